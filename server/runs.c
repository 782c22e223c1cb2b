/* Training runs: creation, the per-run queue executed strictly in seq_id
 * order (out-of-order arrivals buffered, resubmits deduplicated, gaps failed
 * after a timeout), and each op's work on the compute worker. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>

#include "api_util.h"
#include "metrics.h"
#include "svc.h"
#include "dist_serve.h" /* the multi-rank service */

static double wall_now(void) { return (double)time(NULL); }

void svc_new_id(svc *s, const char *prefix, char *out, size_t len) {
    s->id_counter++;
    char hex[40];
    if (twk_random_hex(hex, 8) == 0) {
        snprintf(out, len, "%s-%s", prefix, hex);
        return;
    }
    unsigned long long r = uv_hrtime() * 0x9e3779b97f4a7c15ull ^ (s->id_counter * 0xbf58476d1ce4e5b9ull);
    snprintf(out, len, "%s-%08llx%04llx", prefix, (r >> 24) & 0xffffffffull, s->id_counter & 0xffff);
}

const char *svc_save_kind(op_kind k) {
    return k == OP_SAVE ? "weights" : k == OP_SAVE_EXTERNAL ? "external_weights" : "sampler_weights";
}

const char *svc_op_route(op_kind k) {
    switch (k) {
    case OP_CREATE: return "create_model";
    case OP_FB: return "forward_backward";
    case OP_OPTIM: return "optim_step";
    case OP_SAVE:
    case OP_SAVE_SAMPLER:
    case OP_SAVE_EXTERNAL: return svc_save_type(k);
    case OP_LOAD: return "load_weights";
    case OP_UNLOAD: return "unload_model";
    case OP_SKIP: break;
    }
    return "skip";
}

const char *svc_save_type(op_kind k) {
    return k == OP_SAVE ? "save_weights" : k == OP_SAVE_EXTERNAL ? "save_weights_external" : "save_weights_for_sampler";
}

/* ---- ops ---- */

op *svc_op_new(svc *s, run_state *r, op_kind kind, int64_t seq) {
    op *o = twk_host_calloc(sizeof *o, "runs o");
    if (!o) return NULL;
    o->kind = kind;
    o->seq = seq;
    o->run = r;
    o->svc = s;
    return o;
}

void svc_op_free(op *o) {
    if (!o) return;
    if (o->snapshot) svc_snapshot_release(o->svc, o->snapshot); /* the save that fills it is over */
    twk_wire_fb_request_free(o->fb);
    twk_host_free(o->out);
    twk_host_free(o);
}

void svc_op_fail(op *o, int user, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->err, sizeof o->err, fmt, ap);
    va_end(ap);
    o->user_error = user;
    o->st = TWK_ERR_INVALID_ARG;
}

/* ---- work on the compute worker ---- */

static void set_json(op *o, cJSON *j) {
    char *txt = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    size_t n = txt ? strlen(txt) : 0;
    o->out = txt && !api_json_oom() ? twk_host_pool_alloc(TWK_HPOOL_REQUESTS, n + 1, "result") : NULL;
    if (!o->out) { /* a part of the tree, its text or the copy is missing */
        cJSON_free(txt);
        o->st = twk_error(TWK_ERR_OOM, "out of memory writing the result");
        snprintf(o->err, sizeof o->err, "%s", twk_last_error());
        o->user_error = 0;
        return;
    }
    memcpy(o->out, txt, n + 1);
    o->out_len = n;
    cJSON_free(txt);
}

static void run_create(op *o) {
    run_state *r = o->run;
    twk_status st = svc_dist_trainer_new(o->svc, r); /* multi-rank: on every rank */
    if (st != TWK_OK) {
        svc_op_fail(o, 0, "creating the model failed: %s", twk_last_error());
        return;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model_id", r->id);
    cJSON_AddStringToObject(j, "type", "create_model");
    set_json(o, j);
}

static void run_optim(op *o) {
    float norm = 0;
    twk_status st = svc_dist_optim_step(o->run, &o->adam, &norm); /* multi-rank: gradients summed, then every rank */
    if (st != TWK_OK) {
        svc_op_fail(o, st == TWK_ERR_INVALID_ARG || st == TWK_ERR_RANGE, "%s", twk_last_error());
        return;
    }
    o->grad_norm = norm; /* the per-step log (steps.c) */
    o->trainer_step = twk_trainer_step(o->run->trainer);
    cJSON *j = cJSON_CreateObject();
    cJSON *m = cJSON_AddObjectToObject(j, "metrics");
    cJSON_AddNumberToObject(m, "grad_norm:mean", isfinite(norm) ? norm : 0);
    cJSON_AddNumberToObject(m, "learning_rate:mean", o->adam.learning_rate);
    cJSON_AddNumberToObject(m, "step:max", (double)twk_trainer_step(o->run->trainer));
    set_json(o, j);
}

static int64_t dir_size(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int64_t total = 0;
    struct dirent *e;
    char p[2048];
    while ((e = readdir(d))) {
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (e->d_name[0] != '.' && stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) total += sb.st_size;
    }
    closedir(d);
    return total;
}

void svc_rm_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[2048];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            struct stat sb;
            if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) svc_rm_tree(p);
            else unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

static int mkdirs(const char *path) {
    char tmp[1400];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(tmp, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* Writes into a temporary sibling folder, then publishes it (svc_ckpt_publish):
 * a crash leaves either the old checkpoint or the new one, complete. */
static void run_save(op *o) {
    if (o->snapshot) { /* unnamed save_weights_for_sampler: snapshot the adapter into a sampler, no disk write */
        twk_status cap = svc_snapshot_capture(o->snapshot, o->run->trainer);
        if (cap == TWK_ERR_STATE) cap = svc_sampler_ready(o->svc, o->snapshot->unit, o->run->trainer);
        if (cap != TWK_OK) {
            svc_op_fail(o, 0, "creating the sampler failed: %s", twk_last_error());
            return;
        }
        for (int i = 0; i < twk_trainer_param_count(o->run->trainer); i++) { /* its host copy's size */
            int64_t ne = 0;
            twk_trainer_param_name(o->run->trainer, i, &ne);
            o->size_bytes += ne * (int64_t)sizeof(float);
        }
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "sampling_session_id", o->snapshot->id);
        cJSON_AddStringToObject(j, "type", "save_weights_for_sampler");
        set_json(o, j);
        return;
    }
    char parent[1300], tmp[1600], old[1600];
    snprintf(parent, sizeof parent, "%s", o->dir);
    char *slash = strrchr(parent, '/');
    if (slash) *slash = 0;
    if (mkdirs(parent) != 0) {
        svc_op_fail(o, 0, "cannot create %s: %s", parent, strerror(errno));
        return;
    }
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s-%s", parent, o->name, o->request_id);
    snprintf(old, sizeof old, "%s/.old-%s-%s", parent, o->name, o->request_id);
    svc_rm_tree(tmp);
    twk_status st = o->kind == OP_SAVE ? twk_trainer_save_state(o->run->trainer, tmp, o->run->base->name)
                                       : twk_adapter_save(o->run->trainer, tmp, o->run->base->name);
    if (st != TWK_OK) {
        svc_op_fail(o, 0, "saving failed: %s", twk_last_error());
        svc_rm_tree(tmp);
        return;
    }
    struct stat sb;
    int existed = stat(o->dir, &sb) == 0;
    if (existed && !o->overwrite) {
        svc_rm_tree(tmp);
        svc_op_fail(o, 1, "checkpoint '%s' exists (pass overwrite=True to replace it)", o->name);
        return;
    }
    if (svc_ckpt_publish(tmp, o->dir, old, existed, o->err, sizeof o->err) != 0) {
        svc_op_fail(o, 0, "%.700s", o->err);
        svc_rm_tree(tmp);
        return;
    }
    o->size_bytes = dir_size(o->dir);
    cJSON *j = cJSON_CreateObject();
    char path[700];
    snprintf(path, sizeof path, "tinker://%s/%s/%s", o->run->id, svc_save_kind(o->kind), o->name);
    cJSON_AddStringToObject(j, "path", path);
    if (o->kind == OP_SAVE_EXTERNAL) cJSON_AddNumberToObject(j, "size_bytes", (double)o->size_bytes);
    cJSON_AddStringToObject(j, "type", svc_save_type(o->kind));
    set_json(o, j);
}

static void run_load(op *o) {
    twk_status st = svc_dist_load_state(o->run, o->dir, o->load_optimizer); /* multi-rank: every rank */
    if (st != TWK_OK) {
        svc_op_fail(o, st == TWK_ERR_INVALID_ARG || st == TWK_ERR_SHAPE, "loading failed: %s", twk_last_error());
        return;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model_id", o->run->id);
    cJSON_AddStringToObject(j, "type", "load_weights");
    set_json(o, j);
}

static void run_unload(op *o) {
    svc_dist_trainer_free(o->run); /* multi-rank: every rank */
    o->run->on_disk = 0;
    svc_spill_remove(o->svc, o->run);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model_id", o->run->id);
    cJSON_AddStringToObject(j, "type", "unload_model");
    set_json(o, j);
}

/* TWK_FAULT (svc_fault): sleeps before the op, or fails it with a server error (1: failed). */
static int svc_fault_point(op *o) {
    const char *route = o->kind == OP_FB && o->fb && o->fb->forward_only ? "forward" : svc_op_route(o->kind);
    double secs = 0;
    if (svc_fault("sleep", route, &secs)) usleep((useconds_t)(secs * 1e6));
    if (!svc_fault("fail", route, NULL)) return 0;
    svc_op_fail(o, 0, "injected fault (TWK_FAULT=fail:%s)", route);
    return 1;
}

int svc_op_start(op *o) {
    o->t_started = twk_metrics_now();
    o->st = TWK_OK;
    twk_clear_error();
    api_json_oom();
    if (svc_fault_point(o)) return 0;
    if (o->kind != OP_CREATE && o->kind != OP_UNLOAD && !o->run->trainer && o->run->on_disk &&
        svc_restore_run(o->svc, o->run) != TWK_OK) {
        svc_op_fail(o, 0, "%s", twk_last_error());
        return 0;
    }
    if (o->kind == OP_UNLOAD && !o->run->trainer && o->run->on_disk) { /* spilled: its folder goes */
        run_unload(o);
        return 0;
    }
    if (o->kind != OP_CREATE && !o->run->trainer) {
        svc_op_fail(o, 1, "model %s is not loaded (unloaded, or its state was lost in a server restart: create a "
                          "training client from a saved checkpoint)",
                    o->run->id);
        return 0;
    }
    return 1;
}

static void op_run(twk_job *j) {
    op *o = j->arg;
    if (!svc_op_start(o)) return;
    switch (o->kind) {
    case OP_CREATE: run_create(o); break;
    case OP_FB: svc_run_fb(&o, 1); break;
    case OP_OPTIM: run_optim(o); break;
    case OP_SAVE:
    case OP_SAVE_SAMPLER:
    case OP_SAVE_EXTERNAL: run_save(o); break;
    case OP_LOAD: run_load(o); break;
    case OP_UNLOAD: run_unload(o); break;
    case OP_SKIP: break;
    }
}

/* ---- completion on the loop thread ---- */

static void record_checkpoint(op *o) {
    twk_store_ckpt c;
    memset(&c, 0, sizeof c);
    snprintf(c.run_id, sizeof c.run_id, "%s", o->run->id);
    snprintf(c.checkpoint_id, sizeof c.checkpoint_id, "%s/%s", svc_save_kind(o->kind), o->name);
    snprintf(c.tenant, sizeof c.tenant, "%s", o->run->tenant);
    snprintf(c.path, sizeof c.path, "%s", o->dir);
    c.size_bytes = o->size_bytes;
    c.created = wall_now();
    c.expires_at = o->ttl_seconds > 0 ? c.created + o->ttl_seconds : 0;
    snprintf(c.user_metadata_json, sizeof c.user_metadata_json, "%s", o->user_metadata_json[0] ? o->user_metadata_json : "{}");
    if (twk_store_ckpt_upsert(o->svc->store, &c) != TWK_OK) {
        snprintf(o->err, sizeof o->err, "recording the checkpoint failed: %s", twk_last_error());
        o->st = TWK_ERR_IO;
    }
}

static void op_done(twk_job *j) {
    op *o = j->arg;
    svc *s = o->svc;
    svc_metrics_op_done(s, o);
    if (o->st == TWK_OK && (o->kind == OP_SAVE || o->kind == OP_SAVE_SAMPLER || o->kind == OP_SAVE_EXTERNAL) &&
        !o->snapshot) {
        record_checkpoint(o);
        svc_crash_point(o->overwrite ? "overwrite" : "save", "recorded");
    }
    if (o->st == TWK_OK && o->kind == OP_CREATE) {
        twk_store_run_touch(s->store, o->run->id, wall_now());
    }
    if (o->kind == OP_UNLOAD && o->st == TWK_OK) o->run->unloaded = 1;
    o->run->running--;
    svc_steps_note(s, o);
    svc_run_op_done(s, o->run);
    if (o->kind == OP_UNLOAD && o->st == TWK_OK && o->run->resident) {
        o->run->resident = 0;
        s->n_resident--;
    }
    if (o->snapshot && o->st == TWK_OK) svc_snapshot_captured(s, o->snapshot, (size_t)o->size_bytes);
    if (o->kind == OP_FB && o->fb) { /* the trace's tokens: the op's input tokens */
        int64_t tokens = 0;
        for (int d = 0; d < o->fb->n_data; d++) tokens += o->fb->data[d].n_tokens;
        twk_futures_set_tokens(s->futures, o->request_id, tokens);
    }
    if (o->st != TWK_OK)
        twk_futures_fail(s->futures, o->request_id, o->user_error && o->st != TWK_ERR_OOM ? "user" : "server", o->err);
    else
        twk_futures_complete(s->futures, o->request_id, o->out_proto ? "application/x-protobuf" : "application/json",
                             o->out, o->out_len);
    /* last_request_time is informational: update it at most every 10 s, so a
     * busy run does not put an fsync on the loop thread after every op */
    double now = wall_now();
    if (o->kind != OP_CREATE && now - o->run->last_touch >= 10) {
        twk_store_run_touch(s->store, o->run->id, now);
        o->run->last_touch = now;
    }
    svc_op_free(o);
}

/* The scheduler's estimate of an op's work: tokens x passes for forward (1) and
 * forward_backward (3: forward, backward through activations and weights); 1 for the rest. */
static double op_cost(const op *o) {
    if (o->kind != OP_FB || !o->fb) return 1;
    double tokens = 0;
    for (int d = 0; d < o->fb->n_data; d++) tokens += (double)o->fb->data[d].n_tokens;
    return tokens * (o->fb->forward_only ? 1 : 3);
}

static void dispatch(svc *s, op *o) {
    if (o->kind == OP_SKIP) {
        svc_op_free(o);
        return;
    }
    if (o->prefail[0]) {
        twk_futures_fail(s->futures, o->request_id, o->prefail_server ? "server" : "user", o->prefail);
        if (o->prefail_server)
            twk_alerts_raise(s->alerts, TWK_ALERT_OP_FAILED, o->run->tenant, o->run->id, o->request_id,
                             "an operation of run %s failed with a server error (request %s): %s", o->run->id,
                             o->request_id, o->prefail);
        svc_op_free(o);
        return;
    }
    if (o->run->diverged) { /* ops after its spill were lost in a restart */
        twk_futures_fail(s->futures, o->request_id, "user", o->run->lost_msg);
        svc_op_free(o);
        return;
    }
    o->job.run = op_run;
    o->job.done = op_done;
    o->job.arg = o;
    svc_metrics_op_queued(s, o);
    o->run->running++;
    twk_job_route(&o->job, o->run->tenant, o->run->id, op_cost(o));
    svc_run_dispatched(s, o->run);
    o->job.owner = o->run; /* every op of the run: none of its later ops may be packed ahead of it */
    if (o->kind == OP_FB) { /* packed training: ready forward / forward_backward heads of one base model run together */
        o->job.batch_key = o->run->base;
        o->job.run_batch = svc_run_fb_jobs;
    }
    o->job.pack_gate = o->kind == OP_OPTIM;
    twk_worker_submit(s->worker, &o->job);
}

int svc_create_run(svc *s, const char *tenant, const char *session_id, int model_seq_id, const char *base,
                   const twk_lora_config *lora, const char *user_metadata_json, char *request_id, char *model_id,
                   char *err, size_t err_len) {
    base_model *bm = svc_find_model(s, base);
    if (!bm) {
        snprintf(err, err_len, "base_model '%s' is not served here (see get_server_capabilities)", base ? base : "");
        return 400;
    }
    snprintf(model_id, 128, "%s:train:%d", session_id, model_seq_id);
    for (run_state *r = s->runs; r; r = r->next)
        if (!strcmp(r->id, model_id)) {
            if (strcmp(r->tenant, tenant)) {
                snprintf(err, err_len, "session '%s' not found", session_id);
                return 404;
            }
            snprintf(request_id, 64, "%s", r->create_request); /* a retried create_model */
            return 0;
        }
    run_state *r = svc_run_new(s, model_id, tenant);
    if (!r) {
        snprintf(err, err_len, "out of memory");
        return 503;
    }
    r->base = bm;
    r->lora = *lora;
    snprintf(r->session_id, sizeof r->session_id, "%s", session_id);
    twk_store_run sr;
    memset(&sr, 0, sizeof sr);
    snprintf(sr.id, sizeof sr.id, "%s", model_id);
    snprintf(sr.tenant, sizeof sr.tenant, "%s", tenant);
    snprintf(sr.session_id, sizeof sr.session_id, "%s", session_id);
    snprintf(sr.base_model, sizeof sr.base_model, "%s", bm->name);
    sr.is_lora = 1;
    sr.lora_rank = lora->rank;
    sr.train_attn = lora->train_attn;
    sr.train_mlp = lora->train_mlp;
    sr.train_unembed = lora->train_unembed;
    sr.seed = (int64_t)lora->seed;
    sr.user_metadata_json = (char *)(user_metadata_json ? user_metadata_json : "{}");
    sr.created = sr.last_request = wall_now();
    if (twk_store_run_create(s->store, &sr) != TWK_OK) {
        snprintf(err, err_len, "recording the run failed: %s", twk_last_error());
        return 500;
    }
    if (twk_futures_create(s->futures, tenant, session_id, model_id, request_id)) {
        snprintf(err, err_len, "out of memory creating the request's future");
        return 503;
    }
    snprintf(r->create_request, sizeof r->create_request, "%s", request_id);
    op *o = svc_op_new(s, r, OP_CREATE, 0);
    if (!o) {
        twk_futures_fail(s->futures, request_id, "server", "out of memory");
        return 0;
    }
    snprintf(o->request_id, sizeof o->request_id, "%s", request_id);
    dispatch(s, o);
    return 0;
}

int svc_dispatch_now(svc *s, run_state *r, op *o, char *request_id) {
    if (twk_futures_create(s->futures, r->tenant, r->session_id, r->id, request_id)) {
        svc_op_free(o);
        return 503;
    }
    snprintf(o->request_id, sizeof o->request_id, "%s", request_id);
    dispatch(s, o);
    return 0;
}

static size_t op_held_bytes(const op *o) { return sizeof *o + o->body_bytes; }

/* Bytes held ahead of the seq order by all runs of a tenant. */
static size_t tenant_early_bytes(const svc *s, const char *tenant) {
    size_t n = 0;
    for (const run_state *r = s->runs; r; r = r->next)
        if (!strcmp(r->tenant, tenant)) n += r->early_bytes;
    return n;
}

/* Takes the head of r->pending off the queue. */
static void pending_insert(svc *s, run_state *r, op *o);

static op *pending_pop(run_state *r) {
    op *h = r->pending;
    r->pending = h->next;
    r->early_bytes -= op_held_bytes(h);
    return h;
}

int svc_submit_op(svc *s, run_state *r, op *o, char *request_id, char *err, size_t err_len) {
    /* a resubmitted (model_id, seq_id) gets its original future */
    if (svc_ring_get(r, o->seq, request_id)) {
        svc_op_free(o);
        return 0;
    }
    if (o->seq < r->next_seq) {
        /* older than anything remembered: answer with a failed future */
        svc_op_free(o);
        if (twk_futures_create(s->futures, r->tenant, r->session_id, r->id, request_id)) {
            snprintf(err, err_len, "out of memory creating the request's future");
            return 503;
        }
        twk_futures_fail(s->futures, request_id, "user", "seq_id is older than the run's current position");
        return 0;
    }
    if (svc_queue_full(s, r->tenant, err, err_len)) { /* nothing queued: the client (the SDK backs off on 429) resends */
        svc_op_free(o);
        return 429;
    }
    size_t held = op_held_bytes(o);
    if (o->seq > r->next_seq) { /* it would wait for seq_id next_seq: bounded */
        const char *which = NULL;
        size_t limit = 0;
        if (r->early_bytes + held > s->cfg.max_early_bytes_run)
            which = "--max-early-mb-run", limit = s->cfg.max_early_bytes_run;
        else if (tenant_early_bytes(s, r->tenant) + held > s->cfg.max_early_bytes_tenant)
            which = "--max-early-mb-tenant", limit = s->cfg.max_early_bytes_tenant;
        if (which) {
            snprintf(err, err_len,
                     "seq_id %lld of model %s is ahead of seq_id %lld, and holding it (%zu bytes) would pass the "
                     "server's %s limit of %.0f MiB buffered ahead of the seq order; send the missing seq_ids first "
                     "or retry later",
                     (long long)o->seq, r->id, (long long)r->next_seq, held, which, (double)limit / 1048576.0);
            svc_op_free(o);
            return 429;
        }
    }
    if (twk_futures_create(s->futures, r->tenant, r->session_id, r->id, request_id)) { /* nothing queued: the client may resend */
        snprintf(err, err_len, "out of memory creating the request's future");
        svc_op_free(o);
        return 503;
    }
    snprintf(o->request_id, sizeof o->request_id, "%s", request_id);
    (void)svc_ring_put(r, o->seq, request_id); /* out of memory: a resubmit of this seq_id is not recognised */
    pending_insert(s, r, o);
    return 0;
}

void svc_skip_seq(svc *s, run_state *r, int64_t seq) {
    if (seq < r->next_seq || svc_ring_get(r, seq, NULL)) return;
    for (const op *p = r->pending; p; p = p->next)
        if (p->seq == seq) return;
    op *o = svc_op_new(s, r, OP_SKIP, seq);
    if (!o) return;
    pending_insert(s, r, o);
}

/* Puts o into r's pending list by seq and dispatches what is now in order. */
static void pending_insert(svc *s, run_state *r, op *o) {
    size_t held = op_held_bytes(o);
    op **pp = &r->pending;
    while (*pp && (*pp)->seq < o->seq) pp = &(*pp)->next;
    o->next = *pp;
    *pp = o;
    r->early_bytes += held;
    while (r->pending && r->pending->seq == r->next_seq) {
        op *h = pending_pop(r);
        r->restored = 0; /* it continues in order from its spilled state: nothing was lost */
        r->next_seq++;
        dispatch(s, h);
    }
    r->gap_since = r->pending ? (r->gap_since > 0 ? r->gap_since : (double)uv_now(s->loop) / 1000.0) : 0;
}

int svc_op_cancel(svc *s, const char *tenant, const char *request_id) {
    for (run_state *r = s->runs; r; r = r->next) {
        if (strcmp(r->tenant, tenant)) continue;
        for (op *o = r->pending; o; o = o->next)
            if (o->kind != OP_SKIP && !strcmp(o->request_id, request_id)) {
                /* keeps its slot (the seq order stays whole) but runs nothing */
                snprintf(o->prefail, sizeof o->prefail, "cancelled by the client (cancel_future)");
                return 1;
            }
    }
    return 0;
}

void svc_check_gaps(svc *s) {
    double now = (double)uv_now(s->loop) / 1000.0;
    for (run_state *r = s->runs; r; r = r->next) {
        if (!r->pending || now - r->gap_since < s->cfg.seq_timeout_s) continue;
        long long missing = (long long)r->next_seq;
        if (r->restored) { /* after a restart: the ops after its last spill are lost, and so is the rest */
            r->diverged = 1;
            snprintf(r->lost_msg, sizeof r->lost_msg,
                     "model %s was restored after a server restart from its state at optimizer step %lld (the "
                     "state after seq_id %lld); the operations from seq_id %lld on were lost with the restart, so "
                     "this run cannot continue: load a saved checkpoint (create_training_client_from_state)",
                     r->id, (long long)r->restored_step, missing - 1, missing);
        }
        while (r->pending) {
            op *h = pending_pop(r);
            char msg[sizeof r->lost_msg];
            if (r->diverged) snprintf(msg, sizeof msg, "%s", r->lost_msg);
            else
                snprintf(msg, sizeof msg,
                         "seq_id %lld of model %s never arrived within %.0f s; failing the operations queued after it",
                         missing, r->id, s->cfg.seq_timeout_s);
            if (h->kind != OP_SKIP) twk_futures_fail(s->futures, h->request_id, "user", msg);
            if (h->seq >= r->next_seq) r->next_seq = h->seq + 1;
            svc_op_free(h);
        }
        r->gap_since = 0;
    }
}

void svc_free_runs(svc *s) {
    run_state *r = s->runs;
    while (r) {
        run_state *next = r->next;
        while (r->pending) svc_op_free(pending_pop(r));
        twk_trainer_free(r->trainer);
        svc_ring_free(r);
        twk_host_free(r);
        r = next;
    }
    s->runs = NULL;
}
