/* Lowerings of the wide (two-stage) reductions (hal/twk_wide.h): stage 1 runs tiles of the terms
 * as many work-groups, sized from the device's compute units, into compensated (hi, lo) pairs in
 * the plan scratch; stage 2 folds them in one work-group per reduction (reduce.cl, nn.cl,
 * optim.cl). The cut depends only on the shapes and kd_device, so results are the same bits run to
 * run. Under TWK_REDUCE_NARROW=1 every lowering here returns KD_NOT_WIDE and the table's older
 * single-group lowering runs instead (benchmarks). */
#include "kd_internal.h"
#include "twk_wide.h"

#define KD_WIDE_GRAIN_ITEMS ((int64_t)TWK_WIDE_LOCAL * TWK_WIDE_GRAIN) /* terms per tile at least */

static int cus(const kd_device *dev) { return dev ? dev->compute_units : 0; }

/* appends the plan scratch at element offset off */
static void scratch_arg(kd_call *c, int64_t off) {
    kd_arg *a = &c->args[c->nargs++];
    a->kind = KD_SCRATCH;
    a->tensor = 0;
    a->i64 = off;
}

/* tiles of a whole-tensor sum of nx terms */
static int64_t sum_tiles(const kd_device *dev, int64_t nx) { return twk_wide_tiles(cus(dev), 1, nx, KD_WIDE_GRAIN_ITEMS); }

/* sqsum_parts: tiles per slice of P slices over nx elements */
static int64_t sqsum_tiles(const kd_device *dev, int64_t nx, int64_t P) {
    return twk_wide_tiles(cus(dev), P, (nx + P - 1) / P, KD_WIDE_GRAIN_ITEMS);
}

/* rmsnorm_back_w over R rows of D: C columns per group, nb column blocks, T row tiles */
static void colsum_cut(const kd_device *dev, int64_t R, int64_t D, int *C, int64_t *nb, int64_t *T) {
    *C = twk_wide_cols(D);
    *nb = (D + *C - 1) / *C;
    *T = twk_wide_tiles(cus(dev), *nb, R, (int64_t)(TWK_WIDE_LOCAL / *C) * TWK_WIDE_GRAIN);
}

static int is_scalar_sum(const twk_launch *l, int64_t n) {
    return l->op != TWK_OP_SUM_TO || kd_nelem(&l->dst, n) == 1;
}

/* stage 1 over [0, nx) as `slices` x k tiles into the scratch's pairs (to_dst: the dst's); mode 0
 * x, 1 x w, 2 x x */
static void parts_call(const twk_launch *l, kd_call *c, int64_t nx, int64_t slices, int64_t k, int mode, int to_dst) {
    kd_begin(c, "wide_parts_f32");
    if (to_dst) kd_buf(c, l, -1, 4);
    else scratch_arg(c, 0);
    kd_buf(c, l, 0, 4);
    kd_buf(c, l, mode == 1 ? 1 : 0, 4);
    kd_i64(c, nx);
    kd_i64(c, slices);
    kd_i64(c, k);
    kd_i32(c, mode);
    kd_grid_groups(c, slices * k, TWK_WIDE_LOCAL);
}

/* stage 2: `groups` folds of k pairs each from the scratch into the dst */
static void fold_call(const twk_launch *l, kd_call *c, int64_t groups, int64_t k, int out_pair, float scale) {
    kd_begin(c, "wide_fold_f32");
    kd_buf(c, l, -1, 4);
    scratch_arg(c, 0);
    kd_i64(c, k);
    kd_i32(c, out_pair);
    kd_f32(c, scale);
    kd_grid_groups(c, groups, kd_pow2_local(k, TWK_WIDE_LOCAL));
}

int kd_wide_sum(const twk_launch *l, int64_t n, const kd_device *dev, kd_call *calls) {
    if (twk_reduce_narrow() || !is_scalar_sum(l, n)) return KD_NOT_WIDE;
    int64_t nx = kd_nelem(&l->src[0], n), G = sum_tiles(dev, nx);
    float scale = l->op == TWK_OP_MEAN ? (float)(1.0 / (double)(nx ? nx : 1)) : 1.0f;
    parts_call(l, &calls[0], nx, 1, G, l->op == TWK_OP_WEIGHTED_SUM ? 1 : 0, 0);
    fold_call(l, &calls[1], 1, G, 0, scale);
    return 2;
}

/* slices of squares: P x k tiles, each slice's k pairs folded into its (hi, lo); with one tile a
 * slice, stage 1 writes the slices' pairs itself */
int kd_wide_sqsum_parts(const twk_launch *l, int64_t n, const kd_device *dev, kd_call *calls) {
    if (twk_reduce_narrow()) return KD_NOT_WIDE;
    int64_t nx = kd_nelem(&l->src[0], n), P = kd_dim(&l->dst, 0, n), k = sqsum_tiles(dev, nx, P);
    parts_call(l, &calls[0], nx, P, k, 2, k == 1);
    if (k == 1) return 1;
    fold_call(l, &calls[1], P, k, 1, 1.0f);
    return 2;
}

/* the slices' pairs folded in one work-group, then the norm and the clip coefficient */
int kd_wide_grad_norm(const twk_launch *l, int64_t n, const kd_device *dev, kd_call *calls) {
    (void)dev;
    if (twk_reduce_narrow()) return KD_NOT_WIDE;
    int64_t P = kd_dim(&l->src[0], 0, n);
    kd_begin(calls, "grad_norm_tree_f32");
    kd_buf(calls, l, -1, 4);
    kd_buf(calls, l, 0, 4);
    kd_buf(calls, l, 1, 4);
    kd_i64(calls, P);
    kd_grid_groups(calls, 1, kd_pow2_local(P, TWK_WIDE_LOCAL));
    return 1;
}

/* rstd per row into scratch[0, R), the tiles' pairs after it, then the column folds into dw */
int kd_wide_rmsnorm_back_w(const twk_launch *l, int64_t n, const kd_device *dev, kd_call *calls) {
    if (twk_reduce_narrow()) return KD_NOT_WIDE;
    int64_t D = kd_dim(&l->dst, 0, n), R = kd_nelem(&l->src[0], n) / D, nb, T;
    int C;
    colsum_cut(dev, R, D, &C, &nb, &T);
    int k = 0;
    kd_call *c;
    if (R > 0) { /* no rows: nothing to normalize; dw is the fold of empty tiles (zeros) */
        c = &calls[k++];
        kd_begin(c, "rms_rstd_f32");
        scratch_arg(c, 0);
        kd_buf(c, l, 0, 4);
        kd_i64(c, D);
        kd_f32(c, l->fp[0]);
        kd_grid_groups(c, R, kd_pow2_local(D / 16, KD_ROW_LOCAL)); /* >= 16 terms an item: fewer tree levels */
    }
    c = &calls[k++];
    kd_begin(c, "rmsnorm_back_w_parts_f32");
    scratch_arg(c, R);
    kd_buf(c, l, 0, 4);
    kd_buf(c, l, 1, 4);
    scratch_arg(c, 0);
    kd_i64(c, R);
    kd_i64(c, D);
    kd_i64(c, T);
    kd_i32(c, C);
    kd_grid_groups(c, nb * T, TWK_WIDE_LOCAL);
    c = &calls[k++];
    kd_begin(c, "col_fold_f32");
    kd_buf(c, l, -1, 4);
    scratch_arg(c, R);
    kd_i64(c, T);
    kd_i64(c, D);
    kd_i32(c, C);
    kd_grid_groups(c, nb, TWK_WIDE_LOCAL);
    return k;
}

size_t kd_wide_scratch_bytes(const twk_launch *l, int64_t n, const kd_device *dev) {
    if (twk_reduce_narrow()) return 0;
    switch (l->op) {
    case TWK_OP_SUM:
    case TWK_OP_MEAN:
    case TWK_OP_WEIGHTED_SUM:
    case TWK_OP_SUM_TO:
        if (!is_scalar_sum(l, n)) return 0;
        return (size_t)(2 * sum_tiles(dev, kd_nelem(&l->src[0], n))) * sizeof(float);
    case TWK_OP_SQSUM_PARTS: {
        int64_t P = kd_dim(&l->dst, 0, n);
        return (size_t)(2 * P * sqsum_tiles(dev, kd_nelem(&l->src[0], n), P)) * sizeof(float);
    }
    case TWK_OP_RMSNORM_BACK_W: {
        int64_t D = kd_dim(&l->dst, 0, n), R = D ? kd_nelem(&l->src[0], n) / D : 0, nb, T;
        int C;
        colsum_cut(dev, R, D, &C, &nb, &T);
        return (size_t)(R + 2 * T * D) * sizeof(float);
    }
    default: return 0;
    }
}
