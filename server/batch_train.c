/* forward / forward_backward on the worker, packed: the ops of several runs on
 * one base model — each the head of its own run's seq_id order, taken
 * together by the worker (worker.c, take_company) — are decoded into loss
 * batches and run by twk_loss_steps (train/) through the base model's pack,
 * so their passes share one base GEMM over all their tokens, each run through
 * its own adapter with its own loss. A lone op is a pack of one, so a run's
 * numbers do not depend on whether company came (within float rounding of
 * the base GEMM: train/README.md). Each op then gets its encoded result or
 * its error; op_done (runs.c) settles its future on the loop thread.
 *
 * This file is the whole server side of packed training; the scheduler calls
 * svc_run_fb_jobs (worker.c) for a job and its company. */
#include <stdio.h>
#include <string.h>

#include "api_util.h"
#include "dist_serve.h"
#include "svc.h"

/* The request as a loss batch: datums as sequences, targets as int32, each
 * input the loss reads dense over all tokens (the registry's `absent` value
 * where a datum lacks it; NULL where every datum does). Arrays are owned by
 * the batch; fb_batch_free releases them. 0 on OOM. */
typedef struct fb_batch {
    twk_loss_batch b;
    int64_t *offsets;
    int32_t *tokens, *targets;
    float *in[TWK_IN_COUNT];
} fb_batch;

static void fb_batch_free(fb_batch *fb) {
    twk_host_free(fb->offsets);
    twk_host_free(fb->tokens);
    twk_host_free(fb->targets);
    for (int i = 0; i < TWK_IN_COUNT; i++) twk_host_free(fb->in[i]);
}

/* One float input of the loss over all datums; NULL (and *oom 0) when no datum gives it. */
static float *fb_gather_input(const twk_wire_fb_request *q, const twk_loss_input_def *def, const int64_t *offsets,
                              int K, int *oom) {
    const char *key = twk_loss_input_key(def->id);
    int any = 0;
    for (int d = 0; d < q->n_data && !any; d++) any = twk_wire_datum_input(&q->data[d], key) != NULL;
    if (!any) return NULL;
    int64_t per = def->shape == TWK_SHAPE_TOKENS ? 1 : K > 0 ? K : 1, n = offsets[q->n_data] * per;
    float *v = twk_host_alloc((size_t)(n ? n : 1) * sizeof(float), key);
    if (!v) {
        *oom = 1;
        return NULL;
    }
    for (int d = 0; d < q->n_data; d++) {
        const twk_wire_tensor *x = twk_wire_datum_input(&q->data[d], key);
        int64_t m = q->data[d].n_tokens * per;
        for (int64_t i = 0; i < m; i++) v[offsets[d] * per + i] = x ? ((const float *)x->data)[i] : def->absent;
    }
    return v;
}

static int fb_gather(const twk_wire_fb_request *q, const twk_loss_def *loss, fb_batch *fb) {
    memset(fb, 0, sizeof *fb);
    const twk_wire_tensor *t0 = twk_wire_datum_input(&q->data[0], "target_tokens");
    int K = t0 && t0->ndim == 2 ? (int)t0->shape[1] : 0;
    fb->offsets = twk_host_alloc((size_t)(q->n_data + 1) * sizeof(int64_t), "offsets");
    if (!fb->offsets) return 0;
    fb->offsets[0] = 0;
    for (int d = 0; d < q->n_data; d++) fb->offsets[d + 1] = fb->offsets[d] + q->data[d].n_tokens;
    int64_t total = fb->offsets[q->n_data], nk = total * (K > 0 ? K : 1);
    fb->tokens = twk_host_alloc((size_t)(total ? total : 1) * sizeof(int32_t), "tokens");
    fb->targets = twk_host_alloc((size_t)(nk ? nk : 1) * sizeof(int32_t), "targets");
    if (!fb->tokens || !fb->targets) return 0;
    for (int d = 0; d < q->n_data; d++) {
        const twk_wire_tensor *tt = twk_wire_datum_input(&q->data[d], "target_tokens");
        int64_t per = K > 0 ? K : 1;
        memcpy(fb->tokens + fb->offsets[d], q->data[d].tokens, (size_t)q->data[d].n_tokens * sizeof(int32_t));
        for (int64_t i = 0; i < q->data[d].n_tokens * per; i++)
            fb->targets[fb->offsets[d] * per + i] = (int32_t)((const int64_t *)tt->data)[i];
    }
    int oom = 0;
    for (int i = 0; i < loss->n_inputs; i++)
        if (loss->inputs[i].dtype == TWK_LOSS_F32)
            fb->in[loss->inputs[i].id] = fb_gather_input(q, &loss->inputs[i], fb->offsets, K, &oom);
    if (oom) return 0;
    fb->b = (twk_loss_batch){q->n_data, fb->offsets, fb->tokens, K, fb->targets, {0}};
    for (int i = 0; i < TWK_IN_COUNT; i++) fb->b.in[i] = fb->in[i];
    return 1;
}

/* The ForwardBackwardOutput: logprobs per datum ([N] or [N, K]) and the loss's metrics. */
static void fb_encode(op *o, const fb_batch *fb, const float *lp, const twk_loss_result *res) {
    int K = fb->b.k, n_data = fb->b.n_seqs;
    int64_t *offk = twk_host_alloc((size_t)(n_data + 1) * sizeof(int64_t), "offsets");
    if (!offk) {
        svc_op_fail(o, 0, "out of memory");
        return;
    }
    for (int d = 0; d <= n_data; d++) offk[d] = fb->offsets[d] * (K > 0 ? K : 1);
    twk_wire_field f = {"logprobs", K, lp, offk};
    if (twk_wire_encode_fb_output(n_data, &f, 1, res->keys, res->values, res->n_metrics, &o->out, &o->out_len) != TWK_OK)
        svc_op_fail(o, 0, "encoding the result failed: %s", twk_last_error());
    o->out_proto = 1;
    twk_host_free(offk);
}

twk_pack *svc_base_pack(const twk_serve_config *cfg, base_model *bm) {
    if (bm->pack) return bm->pack;
    int64_t cap = cfg->pack_tokens > cfg->max_context ? cfg->pack_tokens : cfg->max_context;
    return twk_pack_new(bm->m, cap, cfg->pack_runs > 1 ? cfg->pack_runs : 1, &bm->pack) == TWK_OK ? bm->pack : NULL;
}

twk_status svc_pack_step(twk_pack *pack, twk_trainer *t, const twk_loss_spec *spec, const twk_loss_batch *b, int backward,
                         float *logprobs, twk_loss_result *res) {
    if (!pack) return twk_error(TWK_ERR_OOM, "out of memory for a packed pass: %s", twk_last_error());
    twk_loss_job j = {.t = t, .spec = spec, .b = b, .backward = backward, .logprobs = logprobs};
    twk_status st = twk_loss_steps(pack, &j, 1);
    if (st != TWK_OK) return st;
    if (j.st != TWK_OK) return twk_error(j.st, "%s", j.err);
    *res = j.res;
    return TWK_OK;
}

/* What the loop reads of a finished forward_backward: the loss for the non-finite alert, the
 * metrics for the per-step log (steps.c), the optimizer steps taken. */
static void fb_note(op *o, const twk_loss_result *res) {
    o->loss_value = res->loss;
    o->fb_res = *res;
    o->trainer_step = twk_trainer_step(o->run->trainer);
}

/* Multi-rank (dist_serve.c): each op alone, its datums split across the ranks, each rank's share
 * through its own base model's pack (so a datum's logprobs are the one-process service's). */
static void run_fb_ranks(op *o) {
    fb_batch fb;
    if (!fb_gather(o->fb, o->loss.def, &fb)) {
        svc_op_fail(o, 0, "out of memory for a batch of %d datums", o->fb->n_data);
        fb_batch_free(&fb);
        return;
    }
    int64_t nk = fb.offsets[fb.b.n_seqs] * (fb.b.k > 0 ? fb.b.k : 1);
    float *lp = twk_host_alloc((size_t)(nk ? nk : 1) * sizeof(float), "logprobs");
    twk_loss_result res;
    twk_pack *pack = svc_base_pack(&o->svc->cfg, o->run->base);
    twk_status st = lp ? svc_dist_loss_step(o->run, pack, &o->loss, &fb.b, !o->fb->forward_only, lp, &res) : TWK_ERR_OOM;
    if (st != TWK_OK)
        svc_op_fail(o, st == TWK_ERR_RANGE || st == TWK_ERR_INVALID_ARG, "%s", lp ? twk_last_error() : "out of memory");
    else {
        fb_encode(o, &fb, lp, &res);
        fb_note(o, &res);
    }
    twk_host_free(lp);
    fb_batch_free(&fb);
}

void svc_run_fb(op **ops, int n) {
    if (svc_dist_active()) {
        for (int i = 0; i < n; i++) run_fb_ranks(ops[i]);
        return;
    }
    fb_batch *fb = twk_host_calloc((size_t)n * sizeof *fb, "packed batches");
    twk_loss_job *jobs = twk_host_calloc((size_t)n * sizeof *jobs, "packed jobs");
    op **run = twk_host_alloc((size_t)n * sizeof *run, "packed ops");
    twk_pack *pack = fb && jobs && run ? svc_base_pack(&ops[0]->svc->cfg, ops[0]->run->base) : NULL;
    int m = 0; /* ops that reach the pack */
    for (int i = 0; i < n; i++) {
        op *o = ops[i];
        if (!pack) {
            svc_op_fail(o, 0, "out of memory for a packed pass: %s", twk_last_error());
            continue;
        }
        if (!fb_gather(o->fb, o->loss.def, &fb[m])) {
            svc_op_fail(o, 0, "out of memory for a batch of %d datums", o->fb->n_data);
            fb_batch_free(&fb[m]);
            memset(&fb[m], 0, sizeof fb[m]);
            continue;
        }
        int64_t nk = fb[m].offsets[fb[m].b.n_seqs] * (fb[m].b.k > 0 ? fb[m].b.k : 1);
        float *lp = twk_host_alloc((size_t)(nk ? nk : 1) * sizeof(float), "logprobs");
        if (!lp) {
            svc_op_fail(o, 0, "out of memory");
            fb_batch_free(&fb[m]);
            memset(&fb[m], 0, sizeof fb[m]);
            continue;
        }
        jobs[m] = (twk_loss_job){.t = o->run->trainer, .spec = &o->loss, .b = &fb[m].b, .backward = !o->fb->forward_only, .logprobs = lp};
        run[m++] = o;
    }
    twk_status st = m ? twk_loss_steps(pack, jobs, m) : TWK_OK;
    if (m) svc_metrics_pack(ops[0]->svc, ops[0]->run->base);
    for (int i = 0; i < m; i++) {
        op *o = run[i];
        twk_status js = st == TWK_OK ? jobs[i].st : st;
        if (js != TWK_OK)
            svc_op_fail(o, js == TWK_ERR_RANGE || js == TWK_ERR_INVALID_ARG, "%s", st == TWK_OK ? jobs[i].err : twk_last_error());
        else {
            fb_encode(o, &fb[i], jobs[i].logprobs, &jobs[i].res);
            fb_note(o, &jobs[i].res);
        }
        twk_host_free(jobs[i].logprobs);
        fb_batch_free(&fb[i]);
    }
    twk_host_free(fb);
    twk_host_free(jobs);
    twk_host_free(run);
}

void svc_run_fb_jobs(twk_job **jobs, int n) {
    op *ops[TWK_SERVE_CAP_PACK_RUNS];
    int m = 0;
    for (int i = 0; i < n && i < TWK_SERVE_CAP_PACK_RUNS; i++) {
        op *o = jobs[i]->arg;
        if (svc_op_start(o)) ops[m++] = o;
    }
    if (m) svc_run_fb(ops, m);
}

void svc_pack_stats(const base_model *bm, twk_pack_stats *out) { twk_pack_get_stats(bm ? bm->pack : NULL, out); }
