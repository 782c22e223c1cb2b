/* The LoRA terms of several adapters in one batch: lora_gather y[t] = w[slot[t]] x[t] and its
 * weight gradient lora_gather_back dw[s] = sum over the tokens of slot s of dy[t] x[t]^T.
 *
 * Every output element is one sum in order (over k forward, over the slot's tokens in token
 * order backward), starting from 0, with no split accumulators — so a slot padded with zeros past
 * a smaller rank gives bit-identical results, and a token's row never depends on the other tokens
 * of the batch (packed passes, train/lora_pack.c, rely on both). The loops run over the output
 * row n innermost, where no sum is reordered, so they vectorize. */
#include <string.h>

#include "cpu_internal.h"

#define GATHER_NB 16 /* output columns in one block of registers (the transposed weights padded to it) */
#define GATHER_NB_NARROW 8 /* ... where N <= 8 (rank-8 adapters' A products, and their dX): no half-empty blocks */
#define GATHER_TB 4  /* tokens side by side: independent sums, so the adds do not wait on each other */

typedef struct {
    const cpu_call *c;
    const int32_t *idx; /* slot -> its transposed copy in wt, -1 for a slot no token uses */
    const float *wt;    /* per used slot w[s] transposed and padded with zero columns: [K, np] */
    int64_t np;         /* N rounded up to the block: GATHER_NB, or GATHER_NB_NARROW */
} gather_job;

/* Tokens [t, t + nt), nt <= GATHER_TB: y[t, n] = sum over k in order of w[slot[t], n, k] x[t, k],
 * NB output columns at a time (a constant where it is inlined, so the sums stay in registers). */
static inline __attribute__((always_inline)) void gather_tokens_nb(const gather_job *j, int64_t t, int nt, const int NB) {
    const cpu_call *c = j->c;
    int64_t K = c->src[0].ne[1], N = c->dst.ne[1], np = j->np;
    const float *w[GATHER_TB], *x[GATHER_TB];
    for (int u = 0; u < GATHER_TB; u++) { /* missing tokens repeat the last one, their sums unused */
        int64_t tu = t + (u < nt ? u : nt - 1);
        w[u] = j->wt + (int64_t)j->idx[cpu_id_at(&c->src[2], tu)] * K * np;
        x[u] = (const float *)c->src[0].data + tu * K;
    }
    float *y = c->dst.data;
    for (int64_t n0 = 0; n0 < N; n0 += NB) {
        float a0[GATHER_NB], a1[GATHER_NB], a2[GATHER_NB], a3[GATHER_NB]; /* GATHER_TB of them, in registers */
        for (int i = 0; i < NB; i++) a0[i] = a1[i] = a2[i] = a3[i] = 0;
        for (int64_t k = 0; k < K; k++) {
            const float *p0 = w[0] + k * np + n0, *p1 = w[1] + k * np + n0, *p2 = w[2] + k * np + n0,
                        *p3 = w[3] + k * np + n0;
            float x0 = x[0][k], x1 = x[1][k], x2 = x[2][k], x3 = x[3][k];
#pragma omp simd
            for (int i = 0; i < NB; i++) a0[i] += p0[i] * x0;
#pragma omp simd
            for (int i = 0; i < NB; i++) a1[i] += p1[i] * x1;
#pragma omp simd
            for (int i = 0; i < NB; i++) a2[i] += p2[i] * x2;
#pragma omp simd
            for (int i = 0; i < NB; i++) a3[i] += p3[i] * x3;
        }
        int64_t nb = N - n0 < NB ? N - n0 : NB;
        float *acc[GATHER_TB] = {a0, a1, a2, a3};
        for (int u = 0; u < nt; u++) {
            float *yr = y + (t + u) * N + n0;
            if (nb == NB) /* a whole block: a fixed-size copy (memcpy of a run-time size took a fifth of the time) */
                for (int i = 0; i < NB; i++) yr[i] = acc[u][i];
            else
                memcpy(yr, acc[u], (size_t)nb * sizeof(float));
        }
    }
}

static void gather_rows(void *arg, int64_t b0, int64_t b1) {
    const gather_job *j = arg;
    int64_t T = j->c->src[0].ne[0];
    for (int64_t b = b0; b < b1; b++) {
        int64_t t = b * GATHER_TB;
        int nt = T - t < GATHER_TB ? (int)(T - t) : GATHER_TB;
        if (j->np == GATHER_NB_NARROW) gather_tokens_nb(j, t, nt, GATHER_NB_NARROW);
        else gather_tokens_nb(j, t, nt, GATHER_NB);
    }
}

/* The used slots' weights transposed (and padded to np columns) into scratch, and the slot map;
 * NULL on OOM. w [S, N, K] (or [S, K, N] with iparam 0: the transposed product), f32 or 16-bit
 * (widened here). */
static float *gather_prepare(const cpu_call *c, int64_t np, int32_t **idx_out) {
    int trans = c->l->ip[0] != 0;
    int64_t T = c->src[0].ne[0], S = c->src[1].ne[0], N = c->dst.ne[1], K = c->src[0].ne[1];
    int32_t *idx = twk_host_alloc((size_t)S * sizeof *idx, "lora_gather slots");
    if (!idx) return NULL;
    for (int64_t s = 0; s < S; s++) idx[s] = -1;
    int32_t used = 0;
    for (int64_t t = 0; t < T; t++) { /* ids checked before the launch (cpu_backend.c) */
        int64_t s = cpu_id_at(&c->src[2], t);
        if (idx[s] < 0) idx[s] = used++;
    }
    int half = c->src[1].type != TWK_F32;
    float *wide = half ? twk_host_alloc((size_t)(N * K) * sizeof *wide, "lora_gather widened slot") : NULL;
    float *wt = half && !wide ? NULL : cpu_scratch(c->ctx, (size_t)(used ? used : 1) * (size_t)(np * K) * sizeof *wt);
    if (!wt) {
        twk_host_free(wide);
        twk_host_free(idx);
        return NULL;
    }
    size_t es = twk_dtype_size(c->src[1].type);
    for (int64_t s = 0; s < S; s++) {
        if (idx[s] < 0) continue;
        const float *ws = (const float *)c->src[1].data + s * N * K;
        if (half) {
            twk_dtype_to_f32(c->src[1].type, (const unsigned char *)c->src[1].data + (size_t)(s * N * K) * es, wide, N * K);
            ws = wide;
        }
        float *d = wt + (int64_t)idx[s] * np * K;
        for (int64_t k = 0; k < K; k++) {
            for (int64_t n = 0; n < N; n++) d[k * np + n] = trans ? ws[k * N + n] : ws[n * K + k];
            for (int64_t n = N; n < np; n++) d[k * np + n] = 0;
        }
    }
    twk_host_free(wide);
    *idx_out = idx;
    return wt;
}

twk_status cpu_lora_gather(const cpu_call *c) {
    if (c->l->ip[1]) return cpu_lora_gather_grouped(c); /* rows grouped by expert: kern_grouped.c */
    int64_t T = c->src[0].ne[0], N = c->dst.ne[1];
    int64_t np = N <= GATHER_NB_NARROW ? GATHER_NB_NARROW : (N + GATHER_NB - 1) / GATHER_NB * GATHER_NB;
    int32_t *idx = NULL;
    const float *wt = gather_prepare(c, np, &idx);
    if (!wt) return TWK_ERR_OOM;
    gather_job j = {c, idx, wt, np};
    int64_t per = GATHER_TB * np * c->src[0].ne[1] + 1;
    cpu_parallel_for(c->ctx->pool, (T + GATHER_TB - 1) / GATHER_TB, CPU_GRAIN_ELEMS / per + 1, gather_rows, &j);
    twk_host_free(idx);
    return TWK_OK;
}

/* The weight gradient vectorises along the larger of its two dims (in: A's gradient [r, in];
 * out: B's [out, r]), 16 lanes, with 4 entries of the other dim side by side. */
#define BACK_LANES 16
#define BACK_SIDE 4
#define BACK_ITEM 64 /* entries of the long dim per work item */

typedef struct {
    const cpu_call *c;
    int64_t *order, *start; /* the tokens of each slot in token order: order[start[s] .. start[s + 1]) */
    int64_t *used;          /* the slots with tokens, ascending (the others are zeros, written before) */
    const float *v, *g;     /* per token t: v + t * ldv (along the long dim), g + t * ldg (the short one) */
    int64_t ldv, ldg, nlong, nshort, os, ol; /* out(short a, long b) = dw[s] + a * os + b * ol */
    int64_t blocks;                          /* work items per slot */
} gather_back_job;

/* dw[s] at long entries [b0, b1), every short one: each element one sum over the slot's tokens in
 * token order, from 0. */
static void back_item(const gather_back_job *j, int64_t s, int64_t b0, int64_t b1) {
    float *dw = (float *)j->c->dst.data + s * j->nlong * j->nshort;
    const int64_t *tok = j->order + j->start[s], nt = j->start[s + 1] - j->start[s];
    for (int64_t a0 = 0; a0 < j->nshort; a0 += BACK_SIDE) {
        int64_t na = j->nshort - a0 < BACK_SIDE ? j->nshort - a0 : BACK_SIDE;
        for (int64_t bb = b0; bb < b1; bb += BACK_LANES) {
            int64_t nb = b1 - bb < BACK_LANES ? b1 - bb : BACK_LANES;
            if (na == BACK_SIDE && nb == BACK_LANES) {
                float c0[BACK_LANES], c1[BACK_LANES], c2[BACK_LANES], c3[BACK_LANES]; /* BACK_SIDE of them */
                for (int i = 0; i < BACK_LANES; i++) c0[i] = c1[i] = c2[i] = c3[i] = 0;
                for (int64_t p = 0; p < nt; p++) {
                    const float *v = j->v + tok[p] * j->ldv + bb, *g = j->g + tok[p] * j->ldg + a0;
                    float g0 = g[0], g1 = g[1], g2 = g[2], g3 = g[3];
#pragma omp simd
                    for (int i = 0; i < BACK_LANES; i++) c0[i] += g0 * v[i];
#pragma omp simd
                    for (int i = 0; i < BACK_LANES; i++) c1[i] += g1 * v[i];
#pragma omp simd
                    for (int i = 0; i < BACK_LANES; i++) c2[i] += g2 * v[i];
#pragma omp simd
                    for (int i = 0; i < BACK_LANES; i++) c3[i] += g3 * v[i];
                }
                const float *c[BACK_SIDE] = {c0, c1, c2, c3};
                for (int u = 0; u < BACK_SIDE; u++)
                    for (int i = 0; i < BACK_LANES; i++) dw[(a0 + u) * j->os + (bb + i) * j->ol] = c[u][i];
                continue;
            }
            for (int64_t u = 0; u < na; u++) /* the edges: the same sums, one at a time */
                for (int64_t i = 0; i < nb; i++) {
                    float acc = 0;
                    for (int64_t p = 0; p < nt; p++) acc += j->g[tok[p] * j->ldg + a0 + u] * j->v[tok[p] * j->ldv + bb + i];
                    dw[(a0 + u) * j->os + (bb + i) * j->ol] = acc;
                }
        }
    }
}

static void gather_back_rows(void *arg, int64_t i0, int64_t i1) {
    const gather_back_job *j = arg;
    for (int64_t i = i0; i < i1; i++) {
        int64_t b0 = i % j->blocks * BACK_ITEM;
        back_item(j, j->used[i / j->blocks], b0, b0 + BACK_ITEM < j->nlong ? b0 + BACK_ITEM : j->nlong);
    }
}

twk_status cpu_lora_gather_back(const cpu_call *c) {
    int64_t T = c->src[0].ne[0], S = c->dst.ne[0], N = c->src[1].ne[1], K = c->src[0].ne[1];
    int64_t *buf = cpu_scratch(c->ctx, (size_t)(T + 3 * S + 2) * sizeof *buf);
    if (!buf) return TWK_ERR_OOM;
    gather_back_job j = {.c = c, .order = buf, .start = buf + T, .used = buf + T + 2 * S + 2};
    int64_t *fill = buf + T + S + 1;
    memset(j.start, 0, (size_t)(S + 1) * sizeof *j.start);
    for (int64_t t = 0; t < T; t++) j.start[cpu_id_at(&c->src[2], t) + 1]++; /* ids checked before the launch */
    for (int64_t s = 0; s < S; s++) j.start[s + 1] += j.start[s];
    memcpy(fill, j.start, (size_t)(S + 1) * sizeof *fill);
    for (int64_t t = 0; t < T; t++) j.order[fill[cpu_id_at(&c->src[2], t)]++] = t;
    const float *x = c->src[0].data, *dy = c->src[1].data; /* dw[s, n, k]: n of dy, k of x */
    if (K >= N) { /* long dim k: x along it, dy broadcast */
        j.v = x, j.ldv = K, j.g = dy, j.ldg = N, j.nlong = K, j.nshort = N, j.os = K, j.ol = 1;
    } else {
        j.v = dy, j.ldv = N, j.g = x, j.ldg = K, j.nlong = N, j.nshort = K, j.os = 1, j.ol = K;
    }
    j.blocks = (j.nlong + BACK_ITEM - 1) / BACK_ITEM;
    int64_t n_used = 0, slab = N * K;
    for (int64_t s = 0; s < S; s++) { /* a slot no token names: zeros, one contiguous fill (a packed pass's idle slots) */
        if (j.start[s + 1] > j.start[s]) j.used[n_used++] = s;
        else memset((float *)c->dst.data + s * slab, 0, (size_t)slab * sizeof(float));
    }
    if (!n_used) return TWK_OK;
    int64_t per = (T / n_used + 1) * BACK_ITEM * j.nshort + 1;
    cpu_parallel_for(c->ctx->pool, n_used * j.blocks, CPU_GRAIN_ELEMS / per + 1, gather_back_rows, &j);
    return TWK_OK;
}
