/* The op test case table and its generators (see op_cases.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op_cases.h"

/* ---- builders and references per op ---- */

static twk_id b_add(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_add(g, in[0], in[1]); }
static void r_add(const op_case *c, rt *in, rt *y) { (void)c; ref_add(&in[0], &in[1], y); }
static twk_id b_mul(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_mul(g, in[0], in[1]); }
static void r_mul(const op_case *c, rt *in, rt *y) { (void)c; ref_mul(&in[0], &in[1], y); }
static twk_id b_scale(twk_graph *g, const twk_id *in, const op_case *c) { return twk_scale(g, in[0], (float)c->fp[0]); }
static void r_scale(const op_case *c, rt *in, rt *y) { ref_scale(&in[0], (double)(float)c->fp[0], y); }
static twk_id b_silu(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_silu(g, in[0]); }
static void r_silu(const op_case *c, rt *in, rt *y) { (void)c; ref_silu(&in[0], y); }
static twk_id b_gelu(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_map(g, TWK_OP_GELU, in[0]); }
/* float64 GELU as PyTorch writes gelu(approximate="tanh"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
static void r_gelu(const op_case *c, rt *in, rt *y) {
    (void)c;
    const double k = sqrt(2.0 / 3.14159265358979323846);
    for (int64_t i = 0; i < rt_nelem(&in[0]); i++) {
        double x = in[0].d[i];
        y->d[i] = 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
    }
}
static twk_id b_tanh(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_map(g, TWK_OP_TANH, in[0]); }
static void r_tanh(const op_case *c, rt *in, rt *y) {
    (void)c;
    for (int64_t i = 0; i < rt_nelem(&in[0]); i++) y->d[i] = tanh(in[0].d[i]);
}
static twk_id b_swiglu(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_swiglu(g, in[0], in[1]); }
static void r_swiglu(const op_case *c, rt *in, rt *y) { (void)c; ref_swiglu(&in[0], &in[1], y); }
static twk_id b_sum(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_sum(g, in[0]); }
static void r_sum(const op_case *c, rt *in, rt *y) { (void)c; ref_sum(&in[0], y); }
static twk_id b_mean(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_mean(g, in[0]); }
static void r_mean(const op_case *c, rt *in, rt *y) { (void)c; ref_mean(&in[0], y); }
static twk_id b_wsum(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_weighted_sum(g, in[0], in[1]); }
static void r_wsum(const op_case *c, rt *in, rt *y) { (void)c; ref_weighted_sum(&in[0], &in[1], y); }
static twk_id b_matmul(twk_graph *g, const twk_id *in, const op_case *c) { return twk_matmul(g, in[0], in[1], c->ip[0], c->ip[1]); }
static void r_matmul(const op_case *c, rt *in, rt *y) { ref_matmul(&in[0], &in[1], c->ip[0], c->ip[1], y); }
static twk_id b_get_rows(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_get_rows(g, in[0], in[1]); }
static void r_get_rows(const op_case *c, rt *in, rt *y) { (void)c; ref_get_rows(&in[0], &in[1], y); }
static twk_id b_rmsnorm(twk_graph *g, const twk_id *in, const op_case *c) { return twk_rmsnorm(g, in[0], in[1], (float)c->fp[0]); }
static void r_rmsnorm(const op_case *c, rt *in, rt *y) { ref_rmsnorm(&in[0], &in[1], (double)(float)c->fp[0], y); }
static twk_id b_rope(twk_graph *g, const twk_id *in, const op_case *c) {
    return twk_rope(g, in[0], in[1], c->n_in > 2 ? in[2] : -1, (float)c->fp[0]);
}
static void r_rope(const op_case *c, rt *in, rt *y) { ref_rope(&in[0], &in[1], c->n_in > 2 ? &in[2] : NULL, c->fp[0], y); }
static twk_id b_attn(twk_graph *g, const twk_id *in, const op_case *c) {
    twk_id a = twk_attention(g, in[0], in[1], in[2], in[3], (float)c->fp[0]);
    return c->ip[1] || c->fp[1] ? twk_attention_limit(g, a, c->ip[1], (float)c->fp[1]) : a;
}
static void r_attn(const op_case *c, rt *in, rt *y) {
    ref_attention(&in[0], &in[1], &in[2], &in[3], (double)(float)c->fp[0], c->ip[1], (double)(float)c->fp[1], y);
}
static twk_id b_logprobs(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_logprobs(g, in[0], in[1]); }
static void r_logprobs(const op_case *c, rt *in, rt *y) { (void)c; ref_logprobs(&in[0], &in[1], y); }
static twk_id b_unembed(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_unembed_logprobs(g, in[0], in[1], in[2]); }
void opc_ref_unembed(const op_case *c, rt *in, rt *y) {
    (void)c;
    rt z = {.ndim = 2, .ne = {in[0].ne[0], in[1].ne[0]}};
    z.d = calloc((size_t)rt_nelem(&z), sizeof(double));
    ref_matmul(&in[0], &in[1], 0, 1, &z);
    ref_logprobs(&z, &in[2], y);
    free(z.d);
}
static twk_id b_permute(twk_graph *g, const twk_id *in, const op_case *c) { return twk_permute(g, in[0], c->ip); }
static void r_permute(const op_case *c, rt *in, rt *y) { ref_permute(&in[0], c->ip, y); }
static twk_id b_transpose(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_transpose(g, in[0]); }
static void r_transpose(const op_case *c, rt *in, rt *y) {
    (void)c;
    int perm[4] = {0, 1, 2, 3};
    perm[in[0].ndim - 2] = in[0].ndim - 1;
    perm[in[0].ndim - 1] = in[0].ndim - 2;
    ref_permute(&in[0], perm, y);
}
static twk_id b_slice(twk_graph *g, const twk_id *in, const op_case *c) { return twk_slice(g, in[0], c->ip[0], c->ip[1], c->ip[2]); }
static void r_slice(const op_case *c, rt *in, rt *y) { ref_slice(&in[0], c->ip[0], c->ip[1], y); }
static twk_id b_concat(twk_graph *g, const twk_id *in, const op_case *c) { return twk_concat(g, in[0], in[1], c->ip[0]); }
static void r_concat(const op_case *c, rt *in, rt *y) { ref_concat(&in[0], &in[1], c->ip[0], y); }
static twk_id b_kv_write(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_kv_write(g, in[0], in[1], in[2]); }
static void r_kv_write(const op_case *c, rt *in, rt *y) { (void)c; ref_kv_write(&in[0], &in[1], &in[2], y); }
static twk_id b_attn_cache(twk_graph *g, const twk_id *in, const op_case *c) {
    twk_id a = twk_attention_cached(g, in[0], in[1], in[2], in[3], in[4], (float)c->fp[0]);
    return c->ip[1] || c->fp[1] ? twk_attention_limit(g, a, c->ip[1], (float)c->fp[1]) : a;
}
static void r_attn_cache(const op_case *c, rt *in, rt *y) {
    ref_attn_cache(&in[0], &in[1], &in[2], &in[3], &in[4], (double)(float)c->fp[0], c->ip[1], (double)(float)c->fp[1], y);
}
static twk_id b_lora_gather(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_lora_gather(g, in[0], in[1], in[2]); }
static void r_lora_gather(const op_case *c, rt *in, rt *y) { (void)c; ref_lora_gather(&in[0], &in[1], &in[2], y); }
static twk_id b_grad_acc(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_grad_acc(g, in[0], in[1]); }
static void r_grad_acc(const op_case *c, rt *in, rt *y) { (void)c; ref_add(&in[0], &in[1], y); }
static twk_id b_sqsum(twk_graph *g, const twk_id *in, const op_case *c) { return twk_sqsum_parts(g, in[0], c->ip[0]); }
static void r_sqsum(const op_case *c, rt *in, rt *y) { ref_sqsum_parts(&in[0], c->ip[0], y); }
static twk_id b_grad_norm(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_grad_norm(g, in[0], in[1]); }
static void r_grad_norm(const op_case *c, rt *in, rt *y) { (void)c; ref_grad_norm(&in[0], &in[1], y); }
/* hyper: beta1 = beta2 = 0.9, eps 1e-3, step size 1e-2, sqrt(1 - beta2^step) 0.5, decay 0.99 */
static const double adam_h[TWK_HYPER_N] = {0, 0.9, 0.9, 1e-3, 1e-2, 0.5, 0.99, 0};
static twk_id b_adamw(twk_graph *g, const twk_id *in, const op_case *c) {
    (void)c;
    twk_id h = -1; /* a fill per value, concatenated */
    for (int i = 0; i < TWK_HYPER_N; i++) {
        int64_t one[1] = {1};
        twk_id e = twk_fill(g, 1, one, (float)adam_h[i]);
        h = i == 0 ? e : twk_concat(g, h, e, 0);
    }
    return twk_adamw(g, in[0], in[1], in[2], in[3], h, in[4]);
}
static void r_adamw(const op_case *c, rt *in, rt *y) {
    (void)c;
    double hd[TWK_HYPER_N];
    memcpy(hd, adam_h, sizeof hd);
    rt h = {1, {TWK_HYPER_N}, hd};
    ref_adamw(&in[0], &in[1], &in[2], &in[3], &h, &in[4], y);
}
static twk_id b_lora_gather_grouped(twk_graph *g, const twk_id *in, const op_case *c) {
    return twk_lora_gather_grouped(g, in[0], in[1], in[2], c->ip[0] != 0);
}
/* float64: y[t] = w[slot[t]] x[t], w [S, N, K] (or [S, K, N] transposed: ip[0]) */
static void r_lora_gather_grouped(const op_case *c, rt *in, rt *y) {
    const rt *x = &in[0], *w = &in[1], *slot = &in[2];
    int64_t T = x->ne[0], K = x->ne[1], N = y->ne[1];
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0;
            int64_t base = (int64_t)slot->d[t] * N * K;
            for (int64_t k = 0; k < K; k++) s += w->d[base + (c->ip[0] ? k * N + n : n * K + k)] * x->d[t * K + k];
            y->d[t * N + n] = s;
        }
}
static twk_id b_lora_gather_back(twk_graph *g, const twk_id *in, const op_case *c) { return twk_lora_gather_back(g, in[0], in[1], in[2], c->ip[0]); }
static void r_lora_gather_back(const op_case *c, rt *in, rt *y) { (void)c; ref_lora_gather_back(&in[0], &in[1], &in[2], y); }
static twk_id b_reshape(twk_graph *g, const twk_id *in, const op_case *c) {
    int64_t ne[4] = {c->ip[0], c->ip[1], c->ip[2], c->ip[3]};
    int nd = 0;
    while (nd < 4 && ne[nd]) nd++;
    /* a reshape is a view: follow it by a scale so the output is computed */
    return twk_scale(g, twk_reshape(g, in[0], nd, ne), 1.0f);
}
static void r_reshape(const op_case *c, rt *in, rt *y) { (void)c; ref_copy(&in[0], y); }

/* ---- mixture-of-experts routing on the devices (moegpu; backend_ops only, against the CPU) ----
 * ip: 0 k, 1 renormalise (moe_gate, the block) or moe_sort's mode, 2 a shift of the logits:
 * 1 expert 0 +20 (every token picks it), 2 the last expert -20 (no token picks it). */
static twk_id moe_logits(twk_graph *g, twk_id l, const op_case *c, int i) {
    int64_t E = c->in[i].ne[1], one[1] = {1}, rest[1] = {E - 1};
    if (!c->ip[2]) return l;
    twk_id big = twk_fill(g, 1, one, c->ip[2] == 1 ? 20.0f : -20.0f), zero = twk_fill(g, 1, rest, 0.0f);
    return twk_add(g, l, c->ip[2] == 1 ? twk_concat(g, big, zero, 0) : twk_concat(g, zero, big, 0));
}
static twk_id b_moe_topk(twk_graph *g, const twk_id *in, const op_case *c) { return twk_moe_topk(g, moe_logits(g, in[0], c, 0), c->ip[0]); }
/* ids: in[1] when given, else the top-k of the logits */
static twk_id b_moe_sort(twk_graph *g, const twk_id *in, const op_case *c) {
    twk_id l = moe_logits(g, in[0], c, 0);
    return twk_moe_sort(g, l, c->n_in > 1 ? in[1] : twk_moe_topk(g, l, c->ip[0]), c->ip[1]);
}
static twk_id b_moe_gate(twk_graph *g, const twk_id *in, const op_case *c) {
    twk_id l = moe_logits(g, in[0], c, 0);
    return twk_moe_gate(g, l, twk_moe_topk(g, l, c->ip[0]), c->ip[1] != 0);
}
/* x [T, H] (in 0), logits [T, E] (in 1), experts [E, N, H] (in 2): the sparse MLP's routing
 * around one grouped product per expert, as graph/build_moe.c's callers build it */
static twk_id moe_route(twk_graph *g, const twk_id *in, const op_case *c, twk_id *order, twk_id *inv, twk_id *w) {
    twk_id l = moe_logits(g, in[1], c, 1), ids = twk_moe_topk(g, l, c->ip[0]);
    *w = twk_moe_gate(g, l, ids, c->ip[1] != 0);
    *order = twk_moe_sort(g, l, ids, 0);
    *inv = twk_moe_sort(g, l, ids, 1);
    return twk_moe_sort(g, l, ids, 2);
}
static twk_id b_moe_block(twk_graph *g, const twk_id *in, const op_case *c) {
    twk_id order, inv, w, ex = moe_route(g, in, c, &order, &inv, &w);
    twk_id rows = twk_lora_gather(g, twk_moe_dispatch(g, in[0], order, inv, -1), in[2], ex);
    return twk_moe_combine(g, rows, order, inv, w, c->ip[0]);
}
/* the unweighted dispatch: a copy (its gradient: the unweighted combine) */
static twk_id b_moe_dispatch(twk_graph *g, const twk_id *in, const op_case *c) {
    twk_id order, inv, w;
    moe_route(g, in, c, &order, &inv, &w);
    return twk_moe_dispatch(g, in[0], order, inv, -1);
}
/* the weighted dispatch (the backward of a weighted combine), forward only */
static twk_id b_moe_dispatch_w(twk_graph *g, const twk_id *in, const op_case *c) {
    twk_id order, inv, w;
    moe_route(g, in, c, &order, &inv, &w);
    return twk_moe_dispatch(g, in[0], order, inv, w);
}
/* ---- end of the mixture-of-experts builders ---- */

#define F32(...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_F32, .diff = 1}
#define F32C(...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_F32, .diff = 0}
#define IDS(lim, ...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_I32, .gen = G_IDS, .limit = lim}
/* ids in [0, lim) with the last one lim - 1 (the top of the range) */
#define IDSTOP(lim, ...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_I32, .gen = G_IDS_TOP, .limit = lim}
#define IDS64(lim, ...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_I64, .gen = G_IDS, .limit = lim}
#define POS(...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_I32, .gen = G_POS}
#define SEG(...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_I32, .gen = G_SEG}
#define SEGL(...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_I32, .gen = G_SEG_LONG}
/* packed segments of lengths 1, 2, 67, 1, 13, 97, 1, 5, 131, 3, 41, ... (cycling): single
 * tokens, primes, and segments longer than the device kernels' tiles (<= 32) */
#define SEGP(...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_I32, .gen = G_SEG_PAT}
#define ROWS(lim, ...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_I32, .gen = G_ROWS, .limit = lim}
#define HI(lim, ...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_I32, .gen = G_HI, .limit = lim}
/* a frozen 16-bit weight (bf16 / f16), values rounded to the dtype */
#define W16(t, ...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = t, .diff = 0}
#define POSC(...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_F32, .gen = G_POSITIVE}
#define T_ (-1)

const op_case opc_cases[] = {
    /* elementwise, with every broadcast form */
    {"add same 1", 2, {F32(1), F32(1)}, b_add, r_add, 1e-6, 1e-5},
    {"add same 7x13", 2, {F32(7, 13), F32(7, 13)}, b_add, r_add, 1e-6, 1e-5},
    {"add bias 37x67+67", 2, {F32(37, 67), F32(67)}, b_add, r_add, 1e-6, 1e-5},
    {"add scalar 5x3x7+1", 2, {F32(5, 3, 7), F32(1)}, b_add, r_add, 1e-6, 1e-5},
    {"add mid 5x3x7+3x1", 2, {F32(5, 3, 7), F32(3, 1)}, b_add, r_add, 1e-6, 1e-5},
    {"add tokens Tx13+13", 2, {F32(T_, 13), F32(13)}, b_add, r_add, 1e-6, 1e-5, .cap = 29},
    {"mul same 131x257", 2, {F32(131, 257), F32(131, 257)}, b_mul, r_mul, 1e-6, 1e-5},
    {"mul bias 11x31+31", 2, {F32(11, 31), F32(31)}, b_mul, r_mul, 1e-6, 1e-5},
    {"mul col 2x3x5+3x1", 2, {F32(2, 3, 5), F32(3, 1)}, b_mul, r_mul, 1e-6, 1e-5},
    {"mul per-token col Tx7+Tx1", 2, {F32(T_, 7), F32(T_, 1)}, b_mul, r_mul, 1e-6, 1e-5, .cap = 19},
    {"scale 1", 1, {F32(1)}, b_scale, r_scale, 1e-6, 1e-5, .fp = {-2.5}},
    {"scale 17x19", 1, {F32(17, 19)}, b_scale, r_scale, 1e-6, 1e-5, .fp = {0.37}},
    {"silu 1", 1, {F32(1)}, b_silu, r_silu, 1e-6, 1e-5},
    {"silu 131x257", 1, {F32(131, 257)}, b_silu, r_silu, 1e-6, 1e-5},
    {"gelu 1", 1, {F32(1)}, b_gelu, r_gelu, 1e-6, 1e-5},
    {"gelu 131x257", 1, {F32(131, 257)}, b_gelu, r_gelu, 1e-6, 1e-5},
    {"gelu Tx67", 1, {F32(T_, 67)}, b_gelu, r_gelu, 1e-6, 1e-5, .cap = 29},
    {"tanh 1", 1, {F32(1)}, b_tanh, r_tanh, 1e-6, 1e-5},
    {"tanh 131x257", 1, {F32(131, 257)}, b_tanh, r_tanh, 1e-6, 1e-5},
    {"tanh Tx67", 1, {F32(T_, 67)}, b_tanh, r_tanh, 1e-6, 1e-5, .cap = 29},
    {"swiglu 7x13", 2, {F32(7, 13), F32(7, 13)}, b_swiglu, r_swiglu, 1e-6, 1e-5},
    {"swiglu Tx67", 2, {F32(T_, 67), F32(T_, 67)}, b_swiglu, r_swiglu, 1e-6, 1e-5, .cap = 41},
    /* reductions */
    {"sum 1", 1, {F32(1)}, b_sum, r_sum, 1e-6, 1e-5},
    {"sum 131x257", 1, {F32(131, 257)}, b_sum, r_sum, 1e-6, 1e-5},
    {"sum Tx7", 1, {F32(T_, 7)}, b_sum, r_sum, 1e-6, 1e-5, .cap = 23},
    {"mean 13x7", 1, {F32(13, 7)}, b_mean, r_mean, 1e-6, 1e-5},
    {"mean Tx3", 1, {F32(T_, 3)}, b_mean, r_mean, 1e-6, 1e-5, .cap = 31},
    {"weighted_sum 1", 2, {F32(1), F32(1)}, b_wsum, r_wsum, 1e-6, 1e-5},
    {"weighted_sum T", 2, {F32(T_), F32(T_)}, b_wsum, r_wsum, 1e-6, 1e-5, .cap = 97},
    {"weighted_sum 37x67", 2, {F32(37, 67), F32C(37, 67)}, b_wsum, r_wsum, 1e-6, 1e-5},
    /* matmul: every transpose, batched, token dims on either side */
    {"matmul 1x1x1", 2, {F32(1, 1), F32(1, 1)}, b_matmul, r_matmul, 1e-5, 1e-4},
    {"matmul 1x67 @ (131x67)^T (gemv)", 2, {F32(1, 67), F32(131, 67)}, b_matmul, r_matmul, 1e-5, 1e-4, .ip = {0, 1}},
    {"matmul 1x37 @ 37x101 (gemv)", 2, {F32(1, 37), F32(37, 101)}, b_matmul, r_matmul, 1e-5, 1e-4},
    {"matmul (37x1)^T @ 37x19 (gemv)", 2, {F32(37, 1), F32(37, 19)}, b_matmul, r_matmul, 1e-5, 1e-4, .ip = {1, 0}},
    {"matmul 7x13 @ 13x5", 2, {F32(7, 13), F32(13, 5)}, b_matmul, r_matmul, 1e-5, 1e-4},
    {"matmul 67x131 @ (37x131)^T", 2, {F32(67, 131), F32(37, 131)}, b_matmul, r_matmul, 1e-5, 1e-4, .ip = {0, 1}},
    {"matmul (131x67)^T @ 131x37", 2, {F32(131, 67), F32(131, 37)}, b_matmul, r_matmul, 1e-5, 1e-4, .ip = {1, 0}},
    {"matmul (13x7)^T @ (5x13)^T", 2, {F32(13, 7), F32(5, 13)}, b_matmul, r_matmul, 1e-5, 1e-4, .ip = {1, 1}},
    {"matmul batched 3x5x7 @ 3x7x11", 2, {F32(3, 5, 7), F32(3, 7, 11)}, b_matmul, r_matmul, 1e-5, 1e-4},
    {"matmul batched 2x7x5^T @ 2x7x3", 2, {F32(2, 7, 5), F32(2, 7, 3)}, b_matmul, r_matmul, 1e-5, 1e-4, .ip = {1, 0}},
    {"matmul Tx33 @ (17x33)^T", 2, {F32(T_, 33), F32(17, 33)}, b_matmul, r_matmul, 1e-5, 1e-4, .ip = {0, 1}, .cap = 45},
    {"matmul (Tx9)^T @ Tx5", 2, {F32(T_, 9), F32(T_, 5)}, b_matmul, r_matmul, 1e-5, 1e-4, .ip = {1, 0}, .cap = 37},
    /* transformer ops */
    {"get_rows 1 of 1", 2, {F32(1, 1), IDS(1, 1)}, b_get_rows, r_get_rows, 1e-7, 1e-5},
    {"get_rows T of 37x13 (repeats)", 2, {F32(37, 13), IDS(37, T_)}, b_get_rows, r_get_rows, 1e-7, 1e-5, .cap = 53},
    {"get_rows i64 29 of 7x67", 2, {F32(7, 67), IDS64(7, 29)}, b_get_rows, r_get_rows, 1e-7, 1e-5},
    {"rmsnorm 1x1", 2, {F32(1, 1), F32(1)}, b_rmsnorm, r_rmsnorm, 1e-5, 1e-4, .fp = {1e-6}},
    {"rmsnorm 13x67", 2, {F32(13, 67), F32(67)}, b_rmsnorm, r_rmsnorm, 1e-5, 1e-4, .fp = {1e-6}},
    {"rmsnorm Tx3x31 (q-norm shape)", 2, {F32(T_, 3, 31), F32(31)}, b_rmsnorm, r_rmsnorm, 1e-5, 1e-4, .fp = {1e-5}, .cap = 19},
    /* rope: angles are float32 (as transformers computes them), so positions < 200 keep the
     * float32 angle error below ~2e-5 */
    {"rope 1x1x2", 2, {F32(1, 1, 2), POS(1)}, b_rope, r_rope, 1e-4, 1e-4, .fp = {10000}},
    {"rope Tx3x14", 2, {F32(T_, 3, 14), POS(T_)}, b_rope, r_rope, 1e-4, 1e-4, .fp = {10000}, .cap = 23},
    {"rope 11x2x64 theta 1e6", 2, {F32(11, 2, 64), POS(11)}, b_rope, r_rope, 1e-4, 1e-4, .fp = {1e6}},
    {"rope 7x2x6 given inv_freq", 3, {F32(7, 2, 6), POS(7), F32C(3)}, b_rope, r_rope, 1e-4, 1e-4, .fp = {1}},
    /* attention: GQA, several packed segments */
    {"attn 1x1x1", 4, {F32(1, 1, 1), F32(1, 1, 1), F32(1, 1, 1), SEG(1)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {1.0}},
    {"attn Tx4x8 kv2", 4, {F32(T_, 4, 8), F32(T_, 2, 8), F32(T_, 2, 8), SEG(T_)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.35355339}, .cap = 37},
    {"attn 31x6x5 kv3", 4, {F32(31, 6, 5), F32(31, 3, 5), F32(31, 3, 5), SEG(31)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.5}},
    {"attn 13x2x67 mha", 4, {F32(13, 2, 67), F32(13, 2, 67), F32(13, 2, 67), SEG(13)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.1}},
    {"attn 150x4x16 kv1 long segments", 4, {F32(150, 4, 16), F32(150, 1, 16), F32(150, 1, 16), SEGL(150)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.25}},
    {"attn Tx2x8 long segments", 4, {F32(T_, 2, 8), F32(T_, 2, 8), F32(T_, 2, 8), SEGL(T_)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.3}, .cap = 200},
    /* Mistral / Gemma: a sliding window shorter than the segments (and than a query block, 64), soft-capping */
    {"attn 150x4x16 kv2 window 5", 4, {F32(150, 4, 16), F32(150, 2, 16), F32(150, 2, 16), SEGL(150)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.25}, .ip = {0, 5}},
    {"attn 150x2x8 window 70 softcap 1.5", 4, {F32(150, 2, 8), F32(150, 2, 8), F32(150, 2, 8), SEGL(150)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.9, 1.5}, .ip = {0, 70}},
    {"attn Tx4x8 kv2 softcap 0.7", 4, {F32(T_, 4, 8), F32(T_, 2, 8), F32(T_, 2, 8), SEG(T_)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.6, 0.7}, .cap = 37},
    /* the tiled device kernels at awkward sizes: segment lengths 1, primes, longer than a tile */
    {"attn 140x2x64 mha segments 1 prime long", 4, {F32(140, 2, 64), F32(140, 2, 64), F32(140, 2, 64), SEGP(140)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.125}},
    {"attn 75x8x16 gqa8 segments 1 prime long", 4, {F32(75, 8, 16), F32(75, 1, 16), F32(75, 1, 16), SEGP(75)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.25}},
    /* bf16 / f16 q, k, v (widened as loaded, f32 after): 40 tokens are segments of 1, 2 and 37
     * (longer than a tile, <= 32), GQA 1 / 2 / 8, head sizes 64 / 128. A 16-bit tensor is frozen,
     * so each gradient is checked with the other operands 16-bit: dQ over 16-bit k, v; dK over
     * q, v; dV over q, k; the forward with all three (the inputs hold the reference's values) */
    {"attn bf16 k,v 40x2x64 gqa1 segments (dq)", 4, {F32(40, 2, 64), W16(TWK_BF16, 40, 2, 64), W16(TWK_BF16, 40, 2, 64), SEGP(40)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.125}},
    {"attn bf16 q,v 40x8x64 gqa8 segments (dk)", 4, {W16(TWK_BF16, 40, 8, 64), F32(40, 1, 64), W16(TWK_BF16, 40, 1, 64), SEGP(40)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.125}},
    {"attn bf16 q,k 40x4x128 gqa2 segments (dv)", 4, {W16(TWK_BF16, 40, 4, 128), W16(TWK_BF16, 40, 2, 128), F32(40, 2, 128), SEGP(40)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.088388}},
    {"attn bf16 q,k,v 40x8x128 gqa8 segments", 4, {W16(TWK_BF16, 40, 8, 128), W16(TWK_BF16, 40, 1, 128), W16(TWK_BF16, 40, 1, 128), SEGP(40)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.088388}},
    {"attn f16 k,v Tx4x128 gqa2 segments (dq)", 4, {F32(T_, 4, 128), W16(TWK_F16, T_, 2, 128), W16(TWK_F16, T_, 2, 128), SEGP(T_)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.088388}, .cap = 40},
    {"attn f16 q,v 40x2x128 gqa1 segments (dk)", 4, {W16(TWK_F16, 40, 2, 128), F32(40, 2, 128), W16(TWK_F16, 40, 2, 128), SEGP(40)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.088388}},
    {"attn f16 q,k 40x8x64 gqa8 segments (dv)", 4, {W16(TWK_F16, 40, 8, 64), W16(TWK_F16, 40, 1, 64), F32(40, 1, 64), SEGP(40)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.125}},
    {"attn f16 q,k,v Tx4x64 gqa2 segments", 4, {W16(TWK_F16, T_, 4, 64), W16(TWK_F16, T_, 2, 64), W16(TWK_F16, T_, 2, 64), SEGP(T_)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.125}, .cap = 40},
    {"logprobs 1x1", 2, {F32(1, 1), IDS(1, 1)}, b_logprobs, r_logprobs, 1e-5, 1e-4},
    {"logprobs Tx1031", 2, {F32(T_, 1031), IDS(1031, T_)}, b_logprobs, r_logprobs, 1e-5, 1e-4, .cap = 17},
    {"logprobs 5x7 i64", 2, {F32(5, 7), IDS64(7, 5)}, b_logprobs, r_logprobs, 1e-5, 1e-4},
    /* the fused unembedding (w frozen: its gradient is dh only). The device kernels' tiles are 8
     * tokens x 256 words x 16 columns: T, V and H below are not multiples of them, one V is
     * below a chunk, one H above a work-group's 256 columns, and a target is V - 1 */
    {"unembed_logprobs 1x1 over 1", 3, {F32(1, 1), F32C(1, 1), IDSTOP(1, 1)}, b_unembed, opc_ref_unembed, 1e-5, 1e-4},
    {"unembed_logprobs Tx37 over 300", 3, {F32(T_, 37), F32C(300, 37), IDSTOP(300, T_)}, b_unembed, opc_ref_unembed, 1e-5, 1e-4, .cap = 19},
    {"unembed_logprobs 5x16 over 7 i64", 3, {F32(5, 16), F32C(7, 16), IDS64(7, 5)}, b_unembed, opc_ref_unembed, 1e-5, 1e-4},
    {"unembed_logprobs 9x301 over 520", 3, {F32(9, 301), F32C(520, 301), IDSTOP(520, 9)}, b_unembed, opc_ref_unembed, 1e-5, 1e-4},
    /* decoding with a KV cache (forward only: not differentiable) */
    {"kv_write 1 row of 1", 3, {F32C(1, 1, 2), F32C(1, 1, 2), ROWS(1, 1)}, b_kv_write, r_kv_write, 0, 1},
    {"kv_write T rows of 53x3x8", 3, {F32C(53, 3, 8), F32C(T_, 3, 8), ROWS(53, T_)}, b_kv_write, r_kv_write, 0, 1, .cap = 29},
    {"attn_cache 1x1x1 over 1 row", 5, {F32C(1, 1, 1), F32C(1, 1, 1), F32C(1, 1, 1), IDS(1, 1), HI(1, 1)}, b_attn_cache, r_attn_cache, 1e-5, 1, .fp = {1.0}},
    {"attn_cache Tx4x16 over 67x2x16", 5, {F32C(T_, 4, 16), F32C(67, 2, 16), F32C(67, 2, 16), IDS(60, T_), HI(67, T_)}, b_attn_cache, r_attn_cache, 1e-5, 1, .fp = {0.25}, .cap = 13},
    {"attn_cache 5x6x67 over 300x3x67", 5, {F32C(5, 6, 67), F32C(300, 3, 67), F32C(300, 3, 67), IDS(299, 5), HI(300, 5)}, b_attn_cache, r_attn_cache, 1e-5, 1, .fp = {0.12}},
    {"attn_cache 5x6x16 over 300x3x16 window 7 softcap 0.8", 5, {F32C(5, 6, 16), F32C(300, 3, 16), F32C(300, 3, 16), IDS(299, 5), HI(300, 5)}, b_attn_cache, r_attn_cache, 1e-5, 1, .fp = {0.5, 0.8}, .ip = {0, 7}},
    /* split-K decode (attn_split.cl, attn.comp MODE 3 / 4): caches longer than a 256-key piece,
     * key ranges shorter and longer than one, GQA 1 / 4 / 8, a window over a longer cache */
    {"attn_cache Tx8x64 gqa4 over 1500x2x64 split", 5, {F32C(T_, 8, 64), F32C(1500, 2, 64), F32C(1500, 2, 64), IDS(30, T_), HI(1500, T_)}, b_attn_cache, r_attn_cache, 1e-5, 1, .fp = {0.125}, .cap = 5},
    {"attn_cache 7x2x128 gqa1 over 300x2x128 split", 5, {F32C(7, 2, 128), F32C(300, 2, 128), F32C(300, 2, 128), IDS(290, 7), HI(300, 7)}, b_attn_cache, r_attn_cache, 1e-5, 1, .fp = {0.088}},
    {"attn_cache 5x8x64 gqa8 over 1200x1x64 window 400 softcap 30 split", 5, {F32C(5, 8, 64), F32C(1200, 1, 64), F32C(1200, 1, 64), IDS(700, 5), HI(1200, 5)}, b_attn_cache, r_attn_cache, 1e-5, 1, .fp = {0.125, 30}, .ip = {0, 400}},
    {"lora_gather 1x1 over 1x1x1", 3, {F32C(1, 1), F32C(1, 1, 1), IDS(1, 1)}, b_lora_gather, r_lora_gather, 1e-6, 1},
    {"lora_gather Tx67 over 5x13x67", 3, {F32C(T_, 67), F32C(5, 13, 67), IDS(5, T_)}, b_lora_gather, r_lora_gather, 1e-5, 1, .cap = 19},
    /* the optimizer step */
    {"grad_acc 1", 2, {F32C(1), F32C(1)}, b_grad_acc, r_grad_acc, 1e-6, 1},
    {"grad_acc 37x67", 2, {F32C(37, 67), F32C(37, 67)}, b_grad_acc, r_grad_acc, 1e-6, 1},
    {"sqsum_parts 1 in 1", 1, {F32C(1)}, b_sqsum, r_sqsum, 1e-6, 1, .ip = {1}},
    {"sqsum_parts 3x5 in 7 (some empty)", 1, {F32C(3, 5)}, b_sqsum, r_sqsum, 1e-6, 1, .ip = {7}},
    {"sqsum_parts 131x257 in 13", 1, {F32C(131, 257)}, b_sqsum, r_sqsum, 1e-6, 1, .ip = {13}},
    {"grad_norm 5 parts, clipping", 2, {POSC(5, 2), POSC(8)}, b_grad_norm, r_grad_norm, 1e-6, 1},
    {"grad_norm 300 parts", 2, {POSC(300, 2), POSC(8)}, b_grad_norm, r_grad_norm, 1e-6, 1},
    {"adamw 1", 5, {F32C(1), F32C(1), F32C(1), POSC(1), POSC(2)}, b_adamw, r_adamw, 1e-6, 1},
    {"adamw 37x67", 5, {F32C(37, 67), F32C(37, 67), F32C(37, 67), POSC(37, 67), POSC(2)}, b_adamw, r_adamw, 1e-6, 1},
    /* packed multi-LoRA training: lora_gather's gradients (x and w) and lora_gather_back itself */
    {"lora_gather Tx9 over 3x5x9 with gradients", 3, {F32(T_, 9), F32(3, 5, 9), IDS(3, T_)}, b_lora_gather, r_lora_gather, 1e-5, 1e-4, .cap = 23},
    /* experts over rows grouped by expert (any order is right; runs of equal slots are one product each) */
    {"lora_gather grouped Tx67 over 5x13x67", 3, {F32C(T_, 67), F32C(5, 13, 67), IDS(5, T_)}, b_lora_gather_grouped, r_lora_gather_grouped, 1e-5, 1, .cap = 19},
    {"lora_gather grouped Tx9 over 3x5x9 with gradients", 3, {F32(T_, 9), F32(3, 5, 9), IDS(3, T_)}, b_lora_gather_grouped, r_lora_gather_grouped, 1e-5, 1e-4, .cap = 23},
    {"lora_gather grouped Tx9 over 3x9x5 transposed, dX", 3, {F32(T_, 9), F32C(3, 9, 5), IDS(3, T_)}, b_lora_gather_grouped, r_lora_gather_grouped, 1e-5, 1e-4, .ip = {1}, .cap = 23},
    /* frozen 16-bit expert stacks (a bf16 / f16 mixture of experts), widened as read, f32 sums; dX
     * reads the stack in the other orientation (plain <-> transposed) */
    {"lora_gather grouped Tx67 over bf16 5x13x67, dX", 3, {F32(T_, 67), W16(TWK_BF16, 5, 13, 67), IDS(5, T_)}, b_lora_gather_grouped, r_lora_gather_grouped, 1e-5, 1e-4, .cap = 19},
    {"lora_gather grouped Tx9 over f16 3x9x5 transposed, dX", 3, {F32(T_, 9), W16(TWK_F16, 3, 9, 5), IDS(3, T_)}, b_lora_gather_grouped, r_lora_gather_grouped, 1e-5, 1e-4, .ip = {1}, .cap = 23},
    {"lora_gather Tx9 over f16 3x5x9, dX", 3, {F32(T_, 9), W16(TWK_F16, 3, 5, 9), IDS(3, T_)}, b_lora_gather, r_lora_gather, 1e-5, 1e-4, .cap = 23},
    {"lora_gather_back Tx11, Tx6 into 4x6x11", 3, {F32C(T_, 11), F32C(T_, 6), IDS(4, T_)}, b_lora_gather_back, r_lora_gather_back, 1e-5, 1, .ip = {4}, .cap = 17},
    /* layout */
    {"reshape 6x35 -> 5x7x6", 1, {F32(6, 35)}, b_reshape, r_reshape, 0, 1e-5, .ip = {5, 7, 6, 0}},
    {"reshape Tx12 -> Tx3x4", 1, {F32(T_, 12)}, b_reshape, r_reshape, 0, 1e-5, .ip = {-1, 3, 4, 0}, .cap = 11},
    {"transpose 7x13", 1, {F32(7, 13)}, b_transpose, r_transpose, 0, 1e-5},
    {"transpose Tx3x5", 1, {F32(T_, 3, 5)}, b_transpose, r_transpose, 0, 1e-5, .cap = 9},
    {"permute 2x3x5x7 (2,0,3,1)", 1, {F32(2, 3, 5, 7)}, b_permute, r_permute, 0, 1e-5, .ip = {2, 0, 3, 1}},
    {"permute Tx4x3 (1,0,2)", 1, {F32(T_, 4, 3)}, b_permute, r_permute, 0, 1e-5, .ip = {1, 0, 2}, .cap = 13},
    {"slice 1 of 1", 1, {F32(1)}, b_slice, r_slice, 0, 1e-5, .ip = {0, 0, 1}},
    {"slice 7x13 axis1 [3,8)", 1, {F32(7, 13)}, b_slice, r_slice, 0, 1e-5, .ip = {1, 3, 5}},
    {"slice Tx6x5 axis1 [1,4)", 1, {F32(T_, 6, 5)}, b_slice, r_slice, 0, 1e-5, .ip = {1, 1, 3}, .cap = 7},
    {"concat 3x5 + 4x5 axis0", 2, {F32(3, 5), F32(4, 5)}, b_concat, r_concat, 0, 1e-5, .ip = {0}},
    {"concat Tx2x3 + Tx5x3 axis1", 2, {F32(T_, 2, 3), F32(T_, 5, 3)}, b_concat, r_concat, 0, 1e-5, .ip = {1}, .cap = 10},
};

const int opc_n_cases = (int)(sizeof opc_cases / sizeof opc_cases[0]);

/* ops whose cases above have no token dim: mul, scale, silu; the fused unembedding over 16-bit
 * weights (the device's widening against the CPU's; test_ops' float64 references take f32) */
const op_case opc_extra_cases[] = {
    {"mul tokens Tx7+7", 2, {F32(T_, 7), F32(7)}, b_mul, r_mul, 1e-6, 1e-5, .cap = 27},
    {"scale tokens Tx5", 1, {F32(T_, 5)}, b_scale, r_scale, 1e-6, 1e-5, .fp = {1.75}, .cap = 33},
    {"silu tokens Tx9", 1, {F32(T_, 9)}, b_silu, r_silu, 1e-6, 1e-5, .cap = 21},
    {"unembed_logprobs bf16 Tx37 over 300", 3, {F32(T_, 37), W16(TWK_BF16, 300, 37), IDSTOP(300, T_)}, b_unembed, opc_ref_unembed, 1e-5, 1e-4, .cap = 19},
    {"unembed_logprobs bf16 9x301 over 520", 3, {F32(9, 301), W16(TWK_BF16, 520, 301), IDSTOP(520, 9)}, b_unembed, opc_ref_unembed, 1e-5, 1e-4},
    /* tiled attention at head sizes 128 and 256 (backend_ops only: the float64 finite
     * differences of test_ops would take minutes at these sizes) */
    {"attn 300x8x128 gqa8 segments", 4, {F32(300, 8, 128), F32(300, 1, 128), F32(300, 1, 128), SEGP(300)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.088388}},
    {"attn Tx4x128 gqa2 segments", 4, {F32(T_, 4, 128), F32(T_, 2, 128), F32(T_, 2, 128), SEGP(T_)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.088388}, .cap = 173},
    {"attn 211x4x64 gqa1 segments window 40 softcap 20", 4, {F32(211, 4, 64), F32(211, 4, 64), F32(211, 4, 64), SEGP(211)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.125, 20}, .ip = {0, 40}},
    {"attn 101x2x256 gqa2 segments", 4, {F32(101, 2, 256), F32(101, 1, 256), F32(101, 1, 256), SEGP(101)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.0625}},
    {"attn bf16 k,v 300x8x128 gqa8 segments (dq)", 4, {F32(300, 8, 128), W16(TWK_BF16, 300, 1, 128), W16(TWK_BF16, 300, 1, 128), SEGP(300)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.088388}},
    {"attn 37x2x512 long segments", 4, {F32(37, 2, 512), F32(37, 2, 512), F32(37, 2, 512), SEGL(37)}, b_attn, r_attn, 1e-5, 1e-4, .fp = {0.044}},
    /* split-K decode over bf16 / f16 caches (test_ops' float64 references take f32) */
    {"attn_cache bf16 Tx4x64 gqa2 over 1500x2x64 split", 5, {F32C(T_, 4, 64), W16(TWK_BF16, 1500, 2, 64), W16(TWK_BF16, 1500, 2, 64), IDS(30, T_), HI(1500, T_)}, b_attn_cache, r_attn_cache, 1e-5, 1, .fp = {0.125}, .cap = 5},
    {"attn_cache bf16 6x8x128 gqa8 over 700x1x128 window 300 split", 5, {F32C(6, 8, 128), W16(TWK_BF16, 700, 1, 128), W16(TWK_BF16, 700, 1, 128), IDS(400, 6), HI(700, 6)}, b_attn_cache, r_attn_cache, 1e-5, 1, .fp = {0.088}, .ip = {0, 300}},
    {"attn_cache f16 3x2x64 over 600x2x64 split", 5, {F32C(3, 2, 64), W16(TWK_F16, 600, 2, 64), W16(TWK_F16, 600, 2, 64), IDS(100, 3), HI(600, 3)}, b_attn_cache, r_attn_cache, 1e-5, 1, .fp = {0.125}},
    {"unembed_logprobs f16 5x16 over 7", 3, {F32(5, 16), W16(TWK_F16, 7, 16), IDSTOP(7, 5)}, b_unembed, opc_ref_unembed, 1e-5, 1e-4},
    /* ---- mixture-of-experts routing on the devices (moegpu): tokens 1 and primes, experts 8
     * and 16, top-1/2/4, ties (integer-valued logits), an expert no token picks, every token to
     * one expert; index outputs must be identical ---- */
    {"moe_topk 1x8 top-1", 1, {F32C(1, 8)}, b_moe_topk, NULL, 0, 0, .ip = {1}},
    {"moe_topk Tx16 top-4", 1, {F32C(T_, 16)}, b_moe_topk, NULL, 0, 0, .ip = {4}, .cap = 37},
    {"moe_topk 31x8 top-2 ties", 1, {{.ndim = 2, .ne = {31, 8}, .type = TWK_F32, .gen = G_IDS, .limit = 3}}, b_moe_topk, NULL, 0, 0, .ip = {2}},
    {"moe_topk 13x8 top-8 (all)", 1, {F32C(13, 8)}, b_moe_topk, NULL, 0, 0, .ip = {8}},
    {"moe_sort 1x8 top-1 row->pair", 1, {F32C(1, 8)}, b_moe_sort, NULL, 0, 0, .ip = {1, 0}},
    {"moe_sort Tx16 top-4 row->pair", 1, {F32C(T_, 16)}, b_moe_sort, NULL, 0, 0, .ip = {4, 0}, .cap = 37},
    {"moe_sort Tx16 top-4 pair->row", 1, {F32C(T_, 16)}, b_moe_sort, NULL, 0, 0, .ip = {4, 1}, .cap = 37},
    {"moe_sort Tx16 top-4 row->expert", 1, {F32C(T_, 16)}, b_moe_sort, NULL, 0, 0, .ip = {4, 2}, .cap = 37},
    {"moe_sort 31x8 top-2 ties pair->row", 1, {{.ndim = 2, .ne = {31, 8}, .type = TWK_F32, .gen = G_IDS, .limit = 3}}, b_moe_sort, NULL, 0, 0, .ip = {2, 1}},
    {"moe_sort 29x8 top-2 all to expert 0", 1, {F32C(29, 8)}, b_moe_sort, NULL, 0, 0, .ip = {2, 0, 1}},
    {"moe_sort 23x16 top-1 expert 15 empty", 1, {F32C(23, 16)}, b_moe_sort, NULL, 0, 0, .ip = {1, 1, 2}},
    {"moe_sort 1031x16 top-4 pair->row", 1, {F32C(1031, 16)}, b_moe_sort, NULL, 0, 0, .ip = {4, 1}},
    {"moe_sort 523x8 top-2 ties row->pair", 1, {{.ndim = 2, .ne = {523, 8}, .type = TWK_F32, .gen = G_IDS, .limit = 2}}, b_moe_sort, NULL, 0, 0, .ip = {2, 0}},
    {"moe_sort 19x8 given i64 ids x3", 2, {F32C(19, 8), IDS64(8, 19, 3)}, b_moe_sort, NULL, 0, 0, .ip = {0, 0}},
    {"moe_sort 17x16 given ids x2 row->expert", 2, {F32C(17, 16), IDS(16, 17, 2)}, b_moe_sort, NULL, 0, 0, .ip = {0, 2}},
    {"moe_gate 1x8 top-1 renorm", 1, {F32(1, 8)}, b_moe_gate, NULL, 0, 0, .ip = {1, 1}},
    {"moe_gate Tx8 top-2 renorm", 1, {F32(T_, 8)}, b_moe_gate, NULL, 0, 0, .ip = {2, 1}, .cap = 29},
    {"moe_gate 17x16 top-4", 1, {F32(17, 16)}, b_moe_gate, NULL, 0, 0, .ip = {4, 0}},
    {"moe_gate 13x8 top-2 all to expert 0", 1, {F32(13, 8)}, b_moe_gate, NULL, 0, 0, .ip = {2, 0, 1}},
    {"moe block 1x5 E8 top-1 renorm", 3, {F32(1, 5), F32(1, 8), F32(8, 3, 5)}, b_moe_block, NULL, 0, 0, .ip = {1, 1}},
    {"moe block Tx12 E8 top-2 renorm", 3, {F32(T_, 12), F32(T_, 8), F32(8, 7, 12)}, b_moe_block, NULL, 0, 0, .ip = {2, 1}, .cap = 23},
    {"moe block 37x9 E16 top-4 expert 15 empty", 3, {F32(37, 9), F32(37, 16), F32(16, 6, 9)}, b_moe_block, NULL, 0, 0, .ip = {4, 0, 2}},
    {"moe block 19x6 E8 top-2 all to expert 0", 3, {F32(19, 6), F32(19, 8), F32(8, 5, 6)}, b_moe_block, NULL, 0, 0, .ip = {2, 1, 1}},
    {"moe block Tx7 E16 top-1", 3, {F32(T_, 7), F32(T_, 16), F32(16, 4, 7)}, b_moe_block, NULL, 0, 0, .ip = {1, 0}, .cap = 41},
    {"moe_dispatch Tx5 E8 top-2 (a copy)", 2, {F32(T_, 5), F32C(T_, 8)}, b_moe_dispatch, NULL, 0, 0, .ip = {2, 0}, .cap = 13},
    {"moe_dispatch weighted 11x7 E8 top-2", 2, {F32C(11, 7), F32C(11, 8)}, b_moe_dispatch_w, NULL, 0, 0, .ip = {2, 1}},
    /* ---- end of the mixture-of-experts cases ---- */
};

const int opc_n_extra_cases = (int)(sizeof opc_extra_cases / sizeof opc_extra_cases[0]);

/* ---- generators ---- */

int64_t opc_actual(int64_t ne, int64_t n) { return ne < 0 ? -ne * n : ne; }

static void gen_segments(double *d, int64_t n, twk_rng *r, double p_new) {
    int64_t start = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i > 0 && twk_rng_uniform(r) < p_new) start = i; /* a new sequence begins */
        d[i] = (double)start;
    }
}

static void gen_segments_pattern(double *d, int64_t n) {
    static const int64_t len[] = {1, 2, 67, 1, 13, 97, 1, 5, 131, 3, 41};
    int64_t start = 0, k = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i - start == len[k]) {
            start = i;
            k = (k + 1) % (int64_t)(sizeof len / sizeof len[0]);
        }
        d[i] = (double)start;
    }
}

static void generate(const in_spec *s, rt *t, twk_rng *r) {
    int64_t n = rt_nelem(t);
    for (int64_t i = 0; i < n; i++) {
        switch (s->gen) {
        case G_NORMAL: {
            float f = (float)twk_rng_normal(r);
            if (s->type == TWK_BF16) f = twk_bf16_to_f32(twk_f32_to_bf16(f));
            if (s->type == TWK_F16) f = twk_f16_to_f32(twk_f32_to_f16(f));
            t->d[i] = (double)f;
            break;
        }
        case G_POSITIVE: t->d[i] = (double)(float)(0.5 + twk_rng_uniform(r)); break;
        case G_IDS: t->d[i] = (double)twk_rng_below(r, s->limit); break;
        case G_IDS_TOP: t->d[i] = i == n - 1 ? (double)(s->limit - 1) : (double)twk_rng_below(r, s->limit); break;
        case G_POS: t->d[i] = (double)twk_rng_below(r, 200); break;
        case G_SEG:
        case G_SEG_LONG:
        case G_SEG_PAT:
        case G_HI:
        case G_ROWS: break;
        }
    }
    if (s->gen == G_SEG) gen_segments(t->d, n, r, 0.15);
    if (s->gen == G_SEG_LONG) gen_segments(t->d, n, r, 0.012); /* segments longer than a 64-query block */
    if (s->gen == G_SEG_PAT) gen_segments_pattern(t->d, n);
    if (s->gen == G_ROWS) { /* distinct rows: a shuffled prefix of 0..limit-1 */
        int64_t *perm = malloc((size_t)s->limit * sizeof(int64_t));
        for (int64_t i = 0; i < s->limit; i++) perm[i] = i;
        for (int64_t i = 0; i < n && i < s->limit; i++) {
            int64_t k = i + twk_rng_below(r, s->limit - i), tmp = perm[i];
            perm[i] = perm[k];
            perm[k] = tmp;
            t->d[i] = (double)perm[i];
        }
        free(perm);
    }
}


twk_id opc_build(const op_case *c, twk_graph *g, int64_t n, twk_rng *r, twk_id *ids, rt *in) {
    memset(in, 0, sizeof(rt) * (size_t)c->n_in);
    for (int i = 0; i < c->n_in; i++) {
        const in_spec *s = &c->in[i];
        char name[16];
        snprintf(name, sizeof name, "in%d", i);
        ids[i] = s->type == TWK_F32       ? (s->diff ? twk_param(g, name, s->ndim, s->ne, true)
                                                     : twk_input(g, name, TWK_F32, s->ndim, s->ne))
                 : twk_dtype_is_half(s->type) ? twk_param_dtype(g, name, s->type, s->ndim, s->ne, false)
                                              : twk_input(g, name, s->type, s->ndim, s->ne);
        in[i].ndim = s->ndim;
        for (int k = 0; k < s->ndim; k++) in[i].ne[k] = opc_actual(s->ne[k], n);
        in[i].d = calloc((size_t)rt_nelem(&in[i]), sizeof(double));
        generate(s, &in[i], r);
    }
    for (int i = 1; i < c->n_in; i++) /* hi = lo + 1 + a random extent, within the limit */
        if (c->in[i].gen == G_HI)
            for (int64_t k = 0; k < rt_nelem(&in[i]); k++) {
                int64_t lo = (int64_t)in[i - 1].d[k];
                in[i].d[k] = (double)(lo + 1 + twk_rng_below(r, c->in[i].limit - lo));
            }
    return c->build(g, ids, c);
}

void opc_free_inputs(const op_case *c, rt *in) {
    for (int i = 0; i < c->n_in; i++) {
        free(in[i].d);
        in[i].d = NULL;
    }
}

twk_id opc_weight_input(twk_graph *g, twk_id y) {
    int64_t rne[4] = {0, 0, 0, 0};
    int ynd = twk_node_shape(g, y, 1, rne);
    /* R has y's symbolic shape: rebuild it from the node (token dims negative) */
    int64_t rsym[4] = {1, 1, 1, 1};
    for (int k = 0; k < (ynd > 0 ? ynd : 0); k++) {
        int64_t at2[4];
        twk_node_shape(g, y, 2, at2);
        rsym[k] = at2[k] != rne[k] ? -rne[k] : rne[k];
    }
    return twk_input(g, "R", TWK_F32, ynd > 0 ? ynd : 1, rsym);
}

void *opc_host_input(const op_case *c, int i, const rt *in, size_t *bytes) {
    int64_t ne = rt_nelem(&in[i]);
    void *h = malloc((size_t)(ne > 0 ? ne : 1) * 8);
    if (!h) return NULL;
    for (int64_t k = 0; k < ne; k++) {
        if (c->in[i].type == TWK_F32) ((float *)h)[k] = (float)in[i].d[k];
        else if (c->in[i].type == TWK_I32) ((int32_t *)h)[k] = (int32_t)in[i].d[k];
        else if (c->in[i].type == TWK_BF16) ((uint16_t *)h)[k] = twk_f32_to_bf16((float)in[i].d[k]);
        else if (c->in[i].type == TWK_F16) ((uint16_t *)h)[k] = twk_f32_to_f16((float)in[i].d[k]);
        else ((int64_t *)h)[k] = (int64_t)in[i].d[k];
    }
    *bytes = (size_t)ne * twk_dtype_size(c->in[i].type);
    return h;
}
