/* Lowerings of the transformer ops (nn.cl), the KV-cache ops (kvcache.cl)
 * and attention (attn.cl), one per op or per group of ops (kd.c's table). Id
 * tensors are passed as int words with an is64 flag. */
#include "kd_internal.h"

static int is64(const twk_launch *l, int src) { return l->src[src].type == TWK_I64; }

/* Whether src (-1: dst) is 16-bit: its kernel is the _h16 variant (half.cl), its offset in
 * 2-byte elements, and an f16 flag follows the arguments. */
static int half(const twk_launch *l, int src) { return twk_dtype_is_half(src < 0 ? l->dst.type : l->src[src].type); }
static int f16(const twk_launch *l, int src) { return (src < 0 ? l->dst.type : l->src[src].type) == TWK_F16; }

/* Elements of the last dim, and the rows before it. */
static int64_t last_dim(const twk_tensor_desc *t, int64_t n) { return kd_dim(t, t->ndim - 1, n); }

/* kernel(y, src0, ids, err, T, D, V, is64): get_rows and its scatter-add */
static void rows_call(const twk_launch *l, kd_call *c, const char *kernel, int64_t T, int64_t D, int64_t V) {
    kd_begin(c, kernel);
    kd_buf(c, l, -1, 4);
    kd_buf(c, l, 0, 4);
    kd_buf(c, l, 1, 4);
    kd_err(c);
    kd_i64(c, T);
    kd_i64(c, D);
    kd_i64(c, V);
    kd_i32(c, is64(l, 1));
}

int kd_lower_get_rows(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    int64_t T = kd_dim(&l->dst, 0, n), D = kd_dim(&l->dst, 1, n), V = kd_dim(&l->src[0], 0, n);
    rows_call(l, calls, half(l, 0) ? "get_rows_h16" : kernel, T, D, V);
    if (half(l, 0)) {
        calls->args[1].i64 = (int64_t)(l->src[0].offset / 2); /* the table in 2-byte elements */
        kd_i32(calls, f16(l, 0));
    }
    kd_grid_items(calls, T * D, KD_LOCAL_1D);
    return 1;
}

/* the table zeroed, then one item per column walks the tokens in order */
int kd_lower_get_rows_back(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    int64_t V = kd_dim(&l->dst, 0, n), D = kd_dim(&l->dst, 1, n), T = kd_dim(&l->src[0], 0, n);
    kd_begin(&calls[0], "zero_words");
    kd_buf(&calls[0], l, -1, 4);
    kd_i64(&calls[0], V * D);
    kd_grid_items(&calls[0], V * D, KD_LOCAL_1D);
    rows_call(l, &calls[1], kernel, T, D, V);
    kd_grid_items(&calls[1], D, 64);
    return 2;
}

/* rmsnorm and rmsnorm_back_x: one work-group per row */
int kd_lower_rmsnorm(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    int64_t D = last_dim(&l->dst, n), rows = kd_nelem(&l->dst, n) / D;
    kd_call *c = &calls[0];
    kd_begin(c, kernel);
    kd_buf(c, l, -1, 4);
    for (int i = 0; i < l->nsrc; i++) kd_buf(c, l, i, 4);
    kd_i64(c, D);
    kd_f32(c, l->fp[0]);
    kd_grid_groups(c, rows, kd_pow2_local(D, KD_ROW_LOCAL));
    return 1;
}

int kd_lower_rmsnorm_back_w(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    int64_t D = kd_dim(&l->dst, 0, n), R = kd_nelem(&l->src[0], n) / D;
    size_t L = kd_pow2_local(D, KD_ROW_LOCAL);
    kd_call *c = &calls[0];
    kd_begin(c, kernel);
    kd_buf(c, l, -1, 4);
    kd_buf(c, l, 0, 4);
    kd_buf(c, l, 1, 4);
    kd_i64(c, R);
    kd_i64(c, D);
    kd_f32(c, l->fp[0]);
    kd_grid_groups(c, (D + (int64_t)L - 1) / (int64_t)L, L);
    return 1;
}

int kd_lower_rope(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    int64_t T = kd_dim(&l->dst, 0, n), H = kd_dim(&l->dst, 1, n), D = kd_dim(&l->dst, 2, n);
    int has_freq = l->nsrc > 2;
    kd_call *c = &calls[0];
    kd_begin(c, kernel);
    kd_buf(c, l, -1, 4);
    kd_buf(c, l, 0, 4);
    kd_buf(c, l, 1, 4);
    kd_buf(c, l, has_freq ? 2 : 0, 4);
    kd_i64(c, T);
    kd_i64(c, H);
    kd_i64(c, D);
    kd_f32(c, l->fp[0]);
    kd_f32(c, l->ip[0] ? -1.0f : 1.0f);
    kd_i32(c, has_freq);
    kd_i32(c, is64(l, 1));
    kd_grid_items(c, T * H * (D / 2), KD_LOCAL_1D);
    return 1;
}

/* The fused norm + rope pairs: dst, the launch's first `data` sources (the positions last), the
 * frequencies (or source 0 again when the launch has none), then H, D, eps, theta, the rotation's
 * sign, whether frequencies were given and whether positions are i64; one group per row. */
static int norm_rope_call(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel, int data) {
    int64_t T = kd_dim(&l->dst, 0, n), H = kd_dim(&l->dst, 1, n), D = kd_dim(&l->dst, 2, n);
    int has_freq = l->nsrc > data;
    kd_call *c = &calls[0];
    kd_begin(c, kernel);
    kd_buf(c, l, -1, 4);
    for (int i = 0; i < data; i++) kd_buf(c, l, i, 4);
    kd_buf(c, l, has_freq ? data : 0, 4);
    kd_i64(c, H);
    kd_i64(c, D);
    kd_f32(c, l->fp[0]);
    kd_f32(c, l->fp[1]);
    kd_f32(c, l->ip[0] ? -1.0f : 1.0f);
    kd_i32(c, has_freq);
    kd_i32(c, is64(l, data - 1));
    kd_grid_groups(c, T * H, kd_pow2_local(D, KD_ROW_LOCAL));
    return 1;
}

/* RMSNORM_ROPE: x, the norm's weight, positions */
int kd_lower_rmsnorm_rope(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    return norm_rope_call(l, n, calls, kernel, 3);
}

/* ROPE_RMSNORM_BACK_X: x, the norm's weight, dy, positions */
int kd_lower_rope_rmsnorm_back_x(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    return norm_rope_call(l, n, calls, kernel, 4);
}

int kd_lower_logprobs(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    int64_t T = kd_dim(&l->src[0], 0, n), V = kd_dim(&l->src[0], 1, n);
    kd_call *c = &calls[0];
    kd_begin(c, kernel);
    kd_buf(c, l, -1, 4);
    kd_buf(c, l, 0, 4);
    kd_buf(c, l, 1, 4);
    kd_err(c);
    kd_i64(c, V);
    kd_i32(c, is64(l, 1));
    kd_grid_groups(c, T, kd_pow2_local(V, KD_ROW_LOCAL));
    return 1;
}

int kd_lower_logprobs_back(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    int64_t T = kd_dim(&l->src[0], 0, n), V = kd_dim(&l->src[0], 1, n);
    kd_call *c = &calls[0];
    kd_begin(c, kernel);
    kd_buf(c, l, -1, 4);
    for (int i = 0; i < 4; i++) kd_buf(c, l, i, 4);
    kd_err(c);
    kd_i64(c, T);
    kd_i64(c, V);
    kd_i32(c, is64(l, 1));
    kd_grid_items(c, T * V, KD_LOCAL_1D);
    return 1;
}

/* (y | dh, h, w, targets [, dy, logprobs], err, T, H, V, is64 [, f16]); the _h16 kernels for a 16-bit w */
int kd_lower_unembed(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    int back = l->op == TWK_OP_UNEMBED_LOGPROBS_BACK, h16 = half(l, 1);
    int64_t T = kd_dim(&l->src[0], 0, n), H = kd_dim(&l->src[0], 1, n), V = kd_dim(&l->src[1], 0, n);
    if (T < 1) return 0;
    kd_call *c = &calls[0];
    kd_begin(c, !h16 ? kernel : back ? "unembed_logprobs_back_h16" : "unembed_logprobs_h16");
    kd_buf(c, l, -1, 4);
    kd_buf(c, l, 0, 4);
    kd_buf(c, l, 1, h16 ? 2 : 4);
    for (int i = 2; i < (back ? 5 : 3); i++) kd_buf(c, l, i, 4);
    kd_err(c);
    kd_i64(c, T);
    kd_i64(c, H);
    kd_i64(c, V);
    kd_i32(c, is64(l, 2));
    if (h16) kd_i32(c, f16(l, 1));
    kd_grid_groups(c, (T + KD_UE_TT - 1) / KD_UE_TT, KD_UE_L);
    return 1;
}

int kd_lower_kv_write(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    const twk_tensor_desc *x = &l->src[1];
    int64_t T = kd_dim(x, 0, n), E = kd_dim(x, 1, n) * kd_dim(x, 2, n), R = kd_dim(&l->dst, 0, n);
    kd_call *c = &calls[0];
    kd_begin(c, half(l, -1) ? "kv_write_h16" : kernel);
    kd_buf(c, l, -1, half(l, -1) ? 2 : 4);
    kd_buf(c, l, 1, 4);
    kd_buf(c, l, 2, 4);
    kd_err(c);
    kd_i64(c, T);
    kd_i64(c, E);
    kd_i64(c, R);
    kd_i32(c, is64(l, 2));
    if (half(l, -1)) kd_i32(c, f16(l, -1));
    kd_grid_items(c, T * E, KD_LOCAL_1D);
    return 1;
}

/* lora_gather and lora_gather_back: (dst, x, w or dy, slot), sizes T, N, K, S, over `items` items;
 * lora_gather adds its trans flag, and a 16-bit stack goes to lora_gather_h16 (offset in 2-byte
 * elements, the f16 flag last) */
static int lower_lora(const twk_launch *l, kd_call *calls, const char *kernel, int64_t T, int64_t N, int64_t K,
                      int64_t S, int64_t items) {
    int gather = l->op == TWK_OP_LORA_GATHER, h16 = gather && half(l, 1);
    kd_call *c = &calls[0];
    kd_begin(c, h16 ? "lora_gather_h16" : kernel);
    kd_buf(c, l, -1, 4);
    for (int i = 0; i < 3; i++) kd_buf(c, l, i, i == 1 && h16 ? 2 : 4);
    kd_err(c);
    kd_i64(c, T);
    kd_i64(c, N);
    kd_i64(c, K);
    kd_i64(c, S);
    kd_i32(c, is64(l, 2));
    if (gather) kd_i32(c, l->ip[0] != 0);
    if (h16) kd_i32(c, f16(l, 1));
    kd_grid_items(c, items, KD_LOCAL_1D);
    return 1;
}

/* y [T, N] from x [T, K] and w [S, N, K] (or [S, K, N] transposed: ip[0]) */
int kd_lower_lora_gather(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    int64_t T = kd_dim(&l->src[0], 0, n), K = kd_dim(&l->src[0], 1, n);
    int64_t S = kd_dim(&l->src[1], 0, n), N = kd_dim(&l->dst, 1, n);
    return lower_lora(l, calls, kernel, T, N, K, S, T * N);
}

int kd_lower_lora_gather_back(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    int64_t T = kd_dim(&l->src[0], 0, n), K = kd_dim(&l->src[0], 1, n), N = kd_dim(&l->src[1], 1, n);
    int64_t S = kd_dim(&l->dst, 0, n);
    return lower_lora(l, calls, kernel, T, N, K, S, N * K); /* an item per (n, k), every slot */
}

/* attn_cache (and attn, attn_lse with TWK_ATTN_UNTILED=1): one 64-item group per (query, head);
 * attn and attn_lse otherwise go to the tiled kernels (kd_lower_attn.c) */
int kd_lower_attn_fwd(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    const twk_tensor_desc *q = &l->src[0], *k = &l->src[1];
    int64_t T = kd_dim(q, 0, n), Hq = kd_dim(q, 1, n), D = kd_dim(q, 2, n), Hkv = kd_dim(k, 1, n);
    int lse = l->op == TWK_OP_ATTN_LSE, cache = l->op == TWK_OP_ATTN_CACHE;
    int ra = lse ? 2 : 3, rb = cache ? 4 : ra, h16 = cache && half(l, 1); /* 16-bit caches: attn_fwd_h16 */
    if (!cache && !kd_attn_untiled(l)) return kd_lower_attn_tile_fwd(l, n, calls);
    if (cache && kd_attn_splits(l, n) > 1) return kd_lower_attn_split(l, n, calls);
    kd_call *c = &calls[0];
    kd_begin(c, h16 ? "attn_fwd_h16" : kernel);
    kd_buf(c, l, -1, 4); /* o (unused for lse) */
    kd_buf(c, l, -1, 4); /* lse (unused otherwise) */
    kd_buf(c, l, 0, 4);
    kd_buf(c, l, 1, h16 ? 2 : 4);
    kd_buf(c, l, lse ? 1 : 2, h16 ? 2 : 4); /* v (k stands in for lse) */
    kd_buf(c, l, ra, 4);
    kd_buf(c, l, rb, 4);
    kd_err(c);
    kd_i64(c, Hq);
    kd_i64(c, Hkv);
    kd_i64(c, D);
    kd_i64(c, cache ? kd_dim(k, 0, n) : T);
    kd_f32(c, l->fp[0]);
    kd_i32(c, cache);
    kd_i32(c, !lse);
    kd_i32(c, lse);
    kd_i32(c, is64(l, ra));
    kd_i32(c, is64(l, rb));
    kd_i64(c, l->ip[1] > 0 ? l->ip[1] : 0); /* window */
    kd_f32(c, l->fp[1]);                    /* softcap */
    if (h16) kd_i32(c, f16(l, 1));
    kd_grid_groups(c, T * Hq, KD_ATTN_L);
    return 1;
}

/* which = 0: dQ, a group per (query, head); 1, 2: dK, dV, a group per (key, kv head) */
int kd_lower_attn_back(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    (void)kernel;
    const twk_tensor_desc *q = &l->src[0], *k = &l->src[1];
    int64_t T = kd_dim(q, 0, n), Hq = kd_dim(q, 1, n), D = kd_dim(q, 2, n), Hkv = kd_dim(k, 1, n);
    int which = l->ip[0];
    if (!kd_attn_untiled(l)) return kd_lower_attn_tile_back(l, n, calls);
    kd_call *c = &calls[0];
    kd_begin(c, which == 0 ? "attn_back_q_f32" : "attn_back_kv_f32");
    kd_buf(c, l, -1, 4);
    for (int i = 0; i < 7; i++) kd_buf(c, l, i, 4);
    kd_err(c);
    if (which != 0) kd_i64(c, T);
    kd_i64(c, Hq);
    kd_i64(c, Hkv);
    kd_i64(c, D);
    kd_f32(c, l->fp[0]);
    if (which != 0) kd_i32(c, which);
    kd_i32(c, is64(l, 3));
    kd_i64(c, l->ip[1] > 0 ? l->ip[1] : 0); /* window */
    kd_f32(c, l->fp[1]);                    /* softcap */
    kd_grid_groups(c, T * (which == 0 ? Hq : Hkv), KD_ATTN_L);
    return 1;
}
