/* Causal attention over packed segments with grouped-query heads, and its
 * gradient. Token i attends to keys j with seg_start[i] <= j <= i. The
 * backward pass recomputes probabilities from the saved log-sum-exp. */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"

static inline float dot(const float *a, const float *b, int64_t n) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Segments must be contiguous runs: seg[0] = 0 and each seg[i] is either the
 * previous token's start or i itself. */
static twk_status check_segments(const cpu_call *c, const cpu_tensor *seg) {
    int64_t prev = 0;
    for (int64_t i = 0; i < seg->nelem; i++) {
        int64_t s = cpu_id_at(seg, i);
        if (s < 0 || s > i || (s != prev && s != i))
            return twk_error(TWK_ERR_RANGE,
                             "%s '%s': seg_start[%lld] = %lld is not a segment start (want %lld or %lld)",
                             twk_op_name(c->l->op), c->l->name, (long long)i, (long long)s,
                             (long long)prev, (long long)i);
        prev = s;
    }
    return TWK_OK;
}

typedef struct {
    const cpu_call *c;
    int64_t T, Hq, Hkv, D, group;
    float scale;
    float *scratch; /* per thread: T floats (forward) */
    float *delta;   /* [T, Hq] for the key/value gradients */
} attn_job;

static void init_job(attn_job *j, const cpu_call *c) {
    memset(j, 0, sizeof *j);
    j->c = c;
    j->T = c->src[0].ne[0];
    j->Hq = c->src[0].ne[1];
    j->D = c->src[0].ne[2];
    j->Hkv = c->src[1].ne[1];
    j->group = j->Hq / j->Hkv;
    j->scale = c->l->fp[0];
}

/* scores of query (i, h) against keys [s, i] into sc; returns the max. */
static float scores(const attn_job *j, const float *q, const float *k, int64_t i, int64_t h,
                    int64_t s, float *sc) {
    const float *qi = q + (i * j->Hq + h) * j->D;
    int64_t hk = h / j->group;
    float m = -INFINITY;
    for (int64_t t = s; t <= i; t++) {
        float v = j->scale * dot(qi, k + (t * j->Hkv + hk) * j->D, j->D);
        sc[t - s] = v;
        m = v > m ? v : m;
    }
    return m;
}

static void attn_rows(void *arg, int64_t it0, int64_t it1) {
    const attn_job *j = arg;
    const cpu_call *c = j->c;
    const float *q = c->src[0].data, *k = c->src[1].data, *v = c->src[2].data;
    float *o = c->dst.data;
    float *sc = j->scratch + (int64_t)cpu_thread_index() * j->T;
    for (int64_t it = it0; it < it1; it++) {
        int64_t i = it / j->Hq, h = it % j->Hq, hk = h / j->group;
        int64_t s = cpu_id_at(&c->src[3], i);
        float m = scores(j, q, k, i, h, s, sc);
        float sum = 0;
        for (int64_t t = 0; t <= i - s; t++) {
            sc[t] = expf(sc[t] - m);
            sum += sc[t];
        }
        float inv = 1.0f / sum;
        float *oi = o + (i * j->Hq + h) * j->D;
        memset(oi, 0, (size_t)j->D * sizeof(float));
        for (int64_t t = s; t <= i; t++) {
            const float *vt = v + (t * j->Hkv + hk) * j->D;
            float p = sc[t - s] * inv;
#pragma omp simd
            for (int64_t d = 0; d < j->D; d++) oi[d] += p * vt[d];
        }
    }
}

static int64_t grain_rows(const attn_job *j) {
    int64_t per = j->T * j->D / 2 + 1; /* average work of one query row */
    return CPU_GRAIN_ELEMS / per + 1;
}

twk_status cpu_attn(const cpu_call *c) {
    twk_status st = check_segments(c, &c->src[3]);
    if (st != TWK_OK) return st;
    attn_job j;
    init_job(&j, c);
    j.scratch = cpu_scratch(c->ctx, (size_t)(c->ctx->n_threads * j.T) * sizeof(float));
    if (!j.scratch) return TWK_ERR_OOM;
    cpu_parallel_for(c->ctx->pool, j.T * j.Hq, grain_rows(&j), attn_rows, &j);
    return TWK_OK;
}

static void lse_rows(void *arg, int64_t it0, int64_t it1) {
    const attn_job *j = arg;
    const cpu_call *c = j->c;
    const float *q = c->src[0].data, *k = c->src[1].data;
    float *lse = c->dst.data;
    float *sc = j->scratch + (int64_t)cpu_thread_index() * j->T;
    for (int64_t it = it0; it < it1; it++) {
        int64_t i = it / j->Hq, h = it % j->Hq;
        int64_t s = cpu_id_at(&c->src[2], i);
        float m = scores(j, q, k, i, h, s, sc);
        float sum = 0;
        for (int64_t t = 0; t <= i - s; t++) sum += expf(sc[t] - m);
        lse[it] = m + logf(sum);
    }
}

twk_status cpu_attn_lse(const cpu_call *c) {
    twk_status st = check_segments(c, &c->src[2]);
    if (st != TWK_OK) return st;
    attn_job j;
    init_job(&j, c);
    j.scratch = cpu_scratch(c->ctx, (size_t)(c->ctx->n_threads * j.T) * sizeof(float));
    if (!j.scratch) return TWK_ERR_OOM;
    cpu_parallel_for(c->ctx->pool, j.T * j.Hq, grain_rows(&j), lse_rows, &j);
    return TWK_OK;
}

/* src: q, k, v, seg, o, dO, lse */
static void dq_rows(void *arg, int64_t it0, int64_t it1) {
    const attn_job *j = arg;
    const cpu_call *c = j->c;
    const float *q = c->src[0].data, *k = c->src[1].data, *v = c->src[2].data;
    const float *o = c->src[4].data, *dO = c->src[5].data, *lse = c->src[6].data;
    float *dq = c->dst.data;
    int64_t D = j->D;
    for (int64_t it = it0; it < it1; it++) {
        int64_t i = it / j->Hq, h = it % j->Hq, hk = h / j->group;
        int64_t s = cpu_id_at(&c->src[3], i);
        const float *qi = q + it * D, *doi = dO + it * D;
        float delta = dot(doi, o + it * D, D);
        float *g = dq + it * D;
        memset(g, 0, (size_t)D * sizeof(float));
        for (int64_t t = s; t <= i; t++) {
            const float *kt = k + (t * j->Hkv + hk) * D, *vt = v + (t * j->Hkv + hk) * D;
            float p = expf(j->scale * dot(qi, kt, D) - lse[it]);
            float ds = p * (dot(doi, vt, D) - delta) * j->scale;
#pragma omp simd
            for (int64_t d = 0; d < D; d++) g[d] += ds * kt[d];
        }
    }
}

static void delta_rows(void *arg, int64_t it0, int64_t it1) {
    const attn_job *j = arg;
    const float *o = j->c->src[4].data, *dO = j->c->src[5].data;
    for (int64_t it = it0; it < it1; it++) j->delta[it] = dot(dO + it * j->D, o + it * j->D, j->D);
}

static void dkv_rows(void *arg, int64_t it0, int64_t it1) {
    const attn_job *j = arg;
    const cpu_call *c = j->c;
    const float *q = c->src[0].data, *k = c->src[1].data, *v = c->src[2].data;
    const float *dO = c->src[5].data, *lse = c->src[6].data;
    const cpu_tensor *seg = &c->src[3];
    int want_k = c->l->ip[0] == 1;
    float *out = c->dst.data;
    int64_t D = j->D;
    for (int64_t it = it0; it < it1; it++) {
        int64_t t = it / j->Hkv, hk = it % j->Hkv;
        const float *kt = k + it * D, *vt = v + it * D;
        float *g = out + it * D;
        memset(g, 0, (size_t)D * sizeof(float));
        for (int64_t h = hk * j->group; h < (hk + 1) * j->group; h++) {
            for (int64_t i = t; i < j->T && cpu_id_at(seg, i) <= t; i++) {
                int64_t qi_ = i * j->Hq + h;
                const float *qi = q + qi_ * D, *doi = dO + qi_ * D;
                float p = expf(j->scale * dot(qi, kt, D) - lse[qi_]);
                if (want_k) {
                    float ds = p * (dot(doi, vt, D) - j->delta[qi_]) * j->scale;
#pragma omp simd
                    for (int64_t d = 0; d < D; d++) g[d] += ds * qi[d];
                } else {
#pragma omp simd
                    for (int64_t d = 0; d < D; d++) g[d] += p * doi[d];
                }
            }
        }
    }
}

twk_status cpu_attn_back(const cpu_call *c) {
    twk_status st = check_segments(c, &c->src[3]);
    if (st != TWK_OK) return st;
    attn_job j;
    init_job(&j, c);
    int which = c->l->ip[0];
    if (which == 0) {
        cpu_parallel_for(c->ctx->pool, j.T * j.Hq, grain_rows(&j), dq_rows, &j);
        return TWK_OK;
    }
    if (which == 1) {
        j.delta = cpu_scratch(c->ctx, (size_t)(j.T * j.Hq) * sizeof(float));
        if (!j.delta) return TWK_ERR_OOM;
        cpu_parallel_for(c->ctx->pool, j.T * j.Hq, CPU_GRAIN_ELEMS / j.D + 1, delta_rows, &j);
    }
    cpu_parallel_for(c->ctx->pool, j.T * j.Hkv, grain_rows(&j) / j.group + 1, dkv_rows, &j);
    return TWK_OK;
}
