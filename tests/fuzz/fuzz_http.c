/* fuzz_http — server/http.c's request loop over a socketpair: the input is the
 * client's byte stream (pipelined requests, split into pieces by its first
 * byte so reads are partial), answered by a handler that echoes, parks (with
 * and without an abandon callback) and marks connections authenticated. Every
 * header name and value is read to its NUL, so an unterminated one is an
 * ASan report. Small limits make 413 / 431 reachable. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"

static uv_loop_t loop;
static twk_http_server *srv;

typedef struct park {
    uv_timer_t t;
    twk_http_conn *c;
    int answered;
} park;

static void park_free(uv_handle_t *h) { free(h->data); }

static void park_fire(uv_timer_t *t) {
    park *p = t->data;
    twk_http_respond_json(p->c, 200, "{\"parked\":true}");
    uv_close((uv_handle_t *)&p->t, park_free);
}

static void park_abandon(twk_http_conn *c, void *user) {
    park *p = user;
    (void)c;
    uv_timer_stop(&p->t);
    uv_close((uv_handle_t *)&p->t, park_free);
}

static void handler(twk_http_conn *c, const twk_http_req *r, void *user) {
    (void)user;
    size_t sum = strlen(r->method) + strlen(r->path) + strlen(r->query);
    for (int i = 0; i < r->n_headers; i++) sum += strlen(r->headers[i].name) + strlen(r->headers[i].value);
    const char *key = twk_http_header_get(r, "X-API-Key");
    if (key && strcmp(key, "tml-fuzz") == 0) twk_http_set_authenticated(c);
    if (r->body[r->body_len] != 0) abort(); /* the body is NUL-terminated */
    int park_kind = !strncmp(r->path, "/park", 5) ? 1 : !strncmp(r->path, "/zombie", 7) ? 2 : !strncmp(r->path, "/never", 6) ? 3 : 0;
    if (park_kind) {
        park *p = calloc(1, sizeof *p);
        p->c = c;
        uv_timer_init(&loop, &p->t);
        p->t.data = p;
        if (park_kind != 2) twk_http_set_abandon(c, park_abandon, p);
        if (park_kind != 3) uv_timer_start(&p->t, park_fire, 0, 0);
        return;
    }
    if (!strcmp(r->path, "/empty")) {
        twk_http_respond(c, 204, NULL, NULL, 0, "X-A: 1\r\n");
        return;
    }
    char json[128];
    snprintf(json, sizeof json, "{\"n\":%d,\"len\":%zu,\"sum\":%zu}", r->n_headers, r->body_len, sum);
    twk_http_respond(c, key ? 200 : 401, "application/json", json, strlen(json), NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!srv) {
        uv_loop_init(&loop);
        twk_http_limits lim = twk_http_limits_default();
        lim.max_body_bytes = 4096;
        lim.max_header_bytes = 2048;
        if (twk_http_server_start(&loop, "127.0.0.1", 0, &lim, handler, NULL, &srv) != 0) abort();
    }
    if (size == 0) return 0;
    twk_fuzz_drive(&loop, srv, data + 1, size - 1, data[0] & 0x80 ? 0 : data[0], NULL, 0);
    return 0;
}
