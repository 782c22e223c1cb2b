/* Packed multi-LoRA training as the service packs it (issue 15): the mix of
 * tests/sdk/test_packed_training.py — eight runs of the built-in model with
 * ranks 4, 8, 16, 32, 8, 16, 8, 32, cross_entropy / importance_sampling /
 * dpo, four sequences of 10..15 tokens each, lm_head adapted as the SDK's
 * default — through one pack the size of the service's (capacity 2048, 32
 * slots), first each run alone (the slots' rank growing run by run, as the
 * SDK test's tenants come one at a time), then all eight together; and the
 * same without lm_head (the two-product unembedding). Each run's logprobs,
 * loss, metrics and gradients together must equal alone bit for bit on the
 * CPU (within 1e-5 relative elsewhere).
 *
 * Before TWK_GEMM_ROW_PERIOD (twinkle/ops.h) the segments sat at 16-row
 * boundaries: on an AVX2 EPYC, OpenBLAS's Zen sgemm kernel sums the rows of
 * each 12-row block in two orders (and its thread split moves the blocks),
 * so a segment at row 64 got 1-3 ulp other logprobs than at row 0.
 *
 * And the products themselves: rows placed at a multiple of the device's
 * gemm_row_period (12 with OpenBLAS's Haswell / Zen kernels, else 48) in a
 * product of a multiple of it (one tile; column tiles and row tiles cut on the
 * pool's threads), f32 and bf16 weights, both orientations (x w^T, the
 * forward; dy w, its gradient), give the same bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "check.h"
#include "trainer_util.h"
#include "twinkle/twinkle.h"

#define NR 8
#define NSEQ 4
#define MAXT (NSEQ * 15)

static const int RANK[NR] = {4, 8, 16, 32, 8, 16, 8, 32};
static const char *const LOSS[NR] = {"cross_entropy", "importance_sampling", "dpo", "cross_entropy",
                                     "dpo", "importance_sampling", "cross_entropy", "importance_sampling"};

typedef struct run_data {
    twk_loss_spec spec;
    twk_loss_batch b;
    int64_t off[NSEQ + 1];
    int32_t tok[MAXT], tgt[MAXT];
    float w[MAXT], adv[MAXT], q[MAXT];
} run_data;

typedef struct outcome {
    float lp[MAXT];
    twk_loss_result res;
    float *grad;
    int64_t n_grad;
} outcome;

/* The SDK test's step data: counting sequences on a clock of 32 tokens from 100; dpo's pairs are
 * a counting continuation and the same prompt with scrambled targets, the first 3 tokens weight 0. */
static void make_run(run_data *d, int i, twk_rng *r) {
    int dpo = !strcmp(LOSS[i], "dpo"), is = !strcmp(LOSS[i], "importance_sampling");
    twk_loss_spec_init(LOSS[i], &d->spec);
    d->off[0] = 0;
    for (int s = 0; s < NSEQ; s++) {
        int len = 10 + (int)(twk_rng_next(r) % 6), start = (int)(twk_rng_next(r) % 32);
        int64_t o = d->off[s];
        for (int k = 0; k < len; k++) {
            d->tok[o + k] = 100 + (start + k) % 32;
            d->tgt[o + k] = dpo && s % 2 ? 100 + (int32_t)(twk_rng_next(r) % 32) : 100 + (start + k + 1) % 32;
            d->w[o + k] = dpo && k < 3 ? 0.0f : 1.0f;
            d->adv[o + k] = (float)twk_rng_normal(r);
            d->q[o + k] = -3.0f - (float)(twk_rng_next(r) % 1000) / 1000.0f;
        }
        d->off[s + 1] = o + len;
    }
    d->b = (twk_loss_batch){NSEQ, d->off, d->tok, 0, d->tgt, {0}, NULL};
    d->b.in[TWK_IN_WEIGHTS] = d->w;
    if (is) {
        d->b.in[TWK_IN_ADVANTAGES] = d->adv;
        d->b.in[TWK_IN_LOGPROBS] = d->q;
    }
}

/* Run i's trainer (its rank, seeded; every adapter tensor random so B != 0), lm_head adapted or not. */
static twk_trainer *make_trainer(twk_model *m, int i, int unembed) {
    twk_lora_config lc = twk_lora_default();
    lc.rank = RANK[i];
    lc.train_unembed = unembed;
    lc.seed = (uint64_t)(50 + i);
    twk_trainer *t = NULL;
    if (twk_trainer_new(m, &lc, 2048, &t) != TWK_OK) return NULL;
    twk_rng r;
    twk_rng_seed(&r, (uint64_t)(100 + i));
    trainer_randomize(t, &r, 0.05);
    return t;
}

static void take_grads(twk_trainer *t, outcome *o) { o->grad = trainer_take_grads(t, &o->n_grad); }

/* The largest distance in units in the last place between a[k] and b[k], and max |a - b|. */
static int64_t max_ulps(const float *a, const float *b, int64_t n, double *absd) {
    int64_t u = 0;
    double d = 0;
    for (int64_t k = 0; k < n; k++) {
        int32_t x, y;
        memcpy(&x, &a[k], 4);
        memcpy(&y, &b[k], 4);
        int64_t e = llabs((int64_t)x - y);
        if (e > u) u = e;
        d = fmax(d, fabs((double)a[k] - b[k]));
    }
    *absd = d;
    return u;
}

static double rel_of(double absd, const float *b, int64_t n) {
    double m = 1e-30;
    for (int64_t k = 0; k < n; k++) m = fmax(m, fabs((double)b[k]));
    return absd / m;
}

/* The eight runs alone (one at a time through the shared pack), then together; every run compared. */
static void service_mix(twk_model *m, int exact, int unembed) {
    twk_rng r;
    twk_rng_seed(&r, 7);
    static run_data d[NR];
    outcome alone[NR], together[NR];
    memset(alone, 0, sizeof alone);
    memset(together, 0, sizeof together);
    for (int i = 0; i < NR; i++) make_run(&d[i], i, &r);
    twk_pack *p = NULL;
    int ok = twk_pack_new(m, 2048, 32, &p) == TWK_OK;
    for (int i = 0; ok && i < NR; i++) {
        twk_trainer *t = make_trainer(m, i, unembed);
        twk_loss_job j = {t, &d[i].spec, &d[i].b, 1, alone[i].lp};
        ok = t && twk_loss_steps(p, &j, 1) == TWK_OK && j.st == TWK_OK;
        if (t && j.st != TWK_OK) printf("     run %d alone: %s\n", i, j.err);
        alone[i].res = j.res;
        if (t) take_grads(t, &alone[i]);
        twk_trainer_free(t);
    }
    twk_trainer *t[NR] = {0};
    twk_loss_job jobs[NR];
    for (int i = 0; ok && i < NR; i++) {
        ok = (t[i] = make_trainer(m, i, unembed)) != NULL;
        jobs[i] = (twk_loss_job){t[i], &d[i].spec, &d[i].b, 1, together[i].lp};
    }
    ok = ok && twk_loss_steps(p, jobs, NR) == TWK_OK;
    twk_pack_stats ps;
    twk_pack_get_stats(p, &ps);
    check(ok && ps.shared_passes > 0 && ps.max_segments == NR,
          "%s: 8 runs alone through one service-sized pack, then together (%lld passes, %lld shared, up to %d runs)",
          unembed ? "lm_head adapted" : "no lm_head adapter", (long long)ps.passes, (long long)ps.shared_passes,
          ps.max_segments);
    for (int i = 0; ok && i < NR; i++) {
        if (jobs[i].st != TWK_OK) {
            check(0, "run %d together: %s", i, jobs[i].err);
            continue;
        }
        together[i].res = jobs[i].res;
        take_grads(t[i], &together[i]);
        int64_t n = d[i].off[NSEQ];
        double lp_abs = 0, g_abs = 0;
        int64_t lp_u = max_ulps(together[i].lp, alone[i].lp, n, &lp_abs);
        int64_t g_u = max_ulps(together[i].grad, alone[i].grad, together[i].n_grad, &g_abs);
        double loss_d = fabs(together[i].res.loss - alone[i].res.loss);
        int same = together[i].res.n_metrics == alone[i].res.n_metrics;
        for (int k = 0; same && k < alone[i].res.n_metrics; k++)
            same = exact ? together[i].res.values[k] == alone[i].res.values[k]
                         : fabs(together[i].res.values[k] - alone[i].res.values[k]) <= 1e-5 * fmax(1, fabs(alone[i].res.values[k]));
        if (exact) same = same && lp_u == 0 && g_u == 0 && loss_d == 0;
        else
            same = same && rel_of(lp_abs, alone[i].lp, n) <= 1e-5 && rel_of(g_abs, alone[i].grad, alone[i].n_grad) <= 1e-5 &&
                   loss_d <= 1e-5 * fmax(1, fabs(alone[i].res.loss));
        check(same, "run %d (%s, rank %d) together == alone%s: logprobs %lld ulp (%.3g), gradients %lld ulp (%.3g), loss %.3g",
              i, LOSS[i], RANK[i], exact ? " bit for bit" : " within 1e-5", (long long)lp_u, lp_abs, (long long)g_u, g_abs,
              loss_d);
    }
    for (int i = 0; i < NR; i++) {
        free(alone[i].grad);
        free(together[i].grad);
        twk_trainer_free(t[i]);
    }
    twk_pack_free(p);
}

/* y = x w^T [T, N] and z = dy w [T, K] over token rows; w [N, K] f32 or bf16, frozen. */
typedef struct products {
    twk_graph *g;
    twk_plan *plan;
    twk_id x, dy, w, y, z;
} products;

static int products_new(products *pr, twk_device *dev, twk_dtype wt, int64_t N, int64_t K, int64_t cap) {
    memset(pr, 0, sizeof *pr);
    pr->g = twk_graph_new();
    int64_t xs[2] = {TWK_T, K}, ds[2] = {TWK_T, N}, ws[2] = {N, K};
    pr->x = twk_input(pr->g, "x", TWK_F32, 2, xs);
    pr->dy = twk_input(pr->g, "dy", TWK_F32, 2, ds);
    pr->w = twk_param_dtype(pr->g, "w", wt, 2, ws, false);
    pr->y = twk_matmul(pr->g, pr->x, pr->w, false, true);
    pr->z = twk_matmul(pr->g, pr->dy, pr->w, false, false);
    twk_graph_output(pr->g, pr->y);
    twk_graph_output(pr->g, pr->z);
    if (twk_graph_status(pr->g) != TWK_OK || twk_plan_compile(pr->g, dev, cap, NULL, 0, &pr->plan) != TWK_OK) return 0;
    float *wf = malloc((size_t)(N * K) * sizeof *wf);
    void *wb = malloc((size_t)(N * K) * 4);
    for (int64_t k = 0; k < N * K; k++) wf[k] = (float)(k % 23) / 23.0f - 0.5f + (float)(k % 7) * 1e-3f;
    twk_dtype_from_f32(wt, wf, wb, N * K);
    int ok = twk_plan_write(pr->plan, pr->w, 1, wb, (size_t)(N * K) * (wt == TWK_F32 ? 4 : 2)) == TWK_OK;
    free(wf);
    free(wb);
    return ok;
}

/* Runs n rows whose rows [at, at + P) are the probe rows (the rest other values); y and z of
 * those rows into *y, *z. */
static int products_run(products *pr, int64_t n, int64_t at, int64_t P, int64_t N, int64_t K, float *y, float *z) {
    float *x = malloc((size_t)(n * K) * sizeof *x), *dy = malloc((size_t)(n * N) * sizeof *dy);
    float *oy = malloc((size_t)(n * N) * sizeof *oy), *oz = malloc((size_t)(n * K) * sizeof *oz);
    for (int64_t r = 0; r < n; r++) {
        int probe = r >= at && r < at + P;
        int64_t pr_r = probe ? r - at : r + 1000;
        for (int64_t k = 0; k < K; k++) x[r * K + k] = (float)sin(0.37 * (double)(pr_r * K + k));
        for (int64_t k = 0; k < N; k++) dy[r * N + k] = (float)cos(0.61 * (double)(pr_r * N + k));
    }
    int ok = twk_plan_write(pr->plan, pr->x, n, x, (size_t)(n * K) * 4) == TWK_OK &&
             twk_plan_write(pr->plan, pr->dy, n, dy, (size_t)(n * N) * 4) == TWK_OK && twk_plan_run(pr->plan, n) == TWK_OK &&
             twk_plan_read(pr->plan, pr->y, n, oy, (size_t)(n * N) * 4) == TWK_OK &&
             twk_plan_read(pr->plan, pr->z, n, oz, (size_t)(n * K) * 4) == TWK_OK;
    if (ok) {
        memcpy(y, oy + at * N, (size_t)(P * N) * sizeof *y);
        memcpy(z, oz + at * K, (size_t)(P * K) * sizeof *z);
    }
    free(x);
    free(dy);
    free(oy);
    free(oz);
    return ok;
}

/* P probe rows alone (a product of P rows, P the device's gemm_row_period, the period packed passes
 * align their segments to) and at multiples of P in products of multiples of P rows: 3P .. 10P, and
 * 41P (row tiles on the pool's threads cut at multiples of 48, which a probe at 17P straddles when
 * P is 12). */
static void product_rows(twk_device *dev, int exact) {
    twk_device_props dp;
    int64_t P = twk_device_get_props(dev, &dp) == TWK_OK && dp.gemm_row_period > 0 ? dp.gemm_row_period : TWK_GEMM_ROW_PERIOD;
    printf("device gemm_row_period %d: probes of %lld rows\n", dp.gemm_row_period, (long long)P);
    /* N, K: one tile on one thread; two column tiles, and row tiles, on the pool's threads */
    static const int64_t shapes[][2] = {{384, 128}, {2048, 256}};
    static const int64_t runs[][2] = {{3, 1}, {3, 2}, {5, 4}, {9, 1}, {9, 8}, {10, 8}, {10, 9}, {41, 17}, {41, 40}};
    const int n_runs = (int)(sizeof runs / sizeof runs[0]);
    for (int s = 0; s < 2; s++)
        for (int h = 0; h < 2; h++) {
            int64_t N = shapes[s][0], K = shapes[s][1];
            twk_dtype wt = h ? TWK_BF16 : TWK_F32;
            products pr;
            float *y0 = malloc((size_t)(P * N) * 4), *z0 = malloc((size_t)(P * K) * 4);
            float *y1 = malloc((size_t)(P * N) * 4), *z1 = malloc((size_t)(P * K) * 4);
            int ok = products_new(&pr, dev, wt, N, K, 41 * P) && products_run(&pr, P, 0, P, N, K, y0, z0);
            int64_t worst = 0;
            double worst_abs = 0;
            for (int q = 0; ok && q < n_runs; q++) {
                ok = products_run(&pr, runs[q][0] * P, runs[q][1] * P, P, N, K, y1, z1);
                double a = 0, b = 0;
                int64_t u = max_ulps(y1, y0, P * N, &a), v = max_ulps(z1, z0, P * K, &b);
                if (u > worst) worst = u;
                if (v > worst) worst = v;
                worst_abs = fmax(worst_abs, fmax(a, b));
            }
            check(ok && (exact ? worst == 0 : worst_abs <= 1e-4),
                  "x w^T and dy w, w [%lld, %lld] %s: %lld rows at multiples of %lld in products of 3..41 times that "
                  "== alone%s: %lld ulp (%.3g)",
                  (long long)N, (long long)K, h ? "bf16" : "f32", (long long)P, (long long)P,
                  exact ? " bit for bit" : " within 1e-4", (long long)worst, worst_abs);
            twk_plan_free(pr.plan);
            twk_graph_free(pr.g);
            free(y0);
            free(z0);
            free(y1);
            free(z1);
        }
}

/* A kernel set forced with OPENBLAS_CORETYPE (the ctest variants) that this CPU cannot run: skip. */
static int forced_core_unsupported(void) {
    const char *core = getenv("OPENBLAS_CORETYPE");
    if (!core || !*core) return 0;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (!strcasecmp(core, "Haswell")) return !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma");
    if (!strcasecmp(core, "Sandybridge")) return !__builtin_cpu_supports("avx");
    return 0;
#else
    return 1;
#endif
}

int main(void) {
    if (forced_core_unsupported()) {
        printf("SKIP: this CPU cannot run OpenBLAS's %s kernels\n", getenv("OPENBLAS_CORETYPE"));
        return 77;
    }
    const char *dn = getenv("TWK_TEST_DEVICE");
    dn = dn && *dn ? dn : "cpu";
    twk_device *dev = NULL;
    twk_model *m = NULL;
    if (twk_device_open(dn, &dev) != TWK_OK || twk_model_builtin(dev, &m) != TWK_OK) {
        printf("FAIL opening %s and the built-in model: %s\n", dn, twk_last_error());
        return 1;
    }
    int exact = !strncmp(dn, "cpu", 3);
    printf("device %s: together vs alone %s\n", dn, exact ? "bit-identical" : "within 1e-5 relative");
    product_rows(dev, exact);
    service_mix(m, exact, 1);
    service_mix(m, exact, 0);
    twk_model_free(m);
    twk_device_close(dev);
    printf("%s\n", check_failures ? "FAILED" : "all passed");
    return check_failures ? 1 : 0;
}
