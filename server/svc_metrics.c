/* GET /metrics and the hooks that feed the metrics (metrics.h) and the alerts (alerts.h) from the
 * HTTP server, the futures and the training ops. Loop thread, except where the tables are
 * thread-safe on their own. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "api_util.h"
#include "metrics.h"
#include "svc.h"

/* Words of the API's paths; any other segment is an id. */
static const char *const words[] = {
    "healthz", "get_server_capabilities", "client", "config", "dynamic_config", "telemetry", "auth", "token",
    "cancel_future", "retrieve_futures", "retrieve_future", "create_session", "session_heartbeat", "sessions", "search",
    "finish", "trace_export", "session_traces", "create_model", "get_info", "forward_backward", "forward", "optim_step", "save_weights",
    "save_weights_for_sampler", "save_weights_external", "training_runs", "checkpoints", "weights", "sampler_weights",
    "external_weights", "external_weights_urls", "ttl", "publish", "copy_weights", "load_weights", "unload_model",
    "weights_info", "create_sampling_session", "asample", "samplers", "join_sampling_session", "compute_logprobs",
    "metrics", "/v1/models", "/v1/completions", "/v1/chat/completions", "/metrics", "/"};

static int is_word(const char *w, size_t n) {
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (strlen(words[i]) == n && !strncmp(words[i], w, n)) return 1;
    return 0;
}

void svc_metrics_route(const char *route, char *out, size_t len) {
    if (!route || !*route || !strcmp(route, "-")) {
        snprintf(out, len, "none");
        return;
    }
    if (route[0] == '/') { /* /v1/..., /metrics, the dashboard: whole paths */
        snprintf(out, len, "%s", is_word(route, strlen(route)) ? route : "other");
        return;
    }
    size_t o = 0;
    out[0] = 0;
    for (const char *p = route; *p && o + 1 < len;) {
        size_t n = strcspn(p, "/");
        const char *seg = is_word(p, n) ? NULL : "{id}";
        if (p == route && seg) { /* an unknown first segment: not a route of the API */
            snprintf(out, len, "other");
            return;
        }
        o += (size_t)snprintf(out + o, len - o, "%s%.*s", o ? "/" : "", seg ? 4 : (int)n, seg ? seg : p);
        p += n;
        if (*p == '/') p++;
    }
}

static void on_answer(void *user, const char *method, const char *tenant, const char *route, int status, double seconds) {
    svc *s = user;
    char r[160], l[256];
    svc_metrics_route(route, r, sizeof r);
    snprintf(l, sizeof l, "method=\"%s\",route=\"%s\",status=\"%d\"", method && *method ? method : "none", r, status);
    twk_metrics_add(s->metrics, TWK_M_HTTP_REQUESTS, tenant, l, 1);
    snprintf(l, sizeof l, "route=\"%s\",status=\"%d\"", r, status);
    twk_metrics_observe(s->metrics, TWK_M_HTTP_DURATION, tenant, l, seconds);
    if (status >= 400)
        twk_metrics_add(s->metrics, TWK_M_ERRORS, tenant,
                        status >= 500 ? "category=\"server\",source=\"answer\"" : "category=\"user\",source=\"answer\"", 1);
}

static void on_future_failed(void *user, const char *tenant, const char *route, const char *category) {
    svc *s = user;
    (void)route;
    char c[64], l[128];
    twk_metrics_escape(c, sizeof c, category);
    snprintf(l, sizeof l, "category=\"%s\",source=\"future\"", c);
    twk_metrics_add(s->metrics, TWK_M_ERRORS, tenant, l, 1);
}

twk_status svc_metrics_open(svc *s) {
    s->metrics = twk_metrics_new();
    if (!s->metrics) return twk_error(TWK_ERR_OOM, "out of memory starting the metrics");
    s->alerts = twk_alerts_start(&s->cfg.alerts, s->cfg.data_dir, s->metrics);
    return s->alerts ? TWK_OK : TWK_ERR_BACKEND; /* the reason is the last error */
}

void svc_metrics_attach(svc *s) {
    twk_http_server_set_observer(s->http, on_answer, s);
    twk_futures_on_fail(s->futures, on_future_failed, s);
}

void svc_metrics_close(svc *s) {
    twk_alerts_stop(s->alerts);
    s->alerts = NULL;
    twk_metrics_free(s->metrics);
    s->metrics = NULL;
}

/* ---- training ops ---- */

void svc_metrics_op_queued(svc *s, op *o) {
    o->t_queued = twk_metrics_job_queued(s->metrics, o->run->tenant, "train");
}

void svc_metrics_op_done(svc *s, const op *o) {
    const run_state *r = o->run;
    twk_metrics_job_done(s->metrics, r->tenant, "train", o->t_queued, o->t_started);
    if (o->st == TWK_OK && o->kind == OP_FB && o->fb) {
        double tokens = 0;
        for (int d = 0; d < o->fb->n_data; d++) tokens += (double)o->fb->data[d].n_tokens;
        twk_metrics_tokens(s->metrics, r->tenant, o->fb->forward_only ? "forward" : "forward_backward", tokens);
        if (!isfinite(o->loss_value))
            twk_alerts_raise(s->alerts, TWK_ALERT_LOSS_NONFINITE, r->tenant, r->id, o->request_id,
                             "%s of run %s returned a loss of %g (request %s)",
                             o->fb->forward_only ? "forward" : "forward_backward", r->id, o->loss_value, o->request_id);
    }
    if (o->st != TWK_OK && !(o->user_error && o->st != TWK_ERR_OOM))
        twk_alerts_raise(s->alerts, TWK_ALERT_OP_FAILED, r->tenant, r->id, o->request_id,
                         "an operation of run %s failed with a server error (request %s): %s", r->id, o->request_id,
                         o->err);
}

void svc_metrics_pack(svc *s, const base_model *bm) {
    twk_pack_stats st;
    svc_pack_stats(bm, &st);
    twk_metrics_pack(s->metrics, bm->name, &st);
}

/* ---- GET /metrics ---- */

static void on_tenant_stats(void *user, const char *tenant, int64_t sessions, int64_t ckpts, int64_t bytes) {
    twk_metrics *m = user;
    twk_metrics_set(m, TWK_M_SESSIONS_LIVE, tenant, "", (double)sessions);
    twk_metrics_set(m, TWK_M_CHECKPOINTS, tenant, "", (double)ckpts);
    twk_metrics_set(m, TWK_M_CHECKPOINT_BYTES, tenant, "", (double)bytes);
}

static double process_rss(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
        fclose(f);
    }
    return (double)rss * 4096.0;
}

/* The gauges read at each scrape. */
static void collect(svc *s) {
    twk_metrics *m = s->metrics;
    twk_metrics_clear(m, TWK_M_RUNS_LIVE);
    twk_metrics_clear(m, TWK_M_RUNS_SPILLED);
    for (const run_state *r = s->runs; r; r = r->next) {
        int live = !r->lost && !r->unloaded;
        twk_metrics_add(m, TWK_M_RUNS_LIVE, r->tenant, "", live);
        twk_metrics_add(m, TWK_M_RUNS_SPILLED, r->tenant, "", live && !r->resident);
    }
    twk_metrics_clear(m, TWK_M_SAMPLERS_LIVE);
    twk_metrics_clear(m, TWK_M_SAMPLERS_SPILLED);
    for (const sampler_session *ss = s->samplers; ss; ss = ss->next) {
        twk_metrics_add(m, TWK_M_SAMPLERS_LIVE, ss->tenant, "", 1);
        /* a doomed session's unit may be going away on the worker; others keep theirs */
        twk_metrics_add(m, TWK_M_SAMPLERS_SPILLED, ss->tenant, "", !ss->doomed && ss->unit && atomic_load(&ss->unit->evicted));
    }
    twk_metrics_clear(m, TWK_M_SESSIONS_LIVE);
    twk_metrics_clear(m, TWK_M_CHECKPOINTS);
    twk_metrics_clear(m, TWK_M_CHECKPOINT_BYTES);
    twk_store_tenant_stats(s->store, (double)time(NULL) - 300, on_tenant_stats, m);
    /* the pools as one set of reads, rendered beside their sum: they add up to the total exactly */
    size_t hp[TWK_HPOOL_COUNT], dp[TWK_DPOOL_COUNT];
    size_t host = twk_host_pool_snapshot(hp), device = twk_device_pool_snapshot(s->dev, dp);
    char dev[128], l[200];
    twk_metrics_set(m, TWK_M_HOST_MEMORY, NULL, "", (double)host);
    for (int i = 0; i < TWK_HPOOL_COUNT; i++) {
        snprintf(l, sizeof l, "pool=\"%s\"", twk_host_pool_name((twk_host_pool)i));
        twk_metrics_set(m, TWK_M_HOST_MEMORY_POOL, NULL, l, (double)hp[i]);
    }
    twk_metrics_set(m, TWK_M_PROCESS_RSS, NULL, "", process_rss());
    twk_metrics_escape(dev, sizeof dev, twk_device_spec(s->dev));
    for (int i = 0; i < TWK_DPOOL_COUNT; i++) {
        snprintf(l, sizeof l, "device=\"%s\",pool=\"%s\"", dev, twk_device_pool_name((twk_device_pool)i));
        twk_metrics_set(m, TWK_M_DEVICE_MEMORY_POOL, NULL, l, (double)dp[i]);
    }
    twk_device_props p;
    snprintf(l, sizeof l, "device=\"%s\"", dev);
    twk_metrics_set(m, TWK_M_DEVICE_MEMORY, NULL, l, (double)device);
    if (twk_device_get_props(s->dev, &p) == TWK_OK && p.memory_bytes)
        twk_metrics_set(m, TWK_M_DEVICE_MEMORY_TOTAL, NULL, l, (double)p.memory_bytes);
    twk_metrics_set(m, TWK_M_WORKER_STALL, NULL, "", twk_metrics_stall(m));
    for (int i = 0; i < s->n_models; i++) { /* the pass counters at 0 before the first pass (the worker sets them) */
        char mo[96];
        twk_metrics_escape(mo, sizeof mo, s->models[i].name);
        static const char *const kinds[] = {"packed", "alone"};
        for (int k = 0; k < 2; k++) {
            snprintf(l, sizeof l, "model=\"%s\",kind=\"%s\"", mo, kinds[k]);
            twk_metrics_add(m, TWK_M_TRAIN_PASSES, NULL, l, 0);
        }
        snprintf(l, sizeof l, "model=\"%s\"", mo);
        twk_metrics_add(m, TWK_M_TRAIN_PACKED_RUNS, NULL, l, 0);
        twk_metrics_add(m, TWK_M_TRAIN_PASS_RUNS_MAX, NULL, l, 0);
    }
}

/* The request's key: X-API-Key, or Authorization: Bearer (what Prometheus' scrape config sends). */
static const char *request_key(const twk_http_req *req) {
    const char *k = twk_http_header_get(req, "X-API-Key");
    const char *a = twk_http_header_get(req, "Authorization");
    if (!k && a && !strncasecmp(a, "Bearer ", 7)) k = a + 7;
    return k;
}

void api_metrics(svc *s, twk_http_conn *c, const twk_http_req *req) {
    twk_log_context(NULL, "/metrics");
    twk_http_log_fields(c, NULL, "/metrics", NULL);
    if (strcmp(req->method, "GET") && strcmp(req->method, "HEAD")) {
        api_error(c, 405, "method %s not allowed on /metrics", req->method);
        return;
    }
    const char *key = request_key(req);
    char tenant[64] = "";
    int known = key && twk_auth_tenant(s->auth, key, tenant);
    int admin = known && twk_auth_is_admin(s->auth, key);
    if (known) {
        twk_http_set_authenticated(c);
        twk_log_context(tenant, "/metrics");
        twk_http_log_fields(c, tenant, NULL, NULL);
    }
    if (s->cfg.metrics_auth != TWK_METRICS_OPEN && !known) {
        api_error(c, 401, "invalid or missing API key (send X-API-Key or Authorization: Bearer)");
        return;
    }
    if (s->cfg.metrics_auth == TWK_METRICS_ADMIN && !admin) {
        api_error(c, 403, "/metrics needs an admin key on this server (--metrics-auth admin)");
        return;
    }
    collect(s);
    size_t n = 0;
    char *text = twk_metrics_render(s->metrics, admin, &n);
    if (!text) {
        api_error(c, 503, "out of memory");
        return;
    }
    twk_http_respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, n, NULL);
    twk_host_free(text);
}
