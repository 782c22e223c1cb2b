/* The service's log (see log.h). */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static char cur_tenant[64] = "-", cur_route[96] = "-";
static int quiet, json_mode;
static char answer_msg[600];
static char cur_id[64];      /* the future the request being handled created, or "" */ /* JSON mode: the failure message of the answer about to be sent */

void twk_log_context(const char *tenant, const char *route) {
    snprintf(cur_tenant, sizeof cur_tenant, "%s", tenant && *tenant ? tenant : "-");
    snprintf(cur_route, sizeof cur_route, "%s", route && *route ? route : "-");
}

void twk_log_request_id(const char *id) { snprintf(cur_id, sizeof cur_id, "%s", id ? id : ""); }
const char *twk_log_current_id(void) { return cur_id; }
const char *twk_log_tenant(void) { return cur_tenant; }
const char *twk_log_route(void) { return cur_route; }
void twk_log_quiet(int q) { quiet = q; }
void twk_log_json(int j) { json_mode = j; }
int twk_log_is_json(void) { return json_mode; }

/* The length of the well-formed UTF-8 sequence at s (lead and continuation bytes), 0 if none. */
static int utf8_len(const unsigned char *s) {
    int n = s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 && s[0] < 0xe0 ? 2 : 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    return n;
}

/* Copies s into out (at most cap - 1 bytes) with quotes, backslashes and control bytes escaped:
 * \xNN in text, \u00NN in JSON, where a byte that is not well-formed UTF-8 becomes \ufffd. */
static void escape(char *out, size_t cap, const char *s, int json) {
    size_t o = 0;
    for (; s && *s && o + 7 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        int n = json && ch >= 0x80 ? utf8_len((const unsigned char *)s) : 1;
        if (n == 0) {
            o += (size_t)snprintf(out + o, cap - o, "\\ufffd");
        } else if (n > 1) {
            if (o + (size_t)n + 7 >= cap) break;
            memcpy(out + o, s, (size_t)n);
            o += (size_t)n;
            s += n - 1;
        } else if (ch == '"' || ch == '\\') {
            out[o++] = '\\';
            out[o++] = (char)ch;
        } else if (ch < 0x20 || ch == 0x7f) {
            o += (size_t)snprintf(out + o, cap - o, json ? "\\u%04x" : "\\x%02x", ch);
        } else {
            out[o++] = (char)ch;
        }
    }
    out[o] = 0;
}

/* JSON: a string field ("-" or empty → null). */
static void field(char *out, size_t cap, const char *name, const char *v) {
    char e[1600];
    if (!v || !*v || !strcmp(v, "-")) {
        snprintf(out, cap, ",\"%s\":null", name);
        return;
    }
    size_t room = cap - strlen(name) - 8; /* the escaped text always fits whole: the line stays valid JSON */
    escape(e, room < sizeof e ? room : sizeof e, v, 1);
    if (snprintf(out, cap, ",\"%s\":\"%s\"", name, e) >= (int)cap) snprintf(out, cap, ",\"%s\":null", name);
}

/* JSON: the line's start, {"ts":"2026-12-01T05:00:00.123Z","level":L,"event":E */
static void line_start(char *out, size_t cap, const char *level, const char *event) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tmv;
    gmtime_r(&ts.tv_sec, &tmv);
    char t[32];
    strftime(t, sizeof t, "%Y-%m-%dT%H:%M:%S", &tmv);
    snprintf(out, cap, "{\"ts\":\"%s.%03ldZ\",\"level\":\"%s\",\"event\":\"%s\"", t, ts.tv_nsec / 1000000L, level,
             event);
}

void twk_log_failure(const char *request_id, const char *tenant, const char *route, int status, const char *category,
                     const char *msg) {
    if (quiet) return;
    if (json_mode) {
        if (status) { /* the request's own line carries it */
            snprintf(answer_msg, sizeof answer_msg, "%s", msg ? msg : "");
            return;
        }
        char l[2048], f[4][800];
        line_start(l, sizeof l, category && !strcmp(category, "user") ? "warn" : "error", "future_failed");
        field(f[0], sizeof f[0], "request_id", request_id);
        field(f[1], sizeof f[1], "tenant", tenant);
        field(f[2], sizeof f[2], "route", route);
        field(f[3], sizeof f[3], "error", msg);
        char cat[96];
        escape(cat, sizeof cat, category ? category : "-", 1);
        fprintf(stderr, "%s%s%s%s,\"category\":\"%s\"%s}\n", l, f[0], f[1], f[2], cat, f[3]);
        return;
    }
    char m[600], t[140], r[200], id[140], what[80];
    escape(m, sizeof m, msg, 0);
    escape(t, sizeof t, tenant && *tenant ? tenant : "-", 0);
    escape(r, sizeof r, route && *route ? route : "-", 0);
    escape(id, sizeof id, request_id && *request_id ? request_id : "-", 0);
    if (status) snprintf(what, sizeof what, "status=%d", status);
    else snprintf(what, sizeof what, "category=%.60s", category ? category : "-");
    fprintf(stderr, "twinkle serve: failed request_id=%s tenant=%s route=%s %s msg=\"%s\"\n", id, t, r, what, m);
}

void twk_log_request(const char *request_id, const char *tenant, const char *route, const char *method, int status,
                     double duration_ms) {
    if (quiet || !json_mode) {
        answer_msg[0] = 0;
        return;
    }
    char l[2048], f[5][800];
    line_start(l, sizeof l, status >= 500 ? "error" : status >= 400 ? "warn" : "info", "request");
    field(f[0], sizeof f[0], "request_id", request_id);
    field(f[1], sizeof f[1], "tenant", tenant);
    field(f[2], sizeof f[2], "route", route);
    field(f[3], sizeof f[3], "method", method);
    if (status >= 400 && answer_msg[0]) field(f[4], sizeof f[4], "error", answer_msg);
    else f[4][0] = 0;
    answer_msg[0] = 0;
    fprintf(stderr, "%s%s%s%s%s,\"status\":%d,\"duration_ms\":%.3f%s}\n", l, f[0], f[1], f[2], f[3], status,
            duration_ms, f[4]);
}

void twk_log_info(const char *fmt, ...) {
    if (quiet) return;
    char m[1500];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    if (!json_mode) {
        fprintf(stderr, "twinkle serve: %s\n", m);
        return;
    }
    char l[256], f[1700];
    line_start(l, sizeof l, "info", "message");
    field(f, sizeof f, "msg", m);
    fprintf(stderr, "%s%s}\n", l, f);
}
