/* Every op, forward against a float64 reference and backward against central
 * finite differences of that reference, on random inputs of awkward sizes
 * (1, primes, larger than a tile). Cases with token dims run at capacity and
 * at a smaller run-time count. Each case states its tolerances and prints the
 * measured errors.
 *
 * Error measures: forward  max|y - ref| / max(max|ref|, 1);
 *                 backward max|g - fd|  / max(max|fd|, 1e-2) (the floor keeps
 *                 float32 cancellation in near-zero gradients from reading as error),
 * where fd is the central difference (h = 1e-6) of sum(ref(x) * R) for the
 * random R that also weights the engine's loss. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_ops.h"
#include "twinkle/twinkle.h"

enum gen { G_NORMAL, G_IDS, G_POS, G_SEG, G_SEG_LONG, G_POSITIVE, G_ROWS, G_HI };

typedef struct in_spec {
    int ndim;
    int64_t ne[4]; /* negative: per-token coefficient (TWK_TOK) */
    twk_dtype type;
    int diff;       /* differentiable: a trainable param */
    enum gen gen;
    int64_t limit;  /* ids in [0, limit) */
} in_spec;

typedef struct op_case op_case;
typedef twk_id (*build_fn)(twk_graph *g, const twk_id *in, const op_case *c);
typedef void (*ref_fn)(const op_case *c, rt *in, rt *out);

struct op_case {
    const char *name;
    int n_in;
    in_spec in[6];
    build_fn build;
    ref_fn ref;
    double fwd_tol, bwd_tol;
    int ip[4];
    double fp[2];
    int64_t cap; /* token capacity (cases with token dims) */
};

/* ---- builders and references per op ---- */

static twk_id b_add(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_add(g, in[0], in[1]); }
static void r_add(const op_case *c, rt *in, rt *y) { (void)c; ref_add(&in[0], &in[1], y); }
static twk_id b_mul(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_mul(g, in[0], in[1]); }
static void r_mul(const op_case *c, rt *in, rt *y) { (void)c; ref_mul(&in[0], &in[1], y); }
static twk_id b_scale(twk_graph *g, const twk_id *in, const op_case *c) { return twk_scale(g, in[0], (float)c->fp[0]); }
static void r_scale(const op_case *c, rt *in, rt *y) { ref_scale(&in[0], (double)(float)c->fp[0], y); }
static twk_id b_silu(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_silu(g, in[0]); }
static void r_silu(const op_case *c, rt *in, rt *y) { (void)c; ref_silu(&in[0], y); }
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
    return twk_attention(g, in[0], in[1], in[2], in[3], (float)c->fp[0]);
}
static void r_attn(const op_case *c, rt *in, rt *y) { ref_attention(&in[0], &in[1], &in[2], &in[3], (double)(float)c->fp[0], y); }
static twk_id b_logprobs(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_logprobs(g, in[0], in[1]); }
static void r_logprobs(const op_case *c, rt *in, rt *y) { (void)c; ref_logprobs(&in[0], &in[1], y); }
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
    return twk_attention_cached(g, in[0], in[1], in[2], in[3], in[4], (float)c->fp[0]);
}
static void r_attn_cache(const op_case *c, rt *in, rt *y) {
    ref_attn_cache(&in[0], &in[1], &in[2], &in[3], &in[4], (double)(float)c->fp[0], y);
}
static twk_id b_lora_gather(twk_graph *g, const twk_id *in, const op_case *c) { (void)c; return twk_lora_gather(g, in[0], in[1], in[2]); }
static void r_lora_gather(const op_case *c, rt *in, rt *y) { (void)c; ref_lora_gather(&in[0], &in[1], &in[2], y); }
static twk_id b_reshape(twk_graph *g, const twk_id *in, const op_case *c) {
    int64_t ne[4] = {c->ip[0], c->ip[1], c->ip[2], c->ip[3]};
    int nd = 0;
    while (nd < 4 && ne[nd]) nd++;
    /* a reshape is a view: follow it by a scale so the output is computed */
    return twk_scale(g, twk_reshape(g, in[0], nd, ne), 1.0f);
}
static void r_reshape(const op_case *c, rt *in, rt *y) { (void)c; ref_copy(&in[0], y); }

#define F32(...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_F32, .diff = 1}
#define F32C(...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_F32, .diff = 0}
#define IDS(lim, ...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_I32, .gen = G_IDS, .limit = lim}
#define IDS64(lim, ...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_I64, .gen = G_IDS, .limit = lim}
#define POS(...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_I32, .gen = G_POS}
#define SEG(...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_I32, .gen = G_SEG}
#define SEGL(...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_I32, .gen = G_SEG_LONG}
#define ROWS(lim, ...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_I32, .gen = G_ROWS, .limit = lim}
#define HI(lim, ...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_I32, .gen = G_HI, .limit = lim}
#define T_ (-1)

static const op_case cases[] = {
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
    {"scale 1", 1, {F32(1)}, b_scale, r_scale, 1e-6, 1e-5, .fp = {-2.5}},
    {"scale 17x19", 1, {F32(17, 19)}, b_scale, r_scale, 1e-6, 1e-5, .fp = {0.37}},
    {"silu 1", 1, {F32(1)}, b_silu, r_silu, 1e-6, 1e-5},
    {"silu 131x257", 1, {F32(131, 257)}, b_silu, r_silu, 1e-6, 1e-5},
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
    {"logprobs 1x1", 2, {F32(1, 1), IDS(1, 1)}, b_logprobs, r_logprobs, 1e-5, 1e-4},
    {"logprobs Tx1031", 2, {F32(T_, 1031), IDS(1031, T_)}, b_logprobs, r_logprobs, 1e-5, 1e-4, .cap = 17},
    {"logprobs 5x7 i64", 2, {F32(5, 7), IDS64(7, 5)}, b_logprobs, r_logprobs, 1e-5, 1e-4},
    /* decoding with a KV cache (forward only: not differentiable) */
    {"kv_write 1 row of 1", 3, {F32C(1, 1, 2), F32C(1, 1, 2), ROWS(1, 1)}, b_kv_write, r_kv_write, 0, 1},
    {"kv_write T rows of 53x3x8", 3, {F32C(53, 3, 8), F32C(T_, 3, 8), ROWS(53, T_)}, b_kv_write, r_kv_write, 0, 1, .cap = 29},
    {"attn_cache 1x1x1 over 1 row", 5, {F32C(1, 1, 1), F32C(1, 1, 1), F32C(1, 1, 1), IDS(1, 1), HI(1, 1)}, b_attn_cache, r_attn_cache, 1e-5, 1, .fp = {1.0}},
    {"attn_cache Tx4x16 over 67x2x16", 5, {F32C(T_, 4, 16), F32C(67, 2, 16), F32C(67, 2, 16), IDS(60, T_), HI(67, T_)}, b_attn_cache, r_attn_cache, 1e-5, 1, .fp = {0.25}, .cap = 13},
    {"attn_cache 5x6x67 over 300x3x67", 5, {F32C(5, 6, 67), F32C(300, 3, 67), F32C(300, 3, 67), IDS(299, 5), HI(300, 5)}, b_attn_cache, r_attn_cache, 1e-5, 1, .fp = {0.12}},
    {"lora_gather 1x1 over 1x1x1", 3, {F32C(1, 1), F32C(1, 1, 1), IDS(1, 1)}, b_lora_gather, r_lora_gather, 1e-6, 1},
    {"lora_gather Tx67 over 5x13x67", 3, {F32C(T_, 67), F32C(5, 13, 67), IDS(5, T_)}, b_lora_gather, r_lora_gather, 1e-5, 1, .cap = 19},
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

/* ---- driver ---- */

static int64_t actual(int64_t ne, int64_t n) { return ne < 0 ? -ne * n : ne; }

static void gen_segments(double *d, int64_t n, twk_rng *r, double p_new) {
    int64_t start = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i > 0 && twk_rng_uniform(r) < p_new) start = i; /* a new sequence begins */
        d[i] = (double)start;
    }
}

static void generate(const in_spec *s, rt *t, twk_rng *r) {
    int64_t n = rt_nelem(t);
    for (int64_t i = 0; i < n; i++) {
        switch (s->gen) {
        case G_NORMAL: t->d[i] = (double)(float)twk_rng_normal(r); break;
        case G_POSITIVE: t->d[i] = (double)(float)(0.5 + twk_rng_uniform(r)); break;
        case G_IDS: t->d[i] = (double)twk_rng_below(r, s->limit); break;
        case G_POS: t->d[i] = (double)twk_rng_below(r, 200); break;
        case G_SEG:
        case G_SEG_LONG:
        case G_HI:
        case G_ROWS: break;
        }
    }
    if (s->gen == G_SEG) gen_segments(t->d, n, r, 0.15);
    if (s->gen == G_SEG_LONG) gen_segments(t->d, n, r, 0.012); /* segments longer than a 64-query block */
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

static double loss_of(const op_case *c, rt *in, rt *out, const double *R) {
    c->ref(c, in, out);
    double s = 0;
    for (int64_t i = 0; i < rt_nelem(out); i++) s += out->d[i] * R[i];
    return s;
}

/* Runs one case at token count n; returns the number of failures. */
static int run_case(const op_case *c, twk_device *dev, int64_t n, uint64_t seed) {
    twk_rng r;
    twk_rng_seed(&r, seed);
    int64_t cap = c->cap ? c->cap : 1;
    twk_graph *g = twk_graph_new();
    twk_id ids[6];
    rt in[6];
    memset(in, 0, sizeof in);
    for (int i = 0; i < c->n_in; i++) {
        const in_spec *s = &c->in[i];
        char name[16];
        snprintf(name, sizeof name, "in%d", i);
        ids[i] = s->type == TWK_F32 ? (s->diff ? twk_param(g, name, s->ndim, s->ne, true)
                                               : twk_input(g, name, TWK_F32, s->ndim, s->ne))
                                    : twk_input(g, name, s->type, s->ndim, s->ne);
        in[i].ndim = s->ndim;
        for (int k = 0; k < s->ndim; k++) in[i].ne[k] = actual(s->ne[k], n);
        in[i].d = calloc((size_t)rt_nelem(&in[i]), sizeof(double));
        generate(s, &in[i], &r);
    }
    for (int i = 1; i < c->n_in; i++) /* hi = lo + 1 + a random extent, within the limit */
        if (c->in[i].gen == G_HI)
            for (int64_t k = 0; k < rt_nelem(&in[i]); k++) {
                int64_t lo = (int64_t)in[i - 1].d[k];
                in[i].d[k] = (double)(lo + 1 + twk_rng_below(&r, c->in[i].limit - lo));
            }
    twk_id y = c->build(g, ids, c);
    int64_t yne[4];
    int yn = twk_node_shape(g, y, n, yne);
    rt out = {.ndim = yn > 0 ? yn : 1};
    for (int k = 0; k < out.ndim; k++) out.ne[k] = yn > 0 ? yne[k] : 1;
    int64_t ny = rt_nelem(&out);
    out.d = calloc((size_t)ny, sizeof(double));
    int64_t rne[4];
    for (int k = 0; k < 4; k++) rne[k] = 0;
    int ynd = twk_node_shape(g, y, 1, rne);
    /* R has y's symbolic shape: rebuild it from the node (token dims negative) */
    int64_t rsym[4];
    for (int k = 0; k < (ynd > 0 ? ynd : 0); k++) {
        int64_t at2[4];
        twk_node_shape(g, y, 2, at2);
        rsym[k] = at2[k] != rne[k] ? -rne[k] : rne[k];
    }
    twk_id Rid = twk_input(g, "R", TWK_F32, ynd > 0 ? ynd : 1, rsym);
    twk_id loss = twk_weighted_sum(g, y, Rid);
    int fails = 0;
    if (twk_graph_status(g) != TWK_OK) {
        printf("FAIL %-34s build: %s\n", c->name, twk_graph_error(g));
        fails = 1;
        goto done;
    }
    if (twk_graph_backward(g, loss) != TWK_OK) {
        printf("FAIL %-34s backward: %s\n", c->name, twk_last_error());
        fails = 1;
        goto done;
    }
    twk_graph_output(g, y);
    twk_id grads[6];
    for (int i = 0; i < c->n_in; i++) {
        grads[i] = c->in[i].diff ? twk_graph_grad(g, ids[i]) : -1;
        if (c->in[i].diff && grads[i] < 0) {
            printf("FAIL %-34s input %d got no gradient\n", c->name, i);
            fails = 1;
            goto done;
        }
        if (grads[i] >= 0) twk_graph_output(g, grads[i]);
    }
    twk_plan *p = NULL;
    if (twk_plan_compile(g, dev, cap, NULL, 0, &p) != TWK_OK) {
        printf("FAIL %-34s compile: %s\n", c->name, twk_last_error());
        fails = 1;
        goto done;
    }
    double *R = malloc((size_t)ny * sizeof(double));
    float *buf = malloc((size_t)(ny > 4096 ? ny : 4096) * 8 + 4096 * 64);
    for (int64_t i = 0; i < ny; i++) R[i] = (double)(float)twk_rng_normal(&r);
    for (int i = 0; i < c->n_in; i++) {
        int64_t ne = rt_nelem(&in[i]);
        void *h = malloc((size_t)ne * 8);
        for (int64_t k = 0; k < ne; k++) {
            if (c->in[i].type == TWK_F32) ((float *)h)[k] = (float)in[i].d[k];
            else if (c->in[i].type == TWK_I32) ((int32_t *)h)[k] = (int32_t)in[i].d[k];
            else ((int64_t *)h)[k] = (int64_t)in[i].d[k];
        }
        if (twk_plan_write(p, ids[i], n, h, (size_t)ne * twk_dtype_size(c->in[i].type)) != TWK_OK) {
            printf("FAIL %-34s write: %s\n", c->name, twk_last_error());
            fails++;
        }
        free(h);
    }
    float *Rf = malloc((size_t)ny * sizeof(float));
    for (int64_t i = 0; i < ny; i++) Rf[i] = (float)R[i];
    twk_plan_write(p, Rid, n, Rf, (size_t)ny * 4);
    free(Rf);
    if (twk_plan_run(p, n) != TWK_OK) {
        printf("FAIL %-34s run: %s\n", c->name, twk_last_error());
        fails++;
        goto free_plan;
    }
    /* forward */
    float *yf = malloc((size_t)ny * sizeof(float));
    twk_plan_read(p, y, n, yf, (size_t)ny * 4);
    c->ref(c, in, &out);
    double err = 0, scale = 1;
    for (int64_t i = 0; i < ny; i++) scale = fmax(scale, fabs(out.d[i]));
    for (int64_t i = 0; i < ny; i++) err = fmax(err, fabs((double)yf[i] - out.d[i]));
    if (!(err / scale <= c->fwd_tol)) fails++;
    printf("%s %-34s n=%-3lld fwd err %.2e (tol %.0e)", err / scale <= c->fwd_tol ? "ok  " : "FAIL",
           c->name, (long long)n, err / scale, c->fwd_tol);
    free(yf);
    /* backward: each differentiable input against central differences */
    for (int i = 0; i < c->n_in; i++) {
        if (grads[i] < 0) continue;
        int64_t ne = rt_nelem(&in[i]);
        float *gf = malloc((size_t)ne * sizeof(float));
        twk_plan_read(p, grads[i], n, gf, (size_t)ne * 4);
        int64_t probes = ne < 160 ? ne : 160;
        double gerr = 0, gscale = 1e-2;
        double *fd = malloc((size_t)probes * sizeof(double));
        int64_t *at = malloc((size_t)probes * sizeof(int64_t));
        for (int64_t k = 0; k < probes; k++) {
            int64_t e = probes == ne ? k : twk_rng_below(&r, ne);
            double x0 = in[i].d[e], h = 1e-6 * fmax(1.0, fabs(x0));
            in[i].d[e] = x0 + h;
            double lp = loss_of(c, in, &out, R);
            in[i].d[e] = x0 - h;
            double lm = loss_of(c, in, &out, R);
            in[i].d[e] = x0;
            fd[k] = (lp - lm) / (2 * h);
            at[k] = e;
            gscale = fmax(gscale, fabs(fd[k]));
        }
        for (int64_t k = 0; k < probes; k++) gerr = fmax(gerr, fabs((double)gf[at[k]] - fd[k]));
        int ok = gerr / gscale <= c->bwd_tol;
        if (!ok) fails++;
        printf("  d/in%d %.2e%s", i, gerr / gscale, ok ? "" : " FAIL");
        free(fd);
        free(at);
        free(gf);
    }
    int any_diff = 0;
    for (int i = 0; i < c->n_in; i++) any_diff |= c->in[i].diff;
    if (any_diff) printf("  (bwd tol %.0e)\n", c->bwd_tol);
    else printf("  (forward only: not differentiable)\n");
free_plan:
    free(R);
    free(buf);
    twk_plan_free(p);
done:
    for (int i = 0; i < c->n_in; i++) free(in[i].d);
    free(out.d);
    twk_graph_free(g);
    return fails;
}

int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : NULL;
    twk_device *dev = NULL;
    if (twk_device_open(getenv("TWK_TEST_DEVICE") ? getenv("TWK_TEST_DEVICE") : "cpu", &dev) != TWK_OK) {
        printf("cannot open device: %s\n", twk_last_error());
        return 1;
    }
    int fails = 0, runs = 0;
    int n_cases = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n_cases; i++) {
        const op_case *c = &cases[i];
        if (only && !strstr(c->name, only)) continue;
        if (c->cap) {
            /* at capacity, and at a smaller run-time count */
            fails += run_case(c, dev, c->cap, 1000 + (uint64_t)i);
            fails += run_case(c, dev, c->cap / 2 + 1, 2000 + (uint64_t)i);
            runs += 2;
        } else {
            fails += run_case(c, dev, 1, 1000 + (uint64_t)i);
            runs++;
        }
    }
    twk_device_close(dev);
    printf("%d case runs, %d failures\n", runs, fails);
    return fails ? 1 : 0;
}
