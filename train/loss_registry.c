/* The loss registry: every loss by name, with the inputs it reads (dtype,
 * shape rule, required or not, the value where absent), its config keys with
 * their defaults, and the metrics it reports. Every program that names a loss
 * (the service, `twinkle train`) resolves it here and nowhere else. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "twinkle/train.h"

#define F32 TWK_LOSS_F32
#define I64 TWK_LOSS_I64
#define NONE NAN

/* the inputs of each family: {id, dtype, shape, required, all_or_none, absent} */
#define IN_TARGETS_1D {TWK_IN_TARGET_TOKENS, I64, TWK_SHAPE_TOKENS, 1, 0, 0}
#define IN_MASK {TWK_IN_WEIGHTS, F32, TWK_SHAPE_TOKENS, 0, 0, 1.0f}
#define IN_REF {TWK_IN_REF_LOGPROBS, F32, TWK_SHAPE_TOKENS, 0, 1, NONE}
#define CE_INPUTS                                                                                                        \
    2, {{TWK_IN_TARGET_TOKENS, I64, TWK_SHAPE_TOKENS_OR_K, 1, 0, 0}, {TWK_IN_WEIGHTS, F32, TWK_SHAPE_TOKENS_OR_K, 0, 0, 1.0f}}
#define RL_INPUTS                                                                                                        \
    7, {IN_TARGETS_1D, IN_MASK, {TWK_IN_LOGPROBS, F32, TWK_SHAPE_TOKENS, 1, 0, NONE},                                    \
        {TWK_IN_ADVANTAGES, F32, TWK_SHAPE_TOKENS, 1, 0, NONE}, {TWK_IN_CLIP_LOW, F32, TWK_SHAPE_TOKENS, 0, 0, NONE},    \
        {TWK_IN_CLIP_HIGH, F32, TWK_SHAPE_TOKENS, 0, 0, NONE}, IN_REF}
#define GSPO_INPUTS                                                                                                      \
    8, {IN_TARGETS_1D, IN_MASK, {TWK_IN_LOGPROBS, F32, TWK_SHAPE_TOKENS, 1, 0, NONE},                                    \
        {TWK_IN_ADVANTAGES, F32, TWK_SHAPE_TOKENS, 1, 0, NONE}, {TWK_IN_CLIP_LOW, F32, TWK_SHAPE_TOKENS, 0, 0, NONE},    \
        {TWK_IN_CLIP_HIGH, F32, TWK_SHAPE_TOKENS, 0, 0, NONE}, IN_REF,                                                  \
        {TWK_IN_SEQUENCE_RATIO_MASK, F32, TWK_SHAPE_TOKENS, 0, 0, NONE}}
#define SR_INPUTS                                                                                                        \
    4, {IN_TARGETS_1D, {TWK_IN_LOGPROBS, F32, TWK_SHAPE_TOKENS, 0, 0, NONE},                                           \
        {TWK_IN_ADVANTAGES, F32, TWK_SHAPE_TOKENS, 1, 0, NONE}, {TWK_IN_RECORDED_LOGPROBS, F32, TWK_SHAPE_TOKENS, 0, 0, NONE}}
#define PREF_INPUTS 3, {IN_TARGETS_1D, IN_MASK, IN_REF}
#define DISTILL_INPUTS                                                                                                   \
    3, {{TWK_IN_TARGET_TOKENS, I64, TWK_SHAPE_TOKENS_K, 1, 0, 0}, IN_MASK,                                              \
        {TWK_IN_TEACHER_LOGPROBS, F32, TWK_SHAPE_TOKENS_K, 1, 0, NONE}}

/* config defaults {clip_low, clip_high, beta, max_tokens, kl_beta}; NONE: not taken */
#define RL_CONFIG(lo, hi) {lo, hi, 0.05, 0, 0}
#define CE_METRICS 3, {"loss:sum", "num_tokens:sum", "weight_sum:sum"}
#define RL_METRICS 6, {"loss:sum", "num_tokens:sum", "advantage_tokens:sum", "ratio:mean", "clip_fraction:mean", "kl:mean"}
#define PREF_METRICS 5, {"loss:sum", "num_tokens:sum", "pairs:sum", "margin:mean", "accuracy:mean"}

static const twk_loss_def registry[] = {
    {"cross_entropy", TWK_FAMILY_CE, TWK_LOSS_CROSS_ENTROPY, 0, 1, 0, CE_INPUTS, {NONE, NONE, NONE, NONE, NONE}, CE_METRICS},
    {"importance_sampling", TWK_FAMILY_RL, TWK_LOSS_IMPORTANCE_SAMPLING, TWK_AGG_SUM, 1, 0, RL_INPUTS, RL_CONFIG(0.8, 1.2),
     RL_METRICS},
    {"ppo", TWK_FAMILY_RL, TWK_LOSS_PPO, TWK_AGG_SUM, 1, 0, RL_INPUTS, RL_CONFIG(0.8, 1.2), RL_METRICS},
    {"cispo", TWK_FAMILY_RL, TWK_LOSS_CISPO, TWK_AGG_SUM, 1, 0, RL_INPUTS, RL_CONFIG(0.0, 4.0), RL_METRICS},
    {"dro", TWK_FAMILY_RL, TWK_LOSS_DRO, TWK_AGG_SUM, 1, 0, RL_INPUTS, RL_CONFIG(0.8, 1.2), RL_METRICS},
    {"grpo", TWK_FAMILY_RL, TWK_LOSS_PPO, TWK_AGG_GRPO, 1, 0, RL_INPUTS, RL_CONFIG(0.8, 1.2), RL_METRICS},
    {"dapo", TWK_FAMILY_RL, TWK_LOSS_PPO, TWK_AGG_DAPO, 1, 0, RL_INPUTS, RL_CONFIG(0.8, 1.28), RL_METRICS},
    {"dr_grpo", TWK_FAMILY_RL, TWK_LOSS_PPO, TWK_AGG_DR_GRPO, 1, 0, RL_INPUTS, RL_CONFIG(0.8, 1.2), RL_METRICS},
    {"gspo", TWK_FAMILY_RL, TWK_LOSS_PPO, TWK_AGG_GSPO, 1, 0, GSPO_INPUTS, RL_CONFIG(1 - 3e-4, 1 + 4e-4), RL_METRICS},
    {"stable_reinforce", TWK_FAMILY_RL, TWK_LOSS_STABLE_REINFORCE, TWK_AGG_SUM, 1, 1, SR_INPUTS,
     {NONE, 2.0, NONE, NONE, NONE}, 5, {"loss:sum", "num_tokens:sum", "advantage_tokens:sum", "ratio:mean", "clip_fraction:mean"}},
    {"dpo", TWK_FAMILY_PREF, 0, 0, 2, 0, PREF_INPUTS, {NONE, NONE, 0.1, NONE, NONE}, PREF_METRICS},
    {"ipo", TWK_FAMILY_PREF, 1, 0, 2, 0, PREF_INPUTS, {NONE, NONE, 0.1, NONE, NONE}, PREF_METRICS},
    {"forward_kl", TWK_FAMILY_DISTILL, TWK_DISTILL_FORWARD_KL, 0, 1, 0, DISTILL_INPUTS, {NONE, NONE, 0.5, NONE, NONE},
     CE_METRICS},
    {"reverse_kl", TWK_FAMILY_DISTILL, TWK_DISTILL_REVERSE_KL, 0, 1, 0, DISTILL_INPUTS, {NONE, NONE, 0.5, NONE, NONE},
     CE_METRICS},
    {"jsd", TWK_FAMILY_DISTILL, TWK_DISTILL_JSD, 0, 1, 0, DISTILL_INPUTS, {NONE, NONE, 0.5, NONE, NONE}, CE_METRICS},
};

static const char *const input_keys[TWK_IN_COUNT] = {
    "target_tokens", "weights", "logprobs", "advantages", "clip_low_threshold", "clip_high_threshold", "ref_logprobs",
    "teacher_logprobs", "sequence_ratio_mask", "recorded_logprobs"};
static const char *const config_keys[TWK_CFG_COUNT] = {"clip_low_threshold", "clip_high_threshold", "beta", "max_tokens",
                                                       "kl_beta"};

int twk_loss_count(void) { return (int)(sizeof registry / sizeof registry[0]); }

const twk_loss_def *twk_loss_at(int i) { return i >= 0 && i < twk_loss_count() ? &registry[i] : NULL; }

const twk_loss_def *twk_loss_find(const char *name) {
    for (int i = 0; name && i < twk_loss_count(); i++)
        if (!strcmp(registry[i].name, name)) return &registry[i];
    return NULL;
}

const char *twk_loss_input_key(twk_loss_input_id id) { return id >= 0 && id < TWK_IN_COUNT ? input_keys[id] : "?"; }

const char *twk_loss_config_key(twk_loss_config_id id) { return id >= 0 && id < TWK_CFG_COUNT ? config_keys[id] : "?"; }

const twk_loss_input_def *twk_loss_input_find(const twk_loss_def *d, const char *key) {
    for (int i = 0; d && key && i < d->n_inputs; i++)
        if (!strcmp(input_keys[d->inputs[i].id], key)) return &d->inputs[i];
    return NULL;
}

/* Appends ", name" (or "name" first) to out, truncating safely. */
static void append(char *out, size_t len, const char *name) {
    size_t at = strlen(out);
    if (at < len) snprintf(out + at, len - at, "%s%s", at ? ", " : "", name);
}

void twk_loss_names(char *out, size_t len) {
    if (len) out[0] = 0;
    for (int i = 0; i < twk_loss_count(); i++) append(out, len, registry[i].name);
}

void twk_loss_input_keys(const twk_loss_def *d, char *out, size_t len) {
    if (len) out[0] = 0;
    for (int i = 0; d && i < d->n_inputs; i++) append(out, len, input_keys[d->inputs[i].id]);
}

void twk_loss_config_keys(const twk_loss_def *d, char *out, size_t len) {
    if (len) out[0] = 0;
    for (int i = 0; d && i < TWK_CFG_COUNT; i++)
        if (!isnan(d->config[i])) append(out, len, config_keys[i]);
    if (len && !out[0]) snprintf(out, len, "none");
}

twk_status twk_loss_spec_init(const char *name, twk_loss_spec *out) {
    const twk_loss_def *d = twk_loss_find(name);
    if (!d) {
        char names[512];
        twk_loss_names(names, sizeof names);
        return twk_error(TWK_ERR_INVALID_ARG, "unknown loss '%s' (%s)", name ? name : "(null)", names);
    }
    out->def = d;
    memcpy(out->config, d->config, sizeof out->config);
    return TWK_OK;
}

twk_status twk_loss_spec_set(twk_loss_spec *s, const char *key, double value) {
    int id = -1;
    for (int i = 0; key && i < TWK_CFG_COUNT; i++)
        if (!strcmp(config_keys[i], key)) id = i;
    if (id < 0 || isnan(s->def->config[id])) {
        char keys[256];
        twk_loss_config_keys(s->def, keys, sizeof keys);
        return twk_error(TWK_ERR_INVALID_ARG, "loss_fn_config[%s]: loss '%s' takes no such key (it takes: %s)",
                         key ? key : "(null)", s->def->name, keys);
    }
    if (!isfinite(value)) return twk_error(TWK_ERR_INVALID_ARG, "loss_fn_config[%s] is not finite", key);
    if ((id == TWK_CFG_KL_BETA || id == TWK_CFG_MAX_TOKENS) && value < 0)
        return twk_error(TWK_ERR_INVALID_ARG, "loss_fn_config[%s] = %g must be >= 0", key, value);
    s->config[id] = value;
    return TWK_OK;
}
