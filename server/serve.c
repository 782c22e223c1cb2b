/* `twinkle serve`: configuration, the built-in default model, start-up and
 * shutdown of the loop, the worker and the store. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "svc.h"

void twk_serve_config_default(twk_serve_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->host, sizeof c->host, "127.0.0.1");
    c->port = 8000;
    snprintf(c->data_dir, sizeof c->data_dir, "twinkle-data");
    snprintf(c->device, sizeof c->device, "cpu");
    c->max_lora_rank = 128;
    c->max_context = 2048;
    c->max_datums = 4096;
    c->max_body_bytes = 64u << 20;
    c->seq_timeout_s = 120;
    c->stability_ttl_s = 86400;
    c->poll_timeout_s = 25;
    c->fwdbwd_chunk_len = 1024;
    c->max_early_bytes_run = 256u << 20;
    c->max_early_bytes_tenant = (size_t)1 << 30;
    c->max_result_bytes_tenant = 256u << 20;
    c->result_keep_s = 120;
    c->result_ttl_s = 3600;
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
    if (!strcmp(opt, "quiet")) {
        c->quiet = 1;
        *used = 0;
        return TWK_OK;
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
    struct { const char *name; size_t *dst; double lo, hi; } mbs[] = {
        {"max-body-mb", &c->max_body_bytes, 1, 4096},
        /* buffering limits */
        {"max-early-mb-run", &c->max_early_bytes_run, 0.01, 1 << 20},
        {"max-early-mb-tenant", &c->max_early_bytes_tenant, 0.01, 1 << 20},
        {"max-results-mb-tenant", &c->max_result_bytes_tenant, 0.01, 1 << 20},
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
    NUM("fwdbwd-chunk-len", 1, 1 << 20, fwdbwd_chunk_len, int)
    NUM("result-keep", 1, 86400, result_keep_s, double)
    NUM("result-ttl", 1, 30 * 86400, result_ttl_s, double)
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
        if (!eq && strcmp(p, "quiet")) {
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
    twk_model_config c = {.arch = TWK_ARCH_QWEN3, .vocab = 512, .hidden = 128, .layers = 2, .heads = 4, .kv_heads = 2,
                          .head_dim = 32, .ffn = 384, .rope_theta = 10000, .rms_eps = 1e-6, .tie_embeddings = 1,
                          .qk_norm = 1, .max_positions = 4096, .eos = {1}, .n_eos = 1};
    snprintf(c.arch_name, sizeof c.arch_name, "Qwen3ForCausalLM");
    twk_model *m = NULL;
    if (st == TWK_OK) st = twk_model_random(&c, dev, 20261129, &m);
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

static void on_signal(uv_signal_t *h, int signum) {
    svc *s = h->data;
    if (s->stopping) return;
    s->stopping = 1;
    if (!s->cfg.quiet) fprintf(stderr, "twinkle serve: signal %d, shutting down\n", signum);
    twk_http_server_stop(s->http);
    twk_futures_free(s->futures);
    s->futures = NULL;
    twk_worker_stop(s->worker);
    s->worker = NULL;
    uv_timer_stop(&s->gap_timer);
    uv_close((uv_handle_t *)&s->gap_timer, NULL);
    uv_signal_stop(&s->sigint);
    uv_signal_stop(&s->sigterm);
    uv_close((uv_handle_t *)&s->sigint, NULL);
    uv_close((uv_handle_t *)&s->sigterm, NULL);
}

static twk_status load_models(svc *s) {
    twk_serve_model_spec def;
    const twk_serve_model_spec *specs = s->cfg.models;
    int n = s->cfg.n_models;
    if (n == 0) {
        twk_status st = twk_serve_default_model(s->cfg.data_dir, def.dir, sizeof def.dir);
        if (st != TWK_OK) return st;
        snprintf(def.name, sizeof def.name, "%s", TWK_DEFAULT_MODEL_NAME);
        specs = &def;
        n = 1;
    }
    for (int i = 0; i < n; i++) {
        base_model *b = &s->models[s->n_models];
        snprintf(b->name, sizeof b->name, "%s", specs[i].name);
        char abs_dir[PATH_MAX]; /* absolute: get_info's tokenizer_id is this folder */
        snprintf(b->dir, sizeof b->dir, "%.1000s", realpath(specs[i].dir, abs_dir) ? abs_dir : specs[i].dir);
        twk_status st = twk_model_load(b->dir, s->dev, &b->m);
        if (st != TWK_OK) return twk_error(st, "model '%s': %s", b->name, twk_last_error());
        char tok[1100];
        snprintf(tok, sizeof tok, "%s/tokenizer.json", b->dir);
        struct stat sb;
        b->has_tokenizer = stat(tok, &sb) == 0;
        if (b->has_tokenizer && twk_tokenizer_load(tok, &b->tok) != TWK_OK) {
            fprintf(stderr, "twinkle serve: model '%s': %s (stop strings disabled)\n", b->name, twk_last_error());
            b->tok = NULL;
        }
        s->n_models++;
    }
    return TWK_OK;
}

int twk_serve_run(const twk_serve_config *cfg) {
    svc *s = calloc(1, sizeof *s);
    if (!s) return 1;
    s->cfg = *cfg;
    uv_loop_t loop;
    uv_loop_init(&loop);
    s->loop = &loop;
    int rc = 1;
    twk_status st = twk_store_open(cfg->data_dir, &s->store);
    if (st == TWK_OK) st = twk_auth_load(cfg->keys_file, &s->auth);
    if (st == TWK_OK) st = twk_device_open(cfg->device, &s->dev);
    if (st == TWK_OK) st = load_models(s);
    if (st == TWK_OK && !(s->stab = twk_stab_new(cfg->stability_ttl_s, STAB_MAX_RECORDS)))
        st = twk_error(TWK_ERR_OOM, "out of memory for the stability records");
    if (st != TWK_OK) {
        fprintf(stderr, "twinkle serve: %s\n", twk_last_error());
        goto out;
    }
    twk_futures_limits fl = {cfg->poll_timeout_s, cfg->result_keep_s, cfg->result_ttl_s, cfg->max_result_bytes_tenant};
    twk_log_quiet(cfg->quiet);
    svc_ckpt_recover(s);
    s->futures = twk_futures_new(&loop, &fl);
    s->worker = twk_worker_start(&loop);
    twk_http_limits lim = twk_http_limits_default();
    lim.max_body_bytes = cfg->max_body_bytes;
    int err = s->futures && s->worker
                  ? twk_http_server_start(&loop, cfg->host, cfg->port, &lim, svc_handle, s, &s->http)
                  : UV_ENOMEM;
    if (err) {
        fprintf(stderr, "twinkle serve: cannot listen on %s:%d: %s\n", cfg->host, cfg->port, uv_strerror(err));
        if (s->futures) twk_futures_free(s->futures);
        if (s->worker) twk_worker_stop(s->worker);
        uv_run(&loop, UV_RUN_DEFAULT);
        goto out;
    }
    uv_timer_init(&loop, &s->gap_timer);
    s->gap_timer.data = s;
    uv_timer_start(&s->gap_timer, on_gap_timer, 1000, 1000);
    uv_signal_init(&loop, &s->sigint);
    uv_signal_init(&loop, &s->sigterm);
    s->sigint.data = s->sigterm.data = s;
    uv_signal_start(&s->sigint, on_signal, SIGINT);
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    if (!cfg->quiet) {
        fprintf(stderr, "twinkle serve: listening on http://%s:%d  device %s  data %s  auth %s  models:", cfg->host,
                twk_http_server_port(s->http), twk_device_spec(s->dev), cfg->data_dir,
                twk_auth_open_mode(s->auth) ? "open (any tml- key)" : cfg->keys_file);
        for (int i = 0; i < s->n_models; i++) fprintf(stderr, " %s", s->models[i].name);
        fprintf(stderr, "\n");
    }
    printf("port %d\n", twk_http_server_port(s->http));
    fflush(stdout);
    uv_run(&loop, UV_RUN_DEFAULT);
    rc = 0;
out:
    svc_free_samplers(s);
    svc_free_runs(s);
    for (int i = 0; i < s->n_models; i++) {
        twk_model_free(s->models[i].m);
        twk_tokenizer_free(s->models[i].tok);
        twk_chat_template_free(s->models[i].chat);
    }
    twk_device_close(s->dev);
    twk_auth_free(s->auth);
    twk_store_close(s->store);
    twk_stab_free(s->stab);
    uv_loop_close(&loop);
    free(s);
    return rc;
}
