/* server/ — the failure log: one line on stderr for every 4xx/5xx answer and
 * every failed future (request id, tenant, route, status or error category,
 * message; never a request body). Loop thread only. */
#ifndef TWK_SERVER_LOG_H
#define TWK_SERVER_LOG_H

/* The request being handled: its tenant (NULL before authentication) and route
 * (NULL: unknown). Lines written while answering it carry them; futures created
 * meanwhile keep the route. */
void twk_log_context(const char *tenant, const char *route);
const char *twk_log_tenant(void); /* "-" when unknown */
const char *twk_log_route(void);  /* "-" when unknown */
/* No lines at all (serve --quiet). */
void twk_log_quiet(int quiet);
/* One line: "twinkle serve: failed request_id=R tenant=T route=P status=S|category=C msg=\"...\""
 * (NULL request_id / tenant / route print as "-"; status 0 prints the category; control
 * characters and quotes in the message are escaped, so it stays one line). */
void twk_log_failure(const char *request_id, const char *tenant, const char *route, int status, const char *category,
                     const char *msg);

#endif
