/* The optimizer step: gradient accumulation, the two stages of the global
 * gradient norm, and AdamW, written as train/optim.c's host reference writes
 * them so the CPU's results are the reference's bits. */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"

typedef struct {
    const cpu_call *c;
} optim_job;

static void acc_range(void *arg, int64_t b, int64_t e) {
    const cpu_call *c = ((optim_job *)arg)->c;
    float *acc = c->dst.data;
    const float *g = c->src[1].data;
    for (int64_t i = b; i < e; i++) acc[i] += g[i];
}

twk_status cpu_grad_acc(const cpu_call *c) {
    optim_job j = {c};
    cpu_parallel_for(c->ctx->pool, c->dst.nelem, CPU_GRAIN_ELEMS, acc_range, &j);
    return TWK_OK;
}

/* slice p of n elements over `parts` (every backend slices alike): [p q + min(p, r), ...), q = n / parts, r = n % parts */
static int64_t opt_slice(int64_t p, int64_t n, int64_t parts) {
    int64_t r = n % parts;
    return p * (n / parts) + (p < r ? p : r);
}

/* slice p of x: a double sum of squares, stored as hi = its float, lo = the float of the rest */
static void sqsum_range(void *arg, int64_t p0, int64_t p1) {
    const cpu_call *c = ((optim_job *)arg)->c;
    const float *x = c->src[0].data;
    float *y = c->dst.data;
    int64_t n = c->src[0].nelem, parts = c->dst.ne[0];
    for (int64_t p = p0; p < p1; p++) {
        double s = 0;
        for (int64_t i = opt_slice(p, n, parts), e = opt_slice(p + 1, n, parts); i < e; i++) s += (double)x[i] * x[i];
        float hi = (float)s;
        y[2 * p] = hi;
        y[2 * p + 1] = (float)(s - (double)hi);
    }
}

twk_status cpu_sqsum_parts(const cpu_call *c) {
    optim_job j = {c};
    int64_t parts = c->dst.ne[0];
    cpu_parallel_for(c->ctx->pool, parts, c->src[0].nelem >= CPU_GRAIN_ELEMS ? 1 : parts, sqsum_range, &j);
    return TWK_OK;
}

twk_status cpu_grad_norm(const cpu_call *c) {
    const float *parts = c->src[0].data, *h = c->src[1].data;
    float *y = c->dst.data;
    double ss = 0;
    for (int64_t p = 0; p < c->src[0].ne[0]; p++) ss += (double)parts[2 * p] + (double)parts[2 * p + 1];
    double norm = sqrt(ss);
    /* torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied when < 1 */
    float clip = 1.0f;
    if (h[TWK_HYPER_CLIP] > 0) {
        float coef = (float)(h[TWK_HYPER_CLIP] / (norm + 1e-6));
        if (coef < 1.0f) clip = coef;
    }
    y[0] = (float)norm;
    y[1] = clip;
    return TWK_OK;
}

static void adamw_range(void *arg, int64_t b, int64_t e) {
    const cpu_call *c = ((optim_job *)arg)->c;
    /* distinct tensors (the plan binds each to its own range), so the loop vectorises */
    float *restrict w = c->dst.data, *restrict acc = c->src[1].data, *restrict m = c->src[2].data,
                    *restrict v = c->src[3].data;
    const float *h = c->src[4].data;
    float clip = ((const float *)c->src[5].data)[1];
    float b1 = h[TWK_HYPER_BETA1], b2 = h[TWK_HYPER_BETA2], eps = h[TWK_HYPER_EPS];
    float step_size = h[TWK_HYPER_STEP_SIZE], c2_sqrt = h[TWK_HYPER_C2_SQRT], decay = h[TWK_HYPER_DECAY];
    for (int64_t k = b; k < e; k++) { /* train/optim.c's twk_adamw_reference, element k */
        float g = acc[k] * clip;
        w[k] *= decay;
        m[k] = b1 * m[k] + (1 - b1) * g;
        v[k] = b2 * v[k] + (1 - b2) * g * g;
        float denom = sqrtf(v[k]) / c2_sqrt + eps;
        w[k] -= step_size * m[k] / denom;
        acc[k] = 0;
    }
}

twk_status cpu_adamw(const cpu_call *c) {
    if (!isfinite(((const float *)c->src[5].data)[0])) return TWK_OK; /* a non-finite gradient changes nothing */
    optim_job j = {c};
    cpu_parallel_for(c->ctx->pool, c->dst.nelem, CPU_GRAIN_ELEMS, adamw_range, &j);
    return TWK_OK;
}
