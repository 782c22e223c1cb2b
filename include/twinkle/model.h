/* twinkle — models: Hugging Face Llama / Qwen2 / Qwen3 folders (or random
 * weights of a config), and the tiny one-block LM of the demo.
 *
 * Thread-safety: a twk_model is not changed by training (adapters and trained
 * copies live in trainers) and may be shared by several trainers and samplers;
 * all of them run work on the model's device, so calls on them must not
 * overlap (one thread at a time per device). A twk_tiny_lm belongs to one
 * thread at a time. */
#ifndef TWINKLE_MODEL_H
#define TWINKLE_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "twinkle/export.h"
#include "twinkle/graph.h"

#ifdef __cplusplus
extern "C" {
#endif
TWK_API_BEGIN

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

typedef enum twk_arch {
    TWK_ARCH_LLAMA,
    TWK_ARCH_QWEN2,
    TWK_ARCH_QWEN3,
    TWK_ARCH_MISTRAL, /* Llama with a sliding window on every layer */
    TWK_ARCH_GEMMA2,  /* gemma: local / global layers, soft-caps */
    TWK_ARCH_GEMMA3,  /* gemma: local / global layers, q/k norms, a local RoPE base */
    TWK_ARCH_QWEN3_MOE, /* Qwen3 attention, mixture-of-experts MLPs */
    TWK_ARCH_QWEN2_MOE, /* Qwen2 attention, experts plus a shared expert behind a sigmoid gate */
    TWK_ARCH_MIXTRAL    /* Mistral attention, experts w1 / w3 / w2 */
} twk_arch;
typedef enum twk_rope_type { TWK_ROPE_DEFAULT, TWK_ROPE_LLAMA3, TWK_ROPE_LINEAR } twk_rope_type;

typedef struct twk_model_config {
    twk_arch arch;
    char arch_name[64];
    int vocab, hidden, layers, heads, kv_heads, head_dim, ffn;
    double rope_theta, rms_eps;
    twk_rope_type rope_type;
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_max_pos;
    int max_positions;
    bool tie_embeddings;
    int stored_dtype; /* config.json's torch_dtype (or dtype) as a twk_dtype; -1 when absent or not f32/bf16/f16 */
    bool attn_bias; /* q/k/v biases (Qwen2; Llama with attention_bias) */
    bool o_bias;    /* o_proj bias (Llama with attention_bias) */
    bool qk_norm;   /* Qwen3's q_norm / k_norm */
    /* Sliding-window attention (Mistral, Gemma's local layers): a token sees the last
     * sliding_window positions, itself included (0: none). Layer l is local when
     * local_pattern is 0 (every layer) or (l + 1) % local_pattern != 0 (Gemma 2: 2, Gemma 3: 6). */
    int sliding_window, local_pattern;
    double rope_local_theta; /* RoPE base of the local layers (Gemma 3; 0: rope_theta, same scaling) */
    /* Gemma: RMSNorm weights as (1 + w), embeddings times sqrt(hidden) (in the weights' dtype),
     * GELU-tanh MLP, norms after attention and MLP as well as before. */
    bool gemma;
    double attn_scale;        /* attention score scale (0: head_dim^-0.5; Gemma: query_pre_attn_scalar^-0.5) */
    double attn_softcap;      /* attention scores -> cap * tanh(s / cap) (0: none) */
    double final_softcap;     /* logits -> cap * tanh(l / cap) (0: none) */
    int eos[8], n_eos;
    /* Mixture of experts (n_experts > 0): a sparse layer's MLP routes each token to its top_k of
     * n_experts SwiGLU experts of moe_ffn (softmax over the router's logits, renormalised over
     * the top_k when norm_topk), plus a shared expert of shared_ffn behind a sigmoid gate
     * (Qwen2-MoE; 0: none). Layer l is sparse as train/hf_config.c decides (every
     * sparse_step-th layer not in mlp_only_layers); the others keep the dense MLP of ffn. */
    int n_experts, top_k, moe_ffn, shared_ffn, sparse_step;
    bool norm_topk;
    /* output_router_logits: the router's load-balancing loss (transformers' load_balancing_loss_func)
     * times router_aux_coef (router_aux_loss_coef, default 0.001) joins each pass's training
     * objective and is reported as router_aux_loss (twk_trainer_router_aux_loss) */
    bool router_aux;
    double router_aux_coef;
    uint64_t dense_layers[4]; /* mlp_only_layers as a bit set (layers below 256) */
} twk_model_config;

typedef struct twk_model twk_model;

/* Loads a Hugging Face model folder (config.json + model.safetensors or a
 * sharded index) onto `dev`, weights converted to f32. Errors name the file,
 * field or tensor; *out is NULL then. */
twk_status twk_model_load(const char *dir, twk_device *dev, twk_model **out);
/* twk_model_load holding the matrices (embedding, projections, unembedding) in `dtype`
 * (TWK_F32, TWK_BF16, TWK_F16; -1: as stored in the checkpoint where the device's kernels read
 * 16-bit matmul and get_rows sources (twk_device_half_srcs), else f32), converted with round to
 * nearest even when it differs; norms and biases are f32. Samplers' KV caches are kv_dtype
 * (-1: the matrices' dtype where the device reads 16-bit kv_write / attn_cache sources, else
 * f32). bf16 / f16 models train LoRA adapters (f32) and sample;
 * full-parameter training needs f32. */
twk_status twk_model_load_as(const char *dir, twk_device *dev, int dtype, int kv_dtype, twk_model **out);
/* The dtype twk_model_load_as(dir, dev, dtype, ...) holds dir's weight matrices in, read from
 * the safetensors headers without loading a weight (dev NULL: as stored; a folder with only
 * config.json: its torch_dtype, else f32); -1 (error set) when dtype is not a float dtype or
 * config.json cannot be read. */
int twk_model_weights_dtype(const char *dir, twk_device *dev, int dtype);
/* The dtype the model's matrices are held in. */
twk_dtype twk_model_dtype(const twk_model *m);
/* Converts the model's matrices to dtype t in place (TWK_ERR_INVALID_ARG for a non-float t;
 * on failure the tensors not yet converted keep their dtype). */
twk_status twk_model_convert(twk_model *m, twk_dtype t);
/* The dtype of the KV caches of samplers made from m afterwards (default: the weights'). */
twk_status twk_model_set_kv_dtype(twk_model *m, twk_dtype t);
twk_dtype twk_model_kv_dtype(const twk_model *m);
void twk_model_free(twk_model *m);
/* A model with random weights (normal, std 0.02; norms 1) for `cfg`, for
 * benchmarks and tests; cfg is validated like a config.json. */
twk_status twk_model_random(const twk_model_config *cfg, twk_device *dev, uint64_t seed, twk_model **out);
/* twk_model_random with the matrices made in dtype (the same values as twk_model_random's,
 * rounded to nearest even), never all in f32 at once. */
twk_status twk_model_random_as(const twk_model_config *cfg, twk_device *dev, uint64_t seed, twk_dtype dtype,
                               twk_model **out);
const twk_model_config *twk_model_cfg(const twk_model *m);

/* The built-in model "twinkle/tiny-qwen3" (TWK_BUILTIN_MODEL_NAME): Qwen3, vocab
 * 512, hidden 128, 2 layers, random weights from a fixed seed, no tokenizer;
 * `twinkle serve` without --model serves it. Its config, and the model on `dev`
 * (an error from twk_model_random otherwise; *out is NULL then). */
#define TWK_BUILTIN_MODEL_NAME "twinkle/tiny-qwen3"
void twk_model_builtin_config(twk_model_config *out);
twk_status twk_model_builtin(twk_device *dev, twk_model **out);
/* Writes the model as a Hugging Face folder (config.json + model.safetensors,
 * f32) that twk_model_load and transformers read; files are atomic. */
twk_status twk_model_save(const twk_model *m, const char *dir);
/* Copies the base weight named `name` (Hugging Face name; "lm_head.weight" of
 * a tied model is the embedding) to dst as f32; TWK_ERR_NOT_FOUND or
 * TWK_ERR_INVALID_ARG (wrong element count) otherwise. */
twk_status twk_model_get_weight(const twk_model *m, const char *name, float *dst, int64_t nelem);

TWK_API_END
#ifdef __cplusplus
}
#endif
#endif
