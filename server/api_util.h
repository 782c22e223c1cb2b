/* server/ — small helpers for the JSON endpoints: request bodies, typed
 * fields with messages that name them, error responses, timestamps. */
#ifndef TWK_SERVER_API_UTIL_H
#define TWK_SERVER_API_UTIL_H

#include <stdarg.h>
#include <stddef.h>

#include <cJSON.h>

#include "http.h"

/* Routes cJSON's allocations through the host allocator (twk_host_alloc); call once at start-up. */
void api_json_hooks(void);
/* 1 if a cJSON allocation of this thread failed since the last call (then the tree or text made
 * meanwhile is incomplete: answer 5xx); clears the flag. */
int api_json_oom(void);
/* cJSON_AddItemToArray / cJSON_AddItemToObject that free item when it cannot be added (a NULL
 * container or item, or out of memory: api_json_oom then says so); 1 if added. */
int api_json_push(cJSON *arr, cJSON *item);
int api_json_put(cJSON *obj, const char *key, cJSON *item);

#define API_JSON_MAX_DEPTH 64
/* 1 if p[0..n) is one strict JSON object (RFC 8259: nothing after it, valid UTF-8, no \u0000 or
 * unpaired surrogates in strings, at most API_JSON_MAX_DEPTH levels of nesting); else 0 with a
 * message naming the problem and the innermost field in err. */
int api_json_check(const unsigned char *p, size_t n, char *err, size_t err_len);
/* Parses the body as a JSON object (api_json_check first); on failure answers 400 and returns NULL. */
cJSON *api_body(twk_http_conn *c, const twk_http_req *req);
/* Answers `status` with {"error": msg, "detail": msg}. */
/* Formats an error answer's message into msg and writes the failure log line for it (the
 * request's tenant and route; no body). */
void api_failure_message(char *msg, size_t len, int status, const char *fmt, va_list ap);
void api_error(twk_http_conn *c, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Answers 200 with the JSON (and deletes it). */
void api_ok(twk_http_conn *c, cJSON *j);

/* Typed fields: return 1 and set *out, or 0 after writing a message naming
 * the field into err (required fields) — optional ones return 1 with the
 * default when absent or null. */
int api_str(const cJSON *o, const char *key, int required, const char **out, char *err, size_t err_len);
int api_int(const cJSON *o, const char *key, int required, long long lo, long long hi, long long def, long long *out,
            char *err, size_t err_len);
int api_num(const cJSON *o, const char *key, int required, double def, double *out, char *err, size_t err_len);
int api_bool(const cJSON *o, const char *key, int def, int *out, char *err, size_t err_len);

/* ISO-8601 UTC ("2026-08-08T12:00:00Z") of unix seconds. */
/* ttl_seconds: absent or null → *out = 0 (never expires), else a finite number in (0, API_MAX_TTL_S].
 * 0 with a message naming the field otherwise. */
#define API_MAX_TTL_S 315576000.0 /* ten years */
int api_ttl(const cJSON *o, double *out, char *err, size_t err_len);
void api_iso_time(double t, char *out, size_t len);
/* Value of integer query parameter `name` in "a=1&b=2", clamped; def if absent. */
long api_query_int(const char *query, const char *name, long def, long lo, long hi);
/* 1 if `name` is a valid checkpoint name: [A-Za-z0-9._-], 1..100, not starting with '.' */
int api_valid_name(const char *name);

#endif
