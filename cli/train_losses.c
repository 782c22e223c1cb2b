/* Preference, RL and distillation steps of `twinkle train`: a forward for the
 * logprobs the loss needs, the loss and dL/dp on the host (train/losses.c,
 * train/loss_rl.c), then cross-entropy backwards with weights -dL/dp, which
 * have exactly the loss's gradient. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train_losses.h"

/* Sequence start offsets of a packed batch (n_seqs + 1 entries); NULL on OOM. */
static int64_t *seq_offsets(const twk_packed *pk) {
    int64_t *off = malloc((size_t)(pk->n_seqs + 1) * 8);
    if (!off) return NULL;
    int ns = 0;
    for (int64_t i = 0; i < pk->batch.n; i++)
        if (pk->batch.seg_start[i] == i && ns < pk->n_seqs) off[ns++] = i;
    off[ns] = pk->batch.n;
    return off;
}

/* A backward with weights -dldp (and targets, when given, instead of the batch's). */
static twk_status backward_weights(twk_trainer *t, const twk_batch *b, const int32_t *targets, float *dldp) {
    for (int64_t i = 0; i < b->n; i++) dldp[i] = -dldp[i];
    twk_batch gb = *b;
    gb.weights = dldp;
    if (targets) gb.targets = targets;
    return twk_trainer_forward_backward(t, &gb, NULL, NULL);
}

twk_status twk_train_dpo_step(twk_trainer *t, const twk_packed *pk, int ipo, double beta, double *loss) {
    const twk_batch *b = &pk->batch;
    int64_t n = b->n;
    float *ref = malloc((size_t)n * 4), *p = malloc((size_t)n * 4), *g = malloc((size_t)n * 4);
    int64_t *off = seq_offsets(pk);
    twk_status st = ref && p && g && off ? TWK_OK : twk_error(TWK_ERR_OOM, "dpo: out of memory");
    if (st == TWK_OK && pk->n_seqs % 2)
        st = twk_error(TWK_ERR_INVALID_ARG, "dpo: a batch holds %d sequences, not whole pairs", pk->n_seqs);
    if (st == TWK_OK) st = twk_trainer_forward_base(t, b, ref, NULL);
    if (st == TWK_OK) st = twk_trainer_forward(t, b, p, NULL);
    twk_dpo_stats ds;
    if (st == TWK_OK) st = twk_loss_dpo(pk->n_seqs, off, p, ref, b->weights, beta, ipo, g, &ds);
    if (st == TWK_OK) st = backward_weights(t, b, NULL, g);
    if (st == TWK_OK) *loss = ds.loss;
    free(ref);
    free(p);
    free(g);
    free(off);
    return st;
}

twk_status twk_train_rl_step(twk_trainer *t, const twk_packed *pk, const twk_rl_spec *spec, double *loss,
                             twk_loss_stats *stats) {
    const twk_batch *b = &pk->batch;
    int64_t n = b->n;
    float *p = malloc((size_t)n * 4), *q = malloc((size_t)n * 4), *g = malloc((size_t)n * 4), *ref = NULL;
    int64_t *off = seq_offsets(pk);
    twk_status st = p && q && g && off ? TWK_OK : twk_error(TWK_ERR_OOM, "rl: out of memory");
    if (st == TWK_OK) st = twk_trainer_forward(t, b, p, NULL);
    for (int64_t i = 0; st == TWK_OK && i < n; i++) { /* no sampler logprobs: on-policy, ratio 1 */
        float s = pk->sampler_logprobs[i];
        q[i] = isnan(s) ? p[i] : s;
        if (isnan(pk->advantages[i]))
            st = twk_error(TWK_ERR_INVALID_ARG, "rl: token %lld of the batch has no advantage", (long long)i);
    }
    if (st == TWK_OK && spec->kl_beta > 0) {
        ref = malloc((size_t)n * 4);
        st = ref ? twk_trainer_forward_base(t, b, ref, NULL) : twk_error(TWK_ERR_OOM, "rl: out of memory");
    }
    if (st == TWK_OK)
        st = twk_loss_rl(spec, pk->n_seqs, off, p, q, pk->advantages, b->weights, NULL, NULL, ref, g, stats);
    if (st == TWK_OK) st = backward_weights(t, b, NULL, g);
    if (st == TWK_OK) *loss = stats->loss;
    free(p);
    free(q);
    free(g);
    free(ref);
    free(off);
    return st;
}

twk_status twk_train_distill_step(twk_trainer *t, twk_sampler *teacher, const twk_packed *pk, twk_distill_kind kind,
                                  int k, double beta, double *loss) {
    const twk_batch *b = &pk->batch;
    int64_t n = b->n;
    int64_t *off = seq_offsets(pk);
    int32_t *ids = malloc((size_t)n * (size_t)k * 4), *seq = malloc((size_t)(n + 1) * 4), *col = malloc((size_t)n * 4);
    int32_t *row_ids = malloc((size_t)(n + 1) * (size_t)k * 4);
    float *tlp = malloc((size_t)n * (size_t)k * 4), *row_lps = malloc((size_t)(n + 1) * (size_t)k * 4);
    float *lp = malloc((size_t)n * (size_t)k * 4), *g = malloc((size_t)n * (size_t)k * 4), *one = malloc((size_t)n * 4);
    twk_status st = off && ids && seq && col && row_ids && tlp && row_lps && lp && g && one
                        ? TWK_OK
                        : twk_error(TWK_ERR_OOM, "distill: out of memory");
    /* the teacher's top-k at each position: the sequence is its tokens plus the last target;
     * row j + 1 of the scores predicts target j */
    for (int s = 0; st == TWK_OK && s < pk->n_seqs; s++) {
        int64_t a = off[s], m = off[s + 1] - a;
        memcpy(seq, b->tokens + a, (size_t)m * 4);
        seq[m] = b->targets[a + m - 1];
        st = twk_sampler_score_prompt(teacher, seq, m + 1, NULL, k, row_ids, row_lps);
        if (st == TWK_OK) {
            memcpy(ids + a * k, row_ids + k, (size_t)m * (size_t)k * 4);
            memcpy(tlp + a * k, row_lps + k, (size_t)m * (size_t)k * 4);
        }
    }
    /* the student's logprobs of those tokens, column by column */
    for (int c = 0; st == TWK_OK && c < k; c++) {
        for (int64_t i = 0; i < n; i++) col[i] = ids[i * k + c];
        twk_batch cb = *b;
        cb.targets = col;
        st = twk_trainer_forward(t, &cb, one, NULL);
        for (int64_t i = 0; st == TWK_OK && i < n; i++) lp[i * k + c] = one[i];
    }
    if (st == TWK_OK) st = twk_loss_distill(kind, n, k, lp, tlp, b->weights, beta, g, loss);
    for (int c = 0; st == TWK_OK && c < k; c++) {
        for (int64_t i = 0; i < n; i++) col[i] = ids[i * k + c], one[i] = g[i * k + c];
        st = backward_weights(t, b, col, one);
    }
    free(off);
    free(ids);
    free(seq);
    free(col);
    free(row_ids);
    free(tlp);
    free(row_lps);
    free(lp);
    free(g);
    free(one);
    return st;
}
