/* Transformer kernels: embedding gather, RMSNorm, RoPE (and the two as one launch, RMSNORM_ROPE),
 * and their gradients. Ids were checked before the launch (cpu_backend.c). */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "cpu_internal.h"
#include "cpu_math.h"

/* ---- get_rows ---- */

typedef struct {
    const cpu_call *c;
} job;

static void get_rows_range(void *arg, int64_t r0, int64_t r1) {
    const cpu_call *c = ((job *)arg)->c;
    const unsigned char *tab = c->src[0].data; /* f32, bf16 or f16 rows, widened to f32 */
    twk_dtype tt = c->src[0].type;
    size_t es = twk_dtype_size(tt);
    float *y = c->dst.data;
    int64_t D = c->dst.ne[1];
    for (int64_t r = r0; r < r1; r++) twk_dtype_to_f32(tt, tab + (size_t)(cpu_id_at(&c->src[1], r) * D) * es, y + r * D, D);
}

twk_status cpu_get_rows(const cpu_call *c) {
    job j = {c};
    cpu_parallel_for(c->ctx->pool, c->dst.ne[0], CPU_GRAIN_ELEMS / c->dst.ne[1] + 1, get_rows_range, &j);
    return TWK_OK;
}

/* Columns are split across threads; every thread walks all tokens in order,
 * so repeated ids accumulate deterministically without races. */
static void get_rows_back_cols(void *arg, int64_t d0, int64_t d1) {
    const cpu_call *c = ((job *)arg)->c;
    const float *dy = c->src[0].data;
    float *g = c->dst.data;
    int64_t T = c->src[0].ne[0], D = c->dst.ne[1], V = c->dst.ne[0];
    for (int64_t v = 0; v < V; v++) memset(g + v * D + d0, 0, (size_t)(d1 - d0) * sizeof *g);
    for (int64_t t = 0; t < T; t++) {
        float *row = g + cpu_id_at(&c->src[1], t) * D;
        const float *dr = dy + t * D;
        for (int64_t d = d0; d < d1; d++) row[d] += dr[d];
    }
}

twk_status cpu_get_rows_back(const cpu_call *c) {
    job j = {c};
    int64_t D = c->dst.ne[1];
    int64_t grain = D / (4 * c->ctx->n_threads) + 1;
    if (c->dst.nelem < CPU_GRAIN_ELEMS) grain = D;
    cpu_parallel_for(c->ctx->pool, D, grain, get_rows_back_cols, &j);
    return TWK_OK;
}

/* ---- rmsnorm ---- */

static inline float row_rstd(const float *x, int64_t D, float eps) {
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < D; i++) ss += x[i] * x[i];
    return 1.0f / sqrtf(ss / (float)D + eps);
}

static void rmsnorm_rows(void *arg, int64_t r0, int64_t r1) {
    const cpu_call *c = ((job *)arg)->c;
    const float *x = c->src[0].data, *w = c->src[1].data;
    float *y = c->dst.data, eps = c->l->fp[0];
    int64_t D = c->dst.ne[c->dst.ndim - 1];
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * D;
        float *yr = y + r * D;
        float rs = row_rstd(xr, D, eps);
        for (int64_t i = 0; i < D; i++) yr[i] = w[i] * (xr[i] * rs);
    }
}

/* One row of rmsnorm's dx; dr may be o (each element read before it is written). */
static inline void back_x_row(const float *xr, const float *w, const float *dr, float *o, int64_t D, float eps) {
    float rs = row_rstd(xr, D, eps);
    float dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t i = 0; i < D; i++) dot += dr[i] * w[i] * xr[i];
    float k = dot * rs * rs * rs / (float)D;
    for (int64_t i = 0; i < D; i++) o[i] = dr[i] * w[i] * rs - xr[i] * k;
}

static void rmsnorm_back_x_rows(void *arg, int64_t r0, int64_t r1) {
    const cpu_call *c = ((job *)arg)->c;
    const float *x = c->src[0].data, *w = c->src[1].data, *dy = c->src[2].data;
    float *dx = c->dst.data, eps = c->l->fp[0];
    int64_t D = c->dst.ne[c->dst.ndim - 1];
    for (int64_t r = r0; r < r1; r++) back_x_row(x + r * D, w, dy + r * D, dx + r * D, D, eps);
}

static int64_t rows_of(const cpu_tensor *t) { return t->nelem / t->ne[t->ndim - 1]; }

twk_status cpu_rmsnorm(const cpu_call *c) {
    job j = {c};
    int64_t D = c->dst.ne[c->dst.ndim - 1];
    cpu_parallel_for(c->ctx->pool, rows_of(&c->dst), CPU_GRAIN_ELEMS / D + 1, rmsnorm_rows, &j);
    return TWK_OK;
}

twk_status cpu_rmsnorm_back_x(const cpu_call *c) {
    job j = {c};
    int64_t D = c->dst.ne[c->dst.ndim - 1];
    cpu_parallel_for(c->ctx->pool, rows_of(&c->dst), CPU_GRAIN_ELEMS / D + 1, rmsnorm_back_x_rows, &j);
    return TWK_OK;
}

typedef struct {
    const cpu_call *c;
    float *rstd;
} rms_w_job;

static void rstd_rows(void *arg, int64_t r0, int64_t r1) {
    rms_w_job *j = arg;
    const float *x = j->c->src[0].data;
    int64_t D = j->c->dst.ne[0];
    for (int64_t r = r0; r < r1; r++) j->rstd[r] = row_rstd(x + r * D, D, j->c->l->fp[0]);
}

static void rms_w_cols(void *arg, int64_t d0, int64_t d1) {
    rms_w_job *j = arg;
    const float *x = j->c->src[0].data, *dy = j->c->src[1].data;
    int64_t D = j->c->dst.ne[0], R = rows_of(&j->c->src[0]);
    double acc[64];
    for (int64_t b = d0; b < d1; b += 64) {
        int64_t e = b + 64 < d1 ? b + 64 : d1;
        for (int64_t d = b; d < e; d++) acc[d - b] = 0;
        for (int64_t r = 0; r < R; r++) {
            const float *xr = x + r * D, *dr = dy + r * D;
            float rs = j->rstd[r];
            for (int64_t d = b; d < e; d++) acc[d - b] += (double)(dr[d] * xr[d] * rs);
        }
        for (int64_t d = b; d < e; d++) ((float *)j->c->dst.data)[d] = (float)acc[d - b];
    }
}

twk_status cpu_rmsnorm_back_w(const cpu_call *c) {
    int64_t D = c->dst.ne[0], R = rows_of(&c->src[0]);
    rms_w_job j = {c, NULL};
    j.rstd = cpu_scratch(c->ctx, (size_t)R * sizeof *j.rstd);
    if (!j.rstd) return TWK_ERR_OOM;
    cpu_parallel_for(c->ctx->pool, R, CPU_GRAIN_ELEMS / D + 1, rstd_rows, &j);
    cpu_parallel_for(c->ctx->pool, D, c->src[0].nelem < CPU_GRAIN_ELEMS ? D : 16, rms_w_cols, &j);
    return TWK_OK;
}

/* ---- rope ---- */

/* inv_freq[i] = theta^(-2i/D), computed like transformers (float32 result). */
static void default_inv_freq(float *f, int64_t half, float theta) {
    for (int64_t i = 0; i < half; i++)
        f[i] = (float)(1.0 / pow((double)theta, (double)(2 * i) / (double)(2 * half)));
}

typedef struct {
    const cpu_call *c;
    const float *inv_freq;
    const float *norm_w; /* RMSNORM_ROPE: src[1], the norm's weight (positions in src[2]); ROPE: NULL */
} rope_job;

/* ROPE (positions src[1]) or, with j->norm_w, RMSNORM_ROPE: each row normalized as rmsnorm_rows
 * normalizes it (a float w * (x * rs)) before the same rotation, so bit-identical to the pair. */
static void rope_rows(void *arg, int64_t t0, int64_t t1) {
    const rope_job *j = arg;
    const cpu_call *c = j->c;
    const float *x = c->src[0].data, *w = j->norm_w;
    const cpu_tensor *positions = &c->src[w ? 2 : 1];
    float *y = c->dst.data, eps = w ? c->l->fp[0] : 0.0f;
    int64_t H = c->dst.ne[1], D = c->dst.ne[2], half = D / 2;
    float sign = c->l->ip[0] ? -1.0f : 1.0f;
    float cs[512], sn[512];
    for (int64_t t = t0; t < t1; t++) {
        float p = (float)cpu_id_at(positions, t);
        for (int64_t b = 0; b < half; b += 512) {
            int64_t e = b + 512 < half ? b + 512 : half;
            for (int64_t i = b; i < e; i++) {
                float ang = p * j->inv_freq[i]; /* float32, as transformers computes it */
                cs[i - b] = cosf(ang);
                sn[i - b] = sign * sinf(ang);
            }
            for (int64_t h = 0; h < H; h++) {
                const float *xr = x + (t * H + h) * D;
                float *yr = y + (t * H + h) * D;
                if (w) {
                    float rs = row_rstd(xr, D, eps);
                    for (int64_t i = b; i < e; i++) {
                        float x1 = w[i] * (xr[i] * rs), x2 = w[i + half] * (xr[i + half] * rs);
                        yr[i] = x1 * cs[i - b] - x2 * sn[i - b];
                        yr[i + half] = x2 * cs[i - b] + x1 * sn[i - b];
                    }
                } else {
                    for (int64_t i = b; i < e; i++) {
                        float x1 = xr[i], x2 = xr[i + half];
                        yr[i] = x1 * cs[i - b] - x2 * sn[i - b];
                        yr[i + half] = x2 * cs[i - b] + x1 * sn[i - b];
                    }
                }
            }
        }
    }
}

/* j->inv_freq: src[freq_src] when the launch has it, else theta's default in scratch; TWK_ERR_OOM. */
static twk_status rope_freqs(const cpu_call *c, int freq_src, float theta, rope_job *j) {
    if (c->l->nsrc > freq_src) {
        j->inv_freq = c->src[freq_src].data;
        return TWK_OK;
    }
    int64_t half = c->dst.ne[2] / 2;
    float *f = cpu_scratch(c->ctx, (size_t)half * sizeof *f);
    if (!f) return TWK_ERR_OOM;
    default_inv_freq(f, half, theta);
    j->inv_freq = f;
    return TWK_OK;
}

twk_status cpu_rope(const cpu_call *c) {
    rope_job j = {c, NULL, NULL};
    twk_status st = rope_freqs(c, 2, c->l->fp[0], &j);
    if (st != TWK_OK) return st;
    cpu_parallel_for(c->ctx->pool, c->dst.ne[0], CPU_GRAIN_ELEMS / (c->dst.ne[1] * c->dst.ne[2]) + 1, rope_rows, &j);
    return TWK_OK;
}

/* ---- rmsnorm + rope (the fusion pass's RMSNORM_ROPE): rope_rows with the norm's weight ---- */

twk_status cpu_rmsnorm_rope(const cpu_call *c) {
    rope_job j = {c, NULL, c->src[1].data};
    twk_status st = rope_freqs(c, 3, c->l->fp[1], &j);
    if (st != TWK_OK) return st;
    cpu_parallel_for(c->ctx->pool, c->dst.ne[0], CPU_GRAIN_ELEMS / (c->dst.ne[1] * c->dst.ne[2]) + 1, rope_rows, &j);
    return TWK_OK;
}

/* The backward's pair (ROPE_RMSNORM_BACK_X): per token each head's gradient row rotated by
 * rope_rows' expressions into the output row, then rmsnorm's dx of it in place (back_x_row):
 * bit-identical to the two launches. */
static void rope_rmsnorm_back_x_rows(void *arg, int64_t t0, int64_t t1) {
    const rope_job *j = arg;
    const cpu_call *c = j->c;
    const float *x = c->src[0].data, *w = c->src[1].data, *dy = c->src[2].data;
    float *dx = c->dst.data, eps = c->l->fp[0];
    int64_t H = c->dst.ne[1], D = c->dst.ne[2], half = D / 2;
    float sign = c->l->ip[0] ? -1.0f : 1.0f;
    float cs[512], sn[512];
    for (int64_t t = t0; t < t1; t++) {
        float p = (float)cpu_id_at(&c->src[3], t);
        for (int64_t b = 0; b < half; b += 512) {
            int64_t e = b + 512 < half ? b + 512 : half;
            for (int64_t i = b; i < e; i++) {
                float ang = p * j->inv_freq[i];
                cs[i - b] = cosf(ang);
                sn[i - b] = sign * sinf(ang);
            }
            for (int64_t h = 0; h < H; h++) {
                const float *gr = dy + (t * H + h) * D;
                float *o = dx + (t * H + h) * D;
                for (int64_t i = b; i < e; i++) {
                    float x1 = gr[i], x2 = gr[i + half];
                    o[i] = x1 * cs[i - b] - x2 * sn[i - b];
                    o[i + half] = x2 * cs[i - b] + x1 * sn[i - b];
                }
            }
        }
        for (int64_t h = 0; h < H; h++) {
            float *o = dx + (t * H + h) * D;
            back_x_row(x + (t * H + h) * D, w, o, o, D, eps);
        }
    }
}

twk_status cpu_rope_rmsnorm_back_x(const cpu_call *c) {
    rope_job j = {c, NULL, NULL};
    twk_status st = rope_freqs(c, 4, c->l->fp[1], &j);
    if (st != TWK_OK) return st;
    cpu_parallel_for(c->ctx->pool, c->dst.ne[0], CPU_GRAIN_ELEMS / (c->dst.ne[1] * c->dst.ne[2]) + 1,
                     rope_rmsnorm_back_x_rows, &j);
    return TWK_OK;
}

/* ---- logprobs ---- */

static float row_logsumexp(const float *x, int64_t V) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t i = 0; i < V; i++) m = x[i] > m ? x[i] : m;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < V; i++) s += cpu_expf(x[i] - m);
    return m + logf(s);
}

/* d logits of one row = dy * (onehot(target) - softmax); lse = logits[target] - logprob */
static void logprob_back_row(const float *xr, float *gr, int64_t V, int64_t tgt, float lp, float d) {
    float lse = xr[tgt] - lp;
#pragma omp simd
    for (int64_t i = 0; i < V; i++) gr[i] = -d * cpu_expf(xr[i] - lse);
    gr[tgt] += d;
}

static void logprobs_rows(void *arg, int64_t r0, int64_t r1) {
    const cpu_call *c = ((job *)arg)->c;
    const float *x = c->src[0].data;
    float *y = c->dst.data;
    int64_t V = c->src[0].ne[1];
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * V;
        y[r] = xr[cpu_id_at(&c->src[1], r)] - row_logsumexp(xr, V);
    }
}

static void logprobs_back_rows(void *arg, int64_t r0, int64_t r1) {
    const cpu_call *c = ((job *)arg)->c;
    const float *x = c->src[0].data, *dy = c->src[2].data, *lp = c->src[3].data;
    int64_t V = c->src[0].ne[1];
    for (int64_t r = r0; r < r1; r++)
        logprob_back_row(x + r * V, (float *)c->dst.data + r * V, V, cpu_id_at(&c->src[1], r), lp[r], dy[r]);
}

twk_status cpu_logprobs(const cpu_call *c) {
    job j = {c};
    cpu_parallel_for(c->ctx->pool, c->dst.ne[0], CPU_GRAIN_ELEMS / c->src[0].ne[1] + 1, logprobs_rows, &j);
    return TWK_OK;
}

twk_status cpu_logprobs_back(const cpu_call *c) {
    job j = {c};
    cpu_parallel_for(c->ctx->pool, c->dst.ne[0], CPU_GRAIN_ELEMS / c->src[0].ne[1] + 1, logprobs_back_rows, &j);
    return TWK_OK;
}

/* ---- unembed_logprobs: the logits of one token tile at a time ----
 * Each tile's logits come from the same sgemm (sgemv for a one-token pass) and each
 * row's log-softmax from the same row functions as matmul + logprobs over the whole
 * pass, so the results are bit-identical to that path while only a tile is held. */

typedef struct {
    const cpu_call *c;
    float *z;       /* the tile's logits [rows, V] (the backward turns them into d logits) */
    int64_t t0;     /* the tile's first token */
} tile_job;

static void unembed_rows(void *arg, int64_t r0, int64_t r1) {
    const tile_job *j = arg;
    const cpu_call *c = j->c;
    int64_t V = c->src[1].ne[0];
    float *y = c->dst.data;
    for (int64_t r = r0; r < r1; r++) {
        const float *zr = j->z + r * V;
        y[j->t0 + r] = zr[cpu_id_at(&c->src[2], j->t0 + r)] - row_logsumexp(zr, V);
    }
}

static void unembed_back_rows(void *arg, int64_t r0, int64_t r1) {
    const tile_job *j = arg;
    const cpu_call *c = j->c;
    int64_t V = c->src[1].ne[0];
    const float *dy = c->src[3].data, *lp = c->src[4].data;
    for (int64_t r = r0; r < r1; r++) {
        float *zr = j->z + r * V;
        int64_t t = j->t0 + r;
        logprob_back_row(zr, zr, V, cpu_id_at(&c->src[2], t), lp[t], dy[t]);
    }
}

/* The products of a tile of m tokens from t0 (of a pass of T): forward z = h w^T, backward
 * dh = dz w, with the kernel cpu_matmul takes for the pass of T tokens (w f32 or 16-bit). */
static cpu_gemm_args tile_logits_args(const cpu_call *c, int64_t t0, int64_t m, int64_t T, float *z) {
    int64_t H = c->src[0].ne[1], V = c->src[1].ne[0];
    return (cpu_gemm_args){.tb = 1, .infer = c->infer, .pass_m = T, .M = m, .N = V, .K = H, .lda = H, .ldb = H, .ldc = V,
                           .A = (const float *)c->src[0].data + t0 * H, .B = c->src[1].data, .bt = c->src[1].type, .C = z};
}

static cpu_gemm_args tile_dh_args(const cpu_call *c, int64_t t0, int64_t m, int64_t T, const float *z) {
    int64_t H = c->src[0].ne[1], V = c->src[1].ne[0];
    return (cpu_gemm_args){.pass_m = T, .M = m, .N = H, .K = V, .lda = V, .ldb = H, .ldc = H, .A = z, .B = c->src[1].data,
                           .bt = c->src[1].type, .C = (float *)c->dst.data + t0 * H};
}

/* The scratch: one tile of logits, then the larger of the two products' work (a 16-bit w's panel). */
static twk_status unembed(const cpu_call *c, int back) {
    int64_t T = c->src[0].ne[0], H = c->src[0].ne[1], V = c->src[1].ne[0];
    if (T > INT_MAX || H > INT_MAX || V > INT_MAX)
        return twk_error(TWK_ERR_UNSUPPORTED, "%s '%s': dims exceed the BLAS's int range", twk_op_name(c->l->op), c->l->name);
    int64_t rows = TWK_UNEMBED_TILE_ROWS(V, T);
    cpu_gemm_args fw = tile_logits_args(c, 0, rows, T, NULL), bw = tile_dh_args(c, 0, rows, T, NULL);
    int64_t wf = cpu_gemm_work_floats(c->ctx, &fw), wb = back ? cpu_gemm_work_floats(c->ctx, &bw) : 0;
    float *z = cpu_scratch(c->ctx, (size_t)(rows * V + (wf > wb ? wf : wb)) * sizeof *z);
    if (!z) return TWK_ERR_OOM;
    float *work = z + rows * V;
    for (int64_t t0 = 0; t0 < T; t0 += rows) {
        int64_t m = T - t0 < rows ? T - t0 : rows;
        tile_job j = {c, z, t0};
        fw = tile_logits_args(c, t0, m, T, z);
        cpu_gemm(c->ctx, &fw, work);
        cpu_parallel_for(c->ctx->pool, m, CPU_GRAIN_ELEMS / V + 1, back ? unembed_back_rows : unembed_rows, &j);
        if (!back) continue;
        bw = tile_dh_args(c, t0, m, T, z); /* as matmul's gradient of h w^T */
        cpu_gemm(c->ctx, &bw, work);
    }
    return TWK_OK;
}

twk_status cpu_unembed_logprobs(const cpu_call *c) { return unembed(c, 0); }
twk_status cpu_unembed_logprobs_back(const cpu_call *c) { return unembed(c, 1); }
