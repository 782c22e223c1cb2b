/* twinkle — losses as functions of per-token logprobs: Tinker's built-in
 * losses, the RL family, preference (DPO / IPO) and distillation losses.
 *
 * Thread-safety: every function here is pure (inputs to outputs) and may be
 * called from any thread. */
#ifndef TWINKLE_LOSSES_H
#define TWINKLE_LOSSES_H

#include <stddef.h>
#include <stdint.h>

#include "twinkle/export.h"
#include "twinkle/status.h"

#ifdef __cplusplus
extern "C" {
#endif
TWK_API_BEGIN

/* ---- Tinker's built-in losses, as functions of the per-token logprobs ---- */

typedef enum twk_loss_kind {
    TWK_LOSS_CROSS_ENTROPY = 0, /* -w p */
    TWK_LOSS_IMPORTANCE_SAMPLING, /* -exp(p - q) A */
    TWK_LOSS_PPO,               /* -min(r A, clip(r, lo, hi) A), r = exp(p - q); defaults 0.8 / 1.2 */
    TWK_LOSS_CISPO,             /* -sg(clip(r, lo, hi)) p A; defaults 0.0 / 4.0 */
    TWK_LOSS_DRO                /* -(p A - beta/2 (p - q)^2) */
} twk_loss_kind;

typedef struct twk_loss_stats {
    double loss;          /* the sum over tokens */
    double ratio_mean;    /* mean of exp(p - q) (RL losses) */
    double clip_fraction; /* tokens whose ratio was clipped (ppo, cispo) */
    double kl_mean;       /* mean k3 estimate of KL to the reference (twk_loss_rl with kl_beta) */
} twk_loss_stats;

/* The kind named `name` ("ppo", ...), or -1. */
int twk_loss_kind_from_name(const char *name);
/* Loss and dL/dp for n tokens. p: the model's logprobs; q: the sampler's;
 * adv: advantages; w: cross-entropy weights (NULL = 1); clip_lo / clip_hi:
 * per-token bounds or NULL for the defaults; beta for dro. Training uses
 * weights -dL/dp in a cross-entropy pass, which has the same gradient.
 * TWK_ERR_INVALID_ARG names a missing input; TWK_ERR_RANGE a non-finite gradient. */
twk_status twk_loss_eval(twk_loss_kind kind, int64_t n, const float *p, const float *q, const float *adv,
                         const float *w, const float *clip_lo, const float *clip_hi, double beta, float *dldp,
                         twk_loss_stats *out);

/* GSPO (sequence-level importance ratio): per sequence i over its masked
 * tokens (w != 0, NULL = all), s_i = exp(mean_t (p - q)), A_i = the mean
 * advantage over those tokens; L = (1/N) sum_i -min(s_i A_i, clip(s_i, lo, hi) A_i).
 * dldp gets dL/dp per token (0 where masked or clipped). Stats: loss, the mean
 * s_i and the fraction of sequences clipped. TWK_ERR_INVALID_ARG for bounds
 * with lo > hi; TWK_ERR_RANGE for a non-finite ratio. */
twk_status twk_loss_gspo(int n_seqs, const int64_t *offsets, const float *p, const float *q, const float *adv,
                         const float *w, double lo, double hi, float *dldp, twk_loss_stats *out);

/* Adds the k3 estimate of KL(policy || reference) per token, c_t (exp(r - p) - (r - p) - 1),
 * to *loss and its derivative to dldp, with per-token coefficients c (0 = not counted).
 * *kl_mean gets the mean estimate over counted tokens. TWK_ERR_RANGE if not finite. */
twk_status twk_loss_add_kl(int64_t n, const float *p, const float *ref, const float *c, float *dldp, double *loss,
                           double *kl_mean);

/* How an RL loss sums over tokens: plain sum (Tinker's losses); GRPO: each
 * sequence's token mean, then the mean over sequences; DAPO: the mean over all
 * tokens; Dr. GRPO: token sums / max_tokens, then the mean over sequences;
 * GSPO: one ratio per sequence (twk_loss_gspo). */
typedef enum twk_rl_aggregation { TWK_AGG_SUM, TWK_AGG_GRPO, TWK_AGG_DAPO, TWK_AGG_DR_GRPO, TWK_AGG_GSPO } twk_rl_aggregation;

typedef struct twk_rl_spec {
    twk_loss_kind kind;          /* the per-token surrogate (ppo for the GRPO family) */
    twk_rl_aggregation aggregation;
    double clip_lo, clip_hi;     /* where no per-token bound is given */
    double beta;                 /* dro */
    double max_tokens;           /* dr_grpo; <= 0: the longest sequence's masked tokens */
    double kl_beta;              /* > 0: + kl_beta * KL(policy || reference), k3, with the loss's token weighting */
} twk_rl_spec;

/* The spec of an RL loss by name with its defaults (clip bounds 0.8 / 1.2;
 * cispo 0 / 4; dapo 0.8 / 1.28; gspo 1 - 3e-4 / 1 + 4e-4); TWK_ERR_INVALID_ARG
 * listing the names otherwise. */
twk_status twk_rl_spec_from_name(const char *name, twk_rl_spec *out);
/* Per-token coefficients of the aggregation (0 where mask is 0; mask NULL = all). */
twk_status twk_rl_token_coefficients(twk_rl_aggregation agg, int n_seqs, const int64_t *offsets, const float *mask,
                                     double max_tokens, float *c);
/* An RL loss over n_seqs sequences (offsets: n_seqs + 1 token offsets): p the
 * model's logprobs, q the sampler's, adv advantages, mask (NULL = all) which
 * tokens count for the aggregations, lo / hi per-token clip bounds (NULL or NaN:
 * the spec's), ref the reference logprobs (needed when kl_beta > 0). dldp gets
 * dL/dp. Errors: TWK_ERR_INVALID_ARG (a missing input), TWK_ERR_RANGE (not finite). */
twk_status twk_loss_rl(const twk_rl_spec *spec, int n_seqs, const int64_t *offsets, const float *p, const float *q,
                       const float *adv, const float *mask, const float *lo, const float *hi, const float *ref,
                       float *dldp, twk_loss_stats *out);

/* Preference losses over pairs of sequences (2i chosen, 2i+1 rejected):
 * h_i = sum_c w (p - ref) - sum_r w (p - ref) over each pair's tokens;
 * sigmoid DPO: L = sum -log sigmoid(beta h); IPO: L = sum (h - 1/(2 beta))^2.
 * offsets: n_seqs + 1 token offsets. dldp gets dL/dp per token. */
typedef struct twk_dpo_stats {
    double loss;
    double margin_mean;   /* mean h */
    double accuracy;      /* fraction of pairs with h > 0 */
} twk_dpo_stats;
twk_status twk_loss_dpo(int n_seqs, const int64_t *offsets, const float *p, const float *ref, const float *w, double beta,
                        int ipo, float *dldp, twk_dpo_stats *out);

/* Distillation against a teacher's top-K: per token, student logprobs p and
 * teacher logprobs t of the same K tokens, both renormalized over those K;
 * forward KL(teacher || student), reverse KL(student || teacher), or the
 * generalized JSD beta KL(t || m) + (1 - beta) KL(s || m), m = beta t + (1 - beta) s.
 * w: per-token weights (NULL = 1). dldp gets n x K. TWK_ERR_INVALID_ARG for
 * K outside 1..64 or a jsd beta outside (0, 1). */
typedef enum twk_distill_kind { TWK_DISTILL_FORWARD_KL, TWK_DISTILL_REVERSE_KL, TWK_DISTILL_JSD } twk_distill_kind;
twk_status twk_loss_distill(twk_distill_kind kind, int64_t n, int K, const float *p, const float *t, const float *w,
                            double beta, float *dldp, double *loss);

TWK_API_END
#ifdef __cplusplus
}
#endif
#endif
