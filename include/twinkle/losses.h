/* twinkle — losses: the registry of every loss a trainer can be trained with
 * (name, inputs, config keys, metrics), the one entry point that runs a loss
 * step on a trainer, and the host formulas behind it. A new loss is one
 * registry entry (train/loss_registry.c) plus its formula. */
#ifndef TWINKLE_LOSSES_H
#define TWINKLE_LOSSES_H

#include <stddef.h>
#include <stdint.h>

#include "twinkle/export.h"
#include "twinkle/status.h"

/* Thread-safety: the registry is read-only and the host formulas are pure (any thread);
 * twk_loss_step uses its trainer, so one trainer takes one step at a time. */

#ifdef __cplusplus
extern "C" {
#endif
TWK_API_BEGIN

typedef struct twk_trainer twk_trainer;

/* ---- the registry ---- */

/* Every per-token input a loss may read, by id; the registry names them. */
typedef enum twk_loss_input_id {
    TWK_IN_TARGET_TOKENS,    /* int64: the next tokens ([N], or [N, K]: top-K targets) */
    TWK_IN_WEIGHTS,          /* float32: cross-entropy weights, or the token mask of the other losses */
    TWK_IN_LOGPROBS,         /* float32: the sampler's logprobs of the targets */
    TWK_IN_ADVANTAGES,       /* float32 */
    TWK_IN_CLIP_LOW,         /* float32: per-token clip bounds (ppo, cispo, ...) */
    TWK_IN_CLIP_HIGH,
    TWK_IN_REF_LOGPROBS,     /* float32: the reference's logprobs (dpo, the KL penalty) */
    TWK_IN_TEACHER_LOGPROBS, /* float32 [N, K]: the teacher's logprobs of the K targets */
    TWK_IN_SEQUENCE_RATIO_MASK, /* float32: GSPO, the tokens of the sequence ratio (else weights decide) */
    TWK_IN_RECORDED_LOGPROBS,   /* float32: stable_reinforce, the sampler's logprobs recorded at sampling time
                                   (NaN off the sampled tokens); filled by the service from the datum's
                                   provenance, never sent by a user */
    TWK_IN_COUNT
} twk_loss_input_id;

/* The shape rule of an input, for a datum of N tokens. */
typedef enum twk_loss_shape {
    TWK_SHAPE_TOKENS,       /* [N] */
    TWK_SHAPE_TOKENS_K,     /* [N, K], K = target_tokens' second dimension, 1 <= K <= 64 */
    TWK_SHAPE_TOKENS_OR_K   /* [N] or [N, K]: the same rank as target_tokens (one K per request) */
} twk_loss_shape;

typedef enum twk_loss_dtype { TWK_LOSS_F32, TWK_LOSS_I64 } twk_loss_dtype;

typedef struct twk_loss_input_def {
    twk_loss_input_id id;
    twk_loss_dtype dtype;
    twk_loss_shape shape;
    int required;     /* every datum gives it */
    int all_or_none;  /* every datum or none (ref_logprobs: none = the base model's) */
    float absent;     /* the value of each token of a datum without it; NaN: the loss's default */
} twk_loss_input_def;

/* How a loss runs: a cross-entropy pass, or a forward, the loss and dL/dp on
 * the host (twk_loss_rl / twk_loss_dpo / twk_loss_distill), then a
 * cross-entropy backward with weights -dL/dp. */
typedef enum twk_loss_family { TWK_FAMILY_CE, TWK_FAMILY_RL, TWK_FAMILY_PREF, TWK_FAMILY_DISTILL } twk_loss_family;

/* Numeric loss_fn_config keys. */
typedef enum twk_loss_config_id {
    TWK_CFG_CLIP_LOW,   /* clip_low_threshold */
    TWK_CFG_CLIP_HIGH,  /* clip_high_threshold */
    TWK_CFG_BETA,       /* beta: dro's penalty, dpo's temperature, jsd's mixture */
    TWK_CFG_MAX_TOKENS, /* max_tokens: dr_grpo's normaliser (0: the longest sequence) */
    TWK_CFG_KL_BETA,    /* kl_beta: + kl_beta * KL(policy || reference) (>= 0) */
    TWK_CFG_COUNT
} twk_loss_config_id;

#define TWK_LOSS_MAX_INPUTS 8
#define TWK_LOSS_MAX_METRICS 8
/* The metric a step appends after its loss's own when the model has the router's load-balancing loss
 * (a mixture of experts whose config.json sets output_router_logits): its mean over the step's passes. */
#define TWK_METRIC_ROUTER_AUX "router_aux_loss:mean"

typedef struct twk_loss_def {
    const char *name;
    twk_loss_family family;
    int variant;        /* RL: twk_loss_kind; preference: 1 = ipo; distillation: twk_distill_kind */
    int aggregation;    /* RL: twk_rl_aggregation */
    int group;          /* datums per group: 2 for preference pairs, else 1 */
    int provenance;     /* 1: every datum names the sampled sequences behind its targets (loss_fn_input_spans) */
    int n_inputs;
    twk_loss_input_def inputs[TWK_LOSS_MAX_INPUTS];
    double config[TWK_CFG_COUNT]; /* defaults; NaN: the loss takes no such key */
    int n_metrics;      /* reported in this order; kl:mean only with kl_beta > 0 (TWK_METRIC_ROUTER_AUX may follow) */
    const char *metrics[TWK_LOSS_MAX_METRICS];
} twk_loss_def;

/* The registry: twk_loss_count() entries. */
int twk_loss_count(void);
const twk_loss_def *twk_loss_at(int i);
/* The loss named `name`, or NULL. */
const twk_loss_def *twk_loss_find(const char *name);
/* The wire key of an input ("target_tokens", ...) and of a config entry. */
const char *twk_loss_input_key(twk_loss_input_id id);
const char *twk_loss_config_key(twk_loss_config_id id);
/* The loss's definition of the input named `key`, or NULL when the loss does not read it. */
const twk_loss_input_def *twk_loss_input_find(const twk_loss_def *d, const char *key);
/* "a, b, c": every loss name, or the input keys / config keys of loss d. */
void twk_loss_names(char *out, size_t len);
void twk_loss_input_keys(const twk_loss_def *d, char *out, size_t len);
void twk_loss_config_keys(const twk_loss_def *d, char *out, size_t len);

/* A loss with its configuration. */
typedef struct twk_loss_spec {
    const twk_loss_def *def;
    double config[TWK_CFG_COUNT]; /* the defaults, overridden by twk_loss_spec_set */
} twk_loss_spec;

/* The spec of the loss `name` with its defaults. TWK_ERR_INVALID_ARG
 * ("unknown loss 'x' (names...)") when there is no such loss. */
twk_status twk_loss_spec_init(const char *name, twk_loss_spec *out);
/* Sets config `key`. TWK_ERR_INVALID_ARG naming the key when the loss takes
 * no such key (listing those it takes) or the value is out of range. */
twk_status twk_loss_spec_set(twk_loss_spec *s, const char *key, double value);

/* ---- the step ---- */

/* What the RL losses' aggregations normalise by, over a whole batch: data-parallel ranks each
 * run a share of its sequences (the multi-rank service) and normalise by the whole's numbers, so
 * the shares' losses and gradients add up to the whole batch's. */
typedef struct twk_loss_whole {
    int64_t n_seqs;       /* sequences (GRPO, Dr. GRPO, GSPO) */
    double masked_tokens; /* tokens whose mask is not 0 (DAPO; the KL term's counted tokens) */
    double longest;       /* the most masked tokens of one sequence (Dr. GRPO without max_tokens) */
} twk_loss_whole;

/* n_seqs sequences laid end to end (offsets: n_seqs + 1 token offsets, N =
 * offsets[n_seqs]); k = 0: targets [N], k >= 1: top-K targets [N, k]. in[id]:
 * the input, dense over all tokens ([N] or [N, k] by the registry's shape),
 * or NULL where no sequence gives it. A missing optional input takes the
 * registry's `absent` value. whole: NULL when the batch is the whole batch;
 * else it is a share of one whose statistics these are (twk_loss_whole_of),
 * and RL losses normalise by them (the other families are sums: ignored). */
typedef struct twk_loss_batch {
    int n_seqs;
    const int64_t *offsets;
    const int32_t *tokens;
    int k;
    const int32_t *targets;
    const float *in[TWK_IN_COUNT];
    const twk_loss_whole *whole;
} twk_loss_batch;

/* The statistics of sequences [s0, s1) of b as an RL loss masks them (the sequence_ratio_mask
 * where given and not NaN, else the weights, else 1). TWK_ERR_INVALID_ARG for a bad range. */
twk_status twk_loss_whole_of(const twk_loss_batch *b, int s0, int s1, twk_loss_whole *out);

typedef struct twk_loss_result {
    double loss;                          /* the loss (a sum, Tinker's convention) */
    double mean;                          /* the loss per weighted token / per pair / per token, for display */
    int n_metrics;
    const char *keys[TWK_LOSS_MAX_METRICS]; /* "loss:sum", ... (the registry's) */
    double values[TWK_LOSS_MAX_METRICS];
} twk_loss_result;

/* One step of loss `spec` on batch b: passes of whole sequences up to the
 * trainer's capacity; with backward, the loss's gradient is added to the
 * trainer's accumulated gradients. logprobs (N x max(k, 1) floats, or NULL)
 * gets the model's logprobs of the targets. TWK_ERR_INVALID_ARG /
 * TWK_ERR_RANGE for inputs the loss cannot use (naming them); other codes
 * from the trainer. */
twk_status twk_loss_step(twk_trainer *t, const twk_loss_spec *spec, const twk_loss_batch *b, int backward,
                         float *logprobs, twk_loss_result *res);

/* The steps of several LoRA trainers of one model at once (twk_loss_step's
 * arguments per job, and its results). */
typedef struct twk_pack twk_pack;
typedef struct twk_loss_job {
    twk_trainer *t;
    const twk_loss_spec *spec;
    const twk_loss_batch *b;
    int backward;
    float *logprobs;     /* N x max(k, 1) floats, or NULL */
    twk_loss_result res; /* out */
    twk_status st;       /* out: the job's own status */
    char err[512];       /* out: its error text when st != TWK_OK */
} twk_loss_job;
/* Runs each job's step exactly as twk_loss_step does, but with the passes of
 * all jobs packed into shared passes of `pack` (twk_pack_pass: one base GEMM
 * over every job's tokens, each trainer through its own adapter): forward
 * passes with forward passes, backward with backward, as many jobs per pass
 * as the pack holds. Trainers must be distinct LoRA trainers of the pack's
 * model. A job's results do not depend on the other jobs (bit-identical on the
 * CPU to the job alone through the pack). Returns TWK_OK when the jobs ran
 * (each job's st says whether it succeeded); TWK_ERR_INVALID_ARG / TWK_ERR_OOM
 * when none could. */
twk_status twk_loss_steps(twk_pack *pack, twk_loss_job *jobs, int n);

/* ---- the formulas: loss and dL/dp on the host, from per-token logprobs ---- */

typedef enum twk_loss_kind {
    TWK_LOSS_CROSS_ENTROPY = 0, /* -w p */
    TWK_LOSS_IMPORTANCE_SAMPLING, /* -exp(p - q) A */
    TWK_LOSS_PPO,               /* -min(r A, clip(r, lo, hi) A), r = exp(p - q); defaults 0.8 / 1.2 */
    TWK_LOSS_CISPO,             /* -sg(clip(r, lo, hi)) p A; defaults 0.0 / 4.0 */
    TWK_LOSS_DRO,               /* -(p A - beta/2 (p - q)^2) */
    TWK_LOSS_STABLE_REINFORCE   /* -sg(min(r, hi)) p A: REINFORCE with a truncated importance weight; default hi 2 */
} twk_loss_kind;

typedef struct twk_loss_stats {
    double loss;          /* the sum over tokens */
    double ratio_mean;    /* mean of exp(p - q) (RL losses) */
    double clip_fraction; /* tokens whose ratio was clipped (ppo, cispo) */
    double kl_mean;       /* mean k3 estimate of KL to the reference (twk_loss_rl with kl_beta) */
} twk_loss_stats;

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
/* The same for a share of n_seqs sequences of a batch of whole_seqs: the loss and dL/dp divided by
 * whole_seqs (the shares' add up to the whole's), the stats over the share's own sequences.
 * TWK_ERR_INVALID_ARG also for whole_seqs < n_seqs. */
twk_status twk_loss_gspo_share(int n_seqs, int64_t whole_seqs, const int64_t *offsets, const float *p, const float *q,
                               const float *adv, const float *w, double lo, double hi, float *dldp, twk_loss_stats *out);

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
    const twk_loss_whole *whole; /* NULL: the sequences are the whole batch; else a share of this one */
} twk_rl_spec;

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
