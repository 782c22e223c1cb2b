/* The failure log (see log.h). */
#include "log.h"

#include <stdio.h>
#include <string.h>

static char cur_tenant[64] = "-", cur_route[96] = "-";
static int quiet;

void twk_log_context(const char *tenant, const char *route) {
    snprintf(cur_tenant, sizeof cur_tenant, "%s", tenant && *tenant ? tenant : "-");
    snprintf(cur_route, sizeof cur_route, "%s", route && *route ? route : "-");
}

const char *twk_log_tenant(void) { return cur_tenant; }
const char *twk_log_route(void) { return cur_route; }
void twk_log_quiet(int q) { quiet = q; }

/* Copies s into out (at most cap - 1 bytes) with quotes, backslashes and control bytes escaped. */
static void escape(char *out, size_t cap, const char *s) {
    size_t o = 0;
    for (; s && *s && o + 5 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            out[o++] = '\\';
            out[o++] = (char)ch;
        } else if (ch < 0x20 || ch == 0x7f) {
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", ch);
        } else {
            out[o++] = (char)ch;
        }
    }
    out[o] = 0;
}

void twk_log_failure(const char *request_id, const char *tenant, const char *route, int status, const char *category,
                     const char *msg) {
    if (quiet) return;
    char m[600], t[140], r[200], id[140], what[80];
    escape(m, sizeof m, msg);
    escape(t, sizeof t, tenant && *tenant ? tenant : "-");
    escape(r, sizeof r, route && *route ? route : "-");
    escape(id, sizeof id, request_id && *request_id ? request_id : "-");
    if (status) snprintf(what, sizeof what, "status=%d", status);
    else snprintf(what, sizeof what, "category=%.60s", category ? category : "-");
    fprintf(stderr, "twinkle serve: failed request_id=%s tenant=%s route=%s %s msg=\"%s\"\n", id, t, r, what, m);
}
