/* server/ — futures: a submit answers at once with a request id; the result
 * arrives later (from the worker, via the loop thread) and is fetched by
 * retrieve_future, which long-polls: the connection is parked, with no
 * thread, until the result is ready or the poll timeout passes ("try_again").
 * Loop thread only. */
#ifndef TWK_SERVER_FUTURES_H
#define TWK_SERVER_FUTURES_H

#include <stddef.h>

#include <uv.h>

#include "http.h"

typedef struct twk_futures twk_futures;

typedef struct twk_futures_limits {
    double poll_timeout_s;          /* long-poll hold (default 25) */
    double keep_after_retrieval_s;  /* a result answered to a poll is freed this long after (default 120) */
    double ttl_s;                   /* a result never retrieved is freed this long after it finished (default 3600) */
    size_t max_bytes_tenant;        /* finished results held per tenant (default 256 MiB); past it retrieved
                                     * results go first, then the oldest unretrieved become an error naming it */
} twk_futures_limits;

twk_futures_limits twk_futures_limits_default(void);
/* NULL on out of memory. */
twk_futures *twk_futures_new(uv_loop_t *loop, const twk_futures_limits *lim);
/* Answers every parked poll with try_again and frees everything. */
void twk_futures_free(twk_futures *f);

/* Writes 2 * n_bytes (<= 32) hex digits of getrandom(2) to out; -1 if the kernel's CSPRNG fails. */
int twk_random_hex(char *out, int n_bytes);
/* A new pending future owned by `tenant`; writes its id ("req-" + 32 random hex
 * digits, unguessable) to id[64]; 0, or -1 out of memory (id then "req-unavailable", unknown to polls). */
int twk_futures_create(twk_futures *f, const char *tenant, char *id);
/* Completes with a body (copied) of the given content type. */
void twk_futures_complete(twk_futures *f, const char *id, const char *content_type, const void *body, size_t len);
/* Fails with {"error": message, "category": category}. */
void twk_futures_fail(twk_futures *f, const char *id, const char *category, const char *message);

/* Called (loop thread) for every failed future, with its tenant, route and category: the metrics'
 * error counters. */
typedef void (*twk_futures_fail_fn)(void *user, const char *tenant, const char *route, const char *category);
void twk_futures_on_fail(twk_futures *f, twk_futures_fail_fn fn, void *user);

/* 1 if the future finished with a result (not failed, cancelled, dropped or unknown). */
int twk_futures_succeeded(twk_futures *f, const char *id);
/* cancel_future: a pending future of tenant fails now with category "cancelled" (1); a later
 * result for it is discarded. 0 if it had finished already, -1 if unknown or another tenant's. */
int twk_futures_cancel(twk_futures *f, const char *tenant, const char *id);
/* retrieve_future: answers now if done, else parks the connection. A future
 * of another tenant, or an unknown id, is 404. */
void twk_futures_poll(twk_futures *f, twk_http_conn *c, const char *tenant, const char *id);

/* The result bytes held (for logs and tests). */
size_t twk_futures_bytes(const twk_futures *f);

#endif
