/* twinkle — the training layer. For now: a tiny one-block transformer LM
 * trained from random initialisation on a memorisation task; the first main
 * job and the engine's end-to-end test. Models from Hugging Face folders,
 * LoRA and the real optimizers come next (train/README.md). */
#ifndef TWINKLE_TRAIN_H
#define TWINKLE_TRAIN_H

#include <stdint.h>

#include "twinkle/graph.h"
#include "twinkle/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct twk_tiny_lm_config {
    int vocab;      /* tokens */
    int dim;        /* model width */
    int heads;      /* query heads */
    int kv_heads;   /* key/value heads (grouped-query when < heads) */
    int head_dim;
    int ffn;        /* SwiGLU hidden width */
    int n_seqs;     /* sequences to memorise, packed into one batch */
    int seq_len;    /* average length; lengths vary by +-25% */
    float lr;       /* Adam learning rate */
    uint64_t seed;  /* data and initialisation */
} twk_tiny_lm_config;

/* A small default configuration (runs in well under a second per step). */
twk_tiny_lm_config twk_tiny_lm_default(void);

typedef struct twk_tiny_lm twk_tiny_lm;

/* Builds the model, its training graph and plan on `dev`. On failure returns
 * an error (message set) and *out is NULL. */
twk_status twk_tiny_lm_new(const twk_tiny_lm_config *cfg, twk_device *dev, twk_tiny_lm **out);
void twk_tiny_lm_free(twk_tiny_lm *m);
/* One step: forward, backward, Adam. *loss = mean next-token cross-entropy
 * before the update. */
twk_status twk_tiny_lm_step(twk_tiny_lm *m, float *loss);
/* Tokens in the packed batch. */
int64_t twk_tiny_lm_tokens(const twk_tiny_lm *m);
/* The compiled training plan (forward + backward), owned by the model. */
const twk_plan *twk_tiny_lm_plan(const twk_tiny_lm *m);
/* The compiled plan's statistics. */
void twk_tiny_lm_stats(const twk_tiny_lm *m, twk_plan_stats *out);

/* ---- Hugging Face models (Llama / Qwen2 / Qwen3) ---- */

typedef enum twk_arch { TWK_ARCH_LLAMA, TWK_ARCH_QWEN2, TWK_ARCH_QWEN3 } twk_arch;
typedef enum twk_rope_type { TWK_ROPE_DEFAULT, TWK_ROPE_LLAMA3 } twk_rope_type;

typedef struct twk_model_config {
    twk_arch arch;
    char arch_name[64];
    int vocab, hidden, layers, heads, kv_heads, head_dim, ffn;
    double rope_theta, rms_eps;
    twk_rope_type rope_type;
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_max_pos;
    int max_positions;
    int tie_embeddings;
    int attn_bias;  /* q/k/v biases (Qwen2; Llama with attention_bias) */
    int o_bias;     /* o_proj bias (Llama with attention_bias) */
    int qk_norm;    /* Qwen3's q_norm / k_norm */
    int eos[8], n_eos;
} twk_model_config;

typedef struct twk_model twk_model;

/* Loads a Hugging Face model folder (config.json + model.safetensors or a
 * sharded index) onto `dev`, weights converted to f32. Errors name the file,
 * field or tensor; *out is NULL then. */
twk_status twk_model_load(const char *dir, twk_device *dev, twk_model **out);
void twk_model_free(twk_model *m);
/* A model with random weights (normal, std 0.02; norms 1) for `cfg`, for
 * benchmarks and tests; cfg is validated like a config.json. */
twk_status twk_model_random(const twk_model_config *cfg, twk_device *dev, uint64_t seed, twk_model **out);
const twk_model_config *twk_model_cfg(const twk_model *m);
/* Writes the model as a Hugging Face folder (config.json + model.safetensors,
 * f32) that twk_model_load and transformers read; files are atomic. */
twk_status twk_model_save(const twk_model *m, const char *dir);
/* Copies the base weight named `name` (Hugging Face name; "lm_head.weight" of
 * a tied model is the embedding) to dst; TWK_ERR_NOT_FOUND or
 * TWK_ERR_INVALID_ARG (wrong element count) otherwise. */
twk_status twk_model_get_weight(const twk_model *m, const char *name, float *dst, int64_t nelem);

typedef struct twk_lora_config {
    int rank;           /* r */
    float alpha;        /* scale = alpha / rank; default alpha = 32 (Tinker's) */
    int train_attn;     /* q, k, v, o */
    int train_mlp;      /* gate, up, down */
    int train_unembed;  /* lm_head */
    uint64_t seed;
} twk_lora_config;

/* The default: rank 32, alpha 32, attention + MLP, no unembedding, seed 0. */
twk_lora_config twk_lora_default(void);

/* A packed batch: n tokens of several sequences laid end to end. */
typedef struct twk_batch {
    int64_t n;
    const int32_t *tokens, *targets, *positions, *seg_start;
    const float *weights; /* loss = -sum(weights * logprobs) */
} twk_batch;

/* A model with an optional LoRA adapter (rank 0 = full fine-tuning), compiled
 * for a token capacity. Gradients accumulate over forward_backward calls. */
typedef struct twk_trainer twk_trainer;

/* lora == NULL: full-parameter training (every base weight trainable). */
twk_status twk_trainer_new(twk_model *m, const twk_lora_config *lora, int64_t capacity, twk_trainer **out);
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
twk_status twk_trainer_load_state(twk_trainer *t, const char *dir, int with_optimizer);
/* Optimizer steps taken (restored by load_state with the optimizer). */
int64_t twk_trainer_step(const twk_trainer *t);
/* The most tokens one pass of the trainer holds (its compiled capacity). */
int64_t twk_trainer_capacity(const twk_trainer *t);

/* ---- sampling: prefill and decode with a KV cache ---- */

typedef struct twk_sample_params {
    int max_tokens;            /* new tokens at most (>= 1) */
    float temperature;         /* 0 = greedy; > 0 scales the logits */
    int top_k;                 /* <= 0: off */
    float top_p;               /* (0, 1]; 1 = off */
    uint64_t seed;             /* used when has_seed: the same seed gives the same tokens */
    int has_seed;
    const int32_t *stop_tokens; /* generation ends after emitting one of these (it is included) */
    int n_stop_tokens;
    /* stop strings: generation ends with the token that completes one of them in the
     * generated text (that token included); needs the model's tokenizer */
    const char *const *stop_strings;
    int n_stop_strings;
    const twk_tokenizer *tokenizer;
} twk_sample_params;

typedef struct twk_sampled_seq {
    int32_t *tokens;  /* generated tokens, the stop token included when one ended it */
    float *logprobs;  /* log_softmax of the raw logits (temperature 1) at each chosen token */
    int64_t n;
    int stop_reason;  /* 0: a stop token, 1: max_tokens (length) */
} twk_sampled_seq;

typedef struct twk_sampler twk_sampler;

/* A sampler over `m`, with an adapter of lora's shape when lora != NULL (its
 * B starts at zero: load or copy weights into it), for up to max_seqs
 * sequences decoded together, each at most max_len tokens (prompt included). */
twk_status twk_sampler_new(twk_model *m, const twk_lora_config *lora, int max_seqs, int64_t max_len, twk_sampler **out);
void twk_sampler_free(twk_sampler *s);
/* Loads a PEFT adapter folder (its r and alpha must match). */
twk_status twk_sampler_load_adapter(twk_sampler *s, const char *dir);
/* Copies a trainer's current adapter (same LoRA shape) into the sampler. */
twk_status twk_sampler_copy_adapter(twk_sampler *s, twk_trainer *from);
/* num_samples (<= max_seqs) continuations of the prompt; out[i] must be
 * freed with twk_sampled_seq_free. Errors name the bad parameter. */
twk_status twk_sampler_generate(twk_sampler *s, const int32_t *prompt, int64_t n_prompt, int num_samples,
                                const twk_sample_params *p, twk_sampled_seq *out);
void twk_sampled_seq_free(twk_sampled_seq *q);

/* One request of a shared decode batch. */
typedef struct twk_sample_request {
    const int32_t *prompt;
    int64_t n_prompt;
    int num_samples;
    const twk_sample_params *params;
    twk_sampled_seq *out; /* num_samples entries */
    int slot;             /* adapter slot (samplers made with twk_sampler_new_slots); 0 otherwise */
} twk_sample_request;

/* A sampler whose batches mix adapters: n_slots adapter slots of rank up to
 * slot_rank on every module; each request names its slot. Slots start as
 * zeros, i.e. the base model. */
twk_status twk_sampler_new_slots(twk_model *m, int n_slots, int slot_rank, int max_seqs, int64_t max_len,
                                 twk_sampler **out);
/* Fills dst (nelem floats) with the adapter tensor named `name` (PEFT names)
 * and returns 1, or returns 0 when the adapter has no such tensor. */
typedef int (*twk_adapter_get_fn)(void *ctx, const char *name, float *dst, int64_t nelem);
/* Loads an adapter of the given rank and alpha into a slot (padded to the
 * slot rank, alpha / rank folded into B); modules it lacks are zero. */
twk_status twk_sampler_slot_set(twk_sampler *s, int slot, int rank, float alpha, twk_adapter_get_fn get, void *ctx);
/* The same from a PEFT adapter folder, or a trainer's current adapter. */
twk_status twk_sampler_slot_load_dir(twk_sampler *s, int slot, const char *dir);
twk_status twk_sampler_slot_from_trainer(twk_sampler *s, int slot, twk_trainer *from);
/* Zeros a slot (the base model). */
twk_status twk_sampler_slot_clear(twk_sampler *s, int slot);
int twk_sampler_slots(const twk_sampler *s);
/* The slot twk_sampler_score_prompt uses (0 by default). */
void twk_sampler_set_score_slot(twk_sampler *s, int slot);
int twk_sampler_slot_rank(const twk_sampler *s);

/* Several requests (different prompts and parameters) decoded together: each
 * prompt is prefilled once, then every live sequence of every request takes
 * one token per pass. The samples of all requests together must fit the
 * sampler (max_seqs). Results equal separate twk_sampler_generate calls. */
twk_status twk_sampler_generate_many(twk_sampler *s, const twk_sample_request *reqs, int n_reqs);
/* Per-position scores of a prompt: logprobs[i] = log p(prompt[i] | prompt[:i])
 * (logprobs[0] = NaN), and when k > 0 the k most likely next tokens at each
 * position i (given prompt[:i]; row 0 empty: id 0, -99999), sorted by
 * logprob. Any output may be NULL. Errors name the bad argument. */
twk_status twk_sampler_score_prompt(twk_sampler *s, const int32_t *prompt, int64_t n_prompt, float *logprobs, int k,
                                    int32_t *topk_ids, float *topk_lps);
/* Bytes of the adapter (0 without one), and copies of it to / from the host,
 * so a sampler's KV cache can be dropped and the sampler remade later. */
size_t twk_sampler_adapter_bytes(const twk_sampler *s);
twk_status twk_sampler_adapter_to_host(twk_sampler *s, void *dst, size_t bytes);
twk_status twk_sampler_adapter_from_host(twk_sampler *s, const void *src, size_t bytes);
/* The sampler's sequence limit and context length. */
int twk_sampler_max_seqs(const twk_sampler *s);
int64_t twk_sampler_max_len(const twk_sampler *s);

/* ---- token data: JSONL, one {"tokens": [...], "weights": [...]} per line ----
 * RL rollouts add "advantages" (one number for the sequence, or one per token
 * or per target) and "logprobs" (the sampler's, per token or per target). */

typedef struct twk_dataset twk_dataset;

/* Reads a JSONL file of examples. "tokens" (>= 2 ids, each < vocab) is
 * required; "weights" is optional (default 1): either one per token (the
 * first is then unused: nothing predicts token 0) or one per target
 * (len(tokens) - 1). Errors name the line and field. */
twk_status twk_dataset_load_jsonl(const char *path, int vocab, twk_dataset **out);
void twk_dataset_free(twk_dataset *d);
int64_t twk_dataset_count(const twk_dataset *d);
/* Total target tokens (sum of len(tokens) - 1). */
int64_t twk_dataset_tokens(const twk_dataset *d);
/* TWK_OK when every line has float field `field` ("advantages", "logprobs"); else
 * TWK_ERR_INVALID_ARG naming path, the first line without it and `why` needs it. */
twk_status twk_dataset_require(const twk_dataset *d, const char *field, const char *path, const char *why);
/* Target tokens of the longest example. */
int64_t twk_dataset_max_targets(const twk_dataset *d);

/* A packed batch that owns its arrays (see twk_batch). */
typedef struct twk_packed {
    twk_batch batch;
    const float *advantages;       /* per token of the batch; NaN where the line had none */
    const float *sampler_logprobs; /* per token; NaN where the line had none */
    int n_seqs;
    int32_t *buf_i32;
    float *buf_f32;
    int64_t cap;
} twk_packed;

/* Packs whole examples from *cursor on (wrapping to the start: epochs) until
 * the next would exceed `budget` tokens; advances *cursor. An example longer
 * than the budget is TWK_ERR_INVALID_ARG naming it. */
twk_status twk_dataset_pack(const twk_dataset *d, int64_t budget, int64_t *cursor, twk_packed *out);
/* The same, packing whole groups of `group` consecutive examples (pairs for
 * DPO); *cursor stays a multiple of group. TWK_ERR_INVALID_ARG when the count
 * is not a multiple of group or a group exceeds the budget. */
twk_status twk_dataset_pack_groups(const twk_dataset *d, int64_t budget, int group, int64_t *cursor, twk_packed *out);
void twk_packed_free(twk_packed *p);

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

#ifdef __cplusplus
}
#endif

#include "twinkle/losses.h"
#endif
