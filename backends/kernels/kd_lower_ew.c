/* Lowerings of the elementwise, reduction and layout ops (elementwise.cl,
 * reduce.cl, layout.cl), one per op or per group of ops (kd.c's table). */
#include <stdarg.h>
#include <stdio.h>

#include "kd_internal.h"

/* Strides (elements) of a padded shape s read by a bigger shape; 0 where s is 1. */
static void bcast_strides(const int64_t s[4], int64_t st[4]) {
    int64_t acc = 1;
    for (int i = 3; i >= 0; i--) {
        st[i] = s[i] == 1 ? 0 : acc;
        acc *= s[i];
    }
}

/* kernel(y, srcs..., n[, extra]) over the dst's elements: the same-shape maps */
static int map_call(const twk_launch *l, int64_t n, kd_call *c, const char *name, int nsrc) {
    int64_t ne = kd_nelem(&l->dst, n);
    kd_begin(c, name);
    kd_buf(c, l, -1, 4);
    for (int i = 0; i < nsrc; i++) kd_buf(c, l, i, 4);
    kd_i64(c, ne);
    kd_grid_items(c, ne, KD_LOCAL_1D);
    return 1;
}

static void shape_args(kd_call *c, const int64_t D[4], const int64_t st[4]) {
    kd_i64(c, D[1]);
    kd_i64(c, D[2]);
    kd_i64(c, D[3]);
    for (int i = 0; i < 4; i++) kd_i64(c, st[i]);
}

int kd_lower_map(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    return map_call(l, n, calls, kernel, l->nsrc);
}

/* a map with fparam 0 last (fill's value, scale's factor) */
int kd_lower_map_f(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    map_call(l, n, calls, kernel, l->nsrc);
    kd_f32(calls, l->fp[0]);
    return 1;
}

/* a map with iparam 0 last (swiglu_back's which) */
int kd_lower_map_i(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    map_call(l, n, calls, kernel, l->nsrc);
    kd_i32(calls, l->ip[0]);
    return 1;
}

/* FUSED_EW: fused_ew_f32's kernel code of a map (0: not one it runs) */
static int fused_code(twk_op op) {
    switch (op) {
    case TWK_OP_ADD: return 1;
    case TWK_OP_MUL: return 2;
    case TWK_OP_SCALE: return 3;
    case TWK_OP_SILU: return 4;
    case TWK_OP_SILU_BACK: return 5;
    case TWK_OP_SWIGLU: return 6;
    case TWK_OP_SWIGLU_BACK: return 7;
    case TWK_OP_GELU: return 8;
    case TWK_OP_GELU_BACK: return 9;
    case TWK_OP_TANH: return 10;
    case TWK_OP_TANH_BACK: return 11;
    default: return 0;
    }
}

/* fused_ew_f32's operand index of a TWK_FUSE_STEP operand (sources 0..5, step j at 6 + j); -1 beyond */
static int fused_operand(int arg, int nsrc) {
    if (arg >= TWK_FUSE_RESULT(0)) return 6 + arg - TWK_FUSE_RESULT(0);
    return arg < nsrc ? arg : -1;
}

int kd_fused_ok(const twk_launch *l, char *why, size_t why_len) {
    if (l->nsrc < 1 || l->nsrc > KD_FUSED_MAX_SRC)
        return twk_why(why, why_len, "fused_ew with %d sources (the kernel takes 1..%d)", l->nsrc, KD_FUSED_MAX_SRC);
    int k = 0;
    for (; k < TWK_MAX_PARAMS && l->ip[k]; k++) {
        int32_t st = l->ip[k];
        int nops = twk_op_info(TWK_FUSE_OP(st))->nsrc, bad = !fused_code(TWK_FUSE_OP(st));
        for (int j = 0; j < nops && j < 3 && !bad; j++) {
            int a = TWK_FUSE_ARG(st, j);
            bad = fused_operand(a, l->nsrc) < 0 || (a >= TWK_FUSE_RESULT(0) && a - TWK_FUSE_RESULT(0) >= k);
        }
        if (bad) return twk_why(why, why_len, "fused_ew step %d (%s) is not one the kernel runs", k, twk_op_name(TWK_FUSE_OP(st)));
    }
    return k ? 1 : twk_why(why, why_len, "fused_ew with no steps");
}

/* fused_ew_f32(y, s0..s5, n, w0..w7, f0..f7): unused sources read the first one */
int kd_lower_fused(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    int64_t ne = kd_nelem(&l->dst, n);
    kd_begin(calls, kernel);
    kd_buf(calls, l, -1, 4);
    for (int i = 0; i < KD_FUSED_MAX_SRC; i++) kd_buf(calls, l, i < l->nsrc ? i : 0, 4);
    kd_i64(calls, ne);
    for (int k = 0; k < TWK_MAX_PARAMS; k++) {
        int32_t s = l->ip[k], w = 0;
        if (s) {
            int a[3];
            for (int j = 0; j < 3; j++) {
                int o = fused_operand(TWK_FUSE_ARG(s, j), l->nsrc);
                a[j] = o < 0 ? 0 : o;
            }
            w = fused_code(TWK_FUSE_OP(s)) | a[0] << 8 | a[1] << 12 | a[2] << 16 | TWK_FUSE_IP(s) << 20;
        }
        kd_i32(calls, w);
        if (!s) { /* the rest end the chain too */
            for (k++; k < TWK_MAX_PARAMS; k++) kd_i32(calls, 0);
            break;
        }
    }
    for (int k = 0; k < TWK_MAX_PARAMS; k++) kd_f32(calls, l->fp[k]);
    kd_grid_items(calls, ne, KD_LOCAL_1D);
    return 1;
}

/* add / mul: b read through broadcast strides */
int kd_lower_binary(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    int64_t B[4], S[4], st[4];
    kd_pad4(&l->dst, n, B);
    kd_pad4(&l->src[1], n, S);
    bcast_strides(S, st);
    map_call(l, n, calls, kernel, 2);
    shape_args(calls, B, st);
    kd_i32(calls, l->op == TWK_OP_ADD ? 0 : 1);
    return 1;
}

int kd_lower_broadcast(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    int64_t D[4], S[4], st[4], ne = kd_nelem(&l->dst, n);
    kd_pad4(&l->dst, n, D);
    kd_pad4(&l->src[0], n, S);
    bcast_strides(S, st);
    map_call(l, n, calls, kernel, 1);
    shape_args(calls, D, st);
    kd_f32(calls, l->ip[0] ? (float)(1.0 / (double)ne) : 1.0f); /* ip[0]: the mean's gradient */
    return 1;
}

/* reduce_sum_f32 over x (times w when given) into one value, times scale */
static int reduce_call(const twk_launch *l, int64_t n, kd_call *c, int w_on, float scale) {
    kd_begin(c, "reduce_sum_f32");
    kd_buf(c, l, -1, 4);
    kd_buf(c, l, 0, 4);
    kd_buf(c, l, w_on ? 1 : 0, 4);
    kd_i64(c, kd_nelem(&l->src[0], n));
    kd_i32(c, w_on);
    kd_f32(c, scale);
    kd_grid_groups(c, 1, KD_REDUCE_LOCAL);
    return 1;
}

int kd_lower_sum_to(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    /* down to one value: a work-group reduction, not one item's loop */
    if (kd_nelem(&l->dst, n) == 1) return reduce_call(l, n, calls, 0, 1.0f);
    int64_t D[4], S[4];
    kd_pad4(&l->dst, n, D);
    kd_pad4(&l->src[0], n, S);
    map_call(l, n, calls, kernel, 1);
    kd_i64(calls, D[1]);
    kd_i64(calls, D[2]);
    kd_i64(calls, D[3]);
    for (int i = 0; i < 4; i++) kd_i64(calls, S[i]);
    return 1;
}

/* sum, mean, weighted_sum */
int kd_lower_reduce(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    (void)kernel;
    int64_t nx = kd_nelem(&l->src[0], n);
    return reduce_call(l, n, calls, l->op == TWK_OP_WEIGHTED_SUM, l->op == TWK_OP_MEAN ? (float)(1.0 / (double)nx) : 1.0f);
}

/* ---- layout: elements move as w int words ---- */

/* copy_axis_words for tensors that differ only in the size of `axis`. */
static void copy_axis(const twk_launch *l, int64_t n, kd_call *c, int src, int axis, int64_t src_start,
                      int64_t dst_start, int64_t len, int64_t w) {
    int64_t outer = 1, inner = w;
    for (int i = 0; i < axis; i++) outer *= kd_dim(&l->dst, i, n);
    for (int i = axis + 1; i < l->dst.ndim; i++) inner *= kd_dim(&l->dst, i, n);
    int64_t items = outer * len * inner;
    kd_begin(c, "copy_axis_words");
    kd_buf(c, l, -1, 4);
    kd_buf(c, l, src, 4);
    kd_i64(c, items);
    kd_i64(c, len);
    kd_i64(c, inner);
    kd_i64(c, kd_dim(&l->dst, axis, n));
    kd_i64(c, kd_dim(&l->src[src], axis, n));
    kd_i64(c, dst_start);
    kd_i64(c, src_start);
    kd_grid_items(c, items, KD_LOCAL_1D);
}

/* Elements of the dst's dtype as int words. */
static int64_t words(const twk_launch *l) { return (int64_t)(twk_dtype_size(l->dst.type) / 4); }

int kd_lower_permute(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    const twk_tensor_desc *x = &l->src[0];
    int nd = x->ndim, off = 4 - nd;
    int64_t in_st[TWK_MAX_DIMS], O[4], st[4];
    in_st[nd - 1] = 1;
    for (int i = nd - 2; i >= 0; i--) in_st[i] = in_st[i + 1] * kd_dim(x, i + 1, n);
    for (int i = 0; i < 4; i++) {
        if (i < off) {
            O[i] = 1;
            st[i] = 0;
        } else {
            int p = l->ip[i - off];
            O[i] = kd_dim(x, p, n);
            st[i] = in_st[p];
        }
    }
    int64_t ne = kd_nelem(&l->dst, n);
    kd_call *c = &calls[0];
    kd_begin(c, kernel);
    kd_buf(c, l, -1, 4);
    kd_buf(c, l, 0, 4);
    kd_i64(c, ne);
    shape_args(c, O, st);
    kd_i32(c, (int32_t)words(l));
    kd_grid_items(c, ne, KD_LOCAL_1D);
    return 1;
}

int kd_lower_slice(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    (void)kernel;
    int axis = l->ip[0];
    copy_axis(l, n, &calls[0], 0, axis, l->ip[1], 0, kd_dim(&l->dst, axis, n), words(l));
    return 1;
}

/* zeros, then the source at ip[1] along the axis */
int kd_lower_slice_back(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    (void)kernel;
    int axis = l->ip[0], k = 0;
    int64_t w = words(l), total = kd_nelem(&l->dst, n) * w;
    kd_call *c = &calls[k++];
    kd_begin(c, "zero_words");
    kd_buf(c, l, -1, 4);
    kd_i64(c, total);
    kd_grid_items(c, total, KD_LOCAL_1D);
    int64_t len = kd_dim(&l->src[0], axis, n);
    if (len > 0) copy_axis(l, n, &calls[k++], 0, axis, 0, l->ip[1], len, w);
    return k;
}

int kd_lower_concat(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    (void)kernel;
    int axis = l->ip[0], k = 0;
    int64_t w = words(l), la = kd_dim(&l->src[0], axis, n), lb = kd_dim(&l->src[1], axis, n);
    if (la > 0) copy_axis(l, n, &calls[k++], 0, axis, 0, 0, la, w);
    if (lb > 0) copy_axis(l, n, &calls[k++], 1, axis, 0, la, lb, w);
    return k;
}

/* ---- the optimizer step (optim.cl) ---- */

/* one work-group per slice */
int kd_lower_sqsum_parts(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    int64_t parts = kd_dim(&l->dst, 0, n);
    kd_begin(calls, kernel);
    kd_buf(calls, l, -1, 4);
    kd_buf(calls, l, 0, 4);
    kd_i64(calls, kd_nelem(&l->src[0], n));
    kd_i64(calls, parts);
    kd_grid_groups(calls, parts, KD_REDUCE_LOCAL);
    return 1;
}

/* one item sums the slices */
int kd_lower_grad_norm(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    kd_begin(calls, kernel);
    kd_buf(calls, l, -1, 4);
    kd_buf(calls, l, 0, 4);
    kd_buf(calls, l, 1, 4);
    kd_i64(calls, kd_dim(&l->src[0], 0, n));
    kd_grid_groups(calls, 1, 32);
    return 1;
}

/* adamw_f32(w, g, m, v, hyper, norm, n): the dst is w's storage (in place) */
int kd_lower_adamw(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    int64_t ne = kd_nelem(&l->dst, n);
    kd_begin(calls, kernel);
    kd_buf(calls, l, -1, 4);
    for (int i = 1; i < 6; i++) kd_buf(calls, l, i, 4);
    kd_i64(calls, ne);
    kd_grid_items(calls, ne, KD_LOCAL_1D);
    return 1;
}
