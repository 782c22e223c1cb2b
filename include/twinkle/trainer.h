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
    /* Mixture of experts (PEFT's target_parameters): the routed experts' fused gate_up_proj /
     * down_proj stacks, and the router (mlp.gate). train_mlp covers the dense MLPs and Qwen2-MoE's
     * shared expert. Neither in adapter slots (packed trainers, slot samplers). */
    bool train_experts;
    bool train_router;
} twk_lora_config;

/* The default: rank 32, alpha 32, attention + MLP, no unembedding, no experts or router, seed 0. */
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
    bool unembed_recompute; /* where the fused unembedding runs: the one that recomputes its logits in
                               the backward (twk_unembed_logprobs, three products over the vocabulary)
                               instead of the two-product one (twk_unembed_logprobs_dir, the default on a
                               backend with that op); logprobs the same to a few ulps */
    twk_buffer *arena; /* a caller's device buffer both plans run in when it holds their peak
                          (trainers used one at a time, from one thread, may share one;
                          twk_mem_plan gives the size); NULL: the trainer's own */
    bool early_grads; /* accumulate each gradient as soon as the backward made it (twk_graph_hoist)
                         instead of at its end, so an armed gradient hook hands gradients over
                         while the backward runs (twk_trainer_grad_hook_arm); identical results */
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
/* Forward and backward; gradients are added to the accumulated ones (on the device: only the
 * batch goes up, and the logprobs and loss asked for come down). */
twk_status twk_trainer_forward_backward(twk_trainer *t, const twk_batch *b, float *logprobs, float *loss);
/* A mixture-of-experts model whose config sets output_router_logits: every forward and
 * forward+backward pass also computes transformers' load_balancing_loss_func over the pass's
 * tokens (all sparse layers), and the backward differentiates loss + router_aux_loss_coef * it
 * (the loss the outputs above give stays -sum(weights * logprobs)). Returns the mean of that
 * value over the passes since the last reset (reset: start again); NAN when there were none or
 * the trainer has no such loss (other models; samplers; packed multi-run trainers). */
double twk_trainer_router_aux_loss(twk_trainer *t, bool reset);
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
 * place (e.g. to sum it across data-parallel ranks before the optimizer step):
 * the first call after a pass downloads every gradient into one host copy,
 * which is then the gradient until the next pass or optimizer step uploads it
 * back. The pointer stays valid until the trainer is freed. NULL (and *nelem 0)
 * for a bad index, a sampler (which has no gradients) or a failed download. */
float *twk_trainer_grad_data(twk_trainer *t, int i, int64_t *nelem);

/* Gradients as they become final during the backward pass that ends a step (data-parallel
 * training overlaps their sum with the rest of that pass: dist/). Groups are ranges of
 * trainable tensors [first[g], last[g]] (they may share an end tensor). */
typedef struct twk_grad_hook {
    int n_groups;
    const int *first, *last;
    /* Called on the pass's thread between its segments when every tensor of group g has its
     * gradient for the step; those gradients are then in twk_trainer_grad_data's host copy. Must
     * return quickly (the pass waits); an error stops the pass. */
    twk_status (*ready)(void *ctx, int g);
    void *ctx;
} twk_grad_hook;
/* Arms h (copied; the arrays must stay valid until twk_trainer_grad_hook_finish) for the last
 * backward pass of the next twk_loss_step with backward: that pass runs in segments
 * (twk_plan_run_cut), cut after the launch that completes each group, and h->ready is called for
 * the groups in the order they become final — a property of the compiled plan, the same on every
 * rank of a data-parallel job; order (h->n_groups ints, may be NULL) gets that order. Passes
 * before the last one run as usual. TWK_ERR_INVALID_ARG for bad groups, TWK_ERR_STATE when the
 * trainer has no gradients or a hook is armed, TWK_ERR_OOM. */
twk_status twk_trainer_grad_hook_arm(twk_trainer *t, const twk_grad_hook *h, int *order);
/* Disarms the hook after the step's passes, whether they ran or not: the gradients that did not
 * come to the host copy during the pass come now, tensor by tensor (a tensor that came is never
 * overwritten), and the host copy is the gradient as after twk_trainer_grad_data. Returns how
 * many groups were handed to ready (a prefix of the order) in *n_ready (may be NULL); download
 * errors. */
twk_status twk_trainer_grad_hook_finish(twk_trainer *t, int *n_ready);
/* The i-th tensor's place in the host copy of the gradients, without downloading anything: it
 * holds the gradient where twk_trainer_grad_data or an armed hook (ready) put it. NULL before
 * the copy exists (twk_trainer_grad_hook_arm makes it), for a bad index or a sampler. */
float *twk_trainer_grad_host(twk_trainer *t, int i, int64_t *nelem);

/* The adapter's configuration, or NULL for full-parameter training. */
const twk_lora_config *twk_trainer_lora(const twk_trainer *t);
const twk_model *twk_trainer_model(const twk_trainer *t);

/* ---- packed multi-LoRA passes: several LoRA trainers on one model in one pass ---- */

/* A pack runs the forward (or forward and backward) of several LoRA trainers
 * of one model as one pass: one base GEMM over all their tokens, each
 * trainer's segment through its own adapter (ranks and adapted modules may
 * differ), each trainer's gradients added into its own accumulators. On the
 * CPU every trainer's logprobs, loss and gradients are bit-identical to a
 * pass of that trainer alone through the pack, whatever shares the pass. */
typedef struct twk_pack twk_pack;
/* How many passes ran, how many segments (runs) they held in all, how many
 * held more than one, and the most in one pass; own_passes: passes that
 * twk_loss_steps ran on a job's own trainer instead (LoRA on a mixture of
 * experts' experts or router, never packed). */
typedef struct twk_pack_stats {
    int64_t passes, segments, shared_passes, own_passes;
    int max_segments;
} twk_pack_stats;
/* One trainer's part of a pass: its batch, base = 1 for the adapter turned
 * off (forward only), lp (b.n floats; may be NULL) and loss (-sum w lp,
 * summed in token order) filled by the pass. */
typedef struct twk_pack_seg {
    twk_trainer *t;
    twk_batch b;
    int base;
    float *lp;
    float loss;
    int64_t row; /* set by the pass: where the segment starts in it */
} twk_pack_seg;
/* A pack for passes of up to `capacity` tokens and `max_slots` trainers;
 * its packed trainer is built at the first pass. TWK_ERR_INVALID_ARG / TWK_ERR_OOM. */
twk_status twk_pack_new(twk_model *m, int64_t capacity, int max_slots, twk_pack **out);
void twk_pack_free(twk_pack *p);
int64_t twk_pack_capacity(const twk_pack *p);
int twk_pack_max_slots(const twk_pack *p);
void twk_pack_get_stats(const twk_pack *p, twk_pack_stats *out);
/* One pass over n segments of distinct LoRA trainers of the pack's model
 * (at most max_slots, their tokens within the capacity); backward adds each
 * trainer's gradients. Errors (TWK_ERR_INVALID_ARG names the field) leave
 * every trainer's gradients as they were unless the pass itself failed mid-way. */
twk_status twk_pack_pass(twk_pack *p, int backward, twk_pack_seg *segs, int n);

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
/* The unembedding path of the trainer's training graph: "logits" (matmul + logprobs over [T, V]),
 * "recompute" (twk_unembed_logprobs: token tiles, the backward recomputes the logits) or
 * "two-product" (twk_unembed_logprobs_dir: vocabulary chunks, no product in the backward); "" for
 * NULL. */
const char *twk_trainer_unembed_path(const twk_trainer *t);

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
 * accumulated gradients. It runs on the device (the trainer's optimizer plan):
 * only the hyper-parameters (32 bytes) go up and the norm (8 bytes) comes back. *grad_norm (may be NULL) gets the pre-clip norm.
 * TWK_ERR_INVALID_ARG names a bad hyper-parameter; TWK_ERR_RANGE a non-finite
 * gradient (nothing is updated then). */
twk_status twk_trainer_optim_step(twk_trainer *t, const twk_adam_params *p, float *grad_norm);

/* The host reference twk_trainer_optim_step runs on the device (tests compare the two): one
 * AdamW step number `step` (>= 1) over `count` tensors of host arrays w[i], g[i], m[i], v[i] of
 * n[i] elements, with the global norm summed in double and clip_grad_norm_'s coefficient; g is
 * left as it is. *grad_norm (may be NULL) gets the pre-clip norm. TWK_ERR_INVALID_ARG names a bad
 * hyper-parameter; TWK_ERR_RANGE a non-finite gradient (nothing changed then). */
twk_status twk_adamw_host(float *const *w, const float *const *g, float *const *m, float *const *v, const int64_t *n,
                          int count, const twk_adam_params *p, int64_t step, float *grad_norm);

TWK_API_END
#ifdef __cplusplus
}
#endif
#endif
