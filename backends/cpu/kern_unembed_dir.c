/* unembed_logprobs_dir: training's unembedding in two products over the vocabulary.
 *
 * For each chunk of C words (w_c: its rows, a 16-bit w widened to f32 once per chunk) and each
 * token tile (every token of a pass up to TWK_UNEMBED_DIR_ROWS): Z = h w_c^T (one sgemm), per
 * row an online max m and sum s of exp(z - m) (the old sum and the row of G rescaled by
 * exp(m_old - m_new) when the max grows), P = exp(Z - m) in place, the target's logit kept when
 * it falls in the chunk, and G = G + P w_c (the second sgemm, into the output's first H
 * columns). At the end logprob = z_target - (m + log s) and g = w[target] - G / s, the logprob's
 * gradient in h: the backward is dh = dy g, no product over the vocabulary. A token's sums run
 * in the same order whatever the pass's token count (the chunk size is fixed), and its products'
 * rows are split only at multiples of TWK_GEMM_ROW_PERIOD (cpu_sgemm). */
#include <limits.h>
#include <math.h>

#include "cpu_internal.h"
#include "cpu_math.h"

typedef struct {
    const cpu_call *c;
    float *z;            /* the tile's logits [rows, C], turned into exp(z - m) */
    float *m, *s, *zt;   /* per token of the pass: running max, sum, target logit */
    const float *wc;     /* the chunk's rows of w in f32 [C, H] (widening: its destination) */
    int64_t t0, c0, C;   /* the tile's first token, the chunk's first word, its words */
} dir_job;

/* Rows [r0, r1) of the tile: the chunk's share of the max and sum, P in place, G rescaled. */
static void chunk_rows(void *arg, int64_t r0, int64_t r1) {
    const dir_job *j = arg;
    const cpu_call *c = j->c;
    int64_t H = c->src[0].ne[1], C = j->C;
    for (int64_t r = r0; r < r1; r++) {
        int64_t t = j->t0 + r, tgt = cpu_id_at(&c->src[2], t) - j->c0;
        float *zr = j->z + r * C;
        float mc = -INFINITY;
#pragma omp simd reduction(max : mc)
        for (int64_t i = 0; i < C; i++) mc = zr[i] > mc ? zr[i] : mc;
        if (tgt >= 0 && tgt < C) j->zt[t] = zr[tgt];
        float mo = j->c0 ? j->m[t] : mc, mn = mc > mo ? mc : mo, sc = 0;
#pragma omp simd reduction(+ : sc)
        for (int64_t i = 0; i < C; i++) {
            zr[i] = cpu_expf(zr[i] - mn);
            sc += zr[i];
        }
        if (j->c0 == 0) { /* the first chunk: G is written (beta 0), nothing to rescale */
            j->m[t] = mn;
            j->s[t] = sc;
            continue;
        }
        float f = cpu_expf(mo - mn); /* 1 when the max stays */
        j->m[t] = mn;
        j->s[t] = j->s[t] * f + sc;
        if (f != 1.0f) {
            float *G = (float *)c->dst.data + t * (H + 1);
#pragma omp simd
            for (int64_t i = 0; i < H; i++) G[i] *= f;
        }
    }
}

/* Rows [r0, r1) of the chunk widened to f32 (a 16-bit w). */
static void widen_rows(void *arg, int64_t r0, int64_t r1) {
    const dir_job *j = arg;
    const cpu_tensor *w = &j->c->src[1];
    int64_t H = w->ne[1];
    twk_dtype_to_f32(w->type, (const unsigned char *)w->data + 2 * (size_t)((j->c0 + r0) * H), (float *)j->wc + r0 * H,
                     (r1 - r0) * H);
}

/* Tokens [t0, t1): the logprob into column H, g = w[target] - G / s into columns 0..H-1. */
static void finish_rows(void *arg, int64_t t0, int64_t t1) {
    const dir_job *j = arg;
    const cpu_call *c = j->c;
    const cpu_tensor *w = &c->src[1];
    int64_t H = c->src[0].ne[1];
    for (int64_t t = t0; t < t1; t++) {
        float *row = (float *)c->dst.data + t * (H + 1), s = j->s[t];
        int64_t tgt = cpu_id_at(&c->src[2], t);
        row[H] = j->zt[t] - (j->m[t] + logf(s)); /* as the logits path: z[target] - row_logsumexp */
        if (w->type == TWK_F32) {
            const float *wt = (const float *)w->data + tgt * H;
#pragma omp simd
            for (int64_t i = 0; i < H; i++) row[i] = wt[i] - row[i] / s;
        } else {
            const uint16_t *wt = (const uint16_t *)w->data + tgt * H;
            int bf = w->type == TWK_BF16;
            for (int64_t i = 0; i < H; i++) row[i] = (bf ? twk_bf16_to_f32(wt[i]) : twk_f16_to_f32(wt[i])) - row[i] / s;
        }
    }
}

twk_status cpu_unembed_logprobs_dir(const cpu_call *c) {
    int64_t T = c->src[0].ne[0], H = c->src[0].ne[1], V = c->src[1].ne[0];
    if (T > INT_MAX || H + 1 > INT_MAX || V > INT_MAX)
        return twk_error(TWK_ERR_UNSUPPORTED, "%s '%s': dims exceed the BLAS's int range", twk_op_name(c->l->op), c->l->name);
    if (T == 0) return TWK_OK;
    int half = twk_dtype_is_half(c->src[1].type);
    int64_t C = c->l->ip[0] > 0 && c->l->ip[0] < V ? c->l->ip[0] : TWK_UNEMBED_CHUNK(V);
    int64_t rows = c->l->ip[1] > 0 && c->l->ip[1] < T ? c->l->ip[1] : TWK_UNEMBED_DIR_ROWS(C, T);
    float *z = cpu_scratch(c->ctx, (size_t)TWK_UNEMBED_DIR_SCRATCH(C, rows, H, T, half) * sizeof *z);
    if (!z) return TWK_ERR_OOM;
    float *wide = z + rows * C, *m = wide + (half ? C * H : 0);
    dir_job j = {.c = c, .z = z, .m = m, .s = m + T, .zt = m + 2 * T, .C = C};
    const float *h = c->src[0].data;
    float *G = c->dst.data;
    for (j.c0 = 0; j.c0 < V; j.c0 += C) {
        int64_t cw = V - j.c0 < C ? V - j.c0 : C;
        j.C = cw;
        if (half) {
            j.wc = wide;
            cpu_parallel_for(c->ctx->pool, cw, CPU_GRAIN_ELEMS / H + 1, widen_rows, &j);
        } else {
            j.wc = (const float *)c->src[1].data + j.c0 * H;
        }
        for (j.t0 = 0; j.t0 < T; j.t0 += rows) {
            int64_t mt = T - j.t0 < rows ? T - j.t0 : rows;
            cpu_sgemm(c->ctx, 0, 1, mt, cw, H, h + j.t0 * H, H, j.wc, H, 0.0f, z, cw);
            cpu_parallel_for(c->ctx->pool, mt, CPU_GRAIN_ELEMS / cw + 1, chunk_rows, &j);
            cpu_sgemm(c->ctx, 0, 0, mt, H, cw, z, cw, j.wc, H, j.c0 ? 1.0f : 0.0f, G + j.t0 * (H + 1), H + 1);
        }
    }
    cpu_parallel_for(c->ctx->pool, T, CPU_GRAIN_ELEMS / (H + 1) + 1, finish_rows, &j);
    return TWK_OK;
}
