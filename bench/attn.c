/* bench_attn: causal attention (twk_attention, packed segments, grouped-query heads) forward and
 * backward through compiled plans, at given token counts: seconds, TFLOP/s and the fraction of
 * --peak-tflops; --compare SPEC runs the same on a second device and prints the ratio and the
 * largest |difference| of the output and of dq relative to the reference's largest value.
 *
 * FLOPs (causal, P = sum over segments of L (L + 1) / 2 query-key pairs, per query head):
 * forward 4 D P (Q.K^T and P.V), backward 10 D P (scores recomputed, dV, dP, dQ, dK) — the
 * FlashAttention-2 accounting, so figures compare with its papers' tables. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "twinkle/twinkle.h"

typedef struct attn_shape {
    long tokens, seqs, heads, kv_heads, head_dim, reps;
} attn_shape;

typedef struct attn_result {
    double fwd_s, bwd_s; /* best over reps; bwd = forward+backward minus forward */
    float *o, *dq;       /* host copies, for --compare */
} attn_result;

static double causal_pairs(const attn_shape *s) {
    double per = (double)(s->tokens / s->seqs); /* tokens % seqs == 0 (checked) */
    return (double)s->seqs * per * (per + 1) / 2;
}

/* Best time of `reps` runs of p (after one warm-up run); a negative time on failure. */
static double best_run(twk_plan *p, long reps) {
    if (twk_plan_run(p, 1) != TWK_OK) return -1;
    double best = 1e30;
    for (long r = 0; r < reps; r++) {
        double t0 = twk_now();
        if (twk_plan_run(p, 1) != TWK_OK) return -1;
        double dt = twk_now() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

/* Builds, compiles and times the forward and forward+backward plans on spec; 0 (message
 * printed) on failure. */
static int run_attn(const char *spec, const attn_shape *s, attn_result *res) {
    int64_t T = s->tokens, Hq = s->heads, Hk = s->kv_heads, D = s->head_dim;
    int64_t qne[3] = {T, Hq, D}, kne[3] = {T, Hk, D}, segne[1] = {T};
    twk_device *dev = NULL;
    twk_graph *g = twk_graph_new();
    twk_plan *pf = NULL, *pb = NULL;
    float *q = NULL, *k = NULL, *v = NULL, *r = NULL;
    int32_t *seg = NULL;
    int ok = 0;
    if (!g || twk_device_open(spec, &dev) != TWK_OK) goto out;
    twk_id qi = twk_param(g, "q", 3, qne, true), ki = twk_param(g, "k", 3, kne, true), vi = twk_param(g, "v", 3, kne, true);
    twk_id si = twk_input(g, "seg_start", TWK_I32, 1, segne), ri = twk_input(g, "r", TWK_F32, 3, qne);
    twk_id o = twk_attention(g, qi, ki, vi, si, 1.0f / sqrtf((float)D));
    twk_id loss = twk_weighted_sum(g, o, ri);
    if (twk_graph_status(g) != TWK_OK || twk_graph_output(g, o) != TWK_OK) goto out;
    /* the forward plan compiles before the backward is appended: o alone */
    if (twk_plan_compile(g, dev, 1, NULL, 0, &pf) != TWK_OK) goto out;
    if (twk_graph_backward(g, loss) != TWK_OK) goto out;
    twk_id dq = twk_graph_grad(g, qi), dk = twk_graph_grad(g, ki), dv = twk_graph_grad(g, vi);
    if (dq < 0 || dk < 0 || dv < 0 || twk_graph_output(g, dq) != TWK_OK || twk_graph_output(g, dk) != TWK_OK ||
        twk_graph_output(g, dv) != TWK_OK || twk_plan_compile(g, dev, 1, NULL, 0, &pb) != TWK_OK)
        goto out;
    size_t nq = (size_t)(T * Hq * D), nk = (size_t)(T * Hk * D);
    q = malloc(nq * 4), k = malloc(nk * 4), v = malloc(nk * 4), r = malloc(nq * 4), seg = malloc((size_t)T * 4);
    res->o = malloc(nq * 4), res->dq = malloc(nq * 4);
    if (!q || !k || !v || !r || !seg || !res->o || !res->dq) goto out;
    twk_rng rng;
    twk_rng_seed(&rng, 11);
    for (size_t i = 0; i < nq; i++) q[i] = (float)(2 * twk_rng_uniform(&rng) - 1), r[i] = (float)(2 * twk_rng_uniform(&rng) - 1);
    for (size_t i = 0; i < nk; i++) k[i] = (float)(2 * twk_rng_uniform(&rng) - 1), v[i] = (float)(2 * twk_rng_uniform(&rng) - 1);
    long per = s->tokens / s->seqs;
    for (long t = 0; t < T; t++) seg[t] = (int32_t)(t / per * per);
    twk_plan *plans[2] = {pf, pb};
    for (int i = 0; i < 2; i++) {
        twk_plan *p = plans[i];
        if (twk_plan_write(p, qi, 1, q, nq * 4) != TWK_OK || twk_plan_write(p, ki, 1, k, nk * 4) != TWK_OK ||
            twk_plan_write(p, vi, 1, v, nk * 4) != TWK_OK || twk_plan_write(p, si, 1, seg, (size_t)T * 4) != TWK_OK ||
            (i == 1 && twk_plan_write(p, ri, 1, r, nq * 4) != TWK_OK))
            goto out;
    }
    res->fwd_s = best_run(pf, s->reps);
    double fb = best_run(pb, s->reps);
    if (res->fwd_s < 0 || fb < 0) goto out;
    res->bwd_s = fb > res->fwd_s ? fb - res->fwd_s : fb;
    if (twk_plan_read(pf, o, 1, res->o, nq * 4) != TWK_OK || twk_plan_read(pb, dq, 1, res->dq, nq * 4) != TWK_OK) goto out;
    ok = 1;
out:
    if (!ok) fprintf(stderr, "bench_attn: %s: %s\n", spec, g && twk_graph_status(g) != TWK_OK ? twk_graph_error(g) : twk_last_error());
    twk_plan_free(pf);
    twk_plan_free(pb);
    twk_graph_free(g);
    twk_device_close(dev);
    free(q), free(k), free(v), free(r), free(seg);
    return ok;
}

/* max |a - b| / max |b| over n values. */
static double rel_diff(const float *a, const float *b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (!(e <= d)) d = e;
        if (fabs((double)b[i]) > m) m = fabs((double)b[i]);
    }
    return d / (m > 0 ? m : 1);
}

static void print_row(const char *spec, const attn_shape *s, const attn_result *r, double peak) {
    double P = causal_pairs(s) * (double)s->heads * (double)s->head_dim;
    double ff = 4 * P / r->fwd_s / 1e12, bf = 10 * P / r->bwd_s / 1e12;
    printf("%-10s T %6ld  fwd %9.4f s %8.3f TFLOP/s", spec, s->tokens, r->fwd_s, ff);
    if (peak > 0) printf(" (%5.1f%% of peak)", 100 * ff / peak);
    printf("   bwd %9.4f s %8.3f TFLOP/s", r->bwd_s, bf);
    if (peak > 0) printf(" (%5.1f%% of peak)", 100 * bf / peak);
    printf("\n");
}

static int usage(void) {
    fprintf(stderr, "usage: bench_attn [--tokens 4096,16384] [--seqs 1] [--heads 16] [--kv-heads 8] [--head-dim 128]\n"
                    "                  [--reps 3] [--device cpu] [--compare SPEC] [--peak-tflops P]\n"
                    "  one segment of T tokens per --seqs (T %% seqs == 0); --compare: the same on SPEC, the\n"
                    "  ratio device/SPEC and max |diff| / max |ref| of the output and of dq (ref = SPEC)\n");
    return 2;
}

int main(int argc, char **argv) {
    const char *device = "cpu", *compare = NULL, *tokens = "4096,16384";
    attn_shape s = {0, 1, 16, 8, 128, 3};
    double peak = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long *num = !strcmp(a, "--seqs") ? &s.seqs : !strcmp(a, "--heads") ? &s.heads : !strcmp(a, "--kv-heads") ? &s.kv_heads
                  : !strcmp(a, "--head-dim") ? &s.head_dim : !strcmp(a, "--reps") ? &s.reps : NULL;
        if (!v) return usage();
        i++;
        if (num) {
            if (!bench_parse_long("bench_attn", v, a, 1, 1 << 20, num)) return 2;
        } else if (!strcmp(a, "--tokens")) tokens = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--compare")) compare = v;
        else if (!strcmp(a, "--peak-tflops")) peak = atof(v);
        else return usage();
    }
    if (s.heads % s.kv_heads) {
        fprintf(stderr, "bench_attn: --heads %ld is not a multiple of --kv-heads %ld\n", s.heads, s.kv_heads);
        return 2;
    }
    printf("causal attention, %ld query heads / %ld kv heads, head_dim %ld, %ld segment(s); best of %ld; "
           "FLOPs: fwd 4 D P, bwd 10 D P (P = causal query-key pairs x heads)\n",
           s.heads, s.kv_heads, s.head_dim, s.seqs, s.reps);
    char list[256];
    snprintf(list, sizeof list, "%s", tokens);
    int fails = 0;
    char *save = NULL; /* strtok_r: opening a device may tokenize its spec with strtok */
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (!bench_parse_long("bench_attn", tok, "--tokens", 1, 1 << 22, &s.tokens)) return 2;
        if (s.tokens % s.seqs) {
            fprintf(stderr, "bench_attn: %ld tokens do not split into %ld segments\n", s.tokens, s.seqs);
            return 2;
        }
        attn_result r = {0}, c = {0};
        if (!run_attn(device, &s, &r)) {
            fails++;
        } else {
            print_row(device, &s, &r, peak);
            double P = causal_pairs(&s) * (double)s.heads * (double)s.head_dim;
            printf("SUMMARY bench_attn device=%s tokens=%ld fwd_tflops=%.4f bwd_tflops=%.4f\n", device, s.tokens,
                   4 * P / r.fwd_s / 1e12, 10 * P / r.bwd_s / 1e12);
            if (compare && run_attn(compare, &s, &c)) {
                print_row(compare, &s, &c, 0);
                size_t n = (size_t)(s.tokens * s.heads * s.head_dim);
                printf("ratio %s / %s: fwd %.2f, bwd %.2f; max |diff| / max |ref|: output %.2e, dq %.2e\n", device,
                       compare, c.fwd_s / r.fwd_s, c.bwd_s / r.bwd_s, rel_diff(r.o, c.o, n), rel_diff(r.dq, c.dq, n));
            } else if (compare) {
                fails++;
            }
        }
        free(r.o), free(r.dq), free(c.o), free(c.dq);
    }
    return fails ? 1 : 0;
}
