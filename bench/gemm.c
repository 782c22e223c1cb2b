/* bench_gemm: MATMUL through a compiled plan vs a direct cblas_sgemm on Qwen3-0.6B projection
 * shapes in the three transposes of a training step; prints GFLOP/s and ratios, checks results.
 * --device SPEC times the plan on another device (the host BLAS then only gives the reference),
 * --compare SPEC times a second device in the same run and prints the ratio device/compare. */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "twinkle/twinkle.h"
#include "twk_backend.h" /* the backend interface: tables, launches */

/* The three products a training step does with one weight W[N, K]. */
typedef enum { PASS_FWD = 0, PASS_DGRAD, PASS_WGRAD, PASS_COUNT } pass_kind;

static const char *pass_name[PASS_COUNT] = {"fwd", "dgrad", "wgrad"};
static const char *pass_formula[PASS_COUNT] = {"Y=X.W^T", "dX=dY.W", "dW=dY^T.X"};
static const char *pass_trans[PASS_COUNT] = {"N,T", "N,N", "T,N"};

/* One sgemm as both sides run it: C[m, n] = op(A) . op(B) with inner k. A is
 * stored [a_rows, a_cols] and B [b_rows, b_cols], row-major. */
typedef struct gemm_case {
    pass_kind pass;
    int64_t m, n, k;
    int ta, tb;
    int64_t a_rows, a_cols, b_rows, b_cols;
} gemm_case;

static gemm_case make_case(pass_kind pass, int64_t M, int64_t K, int64_t N) {
    gemm_case c;
    switch (pass) {
    case PASS_FWD: /* Y[M,N] = X[M,K] . W[N,K]^T */
        c = (gemm_case){pass, M, N, K, 0, 1, M, K, N, K};
        break;
    case PASS_DGRAD: /* dX[M,K] = dY[M,N] . W[N,K] */
        c = (gemm_case){pass, M, K, N, 0, 0, M, N, N, K};
        break;
    default: /* dW[N,K] = dY[M,N]^T . X[M,K] */
        c = (gemm_case){pass, N, K, M, 1, 0, M, N, M, K};
        break;
    }
    return c;
}

static void blas_run(const gemm_case *c, const float *A, const float *B, float *C) {
    cblas_sgemm(CblasRowMajor, c->ta ? CblasTrans : CblasNoTrans, c->tb ? CblasTrans : CblasNoTrans,
                (int)c->m, (int)c->n, (int)c->k, 1.0f, A, (int)c->a_cols, B, (int)c->b_cols, 0.0f, C,
                (int)c->n);
}

/* A few entries of the reference recomputed in double, independently of the
 * BLAS, so a wrong cblas call in this file cannot hide an engine bug. Returns
 * the largest |diff| / max|ref| seen. */
static double spot_check(const gemm_case *c, const float *A, const float *B, const float *C,
                         double ref_max, twk_rng *rng) {
    double worst = 0;
    for (int s = 0; s < 32; s++) {
        int64_t i = twk_rng_below(rng, c->m), j = twk_rng_below(rng, c->n);
        double acc = 0;
        for (int64_t p = 0; p < c->k; p++) {
            double a = c->ta ? A[p * c->a_cols + i] : A[i * c->a_cols + p];
            double b = c->tb ? B[j * c->b_cols + p] : B[p * c->b_cols + j];
            acc += a * b;
        }
        double d = fabs(acc - (double)C[i * c->n + j]) / (ref_max > 0 ? ref_max : 1);
        if (d > worst) worst = d;
    }
    return worst;
}

typedef struct result {
    double eng_s, blas_s, max_diff, ref_max;
    int ok;
} result;

/* Builds and compiles the plan for one case, times it against the BLAS and
 * compares the outputs. Returns 0 on an engine error (message printed). */
static int bench_case(twk_device *dev, const gemm_case *c, int reps, int blas_timed, const float *pool_a,
                      const float *pool_b, float *out_eng, float *out_ref, twk_rng *rng, result *res) {
    twk_graph *g = twk_graph_new();
    if (!g) {
        fprintf(stderr, "bench_gemm: graph_new: %s\n", twk_last_error());
        return 0;
    }
    int64_t ane[2] = {c->a_rows, c->a_cols}, bne[2] = {c->b_rows, c->b_cols};
    twk_id a = twk_input(g, "a", TWK_F32, 2, ane);
    twk_id b = twk_input(g, "b", TWK_F32, 2, bne);
    twk_id y = twk_matmul(g, a, b, c->ta != 0, c->tb != 0);
    if (twk_graph_status(g) != TWK_OK) {
        fprintf(stderr, "bench_gemm: building the graph: %s\n", twk_graph_error(g));
        twk_graph_free(g);
        return 0;
    }
    int64_t yne[TWK_MAX_DIMS];
    if (twk_node_shape(g, y, 1, yne) != 2 || yne[0] != c->m || yne[1] != c->n) {
        fprintf(stderr, "bench_gemm: matmul output is not [%lld, %lld]\n", (long long)c->m,
                (long long)c->n);
        twk_graph_free(g);
        return 0;
    }
    twk_plan *p = NULL;
    if (twk_graph_output(g, y) != TWK_OK || twk_plan_compile(g, dev, 1, NULL, 0, &p) != TWK_OK) {
        fprintf(stderr, "bench_gemm: compiling: %s\n", twk_last_error());
        twk_graph_free(g);
        return 0;
    }
    size_t a_bytes = (size_t)(c->a_rows * c->a_cols) * sizeof(float);
    size_t b_bytes = (size_t)(c->b_rows * c->b_cols) * sizeof(float);
    size_t y_bytes = (size_t)(c->m * c->n) * sizeof(float);
    int ok = 0;
    if (twk_plan_write(p, a, 1, pool_a, a_bytes) != TWK_OK ||
        twk_plan_write(p, b, 1, pool_b, b_bytes) != TWK_OK) {
        fprintf(stderr, "bench_gemm: plan_write: %s\n", twk_last_error());
        goto done;
    }
    /* warm-up: first-touch of the arena, BLAS thread start, caches */
    if (twk_plan_run(p, 1) != TWK_OK) {
        fprintf(stderr, "bench_gemm: plan_run: %s\n", twk_last_error());
        goto done;
    }
    blas_run(c, pool_a, pool_b, out_ref);
    /* Off the host, one run may be short next to a launch and a wait: time
     * `inner` runs back to back, about 20 ms, and divide. */
    int inner = 1;
    if (!blas_timed) {
        double t0 = twk_now();
        if (twk_plan_run(p, 1) != TWK_OK) {
            fprintf(stderr, "bench_gemm: plan_run: %s\n", twk_last_error());
            goto done;
        }
        double once = twk_now() - t0;
        inner = once > 0 ? (int)fmin(200.0, fmax(1.0, 0.02 / once)) : 200;
    }
    double best_e = INFINITY, best_b = INFINITY;
    for (int r = 0; r < reps; r++) {
        double t0 = twk_now();
        for (int k = 0; k < inner; k++)
            if (twk_plan_run(p, 1) != TWK_OK) {
                fprintf(stderr, "bench_gemm: plan_run: %s\n", twk_last_error());
                goto done;
            }
        double t1 = twk_now();
        if (blas_timed) blas_run(c, pool_a, pool_b, out_ref);
        double t2 = twk_now();
        if ((t1 - t0) / inner < best_e) best_e = (t1 - t0) / inner;
        if (t2 - t1 < best_b) best_b = t2 - t1;
    }
    if (twk_plan_read(p, y, 1, out_eng, y_bytes) != TWK_OK) {
        fprintf(stderr, "bench_gemm: plan_read: %s\n", twk_last_error());
        goto done;
    }
    double ref_max = 0, diff = 0;
    int nan = 0;
    for (int64_t i = 0; i < c->m * c->n; i++) {
        double r = fabs((double)out_ref[i]), d = fabs((double)out_eng[i] - (double)out_ref[i]);
        if (isnan(d)) nan = 1;
        if (r > ref_max) ref_max = r;
        if (d > diff) diff = d;
    }
    if (nan) diff = NAN; /* printed as nan, and a failure */
    double spot = spot_check(c, pool_a, pool_b, out_ref, ref_max, rng);
    res->eng_s = best_e;
    res->blas_s = best_b;
    res->max_diff = diff;
    res->ref_max = ref_max;
    res->ok = !nan && diff <= 1e-3 * ref_max && ref_max > 0 && spot <= 1e-3;
    if (spot > 1e-3)
        fprintf(stderr, "bench_gemm: the BLAS reference itself disagrees with a double-precision dot "
                        "product (relative %.3g): this bench's cblas call is wrong\n", spot);
    ok = 1;
done:
    twk_plan_free(p);
    twk_graph_free(g);
    return ok;
}

/* 64-byte aligned like the engine's buffers, so the BLAS side gets no
 * alignment handicap. */
static float *alloc_floats(size_t n) {
    size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    return aligned_alloc(64, bytes ? bytes : 64);
}

static void fill_uniform(float *x, size_t n, twk_rng *rng) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(2.0 * twk_rng_uniform(rng) - 1.0);
}

static int is_cpu_spec(const char *spec) { return strcspn(spec, ":") == 3 && !strncmp(spec, "cpu", 3); }

static twk_device *open_device(const char *spec, twk_device_props *props) {
    twk_device *dev = NULL;
    if (twk_device_open(spec, &dev) != TWK_OK) {
        fprintf(stderr, "bench_gemm: %s\n", twk_last_error());
        return NULL;
    }
    if (twk_device_backend(dev)->device_props(0, props) != TWK_OK) {
        fprintf(stderr, "bench_gemm: device_props: %s\n", twk_last_error());
        twk_device_close(dev);
        return NULL;
    }
    return dev;
}

int main(int argc, char **argv) {
    long reps = 5, M = 2048, reps_flag = -1;
    int quick = 0;
    const char *device = "cpu", *compare = NULL;
    double peak = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: bench_gemm [--quick] [--reps N] [--m M] [--device SPEC] [--compare SPEC] [--peak-tflops P]\n"
                   "  MATMUL through a compiled plan vs cblas_sgemm, Qwen3-0.6B projection\n"
                   "  shapes at M tokens (default 2048), K, N in {1024, 2048, 3072}, forward,\n"
                   "  input-gradient and weight-gradient transposes. Best of N reps (default 5).\n"
                   "  --quick: K, N in {1024, 3072} only and 3 reps.\n"
                   "  --device SPEC: time the plan on that device (default cpu); off the CPU the\n"
                   "    host BLAS only computes the reference, and TFLOP/s are reported.\n"
                   "  --compare SPEC: also time the plan on SPEC (e.g. cpu) and print device/SPEC.\n"
                   "  --peak-tflops P: print the device's figure as a fraction of a P TFLOP/s peak.\n");
            return 0;
        }
        if (!strcmp(argv[i], "--quick")) {
            quick = 1;
            continue;
        }
        if (strcmp(argv[i], "--reps") && strcmp(argv[i], "--m") && strcmp(argv[i], "--device") &&
            strcmp(argv[i], "--compare") && strcmp(argv[i], "--peak-tflops")) {
            fprintf(stderr, "bench_gemm: unknown option '%s' (see --help)\n", argv[i]);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_gemm: %s needs a value (see --help)\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "--reps")) {
            if (!bench_parse_long("bench_gemm", argv[++i], "--reps", 1, 1000, &reps_flag)) return 2;
        } else if (!strcmp(argv[i], "--m")) {
            if (!bench_parse_long("bench_gemm", argv[++i], "--m", 1, 65536, &M)) return 2;
        } else if (!strcmp(argv[i], "--device")) {
            device = argv[++i];
        } else if (!strcmp(argv[i], "--compare")) {
            compare = argv[++i];
        } else { /* --peak-tflops */
            char *end = NULL;
            peak = strtod(argv[++i], &end);
            if (*end || !(peak > 0)) {
                fprintf(stderr, "bench_gemm: --peak-tflops wants a positive number, got '%s'\n", argv[i]);
                return 2;
            }
        }
    }
    if (quick) reps = 3;
    if (reps_flag > 0) reps = reps_flag;
    /* the plain CPU bench (engine against the BLAS, both timed) unless another device is asked for */
    int blas_timed = is_cpu_spec(device) && !compare;

    static const int64_t dims_full[] = {1024, 2048, 3072};
    static const int64_t dims_quick[] = {1024, 3072};
    const int64_t *dims = quick ? dims_quick : dims_full;
    int n_dims = quick ? 2 : 3;
    int64_t dmax = dims[n_dims - 1];

    /* Open the device first: the CPU device sets OpenBLAS to its thread count,
     * which the direct cblas calls below then share. */
    twk_device_props props, cprops;
    twk_device *dev = open_device(device, &props), *cmp = NULL;
    if (!dev) return 1;
    if (compare && !(cmp = open_device(compare, &cprops))) {
        twk_device_close(dev);
        return 1;
    }
    int blas_threads = openblas_get_num_threads();
    printf("bench_gemm: %s on %s; engine threads %d, OpenBLAS threads %d (%s)\n", twk_device_spec(dev), props.name,
           props.max_threads, blas_threads, openblas_get_config());
    if (cmp) printf("compared with %s on %s (%d threads)\n", twk_device_spec(cmp), cprops.name, cprops.max_threads);
    if (blas_timed && blas_threads != props.max_threads)
        printf("warning: thread counts differ; the comparison is not like for like\n");
    printf("M = %ld tokens, K, N in {", M);
    for (int i = 0; i < n_dims; i++) printf("%s%lld", i ? ", " : "", (long long)dims[i]);
    printf("}, best of %ld reps after 1 warm-up%s\n\n", reps,
           blas_timed ? ", engine and BLAS interleaved" : "; the host BLAS gives the reference only");

    /* Random operands at the largest size; every case reads a prefix. */
    int64_t big = M > dmax ? M : dmax;
    size_t pool_a_n = (size_t)(M * dmax), pool_b_n = (size_t)(big * dmax), out_n = (size_t)(big * dmax);
    float *pool_a = alloc_floats(pool_a_n), *pool_b = alloc_floats(pool_b_n);
    float *out_eng = alloc_floats(out_n), *out_ref = alloc_floats(out_n);
    if (!pool_a || !pool_b || !out_eng || !out_ref) {
        fprintf(stderr, "bench_gemm: out of host memory\n");
        free(pool_a), free(pool_b), free(out_eng), free(out_ref);
        twk_device_close(dev);
        twk_device_close(cmp);
        return 1;
    }
    twk_rng rng;
    twk_rng_seed(&rng, 20261129);
    fill_uniform(pool_a, pool_a_n, &rng);
    fill_uniform(pool_b, pool_b_n, &rng);

    const char *second = blas_timed ? "BLAS" : cmp ? twk_device_spec(cmp) : "";
    printf("%-5s %-10s %-4s %-6s %-6s %-17s %10s %10s %8s %10s\n", "pass", "product", "op", "K", "N",
           "sgemm m x n x k", blas_timed ? "engine" : twk_device_spec(dev), second,
           blas_timed ? "eng/BLAS" : cmp ? "ratio" : "", "max|diff|");
    printf("%-5s %-10s %-4s %-6s %-6s %-17s %10s %10s %8s %10s\n", "", "", "", "", "", "", "GFLOP/s",
           blas_timed || cmp ? "GFLOP/s" : "", "", "");
    double log_sum = 0, log_dev = 0, best_dev = 0;
    int n_cases = 0, failed = 0, rc = 0;
    double t_start = twk_now();
    for (int ki = 0; ki < n_dims && !rc; ki++) {
        for (int ni = 0; ni < n_dims && !rc; ni++) {
            for (int pi = 0; pi < PASS_COUNT; pi++) {
                int64_t K = dims[ki], N = dims[ni];
                gemm_case c = make_case((pass_kind)pi, M, K, N);
                result r, rc2 = {0};
                if (!bench_case(dev, &c, (int)reps, blas_timed, pool_a, pool_b, out_eng, out_ref, &rng, &r) ||
                    (cmp && !bench_case(cmp, &c, (int)reps, 0, pool_a, pool_b, out_eng, out_ref, &rng, &rc2))) {
                    rc = 1;
                    break;
                }
                double flop = 2.0 * (double)c.m * (double)c.n * (double)c.k;
                double ge = flop / r.eng_s * 1e-9;
                double gb = blas_timed ? flop / r.blas_s * 1e-9 : cmp ? flop / rc2.eng_s * 1e-9 : 0;
                double ratio = gb > 0 ? ge / gb : 0;
                char mnk[32], second_col[16] = "", ratio_col[16] = "";
                snprintf(mnk, sizeof mnk, "%lldx%lldx%lld", (long long)c.m, (long long)c.n, (long long)c.k);
                if (gb > 0) {
                    snprintf(second_col, sizeof second_col, "%.1f", gb);
                    snprintf(ratio_col, sizeof ratio_col, "%.3f", ratio);
                }
                int ok = r.ok && (!cmp || rc2.ok);
                double diff = cmp && rc2.max_diff > r.max_diff ? rc2.max_diff : r.max_diff;
                printf("%-5s %-10s %-4s %-6lld %-6lld %-17s %10.1f %10s %8s %10.2e%s\n", pass_name[pi],
                       pass_formula[pi], pass_trans[pi], (long long)K, (long long)N, mnk, ge, second_col, ratio_col,
                       diff, ok ? "" : "  MISMATCH");
                fflush(stdout);
                if (ratio > 0) log_sum += log(ratio);
                log_dev += log(ge);
                if (ge > best_dev) best_dev = ge;
                n_cases++;
                if (!ok) failed++;
            }
        }
    }
    if (!rc) {
        double geo = exp(log_sum / n_cases), geo_dev = exp(log_dev / n_cases);
        if (blas_timed)
            printf("\ngeometric mean engine/BLAS over %d products: %.3f (expected >= 0.95)%s\n", n_cases, geo,
                   geo < 0.95 ? "  BELOW EXPECTATION" : "");
        else
            printf("\n%s: geometric mean %.3f TFLOP/s, best %.3f TFLOP/s over %d products%s\n", twk_device_spec(dev),
                   geo_dev * 1e-3, best_dev * 1e-3, n_cases, cmp ? "" : "");
        if (cmp) printf("geometric mean %s/%s over %d products: %.3f\n", twk_device_spec(dev), twk_device_spec(cmp),
                        n_cases, geo);
        if (peak > 0)
            printf("%s: best %.1f%%, geometric mean %.1f%% of a %.4g TFLOP/s peak\n", twk_device_spec(dev),
                   100 * best_dev * 1e-3 / peak, 100 * geo_dev * 1e-3 / peak, peak);
        printf("wall time %.1f s\n", twk_now() - t_start);
        /* one line for scripts (bench/device/run.sh) */
        printf("SUMMARY bench_gemm device=%s tflops_geo=%.4f tflops_best=%.4f ratio=%.4f ok=%d\n", twk_device_spec(dev),
               geo_dev * 1e-3, best_dev * 1e-3, blas_timed || cmp ? geo : 0, failed == 0);
        if (failed) {
            printf("FAILED: %d product(s) differ from the BLAS by more than 1e-3 x max|ref|\n", failed);
            rc = 1;
        } else {
            printf("results: engine == BLAS within 1e-3 x max|ref| on every product\n");
        }
    }
    free(pool_a), free(pool_b), free(out_eng), free(out_ref);
    twk_device_close(dev);
    twk_device_close(cmp);
    return rc;
}
