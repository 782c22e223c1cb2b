/* The sessions' timelines (trace_export): every future that belongs to a session — the training
 * ops of its runs, its sampling requests — leaves a record when it settles (futures.c's settle
 * observer: the one place that sees every request's submission and its end). Records are collected
 * on the loop thread and written to the store's session_trace table in one transaction per
 * TWK_SERVE_TRACE_FLUSH_MS (or per TWK_SERVE_TRACE_BATCH records), each session keeping its newest
 * TWK_SERVE_TRACE_RECORDS; trace_export flushes before it reads. */
#include <stdio.h>
#include <string.h>

#include "svc.h"

struct svc_timeline {
    uv_timer_t timer;          /* first member: the close callback frees the struct through it */
    twk_store_trace_rec *rows; /* waiting to be written */
    int n, cap;
    long long lost;            /* records lost since start (no memory; or refused by the store, logged) */
};

static void on_settle(void *user, const twk_future_settled *f) {
    svc *s = user;
    struct svc_timeline *t = s->timeline;
    if (!t || !f->session[0]) return;
    if (t->n == t->cap) {
        int ncap = t->cap ? t->cap * 2 : 64;
        twk_store_trace_rec *g =
            twk_host_realloc(t->rows, (size_t)t->cap * sizeof *g, (size_t)ncap * sizeof *g, "timeline rows");
        if (!g) { /* out of memory: this record is lost, the request is not affected */
            t->lost++;
            return;
        }
        t->rows = g;
        t->cap = ncap;
    }
    twk_store_trace_rec *r = &t->rows[t->n++];
    memset(r, 0, sizeof *r);
    snprintf(r->session_id, sizeof r->session_id, "%s", f->session);
    snprintf(r->tenant, sizeof r->tenant, "%s", f->tenant);
    snprintf(r->request_id, sizeof r->request_id, "%s", f->id);
    snprintf(r->route, sizeof r->route, "%s", f->route);
    snprintf(r->subject, sizeof r->subject, "%s", f->subject);
    r->start_ns = f->start_ns;
    r->end_ns = f->end_ns > f->start_ns ? f->end_ns : f->start_ns + 1; /* a slice has a length */
    r->ok = f->ok;
    snprintf(r->category, sizeof r->category, "%s", f->category);
    /* cut at a UTF-8 character boundary */
    size_t n = strlen(f->error);
    if (n >= sizeof r->error) {
        n = sizeof r->error - 1;
        while (n > 0 && ((unsigned char)f->error[n] & 0xC0) == 0x80) n--;
    }
    memcpy(r->error, f->error, n);
    r->error[n] = 0;
    r->tokens = f->tokens;
    if (t->n >= TWK_SERVE_TRACE_BATCH) svc_timeline_flush(s);
}

void svc_timeline_flush(svc *s) {
    struct svc_timeline *t = s->timeline;
    if (!t || t->n == 0) return;
    int failed = 0;
    if (twk_store_trace_add(s->store, t->rows, t->n, TWK_SERVE_TRACE_RECORDS, &failed) != TWK_OK)
        twk_log_info("session timelines: %d of %d records not stored: %s", failed, t->n, twk_last_error());
    t->lost += failed;
    t->n = 0;
}

static void on_flush(uv_timer_t *h) { svc_timeline_flush(h->data); }

int svc_timeline_start(svc *s) {
    struct svc_timeline *t = twk_host_calloc(sizeof *t, "timeline");
    if (!t) return -1;
    uv_timer_init(s->loop, &t->timer);
    t->timer.data = s;
    uv_timer_start(&t->timer, on_flush, TWK_SERVE_TRACE_FLUSH_MS, TWK_SERVE_TRACE_FLUSH_MS);
    s->timeline = t;
    twk_futures_on_settle(s->futures, on_settle, s);
    return 0;
}

static void on_closed(uv_handle_t *h) {
    struct svc_timeline *t = (struct svc_timeline *)h; /* the timer is the first member */
    twk_host_free(t->rows);
    twk_host_free(t);
}

void svc_timeline_stop(svc *s) {
    struct svc_timeline *t = s->timeline;
    if (!t) return;
    svc_timeline_flush(s);
    twk_futures_on_settle(s->futures, NULL, NULL);
    s->timeline = NULL;
    uv_timer_stop(&t->timer);
    uv_close((uv_handle_t *)&t->timer, on_closed);
}
