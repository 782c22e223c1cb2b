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

/* The sampler's passes (twk_trainer.pass): what build() makes in sampling mode. */
enum { TWK_PASS_PREFILL, TWK_PASS_DECODE, TWK_PASS_HEAD };

/* A head of prompt scoring: final hidden rows [T, hidden] in, each row's logprob of its
 * target out; [0] fused (twk_unembed_logprobs, no logits: the base unembedding only), [1]
 * the unembedding with its adapter (slot) and the logits [rows, V] too. */
typedef struct twk_score_head {
    twk_graph *g;
    twk_plan *p;
    twk_id hidden, logits, logprobs;
    int64_t rows; /* the plan's capacity in rows */
} twk_score_head;

/* A trainable tensor of a trainer; its accumulated gradient and AdamW moments live on the
 * device, at element `off` of the trainer's flat buffers (train/optim_plan.c). */
typedef struct tparam {
    named_buf *nb;   /* storage (model weight or adapter tensor) */
    twk_id id;       /* param node */
    twk_id grad;     /* gradient node in the backward graph */
    twk_id acc;      /* its accumulator leaf in the backward graph (bound to grad_acc at off) */
    twk_id acc_op;   /* the grad_acc node adding the pass's gradient into it */
    int64_t off;     /* element offset in grad_acc, adam_m, adam_v */
} tparam;

struct twk_trainer {
    twk_model *m;
    int lora;
    twk_lora_config lc;
    float scale;
    named_buf *adapter; /* LoRA tensors */
    int n_adapter;
    named_buf inv_freq, inv_freq_local; /* the local layers' own (Gemma 3; nelem 0 otherwise) */
    twk_graph *g;
    twk_id tokens, targets, positions, seg, weights, logprobs, loss, inv_freq_id, inv_freq_local_id;
    twk_id *param_ids;  /* per model weight, then per adapter tensor */
    tparam *tp;
    int n_tp;
    twk_plan *fwd, *fwdbwd;
    int64_t capacity;
    int64_t step;
    /* the optimizer on the device (optim_plan.c): flat gradient accumulator and moments, the
     * optimizer plan, and a host copy of the gradients handed out by twk_trainer_grad_data */
    twk_buffer *grad_acc, *adam_m, *adam_v;
    int64_t flat_n;
    twk_graph *g_opt;
    twk_plan *opt;
    twk_id opt_hyper, opt_norm;
    float *grad_host;
    int grads_on_host; /* grad_host is the current gradient (the device copy is stale) */
    struct twk_grad_hook_state *hook; /* grad_hook.c: armed for the step's last backward pass (NULL: none) */
    /* sampling mode (train/sampler.c): attention over per-layer KV caches */
    int sampling;
    int max_seqs;
    int64_t max_len;
    twk_id rows, lo, hi, sel, logits;
    /* a sliding-window layer's cache is a ring of `window` rows per sequence when the window is
     * shorter than max_len (hf_config.h's twk_kv_seq_rows): its own rows and ranges (ring set) */
    int ring, full; /* some layers' caches are rings; some are not */
    twk_id rows_w, lo_w, hi_w;
    named_buf *kv; /* 2 per layer: K cache, V cache, [twk_kv_layer_rows, kv_heads, head_dim] */
    /* the plans over one set of buffers, each built by build() for t->pass: fwd (prefill:
     * the whole prompt through the training attention, its keys and values written into
     * the cache, logits of 1 selected row, every row's final hidden state), decode (one
     * row per token fed, attention over the cache), and the lazily made heads of prompt
     * scoring (twk_trainer_score_head) */
    int pass;
    twk_id hidden, prefill_logits; /* the prefill plan's [T, hidden] output and its logits */
    twk_graph *g_decode;
    twk_plan *decode;
    twk_score_head head[2];
    /* adapter slots (a sampler serving several adapters in one batch): every
     * module has A [n_slots, slot_rank, in] and B [n_slots, out, slot_rank]
     * (B already scaled by alpha / rank); each token names its slot */
    int n_slots, slot_rank;
    twk_id slot_in, slot_sel; /* per token; per selected row (the unembedding's inputs) */
    twk_id slot_scale;        /* a packed trainer (lora_pack.c): each token's LoRA scale (alpha / rank of its run; 0: base) */
    /* memory planning (memplan.c): per-layer activation recompute; a dry trainer has
     * shapes only (no buffers, no host state) and estimates its plans instead of compiling */
    int recompute, dry;
    int early_grads; /* twk_trainer_opts.early_grads: grad_acc hoisted to right after each gradient */
    int fused; /* logprobs by twk_unembed_logprobs (no [T, V] logits) */
    int dir;   /* and in the training graph by twk_unembed_logprobs_dir (two products, none in the
                  backward); the forward plan's graph (forward_only) keeps the one-product op */
    int forward_only;
    /* the router's load-balancing loss (cfg.router_aux; not in samplers; in a packed trainer per slot:
     * aux and aux_coef [n_slots, 1], written and read by lora_pack.c):
     * aux_stats the sum of the sparse layers' moe_router_stats while build() runs (n_aux of them),
     * aux its value per pass, aux_coef the run-time f32 [1] coefficient input of the forward+backward
     * plan (0 while aux_off: loss_step.c's passes that must not add its gradient again), objective
     * = loss + aux_coef * aux, what the backward differentiates (else objective = loss); aux_sum /
     * aux_n: the values of the passes since twk_trainer_router_aux_loss last reset them */
    twk_id aux_stats, aux, aux_coef, objective;
    twk_id aux_slot; /* a packed trainer's: each row's run slot for the statistics (-1: padding, a base segment) */
    int n_aux, aux_off;
    double aux_sum;
    long aux_n;
    twk_plan_stats est_fwd, est_fwdbwd;
    twk_buffer *arena; /* the trainer's own arena of both plans (NULL: none, or the caller's) */
};

/* grad_hook.c: the backward pass that ends a step (loss_step.c's last backward pass): with a hook
 * armed (twk_trainer_grad_hook_arm) it runs in segments, handing each group of gradients to the
 * host as it becomes final; else twk_trainer_forward_backward. */
twk_status twk_trainer_forward_backward_last(twk_trainer *t, const twk_batch *b, float *logprobs, float *loss);
/* model.c: after a run of plan p over n tokens, adds the pass's router_aux_loss to the trainer's
 * running sum (nothing without one); the plan read's error. */
twk_status twk_trainer_note_aux(twk_trainer *t, twk_plan *p, int64_t n);
/* grad_hook.c: frees the hook's state (twk_trainer_free). */
void twk_trainer_grad_hook_free(twk_trainer *t);

/* Creates a trainer (sampling = 0) or, with sampling = 1, the decoding
 * graph of a sampler: KV caches for max_seqs sequences of max_len tokens and
 * logits of max_seqs selected rows as the output. */
twk_status twk_trainer_create(twk_model *m, const twk_lora_config *lora, int64_t capacity, int sampling, int max_seqs,
                              int64_t max_len, twk_trainer **out);
/* Prompt scoring's head (sampling mode) into *out: the fused one (which = 0) where the
 * unembedding has no adapter, the device has TWK_OP_UNEMBED_LOGPROBS and f32 weights (else
 * *out = NULL, TWK_OK); with which = 1 the one with logits. Built and compiled on first use;
 * the graph compiler's error when that fails. */
twk_status twk_trainer_score_head(twk_trainer *t, int which, twk_score_head **out);
/* A sampling-mode trainer with n_slots adapter slots of rank <= slot_rank on
 * every module (attention, MLP, unembedding); slots start as zeros (base). */
twk_status twk_trainer_create_slots(twk_model *m, int n_slots, int slot_rank, int max_seqs, int64_t max_len,
                                    twk_trainer **out);

/* optim_plan.c: the trainer's gradients and optimizer on the device. After the backward graph
 * exists: gives each trainable tensor its place in the flat buffers (allocated, zeroed) and an
 * accumulating GRAD_ACC output in t->g; errors: out of memory, the graph's. */
twk_status twk_trainer_grads_init(twk_trainer *t);
/* Writes the accumulator bindings of the backward plan into b (n_tp of them); their count. */
int twk_trainer_grad_bindings(const twk_trainer *t, twk_binding *b);
/* Builds and compiles the optimizer plan (norm, clipping, AdamW); the compiler's error otherwise. */
twk_status twk_trainer_optim_plan(twk_trainer *t);
/* Uploads the host copy of the gradients when it is the current one (after twk_trainer_grad_data). */
twk_status twk_trainer_grads_to_device(twk_trainer *t);
/* Frees what twk_trainer_grads_init and twk_trainer_optim_plan made. */
void twk_trainer_grads_free(twk_trainer *t);
/* The AdamW moments of trainable tensor i to or from the host (training-state checkpoints). */
twk_status twk_trainer_moments_get(twk_trainer *t, int i, float *m, float *v);
twk_status twk_trainer_moments_set(twk_trainer *t, int i, const float *m, const float *v);
/* Zeroes every moment (the optimizer restarts). */
twk_status twk_trainer_moments_zero(twk_trainer *t);
/* A packed trainer (lora_pack.c): adapter slots A [n_slots, slot_rank, in],
 * B [n_slots, out, slot_rank] on the modules `modules` selects, trainable, with
 * per-token inputs lora_slot and lora_scale; forward and forward+backward plans. */
twk_status twk_trainer_create_packed(twk_model *m, const twk_lora_config *modules, int n_slots, int slot_rank,
                                     int64_t capacity, twk_trainer **out);
/* Checks a batch (token count within the capacity, finite weights, positions
 * >= 0) and writes it into plan p's inputs; TWK_ERR_INVALID_ARG names the field. */
twk_status twk_trainer_bind_batch(twk_trainer *t, twk_plan *p, const twk_batch *b);
/* The model's weights as shapes only (no device, no buffers), held as twk_model_load_as
 * holds them: matrices in `dtype`, norms and biases f32; the base of a dry trainer. NULL on
 * allocation failure. Freed with twk_model_free. */
twk_model *twk_model_shapes(const twk_model_config *cfg, twk_dtype dtype);
/* A trainer as twk_trainer_new_opts would make it, with dry = 1 on a twk_model_shapes
 * model: its plans are estimated (t->est_fwd, t->est_fwdbwd), nothing is allocated on a device. */
twk_status twk_trainer_create_dry(twk_model *m, const twk_lora_config *lora, int64_t capacity,
                                  const twk_trainer_opts *o, twk_trainer **out);

#endif
