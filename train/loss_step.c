/* The loss step: one entry point that runs any registered loss on a trainer.
 * Cross-entropy is one pass (forward, or forward and backward). Every other
 * loss is a forward for the model's logprobs p, the loss and dL/dp on the
 * host (losses.c, loss_rl.c), then a cross-entropy backward with weights
 * -dL/dp, which has exactly the loss's gradient. Sequences are packed whole
 * into passes of at most the trainer's capacity. Several trainers' steps run
 * together through twk_loss_steps (loss_steps.c), which packs their passes. */
#include <math.h>
#include <string.h>

#include "loss_pack.h"
#include "trainer_internal.h"
#include "twinkle/train.h"

/* Scratch of one pass: tokens, targets, positions, segment starts and weights. */
typedef struct step_ctx {
    twk_packer *pk; /* non-NULL: passes go through the packer (twk_loss_steps) as job `job` */
    int job;
    twk_trainer *t;
    const twk_loss_batch *b;
    int64_t cap, total;
    int32_t *tgt, *pos, *seg;
    float *w;
    int last_col; /* this call's target column is the last (always 1 outside column_passes) */
} step_ctx;

/* Passes over the batch: targets (one per token; NULL = the batch's 1-D
 * targets) and weights (one per token; NULL = 1). Logprobs of every token go
 * to lp; the cross-entropy loss -sum w p (float per pass) is summed into
 * *loss_sum, the weights into *wsum. */
static twk_status passes(step_ctx *c, pass_mode mode, const int32_t *targets, const float *weights, float *lp,
                         double *loss_sum, double *wsum) {
    const twk_loss_batch *b = c->b;
    const int64_t *off = b->offsets;
    if (!targets) targets = b->targets;
    for (int s0 = 0; s0 < b->n_seqs;) {
        int s1 = s0;
        while (s1 < b->n_seqs && off[s1 + 1] - off[s0] <= c->cap) s1++;
        if (s1 == s0)
            return twk_error(TWK_ERR_INVALID_ARG, "sequence %d has %lld tokens; a pass holds %lld", s0,
                             (long long)(off[s0 + 1] - off[s0]), (long long)c->cap);
        int64_t a = off[s0], n = off[s1] - a;
        for (int s = s0; s < s1; s++)
            for (int64_t i = off[s]; i < off[s + 1]; i++) {
                int64_t t = i - a;
                c->tgt[t] = targets[i];
                c->w[t] = weights ? weights[i] : 1.0f;
                c->pos[t] = (int32_t)(i - off[s]);
                c->seg[t] = (int32_t)(off[s] - a);
                *wsum += c->w[t];
            }
        twk_batch pb = {n, b->tokens + a, c->tgt, c->pos, c->seg, c->w};
        float loss = 0;
        /* backward passes come last in every family: the last one ends the step's gradients */
        int last = mode == PASS_BACKWARD && s1 == b->n_seqs && c->last_col;
        /* a run whose LoRA the pack's slots cannot hold (a mixture of experts' experts or router)
         * runs its passes on its own trainer, as alone, counted in the pack's own_passes */
        int own = c->pk && twk_pack_needs_own(c->t);
        twk_status st = c->pk && !own         ? twk_packer_pass(c->pk, c->job, c->t, mode, &pb, lp + a, &loss)
                        : last                ? twk_trainer_forward_backward_last(c->t, &pb, lp + a, &loss)
                        : mode == PASS_BACKWARD ? twk_trainer_forward_backward(c->t, &pb, lp + a, &loss)
                        : mode == PASS_BASE   ? twk_trainer_forward_base(c->t, &pb, lp + a, &loss)
                                              : twk_trainer_forward(c->t, &pb, lp + a, &loss);
        if (st != TWK_OK) return st;
        if (own) twk_packer_count_own(c->pk);
        *loss_sum += loss;
        s0 = s1;
    }
    return TWK_OK;
}

/* K column passes over top-K targets: column k's targets, its weights from
 * weights_nk (N x K; NULL = 1) and its logprobs into lp_k (N x K). */
static twk_status column_passes(step_ctx *c, pass_mode mode, const float *weights_nk, float *lp_k, double *loss_sum,
                                double *wsum) {
    int64_t n = c->total;
    int K = c->b->k;
    size_t bytes = (size_t)(n ? n : 1) * sizeof(float);
    int32_t *tk = twk_host_alloc(bytes, "column targets");
    float *wk = twk_host_alloc(bytes, "column weights"), *lp1 = twk_host_alloc(bytes, "column logprobs");
    twk_status st = tk && wk && lp1 ? TWK_OK : twk_error(TWK_ERR_OOM, "loss step: out of memory");
    for (int k = 0; st == TWK_OK && k < K; k++) {
        for (int64_t i = 0; i < n; i++) {
            tk[i] = c->b->targets[i * K + k];
            wk[i] = weights_nk ? weights_nk[i * K + k] : 1.0f;
        }
        double l = 0, ws = 0;
        c->last_col = k == K - 1;
        c->t->aux_off = k != K - 1; /* the router's load-balancing loss: its gradient once per step, in the last column */
        st = passes(c, mode, tk, wk, lp1, &l, &ws);
        c->last_col = 1;
        c->t->aux_off = 0;
        *loss_sum += l;
        *wsum += ws;
        for (int64_t i = 0; st == TWK_OK && i < n; i++) lp_k[i * K + k] = lp1[i];
    }
    twk_host_free(tk);
    twk_host_free(wk);
    twk_host_free(lp1);
    return st;
}

/* The backward of a host-evaluated loss: dldp (one per token, or N x K) is
 * negated in place and trained as cross-entropy weights. */
static twk_status backward_dldp(step_ctx *c, float *dldp) {
    int K = c->b->k;
    int64_t n = c->total * (K > 0 ? K : 1);
    for (int64_t i = 0; i < n; i++) dldp[i] = -dldp[i];
    float *lp = twk_host_alloc((size_t)(n ? n : 1) * sizeof(float), "logprobs");
    double unused = 0, unused_w = 0;
    twk_status st = !lp     ? twk_error(TWK_ERR_OOM, "loss step: out of memory")
                    : K > 0 ? column_passes(c, PASS_BACKWARD, dldp, lp, &unused, &unused_w)
                            : passes(c, PASS_BACKWARD, NULL, dldp, lp, &unused, &unused_w);
    twk_host_free(lp);
    return st;
}

/* The batch's weights, or a fresh array of ones (*owned set); NULL on OOM. */
static const float *weights_or_ones(step_ctx *c, float **owned) {
    *owned = NULL;
    if (c->b->in[TWK_IN_WEIGHTS]) return c->b->in[TWK_IN_WEIGHTS];
    *owned = twk_host_alloc((size_t)(c->total ? c->total : 1) * sizeof(float), "weights");
    for (int64_t i = 0; *owned && i < c->total; i++) (*owned)[i] = 1.0f;
    return *owned;
}

/* Reference logprobs: the batch's, else the base model's (a forward with the adapter off). */
static twk_status reference(step_ctx *c, const float **ref, float **owned) {
    *owned = NULL;
    if ((*ref = c->b->in[TWK_IN_REF_LOGPROBS])) return TWK_OK;
    *owned = twk_host_alloc((size_t)(c->total ? c->total : 1) * sizeof(float), "reference logprobs");
    if (!*owned) return twk_error(TWK_ERR_OOM, "loss step: out of memory");
    double unused = 0, unused_w = 0;
    *ref = *owned;
    return passes(c, PASS_BASE, NULL, NULL, *owned, &unused, &unused_w);
}

/* Cross-entropy: one pass per target column, backward when asked. */
static twk_status step_ce(step_ctx *c, int backward, float *lp, twk_loss_result *r) {
    double loss = 0, wsum = 0;
    pass_mode mode = backward ? PASS_BACKWARD : PASS_FORWARD;
    twk_status st = c->b->k > 0 ? column_passes(c, mode, c->b->in[TWK_IN_WEIGHTS], lp, &loss, &wsum)
                                : passes(c, mode, NULL, c->b->in[TWK_IN_WEIGHTS], lp, &loss, &wsum);
    r->loss = loss;
    r->values[2] = wsum;
    return st;
}

/* Token i's mask of an RL loss: the sequence_ratio_mask where given and not NaN, else the weight (1
 * where absent). */
static float rl_mask_at(const twk_loss_batch *b, int64_t i) {
    const float *srm = b->in[TWK_IN_SEQUENCE_RATIO_MASK], *w = b->in[TWK_IN_WEIGHTS];
    return srm && !isnan(srm[i]) ? srm[i] : w ? w[i] : 1.0f;
}

/* The token mask of an RL loss (rl_mask_at): the weights themselves when no sequence_ratio_mask is
 * given, else built (*owned set); NULL on OOM. */
static const float *rl_mask(step_ctx *c, float **owned) {
    if (!c->b->in[TWK_IN_SEQUENCE_RATIO_MASK]) return weights_or_ones(c, owned);
    *owned = twk_host_alloc((size_t)(c->total ? c->total : 1) * sizeof(float), "sequence ratio mask");
    for (int64_t i = 0; *owned && i < c->total; i++) (*owned)[i] = rl_mask_at(c->b, i);
    return *owned;
}

twk_status twk_loss_whole_of(const twk_loss_batch *b, int s0, int s1, twk_loss_whole *out) {
    if (!b || !b->offsets || !out || s0 < 0 || s1 < s0 || s1 > b->n_seqs)
        return twk_error(TWK_ERR_INVALID_ARG, "loss_whole_of: NULL argument or sequences [%d, %d) of %d", s0, s1,
                         b ? b->n_seqs : 0);
    memset(out, 0, sizeof *out);
    out->n_seqs = s1 - s0;
    for (int s = s0; s < s1; s++) {
        double ns = 0;
        for (int64_t i = b->offsets[s]; i < b->offsets[s + 1]; i++) ns += rl_mask_at(b, i) != 0.0f;
        out->masked_tokens += ns;
        out->longest = ns > out->longest ? ns : out->longest;
    }
    return TWK_OK;
}

/* RL: Tinker's surrogates, the GRPO family, GSPO and stable_reinforce
 * (twk_loss_rl). Where the sampler's logprobs are NaN the model's own are
 * used (on-policy, ratio 1); stable_reinforce takes them from the recording. */
static twk_status step_rl(step_ctx *c, const twk_loss_spec *s, int backward, float *p, twk_loss_result *r) {
    const twk_loss_batch *b = c->b;
    int64_t n = c->total;
    double unused = 0, wsum = 0;
    const double *cfg = s->config; /* NaN: a key the loss does not take */
    twk_rl_spec rl = {(twk_loss_kind)s->def->variant, (twk_rl_aggregation)s->def->aggregation, cfg[TWK_CFG_CLIP_LOW],
                      cfg[TWK_CFG_CLIP_HIGH], cfg[TWK_CFG_BETA], isnan(cfg[TWK_CFG_MAX_TOKENS]) ? 0 : cfg[TWK_CFG_MAX_TOKENS],
                      isnan(cfg[TWK_CFG_KL_BETA]) ? 0 : cfg[TWK_CFG_KL_BETA], b->whole};
    float *q = twk_host_alloc((size_t)(n ? n : 1) * sizeof(float), "sampler logprobs");
    float *g = twk_host_alloc((size_t)(n ? n : 1) * sizeof(float), "loss gradient");
    float *mask_own = NULL, *ref_own = NULL;
    const float *mask = rl_mask(c, &mask_own), *ref = NULL;
    const float *adv = b->in[TWK_IN_ADVANTAGES], *sq = b->in[TWK_IN_LOGPROBS];
    if (s->def->provenance) sq = b->in[TWK_IN_RECORDED_LOGPROBS]; /* the sampler's, as recorded; NaN off the sampled tokens */
    twk_status st = q && g && mask ? TWK_OK : twk_error(TWK_ERR_OOM, "loss step: out of memory");
    if (st == TWK_OK && !adv) st = twk_error(TWK_ERR_INVALID_ARG, "%s needs advantages", s->def->name);
    if (st == TWK_OK) st = passes(c, PASS_FORWARD, NULL, NULL, p, &unused, &wsum);
    for (int64_t i = 0; st == TWK_OK && i < n; i++) {
        q[i] = !sq || isnan(sq[i]) ? p[i] : sq[i];
        if (isnan(adv[i])) st = twk_error(TWK_ERR_INVALID_ARG, "token %lld of the batch has no advantage", (long long)i);
    }
    if (st == TWK_OK && rl.kl_beta > 0) st = reference(c, &ref, &ref_own);
    twk_loss_stats ls = {0, 0, 0, 0};
    if (st == TWK_OK)
        st = twk_loss_rl(&rl, b->n_seqs, b->offsets, p, q, adv, mask, b->in[TWK_IN_CLIP_LOW], b->in[TWK_IN_CLIP_HIGH],
                         ref, g, &ls);
    if (st == TWK_OK && backward) st = backward_dldp(c, g);
    r->loss = ls.loss;
    r->values[2] = (double)n;
    r->values[3] = ls.ratio_mean;
    r->values[4] = ls.clip_fraction;
    r->values[5] = ls.kl_mean;
    r->n_metrics = rl.kl_beta > 0 ? 6 : 5;
    r->mean = rl.aggregation == TWK_AGG_SUM ? (n ? ls.loss / (double)n : 0) : ls.loss;
    twk_host_free(q);
    twk_host_free(g);
    twk_host_free(mask_own);
    twk_host_free(ref_own);
    return st;
}

/* Preference pairs (dpo, ipo): the policy's and the reference's logprobs, the pair loss on the host. */
static twk_status step_pref(step_ctx *c, const twk_loss_spec *s, int backward, float *p, twk_loss_result *r) {
    int64_t n = c->total;
    double unused = 0, wsum = 0;
    float *g = twk_host_alloc((size_t)(n ? n : 1) * sizeof(float), "loss gradient"), *mask_own = NULL, *ref_own = NULL;
    const float *mask = weights_or_ones(c, &mask_own), *ref = NULL;
    twk_status st = g && mask ? TWK_OK : twk_error(TWK_ERR_OOM, "loss step: out of memory");
    if (st == TWK_OK && c->b->n_seqs % 2)
        st = twk_error(TWK_ERR_INVALID_ARG, "%s takes pairs (chosen, rejected): %d sequences, an odd count",
                       s->def->name, c->b->n_seqs);
    if (st == TWK_OK) st = passes(c, PASS_FORWARD, NULL, c->b->in[TWK_IN_WEIGHTS], p, &unused, &wsum);
    if (st == TWK_OK) st = reference(c, &ref, &ref_own);
    twk_dpo_stats ds = {0, 0, 0};
    if (st == TWK_OK)
        st = twk_loss_dpo(c->b->n_seqs, c->b->offsets, p, ref, mask, s->config[TWK_CFG_BETA], s->def->variant, g, &ds);
    if (st == TWK_OK && backward) st = backward_dldp(c, g);
    r->loss = ds.loss;
    r->values[2] = c->b->n_seqs / 2;
    r->values[3] = ds.margin_mean;
    r->values[4] = ds.accuracy;
    r->mean = c->b->n_seqs >= 2 ? ds.loss / (c->b->n_seqs / 2) : ds.loss;
    twk_host_free(g);
    twk_host_free(mask_own);
    twk_host_free(ref_own);
    return st;
}

/* Distillation: the student's logprobs of the teacher's top-K tokens (K
 * forwards), the divergence on the host, K backwards. */
static twk_status step_distill(step_ctx *c, const twk_loss_spec *s, int backward, float *lp_k, twk_loss_result *r) {
    int64_t n = c->total, nk = n * (c->b->k > 0 ? c->b->k : 1);
    double unused = 0, unused_w = 0, wsum = 0;
    const float *tlp = c->b->in[TWK_IN_TEACHER_LOGPROBS];
    float *g = twk_host_alloc((size_t)(nk ? nk : 1) * sizeof(float), "loss gradient"), *w_own = NULL;
    const float *w = weights_or_ones(c, &w_own);
    twk_status st = g && w ? TWK_OK : twk_error(TWK_ERR_OOM, "loss step: out of memory");
    if (st == TWK_OK && (c->b->k < 1 || !tlp))
        st = twk_error(TWK_ERR_INVALID_ARG, "%s needs top-K target_tokens and teacher_logprobs", s->def->name);
    if (st == TWK_OK) st = column_passes(c, PASS_FORWARD, NULL, lp_k, &unused, &unused_w);
    for (int64_t i = 0; st == TWK_OK && i < n; i++) wsum += w[i];
    if (st == TWK_OK)
        st = twk_loss_distill((twk_distill_kind)s->def->variant, n, c->b->k, lp_k, tlp, w, s->config[TWK_CFG_BETA], g,
                              &r->loss);
    if (st == TWK_OK && backward) st = backward_dldp(c, g);
    r->values[2] = wsum;
    twk_host_free(g);
    twk_host_free(w_own);
    return st;
}

twk_status twk_loss_step(twk_trainer *t, const twk_loss_spec *spec, const twk_loss_batch *b, int backward,
                         float *logprobs, twk_loss_result *res) {
    return twk_loss_step_in(NULL, 0, t, spec, b, backward, logprobs, res);
}

twk_status twk_loss_step_in(twk_packer *pk, int job, twk_trainer *t, const twk_loss_spec *spec, const twk_loss_batch *b,
                            int backward, float *logprobs, twk_loss_result *res) {
    if (!t || !spec || !spec->def || !b || !res || b->n_seqs < 1 || !b->offsets || !b->tokens || !b->targets)
        return twk_error(TWK_ERR_INVALID_ARG, "loss step: NULL argument or no sequences");
    const twk_loss_def *d = spec->def;
    memset(res, 0, sizeof *res);
    double aux_sum0 = t->aux_sum; /* this step's passes' router_aux_loss: what they add */
    long aux_n0 = t->aux_n;
    step_ctx c = {pk, job, t, b, twk_trainer_capacity(t), b->offsets[b->n_seqs], NULL, NULL, NULL, NULL, 1};
    int64_t cap = c.cap > 0 ? c.cap : 1, nk = c.total * (b->k > 0 ? b->k : 1);
    c.tgt = twk_host_alloc((size_t)cap * 3 * sizeof(int32_t), "batch");
    c.w = twk_host_alloc((size_t)cap * sizeof(float), "batch weights");
    float *lp = logprobs ? logprobs : twk_host_alloc((size_t)(nk ? nk : 1) * sizeof(float), "logprobs");
    twk_status st = c.tgt && c.w && lp ? TWK_OK : twk_error(TWK_ERR_OOM, "loss step: out of memory");
    if (st == TWK_OK) {
        c.pos = c.tgt + cap;
        c.seg = c.tgt + 2 * cap;
        res->n_metrics = d->n_metrics;
        st = d->family == TWK_FAMILY_CE    ? step_ce(&c, backward, lp, res)
             : d->family == TWK_FAMILY_RL   ? step_rl(&c, spec, backward, lp, res)
             : d->family == TWK_FAMILY_PREF ? step_pref(&c, spec, backward, lp, res)
                                            : step_distill(&c, spec, backward, lp, res);
    }
    if (d->family == TWK_FAMILY_CE || d->family == TWK_FAMILY_DISTILL) /* per weighted token */
        res->mean = res->values[2] != 0 ? res->loss / res->values[2] : res->loss;
    res->values[0] = res->loss;
    res->values[1] = (double)c.total;
    for (int i = 0; i < res->n_metrics; i++) res->keys[i] = d->metrics[i];
    if (st == TWK_OK && t->aux_n > aux_n0 && res->n_metrics < TWK_LOSS_MAX_METRICS) {
        res->keys[res->n_metrics] = TWK_METRIC_ROUTER_AUX;
        res->values[res->n_metrics++] = (t->aux_sum - aux_sum0) / (double)(t->aux_n - aux_n0);
    }
    twk_host_free(c.tgt);
    twk_host_free(c.w);
    if (lp != logprobs) twk_host_free(lp);
    return st;
}
