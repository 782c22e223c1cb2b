/* Helpers for the JSON endpoints. */
#include "api_util.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void api_error(twk_http_conn *c, int status, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "error", msg);
    cJSON_AddStringToObject(j, "detail", msg);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    twk_http_respond_json(c, status, s ? s : "{\"error\":\"out of memory\"}");
    free(s);
}

void api_ok(twk_http_conn *c, cJSON *j) {
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) {
        twk_http_respond_json(c, 500, "{\"error\":\"out of memory\"}");
        return;
    }
    twk_http_respond_json(c, 200, s);
    free(s);
}

cJSON *api_body(twk_http_conn *c, const twk_http_req *req) {
    if (req->body_len == 0) return cJSON_CreateObject();
    cJSON *j = cJSON_ParseWithLength((const char *)req->body, req->body_len);
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

void api_iso_time(double t, char *out, size_t len) {
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
