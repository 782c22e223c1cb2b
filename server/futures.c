/* The futures table and parked long polls. */
#include "futures.h"

#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <cJSON.h>

#include "api_util.h"
#include "twinkle/hal.h"
#include "log.h"

typedef struct waiter waiter;

typedef struct tenant_use tenant_use;

typedef struct future {
    char id[64];
    char tenant[64];
    char route[48];      /* the endpoint that created it (for the failure log) */
    char session[96];    /* the session and the run / sampling session it works for ("" none) */
    char subject[160];
    int64_t start_ns;    /* wall clock when it was created (the settle observer) */
    int64_t tokens;      /* -1 unknown */
    int state; /* 0 pending, 1 done, 2 failed, 3 dropped (--max-results-mb-tenant) */
    char content_type[48];
    unsigned char *body;
    size_t len;
    double finished_at;
    double retrieved_at; /* 0 until a final answer was sent */
    tenant_use *use;
    waiter *waiters;
    struct future *next;             /* hash chain */
    struct future *older, *newer;    /* finished futures, in the order they finished */
} future;

/* Result bytes a tenant's finished futures hold (--max-results-mb-tenant). */
struct tenant_use {
    char tenant[64];
    size_t bytes;
    tenant_use *next;
};

struct waiter {
    twk_futures *f;
    future *fut;
    twk_http_conn *conn;
    uv_timer_t timer;
    waiter *next;
};

#define N_BUCKETS 4096

struct twk_futures {
    uv_loop_t *loop;
    twk_futures_limits lim;
    future *buckets[N_BUCKETS];
    future *oldest, *newest; /* finished futures */
    tenant_use *uses;
    int pending, finished;
    uv_timer_t gc;
    twk_futures_fail_fn on_fail; /* metrics */
    void *on_fail_user;
    twk_futures_settle_fn on_settle; /* the sessions' timelines */
    void *on_settle_user;
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

static int64_t wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static tenant_use *use_of(twk_futures *f, const char *tenant) {
    for (tenant_use *u = f->uses; u; u = u->next)
        if (!strcmp(u->tenant, tenant)) return u;
    tenant_use *u = twk_host_calloc(sizeof *u, "futures u");
    if (!u) return NULL;
    snprintf(u->tenant, sizeof u->tenant, "%s", tenant);
    u->next = f->uses;
    f->uses = u;
    return u;
}

/* Sets a finished future's body, keeping its tenant's byte count. */
static void set_body(future *x, unsigned char *body, size_t len) {
    if (x->use) x->use->bytes -= x->len;
    twk_host_free(x->body);
    x->body = body;
    x->len = body ? len : 0;
    if (x->use) x->use->bytes += x->len;
}

/* Frees a finished future without waiters. */
static void drop(twk_futures *f, future *x) {
    future **pp = &f->buckets[hash(x->id)];
    while (*pp && *pp != x) pp = &(*pp)->next;
    if (*pp) *pp = x->next;
    if (x->older) x->older->newer = x->newer;
    else f->oldest = x->newer;
    if (x->newer) x->newer->older = x->older;
    else f->newest = x->older;
    set_body(x, NULL, 0);
    twk_host_free(x);
    f->finished--;
}

/* Frees results retrieved more than --result-keep ago (the SDK re-polls a
 * request id only when the answer to a poll was lost: it retries after a
 * connection error with a backoff of 1, 2, 4, ... s, capped at 30 s, and its
 * HTTP timeout per poll is 45 s; after a received result or error it never
 * polls that id again) and results nobody retrieved within --result-ttl. */
static void gc_tick(uv_timer_t *t) {
    twk_futures *f = t->data;
    double now = now_s(f);
    int dropped = 0;
    for (future *x = f->oldest, *next; x; x = next) {
        next = x->newer;
        if (x->waiters) continue;
        if ((x->retrieved_at > 0 && now - x->retrieved_at >= f->lim.keep_after_retrieval_s) ||
            now - x->finished_at >= f->lim.ttl_s) {
            drop(f, x);
            dropped++;
        }
    }
#ifdef __GLIBC__
    /* hand the freed pages back (glibc keeps a peak's worth of free memory in its arenas otherwise) */
    if (dropped && !f->pending) malloc_trim(0);
#endif
}

/* Keeps a tenant's result bytes within --max-results-mb-tenant: retrieved
 * results are freed first, then the oldest unretrieved ones are replaced by
 * an error naming the limit. */
static void enforce_bytes(twk_futures *f, tenant_use *u) {
    if (!u) return;
    for (future *x = f->oldest, *next; x && u->bytes > f->lim.max_bytes_tenant; x = next) {
        next = x->newer;
        if (x->use == u && x->retrieved_at > 0 && !x->waiters) drop(f, x);
    }
    for (future *x = f->oldest; x && u->bytes > f->lim.max_bytes_tenant; x = x->newer) {
        if (x->use != u || x->state == 3) continue;
        char msg[400];
        snprintf(msg, sizeof msg,
                 "{\"error\":\"the result (%zu bytes) was dropped: this tenant's finished results not yet "
                 "retrieved passed the server's --max-results-mb-tenant limit of %.0f MiB; retrieve results "
                 "sooner\",\"category\":\"user\"}",
                 x->len, (double)f->lim.max_bytes_tenant / 1048576.0);
        unsigned char *b = (unsigned char *)twk_host_strdup(msg, "dropped result");
        if (!b) return;
        set_body(x, b, strlen(msg));
        snprintf(x->content_type, sizeof x->content_type, "application/json");
        x->state = 3; /* failed: dropped */
        twk_log_failure(x->id, x->tenant, x->route, 0, "user",
                        "result dropped: the tenant's unretrieved results passed --max-results-mb-tenant");
        if (f->on_fail) f->on_fail(f->on_fail_user, x->tenant, x->route, "user");
    }
}

twk_futures_limits twk_futures_limits_default(void) {
    twk_futures_limits l = {25.0, 120.0, 3600.0, (size_t)256 << 20};
    return l;
}

twk_futures *twk_futures_new(uv_loop_t *loop, const twk_futures_limits *lim) {
    twk_futures *f = twk_host_calloc(sizeof *f, "futures f");
    if (!f) return NULL;
    f->loop = loop;
    f->lim = *lim;
    double every = f->lim.keep_after_retrieval_s / 4;
    every = every < 1 ? 1 : every > 30 ? 30 : every;
    uv_timer_init(loop, &f->gc);
    f->gc.data = f;
    uv_timer_start(&f->gc, gc_tick, (uint64_t)(every * 1000), (uint64_t)(every * 1000));
    return f;
}

static void try_again_json(char *buf, size_t len, const char *id) {
    snprintf(buf, len, "{\"type\":\"try_again\",\"request_id\":\"%s\",\"queue_state\":\"active\"}", id);
}

static void waiter_closed(uv_handle_t *h) { twk_host_free(h->data); }

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

/* Sends a finished future's result; from now on it is kept only --result-keep. */
static void answer(twk_futures *f, twk_http_conn *c, future *x) {
    if (x->retrieved_at == 0) x->retrieved_at = now_s(f);
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

static void gc_closed(uv_handle_t *h) { twk_host_free(h->data); }

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
            twk_host_free(x->body);
            twk_host_free(x);
            x = next;
        }
    }
    while (f->uses) {
        tenant_use *u = f->uses;
        f->uses = u->next;
        twk_host_free(u);
    }
    uv_close((uv_handle_t *)&f->gc, gc_closed); /* frees f once libuv is done with the timer */
}

int twk_random_hex(char *out, int n_bytes) {
    unsigned char b[32];
    if (n_bytes > 32) n_bytes = 32;
    for (int got = 0; got < n_bytes;) {
        ssize_t k = getrandom(b + got, (size_t)(n_bytes - got), 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        got += (int)k;
    }
    for (int i = 0; i < n_bytes; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
    return 0;
}

int twk_futures_create(twk_futures *f, const char *tenant, const char *session, const char *subject, char *id) {
    future *x = twk_host_calloc(sizeof *x, "future");
    char hex[40];
    if (!x || twk_random_hex(hex, 16) != 0) {
        twk_host_free(x);
        snprintf(id, 64, "req-unavailable"); /* unknown to every poll: answers 404 */
        return -1;
    }
    snprintf(x->id, sizeof x->id, "req-%s", hex);
    snprintf(x->route, sizeof x->route, "%s", twk_log_route());
    snprintf(x->tenant, sizeof x->tenant, "%s", tenant);
    snprintf(x->session, sizeof x->session, "%s", session ? session : "");
    snprintf(x->subject, sizeof x->subject, "%s", subject ? subject : "");
    x->start_ns = wall_ns();
    x->tokens = -1;
    unsigned h = hash(x->id);
    x->next = f->buckets[h];
    f->buckets[h] = x;
    f->pending++;
    snprintf(id, 64, "%s", x->id);
    twk_log_request_id(x->id);
    return 0;
}

void twk_futures_set_tokens(twk_futures *f, const char *id, int64_t tokens) {
    future *x = find(f, id);
    if (x && !x->state) x->tokens = tokens;
}

void twk_futures_on_settle(twk_futures *f, twk_futures_settle_fn fn, void *user) {
    f->on_settle = fn;
    f->on_settle_user = user;
}

/* The settle observer of x, which just finished (failed: category and message). */
static void settled(twk_futures *f, const future *x, const char *category, const char *message) {
    if (!f->on_settle) return;
    twk_future_settled info = {x->id,       x->tenant, x->route,          x->session,       x->subject,
                               x->start_ns, wall_ns(), x->state == 1,     category ? category : "",
                               message ? message : "",  x->tokens};
    f->on_settle(f->on_settle_user, &info);
}

static void finish(twk_futures *f, future *x) {
    x->finished_at = now_s(f);
    f->pending--;
    f->finished++;
    x->older = f->newest;
    if (f->newest) f->newest->newer = x;
    else f->oldest = x;
    f->newest = x;
    x->use = use_of(f, x->tenant);
    if (x->use) x->use->bytes += x->len;
    while (x->waiters) {
        waiter *w = x->waiters;
        twk_http_conn *c = w->conn;
        w->conn = NULL;
        if (c) {
            twk_http_set_abandon(c, NULL, NULL);
            answer(f, c, x);
        }
        drop_waiter(w);
    }
}

void twk_futures_complete(twk_futures *f, const char *id, const char *content_type, const void *body, size_t len) {
    future *x = find(f, id);
    if (!x || x->state) return;
    x->body = body || !len ? twk_host_pool_alloc(TWK_HPOOL_REQUESTS, len ? len : 1, "result") : NULL;
    if (!x->body) { /* out of memory, here or where the result was made (no body) */
        twk_futures_fail(f, id, "server", "out of memory storing the result");
        return;
    }
    memcpy(x->body, body, len);
    x->len = len;
    snprintf(x->content_type, sizeof x->content_type, "%s", content_type);
    x->state = 1;
    settled(f, x, NULL, NULL);
    finish(f, x);
    enforce_bytes(f, x->use);
}

void twk_futures_on_fail(twk_futures *f, twk_futures_fail_fn fn, void *user) {
    f->on_fail = fn;
    f->on_fail_user = user;
}

void twk_futures_fail(twk_futures *f, const char *id, const char *category, const char *message) {
    future *x = find(f, id);
    if (!x || x->state) return;
    twk_log_failure(x->id, x->tenant, x->route, 0, category, message);
    if (f->on_fail) f->on_fail(f->on_fail_user, x->tenant, x->route, category);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "error", message);
    cJSON_AddStringToObject(j, "category", category);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s || api_json_oom()) { /* out of memory: the message alone, without escapes */
        cJSON_free(s);
        s = twk_host_strdup("{\"error\":\"out of memory\",\"category\":\"server\"}", "failure");
    }
    x->body = (unsigned char *)s;
    x->len = s ? strlen(s) : 0;
    snprintf(x->content_type, sizeof x->content_type, "application/json");
    x->state = 2;
    settled(f, x, category, message);
    finish(f, x);
    enforce_bytes(f, x->use);
}

int twk_futures_succeeded(twk_futures *f, const char *id) {
    const future *x = find(f, id);
    return x && x->state == 1;
}

int twk_futures_cancel(twk_futures *f, const char *tenant, const char *id) {
    future *x = id ? find(f, id) : NULL;
    if (!x || strcmp(x->tenant, tenant)) return -1;
    if (x->state) return 0;
    twk_futures_fail(f, id, "cancelled", "cancelled by the client (cancel_future)");
    return 1;
}

void twk_futures_poll(twk_futures *f, twk_http_conn *c, const char *tenant, const char *id) {
    future *x = id ? find(f, id) : NULL;
    twk_http_log_fields(c, NULL, NULL, id); /* the polled future's id, also when answered later */
    if (!x || strcmp(x->tenant, tenant)) {
        twk_log_failure(id, tenant, twk_log_route(), 404, NULL, "unknown request_id");
        twk_http_respond_json(c, 404, "{\"error\":\"unknown request_id\"}");
        return;
    }
    if (x->state) {
        answer(f, c, x);
        return;
    }
    waiter *w = twk_host_calloc(sizeof *w, "futures w");
    if (!w) {
        twk_log_failure(id, tenant, twk_log_route(), 503, NULL, "out of memory");
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
    uv_timer_start(&w->timer, poll_timeout, (uint64_t)(f->lim.poll_timeout_s * 1000), 0);
    twk_http_set_abandon(c, poll_abandoned, w);
}

size_t twk_futures_bytes(const twk_futures *f) {
    size_t n = 0;
    for (const tenant_use *u = f->uses; u; u = u->next) n += u->bytes;
    return n;
}
