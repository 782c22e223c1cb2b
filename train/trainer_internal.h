/* train/ internals shared by the model loader, the trainer, the optimizer
 * and checkpoint code. Not a public header. */
#ifndef TWK_TRAINER_INTERNAL_H
#define TWK_TRAINER_INTERNAL_H

#include "twinkle/train.h"

/* A named tensor in a device buffer: a base weight or an adapter tensor. */
typedef struct named_buf {
    char name[224];
    int ndim;
    int64_t ne[3];
    int64_t nelem;
    twk_dtype dtype; /* TWK_F32 (0) unless set */
    twk_buffer *buf;
} named_buf;

/* The tensor's size in bytes, from its dtype. */
static inline size_t nb_bytes(const named_buf *nb) { return (size_t)nb->nelem * twk_dtype_size(nb->dtype); }

struct twk_model {
    twk_model_config cfg;
    twk_device *dev;
    named_buf *w;      /* matrices in the model's dtype (f32, bf16, f16); norms and biases f32 */
    int n_w;
    twk_dtype kv_dtype; /* samplers' KV caches, when kv_set; else the weights' dtype */
    int kv_set;
};

/* A trainable tensor of a trainer and its host-side gradient and moments. */
typedef struct tparam {
    named_buf *nb;   /* storage (model weight or adapter tensor) */
    twk_id id;       /* param node */
    twk_id grad;     /* gradient node in the backward graph */
    float *acc;      /* accumulated gradient (host) */
    float *m, *v;    /* AdamW moments (host), allocated at the first step */
} tparam;

struct twk_trainer {
    twk_model *m;
    int lora;
    twk_lora_config lc;
    float scale;
    named_buf *adapter; /* LoRA tensors */
    int n_adapter;
    named_buf inv_freq;
    twk_graph *g;
    twk_id tokens, targets, positions, seg, weights, logprobs, loss, inv_freq_id;
    twk_id *param_ids;  /* per model weight, then per adapter tensor */
    tparam *tp;
    int n_tp;
    twk_plan *fwd, *fwdbwd;
    int64_t capacity;
    int64_t step;
    /* sampling mode (train/sampler.c): attention over per-layer KV caches */
    int sampling;
    int max_seqs;
    int64_t max_len;
    twk_id rows, lo, hi, sel, logits;
    named_buf *kv; /* 2 per layer: K cache, V cache, [max_seqs * max_len, kv_heads, head_dim] */
    /* two plans over one set of buffers: fwd selects 1 row (prefill: the last
     * prompt token), decode selects one row per token fed (sel_dyn) */
    int sel_dyn;
    twk_graph *g_decode;
    twk_plan *decode;
    /* adapter slots (a sampler serving several adapters in one batch): every
     * module has A [n_slots, slot_rank, in] and B [n_slots, out, slot_rank]
     * (B already scaled by alpha / rank); each token names its slot */
    int n_slots, slot_rank;
    twk_id slot_in, slot_sel; /* per token; per selected row (the unembedding's inputs) */
};

/* Creates a trainer (sampling = 0) or, with sampling = 1, the decoding
 * graph of a sampler: KV caches for max_seqs sequences of max_len tokens and
 * logits of max_seqs selected rows as the output. */
twk_status twk_trainer_create(twk_model *m, const twk_lora_config *lora, int64_t capacity, int sampling, int max_seqs,
                              int64_t max_len, twk_trainer **out);
/* A sampling-mode trainer with n_slots adapter slots of rank <= slot_rank on
 * every module (attention, MLP, unembedding); slots start as zeros (base). */
twk_status twk_trainer_create_slots(twk_model *m, int n_slots, int slot_rank, int max_seqs, int64_t max_len,
                                    twk_trainer **out);

#endif
