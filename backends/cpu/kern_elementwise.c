/* Elementwise kernels (fill, scale, silu, gelu, tanh, swiglu and their gradients), the spans
 * they share with the fused chains (cpu_ew_span), and the broadcast / sum-to pair. */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"

/* 4-D right-aligned view of a tensor's dims. */
static void pad4(const cpu_tensor *t, int64_t d[4]) {
    int off = 4 - t->ndim;
    for (int i = 0; i < 4; i++) d[i] = i < off ? 1 : t->ne[i - off];
}

/* Strides (in elements) of `small` indexed by `big`'s padded dims; 0 where broadcast. */
static void bcast_strides(const int64_t s[4], int64_t st[4]) {
    int64_t acc = 1;
    for (int i = 3; i >= 0; i--) {
        st[i] = s[i] == 1 ? 0 : acc;
        acc *= s[i];
    }
}

static void add_span(float *y, const float *a, const float *b, int64_t n);
static void mul_span(float *y, const float *a, const float *b, int64_t n);

typedef struct {
    const cpu_call *c;
    int op; /* 0 add, 1 mul */
    int64_t B[4], st[4];
} bin_job;

static void bin_rows(void *arg, int64_t r0, int64_t r1) {
    const bin_job *j = arg;
    const float *a = j->c->src[0].data, *b = j->c->src[1].data;
    float *y = j->c->dst.data;
    int64_t inner = j->B[3];
    for (int64_t r = r0; r < r1; r++) {
        int64_t i2 = r % j->B[2], i1 = (r / j->B[2]) % j->B[1], i0 = r / (j->B[2] * j->B[1]);
        const float *br = b + i0 * j->st[0] + i1 * j->st[1] + i2 * j->st[2];
        const float *ar = a + r * inner;
        float *yr = y + r * inner;
        if (j->st[3] == 0) {
            float bv = br[0];
            if (j->op == 0)
                for (int64_t k = 0; k < inner; k++) yr[k] = ar[k] + bv;
            else
                for (int64_t k = 0; k < inner; k++) yr[k] = ar[k] * bv;
        } else if (j->op == 0) {
            add_span(yr, ar, br, inner);
        } else {
            mul_span(yr, ar, br, inner);
        }
    }
}

static twk_status binary(const cpu_call *c, int op) {
    bin_job j = {.c = c, .op = op};
    int64_t S[4];
    pad4(&c->dst, j.B);
    /* b is right-aligned against a */
    cpu_tensor b = c->src[1];
    pad4(&b, S);
    bcast_strides(S, j.st);
    int64_t rows = j.B[0] * j.B[1] * j.B[2];
    int64_t grain = CPU_GRAIN_ELEMS / (j.B[3] ? j.B[3] : 1) + 1;
    cpu_parallel_for(c->ctx->pool, rows, grain, bin_rows, &j);
    return TWK_OK;
}

twk_status cpu_add(const cpu_call *c) { return binary(c, 0); }
twk_status cpu_mul(const cpu_call *c) { return binary(c, 1); }

/* ---- unary and same-shape maps ---- */

/* libm's expf, not cpu_math.h's cpu_expf: with that one's ~2 ulp (which would let these spans
 * vectorise, swiglu_back 2x faster), the llama fixture's LoRA tensors after 3 AdamW steps moved
 * 1.22e-4 from PEFT's in the sanitizer build (test_parity's tolerance 1e-4; 3.0e-5 with expf). */
static inline float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

/* GELU, tanh approximation: 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)
 * (the sigmoid form has no cancellation for negative x). */
#define GELU_2C 1.5957691216057308f /* 2 sqrt(2/pi) */
static inline float gelu_2u(float x) { return GELU_2C * (x + 0.044715f * x * x * x); }

/* Spans: y[0..n) from a, b, c [0..n). The unfused kernels and the fused chains (kern_fused.c)
 * run these same loops, so a chain computes every element with the same instructions. */
static void add_span(float *y, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}
static void mul_span(float *y, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] * b[i];
}
static void scale_span(float *y, const float *x, float s, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * s;
}
static void silu_span(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * sigmoidf_(x[i]);
}
static void silu_back_span(float *y, const float *x, const float *dy, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float s = sigmoidf_(x[i]);
        y[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
    }
}
static void tanh_span(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = tanhf(x[i]);
}
static void tanh_back_span(float *y, const float *x, const float *dy, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float t = tanhf(x[i]);
        y[i] = dy[i] * (1.0f - t * t);
    }
}
static void gelu_span(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * sigmoidf_(gelu_2u(x[i]));
}
static void gelu_back_span(float *y, const float *x, const float *dy, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = x[i], s = sigmoidf_(gelu_2u(v));
        y[i] = dy[i] * (s + v * s * (1.0f - s) * GELU_2C * (1.0f + 0.134145f * v * v));
    }
}
static void swiglu_span(float *y, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = g[i] * sigmoidf_(g[i]) * u[i];
}
static void swiglu_back_span(float *y, const float *g, const float *u, const float *dy, int which, int64_t n) {
    if (which == 0) {
        for (int64_t i = 0; i < n; i++) {
            float s = sigmoidf_(g[i]);
            y[i] = dy[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
        }
    } else {
        for (int64_t i = 0; i < n; i++) y[i] = dy[i] * g[i] * sigmoidf_(g[i]);
    }
}

bool cpu_ew_span(twk_op op, int ip0, float fp0, float *y, const float *a, const float *b, const float *c, int64_t n) {
    switch (op) {
    case TWK_OP_ADD: add_span(y, a, b, n); return true;
    case TWK_OP_MUL: mul_span(y, a, b, n); return true;
    case TWK_OP_SCALE: scale_span(y, a, fp0, n); return true;
    case TWK_OP_SILU: silu_span(y, a, n); return true;
    case TWK_OP_SILU_BACK: silu_back_span(y, a, b, n); return true;
    case TWK_OP_TANH: tanh_span(y, a, n); return true;
    case TWK_OP_TANH_BACK: tanh_back_span(y, a, b, n); return true;
    case TWK_OP_GELU: gelu_span(y, a, n); return true;
    case TWK_OP_GELU_BACK: gelu_back_span(y, a, b, n); return true;
    case TWK_OP_SWIGLU: swiglu_span(y, a, b, n); return true;
    case TWK_OP_SWIGLU_BACK: swiglu_back_span(y, a, b, c, ip0, n); return true;
    default: return false;
    }
}

typedef struct {
    const cpu_call *c;
} map_job;

static void fill_range(void *arg, int64_t b, int64_t e) {
    const cpu_call *c = ((map_job *)arg)->c;
    float *y = c->dst.data, v = c->l->fp[0];
    for (int64_t i = b; i < e; i++) y[i] = v;
}

/* Every same-shape map: its span over [b, e) of the sources. */
static void span_range(void *arg, int64_t b, int64_t e) {
    const cpu_call *c = ((map_job *)arg)->c;
    const float *s[3] = {NULL, NULL, NULL};
    for (int k = 0; k < c->l->nsrc && k < 3; k++) s[k] = (const float *)c->src[k].data + b;
    cpu_ew_span(c->l->op, c->l->ip[0], c->l->fp[0], (float *)c->dst.data + b, s[0], s[1], s[2], e - b);
}

static twk_status map(const cpu_call *c, cpu_range_fn fn) {
    map_job j = {c};
    cpu_parallel_for(c->ctx->pool, c->dst.nelem, CPU_GRAIN_ELEMS, fn, &j);
    return TWK_OK;
}

twk_status cpu_fill(const cpu_call *c) { return map(c, fill_range); }
twk_status cpu_scale(const cpu_call *c) { return map(c, span_range); }
twk_status cpu_silu(const cpu_call *c) { return map(c, span_range); }
twk_status cpu_silu_back(const cpu_call *c) { return map(c, span_range); }
twk_status cpu_swiglu(const cpu_call *c) { return map(c, span_range); }
twk_status cpu_gelu(const cpu_call *c) { return map(c, span_range); }
twk_status cpu_tanh(const cpu_call *c) { return map(c, span_range); }
twk_status cpu_tanh_back(const cpu_call *c) { return map(c, span_range); }
twk_status cpu_gelu_back(const cpu_call *c) { return map(c, span_range); }
twk_status cpu_swiglu_back(const cpu_call *c) { return map(c, span_range); }

/* ---- broadcast and its adjoint ---- */

typedef struct {
    const cpu_call *c;
    int64_t D[4], S[4], st[4];
    float scale;
} shape_job;

static void broadcast_rows(void *arg, int64_t r0, int64_t r1) {
    const shape_job *j = arg;
    const float *x = j->c->src[0].data;
    float *y = j->c->dst.data;
    int64_t inner = j->D[3];
    for (int64_t r = r0; r < r1; r++) {
        int64_t i2 = r % j->D[2], i1 = (r / j->D[2]) % j->D[1], i0 = r / (j->D[2] * j->D[1]);
        const float *xr = x + i0 * j->st[0] + i1 * j->st[1] + i2 * j->st[2];
        float *yr = y + r * inner;
        if (j->st[3] == 0)
            for (int64_t k = 0; k < inner; k++) yr[k] = xr[0] * j->scale;
        else
            for (int64_t k = 0; k < inner; k++) yr[k] = xr[k] * j->scale;
    }
}

twk_status cpu_broadcast(const cpu_call *c) {
    shape_job j = {.c = c, .scale = 1.0f};
    pad4(&c->dst, j.D);
    pad4(&c->src[0], j.S);
    bcast_strides(j.S, j.st);
    if (c->l->ip[0]) j.scale = (float)(1.0 / (double)c->dst.nelem); /* mean's gradient */
    int64_t rows = j.D[0] * j.D[1] * j.D[2];
    cpu_parallel_for(c->ctx->pool, rows, CPU_GRAIN_ELEMS / (j.D[3] ? j.D[3] : 1) + 1, broadcast_rows, &j);
    return TWK_OK;
}

#define SUMTO_BLOCK 64

/* Items: (dst row, block of the inner dim); each dst element is summed in a
 * fixed order over the reduced dims, so the result is deterministic. */
static void sum_to_items(void *arg, int64_t i0_, int64_t i1_) {
    const shape_job *j = arg;
    const float *x = j->c->src[0].data;
    float *y = j->c->dst.data;
    const int64_t *D = j->D, *S = j->S;
    int64_t nblk = (D[3] + SUMTO_BLOCK - 1) / SUMTO_BLOCK;
    int64_t sst[4]; /* src strides */
    sst[3] = 1;
    for (int i = 2; i >= 0; i--) sst[i] = sst[i + 1] * S[i + 1];
    for (int64_t it = i0_; it < i1_; it++) {
        int64_t r = it / nblk, blk = it % nblk;
        int64_t d2 = r % D[2], d1 = (r / D[2]) % D[1], d0 = r / (D[2] * D[1]);
        int64_t k0 = blk * SUMTO_BLOCK, k1 = k0 + SUMTO_BLOCK < D[3] ? k0 + SUMTO_BLOCK : D[3];
        double acc[SUMTO_BLOCK];
        for (int64_t k = 0; k < k1 - k0; k++) acc[k] = 0;
        int64_t n0 = D[0] == S[0] ? 1 : S[0], n1 = D[1] == S[1] ? 1 : S[1], n2 = D[2] == S[2] ? 1 : S[2];
        for (int64_t a = 0; a < n0; a++)
            for (int64_t b = 0; b < n1; b++)
                for (int64_t cc = 0; cc < n2; cc++) {
                    int64_t s0 = n0 == 1 ? d0 : a, s1 = n1 == 1 ? d1 : b, s2 = n2 == 1 ? d2 : cc;
                    const float *row = x + s0 * sst[0] + s1 * sst[1] + s2 * sst[2];
                    if (D[3] == S[3]) {
                        for (int64_t k = k0; k < k1; k++) acc[k - k0] += row[k];
                    } else {
                        double t = 0;
                        for (int64_t k = 0; k < S[3]; k++) t += row[k];
                        acc[0] += t;
                    }
                }
        float *yr = y + r * D[3];
        for (int64_t k = k0; k < k1; k++) yr[k] = (float)acc[k - k0];
    }
}

twk_status cpu_sum_to(const cpu_call *c) {
    shape_job j = {.c = c};
    pad4(&c->dst, j.D);
    /* src is right-aligned against dst's rank when padded to 4 */
    pad4(&c->src[0], j.S);
    int64_t rows = j.D[0] * j.D[1] * j.D[2];
    int64_t nblk = (j.D[3] + SUMTO_BLOCK - 1) / SUMTO_BLOCK;
    int64_t per_item = c->src[0].nelem / (rows * nblk) + 1;
    cpu_parallel_for(c->ctx->pool, rows * nblk, CPU_GRAIN_ELEMS / per_item + 1, sum_to_items, &j);
    return TWK_OK;
}
