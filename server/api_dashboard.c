/* The runs dashboard: the page (server/dashboard/, embedded into the binary at build time by
 * cmake/embed.cmake) and its JSON API under /api/v1/dashboard. A tenant's key sees that tenant's
 * runs, checkpoints, samplers and queue; an admin key (keys file `KEY TENANT admin`) sees every
 * tenant's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api_util.h"
#include "svc.h"

#include "dash_index_html.h"
#include "dash_dashboard_js.h"
#include "dash_dashboard_css.h"

/* ---- the page ---- */

typedef struct dash_asset {
    const char *path;
    const char *type;
    const unsigned char *data;
    const size_t *len;
} dash_asset;

static const dash_asset assets[] = {
    {"/", "text/html; charset=utf-8", dash_index_html, &dash_index_html_len},
    {"/dashboard/dashboard.js", "text/javascript; charset=utf-8", dash_dashboard_js, &dash_dashboard_js_len},
    {"/dashboard/dashboard.css", "text/css; charset=utf-8", dash_dashboard_css, &dash_dashboard_css_len},
};

/* Everything the page loads is its own: no inline script or style, nothing from elsewhere, never framed. */
static const char asset_headers[] =
    "Cache-Control: no-cache\r\n"
    "X-Content-Type-Options: nosniff\r\n"
    "Referrer-Policy: no-referrer\r\n"
    "Content-Security-Policy: default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'\r\n";

int api_dashboard_static(twk_http_conn *c, const twk_http_req *req) {
    for (size_t i = 0; i < sizeof assets / sizeof assets[0]; i++) {
        if (strcmp(req->path, assets[i].path)) continue;
        twk_http_log_fields(c, NULL, req->path, NULL);
        if (strcmp(req->method, "GET")) {
            api_error(c, 405, "method %s not allowed on %s", req->method, req->path);
            return 1;
        }
        twk_http_respond(c, 200, assets[i].type, assets[i].data, *assets[i].len, asset_headers);
        return 1;
    }
    return 0;
}

/* ---- the JSON API ---- */

/* The percent-decoded value of query parameter `name` into out[cap]; 0 when absent, malformed
 * (a bad %XX, an encoded NUL) or too long. */
static int query_str(const char *query, const char *name, char *out, size_t cap) {
    size_t n = strlen(name);
    for (const char *p = query; p && *p;) {
        if (!strncmp(p, name, n) && p[n] == '=') {
            size_t k = 0;
            for (const char *q = p + n + 1; *q && *q != '&'; q++) {
                int ch = (unsigned char)*q;
                if (ch == '%') {
                    char hex[3] = {q[1], q[1] ? q[2] : 0, 0};
                    char *end = NULL;
                    long v = strtol(hex, &end, 16);
                    if (!hex[0] || !hex[1] || *end || v == 0) return 0;
                    ch = (int)v;
                    q += 2;
                } else if (ch == '+') {
                    ch = ' ';
                }
                if (k + 1 >= cap) return 0;
                out[k++] = (char)ch;
            }
            out[k] = 0;
            return 1;
        }
        p = strchr(p, '&');
        if (p) p++;
    }
    return 0;
}

static const char *const step_kinds[] = {"forward_backward", "forward", "optim_step"};

static const run_state *live_run(const svc *s, const char *id) {
    for (const run_state *r = s->runs; r; r = r->next)
        if (!strcmp(r->id, id)) return r;
    return NULL;
}

/* What the server knows of a run now: live (its adapter in memory), unloaded, lost (a restart
 * dropped its live state) or stored (known only from the store, from an earlier server). */
static const char *run_state_name(const run_state *r) {
    return !r ? "stored" : r->lost ? "lost" : r->unloaded ? "unloaded" : "live";
}

static int held_ops(const run_state *r) {
    int n = 0;
    for (const op *o = r ? r->pending : NULL; o; o = o->next) n += o->kind != OP_SKIP;
    return n;
}

static cJSON *runs_json(svc *s, const char *tenant, int admin, int *total) {
    twk_store_run *runs = NULL;
    int n = 0;
    twk_status st = admin ? twk_store_run_list_all(s->store, TWK_SERVE_DASH_RUNS, 0, &runs, &n, total)
                          : twk_store_run_list(s->store, tenant, NULL, TWK_SERVE_DASH_RUNS, 0, &runs, &n, total);
    if (st != TWK_OK) return NULL;
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        const run_state *live = live_run(s, runs[i].id);
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "id", runs[i].id);
        cJSON_AddStringToObject(j, "tenant", runs[i].tenant);
        cJSON_AddStringToObject(j, "session_id", runs[i].session_id);
        cJSON_AddStringToObject(j, "base_model", runs[i].base_model);
        cJSON_AddNumberToObject(j, "lora_rank", runs[i].lora_rank);
        cJSON_AddNumberToObject(j, "created", runs[i].created);
        cJSON_AddNumberToObject(j, "last_request", runs[i].last_request);
        cJSON_AddStringToObject(j, "state", run_state_name(live));
        cJSON_AddNumberToObject(j, "running", live ? live->running : 0);
        cJSON_AddNumberToObject(j, "waiting", held_ops(live));
        cJSON_AddNumberToObject(j, "next_seq", live ? (double)live->next_seq : 0);
        cJSON *meta = cJSON_Parse(runs[i].user_metadata_json ? runs[i].user_metadata_json : "{}");
        api_json_put(j, "user_metadata", meta ? meta : cJSON_CreateObject());
        api_json_push(arr, j);
        twk_store_run_clear(&runs[i]);
    }
    twk_host_free(runs);
    return arr;
}

static cJSON *ckpts_json(svc *s, const char *tenant, int admin, double now, int *total) {
    twk_store_ckpt *list = NULL;
    int n = 0;
    twk_status st = admin ? twk_store_ckpt_list_all(s->store, TWK_SERVE_DASH_CKPTS, 0, &list, &n, total)
                          : twk_store_ckpt_list(s->store, tenant, NULL, TWK_SERVE_DASH_CKPTS, 0, &list, &n, total);
    if (st != TWK_OK) return NULL;
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        const twk_store_ckpt *c = &list[i];
        char path[512];
        snprintf(path, sizeof path, "tinker://%s/%s", c->run_id, c->checkpoint_id);
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "tinker_path", path);
        cJSON_AddStringToObject(j, "run_id", c->run_id);
        cJSON_AddStringToObject(j, "checkpoint_id", c->checkpoint_id);
        cJSON_AddStringToObject(j, "tenant", c->tenant);
        cJSON_AddStringToObject(j, "type", svc_ckpt_type(c->checkpoint_id));
        cJSON_AddNumberToObject(j, "size_bytes", (double)c->size_bytes);
        cJSON_AddNumberToObject(j, "created", c->created);
        if (c->expires_at > 0) {
            cJSON_AddNumberToObject(j, "expires_at", c->expires_at);
            cJSON_AddNumberToObject(j, "ttl_seconds_left", c->expires_at > now ? c->expires_at - now : 0);
        } else {
            cJSON_AddNullToObject(j, "expires_at");
            cJSON_AddNullToObject(j, "ttl_seconds_left");
        }
        cJSON_AddBoolToObject(j, "public", c->is_public);
        api_json_push(arr, j);
    }
    twk_host_free(list);
    return arr;
}

static cJSON *samplers_json(const svc *s, const char *tenant, int admin) {
    cJSON *arr = cJSON_CreateArray();
    for (const sampler_session *ss = s->samplers; ss; ss = ss->next) {
        if (!admin && strcmp(ss->tenant, tenant)) continue;
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "id", ss->id);
        cJSON_AddStringToObject(j, "tenant", ss->tenant);
        cJSON_AddStringToObject(j, "base_model", ss->base ? ss->base->name : "");
        if (ss->model_path[0]) cJSON_AddStringToObject(j, "model_path", ss->model_path);
        else cJSON_AddNullToObject(j, "model_path");
        cJSON_AddBoolToObject(j, "adapter", ss->has_adapter || ss->owns_unit);
        api_json_push(arr, j);
    }
    return arr;
}

/* The live queue: every live run of the caller's view with ops on the worker or held for a missing
 * seq_id; an admin also sees the sampling requests of the whole service. */
static cJSON *queue_json(const svc *s, const char *tenant, int admin) {
    cJSON *q = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    for (const run_state *r = s->runs; r; r = r->next) {
        if (!admin && strcmp(r->tenant, tenant)) continue;
        int held = held_ops(r);
        if (!r->running && !held) continue;
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "run_id", r->id);
        cJSON_AddStringToObject(j, "tenant", r->tenant);
        cJSON_AddNumberToObject(j, "running", r->running);
        cJSON_AddNumberToObject(j, "waiting", held);
        cJSON_AddNumberToObject(j, "next_seq", (double)r->next_seq);
        api_json_push(arr, j);
    }
    api_json_put(q, "runs", arr);
    if (admin) {
        cJSON_AddNumberToObject(q, "sample_requests", s->sample_inflight);
        cJSON_AddNumberToObject(q, "sample_queue_limit", s->cfg.sample_queue);
    }
    return q;
}

static void h_overview(svc *s, twk_http_conn *c, const char *tenant, int admin) {
    double now = (double)time(NULL);
    int n_runs = 0, n_ckpts = 0;
    cJSON *runs = runs_json(s, tenant, admin, &n_runs);
    cJSON *ckpts = runs ? ckpts_json(s, tenant, admin, now, &n_ckpts) : NULL;
    if (!runs || !ckpts) {
        cJSON_Delete(runs);
        api_error(c, 500, "reading the store failed: %s", twk_last_error());
        return;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "tenant", tenant);
    cJSON_AddBoolToObject(j, "admin", admin);
    cJSON_AddNumberToObject(j, "time", now);
    api_json_put(j, "runs", runs);
    cJSON_AddNumberToObject(j, "runs_total", n_runs);
    api_json_put(j, "checkpoints", ckpts);
    cJSON_AddNumberToObject(j, "checkpoints_total", n_ckpts);
    api_json_put(j, "samplers", samplers_json(s, tenant, admin));
    api_json_put(j, "queue", queue_json(s, tenant, admin));
    if (api_json_oom()) {
        cJSON_Delete(j);
        api_error(c, 503, "out of memory");
        return;
    }
    api_ok(c, j);
}

#define DASH_MAX_KEYS 64 /* metric keys per series (a loss has a handful) */

/* The metrics of rows[0..n) as columns: key -> array of n values (null where a row lacks the key or
 * its value is not a finite number), keys in order of first appearance. NULL without memory. */
static cJSON *series_columns(const twk_store_step *rows, int n) {
    cJSON **parsed = twk_host_calloc((size_t)(n ? n : 1) * sizeof *parsed, "dashboard rows");
    cJSON *cols = cJSON_CreateObject();
    if (!parsed || !cols) {
        twk_host_free(parsed);
        cJSON_Delete(cols);
        return NULL;
    }
    const char *keys[DASH_MAX_KEYS];
    int n_keys = 0;
    for (int i = 0; i < n; i++) {
        parsed[i] = cJSON_Parse(rows[i].metrics_json ? rows[i].metrics_json : "{}");
        for (const cJSON *v = parsed[i] ? parsed[i]->child : NULL; v && n_keys < DASH_MAX_KEYS; v = v->next) {
            int seen = 0;
            for (int k = 0; k < n_keys && !seen; k++) seen = !strcmp(keys[k], v->string);
            if (!seen) keys[n_keys++] = v->string;
        }
    }
    for (int k = 0; k < n_keys; k++) {
        cJSON *col = cJSON_CreateArray();
        for (int i = 0; i < n && col; i++) {
            const cJSON *v = parsed[i] ? cJSON_GetObjectItemCaseSensitive(parsed[i], keys[k]) : NULL;
            if (!api_json_push(col, cJSON_IsNumber(v) ? cJSON_CreateNumber(v->valuedouble) : cJSON_CreateNull())) break;
        }
        api_json_put(cols, keys[k], col);
    }
    for (int i = 0; i < n; i++) cJSON_Delete(parsed[i]); /* keys[] pointed into these */
    twk_host_free(parsed);
    return cols;
}

static void h_steps(svc *s, twk_http_conn *c, const twk_http_req *req, const char *tenant, int admin) {
    char run_id[128];
    if (!query_str(req->query, "run", run_id, sizeof run_id) || !run_id[0]) {
        api_error(c, 400, "query parameter 'run' (a training run id, percent-encoded) is missing or malformed");
        return;
    }
    if (!admin) { /* another tenant's run is as absent as an unknown one */
        twk_store_run r;
        if (twk_store_run_get(s->store, tenant, run_id, &r) != TWK_OK) {
            api_error(c, 404, "training run '%s' not found", run_id);
            return;
        }
        twk_store_run_clear(&r);
    }
    svc_steps_flush(s); /* what finished until now is in the answer */
    twk_store_step *rows = NULL;
    int n = 0;
    if (twk_store_steps_list(s->store, admin ? NULL : tenant, run_id, &rows, &n) != TWK_OK) {
        api_error(c, 500, "reading the step metrics failed: %s", twk_last_error());
        return;
    }
    cJSON *j = cJSON_CreateObject(), *series = cJSON_CreateArray();
    cJSON_AddStringToObject(j, "run_id", run_id);
    cJSON_AddNumberToObject(j, "max_points", TWK_SERVE_STEP_POINTS);
    for (int i = 0; i < n;) {
        int kind = rows[i].kind, first = i;
        cJSON *sj = cJSON_CreateObject(), *seq = cJSON_CreateArray(), *step = cJSON_CreateArray(),
              *t = cJSON_CreateArray();
        cJSON_AddStringToObject(sj, "kind", kind >= 0 && kind <= TWK_STEP_OPTIM ? step_kinds[kind] : "?");
        for (; i < n && rows[i].kind == kind; i++) {
            api_json_push(seq, cJSON_CreateNumber((double)rows[i].seq));
            api_json_push(step, cJSON_CreateNumber((double)rows[i].step));
            api_json_push(t, cJSON_CreateNumber(rows[i].time));
        }
        cJSON_AddNumberToObject(sj, "points", i - first);
        api_json_put(sj, "seq", seq);
        api_json_put(sj, "step", step);
        api_json_put(sj, "time", t);
        api_json_put(sj, "metrics", series_columns(rows + first, i - first)); /* NULL: marks out of memory */
        api_json_push(series, sj);
    }
    twk_store_steps_free(rows, n);
    api_json_put(j, "series", series);
    if (api_json_oom()) {
        cJSON_Delete(j);
        api_error(c, 503, "out of memory");
        return;
    }
    api_ok(c, j);
}

int api_dashboard(svc *s, twk_http_conn *c, const twk_http_req *req, const char *tenant, const char *key,
                  const char *route) {
    int overview = !strcmp(route, "dashboard"), steps = !strcmp(route, "dashboard/steps");
    if (!overview && !steps) return 0;
    if (strcmp(req->method, "GET")) {
        api_error(c, 405, "method %s not allowed on %s", req->method, req->path);
        return 1;
    }
    int admin = twk_auth_is_admin(s->auth, key);
    if (overview) h_overview(s, c, tenant, admin);
    else h_steps(s, c, req, tenant, admin);
    return 1;
}
