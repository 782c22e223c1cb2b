/* Split-K decode attention (attn_cache over a long cache: backends/kernels/attn_split.cl, the
 * Vulkan attn.comp MODE 3 / 4) on a device (TWK_TEST_DEVICE, default the CPU), against a float64
 * reference and against the same device with TWK_ATTN_UNSPLIT=1 (one work-group per query and
 * head): key ranges of 1 to 2,000 keys, shorter and longer than a 256-key piece, over caches of
 * 2,000 and 1,000 rows, grouped-query heads 2 and 8, a window of 300 and a soft-cap, at the
 * plan's capacity and at a smaller run-time token count. Checks: every output within 1e-5 of
 * float64 (outputs are convex combinations of values in [-1, 1]: float32 sums give ~1e-7), and a
 * range within one piece bit-identical to the unsplit kernel (one piece: the merge's weight is 1).
 * The largest split / unsplit difference over the longer ranges is printed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "twinkle/twinkle.h"

static int fails;

static void check(int cond, const char *what) {
    printf("%s %s\n", cond ? "ok  " : "FAIL", what);
    fails += !cond;
}

typedef struct shape {
    const char *name;
    int64_t cap, Hq, Hkv, D, R, window;
    float cap_s; /* soft-cap (0: none) */
    int32_t lo[16], hi[16];
} shape;

/* o [n, Hq, D] of the compiled attn_cache on dev; 0 (message printed) on failure. */
static int run(twk_device *dev, const shape *s, int64_t n, const float *q, const float *k, const float *v, float *o) {
    twk_graph *g = twk_graph_new();
    int64_t qne[3] = {TWK_T, s->Hq, s->D}, kne[3] = {s->R, s->Hkv, s->D}, tne[1] = {TWK_T};
    twk_id qi = twk_input(g, "q", TWK_F32, 3, qne), ki = twk_input(g, "kc", TWK_F32, 3, kne);
    twk_id vi = twk_input(g, "vc", TWK_F32, 3, kne), li = twk_input(g, "lo", TWK_I32, 1, tne);
    twk_id hi = twk_input(g, "hi", TWK_I32, 1, tne);
    twk_id a = twk_attention_cached(g, qi, ki, vi, li, hi, 1.0f / sqrtf((float)s->D));
    if (s->window || s->cap_s > 0) a = twk_attention_limit(g, a, (int)s->window, s->cap_s);
    twk_plan *p = NULL;
    size_t nq = (size_t)(n * s->Hq * s->D), nk = (size_t)(s->R * s->Hkv * s->D);
    twk_status st = twk_graph_output(g, a);
    if (st == TWK_OK) st = twk_plan_compile(g, dev, s->cap, NULL, 0, &p);
    if (st == TWK_OK) st = twk_plan_write(p, qi, n, q, nq * 4);
    if (st == TWK_OK) st = twk_plan_write(p, ki, n, k, nk * 4);
    if (st == TWK_OK) st = twk_plan_write(p, vi, n, v, nk * 4);
    if (st == TWK_OK) st = twk_plan_write(p, li, n, s->lo, (size_t)n * 4);
    if (st == TWK_OK) st = twk_plan_write(p, hi, n, s->hi, (size_t)n * 4);
    if (st == TWK_OK) st = twk_plan_run(p, n);
    if (st == TWK_OK) st = twk_plan_read(p, a, n, o, nq * 4);
    if (st != TWK_OK) printf("FAIL %s at n = %lld: %s\n", s->name, (long long)n, twk_last_error());
    twk_plan_free(p);
    twk_graph_free(g);
    return st == TWK_OK;
}

/* The float64 attention of query t, head h into out [D]. */
static void reference(const shape *s, const float *q, const float *k, const float *v, int64_t t, int64_t h, double *out) {
    int64_t D = s->D, hk = h / (s->Hq / s->Hkv), j0 = s->lo[t], j1 = s->hi[t];
    if (s->window > 0 && j1 - s->window > j0) j0 = j1 - s->window;
    double scale = 1.0 / sqrt((double)D), m = -INFINITY, l = 0, *sc = malloc((size_t)(j1 - j0) * sizeof(double));
    for (int64_t j = j0; j < j1; j++) {
        double d = 0;
        for (int64_t e = 0; e < D; e++) d += (double)q[(t * s->Hq + h) * D + e] * k[(j * s->Hkv + hk) * D + e];
        d *= (double)(float)scale;
        if (s->cap_s > 0) d = s->cap_s * tanh(d / s->cap_s);
        sc[j - j0] = d;
        m = fmax(m, d);
    }
    for (int64_t e = 0; e < D; e++) out[e] = 0;
    for (int64_t j = j0; j < j1; j++) {
        double p = exp(sc[j - j0] - m);
        l += p;
        for (int64_t e = 0; e < D; e++) out[e] += p * v[(j * s->Hkv + hk) * D + e];
    }
    for (int64_t e = 0; e < D; e++) out[e] /= l;
    free(sc);
}

static void shape_case(twk_device *dev, const shape *s) {
    size_t nq = (size_t)(s->cap * s->Hq * s->D), nk = (size_t)(s->R * s->Hkv * s->D);
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *os = malloc(nq * 4), *ou = malloc(nq * 4);
    double *ref = malloc((size_t)s->D * sizeof(double));
    twk_rng r;
    twk_rng_seed(&r, 5);
    for (size_t i = 0; i < nq; i++) q[i] = (float)(4 * twk_rng_uniform(&r) - 2);
    for (size_t i = 0; i < nk; i++) k[i] = (float)(4 * twk_rng_uniform(&r) - 2), v[i] = (float)(2 * twk_rng_uniform(&r) - 1);
    int64_t ns[2] = {s->cap, 5};
    for (int c = 0; c < 2; c++) {
        int64_t n = ns[c];
        setenv("TWK_ATTN_UNSPLIT", "1", 1);
        int ok = run(dev, s, n, q, k, v, ou);
        unsetenv("TWK_ATTN_UNSPLIT");
        ok = ok && run(dev, s, n, q, k, v, os);
        if (!ok) {
            fails++;
            continue;
        }
        double err_s = 0, err_u = 0, diff_long = 0;
        int short_same = 1, nshort = 0, nlong = 0;
        for (int64_t t = 0; t < n; t++) {
            int64_t len = s->hi[t] - s->lo[t];
            if (s->window > 0 && len > s->window) len = s->window;
            if (len <= 256) nshort++;
            else nlong++;
            for (int64_t h = 0; h < s->Hq; h++) {
                reference(s, q, k, v, t, h, ref);
                for (int64_t e = 0; e < s->D; e++) {
                    size_t i = (size_t)((t * s->Hq + h) * s->D + e);
                    err_s = fmax(err_s, fabs(os[i] - ref[e]));
                    err_u = fmax(err_u, fabs(ou[i] - ref[e]));
                    if (len <= 256) short_same &= memcmp(&os[i], &ou[i], 4) == 0;
                    else diff_long = fmax(diff_long, fabs((double)os[i] - ou[i]));
                }
            }
        }
        char what[256];
        printf("     %s, n = %lld (%d ranges within a piece, %d longer): max |o - float64| split %.2e, unsplit %.2e; "
               "longer ranges max |split - unsplit| %.2e\n",
               s->name, (long long)n, nshort, nlong, err_s, err_u, diff_long);
        snprintf(what, sizeof what, "%s, n = %lld: split and unsplit within 1e-5 of float64", s->name, (long long)n);
        check(err_s <= 1e-5 && err_u <= 1e-5, what);
        snprintf(what, sizeof what, "%s, n = %lld: ranges within one piece bit-identical to the unsplit kernel", s->name,
                 (long long)n);
        check(short_same, what);
    }
    free(q), free(k), free(v), free(os), free(ou), free(ref);
}

int main(void) {
    const char *spec = getenv("TWK_TEST_DEVICE");
    twk_device *dev = NULL;
    if (twk_device_open(spec && *spec ? spec : "cpu", &dev) != TWK_OK) {
        printf("FAIL open %s: %s\n", spec, twk_last_error());
        return 1;
    }
    /* ranges of 1, 37, 256, 257, 300, 511, 777, 1500, 2000 keys and a few between */
    shape a = {"14 queries x 4 heads / 2 kv heads x 64 over 2000 rows", 14, 4, 2, 64, 2000, 0, 0,
               {0, 100, 1000, 5, 0, 300, 1, 0, 0, 17, 1999, 640, 250, 0},
               {1, 137, 1256, 262, 300, 811, 778, 1500, 2000, 1800, 2000, 1151, 256, 64}};
    shape b = {"9 queries x 8 heads / 1 kv head x 128 over 1000 rows, window 300, soft-cap 20", 9, 8, 1, 128, 1000, 300, 20,
               {0, 0, 10, 500, 0, 0, 900, 3, 200}, {1000, 299, 311, 1000, 600, 256, 1000, 4, 460}};
    shape_case(dev, &a);
    shape_case(dev, &b);
    twk_device_close(dev);
    printf("%s\n", fails ? "FAILED" : "all passed");
    return fails ? 1 : 0;
}
