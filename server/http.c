/* server/http.c — HTTP/1.1 on libuv with http_parser (see http.h).
 *
 * One connection = one uv_tcp_t + one uv_timer_t, both closed with uv_close;
 * the struct is freed when both close callbacks ran. Bytes read are appended
 * to an input buffer and parsed from there; the parser is paused at the end
 * of every request (on_message_complete), so a pipelined request behind it
 * stays in the buffer until the current one has been answered. Reading goes
 * on while a request is outstanding (so a client that disconnects from a
 * parked long poll is noticed) until IN_CAP unparsed bytes are buffered.
 *
 * The one timer per connection serves, by mode: the idle timeout (nothing
 * outstanding, no request begun; the short header timeout until a handler
 * marked the connection authenticated), the read timeout (a request began
 * arriving: its headers must be complete within header_timeout_ms and all of
 * it within read_timeout_ms, both counted from its first byte), a
 * 0 ms "resume" after a deferred response (so parsing the next pipelined
 * request never runs inside the caller's twk_http_respond), and the linger
 * after a final error response (write, shutdown, drain what the client is
 * still sending for up to LINGER_MS, then close — so the client reads the
 * 4xx instead of a reset).
 *
 * Lifetime with an outstanding request: when the connection closes, the
 * abandon callback (if set) is called once, first, and the struct is freed
 * after libuv closed the handles. Without an abandon callback the struct is
 * kept (a "zombie": socket closed, no handles) until the caller's
 * twk_http_respond, which then just frees it, or until the server stops —
 * so a handler that parks without an abandon callback never responds through
 * a dangling pointer while the server runs.
 *
 * Headers go into a per-request arena as NUL-terminated strings; header
 * callbacks after on_headers_complete are a chunked body's trailers, which
 * are counted against the header limit and dropped. */
#include "http.h"
#include "log.h"
#include "twinkle/hal.h"

#include <errno.h>
#include <http_parser.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define READ_CHUNK (64 * 1024)         /* free space offered to each read */
#define IN_CAP (256 * 1024)            /* unparsed bytes buffered before reading stops */
#define WQ_CAP (4 * 1024 * 1024)       /* queued response bytes before parsing waits */
#define LINGER_MS 1000                 /* drain after a final error response */
#define BODY_KEEP (1024 * 1024)        /* body buffers larger than this are freed between requests */

enum { T_NONE, T_IDLE, T_READ, T_RESUME, T_LINGER };
enum { PH_URL, PH_FIELD, PH_VALUE };

typedef struct hdr_off {
    size_t name, value;
} hdr_off;

struct twk_http_conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_shutdown_t shut;
    twk_http_server *srv;
    twk_http_conn *prev, *next;
    http_parser parser;
    char peer[64];

    /* read but not yet parsed: in[in_off .. in_len) */
    char *in;
    size_t in_off, in_len, in_cap;

    /* the request being parsed (and, once dispatched, the one outstanding):
     * url, then per header name NUL value NUL, in one arena of offsets */
    char *arena;
    size_t arena_len, arena_cap;
    hdr_off *hoff;
    int n_hdr, hoff_cap, phase;
    twk_http_header *hdrs;
    int hdrs_cap;
    unsigned char *body;
    size_t body_len, body_cap;
    size_t header_bytes;
    twk_http_req req;
    int keep_alive, is_head, http10;
    int headers_done;     /* on_headers_complete ran for the current request */
    uint64_t msg_start;   /* loop time of the current request's first byte */
    int authenticated;    /* twk_http_set_authenticated: long idle timeout, never evicted */
    unsigned char addr_key[17]; /* family + IP address, for the per-address cap */
    int adopted;          /* from twk_http_server_adopt: outside the connection caps */

    int err_status;       /* set by a parser callback: answer this and close */
    char err_msg[200];

    int handles_open;     /* 2 until both uv_close callbacks ran */
    int timer_mode;
    size_t idle_wq;       /* write_queue_size when the idle timer was armed */
    int counted;          /* counted in srv->n_open */
    int reading;
    int in_process;
    int in_message;       /* a request began arriving and is not complete */
    int msg_ready;        /* on_message_complete ran; dispatch after execute returns */
    int outstanding;      /* handed to the handler, not answered yet */
    int final_sent;       /* the last response is queued; shutdown/linger/close follow */
    int lingering;
    int peer_eof;
    int closing;          /* uv_close called */
    int abandoned;        /* abandon callback called */
    int streaming;        /* twk_http_stream_begin sent the head; the request stays outstanding */
    int stream_status;
    int zombie;           /* handles closed, request outstanding, no abandon callback */
    twk_http_abandon_fn abandon_fn;
    void *abandon_user;
    /* the access log's fields of the outstanding request (twk_http_log_fields) */
    char log_tenant[64], log_route[96], log_id[64];
    uint64_t t_start;     /* uv_hrtime() when it was handed to the handler */
};

struct twk_http_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    twk_http_limits limits;
    twk_http_handler handler;
    void *user;
    int port;
    int n_open;
    int stopping;
    int listener_closed;
    twk_http_conn *conns; /* every conn not yet freed, zombies included */
    uv_tcp_t refuse;      /* accepts and closes a connection there is no memory for */
    int refuse_busy;      /* refuse is open or closing */
    twk_http_observer observe; /* per answer (metrics) */
    void *observe_user;
};

typedef struct wreq {
    uv_write_t req;
    uv_buf_t buf;
    char data[];
} wreq;

static void conn_close(twk_http_conn *c);
static int fail(twk_http_conn *c, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void conn_process(twk_http_conn *c);
static void conn_after_io(twk_http_conn *c);

/* ---------- small helpers ---------- */

static int reserve(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : 16;
    while (n < need) {
        if (n > SIZE_MAX / 2 / elem) return -1;
        n *= 2;
    }
    twk_host_pool pool = twk_host_pool_enter(TWK_HPOOL_REQUESTS); /* a new buffer: the requests pool */
    void *q = twk_host_realloc(*p, *cap * elem, n * elem, "HTTP buffer");
    twk_host_pool_enter(pool);
    if (!q) return -1;
    *p = q;
    *cap = n;
    return 0;
}

static const char *reason_phrase(int status) {
    switch (status) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 307: return "Temporary Redirect";
    case 308: return "Permanent Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 406: return "Not Acceptable";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 411: return "Length Required";
    case 412: return "Precondition Failed";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 416: return "Range Not Satisfiable";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Entity";
    case 425: return "Too Early";
    case 426: return "Upgrade Required";
    case 428: return "Precondition Required";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    case 507: return "Insufficient Storage";
    default: break;
    }
    if (status >= 200 && status < 300) return "OK";
    if (status >= 300 && status < 400) return "Redirect";
    if (status >= 400 && status < 500) return "Client Error";
    if (status >= 500 && status < 600) return "Server Error";
    return "Unknown";
}

/* ---------- limits ---------- */

twk_http_limits twk_http_limits_default(void) {
    twk_http_limits l;
    l.max_body_bytes = (size_t)64 << 20;
    l.max_header_bytes = (size_t)64 << 10;
    l.idle_timeout_ms = 75000;
    l.read_timeout_ms = 30000;
    l.header_timeout_ms = 10000;
    l.max_connections = 4096;
    l.max_connections_per_addr = 512;
    return l;
}

const char *twk_http_header_get(const twk_http_req *r, const char *name) {
    if (!r || !name) return NULL;
    for (int i = 0; i < r->n_headers; i++)
        if (strcasecmp(r->headers[i].name, name) == 0) return r->headers[i].value;
    return NULL;
}

void twk_http_set_authenticated(twk_http_conn *c) {
    if (c && !c->zombie) c->authenticated = 1;
}

int twk_http_server_connections(const twk_http_server *s) {
    int n = 0;
    for (const twk_http_conn *c = s ? s->conns : NULL; c; c = c->next) n++;
    return n;
}

/* ---------- freeing ---------- */

static void server_maybe_free(twk_http_server *s) {
    if (s->stopping && s->listener_closed && !s->conns && !s->refuse_busy) twk_host_free(s);
}

static void conn_free(twk_http_conn *c) {
    twk_http_server *s = c->srv;
    if (c->prev) c->prev->next = c->next;
    else s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    twk_host_free(c->in);
    twk_host_free(c->arena);
    twk_host_free(c->hoff);
    twk_host_free(c->hdrs);
    twk_host_free(c->body);
    twk_host_free(c);
    server_maybe_free(s);
}

/* Both handles are closed. */
static void conn_release(twk_http_conn *c) {
    if (c->outstanding && !c->abandoned) {
        if (c->abandon_fn) { /* set after the close began: still owed its callback */
            c->abandoned = 1;
            c->abandon_fn(c, c->abandon_user);
        } else if (!c->srv->stopping) {
            c->zombie = 1; /* freed by twk_http_respond or the server's stop */
            return;
        }
    }
    conn_free(c);
}

static void on_handle_closed(uv_handle_t *h) {
    twk_http_conn *c = h->data;
    if (--c->handles_open == 0) conn_release(c);
}

static void conn_close(twk_http_conn *c) {
    if (c->closing) return;
    c->closing = 1;
    if (c->counted) {
        c->counted = 0;
        if (!c->adopted) c->srv->n_open--;
    }
    /* abandon first, so the caller forgets the pointer before anything else;
     * respond calls from inside it are ignored (closing is set) */
    if (c->outstanding && c->abandon_fn && !c->abandoned) {
        c->abandoned = 1;
        c->abandon_fn(c, c->abandon_user);
    }
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

/* ---------- timers and reading ---------- */

static void timer_set(twk_http_conn *c, int mode, uint64_t ms);

static unsigned min_ms(unsigned a, unsigned b) { return a < b ? a : b; }

/* How long the connection may sit idle: the header timeout until it is
 * known to serve an authenticated client. */
static unsigned idle_ms(const twk_http_conn *c) {
    const twk_http_limits *l = &c->srv->limits;
    return c->authenticated ? l->idle_timeout_ms : min_ms(l->idle_timeout_ms, l->header_timeout_ms);
}

/* The current request's time limit: headers, then the whole request. */
static unsigned request_limit_ms(const twk_http_conn *c) {
    const twk_http_limits *l = &c->srv->limits;
    return c->headers_done ? l->read_timeout_ms : min_ms(l->read_timeout_ms, l->header_timeout_ms);
}

/* Arms the read timer for what is left of the current request's limit. */
static void arm_read_timer(twk_http_conn *c) {
    uint64_t lim = request_limit_ms(c), spent = uv_now(c->srv->loop) - c->msg_start;
    timer_set(c, T_READ, spent >= lim ? 0 : lim - spent);
}

static void on_timer(uv_timer_t *t) {
    twk_http_conn *c = t->data;
    int mode = c->timer_mode;
    c->timer_mode = T_NONE;
    if (c->closing) return;
    switch (mode) {
    case T_IDLE:
        /* a response still being written is not idleness, as long as it moves */
        if (c->tcp.write_queue_size > 0 && c->tcp.write_queue_size != c->idle_wq) {
            timer_set(c, T_IDLE, idle_ms(c));
            break;
        }
        conn_close(c); /* quietly */
        break;
    case T_READ: /* slow client: the request began but did not complete in time */
        c->in_message = 0;
        c->err_status = 0;
        fail(c, 408, "request %s within %u ms", c->headers_done ? "not received completely" : "headers not received",
             request_limit_ms(c));
        conn_process(c); /* sends the pending error */
        break;
    case T_RESUME:
        conn_process(c);
        break;
    case T_LINGER:
        conn_close(c);
        break;
    default:
        break;
    }
}

static void timer_set(twk_http_conn *c, int mode, uint64_t ms) {
    c->timer_mode = mode;
    c->idle_wq = c->tcp.write_queue_size;
    if (mode == T_NONE) uv_timer_stop(&c->timer);
    else uv_timer_start(&c->timer, on_timer, ms, 0);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    twk_http_conn *c = h->data;
    (void)suggested;
    if (c->final_sent) c->in_off = c->in_len = 0; /* draining: discard */
    if (c->in_off > 0 && c->in_cap - c->in_len < READ_CHUNK) {
        memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
        c->in_len -= c->in_off;
        c->in_off = 0;
    }
    if (reserve((void **)&c->in, &c->in_cap, c->in_len + READ_CHUNK, 1) != 0) {
        *buf = uv_buf_init(NULL, 0); /* libuv reports UV_ENOBUFS */
        return;
    }
    *buf = uv_buf_init(c->in + c->in_len, (unsigned)(c->in_cap - c->in_len));
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
    twk_http_conn *c = st->data;
    (void)buf;
    if (c->closing) return;
    if (nread < 0) {
        if (c->final_sent && !c->lingering) {
            /* the client half-closed after its request: let the queued
             * response go out, then close (on_shutdown) */
            c->peer_eof = 1;
            uv_read_stop(st);
            c->reading = 0;
            return;
        }
        conn_close(c); /* EOF or error: a parked request is abandoned */
        return;
    }
    if (nread == 0) return;
    if (c->final_sent) {
        c->in_off = c->in_len = 0; /* drained */
        return;
    }
    c->in_len += (size_t)nread;
    if (!c->outstanding) conn_process(c);
    else conn_after_io(c);
}

static void read_set(twk_http_conn *c, int on) {
    if (on && !c->reading) {
        if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0) c->reading = 1;
    } else if (!on && c->reading) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = 0;
    }
}

/* Reading and timer state after anything happened (not while lingering). */
static void conn_after_io(twk_http_conn *c) {
    if (c->closing || c->final_sent) return;
    read_set(c, c->in_len - c->in_off < IN_CAP);
    if (c->outstanding) {
        if (c->timer_mode != T_NONE) timer_set(c, T_NONE, 0);
    } else if (c->in_message) {
        if (c->timer_mode != T_READ) arm_read_timer(c);
    } else {
        timer_set(c, T_IDLE, idle_ms(c));
    }
}

/* ---------- writing ---------- */

static void on_write(uv_write_t *req, int status) {
    wreq *w = (wreq *)req;
    twk_http_conn *c = req->handle->data;
    twk_host_free(w);
    if (status < 0) {
        if (status != UV_ECANCELED && !c->closing) conn_close(c);
        return;
    }
    /* parsing may have waited for the write queue to drain */
    if (!c->closing && !c->final_sent && !c->outstanding && !c->in_process && c->in_len > c->in_off &&
        c->tcp.write_queue_size < WQ_CAP)
        conn_process(c);
}

/* Queues head, body and tail (NULL: none) as one write. Returns 0 or a libuv error. */
static int conn_write(twk_http_conn *c, const char *head, size_t hlen, const void *body, size_t blen, const char *tail) {
    size_t tlen = tail ? strlen(tail) : 0;
    wreq *w = twk_host_pool_alloc(TWK_HPOOL_REQUESTS, sizeof *w + hlen + blen + tlen, "response");
    if (!w) return UV_ENOMEM;
    memcpy(w->data, head, hlen);
    if (blen) memcpy(w->data + hlen, body, blen);
    if (tlen) memcpy(w->data + hlen + blen, tail, tlen);
    w->buf = uv_buf_init(w->data, (unsigned)(hlen + blen + tlen));
    int r = uv_write(&w->req, (uv_stream_t *)&c->tcp, &w->buf, 1, on_write);
    if (r != 0) twk_host_free(w);
    return r;
}

static void on_shutdown(uv_shutdown_t *req, int status) {
    twk_http_conn *c = req->handle->data;
    if (status == UV_ECANCELED || c->closing) return;
    if (status < 0 || c->peer_eof) {
        conn_close(c);
        return;
    }
    /* drain what the client still sends, so it reads our response rather
     * than a reset, until it closes or LINGER_MS pass */
    c->lingering = 1;
    read_set(c, 1);
    timer_set(c, T_LINGER, LINGER_MS);
}

/* The last response is queued: no more requests on this connection. */
static void conn_finish(twk_http_conn *c) {
    c->final_sent = 1;
    c->in_message = 0;
    /* until the shutdown completes (the response is written), the idle rule:
     * a client that stops reading it is dropped */
    timer_set(c, T_IDLE, idle_ms(c));
    if (uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, on_shutdown) != 0) conn_close(c);
}

/* conn_send's len for a streamed response: chunked (HTTP/1.1) or until the close (HTTP/1.0) */
#define STREAMED ((size_t)-1)

/* Builds and queues one response (with len STREAMED: its head only). Returns 0 or a libuv error. */
static int conn_send(twk_http_conn *c, int status, const char *ctype, const void *body, size_t len,
                     const char *extra, int close_after) {
    if (status < 100 || status > 999) status = 500;
    int streamed = len == STREAMED;
    if (!body || streamed) len = 0;
    int no_body = (status >= 100 && status < 200) || status == 204 || status == 304;
    const char *reason = reason_phrase(status);
    size_t elen = extra ? strlen(extra) : 0;
    int extra_crlf = elen > 0 && extra[elen - 1] != '\n';
    size_t cap = 160 + strlen(reason) + (ctype ? strlen(ctype) : 0) + elen;
    char *head = twk_host_pool_alloc(TWK_HPOOL_REQUESTS, cap, "response head");
    if (!head) return UV_ENOMEM;
    int n = snprintf(head, cap, "HTTP/1.1 %d %s\r\n", status, reason);
    if (streamed && !c->http10) n += snprintf(head + n, cap - (size_t)n, "Transfer-Encoding: chunked\r\n");
    else if (!no_body && !streamed) n += snprintf(head + n, cap - (size_t)n, "Content-Length: %zu\r\n", len);
    if (ctype && !no_body) n += snprintf(head + n, cap - (size_t)n, "Content-Type: %s\r\n", ctype);
    if (close_after) n += snprintf(head + n, cap - (size_t)n, "Connection: close\r\n");
    else if (c->http10) n += snprintf(head + n, cap - (size_t)n, "Connection: keep-alive\r\n");
    if (elen) {
        memcpy(head + n, extra, elen);
        n += (int)elen;
        if (extra_crlf) {
            memcpy(head + n, "\r\n", 2);
            n += 2;
        }
    }
    memcpy(head + n, "\r\n", 2);
    n += 2;
    int r = conn_write(c, head, (size_t)n, body, (no_body || c->is_head) ? 0 : len, NULL);
    twk_host_free(head);
    return r;
}

static void json_escape_into(char *out, size_t cap, const char *s) {
    size_t o = 0;
    for (; *s && o + 7 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            out[o++] = '\\';
            out[o++] = (char)ch;
        } else if (ch < 0x20) {
            o += (size_t)snprintf(out + o, cap - o, "\\u%04x", ch);
        } else {
            out[o++] = (char)ch;
        }
    }
    out[o] = 0;
}

/* An error the server itself answers (never the handler's): JSON body,
 * Connection: close, then shutdown and linger. */
static void conn_send_error(twk_http_conn *c, int status, const char *msg) {
    char esc[512], json[600];
    twk_log_failure(NULL, NULL, NULL, status, NULL, msg);
    /* the time since the refused request's first byte (0 when no request had begun: an idle timeout) */
    double ms = c->in_message || c->msg_start ? (double)(uv_now(c->srv->loop) - c->msg_start) : 0;
    twk_log_request(NULL, NULL, NULL, NULL, status, ms);
    if (c->srv->observe) c->srv->observe(c->srv->observe_user, "", "", "", status, ms / 1e3);
    json_escape_into(esc, sizeof esc, msg);
    int n = snprintf(json, sizeof json, "{\"error\":\"%s\"}", esc);
    c->is_head = 0;
    if (conn_send(c, status, "application/json", json, (size_t)n, NULL, 1) != 0) {
        conn_close(c);
        return;
    }
    conn_finish(c);
}

/* ---------- parser callbacks ---------- */

static int fail(twk_http_conn *c, int status, const char *fmt, ...) {
    if (!c->err_status) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err_msg, sizeof c->err_msg, fmt, ap);
        va_end(ap);
        c->err_status = status;
    }
    return -1;
}

static int arena_put(twk_http_conn *c, const char *p, size_t n) {
    if (reserve((void **)&c->arena, &c->arena_cap, c->arena_len + n + 1, 1) != 0) return -1;
    if (n) memcpy(c->arena + c->arena_len, p, n);
    c->arena_len += n;
    return 0;
}

static int arena_nul(twk_http_conn *c) {
    static const char z = 0;
    return arena_put(c, &z, 1);
}

static int count_header_bytes(twk_http_conn *c, size_t n) {
    c->header_bytes += n;
    if (c->header_bytes > c->srv->limits.max_header_bytes)
        return fail(c, 431, "request headers exceed the limit of %zu bytes", c->srv->limits.max_header_bytes);
    return 0;
}

static int hex_val(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* What is wrong with the request target (NUL-terminated, query included), or
 * NULL: it must be a path from '/' without a fragment, empty ("//"), "." or
 * ".." segments (also percent-encoded), nor a '\\' or an encoded '/', '\\' or
 * NUL, so that the path a proxy matched is the path routed here. */
static const char *target_problem(const char *url) {
    if (url[0] != '/') return "it must be a path starting with '/'";
    for (const char *seg = url + 1;; seg++) {
        size_t raw = 0, dec = 0;
        int dots = 0;
        for (; seg[raw] && seg[raw] != '/' && seg[raw] != '?'; raw++, dec++) {
            char ch = seg[raw];
            if (ch == '#') return "a fragment ('#') is not allowed";
            if (ch == '%') {
                int hi = hex_val(seg[raw + 1]), lo = hi < 0 ? -1 : hex_val(seg[raw + 2]);
                if (lo < 0) return "a malformed percent escape in the path";
                ch = (char)(hi * 16 + lo);
                if (ch == '/' || ch == '\\' || ch == 0) return "an encoded '/', '\\' or NUL in the path";
                raw += 2;
            }
            if (ch == '\\') return "a '\\' in the path";
            dots += ch == '.';
        }
        char end = seg[raw];
        if (dec > 0 && dots == (int)dec && dec <= 2) return "a '.' or '..' segment in the path";
        if (dec == 0 && end == '/') return "an empty segment ('//') in the path";
        if (end != '/') return end == '?' && strchr(seg + raw, '#') ? "a fragment ('#') is not allowed" : NULL;
        seg += raw;
    }
}

static int cb_message_begin(http_parser *p) {
    twk_http_conn *c = p->data;
    c->arena_len = 0;
    c->n_hdr = 0;
    c->phase = PH_URL;
    c->body_len = 0;
    if (c->body_cap > BODY_KEEP) {
        twk_host_free(c->body);
        c->body = NULL;
        c->body_cap = 0;
    }
    c->header_bytes = 0;
    c->headers_done = 0;
    memset(&c->req, 0, sizeof c->req);
    c->in_message = 1;
    c->msg_start = uv_now(c->srv->loop);
    arm_read_timer(c);
    return 0;
}

static int cb_url(http_parser *p, const char *at, size_t len) {
    twk_http_conn *c = p->data;
    if (count_header_bytes(c, len)) return -1;
    if (arena_put(c, at, len)) return fail(c, 500, "out of memory");
    return 0;
}

static int cb_header_field(http_parser *p, const char *at, size_t len) {
    twk_http_conn *c = p->data;
    if (count_header_bytes(c, len + 4)) return -1; /* ": " and CRLF */
    if (c->headers_done) return 0; /* a trailer: counted, never a header */
    if (c->phase != PH_FIELD) {
        if (arena_nul(c)) return fail(c, 500, "out of memory"); /* ends the url or the previous value */
        if (c->n_hdr == c->hoff_cap) {
            int ncap = c->hoff_cap ? c->hoff_cap * 2 : 16;
            hdr_off *q = twk_host_realloc(c->hoff, (size_t)c->hoff_cap * sizeof *q, (size_t)ncap * sizeof *q, "header offsets");
            if (!q) return fail(c, 500, "out of memory");
            c->hoff = q;
            c->hoff_cap = ncap;
        }
        c->hoff[c->n_hdr].name = c->arena_len;
        c->hoff[c->n_hdr].value = 0;
        c->n_hdr++;
        c->phase = PH_FIELD;
    }
    if (arena_put(c, at, len)) return fail(c, 500, "out of memory");
    return 0;
}

static int cb_header_value(http_parser *p, const char *at, size_t len) {
    twk_http_conn *c = p->data;
    if (count_header_bytes(c, len)) return -1;
    if (c->headers_done) return 0; /* a trailer */
    if (c->phase == PH_FIELD) {
        if (arena_nul(c)) return fail(c, 500, "out of memory");
        c->hoff[c->n_hdr - 1].value = c->arena_len;
        c->phase = PH_VALUE;
    }
    if (arena_put(c, at, len)) return fail(c, 500, "out of memory");
    return 0;
}

static const char *arena_header(const twk_http_conn *c, const char *name) {
    for (int i = 0; i < c->n_hdr; i++)
        if (strcasecmp(c->arena + c->hoff[i].name, name) == 0) return c->arena + c->hoff[i].value;
    return NULL;
}

static int cb_headers_complete(http_parser *p) {
    twk_http_conn *c = p->data;
    if (c->phase == PH_FIELD) { /* a name with no value callback: empty value */
        if (arena_nul(c)) return fail(c, 500, "out of memory");
        c->hoff[c->n_hdr - 1].value = c->arena_len;
    }
    if (arena_nul(c)) return fail(c, 500, "out of memory");
    c->phase = PH_URL;
    c->headers_done = 1;
    if (c->in_message) arm_read_timer(c); /* the body gets the rest of read_timeout_ms */
    if (p->http_major != 1 || p->http_minor > 1)
        return fail(c, 505, "HTTP version %u.%u is not supported (only 1.0 and 1.1)", p->http_major, p->http_minor);
    const char *bad = target_problem(c->arena);
    if (bad) return fail(c, 400, "bad request target: %s", bad);
    c->keep_alive = http_should_keep_alive(p) && !p->upgrade;
    c->is_head = p->method == HTTP_HEAD;
    c->http10 = p->http_major == 1 && p->http_minor == 0;
    size_t max = c->srv->limits.max_body_bytes;
    if (p->content_length != ULLONG_MAX && p->content_length > max)
        return fail(c, 413, "request body of %llu bytes exceeds the limit of %zu bytes",
                    (unsigned long long)p->content_length, max);
    int has_body = (p->flags & F_CHUNKED) || (p->content_length != ULLONG_MAX && p->content_length > 0);
    const char *expect = arena_header(c, "Expect");
    if (has_body && expect && strcasecmp(expect, "100-continue") == 0 && !(p->http_major == 1 && p->http_minor == 0)) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        if (conn_write(c, cont, sizeof cont - 1, NULL, 0, NULL) != 0) return fail(c, 500, "out of memory");
    }
    return 0;
}

static int cb_body(http_parser *p, const char *at, size_t len) {
    twk_http_conn *c = p->data;
    size_t max = c->srv->limits.max_body_bytes;
    if (len > max - c->body_len) return fail(c, 413, "request body exceeds the limit of %zu bytes", max);
    if (reserve((void **)&c->body, &c->body_cap, c->body_len + len + 1, 1) != 0) return fail(c, 500, "out of memory");
    memcpy(c->body + c->body_len, at, len);
    c->body_len += len;
    return 0;
}

static int cb_chunk_header(http_parser *p) {
    twk_http_conn *c = p->data;
    size_t max = c->srv->limits.max_body_bytes;
    if (p->content_length > max - c->body_len)
        return fail(c, 413, "a chunk of %llu bytes: the request body exceeds the limit of %zu bytes",
                    (unsigned long long)p->content_length, max);
    return 0;
}

static int cb_message_complete(http_parser *p) {
    twk_http_conn *c = p->data;
    c->in_message = 0;
    c->msg_ready = 1;
    timer_set(c, T_NONE, 0);
    http_parser_pause(p, 1); /* the next pipelined request waits for this answer */
    return 0;
}

static const http_parser_settings parser_settings = {
    .on_message_begin = cb_message_begin,
    .on_url = cb_url,
    .on_header_field = cb_header_field,
    .on_header_value = cb_header_value,
    .on_headers_complete = cb_headers_complete,
    .on_body = cb_body,
    .on_chunk_header = cb_chunk_header,
    .on_message_complete = cb_message_complete,
};

/* ---------- dispatch ---------- */

static void conn_dispatch(twk_http_conn *c) {
    static const unsigned char empty_body[1] = {0};
    if (c->hdrs_cap < c->n_hdr) {
        twk_http_header *h = twk_host_realloc(c->hdrs, (size_t)c->hdrs_cap * sizeof *h, (size_t)c->n_hdr * sizeof *h, "headers");
        if (!h) {
            conn_send_error(c, 500, "out of memory");
            return;
        }
        c->hdrs = h;
        c->hdrs_cap = c->n_hdr;
    }
    for (int i = 0; i < c->n_hdr; i++) {
        c->hdrs[i].name = c->arena + c->hoff[i].name;
        c->hdrs[i].value = c->arena + c->hoff[i].value;
    }
    char *url = c->arena; /* NUL-terminated (the first arena string) */
    char *q = strchr(url, '?');
    if (q) *q++ = 0;
    if (c->body) c->body[c->body_len] = 0;

    c->req.method = http_method_str((enum http_method)c->parser.method);
    c->req.path = url;
    c->req.query = q ? q : "";
    c->req.headers = c->hdrs;
    c->req.n_headers = c->n_hdr;
    c->req.body = c->body ? c->body : empty_body;
    c->req.body_len = c->body_len;

    c->outstanding = 1;
    c->abandon_fn = NULL;
    c->abandon_user = NULL;
    c->log_tenant[0] = c->log_route[0] = c->log_id[0] = 0;
    c->t_start = uv_hrtime();
    timer_set(c, T_NONE, 0);
    c->srv->handler(c, &c->req, c->srv->user);
}

static void conn_process(twk_http_conn *c) {
    if (c->in_process || c->closing) return;
    c->in_process = 1;
    while (!c->closing && !c->final_sent && !c->outstanding) {
        if (c->err_status) { /* from the read timer, or a callback before execute returned */
            int st = c->err_status;
            c->err_status = 0;
            conn_send_error(c, st, c->err_msg);
            break;
        }
        size_t avail = c->in_len - c->in_off;
        if (avail == 0 || c->tcp.write_queue_size >= WQ_CAP) break;
        size_t n = http_parser_execute(&c->parser, &parser_settings, c->in + c->in_off, avail);
        if (n > avail) n = avail;
        c->in_off += n;
        enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
        if (c->err_status) continue; /* answered at the top of the loop */
        if (e == HPE_PAUSED) {
            http_parser_pause(&c->parser, 0);
        } else if (e == HPE_INVALID_CONTENT_LENGTH && c->headers_done) { /* a chunk size past 2^64 */
            fail(c, 413, "a chunk size overflows (the body limit is %zu bytes)", c->srv->limits.max_body_bytes);
            continue;
        } else if (e == HPE_HEADER_OVERFLOW) {
            fail(c, 431, "request headers exceed the limit of %zu bytes", c->srv->limits.max_header_bytes);
            continue;
        } else if (e != HPE_OK) {
            fail(c, 400, "malformed HTTP request: %s (%s)", http_errno_description(e), http_errno_name(e));
            continue;
        }
        if (c->msg_ready) {
            c->msg_ready = 0;
            conn_dispatch(c);
            continue;
        }
        if (n < avail) { /* the parser stopped without a request (should not happen): give up */
            conn_close(c);
            break;
        }
    }
    if (c->in_off == c->in_len) c->in_off = c->in_len = 0;
    c->in_process = 0;
    conn_after_io(c);
}

/* ---------- public: responding ---------- */

/* The outstanding request is answered with status: logged, no longer outstanding. Returns 1 when
 * the response can be written, 0 when c is gone or going (a zombie is freed here). */
static int conn_answer(twk_http_conn *c, int status) {
    if (c->zombie) { /* closed while parked without an abandon callback */
        c->outstanding = 0;
        conn_free(c);
        return 0;
    }
    if (!c->outstanding) return 0; /* a second call */
    c->outstanding = 0;
    c->streaming = 0;
    twk_log_request(c->log_id[0] ? c->log_id : twk_log_current_id(), c->log_tenant, c->log_route, c->req.method, status,
                    (double)(uv_hrtime() - c->t_start) / 1e6);
    if (c->srv->observe)
        c->srv->observe(c->srv->observe_user, c->req.method, c->log_tenant, c->log_route, status,
                        (double)(uv_hrtime() - c->t_start) / 1e9);
    c->abandon_fn = NULL;
    c->abandon_user = NULL;
    return !c->closing; /* when closing, on_handle_closed frees it */
}

/* After the response was queued: the next request, or the end of the connection. */
static void conn_answered(twk_http_conn *c, int close_after) {
    if (close_after) {
        conn_finish(c);
        return;
    }
    if (c->in_process) return; /* the parse loop goes on by itself */
    /* parse the next pipelined request from the loop, not from inside the caller */
    timer_set(c, T_RESUME, 0);
}

/* An HTTP/1.0 client gets a stream delimited by the connection's close. */
static int stream_close_after(const twk_http_conn *c) { return !c->keep_alive || c->srv->stopping || c->http10; }

void twk_http_respond(twk_http_conn *c, int status, const char *content_type, const void *body, size_t len,
                      const char *extra_headers) {
    if (!c) return;
    if (c->streaming && !c->zombie) { /* the head is sent: all that can be done is ending the stream */
        twk_http_stream_end(c);
        return;
    }
    if (!conn_answer(c, status)) return;
    int close_after = !c->keep_alive || c->srv->stopping;
    if (conn_send(c, status, content_type, body, len, extra_headers, close_after) != 0) {
        conn_close(c);
        return;
    }
    conn_answered(c, close_after);
}

int twk_http_stream_begin(twk_http_conn *c, int status, const char *content_type, const char *extra_headers) {
    if (!c || c->zombie || !c->outstanding || c->streaming || c->closing) return -1;
    if (conn_send(c, status, content_type, NULL, STREAMED, extra_headers, stream_close_after(c)) != 0) {
        conn_close(c); /* the abandon callback tells the caller */
        return -1;
    }
    c->streaming = 1;
    c->stream_status = status;
    return 0;
}

/* Queues one piece of a stream: a chunk, or raw bytes for HTTP/1.0 (len 0 with chunked: the end). */
static int stream_put(twk_http_conn *c, const void *data, size_t len) {
    if (c->is_head) return 0;
    if (c->http10) return len ? conn_write(c, (const char *)data, len, NULL, 0, NULL) : 0;
    char head[32];
    int n = snprintf(head, sizeof head, "%zx\r\n", len);
    return conn_write(c, head, (size_t)n, data, len, "\r\n");
}

int twk_http_stream_write(twk_http_conn *c, const void *data, size_t len) {
    if (!c || !c->streaming || c->zombie || c->closing) return -1;
    if (!len) return 0;
    if (stream_put(c, data, len) != 0) {
        conn_close(c);
        return -1;
    }
    return 0;
}

void twk_http_stream_end(twk_http_conn *c) {
    if (!c || !c->streaming) return;
    int close_after = stream_close_after(c);
    if (!conn_answer(c, c->stream_status)) return;
    if (stream_put(c, NULL, 0) != 0) {
        conn_close(c);
        return;
    }
    conn_answered(c, close_after);
}

void twk_http_log_fields(twk_http_conn *c, const char *tenant, const char *route, const char *request_id) {
    if (!c) return;
    if (tenant) snprintf(c->log_tenant, sizeof c->log_tenant, "%s", tenant);
    if (route) snprintf(c->log_route, sizeof c->log_route, "%s", route);
    if (request_id) snprintf(c->log_id, sizeof c->log_id, "%s", request_id);
}

void twk_http_server_set_observer(twk_http_server *s, twk_http_observer fn, void *user) {
    s->observe = fn;
    s->observe_user = user;
}

void twk_http_respond_json(twk_http_conn *c, int status, const char *json) {
    twk_http_respond(c, status, "application/json", json, json ? strlen(json) : 0, NULL);
}

void twk_http_set_abandon(twk_http_conn *c, twk_http_abandon_fn fn, void *user) {
    if (!c || c->zombie || c->abandoned || !c->outstanding) return;
    c->abandon_fn = fn;
    c->abandon_user = fn ? user : NULL;
}

/* ---------- public: server ---------- */

static void on_refused_closed(uv_handle_t *h) {
    twk_http_server *s = h->data;
    s->refuse_busy = 0;
    server_maybe_free(s);
}

/* Out of memory for a new connection: accept it and close it at once (libuv stops listening
 * until a connection is accepted); a second failure while the first is still closing leaves it
 * queued. */
static void refuse_connection(twk_http_server *s, uv_stream_t *ls) {
    if (!s->refuse_busy && uv_tcp_init(s->loop, &s->refuse) == 0) {
        s->refuse_busy = 1;
        s->refuse.data = s;
        uv_accept(ls, (uv_stream_t *)&s->refuse);
        uv_close((uv_handle_t *)&s->refuse, on_refused_closed);
    }
}

/* A new connection struct with its handles initialised, first in the list. */
static twk_http_conn *conn_new(twk_http_server *s) {
    twk_http_conn *c = twk_host_calloc(sizeof *c, "connection");
    if (!c) return NULL;
    c->srv = s;
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->handles_open = 2;
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    snprintf(c->peer, sizeof c->peer, "?");
    return c;
}

/* Peer name for logs and the address key for the per-address cap. */
static void conn_peer(twk_http_conn *c) {
    struct sockaddr_storage ss;
    int sl = (int)sizeof ss;
    memset(&ss, 0, sizeof ss);
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &sl) != 0) return;
    char ip[INET6_ADDRSTRLEN] = "?";
    c->addr_key[0] = (unsigned char)ss.ss_family;
    if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
        memcpy(c->addr_key + 1, &a->sin6_addr, 16);
        uv_ip6_name(a, ip, sizeof ip);
        snprintf(c->peer, sizeof c->peer, "[%s]:%d", ip, ntohs(a->sin6_port));
    } else if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
        memcpy(c->addr_key + 1, &a->sin_addr, 4);
        uv_ip4_name(a, ip, sizeof ip);
        snprintf(c->peer, sizeof c->peer, "%s:%d", ip, ntohs(a->sin_port));
    }
}

/* Starts parsing and reading. */
static void conn_start(twk_http_conn *c) {
    c->counted = 1;
    uv_tcp_nodelay(&c->tcp, 1);
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    conn_after_io(c); /* starts reading and the idle timer */
}

/* Makes room for new connection `nc` under both caps by closing the oldest
 * connections that are not authenticated and have nothing outstanding.
 * Returns 0, or -1 when no such connection is left to close. */
static int make_room(twk_http_server *s, const twk_http_conn *nc) {
    for (int per_addr = 1; per_addr >= 0; per_addr--) {
        int limit = per_addr ? s->limits.max_connections_per_addr : s->limits.max_connections;
        for (;;) {
            int n = 0;
            twk_http_conn *oldest = NULL; /* the list is newest first */
            for (twk_http_conn *c = s->conns; c; c = c->next) {
                if (!c->counted || c->adopted || c == nc) continue;
                if (per_addr && memcmp(c->addr_key, nc->addr_key, sizeof c->addr_key) != 0) continue;
                n++;
                if (!c->authenticated && !c->outstanding && !c->final_sent) oldest = c;
            }
            if (n < limit) break;
            if (!oldest) return -1;
            conn_close(oldest);
        }
    }
    return 0;
}

static void on_connection(uv_stream_t *ls, int status) {
    twk_http_server *s = ls->data;
    if (status < 0 || s->stopping) return;
    twk_http_conn *c = conn_new(s);
    if (!c) {
        refuse_connection(s, ls);
        return;
    }
    if (uv_accept(ls, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c);
        return;
    }
    conn_peer(c);
    if (make_room(s, c) != 0) {
        conn_close(c); /* refused: accepted and closed at once */
        return;
    }
    s->n_open++;
    conn_start(c);
}

int twk_http_server_adopt(twk_http_server *s, int fd) {
    if (!s || s->stopping || fd < 0) {
        if (fd >= 0) close(fd);
        return UV_EINVAL;
    }
    twk_http_conn *c = conn_new(s);
    if (!c) {
        close(fd);
        return UV_ENOMEM;
    }
    int r = uv_tcp_open(&c->tcp, fd);
    if (r != 0) {
        close(fd);
        conn_close(c);
        return r;
    }
    c->adopted = 1;
    snprintf(c->peer, sizeof c->peer, "fd:%d", fd);
    conn_start(c);
    return 0;
}

static void on_listener_closed(uv_handle_t *h) {
    twk_http_server *s = h->data;
    s->listener_closed = 1;
    server_maybe_free(s);
}

static void on_failed_listener_closed(uv_handle_t *h) { twk_host_free(h->data); }

int twk_http_server_start(uv_loop_t *loop, const char *host, int port, const twk_http_limits *limits,
                          twk_http_handler handler, void *user, twk_http_server **out) {
    if (out) *out = NULL;
    if (!loop || !handler || !out || port < 0 || port > 65535) return UV_EINVAL;
    twk_http_limits lim = twk_http_limits_default();
    if (limits) { /* zero fields keep their defaults */
        if (limits->max_body_bytes) lim.max_body_bytes = limits->max_body_bytes;
        if (limits->max_header_bytes) lim.max_header_bytes = limits->max_header_bytes;
        if (limits->idle_timeout_ms) lim.idle_timeout_ms = limits->idle_timeout_ms;
        if (limits->read_timeout_ms) lim.read_timeout_ms = limits->read_timeout_ms;
        if (limits->header_timeout_ms) lim.header_timeout_ms = limits->header_timeout_ms;
        if (limits->max_connections > 0) lim.max_connections = limits->max_connections;
        if (limits->max_connections_per_addr > 0) lim.max_connections_per_addr = limits->max_connections_per_addr;
    }
    /* http_parser's own cap on header bytes is process-wide (80 KiB unless
     * raised); raise it so our limit is the one that applies */
    if (lim.max_header_bytes + 8192 > HTTP_MAX_HEADER_SIZE)
        http_parser_set_max_header_size(lim.max_header_bytes > UINT32_MAX - 8192 ? UINT32_MAX
                                                                                 : (uint32_t)lim.max_header_bytes + 8192);

    if (!host) host = "127.0.0.1";
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t sl;
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) == 0) sl = sizeof(struct sockaddr_in);
    else if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) == 0) sl = sizeof(struct sockaddr_in6);
    else return UV_EINVAL;

    /* bind and listen on a plain socket first: every likely failure happens
     * before a libuv handle exists, so a failed start leaves nothing to close */
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return uv_translate_sys_error(errno);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, sl) != 0 || listen(fd, SOMAXCONN) != 0) {
        int e = uv_translate_sys_error(errno);
        close(fd);
        return e;
    }
    struct sockaddr_storage bound;
    socklen_t bl = sizeof bound;
    int bport = port;
    if (getsockname(fd, (struct sockaddr *)&bound, &bl) == 0)
        bport = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                  : ((struct sockaddr_in *)&bound)->sin_port);

    twk_http_server *s = twk_host_calloc(sizeof *s, "HTTP server");
    if (!s) {
        close(fd);
        return UV_ENOMEM;
    }
    s->loop = loop;
    s->limits = lim;
    s->handler = handler;
    s->user = user;
    s->port = bport;
    int r = uv_tcp_init(loop, &s->listener);
    if (r != 0) {
        close(fd);
        twk_host_free(s);
        return r;
    }
    s->listener.data = s;
    r = uv_tcp_open(&s->listener, fd);
    if (r != 0) close(fd);
    if (r == 0) r = uv_listen((uv_stream_t *)&s->listener, SOMAXCONN, on_connection);
    if (r != 0) {
        /* rare: the struct is freed once the loop runs the close callback */
        uv_close((uv_handle_t *)&s->listener, on_failed_listener_closed);
        return r;
    }
    *out = s;
    return 0;
}

int twk_http_server_port(const twk_http_server *s) { return s ? s->port : -1; }

void twk_http_server_stop(twk_http_server *s) {
    if (!s || s->stopping) return;
    s->stopping = 1;
    uv_close((uv_handle_t *)&s->listener, on_listener_closed);
    /* zombies first (no callbacks run, so the list can't change under us) */
    for (twk_http_conn *c = s->conns, *nx; c; c = nx) {
        nx = c->next;
        if (c->zombie) conn_free(c);
    }
    /* then close the rest; closing never frees synchronously, so the list
     * stays intact while abandon callbacks run */
    for (twk_http_conn *c = s->conns; c; c = c->next) conn_close(c);
}
