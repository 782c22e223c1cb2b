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

twk_futures *twk_futures_new(uv_loop_t *loop, double poll_timeout_s);
/* Answers every parked poll with try_again and frees everything. */
void twk_futures_free(twk_futures *f);

/* A new pending future owned by `tenant`; writes its id ("req-…") to id[64]. */
void twk_futures_create(twk_futures *f, const char *tenant, char *id);
/* Completes with a body (copied) of the given content type. */
void twk_futures_complete(twk_futures *f, const char *id, const char *content_type, const void *body, size_t len);
/* Fails with {"error": message, "category": category}. */
void twk_futures_fail(twk_futures *f, const char *id, const char *category, const char *message);

/* retrieve_future: answers now if done, else parks the connection. A future
 * of another tenant, or an unknown id, is 404. */
void twk_futures_poll(twk_futures *f, twk_http_conn *c, const char *tenant, const char *id);

/* Futures pending / finished (for logs and tests). */
void twk_futures_counts(const twk_futures *f, int *pending, int *finished);

#endif
