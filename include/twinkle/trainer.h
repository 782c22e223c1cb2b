/* twinkle — training a model: LoRA or full-parameter trainers, adapters in
 * PEFT's layout, training state, AdamW.
 *
 * Thread-safety: a twk_trainer belongs to one thread at a time, and trainers
 * and samplers over one model (one device) must not be used concurrently. */
#ifndef TWINKLE_TRAINER_H
#define TWINKLE_TRAINER_H

#include <stdbool.h>
#include <stdint.h>

#include "twinkle/data.h"
#include "twinkle/export.h"
#include "twinkle/model.h"

#ifdef __cplusplus
extern "C" {
#endif
TWK_API_BEGIN

typedef struct twk_lora_config {
    int rank;           /* r */
    float alpha;        /* scale = alpha / rank; default alpha = 32 (Tinker's) */
    bool train_attn;    /* q, k, v, o */
    bool train_mlp;     /* gate, up, down */
    bool train_unembed; /* lm_head */
    uint64_t seed;
} twk_lora_config;

/* The default: rank 32, alpha 32, attention + MLP, no unembedding, seed 0. */
twk_lora_config twk_lora_default(void);

/* A model with an optional LoRA adapter (rank 0 = full fine-tuning), compiled
 * for a token capacity. Gradients accumulate over forward_backward calls. */
typedef struct twk_trainer twk_trainer;

/* lora == NULL: full-parameter training (every base weight trainable). */
twk_status twk_trainer_new(twk_model *m, const twk_lora_config *lora, int64_t capacity, twk_trainer **out);
/* How a trainer's plans are built. */
typedef struct twk_trainer_opts {
    bool recompute; /* per-layer activation recompute: each layer's activations are computed
                       again in the backward (twk_graph_recompute); bit-identical gradients */
    bool logits;    /* keep the [T, V] logits path (matmul + logprobs) where the fused
                       unembedding (twk_unembed_logprobs: token tiles, no logits) would run:
                       LoRA without lm_head on a backend with the op; identical results */
    twk_buffer *arena; /* a caller's device buffer both plans run in when it holds their peak
                          (trainers used one at a time, from one thread, may share one;
                          twk_mem_plan gives the size); NULL: the trainer's own */
} twk_trainer_opts;
/* twk_trainer_new with options (NULL: the defaults, all off). */
twk_status twk_trainer_new_opts(twk_model *m, const twk_lora_config *lora, int64_t capacity,
                                const twk_trainer_opts *o, twk_trainer **out);
void twk_trainer_free(twk_trainer *t);
/* Forward only: per-token logprobs (n floats) and the loss; NULL outputs skipped. */
twk_status twk_trainer_forward(twk_trainer *t, const twk_batch *b, float *logprobs, float *loss);
/* Forward with the adapter turned off (the base model: reference logprobs
 * for DPO); the adapter is unchanged afterwards. TWK_ERR_INVALID_ARG
 * without an adapter. */
twk_status twk_trainer_forward_base(twk_trainer *t, const twk_batch *b, float *logprobs, float *loss);
/* Forward and backward; gradients are added to the accumulated ones. */
twk_status twk_trainer_forward_backward(twk_trainer *t, const twk_batch *b, float *logprobs, float *loss);
/* Number of trainable tensors and the i-th one's name (PEFT names for LoRA,
 * Hugging Face names for full training) and element count. */
int twk_trainer_param_count(const twk_trainer *t);
const char *twk_trainer_param_name(const twk_trainer *t, int i, int64_t *nelem);
/* Copies a trainable tensor's value or accumulated gradient (by name) to/from
 * the host; TWK_ERR_NOT_FOUND / TWK_ERR_INVALID_ARG name the problem. */
twk_status twk_trainer_get(twk_trainer *t, const char *name, float *dst, int64_t nelem);
twk_status twk_trainer_set(twk_trainer *t, const char *name, const float *src, int64_t nelem);
twk_status twk_trainer_get_grad(twk_trainer *t, const char *name, float *dst, int64_t nelem);
void twk_trainer_zero_grad(twk_trainer *t);
/* The i-th trainable tensor's accumulated gradient on the host, writable in
 * place (e.g. to sum it across data-parallel ranks before the optimizer step);
 * valid until the trainer is freed. NULL (and *nelem 0) for a bad index or a
 * sampler, which has no gradients. */
float *twk_trainer_grad_data(twk_trainer *t, int i, int64_t *nelem);

/* The adapter's configuration, or NULL for full-parameter training. */
const twk_lora_config *twk_trainer_lora(const twk_trainer *t);
const twk_model *twk_trainer_model(const twk_trainer *t);

/* Writes the LoRA adapter in PEFT's layout into folder `dir` (created if
 * missing): adapter_config.json + adapter_model.safetensors, atomically, so
 * peft.PeftModel.from_pretrained loads it. `base_model` names the base for
 * adapter_config.json (may be NULL). */
twk_status twk_adapter_save(twk_trainer *t, const char *dir, const char *base_model);
/* Reads a PEFT adapter folder's adapter_config.json into lc: r, lora_alpha,
 * and which module groups target_modules names (seed untouched). Errors name
 * the file and field. */
twk_status twk_adapter_read_config(const char *dir, twk_lora_config *lc);
/* Merges the PEFT adapter folder into the base model folder: writes out_dir (created if missing)
 * with model.safetensors holding W + (lora_alpha / r) * B @ A for every adapted weight, in the
 * base's dtype (f32 / f16 / bf16; the sum is computed in double), and the base folder's other
 * files (config.json, generation_config.json, tokenizer files) copied. An adapted lm_head on tied
 * embeddings becomes its own lm_head.weight (config.json: tie_word_embeddings false). Errors
 * name the file or tensor: a LoRA pair that matches no base weight, shapes that disagree,
 * DoRA / rsLoRA. */
twk_status twk_adapter_merge(const char *base_dir, const char *adapter_dir, const char *out_dir);
/* Loads a PEFT adapter folder into the trainer's adapter. Its r and
 * lora_alpha must equal the trainer's and every tensor must match a module
 * the trainer adapts (errors name the field or tensor). */
twk_status twk_adapter_load(twk_trainer *t, const char *dir);

/* Saves the training state into folder `dir`: the adapter in PEFT's layout
 * (or, for full training, model.safetensors with every trained weight) and
 * optimizer_state.safetensors (AdamW moments and step). Files are atomic. */
twk_status twk_trainer_save_state(twk_trainer *t, const char *dir, const char *base_model);
/* Loads what twk_trainer_save_state wrote: the weights, and the optimizer's
 * moments and step when with_optimizer (else the optimizer restarts). */
twk_status twk_trainer_load_state(twk_trainer *t, const char *dir, bool with_optimizer);
/* Optimizer steps taken (restored by load_state with the optimizer). */
int64_t twk_trainer_step(const twk_trainer *t);
/* The most tokens one pass of the trainer holds (its compiled capacity). */
int64_t twk_trainer_capacity(const twk_trainer *t);

/* AdamW, configured like Tinker's AdamParams. */
typedef struct twk_adam_params {
    float learning_rate, beta1, beta2, eps, weight_decay;
    float grad_clip_norm; /* > 0: clip the global gradient norm to this first */
} twk_adam_params;

/* Tinker's defaults: lr 1e-4, betas 0.9 / 0.95, eps 1e-12, no decay, no clipping. */
twk_adam_params twk_adam_default(void);

/* One AdamW step over every trainable tensor, equal to torch.optim.AdamW
 * (bias correction, decoupled weight decay) after
 * torch.nn.utils.clip_grad_norm_ when grad_clip_norm > 0; then zeroes the
 * accumulated gradients. *grad_norm (may be NULL) gets the pre-clip norm.
 * TWK_ERR_INVALID_ARG names a bad hyper-parameter; TWK_ERR_RANGE a non-finite
 * gradient (nothing is updated then). */
twk_status twk_trainer_optim_step(twk_trainer *t, const twk_adam_params *p, float *grad_norm);

TWK_API_END
#ifdef __cplusplus
}
#endif
#endif
