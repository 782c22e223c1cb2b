/* The futures table and parked long polls. */
#include "futures.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

typedef struct waiter waiter;

typedef struct future {
    char id[64];
    char tenant[64];
    int state; /* 0 pending, 1 done, 2 failed */
    char content_type[48];
    unsigned char *body;
    size_t len;
    double finished_at;
    waiter *waiters;
    struct future *next; /* hash chain */
} future;

struct waiter {
    twk_futures *f;
    future *fut;
    twk_http_conn *conn;
    uv_timer_t timer;
    waiter *next;
};

#define N_BUCKETS 4096
#define KEEP_RESULTS_S 3600.0

struct twk_futures {
    uv_loop_t *loop;
    double poll_timeout_s;
    future *buckets[N_BUCKETS];
    unsigned long long counter;
    unsigned long long salt;
    int pending, finished;
    uv_timer_t gc;
};

static unsigned hash(const char *s) {
    unsigned h = 2166136261u;
    while (*s) h = (h ^ (unsigned char)*s++) * 16777619u;
    return h % N_BUCKETS;
}

static future *find(twk_futures *f, const char *id) {
    for (future *x = f->buckets[hash(id)]; x; x = x->next)
        if (!strcmp(x->id, id)) return x;
    return NULL;
}

static double now_s(twk_futures *f) { return (double)uv_now(f->loop) / 1000.0; }

/* Drops finished results older than KEEP_RESULTS_S. */
static void gc_tick(uv_timer_t *t) {
    twk_futures *f = t->data;
    double now = now_s(f);
    for (int b = 0; b < N_BUCKETS; b++) {
        future **pp = &f->buckets[b];
        while (*pp) {
            future *x = *pp;
            if (x->state && !x->waiters && now - x->finished_at > KEEP_RESULTS_S) {
                *pp = x->next;
                free(x->body);
                free(x);
                f->finished--;
            } else {
                pp = &x->next;
            }
        }
    }
}

twk_futures *twk_futures_new(uv_loop_t *loop, double poll_timeout_s) {
    twk_futures *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->loop = loop;
    f->poll_timeout_s = poll_timeout_s > 0 ? poll_timeout_s : 25.0;
    f->salt = (unsigned long long)uv_hrtime() ^ ((unsigned long long)(uintptr_t)f << 16);
    uv_timer_init(loop, &f->gc);
    f->gc.data = f;
    uv_timer_start(&f->gc, gc_tick, 60000, 60000);
    return f;
}

static void try_again_json(char *buf, size_t len, const char *id) {
    snprintf(buf, len, "{\"type\":\"try_again\",\"request_id\":\"%s\",\"queue_state\":\"active\"}", id);
}

static void waiter_closed(uv_handle_t *h) { free(h->data); }

/* Detaches a waiter from its future and releases it (timer closed async). */
static void drop_waiter(waiter *w) {
    waiter **pp = &w->fut->waiters;
    while (*pp && *pp != w) pp = &(*pp)->next;
    if (*pp) *pp = w->next;
    if (w->conn) twk_http_set_abandon(w->conn, NULL, NULL);
    uv_timer_stop(&w->timer);
    w->timer.data = w;
    uv_close((uv_handle_t *)&w->timer, waiter_closed);
}

static void answer(twk_http_conn *c, const future *x) {
    if (x->state == 1)
        twk_http_respond(c, 200, x->content_type, x->body, x->len, NULL);
    else
        twk_http_respond(c, 200, "application/json", x->body, x->len, NULL);
}

static void poll_timeout(uv_timer_t *t) {
    waiter *w = t->data;
    char buf[160];
    try_again_json(buf, sizeof buf, w->fut->id);
    twk_http_conn *c = w->conn;
    w->conn = NULL;
    twk_http_set_abandon(c, NULL, NULL);
    twk_http_respond_json(c, 200, buf);
    drop_waiter(w);
}

static void poll_abandoned(twk_http_conn *c, void *user) {
    (void)c;
    waiter *w = user;
    w->conn = NULL;
    drop_waiter(w);
}

static void gc_closed(uv_handle_t *h) { free(h->data); }

void twk_futures_free(twk_futures *f) {
    if (!f) return;
    uv_timer_stop(&f->gc);
    for (int b = 0; b < N_BUCKETS; b++) {
        future *x = f->buckets[b];
        while (x) {
            while (x->waiters) {
                waiter *w = x->waiters;
                char buf[160];
                try_again_json(buf, sizeof buf, x->id);
                twk_http_conn *c = w->conn;
                w->conn = NULL;
                if (c) {
                    twk_http_set_abandon(c, NULL, NULL);
                    twk_http_respond_json(c, 200, buf);
                }
                drop_waiter(w);
            }
            future *next = x->next;
            free(x->body);
            free(x);
            x = next;
        }
    }
    uv_close((uv_handle_t *)&f->gc, gc_closed); /* frees f once libuv is done with the timer */
}

void twk_futures_create(twk_futures *f, const char *tenant, char *id) {
    future *x = calloc(1, sizeof *x);
    if (!x) {
        snprintf(id, 64, "req-oom");
        return;
    }
    f->counter++;
    snprintf(x->id, sizeof x->id, "req-%llx-%llu", (f->salt * 0x9e3779b97f4a7c15ull + f->counter) >> 20,
             f->counter);
    snprintf(x->tenant, sizeof x->tenant, "%s", tenant);
    unsigned h = hash(x->id);
    x->next = f->buckets[h];
    f->buckets[h] = x;
    f->pending++;
    snprintf(id, 64, "%s", x->id);
}

static void finish(twk_futures *f, future *x) {
    x->finished_at = now_s(f);
    f->pending--;
    f->finished++;
    while (x->waiters) {
        waiter *w = x->waiters;
        twk_http_conn *c = w->conn;
        w->conn = NULL;
        if (c) {
            twk_http_set_abandon(c, NULL, NULL);
            answer(c, x);
        }
        drop_waiter(w);
    }
}

void twk_futures_complete(twk_futures *f, const char *id, const char *content_type, const void *body, size_t len) {
    future *x = find(f, id);
    if (!x || x->state) return;
    x->body = malloc(len ? len : 1);
    if (!x->body) {
        twk_futures_fail(f, id, "server", "out of memory storing the result");
        return;
    }
    memcpy(x->body, body, len);
    x->len = len;
    snprintf(x->content_type, sizeof x->content_type, "%s", content_type);
    x->state = 1;
    finish(f, x);
}

void twk_futures_fail(twk_futures *f, const char *id, const char *category, const char *message) {
    future *x = find(f, id);
    if (!x || x->state) return;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "error", message);
    cJSON_AddStringToObject(j, "category", category);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    x->body = (unsigned char *)s;
    x->len = s ? strlen(s) : 0;
    snprintf(x->content_type, sizeof x->content_type, "application/json");
    x->state = 2;
    finish(f, x);
}

void twk_futures_poll(twk_futures *f, twk_http_conn *c, const char *tenant, const char *id) {
    future *x = id ? find(f, id) : NULL;
    if (!x || strcmp(x->tenant, tenant)) {
        twk_http_respond_json(c, 404, "{\"error\":\"unknown request_id\"}");
        return;
    }
    if (x->state) {
        answer(c, x);
        return;
    }
    waiter *w = calloc(1, sizeof *w);
    if (!w) {
        twk_http_respond_json(c, 503, "{\"error\":\"out of memory\"}");
        return;
    }
    w->f = f;
    w->fut = x;
    w->conn = c;
    w->next = x->waiters;
    x->waiters = w;
    uv_timer_init(f->loop, &w->timer);
    w->timer.data = w;
    uv_timer_start(&w->timer, poll_timeout, (uint64_t)(f->poll_timeout_s * 1000), 0);
    twk_http_set_abandon(c, poll_abandoned, w);
}

void twk_futures_counts(const twk_futures *f, int *pending, int *finished) {
    if (pending) *pending = f->pending;
    if (finished) *finished = f->finished;
}
