/* The multi-rank service, ranks above 0: no HTTP, no store — the same base
 * models, a replica of every run's trainer, and a loop executing rank 0's
 * commands (dist_serve.h) in the order they come. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "dist.h"
#include "dist_serve.h"

typedef struct frun {
    char id[128];
    int model; /* its base model's index */
    twk_trainer *t;
    struct frun *next;
} frun;

typedef struct follower {
    twk_serve_config cfg;
    twk_device *dev;
    base_model models[TWK_MAX_BASE_MODELS];
    int n_models;
    frun *runs;
    twk_sampler *samplers[TWK_MAX_BASE_MODELS]; /* each base model's slotted sampler replica, made on first use */
    char dev_err[512];         /* why the device did not open */
} follower;

static frun **find(follower *f, const char *id) {
    frun **pp = &f->runs;
    while (*pp && strcmp((*pp)->id, id)) pp = &(*pp)->next;
    return pp;
}

static twk_trainer *trainer_of(follower *f, const char *id) {
    frun *r = *find(f, id);
    if (!r) twk_error(TWK_ERR_STATE, "run %s is not loaded on this rank", id);
    return r ? r->t : NULL;
}

static void reply(twk_status st, const twk_loss_result *res, const float *lp, int64_t n_lp) {
    dsv_reply rep;
    memset(&rep, 0, sizeof rep);
    rep.st = st;
    rep.user_error = st == TWK_ERR_INVALID_ARG || st == TWK_ERR_RANGE;
    if (st != TWK_OK) snprintf(rep.err, sizeof rep.err, "%s", twk_last_error());
    if (res) {
        rep.n_metrics = res->n_metrics;
        rep.loss = res->loss;
        memcpy(rep.values, res->values, sizeof rep.values);
    }
    int64_t len = (int64_t)sizeof rep + (lp ? n_lp * (int64_t)sizeof(float) : 0);
    unsigned char *buf = twk_host_alloc((size_t)len, "dist reply");
    if (!buf) { /* the header alone, failed: rank 0 reruns the batch */
        rep.st = TWK_ERR_OOM;
        snprintf(rep.err, sizeof rep.err, "out of memory for a reply");
        (void)twk_dist_send(0, DSV_TAG_REPLY, &rep, sizeof rep);
        return;
    }
    rep.n_logprobs = lp ? n_lp : 0;
    memcpy(buf, &rep, sizeof rep);
    if (lp && n_lp) memcpy(buf + sizeof rep, lp, (size_t)n_lp * sizeof(float));
    (void)twk_dist_send(0, DSV_TAG_REPLY, buf, len);
    twk_host_free(buf);
}

/* A forward_backward share: the arrays after the header, in send_share's order. */
static void run_fb(follower *f, const dsv_cmd *h, const unsigned char *p, int64_t len) {
    twk_loss_spec spec;
    frun *r = *find(f, h->run);
    twk_trainer *t = trainer_of(f, h->run);
    twk_status st = t ? twk_loss_spec_init(h->loss, &spec) : TWK_ERR_STATE;
    int64_t ntok = h->n_tokens, kw = h->k > 0 ? h->k : 1, need = (int64_t)(h->n_seqs + 1) * 8 + ntok * 4 + ntok * kw * 4;
    twk_loss_batch b;
    memset(&b, 0, sizeof b);
    if (st == TWK_OK) {
        memcpy(spec.config, h->config, sizeof spec.config);
        b.n_seqs = h->n_seqs;
        b.k = h->k;
        b.offsets = (const int64_t *)p;
        b.tokens = (const int32_t *)(p + (h->n_seqs + 1) * 8);
        b.targets = b.tokens + ntok;
        const float *at = (const float *)(b.targets + ntok * kw);
        for (int i = 0; i < spec.def->n_inputs; i++) {
            const twk_loss_input_def *in = &spec.def->inputs[i];
            if (in->dtype != TWK_LOSS_F32 || !(h->in_mask & (1u << in->id))) continue;
            b.in[in->id] = at;
            at += ntok * dsv_input_width(in, h->k);
            need += ntok * dsv_input_width(in, h->k) * 4;
        }
        if (need > len) st = twk_error(TWK_ERR_BACKEND, "a forward_backward share of %lld bytes, %lld expected",
                                       (long long)len, (long long)need);
    }
    float *saved = st == TWK_OK && h->backward ? dsv_grads_save(t) : NULL;
    float *lp = twk_host_alloc((size_t)(ntok > 0 ? ntok * kw : 1) * sizeof(float), "logprobs");
    if (st == TWK_OK && (!lp || (h->backward && !saved))) st = twk_error(TWK_ERR_OOM, "out of memory for a share");
    twk_loss_result res;
    memset(&res, 0, sizeof res);
    /* through the base model's pack, as rank 0 and the one-process service run a share */
    if (st == TWK_OK) st = svc_pack_step(svc_base_pack(&f->cfg, &f->models[r->model]), t, &spec, &b, h->backward, lp, &res);
    reply(st, &res, st == TWK_OK ? lp : NULL, ntok * kw);
    if (h->backward) { /* rank 0's verdict: keep the gradient, or put it back (a share failed somewhere) */
        void *v = NULL;
        int64_t vn = 0;
        if (twk_dist_recv(0, DSV_TAG_VERDICT, &v, &vn) == TWK_OK && vn == 4 && *(int32_t *)v == 0 && saved)
            dsv_grads_restore(t, saved);
        twk_host_free(v);
    }
    twk_host_free(saved);
    twk_host_free(lp);
}

/* A snapshot's tensors inside the command: (name, nelem, floats) * n, for twk_sampler_slot_set. */
typedef struct msg_adapter {
    const unsigned char *at;
    int n;
} msg_adapter;

static int get_from_msg(void *ctx, const char *name, float *dst, int64_t nelem) {
    const msg_adapter *a = ctx;
    const unsigned char *p = a->at;
    for (int i = 0; i < a->n; i++) {
        int64_t ne;
        memcpy(&ne, p + 224, 8);
        if (!strcmp((const char *)p, name)) {
            if (ne != nelem) return 0;
            memcpy(dst, p + 232, (size_t)ne * sizeof(float));
            return 1;
        }
        p += 232 + ne * (int64_t)sizeof(float);
    }
    return 0;
}

/* Reads one adapter of a DSV_SAMPLE (svc_dist_sample_send's put_adapter) into slot `slot`. */
static twk_status load_slot(twk_sampler *sm, int slot, const unsigned char *msg, int64_t len, int64_t *at) {
    const int32_t *kind = dsv_take(msg, len, at, 4), *rank = dsv_take(msg, len, at, 4);
    const float *alpha = dsv_take(msg, len, at, 4);
    const char *dir = dsv_take(msg, len, at, 1024);
    const int32_t *n = dsv_take(msg, len, at, 4);
    if (!n) return twk_error(TWK_ERR_BACKEND, "a short decode batch");
    msg_adapter ma = {msg + *at, *n};
    for (int i = 0; *kind == 2 && i < *n; i++) {
        const unsigned char *t = dsv_take(msg, len, at, 232);
        int64_t ne;
        if (!t) return twk_error(TWK_ERR_BACKEND, "a short decode batch");
        memcpy(&ne, t + 224, 8);
        if (!dsv_take(msg, len, at, ne * (int64_t)sizeof(float))) return twk_error(TWK_ERR_BACKEND, "a short decode batch");
    }
    if (*kind == 1) return twk_sampler_slot_load_dir(sm, slot, dir);
    if (*kind == 2) return twk_sampler_slot_set(sm, slot, *rank, *alpha, get_from_msg, &ma);
    return twk_sampler_slot_clear(sm, slot);
}

/* A decode batch: its adapters into slots 1.., the requests decoded together, the sequences sent
 * back under the batch's tag without waiting for rank 0 to take them. */
static void run_sample(follower *f, const dsv_cmd *h, const unsigned char *msg, int64_t len) {
    enum { SEQS = TWK_SERVE_SAMPLER_SEQS };
    int64_t at = sizeof *h;
    twk_status st = h->model >= 0 && h->model < f->n_models && h->n_seqs >= 1 && h->n_seqs <= SEQS
                        ? TWK_OK : twk_error(TWK_ERR_STATE, "a decode batch for model %d of %d requests", h->model, h->n_seqs);
    twk_sampler **sm = st == TWK_OK ? &f->samplers[h->model] : NULL;
    if (st == TWK_OK && !*sm)
        st = twk_sampler_new_slots(f->models[h->model].m, f->cfg.sampler_slots, f->cfg.slot_rank, SEQS,
                                   f->cfg.max_context, sm);
    if (st == TWK_OK && h->k >= f->cfg.sampler_slots) st = twk_error(TWK_ERR_STATE, "%d adapters in a decode batch", h->k);
    for (int a = 0; st == TWK_OK && a < h->k; a++) st = load_slot(*sm, a + 1, msg, len, &at);
    twk_sample_request reqs[SEQS];
    twk_sample_params params[SEQS];
    int32_t stops[SEQS][TWK_SERVE_MAX_STOP_TOKENS];
    char strs[SEQS][TWK_SERVE_MAX_STOP_STRINGS][TWK_SERVE_MAX_STOP_STRING_LEN + 1];
    const char *str_ptr[SEQS][TWK_SERVE_MAX_STOP_STRINGS];
    int total = 0;
    for (int i = 0; st == TWK_OK && i < h->n_seqs; i++) {
        const int32_t *head = dsv_take(msg, len, &at, 32);
        const float *fl = dsv_take(msg, len, &at, 8);
        const void *seed_at = dsv_take(msg, len, &at, 8), *np_at = dsv_take(msg, len, &at, 8);
        uint64_t seed = 0;
        int64_t np = -1; /* 8-byte fields at 4-byte offsets: copied out */
        if (seed_at && np_at) memcpy(&seed, seed_at, 8), memcpy(&np, np_at, 8);
        const int32_t *prompt = np >= 0 ? dsv_take(msg, len, &at, np * 4) : NULL;
        const void *stop = prompt && head[5] >= 0 && head[5] <= TWK_SERVE_MAX_STOP_TOKENS ? dsv_take(msg, len, &at, head[5] * 4) : NULL;
        if (!stop || head[6] < 0 || head[6] > TWK_SERVE_MAX_STOP_STRINGS) {
            st = twk_error(TWK_ERR_BACKEND, "a short decode batch");
            break;
        }
        memcpy(stops[i], stop, (size_t)head[5] * 4);
        for (int k = 0; st == TWK_OK && k < head[6]; k++) {
            const int32_t *sl = dsv_take(msg, len, &at, 4);
            const char *sv = sl && *sl >= 0 && *sl <= TWK_SERVE_MAX_STOP_STRING_LEN ? dsv_take(msg, len, &at, *sl) : NULL;
            if (!sv) st = twk_error(TWK_ERR_BACKEND, "a short decode batch");
            else {
                memcpy(strs[i][k], sv, (size_t)*sl);
                strs[i][k][*sl] = 0;
                str_ptr[i][k] = strs[i][k];
            }
        }
        params[i] = (twk_sample_params){head[2], fl[0], head[3], fl[1], seed, head[4] != 0, stops[i], head[5],
                                        str_ptr[i], head[6], f->models[h->model].tok};
        reqs[i] = (twk_sample_request){prompt, np, head[1], &params[i], NULL, head[0], NULL, NULL};
        total += head[1];
    }
    twk_sampled_seq *res = st == TWK_OK ? twk_host_calloc((size_t)(total ? total : 1) * sizeof *res, "sampled") : NULL;
    if (st == TWK_OK && !res) st = twk_error(TWK_ERR_OOM, "out of memory for a decode batch");
    for (int i = 0, off = 0; st == TWK_OK && i < h->n_seqs; off += reqs[i].num_samples, i++) reqs[i].out = res + off;
    if (st == TWK_OK) st = twk_sampler_generate_many(*sm, reqs, h->n_seqs);
    dsv_reply rep;
    memset(&rep, 0, sizeof rep);
    rep.st = st;
    if (st != TWK_OK) snprintf(rep.err, sizeof rep.err, "%s", twk_last_error());
    dsv_buf b = {0};
    dsv_put(&b, &rep, sizeof rep);
    for (int i = 0; st == TWK_OK && i < total; i++) {
        int32_t why = res[i].stop_reason;
        dsv_put(&b, &res[i].n, 8);
        dsv_put(&b, &why, 4);
        dsv_put(&b, res[i].tokens, res[i].n * 4);
        dsv_put(&b, res[i].logprobs, res[i].n * 4);
    }
    for (int i = 0; res && i < total; i++) twk_sampled_seq_free(&res[i]);
    twk_host_free(res);
    if (b.oom) { /* the header alone, failed */
        twk_host_free(b.p);
        b = (dsv_buf){0};
        rep.st = TWK_ERR_OOM;
        snprintf(rep.err, sizeof rep.err, "out of memory for the decoded sequences");
        dsv_put(&b, &rep, sizeof rep);
    }
    if (b.p) (void)twk_dist_send_async(0, DSV_TAG_SAMPLE + h->tag, b.p, b.n);
}

static twk_status run_create(follower *f, const dsv_cmd *h) {
    if (h->model < 0 || h->model >= f->n_models) return twk_error(TWK_ERR_STATE, "no base model %d on this rank", h->model);
    frun *r = twk_host_calloc(sizeof *r, "run");
    if (!r) return twk_error(TWK_ERR_OOM, "out of memory for a run");
    snprintf(r->id, sizeof r->id, "%s", h->run);
    r->model = h->model;
    twk_status st = twk_trainer_new(f->models[h->model].m, &h->lora, h->capacity, &r->t);
    if (st != TWK_OK) {
        twk_host_free(r);
        return st;
    }
    r->next = f->runs;
    f->runs = r;
    return TWK_OK;
}

static void run_unload(follower *f, const char *id) {
    frun **pp = find(f, id), *r = *pp;
    if (!r) return;
    *pp = r->next;
    twk_trainer_free(r->t);
    twk_host_free(r);
}

/* One command; 0 when it was DSV_STOP. */
static int step(follower *f) {
    void *buf = NULL;
    int64_t len = 0;
    if (twk_dist_recv(0, DSV_TAG_CMD, &buf, &len) != TWK_OK || len < (int64_t)sizeof(dsv_cmd)) {
        fprintf(stderr, "twinkle serve: rank %d: lost rank 0's commands: %s\n", twk_dist_rank(), twk_last_error());
        twk_host_free(buf);
        return 0;
    }
    dsv_cmd h;
    memcpy(&h, buf, sizeof h);
    h.run[sizeof h.run - 1] = h.path[sizeof h.path - 1] = h.loss[sizeof h.loss - 1] = 0;
    twk_clear_error();
    twk_status st = TWK_OK;
    twk_trainer *t = NULL;
    float *saved = NULL;
    int more = 1;
    switch ((dsv_kind)h.kind) {
    case DSV_START:
        st = f->dev ? svc_load_models(&f->cfg, f->dev, f->models, &f->n_models)
                    : twk_error(TWK_ERR_BACKEND, "%s", f->dev_err);
        reply(st, NULL, NULL, 0);
        break;
    case DSV_CREATE: reply(run_create(f, &h), NULL, NULL, 0); break;
    case DSV_FB: run_fb(f, &h, (const unsigned char *)buf + sizeof h, len - (int64_t)sizeof h); break;
    case DSV_OPTIM:
        /* the collective first, whatever happens: rank 0 and every other follower are in it */
        t = trainer_of(f, h.run);
        saved = t ? dsv_grads_save(t) : NULL; /* put back if the step is refused, as on rank 0 */
        st = t ? twk_dist_sum_grads(t, DSV_BUCKET_BYTES, NULL) : TWK_ERR_STATE;
        if (st == TWK_OK) st = twk_trainer_optim_step(t, &h.adam, NULL);
        if (st != TWK_OK && t && saved) dsv_grads_restore(t, saved);
        twk_host_free(saved);
        reply(st, NULL, NULL, 0);
        break;
    case DSV_LOAD:
        t = trainer_of(f, h.run);
        reply(t ? twk_trainer_load_state(t, h.path, h.load_optimizer) : TWK_ERR_STATE, NULL, NULL, 0);
        break;
    case DSV_SAMPLE: run_sample(f, &h, buf, len); break;
    case DSV_UNLOAD:
        run_unload(f, h.run);
        reply(TWK_OK, NULL, NULL, 0);
        break;
    case DSV_STOP:
        reply(TWK_OK, NULL, NULL, 0);
        more = 0;
        break;
    default: reply(twk_error(TWK_ERR_STATE, "unknown command %d", h.kind), NULL, NULL, 0);
    }
    twk_host_free(buf);
    return more;
}

int twk_serve_follower(const twk_serve_config *cfg) {
    follower *f = twk_host_calloc(sizeof *f, "follower");
    if (!f) return 1;
    f->cfg = *cfg;
    /* SIGINT / SIGTERM from the process manager: rank 0 shuts down and sends DSV_STOP */
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    if (twk_device_open(cfg->device, &f->dev) != TWK_OK) /* reported by START, which rank 0 names this rank in */
        snprintf(f->dev_err, sizeof f->dev_err, "%s", twk_last_error());
    while (step(f)) {
    }
    int rc = twk_dist_failed() ? 1 : 0; /* a rank was lost (this one stops; rank 0 serves alone) */
    while (f->runs) run_unload(f, f->runs->id);
    for (int i = 0; i < f->n_models; i++) {
        twk_sampler_free(f->samplers[i]);
        twk_pack_free(f->models[i].pack);
        twk_model_free(f->models[i].m);
        twk_tokenizer_free(f->models[i].tok);
    }
    twk_device_close(f->dev);
    twk_host_free(f);
    return rc;
}
