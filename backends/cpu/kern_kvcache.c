/* Decoding with a KV cache: writing new keys/values into cache rows, and
 * attention of each query over its own range of cache rows [lo, hi) — with a
 * sliding window W (ip[1] > 0) its last W rows — scores scale * q.k
 * soft-capped to cap * tanh(s / cap) where fp[1] = cap > 0. */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"
#include "cpu_math.h"

twk_status cpu_kv_write(const cpu_call *c) {
    const cpu_tensor *x = &c->src[1], *rows = &c->src[2];
    unsigned char *cache = c->dst.data; /* the cache itself (f32, bf16 or f16): written in place */
    size_t es = twk_dtype_size(c->dst.type);
    int64_t row = x->ne[1] * x->ne[2];
    for (int64_t t = 0; t < x->ne[0]; t++) {
        int64_t r = cpu_id_at(rows, t); /* checked before the launch (cpu_backend.c) */
        twk_dtype_from_f32(c->dst.type, (const float *)x->data + t * row, cache + (size_t)(r * row) * es, row);
    }
    return TWK_OK;
}

typedef struct {
    const cpu_call *c;
    int64_t Hq, Hkv, D, group;
    float *scratch; /* per thread: R floats */
    int64_t R;
} cache_job;

/* D floats of cache t from element off: in place for f32, else widened into buf. */
static const float *cache_row(const cpu_tensor *t, int64_t off, int64_t D, float *buf) {
    if (t->type == TWK_F32) return (const float *)t->data + off;
    twk_dtype_to_f32(t->type, (const unsigned char *)t->data + 2 * off, buf, D);
    return buf;
}

static void attn_cache_rows(void *arg, int64_t it0, int64_t it1) {
    const cache_job *j = arg;
    const cpu_call *c = j->c;
    const float *q = c->src[0].data;
    float *o = c->dst.data, scale = c->l->fp[0], cap = c->l->fp[1];
    int64_t window = c->l->ip[1] > 0 ? c->l->ip[1] : 0; /* the last `window` rows before hi */
    int64_t D = j->D;
    float *sc = j->scratch + (int64_t)cpu_thread_index() * (j->R + D);
    float *wide = sc + j->R; /* a bf16 / f16 cache row widened */
    for (int64_t it = it0; it < it1; it++) {
        int64_t t = it / j->Hq, h = it % j->Hq, hk = h / j->group;
        int64_t lo = cpu_id_at(&c->src[3], t), hi = cpu_id_at(&c->src[4], t);
        if (window && hi - window > lo) lo = hi - window;
        const float *qi = q + it * D;
        float m = -INFINITY;
        for (int64_t r = lo; r < hi; r++) {
            const float *kr = cache_row(&c->src[1], (r * j->Hkv + hk) * D, D, wide);
            float s = 0;
#pragma omp simd reduction(+ : s)
            for (int64_t d = 0; d < D; d++) s += qi[d] * kr[d];
            s *= scale;
            if (cap > 0) s = cap * tanhf(s / cap);
            sc[r - lo] = s;
            m = s > m ? s : m;
        }
        float sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t r = 0; r < hi - lo; r++) {
            sc[r] = cpu_expf(sc[r] - m);
            sum += sc[r];
        }
        float *oi = o + it * D, inv = 1.0f / sum;
        memset(oi, 0, (size_t)D * sizeof *oi);
        for (int64_t r = lo; r < hi; r++) {
            const float *vr = cache_row(&c->src[2], (r * j->Hkv + hk) * D, D, wide);
            float p = sc[r - lo] * inv;
#pragma omp simd
            for (int64_t d = 0; d < D; d++) oi[d] += p * vr[d];
        }
    }
}

twk_status cpu_attn_cache(const cpu_call *c) {
    cache_job j = {.c = c, .Hq = c->src[0].ne[1], .Hkv = c->src[1].ne[1], .D = c->src[0].ne[2], .R = c->src[1].ne[0]};
    j.group = j.Hq / j.Hkv;
    int64_t T = c->src[0].ne[0];
    j.scratch = cpu_scratch(c->ctx, (size_t)(c->ctx->n_threads * (j.R + j.D)) * sizeof *j.scratch);
    if (!j.scratch) return TWK_ERR_OOM;
    int64_t per = j.R * j.D + 1;
    cpu_parallel_for(c->ctx->pool, T * j.Hq, CPU_GRAIN_ELEMS / per + 1, attn_cache_rows, &j);
    return TWK_OK;
}
