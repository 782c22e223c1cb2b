/* twinkle — memory known before it is spent: what a trainer (and a sampler's KV
 * cache) of a model configuration will hold, from the real graphs built with shapes
 * only (twk_plan_estimate), without loading weights or touching a device.
 *
 * Thread-safety: every function here is reentrant. */
#ifndef TWINKLE_MEMPLAN_H
#define TWINKLE_MEMPLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "twinkle/export.h"
#include "twinkle/hal.h"
#include "twinkle/model.h"
#include "twinkle/trainer.h"

#ifdef __cplusplus
extern "C" {
#endif
TWK_API_BEGIN

/* What is planned: one trainer of `tokens` tokens per pass. */
typedef struct twk_mem_request {
    int64_t tokens;       /* tokens per pass (the trainer's capacity) */
    int rank;             /* LoRA rank; 0 = full-parameter training */
    bool train_unembed;   /* LoRA on lm_head too (attention + MLP always) */
    const char *dtype;    /* the frozen weights' dtype: "f32" (NULL), "bf16" or "f16" */
    bool recompute;       /* per-layer activation recompute */
    bool logits;          /* the [T, V] logits path (twk_trainer_opts.logits; backends without
                             the fused unembedding); full training and an lm_head adapter take it */
    bool unembed_recompute; /* the fused unembedding that recomputes its logits in the backward
                             (twk_trainer_opts.unembed_recompute; backends without the two-product one) */
    int kv_seqs;          /* KV cache: sequences of kv_len tokens (0: none) */
    int64_t kv_len;
    bool train_experts;   /* mixture of experts: LoRA on the experts' stacks (twk_lora_config's) */
    bool train_router;    /* and on the router */
} twk_mem_request;

/* Bytes of each part. Device parts: weights, adapter, gradients, moments (the optimizer
 * plan runs on the device), activations, scratch, widen, kv_cache; host part: bookkeeping.
 * On the CPU both are host memory. */
typedef struct twk_mem_plan {
    uint64_t weights;     /* base weights in the request's dtype, with the RoPE table */
    uint64_t adapter;     /* LoRA A and B (f32); 0 for full training (the weights train) */
    uint64_t grads;       /* gradient accumulators of the trainable tensors (f32) */
    uint64_t moments;     /* AdamW m and v */
    uint64_t act_forward; /* the forward plan's arena peak and inputs */
    uint64_t act_train;   /* the forward+backward plan's arena peak and inputs */
    uint64_t activations; /* the arena both plans share (the larger peak) and their inputs */
    uint64_t arena;       /* that arena alone: the size of a buffer trainers may share (twk_trainer_opts) */
    uint64_t scratch;     /* the fused unembedding's tile of logits (the two-product one's also a
                             16-bit w's chunk widened and 3 floats a token; the CPU's scratch; the GPU
                             backends' kernels keep their tile in local memory: an upper bound there) */
    uint64_t widen;       /* a 16-bit model's largest f32 panel of a weight in matmul (a backend's scratch) */
    uint64_t kv_cache;    /* K and V of kv_seqs x kv_len tokens, in the weights' dtype */
    uint64_t bookkeeping; /* host: the trainer's graph and plans' own structures */
    uint64_t per_run;     /* adapter + grads + moments: what one more LoRA run of the service costs */
    uint64_t device, host, total;
    int n_launches;       /* of the forward+backward plan */
} twk_mem_plan;

/* Bytes per element of a weight dtype name ("f32" 4, "bf16" and "f16" 2; NULL: f32); 0 if unknown. */
size_t twk_mem_dtype_bytes(const char *dtype);
/* The plan of `rq` for a model configuration; errors name the bad field. */
twk_status twk_mem_plan_config(const twk_model_config *cfg, const twk_mem_request *rq, twk_mem_plan *out);
/* The same for a Hugging Face folder's config.json (no weights are read). */
twk_status twk_mem_plan_dir(const char *dir, const twk_mem_request *rq, twk_mem_plan *out);
/* "12.3 GiB", "456.7 MiB", "89.0 KiB" or "12 B" into buf; buf. */
const char *twk_mem_bytes_str(uint64_t bytes, char *buf, size_t len);
/* The plan as a table, one part a line, into buf (truncated to len); buf. */
const char *twk_mem_plan_table(const twk_mem_plan *p, const twk_mem_request *rq, char *buf, size_t len);
/* The memory a plan may take on dev: its memory (twk_device_props.memory_bytes; for the CPU,
 * the host's RAM), or the environment's TWK_MEM_BUDGET when that is smaller (bytes, with an
 * optional K, M, G, T suffix of powers of 1024: "512M", "1.5GiB"). *budgeted says which one
 * (may be NULL). TWK_ERR_INVALID_ARG naming TWK_MEM_BUDGET when it is not a size. */
twk_status twk_mem_capacity(twk_device *dev, uint64_t *bytes, bool *budgeted);
/* Whether the plan fits `dev`: its capacity (twk_mem_capacity) holds the device parts, and the
 * CPU's RAM the host parts. TWK_OK, or TWK_ERR_OOM naming what does not fit (the table is the
 * caller's to print); TWK_ERR_INVALID_ARG for a bad TWK_MEM_BUDGET. */
twk_status twk_mem_plan_fits(const twk_mem_plan *p, twk_device *dev);
/* Whether dev runs the fused unembedding (TWK_OP_UNEMBED_LOGPROBS) over an lm_head of the
 * weight dtype named `dtype` ("f32" or NULL, "bf16", "f16"); false for an unknown name. */
bool twk_mem_fused_unembed(const twk_device *dev, const char *dtype);
/* Whether dev runs the two-product fused unembedding (TWK_OP_UNEMBED_LOGPROBS_DIR) over such an
 * lm_head: a trainer takes it where it takes the fused unembedding; false for an unknown name. */
bool twk_mem_dir_unembed(const twk_device *dev, const char *dtype);
/* The plan of rq for the folder `dir` on dev (rq->logits set when dev lacks the fused
 * unembedding for rq->dtype, rq->unembed_recompute when it lacks the two-product one). When it does not fit, rq->recompute is off and
 * `auto_recompute`, the plan with recompute instead (rq->recompute then set). TWK_OK when the
 * plan in *out fits; TWK_ERR_OOM naming what does not (*out the smallest plan tried, rq as
 * planned); a config error otherwise. */
twk_status twk_mem_plan_choose(const char *dir, twk_mem_request *rq, bool auto_recompute, twk_device *dev,
                               twk_mem_plan *out);

TWK_API_END
#ifdef __cplusplus
}
#endif
#endif
