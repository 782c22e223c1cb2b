/* retrieve_futures: the SDK's batched poll of a sampling session. Each client
 * of a session (its clone id, seq_id / 1e9) long-polls for the requests that
 * finished since its cursor; the results themselves are still fetched with
 * retrieve_future. Events are kept until a poll's prev_cursor acknowledges
 * them. Loop thread only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_util.h"
#include "svc.h"

typedef struct fevent {
    char id[64];
    int64_t clone, cursor;
    int failed;
    size_t size;
    struct fevent *next;
} fevent;

typedef struct fwaiter {
    struct session_events *ev;
    twk_http_conn *conn;
    int64_t clone, prev_cursor;
    uv_timer_t timer;
    struct fwaiter *next;
} fwaiter;

struct session_events {
    fevent *head, **tail;
    int64_t next_cursor;
    fwaiter *waiters;
};

static struct session_events *events_of(sampler_session *ss) {
    if (!ss->events) {
        ss->events = twk_host_calloc(sizeof *ss->events, "session events");
        if (ss->events) ss->events->tail = &ss->events->head;
    }
    return ss->events;
}

/* Answers c with clone's events after prev (drops those at or before it first). */
static void answer(struct session_events *ev, twk_http_conn *c, int64_t clone, int64_t prev) {
    fevent **pp = &ev->head;
    while (*pp) { /* acknowledged: gone */
        fevent *e = *pp;
        if (e->clone == clone && e->cursor <= prev) {
            *pp = e->next;
            twk_host_free(e);
        } else {
            pp = &e->next;
        }
    }
    ev->tail = &ev->head;
    while (*ev->tail) ev->tail = &(*ev->tail)->next;
    cJSON *j = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(j, "completions");
    int64_t cursor = prev;
    for (fevent *e = ev->head; e; e = e->next) {
        if (e->clone != clone) continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "state", e->failed ? "failed" : "finished");
        cJSON_AddStringToObject(o, "request_id", e->id);
        if (!e->failed) cJSON_AddNumberToObject(o, "response_payload_uncompressed_size", (double)e->size);
        cJSON_AddItemToArray(arr, o);
        if (e->cursor > cursor) cursor = e->cursor;
    }
    cJSON_AddNumberToObject(j, "cursor", (double)cursor);
    api_ok(c, j);
}

static int has_events(const struct session_events *ev, int64_t clone, int64_t prev) {
    for (const fevent *e = ev->head; e; e = e->next)
        if (e->clone == clone && e->cursor > prev) return 1;
    return 0;
}

static void waiter_closed(uv_handle_t *h) { twk_host_free(h->data); }

/* Unlinks w and frees it (after its timer closed). */
static void waiter_drop(fwaiter *w) {
    for (fwaiter **pp = &w->ev->waiters; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    uv_timer_stop(&w->timer);
    w->timer.data = w;
    uv_close((uv_handle_t *)&w->timer, waiter_closed);
}

static void waiter_timeout(uv_timer_t *t) {
    fwaiter *w = t->data;
    twk_http_set_abandon(w->conn, NULL, NULL);
    answer(w->ev, w->conn, w->clone, w->prev_cursor);
    waiter_drop(w);
}

static void waiter_abandoned(twk_http_conn *c, void *user) {
    (void)c;
    waiter_drop(user);
}

void svc_session_event(svc *s, sampler_session *ss, int64_t clone, const char *request_id, int failed, size_t size) {
    (void)s;
    struct session_events *ev = events_of(ss);
    fevent *e = ev ? twk_host_calloc(sizeof *e, "session event") : NULL;
    if (!e) return; /* out of memory: the SDK's poll then waits for its own timeout */
    snprintf(e->id, sizeof e->id, "%s", request_id);
    e->clone = clone;
    e->failed = failed;
    e->size = size;
    e->cursor = ++ev->next_cursor;
    *ev->tail = e;
    ev->tail = &e->next;
    for (fwaiter *w = ev->waiters, *next; w; w = next) {
        next = w->next;
        if (w->clone != clone) continue;
        twk_http_set_abandon(w->conn, NULL, NULL);
        answer(ev, w->conn, w->clone, w->prev_cursor);
        waiter_drop(w);
    }
}

void api_retrieve_futures(svc *s, twk_http_conn *c, const cJSON *b, const char *tenant) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "target");
    const char *sid, *type = NULL;
    long long clone, prev;
    double timeout;
    char err[256];
    if (!cJSON_IsObject(t)) {
        api_error(c, 400, "field 'target' must be an object {type: sampling_session, sampling_session_id, "
                          "cloned_sampler_id}");
        return;
    }
    if (!api_str(t, "type", 0, &type, err, sizeof err) || (type && strcmp(type, "sampling_session"))) {
        api_error(c, 400, "target.type must be 'sampling_session'");
        return;
    }
    if (!api_str(t, "sampling_session_id", 1, &sid, err, sizeof err) ||
        !api_int(t, "cloned_sampler_id", 0, 0, 1000000000, 0, &clone, err, sizeof err)) {
        api_error(c, 400, "target: %s", err);
        return;
    }
    if (!api_int(b, "prev_cursor", 0, 0, (1ll << 53), 0, &prev, err, sizeof err) ||
        !api_num(b, "timeout", 0, s->cfg.poll_timeout_s, &timeout, err, sizeof err)) {
        api_error(c, 400, "%s", err);
        return;
    }
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(b, "retrieved_request_ids");
    if (ids && !cJSON_IsArray(ids) && !cJSON_IsNull(ids)) {
        api_error(c, 400, "field 'retrieved_request_ids' must be a list of request ids");
        return;
    }
    sampler_session *ss = svc_find_sampler(s, tenant, sid);
    if (!ss) {
        api_error(c, 404, "sampling session '%s' not found", sid);
        return;
    }
    struct session_events *ev = events_of(ss);
    fwaiter *w = ev && !has_events(ev, clone, prev) && timeout > 0 ? twk_host_calloc(sizeof *w, "session waiter") : NULL;
    if (!ev) {
        api_error(c, 503, "out of memory");
        return;
    }
    if (!w) {
        answer(ev, c, clone, prev);
        return;
    }
    if (timeout > s->cfg.poll_timeout_s) timeout = s->cfg.poll_timeout_s;
    w->ev = ev;
    w->conn = c;
    w->clone = clone;
    w->prev_cursor = prev;
    w->next = ev->waiters;
    ev->waiters = w;
    uv_timer_init(s->loop, &w->timer);
    w->timer.data = w;
    uv_timer_start(&w->timer, waiter_timeout, (uint64_t)(timeout * 1000), 0);
    twk_http_set_abandon(c, waiter_abandoned, w);
}

void svc_session_events_free(sampler_session *ss) {
    struct session_events *ev = ss->events;
    if (!ev) return;
    while (ev->waiters) { /* shutdown: the HTTP server already closed the parked connections */
        fwaiter *w = ev->waiters;
        twk_http_set_abandon(w->conn, NULL, NULL);
        answer(ev, w->conn, w->clone, w->prev_cursor);
        waiter_drop(w);
    }
    while (ev->head) {
        fevent *e = ev->head;
        ev->head = e->next;
        twk_host_free(e);
    }
    twk_host_free(ev);
    ss->events = NULL;
}
