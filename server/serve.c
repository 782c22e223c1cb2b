/* `twinkle serve`: configuration, the built-in default model, start-up and
 * shutdown of the loop, the worker and the store. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api_util.h"
#include "sign.h"
#include "svc.h"
#include "dist_serve.h" /* the multi-rank service */

void twk_serve_config_default(twk_serve_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->host, sizeof c->host, "127.0.0.1");
    c->port = TWK_SERVE_DEF_PORT;
    snprintf(c->data_dir, sizeof c->data_dir, "twinkle-data");
    snprintf(c->device, sizeof c->device, "cpu");
    c->dtype = c->kv_dtype = -1;
    c->max_lora_rank = TWK_SERVE_DEF_MAX_LORA_RANK;
    c->max_context = TWK_SERVE_DEF_MAX_CONTEXT;
    c->max_datums = TWK_SERVE_DEF_MAX_DATUMS;
    c->max_body_bytes = (size_t)TWK_SERVE_DEF_MAX_BODY_MB << 20;
    c->seq_timeout_s = TWK_SERVE_DEF_SEQ_TIMEOUT_S;
    c->stability_ttl_s = TWK_SERVE_DEF_STABILITY_TTL_S;
    c->stability_records = TWK_SERVE_DEF_STABILITY_RECORDS;
    c->poll_timeout_s = TWK_SERVE_DEF_POLL_TIMEOUT_S;
    c->fwdbwd_chunk_len = TWK_SERVE_DEF_FWDBWD_CHUNK_LEN;
    c->max_early_bytes_run = (size_t)TWK_SERVE_DEF_EARLY_MB_RUN << 20;
    c->max_early_bytes_tenant = (size_t)TWK_SERVE_DEF_EARLY_MB_TENANT << 20;
    c->max_result_bytes_tenant = (size_t)TWK_SERVE_DEF_RESULTS_MB_TENANT << 20;
    c->result_keep_s = TWK_SERVE_DEF_RESULT_KEEP_S;
    c->result_ttl_s = TWK_SERVE_DEF_RESULT_TTL_S;
    c->sample_queue = TWK_SERVE_DEF_SAMPLE_QUEUE;
    c->sampler_slots = TWK_SERVE_DEF_SAMPLER_SLOTS;
    c->slot_rank = twk_lora_default().rank;
    c->live_samplers = TWK_SERVE_DEF_LIVE_SAMPLERS;
    c->max_queue_tenant = TWK_SERVE_DEF_MAX_QUEUE_TENANT;
    c->run_idle_s = TWK_SERVE_DEF_RUN_IDLE_S;
    c->max_live_runs = TWK_SERVE_DEF_MAX_LIVE_RUNS;
    c->sampler_idle_s = TWK_SERVE_DEF_SAMPLER_IDLE_S;
    c->max_sampler_host_bytes = (size_t)TWK_SERVE_DEF_SAMPLER_HOST_MB << 20;
    c->pack_runs = TWK_SERVE_DEF_PACK_RUNS;
    c->url_ttl_s = 3600;
    c->ckpt_sweep_s = 60;
    twk_alert_config_default(&c->alerts);
    /* connection limits */
    c->max_connections = 4096;
    c->max_connections_per_addr = 512;
    c->header_timeout_s = 10;
    c->idle_timeout_s = 75;
    c->read_timeout_s = 30;
}

static int parse_num(const char *s, double lo, double hi, double *out) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (!*s || *end || !(v >= lo && v <= hi)) return 0;
    *out = v;
    return 1;
}

twk_status twk_serve_config_arg(twk_serve_config *c, const char *opt, const char *val, int *used) {
    *used = 1;
    while (*opt == '-') opt++;
    if (!strcmp(opt, "quiet") || !strcmp(opt, "jwt-auth") || !strcmp(opt, "recompute")) { /* flags: no value */
        *(!strcmp(opt, "quiet") ? &c->quiet : !strcmp(opt, "recompute") ? &c->recompute : &c->jwt_auth) = 1;
        *used = 0;
        return TWK_OK;
    }
    if (!strcmp(opt, "log-format")) {
        if (!val || (strcmp(val, "text") && strcmp(val, "json")))
            return twk_error(TWK_ERR_INVALID_ARG, "--log-format wants text or json, got '%s'", val ? val : "");
        c->log_json = !strcmp(val, "json");
        return TWK_OK;
    }
    twk_status ast;
    if (twk_alert_config_arg(&c->alerts, opt, val, &ast)) return ast;
    if (!strcmp(opt, "metrics-auth")) {
        static const char *const modes[] = {[TWK_METRICS_KEY] = "key", [TWK_METRICS_OPEN] = "open", [TWK_METRICS_ADMIN] = "admin"};
        for (int i = 0; val && i < 3; i++)
            if (!strcmp(val, modes[i])) {
                c->metrics_auth = i;
                return TWK_OK;
            }
        return twk_error(TWK_ERR_INVALID_ARG, "--metrics-auth wants open, key or admin, got '%s'", val ? val : "");
    }
    /* a known option without its value says so; an unknown one is "unknown option" */
    double v;
#define NUM(name, lo, hi, field, type)                                                                  \
    if (!strcmp(opt, name)) {                                                                           \
        if (!val) return twk_error(TWK_ERR_INVALID_ARG, "--%s needs a value", opt);                     \
        if (!parse_num(val, lo, hi, &v))                                                                \
            return twk_error(TWK_ERR_INVALID_ARG, "--%s wants a number in [%g, %g], got '%s'", opt,     \
                             (double)(lo), (double)(hi), val);                                          \
        c->field = (type)v;                                                                             \
        return TWK_OK;                                                                                  \
    }
    NUM("port", 0, 65535, port, int)
    NUM("max-lora-rank", 1, 4096, max_lora_rank, int)
    NUM("max-context", 2, 1 << 20, max_context, int64_t)
    NUM("max-datums", 1, 1 << 20, max_datums, int64_t)
    NUM("pack-runs", 1, TWK_SERVE_CAP_PACK_RUNS, pack_runs, int)
    NUM("pack-tokens", 0, 1 << 22, pack_tokens, int64_t)
    struct { const char *name; size_t *dst; double lo, hi; } mbs[] = {
        {"max-body-mb", &c->max_body_bytes, 1, 4096},
        /* buffering limits */
        {"max-early-mb-run", &c->max_early_bytes_run, 0.01, 1 << 20},
        {"max-early-mb-tenant", &c->max_early_bytes_tenant, 0.01, 1 << 20},
        {"max-results-mb-tenant", &c->max_result_bytes_tenant, 0.01, 1 << 20},
        {"max-sampler-host-mb", &c->max_sampler_host_bytes, 0.01, 1 << 20},
    };
    for (size_t i = 0; i < sizeof mbs / sizeof mbs[0]; i++)
        if (!strcmp(opt, mbs[i].name)) {
            if (!val) return twk_error(TWK_ERR_INVALID_ARG, "--%s needs a value", opt);
            if (!parse_num(val, mbs[i].lo, mbs[i].hi, &v))
                return twk_error(TWK_ERR_INVALID_ARG, "--%s wants a number in [%g, %g], got '%s'", opt, mbs[i].lo,
                                 mbs[i].hi, val);
            *mbs[i].dst = (size_t)(v * 1048576.0);
            return TWK_OK;
        }
    NUM("seq-timeout", 1, 86400, seq_timeout_s, double)
    NUM("stability-ttl", 1, 1e7, stability_ttl_s, double)
    NUM("poll-timeout", 0.05, 40, poll_timeout_s, double)
    NUM("url-ttl", 1, 7 * 86400, url_ttl_s, double)
    NUM("fwdbwd-chunk-len", 1, 1 << 20, fwdbwd_chunk_len, int)
    NUM("result-keep", 1, 86400, result_keep_s, double)
    NUM("result-ttl", 1, 30 * 86400, result_ttl_s, double)
    NUM("checkpoint-sweep", 0.1, 86400, ckpt_sweep_s, double)
    /* connection limits */
    NUM("max-connections", 1, 1 << 20, max_connections, int)
    NUM("max-connections-per-addr", 1, 1 << 20, max_connections_per_addr, int)
    NUM("header-timeout", 0.05, 3600, header_timeout_s, double)
    NUM("idle-timeout", 0.05, 86400, idle_timeout_s, double)
    NUM("read-timeout", 0.05, 86400, read_timeout_s, double)
    NUM("stability-records", 1, 1 << 24, stability_records, int)
    NUM("sample-queue", 1, 1 << 16, sample_queue, int)
    NUM("sampler-slots", 2, TWK_SERVE_CAP_SAMPLER_SLOTS, sampler_slots, int)
    NUM("slot-rank", 1, 4096, slot_rank, int)
    NUM("live-samplers", 1, TWK_SERVE_CAP_LIVE_SAMPLERS, live_samplers, int)
    NUM("max-queue-per-tenant", 1, 1 << 20, max_queue_tenant, int)
    NUM("run-idle-s", 0.1, 1e7, run_idle_s, double)
    NUM("max-live-runs", 1, 1 << 20, max_live_runs, int)
    NUM("sampler-idle-s", 0.1, 1e7, sampler_idle_s, double)
#undef NUM
    struct { const char *name; char *dst; size_t len; } strs[] = {
        {"host", c->host, sizeof c->host},
        {"data-dir", c->data_dir, sizeof c->data_dir},
        {"keys", c->keys_file, sizeof c->keys_file},
        {"device", c->device, sizeof c->device},
    };
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        if (!strcmp(opt, strs[i].name)) {
            if (!val) return twk_error(TWK_ERR_INVALID_ARG, "--%s needs a value", opt);
            if (strlen(val) >= strs[i].len) return twk_error(TWK_ERR_INVALID_ARG, "--%s: value too long", opt);
            snprintf(strs[i].dst, strs[i].len, "%s", val);
            return TWK_OK;
        }
    if (!strcmp(opt, "dtype") || !strcmp(opt, "kv-dtype")) {
        int t = twk_dtype_parse_float(val);
        if (t < 0) return twk_error(TWK_ERR_INVALID_ARG, "--%s: '%s' is not f32, bf16 or f16", opt, val ? val : "");
        *(opt[0] == 'd' ? &c->dtype : &c->kv_dtype) = t;
        return TWK_OK;
    }
    if (!strcmp(opt, "model")) {
        if (!val) return twk_error(TWK_ERR_INVALID_ARG, "--%s needs a value", opt);
        if (c->n_models == TWK_MAX_BASE_MODELS)
            return twk_error(TWK_ERR_INVALID_ARG, "--model: at most %d models", TWK_MAX_BASE_MODELS);
        twk_serve_model_spec *m = &c->models[c->n_models];
        const char *eq = strchr(val, '=');
        size_t dl = eq ? (size_t)(eq - val) : strlen(val);
        if (dl == 0 || dl >= sizeof m->dir) return twk_error(TWK_ERR_INVALID_ARG, "--model: bad folder '%s'", val);
        memcpy(m->dir, val, dl);
        m->dir[dl] = 0;
        while (dl > 1 && m->dir[dl - 1] == '/') m->dir[--dl] = 0;
        if (eq) {
            if (!eq[1] || strlen(eq + 1) >= sizeof m->name)
                return twk_error(TWK_ERR_INVALID_ARG, "--model: bad name in '%s'", val);
            snprintf(m->name, sizeof m->name, "%s", eq + 1);
        } else {
            const char *base = strrchr(m->dir, '/');
            snprintf(m->name, sizeof m->name, "%s", base ? base + 1 : m->dir);
        }
        for (int i = 0; i < c->n_models; i++)
            if (!strcmp(c->models[i].name, m->name))
                return twk_error(TWK_ERR_INVALID_ARG, "--model: two models named '%s'", m->name);
        c->n_models++;
        return TWK_OK;
    }
    return twk_error(TWK_ERR_INVALID_ARG, "unknown option --%s", opt);
}

twk_status twk_serve_config_file(twk_serve_config *c, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return twk_error(TWK_ERR_IO, "cannot open config file %s", path);
    char line[2048];
    int lineno = 0;
    twk_status st = TWK_OK;
    while (st == TWK_OK && fgets(line, sizeof line, f)) {
        lineno++;
        char *p = line;
        while (isspace((unsigned char)*p)) p++;
        if (!*p || *p == '#') continue;
        char *eq = strchr(p, '=');
        char *end = p + strlen(p);
        while (end > p && isspace((unsigned char)end[-1])) *--end = 0;
        if (!eq && strcmp(p, "quiet") && strcmp(p, "jwt-auth") && strcmp(p, "recompute")) {
            st = twk_error(TWK_ERR_INVALID_ARG, "%s:%d: want 'key = value'", path, lineno);
            break;
        }
        char *val = NULL;
        if (eq) {
            char *k = eq;
            while (k > p && isspace((unsigned char)k[-1])) k--;
            *k = 0;
            val = eq + 1;
            while (isspace((unsigned char)*val)) val++;
        }
        int used;
        st = twk_serve_config_arg(c, p, val, &used);
        if (st != TWK_OK) st = twk_error(st, "%s:%d: %s", path, lineno, twk_last_error());
    }
    fclose(f);
    return st;
}

twk_status twk_serve_default_model(const char *data_dir, char *dir, size_t dir_len) {
    char models[1200];
    snprintf(models, sizeof models, "%s/models", data_dir);
    snprintf(dir, dir_len, "%s/tiny", models);
    char cfg_path[1300];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    struct stat sb;
    if (stat(cfg_path, &sb) == 0) return TWK_OK;
    if ((mkdir(data_dir, 0700) != 0 && errno != EEXIST) || (mkdir(models, 0755) != 0 && errno != EEXIST))
        return twk_error(TWK_ERR_IO, "cannot create %s: %s", models, strerror(errno));
    twk_device *dev = NULL;
    twk_status st = twk_device_open("cpu", &dev);
    twk_model *m = NULL;
    if (st == TWK_OK) st = twk_model_builtin(dev, &m);
    char tmp[1300];
    snprintf(tmp, sizeof tmp, "%s/.tiny-%ld", models, (long)getpid());
    if (st == TWK_OK) st = twk_model_save(m, tmp);
    if (st == TWK_OK && rename(tmp, dir) != 0 && errno != EEXIST && errno != ENOTEMPTY)
        st = twk_error(TWK_ERR_IO, "cannot publish %s: %s", dir, strerror(errno));
    twk_model_free(m);
    twk_device_close(dev);
    return st;
}

static void on_gap_timer(uv_timer_t *t) { svc_check_gaps(t->data); }

/* Stops accepting, fails what waits, joins the worker and closes the loop's handles; the loop
 * then ends. */
static void shut_down(svc *s) {
    s->stopping = 1;
    twk_http_server_stop(s->http);
    svc_spill_stop(s); /* every resident run's state to DATA_DIR/spill, queued before the worker stops */
    svc_timeline_stop(s); /* the settled requests' records written, before the futures go */
    twk_futures_free(s->futures);
    s->futures = NULL;
    twk_worker_stop(s->worker);
    s->worker = NULL;
    svc_steps_stop(s); /* after the worker: its last ops' rows are written too */
    uv_timer_stop(&s->gap_timer);
    uv_close((uv_handle_t *)&s->gap_timer, NULL);
    svc_sweeper_stop(s);
    uv_signal_stop(&s->sigint);
    uv_signal_stop(&s->sigterm);
    uv_close((uv_handle_t *)&s->sigint, NULL);
    uv_close((uv_handle_t *)&s->sigterm, NULL);
}

static void on_signal(uv_signal_t *h, int signum) {
    svc *s = h->data;
    if (s->stopping) return;
    twk_log_info("signal %d, shutting down", signum);
    shut_down(s);
}

/* Before b's weights are read: its memory plan on the device — the weights, the activation
 * arena every run shares, the base sampler's KV cache and one run at --max-lora-rank — refused
 * with the table when it cannot fit (recompute chosen when only that fits), and the start-up
 * line with the per-run cost at --slot-rank (the default LoRA rank). */
static twk_status plan_model(const twk_serve_config *c, twk_device *dev, base_model *b, twk_mem_plan *p) {
    int dtype = twk_model_weights_dtype(b->dir, dev, c->dtype); /* the dtype the load will hold */
    if (dtype < 0) return TWK_ERR_INVALID_ARG;
    twk_mem_request rq = {.tokens = c->max_context, .rank = c->max_lora_rank, .train_unembed = true,
                          .train_experts = true, /* train_mlp's expert stacks on a mixture of experts */
                          .dtype = twk_dtype_name((twk_dtype)dtype), .recompute = c->recompute,
                          .kv_seqs = TWK_SERVE_SAMPLER_SEQS, .kv_len = c->max_context};
    twk_status st = twk_mem_plan_choose(b->dir, &rq, true, dev, p);
    char table[2048], w[32], ar[32], kv[32], pr[32], ad[32], mo[32], gr[32];
    if (st == TWK_ERR_OOM) {
        char why[600];
        snprintf(why, sizeof why, "%s", twk_last_error());
        fprintf(stderr, "twinkle serve: model '%s' cannot be served on %s (--max-context %lld, --max-lora-rank %d):\n%s",
                b->name, twk_device_spec(dev), (long long)c->max_context, c->max_lora_rank,
                twk_mem_plan_table(p, &rq, table, sizeof table));
        return twk_error(st, "does not fit: %s", why);
    }
    if (st != TWK_OK) return st;
    b->recompute = rq.recompute;
    twk_mem_request one = rq;
    one.rank = c->slot_rank;
    one.train_unembed = false;
    one.kv_seqs = 0;
    twk_mem_plan run;
    st = twk_mem_plan_dir(b->dir, &one, &run);
    if (st != TWK_OK) return st;
    twk_log_info("model '%s': weights %s (loaded once, shared by every tenant), activations %s (one arena every run "
                 "shares%s), sampler KV cache %s; each run of rank %d costs %s: adapter %s + gradients %s + AdamW moments %s",
                 b->name, twk_mem_bytes_str(p->weights, w, sizeof w), twk_mem_bytes_str(p->arena, ar, sizeof ar),
                 rq.recompute ? ", recompute" : "", twk_mem_bytes_str(p->kv_cache, kv, sizeof kv), c->slot_rank,
                 twk_mem_bytes_str(run.per_run, pr, sizeof pr), twk_mem_bytes_str(run.adapter, ad, sizeof ad),
                 twk_mem_bytes_str(run.grads, gr, sizeof gr), twk_mem_bytes_str(run.moments, mo, sizeof mo));
    return TWK_OK;
}

twk_status svc_load_models(const twk_serve_config *cfg, twk_device *dev, base_model *models, int *n_models) {
    twk_serve_model_spec def;
    const twk_serve_model_spec *specs = cfg->models;
    int n = cfg->n_models;
    if (n == 0) {
        twk_status st = twk_serve_default_model(cfg->data_dir, def.dir, sizeof def.dir);
        if (st != TWK_OK) return st;
        snprintf(def.name, sizeof def.name, "%s", TWK_DEFAULT_MODEL_NAME);
        specs = &def;
        n = 1;
    }
    for (int i = 0; i < n; i++) {
        base_model *b = &models[*n_models];
        snprintf(b->name, sizeof b->name, "%s", specs[i].name);
        char abs_dir[PATH_MAX]; /* absolute: get_info's tokenizer_id is this folder */
        snprintf(b->dir, sizeof b->dir, "%.1000s", realpath(specs[i].dir, abs_dir) ? abs_dir : specs[i].dir);
        twk_mem_plan plan;
        twk_status st = plan_model(cfg, dev, b, &plan);
        if (st == TWK_OK) st = twk_model_load_as(b->dir, dev, cfg->dtype, cfg->kv_dtype, &b->m);
        if (st == TWK_OK && plan.arena) {
            twk_device_pool pool = twk_device_pool_enter(TWK_DPOOL_ACTIVATIONS);
            st = twk_buffer_alloc(dev, plan.arena, &b->arena);
            twk_device_pool_enter(pool);
        }
        if (st != TWK_OK) {
            st = twk_error(st, "model '%s': %s", b->name, twk_last_error());
            twk_buffer_free(dev, b->arena);
            twk_model_free(b->m);
            b->arena = NULL;
            b->m = NULL;
            return st;
        }
        char tok[1100];
        snprintf(tok, sizeof tok, "%s/tokenizer.json", b->dir);
        struct stat sb;
        b->has_tokenizer = stat(tok, &sb) == 0;
        if (b->has_tokenizer && twk_tokenizer_load(tok, &b->tok) != TWK_OK) {
            twk_log_info("model '%s': %s (stop strings disabled)", b->name, twk_last_error());
            b->tok = NULL;
        }
        (*n_models)++;
    }
    return TWK_OK;
}

/* Opens the store, keys, device and models, starts the futures, the worker and the listener on
 * `loop`; 0, or 1 after a message on stderr (what was started is stopped; serve_close frees). */
static int serve_open(svc *s, const twk_serve_config *cfg, uv_loop_t *loop) {
    s->cfg = *cfg;
    s->loop = loop;
    api_json_hooks();
    twk_log_quiet(cfg->quiet);
    twk_log_json(cfg->log_json);
    twk_status st = twk_store_open(cfg->data_dir, &s->store);
    if (st == TWK_OK) st = twk_auth_load(cfg->keys_file, &s->auth);
    if (st == TWK_OK) st = twk_device_open(cfg->device, &s->dev);
    if (st == TWK_OK) st = svc_load_models(cfg, s->dev, s->models, &s->n_models);
    if (st == TWK_OK && !(s->stab = twk_stab_new(cfg->stability_ttl_s, cfg->stability_records)))
        st = twk_error(TWK_ERR_OOM, "out of memory for the stability records");
    char key_err[1300];
    if (st == TWK_OK && svc_dist_start(key_err, sizeof key_err) != 0) /* multi-rank: the others load the models */
        st = twk_error(TWK_ERR_BACKEND, "%s", key_err);
    if (st == TWK_OK && twk_sign_key_load(cfg->data_dir, s->url_key, key_err, sizeof key_err) != 0)
        st = twk_error(TWK_ERR_IO, "%s", key_err);
    if (st == TWK_OK) st = svc_metrics_open(s);
    if (st != TWK_OK) {
        fprintf(stderr, "twinkle serve: %s\n", twk_last_error());
        return 1;
    }
    twk_futures_limits fl = {cfg->poll_timeout_s, cfg->result_keep_s, cfg->result_ttl_s, cfg->max_result_bytes_tenant};
    svc_ckpt_recover(s);
    s->futures = twk_futures_new(loop, &fl);
    s->worker = twk_worker_start(loop);
    if (s->worker) twk_worker_set_batch_max(s->worker, cfg->pack_runs); /* packed training: batch_train.c */
    twk_http_limits lim = twk_http_limits_default();
    lim.max_body_bytes = cfg->max_body_bytes;
    /* connection limits */
    lim.max_connections = cfg->max_connections;
    lim.max_connections_per_addr = cfg->max_connections_per_addr;
    lim.header_timeout_ms = (unsigned)(cfg->header_timeout_s * 1000.0);
    lim.idle_timeout_ms = (unsigned)(cfg->idle_timeout_s * 1000.0);
    lim.read_timeout_ms = (unsigned)(cfg->read_timeout_s * 1000.0);
    int err = s->futures && s->worker
                  ? twk_http_server_start(loop, cfg->host, cfg->port, &lim, svc_handle, s, &s->http)
                  : UV_ENOMEM;
    if (err) {
        fprintf(stderr, "twinkle serve: cannot listen on %s:%d: %s\n", cfg->host, cfg->port, uv_strerror(err));
        if (s->futures) twk_futures_free(s->futures);
        if (s->worker) twk_worker_stop(s->worker);
        s->futures = NULL;
        s->worker = NULL;
        uv_run(loop, UV_RUN_DEFAULT);
        return 1;
    }
    svc_metrics_attach(s);
    uv_timer_init(loop, &s->gap_timer);
    s->gap_timer.data = s;
    uv_timer_start(&s->gap_timer, on_gap_timer, 1000, 1000);
    svc_sweeper_start(s);
    if (svc_steps_start(s) != 0) twk_log_info("out of memory for the step metrics log: no curves this time");
    if (svc_timeline_start(s) != 0) twk_log_info("out of memory for the session timelines: no traces this time");
    svc_spill_start(s);
    uv_signal_init(loop, &s->sigint);
    uv_signal_init(loop, &s->sigterm);
    s->sigint.data = s->sigterm.data = s;
    uv_signal_start(&s->sigint, on_signal, SIGINT);
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    char names[600] = "";
    for (int i = 0; i < s->n_models; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), " %s", s->models[i].name);
    twk_log_info("listening on http://%s:%d  device %s  data %s  auth %s  models:%s", cfg->host,
                 twk_http_server_port(s->http), twk_device_spec(s->dev), cfg->data_dir,
                 twk_auth_open_mode(s->auth) ? "open (any tml- key)" : cfg->keys_file, names);
    return 0;
}

/* Frees what serve_open made, after the loop ended. */
static void serve_close(svc *s, uv_loop_t *loop) {
    svc_metrics_close(s);
    svc_free_samplers(s);
    svc_free_runs(s);
    for (int i = 0; i < s->n_models; i++) {
        twk_pack_free(s->models[i].pack);
        twk_buffer_free(s->dev, s->models[i].arena);
        twk_model_free(s->models[i].m);
        twk_tokenizer_free(s->models[i].tok);
        twk_chat_template_free(s->models[i].chat);
    }
    twk_device_close(s->dev);
    twk_auth_free(s->auth);
    twk_store_close(s->store);
    twk_stab_free(s->stab);
    uv_loop_close(loop);
    twk_host_free(s);
}

int twk_serve_run(const twk_serve_config *cfg) {
    svc *s = twk_host_calloc(sizeof *s, "service");
    if (!s) return 1;
    uv_loop_t loop;
    uv_loop_init(&loop);
    int rc = serve_open(s, cfg, &loop);
    if (rc == 0) {
        printf("port %d\n", twk_http_server_port(s->http));
        fflush(stdout);
        uv_run(&loop, UV_RUN_DEFAULT);
    }
    svc_dist_stop(); /* multi-rank: the other ranks leave their command loops */
    serve_close(s, &loop);
    return rc;
}

/* ---- the service in a thread of this process (tests) ---- */

struct twk_serve {
    svc *s;
    uv_loop_t loop;
    uv_async_t stop;
    pthread_t thread;
};

static void on_stop(uv_async_t *a) {
    svc *s = a->data;
    if (!s->stopping) shut_down(s);
    uv_close((uv_handle_t *)a, NULL);
}

static void *serve_thread(void *arg) {
    twk_serve *h = arg;
    uv_run(&h->loop, UV_RUN_DEFAULT);
    return NULL;
}

twk_status twk_serve_start(const twk_serve_config *cfg, twk_serve **out) {
    *out = NULL;
    twk_serve *h = twk_host_calloc(sizeof *h, "service handle");
    svc *s = twk_host_calloc(sizeof *s, "service");
    if (!h || !s) {
        twk_host_free(h);
        twk_host_free(s);
        return twk_error(TWK_ERR_OOM, "out of memory starting the service");
    }
    h->s = s;
    uv_loop_init(&h->loop);
    if (serve_open(s, cfg, &h->loop)) {
        serve_close(s, &h->loop);
        twk_host_free(h);
        return twk_error(TWK_ERR_IO, "the service did not start (see stderr)");
    }
    uv_async_init(&h->loop, &h->stop, on_stop);
    h->stop.data = s;
    if (pthread_create(&h->thread, NULL, serve_thread, h)) {
        shut_down(s);
        uv_close((uv_handle_t *)&h->stop, NULL);
        uv_run(&h->loop, UV_RUN_DEFAULT);
        serve_close(s, &h->loop);
        twk_host_free(h);
        return twk_error(TWK_ERR_IO, "cannot start the service's thread");
    }
    *out = h;
    return TWK_OK;
}

int twk_serve_port(const twk_serve *h) { return h ? twk_http_server_port(h->s->http) : 0; }

void twk_serve_pack_stats(const twk_serve *h, twk_pack_stats *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; h && i < h->s->n_models; i++) {
        twk_pack_stats one;
        svc_pack_stats(&h->s->models[i], &one);
        out->passes += one.passes;
        out->segments += one.segments;
        out->shared_passes += one.shared_passes;
        out->own_passes += one.own_passes;
        if (one.max_segments > out->max_segments) out->max_segments = one.max_segments;
    }
}

void twk_serve_stop(twk_serve *h) {
    if (!h) return;
    uv_async_send(&h->stop);
    pthread_join(h->thread, NULL);
    serve_close(h->s, &h->loop);
    twk_host_free(h);
}
