/* Causal attention over packed segments with grouped-query heads, and its
 * gradient, built on BLAS GEMMs. Token i attends to keys j with
 * seg_start[i] <= j <= i. Work goes block by block: for each segment, head
 * and block of QB queries, the scores against the keys up to the block's
 * last query are one sgemm, masked and normalised in place, and the products
 * with V (or the gradients) are one more sgemm each — so the quadratic part
 * runs at GEMM speed while causality skips the upper blocks. The backward
 * pass recomputes probabilities from the saved log-sum-exp. */
#include <math.h>
#include <string.h>

#include <cblas.h>

#include "cpu_internal.h"
#include "cpu_math.h"

#define QB 64 /* queries per block */

static inline float dot(const float *a, const float *b, int64_t n) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

typedef struct attn_shape {
    int64_t T, Hq, Hkv, D, group;
    float scale;
    const float *q, *k, *v;
    const cpu_tensor *seg;
} attn_shape;

static void shape_of(attn_shape *a, const cpu_call *c, int seg_src) {
    a->T = c->src[0].ne[0];
    a->Hq = c->src[0].ne[1];
    a->D = c->src[0].ne[2];
    a->Hkv = c->src[1].ne[1];
    a->group = a->Hq / a->Hkv;
    a->scale = c->l->fp[0];
    a->q = c->src[0].data;
    a->k = c->src[1].data;
    a->v = seg_src == 3 ? c->src[2].data : NULL;
    a->seg = &c->src[seg_src];
}

/* Scores of queries [s+b0, s+b0+nq) of head h against keys [s, s+b0+nq):
 * S[r][j] = scale * q . k, into S with row stride lk = b0 + nq. */
static void block_scores(const attn_shape *a, int64_t s, int64_t b0, int64_t nq, int64_t h, float *S) {
    int64_t lk = b0 + nq, hk = h / a->group;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)lk, (int)a->D, a->scale,
                a->q + ((s + b0) * a->Hq + h) * a->D, (int)(a->Hq * a->D), a->k + (s * a->Hkv + hk) * a->D,
                (int)(a->Hkv * a->D), 0.0f, S, (int)lk);
}

/* Row r of a block sees keys [0, b0 + r] (relative to the segment start). */
static inline int64_t visible(int64_t b0, int64_t r) { return b0 + r + 1; }

/* Softmax of each row over its visible keys, zeros beyond; lse (may be NULL)
 * gets each row's log-sum-exp. */
static void block_softmax(float *S, int64_t b0, int64_t nq, float *lse) {
    int64_t lk = b0 + nq;
    for (int64_t r = 0; r < nq; r++) {
        float *row = S + r * lk;
        int64_t n = visible(b0, r);
        float m = -INFINITY;
        for (int64_t j = 0; j < n; j++) m = row[j] > m ? row[j] : m;
        float sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < n; j++) {
            row[j] = cpu_expf(row[j] - m);
            sum += row[j];
        }
        float inv = 1.0f / sum;
        for (int64_t j = 0; j < n; j++) row[j] *= inv;
        memset(row + n, 0, (size_t)(lk - n) * sizeof *row);
        if (lse) lse[r] = m + logf(sum);
    }
}

/* Probabilities from a saved lse: P = exp(S - lse), zeros beyond the visible keys. */
static void block_probs(float *S, int64_t b0, int64_t nq, const float *lse, int64_t lse_stride) {
    int64_t lk = b0 + nq;
    for (int64_t r = 0; r < nq; r++) {
        float *row = S + r * lk, l = lse[r * lse_stride];
        int64_t n = visible(b0, r);
#pragma omp simd
        for (int64_t j = 0; j < n; j++) row[j] = cpu_expf(row[j] - l);
        memset(row + n, 0, (size_t)(lk - n) * sizeof *row);
    }
}

typedef void (*block_fn)(const cpu_call *c, const attn_shape *a, int64_t s, int64_t b0, int64_t nq, int64_t h,
                         float *S, float *S2);

/* Calls fn for every (segment, query head, query block). */
static twk_status for_blocks(const cpu_call *c, const attn_shape *a, block_fn fn) {
    float *S = cpu_scratch(c->ctx, (size_t)(2 * QB * a->T) * sizeof *S);
    if (!S) return TWK_ERR_OOM;
    float *S2 = S + QB * a->T;
    for (int64_t s = 0; s < a->T;) {
        int64_t e = s + 1;
        while (e < a->T && cpu_id_at(a->seg, e) == s) e++;
        for (int64_t h = 0; h < a->Hq; h++)
            for (int64_t b0 = 0; b0 < e - s; b0 += QB) {
                int64_t nq = e - s - b0 < QB ? e - s - b0 : QB;
                fn(c, a, s, b0, nq, h, S, S2);
            }
        s = e;
    }
    return TWK_OK;
}

static void fwd_block(const cpu_call *c, const attn_shape *a, int64_t s, int64_t b0, int64_t nq, int64_t h, float *S,
                      float *S2) {
    (void)S2;
    int64_t lk = b0 + nq, hk = h / a->group;
    block_scores(a, s, b0, nq, h, S);
    block_softmax(S, b0, nq, NULL);
    float *o = c->dst.data;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nq, (int)a->D, (int)lk, 1.0f, S, (int)lk,
                a->v + (s * a->Hkv + hk) * a->D, (int)(a->Hkv * a->D), 0.0f, o + ((s + b0) * a->Hq + h) * a->D,
                (int)(a->Hq * a->D));
}

twk_status cpu_attn(const cpu_call *c) {
    attn_shape a;
    shape_of(&a, c, 3);
    return for_blocks(c, &a, fwd_block);
}

static void lse_block(const cpu_call *c, const attn_shape *a, int64_t s, int64_t b0, int64_t nq, int64_t h, float *S,
                      float *S2) {
    block_scores(a, s, b0, nq, h, S);
    block_softmax(S, b0, nq, S2);
    float *lse = c->dst.data;
    for (int64_t r = 0; r < nq; r++) lse[(s + b0 + r) * a->Hq + h] = S2[r];
}

twk_status cpu_attn_lse(const cpu_call *c) {
    attn_shape a;
    shape_of(&a, c, 2);
    return for_blocks(c, &a, lse_block);
}

/* Backward (src: q, k, v, seg, o, dO, lse). For a block: P from lse; for dq
 * and dk also dS = P * (dO.V^T - rowsum(dO * O)) * scale. */
static void back_block(const cpu_call *c, const attn_shape *a, int64_t s, int64_t b0, int64_t nq, int64_t h, float *S,
                       float *S2) {
    int which = c->l->ip[0];
    int64_t lk = b0 + nq, hk = h / a->group, ldq = a->Hq * a->D, ldk = a->Hkv * a->D;
    const float *o = c->src[4].data, *dO = c->src[5].data, *lse = c->src[6].data;
    const float *dO_blk = dO + ((s + b0) * a->Hq + h) * a->D;
    float *out = c->dst.data;
    block_scores(a, s, b0, nq, h, S);
    block_probs(S, b0, nq, lse + (s + b0) * a->Hq + h, a->Hq);
    if (which == 2) { /* dV[keys] += P^T dO */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)lk, (int)a->D, (int)nq, 1.0f, S, (int)lk, dO_blk,
                    (int)ldq, 1.0f, out + (s * a->Hkv + hk) * a->D, (int)ldk);
        return;
    }
    /* dP = dO V^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)lk, (int)a->D, 1.0f, dO_blk, (int)ldq,
                a->v + (s * a->Hkv + hk) * a->D, (int)ldk, 0.0f, S2, (int)lk);
    for (int64_t r = 0; r < nq; r++) {
        int64_t i = (s + b0 + r) * a->Hq + h;
        float delta = dot(dO + i * a->D, o + i * a->D, a->D);
        float *p = S + r * lk, *dp = S2 + r * lk;
        int64_t n = visible(b0, r);
#pragma omp simd
        for (int64_t j = 0; j < n; j++) p[j] = p[j] * (dp[j] - delta) * a->scale; /* dS */
    }
    if (which == 0) /* dQ = dS K */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nq, (int)a->D, (int)lk, 1.0f, S, (int)lk,
                    a->k + (s * a->Hkv + hk) * a->D, (int)ldk, 0.0f, out + ((s + b0) * a->Hq + h) * a->D, (int)ldq);
    else /* dK[keys] += dS^T Q */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)lk, (int)a->D, (int)nq, 1.0f, S, (int)lk,
                    a->q + ((s + b0) * a->Hq + h) * a->D, (int)ldq, 1.0f, out + (s * a->Hkv + hk) * a->D, (int)ldk);
}

twk_status cpu_attn_back(const cpu_call *c) {
    attn_shape a;
    shape_of(&a, c, 3);
    if (c->l->ip[0] != 0) memset(c->dst.data, 0, (size_t)c->dst.nelem * twk_dtype_size(c->dst.type)); /* dK, dV accumulate */
    return for_blocks(c, &a, back_block);
}
