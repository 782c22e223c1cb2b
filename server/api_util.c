/* Helpers for the JSON endpoints. */
#include "api_util.h"
#include "twinkle/hal.h"

#include "log.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void api_failure_message(char *msg, size_t len, int status, const char *fmt, va_list ap) {
    vsnprintf(msg, len, fmt, ap);
    twk_log_failure(NULL, twk_log_tenant(), twk_log_route(), status, NULL, msg);
}

void api_error(twk_http_conn *c, int status, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    api_failure_message(msg, sizeof msg, status, fmt, ap);
    va_end(ap);
    api_json_oom();
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "error", msg);
    cJSON_AddStringToObject(j, "detail", msg);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    twk_http_respond_json(c, status, s && !api_json_oom() ? s : "{\"error\":\"out of memory\"}");
    cJSON_free(s);
}

/* cJSON's allocations go through the host allocator (api_json_hooks); a failed one leaves a
 * tree silently incomplete, so it is remembered per thread until api_json_oom reads it. */
static _Thread_local int json_oom;

static void *json_alloc(size_t n) {
    void *p = twk_host_pool_alloc(TWK_HPOOL_REQUESTS, n, "JSON");
    if (!p) json_oom = 1;
    return p;
}

void api_json_hooks(void) {
    cJSON_Hooks h = {json_alloc, twk_host_free};
    cJSON_InitHooks(&h);
}

int api_json_push(cJSON *arr, cJSON *item) {
    if (arr && item && cJSON_AddItemToArray(arr, item)) return 1;
    cJSON_Delete(item);
    json_oom = 1;
    return 0;
}

int api_json_put(cJSON *obj, const char *key, cJSON *item) {
    if (obj && item && cJSON_AddItemToObject(obj, key, item)) return 1;
    cJSON_Delete(item);
    json_oom = 1;
    return 0;
}

int api_json_oom(void) {
    int r = json_oom;
    json_oom = 0;
    return r;
}

void api_ok(twk_http_conn *c, cJSON *j) {
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s || api_json_oom()) {
        cJSON_free(s);
        twk_log_failure(NULL, twk_log_tenant(), twk_log_route(), 500, NULL, "out of memory");
        twk_http_respond_json(c, 500, "{\"error\":\"out of memory\"}");
        return;
    }
    twk_http_respond_json(c, 200, s);
    cJSON_free(s);
}

/* ---- strict JSON check (RFC 8259) before cJSON, which is lenient ---- */

typedef struct jscan {
    const unsigned char *p, *begin, *end;
    int depth;
    char key[64];  /* the innermost member's name, for messages */
    char *err;
    size_t err_len;
} jscan;

static int jfail(jscan *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int jfail(jscan *s, const char *fmt, ...) {
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(s->err, s->err_len, "request body is not valid JSON: %s", what);
    return 0;
}

static const char *jfield(const jscan *s) { return s->key[0] ? s->key : "(top level)"; }

static void jws(jscan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) s->p++;
}

static int jhex4(jscan *s, unsigned *v) {
    if (s->end - s->p < 4) return 0;
    *v = 0;
    for (int i = 0; i < 4; i++) {
        int c = s->p[i], d = isdigit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        *v = *v * 16 + (unsigned)d;
    }
    s->p += 4;
    return 1;
}

/* One UTF-8 sequence starting at s->p (a byte >= 0x80): no overlongs, surrogates or > U+10FFFF. */
static int jutf8(jscan *s) {
    const unsigned char *q = s->p;
    unsigned c = q[0], cp, n;
    if (c >= 0xc2 && c <= 0xdf) n = 1, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef) n = 2, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4) n = 3, cp = c & 0x07;
    else return 0;
    if ((size_t)(s->end - q) <= n) return 0;
    for (unsigned i = 1; i <= n; i++) {
        if ((q[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (q[i] & 0x3f);
    }
    if ((n == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    s->p += n + 1;
    return 1;
}

/* A string; is_key: its text (up to 63 bytes) becomes s->key. */
static int jstring(jscan *s, int is_key) {
    const unsigned char *start = ++s->p;
    char where[100];
    if (is_key) snprintf(where, sizeof where, "a member name");
    else snprintf(where, sizeof where, "field '%s'", jfield(s));
    while (s->p < s->end && *s->p != '"') {
        unsigned c = *s->p;
        if (c < 0x20) return jfail(s, "%s contains a raw control character (0x%02x)", where, c);
        if (c >= 0x80) {
            if (!jutf8(s)) return jfail(s, "%s is not valid UTF-8 (byte 0x%02x at offset %zu)", where, c,
                                        (size_t)(s->p - s->begin));
            continue;
        }
        s->p++;
        if (c != '\\') continue;
        if (s->p >= s->end) break;
        c = *s->p++;
        if (c == 'u') {
            unsigned v, lo;
            if (!jhex4(s, &v)) return jfail(s, "%s has a malformed \\u escape", where);
            if (v == 0) return jfail(s, "%s contains a NUL character (\\u0000), which is not allowed", where);
            if (v >= 0xdc00 && v <= 0xdfff) return jfail(s, "%s has an unpaired surrogate escape", where);
            if (v >= 0xd800 && v <= 0xdbff) {
                if (s->end - s->p < 6 || s->p[0] != '\\' || s->p[1] != 'u') return jfail(s, "%s has an unpaired surrogate escape", where);
                s->p += 2;
                if (!jhex4(s, &lo) || lo < 0xdc00 || lo > 0xdfff) return jfail(s, "%s has an unpaired surrogate escape", where);
            }
        } else if (!strchr("\"\\/bfnrt", (int)c) || !c) {
            return jfail(s, "%s has an invalid escape", where);
        }
    }
    if (s->p >= s->end) return jfail(s, "unterminated string");
    if (is_key) {
        size_t n = (size_t)(s->p - start);
        if (n >= sizeof s->key) n = sizeof s->key - 1;
        memcpy(s->key, start, n);
        s->key[n] = 0;
        for (size_t i = 0; i < n; i++)
            if (s->key[i] < 0x20 || s->key[i] == '\\') s->key[i] = '?';
    }
    s->p++;
    return 1;
}

static int jnumber(jscan *s) {
    const unsigned char *q = s->p;
    if (q < s->end && *q == '-') q++;
    if (q < s->end && *q == '0') q++;
    else if (q < s->end && *q >= '1' && *q <= '9') while (q < s->end && isdigit(*q)) q++;
    else return 0;
    if (q < s->end && *q == '.') {
        if (++q >= s->end || !isdigit(*q)) return 0;
        while (q < s->end && isdigit(*q)) q++;
    }
    if (q < s->end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < s->end && (*q == '+' || *q == '-')) q++;
        if (q >= s->end || !isdigit(*q)) return 0;
        while (q < s->end && isdigit(*q)) q++;
    }
    s->p = q;
    return 1;
}

static int jvalue(jscan *s) {
    jws(s);
    if (s->p >= s->end) return jfail(s, "unexpected end of input");
    unsigned char c = *s->p;
    if (c == '"') return jstring(s, 0);
    if (c == '{' || c == '[') {
        if (++s->depth > API_JSON_MAX_DEPTH)
            return jfail(s, "nesting too deep (more than %d levels of objects and arrays)", API_JSON_MAX_DEPTH);
        char outer[sizeof s->key];
        memcpy(outer, s->key, sizeof outer);
        s->p++;
        jws(s);
        unsigned char close = c == '{' ? '}' : ']';
        if (s->p < s->end && *s->p == close) {
            s->p++;
        } else {
            for (;;) {
                if (c == '{') {
                    jws(s);
                    if (s->p >= s->end || *s->p != '"') return jfail(s, "expected a member name at offset %zu", (size_t)(s->p - s->begin));
                    if (!jstring(s, 1)) return 0;
                    jws(s);
                    if (s->p >= s->end || *s->p != ':') return jfail(s, "expected ':' at offset %zu", (size_t)(s->p - s->begin));
                    s->p++;
                }
                if (!jvalue(s)) return 0;
                jws(s);
                if (s->p < s->end && *s->p == ',') {
                    s->p++;
                    continue;
                }
                if (s->p < s->end && *s->p == close) {
                    s->p++;
                    break;
                }
                return jfail(s, "expected ',' or '%c' at offset %zu", close, (size_t)(s->p - s->begin));
            }
        }
        memcpy(s->key, outer, sizeof outer);
        s->depth--;
        return 1;
    }
    static const char *const lits[3] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(lits[i]);
        if ((size_t)(s->end - s->p) >= n && !memcmp(s->p, lits[i], n)) {
            s->p += n;
            return 1;
        }
    }
    if (jnumber(s)) return 1;
    return jfail(s, "invalid value at offset %zu (field '%s')", (size_t)(s->p - s->begin), jfield(s));
}

int api_json_check(const unsigned char *p, size_t n, char *err, size_t err_len) {
    jscan s = {p, p, p + n, 0, "", err, err_len};
    jws(&s);
    if (s.p >= s.end || *s.p != '{') {
        snprintf(err, err_len, "request body is not a JSON object");
        return 0;
    }
    if (!jvalue(&s)) return 0;
    jws(&s);
    if (s.p != s.end) {
        snprintf(err, err_len, "request body is not valid JSON: unexpected data after the JSON object at offset %zu", (size_t)(s.p - p));
        return 0;
    }
    return 1;
}

cJSON *api_body(twk_http_conn *c, const twk_http_req *req) {
    if (req->body_len == 0) return cJSON_CreateObject();
    char err[300];
    if (!api_json_check(req->body, req->body_len, err, sizeof err)) {
        api_error(c, 400, "%s", err);
        return NULL;
    }
    api_json_oom();
    cJSON *j = cJSON_ParseWithLength((const char *)req->body, req->body_len);
    if (api_json_oom()) { /* the strict check passed: only memory can fail it */
        cJSON_Delete(j);
        api_error(c, 503, "out of memory reading the request body");
        return NULL;
    }
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        api_error(c, 400, "request body is not a JSON object");
        return NULL;
    }
    return j;
}

int api_str(const cJSON *o, const char *key, int required, const char **out, char *err, size_t err_len) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        *out = NULL;
        if (required) snprintf(err, err_len, "field '%s' is required", key);
        return !required;
    }
    if (!cJSON_IsString(v)) {
        snprintf(err, err_len, "field '%s' must be a string", key);
        return 0;
    }
    *out = v->valuestring;
    return 1;
}

int api_int(const cJSON *o, const char *key, int required, long long lo, long long hi, long long def, long long *out,
            char *err, size_t err_len) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        if (required) snprintf(err, err_len, "field '%s' is required", key);
        return !required;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < (double)lo ||
        v->valuedouble > (double)hi) {
        snprintf(err, err_len, "field '%s' must be an integer in [%lld, %lld]", key, lo, hi);
        return 0;
    }
    *out = (long long)v->valuedouble;
    return 1;
}

int api_num(const cJSON *o, const char *key, int required, double def, double *out, char *err, size_t err_len) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        if (required) snprintf(err, err_len, "field '%s' is required", key);
        return !required;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        snprintf(err, err_len, "field '%s' must be a finite number", key);
        return 0;
    }
    *out = v->valuedouble;
    return 1;
}

int api_bool(const cJSON *o, const char *key, int def, int *out, char *err, size_t err_len) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return 1;
    }
    if (!cJSON_IsBool(v)) {
        snprintf(err, err_len, "field '%s' must be true or false", key);
        return 0;
    }
    *out = cJSON_IsTrue(v);
    return 1;
}

int api_ttl(const cJSON *o, double *out, char *err, size_t err_len) {
    if (!api_num(o, "ttl_seconds", 0, 0, out, err, err_len)) return 0;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "ttl_seconds");
    if (v && !cJSON_IsNull(v) && !(*out > 0 && *out <= API_MAX_TTL_S)) {
        snprintf(err, err_len, "field 'ttl_seconds' = %g is out of range: it must be in (0, %.0f] (ten years), or null "
                               "for no expiry", *out, API_MAX_TTL_S);
        return 0;
    }
    return 1;
}

void api_iso_time(double t, char *out, size_t len) {
    if (!(t >= 0)) t = 0;
    if (t > 253402300799.0) t = 253402300799.0; /* 9999-12-31T23:59:59Z: a legacy row's huge expiry stays parseable */
    time_t tt = (time_t)t;
    struct tm tmv;
    gmtime_r(&tt, &tmv);
    strftime(out, len, "%Y-%m-%dT%H:%M:%SZ", &tmv);
}

long api_query_int(const char *query, const char *name, long def, long lo, long hi) {
    size_t n = strlen(name);
    for (const char *p = query; p && *p;) {
        if (!strncmp(p, name, n) && p[n] == '=') {
            char *end = NULL;
            long v = strtol(p + n + 1, &end, 10);
            if (end == p + n + 1) return def;
            return v < lo ? lo : v > hi ? hi : v;
        }
        p = strchr(p, '&');
        if (p) p++;
    }
    return def;
}

int api_valid_name(const char *name) {
    size_t n = name ? strlen(name) : 0;
    if (n < 1 || n > 100 || name[0] == '.') return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)name[i]) && name[i] != '.' && name[i] != '_' && name[i] != '-') return 0;
    return 1;
}
