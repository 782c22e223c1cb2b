/* Causal attention over packed segments with grouped-query heads, and its
 * gradient, built on BLAS GEMMs. Token i attends to keys j with
 * seg_start[i] <= j <= i and, with a sliding window W (ip[1] > 0),
 * i - j < W. Scores are scale * q.k (fp[0]), soft-capped to
 * cap * tanh(s / cap) where fp[1] = cap > 0. Work goes block by block: for
 * each segment, head and block of QB queries, the scores against the keys the
 * block can see are one sgemm, masked and normalised in place, and the
 * products with V (or the gradients) are one more sgemm each — so the
 * quadratic part runs at GEMM speed while causality (and the window) skip the
 * blocks nobody sees. The (segment, head) pairs run in parallel on the pool's
 * threads, each product on one BLAS thread (blocks of 64 queries are too small
 * to split). The backward pass recomputes probabilities from the saved
 * log-sum-exp. q, k and v may each be bf16 / f16: such a source is
 * widened to f32 once, into the scratch, before the blocks run. */
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
    int64_t window; /* 0: none */
    float scale, cap; /* cap 0: no soft-capping */
    const float *q, *k, *v;
    const cpu_tensor *seg;
    int64_t nseg, longest, *starts; /* the segments: [starts[n], starts[n + 1]), the longest's length */
    int mats;                         /* scratch matrices of QB x longest floats per thread: 1, 2 or 3 */
} attn_shape;

/* Source t's floats: its data when f32, else widened into *buf (which then moves past them). */
static const float *widened(const cpu_tensor *t, float **buf) {
    if (t->type == TWK_F32) return t->data;
    float *w = *buf;
    twk_dtype_to_f32(t->type, t->data, w, t->nelem);
    *buf += t->nelem;
    return w;
}

/* The end of the segment that starts at token s (its tokens name s as their start). */
static int64_t seg_end(const attn_shape *a, int64_t s) {
    int64_t e = s + 1;
    while (e < a->T && cpu_id_at(a->seg, e) == s) e++;
    return e;
}

/* The shape, and the f32 q, k (and v, seg_src 3) in *S's tail; *S gets the segments' starts (the
 * blocks' scratch follows them: mats QB L floats per thread, L the longest segment). TWK_ERR_OOM when
 * the scratch cannot grow. */
static twk_status shape_of(attn_shape *a, const cpu_call *c, int seg_src, int mats, float **S) {
    a->T = c->src[0].ne[0];
    a->Hq = c->src[0].ne[1];
    a->D = c->src[0].ne[2];
    a->Hkv = c->src[1].ne[1];
    a->group = a->Hq / a->Hkv;
    a->scale = c->l->fp[0];
    a->cap = c->l->fp[1];
    a->window = c->l->ip[1] > 0 ? c->l->ip[1] : 0;
    a->seg = &c->src[seg_src];
    a->nseg = 0;
    a->longest = 0;
    a->mats = mats;
    for (int64_t s = 0, e; s < a->T; a->nseg++, s = e) {
        e = seg_end(a, s);
        if (e - s > a->longest) a->longest = e - s;
    }
    int64_t starts = (a->nseg + 1) * (int64_t)(sizeof(int64_t) / sizeof(float));
    int64_t blocks = (int64_t)c->ctx->n_threads * mats * QB * a->longest, floats = starts + blocks;
    for (int i = 0; i < seg_src; i++) floats += c->src[i].type == TWK_F32 ? 0 : c->src[i].nelem;
    *S = cpu_scratch(c->ctx, (size_t)floats * sizeof **S);
    if (!*S) return TWK_ERR_OOM;
    a->starts = (int64_t *)(void *)*S;
    for (int64_t s = 0, n = 0; s < a->T; s = seg_end(a, s)) a->starts[n++] = s;
    a->starts[a->nseg] = a->T;
    float *wide = *S + starts + blocks;
    a->q = widened(&c->src[0], &wide);
    a->k = widened(&c->src[1], &wide);
    a->v = seg_src == 3 ? widened(&c->src[2], &wide) : NULL;
    *S += starts;
    return TWK_OK;
}

/* A block: queries [b0, b0 + nq) and the keys [k0, b0 + nq) they can see, relative to the
 * segment start s; S rows have stride lk = b0 + nq - k0. */
typedef struct blk {
    int64_t s, b0, nq, k0, lk;
} blk;

/* Row r of a block sees keys [first(r), b0 + r] (relative to the segment start). */
static inline int64_t first_key(const attn_shape *a, int64_t q) {
    return a->window && q - a->window + 1 > 0 ? q - a->window + 1 : 0;
}
/* Row r's visible keys as columns [*c0, *c1) of S. */
static inline void visible(const attn_shape *a, const blk *b, int64_t r, int64_t *c0, int64_t *c1) {
    *c0 = first_key(a, b->b0 + r) - b->k0;
    *c1 = b->b0 + r + 1 - b->k0;
}

/* Scores of the block's queries of head h against its keys: S[r][j] = scale * q . k, soft-capped
 * on the visible columns; with `caps` (may be NULL) 1 - tanh^2 there, the cap's derivative. */
static void block_scores(const attn_shape *a, const blk *b, int64_t h, float *S, float *caps) {
    int64_t hk = h / a->group;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)b->nq, (int)b->lk, (int)a->D, a->scale,
                a->q + ((b->s + b->b0) * a->Hq + h) * a->D, (int)(a->Hq * a->D),
                a->k + ((b->s + b->k0) * a->Hkv + hk) * a->D, (int)(a->Hkv * a->D), 0.0f, S, (int)b->lk);
    if (!(a->cap > 0)) return;
    for (int64_t r = 0; r < b->nq; r++) {
        int64_t c0, c1;
        visible(a, b, r, &c0, &c1);
        float *row = S + r * b->lk, *cr = caps ? caps + r * b->lk : NULL;
        for (int64_t j = c0; j < c1; j++) {
            float t = tanhf(row[j] / a->cap);
            row[j] = a->cap * t;
            if (cr) cr[j] = 1.0f - t * t;
        }
    }
}

/* Zeroes row's columns outside [c0, c1). */
static inline void mask_row(float *row, int64_t lk, int64_t c0, int64_t c1) {
    memset(row, 0, (size_t)c0 * sizeof *row);
    memset(row + c1, 0, (size_t)(lk - c1) * sizeof *row);
}

/* Softmax of each row over its visible keys, zeros elsewhere; lse (may be NULL)
 * gets each row's log-sum-exp. */
static void block_softmax(const attn_shape *a, const blk *b, float *S, float *lse) {
    for (int64_t r = 0; r < b->nq; r++) {
        float *row = S + r * b->lk;
        int64_t c0, c1;
        visible(a, b, r, &c0, &c1);
        float m = -INFINITY;
        for (int64_t j = c0; j < c1; j++) m = row[j] > m ? row[j] : m;
        float sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = c0; j < c1; j++) {
            row[j] = cpu_expf(row[j] - m);
            sum += row[j];
        }
        float inv = 1.0f / sum;
        for (int64_t j = c0; j < c1; j++) row[j] *= inv;
        mask_row(row, b->lk, c0, c1);
        if (lse) lse[r] = m + logf(sum);
    }
}

/* Probabilities from a saved lse: P = exp(S - lse), zeros outside the visible keys. */
static void block_probs(const attn_shape *a, const blk *b, float *S, const float *lse, int64_t lse_stride) {
    for (int64_t r = 0; r < b->nq; r++) {
        float *row = S + r * b->lk, l = lse[r * lse_stride];
        int64_t c0, c1;
        visible(a, b, r, &c0, &c1);
#pragma omp simd
        for (int64_t j = c0; j < c1; j++) row[j] = cpu_expf(row[j] - l);
        mask_row(row, b->lk, c0, c1);
    }
}

typedef void (*block_fn)(const cpu_call *c, const attn_shape *a, const blk *b, int64_t h, float *S, float *S2,
                         float *S3);

typedef struct {
    const cpu_call *c;
    const attn_shape *a;
    block_fn fn;
    float *S;    /* a->mats QB longest floats per thread */
    int by_kv;   /* a task is a (segment, key/value head) and walks the heads of its group */
} attn_job;

/* Tasks [t0, t1): each a (segment, head) whose query blocks run in order, or with by_kv a (segment,
 * key/value head) whose query heads run in order, then each head's blocks — the order a serial walk
 * of heads and blocks has, so dK and dV add their terms in the same order whatever the threads. */
static void attn_tasks(void *arg, int64_t t0, int64_t t1) {
    const attn_job *j = arg;
    const attn_shape *a = j->a;
    int64_t per = a->mats * QB * a->longest, heads = j->by_kv ? a->Hkv : a->Hq;
    float *S = j->S + (int64_t)cpu_thread_index() * per;
    float *S2 = a->mats > 1 ? S + QB * a->longest : NULL, *S3 = a->mats > 2 ? S2 + QB * a->longest : NULL;
    for (int64_t t = t0; t < t1; t++) {
        int64_t s = a->starts[t / heads], len = a->starts[t / heads + 1] - s, hh = t % heads;
        int64_t h0 = j->by_kv ? hh * a->group : hh, h1 = j->by_kv ? h0 + a->group : hh + 1;
        for (int64_t h = h0; h < h1; h++)
            for (int64_t b0 = 0; b0 < len; b0 += QB) {
                blk b = {.s = s, .b0 = b0, .nq = len - b0 < QB ? len - b0 : QB, .k0 = first_key(a, b0)};
                b.lk = b0 + b.nq - b.k0;
                j->fn(j->c, a, &b, h, S, S2, S3);
            }
    }
}

/* Calls fn for every (segment, query head, query block), the (segment, head) pairs spread over the
 * pool's threads, each product on one BLAS thread; S: shape_of's scratch. Every output row is
 * written by one task, so the bits do not depend on the thread count. */
static twk_status for_blocks(const cpu_call *c, const attn_shape *a, block_fn fn, float *S, int by_kv) {
    attn_job j = {.c = c, .a = a, .fn = fn, .S = S, .by_kv = by_kv};
    cpu_blas_threads(c->ctx, 1, 1, 1);
    cpu_parallel_for(c->ctx->pool, a->nseg * (by_kv ? a->Hkv : a->Hq), 1, attn_tasks, &j);
    return TWK_OK;
}

static void fwd_block(const cpu_call *c, const attn_shape *a, const blk *b, int64_t h, float *S, float *S2, float *S3) {
    (void)S2;
    (void)S3;
    int64_t hk = h / a->group;
    block_scores(a, b, h, S, NULL);
    block_softmax(a, b, S, NULL);
    float *o = c->dst.data;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)b->nq, (int)a->D, (int)b->lk, 1.0f, S, (int)b->lk,
                a->v + ((b->s + b->k0) * a->Hkv + hk) * a->D, (int)(a->Hkv * a->D), 0.0f,
                o + ((b->s + b->b0) * a->Hq + h) * a->D, (int)(a->Hq * a->D));
}

twk_status cpu_attn(const cpu_call *c) {
    attn_shape a;
    float *S;
    twk_status st = shape_of(&a, c, 3, 1, &S);
    return st != TWK_OK ? st : for_blocks(c, &a, fwd_block, S, 0);
}

static void lse_block(const cpu_call *c, const attn_shape *a, const blk *b, int64_t h, float *S, float *S2, float *S3) {
    (void)S3;
    block_scores(a, b, h, S, NULL);
    block_softmax(a, b, S, S2);
    float *lse = c->dst.data;
    for (int64_t r = 0; r < b->nq; r++) lse[(b->s + b->b0 + r) * a->Hq + h] = S2[r];
}

twk_status cpu_attn_lse(const cpu_call *c) {
    attn_shape a;
    float *S;
    twk_status st = shape_of(&a, c, 2, 2, &S); /* S2: the block's lse */
    return st != TWK_OK ? st : for_blocks(c, &a, lse_block, S, 0);
}

/* Backward (src: q, k, v, seg, o, dO, lse). For a block: P from lse; for dq
 * and dk also dS = P * (dO.V^T - rowsum(dO * O)) * (1 - tanh^2 with a cap) * scale. */
static void back_block(const cpu_call *c, const attn_shape *a, const blk *b, int64_t h, float *S, float *S2,
                       float *S3) {
    int which = c->l->ip[0];
    int64_t lk = b->lk, nq = b->nq, hk = h / a->group, ldq = a->Hq * a->D, ldk = a->Hkv * a->D;
    const float *o = c->src[4].data, *dO = c->src[5].data, *lse = c->src[6].data;
    const float *dO_blk = dO + ((b->s + b->b0) * a->Hq + h) * a->D;
    const float *keys = a->k + ((b->s + b->k0) * a->Hkv + hk) * a->D, *vals = a->v + ((b->s + b->k0) * a->Hkv + hk) * a->D;
    float *out = c->dst.data, *kout = out + ((b->s + b->k0) * a->Hkv + hk) * a->D;
    block_scores(a, b, h, S, S3);
    block_probs(a, b, S, lse + (b->s + b->b0) * a->Hq + h, a->Hq);
    if (which == 2) { /* dV[keys] += P^T dO */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)lk, (int)a->D, (int)nq, 1.0f, S, (int)lk, dO_blk,
                    (int)ldq, 1.0f, kout, (int)ldk);
        return;
    }
    /* dP = dO V^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)lk, (int)a->D, 1.0f, dO_blk, (int)ldq, vals,
                (int)ldk, 0.0f, S2, (int)lk);
    for (int64_t r = 0; r < nq; r++) {
        int64_t i = (b->s + b->b0 + r) * a->Hq + h, c0, c1;
        float delta = dot(dO + i * a->D, o + i * a->D, a->D);
        float *p = S + r * lk, *dp = S2 + r * lk;
        visible(a, b, r, &c0, &c1);
        if (a->cap > 0) {
            const float *cd = S3 + r * lk;
#pragma omp simd
            for (int64_t j = c0; j < c1; j++) p[j] = p[j] * (dp[j] - delta) * cd[j] * a->scale; /* dS */
        } else {
#pragma omp simd
            for (int64_t j = c0; j < c1; j++) p[j] = p[j] * (dp[j] - delta) * a->scale; /* dS */
        }
    }
    if (which == 0) /* dQ = dS K */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nq, (int)a->D, (int)lk, 1.0f, S, (int)lk, keys,
                    (int)ldk, 0.0f, out + ((b->s + b->b0) * a->Hq + h) * a->D, (int)ldq);
    else /* dK[keys] += dS^T Q */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)lk, (int)a->D, (int)nq, 1.0f, S, (int)lk,
                    a->q + ((b->s + b->b0) * a->Hq + h) * a->D, (int)ldq, 1.0f, kout, (int)ldk);
}

twk_status cpu_attn_back(const cpu_call *c) {
    attn_shape a;
    float *S;
    twk_status st = shape_of(&a, c, 3, c->l->fp[1] > 0 ? 3 : 2, &S); /* S2: dP; S3: the cap's derivative */
    if (st != TWK_OK) return st;
    if (c->l->ip[0] != 0) memset(c->dst.data, 0, (size_t)c->dst.nelem * twk_dtype_size(c->dst.type)); /* dK, dV accumulate */
    return for_blocks(c, &a, back_block, S, c->l->ip[0] != 0); /* dK, dV: a task owns its rows */
}
