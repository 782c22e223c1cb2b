/* twinkle — the op table: the one place every op is named and described.
 *
 * Owned by graph/; included by hal/ and every backend (a backend sees only
 * hal/ and this table). Each row:
 *
 *   X(ENUM, "name", nsrc, KIND, index, checked, diff, BACK, TOL, IDS)
 *
 *   nsrc     required sources; -1 means variable (see graph.h)
 *   KIND     how the plan stores the output and whether a kernel runs (twk_op_kind)
 *   index    sources holding indices (i32 or i64), as a mask of TWK_SRC(i)
 *   checked  the index sources whose values kernels range-check (positions are not)
 *   diff     sources gradients flow to (autograd); TWK_SRC_ALL for every source
 *   BACK     for a MAP: the op computing dx from (x, dy); NONE otherwise
 *   TOL      tolerance class of the op's results across backends (twk_op_tol)
 *   IDS      how the checked sources are checked and what bounds them (twk_op_ids), for
 *            the one wording of bad-id errors every backend shares (twk_launch_bad_id)
 *
 * Every fact about an op that more than one layer needs is a column here;
 * code reads it through twk_op_info() instead of switching on op kinds. */
#ifndef TWINKLE_OPS_H
#define TWINKLE_OPS_H

#include <stdbool.h>

#include "twinkle/export.h"

/* Thread-safety: the op table is read-only; every function here may be called from any thread. */

#ifdef __cplusplus
extern "C" {
#endif
TWK_API_BEGIN

#define TWK_SRC(i) (1u << (i))
#define TWK_SRC_ALL 0xffu
/* IDS: TWK_IDS(check, "name", "range name", bound source (-1 the output), bound dim) */
#define TWK_IDS(check, what, in, src, dim) {TWK_IDS_##check, what, in, src, dim}
#define TWK_NO_IDS {TWK_IDS_NONE, "", "", 0, 0}

/* clang-format off */
#define TWK_OP_LIST(X)                                                                                          \
    /* leaves: no kernel; their storage is bound or planned */                                                  \
    X(INPUT,          "input",          0, LEAF,    0,                    0,                    0,           NONE, EXACT, TWK_NO_IDS) \
    X(PARAM,          "param",          0, LEAF,    0,                    0,                    0,           NONE, EXACT, TWK_NO_IDS) \
    X(FILL,           "fill",           0, COMPUTE, 0,                    0,                    0,           NONE, EXACT, TWK_NO_IDS) /* every element = fparam[0] */ \
    /* layout (RESHAPE is a view; the others copy) */                                                           \
    X(RESHAPE,        "reshape",        1, VIEW,    0,                    0,                    TWK_SRC_ALL, NONE, EXACT, TWK_NO_IDS) \
    X(PERMUTE,        "permute",        1, COPY,    0,                    0,                    TWK_SRC_ALL, NONE, EXACT, TWK_NO_IDS) /* iparams = axis order */ \
    X(SLICE,          "slice",          1, COPY,    0,                    0,                    TWK_SRC_ALL, NONE, EXACT, TWK_NO_IDS) /* axis, start */ \
    X(SLICE_BACK,     "slice_back",     1, COPY,    0,                    0,                    TWK_SRC_ALL, NONE, EXACT, TWK_NO_IDS) /* zeros with src at axis/start */ \
    X(CONCAT,         "concat",         2, COPY,    0,                    0,                    TWK_SRC_ALL, NONE, EXACT, TWK_NO_IDS) /* along axis */ \
    X(BROADCAST,      "broadcast",      1, COMPUTE, 0,                    0,                    TWK_SRC_ALL, NONE, EXACT, TWK_NO_IDS) /* src broadcast to dst shape */ \
    X(SUM_TO,         "sum_to",         1, COMPUTE, 0,                    0,                    TWK_SRC_ALL, NONE, ACCUM, TWK_NO_IDS) /* sum src down to dst shape */ \
    /* elementwise */                                                                                           \
    X(ADD,            "add",            2, COMPUTE, 0,                    0,                    TWK_SRC_ALL, NONE, EXACT, TWK_NO_IDS) /* b broadcasts to a */ \
    X(MUL,            "mul",            2, COMPUTE, 0,                    0,                    TWK_SRC_ALL, NONE, EXACT, TWK_NO_IDS) /* b broadcasts to a */ \
    X(SCALE,          "scale",          1, COMPUTE, 0,                    0,                    TWK_SRC_ALL, NONE, EXACT, TWK_NO_IDS) /* x * fparam[0] */ \
    X(SILU,           "silu",           1, MAP,     0,                    0,                    TWK_SRC_ALL, SILU_BACK, TRANSCENDENTAL, TWK_NO_IDS) \
    X(SILU_BACK,      "silu_back",      2, COMPUTE, 0,                    0,                    TWK_SRC_ALL, NONE, TRANSCENDENTAL, TWK_NO_IDS) /* (x, dy) */ \
    X(SWIGLU,         "swiglu",         2, COMPUTE, 0,                    0,                    TWK_SRC_ALL, NONE, TRANSCENDENTAL, TWK_NO_IDS) /* silu(gate) * up */ \
    X(SWIGLU_BACK,    "swiglu_back",    3, COMPUTE, 0,                    0,                    TWK_SRC_ALL, NONE, TRANSCENDENTAL, TWK_NO_IDS) /* (gate, up, dy); iparam 0: d/dgate, 1: d/dup */ \
    X(GELU,           "gelu",           1, MAP,     0,                    0,                    TWK_SRC_ALL, GELU_BACK, TRANSCENDENTAL, TWK_NO_IDS) /* tanh approximation (gelu_pytorch_tanh) */ \
    X(GELU_BACK,      "gelu_back",      2, COMPUTE, 0,                    0,                    TWK_SRC_ALL, NONE, TRANSCENDENTAL, TWK_NO_IDS) /* (x, dy) */ \
    X(TANH,           "tanh",           1, MAP,     0,                    0,                    TWK_SRC_ALL, TANH_BACK, TRANSCENDENTAL, TWK_NO_IDS) /* Gemma's final-logit soft-cap: cap * tanh(x / cap) */ \
    X(TANH_BACK,      "tanh_back",      2, COMPUTE, 0,                    0,                    TWK_SRC_ALL, NONE, TRANSCENDENTAL, TWK_NO_IDS) /* (x, dy): dy (1 - tanh^2 x) */ \
    /* reductions */                                                                                            \
    X(SUM,            "sum",            1, COMPUTE, 0,                    0,                    TWK_SRC_ALL, NONE, ACCUM, TWK_NO_IDS) /* all elements -> [1] */ \
    X(MEAN,           "mean",           1, COMPUTE, 0,                    0,                    TWK_SRC_ALL, NONE, ACCUM, TWK_NO_IDS) /* all elements -> [1] */ \
    X(WEIGHTED_SUM,   "weighted_sum",   2, COMPUTE, 0,                    0,                    TWK_SRC_ALL, NONE, ACCUM, TWK_NO_IDS) /* sum(x * w) -> [1] */ \
    /* linear algebra */                                                                                        \
    X(MATMUL,         "matmul",         2, COMPUTE, 0,                    0,                    TWK_SRC_ALL, NONE, ACCUM, TWK_NO_IDS) /* iparams: trans_a, trans_b */ \
    /* transformer */                                                                                           \
    X(GET_ROWS,       "get_rows",       2, COMPUTE, TWK_SRC(1),           TWK_SRC(1),           TWK_SRC(0),  NONE, EXACT, TWK_IDS(RANGE, "ids", "", 0, 0)) /* (table [V,D], ids [T]) */ \
    X(GET_ROWS_BACK,  "get_rows_back",  2, COMPUTE, TWK_SRC(1),           TWK_SRC(1),           TWK_SRC(0),  NONE, ACCUM, TWK_IDS(RANGE, "ids", "", -1, 0)) /* (dy [T,D], ids [T]) -> [V,D] */ \
    X(RMSNORM,        "rmsnorm",        2, COMPUTE, 0,                    0,                    TWK_SRC_ALL, NONE, ACCUM, TWK_NO_IDS) /* (x, w); fparam eps */ \
    X(RMSNORM_BACK_X, "rmsnorm_back_x", 3, COMPUTE, 0,                    0,                    TWK_SRC_ALL, NONE, ACCUM, TWK_NO_IDS) /* (x, w, dy) */ \
    X(RMSNORM_BACK_W, "rmsnorm_back_w", 2, COMPUTE, 0,                    0,                    TWK_SRC_ALL, NONE, ACCUM, TWK_NO_IDS) /* (x, dy) -> [D]; fparam eps */ \
    X(ROPE,           "rope",          -1, COMPUTE, TWK_SRC(1),           0,                    TWK_SRC(0),  NONE, ACCUM, TWK_NO_IDS) /* (x [T,H,D], pos [T] [, inv_freq [D/2]]) */ \
    X(ATTN,           "attn",           4, COMPUTE, TWK_SRC(3),           TWK_SRC(3),           TWK_SRC(0) | TWK_SRC(1) | TWK_SRC(2), NONE, ACCUM, TWK_IDS(SEGMENTS, "seg_start", "", 0, 0)) /* (q, k, v, seg_start) */ \
    X(ATTN_LSE,       "attn_lse",       3, COMPUTE, TWK_SRC(2),           TWK_SRC(2),           TWK_SRC_ALL, NONE, ACCUM, TWK_IDS(SEGMENTS, "seg_start", "", 0, 0)) /* (q, k, seg_start) -> [T,Hq] */ \
    X(ATTN_BACK,      "attn_back",      7, COMPUTE, TWK_SRC(3),           TWK_SRC(3),           TWK_SRC_ALL, NONE, ACCUM, TWK_IDS(SEGMENTS, "seg_start", "", 0, 0)) /* (q,k,v,seg,o,dO,lse); iparam 0: which */ \
    X(LOGPROBS,       "logprobs",       2, COMPUTE, TWK_SRC(1),           TWK_SRC(1),           TWK_SRC(0),  NONE, ACCUM, TWK_IDS(RANGE, "targets", "", 0, 1)) /* (logits [T,V], targets [T]) -> [T] */ \
    X(LOGPROBS_BACK,  "logprobs_back",  4, COMPUTE, TWK_SRC(1),           TWK_SRC(1),           TWK_SRC_ALL, NONE, ACCUM, TWK_IDS(RANGE, "targets", "", 0, 1)) /* (logits, targets, dy, logprobs) -> [T,V] */ \
    /* logprobs without the [T, V] logits: the unembedding fused in, token tiles of TWK_UNEMBED_TILE_ROWS */     \
    X(UNEMBED_LOGPROBS, "unembed_logprobs", 3, COMPUTE, TWK_SRC(2),       TWK_SRC(2),           TWK_SRC(0),  NONE, ACCUM, TWK_IDS(RANGE, "targets", "", 1, 0)) /* (h [T,H], w [V,H] frozen, targets [T]) -> [T] */ \
    X(UNEMBED_LOGPROBS_BACK, "unembed_logprobs_back", 5, COMPUTE, TWK_SRC(2), TWK_SRC(2),       0,           NONE, ACCUM, TWK_IDS(RANGE, "targets", "", 1, 0)) /* (h, w, targets, dy, logprobs) -> dh [T,H] */ \
    /* training's unembedding in two products (vocabulary chunks; its gradient needs no product): the logprob and dh's direction */ \
    X(UNEMBED_LOGPROBS_DIR, "unembed_logprobs_dir", 3, COMPUTE, TWK_SRC(2), TWK_SRC(2),        TWK_SRC(0),  NONE, ACCUM, TWK_IDS(RANGE, "targets", "", 1, 0)) /* (h [T,H], w [V,H] frozen, targets [T]) -> [T,H+1]: g = w[target] - softmax(h w^T) w, then the logprob; ip: chunk words, tile tokens (0: TWK_UNEMBED_CHUNK, TWK_UNEMBED_DIR_ROWS) */ \
    /* decoding with a KV cache (no gradients) */                                                               \
    X(KV_WRITE,       "kv_write",       3, INPLACE, TWK_SRC(2),           TWK_SRC(2),           0,           NONE, EXACT, TWK_IDS(RANGE, "rows", "the cache ", -1, 0)) /* (cache [R,H,D], x [T,H,D], rows [T]) */ \
    X(ATTN_CACHE,     "attn_cache",     5, COMPUTE, TWK_SRC(3) | TWK_SRC(4), TWK_SRC(3) | TWK_SRC(4), 0,     NONE, ACCUM, TWK_IDS(ROWS, "rows", "", 1, 0)) /* (q [T,Hq,D], kc, vc [R,Hkv,D], lo [T], hi [T]) */ \
    /* multi-adapter LoRA (the sampler's adapter slots; packed training of several runs) */                    \
    X(LORA_GATHER,    "lora_gather",    3, COMPUTE, TWK_SRC(2),           TWK_SRC(2),           TWK_SRC(0) | TWK_SRC(1), NONE, ACCUM, TWK_IDS(RANGE, "slot", "", 1, 0)) /* (x [T,K], w [S,N,K], slot [T]) -> [T,N]: w[slot[t]] x[t], sums over k in order */ \
    X(LORA_GATHER_BACK, "lora_gather_back", 3, COMPUTE, TWK_SRC(2),       TWK_SRC(2),           0,           NONE, ACCUM, TWK_IDS(RANGE, "slot", "", -1, 0)) /* (x [T,K], dy [T,N], slot [T]) -> [S,N,K]: per slot, sum of dy[t] x[t]^T over its tokens in token order */ \
    /* mixture of experts: routing (T tokens, E experts, K choices each; the T*K (token, choice) pairs grouped by expert) */ \
    X(MOE_TOPK,       "moe_topk",       1, COMPUTE, 0,                    0,                    0,           NONE, EXACT, TWK_NO_IDS) /* logits [T,E] -> i32 [T,K]: the K largest, ties to the lower index (torch.topk) */ \
    X(MOE_GATE,       "moe_gate",       2, COMPUTE, TWK_SRC(1),           TWK_SRC(1),           TWK_SRC(0),  NONE, TRANSCENDENTAL, TWK_IDS(RANGE, "experts", "", 0, 1)) /* (logits [T,E], ids [T,K]) -> [T,K]: softmax(logits)[ids]; iparam 0: renormalised over the K */ \
    X(MOE_GATE_BACK,  "moe_gate_back",  3, COMPUTE, TWK_SRC(1),           TWK_SRC(1),           0,           NONE, TRANSCENDENTAL, TWK_IDS(RANGE, "experts", "", 0, 1)) /* (logits, ids, dy [T,K]) -> [T,E] */ \
    X(MOE_SORT,       "moe_sort",       2, COMPUTE, TWK_SRC(1),           TWK_SRC(1),           0,           NONE, EXACT, TWK_IDS(RANGE, "experts", "", 0, 1)) /* (logits [T,E], ids [T,K]) -> i32 [T*K], pairs by expert, stable; iparam 0: 0 row -> pair, 1 pair -> row, 2 row -> expert */ \
    X(MOE_DISPATCH,   "moe_dispatch",  -1, COMPUTE, TWK_SRC(1) | TWK_SRC(2), 0,                 TWK_SRC(0),  NONE, EXACT, TWK_NO_IDS) /* (x [T,H], order, inv [T*K] [, w [T,K]]) -> [T*K,H]: row r = x[order[r] / K] (* w[order[r]]) */ \
    X(MOE_COMBINE,    "moe_combine",   -1, COMPUTE, TWK_SRC(1) | TWK_SRC(2), 0,                 TWK_SRC(0) | TWK_SRC(3), NONE, ACCUM, TWK_NO_IDS) /* (y [T*K,H], order, inv [, w [T,K]]) -> [T,H]: sum over j in order of (w[t,j] *) y[inv[t*K+j]] */ \
    X(MOE_COMBINE_BACK_W, "moe_combine_back_w", 4, COMPUTE, TWK_SRC(1) | TWK_SRC(2), 0,         0,           NONE, ACCUM, TWK_NO_IDS) /* (y, order, inv, dout [T,H]) -> [T,K]: dot(dout[t], y[inv[t*K+j]]) */ \
    X(MOE_ROUTER_STATS, "moe_router_stats", -1, COMPUTE, TWK_SRC(1) | TWK_SRC(2), TWK_SRC(1),   TWK_SRC(0),  NONE, ACCUM, TWK_IDS(RANGE, "experts", "", 0, 1)) /* (logits [T,E], ids [T,K] [, slot [T]]) -> [2,E] ([S,2,E]: per slot, rows of a slot outside 0..S-1 skipped): the choices per expert / the rows, the mean softmax (load-balancing loss) */ \
    X(MOE_ROUTER_STATS_BACK, "moe_router_stats_back", -1, COMPUTE, TWK_SRC(2), 0,                 0,           NONE, TRANSCENDENTAL, TWK_NO_IDS) /* (logits [T,E], dy [2,E] or [S,2,E] [, slot [T]]) -> [T,E]: through the mean softmax only */ \
    /* the optimizer step on the device (no gradients; hyper = twk_optim_hyper's 8 floats) */                  \
    X(GRAD_ACC,       "grad_acc",       2, INPLACE, 0,                    0,                    0,           NONE, EXACT, TWK_NO_IDS) /* (acc, g): acc += g */ \
    X(SQSUM_PARTS,    "sqsum_parts",    1, COMPUTE, 0,                    0,                    0,           NONE, ACCUM, TWK_NO_IDS) /* x [N] -> [P,2]: sum x^2 of slice p as (hi, lo) */ \
    X(GRAD_NORM,      "grad_norm",      2, COMPUTE, 0,                    0,                    0,           NONE, ACCUM, TWK_NO_IDS) /* (parts [P,2], hyper) -> [2]: norm, clip coefficient */ \
    X(ADAMW,          "adamw",          6, INPLACE, 0,                    0,                    0,           NONE, TRANSCENDENTAL, TWK_NO_IDS) /* (w, g, m, v, hyper, norm) -> w; also writes m, v and zeroes g */ \
    /* made by the plan compiler's fusion pass (graph/fuse.c), never built: a chain of same-shape elementwise ops, one launch */ \
    X(FUSED_EW,       "fused_ew",      -1, COMPUTE, 0,                    0,                    0,           NONE, TRANSCENDENTAL, TWK_NO_IDS) /* srcs all of dst's shape; ip[k] = step k (TWK_FUSE_STEP in twk_backend.h), fp[k] its fparam */ \
    /* made by the fusion pass too: Qwen3's per-head norm of q or k and the rotation after it, one launch */ \
    X(RMSNORM_ROPE,   "rmsnorm_rope",  -1, COMPUTE, TWK_SRC(2),           0,                    0,           NONE, ACCUM, TWK_NO_IDS) /* (x [T,H,D], w [D], pos [T] [, inv_freq [D/2]]): rope(rmsnorm(x, w)); fp[0] eps, fp[1] theta, ip[0] rope's inverse flag */ \
    X(ROPE_RMSNORM_BACK_X, "rope_rmsnorm_back_x", -1, COMPUTE, TWK_SRC(3),     0,                    0,           NONE, ACCUM, TWK_NO_IDS) /* (x, w, dy [T,H,D], pos [T] [, inv_freq]): rmsnorm_back_x(x, w, rope(dy)), the backward's pair (rope's ip[0] the inverse); fp[0] eps, fp[1] theta */

/* The sources that may hold bf16 / f16 (frozen weights, KV caches, attention's q, k, v, each on
 * its own), X(OP, mask), on a backend whose kernels widen them to f32 (its half_srcs;
 * twk_device_half_srcs); KV_WRITE's output is its cache's dtype, every other output f32. */
#define TWK_OP_HALF_SRCS(X) \
    X(MATMUL, TWK_SRC(1)) X(GET_ROWS, TWK_SRC(0)) X(KV_WRITE, TWK_SRC(0)) X(ATTN_CACHE, TWK_SRC(1) | TWK_SRC(2)) \
    X(ATTN, TWK_SRC(0) | TWK_SRC(1) | TWK_SRC(2)) X(ATTN_LSE, TWK_SRC(0) | TWK_SRC(1)) \
    X(ATTN_BACK, TWK_SRC(0) | TWK_SRC(1) | TWK_SRC(2)) \
    X(UNEMBED_LOGPROBS, TWK_SRC(1)) X(UNEMBED_LOGPROBS_BACK, TWK_SRC(1)) X(UNEMBED_LOGPROBS_DIR, TWK_SRC(1)) \
    X(LORA_GATHER, TWK_SRC(1))
/* The ops whose output is i32 indices (the routing of a mixture of experts), X(OP). */
#define TWK_OP_INDEX_OUT(X) X(MOE_TOPK) X(MOE_SORT)
/* clang-format on */

/* The optimizer's hyper-parameter vector (f32 [TWK_HYPER_N]), a run-time input of GRAD_NORM and
 * ADAMW so a new learning rate needs no recompile: torch.optim.AdamW's constants for one step. */
enum twk_hyper {
    TWK_HYPER_CLIP = 0,      /* max global norm (clip_grad_norm_'s max_norm); 0: no clipping */
    TWK_HYPER_BETA1 = 1,
    TWK_HYPER_BETA2 = 2,
    TWK_HYPER_EPS = 3,
    TWK_HYPER_STEP_SIZE = 4, /* lr / (1 - beta1^step) */
    TWK_HYPER_C2_SQRT = 5,   /* sqrt(1 - beta2^step) */
    TWK_HYPER_DECAY = 6,     /* 1 - lr * weight_decay */
    TWK_HYPER_N = 8
};
/* The CPU's f32 products give a row of C the same bits wherever it sits when it sits at a multiple
 * of TWK_GEMM_ROW_PERIOD rows in a product of a multiple of it: OpenBLAS's sgemm kernels tile the
 * rows (its N, row-major) in blocks whose rows are summed in different instruction orders — 12 (two
 * halves of 6) on Haswell / Zen, 16 on SkylakeX — and the CPU backend splits a product between its
 * threads only at multiples of the period (never OpenBLAS's own split). Packed multi-LoRA passes
 * (train/lora_pack.c) start each run's segment at a multiple of it. */
#define TWK_GEMM_ROW_PERIOD 48
/* UNEMBED_LOGPROBS: a kernel holds at most one tile of [rows, V] logits, rows =
 * TWK_UNEMBED_TILE_ROWS(V, T) (2^24 floats, 64 MiB, at least 16 rows, at most T): the CPU's
 * scratch; the OpenCL / CUDA / Vulkan kernels hold 8 tokens x 256 words in local memory instead. */
#define TWK_UNEMBED_TILE_FLOATS ((int64_t)1 << 24)
#define TWK_UNEMBED_TILE_ROWS(V, T)                                                                     \
    ((T) < 16 || TWK_UNEMBED_TILE_FLOATS / (V) >= (T) ? (T) : TWK_UNEMBED_TILE_FLOATS / (V) < 16 ? 16 \
                                                                                  : TWK_UNEMBED_TILE_FLOATS / (V))
/* UNEMBED_LOGPROBS_DIR: the vocabulary in chunks of TWK_UNEMBED_CHUNK(V) words (2048; fixed, so a
 * token's sums run in the same order whatever the pass's token count), each chunk's [rows, C]
 * logits for token tiles of TWK_UNEMBED_DIR_ROWS(C, T) tokens (within TWK_UNEMBED_TILE_FLOATS: every
 * token of a pass up to 8192; past it tiles of 8160, a multiple of TWK_GEMM_ROW_PERIOD). The CPU's scratch, in floats: the tile, a 16-bit w's chunk widened
 * to f32 ([C, H]) and three floats per token (running max, sum, target logit). */
#define TWK_UNEMBED_CHUNK_WORDS 2048
#define TWK_UNEMBED_CHUNK(V) ((V) < TWK_UNEMBED_CHUNK_WORDS ? (V) : TWK_UNEMBED_CHUNK_WORDS)
#define TWK_UNEMBED_DIR_ROWS(C, T)                                                                      \
    (TWK_UNEMBED_TILE_FLOATS / (C) >= (T) ? (T)                                                         \
     : TWK_UNEMBED_TILE_FLOATS / (C) < TWK_GEMM_ROW_PERIOD ? TWK_UNEMBED_TILE_FLOATS / (C)               \
                                                           : TWK_UNEMBED_TILE_FLOATS / (C) / TWK_GEMM_ROW_PERIOD * TWK_GEMM_ROW_PERIOD)
#define TWK_UNEMBED_DIR_SCRATCH(C, rows, H, T, half) ((rows) * (C) + ((half) ? (C) * (H) : 0) + 3 * (T))
/* MATMUL with a 16-bit b: a kernel widens b to f32 in panels of TWK_HALF_PANEL_ROWS(row, total)
 * contiguous rows of `row` elements (2^20 floats, 4 MiB, at least 16 rows, at most total). */
#define TWK_HALF_PANEL_FLOATS ((int64_t)1 << 20)
#define TWK_HALF_PANEL_ROWS(row, total)                                                                 \
    (TWK_HALF_PANEL_FLOATS / (row) < 16 ? ((total) < 16 ? (total) : 16)                              \
                                         : TWK_HALF_PANEL_FLOATS / (row) > (total) ? (total) : TWK_HALF_PANEL_FLOATS / (row))

typedef enum twk_op {
#define TWK_OP_ENUM_(e, ...) TWK_OP_##e,
    TWK_OP_LIST(TWK_OP_ENUM_)
#undef TWK_OP_ENUM_
    TWK_OP_COUNT,
    TWK_OP_NONE = TWK_OP_COUNT /* "no op" in the BACK column */
} twk_op;

/* How an op's output is stored and whether a backend runs a kernel for it. */
typedef enum twk_op_kind {
    TWK_OPK_LEAF,    /* no kernel: storage bound by the caller or planned (input, param) */
    TWK_OPK_VIEW,    /* no kernel: aliases source 0's storage (reshape) */
    TWK_OPK_COPY,    /* a kernel that only moves elements: any dtype of one size */
    TWK_OPK_INPLACE, /* a kernel that writes into source 0's storage (kv_write) */
    TWK_OPK_MAP,     /* y = f(x) elementwise on f32, no parameters; dx = BACK(x, dy) */
    TWK_OPK_COMPUTE, /* any other kernel: f32 from f32 and index sources */
} twk_op_kind;

/* How closely two backends agree on an op (backend_ops' NMSE tolerances). */
typedef enum twk_op_tol {
    TWK_TOL_EXACT,          /* copies and single roundings */
    TWK_TOL_TRANSCENDENTAL, /* exp / tanh from another math library */
    TWK_TOL_ACCUM,          /* sums in another order (reductions, GEMM, attention) */
} twk_op_tol;

/* How kernels check an op's checked index sources (the IDS column). */
typedef enum twk_id_check {
    TWK_IDS_NONE,
    TWK_IDS_RANGE,    /* each id in [0, bound) */
    TWK_IDS_SEGMENTS, /* segment starts: each is the previous token's start or the token itself */
    TWK_IDS_ROWS,     /* (lo, hi) from two sources: a non-empty row range inside [0, bound) */
} twk_id_check;

typedef struct twk_op_ids {
    twk_id_check check;
    const char *what;   /* the ids' name in messages ("ids", "targets", "rows", "slot", "seg_start") */
    const char *in;     /* words before the range ("the cache ") */
    signed char bound_src, bound_dim; /* the bound: dim bound_dim of source bound_src (-1: the output) */
} twk_op_ids;

/* One row of the op table. */
typedef struct twk_op_traits {
    const char *name;
    int nsrc;          /* required sources; -1 variable */
    twk_op_kind kind;
    unsigned index;    /* bit i: source i holds indices */
    unsigned checked;  /* bit i: index source i is range-checked by kernels */
    unsigned diff;     /* bit i: gradients flow to source i */
    twk_op back;       /* MAP: the gradient op (x, dy) -> dx; else TWK_OP_NONE */
    twk_op_tol tol;
    twk_op_ids ids;    /* checked sources: the first set bit of `checked` (ROWS: it and the next) */
} twk_op_traits;

/* The op's row; a row named "?" (no sources, kind LEAF) for an out-of-range value. */
const twk_op_traits *twk_op_info(twk_op op);
/* The op's lower-case name ("matmul"); "?" for an out-of-range value. */
const char *twk_op_name(twk_op op);
/* The op's TWK_OP_HALF_SRCS mask; 0 for the other ops. */
unsigned twk_op_half_srcs(twk_op op);
/* Whether op's output is i32 indices (TWK_OP_INDEX_OUT); false for the other ops. */
bool twk_op_index_out(twk_op op);
/* Whether a backend runs a kernel for op (every kind but LEAF and VIEW). */
bool twk_op_has_kernel(twk_op op);

TWK_API_END
#ifdef __cplusplus
}
#endif

#endif
