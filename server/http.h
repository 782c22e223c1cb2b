/* server/ — a small HTTP/1.1 server on libuv, parsing with http_parser
 * (Debian's libhttp-parser-dev). Keep-alive, bounded request bodies (413),
 * idle and slow-client timeouts, and deferred responses: a handler may return
 * without answering and answer later on the loop thread (long polls park
 * this way, with no thread per waiting client). Everything here runs on the
 * loop thread. HTTP/1.0 and 1.1 only (others: 505); the trailers of a
 * chunked request are read and discarded, never seen as headers. */
#ifndef TWK_SERVER_HTTP_H
#define TWK_SERVER_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

typedef struct twk_http_server twk_http_server;
typedef struct twk_http_conn twk_http_conn;

typedef struct twk_http_header {
    const char *name;  /* as received; compare case-insensitively */
    const char *value;
} twk_http_header;

typedef struct twk_http_req {
    const char *method;         /* "GET", "POST", "DELETE", "PUT", ... */
    const char *path;           /* URL path without the query, percent-decoding NOT applied; always
                                   starts with '/', and has no empty ("//"), "." or ".." segment, nor
                                   an encoded '/', '\\' or NUL (such requests get 400) */
    const char *query;          /* text after '?', or "" */
    const twk_http_header *headers;
    int n_headers;
    const unsigned char *body;  /* NUL-terminated for convenience; may contain NULs */
    size_t body_len;
} twk_http_req;

/* The value of header `name` (case-insensitive) or NULL. */
const char *twk_http_header_get(const twk_http_req *r, const char *name);

/* Called once per complete request. The request and its strings live until
 * the response is sent (or the connection closes). The handler must answer
 * with twk_http_respond, now or later; requests on one connection are
 * answered in order (the next one is not parsed until this one is answered). */
typedef void (*twk_http_handler)(twk_http_conn *c, const twk_http_req *req, void *user);

typedef struct twk_http_limits {
    size_t max_body_bytes;      /* 413 past this (default 64 MiB); also a chunk size past it */
    size_t max_header_bytes;    /* 431 past this (default 64 KiB) */
    unsigned idle_timeout_ms;   /* close an authenticated keep-alive connection idle this long (default 75 s) */
    unsigned read_timeout_ms;   /* a started request must arrive completely within this (default 30 s) */
    unsigned header_timeout_ms; /* a request's headers must arrive within this of its first byte, and a
                                   connection not marked authenticated is closed when idle this long
                                   (default 10 s; never longer than the two above) */
    int max_connections;        /* open connections in total (default 4096) */
    int max_connections_per_addr; /* open connections per client IP address (default 512) */
} twk_http_limits;
/* At either connection cap, a new connection first closes the oldest
 * connection that is neither authenticated nor has a request outstanding
 * (from the same address for the per-address cap); only when there is none
 * is the new one refused (accepted and closed at once). */

/* Defaults as documented above. */
twk_http_limits twk_http_limits_default(void);

/* Binds host:port (port 0 = any free port) and starts accepting on `loop`.
 * Returns 0 or a negative libuv error code (uv_strerror names it). */
int twk_http_server_start(uv_loop_t *loop, const char *host, int port, const twk_http_limits *limits,
                          twk_http_handler handler, void *user, twk_http_server **out);
/* The port actually bound. */
int twk_http_server_port(const twk_http_server *s);
/* Stops accepting, closes every connection (parked ones get their abandon
 * callback), and frees the server once libuv has closed the handles. */
void twk_http_server_stop(twk_http_server *s);

/* What the access log line of c's outstanding request names (twk_log_request, written when it is
 * answered); a NULL argument leaves that field as it is. Every field starts empty per request. */
void twk_http_log_fields(twk_http_conn *c, const char *tenant, const char *route, const char *request_id);

/* Called once per answer (also the HTTP layer's own 4xx) on the loop thread, with the fields
 * twk_http_log_fields set ("" where unknown) and the time from the parsed request to the answer
 * (0 for the HTTP layer's errors): the metrics' request counters. */
typedef void (*twk_http_observer)(void *user, const char *method, const char *tenant, const char *route, int status,
                                  double seconds);
void twk_http_server_set_observer(twk_http_server *s, twk_http_observer fn, void *user);
/* Sends a response with Content-Length and the given content type (may be
 * NULL for an empty body). extra_headers: NULL or "Name: value\r\n..." lines.
 * Keeps the connection open unless the client asked to close. Safe to call
 * once per request; a second call is ignored. */
void twk_http_respond(twk_http_conn *c, int status, const char *content_type, const void *body, size_t len,
                      const char *extra_headers);
/* A streamed response (server-sent events): twk_http_stream_begin sends the status and headers with
 * Transfer-Encoding: chunked (an HTTP/1.0 client: no length, the close ends it), the request stays
 * outstanding (parked: the abandon callback tells of a client that goes away), each
 * twk_http_stream_write sends one chunk as it comes, and twk_http_stream_end sends the terminating
 * chunk and answers the request (twk_http_respond on a streaming request ends it the same way).
 * begin and write return 0, or -1 when the connection is gone or closing (the abandon callback, if
 * set, has run then or will run). */
int twk_http_stream_begin(twk_http_conn *c, int status, const char *content_type, const char *extra_headers);
int twk_http_stream_write(twk_http_conn *c, const void *data, size_t len);
void twk_http_stream_end(twk_http_conn *c);
/* JSON convenience: status + application/json body (NUL-terminated). */
void twk_http_respond_json(twk_http_conn *c, int status, const char *json);

/* For a parked (deferred) request: called if the connection closes before
 * twk_http_respond; after it the conn pointer is invalid. Set NULL to clear. */
typedef void (*twk_http_abandon_fn)(twk_http_conn *c, void *user);
void twk_http_set_abandon(twk_http_conn *c, twk_http_abandon_fn fn, void *user);

/* Marks the connection as used by an authenticated client (the handler calls
 * it once the request's key is accepted): from then on it keeps the long idle
 * timeout and is never closed to make room for a new connection. */
void twk_http_set_authenticated(twk_http_conn *c);

/* Serves an already connected stream socket (e.g. one end of a socketpair;
 * tests and fuzzers) as a connection of `s`, outside the connection caps.
 * Takes ownership of fd. Returns 0 or a negative libuv error (fd closed). */
int twk_http_server_adopt(twk_http_server *s, int fd);
/* Connections not yet freed (closing ones included). */
int twk_http_server_connections(const twk_http_server *s);

#endif
