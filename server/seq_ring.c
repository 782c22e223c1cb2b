/* The seq_id dedupe ring of a run (runs.c): a resubmitted (model_id, seq_id)
 * gets its original future's request id. TWK_SERVE_DEDUPE_RING slots indexed
 * by seq_id modulo the ring, allocated on the run's first op; a spilled run's
 * ring is packed to its used entries (a run idle after a few ops keeps a few
 * dozen bytes) and unpacked by its next op. Request ids are stored as the 16
 * bytes of futures.c's `req-` + 32 hex digits. */
#include <stdlib.h>
#include <string.h>

#include "svc.h"

typedef struct seq_entry {
    int64_t seq; /* -1: empty */
    uint8_t id[16];
} seq_entry;

struct seq_ring {
    int packed; /* 0: TWK_SERVE_DEDUPE_RING slots by seq % ring; 1: n used entries sorted by seq */
    int n;
    seq_entry e[];
};

static int hex_val(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* 1 when id is `req-` + 32 lowercase hex digits (futures.c's form), its bytes in out. */
static int id_encode(const char *id, uint8_t out[16]) {
    if (strncmp(id, "req-", 4) || strlen(id) != 36) return 0;
    for (int i = 0; i < 16; i++) {
        int hi = hex_val(id[4 + 2 * i]), lo = hex_val(id[5 + 2 * i]);
        if (hi < 0 || lo < 0) return 0;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 1;
}

static void id_decode(const uint8_t in[16], char *out) {
    static const char hex[] = "0123456789abcdef";
    memcpy(out, "req-", 4);
    for (int i = 0; i < 16; i++) {
        out[4 + 2 * i] = hex[in[i] >> 4];
        out[5 + 2 * i] = hex[in[i] & 15];
    }
    out[36] = 0;
}

static seq_ring *ring_slots(void) {
    seq_ring *g = twk_host_alloc(sizeof *g + TWK_SERVE_DEDUPE_RING * sizeof(seq_entry), "seq_id ring");
    if (!g) return NULL;
    g->packed = 0;
    g->n = TWK_SERVE_DEDUPE_RING;
    for (int i = 0; i < g->n; i++) g->e[i].seq = -1;
    return g;
}

int svc_ring_put(run_state *r, int64_t seq, const char *request_id) {
    uint8_t id[16];
    if (seq < 0 || !id_encode(request_id, id)) return -1;
    if (!r->ring || r->ring->packed) { /* first op, or the first after a spill */
        seq_ring *g = ring_slots();
        if (!g) return -1;
        for (int i = 0; r->ring && i < r->ring->n; i++) g->e[(uint64_t)r->ring->e[i].seq % TWK_SERVE_DEDUPE_RING] = r->ring->e[i];
        twk_host_free(r->ring);
        r->ring = g;
    }
    seq_entry *x = &r->ring->e[(uint64_t)seq % TWK_SERVE_DEDUPE_RING];
    x->seq = seq;
    memcpy(x->id, id, sizeof id);
    return 0;
}

static int by_seq(const void *a, const void *b) {
    int64_t x = ((const seq_entry *)a)->seq, y = ((const seq_entry *)b)->seq;
    return (x > y) - (x < y);
}

int svc_ring_get(const run_state *r, int64_t seq, char *request_id) {
    const seq_ring *g = r->ring;
    if (!g || seq < 0) return 0;
    const seq_entry *x;
    if (g->packed) {
        seq_entry key = {.seq = seq};
        x = bsearch(&key, g->e, (size_t)g->n, sizeof *g->e, by_seq);
    } else {
        x = &g->e[(uint64_t)seq % TWK_SERVE_DEDUPE_RING];
        if (x->seq != seq) x = NULL;
    }
    if (x && request_id) id_decode(x->id, request_id);
    return x != NULL;
}

void svc_ring_pack(run_state *r) {
    seq_ring *g = r->ring;
    if (!g || g->packed) return;
    int n = 0;
    for (int i = 0; i < g->n; i++) n += g->e[i].seq >= 0;
    seq_ring *p = n ? twk_host_alloc(sizeof *p + (size_t)n * sizeof(seq_entry), "seq_id ring (packed)") : NULL;
    if (n && !p) return; /* kept as it is */
    if (p) {
        p->packed = 1;
        p->n = 0;
        for (int i = 0; i < g->n; i++)
            if (g->e[i].seq >= 0) p->e[p->n++] = g->e[i];
        qsort(p->e, (size_t)p->n, sizeof *p->e, by_seq);
    }
    twk_host_free(g);
    r->ring = p;
}

void svc_ring_free(run_state *r) {
    twk_host_free(r->ring);
    r->ring = NULL;
}
