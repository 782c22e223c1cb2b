/* Lowering of the transformer ops (nn.cl), the KV-cache ops (kvcache.cl)
 * and attention (attn.cl). Id tensors are passed as int words with an
 * is64 flag. */
#include "kd_internal.h"

static int is64(const twk_launch *l, int src) { return l->src[src].type == TWK_I64; }

/* Elements of the last dim, and the rows before it. */
static int64_t last_dim(const twk_tensor_desc *t, int64_t n) { return kd_dim(t, t->ndim - 1, n); }

int kd_lower_nn(const twk_launch *l, int64_t n, kd_call *calls) {
    kd_call *c = &calls[0];
    switch (l->op) {
    case TWK_OP_GET_ROWS: {
        int64_t T = kd_dim(&l->dst, 0, n), D = kd_dim(&l->dst, 1, n), V = kd_dim(&l->src[0], 0, n);
        kd_begin(c, "get_rows_f32");
        kd_buf(c, l, -1, 4);
        kd_buf(c, l, 0, 4);
        kd_buf(c, l, 1, 4);
        kd_err(c);
        kd_i64(c, T);
        kd_i64(c, D);
        kd_i64(c, V);
        kd_i32(c, is64(l, 1));
        kd_grid_items(c, T * D, KD_LOCAL_1D);
        return 1;
    }
    case TWK_OP_GET_ROWS_BACK: {
        int64_t V = kd_dim(&l->dst, 0, n), D = kd_dim(&l->dst, 1, n), T = kd_dim(&l->src[0], 0, n);
        kd_begin(c, "zero_words");
        kd_buf(c, l, -1, 4);
        kd_i64(c, V * D);
        kd_grid_items(c, V * D, KD_LOCAL_1D);
        c = &calls[1];
        kd_begin(c, "get_rows_back_f32");
        kd_buf(c, l, -1, 4);
        kd_buf(c, l, 0, 4);
        kd_buf(c, l, 1, 4);
        kd_err(c);
        kd_i64(c, T);
        kd_i64(c, D);
        kd_i64(c, V);
        kd_i32(c, is64(l, 1));
        kd_grid_items(c, D, 64);
        return 2;
    }
    case TWK_OP_RMSNORM:
    case TWK_OP_RMSNORM_BACK_X: {
        int64_t D = last_dim(&l->dst, n), rows = kd_nelem(&l->dst, n) / D;
        int back = l->op == TWK_OP_RMSNORM_BACK_X;
        kd_begin(c, back ? "rmsnorm_back_x_f32" : "rmsnorm_f32");
        kd_buf(c, l, -1, 4);
        kd_buf(c, l, 0, 4);
        kd_buf(c, l, 1, 4);
        if (back) kd_buf(c, l, 2, 4);
        kd_i64(c, D);
        kd_f32(c, l->fp[0]);
        kd_grid_groups(c, rows, kd_pow2_local(D, KD_ROW_LOCAL));
        return 1;
    }
    case TWK_OP_RMSNORM_BACK_W: {
        int64_t D = kd_dim(&l->dst, 0, n), R = kd_nelem(&l->src[0], n) / D;
        size_t L = kd_pow2_local(D, KD_ROW_LOCAL);
        kd_begin(c, "rmsnorm_back_w_f32");
        kd_buf(c, l, -1, 4);
        kd_buf(c, l, 0, 4);
        kd_buf(c, l, 1, 4);
        kd_i64(c, R);
        kd_i64(c, D);
        kd_f32(c, l->fp[0]);
        kd_grid_groups(c, (D + (int64_t)L - 1) / (int64_t)L, L);
        return 1;
    }
    case TWK_OP_ROPE: {
        int64_t T = kd_dim(&l->dst, 0, n), H = kd_dim(&l->dst, 1, n), D = kd_dim(&l->dst, 2, n);
        int has_freq = l->nsrc > 2;
        kd_begin(c, "rope_f32");
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
    case TWK_OP_LOGPROBS: {
        int64_t T = kd_dim(&l->src[0], 0, n), V = kd_dim(&l->src[0], 1, n);
        kd_begin(c, "logprobs_f32");
        kd_buf(c, l, -1, 4);
        kd_buf(c, l, 0, 4);
        kd_buf(c, l, 1, 4);
        kd_err(c);
        kd_i64(c, V);
        kd_i32(c, is64(l, 1));
        kd_grid_groups(c, T, kd_pow2_local(V, KD_ROW_LOCAL));
        return 1;
    }
    case TWK_OP_LOGPROBS_BACK: {
        int64_t T = kd_dim(&l->src[0], 0, n), V = kd_dim(&l->src[0], 1, n);
        kd_begin(c, "logprobs_back_f32");
        kd_buf(c, l, -1, 4);
        kd_buf(c, l, 0, 4);
        kd_buf(c, l, 1, 4);
        kd_buf(c, l, 2, 4);
        kd_buf(c, l, 3, 4);
        kd_err(c);
        kd_i64(c, T);
        kd_i64(c, V);
        kd_i32(c, is64(l, 1));
        kd_grid_items(c, T * V, KD_LOCAL_1D);
        return 1;
    }
    case TWK_OP_KV_WRITE: {
        const twk_tensor_desc *x = &l->src[1];
        int64_t T = kd_dim(x, 0, n), E = kd_dim(x, 1, n) * kd_dim(x, 2, n), R = kd_dim(&l->dst, 0, n);
        kd_begin(c, "kv_write_f32");
        kd_buf(c, l, -1, 4);
        kd_buf(c, l, 1, 4);
        kd_buf(c, l, 2, 4);
        kd_err(c);
        kd_i64(c, T);
        kd_i64(c, E);
        kd_i64(c, R);
        kd_i32(c, is64(l, 2));
        kd_grid_items(c, T * E, KD_LOCAL_1D);
        return 1;
    }
    case TWK_OP_LORA_GATHER: {
        int64_t T = kd_dim(&l->src[0], 0, n), K = kd_dim(&l->src[0], 1, n);
        int64_t S = kd_dim(&l->src[1], 0, n), N = kd_dim(&l->src[1], 1, n);
        kd_begin(c, "lora_gather_f32");
        kd_buf(c, l, -1, 4);
        kd_buf(c, l, 0, 4);
        kd_buf(c, l, 1, 4);
        kd_buf(c, l, 2, 4);
        kd_err(c);
        kd_i64(c, T);
        kd_i64(c, N);
        kd_i64(c, K);
        kd_i64(c, S);
        kd_i32(c, is64(l, 2));
        kd_grid_items(c, T * N, KD_LOCAL_1D);
        return 1;
    }
    default: break;
    }
    twk_error(TWK_ERR_UNSUPPORTED, "kd: no lowering for op %s", twk_op_name(l->op));
    return -1;
}

int kd_lower_attn(const twk_launch *l, int64_t n, kd_call *calls) {
    kd_call *c = &calls[0];
    const twk_tensor_desc *q = &l->src[0], *k = &l->src[1];
    int64_t T = kd_dim(q, 0, n), Hq = kd_dim(q, 1, n), D = kd_dim(q, 2, n), Hkv = kd_dim(k, 1, n);
    float scale = l->fp[0];
    switch (l->op) {
    case TWK_OP_ATTN:
    case TWK_OP_ATTN_LSE:
    case TWK_OP_ATTN_CACHE: {
        int lse = l->op == TWK_OP_ATTN_LSE, cache = l->op == TWK_OP_ATTN_CACHE;
        int ra = lse ? 2 : 3, rb = cache ? 4 : ra;
        kd_begin(c, "attn_fwd_f32");
        kd_buf(c, l, -1, 4); /* o (unused for lse) */
        kd_buf(c, l, -1, 4); /* lse (unused otherwise) */
        kd_buf(c, l, 0, 4);
        kd_buf(c, l, 1, 4);
        kd_buf(c, l, lse ? 1 : 2, 4); /* v (k stands in for lse) */
        kd_buf(c, l, ra, 4);
        kd_buf(c, l, rb, 4);
        kd_err(c);
        kd_i64(c, Hq);
        kd_i64(c, Hkv);
        kd_i64(c, D);
        kd_i64(c, cache ? kd_dim(k, 0, n) : T);
        kd_f32(c, scale);
        kd_i32(c, cache);
        kd_i32(c, !lse);
        kd_i32(c, lse);
        kd_i32(c, is64(l, ra));
        kd_i32(c, is64(l, rb));
        kd_grid_groups(c, T * Hq, KD_ATTN_L);
        return 1;
    }
    case TWK_OP_ATTN_BACK: {
        int which = l->ip[0];
        kd_begin(c, which == 0 ? "attn_back_q_f32" : "attn_back_kv_f32");
        kd_buf(c, l, -1, 4);
        for (int i = 0; i < 7; i++) kd_buf(c, l, i, 4);
        kd_err(c);
        if (which != 0) kd_i64(c, T);
        kd_i64(c, Hq);
        kd_i64(c, Hkv);
        kd_i64(c, D);
        kd_f32(c, scale);
        if (which != 0) kd_i32(c, which);
        kd_i32(c, is64(l, 3));
        kd_grid_groups(c, T * (which == 0 ? Hq : Hkv), KD_ATTN_L);
        return 1;
    }
    default: break;
    }
    twk_error(TWK_ERR_UNSUPPORTED, "kd: no lowering for op %s", twk_op_name(l->op));
    return -1;
}
