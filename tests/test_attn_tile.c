/* Tiled training attention (backends/kernels/attn_tile.cl, the Vulkan attn_tile.comp) on a device
 * (TWK_TEST_DEVICE, default the CPU, whose blocks of 64 queries are GEMMs per segment): a sequence's
 * rows do not depend on the tiling. On the CPU also: the outputs do not depend on the thread count
 * (its (segment, head) tasks are spread over the pool; a pool of 1 and of 3 threads give the same bits). The same 61-token sequence is run alone and packed
 * after a 37-token one (so its rows fall at other offsets in the query and key tiles), with the same
 * values; its output o and its rows of dQ, dK and dV (loss sum(o * R), R the same on its rows) must
 * be bit-identical. Head sizes 64 and 128 (other tile sizes), GQA 1 and 4, with a window of 23 and
 * a soft-cap. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "twinkle/twinkle.h"

static int fails;

#define LA 37 /* the sequence packed before */
#define LB 61 /* the sequence compared */

/* o, dq, dk, dv of one pass over T tokens (the last LB are the compared sequence), into out[4]. */
static int pass(twk_device *dev, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, int window, float cap, const float *q,
                const float *k, const float *v, const float *r, float *out[4]) {
    int64_t qne[3] = {T, Hq, D}, kne[3] = {T, Hkv, D}, sne[1] = {T};
    twk_graph *g = twk_graph_new();
    twk_id qi = twk_param(g, "q", 3, qne, true), ki = twk_param(g, "k", 3, kne, true), vi = twk_param(g, "v", 3, kne, true);
    twk_id si = twk_input(g, "seg", TWK_I32, 1, sne), ri = twk_input(g, "r", TWK_F32, 3, qne);
    twk_id o = twk_attention(g, qi, ki, vi, si, 1.0f / sqrtf((float)D));
    if (window || cap > 0) o = twk_attention_limit(g, o, window, cap);
    twk_id loss = twk_weighted_sum(g, o, ri);
    twk_plan *p = NULL;
    int32_t *seg = malloc((size_t)T * 4);
    for (int64_t t = 0; t < T; t++) seg[t] = (int32_t)(t < T - LB ? 0 : T - LB);
    twk_status st = twk_graph_backward(g, loss);
    twk_id ids[4] = {o, twk_graph_grad(g, qi), twk_graph_grad(g, ki), twk_graph_grad(g, vi)};
    for (int i = 0; i < 4 && st == TWK_OK; i++) st = ids[i] < 0 ? TWK_ERR_INVALID_ARG : twk_graph_output(g, ids[i]);
    size_t nq = (size_t)(T * Hq * D), nk = (size_t)(T * Hkv * D);
    if (st == TWK_OK) st = twk_plan_compile(g, dev, 1, NULL, 0, &p);
    if (st == TWK_OK) st = twk_plan_write(p, qi, 1, q, nq * 4);
    if (st == TWK_OK) st = twk_plan_write(p, ki, 1, k, nk * 4);
    if (st == TWK_OK) st = twk_plan_write(p, vi, 1, v, nk * 4);
    if (st == TWK_OK) st = twk_plan_write(p, ri, 1, r, nq * 4);
    if (st == TWK_OK) st = twk_plan_write(p, si, 1, seg, (size_t)T * 4);
    if (st == TWK_OK) st = twk_plan_run(p, 1);
    for (int i = 0; i < 4 && st == TWK_OK; i++) st = twk_plan_read(p, ids[i], 1, out[i], (i == 0 || i == 1 ? nq : nk) * 4);
    if (st != TWK_OK) printf("FAIL pass of %lld tokens: %s\n", (long long)T, twk_last_error());
    twk_plan_free(p);
    twk_graph_free(g);
    free(seg);
    return st == TWK_OK;
}

/* q, k (values in [-2, 2)), v and the loss weights r (in [-1, 1)) from seed, and the outputs' room
 * a[4], b[4] (o and dq of nq floats, dk and dv of nk). */
static void make_inputs(uint64_t seed, size_t nq, size_t nk, float **q, float **k, float **v, float **r, float *a[4],
                        float *b[4]) {
    *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *r = malloc(nq * 4);
    twk_rng rng;
    twk_rng_seed(&rng, seed);
    for (size_t i = 0; i < nq; i++) (*q)[i] = (float)(4 * twk_rng_uniform(&rng) - 2), (*r)[i] = (float)(2 * twk_rng_uniform(&rng) - 1);
    for (size_t i = 0; i < nk; i++) (*k)[i] = (float)(4 * twk_rng_uniform(&rng) - 2), (*v)[i] = (float)(2 * twk_rng_uniform(&rng) - 1);
    for (int i = 0; i < 4; i++) a[i] = malloc((i < 2 ? nq : nk) * 4), b[i] = malloc((i < 2 ? nq : nk) * 4);
}

static void shape_case(twk_device *dev, int64_t Hq, int64_t Hkv, int64_t D, int window, float cap) {
    int64_t T = LA + LB;
    size_t nq = (size_t)(T * Hq * D), nk = (size_t)(T * Hkv * D);
    float *q, *k, *v, *r, *a[4], *b[4];
    make_inputs(3, nq, nk, &q, &k, &v, &r, a, b);
    /* alone: the compared sequence's values are the packed pass's last LB rows */
    size_t oq = (size_t)(LA * Hq * D), ok_ = (size_t)(LA * Hkv * D);
    int ok = pass(dev, T, Hq, Hkv, D, window, cap, q, k, v, r, a) &&
             pass(dev, LB, Hq, Hkv, D, window, cap, q + oq, k + ok_, v + ok_, r + oq, b);
    const char *names[4] = {"o", "dq", "dk", "dv"};
    char what[256];
    for (int i = 0; ok && i < 4; i++) {
        size_t off = i < 2 ? oq : ok_, cnt = i < 2 ? nq - oq : nk - ok_, diff = 0;
        for (size_t e = 0; e < cnt; e++) diff += memcmp(&a[i][off + e], &b[i][e], 4) != 0;
        snprintf(what, sizeof what,
                 "head size %lld, %lld / %lld heads%s: %s of a %d-token sequence bit-identical alone and packed after %d "
                 "tokens (%zu of %zu differ)",
                 (long long)D, (long long)Hq, (long long)Hkv, window ? ", window 23, soft-cap 30" : "", names[i], LB, LA,
                 diff, cnt);
        printf("%s %s\n", diff == 0 ? "ok  " : "FAIL", what);
        fails += diff != 0;
    }
    if (!ok) fails++;
    for (int i = 0; i < 4; i++) free(a[i]), free(b[i]);
    free(q), free(k), free(v), free(r);
}

/* The CPU only: the packed pass of each shape on a pool of 1 thread and of 3, bit for bit. */
static void threads_case(int64_t Hq, int64_t Hkv, int64_t D, int window, float cap) {
    twk_device *dev[2] = {NULL, NULL};
    const char *counts[2] = {"1", "3"};
    for (int i = 0; i < 2; i++) {
        setenv("TWK_THREADS", counts[i], 1);
        if (twk_device_open("cpu", &dev[i]) != TWK_OK) {
            printf("FAIL open cpu with %s threads: %s\n", counts[i], twk_last_error());
            fails++;
        }
    }
    unsetenv("TWK_THREADS");
    int64_t T = LA + LB;
    size_t nq = (size_t)(T * Hq * D), nk = (size_t)(T * Hkv * D);
    float *q, *k, *v, *r, *a[4], *b[4];
    make_inputs(5, nq, nk, &q, &k, &v, &r, a, b);
    int ok = dev[0] && dev[1] && pass(dev[0], T, Hq, Hkv, D, window, cap, q, k, v, r, a) &&
             pass(dev[1], T, Hq, Hkv, D, window, cap, q, k, v, r, b);
    const char *names[4] = {"o", "dq", "dk", "dv"};
    for (int i = 0; ok && i < 4; i++) {
        size_t cnt = i < 2 ? nq : nk, diff = 0;
        for (size_t e = 0; e < cnt; e++) diff += memcmp(&a[i][e], &b[i][e], 4) != 0;
        printf("%s head size %lld, %lld / %lld heads%s: %s of a %lld-token pass bit-identical on 1 and 3 threads "
               "(%zu of %zu differ)\n",
               diff == 0 ? "ok  " : "FAIL", (long long)D, (long long)Hq, (long long)Hkv,
               window ? ", window 23, soft-cap 30" : "", names[i], (long long)T, diff, cnt);
        fails += diff != 0;
    }
    if (!ok) fails++;
    for (int i = 0; i < 4; i++) free(a[i]), free(b[i]);
    free(q), free(k), free(v), free(r);
    for (int i = 0; i < 2; i++) twk_device_close(dev[i]);
}

int main(void) {
    const char *spec = getenv("TWK_TEST_DEVICE");
    if (!spec || !*spec) spec = "cpu";
    twk_device *dev = NULL;
    if (twk_device_open(spec, &dev) != TWK_OK) {
        printf("FAIL open %s: %s\n", spec, twk_last_error());
        return 1;
    }
    shape_case(dev, 4, 4, 64, 0, 0);
    shape_case(dev, 8, 2, 128, 0, 0);
    shape_case(dev, 4, 1, 64, 23, 30.0f);
    twk_device_close(dev);
    if (!strncmp(spec, "cpu", 3)) {
        threads_case(4, 4, 64, 0, 0);
        threads_case(8, 2, 128, 0, 0);
        threads_case(4, 1, 64, 23, 30.0f);
    }
    printf("%s\n", fails ? "FAILED" : "all passed");
    return fails ? 1 : 0;
}
