/* Per-op lowering: each launch becomes 1-3 dispatches of the shaders in
 * shaders/ (pipeline = shader + spec constants, sizes in push constants),
 * through a table with one entry per op (its lowering and the shader's MODE,
 * or why Vulkan does not run it). Launches with ids get a check.comp
 * dispatch first. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "twk_wide.h"
#include "vk_internal.h"

/* ---- helpers ---- */

static int64_t dim(const twk_tensor_desc *t, int i, int64_t n) { return twk_desc_dim(t, i, n); }

static void pad4(const twk_tensor_desc *t, int64_t n, int64_t d[4]) {
    int off = 4 - t->ndim;
    for (int i = 0; i < 4; i++) d[i] = i < off ? 1 : dim(t, i - off, n);
}

static int64_t inner_of(const twk_tensor_desc *t, int from, int64_t n) {
    int64_t e = 1;
    for (int i = from; i < t->ndim; i++) e *= dim(t, i, n);
    return e;
}

static void bcast_strides(const int64_t s[4], int32_t st[4]) {
    int64_t acc = 1;
    for (int i = 3; i >= 0; i--) {
        st[i] = s[i] == 1 ? 0 : (int32_t)acc;
        acc *= s[i];
    }
}

static vk_dispatch *start(vk_dispatch *d, int *k, vk_shader s, uint32_t wg, int mode) {
    vk_dispatch *x = &d[(*k)++];
    memset(x, 0, sizeof *x);
    x->shader = s;
    x->spec[0] = wg;
    x->spec[1] = (uint32_t)mode;
    for (int i = 0; i < VK_NBIND; i++) x->bind[i] = VKB_NONE;
    x->groups[0] = x->groups[1] = x->groups[2] = 1;
    return x;
}

vk_dispatch *vk_next_dispatch(vk_dispatch *d, int *k, vk_shader s, uint32_t wg, int mode) { return start(d, k, s, wg, mode); }

/* The shaders' code for a 16-bit operand (spec constants 10, 11; common.glsl): 1 bf16, 2 f16, 0 f32. */
static uint32_t h16_code(twk_dtype t) { return t == TWK_BF16 ? 1u : t == TWK_F16 ? 2u : 0u; }

static uint32_t groups_for(const vk_ctx *c, int64_t items, uint32_t per_group) {
    int64_t g = (items + per_group - 1) / per_group;
    if (g < 1) g = 1;
    if (g > (int64_t)c->max_groups) g = c->max_groups;
    return (uint32_t)g;
}

static void copy_box(vk_dispatch *x, const int64_t box[4], const int64_t sst[4], const int64_t dst_st[4], int es) {
    int64_t n = 1;
    for (int i = 0; i < 4; i++) {
        x->p[i] = (int32_t)box[i];
        x->p[4 + i] = (int32_t)sst[i];
        x->p[8 + i] = (int32_t)dst_st[i];
        n *= box[i];
    }
    x->p[12] = es;
    x->p[13] = (int32_t)n;
}

/* A rotation's theta when it has no inv_freq source (rope, or the fusion pass's pairs with it); 0 else. */
static float rope_theta(const twk_launch *l) {
    if (l->op == TWK_OP_ROPE && l->nsrc <= 2) return l->fp[0];
    if (l->op == TWK_OP_RMSNORM_ROPE && l->nsrc <= 3) return l->fp[1];
    if (l->op == TWK_OP_ROPE_RMSNORM_BACK_X && l->nsrc <= 4) return l->fp[1];
    return 0;
}

size_t vk_const_bytes(const twk_launch *l) {
    /* rope without an inv_freq source: the C floats vk_write_consts writes, padded to 16 bytes */
    if (rope_theta(l) > 0) return ((size_t)(l->dst.ne[2] / 2) * sizeof(float) + 15) / 16 * 16;
    return 0;
}

void vk_write_consts(const twk_launch *l, void *dst) {
    float theta = rope_theta(l);
    if (theta > 0) { /* inv_freq as transformers computes it (as the CPU does) */
        int64_t half = l->dst.ne[2] / 2;
        float *f = dst;
        for (int64_t i = 0; i < half; i++)
            f[i] = (float)(1.0 / pow((double)theta, (double)(2 * i) / (double)(2 * half)));
    }
}

/* ---- lowering: one function per op or group of ops ---- */

/* One launch being lowered: its dispatches d[0..k), the plan scratch it
 * needs, and the MODE its table entry gives the shader. */
typedef struct vk_low {
    const vk_ctx *c;
    const twk_launch *l;
    const twk_tensor_desc *y, *s;
    int li;
    int64_t n, ny, cap; /* cap: the plan's capacity */
    size_t const_off;
    vk_dispatch *d;
    int k;
    size_t scratch;
    int mode;
} vk_low;

/* A lowering: 0 when done, VK_TOO_BIG when a size exceeds 32-bit shader
 * indexing or the grid, -1 with the error set otherwise. */
typedef int (*vk_lower_fn)(vk_low *w);
#define VK_TOO_BIG 1

static vk_dispatch *next(vk_low *w, vk_shader s, uint32_t wg, int mode) { return start(w->d, &w->k, s, wg, mode); }

/* fill, scale and the same-shape maps (eltwise.comp, MODE from the table) */
static int lower_eltwise(vk_low *w) {
    const twk_launch *l = w->l;
    int mode = l->op == TWK_OP_SWIGLU_BACK ? w->mode + (l->ip[0] != 0) : w->mode;
    vk_dispatch *x = next(w, VKS_ELTWISE, 128, mode);
    x->bind[0] = VKB_DST;
    for (int i = 0; i < l->nsrc && i < 3; i++) x->bind[1 + i] = i;
    x->p[0] = (int32_t)w->ny;
    x->fp[0] = l->fp[0];
    x->groups[0] = groups_for(w->c, w->ny, 128);
    return 0;
}

/* add, mul, broadcast (broadcast.comp) */
static int lower_broadcast(vk_low *w) {
    const twk_launch *l = w->l;
    int bc = l->op == TWK_OP_BROADCAST;
    vk_dispatch *x = next(w, VKS_BROADCAST, 128, w->mode);
    int64_t D[4], S[4];
    pad4(w->y, w->n, D);
    pad4(bc ? &w->s[0] : &w->s[1], w->n, S);
    int32_t st[4];
    bcast_strides(S, st);
    for (int i = 0; i < 4; i++) {
        x->p[i] = (int32_t)D[i];
        x->p[4 + i] = st[i];
    }
    x->p[8] = (int32_t)w->ny;
    x->bind[0] = VKB_DST;
    x->bind[1] = 0;
    x->bind[2] = bc ? 0 : 1;
    x->fp[0] = bc && l->ip[0] ? (float)(1.0 / (double)w->ny) : 1.0f;
    x->groups[0] = groups_for(w->c, w->ny, 128);
    return 0;
}

/* ---- wide (two-stage) reductions, hal/twk_wide.h: stage 1 tiles the terms over many
 * work-groups into (hi, lo) pairs in the plan scratch, stage 2 folds them (reduce.comp) ---- */

/* the wide shaders' work-group: TWK_WIDE_LOCAL, halved while the device cannot run it */
static uint32_t wide_wg(const vk_ctx *c) {
    uint32_t wg = TWK_WIDE_LOCAL;
    while (wg > 32 && wg > c->props.limits.maxComputeWorkGroupInvocations) wg /= 2;
    return wg;
}

#define VK_WIDE_GRAIN ((int64_t)TWK_WIDE_LOCAL * TWK_WIDE_GRAIN)

/* terms [0, nx) of src 0 (kind 0 x, 1 x * src 1, 2 x^2) as `slices` x k tiles, folded per slice:
 * into the dst's pairs (out_pair) or dst[s] = scale * sum */
static int wide_sum(vk_low *w, int64_t nx, int64_t slices, int64_t k, int kind, int out_pair, float scale) {
    if (slices > (int64_t)w->c->max_groups) return VK_TOO_BIG;
    if (slices * k > (int64_t)w->c->max_groups) k = w->c->max_groups / slices; /* one group a tile, exactly */
    vk_dispatch *x = next(w, VKS_REDUCE, wide_wg(w->c), kind == 0 ? 3 : kind == 1 ? 6 : 7);
    x->bind[0] = VKB_SCRATCH;
    x->bind[1] = 0;
    x->bind[2] = kind == 1 ? 1 : 0;
    x->p[0] = (int32_t)nx;
    x->p[1] = (int32_t)slices;
    x->p[2] = (int32_t)k;
    x->p[3] = kind;
    x->groups[0] = (uint32_t)(slices * k);
    x = next(w, VKS_REDUCE, 64, 4); /* a fold is small: 64 invocations (a slice's k is often 1) */
    x->bind[0] = VKB_DST;
    x->bind[1] = VKB_SCRATCH;
    x->p[1] = (int32_t)slices;
    x->p[2] = (int32_t)k;
    x->p[3] = out_pair;
    x->fp[0] = scale;
    x->groups[0] = (uint32_t)slices;
    w->scratch = (size_t)(2 * slices * k) * sizeof(float);
    return 0;
}

/* a whole-tensor sum of nx terms: one slice */
static int wide_total(vk_low *w, int kind, float scale) {
    int64_t nx = twk_desc_nelem(&w->s[0], w->n);
    return wide_sum(w, nx, 1, twk_wide_tiles(w->c->compute_units, 1, nx, VK_WIDE_GRAIN), kind, 0, scale);
}

static int lower_sum_to(vk_low *w) {
    if (w->ny == 1 && !twk_reduce_narrow()) return wide_total(w, 0, 1.0f); /* to one value */
    vk_dispatch *x = next(w, VKS_SUM_TO, 64, w->mode);
    int64_t D[4], S[4];
    pad4(w->y, w->n, D);
    pad4(&w->s[0], w->n, S);
    for (int i = 0; i < 4; i++) {
        x->p[i] = (int32_t)D[i];
        x->p[4 + i] = (int32_t)S[i];
    }
    x->p[8] = (int32_t)w->ny;
    x->bind[0] = VKB_DST;
    x->bind[1] = 0;
    x->groups[0] = groups_for(w->c, w->ny, 64);
    return 0;
}

/* sum, mean, weighted_sum: wide, or one work-group (TWK_REDUCE_NARROW=1) */
static int lower_reduce(vk_low *w) {
    if (!twk_reduce_narrow()) {
        int64_t nx = twk_desc_nelem(&w->s[0], w->n);
        return wide_total(w, w->l->op == TWK_OP_WEIGHTED_SUM ? 1 : 0,
                          w->l->op == TWK_OP_MEAN ? (float)(1.0 / (double)(nx ? nx : 1)) : 1.0f);
    }
    uint32_t wg = 256; /* a power of two the device allows (Vulkan guarantees 128) */
    while (wg > w->c->props.limits.maxComputeWorkGroupInvocations) wg /= 2;
    vk_dispatch *x = next(w, VKS_REDUCE, wg, w->mode);
    x->bind[0] = VKB_DST;
    x->bind[1] = 0;
    if (w->l->op == TWK_OP_WEIGHTED_SUM) x->bind[2] = 1;
    x->p[0] = (int32_t)twk_desc_nelem(&w->s[0], w->n);
    return 0;
}

static int lower_permute(vk_low *w) {
    const twk_launch *l = w->l;
    int64_t n = w->n;
    vk_dispatch *x = next(w, VKS_COPY, 128, 0);
    const twk_tensor_desc *in = &w->s[0];
    int nd = in->ndim, off = 4 - nd;
    int64_t in_st[TWK_MAX_DIMS], box[4], sst[4], dst_st[4];
    in_st[nd - 1] = 1;
    for (int i = nd - 2; i >= 0; i--) in_st[i] = in_st[i + 1] * dim(in, i + 1, n);
    for (int i = 0; i < 4; i++) {
        int p = i < off ? -1 : l->ip[i - off];
        if (p < 0 || p >= nd) {
            box[i] = 1;
            sst[i] = 0;
        } else {
            box[i] = dim(in, p, n);
            sst[i] = in_st[p];
        }
    }
    dst_st[3] = 1;
    for (int i = 2; i >= 0; i--) dst_st[i] = dst_st[i + 1] * box[i + 1];
    copy_box(x, box, sst, dst_st, (int)(twk_dtype_size(w->y->type) / 4));
    x->bind[0] = VKB_DST;
    x->bind[1] = 0;
    x->groups[0] = groups_for(w->c, w->ny, 128);
    return 0;
}

/* slice, slice_back (zeros first), concat: strided copies along one axis */
static int lower_axis_copy(vk_low *w) {
    const twk_launch *l = w->l;
    const twk_tensor_desc *y = w->y, *s = w->s;
    int64_t n = w->n;
    int axis = l->ip[0], es = (int)(twk_dtype_size(y->type) / 4);
    int64_t outer = 1;
    for (int i = 0; i < axis; i++) outer *= dim(y, i, n);
    int64_t inner = inner_of(y, axis + 1, n), yax = dim(y, axis, n);
    vk_dispatch *x;
    if (l->op == TWK_OP_SLICE_BACK) {
        x = next(w, VKS_COPY, 128, 1);
        x->bind[0] = VKB_DST;
        x->p[13] = (int32_t)(w->ny * es);
        x->groups[0] = groups_for(w->c, w->ny * es, 128);
    }
    for (int part = 0; part < (l->op == TWK_OP_CONCAT ? 2 : 1); part++) {
        const twk_tensor_desc *src = &s[part];
        int64_t sax = dim(src, axis, n);
        int64_t len = l->op == TWK_OP_SLICE ? yax : sax;
        int64_t src_start = l->op == TWK_OP_SLICE ? l->ip[1] : 0;
        int64_t dst_start = l->op == TWK_OP_SLICE_BACK ? l->ip[1] : part ? dim(&s[0], axis, n) : 0;
        int64_t box[4] = {1, outer, len, inner}, sst[4] = {0, sax * inner, inner, 1},
                dst_st[4] = {0, yax * inner, inner, 1};
        x = next(w, VKS_COPY, 128, 0);
        copy_box(x, box, sst, dst_st, es);
        x->bind[0] = VKB_DST;
        x->bind[1] = part;
        x->add_off[0] = (uint32_t)(dst_start * inner * es);
        x->add_off[1] = (uint32_t)(src_start * inner * es);
        x->groups[0] = groups_for(w->c, outer * len * inner, 128);
    }
    return 0;
}

/* the GEMM shader's tiles: cooperative matrices (TWK_VULKAN_GEMM=fp16) or
 * 64 x 64 tiles, K in steps of 8, 8 x 8 outputs per thread (64 threads);
 * M <= 8 (decoding): one output per thread, no barriers */
static vk_dispatch *matmul_pipeline(vk_low *w, int64_t M, int *simple, uint32_t *BM, uint32_t *BN) {
    const vk_ctx *c = w->c;
    vk_dispatch *x;
    *simple = M <= 8;
    *BM = 64;
    *BN = 64;
    if (c->gemm_fp16) {
        /* 2 x 2 subgroups, each with 2 x 2 tiles of the device's MM x MN shape; K in
         * steps of 2 MK (vk_coopmat.c checked the limits for this shape) */
        *simple = 0;
        *BM = 4 * c->coop.m;
        *BN = 4 * c->coop.n;
        x = next(w, VKS_MATMUL_COOPMAT, 4 * c->coop.subgroup, 0);
        x->spec[2] = *BM;
        x->spec[3] = *BN;
        x->spec[4] = 2 * c->coop.k;
        x->spec[5] = c->coop.m;
        x->spec[6] = c->coop.n;
        x->spec[9] = c->coop.k;
        return x;
    }
    uint32_t BK = 8, TM = 8, TN = 8;
    x = next(w, VKS_MATMUL, *simple ? 64 : (*BM / TM) * (*BN / TN), *simple);
    x->spec[2] = *BM;
    x->spec[3] = *BN;
    x->spec[4] = BK;
    x->spec[5] = TM;
    x->spec[6] = TN;
    return x;
}

static int lower_matmul(vk_low *w) {
    const twk_launch *l = w->l;
    const twk_tensor_desc *y = w->y, *s = w->s;
    int64_t n = w->n;
    int r = s[0].ndim, ta = l->ip[0] != 0, tb = l->ip[1] != 0;
    int64_t batch = r == 3 ? dim(&s[0], 0, n) : 1;
    int64_t M = dim(y, r - 2, n), N = dim(y, r - 1, n);
    int64_t K = ta ? dim(&s[0], r - 2, n) : dim(&s[0], r - 1, n);
    int simple;
    uint32_t BM, BN;
    vk_dispatch *x = matmul_pipeline(w, M, &simple, &BM, &BN);
    x->spec[7] = (uint32_t)ta;
    x->spec[8] = (uint32_t)tb;
    x->spec[10] = h16_code(s[1].type); /* a 16-bit weight, widened as B is loaded */
    int64_t p[10] = {M, N, K, dim(&s[0], r - 1, n), dim(&s[1], r - 1, n), N, M * K, K * N, M * N, batch};
    for (int i = 0; i < 10; i++) x->p[i] = (int32_t)p[i];
    x->bind[0] = VKB_DST;
    x->bind[1] = 0;
    x->bind[2] = 1;
    if ((N + BN - 1) / BN > (int64_t)w->c->max_groups) return VK_TOO_BIG;
    x->groups[0] = (uint32_t)((N + BN - 1) / BN);
    x->groups[1] = groups_for(w->c, M, BM);
    x->groups[2] = groups_for(w->c, batch, 1);
    if (simple) {
        x->groups[0] = groups_for(w->c, M * N, 64);
        x->groups[1] = 1;
    }
    return 0;
}

/* get_rows and its gradient (rows.comp; the gradient zeroes the table first) */
static int lower_get_rows(vk_low *w) {
    const twk_launch *l = w->l;
    int64_t n = w->n;
    int back = l->op == TWK_OP_GET_ROWS_BACK;
    int64_t T = dim(&w->s[1], 0, n), D = dim(w->y, 1, n), V = back ? dim(w->y, 0, n) : dim(&w->s[0], 0, n);
    vk_dispatch *x;
    if (back) { /* zero the whole table in parallel; the columns then accumulate */
        x = next(w, VKS_COPY, 128, 1);
        x->bind[0] = VKB_DST;
        x->p[13] = (int32_t)w->ny;
        x->groups[0] = groups_for(w->c, w->ny, 128);
    }
    x = next(w, VKS_ROWS, 64, w->mode);
    if (!back) x->spec[10] = h16_code(w->s[0].type); /* a 16-bit table */
    x->bind[0] = VKB_DST;
    x->bind[1] = 0;
    x->bind[2] = 1;
    x->p[0] = (int32_t)T;
    x->p[1] = (int32_t)D;
    x->p[2] = (int32_t)V;
    x->p[7] = w->s[1].type == TWK_I64;
    x->groups[0] = groups_for(w->c, back ? D : T * D, 64);
    return 0;
}

static int lower_kv_write(vk_low *w) {
    const twk_tensor_desc *s = w->s;
    int64_t n = w->n;
    int64_t T = dim(&s[1], 0, n), row = dim(&s[1], 1, n) * dim(&s[1], 2, n), R = dim(w->y, 0, n);
    vk_dispatch *x = next(w, VKS_ROWS, 64, w->mode);
    x->spec[10] = h16_code(w->y->type); /* a 16-bit cache: one item per word of a row */
    x->bind[0] = VKB_DST;
    x->bind[1] = 1;
    x->bind[2] = 2;
    x->p[0] = (int32_t)T;
    x->p[1] = (int32_t)row;
    x->p[2] = (int32_t)R;
    x->p[7] = s[2].type == TWK_I64;
    x->groups[0] = groups_for(w->c, x->spec[10] ? T * (row / 2 + 1) : T * row, 64);
    return 0;
}

/* lora_gather (MODE 3: w [S, N, K], or [S, K, N] transposed; f32 or a 16-bit stack widened as
 * read) and its weight gradient (MODE 4), one item per output element */
static int lower_lora_gather(vk_low *w) {
    const twk_tensor_desc *s = w->s;
    int64_t n = w->n;
    int back = w->l->op == TWK_OP_LORA_GATHER_BACK;
    int64_t T = dim(&s[0], 0, n), K = dim(&s[0], 1, n);
    int64_t S = back ? dim(w->y, 0, n) : dim(&s[1], 0, n), N = back ? dim(&s[1], 1, n) : dim(w->y, 1, n);
    vk_dispatch *x = next(w, VKS_ROWS, 64, w->mode);
    if (!back) x->spec[10] = h16_code(s[1].type); /* a 16-bit expert stack */
    x->bind[0] = VKB_DST;
    x->bind[1] = 0;
    x->bind[2] = 2;
    x->bind[3] = 1;
    x->p[0] = (int32_t)T;
    x->p[1] = (int32_t)N;
    x->p[2] = (int32_t)S;
    x->p[3] = (int32_t)K;
    x->p[4] = !back && w->l->ip[0] != 0;
    x->p[7] = s[2].type == TWK_I64;
    x->groups[0] = groups_for(w->c, back ? N * K : T * N, 64);
    return 0;
}

/* rmsnorm, rmsnorm_back_x: a work-group per row (rownorm.comp) */
static int lower_rownorm(vk_low *w) {
    int64_t D = dim(w->y, w->y->ndim - 1, w->n), R = w->ny / (D ? D : 1);
    vk_dispatch *x = next(w, VKS_ROWNORM, 128, w->mode);
    x->bind[0] = VKB_DST;
    for (int i = 0; i < w->l->nsrc; i++) x->bind[1 + i] = i;
    x->p[0] = (int32_t)R;
    x->p[1] = (int32_t)D;
    x->fp[0] = w->l->fp[0];
    x->groups[0] = groups_for(w->c, R, 1);
    return 0;
}

/* per-row rstd into the plan scratch, then column sums in a fixed order: wide (stage 1 over
 * column blocks x row tiles into pairs after the rstd, stage 2 folding them), or one thread per
 * column over all rows (TWK_REDUCE_NARROW=1) */
static int lower_rmsnorm_back_w(vk_low *w) {
    int64_t D = dim(w->y, 0, w->n), R = twk_desc_nelem(&w->s[0], w->n) / (D ? D : 1);
    vk_dispatch *x = next(w, VKS_ROWNORM, 128, w->mode);
    if (!twk_reduce_narrow()) {
        int C = twk_wide_cols(D);
        int64_t nb = (D + C - 1) / C, T = twk_wide_tiles(w->c->compute_units, nb, R, (int64_t)(TWK_WIDE_LOCAL / C) * TWK_WIDE_GRAIN);
        if ((uint32_t)C > wide_wg(w->c) || nb > (int64_t)w->c->max_groups) return VK_TOO_BIG; /* C <= 32 */
        if (nb * T > (int64_t)w->c->max_groups) T = w->c->max_groups / nb; /* one group a (block, tile), exactly */
        uint32_t rwg = 32; /* the rstd: >= 16 terms an invocation, fewer tree levels */
        while (rwg < wide_wg(w->c) && (int64_t)rwg * 16 < D) rwg *= 2;
        x->spec[0] = rwg;
        x->bind[0] = VKB_SCRATCH;
        x->bind[1] = 0;
        x->p[0] = (int32_t)R;
        x->p[1] = (int32_t)D;
        x->fp[0] = w->l->fp[0];
        x->groups[0] = groups_for(w->c, R, 1);
        x = next(w, VKS_ROWNORM, wide_wg(w->c), 6);
        x->bind[0] = VKB_SCRATCH;
        x->add_off[0] = (uint32_t)R;
        x->bind[1] = 0;
        x->bind[2] = 1;
        x->bind[3] = VKB_SCRATCH;
        x->p[0] = (int32_t)R;
        x->p[1] = (int32_t)D;
        x->p[2] = (int32_t)T;
        x->p[3] = C;
        x->groups[0] = (uint32_t)(nb * T);
        x = next(w, VKS_REDUCE, wide_wg(w->c), 5);
        x->bind[0] = VKB_DST;
        x->bind[1] = VKB_SCRATCH;
        x->add_off[1] = (uint32_t)R;
        x->p[0] = (int32_t)T;
        x->p[1] = (int32_t)D;
        x->p[2] = C;
        x->groups[0] = (uint32_t)nb;
        w->scratch = (size_t)(R + 2 * T * D) * sizeof(float);
        return 0;
    }
    x->bind[0] = VKB_SCRATCH;
    x->bind[1] = 0;
    x->p[0] = (int32_t)R;
    x->p[1] = (int32_t)D;
    x->fp[0] = w->l->fp[0];
    x->groups[0] = groups_for(w->c, R, 1);
    x = next(w, VKS_ROWNORM, 64, w->mode + 1);
    x->bind[0] = VKB_DST;
    x->bind[1] = 0;
    x->bind[2] = 1;
    x->bind[3] = VKB_SCRATCH;
    x->p[0] = (int32_t)R;
    x->p[1] = (int32_t)D;
    x->groups[0] = groups_for(w->c, D, 64);
    w->scratch = (size_t)R * sizeof(float); /* one float rstd per row (rownorm.comp) */
    return 0;
}

static int lower_rope(vk_low *w) {
    const twk_launch *l = w->l;
    int64_t n = w->n;
    int64_t T = dim(w->y, 0, n), H = dim(w->y, 1, n), D = dim(w->y, 2, n);
    vk_dispatch *x = next(w, VKS_ROPE, 64, w->mode);
    x->bind[0] = VKB_DST;
    x->bind[1] = 0;
    x->bind[2] = 1;
    if (l->nsrc > 2) {
        x->bind[3] = 2;
    } else {
        x->bind[3] = VKB_CONST;
        x->add_off[3] = (uint32_t)(w->const_off / 4);
    }
    x->p[0] = (int32_t)T;
    x->p[1] = (int32_t)H;
    x->p[2] = (int32_t)D;
    x->p[7] = w->s[1].type == TWK_I64;
    x->fp[0] = l->ip[0] ? -1.0f : 1.0f;
    x->groups[0] = groups_for(w->c, T * H * (D / 2), 64);
    return 0;
}

/* the fusion pass's pairs, rmsnorm_rope (MODE 7) and rope_rmsnorm_back_x (MODE 8): rownorm.comp,
 * a work-group per (token, head) row of the work-group size rmsnorm runs (the same sums) */
static int lower_norm_rope(vk_low *w) {
    const twk_launch *l = w->l;
    int64_t T = dim(w->y, 0, w->n), H = dim(w->y, 1, w->n), D = dim(w->y, 2, w->n);
    int pos = w->mode == 7 ? 2 : 3; /* the source holding the positions; inv_freq the next */
    vk_dispatch *x = next(w, VKS_ROWNORM, 128, w->mode);
    x->bind[0] = VKB_DST;
    for (int i = 0; i <= pos; i++) x->bind[1 + i] = i;
    if (l->nsrc > pos + 1) {
        x->bind[2 + pos] = pos + 1;
    } else {
        x->bind[2 + pos] = VKB_CONST;
        x->add_off[2 + pos] = (uint32_t)(w->const_off / 4);
    }
    x->p[0] = (int32_t)(T * H);
    x->p[1] = (int32_t)D;
    x->p[2] = (int32_t)H;
    x->p[7] = w->s[pos].type == TWK_I64;
    x->fp[0] = l->fp[0];
    x->fp[1] = l->ip[0] ? -1.0f : 1.0f;
    x->groups[0] = groups_for(w->c, T * H, 1);
    return 0;
}

/* logprobs and its gradient: a work-group per token row */
static int lower_logprobs(vk_low *w) {
    int64_t T = dim(&w->s[0], 0, w->n), V = dim(&w->s[0], 1, w->n);
    vk_dispatch *x = next(w, VKS_ROWNORM, 128, w->mode);
    x->bind[0] = VKB_DST;
    for (int i = 0; i < w->l->nsrc; i++) x->bind[1 + i] = i;
    x->p[0] = (int32_t)T;
    x->p[1] = (int32_t)V;
    x->p[7] = w->s[1].type == TWK_I64;
    x->groups[0] = groups_for(w->c, T, 1);
    return 0;
}

/* unembed_logprobs (MODE 0) and its gradient (MODE 1): a work-group per 8-token tile (unembed.comp),
 * 256 invocations (one vocabulary word each per chunk) or fewer where the device's limits need */
static int lower_unembed(vk_low *w) {
    int64_t T = dim(&w->s[0], 0, w->n), H = dim(&w->s[0], 1, w->n), V = dim(&w->s[1], 0, w->n);
    vk_dispatch *x = next(w, VKS_UNEMBED, 256, w->mode);
    const VkPhysicalDeviceLimits *lim = &w->c->props.limits;
    /* shared floats: hs 8 x 16, ws WG x 17, gs 8 x WG, red WG, tg / dd / lse 8 each */
    while (x->spec[0] > 32 && (x->spec[0] > lim->maxComputeWorkGroupInvocations ||
                               4u * (128u + 26u * x->spec[0] + 24u) > lim->maxComputeSharedMemorySize))
        x->spec[0] /= 2;
    x->spec[10] = h16_code(w->s[1].type); /* a 16-bit unembedding, widened as it is staged */
    x->bind[0] = VKB_DST;
    for (int i = 0; i < w->l->nsrc; i++) x->bind[1 + i] = i;
    x->p[0] = (int32_t)T;
    x->p[1] = (int32_t)H;
    x->p[2] = (int32_t)V;
    x->p[7] = w->s[2].type == TWK_I64;
    x->groups[0] = groups_for(w->c, (T + 7) / 8, 1);
    return 0;
}

/* attn, attn_lse, attn_back on the tiled attn_tile.comp (vk_lower_attn.c); attn_cache (attn.comp); with
 * TWK_ATTN_UNTILED=1 or a head size above 512, attn / attn_lse (attn.comp) and attn_back (attn_back.comp) */
static int lower_attn(vk_low *w) {
    const twk_launch *l = w->l;
    const twk_tensor_desc *s = w->s;
    int64_t n = w->n;
    int segi = l->op == TWK_OP_ATTN_LSE ? 2 : 3;
    int64_t T = dim(&s[0], 0, n), Hq = dim(&s[0], 1, n), D = dim(&s[0], 2, n), Hkv = dim(&s[1], 1, n);
    int64_t rows = l->op == TWK_OP_ATTN_CACHE ? dim(&s[1], 0, n) : T;
    if (Hkv < 1 || Hq % Hkv) {
        twk_error(TWK_ERR_SHAPE, "vulkan: %s '%s': %lld query heads over %lld kv heads", twk_op_name(l->op), l->name,
                  (long long)Hq, (long long)Hkv);
        return -1;
    }
    if (vk_attn_tiled(w->c, l, D)) return vk_lower_attn_tile(w->c, l, n, w->d, &w->k, &w->scratch);
    vk_dispatch *x;
    if (l->op == TWK_OP_ATTN_BACK) {
        x = next(w, VKS_ATTN_BACK, 64, l->ip[0]);
        for (int i = 0; i < 7; i++) x->bind[1 + i] = i;
    } else {
        x = next(w, VKS_ATTN, 64, w->mode);
        x->bind[1] = 0;
        x->bind[2] = 1;
        if (l->op != TWK_OP_ATTN_LSE) x->bind[3] = 2;
        x->bind[4] = segi;
        if (l->op == TWK_OP_ATTN_CACHE) {
            x->bind[5] = 4;
            x->p[7] = s[4].type == TWK_I64;
            x->spec[10] = h16_code(s[1].type); /* 16-bit K / V caches */
            x->spec[11] = h16_code(s[2].type);
        }
    }
    x->bind[0] = VKB_DST;
    int64_t p[5] = {T, Hq, Hkv, D, rows};
    for (int i = 0; i < 5; i++) x->p[i] = (int32_t)p[i];
    x->p[6] = s[segi].type == TWK_I64;
    x->fp[0] = l->fp[0];
    x->fp[1] = l->fp[1];                       /* soft-cap */
    x->p[8] = l->ip[1] > 0 ? l->ip[1] : 0; /* sliding window */
    int kv_groups = l->op == TWK_OP_ATTN_BACK && l->ip[0] != 0;
    if ((kv_groups ? Hkv : Hq) > (int64_t)w->c->max_groups) return VK_TOO_BIG;
    x->groups[0] = (uint32_t)(kv_groups ? Hkv : Hq);
    x->groups[1] = groups_for(w->c, T, 1);
    int64_t S = vk_attn_splits(l, w->cap);
    if (S > 1) { /* split-K: the pieces' partials into the scratch (MODE 3), then their merge (MODE 4) */
        x->spec[1] = 3;
        x->bind[0] = VKB_SCRATCH;
        x->p[9] = (int32_t)S;
        x->groups[2] = (uint32_t)S;
        w->scratch = (size_t)(T * Hq * S * (D + 2)) * sizeof(float);
        vk_dispatch *r = next(w, VKS_ATTN, 64, 4);
        r->bind[0] = VKB_DST;
        r->bind[1] = VKB_SCRATCH;
        for (int i = 0; i < 4; i++) r->p[i] = (int32_t)p[i];
        r->p[9] = (int32_t)S;
        r->groups[0] = groups_for(w->c, T * Hq * D, 64);
    }
    return 0;
}

/* A check.comp dispatch over the launch's checked ids, by the op table's IDS
 * rule (MODE 0 ranges, 1 segment starts, 2 row ranges from two sources),
 * before its own dispatches. */
static void check_ids(vk_low *w) {
    const twk_op_traits *op = twk_op_info(w->l->op);
    if (op->ids.check == TWK_IDS_NONE || !op->checked) return;
    int src = __builtin_ctz(op->checked), mode = (int)op->ids.check - TWK_IDS_RANGE;
    const twk_tensor_desc *b = op->ids.bound_src < 0 ? w->y : &w->s[op->ids.bound_src];
    int64_t count = twk_desc_nelem(&w->s[src], w->n);
    int64_t limit = op->ids.check == TWK_IDS_SEGMENTS ? count : dim(b, op->ids.bound_dim, w->n);
    vk_dispatch *x = next(w, VKS_CHECK, 64, mode);
    x->bind[1] = src;
    x->p[0] = (int32_t)count;
    x->p[1] = (int32_t)(limit > INT32_MAX ? INT32_MAX : limit);
    x->p[2] = w->s[src].type == TWK_I64;
    x->p[4] = w->li;
    if (op->ids.check == TWK_IDS_ROWS) {
        x->bind[2] = src + 1;
        x->p[3] = w->s[src + 1].type == TWK_I64;
    }
    x->groups[0] = groups_for(w->c, count, 64);
}

/* ---- mixture-of-experts routing (moe.comp, MODE from the table) ---- */

/* moe_topk (0), moe_gate (1), moe_gate_back (2): one invocation per token; moe_sort (3): the
 * output zeroed, then one 64-invocation group per expert; moe_dispatch (4), moe_combine (5): one per
 * element, w (source 3) optional; moe_combine_back_w (6): one per (token, choice) */
static int lower_moe(vk_low *w) {
    const twk_launch *l = w->l;
    const twk_tensor_desc *s = w->s;
    int64_t n = w->n;
    if (w->mode == 3) {
        vk_dispatch *z = next(w, VKS_COPY, 128, 1);
        z->bind[0] = VKB_DST;
        z->p[13] = (int32_t)w->ny;
        z->groups[0] = groups_for(w->c, w->ny, 128);
    }
    vk_dispatch *x = next(w, VKS_MOE, 64, w->mode);
    x->bind[0] = VKB_DST;
    int64_t items;
    if (w->mode <= 2) { /* logits [T, E], ids [T, K] (topk: the output), dy [T, K] */
        const twk_tensor_desc *ids = w->mode == 0 ? w->y : &s[1];
        x->bind[1] = 0;
        if (w->mode > 0) x->bind[2] = 1;
        if (w->mode == 2) x->bind[3] = 2;
        x->p[0] = (int32_t)dim(ids, 0, n);
        x->p[1] = (int32_t)dim(&s[0], 1, n);
        x->p[2] = (int32_t)dim(ids, 1, n);
        x->p[3] = l->ip[0] != 0;
        x->p[7] = w->mode > 0 && s[1].type == TWK_I64;
        items = x->p[0];
    } else if (w->mode == 3) {
        x->bind[2] = 1;
        x->p[0] = (int32_t)w->ny;
        x->p[1] = (int32_t)dim(&s[0], 1, n);
        x->p[2] = l->ip[0];
        x->p[7] = s[1].type == TWK_I64;
        items = (int64_t)x->p[1] * 64; /* a 64-invocation group per expert */
    } else {
        int dispatch = w->mode == 4, perm = dispatch ? 1 : 2;
        const twk_tensor_desc *tok = dispatch ? &s[0] : w->mode == 5 ? w->y : &s[3];
        int64_t T = dim(tok, 0, n), H = dim(&s[0], 1, n), R = dispatch ? dim(w->y, 0, n) : dim(&s[0], 0, n);
        x->bind[1] = 0;
        x->bind[2] = perm;
        x->bind[3] = w->mode == 6 || l->nsrc > 3 ? 3 : 0;
        x->p[0] = (int32_t)(dispatch ? R : T);
        x->p[1] = (int32_t)H;
        x->p[2] = (int32_t)(T ? R / T : 1);
        x->p[3] = l->nsrc > 3;
        x->p[7] = s[perm].type == TWK_I64;
        items = w->mode == 6 ? R : w->ny;
    }
    x->groups[0] = groups_for(w->c, items, 64);
    return 0;
}

/* moe_router_stats (7): one 64-invocation group per (slot, expert) of dst [2, E] / [S, 2, E]; its
 * backward (8): one per row, dy at binding 3. The slot (source 2, binding 4) is optional. */
static int lower_router_stats(vk_low *w) {
    const twk_launch *l = w->l;
    const twk_tensor_desc *s = w->s;
    int back = w->mode == 8, has_slot = l->nsrc > 2;
    int64_t T = dim(&s[0], 0, w->n), E = dim(&s[0], 1, w->n);
    int64_t S = !has_slot ? 1 : back ? dim(&s[1], 0, w->n) : dim(w->y, 0, w->n);
    vk_dispatch *x = next(w, VKS_MOE, 64, w->mode);
    x->bind[0] = VKB_DST;
    x->bind[1] = 0;
    x->bind[back ? 3 : 2] = 1;
    if (has_slot) x->bind[4] = 2;
    x->p[0] = (int32_t)T;
    x->p[1] = (int32_t)E;
    x->p[2] = back ? 0 : (int32_t)dim(&s[1], 1, w->n);
    x->p[3] = (int32_t)S;
    x->p[4] = has_slot;
    x->p[6] = has_slot && s[2].type == TWK_I64;
    x->p[7] = !back && s[1].type == TWK_I64;
    x->groups[0] = groups_for(w->c, back ? T : S * E * 64, 64); /* forward: a 64-invocation group per (s, e) */
    return 0;
}

/* ---- the table ---- */

/* the optimizer step (optim.comp): grad_acc, sqsum_parts (a group per slice), grad_norm, adamw */
static int lower_optim(vk_low *w) {
    if (w->mode == 1 && !twk_reduce_narrow()) { /* the wide sums of squares, per slice */
        int64_t nx = twk_desc_nelem(&w->s[0], w->n), P = dim(w->y, 0, w->n);
        return wide_sum(w, nx, P, twk_wide_tiles(w->c->compute_units, P, (nx + P - 1) / P, VK_WIDE_GRAIN), 2, 1, 1.0f);
    }
    if (w->mode == 2 && !twk_reduce_narrow()) { /* the slices' pairs folded by one work-group */
        vk_dispatch *x = next(w, VKS_OPTIM, wide_wg(w->c), 4);
        x->bind[0] = VKB_DST;
        x->bind[1] = 0;
        x->bind[2] = 1;
        x->p[1] = (int32_t)dim(&w->s[0], 0, w->n);
        return 0;
    }
    int per_slice = w->mode == 1, one_item = w->mode == 2;
    vk_dispatch *x = next(w, VKS_OPTIM, per_slice ? 256 : 128, w->mode);
    while (per_slice && x->spec[0] > w->c->props.limits.maxComputeWorkGroupInvocations) x->spec[0] /= 2;
    x->bind[0] = VKB_DST;
    if (w->mode == 0) x->bind[1] = 1;
    if (w->mode == 1 || w->mode == 2) x->bind[1] = 0;
    if (w->mode == 2) x->bind[2] = 1;
    for (int i = 1; w->mode == 3 && i < 6; i++) x->bind[i] = i;
    int64_t n = twk_desc_nelem(per_slice ? &w->s[0] : w->y, w->n);
    if (n > INT32_MAX) return VK_TOO_BIG;
    x->p[0] = (int32_t)n;
    x->p[1] = (int32_t)(w->mode == 2 ? dim(&w->s[0], 0, w->n) : dim(w->y, 0, w->n));
    x->groups[0] = per_slice ? (uint32_t)x->p[1] : one_item ? 1u : groups_for(w->c, n, 128);
    return 0;
}

/* fused elementwise chains (vk_lower_fused.c) */
static int lower_fused(vk_low *w) { return vk_lower_fused(w->c, w->l, w->ny, w->d, &w->k); }

/* One op's entry: its lowering and the MODE spec constant it gives its
 * shader (see the shader's header comment), or why Vulkan does not run an
 * op that has a CPU kernel. */
typedef struct vk_entry {
    vk_lower_fn lower;
    int mode;
    const char *unsupported;
} vk_entry;

static const vk_entry table[TWK_OP_COUNT] = {
    [TWK_OP_FILL] = {lower_eltwise, 0},
    [TWK_OP_PERMUTE] = {lower_permute, 0},
    [TWK_OP_SLICE] = {lower_axis_copy, 0},
    [TWK_OP_SLICE_BACK] = {lower_axis_copy, 0},
    [TWK_OP_CONCAT] = {lower_axis_copy, 0},
    [TWK_OP_BROADCAST] = {lower_broadcast, 2},
    [TWK_OP_SUM_TO] = {lower_sum_to, 0},
    [TWK_OP_ADD] = {lower_broadcast, 0},
    [TWK_OP_MUL] = {lower_broadcast, 1},
    [TWK_OP_SCALE] = {lower_eltwise, 1},
    [TWK_OP_SILU] = {lower_eltwise, 2},
    [TWK_OP_SILU_BACK] = {lower_eltwise, 3},
    [TWK_OP_SWIGLU] = {lower_eltwise, 4},
    [TWK_OP_SWIGLU_BACK] = {lower_eltwise, 5}, /* 5 d/dgate, 6 d/dup */
    [TWK_OP_GELU] = {lower_eltwise, 7},
    [TWK_OP_GELU_BACK] = {lower_eltwise, 8},
    [TWK_OP_TANH] = {lower_eltwise, 9},
    [TWK_OP_TANH_BACK] = {lower_eltwise, 10},
    [TWK_OP_SUM] = {lower_reduce, 0},
    [TWK_OP_MEAN] = {lower_reduce, 1},
    [TWK_OP_WEIGHTED_SUM] = {lower_reduce, 2},
    [TWK_OP_MATMUL] = {lower_matmul, 0},
    [TWK_OP_GET_ROWS] = {lower_get_rows, 0},
    [TWK_OP_GET_ROWS_BACK] = {lower_get_rows, 1},
    [TWK_OP_RMSNORM] = {lower_rownorm, 0},
    [TWK_OP_RMSNORM_BACK_X] = {lower_rownorm, 1},
    [TWK_OP_RMSNORM_BACK_W] = {lower_rmsnorm_back_w, 2}, /* 2 rstd, 3 column sums */
    [TWK_OP_ROPE] = {lower_rope, 0},
    [TWK_OP_ATTN] = {lower_attn, 0},
    [TWK_OP_ATTN_LSE] = {lower_attn, 1},
    [TWK_OP_ATTN_BACK] = {lower_attn, 0}, /* MODE = iparam 0 (which) */
    [TWK_OP_LOGPROBS] = {lower_logprobs, 4},
    [TWK_OP_LOGPROBS_BACK] = {lower_logprobs, 5},
    [TWK_OP_UNEMBED_LOGPROBS] = {lower_unembed, 0},
    [TWK_OP_UNEMBED_LOGPROBS_BACK] = {lower_unembed, 1},
    [TWK_OP_UNEMBED_LOGPROBS_DIR] = {.unsupported = "the two-product unembedding is the CPU's: its chunks run through the BLAS; this backend's trainers take unembed_logprobs (+ back), whose tiles stay in work-group memory"},
    [TWK_OP_KV_WRITE] = {lower_kv_write, 2},
    [TWK_OP_ATTN_CACHE] = {lower_attn, 2},
    [TWK_OP_LORA_GATHER] = {lower_lora_gather, 3},
    [TWK_OP_GRAD_ACC] = {lower_optim, 0},
    [TWK_OP_SQSUM_PARTS] = {lower_optim, 1},
    [TWK_OP_GRAD_NORM] = {lower_optim, 2},
    [TWK_OP_ADAMW] = {lower_optim, 3},
    [TWK_OP_MOE_TOPK] = {lower_moe, 0},
    [TWK_OP_MOE_GATE] = {lower_moe, 1},
    [TWK_OP_MOE_GATE_BACK] = {lower_moe, 2},
    [TWK_OP_MOE_SORT] = {lower_moe, 3},
    [TWK_OP_MOE_DISPATCH] = {lower_moe, 4},
    [TWK_OP_MOE_COMBINE] = {lower_moe, 5},
    [TWK_OP_MOE_COMBINE_BACK_W] = {lower_moe, 6},
    [TWK_OP_MOE_ROUTER_STATS] = {lower_router_stats, 7},
    [TWK_OP_MOE_ROUTER_STATS_BACK] = {lower_router_stats, 8},
    [TWK_OP_LORA_GATHER_BACK] = {lower_lora_gather, 4},
    [TWK_OP_FUSED_EW] = {lower_fused, 0}, /* fused.comp interprets the chain's steps (vk_lower_fused.c) */
    [TWK_OP_RMSNORM_ROPE] = {lower_norm_rope, 7},        /* rownorm.comp MODE 7 */
    [TWK_OP_ROPE_RMSNORM_BACK_X] = {lower_norm_rope, 8}, /* rownorm.comp MODE 8 */
};
_Static_assert(sizeof table / sizeof table[0] == TWK_OP_COUNT, "one entry per op");

static const vk_entry *entry(twk_op op) { return (int)op >= 0 && op < TWK_OP_COUNT ? &table[op] : NULL; }

int vk_op_kernel(twk_op op, const char **why) {
    const vk_entry *e = entry(op);
    *why = e ? e->unsupported : NULL;
    return e && e->lower;
}

unsigned vk_half_srcs(twk_op op) {
    switch (op) { /* read or written as packed 32-bit words (common.glsl) */
    case TWK_OP_MATMUL: return TWK_SRC(1);                  /* matmul.comp widens B as it loads it */
    case TWK_OP_GET_ROWS: return TWK_SRC(0);                /* rows.comp MODE 0 */
    case TWK_OP_KV_WRITE: return TWK_SRC(0);                /* rows.comp: narrowed, round to nearest even */
    case TWK_OP_ATTN_CACHE: return TWK_SRC(1) | TWK_SRC(2); /* attn.comp MODE 2 */
    case TWK_OP_ATTN:
    case TWK_OP_ATTN_BACK: return TWK_SRC(0) | TWK_SRC(1) | TWK_SRC(2); /* attn_tile.comp: widened as staged */
    case TWK_OP_ATTN_LSE: return TWK_SRC(0) | TWK_SRC(1);
    case TWK_OP_UNEMBED_LOGPROBS:
    case TWK_OP_UNEMBED_LOGPROBS_BACK: return TWK_SRC(1);   /* unembed.comp: w widened as staged */
    case TWK_OP_LORA_GATHER: return TWK_SRC(1);             /* rows.comp MODE 3: the expert stack widened as read */
    default: return 0;
    }
}

bool vk_supports(const twk_launch *l, char *why, size_t why_len) {
    const char *reason = NULL;
    if (!vk_op_kernel(l->op, &reason)) {
        if (why) snprintf(why, why_len, "no vulkan kernel for %s%s%s", twk_op_name(l->op), reason ? ": " : "",
                          reason ? reason : "");
        return false;
    }
    if (l->dst.ndim > 4 || l->dst.ndim < 1) {
        if (why) snprintf(why, why_len, "rank %d", l->dst.ndim);
        return false;
    }
    if (!twk_launch_dtypes_ok(l, vk_half_srcs(l->op), "vulkan", why, why_len)) return false;
    if (twk_op_info(l->op)->kind == TWK_OPK_COPY) { /* copy.comp moves 32-bit words */
        size_t es = twk_dtype_size(l->dst.type);
        if (es == 4 || es == 8) return true;
        if (why) snprintf(why, why_len, "%s of %zu-byte elements", twk_op_name(l->op), es);
        return false;
    }
    if (l->op == TWK_OP_FUSED_EW && !vk_fused_ok(l, why, why_len)) return false;
    if (vk_attn_half(l) && l->src[0].ndim == 3 && l->src[0].ne[2] > VK_ATTN_TILE_MAXD) { /* the per-token shaders read f32 */
        if (why) snprintf(why, why_len, "%s with 16-bit operands at head size %lld (the tiled shader's limit is %d)",
                          twk_op_name(l->op), (long long)l->src[0].ne[2], VK_ATTN_TILE_MAXD);
        return false;
    }
    if (l->op == TWK_OP_MATMUL && l->src[0].ndim != 2 && l->src[0].ndim != 3) {
        if (why) snprintf(why, why_len, "matmul of rank %d", l->src[0].ndim);
        return false;
    }
    return true;
}

int vk_lower(const vk_ctx *c, const twk_launch *l, int li, int64_t n, int64_t cap, size_t const_off, vk_dispatch *d,
             size_t *scratch_bytes) {
    vk_low w = {.c = c, .l = l, .y = &l->dst, .s = l->src, .li = li, .n = n, .cap = cap, .ny = twk_desc_nelem(&l->dst, n),
                .const_off = const_off, .d = d};
    *scratch_bytes = 0;
    const vk_entry *e = entry(l->op);
    if (!e || !e->lower) {
        twk_error(TWK_ERR_UNSUPPORTED, "vulkan: no kernel for op %s ('%s')", twk_op_name(l->op), l->name);
        return -1;
    }
    int big = w.ny > INT32_MAX;
    for (int i = 0; i < l->nsrc; i++) big |= twk_desc_nelem(&l->src[i], n) > INT32_MAX;
    w.mode = e->mode;
    if (!big) check_ids(&w);
    int r = big ? VK_TOO_BIG : e->lower(&w);
    if (r == VK_TOO_BIG) {
        twk_error(TWK_ERR_UNSUPPORTED, "vulkan: %s '%s' is too large for 32-bit shader indexing", twk_op_name(l->op),
                  l->name);
        return -1;
    }
    if (r < 0) return -1;
    *scratch_bytes = w.scratch;
    return w.k;
}
