/* Memory: activation recompute gives bit-identical losses, logprobs and gradients
 * on the CPU (LoRA and full training, the parity fixtures and a random model) and a
 * smaller forward+backward arena; the memory plan (twk_mem_plan_*, built from the
 * real graphs with shapes only) against what a real trainer allocates: the CPU
 * device's allocation counter and every host allocation of the engine (a counting
 * allocator), on the fixtures and on a 4-layer model of Qwen3-0.6B's widths, within
 * 10%; the peak RSS is printed beside them. The one-arena trainer runs a step in the
 * arena a caller hands it (shared by two trainers). bf16 models take the fused unembedding
 * too (bit-identical to their logits path) and are measured within the same 10%. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "twinkle/twinkle.h"

#ifndef TWK_PARITY_DIR
#define TWK_PARITY_DIR "tests/parity/fixtures"
#endif

static int fails;

static void check(int cond, const char *fmt, const char *what) {
    printf("%s ", cond ? "ok  " : "FAIL");
    printf(fmt, what);
    printf("\n");
    fails += !cond;
}

/* ---- a counting allocator: live and peak bytes of the engine's host allocations ---- */
#define HDR 64
static size_t live, peak;

static void *count_alloc(void *user, size_t bytes, size_t align) {
    (void)user;
    (void)align; /* HDR keeps the 64-byte alignment the engine asks for */
    void *p = NULL;
    size_t rounded = (bytes + HDR - 1) / HDR * HDR;
    if (posix_memalign(&p, HDR, HDR + (rounded ? rounded : HDR)) != 0) return NULL;
    *(size_t *)p = bytes;
    live += bytes;
    if (live > peak) peak = live;
    return (char *)p + HDR;
}

static void count_free(void *user, void *ptr) {
    (void)user;
    char *p = (char *)ptr - HDR;
    live -= *(size_t *)p;
    free(p);
}

static long rss_peak_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atol(line + 6);
    if (f) fclose(f);
    return kb;
}

/* A packed batch of two sequences of random ids below vocab. */
typedef struct {
    int32_t *tok, *tgt, *pos, *seg;
    float *w;
    twk_batch b;
} batch;

static void batch_make(batch *x, int64_t n, int vocab, uint64_t seed) {
    x->tok = malloc((size_t)n * sizeof *x->tok);
    x->tgt = malloc((size_t)n * sizeof *x->tgt);
    x->pos = malloc((size_t)n * sizeof *x->pos);
    x->seg = malloc((size_t)n * sizeof *x->seg);
    x->w = malloc((size_t)n * sizeof *x->w);
    twk_rng r;
    twk_rng_seed(&r, seed);
    int64_t half = n / 2;
    for (int64_t i = 0; i < n; i++) {
        x->tok[i] = (int32_t)twk_rng_below(&r, (uint64_t)vocab);
        x->tgt[i] = (int32_t)twk_rng_below(&r, (uint64_t)vocab);
        x->seg[i] = i < half ? 0 : (int32_t)half;
        x->pos[i] = (int32_t)(i - x->seg[i]);
        x->w[i] = 1.0f;
    }
    x->b = (twk_batch){.n = n, .tokens = x->tok, .targets = x->tgt, .positions = x->pos, .seg_start = x->seg, .weights = x->w};
}

static void batch_free(batch *x) {
    free(x->tok);
    free(x->tgt);
    free(x->pos);
    free(x->seg);
    free(x->w);
}

/* ---- two ways to plan one step: identical results ---- */
static char paths[2][16]; /* the unembedding paths of compare_tol's last two trainers */
/* A gradient tensor that is zero in exact arithmetic (the key projections' at one token: a softmax
 * over one key has no gradient) holds rounding noise the size of the step's other gradients times
 * 2^-24, so each tensor's difference is measured against the larger of its own largest magnitude
 * and GRAD_FLOOR times the step's largest gradient. */
#define GRAD_FLOOR 0.1
/* Two trainers on one batch: bit-identical loss, logprobs and gradients when tol is 0, else every
 * difference within tol relative to the largest magnitude of its tensor. */
static void compare_tol(twk_model *m, const char *name, int rank, int64_t n, twk_trainer_opts oa, twk_trainer_opts ob,
                        const char *how, double tol) {
    const twk_model_config *c = twk_model_cfg(m);
    twk_lora_config lc = twk_lora_default();
    lc.rank = rank ? rank : 4;
    lc.alpha = 8;
    twk_trainer *t[2] = {NULL, NULL};
    float loss[2] = {0, 0}, *lp[2] = {NULL, NULL};
    batch x;
    batch_make(&x, n, c->vocab, 5);
    for (int k = 0; k < 2; k++) {
        lp[k] = calloc((size_t)n, sizeof(float));
        if (twk_trainer_new_opts(m, rank ? &lc : NULL, n, k ? &ob : &oa, &t[k]) != TWK_OK ||
            twk_trainer_forward_backward(t[k], &x.b, lp[k], &loss[k]) != TWK_OK) {
            paths[k][0] = 0;
            printf("FAIL %s: %s\n", name, twk_last_error());
            fails++;
            goto out;
        }
    }
    for (int k = 0; k < 2; k++) snprintf(paths[k], sizeof paths[k], "%s", twk_trainer_unembed_path(t[k]));
    int same = !memcmp(&loss[0], &loss[1], sizeof(float)) && !memcmp(lp[0], lp[1], (size_t)n * sizeof(float));
    double lp_rel = 0, lp_big = 0;
    for (int64_t k = 0; k < n; k++) {
        double d = fabs((double)lp[0][k] - (double)lp[1][k]);
        if (fabs((double)lp[0][k]) > lp_big) lp_big = fabs((double)lp[0][k]);
        if (d > lp_rel) lp_rel = d;
    }
    lp_rel = lp_big > 0 ? lp_rel / lp_big : lp_rel;
    int np = twk_trainer_param_count(t[0]), diff = 0;
    double worst = 0, worst_rel = 0, big_all = 0, *wt = calloc((size_t)np + 1, sizeof *wt), *bt = calloc((size_t)np + 1, sizeof *bt);
    for (int i = 0; i < np; i++) {
        int64_t ne = 0;
        const char *pn = twk_trainer_param_name(t[0], i, &ne);
        float *g0 = malloc((size_t)ne * sizeof *g0), *g1 = malloc((size_t)ne * sizeof *g1);
        twk_trainer_get_grad(t[0], pn, g0, ne);
        twk_trainer_get_grad(t[1], pn, g1, ne);
        if (memcmp(g0, g1, (size_t)ne * sizeof *g0)) diff++;
        double big = 0, w = 0;
        for (int64_t k = 0; k < ne; k++) {
            double d = fabs((double)g0[k] - (double)g1[k]);
            if (d > w) w = d;
            if (fabs((double)g0[k]) > big) big = fabs((double)g0[k]);
        }
        if (w > worst) worst = w;
        wt[i] = w;
        bt[i] = big;
        if (big > big_all) big_all = big;
        free(g0);
        free(g1);
    }
    /* each tensor against its largest magnitude, floored at GRAD_FLOOR of the step's largest gradient (above) */
    int worst_i = 0;
    for (int i = 0; i < np; i++) {
        double s = bt[i] > GRAD_FLOOR * big_all ? bt[i] : GRAD_FLOOR * big_all;
        if (s > 0 && wt[i] / s > worst_rel) worst_rel = wt[i] / s, worst_i = i;
    }
    if (getenv("TWK_TEST_VERBOSE") && np)
        printf("     worst: %s |diff| %.3g, its largest %.3g, the step's largest %.3g\n", twk_trainer_param_name(t[0], worst_i, NULL),
               wt[worst_i], bt[worst_i], big_all);
    free(wt);
    free(bt);
    printf("     %s (%s, %lld tokens, %s / %s): loss %.6f / %.6f, %d tensors, %d differ, max |diff| %.3g (%.3g of the tensor's largest, floored), "
           "logprobs %.3g\n", name, rank ? "LoRA" : "full", (long long)n, paths[0], paths[1], (double)loss[0], (double)loss[1], np, diff, worst,
           worst_rel, lp_rel);
    char what[200];
    if (tol == 0) {
        snprintf(what, sizeof what, "%s %s: %s gives bit-identical loss, logprobs and %d gradients", name,
                 rank ? "LoRA" : "full", how, np);
        check(same && !diff && np > 0, "%s", what);
    } else {
        snprintf(what, sizeof what, "%s %s: %s gives loss, logprobs and %d gradients within %.0e (relative)", name,
                 rank ? "LoRA" : "full", how, np, tol);
        check(np > 0 && worst_rel <= tol && lp_rel <= tol && fabs((double)loss[0] - (double)loss[1]) <= tol * fabs((double)loss[0]),
              "%s", what);
    }
out:
    for (int k = 0; k < 2; k++) {
        twk_trainer_free(t[k]);
        free(lp[k]);
    }
    batch_free(&x);
}

static void compare_case(twk_model *m, const char *name, int rank, int64_t n, twk_trainer_opts oa, twk_trainer_opts ob,
                         const char *how) {
    compare_tol(m, name, rank, n, oa, ob, how, 0);
}

/* recompute on / off, and what the plan says of it */
static void recompute_case(twk_model *m, const char *name, int rank, int64_t n) {
    const twk_model_config *c = twk_model_cfg(m);
    compare_case(m, name, rank, n, (twk_trainer_opts){0}, (twk_trainer_opts){.recompute = true}, "recompute");
    twk_mem_request rq = {.tokens = n, .rank = rank, .dtype = "f32"};
    twk_mem_plan p0, p1;
    rq.recompute = 0;
    twk_mem_plan_config(c, &rq, &p0);
    rq.recompute = 1;
    twk_mem_plan_config(c, &rq, &p1);
    printf("     forward+backward plan: %llu bytes, %llu with recompute (%.1f%%), launches %d -> %d\n",
           (unsigned long long)p0.act_train, (unsigned long long)p1.act_train, 100.0 * (double)p1.act_train / (double)p0.act_train,
           p0.n_launches, p1.n_launches);
    char what[160];
    snprintf(what, sizeof what, "%s: recompute plans more launches (LoRA: a smaller forward+backward arena)", name);
    /* full training keeps every weight's gradient to the end: its peak may not move */
    check(p1.n_launches > p0.n_launches && (!rank || c->layers < 2 || p1.act_train < p0.act_train), "%s", what);
}

/* The fused unembeddings against matmul + logprobs over [T, V].
 * The one that recomputes its logits (token tiles): bit-identical in one tile; over several, sgemm
 * of a tile's rows need not give the bits of the whole pass's (OpenBLAS's Haswell kernels differ in
 * the last bits with the row count), so within 1e-5 of each tensor's scale.
 * The two-product one (vocabulary chunks, the trainer's default here): the log-sum-exp is an online
 * sum over the chunks (the running sum rescaled when the max grows) instead of one pass after the
 * max, and dh = dy (w[target] - G / s) instead of the product of the softmax's gradient with w: the
 * same f32 terms summed in another order. Each sum of V terms of size <= its total carries a relative
 * rounding error of at most ~V/16 * 2^-24 (16 SIMD lanes, then the lanes; 6e-4 for V = 151936, 4e-6
 * for the fixtures' ~1000) and in practice its square root, ~1e-6 (sqrt(9500) * 6e-8); the logprob
 * differs by that error of log s, the gradients by it relative to |w| (|dh| ~ |w|), and the LoRA
 * gradients, sums over tokens of products with dh, relatively the same. Tolerance: 2e-5 of each
 * tensor's largest magnitude (floored: GRAD_FLOOR; logprobs: of the largest |logprob|), 20 x that
 * estimate; the measured differences are printed (at one token the logits path's logits come from
 * sgemv or the 16-bit row dots, the two-product one's from sgemm). Two-product with activation
 * recompute: bit-identical to it without. */
static void paths_are(const char *name, const char *a, const char *b) {
    char what[160];
    snprintf(what, sizeof what, "%s: the trainers took the %s and %s paths", name, a, b);
    check(!strcmp(paths[0], a) && !strcmp(paths[1], b), "%s", what);
}

static void unembed_case(twk_model *m, const char *name, int64_t n) {
    int one_tile = TWK_UNEMBED_TILE_ROWS((int64_t)twk_model_cfg(m)->vocab, n) >= n;
    double tol = one_tile ? 0 : 1e-5;
    compare_tol(m, name, 8, n, (twk_trainer_opts){.logits = true}, (twk_trainer_opts){.unembed_recompute = true},
                "the fused unembedding (logits recomputed)", tol);
    paths_are(name, "logits", "recompute");
    compare_tol(m, name, 8, n, (twk_trainer_opts){.logits = true}, (twk_trainer_opts){.unembed_recompute = true, .recompute = true},
                "the fused unembedding (logits recomputed) with recompute", tol);
    compare_tol(m, name, 8, n, (twk_trainer_opts){.logits = true}, (twk_trainer_opts){0}, "the two-product unembedding", 2e-5);
    paths_are(name, "logits", "two-product");
    compare_tol(m, name, 8, n, (twk_trainer_opts){0}, (twk_trainer_opts){.recompute = true},
                "the two-product unembedding with recompute", 0);
    paths_are(name, "two-product", "two-product");
}

/* ---- prediction against the measured peak ---- */
static double rel(double a, double b) { return (a > b ? a - b : b - a) / b; }

static twk_model *load_counted(twk_device *dev, const char *dir, const twk_model_config *cfg, twk_dtype dtype,
                               size_t *w_host, uint64_t *w_dev);

/* A fresh device (its backend's scratch is allocated anew) with the model of dir or cfg,
 * its matrices in dtype; the plan against every host allocation and the device's allocation
 * counter, which does not see the CPU backend's scratch (the fused unembedding's tile, the
 * 16-bit matmul's f32 panel: host memory). Every LoRA trainer takes the fused path: the plan must have its tile. */
static void predict_case(const char *dir, const twk_model_config *cfg, const char *name, int rank, int64_t n, int recompute,
                         twk_dtype dtype) {
    twk_device *dev = NULL;
    size_t w_host = 0;
    uint64_t w_dev = 0;
    twk_model *m = twk_device_open("cpu", &dev) == TWK_OK ? load_counted(dev, dir, cfg, dtype, &w_host, &w_dev) : NULL;
    twk_mem_request rq = {.tokens = n, .rank = rank, .dtype = twk_dtype_name(dtype), .recompute = recompute};
    twk_mem_plan p;
    twk_status st = m ? twk_mem_plan_config(twk_model_cfg(m), &rq, &p) : TWK_ERR_IO;
    if (st != TWK_OK) {
        printf("FAIL %s: %s\n", name, twk_last_error());
        fails++;
        twk_model_free(m);
        twk_device_close(dev);
        return;
    }
    twk_trainer *t = NULL;
    batch x;
    batch_make(&x, n, twk_model_cfg(m)->vocab, 3);
    size_t base = live;
    uint64_t dev_base = 0, dev_peak = 0;
    peak = live;
    twk_device_memory(dev, &dev_base, NULL, true);
    twk_lora_config lc = twk_lora_default();
    lc.rank = rank;
    twk_trainer_opts o = {.recompute = recompute};
    st = twk_trainer_new_opts(m, rank ? &lc : NULL, n, &o, &t);
    twk_adam_params ap = twk_adam_default();
    if (st == TWK_OK) st = twk_trainer_forward_backward(t, &x.b, NULL, NULL);
    if (st == TWK_OK) st = twk_trainer_optim_step(t, &ap, NULL);
    if (st == TWK_OK) st = twk_trainer_forward(t, &x.b, NULL, NULL);
    size_t measured = peak - base + w_host;
    twk_device_memory(dev, NULL, &dev_peak, false);
    dev_peak = dev_peak - dev_base + w_dev;
    if (st != TWK_OK) printf("FAIL %s: %s\n", name, twk_last_error());
    fails += st != TWK_OK;
    twk_trainer_free(t);
    twk_model_free(m);
    twk_device_close(dev);
    batch_free(&x);
    if (st != TWK_OK) return;
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32];
    printf("     %s (%s%s, %s, %lld tokens): planned %s (device %s, of it the logits tile %s, the 16-bit panel %s), measured %s (device counter %s); "
           "peak RSS %ld MiB\n",
           name, rank ? "LoRA" : "full", recompute ? ", recompute" : "", rq.dtype, (long long)n, twk_mem_bytes_str(p.total, b1, sizeof b1),
           twk_mem_bytes_str(p.device, b2, sizeof b2), twk_mem_bytes_str(p.scratch, b5, sizeof b5), twk_mem_bytes_str(p.widen, b6, sizeof b6),
           twk_mem_bytes_str(measured, b3, sizeof b3), twk_mem_bytes_str(dev_peak, b4, sizeof b4), rss_peak_kb() / 1024);
    double e_all = rel((double)measured, (double)p.total), e_dev = rel((double)dev_peak, (double)(p.device - p.scratch - p.widen));
    printf("     error: all host allocations %.2f%%, device counter %.2f%% (tolerance 10%%)\n", 100 * e_all, 100 * e_dev);
    char what[200];
    snprintf(what, sizeof what, "%s (%s): the plan is within 10%% of the measured peak (allocations and device counter)", name,
             rq.dtype);
    /* the fused path's tile only where the trainer takes it: LoRA over a frozen lm_head (f32 or 16-bit) */
    int tile_ok = (p.scratch != 0) == (rank != 0);
    check(e_all <= 0.10 && e_dev <= 0.10 && tile_ok, "%s", what);
}

/* Loads dir (or a random model of cfg) with its matrices in dtype, counting what the weights take. */
static twk_model *load_counted(twk_device *dev, const char *dir, const twk_model_config *cfg, twk_dtype dtype,
                               size_t *w_host, uint64_t *w_dev) {
    size_t h0 = live;
    uint64_t d0 = 0, d1 = 0;
    twk_device_memory(dev, &d0, NULL, false);
    twk_model *m = NULL;
    twk_status st = dir ? twk_model_load_as(dir, dev, (int)dtype, -1, &m) : twk_model_random_as(cfg, dev, 7, dtype, &m);
    if (st != TWK_OK) {
        printf("skip %s: %s\n", dir ? dir : "random model", twk_last_error());
        return NULL;
    }
    twk_device_memory(dev, &d1, NULL, false);
    *w_host = live - h0;
    *w_dev = d1 - d0;
    return m;
}

/* Two trainers in one caller arena: they run in it, one after the other. */
static void shared_arena_case(twk_model *m) {
    const twk_model_config *c = twk_model_cfg(m);
    twk_mem_request rq = {.tokens = 48, .rank = 8, .dtype = "f32"};
    twk_mem_plan p;
    twk_mem_plan_config(c, &rq, &p);
    twk_device *dev = NULL;
    twk_device_open("cpu", &dev);
    twk_buffer *arena = NULL;
    twk_lora_config lc = twk_lora_default();
    lc.rank = 8;
    twk_trainer *a = NULL, *b = NULL, *own = NULL;
    batch x;
    batch_make(&x, 48, c->vocab, 9);
    float la = 0, lb = 0, lo = 0;
    uint64_t before = 0, after = 0;
    /* the arena the plan names: the larger peak, without the plans' inputs */
    twk_status st = twk_buffer_alloc(dev, p.activations, &arena);
    twk_device_memory(dev, &before, NULL, false);
    twk_trainer_opts o = {.arena = arena};
    if (st == TWK_OK) st = twk_trainer_new_opts(m, &lc, 48, &o, &a);
    if (st == TWK_OK) st = twk_trainer_new_opts(m, &lc, 48, &o, &b);
    twk_device_memory(dev, &after, NULL, false);
    if (st == TWK_OK) st = twk_trainer_forward_backward(a, &x.b, NULL, &la);
    if (st == TWK_OK) st = twk_trainer_forward_backward(b, &x.b, NULL, &lb);
    if (st == TWK_OK) st = twk_trainer_new(m, &lc, 48, &own);
    if (st == TWK_OK) st = twk_trainer_forward_backward(own, &x.b, NULL, &lo);
    if (st != TWK_OK) printf("FAIL shared arena: %s\n", twk_last_error());
    printf("     two trainers in one arena of %llu bytes: %llu bytes more on the device for both; losses %.6f %.6f (own arena %.6f)\n",
           (unsigned long long)twk_buffer_size(arena), (unsigned long long)(after - before), (double)la, (double)lb, (double)lo);
    check(st == TWK_OK && la == lo && lb == lo && after - before < p.activations,
          "%s", "trainers sharing a caller's arena allocate no arena of their own and compute the same loss");
    twk_trainer_free(a);
    twk_trainer_free(b);
    twk_trainer_free(own);
    twk_buffer_free(dev, arena);
    twk_device_close(dev);
    batch_free(&x);
}

/* --quick (the sanitizer pass): the 4-layer model of Qwen3-0.6B's widths in f32 only; its
 * recompute and bf16 plans take the same code as the fixtures' (~20 s a case plain, ~45 under ASan) */
int main(int argc, char **argv) {
    static const char *const fixtures[] = {"qwen3", "qwen2", "llama"};
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    twk_allocator a = {count_alloc, count_free, NULL};
    twk_set_allocator(&a); /* every host allocation of the engine is counted */
    twk_device *dev = NULL;
    if (twk_device_open("cpu", &dev) != TWK_OK) return 1;
    char dir[1024];
    size_t w_host = 0;
    uint64_t w_dev = 0;
    for (int i = 0; i < 3; i++) {
        snprintf(dir, sizeof dir, "%s/%s/model", TWK_PARITY_DIR, fixtures[i]);
        twk_model *m = load_counted(dev, dir, NULL, TWK_F32, &w_host, &w_dev);
        if (!m) continue;
        recompute_case(m, fixtures[i], 8, 40);
        recompute_case(m, fixtures[i], 0, 40);
        unembed_case(m, fixtures[i], 40);
        unembed_case(m, fixtures[i], 1);
        if (i == 0) shared_arena_case(m);
        twk_model_free(m);
        predict_case(dir, NULL, fixtures[i], 8, 256, 0, TWK_F32);
        predict_case(dir, NULL, fixtures[i], 8, 256, 1, TWK_F32);
        predict_case(dir, NULL, fixtures[i], 0, 128, 0, TWK_F32);
        predict_case(dir, NULL, fixtures[i], 8, 256, 0, TWK_BF16);
        m = load_counted(dev, dir, NULL, TWK_BF16, &w_host, &w_dev); /* the fused unembedding over a bf16 lm_head */
        if (m) {
            char nm[64];
            snprintf(nm, sizeof nm, "%s bf16", fixtures[i]);
            unembed_case(m, nm, 40);
            unembed_case(m, nm, 1);
            twk_model_free(m);
        }
    }
    /* a random 4-layer model: more layers show the saving */
    twk_model_config c = {.arch = TWK_ARCH_QWEN3, .vocab = 300, .hidden = 64, .layers = 4, .heads = 4, .kv_heads = 2,
                          .head_dim = 16, .ffn = 96, .rope_theta = 1e4, .rms_eps = 1e-6, .qk_norm = true};
    twk_model *m = load_counted(dev, NULL, &c, TWK_F32, &w_host, &w_dev);
    if (m) {
        recompute_case(m, "random 4-layer", 8, 64);
        unembed_case(m, "random 4-layer", 64);
        twk_model_free(m);
    }
    /* a vocabulary of 151936: 200 tokens are two token tiles of the fused unembedding (110 + 90 rows) */
    twk_model_config wv = {.arch = TWK_ARCH_QWEN3, .vocab = 151936, .hidden = 32, .layers = 1, .heads = 2, .kv_heads = 1,
                           .head_dim = 16, .ffn = 48, .rope_theta = 1e4, .rms_eps = 1e-6, .qk_norm = true, .tie_embeddings = true};
    snprintf(wv.arch_name, sizeof wv.arch_name, "Qwen3ForCausalLM");
    for (int k = 0; k < 2; k++) {
        m = load_counted(dev, NULL, &wv, k ? TWK_BF16 : TWK_F32, &w_host, &w_dev);
        if (!m) continue;
        unembed_case(m, k ? "vocab 151936 bf16, two tiles" : "vocab 151936 f32, two tiles", 200);
        twk_model_free(m);
    }
    twk_device_close(dev);
    predict_case(NULL, &c, "random 4-layer", 8, 64, 1, TWK_F32);
    predict_case(NULL, &c, "random 4-layer", 8, 64, 0, TWK_BF16);
    /* a 4-layer model with Qwen3-0.6B's widths (tied embeddings, vocab 151936) */
    twk_model_config q = {.arch = TWK_ARCH_QWEN3, .vocab = 151936, .hidden = 1024, .layers = 4, .heads = 16, .kv_heads = 8,
                          .head_dim = 128, .ffn = 3072, .rope_theta = 1e6, .rms_eps = 1e-6, .qk_norm = true,
                          .tie_embeddings = true};
    snprintf(q.arch_name, sizeof q.arch_name, "Qwen3ForCausalLM");
    predict_case(NULL, &q, "Qwen3-0.6B widths, 4 layers", 32, 256, 0, TWK_F32);
    if (!quick) {
        predict_case(NULL, &q, "Qwen3-0.6B widths, 4 layers", 32, 256, 1, TWK_F32);
        predict_case(NULL, &q, "Qwen3-0.6B widths, 4 layers", 32, 256, 0, TWK_BF16);
    }
    twk_set_allocator(NULL);
    printf("%d failures\n", fails);
    return fails ? 1 : 0;
}
