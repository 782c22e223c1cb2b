/* Lowerings of training attention (ATTN, ATTN_LSE, ATTN_BACK) onto the tiled kernels of
 * attn_tile.cl, the tile size from the head size, and the plan scratch they need (attn_back's
 * delta = rowsum(dO * o)). TWK_ATTN_UNTILED=1 in the environment keeps the older kernels of
 * attn.cl (one group per token and head), for benchmarks that compare the two. */
#include <stdlib.h>

#include "kd_internal.h"

int kd_attn_untiled(void) {
    const char *e = getenv("TWK_ATTN_UNTILED");
    return e && e[0] == '1';
}

/* Queries (and keys) per tile: the largest power of two <= KD_FA_MAXB with B * D <= bd. */
static int64_t tile_of(int64_t D, int64_t bd) {
    int64_t b = KD_FA_MAXB;
    while (b > 1 && b * D > bd) b /= 2;
    return b;
}

/* The arguments every tiled kernel takes after its buffers: the error word, the sizes, the tile, the scale. */
static void tile_dims(kd_call *c, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, int64_t B, float scale) {
    kd_err(c);
    kd_i64(c, T);
    kd_i64(c, Hq);
    kd_i64(c, Hkv);
    kd_i64(c, D);
    kd_i64(c, B);
    kd_f32(c, scale);
}

static int is64(const twk_launch *l, int src) { return l->src[src].type == TWK_I64; }

int kd_lower_attn_tile_fwd(const twk_launch *l, int64_t n, kd_call *calls) {
    const twk_tensor_desc *q = &l->src[0], *k = &l->src[1];
    int64_t T = kd_dim(q, 0, n), Hq = kd_dim(q, 1, n), D = kd_dim(q, 2, n), Hkv = kd_dim(k, 1, n);
    int lse = l->op == TWK_OP_ATTN_LSE, seg = lse ? 2 : 3;
    int64_t B = tile_of(D, KD_FA_FWD_BD);
    kd_call *c = &calls[0];
    kd_begin(c, "attn_tile_fwd_f32");
    kd_buf(c, l, -1, 4);             /* o (unused for lse) */
    kd_buf(c, l, -1, 4);             /* lse (unused otherwise) */
    kd_buf(c, l, 0, 4);
    kd_buf(c, l, 1, 4);
    kd_buf(c, l, lse ? 1 : 2, 4);    /* v (k stands in for attn_lse) */
    kd_buf(c, l, seg, 4);
    tile_dims(c, T, Hq, Hkv, D, B, l->fp[0]);
    kd_i32(c, !lse);
    kd_i32(c, lse);
    kd_i32(c, is64(l, seg));
    kd_i64(c, l->ip[1] > 0 ? l->ip[1] : 0); /* window */
    kd_f32(c, l->fp[1]);                    /* softcap */
    kd_grid_groups(c, (T + B - 1) / B * Hq, KD_FA_L);
    return 1;
}

size_t kd_attn_scratch_bytes(const twk_launch *l, int64_t n) {
    if (!l || l->op != TWK_OP_ATTN_BACK || l->ip[0] == 2 || kd_attn_untiled()) return 0;
    return (size_t)(kd_dim(&l->src[0], 0, n) * kd_dim(&l->src[0], 1, n)) * sizeof(float);
}

/* (q, k, v, seg, o, dO, lse): which 0 dQ, 1 dK (both after delta into the scratch), 2 dV. */
int kd_lower_attn_tile_back(const twk_launch *l, int64_t n, kd_call *calls) {
    const twk_tensor_desc *q = &l->src[0], *k = &l->src[1];
    int64_t T = kd_dim(q, 0, n), Hq = kd_dim(q, 1, n), D = kd_dim(q, 2, n), Hkv = kd_dim(k, 1, n);
    int which = l->ip[0], nc = 0;
    int64_t B = tile_of(D, KD_FA_BWD_BD);
    if (which != 2) {
        kd_call *d = &calls[nc++];
        kd_begin(d, "attn_tile_delta_f32");
        kd_arg *y = &d->args[d->nargs++];
        y->kind = KD_SCRATCH;
        y->i64 = 0;
        kd_buf(d, l, 4, 4); /* o */
        kd_buf(d, l, 5, 4); /* dO */
        kd_i64(d, T * Hq);
        kd_i64(d, D);
        kd_grid_items(d, T * Hq, KD_LOCAL_1D);
    }
    kd_call *c = &calls[nc++];
    kd_begin(c, which == 0 ? "attn_tile_back_q_f32" : "attn_tile_back_kv_f32");
    kd_buf(c, l, -1, 4);
    for (int i = 0; i < 4; i++) kd_buf(c, l, i, 4); /* q, k, v, seg */
    kd_buf(c, l, 5, 4);                             /* dO */
    kd_buf(c, l, 6, 4);                             /* lse */
    if (which != 2) {
        kd_arg *s = &c->args[c->nargs++];
        s->kind = KD_SCRATCH;
        s->i64 = 0;
    } else {
        kd_buf(c, l, 6, 4); /* dV reads no delta: lse stands in */
    }
    tile_dims(c, T, Hq, Hkv, D, B, l->fp[0]);
    if (which != 0) kd_i32(c, which);
    kd_i32(c, is64(l, 3));
    kd_i64(c, l->ip[1] > 0 ? l->ip[1] : 0); /* window */
    kd_f32(c, l->fp[1]);                    /* softcap */
    kd_grid_groups(c, (T + B - 1) / B * (which == 0 ? Hq : Hkv), KD_FA_L);
    return nc;
}
