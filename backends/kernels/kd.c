/* kd: the kernel table (one entry per op: its lowering, or why the kernels
 * do not run it), which launches the shared kernels run (kd_supports), GEMM
 * descriptions for the BLAS, and kd_lower's dispatch through the table. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kd_internal.h"

/* One op's entry: `lower` writes its calls (given `kernel`, for the lowerings
 * several ops share); `gemm` hands it to the backend's BLAS; `unsupported`
 * says why the kernels do not run an op that has a CPU kernel. */
typedef struct kd_entry {
    kd_lower_fn lower;
    const char *kernel;
    int gemm;
    const char *unsupported;
    kd_wide_fn wide; /* the wide reduction tried first (kd_lower_reduce.c) */
} kd_entry;

static const kd_entry table[TWK_OP_COUNT] = {
    [TWK_OP_FILL] = {kd_lower_map_f, "fill_f32"},
    [TWK_OP_PERMUTE] = {kd_lower_permute, "permute_words"},
    [TWK_OP_SLICE] = {kd_lower_slice, "copy_axis_words"},
    [TWK_OP_SLICE_BACK] = {kd_lower_slice_back, "copy_axis_words"},
    [TWK_OP_CONCAT] = {kd_lower_concat, "copy_axis_words"},
    [TWK_OP_BROADCAST] = {kd_lower_broadcast, "broadcast_f32"},
    [TWK_OP_SUM_TO] = {kd_lower_sum_to, "sum_to_f32", .wide = kd_wide_sum},
    [TWK_OP_ADD] = {kd_lower_binary, "binary_f32"},
    [TWK_OP_MUL] = {kd_lower_binary, "binary_f32"},
    [TWK_OP_SCALE] = {kd_lower_map_f, "scale_f32"},
    [TWK_OP_SILU] = {kd_lower_map, "silu_f32"},
    [TWK_OP_SILU_BACK] = {kd_lower_map, "silu_back_f32"},
    [TWK_OP_SWIGLU] = {kd_lower_map, "swiglu_f32"},
    [TWK_OP_SWIGLU_BACK] = {kd_lower_map_i, "swiglu_back_f32"},
    [TWK_OP_GELU] = {kd_lower_map, "gelu_f32"},
    [TWK_OP_GELU_BACK] = {kd_lower_map, "gelu_back_f32"},
    [TWK_OP_TANH] = {kd_lower_map, "tanh_f32"},
    [TWK_OP_TANH_BACK] = {kd_lower_map, "tanh_back_f32"},
    [TWK_OP_SUM] = {kd_lower_reduce, "reduce_sum_f32", .wide = kd_wide_sum},
    [TWK_OP_MEAN] = {kd_lower_reduce, "reduce_sum_f32", .wide = kd_wide_sum},
    [TWK_OP_WEIGHTED_SUM] = {kd_lower_reduce, "reduce_sum_f32", .wide = kd_wide_sum},
    [TWK_OP_MATMUL] = {.gemm = 1},
    [TWK_OP_GET_ROWS] = {kd_lower_get_rows, "get_rows_f32"},
    [TWK_OP_GET_ROWS_BACK] = {kd_lower_get_rows_back, "get_rows_back_f32"},
    [TWK_OP_RMSNORM] = {kd_lower_rmsnorm, "rmsnorm_f32"},
    [TWK_OP_RMSNORM_BACK_X] = {kd_lower_rmsnorm, "rmsnorm_back_x_f32"},
    [TWK_OP_RMSNORM_BACK_W] = {kd_lower_rmsnorm_back_w, "rmsnorm_back_w_f32", .wide = kd_wide_rmsnorm_back_w},
    [TWK_OP_ROPE] = {kd_lower_rope, "rope_f32"},
    [TWK_OP_ATTN] = {kd_lower_attn_fwd, "attn_fwd_f32"},
    [TWK_OP_ATTN_LSE] = {kd_lower_attn_fwd, "attn_fwd_f32"},
    [TWK_OP_ATTN_BACK] = {kd_lower_attn_back, NULL},
    [TWK_OP_LOGPROBS] = {kd_lower_logprobs, "logprobs_f32"},
    [TWK_OP_LOGPROBS_BACK] = {kd_lower_logprobs_back, "logprobs_back_f32"},
    [TWK_OP_UNEMBED_LOGPROBS] = {kd_lower_unembed, "unembed_logprobs_f32"},
    [TWK_OP_UNEMBED_LOGPROBS_BACK] = {kd_lower_unembed, "unembed_logprobs_back_f32"},
    [TWK_OP_UNEMBED_LOGPROBS_DIR] = {.unsupported = "the two-product unembedding is the CPU's: its chunks run through the BLAS; this backend's trainers take unembed_logprobs (+ back), whose tiles stay in work-group memory"},
    [TWK_OP_KV_WRITE] = {kd_lower_kv_write, "kv_write_f32"},
    [TWK_OP_ATTN_CACHE] = {kd_lower_attn_fwd, "attn_fwd_f32"},
    [TWK_OP_LORA_GATHER] = {kd_lower_lora_gather, "lora_gather_f32"},
    [TWK_OP_GRAD_ACC] = {kd_lower_map, "grad_acc_f32"},
    [TWK_OP_SQSUM_PARTS] = {kd_lower_sqsum_parts, "sqsum_parts_f32", .wide = kd_wide_sqsum_parts},
    [TWK_OP_GRAD_NORM] = {kd_lower_grad_norm, "grad_norm_f32", .wide = kd_wide_grad_norm},
    [TWK_OP_ADAMW] = {kd_lower_adamw, "adamw_f32"},
    [TWK_OP_MOE_TOPK] = {kd_lower_moe_topk, "moe_topk_f32"},
    [TWK_OP_MOE_GATE] = {kd_lower_moe_gate, "moe_gate_f32"},
    [TWK_OP_MOE_GATE_BACK] = {kd_lower_moe_gate, "moe_gate_back_f32"},
    [TWK_OP_MOE_SORT] = {kd_lower_moe_sort, "moe_sort_i32"},
    [TWK_OP_MOE_DISPATCH] = {kd_lower_moe_move, "moe_dispatch_f32"},
    [TWK_OP_MOE_COMBINE] = {kd_lower_moe_move, "moe_combine_f32"},
    [TWK_OP_MOE_COMBINE_BACK_W] = {kd_lower_moe_combine_back_w, "moe_combine_back_w_f32"},
    [TWK_OP_MOE_ROUTER_STATS] = {kd_lower_moe_router_stats, "moe_router_stats_f32"},
    [TWK_OP_MOE_ROUTER_STATS_BACK] = {kd_lower_moe_router_stats, "moe_router_stats_back_f32"},
    [TWK_OP_LORA_GATHER_BACK] = {kd_lower_lora_gather_back, "lora_gather_back_f32"},
    [TWK_OP_FUSED_EW] = {kd_lower_fused, "fused_ew_f32"},
    [TWK_OP_RMSNORM_ROPE] = {kd_lower_rmsnorm_rope, "rmsnorm_rope_f32"},
    [TWK_OP_ROPE_RMSNORM_BACK_X] = {kd_lower_rope_rmsnorm_back_x, "rope_rmsnorm_back_x_f32"},
};
_Static_assert(sizeof table / sizeof table[0] == TWK_OP_COUNT, "one entry per op");

static const kd_entry *entry(twk_op op) { return (int)op >= 0 && op < TWK_OP_COUNT ? &table[op] : NULL; }

int kd_op_kernel(twk_op op, const char **why) {
    const kd_entry *e = entry(op);
    *why = e ? e->unsupported : NULL;
    return e && (e->lower || e->gemm);
}

unsigned kd_half_srcs(twk_op op) {
    switch (op) {
    case TWK_OP_MATMUL: return TWK_SRC(1);   /* widened in panels (kd_gemm_half.c), then the f32 GEMM */
    case TWK_OP_GET_ROWS: return TWK_SRC(0); /* get_rows_h16 */
    case TWK_OP_KV_WRITE: return TWK_SRC(0); /* kv_write_h16: narrowed, round to nearest even */
    case TWK_OP_ATTN_CACHE: return TWK_SRC(1) | TWK_SRC(2); /* attn_fwd_h16 */
    case TWK_OP_ATTN:
    case TWK_OP_ATTN_BACK: return TWK_SRC(0) | TWK_SRC(1) | TWK_SRC(2); /* attn_tile.cl: widened as staged */
    case TWK_OP_ATTN_LSE: return TWK_SRC(0) | TWK_SRC(1);
    case TWK_OP_UNEMBED_LOGPROBS:
    case TWK_OP_UNEMBED_LOGPROBS_BACK: return TWK_SRC(1); /* unembed_logprobs(_back)_h16: w widened as staged */
    case TWK_OP_LORA_GATHER: return TWK_SRC(1); /* lora_gather_h16: an expert stack widened as read, plain or transposed */
    default: return 0;
    }
}

/* ---- support ---- */

/* The kernels' limits on attention (head size, head grouping) and GEMM ranks. */
static int shapes_ok(const twk_launch *l, char *why, size_t why_len) {
    if (l->op == TWK_OP_ATTN || l->op == TWK_OP_ATTN_LSE || l->op == TWK_OP_ATTN_BACK ||
        l->op == TWK_OP_ATTN_CACHE) {
        int64_t D = l->src[0].ne[2];
        if (l->src[0].ndim != 3 || D > KD_ATTN_MAXD)
            return twk_why(why, why_len, "attention head size %lld above the kernels' %d", (long long)D, KD_ATTN_MAXD);
        if (l->src[1].ne[1] < 1 || l->src[0].ne[1] % l->src[1].ne[1] != 0)
            return twk_why(why, why_len, "%lld query heads do not group over %lld kv heads", (long long)l->src[0].ne[1],
                       (long long)l->src[1].ne[1]);
    }
    if (l->op == TWK_OP_ATTN_CACHE && l->src[1].type != l->src[2].type)
        return twk_why(why, why_len, "K cache %s and V cache %s differ", twk_dtype_name(l->src[1].type),
                   twk_dtype_name(l->src[2].type));
    if (l->op == TWK_OP_FUSED_EW && !kd_fused_ok(l, why, why_len)) return 0;
    if (l->op == TWK_OP_MATMUL) {
        int r = l->src[0].ndim;
        if ((r != 2 && r != 3) || l->src[1].ndim != r)
            return twk_why(why, why_len, "matmul of ranks %d and %d", r, l->src[1].ndim);
        if (r != 2 && twk_dtype_is_half(l->src[1].type))
            return twk_why(why, why_len, "a batched matmul with a %s operand (16-bit weights are matrices)",
                       twk_dtype_name(l->src[1].type));
    }
    return 1;
}

int kd_supports(const twk_launch *l, char *why, size_t why_len) {
    if (!l) return twk_why(why, why_len, "no launch");
    const char *reason = NULL;
    if (!kd_op_kernel(l->op, &reason))
        return twk_why(why, why_len, "no kernel for %s (%s)", twk_op_name(l->op),
                   reason ? reason : twk_op_has_kernel(l->op) ? "missing from the kernel table" : "a leaf or a view");
    if (l->dst.ndim < 1 || l->dst.ndim > 4) return twk_why(why, why_len, "rank %d outside 1..4", l->dst.ndim);
    int copy = twk_op_info(l->op)->kind == TWK_OPK_COPY;
    if (copy && twk_dtype_size(l->dst.type) != 4 && twk_dtype_size(l->dst.type) != 8)
        return twk_why(why, why_len, "element size %zu bytes", twk_dtype_size(l->dst.type));
    if (!twk_launch_dtypes_ok(l, kd_half_srcs(l->op), "the kernel dialect", why, why_len)) return 0;
    return copy || shapes_ok(l, why, why_len);
}

/* ---- lowering ---- */

static void lower_gemm(const twk_launch *l, int64_t n, kd_gemm *g) {
    const twk_tensor_desc *a = &l->src[0], *b = &l->src[1];
    int r = a->ndim;
    memset(g, 0, sizeof *g);
    g->trans_a = l->ip[0] != 0;
    g->trans_b = l->ip[1] != 0;
    g->batch = r == 3 ? kd_dim(a, 0, n) : 1;
    g->m = kd_dim(&l->dst, r - 2, n);
    g->n = kd_dim(&l->dst, r - 1, n);
    g->k = g->trans_a ? kd_dim(a, r - 2, n) : kd_dim(a, r - 1, n);
    g->lda = kd_dim(a, r - 1, n);
    g->ldb = kd_dim(b, r - 1, n);
    g->ldc = g->n;
    g->stride_a = g->m * g->k;
    g->stride_b = g->k * g->n;
    g->stride_c = g->m * g->n;
    if (twk_dtype_is_half(b->type)) { /* a frozen weight (rank 2: kd_supports) */
        g->b_half = (int)b->type;
        g->b_rows = g->trans_b ? g->n : g->k;
        g->panel_rows = TWK_HALF_PANEL_ROWS(g->ldb, g->b_rows);
    }
}

size_t kd_scratch_bytes(const twk_launch *l, int64_t n, const kd_device *dev) {
    if (!l) return 0;
    size_t a = kd_attn_scratch_bytes(l, n), w = kd_wide_scratch_bytes(l, n, dev);
    return a > w ? a : w;
}

int kd_lower(const twk_launch *l, int64_t n, const kd_device *dev, kd_call *calls, kd_gemm *gemm, int *is_gemm) {
    char why[160];
    if (is_gemm) *is_gemm = 0;
    if (!kd_supports(l, why, sizeof why)) {
        twk_error(TWK_ERR_UNSUPPORTED, "kd: op %s ('%s') is not supported: %s", l ? twk_op_name(l->op) : "?",
                  l && l->name ? l->name : "", why);
        return -1;
    }
    const kd_entry *e = entry(l->op);
    if (e->gemm) {
        lower_gemm(l, n, gemm);
        if (is_gemm) *is_gemm = 1;
        return 0;
    }
    if (kd_nelem(&l->dst, n) == 0) return 0;
    if (e->wide) {
        int nc = e->wide(l, n, dev, calls);
        if (nc != KD_NOT_WIDE) return nc;
    }
    return e->lower(l, n, calls, e->kernel);
}
