/* The two-product unembedding's op cases (op_cases.h's opc_dir_cases): twk_unembed_logprobs_dir
 * read through twk_unembed_dir_logprobs (the logprobs against float64, dh through the autograd
 * rule against finite differences of that reference), and its packed output [T, H + 1] itself
 * (the direction g and the logprob against float64; forward only: the gradient treats g as a
 * constant). ip[0] chunk words, ip[1] tile tokens (0: the defaults): T = 1, primes, several
 * chunks and token tiles, V not a multiple of the chunk, the default chunk crossed, f32 / bf16 /
 * f16 w (values rounded to the dtype, so the float64 reference sees the same weights). */
#include <stdlib.h>

#include "op_cases.h"

static twk_id b_dir(twk_graph *g, const twk_id *in, const op_case *c) {
    return twk_unembed_dir_logprobs(g, twk_unembed_logprobs_dir(g, in[0], in[1], in[2], c->ip[0], c->ip[1]));
}
static twk_id b_packed(twk_graph *g, const twk_id *in, const op_case *c) {
    return twk_unembed_logprobs_dir(g, in[0], in[1], in[2], c->ip[0], c->ip[1]);
}
static void r_packed(const op_case *c, rt *in, rt *y) { (void)c; ref_unembed_dir(&in[0], &in[1], &in[2], y); }

#define F32(...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_F32, .diff = 1}
#define F32C(...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_F32, .diff = 0}
#define W16(t, ...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = t, .diff = 0}
/* ids in [0, lim) with the last one lim - 1 (the top of the range) */
#define IDSTOP(lim, ...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_I32, .gen = G_IDS_TOP, .limit = lim}
#define IDS64(lim, ...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_I64, .gen = G_IDS, .limit = lim}
#define T_ (-1)

const op_case opc_dir_cases[] = {
    /* the logprobs and dh */
    {"unembed_dir 1x1 over 1", 3, {F32(1, 1), F32C(1, 1), IDSTOP(1, 1)}, b_dir, opc_ref_unembed, 1e-5, 1e-4},
    {"unembed_dir 1x37 over 300 chunk 64", 3, {F32(1, 37), F32C(300, 37), IDSTOP(300, 1)}, b_dir, opc_ref_unembed, 1e-5, 1e-4, .ip = {64}},
    {"unembed_dir Tx37 over 300 chunk 64", 3, {F32(T_, 37), F32C(300, 37), IDSTOP(300, T_)}, b_dir, opc_ref_unembed, 1e-5, 1e-4, .ip = {64}, .cap = 19},
    {"unembed_dir Tx37 over 300 chunk 97 rows 7", 3, {F32(T_, 37), F32C(300, 37), IDSTOP(300, T_)}, b_dir, opc_ref_unembed, 1e-5, 1e-4, .ip = {97, 7}, .cap = 19},
    {"unembed_dir 5x16 over 7 i64", 3, {F32(5, 16), F32C(7, 16), IDS64(7, 5)}, b_dir, opc_ref_unembed, 1e-5, 1e-4},
    {"unembed_dir 9x301 over 520 chunk 128", 3, {F32(9, 301), F32C(520, 301), IDSTOP(520, 9)}, b_dir, opc_ref_unembed, 1e-5, 1e-4, .ip = {128}},
    {"unembed_dir 3x24 over 4500 (default chunks)", 3, {F32(3, 24), F32C(4500, 24), IDSTOP(4500, 3)}, b_dir, opc_ref_unembed, 1e-5, 1e-4},
    {"unembed_dir bf16 1x37 over 300 chunk 64", 3, {F32(1, 37), W16(TWK_BF16, 300, 37), IDSTOP(300, 1)}, b_dir, opc_ref_unembed, 1e-5, 1e-4, .ip = {64}},
    {"unembed_dir bf16 Tx37 over 300 chunk 64 rows 5", 3, {F32(T_, 37), W16(TWK_BF16, 300, 37), IDSTOP(300, T_)}, b_dir, opc_ref_unembed, 1e-5, 1e-4, .ip = {64, 5}, .cap = 19},
    {"unembed_dir bf16 3x24 over 4500 (default chunks)", 3, {F32(3, 24), W16(TWK_BF16, 4500, 24), IDSTOP(4500, 3)}, b_dir, opc_ref_unembed, 1e-5, 1e-4},
    {"unembed_dir f16 1x16 over 71 chunk 8", 3, {F32(1, 16), W16(TWK_F16, 71, 16), IDSTOP(71, 1)}, b_dir, opc_ref_unembed, 1e-5, 1e-4, .ip = {8}},
    {"unembed_dir f16 Tx16 over 71 chunk 8 rows 4", 3, {F32(T_, 16), W16(TWK_F16, 71, 16), IDSTOP(71, T_)}, b_dir, opc_ref_unembed, 1e-5, 1e-4, .ip = {8, 4}, .cap = 13},
    /* the packed output: g and the logprob */
    {"unembed_dir packed 1x1 over 1", 3, {F32C(1, 1), F32C(1, 1), IDSTOP(1, 1)}, b_packed, r_packed, 1e-5, 1},
    {"unembed_dir packed 1x37 over 300 chunk 64", 3, {F32C(1, 37), F32C(300, 37), IDSTOP(300, 1)}, b_packed, r_packed, 1e-5, 1, .ip = {64}},
    {"unembed_dir packed Tx37 over 300 chunk 97 rows 7", 3, {F32C(T_, 37), F32C(300, 37), IDSTOP(300, T_)}, b_packed, r_packed, 1e-5, 1, .ip = {97, 7}, .cap = 19},
    {"unembed_dir packed 3x24 over 4500 (default chunks)", 3, {F32C(3, 24), F32C(4500, 24), IDSTOP(4500, 3)}, b_packed, r_packed, 1e-5, 1},
    {"unembed_dir packed bf16 Tx37 over 300 chunk 64 rows 5", 3, {F32C(T_, 37), W16(TWK_BF16, 300, 37), IDSTOP(300, T_)}, b_packed, r_packed, 1e-5, 1, .ip = {64, 5}, .cap = 19},
    {"unembed_dir packed bf16 1x37 over 4500 (default chunks)", 3, {F32C(1, 37), W16(TWK_BF16, 4500, 37), IDSTOP(4500, 1)}, b_packed, r_packed, 1e-5, 1},
    {"unembed_dir packed f16 Tx16 over 71 chunk 8 rows 4", 3, {F32C(T_, 16), W16(TWK_F16, 71, 16), IDSTOP(71, T_)}, b_packed, r_packed, 1e-5, 1, .ip = {8, 4}, .cap = 13},
};

const int opc_n_dir_cases = (int)(sizeof opc_dir_cases / sizeof opc_dir_cases[0]);
