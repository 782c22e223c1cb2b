/* One step of `twinkle train`: the packed batch (or one rank's share of it, which RL losses
 * normalise by the whole batch's statistics) becomes a loss batch (its sequences, targets,
 * weights, and the rollouts' advantages and sampler logprobs); for distillation the teacher's top-k at
 * every position become the targets and teacher_logprobs. train/'s
 * twk_loss_step does the rest. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "train_step.h"

/* Sequence start offsets of a packed batch (n_seqs + 1 entries); NULL on OOM. */
static int64_t *seq_offsets(const twk_packed *pk) {
    int64_t *off = malloc((size_t)(pk->n_seqs + 1) * sizeof(int64_t));
    if (!off) return NULL;
    int ns = 0;
    for (int64_t i = 0; i < pk->batch.n; i++)
        if (pk->batch.seg_start[i] == i && ns < pk->n_seqs) off[ns++] = i;
    off[ns] = pk->batch.n;
    return off;
}

void twk_train_shard(const twk_packed *pk, int group, int rank, int size, int *s0, int *s1) {
    int64_t *off = seq_offsets(pk);
    twk_dist_shard(off, pk->n_seqs, group, rank, size, s0, s1); /* off NULL (OOM): every share empty */
    if (!off) *s0 = *s1 = 0;
    free(off);
}

/* The teacher's top-k next tokens and their logprobs at every position:
 * each sequence is scored with its last target appended, so row j + 1 of
 * the scores predicts target j. ids and tlp: n x k. */
static twk_status teacher_topk(twk_sampler *teacher, const twk_loss_batch *lb, int k, int32_t *ids, float *tlp) {
    const int64_t *off = lb->offsets;
    int64_t longest = 0;
    for (int s = 0; s < lb->n_seqs; s++) longest = off[s + 1] - off[s] > longest ? off[s + 1] - off[s] : longest;
    int32_t *seq = malloc((size_t)(longest + 1) * sizeof(int32_t)), *row_ids = malloc((size_t)(longest + 1) * (size_t)k * sizeof(int32_t));
    float *row_lps = malloc((size_t)(longest + 1) * (size_t)k * sizeof(float));
    twk_status st = seq && row_ids && row_lps ? TWK_OK : twk_error(TWK_ERR_OOM, "distill: out of memory");
    for (int s = 0; st == TWK_OK && s < lb->n_seqs; s++) {
        int64_t a = off[s], m = off[s + 1] - a;
        memcpy(seq, lb->tokens + a, (size_t)m * sizeof(int32_t));
        seq[m] = lb->targets[a + m - 1];
        st = twk_sampler_score_prompt(teacher, seq, m + 1, NULL, k, row_ids, row_lps);
        if (st == TWK_OK) {
            memcpy(ids + a * k, row_ids + k, (size_t)m * (size_t)k * sizeof(int32_t));
            memcpy(tlp + a * k, row_lps + k, (size_t)m * (size_t)k * sizeof(float));
        }
    }
    free(seq);
    free(row_ids);
    free(row_lps);
    return st;
}

/* p + a, or NULL when p is. */
static const float *at(const float *p, int64_t a) { return p ? p + a : NULL; }

twk_status twk_train_step(twk_trainer *t, const twk_loss_spec *spec, const twk_packed *pk, int s0, int s1,
                          twk_sampler *teacher, int k, int backward, twk_loss_result *res) {
    const twk_batch *b = &pk->batch;
    int distill = spec->def->family == TWK_FAMILY_DISTILL;
    int64_t *off = seq_offsets(pk);
    twk_status st = off ? TWK_OK : twk_error(TWK_ERR_OOM, "train step: out of memory");
    int64_t a = off ? off[s0] : 0, n = off ? off[s1] - a : 0;
    /* a share of the batch (data-parallel ranks): RL losses normalise by the whole batch's statistics */
    twk_loss_whole whole;
    int share = s1 - s0 < pk->n_seqs;
    if (st == TWK_OK && share) {
        twk_loss_batch all = {pk->n_seqs, off, b->tokens, 0, b->targets, {0}, NULL};
        all.in[TWK_IN_WEIGHTS] = b->weights;
        all.in[TWK_IN_ADVANTAGES] = pk->advantages;
        all.in[TWK_IN_LOGPROBS] = pk->sampler_logprobs;
        st = twk_loss_whole_of(&all, 0, pk->n_seqs, &whole);
    }
    for (int s = s0; off && s <= s1; s++) off[s - s0] = off[s] - a; /* the share's own offsets */
    int32_t *ids = distill ? malloc((size_t)(n ? n : 1) * (size_t)k * sizeof(int32_t)) : NULL;
    float *tlp = distill ? malloc((size_t)(n ? n : 1) * (size_t)k * sizeof(float)) : NULL;
    if (st == TWK_OK && distill && !(ids && tlp && teacher)) st = twk_error(TWK_ERR_OOM, "train step: out of memory");
    twk_loss_batch lb = {s1 - s0, off, b->tokens + a, 0, b->targets + a, {0}, share ? &whole : NULL};
    lb.in[TWK_IN_WEIGHTS] = at(b->weights, a);
    lb.in[TWK_IN_ADVANTAGES] = at(pk->advantages, a);
    lb.in[TWK_IN_LOGPROBS] = at(pk->sampler_logprobs, a); /* NaN where a line had none: on-policy */
    if (st == TWK_OK && distill) {
        st = teacher_topk(teacher, &lb, k, ids, tlp);
        lb.k = k;
        lb.targets = ids;
        lb.in[TWK_IN_TEACHER_LOGPROBS] = tlp;
    }
    if (st == TWK_OK) st = twk_loss_step(t, spec, &lb, backward, NULL, res);
    free(off);
    free(ids);
    free(tlp);
    return st;
}
