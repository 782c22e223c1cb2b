/* Bounded memory and live state across restarts: runs idle past --run-idle-s
 * (or the least recently used past --max-live-runs, or those of a finished
 * session, or all of them at shutdown) are spilled to DATA_DIR/spill/<run> —
 * the training state (adapter, AdamW moments and step), the accumulated
 * gradients and the seq position, published atomically like a checkpoint —
 * and read back on the run's next op; unnamed sampler snapshots are freed when
 * their session finishes, when idle past --sampler-idle-s, or past
 * --max-sampler-host-mb; the per-tenant queue bound. Design: README.md,
 * "Bounded memory" and "Restart". */
#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cJSON.h>

#include "svc.h"

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int svc_queue_full(svc *s, const char *tenant, char *err, size_t err_len) {
    int n = twk_worker_tenant_depth(s->worker, tenant);
    if (n < s->cfg.max_queue_tenant) return 0;
    snprintf(err, err_len,
             "tenant '%s' has %d requests waiting for the compute worker, the server's --max-queue-per-tenant "
             "limit; retry when some have finished (other tenants are served meanwhile)",
             tenant, n);
    return 1;
}

/* ---- paths ---- */

/* DATA_DIR/spill/<run> and its temporary and replaced siblings (names the start-up recovery
 * of ckpt_fs.c knows: .tmp-<name>-req-..., .old-<name>-req-...). A '/' in the id becomes '_'. */
static void spill_paths(const svc *s, const run_state *r, char *dir, char *tmp, char *old, size_t len) {
    char name[160];
    snprintf(name, sizeof name, "%s", r->id);
    for (char *p = name; *p; p++)
        if (*p == '/') *p = '_';
    snprintf(dir, len, "%s/spill/%s", s->cfg.data_dir, name);
    if (tmp) snprintf(tmp, len, "%s/spill/.tmp-%s-req-spill", s->cfg.data_dir, name);
    if (old) snprintf(old, len, "%s/spill/.old-%s-req-spill", s->cfg.data_dir, name);
}

/* ---- the spill itself (worker) ---- */

typedef struct spill_job {
    twk_job job;
    svc *s;
    run_state *r;
    int64_t next_seq;  /* the seq position after the ops queued before the spill */
    int result;        /* 1 spilled, 0 nothing resident, -1 failed (err) */
    char err[900];
} spill_job;

/* Writes the accumulated gradients of t to path as raw float32, tensor after tensor. */
static twk_status write_grads(twk_trainer *t, const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) return twk_error(TWK_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    int ok = 1;
    for (int i = 0; ok && i < twk_trainer_param_count(t); i++) {
        int64_t n = 0;
        const float *g = twk_trainer_grad_data(t, i, &n);
        ok = g && fwrite(g, sizeof *g, (size_t)n, f) == (size_t)n;
    }
    if (fclose(f) != 0) ok = 0;
    return ok ? TWK_OK : twk_error(TWK_ERR_IO, "cannot write %s", path);
}

static twk_status read_grads(twk_trainer *t, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return twk_error(TWK_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    int ok = 1;
    for (int i = 0; ok && i < twk_trainer_param_count(t); i++) {
        int64_t n = 0;
        float *g = twk_trainer_grad_data(t, i, &n);
        ok = g && fread(g, sizeof *g, (size_t)n, f) == (size_t)n;
    }
    ok = ok && fgetc(f) == EOF;
    fclose(f);
    return ok ? TWK_OK : twk_error(TWK_ERR_IO, "%s does not match the run's adapter", path);
}

static twk_status write_meta(const char *path, const run_state *r, int64_t next_seq, int64_t step) {
    FILE *f = fopen(path, "w");
    if (!f) return twk_error(TWK_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    int ok = fprintf(f, "{\"run_id\": \"%s\", \"next_seq\": %lld, \"step\": %lld}\n", r->id, (long long)next_seq,
                     (long long)step) > 0;
    if (fclose(f) != 0) ok = 0;
    return ok ? TWK_OK : twk_error(TWK_ERR_IO, "cannot write %s", path);
}

static void spill_job_run(twk_job *j) {
    spill_job *sj = j->arg;
    run_state *r = sj->r;
    svc *s = sj->s;
    if (!r->trainer) return; /* unloaded, lost, never created, or spilled already */
    char dir[1400], tmp[1400], old[1400], file[1500];
    spill_paths(s, r, dir, tmp, old, sizeof dir);
    snprintf(file, sizeof file, "%s/spill", s->cfg.data_dir);
    if (mkdir(file, 0755) != 0 && errno != EEXIST) {
        snprintf(sj->err, sizeof sj->err, "cannot create %.800s: %s", file, strerror(errno));
        sj->result = -1;
        return;
    }
    svc_rm_tree(tmp);
    twk_status st = twk_trainer_save_state(r->trainer, tmp, r->base->name);
    snprintf(file, sizeof file, "%s/grads.bin", tmp);
    if (st == TWK_OK) st = write_grads(r->trainer, file);
    snprintf(file, sizeof file, "%s/spill.json", tmp);
    if (st == TWK_OK) st = write_meta(file, r, sj->next_seq, twk_trainer_step(r->trainer));
    struct stat sb;
    if (st != TWK_OK) snprintf(sj->err, sizeof sj->err, "%s", twk_last_error());
    else if (svc_ckpt_publish_mode("spill", tmp, dir, old, stat(dir, &sb) == 0, sj->err, sizeof sj->err) != 0)
        st = TWK_ERR_IO;
    if (st != TWK_OK) {
        svc_rm_tree(tmp);
        sj->result = -1;
        return; /* the trainer stays in memory */
    }
    twk_trainer_free(r->trainer);
    r->trainer = NULL;
    r->on_disk = 1;
    malloc_trim(0); /* give the adapter's and the moments' pages back */
    sj->result = 1;
}

static void spill_job_done(twk_job *j) {
    spill_job *sj = j->arg;
    svc *s = sj->s;
    if (sj->result == 1) s->runs_spilled++;
    if (sj->result < 0) {
        twk_log_info("spilling model %s failed (it stays in memory): %s", sj->r->id, sj->err);
        if (!sj->r->resident) {
            sj->r->resident = 1;
            s->n_resident++;
        }
    }
    twk_host_free(sj);
}

void svc_spill_run(svc *s, run_state *r) {
    if (!r->resident || !s->worker) return;
    spill_job *sj = twk_host_calloc(sizeof *sj, "spill job");
    if (!sj) return; /* it stays resident; the next pass tries again */
    svc_ring_pack(r); /* its next op unpacks it */
    r->resident = 0;
    s->n_resident--;
    sj->s = s;
    sj->r = r;
    sj->next_seq = r->next_seq;
    twk_job_route(&sj->job, r->tenant, r->id, 1);
    sj->job.run = spill_job_run;
    sj->job.done = spill_job_done;
    sj->job.arg = sj;
    twk_worker_submit(s->worker, &sj->job);
}

twk_status svc_restore_run(svc *s, run_state *r) {
    char dir[1400], file[1500];
    spill_paths(s, r, dir, NULL, NULL, sizeof dir);
    twk_trainer *t = NULL;
    twk_trainer_opts to = {.recompute = r->base->recompute, .arena = r->base->arena}; /* runs take turns on the worker */
    twk_status st = twk_trainer_new_opts(r->base->m, &r->lora, s->cfg.max_context, &to, &t);
    if (st == TWK_OK) st = twk_trainer_load_state(t, dir, true);
    snprintf(file, sizeof file, "%s/grads.bin", dir);
    if (st == TWK_OK) st = read_grads(t, file);
    if (st != TWK_OK) {
        twk_trainer_free(t);
        return twk_error(st, "restoring model %s from %s failed: %s", r->id, dir, twk_last_error());
    }
    r->trainer = t;
    r->on_disk = 0; /* the folder stays: after a crash, the run continues from it */
    return TWK_OK;
}

void svc_spill_remove(svc *s, const run_state *r) {
    char dir[1400];
    spill_paths(s, r, dir, NULL, NULL, sizeof dir);
    svc_rm_tree(dir);
}

/* ---- residency (loop) ---- */

void svc_run_dispatched(svc *s, run_state *r) {
    r->inflight++;
    r->last_used = wall_now();
    if (r->resident) return;
    r->resident = 1;
    s->n_resident++;
    while (s->n_resident > s->cfg.max_live_runs) { /* the least recently used run with nothing in flight */
        run_state *victim = NULL;
        for (run_state *x = s->runs; x; x = x->next)
            if (x != r && x->resident && !x->inflight && (!victim || x->last_used < victim->last_used)) victim = x;
        if (!victim) break; /* every resident run is busy: over the cap until one finishes */
        svc_spill_run(s, victim);
    }
}

void svc_run_op_done(svc *s, run_state *r) {
    (void)s;
    r->inflight--;
    r->last_used = wall_now();
}

/* ---- after a restart ---- */

int svc_spill_adopt(svc *s, run_state *r, const twk_store_run *sr) {
    char dir[1400], file[1500];
    spill_paths(s, r, dir, NULL, NULL, sizeof dir);
    snprintf(file, sizeof file, "%s/spill.json", dir);
    FILE *f = fopen(file, "r");
    if (!f) return 0;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(j, "next_seq"), *step = cJSON_GetObjectItemCaseSensitive(j, "step");
    int ok = r->base && cJSON_IsNumber(seq) && cJSON_IsNumber(step) && seq->valuedouble >= 1;
    if (ok) {
        r->lost = 0;
        r->on_disk = 1;
        r->lora = svc_run_lora(sr);
        r->next_seq = (int64_t)seq->valuedouble;
        r->restored = 1;
        r->restored_step = (int64_t)step->valuedouble;
        r->last_used = wall_now();
    }
    cJSON_Delete(j);
    return ok;
}

/* ---- unnamed sampler snapshots ---- */

enum { GONE_FINISHED = 1, GONE_IDLE, GONE_HOST_CAP };

static uint64_t gone_key(const char *tenant, const char *id) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a over tenant, a NUL, id */
    for (const char *p = tenant; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h *= 1099511628211ull;
    for (const char *p = id; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return h ? h : 1;
}

const char *svc_sampler_gone(const svc *s, const char *tenant, const char *id) {
    uint64_t k = gone_key(tenant, id);
    for (int i = 0; i < TWK_SERVE_GONE_RING; i++)
        if (s->gone_hash[i] == k) switch (s->gone_why[i]) {
            case GONE_FINISHED: return "its training session finished";
            case GONE_IDLE: return "no request used it for --sampler-idle-s";
            default: return "unnamed snapshots passed --max-sampler-host-mb";
            }
    return NULL;
}

typedef struct free_job {
    twk_job job;
    svc *s;
    sampler_session *ss;
} free_job;

static void free_job_run(twk_job *j) {
    free_job *fj = j->arg;
    svc_snapshot_drop_worker(fj->s, fj->ss);
    malloc_trim(0);
}

static void free_job_done(twk_job *j) {
    free_job *fj = j->arg;
    svc_sampler_free(fj->ss);
    fj->s->snapshots_freed++;
    twk_host_free(fj);
}

/* Frees an unnamed snapshot now (nothing in flight) or once its last request ends. */
static void snapshot_free(svc *s, sampler_session *ss, int why) {
    if (s->stopping) return; /* shutdown frees every session; the worker takes no more jobs */
    if (ss->inflight) {
        ss->doomed = why;
        return;
    }
    free_job *fj = twk_host_calloc(sizeof *fj, "snapshot free job");
    if (!fj || !s->worker) {
        twk_host_free(fj);
        return; /* kept; a later pass tries again */
    }
    s->gone_hash[s->gone_next] = gone_key(ss->tenant, ss->id);
    s->gone_why[s->gone_next] = (unsigned char)why;
    s->gone_next = (s->gone_next + 1) % TWK_SERVE_GONE_RING;
    svc_sampler_unlink(s, ss);
    fj->s = s;
    fj->ss = ss;
    twk_job_route(&fj->job, ss->tenant, ss->id, 1);
    fj->job.run = free_job_run;
    fj->job.done = free_job_done;
    fj->job.arg = fj;
    twk_worker_submit(s->worker, &fj->job);
}

void svc_snapshot_use(svc *s, sampler_session *ss) {
    (void)s;
    ss->inflight++;
    ss->last_used = wall_now();
}

void svc_snapshot_release(svc *s, sampler_session *ss) {
    if (s->stopping) return; /* shutdown frees every session */
    ss->inflight--;
    ss->last_used = wall_now();
    if (ss->snapshot && ss->doomed && !ss->inflight) snapshot_free(s, ss, ss->doomed);
}

/* Frees the least recently used unnamed snapshots until their host copies fit --max-sampler-host-mb. */
static void snapshot_cap(svc *s) {
    for (;;) {
        size_t total = 0;
        sampler_session *lru = NULL;
        for (sampler_session *ss = s->samplers; ss; ss = ss->next) {
            if (!ss->snapshot || ss->doomed) continue;
            total += ss->host_bytes;
            if (!ss->inflight && ss->host_bytes && (!lru || ss->last_used < lru->last_used)) lru = ss;
        }
        if (total <= s->cfg.max_sampler_host_bytes || !lru) return;
        snapshot_free(s, lru, GONE_HOST_CAP);
    }
}

void svc_session_finished(svc *s, const char *tenant, const char *session_id) {
    char prefix[200];
    int pl = snprintf(prefix, sizeof prefix, "%s:sample:", session_id);
    for (sampler_session *ss = s->samplers, *next; ss; ss = next) {
        next = ss->next;
        if (ss->snapshot && !strcmp(ss->tenant, tenant) && !strncmp(ss->id, prefix, (size_t)pl))
            snapshot_free(s, ss, GONE_FINISHED);
    }
    for (run_state *r = s->runs; r; r = r->next)
        if (r->resident && !strcmp(r->tenant, tenant) && !strcmp(r->session_id, session_id)) svc_spill_run(s, r);
}

/* ---- the timer ---- */

static void on_spill_timer(uv_timer_t *t) {
    svc *s = t->data;
    double now = wall_now();
    for (run_state *r = s->runs; r; r = r->next)
        if (r->resident && !r->inflight && !r->pending && now - r->last_used >= s->cfg.run_idle_s) svc_spill_run(s, r);
    for (sampler_session *ss = s->samplers, *next; ss; ss = next) {
        next = ss->next;
        if (ss->snapshot && !ss->doomed && !ss->inflight && now - ss->last_used >= s->cfg.sampler_idle_s)
            snapshot_free(s, ss, GONE_IDLE);
    }
    snapshot_cap(s);
}

void svc_spill_start(svc *s) {
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/spill", s->cfg.data_dir);
    svc_ckpt_recover_folder(s, dir);
    double period = s->cfg.run_idle_s < s->cfg.sampler_idle_s ? s->cfg.run_idle_s : s->cfg.sampler_idle_s;
    period /= 4;
    if (period < 0.05) period = 0.05;
    if (period > 5) period = 5;
    uv_timer_init(s->loop, &s->spill_timer);
    s->spill_timer.data = s;
    uv_timer_start(&s->spill_timer, on_spill_timer, (uint64_t)(period * 1000), (uint64_t)(period * 1000));
}

void svc_spill_stop(svc *s) {
    int n = 0;
    for (run_state *r = s->runs; r; r = r->next)
        if (r->resident) {
            svc_spill_run(s, r);
            n++;
        }
    if (n) twk_log_info("shutdown: spilling %d run(s) to %s/spill", n, s->cfg.data_dir);
    uv_timer_stop(&s->spill_timer);
    uv_close((uv_handle_t *)&s->spill_timer, NULL);
}

/* A snapshot's host bytes, once its save op has captured it (runs.c's op_done). */
void svc_snapshot_captured(svc *s, sampler_session *ss, size_t bytes) {
    ss->host_bytes = bytes;
    ss->last_used = wall_now();
    snapshot_cap(s);
}
