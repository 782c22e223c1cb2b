/* test_seq_ring — a run's seq_id dedupe ring (server/seq_ring.c) against the test's own rule (the
 * latest 512 seq_ids put, each with the id made for it): after 700 puts only those are remembered;
 * packing (a spill) keeps exactly those, and a ring packed after 3 ops holds 3 entries of 24 bytes
 * plus the allocator's header (under 256 bytes, against 12 KiB of slots); the next put unpacks it
 * with every entry kept; an id not of futures.c's `req-` + 32 lowercase hex form is refused;
 * freeing returns every byte (the host allocator's count). */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "svc.h"

#define PUTS 700

static void id_of(int64_t seq, char *out) { /* distinct ids with every hex digit used */
    snprintf(out, 64, "req-%016llx%016llx", (unsigned long long)(seq * 0x9e3779b97f4a7c15ull),
             (unsigned long long)(~seq * 0xc2b2ae3d27d4eb4full));
}

/* The seq_ids of 1..last that the ring must remember: the latest per slot (seq % ring). */
static int expected(int64_t seq, int64_t last) { return seq >= 1 && seq <= last && seq > last - TWK_SERVE_DEDUPE_RING; }

static int agrees(const run_state *r, int64_t last, int64_t extra, const char *extra_id) {
    char got[64], want[64];
    for (int64_t s = 0; s <= PUTS + 5; s++) {
        int hit = svc_ring_get(r, s, got);
        if (s == extra) {
            if (!hit || strcmp(got, extra_id)) return 0;
            continue;
        }
        if (hit != expected(s, last)) return 0;
        id_of(s, want);
        if (hit && strcmp(got, want)) return 0;
    }
    return 1;
}

int main(void) {
    run_state r;
    memset(&r, 0, sizeof r);
    size_t h0 = twk_host_bytes_in_use();
    char id[64];
    check(!svc_ring_get(&r, 1, id), "an empty ring remembers nothing");
    for (int64_t s = 1; s <= PUTS; s++) {
        id_of(s, id);
        if (svc_ring_put(&r, s, id)) break;
    }
    size_t full = twk_host_bytes_in_use() - h0;
    check(agrees(&r, PUTS, -1, NULL), "after %d puts: the last %d seq_ids, each with its id", PUTS, TWK_SERVE_DEDUPE_RING);
    svc_ring_pack(&r);
    size_t packed = twk_host_bytes_in_use() - h0;
    check(agrees(&r, PUTS, -1, NULL), "packed: the same answers");
    printf("     host bytes: %zu with 512 slots, %zu packed\n", full, packed);
    check(full >= (size_t)TWK_SERVE_DEDUPE_RING * 24 && full < (size_t)TWK_SERVE_DEDUPE_RING * 24 + 256, "512 slots of 24 bytes");
    svc_ring_free(&r);
    check(twk_host_bytes_in_use() == h0, "freed: every byte returned");

    for (int64_t s = 1; s <= 3; s++) {
        id_of(s, id);
        svc_ring_put(&r, s, id);
    }
    svc_ring_pack(&r);
    packed = twk_host_bytes_in_use() - h0;
    printf("     a run spilled after 3 ops keeps %zu bytes of ring\n", packed);
    check(packed < (size_t)(3 * 24 + 256) && agrees(&r, 3, -1, NULL), "3 entries packed: %zu bytes, the same answers", packed);
    char extra[64] = "req-0123456789abcdef0123456789abcdef";
    check(svc_ring_put(&r, 40, extra) == 0 && agrees(&r, 3, 40, extra), "the next put unpacks: old entries kept, new one added");
    check(svc_ring_put(&r, 41, "req-unavailable") == -1 && svc_ring_put(&r, 42, "req-0123456789ABCDEF0123456789abcdef") == -1 &&
              !svc_ring_get(&r, 41, id) && !svc_ring_get(&r, 42, id),
          "ids not of the `req-` + 32 lowercase hex form are refused");
    svc_ring_pack(&r);
    svc_ring_pack(&r); /* packing twice is harmless */
    check(agrees(&r, 3, 40, extra), "packed again: the same answers");
    svc_ring_free(&r);
    check(twk_host_bytes_in_use() == h0, "freed again: every byte returned");
    return check_failures != 0;
}
