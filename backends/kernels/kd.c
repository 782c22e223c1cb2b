/* kd: which ops the shared kernels run (kd_supports), the per-op dispatch of
 * kd_lower, GEMM descriptions for the BLAS, and the argument/grid builders. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kd_internal.h"

void kd_begin(kd_call *c, const char *name) {
    memset(c, 0, sizeof *c);
    c->kernel = name;
}

static kd_arg *next_arg(kd_call *c) {
    /* the kernels' signatures are fixed and below KD_MAX_ARGS; clamp defensively */
    if (c->nargs >= KD_MAX_ARGS) return &c->args[KD_MAX_ARGS - 1];
    kd_arg *a = &c->args[c->nargs++];
    memset(a, 0, sizeof *a);
    return a;
}

void kd_buf(kd_call *c, const twk_launch *l, int t, size_t elem) {
    kd_arg *a = next_arg(c);
    const twk_tensor_desc *d = t < 0 ? &l->dst : &l->src[t];
    a->kind = KD_BUF;
    a->tensor = t;
    a->i64 = (int64_t)(d->offset / elem);
}

void kd_err(kd_call *c) { next_arg(c)->kind = KD_ERR; }

void kd_i32(kd_call *c, int32_t v) {
    kd_arg *a = next_arg(c);
    a->kind = KD_I32;
    a->i32 = v;
}

void kd_i64(kd_call *c, int64_t v) {
    kd_arg *a = next_arg(c);
    a->kind = KD_I64;
    a->i64 = v;
}

void kd_f32(kd_call *c, float v) {
    kd_arg *a = next_arg(c);
    a->kind = KD_F32;
    a->f32 = v;
}

void kd_grid_items(kd_call *c, int64_t items, size_t local) {
    size_t groups = (size_t)((items + (int64_t)local - 1) / (int64_t)local);
    kd_grid_groups(c, (int64_t)(groups ? groups : 1), local);
}

void kd_grid_groups(kd_call *c, int64_t groups, size_t local) {
    c->dims = 1;
    c->local[0] = local;
    c->global[0] = (size_t)groups * local;
    c->local[1] = c->local[2] = c->global[1] = c->global[2] = 1;
}

size_t kd_pow2_local(int64_t n, size_t max) {
    size_t p = 32;
    while (p < max && (int64_t)p < n) p *= 2;
    return p;
}

int64_t kd_dim(const twk_tensor_desc *t, int i, int64_t n) { return twk_desc_dim(t, i, n); }

int64_t kd_nelem(const twk_tensor_desc *t, int64_t n) { return twk_desc_nelem(t, n); }

void kd_pad4(const twk_tensor_desc *t, int64_t n, int64_t d[4]) {
    int off = 4 - t->ndim;
    for (int i = 0; i < 4; i++) d[i] = i < off ? 1 : twk_desc_dim(t, i - off, n);
}

/* ---- support ---- */



static int has_kernel(twk_op op) {
    switch (op) {
    case TWK_OP_INPUT:
    case TWK_OP_PARAM:
    case TWK_OP_RESHAPE:
    case TWK_OP_COUNT: return 0;
    default: return (int)op >= 0 && op < TWK_OP_COUNT;
    }
}

/* Writes a reason to why (if given); returns 0 (not supported). */
static int say(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int say(char *why, size_t len, const char *fmt, ...) {
    if (why && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, len, fmt, ap);
        va_end(ap);
    }
    return 0;
}

int kd_supports(const twk_launch *l, char *why, size_t why_len) {
    if (!l) return say(why, why_len, "no launch");
    if (!has_kernel(l->op)) return say(why, why_len, "no kernel for %s (a leaf or a view)", twk_op_name(l->op));
    if (l->dst.ndim < 1 || l->dst.ndim > 4) return say(why, why_len, "rank %d outside 1..4", l->dst.ndim);
    if (twk_op_is_copy(l->op) && twk_dtype_size(l->dst.type) != 4 && twk_dtype_size(l->dst.type) != 8)
        return say(why, why_len, "element size %zu bytes", twk_dtype_size(l->dst.type));
    if (!twk_launch_dtypes_ok(l, "the kernels", why, why_len)) return 0;
    if (twk_op_is_copy(l->op)) return 1;
    if (l->op == TWK_OP_ATTN || l->op == TWK_OP_ATTN_LSE || l->op == TWK_OP_ATTN_BACK ||
        l->op == TWK_OP_ATTN_CACHE) {
        int64_t D = l->src[0].ne[2];
        if (l->src[0].ndim != 3 || D > KD_ATTN_MAXD)
            return say(why, why_len, "attention head size %lld above the kernels' %d", (long long)D, KD_ATTN_MAXD);
        if (l->src[1].ne[1] < 1 || l->src[0].ne[1] % l->src[1].ne[1] != 0)
            return say(why, why_len, "%lld query heads do not group over %lld kv heads", (long long)l->src[0].ne[1],
                       (long long)l->src[1].ne[1]);
    }
    if (l->op == TWK_OP_MATMUL) {
        int r = l->src[0].ndim;
        if ((r != 2 && r != 3) || l->src[1].ndim != r)
            return say(why, why_len, "matmul of ranks %d and %d", r, l->src[1].ndim);
    }
    return 1;
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
}

int kd_lower(const twk_launch *l, int64_t n, kd_call *calls, kd_gemm *gemm, int *is_gemm) {
    char why[160];
    if (is_gemm) *is_gemm = 0;
    if (!kd_supports(l, why, sizeof why)) {
        twk_error(TWK_ERR_UNSUPPORTED, "kd: op %s ('%s') is not supported: %s", l ? twk_op_name(l->op) : "?",
                  l && l->name ? l->name : "", why);
        return -1;
    }
    if (l->op == TWK_OP_MATMUL) {
        lower_gemm(l, n, gemm);
        if (is_gemm) *is_gemm = 1;
        return 0;
    }
    if (kd_nelem(&l->dst, n) == 0) return 0;
    switch (l->op) {
    case TWK_OP_PERMUTE:
    case TWK_OP_SLICE:
    case TWK_OP_SLICE_BACK:
    case TWK_OP_CONCAT: return kd_lower_layout(l, n, calls);
    case TWK_OP_ATTN:
    case TWK_OP_ATTN_LSE:
    case TWK_OP_ATTN_BACK:
    case TWK_OP_ATTN_CACHE: return kd_lower_attn(l, n, calls);
    case TWK_OP_GET_ROWS:
    case TWK_OP_GET_ROWS_BACK:
    case TWK_OP_RMSNORM:
    case TWK_OP_RMSNORM_BACK_X:
    case TWK_OP_RMSNORM_BACK_W:
    case TWK_OP_ROPE:
    case TWK_OP_LOGPROBS:
    case TWK_OP_LOGPROBS_BACK:
    case TWK_OP_KV_WRITE:
    case TWK_OP_LORA_GATHER: return kd_lower_nn(l, n, calls);
    default: return kd_lower_elementwise(l, n, calls);
    }
}
