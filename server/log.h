/* server/ — the service's log on stderr. Text mode (the default): one line per
 * 4xx/5xx answer and per failed future (request id, tenant, route, status or
 * error category, message; never a request body). JSON mode (--log-format json):
 * one JSON object per line — every answered request (level, request id, tenant,
 * route, method, status, duration, and the error message of a 4xx/5xx), every
 * failed future, and the service's other messages. Loop thread only. */
#ifndef TWK_SERVER_LOG_H
#define TWK_SERVER_LOG_H

/* The request being handled: its tenant (NULL before authentication) and route
 * (NULL: unknown). Lines written while answering it carry them; futures created
 * meanwhile keep the route. */
void twk_log_context(const char *tenant, const char *route);
/* The future the request being handled created (NULL: none yet, at the start of each request);
 * its answer's log line names it. */
void twk_log_request_id(const char *id);
const char *twk_log_current_id(void); /* "" when none */
const char *twk_log_tenant(void); /* "-" when unknown */
const char *twk_log_route(void);  /* "-" when unknown */
/* No lines at all (serve --quiet). */
void twk_log_quiet(int quiet);
/* 0: text (failures only), 1: JSON lines (every request). */
void twk_log_json(int json);
int twk_log_is_json(void);
/* A failure. Text: "twinkle serve: failed request_id=R tenant=T route=P status=S|category=C msg=\"...\""
 * (NULL request_id / tenant / route print as "-"; status 0 prints the category; control
 * characters and quotes in the message are escaped, so it stays one line). JSON: a failed
 * future (status 0) is its own line; an answer's message is kept for the request's line
 * (twk_log_request), which follows it. */
void twk_log_failure(const char *request_id, const char *tenant, const char *route, int status, const char *category,
                     const char *msg);
/* An answered request (JSON mode only; nothing in text mode): level info / warn (4xx) / error (5xx). */
void twk_log_request(const char *request_id, const char *tenant, const char *route, const char *method, int status,
                     double duration_ms);
/* Any other message of the service ("recovery: ...", the listening line): text after
 * "twinkle serve: ", or {"level": "info", "event": "message", "msg": ...}. */
void twk_log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
