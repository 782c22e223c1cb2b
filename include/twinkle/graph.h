/* twinkle — tensor IR, static autograd, passes and compiled plans.
 *
 * A graph is built once per shape family. Tensors are named by integer ids
 * (twk_id); a builder returns -1 on error and records the first error in the
 * graph (sticky: later builders given -1 return -1 without a new message), so
 * a whole model can be built and checked once with twk_graph_status().
 *
 * Shapes: dims are given outermost first. A dim written TWK_TOK(k) is k times
 * the run-time token count; a plan is compiled for a token capacity and runs
 * with any count up to it. */
#ifndef TWINKLE_GRAPH_H
#define TWINKLE_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include "twinkle/export.h"
#include "twinkle/hal.h"

/* Thread-safety: a twk_graph is built by one thread at a time; once built, it may be
 * compiled from several threads (compiling only reads it). A twk_plan belongs to one
 * thread at a time, like the device it runs on. */

#ifdef __cplusplus
extern "C" {
#endif
TWK_API_BEGIN

typedef int32_t twk_id;
typedef struct twk_graph twk_graph;
typedef struct twk_plan twk_plan;

/* A dim of k per token, in a shape given to twk_input/twk_param/twk_reshape. */
#define TWK_TOK(k) (-(int64_t)(k))
#define TWK_T TWK_TOK(1)

/* New empty graph; NULL on allocation failure (message set). */
twk_graph *twk_graph_new(void);
void twk_graph_free(twk_graph *g);

/* TWK_OK, or the first error a builder met (its message is twk_graph_error). */
twk_status twk_graph_status(const twk_graph *g);
const char *twk_graph_error(const twk_graph *g);

/* ---- leaves ---- */
/* Run-time data (tokens, positions, targets, weights); never gets a gradient. */
twk_id twk_input(twk_graph *g, const char *name, twk_dtype t, int ndim, const int64_t *ne);
/* A parameter; `trainable` ones get gradients from twk_graph_backward. */
twk_id twk_param(twk_graph *g, const char *name, int ndim, const int64_t *ne, bool trainable);
/* A parameter of dtype t (f32, or bf16 / f16 for frozen weights and KV caches, which only
 * matmul's b, get_rows' table and the KV-cache ops take); -1 for a trainable non-f32 one. */
twk_id twk_param_dtype(twk_graph *g, const char *name, twk_dtype t, int ndim, const int64_t *ne, bool trainable);
/* A constant tensor with every element `value`. */
twk_id twk_fill(twk_graph *g, int ndim, const int64_t *ne, float value);

/* ---- layout ---- */
/* Same data, new shape (a view; element counts must agree, incl. token dims). */
twk_id twk_reshape(twk_graph *g, twk_id x, int ndim, const int64_t *ne);
/* Axes reordered: out dim i = in dim perm[i]. */
twk_id twk_permute(twk_graph *g, twk_id x, const int *perm);
/* Swaps the last two dims. */
twk_id twk_transpose(twk_graph *g, twk_id x);
/* x[..., start:start+len, ...] along `axis` (a static dim). */
twk_id twk_slice(twk_graph *g, twk_id x, int axis, int64_t start, int64_t len);
/* a and b joined along `axis`; other dims must agree. */
twk_id twk_concat(twk_graph *g, twk_id a, twk_id b, int axis);

/* ---- elementwise (b broadcasts to a: b's dims, right-aligned, equal or 1) ---- */
twk_id twk_add(twk_graph *g, twk_id a, twk_id b);
twk_id twk_mul(twk_graph *g, twk_id a, twk_id b);
twk_id twk_scale(twk_graph *g, twk_id x, float s);
twk_id twk_silu(twk_graph *g, twk_id x);
/* y = op(x) elementwise for any op of kind TWK_OPK_MAP in the op table (silu,
 * gelu: the tanh approximation, gelu_pytorch_tanh; tanh); -1 with TWK_ERR_INVALID_ARG
 * naming the op when it is not a map. */
twk_id twk_map(twk_graph *g, twk_op op, twk_id x);
twk_id twk_swiglu(twk_graph *g, twk_id gate, twk_id up);

/* ---- reductions to a [1] tensor ---- */
twk_id twk_sum(twk_graph *g, twk_id x);
twk_id twk_mean(twk_graph *g, twk_id x);
/* sum(x * w) over all elements; x and w of one shape. */
twk_id twk_weighted_sum(twk_graph *g, twk_id x, twk_id w);

/* ---- linear algebra ---- */
/* op(a) @ op(b) where op transposes the last two dims when asked. Rank 2, or
 * rank 3 with an equal batch dim on both. [.., M, K] @ [.., K, N] -> [.., M, N]. */
twk_id twk_matmul(twk_graph *g, twk_id a, twk_id b, bool trans_a, bool trans_b);

/* ---- transformer ---- */
/* table[ids[i]] for each id: table [V, D], ids i32/i64 [T] -> [T, D]. */
twk_id twk_get_rows(twk_graph *g, twk_id table, twk_id ids);
/* x / sqrt(mean(x^2 over the last dim) + eps) * w; w has the last dim's size. */
twk_id twk_rmsnorm(twk_graph *g, twk_id x, twk_id w, float eps);
/* Rotary embedding, Llama/Qwen half-rotation layout, on x [T, H, D] with
 * positions pos i32 [T]. inv_freq (f32 [D/2]) may be -1: theta^(-2i/D). */
twk_id twk_rope(twk_graph *g, twk_id x, twk_id pos, twk_id inv_freq, float theta);
/* Causal attention within packed segments, grouped-query heads:
 * q [T, Hq, D], k and v [T, Hkv, D] (Hq % Hkv == 0), seg_start i32 [T] = index
 * of the first token of each token's sequence. Scores scaled by `scale`. q, k and v
 * may each be f32, bf16 or f16 (widened as read, accumulated in f32; the output and
 * gradients are f32), on a device whose half_srcs allow it. */
twk_id twk_attention(twk_graph *g, twk_id q, twk_id k, twk_id v, twk_id seg_start,
                     float scale);
/* Writes x [T, H, D] into rows rows[t] of cache [R, H, D] (a parameter or
 * bound tensor, updated in place); the result is the cache after the write,
 * to be read by twk_attention_cached. Not differentiable. */
twk_id twk_kv_write(twk_graph *g, twk_id cache, twk_id x, twk_id rows);
/* Attention of q [T, Hq, D] over cache rows [lo[t], hi[t]) of kc and vc
 * [R, Hkv, D] (grouped-query heads; Hq % Hkv == 0). Not differentiable. */
twk_id twk_attention_cached(twk_graph *g, twk_id q, twk_id kc, twk_id vc, twk_id lo, twk_id hi, float scale);
/* Limits an attention node (twk_attention or twk_attention_cached) to a sliding window: query i
 * sees keys j with i - j < window (0: no window; for the cached form, the last `window` rows before
 * hi), and soft-caps its scores to softcap * tanh(s / softcap) (0: none), as Mistral / Gemma.
 * Returns attn, or -1 (the graph's error set) for another node or a negative window / softcap. */
twk_id twk_attention_limit(twk_graph *g, twk_id attn, int window, float softcap);
/* Per-row matrix from a stack: y[t] = w[slot[t]] @ x[t] for x [T, K] and
 * w [S, N, K] -> [T, N] (LoRA of several adapters in one batch). Each sum runs over k
 * in order, so zero-padded slots (a smaller rank) change nothing. Differentiable in x and w. */
twk_id twk_lora_gather(twk_graph *g, twk_id x, twk_id w, twk_id slot);
/* twk_lora_gather over rows grouped by slot (a mixture of experts' rows sorted by expert; w a
 * frozen expert stack [E, N, K], or [E, K, N] when trans): the same y[t] = w[slot[t]] x[t], which a
 * backend may compute as one product per run of equal slots (the CPU: one sgemm each), so a row
 * no longer sums over k in the plain order. Differentiable in x (both forms) and w. -1 (the
 * graph's error set) on bad shapes or dtypes. */
twk_id twk_lora_gather_grouped(twk_graph *g, twk_id x, twk_id w, twk_id slot, bool trans);
/* The gradient of lora_gather's w: [n_slots, N, K], slot s the sum over the
 * tokens t with slot[t] == s (in token order) of dy[t] x[t]^T (x [T, K], dy [T, N]). */
twk_id twk_lora_gather_back(twk_graph *g, twk_id x, twk_id dy, twk_id slot, int64_t n_slots);
/* ---- mixture of experts (T tokens, E experts, K experts per token) ---- */
/* i32 [T, K]: each row's k largest logits' experts, largest first, ties to the lower expert (as
 * torch.topk); logits f32 [T, E]. Not differentiable. */
twk_id twk_moe_topk(twk_graph *g, twk_id logits, int k);
/* The routing weights [T, K]: softmax(logits)[t, ids[t, j]], divided by their sum over j when
 * `renormalize` (= the softmax over the chosen logits). Differentiable in logits. */
twk_id twk_moe_gate(twk_graph *g, twk_id logits, twk_id ids, bool renormalize);
/* The T*K (token, choice) pairs p = t*K + j grouped by expert (stable: pair order inside an
 * expert), as i32 [T*K]: mode 0 the pair of each grouped row, 1 the row of each pair, 2 the
 * expert of each grouped row (the slot twk_lora_gather reads: one grouped product per weight
 * stack). logits only give E. */
twk_id twk_moe_sort(twk_graph *g, twk_id logits, twk_id ids, int mode);
/* Rows grouped by expert: out[r] = x[order[r] / K] (times w[order[r]] when w >= 0), x [T, H],
 * order / inv: moe_sort's modes 0 / 1 -> [T*K, H]. Differentiable in x (unweighted). */
twk_id twk_moe_dispatch(twk_graph *g, twk_id x, twk_id order, twk_id inv, twk_id w);
/* Back to tokens: out[t] = sum over j in order of w[t, j] y[inv[t*K + j]] (w = 1 when w < 0);
 * y [T*K, H] -> [T, H]. Differentiable in y and w (the routing weights' gradient). */
twk_id twk_moe_combine(twk_graph *g, twk_id y, twk_id order, twk_id inv, twk_id w, int64_t k);
/* The statistics of transformers' load_balancing_loss_func for one layer, f32 [2, E]: row 0 the
 * number of choices (ids [T, K]) of each expert over T, row 1 the mean over the T rows of
 * softmax(logits) (T: the run-time count). Differentiable in logits through row 1 only (the
 * counts have no gradient, as torch's histc). -1 with the graph's error set on bad shapes. */
twk_id twk_moe_router_stats(twk_graph *g, twk_id logits, twk_id ids);
/* The same per slot, f32 [n_slots, 2, E]: row s over the rows t with slot[t] == s (i32 [T]; a slot
 * outside 0..n_slots-1 counts nowhere: padding), each over its own row count. -1 with the
 * graph's error set on bad shapes or n_slots < 1. */
twk_id twk_moe_router_stats_slots(twk_graph *g, twk_id logits, twk_id ids, twk_id slot, int n_slots);
/* log_softmax(logits)[t, targets[t]]: logits [T, V], targets i32/i64 [T] -> [T]. */
twk_id twk_logprobs(twk_graph *g, twk_id logits, twk_id targets);
/* twk_logprobs(h w^T, targets) without the [T, V] logits: h [T, H], a frozen w [V, H] (f32,
 * or bf16 / f16 where the device's half_srcs allow; TWK_ERR_INVALID_ARG when w is a trainable
 * param), targets [T] -> [T]. Kernels hold one token tile of logits at a time
 * (TWK_UNEMBED_TILE_ROWS); the backward (dh) recomputes them. On the CPU bit-identical to
 * twk_logprobs(twk_matmul(h, w, false, true), targets) when the pass is one tile; over several
 * tiles as far as the BLAS gives each row the same bits whatever the row count (OpenBLAS's
 * Haswell kernels do not: last-bit differences); backends without the op say so (twk_device_has_op). */
twk_id twk_unembed_logprobs(twk_graph *g, twk_id h, twk_id w, twk_id targets);
/* Training's twk_unembed_logprobs in two products over the vocabulary and none in its gradient:
 * h [T, H], a frozen w [V, H] (f32, or bf16 / f16 where the device's half_srcs allow), targets
 * [T] -> [T, H + 1], per token the direction g = w[target] - softmax(h w^T) w (columns 0..H-1: the
 * logprob's gradient in h) and the logprob (column H; read it with twk_unembed_dir_logprobs).
 * Kernels run vocabulary chunks of `chunk` words with an online max and sum, for token tiles of
 * `rows` tokens (0 and 0: TWK_UNEMBED_CHUNK, TWK_UNEMBED_DIR_ROWS; tests pass small ones to cross
 * the boundaries), holding a [rows, chunk] tile of logits, never [T, V]. The gradient takes g as a
 * constant: dh = d[:, H] * g (a slice and a broadcast mul), exact for the logprob column; a gradient
 * reaching columns 0..H-1 is not propagated. The logprobs equal the logits path's to a few ulps of
 * the log-sum-exp (the online sum's order). -1 with the graph's error set on bad shapes, a
 * trainable w or a negative chunk / rows; backends without the op say so (twk_device_has_op). */
twk_id twk_unembed_logprobs_dir(twk_graph *g, twk_id h, twk_id w, twk_id targets, int chunk, int rows);
/* The logprobs [T] in column H of twk_unembed_logprobs_dir's output `packed` (a slice and a
 * reshape); -1 with the graph's error set when packed is not that op's node. */
twk_id twk_unembed_dir_logprobs(twk_graph *g, twk_id packed);

/* ---- the optimizer step (not differentiable; ops.h's twk_hyper describes `hyper`) ---- */
/* acc += g in place (acc a parameter or bound tensor of g's shape, no token dims): gradient
 * accumulation across passes; the result is acc after the add. */
twk_id twk_grad_acc(twk_graph *g, twk_id acc, twk_id grad);
/* Sums of squares of x's elements over `parts` equal slices, each as an f32 pair (hi, lo) whose
 * sum is the slice's sum: [parts, 2]. The first stage of the global gradient norm. */
twk_id twk_sqsum_parts(twk_graph *g, twk_id x, int parts);
/* [2]: the norm sqrt(sum of parts) and the clip coefficient of torch.nn.utils.clip_grad_norm_
 * (min(1, max_norm / (norm + 1e-6)); 1 without clipping) from parts [P, 2] and hyper f32 [8]. */
twk_id twk_grad_norm(twk_graph *g, twk_id parts, twk_id hyper);
/* One torch.optim.AdamW step of w in place from grad * norm[1], with moments m and v (updated
 * in place too); grad is zeroed (consumed). Nothing changes when norm[0] is not finite. w, grad,
 * m and v: one shape, parameters or bound tensors; hyper f32 [8]; norm [2] from twk_grad_norm. */
twk_id twk_adamw(twk_graph *g, twk_id w, twk_id grad, twk_id m, twk_id v, twk_id hyper, twk_id norm);
/* ---- autograd ---- */
/* Appends the backward graph of scalar `loss` ([1]): every trainable param
 * that `loss` depends on gets a gradient (see twk_graph_grad). Only tensors
 * on a path from a trainable param get gradient ops; fan-out accumulates.
 * Call once per graph. */
twk_status twk_graph_backward(twk_graph *g, twk_id loss);
/* The gradient of `param` after twk_graph_backward; -1 if it has none. */
twk_id twk_graph_grad(const twk_graph *g, twk_id param);
/* Marks a forward tensor (a layer's input) as a checkpoint for twk_graph_recompute.
 * Call before twk_graph_backward; TWK_ERR_STATE after it, TWK_ERR_INVALID_ARG for a bad id. */
twk_status twk_graph_checkpoint(twk_graph *g, twk_id id);
/* Activation recompute, after twk_graph_backward: the forward tensors strictly between
 * two checkpoints (but the last checkpoint's segment, leaves and outputs) are copied, and
 * the backward reads the copies, computed right before the first backward op that needs
 * them; the forward originals then die as soon as the forward has used them. Ids of
 * existing tensors do not change; plans compiled afterwards run the new order. Gradients
 * are bit-identical on a deterministic backend. TWK_ERR_STATE before backward or twice. */
twk_status twk_graph_recompute(twk_graph *g);
/* Moves node id in the launch order to right after the last of its sources (a gradient's
 * accumulation, launched as soon as the gradient exists rather than at the end of the
 * backward); plans compiled afterwards run the new order, with the same results. Call after
 * twk_graph_recompute (which refuses a graph already reordered). TWK_ERR_INVALID_ARG /
 * TWK_ERR_OOM. */
twk_status twk_graph_hoist(twk_graph *g, twk_id id);
/* Elementwise fusion in this graph's compiled plans (on by default; the environment's
 * TWK_FUSION=0 turns it off for every plan): chains of same-shape elementwise ops whose
 * intermediates nothing else reads become one launch where the device runs fused chains
 * (graph/fuse.c), with results bit-identical to the unfused plan on the CPU.
 * TWK_ERR_INVALID_ARG when g is NULL. */
twk_status twk_graph_set_fusion(twk_graph *g, bool on);

/* ---- inspection ---- */
int twk_graph_size(const twk_graph *g);
/* Host bytes the graph holds (its node storage and autograd tables); 0 for NULL. */
size_t twk_graph_host_bytes(const twk_graph *g);
twk_op twk_node_op(const twk_graph *g, twk_id id);
twk_dtype twk_node_dtype(const twk_graph *g, twk_id id);
/* Writes ne (token dims resolved for n tokens) and returns ndim; -1 bad id. */
int twk_node_shape(const twk_graph *g, twk_id id, int64_t n, int64_t *ne);
const char *twk_node_name(const twk_graph *g, twk_id id);
/* Names a node (for messages and twk_graph_find). */
void twk_node_set_name(twk_graph *g, twk_id id, const char *name);
/* The node named `name`, or -1. */
twk_id twk_graph_find(const twk_graph *g, const char *name);
/* Writes a node's shape like "[T*16, 64] f32" into buf. */
const char *twk_node_shape_str(const twk_graph *g, twk_id id, char *buf, size_t len);

/* Marks a tensor as a plan output: it is computed and kept until the run ends. */
twk_status twk_graph_output(twk_graph *g, twk_id id);

/* ---- compiled plans ---- */

/* A caller-owned buffer a tensor lives in instead of the plan's arena
 * (parameters shared between plans, gradients that persist, ...). */
typedef struct twk_binding {
    twk_id id;
    twk_buffer *buf;
    size_t offset;
} twk_binding;

typedef struct twk_plan_stats {
    int n_nodes_graph;      /* nodes in the graph */
    int n_launches;         /* kernel launches after dead-node removal */
    size_t arena_bytes;     /* peak intermediate memory (planned) */
    size_t naive_bytes;     /* sum of all planned intermediates */
    size_t leaf_bytes;      /* inputs/params the plan allocated itself */
    int arena_shared;       /* runs in a caller's arena (twk_plan_compile_in) */
    size_t host_bytes;      /* the plan's own host bookkeeping (slots, launches, names) */
    int n_launches_unfused; /* launches before elementwise fusion (n_launches when nothing fused) */
    int n_fused_groups;     /* fused launches (each replaces two or more) */
} twk_plan_stats;

/* Compiles the graph's outputs for `dev` at token capacity `capacity` (>= 1):
 * dead-node removal, supports_op checks (an op the backend lacks is an error
 * naming the op, backend and shapes), liveness-based memory planning, arena
 * allocation, backend prepare. Leaves not in `binds` get plan-owned storage.
 * On failure returns an error and *out is NULL. */
twk_status twk_plan_compile(const twk_graph *g, twk_device *dev, int64_t capacity,
                            const twk_binding *binds, int n_binds, twk_plan **out);
/* twk_plan_compile, with the arena in the caller's buffer `arena` when it holds the plan's
 * peak (else, or with NULL, in its own). Plans sharing an arena must never run at the same
 * time and must be read right after their own run; the buffer must outlive them. */
twk_status twk_plan_compile_in(const twk_graph *g, twk_device *dev, int64_t capacity,
                               const twk_binding *binds, int n_binds, twk_buffer *arena, twk_plan **out);
void twk_plan_free(twk_plan *p);

/* Copies host data into a tensor for token count n (bytes must equal the
 * tensor's size at n). TWK_ERR_INVALID_ARG if the tensor has no storage in
 * this plan (it was removed as dead) or the size is wrong. */
twk_status twk_plan_write(twk_plan *p, twk_id id, int64_t n, const void *src, size_t bytes);
/* Copies a tensor's data for token count n to the host (after twk_plan_run). */
twk_status twk_plan_read(twk_plan *p, twk_id id, int64_t n, void *dst, size_t bytes);
/* twk_plan_read of the tensor's first `bytes` only (1 <= bytes <= its size at n): e.g. the leading
 * slots of a stacked tensor. TWK_ERR_INVALID_ARG as twk_plan_read, or for bytes outside that range. */
twk_status twk_plan_read_head(twk_plan *p, twk_id id, int64_t n, void *dst, size_t bytes);
/* Runs the plan for n tokens (1 <= n <= capacity) and waits for it. */
twk_status twk_plan_run(twk_plan *p, int64_t n);
/* The index of the launch that computes node id in the plan's launch list, or -1 (no launch:
 * a leaf, a view, removed as dead). */
int twk_plan_launch_of(const twk_plan *p, twk_id id);
/* Kernel launches run by every plan of this process so far (twk_plan_run and twk_plan_run_cut,
 * counted when the backend accepted the run); any thread. Cannot fail. */
uint64_t twk_plan_launches_run(void);
/* Called by twk_plan_run_cut after segment i (launches before cuts[i]) finished on the device;
 * an error stops the run and is returned. */
typedef twk_status (*twk_plan_cut_fn)(void *ctx, int i);
/* twk_plan_run, in segments: the launches before cuts[0], then at(ctx, 0), the launches before
 * cuts[1], at(ctx, 1), ..., then the rest (cuts ascending, inside 1..n_launches-1). Each segment
 * runs on every backend as a plan of its own over the same launches (prepared once per cut set
 * and kept), so the results are the plan's. TWK_ERR_INVALID_ARG for bad cuts; the backend's and
 * at's errors. n_cuts = 0 is twk_plan_run. */
twk_status twk_plan_run_cut(twk_plan *p, int64_t n, const int *cuts, int n_cuts, twk_plan_cut_fn at, void *ctx);

void twk_plan_get_stats(const twk_plan *p, twk_plan_stats *out);
/* The memory a compile at `capacity` would plan, without a device and without allocating
 * it: the same dead-node removal, storage classes, live ranges and placement as
 * twk_plan_compile (n_launches, arena_bytes, naive_bytes, leaf_bytes of *out; `bound` are
 * the ids a compile would bind). The graph's error, or TWK_ERR_INVALID_ARG for bad ids. */
twk_status twk_plan_estimate(const twk_graph *g, int64_t capacity, const twk_id *bound, int n_bound,
                             twk_plan_stats *out);
/* The backend-facing launch list (for tests and tools). */
const twk_hal_plan *twk_plan_hal(const twk_plan *p);
/* Arena placement of a tensor: offset/size in bytes at capacity and the
 * launch range [first, last] during which it is live. false if the tensor is
 * not placed in the arena (bound, leaf, view or dead). */
bool twk_plan_placement(const twk_plan *p, twk_id id, size_t *offset, size_t *bytes,
                        int *first, int *last);
/* Checks that no two arena tensors live at the same time overlap in memory;
 * TWK_OK or TWK_ERR_STATE naming the pair. */
twk_status twk_plan_validate_memory(const twk_plan *p);

TWK_API_END
#ifdef __cplusplus
}
#endif
#endif
