/* test_http — server/http.c over real sockets.
 *
 * The server runs in a uv loop on a second thread; this thread is the client,
 * with plain blocking POSIX sockets. The test handler echoes the request as
 * JSON, parks "/park" for 200 ms (answered from a uv_timer, like a long
 * poll) and "/park_long" for 10 s (still parked when the server stops), and
 * counts abandon callbacks. "/api/v1/..." mimics the service's key check
 * (one key, alice's; 401 otherwise; "/api/v1/healthz" needs none). Small
 * limits and timeouts keep it fast. Further servers: one connection at most
 * (srv_small), small connection caps (srv_caps: 8 in all, 4 per address),
 * and a short header timeout (srv_ht). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "http.h"

#define READ_TIMEOUT_MS 300
#define IDLE_TIMEOUT_MS 500
#define MAX_BODY 1024
#define MAX_HEADER 2048
#define N_CONCURRENT 200
#define BIG_RESP ((size_t)16 << 20)

static uv_loop_t loop;
#define ALICE_KEY "tml-alice-secret-7f3a"
#define CAP_TOTAL 8
#define CAP_PER_ADDR 4
#define HEADER_TIMEOUT_MS 200

static twk_http_server *srv, *srv_small, *srv_caps, *srv_ht;
static int port, port_small, port_caps, port_ht;
static uv_async_t stop_async;
static atomic_int n_abandon, n_park_answered, n_requests;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---------------- server side (loop thread) ---------------- */

typedef struct park {
    uv_timer_t t;
    twk_http_conn *c;
    int has_abandon;
} park;

static void park_free(uv_handle_t *h) { free(h->data); }

static void park_fire(uv_timer_t *t) {
    park *p = t->data;
    twk_http_respond_json(p->c, 200, "{\"parked\":true}");
    /* a second call is ignored (only where the conn is known alive: without an
     * abandon callback the first respond may have freed a closed one) */
    if (p->has_abandon) twk_http_respond_json(p->c, 500, "{\"second\":true}");
    atomic_fetch_add(&n_park_answered, 1);
    uv_close((uv_handle_t *)&p->t, park_free);
}

static void park_abandon(twk_http_conn *c, void *user) {
    park *p = user;
    if (p->c != c) fprintf(stderr, "abandon: wrong conn\n");
    atomic_fetch_add(&n_abandon, 1);
    uv_timer_stop(&p->t);
    uv_close((uv_handle_t *)&p->t, park_free);
}

/* "/stream": a streamed response of STREAM_PIECES pieces, one every 30 ms */
#define STREAM_PIECES 4
typedef struct streamer {
    uv_timer_t t;
    twk_http_conn *c;
    int sent;
} streamer;
static atomic_int n_stream_abandon, n_stream_ended;

static void stream_tick(uv_timer_t *t) {
    streamer *st = t->data;
    char piece[32];
    int n = snprintf(piece, sizeof piece, "data: piece %d\n\n", st->sent++);
    twk_http_stream_write(st->c, piece, (size_t)n);
    if (st->sent < STREAM_PIECES) return;
    twk_http_stream_end(st->c);
    atomic_fetch_add(&n_stream_ended, 1);
    uv_timer_stop(&st->t);
    uv_close((uv_handle_t *)&st->t, park_free);
}

static void stream_abandon(twk_http_conn *c, void *user) {
    (void)c;
    streamer *st = user;
    atomic_fetch_add(&n_stream_abandon, 1);
    uv_timer_stop(&st->t);
    uv_close((uv_handle_t *)&st->t, park_free);
}

static void handler(twk_http_conn *c, const twk_http_req *r, void *user) {
    (void)user;
    atomic_fetch_add(&n_requests, 1);
    if (strcmp(r->path, "/stream") == 0) {
        streamer *st = calloc(1, sizeof *st);
        st->c = c;
        uv_timer_init(&loop, &st->t);
        st->t.data = st;
        if (twk_http_stream_begin(c, 200, "text/event-stream", "Cache-Control: no-cache\r\n") != 0) {
            uv_close((uv_handle_t *)&st->t, park_free);
            return;
        }
        twk_http_set_abandon(c, stream_abandon, st);
        uv_timer_start(&st->t, stream_tick, 30, 30);
        return;
    }
    int is_park = strcmp(r->path, "/park") == 0, is_long = strcmp(r->path, "/park_long") == 0;
    int no_abandon = strcmp(r->path, "/park_noabandon") == 0;
    if (is_park || is_long || no_abandon) {
        park *p = calloc(1, sizeof *p);
        p->c = c;
        uv_timer_init(&loop, &p->t);
        p->t.data = p;
        uv_timer_start(&p->t, park_fire, is_long ? 10000 : 200, 0);
        p->has_abandon = !no_abandon;
        if (p->has_abandon) twk_http_set_abandon(c, park_abandon, p);
        return;
    }
    if (strncmp(r->path, "/api/v1/", 8) == 0) { /* the service's key check, in miniature */
        const char *key = twk_http_header_get(r, "X-API-Key");
        if (strcmp(r->path, "/api/v1/healthz") == 0) {
            twk_http_respond_json(c, 200, "{\"status\":\"ok\"}");
        } else if (key && strcmp(key, ALICE_KEY) == 0) {
            twk_http_set_authenticated(c);
            twk_http_respond_json(c, 200, "{\"sessions\":[\"alice-session-1\"]}");
        } else {
            twk_http_respond_json(c, 401, "{\"error\":\"invalid or missing API key\"}");
        }
        return;
    }
    if (strcmp(r->path, "/bigresp") == 0) {
        unsigned char *big = malloc(BIG_RESP);
        for (size_t i = 0; i < BIG_RESP; i++) big[i] = (unsigned char)(i * 7);
        twk_http_respond(c, 200, "application/octet-stream", big, BIG_RESP, NULL);
        free(big);
        return;
    }
    if (strcmp(r->path, "/nocontent") == 0) {
        twk_http_respond(c, 204, NULL, NULL, 0, "X-Extra: 1\r\n");
        return;
    }
    char body[128] = "";
    int printable = r->body_len < sizeof body;
    for (size_t i = 0; printable && i < r->body_len; i++)
        if (r->body[i] < 0x20 || r->body[i] > 0x7e || r->body[i] == '"' || r->body[i] == '\\') printable = 0;
    if (printable) memcpy(body, r->body, r->body_len + 1); /* includes the NUL */
    const char *xt = twk_http_header_get(r, "x-test");
    char json[1024];
    snprintf(json, sizeof json,
             "{\"method\":\"%s\",\"path\":\"%s\",\"query\":\"%s\",\"body_len\":%zu,\"body\":\"%s\",\"x_test\":\"%s\","
             "\"nul\":%d}",
             r->method, r->path, r->query, r->body_len, body, xt ? xt : "", r->body[r->body_len] == 0);
    twk_http_respond(c, 200, "application/json", json, strlen(json), "X-Served-By: test\r\n");
}

static void on_stop(uv_async_t *a) {
    twk_http_server_stop(srv);
    twk_http_server_stop(srv_small);
    twk_http_server_stop(srv_caps);
    twk_http_server_stop(srv_ht);
    uv_close((uv_handle_t *)a, NULL);
}

static void *loop_thread(void *arg) {
    (void)arg;
    uv_run(&loop, UV_RUN_DEFAULT);
    return NULL;
}

/* ---------------- client side ---------------- */

typedef struct client {
    int fd;
    size_t len;
    char buf[1 << 17];
} client;

typedef struct resp {
    int status;
    int conn_close;
    char head[4096];
    char body[1 << 16];
    size_t body_len;
} resp;

/* Connects to 127.0.0.1:p from 127.0.0.<src> (0: any source). */
static int cl_connect_from(client *cl, int p, int src) {
    cl->len = 0;
    cl->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (cl->fd < 0) return -1;
    if (src) {
        struct sockaddr_in b;
        memset(&b, 0, sizeof b);
        b.sin_family = AF_INET;
        b.sin_addr.s_addr = htonl(0x7f000000u | (unsigned)src);
        if (bind(cl->fd, (struct sockaddr *)&b, sizeof b) != 0) {
            close(cl->fd);
            cl->fd = -1;
            return -1;
        }
    }
    struct timeval tv = {3, 0};
    setsockopt(cl->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(cl->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)p);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(cl->fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(cl->fd);
        cl->fd = -1;
        return -1;
    }
    return 0;
}

static int cl_connect(client *cl, int p) { return cl_connect_from(cl, p, 0); }

static void cl_close(client *cl) {
    if (cl->fd >= 0) close(cl->fd);
    cl->fd = -1;
}

static int cl_send(client *cl, const char *data, size_t n) {
    while (n) {
        ssize_t k = send(cl->fd, data, n, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        data += k;
        n -= (size_t)k;
    }
    return 0;
}

static int cl_sends(client *cl, const char *s) { return cl_send(cl, s, strlen(s)); }

/* -1: error/timeout, 0: EOF, >0 bytes */
static ssize_t cl_fill(client *cl) {
    if (cl->len >= sizeof cl->buf) return -1;
    ssize_t k;
    do k = recv(cl->fd, cl->buf + cl->len, sizeof cl->buf - cl->len, 0);
    while (k < 0 && errno == EINTR);
    if (k > 0) cl->len += (size_t)k;
    return k;
}

/* One response (Content-Length framed). 0 or -1. */
static int cl_read(client *cl, resp *r) {
    memset(r, 0, sizeof *r);
    r->status = -1;
    char *end;
    for (;;) {
        end = memmem(cl->buf, cl->len, "\r\n\r\n", 4);
        if (end) break;
        if (cl_fill(cl) <= 0) return -1;
    }
    size_t hl = (size_t)(end - cl->buf) + 4;
    if (hl >= sizeof r->head) return -1;
    memcpy(r->head, cl->buf, hl);
    r->head[hl] = 0;
    if (sscanf(r->head, "HTTP/1.1 %d", &r->status) != 1) return -1;
    size_t cl_len = 0;
    const char *h = strcasestr(r->head, "\r\nContent-Length:");
    if (h) cl_len = strtoul(h + 17, NULL, 10);
    r->conn_close = strcasestr(r->head, "\r\nConnection: close\r\n") != NULL;
    if (cl_len >= sizeof r->body) return -1;
    while (cl->len < hl + cl_len)
        if (cl_fill(cl) <= 0) return -1;
    memcpy(r->body, cl->buf + hl, cl_len);
    r->body[cl_len] = 0;
    r->body_len = cl_len;
    memmove(cl->buf, cl->buf + hl + cl_len, cl->len - hl - cl_len);
    cl->len -= hl + cl_len;
    return 0;
}

/* Waits for the server to close: 1 on EOF/reset, 0 on timeout or unexpected data. */
static int cl_wait_eof(client *cl) {
    for (;;) {
        ssize_t k = cl_fill(cl);
        if (k == 0) return 1;
        if (k < 0) return errno == ECONNRESET;
        cl->len = 0; /* unexpected bytes */
        return 0;
    }
}

static int is_json_error(const resp *r, const char *needle) {
    return r->body_len > 0 && strstr(r->head, "Content-Type: application/json") && r->body[0] == '{' &&
           strstr(r->body, "\"error\":\"") && (!needle || strstr(r->body, needle));
}

static int simple_get(int p, const char *path, resp *r) {
    static client cl;
    if (cl_connect(&cl, p) != 0) return -1;
    char req[512];
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path);
    int rc = cl_sends(&cl, req) == 0 && cl_read(&cl, r) == 0 ? 0 : -1;
    cl_close(&cl);
    return rc;
}

/* ---------------- tests ---------------- */

static client A, B, C0;
static resp R, R2;
static client many[N_CONCURRENT];

static void t_get_post(void) {
    int ok = simple_get(port, "/hello?x=1&y=2", &R) == 0;
    check(ok && R.status == 200 && strstr(R.body, "\"method\":\"GET\"") && strstr(R.body, "\"path\":\"/hello\"") &&
              strstr(R.body, "\"query\":\"x=1&y=2\"") && strstr(R.head, "X-Served-By: test\r\n") && !R.conn_close,
          "GET with query: %d %s", R.status, R.body);

    ok = cl_connect(&A, port) == 0 &&
         cl_sends(&A, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\nContent-Type: text/plain\r\n\r\n"
                      "hello world") == 0 &&
         cl_read(&A, &R) == 0;
    check(ok && R.status == 200 && strstr(R.body, "\"method\":\"POST\"") && strstr(R.body, "\"body_len\":11") &&
              strstr(R.body, "\"body\":\"hello world\"") && strstr(R.body, "\"nul\":1"),
          "POST with body: %s", R.body);
    cl_close(&A);
}

static void t_keepalive(void) {
    int ok = cl_connect(&A, port) == 0, n = 0;
    for (int i = 0; ok && i < 3; i++) {
        char req[128], want[64];
        snprintf(req, sizeof req, "GET /k%d HTTP/1.1\r\nHost: x\r\n\r\n", i);
        snprintf(want, sizeof want, "\"path\":\"/k%d\"", i);
        ok = cl_sends(&A, req) == 0 && cl_read(&A, &R) == 0 && R.status == 200 && strstr(R.body, want) && !R.conn_close;
        n += ok;
    }
    check(ok && n == 3, "keep-alive: 3 requests on one connection");
    /* the last one asks to close */
    ok = ok && cl_sends(&A, "GET /bye HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n") == 0 && cl_read(&A, &R) == 0;
    check(ok && R.status == 200 && R.conn_close && cl_wait_eof(&A), "Connection: close honoured");
    cl_close(&A);

    ok = cl_connect(&A, port) == 0 && cl_sends(&A, "GET /old HTTP/1.0\r\n\r\n") == 0 && cl_read(&A, &R) == 0;
    check(ok && R.status == 200 && R.conn_close && cl_wait_eof(&A), "HTTP/1.0 without keep-alive closes");
    cl_close(&A);
    ok = cl_connect(&A, port) == 0 && cl_sends(&A, "GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n") == 0 &&
         cl_read(&A, &R) == 0 && strstr(R.head, "Connection: keep-alive") &&
         cl_sends(&A, "GET /b HTTP/1.0\r\nConnection: keep-alive\r\n\r\n") == 0 && cl_read(&A, &R2) == 0;
    check(ok && R2.status == 200 && strstr(R2.body, "/b"), "HTTP/1.0 keep-alive");
    cl_close(&A);
}

static void t_pipelined(void) {
    int ok = cl_connect(&A, port) == 0 &&
             cl_sends(&A, "GET /p1 HTTP/1.1\r\nHost: x\r\n\r\nPOST /p2 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc") ==
                 0 &&
             cl_read(&A, &R) == 0 && cl_read(&A, &R2) == 0;
    check(ok && strstr(R.body, "\"path\":\"/p1\"") && strstr(R2.body, "\"path\":\"/p2\"") &&
              strstr(R2.body, "\"body\":\"abc\""),
          "two pipelined requests in one write answered in order");
    cl_close(&A);

    /* a parked request with a pipelined one behind it: order kept */
    double t0 = now_ms();
    ok = cl_connect(&A, port) == 0 &&
         cl_sends(&A, "GET /park HTTP/1.1\r\nHost: x\r\n\r\nGET /behind HTTP/1.1\r\nHost: x\r\n\r\n") == 0 &&
         cl_read(&A, &R) == 0 && cl_read(&A, &R2) == 0;
    double dt = now_ms() - t0;
    check(ok && strstr(R.body, "\"parked\":true") && strstr(R2.body, "\"path\":\"/behind\"") && dt >= 150,
          "pipelined behind a parked request: answered after it (%.0f ms)", dt);
    cl_close(&A);
}

static void t_park(void) {
    int before = atomic_load(&n_park_answered);
    double t0 = now_ms();
    int ok = cl_connect(&A, port) == 0 && cl_sends(&A, "GET /park HTTP/1.1\r\nHost: x\r\n\r\n") == 0 &&
             cl_read(&A, &R) == 0;
    double dt = now_ms() - t0;
    check(ok && R.status == 200 && strstr(R.body, "\"parked\":true") && dt >= 150 && dt < 2000,
          "parked request answered later (%.0f ms)", dt);
    /* the second respond was ignored and the connection is still usable */
    ok = ok && cl_sends(&A, "GET /after HTTP/1.1\r\nHost: x\r\n\r\n") == 0 && cl_read(&A, &R) == 0;
    check(ok && R.status == 200 && strstr(R.body, "/after") && atomic_load(&n_park_answered) == before + 1,
          "second respond ignored; keep-alive after a parked answer");
    cl_close(&A);

    /* client disconnects while parked */
    int ab = atomic_load(&n_abandon), answered = atomic_load(&n_park_answered);
    ok = cl_connect(&A, port) == 0 && cl_sends(&A, "GET /park HTTP/1.1\r\nHost: x\r\n\r\n") == 0;
    sleep_ms(50);
    cl_close(&A);
    sleep_ms(400);
    check(ok && atomic_load(&n_abandon) == ab + 1 && atomic_load(&n_park_answered) == answered,
          "parked request, client gone: abandon called exactly once (%d)", atomic_load(&n_abandon) - ab);
    ok = simple_get(port, "/still", &R) == 0;
    check(ok && R.status == 200 && strstr(R.body, "/still"), "server keeps working after an abandon");
}

/* A streamed response: chunked pieces as they are written, then keep-alive; an HTTP/1.0 client
 * gets the raw pieces until the close; a client that leaves mid-stream gets the abandon callback. */
static void t_stream(void) {
    const char *want = "data: piece 0\n\ndata: piece 1\n\ndata: piece 2\n\ndata: piece 3\n\n";
    int ok = cl_connect(&A, port) == 0 && cl_sends(&A, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n") == 0;
    int first_alone = 0;
    while (ok && !memmem(A.buf, A.len, "\r\n0\r\n\r\n", 7)) {
        ok = cl_fill(&A) > 0;
        /* the first piece arrives before the last one is written */
        if (ok && memmem(A.buf, A.len, "piece 0", 7) && !memmem(A.buf, A.len, "piece 3", 7)) first_alone = 1;
    }
    if (A.len < sizeof A.buf) A.buf[A.len] = 0;
    else ok = 0;
    char *end = ok ? memmem(A.buf, A.len, "\r\n\r\n", 4) : NULL;
    char body[256] = "";
    size_t bl = 0;
    int chunked = end && strcasestr(A.buf, "Transfer-Encoding: chunked\r\n") && strstr(A.buf, "text/event-stream") &&
                  !strcasestr(A.buf, "Content-Length");
    for (char *q = end ? end + 4 : NULL; q && chunked;) { /* de-chunk */
        size_t n = strtoul(q, &q, 16);
        if (strncmp(q, "\r\n", 2) || bl + n >= sizeof body) break;
        memcpy(body + bl, q + 2, n);
        bl += n;
        q += 2 + n + 2;
        if (!n) break;
    }
    body[bl] = 0;
    check(ok && chunked && !strcmp(body, want) && first_alone, "stream: chunked pieces as written, first before last");
    size_t used = end ? (size_t)(strstr(end, "\r\n0\r\n\r\n") + 7 - A.buf) : 0;
    if (ok && used <= A.len) {
        memmove(A.buf, A.buf + used, A.len - used);
        A.len -= used;
    }
    ok = ok && cl_sends(&A, "GET /after_stream HTTP/1.1\r\nHost: x\r\n\r\n") == 0 && cl_read(&A, &R) == 0;
    check(ok && R.status == 200 && strstr(R.body, "/after_stream"), "stream: keep-alive after its end");
    cl_close(&A);

    ok = cl_connect(&A, port) == 0 && cl_sends(&A, "GET /stream HTTP/1.0\r\n\r\n") == 0;
    while (ok && cl_fill(&A) > 0) {
    }
    A.buf[A.len < sizeof A.buf ? A.len : sizeof A.buf - 1] = 0;
    end = strstr(A.buf, "\r\n\r\n");
    check(ok && end && !strcmp(end + 4, want) && !strcasestr(A.buf, "Transfer-Encoding"),
          "stream to HTTP/1.0: the pieces until the close");
    cl_close(&A);

    int ab = atomic_load(&n_stream_abandon), ended = atomic_load(&n_stream_ended);
    ok = cl_connect(&A, port) == 0 && cl_sends(&A, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n") == 0;
    while (ok && !memmem(A.buf, A.len, "piece 0", 7)) ok = cl_fill(&A) > 0;
    cl_close(&A);
    sleep_ms(300);
    check(ok && atomic_load(&n_stream_abandon) == ab + 1 && atomic_load(&n_stream_ended) == ended,
          "stream, client gone mid-stream: abandon called once, no end");
    ok = simple_get(port, "/still_streaming", &R) == 0;
    check(ok && R.status == 200, "server keeps working after an abandoned stream");
}

/* Parked without an abandon callback, client gone: the server keeps the
 * connection's memory until the late respond (ASan checks that it is not
 * touched after being freed). */
static void t_park_no_abandon(void) {
    int answered = atomic_load(&n_park_answered), ab = atomic_load(&n_abandon);
    int ok = cl_connect(&A, port) == 0 && cl_sends(&A, "GET /park_noabandon HTTP/1.1\r\nHost: x\r\n\r\n") == 0;
    sleep_ms(50);
    cl_close(&A);
    for (int i = 0; i < 100 && atomic_load(&n_park_answered) == answered; i++) sleep_ms(10);
    ok = ok && atomic_load(&n_park_answered) == answered + 1 && atomic_load(&n_abandon) == ab;
    ok = ok && simple_get(port, "/after_zombie", &R) == 0 && R.status == 200;
    check(ok, "parked without abandon callback, client gone: late respond is safe");
}

typedef struct sender {
    client *cl;
    const char *data;
    size_t len;
    int rc;
} sender;

static void *send_thread(void *arg) {
    sender *sd = arg;
    sd->rc = cl_send(sd->cl, sd->data, sd->len);
    return NULL;
}

/* Many pipelined requests behind a parked one: the server stops reading
 * while it is parked (buffer cap), then answers everything in order. */
static void t_pipeline_flood(void) {
    enum { N = 12000 };
    size_t cap = (size_t)N * 64 + 256, len = 0;
    char *buf = malloc(cap);
    len += (size_t)snprintf(buf + len, cap - len, "GET /park HTTP/1.1\r\nHost: x\r\n\r\n");
    for (int i = 0; i < N; i++) len += (size_t)snprintf(buf + len, cap - len, "GET /f%d HTTP/1.1\r\nHost: x\r\n\r\n", i);
    int ok = cl_connect(&A, port) == 0;
    sender sd = {&A, buf, len, -1};
    pthread_t th;
    if (ok) pthread_create(&th, NULL, send_thread, &sd);
    ok = ok && cl_read(&A, &R) == 0 && strstr(R.body, "\"parked\":true");
    int in_order = 0;
    for (int i = 0; ok && i < N; i++) {
        char want[64];
        snprintf(want, sizeof want, "\"path\":\"/f%d\"", i);
        if (cl_read(&A, &R) != 0 || !strstr(R.body, want)) break;
        in_order++;
    }
    if (sd.cl == &A && A.fd >= 0) pthread_join(th, NULL);
    check(ok && in_order == N && sd.rc == 0, "%zu KiB pipelined behind a parked request: %d/%d in order", len >> 10,
          in_order, N);
    cl_close(&A);
    free(buf);

    /* a request after "Connection: close" in the same write is not answered */
    ok = cl_connect(&A, port) == 0 &&
         cl_sends(&A, "GET /last HTTP/1.1\r\nConnection: close\r\n\r\nGET /never HTTP/1.1\r\n\r\n") == 0 &&
         cl_read(&A, &R) == 0;
    check(ok && strstr(R.body, "/last") && R.conn_close && cl_wait_eof(&A), "nothing answered after Connection: close");
    cl_close(&A);

    /* a body exactly at the limit, sent in pieces */
    ok = cl_connect(&A, port) == 0 &&
         cl_sends(&A, "POST /full HTTP/1.1\r\nHost: x\r\nContent-Length: 1024\r\n\r\n") == 0;
    char chunk[256];
    memset(chunk, 'z', sizeof chunk);
    for (int i = 0; ok && i < 4; i++) {
        ok = cl_send(&A, chunk, sizeof chunk) == 0;
        sleep_ms(5);
    }
    ok = ok && cl_read(&A, &R) == 0;
    check(ok && R.status == 200 && strstr(R.body, "\"body_len\":1024"), "body exactly at the limit accepted");
    cl_close(&A);
}

static void t_limits(void) {
    /* Content-Length over the limit, body sent anyway (drained, no reset) */
    char *req = malloc(8192);
    int n = snprintf(req, 8192, "POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n");
    memset(req + n, 'a', 5000);
    int ok = cl_connect(&A, port) == 0 && cl_send(&A, req, (size_t)n + 5000) == 0 && cl_read(&A, &R) == 0;
    check(ok && R.status == 413 && R.conn_close &&
              is_json_error(&R, "request body of 5000 bytes exceeds the limit of 1024 bytes") && cl_wait_eof(&A),
          "body over the limit: 413 %s", R.body);
    cl_close(&A);
    free(req);

    /* chunked body over the limit */
    ok = cl_connect(&A, port) == 0 &&
         cl_sends(&A, "POST /bigc HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n") == 0;
    char chunk[1024];
    memset(chunk, 'b', sizeof chunk);
    ok = ok && cl_send(&A, chunk, sizeof chunk) == 0 && cl_sends(&A, "\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n") == 0 &&
         cl_read(&A, &R) == 0;
    check(ok && R.status == 413 && is_json_error(&R, "exceeds the limit of 1024 bytes"),
          "chunked body over the limit: 413 %s", R.body);
    cl_close(&A);

    /* garbage */
    ok = cl_connect(&A, port) == 0 && cl_sends(&A, "\x01\x02 this is not HTTP\r\n\r\n") == 0 && cl_read(&A, &R) == 0;
    check(ok && R.status == 400 && R.conn_close && is_json_error(&R, "malformed HTTP request: ") && cl_wait_eof(&A),
          "garbage: 400 %s", R.body);
    cl_close(&A);
    ok = cl_connect(&A, port) == 0 && cl_sends(&A, "GET / HTTP/1.1\r\nBad Header\r\n\r\n") == 0 &&
         cl_read(&A, &R) == 0;
    check(ok && R.status == 400 && is_json_error(&R, "malformed HTTP request: "), "bad header line: 400 %s", R.body);
    cl_close(&A);

    /* header over the limit */
    char *big = malloc(MAX_HEADER * 2 + 256);
    n = snprintf(big, 256, "GET /h HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(big + n, 'h', MAX_HEADER * 2);
    memcpy(big + n + MAX_HEADER * 2, "\r\n\r\n", 5);
    ok = cl_connect(&A, port) == 0 && cl_sends(&A, big) == 0 && cl_read(&A, &R) == 0;
    check(ok && R.status == 431 && R.conn_close && is_json_error(&R, "request headers exceed the limit of 2048 bytes"),
          "header over the limit: 431 %s", R.body);
    cl_close(&A);
    /* a long URL counts too */
    n = snprintf(big, 256, "GET /");
    memset(big + n, 'u', MAX_HEADER * 2);
    memcpy(big + n + MAX_HEADER * 2, " HTTP/1.1\r\n\r\n", 14);
    ok = cl_connect(&A, port) == 0 && cl_sends(&A, big) == 0 && cl_read(&A, &R) == 0;
    check(ok && R.status == 431 && is_json_error(&R, NULL), "URL over the header limit: 431");
    cl_close(&A);
    free(big);
}

static void t_timeouts(void) {
    /* body never completes */
    double t0 = now_ms();
    int ok = cl_connect(&A, port) == 0 &&
             cl_sends(&A, "POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc") == 0 && cl_read(&A, &R) == 0;
    double dt = now_ms() - t0;
    check(ok && R.status == 408 && R.conn_close && is_json_error(&R, "within 300 ms") && dt >= READ_TIMEOUT_MS - 20 &&
              dt < READ_TIMEOUT_MS + 1000 && cl_wait_eof(&A),
          "incomplete body: 408 after %.0f ms %s", dt, R.body);
    cl_close(&A);

    /* slowloris: headers trickle in, each write resetting nothing */
    t0 = now_ms();
    ok = cl_connect(&A, port) == 0 && cl_sends(&A, "GET /slow HTTP/1.1\r\n") == 0;
    for (int i = 0; ok && i < 3; i++) {
        sleep_ms(120);
        ok = cl_sends(&A, "X-A: b\r\n") == 0;
    }
    ok = ok && cl_read(&A, &R) == 0;
    dt = now_ms() - t0;
    check(ok && R.status == 408 && is_json_error(&R, NULL) && dt < READ_TIMEOUT_MS + 200,
          "trickled headers: 408 after %.0f ms (counted from the first byte)", dt);
    cl_close(&A);

    /* idle keep-alive connection */
    ok = cl_connect(&A, port) == 0 && cl_sends(&A, "GET /i HTTP/1.1\r\nHost: x\r\n\r\n") == 0 && cl_read(&A, &R) == 0;
    t0 = now_ms();
    int eof = ok && cl_wait_eof(&A);
    dt = now_ms() - t0;
    check(ok && eof && dt >= IDLE_TIMEOUT_MS - 50 && dt < IDLE_TIMEOUT_MS + 1000,
          "idle keep-alive connection closed after %.0f ms", dt);
    cl_close(&A);

    /* a connection that never sends anything */
    t0 = now_ms();
    ok = cl_connect(&A, port) == 0 && cl_wait_eof(&A);
    dt = now_ms() - t0;
    check(ok && dt >= IDLE_TIMEOUT_MS - 50, "silent connection closed after %.0f ms", dt);
    cl_close(&A);
}

/* Requests /bigresp (16 MiB) with a small receive buffer, then reads it,
 * pausing pause_ms every 2 MiB (after a first pause of first_ms). Returns
 * the body bytes received before EOF/reset. */
static size_t big_download(int first_ms, int pause_ms) {
    client *cl = &A;
    cl->len = 0;
    cl->fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 64 << 10;
    setsockopt(cl->fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct timeval tv = {3, 0};
    setsockopt(cl->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    size_t got = 0, head = 0;
    if (connect(cl->fd, (struct sockaddr *)&a, sizeof a) != 0 || cl_sends(cl, "GET /bigresp HTTP/1.1\r\nHost: x\r\n\r\n"))
        goto out;
    sleep_ms(first_ms);
    size_t next_pause = 2u << 20;
    for (;;) {
        ssize_t k = recv(cl->fd, cl->buf, sizeof cl->buf, 0);
        if (k <= 0) break;
        if (!head) { /* the head arrives first and fits */
            char *e = memmem(cl->buf, (size_t)k, "\r\n\r\n", 4);
            if (!e) break;
            head = (size_t)(e - cl->buf) + 4;
            got += (size_t)k - head;
        } else {
            got += (size_t)k;
        }
        if (got >= BIG_RESP) break;
        if (got >= next_pause) {
            sleep_ms(pause_ms);
            next_pause += 2u << 20;
        }
    }
out:
    cl_close(cl);
    return got;
}

static void t_slow_reader(void) {
    double t0 = now_ms();
    size_t got = big_download(0, 90);
    double dt = now_ms() - t0;
    check(got == BIG_RESP && dt > IDLE_TIMEOUT_MS, "slow but steady reader gets all of a 16 MiB response (%.0f ms)", dt);
    got = big_download(IDLE_TIMEOUT_MS + 300, 0);
    check(got < BIG_RESP, "stalled reader dropped after the idle timeout (%zu of %zu bytes)", got, BIG_RESP);
}

static void t_concurrent(void) {
    int connected = 0, answered = 0;
    for (int i = 0; i < N_CONCURRENT; i++) connected += cl_connect(&many[i], port) == 0;
    for (int i = 0; i < N_CONCURRENT; i++) {
        char req[128];
        snprintf(req, sizeof req, "GET /c%d HTTP/1.1\r\nHost: x\r\n\r\n", i);
        if (many[i].fd >= 0) cl_sends(&many[i], req);
    }
    for (int i = 0; i < N_CONCURRENT; i++) {
        char want[64];
        snprintf(want, sizeof want, "\"path\":\"/c%d\"", i);
        if (many[i].fd >= 0 && cl_read(&many[i], &R) == 0 && R.status == 200 && strstr(R.body, want)) answered++;
    }
    for (int i = 0; i < N_CONCURRENT; i++) cl_close(&many[i]);
    check(connected == N_CONCURRENT && answered == N_CONCURRENT, "%d concurrent connections: %d answered", connected,
          answered);
}

static void t_bodies(void) {
    int ok = cl_connect(&A, port) == 0 &&
             cl_sends(&A, "POST /chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                          "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n") == 0 &&
             cl_read(&A, &R) == 0;
    check(ok && R.status == 200 && strstr(R.body, "\"body_len\":11") && strstr(R.body, "\"body\":\"hello world\""),
          "chunked request body: %s", R.body);
    /* same connection: a request split across many writes, header name and value split too */
    const char *parts[] = {"GET /sp", "lit?q=1 HTTP/1.1\r\nHo", "st: x\r\nX-Te", "st: hel", "lo wor", "ld\r\n", "\r\n"};
    for (size_t i = 0; ok && i < sizeof parts / sizeof *parts; i++) {
        ok = cl_sends(&A, parts[i]) == 0;
        sleep_ms(15);
    }
    ok = ok && cl_read(&A, &R) == 0;
    check(ok && strstr(R.body, "\"path\":\"/split\"") && strstr(R.body, "\"query\":\"q=1\"") &&
              strstr(R.body, "\"x_test\":\"hello world\""),
          "request split across writes (folded callbacks): %s", R.body);
    /* Expect: 100-continue */
    ok = ok && cl_sends(&A, "POST /exp HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n") == 0 &&
         cl_read(&A, &R) == 0 && R.status == 100 && cl_sends(&A, "data") == 0 && cl_read(&A, &R2) == 0;
    check(ok && R2.status == 200 && strstr(R2.body, "\"body\":\"data\""), "Expect: 100-continue");
    /* a body with a NUL in it, and an empty-valued header */
    static const char nul_req[] = "PUT /nul HTTP/1.1\r\nHost: x\r\nX-Test:\r\nContent-Length: 3\r\n\r\na\0b";
    ok = ok && cl_send(&A, nul_req, sizeof nul_req - 1) == 0 &&
         cl_read(&A, &R) == 0;
    check(ok && strstr(R.body, "\"method\":\"PUT\"") && strstr(R.body, "\"body_len\":3") && strstr(R.body, "\"x_test\":\"\""),
          "binary body and empty header value: %s", R.body);
    /* 204: no Content-Length, no body, extra header */
    ok = ok && cl_sends(&A, "DELETE /nocontent HTTP/1.1\r\nHost: x\r\n\r\n") == 0 && cl_read(&A, &R) == 0;
    check(ok && R.status == 204 && !strstr(R.head, "Content-Length") && strstr(R.head, "X-Extra: 1\r\n"), "204 response");
    /* HEAD: headers only */
    ok = ok && cl_sends(&A, "HEAD /h HTTP/1.1\r\nHost: x\r\n\r\nGET /afterhead HTTP/1.1\r\nHost: x\r\n\r\n") == 0;
    if (ok) { /* the HEAD response has a Content-Length but no body: read just the head */
        while (!memmem(A.buf, A.len, "\r\n\r\n", 4) && cl_fill(&A) > 0) {}
        char *e = memmem(A.buf, A.len, "\r\n\r\n", 4);
        ok = e && strncmp(A.buf, "HTTP/1.1 200", 12) == 0;
        if (ok) {
            size_t hl = (size_t)(e - A.buf) + 4;
            memmove(A.buf, A.buf + hl, A.len - hl);
            A.len -= hl;
        }
        ok = ok && cl_read(&A, &R) == 0 && strstr(R.body, "/afterhead");
    }
    check(ok, "HEAD answered without a body");
    cl_close(&A);
}

/* 1 when the server has closed cl's connection (EOF or reset readable now),
 * 0 when it is open and silent. */
static int cl_closed_now(client *cl) {
    struct pollfd pf = {cl->fd, POLLIN, 0};
    if (poll(&pf, 1, 0) <= 0) return 0;
    char b[64];
    ssize_t k = recv(cl->fd, b, sizeof b, MSG_DONTWAIT | MSG_PEEK);
    return k == 0 || (k < 0 && errno == ECONNRESET);
}

static void t_max_connections(void) {
    /* the one slot held by an authenticated client: a new connection is refused */
    int ok = cl_connect(&A, port_small) == 0 &&
             cl_sends(&A, "GET /api/v1/sessions HTTP/1.1\r\nX-API-Key: " ALICE_KEY "\r\n\r\n") == 0 &&
             cl_read(&A, &R) == 0 && R.status == 200;
    int refused = ok && cl_connect(&B, port_small) == 0 && cl_wait_eof(&B);
    cl_close(&B);
    ok = ok && cl_sends(&A, "GET /api/v1/sessions HTTP/1.1\r\nX-API-Key: " ALICE_KEY "\r\n\r\n") == 0 &&
         cl_read(&A, &R) == 0 && R.status == 200;
    check(ok && refused, "max_connections: past the limit, a new connection is refused, the keyed one kept");
    cl_close(&A);
    int ok2 = 0;
    for (int i = 0; i < 50 && !ok2; i++) { /* the server notices A's close asynchronously */
        sleep_ms(20);
        ok2 = simple_get(port_small, "/two", &R) == 0 && R.status == 200;
    }
    check(ok2, "max_connections: a slot frees when a connection closes");

    /* the slot held by an idle unauthenticated client: it is closed to make room */
    ok = cl_connect(&A, port_small) == 0 && cl_sends(&A, "GET /one HTTP/1.1\r\nHost: x\r\n\r\n") == 0 &&
         cl_read(&A, &R) == 0 && R.status == 200;
    ok = ok && cl_connect(&B, port_small) == 0 && cl_sends(&B, "GET /api/v1/healthz HTTP/1.1\r\n\r\n") == 0 &&
         cl_read(&B, &R2) == 0 && R2.status == 200;
    check(ok && cl_wait_eof(&A), "max_connections: an idle unauthenticated connection makes room for a new one");
    cl_close(&A);
    cl_close(&B);
}

/* Finding 1 of issue 18: a chunked request's trailers were added to the
 * headers, the last one left without its NUL. */
static void t_trailers(void) {
    /* the reviewer's keep-alive pair: B's 4-byte "tml-" trailer was completed
     * by A's key left in the connection's buffer */
    char pad[41], bs[27], req[512];
    memset(pad, 'p', 40);
    pad[40] = 0;
    memset(bs, 'b', 26);
    bs[26] = 0;
    snprintf(req, sizeof req, "GET /api/v1/sessions HTTP/1.1\r\nHost: x\r\nX-Pad: %s\r\nX-API-Key: " ALICE_KEY "\r\n\r\n",
             pad);
    int ok = cl_connect(&A, port) == 0 && cl_sends(&A, req) == 0 && cl_read(&A, &R) == 0 && R.status == 200;
    snprintf(req, sizeof req,
             "GET /api/v1/sessions?%s HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-API-Key: tml-\r\n\r\n", bs);
    ok = ok && cl_sends(&A, req) == 0 && cl_read(&A, &R2) == 0;
    check(ok && R.status == 200 && R2.status == 401 && !strstr(R2.body, "alice"),
          "keep-alive: a later request's trailer does not complete an earlier key: %d %s", R2.status, R2.body);
    cl_close(&A);

    /* a key sent only as a trailer is not a header */
    ok = cl_connect(&A, port) == 0 &&
         cl_sends(&A, "POST /api/v1/sessions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                      "2\r\n{}\r\n0\r\nX-API-Key: " ALICE_KEY "\r\n\r\n") == 0 &&
         cl_read(&A, &R) == 0;
    check(ok && R.status == 401, "a key only in a trailer: %d %s", R.status, R.body);
    /* nor any other trailer: the echo shows no x-test */
    ok = ok && cl_sends(&A, "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Test: t\r\n\r\n") ==
                   0 &&
         cl_read(&A, &R) == 0;
    check(ok && R.status == 200 && strstr(R.body, "\"x_test\":\"\"") && strstr(R.body, "\"body\":\"abc\""),
          "trailers are dropped: %s", R.body);
    cl_close(&A);

    /* the reviewer's minimal ASan crash (an unterminated trailer name read as a
     * header): without a version it is HTTP/0.9 (505); with one, served */
    static const char crash[] = "POST /\nTransfer-Encoding:chunked\n\n0\r\nT:\n\n";
    ok = cl_connect(&A, port) == 0 && cl_send(&A, crash, sizeof crash - 1) == 0 && cl_read(&A, &R) == 0;
    check(ok && R.status == 505 && R.conn_close && cl_wait_eof(&A), "minimal trailer crash input answered cleanly: %d %s",
          R.status, R.body);
    cl_close(&A);
    static const char crash11[] = "POST / HTTP/1.1\nTransfer-Encoding:chunked\n\n0\r\nT:\n\n";
    ok = cl_connect(&A, port) == 0 && cl_send(&A, crash11, sizeof crash11 - 1) == 0 && cl_read(&A, &R) == 0;
    check(ok && R.status == 200 && strstr(R.body, "\"path\":\"/\"") && strstr(R.body, "\"body_len\":0"),
          "the same with HTTP/1.1: served, the trailer dropped: %d %s", R.status, R.body);
    cl_close(&A);

    /* trailers count against the header limit */
    char *big = malloc(MAX_HEADER * 2 + 256);
    int n = snprintf(big, 256, "POST /t HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-Big: ");
    memset(big + n, 't', MAX_HEADER * 2);
    memcpy(big + n + MAX_HEADER * 2, "\r\n\r\n", 5);
    ok = cl_connect(&A, port) == 0 && cl_sends(&A, big) == 0 && cl_read(&A, &R) == 0;
    check(ok && R.status == 431, "trailers over the header limit: %d", R.status);
    cl_close(&A);
    free(big);
}

/* Finding 9: the request target is a normalised path; versions 1.0 and 1.1
 * only; a chunk size past the body limit or 2^64 is refused at once. */
static void t_targets_versions(void) {
    static const char *bad[] = {"/whatever/../x/api/v1/training_runs", "/a/./b", "/..", "/.", "//api/v1/sessions",
                                "/api//v1", "/a/%2e%2e/b", "/a/%2E./b", "/a/.%2e", "/a%2fb", "/a%2Fb", "/a%5cb",
                                "/a%00b", "/a%zzb", "/a%4", "/a\\b", "http://x/api/v1/sessions", "*", "/x#frag",
                                "/x?q=1#frag"};
    int n_bad = 0;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char req[256];
        snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nX-API-Key: " ALICE_KEY "\r\n\r\n", bad[i]);
        int ok = cl_connect(&A, port) == 0 && cl_sends(&A, req) == 0 && cl_read(&A, &R) == 0;
        if (ok && R.status == 400 && is_json_error(&R, "bad request target")) n_bad++;
        else printf("     %s -> %d %s\n", bad[i], R.status, R.body);
        cl_close(&A);
    }
    check(n_bad == (int)(sizeof bad / sizeof *bad), "targets with traversal, '//', encoded separators: 400 (%d of %zu)",
          n_bad, sizeof bad / sizeof *bad);
    int ok = simple_get(port, "/a.b/..c/.../%41%2d?x=../..//%2f", &R) == 0;
    check(ok && R.status == 200 && strstr(R.body, "\"path\":\"/a.b/..c/.../%41%2d\"") &&
              strstr(R.body, "\"query\":\"x=../..//%2f\""),
          "dots inside names, harmless escapes and anything in the query pass: %s", R.body);

    static const char *versions[] = {"GET /x HTTP/9.9\r\n\r\n", "GET /x HTTP/1.2\r\n\r\n", "GET /x HTTP/2.0\r\n\r\n",
                                     "GET /x HTTP/0.9\r\n\r\n", "GET /x\r\n\r\n"};
    int n505 = 0;
    for (size_t i = 0; i < sizeof versions / sizeof *versions; i++) {
        ok = cl_connect(&A, port) == 0 && cl_sends(&A, versions[i]) == 0 && cl_read(&A, &R) == 0;
        if (ok && R.status == 505 && is_json_error(&R, "only 1.0 and 1.1")) n505++;
        else printf("     %.16s -> %d %s\n", versions[i], R.status, R.body);
        cl_close(&A);
    }
    check(n505 == (int)(sizeof versions / sizeof *versions), "HTTP/9.9, 1.2, 2.0, 0.9 and none: 505 (%d of %zu)", n505,
          sizeof versions / sizeof *versions);

    /* chunk sizes: 2^63, past 2^64, and one byte past the limit, each before any chunk data */
    static const char *sizes[] = {"8000000000000000", "FFFFFFFFFFFFFFFFFFFF", "401"};
    int n413 = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        char req[256];
        snprintf(req, sizeof req, "POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n%s\r\n", sizes[i]);
        ok = cl_connect(&A, port) == 0 && cl_sends(&A, req) == 0 && cl_read(&A, &R) == 0;
        /* a 408 would mean the server waited for the chunk (the read timeout) */
        if (ok && R.status == 413 && is_json_error(&R, "1024 bytes")) n413++;
        else printf("     chunk size %s -> %d %s\n", sizes[i], R.status, R.body);
        cl_close(&A);
    }
    check(n413 == (int)(sizeof sizes / sizeof *sizes), "chunk sizes 2^63, > 2^64 and limit+1: 413 before the data (%d of %zu)",
          n413, sizeof sizes / sizeof *sizes);
}

#define N_IDLE 24
static client idle_cl[N_IDLE];

/* Finding 2: idle connections without a key must not lock anyone out. */
static void t_connection_caps(void) {
    /* an authenticated client first */
    static const char keyed[] = "GET /api/v1/sessions HTTP/1.1\r\nX-API-Key: " ALICE_KEY "\r\n\r\n";
    int ok = cl_connect_from(&A, port_caps, 1) == 0 && cl_sends(&A, keyed) == 0 && cl_read(&A, &R) == 0 &&
             R.status == 200;
    check(ok, "caps: keyed client connected");
    /* N_IDLE silent connections from one address (over the per-address cap), then the
     * same from several addresses (over the total cap) */
    int connected = 0;
    for (int i = 0; i < N_IDLE / 2; i++) connected += cl_connect_from(&idle_cl[i], port_caps, 2) == 0;
    /* a request from elsewhere: once answered, every earlier connection was accepted */
    ok = cl_connect_from(&B, port_caps, 20) == 0 && cl_sends(&B, "GET /api/v1/healthz HTTP/1.1\r\n\r\n") == 0 &&
         cl_read(&B, &R) == 0 && R.status == 200;
    cl_close(&B);
    int open_same = 0;
    for (int i = 0; i < N_IDLE / 2; i++) open_same += !cl_closed_now(&idle_cl[i]);
    int oldest_closed = 1;
    for (int i = 0; i < N_IDLE / 2 - CAP_PER_ADDR; i++) oldest_closed &= cl_closed_now(&idle_cl[i]);
    check(ok && connected == N_IDLE / 2 && open_same == CAP_PER_ADDR && oldest_closed,
          "per-address cap %d: %d idle connections from one address, %d left open (the newest)", CAP_PER_ADDR,
          connected, open_same);
    for (int i = N_IDLE / 2; i < N_IDLE; i++) connected += cl_connect_from(&idle_cl[i], port_caps, 3 + i % 4) == 0;
    /* healthz and a keyed request on new connections still succeed */
    ok = cl_connect_from(&B, port_caps, 21) == 0 && cl_sends(&B, "GET /api/v1/healthz HTTP/1.1\r\n\r\n") == 0 &&
         cl_read(&B, &R) == 0 && R.status == 200;
    check(ok, "caps: /api/v1/healthz answered with %d idle connections held open", N_IDLE);
    ok = cl_connect_from(&B, port_caps, 22) == 0 && cl_sends(&B, keyed) == 0 && cl_read(&B, &R) == 0 &&
         R.status == 200;
    check(ok, "caps: a keyed request on a new connection answered");
    int open_idle = 0;
    for (int i = 0; i < N_IDLE; i++) open_idle += !cl_closed_now(&idle_cl[i]);
    /* the first keyed client was never closed to make room */
    int a_ok = cl_sends(&A, keyed) == 0 && cl_read(&A, &R) == 0 && R.status == 200;
    check(a_ok && open_idle <= CAP_TOTAL - 2, "caps: the keyed connection kept; %d of %d idle ones still open (cap %d)",
          open_idle, connected, CAP_TOTAL);
    /* every slot authenticated: a new connection is refused rather than evicting one */
    client keyed_cl[CAP_TOTAL];
    int n_keyed = 0;
    for (int i = 0; i < CAP_TOTAL - 2; i++)
        n_keyed += cl_connect_from(&keyed_cl[i], port_caps, 30 + i) == 0 && cl_sends(&keyed_cl[i], keyed) == 0 &&
                   cl_read(&keyed_cl[i], &R) == 0 && R.status == 200;
    int refused = cl_connect_from(&C0, port_caps, 40) == 0 && cl_wait_eof(&C0);
    cl_close(&C0);
    check(n_keyed == CAP_TOTAL - 2 && refused, "caps: with every slot keyed, a new connection is refused");
    for (int i = 0; i < CAP_TOTAL - 2; i++) cl_close(&keyed_cl[i]);
    for (int i = 0; i < N_IDLE; i++) cl_close(&idle_cl[i]);
    cl_close(&A);
    cl_close(&B);
}

/* The header timeout: silent or slow connections without a key go first. */
static void t_header_timeout(void) {
    static const char keyed[] = "GET /api/v1/sessions HTTP/1.1\r\nX-API-Key: " ALICE_KEY "\r\n\r\n";
    int ok = cl_connect(&A, port_ht) == 0 && cl_sends(&A, keyed) == 0 && cl_read(&A, &R) == 0 && R.status == 200;
    /* a silent connection is closed (the idle timeout is 30 s: only the header timeout can close it) */
    int silent = cl_connect(&B, port_ht) == 0 && cl_wait_eof(&B);
    cl_close(&B);
    check(ok && silent, "header timeout: a silent connection is closed");
    /* headers that trickle in: 408 naming the header timeout */
    ok = cl_connect(&B, port_ht) == 0 && cl_sends(&B, "GET /slow HTTP/1.1\r\n") == 0 && cl_read(&B, &R) == 0;
    check(ok && R.status == 408 && is_json_error(&R, "request headers not received within 200 ms"),
          "header timeout: incomplete headers get 408: %s", R.body);
    cl_close(&B);
    /* an unauthenticated keep-alive connection goes idle: closed */
    ok = cl_connect(&B, port_ht) == 0 && cl_sends(&B, "GET /api/v1/healthz HTTP/1.1\r\n\r\n") == 0 &&
         cl_read(&B, &R) == 0 && R.status == 200 && cl_wait_eof(&B);
    check(ok, "header timeout: an idle connection that never sent a key is closed");
    cl_close(&B);
    /* the authenticated one, idle all along, is still served */
    ok = cl_sends(&A, keyed) == 0 && cl_read(&A, &R) == 0 && R.status == 200;
    check(ok, "header timeout: the keyed connection, idle meanwhile, is kept");
    cl_close(&A);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    double t_start = now_ms();
    uv_loop_init(&loop);
    twk_http_limits lim = twk_http_limits_default();
    check(lim.max_body_bytes == 64u << 20 && lim.max_header_bytes == 64u << 10 && lim.idle_timeout_ms == 75000 &&
              lim.read_timeout_ms == 30000 && lim.header_timeout_ms == 10000 && lim.max_connections == 4096 &&
              lim.max_connections_per_addr == 512,
          "default limits");
    lim.max_body_bytes = MAX_BODY;
    lim.max_header_bytes = MAX_HEADER;
    lim.idle_timeout_ms = IDLE_TIMEOUT_MS;
    lim.read_timeout_ms = READ_TIMEOUT_MS;
    lim.max_connections = 1000;
    int rc = twk_http_server_start(&loop, "127.0.0.1", 0, &lim, handler, NULL, &srv);
    port = twk_http_server_port(srv);
    check(rc == 0 && port > 0, "server started on 127.0.0.1:%d", port);
    twk_http_limits small = lim;
    small.max_connections = 1;
    rc = twk_http_server_start(&loop, "127.0.0.1", 0, &small, handler, NULL, &srv_small);
    port_small = twk_http_server_port(srv_small);
    check(rc == 0 && port_small > 0, "second server (max_connections 1) on port %d", port_small);
    twk_http_limits caps = lim;
    caps.max_connections = CAP_TOTAL;
    caps.max_connections_per_addr = CAP_PER_ADDR;
    caps.idle_timeout_ms = caps.header_timeout_ms = caps.read_timeout_ms = 60000;
    rc = twk_http_server_start(&loop, "127.0.0.1", 0, &caps, handler, NULL, &srv_caps);
    port_caps = twk_http_server_port(srv_caps);
    check(rc == 0 && port_caps > 0, "third server (%d connections, %d per address) on port %d", CAP_TOTAL, CAP_PER_ADDR,
          port_caps);
    twk_http_limits ht = lim;
    ht.idle_timeout_ms = ht.read_timeout_ms = 30000;
    ht.header_timeout_ms = HEADER_TIMEOUT_MS;
    rc = twk_http_server_start(&loop, "127.0.0.1", 0, &ht, handler, NULL, &srv_ht);
    port_ht = twk_http_server_port(srv_ht);
    check(rc == 0 && port_ht > 0, "fourth server (header timeout %d ms) on port %d", HEADER_TIMEOUT_MS, port_ht);
    twk_http_server *dup = NULL;
    rc = twk_http_server_start(&loop, "127.0.0.1", port, &lim, handler, NULL, &dup);
    check(rc == UV_EADDRINUSE && dup == NULL, "port in use: %s", uv_err_name(rc));
    rc = twk_http_server_start(&loop, "not-an-ip", 0, &lim, handler, NULL, &dup);
    check(rc == UV_EINVAL && dup == NULL, "bad host: %s", uv_err_name(rc));
    uv_async_init(&loop, &stop_async, on_stop);
    if (!srv || !srv_small || !srv_caps || !srv_ht) return 1;

    pthread_t th;
    pthread_create(&th, NULL, loop_thread, NULL);

    t_get_post();
    t_keepalive();
    t_pipelined();
    t_park();
    t_stream();
    t_park_no_abandon();
    t_pipeline_flood();
    t_limits();
    t_timeouts();
    t_concurrent();
    t_slow_reader();
    t_bodies();
    t_max_connections();
    t_trailers();
    t_targets_versions();
    t_connection_caps();
    t_header_timeout();

    int ok = simple_get(port, "/final?done=1", &R) == 0;
    check(ok && R.status == 200 && strstr(R.body, "\"path\":\"/final\""), "a well-formed request still succeeds");

    /* stop with a request still parked: its abandon callback runs */
    int ab = atomic_load(&n_abandon);
    int n0 = atomic_load(&n_requests);
    ok = cl_connect(&A, port) == 0 &&
         cl_sends(&A, "GET /park_long HTTP/1.1\r\nHost: x\r\n\r\n") == 0 &&
         cl_connect(&B, port) == 0;
    for (int i = 0; i < 200 && atomic_load(&n_requests) == n0; i++) sleep_ms(5);
    sleep_ms(20);
    uv_async_send(&stop_async);
    pthread_join(th, NULL);
    check(ok && atomic_load(&n_abandon) == ab + 1, "stop: the parked request was abandoned (%d)",
          atomic_load(&n_abandon) - ab);
    check(cl_wait_eof(&A) && cl_wait_eof(&B), "stop: connections closed");
    cl_close(&A);
    cl_close(&B);
    rc = uv_loop_close(&loop);
    check(rc == 0, "loop closed cleanly after stop (%s)", rc ? uv_err_name(rc) : "0");

    printf("%s (%d failures, %.0f ms)\n", check_failures ? "FAILED" : "all passed", check_failures, now_ms() - t_start);
    return check_failures ? 1 : 0;
}
