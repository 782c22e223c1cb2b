/* test_reduce: the wide (two-stage) reductions of the GPU backends (hal/twk_wide.h) against
 * float64 references, within their stated float32 error bound, and bit-identical run to run.
 *
 * Ops: sum, mean, weighted_sum, sqsum_parts (+ grad_norm), rmsnorm's weight gradient
 * (rmsnorm_back_w), at sizes with one term, primes, ragged tiles and > 1e6 terms, on the device
 * TWK_TEST_DEVICE (default cpu; the bound is the GPU kernels', so the cpu is held to it too but
 * its reductions are its own).
 *
 * The bound (u = 2^-24; every addition of the kernels is a TwoSum whose error goes to lo, a
 * product's rounding error fma(a, b, -ab) too where stated; d = the longest chain of additions a
 * term passes through, from the tile cut of twk_wide_tiles):
 *   |y - S| <= u |S| + k u A + c2 A,    c2 = (1 + u)(1 + g(d)) (d + 1) u g(2 d),  g(k) = k u / (1 - k u)
 * with S the exact sum, A = sum |t_i| of the terms, k = 0 for sums (products compensated; 1 on
 * Vulkan, where fma may be a multiply and an add, as on lavapipe) and
 * 20 for rmsnorm_back_w (two uncompensated products, 2u, and the rstd, 18u from the OpenCL /
 * Vulkan ulp limits of division and sqrt); mean adds 3u |S| / n (scale and product roundings);
 * the norm: 10u sqrt(S) on top of half the sum's relative bound. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "twinkle/twinkle.h"
#include "twk_wide.h"

#define U (1.0 / 16777216.0)

static double gam(double k) { return k * U / (1.0 - k * U); }
static double c2_of(double d) { return (1 + U) * (1 + gam(d)) * (d + 1) * U * gam(2 * d); }

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* the chain of a sum of n terms in `slices` x k tiles then its fold (groups of >= 128 items, a
 * fold group of >= 32), generous by a few levels */
static double depth_sum(int64_t n, int64_t slices, int64_t k) {
    int64_t tile = cdiv(cdiv(n, slices), k);
    return (double)(cdiv(tile, 128) + 8 + cdiv(k, 32) + 8 + 2);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double uni(void) { /* [0, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

/* data kind 0: uniform(-1, 1) (cancellation); 1: signs and magnitudes 2^-20 .. 2^20 */
static float sample(int kind) {
    double v = 2 * uni() - 1;
    if (kind == 1) v = ldexp(v, (int)(uni() * 41) - 20);
    return (float)v;
}

static int cus;            /* the device's compute units */
static int gpu;            /* not the cpu backend: its reductions are its own, only determinism is checked */
static double kp;          /* k of a product's term: 0 where fma(a, b, -ab) is exact, 1 on Vulkan (lavapipe
                              lowers fma to a multiply and an add, so the product's error is lost) */
static double worst_ratio; /* largest measured error / bound */

static double ratio(double err, double bound) { return bound > 0 ? err / bound : (err == 0 ? 0 : INFINITY); }

static void judge_err(const char *what, double err, double bound, double ref) {
    double r = ratio(err, bound);
    if (!gpu) {
        printf("     %-44s err %.3e  (cpu: not held to the GPU bound %.3e)\n", what, err, bound);
        return;
    }
    if (r > worst_ratio) worst_ratio = r;
    check(err <= bound, "%-44s err %.3e  bound %.3e  (%.3f of it)  ref %.6e", what, err, bound, r, ref);
}

static void judge(const char *what, double got, double ref, double bound) {
    judge_err(what, isfinite(got) ? fabs(got - ref) : INFINITY, bound, ref);
}

/* Runs plan p twice and a second plan of the same graph once: every output's bits must agree. */
static int runs_agree(twk_device *dev, const twk_graph *g, twk_plan *p, const twk_id *outs, const size_t *bytes,
                      int nout, const twk_id *ins, float *const *in_data, const size_t *in_bytes, int nin,
                      float **first) {
    twk_plan *q = NULL;
    if (twk_plan_compile(g, dev, 1, NULL, 0, &q) != TWK_OK) return 0;
    int same = 1;
    for (int rep = 0; rep < 3 && same; rep++) {
        twk_plan *r = rep == 2 ? q : p;
        for (int i = 0; i < nin; i++)
            if (twk_plan_write(r, ins[i], 1, in_data[i], in_bytes[i]) != TWK_OK) same = 0;
        if (!same || twk_plan_run(r, 1) != TWK_OK) same = 0;
        for (int o = 0; o < nout && same; o++) {
            float *buf = malloc(bytes[o]);
            if (!buf || twk_plan_read(r, outs[o], 1, buf, bytes[o]) != TWK_OK) same = 0;
            else if (rep == 0) memcpy(first[o], buf, bytes[o]);
            else if (memcmp(first[o], buf, bytes[o]) != 0) same = 0;
            free(buf);
        }
    }
    twk_plan_free(q);
    return same;
}

/* sum, mean, weighted_sum, sqsum_parts at P slices and grad_norm over n terms */
static void check_sums(twk_device *dev, int64_t n, int kind) {
    const int P = n < 256 ? (int)n : 256;
    int64_t ne[1] = {n}, hn[1] = {TWK_HYPER_N};
    twk_graph *g = twk_graph_new();
    twk_id x = twk_input(g, "x", TWK_F32, 1, ne), w = twk_input(g, "w", TWK_F32, 1, ne);
    twk_id hy = twk_input(g, "hyper", TWK_F32, 1, hn);
    twk_id outs[5] = {twk_sum(g, x), twk_mean(g, x), twk_weighted_sum(g, x, w), twk_sqsum_parts(g, x, P), -1};
    outs[4] = twk_grad_norm(g, outs[3], hy);
    size_t bytes[5] = {4, 4, 4, (size_t)P * 8, 8};
    for (int o = 0; o < 5; o++) twk_graph_output(g, outs[o]);
    twk_plan *p = NULL;
    if (twk_graph_status(g) != TWK_OK || twk_plan_compile(g, dev, 1, NULL, 0, &p) != TWK_OK) {
        check(0, "n=%lld: compile: %s", (long long)n, twk_last_error());
        twk_graph_free(g);
        return;
    }
    float *xs = malloc((size_t)n * 4), *ws = malloc((size_t)n * 4), hyper[TWK_HYPER_N] = {0};
    float *res[5];
    for (int o = 0; o < 5; o++) res[o] = malloc(bytes[o]);
    for (int64_t i = 0; i < n; i++) xs[i] = sample(kind), ws[i] = sample(0);
    twk_id ins[3] = {x, w, hy};
    float *in_data[3] = {xs, ws, hyper};
    size_t in_bytes[3] = {(size_t)n * 4, (size_t)n * 4, sizeof hyper};
    int same = runs_agree(dev, g, p, outs, bytes, 5, ins, in_data, in_bytes, 3, res);
    check(same, "n=%-8lld data %d: two runs and a second plan give the same bits", (long long)n, kind);
    /* float64 references */
    double S = 0, A = 0, SW = 0, AW = 0, SQ = 0;
    for (int64_t i = 0; i < n; i++) {
        S += xs[i], A += fabs(xs[i]);
        SW += (double)xs[i] * ws[i], AW += fabs((double)xs[i] * ws[i]);
        SQ += (double)xs[i] * xs[i];
    }
    int64_t G = twk_wide_tiles(cus, 1, n, (int64_t)TWK_WIDE_LOCAL * TWK_WIDE_GRAIN);
    double c2 = c2_of(depth_sum(n, 1, G));
    char what[96];
    snprintf(what, sizeof what, "n=%lld d%d sum (%lld tiles)", (long long)n, kind, (long long)G);
    judge(what, res[0][0], S, U * fabs(S) + c2 * A);
    snprintf(what, sizeof what, "n=%lld d%d mean", (long long)n, kind);
    judge(what, res[1][0], S / (double)n, gam(3) * fabs(S) / (double)n + (1 + gam(3)) * c2 * A / (double)n);
    snprintf(what, sizeof what, "n=%lld d%d weighted_sum", (long long)n, kind);
    judge(what, res[2][0], SW, U * fabs(SW) + kp * U * AW + c2 * AW);
    /* the slices as every backend cuts them, and the norm */
    int64_t k = twk_wide_tiles(cus, P, cdiv(n, P), (int64_t)TWK_WIDE_LOCAL * TWK_WIDE_GRAIN);
    /* a slice's pair (hi, lo) read as hi + lo in double: no final rounding, the second-order term only */
    double c2s = c2_of(depth_sum(n, P, k)), worst = -1, worst_bound = 0, worst_ref = 0;
    for (int s = 0; s < P; s++) {
        int64_t b = twk_wide_tile_start(n, P, s), e = twk_wide_tile_start(n, P, s + 1);
        double q = 0;
        for (int64_t i = b; i < e; i++) q += (double)xs[i] * xs[i];
        double err = fabs((double)res[3][2 * s] + (double)res[3][2 * s + 1] - q), bound = (kp * U + c2s) * q * 1.0001;
        if (worst < 0 || ratio(err, bound) > ratio(worst, worst_bound)) worst = err, worst_bound = bound, worst_ref = q;
    }
    snprintf(what, sizeof what, "n=%lld d%d sqsum_parts %d slices x %lld", (long long)n, kind, P, (long long)k);
    judge_err(what, worst, worst_bound, worst_ref);
    double c2n = c2_of(depth_sum(n, P, k) + (double)cdiv(P, 32) + 8), norm = sqrt(SQ);
    snprintf(what, sizeof what, "n=%lld d%d grad_norm", (long long)n, kind);
    judge(what, res[4][0], norm, (0.5 * ((1 + kp) * U + c2n) * (1 + U) + 10 * U) * norm * 1.0001);
    for (int o = 0; o < 5; o++) free(res[o]);
    free(xs);
    free(ws);
    twk_plan_free(p);
    twk_graph_free(g);
}

/* dw of rmsnorm(x, w) under the loss sum(y * r): sum_rows r x rstd (rmsnorm_back_w) */
static void check_back_w(twk_device *dev, int64_t R, int64_t D) {
    const float eps = 1e-6f;
    int64_t xne[2] = {R, D}, wne[1] = {D};
    twk_graph *g = twk_graph_new();
    twk_id x = twk_param(g, "x", 2, xne, false), w = twk_param(g, "w", 1, wne, true);
    twk_id r = twk_input(g, "r", TWK_F32, 2, xne);
    twk_id loss = twk_weighted_sum(g, twk_rmsnorm(g, x, w, eps), r);
    twk_id dw = -1;
    if (twk_graph_backward(g, loss) == TWK_OK) dw = twk_graph_grad(g, w);
    twk_graph_output(g, dw);
    twk_plan *p = NULL;
    if (twk_graph_status(g) != TWK_OK || dw < 0 || twk_plan_compile(g, dev, 1, NULL, 0, &p) != TWK_OK) {
        check(0, "rmsnorm_back_w %lldx%lld: compile: %s", (long long)R, (long long)D, twk_last_error());
        twk_graph_free(g);
        return;
    }
    size_t nx = (size_t)(R * D);
    float *xs = malloc(nx * 4), *rs = malloc(nx * 4), *got = malloc((size_t)D * 4);
    for (size_t i = 0; i < nx; i++) xs[i] = sample(0), rs[i] = sample(0);
    twk_id ins[2] = {x, r}; /* w is dead in dw's plan: dw = sum r x rstd does not read it */
    float *in_data[2] = {xs, rs};
    size_t in_bytes[2] = {nx * 4, nx * 4}, ob[1] = {(size_t)D * 4};
    int same = runs_agree(dev, g, p, &dw, ob, 1, ins, in_data, in_bytes, 2, &got);
    check(same, "rmsnorm_back_w %lldx%lld: two runs and a second plan give the same bits", (long long)R, (long long)D);
    double *S = calloc((size_t)D, sizeof *S), *A = calloc((size_t)D, sizeof *A);
    for (int64_t i = 0; i < R; i++) {
        double ss = 0;
        for (int64_t d = 0; d < D; d++) ss += (double)xs[i * D + d] * xs[i * D + d];
        double rstd = 1.0 / sqrt(ss / (double)D + (double)eps);
        for (int64_t d = 0; d < D; d++) {
            double t = (double)rs[i * D + d] * xs[i * D + d] * rstd;
            S[d] += t, A[d] += fabs(t);
        }
    }
    int C = twk_wide_cols(D);
    int64_t nb = cdiv(D, C), T = twk_wide_tiles(cus, nb, R, (int64_t)(TWK_WIDE_LOCAL / C) * TWK_WIDE_GRAIN);
    int64_t lanes = 128 / C;
    double d = (double)(cdiv(cdiv(R, T), lanes) + 8 + cdiv(T, lanes) + 8 + 2), c2 = c2_of(d);
    double worst = -1, worst_bound = 0, ref_at = 0;
    for (int64_t j = 0; j < D; j++) { /* the column nearest its bound */
        double bound = U * fabs(S[j]) + 20 * U * A[j] + c2 * A[j];
        double err = isfinite(got[j]) ? fabs(got[j] - S[j]) : INFINITY;
        if (worst < 0 || ratio(err, bound) > ratio(worst, worst_bound)) worst = err, worst_bound = bound, ref_at = S[j];
    }
    char what[96];
    snprintf(what, sizeof what, "rmsnorm_back_w %lldx%lld (%lld x %lld tiles)", (long long)R, (long long)D,
             (long long)nb, (long long)T);
    judge_err(what, worst, worst_bound, ref_at);
    free(S), free(A), free(xs), free(rs), free(got);
    twk_plan_free(p);
    twk_graph_free(g);
}

int main(int argc, char **argv) {
    const char *spec = getenv("TWK_TEST_DEVICE") ? getenv("TWK_TEST_DEVICE") : "cpu";
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    twk_device *dev = NULL;
    if (twk_device_open(spec, &dev) != TWK_OK) {
        printf("FAIL cannot open %s: %s\n", spec, twk_last_error());
        return 1;
    }
    twk_device_props props;
    memset(&props, 0, sizeof props);
    if (twk_device_get_props(dev, &props) == TWK_OK) cus = props.compute_units;
    gpu = strncmp(spec, "cpu", 3) != 0;
    kp = strncmp(spec, "vulkan", 6) == 0 ? 1 : 0;
    printf("device %s (%s), %d compute units: %lld stage-1 tiles at most for one sum\n", spec, props.name, cus,
           (long long)twk_wide_tiles(cus, 1, INT64_MAX / 2, 1));
    const int64_t sizes[] = {1, 2, 3, 97, 1021, 65537, 1000003, 3000017};
    int ns = quick ? 7 : (int)(sizeof sizes / sizeof sizes[0]); /* --quick: up to 1000003 */
    for (int i = 0; i < ns; i++)
        for (int kind = 0; kind < 2; kind++) check_sums(dev, sizes[i], kind);
    const int64_t shapes[][2] = {{1, 1}, {3, 5}, {131, 67}, {20011, 7}, {4099, 128}, {257, 4096}, {8191, 1000}};
    int nsh = quick ? 5 : (int)(sizeof shapes / sizeof shapes[0]);
    for (int i = 0; i < nsh; i++) check_back_w(dev, shapes[i][0], shapes[i][1]);
    printf("largest error / bound: %.3f\n", worst_ratio);
    twk_device_close(dev);
    printf("%d failures\n", check_failures);
    return check_failures != 0;
}
