/* Lowerings of the mixture-of-experts routing ops (moe.cl), one per op. Id tensors are
 * passed as int words with an is64 flag; sizes are taken at the run-time token count. */
#include "kd_internal.h"

static int is64(const twk_launch *l, int src) { return l->src[src].type == TWK_I64; }

int kd_lower_moe_topk(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    int64_t T = kd_dim(&l->dst, 0, n), K = kd_dim(&l->dst, 1, n), E = kd_dim(&l->src[0], 1, n);
    kd_call *c = &calls[0];
    kd_begin(c, kernel);
    kd_buf(c, l, -1, 4);
    kd_buf(c, l, 0, 4);
    kd_i64(c, T);
    kd_i64(c, E);
    kd_i64(c, K);
    kd_grid_items(c, T, 64);
    return 1;
}

/* moe_gate (dst [T, K]) and moe_gate_back (dst [T, E], dy src 2): one item per token */
int kd_lower_moe_gate(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    int64_t T = kd_dim(&l->src[1], 0, n), K = kd_dim(&l->src[1], 1, n), E = kd_dim(&l->src[0], 1, n);
    kd_call *c = &calls[0];
    kd_begin(c, kernel);
    kd_buf(c, l, -1, 4);
    kd_buf(c, l, 0, 4);
    kd_buf(c, l, 1, 4);
    if (l->op == TWK_OP_MOE_GATE_BACK) kd_buf(c, l, 2, 4);
    kd_err(c);
    kd_i64(c, T);
    kd_i64(c, E);
    kd_i64(c, K);
    kd_i32(c, l->ip[0] != 0);
    kd_i32(c, is64(l, 1));
    kd_grid_items(c, T, 64);
    return 1;
}

/* the output zeroed, then the counting sort: one 64-item group per expert (moe.cl's KD_MOE_SORT_L) */
int kd_lower_moe_sort(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    int64_t P = kd_dim(&l->dst, 0, n), E = kd_dim(&l->src[0], 1, n);
    kd_begin(&calls[0], "zero_words");
    kd_buf(&calls[0], l, -1, 4);
    kd_i64(&calls[0], P);
    kd_grid_items(&calls[0], P, KD_LOCAL_1D);
    kd_call *c = &calls[1];
    kd_begin(c, kernel);
    kd_buf(c, l, -1, 4);
    kd_buf(c, l, 1, 4);
    kd_err(c);
    kd_i64(c, P);
    kd_i64(c, E);
    kd_i32(c, l->ip[0]);
    kd_i32(c, is64(l, 1));
    kd_grid_groups(c, E, 64);
    return 2;
}

/* moe_dispatch (order: src 1) and moe_combine (inv: src 2); w (src 3) optional, x / y standing in */
int kd_lower_moe_move(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    int dispatch = l->op == TWK_OP_MOE_DISPATCH, has_w = l->nsrc > 3;
    const twk_tensor_desc *tok = dispatch ? &l->src[0] : &l->dst, *rows = dispatch ? &l->dst : &l->src[0];
    int64_t T = kd_dim(tok, 0, n), H = kd_dim(tok, 1, n), R = kd_dim(rows, 0, n), K = T ? R / T : 1;
    int perm = dispatch ? 1 : 2;
    kd_call *c = &calls[0];
    kd_begin(c, kernel);
    kd_buf(c, l, -1, 4);
    kd_buf(c, l, 0, 4);
    kd_buf(c, l, perm, 4);
    kd_buf(c, l, has_w ? 3 : 0, 4);
    kd_i64(c, dispatch ? R : T);
    kd_i64(c, H);
    kd_i64(c, K);
    kd_i32(c, has_w);
    kd_i32(c, is64(l, perm));
    kd_grid_items(c, (dispatch ? R : T) * H, KD_LOCAL_1D);
    return 1;
}

int kd_lower_moe_combine_back_w(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    int64_t T = kd_dim(&l->dst, 0, n), K = kd_dim(&l->dst, 1, n), H = kd_dim(&l->src[0], 1, n);
    kd_call *c = &calls[0];
    kd_begin(c, kernel);
    kd_buf(c, l, -1, 4);
    kd_buf(c, l, 0, 4);
    kd_buf(c, l, 2, 4);
    kd_buf(c, l, 3, 4);
    kd_i64(c, T);
    kd_i64(c, H);
    kd_i64(c, K);
    kd_i32(c, is64(l, 2));
    kd_grid_items(c, T * K, KD_LOCAL_1D);
    return 1;
}

/* moe_router_stats (dst [2, E] or [S, 2, E]): one 64-item group per (slot, expert) (moe.cl's
 * KD_MOE_STATS_L); its backward (dst
 * [T, E], dy src 1): one item per row. The slot (src 2) is optional, logits standing in. */
int kd_lower_moe_router_stats(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel) {
    int back = l->op == TWK_OP_MOE_ROUTER_STATS_BACK, has_slot = l->nsrc > 2;
    int64_t T = kd_dim(&l->src[0], 0, n), E = kd_dim(&l->src[0], 1, n);
    int64_t S = !has_slot ? 1 : back ? kd_dim(&l->src[1], 0, n) : kd_dim(&l->dst, 0, n);
    kd_call *c = &calls[0];
    kd_begin(c, kernel);
    kd_buf(c, l, -1, 4);
    kd_buf(c, l, 0, 4);
    kd_buf(c, l, 1, 4);
    kd_buf(c, l, has_slot ? 2 : 0, 4);
    if (!back) kd_err(c);
    kd_i64(c, T);
    kd_i64(c, E);
    if (!back) kd_i64(c, kd_dim(&l->src[1], 1, n));
    kd_i64(c, S);
    kd_i32(c, has_slot);
    if (!back) kd_i32(c, is64(l, 1));
    kd_i32(c, has_slot && is64(l, 2));
    if (back) kd_grid_items(c, T, 64);
    else kd_grid_groups(c, S * E, 64);
    return 1;
}
