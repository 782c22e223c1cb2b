/* Lowerings of training attention (ATTN, ATTN_LSE, ATTN_BACK) onto the tiled kernels of
 * attn_tile.cl, the tile size from the head size, split-K decode attention (ATTN_CACHE over a
 * long cache, attn_split.cl), and the plan scratch they need (attn_back's delta = rowsum(dO * o),
 * the split partials). TWK_ATTN_UNTILED=1 in the environment keeps the older kernels of attn.cl
 * (one group per token and head; f32 only: a launch with a bf16 / f16 q, k or v stays tiled),
 * TWK_ATTN_UNSPLIT=1 one group per (query, head) for attn_cache, for benchmarks that compare them. */
#include <stdlib.h>

#include "kd_internal.h"

static int env_on(const char *name) {
    const char *e = getenv(name);
    return e && e[0] == '1';
}

int kd_attn_untiled(const twk_launch *l) {
    for (int i = 0; i < 3 && i < l->nsrc - 1; i++) /* q, k (and v): the tiled kernels widen 16-bit ones */
        if (twk_dtype_is_half(l->src[i].type)) return 0;
    return env_on("TWK_ATTN_UNTILED");
}

/* Bytes of one piece's partials for every (query, head) of attn_cache: T Hq (D + 2) floats. */
static int64_t split_row_bytes(const twk_launch *l, int64_t n) {
    const twk_tensor_desc *q = &l->src[0];
    return kd_dim(q, 0, n) * kd_dim(q, 1, n) * (kd_dim(q, 2, n) + 2) * (int64_t)sizeof(float);
}

/* Pieces per (query, head) of attn_cache at n: 1 (one group per query and head) unless the
 * longest key range the cache allows (its rows, or the window) exceeds KD_SPLIT_KEYS; then
 * ceil(range / KD_SPLIT_KEYS), at most KD_SPLIT_MAX, fewer while the partials, T Hq S (D + 2)
 * floats, would pass KD_SPLIT_BUDGET bytes. */
int64_t kd_attn_splits(const twk_launch *l, int64_t n) {
    if (!l || l->op != TWK_OP_ATTN_CACHE || env_on("TWK_ATTN_UNSPLIT")) return 1;
    int64_t R = kd_dim(&l->src[1], 0, n), w = l->ip[1], ctx = w > 0 && w < R ? w : R;
    if (ctx <= KD_SPLIT_KEYS) return 1;
    int64_t S = (ctx + KD_SPLIT_KEYS - 1) / KD_SPLIT_KEYS, per = split_row_bytes(l, n);
    if (S > KD_SPLIT_MAX) S = KD_SPLIT_MAX;
    while (S > 1 && per * S > KD_SPLIT_BUDGET) S--;
    return S;
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

/* Source i (q, k or v) as the tiled kernels take it: the buffer with its offset in elements of
 * its dtype; its dtype code (KD_FA_F32 0, KD_FA_BF16 1, KD_FA_F16 2 in attn_tile.cl) comes last. */
static void qkv_buf(kd_call *c, const twk_launch *l, int i) {
    kd_buf(c, l, i, twk_dtype_is_half(l->src[i].type) ? 2 : 4);
}
static int qkv_code(const twk_launch *l, int i) {
    twk_dtype t = l->src[i].type;
    return t == TWK_BF16 ? 1 : t == TWK_F16 ? 2 : 0;
}

int kd_lower_attn_tile_fwd(const twk_launch *l, int64_t n, kd_call *calls) {
    const twk_tensor_desc *q = &l->src[0], *k = &l->src[1];
    int64_t T = kd_dim(q, 0, n), Hq = kd_dim(q, 1, n), D = kd_dim(q, 2, n), Hkv = kd_dim(k, 1, n);
    int lse = l->op == TWK_OP_ATTN_LSE, seg = lse ? 2 : 3;
    int64_t B = tile_of(D, KD_FA_FWD_BD);
    kd_call *c = &calls[0];
    kd_begin(c, "attn_tile_fwd_f32");
    kd_buf(c, l, -1, 4);             /* o (unused for lse) */
    kd_buf(c, l, -1, 4);             /* lse (unused otherwise) */
    qkv_buf(c, l, 0);
    qkv_buf(c, l, 1);
    qkv_buf(c, l, lse ? 1 : 2);      /* v (k stands in for attn_lse) */
    kd_buf(c, l, seg, 4);
    tile_dims(c, T, Hq, Hkv, D, B, l->fp[0]);
    kd_i32(c, !lse);
    kd_i32(c, lse);
    kd_i32(c, is64(l, seg));
    kd_i64(c, l->ip[1] > 0 ? l->ip[1] : 0); /* window */
    kd_f32(c, l->fp[1]);                    /* softcap */
    kd_i32(c, qkv_code(l, 0));
    kd_i32(c, qkv_code(l, 1));
    kd_i32(c, qkv_code(l, lse ? 1 : 2));
    kd_grid_groups(c, (T + B - 1) / B * Hq, KD_FA_L);
    return 1;
}

size_t kd_attn_scratch_bytes(const twk_launch *l, int64_t n) {
    if (l && l->op == TWK_OP_ATTN_CACHE) { /* the most any n' <= n needs (the pieces shrink as T grows) */
        if (kd_attn_splits(l, 1) <= 1 && kd_attn_splits(l, n) <= 1) return 0;
        int64_t b = split_row_bytes(l, n) * KD_SPLIT_MAX;
        return (size_t)(b < KD_SPLIT_BUDGET ? b : KD_SPLIT_BUDGET);
    }
    if (!l || l->op != TWK_OP_ATTN_BACK || l->ip[0] == 2 || kd_attn_untiled(l)) return 0;
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
    for (int i = 0; i < 3; i++) qkv_buf(c, l, i); /* q, k, v */
    kd_buf(c, l, 3, 4);                           /* seg */
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
    for (int i = 0; i < 3; i++) kd_i32(c, qkv_code(l, i));
    kd_grid_groups(c, (T + B - 1) / B * (which == 0 ? Hq : Hkv), KD_FA_L);
    return nc;
}

/* attn_cache split-K: the partials of every piece into the scratch, then their merge into o. */
int kd_lower_attn_split(const twk_launch *l, int64_t n, kd_call *calls) {
    const twk_tensor_desc *q = &l->src[0], *k = &l->src[1];
    int64_t T = kd_dim(q, 0, n), Hq = kd_dim(q, 1, n), D = kd_dim(q, 2, n), Hkv = kd_dim(k, 1, n);
    int64_t S = kd_attn_splits(l, n);
    int h16 = twk_dtype_is_half(k->type);
    kd_call *c = &calls[0];
    kd_begin(c, h16 ? "attn_split_h16" : "attn_split_f32");
    kd_arg *p = &c->args[c->nargs++];
    p->kind = KD_SCRATCH;
    p->i64 = 0;
    kd_buf(c, l, 0, 4);
    kd_buf(c, l, 1, h16 ? 2 : 4);
    kd_buf(c, l, 2, h16 ? 2 : 4);
    kd_buf(c, l, 3, 4); /* lo */
    kd_buf(c, l, 4, 4); /* hi */
    kd_err(c);
    kd_i64(c, Hq);
    kd_i64(c, Hkv);
    kd_i64(c, D);
    kd_i64(c, kd_dim(k, 0, n));
    kd_i64(c, S);
    kd_f32(c, l->fp[0]);
    kd_i32(c, is64(l, 3));
    kd_i32(c, is64(l, 4));
    kd_i64(c, l->ip[1] > 0 ? l->ip[1] : 0); /* window */
    kd_f32(c, l->fp[1]);                    /* softcap */
    if (h16) kd_i32(c, k->type == TWK_F16);
    kd_grid_groups(c, T * Hq * S, KD_ATTN_L);
    kd_call *r = &calls[1];
    kd_begin(r, "attn_split_reduce_f32");
    kd_buf(r, l, -1, 4);
    p = &r->args[r->nargs++];
    p->kind = KD_SCRATCH;
    p->i64 = 0;
    kd_i64(r, T * Hq);
    kd_i64(r, D);
    kd_i64(r, S);
    kd_grid_items(r, T * Hq * D, KD_LOCAL_1D);
    return 2;
}
