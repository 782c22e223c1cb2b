/* Packed multi-LoRA training (train/lora_pack.c, train/loss_steps.c): five
 * LoRA trainers of the built-in model with different ranks (4, 8, 16, 32, 8),
 * alphas, modules (one adapts lm_head) and losses (cross_entropy,
 * importance_sampling, dpo with the base model as reference, a forward-only
 * cross_entropy) take one step together through twk_loss_steps, and each
 * alone through a fresh pack.
 *
 * Checked: every job's logprobs, loss, metrics and gradients together equal
 * its results alone — bit for bit on the CPU (the reductions stay inside each
 * run's tokens, and segments sit at 48-row boundaries, TWK_GEMM_ROW_PERIOD, so
 * the CPU's products compute every row the same way; the packs even differ in slot rank and
 * modules), within 1e-5 relative (max |diff| / max |value|) on other devices
 * (TWK_TEST_DEVICE) and for a job whose backward pass takes another
 * unembedding together than alone: a pass shared with a run that adapts
 * lm_head keeps the [T, V] logits for all its runs, where alone the CPU takes
 * the two-product unembedding (the same sums in another order); the pass counter shows the passes were shared (3 passes
 * instead of 8). And the packed path agrees with the plain trainer
 * (twk_loss_step, LoRA as GEMMs) within 1e-5 relative: the same math,
 * another summation order. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer_util.h"
#include "twinkle/twinkle.h"

#define NJ 5
#define NSEQ 4
#define LEN 13

static int fails;

static void check(int ok, const char *what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    fails += !ok;
}

static const char *test_device(void) {
    const char *d = getenv("TWK_TEST_DEVICE");
    return d && *d ? d : "cpu";
}

typedef struct job_data {
    twk_loss_spec spec;
    twk_loss_batch b;
    int64_t off[NSEQ + 1];
    int32_t tok[NSEQ * LEN], tgt[NSEQ * LEN];
    float w[NSEQ * LEN], adv[NSEQ * LEN], q[NSEQ * LEN];
    int backward;
} job_data;

typedef struct outcome {
    float lp[NSEQ * LEN];
    twk_loss_result res;
    float *grad; /* every trainable tensor's gradient, end to end */
    int64_t n_grad;
} outcome;

static void make_job(job_data *d, int i, int vocab, twk_rng *r) {
    static const char *const loss[NJ] = {"cross_entropy", "importance_sampling", "dpo", "cross_entropy", "cross_entropy"};
    twk_loss_spec_init(loss[i], &d->spec);
    d->backward = i != 4;
    d->off[0] = 0;
    for (int s = 0; s < NSEQ; s++) d->off[s + 1] = d->off[s] + LEN - (s + i) % 4; /* lengths 10..13 */
    for (int64_t k = 0; k < d->off[NSEQ]; k++) {
        d->tok[k] = (int32_t)(twk_rng_next(r) % (uint64_t)vocab);
        d->tgt[k] = (int32_t)(twk_rng_next(r) % (uint64_t)vocab);
        d->w[k] = k % 5 == 0 ? 0.0f : 1.0f;
        d->adv[k] = (float)twk_rng_normal(r);
        d->q[k] = (float)(-5.0 + 0.5 * twk_rng_normal(r));
    }
    d->b = (twk_loss_batch){NSEQ, d->off, d->tok, 0, d->tgt, {0}, NULL};
    d->b.in[TWK_IN_WEIGHTS] = d->w;
    if (i == 1) {
        d->b.in[TWK_IN_ADVANTAGES] = d->adv;
        d->b.in[TWK_IN_LOGPROBS] = d->q;
    }
}

/* A LoRA trainer with every adapter tensor random (so B != 0 and both A and B get gradients). */
static twk_trainer *make_trainer(twk_model *m, int i, twk_rng *r) {
    static const int rank[NJ] = {4, 8, 16, 32, 8};
    twk_lora_config lc = twk_lora_default();
    lc.rank = rank[i];
    lc.alpha = (float)(8 + 4 * i);
    lc.train_unembed = i == 3;
    lc.train_mlp = i != 2;
    lc.seed = (uint64_t)i;
    twk_trainer *t = NULL;
    if (twk_trainer_new(m, &lc, 64, &t) != TWK_OK) return NULL;
    trainer_randomize(t, r, 0.05);
    return t;
}

static void take_grads(twk_trainer *t, outcome *o) { o->grad = trainer_take_grads(t, &o->n_grad); }

/* max |a - b| / max(max |b|, 1e-30) over n floats. */
static double rel_diff(const float *a, const float *b, int64_t n, double *absd) {
    double d = 0, m = 1e-30;
    for (int64_t k = 0; k < n; k++) {
        d = fmax(d, fabs((double)a[k] - b[k]));
        m = fmax(m, fabs((double)b[k]));
    }
    if (absd) *absd = d;
    return d / m;
}

int main(void) {
    twk_device *dev = NULL;
    twk_model *m = NULL;
    if (twk_device_open(test_device(), &dev) != TWK_OK || twk_model_builtin(dev, &m) != TWK_OK) {
        printf("FAIL opening %s and the built-in model: %s\n", test_device(), twk_last_error());
        return 1;
    }
    int exact = !strncmp(test_device(), "cpu", 3);
    const double tol = 1e-5;
    printf("device %s: together vs alone %s\n", test_device(), exact ? "bit-identical" : "within 1e-5 relative");
    twk_rng r;
    twk_rng_seed(&r, 11);
    static job_data d[NJ];
    twk_trainer *t[NJ];
    outcome alone[NJ], together[NJ], plain[NJ];
    memset(alone, 0, sizeof alone);
    memset(together, 0, sizeof together);
    memset(plain, 0, sizeof plain);
    for (int i = 0; i < NJ; i++) {
        make_job(&d[i], i, twk_model_cfg(m)->vocab, &r);
        t[i] = make_trainer(m, i, &r);
        if (!t[i]) {
            printf("FAIL trainer %d: %s\n", i, twk_last_error());
            return 1;
        }
    }
    twk_loss_job jobs[NJ];
    for (int i = 0; i < NJ; i++) jobs[i] = (twk_loss_job){t[i], &d[i].spec, &d[i].b, d[i].backward, NULL};

    /* each alone, through a pack of its own (its rank, its modules) */
    int ok = 1;
    for (int i = 0; i < NJ; i++) {
        twk_pack *p = NULL;
        twk_loss_job j = jobs[i];
        j.logprobs = alone[i].lp;
        ok &= twk_pack_new(m, 256, 8, &p) == TWK_OK && twk_loss_steps(p, &j, 1) == TWK_OK && j.st == TWK_OK;
        if (j.st != TWK_OK) printf("     job %d alone: %s\n", i, j.err);
        alone[i].res = j.res;
        take_grads(t[i], &alone[i]);
        twk_pack_free(p);
    }
    check(ok, "each job alone through a pack of its own");

    /* all together: one pack, every pass shared */
    twk_pack *p = NULL;
    ok = twk_pack_new(m, 512, 8, &p) == TWK_OK;
    for (int i = 0; i < NJ; i++) jobs[i].logprobs = together[i].lp;
    ok = ok && twk_loss_steps(p, jobs, NJ) == TWK_OK;
    for (int i = 0; i < NJ; i++) {
        if (jobs[i].st != TWK_OK) printf("     job %d together: %s\n", i, jobs[i].err);
        ok &= jobs[i].st == TWK_OK;
        together[i].res = jobs[i].res;
        take_grads(t[i], &together[i]);
    }
    check(ok, "five jobs together through one pack");
    twk_pack_stats ps;
    twk_pack_get_stats(p, &ps);
    printf("     pass counter: %lld passes, %lld segments, %lld shared, at most %d runs in a pass\n", (long long)ps.passes,
           (long long)ps.segments, (long long)ps.shared_passes, ps.max_segments);
    /* forwards first: (is, dpo, ce forward-only), then dpo's base forward alone, then one backward of the other four */
    check(ps.passes == 3 && ps.segments == 8 && ps.shared_passes == 2 && ps.max_segments == 4,
          "the pass counter: 3 passes (3 runs, 1, 4) where alone they take 8");
    twk_pack_free(p);

    /* together == alone; bit for bit where the job's passes take the same unembedding path both ways */
    int unembed_runs = 0;
    for (int i = 0; i < NJ; i++) unembed_runs += d[i].backward && twk_trainer_lora(t[i])->train_unembed;
    for (int i = 0; i < NJ; i++) {
        int moved = exact && unembed_runs && d[i].backward && !twk_trainer_lora(t[i])->train_unembed &&
                    strcmp(twk_trainer_unembed_path(t[i]), "two-product") == 0;
        int exact_i = exact && !moved;
        int64_t n = d[i].off[NSEQ];
        double lp_abs = 0, g_abs = 0;
        double lp_rel = rel_diff(together[i].lp, alone[i].lp, n, &lp_abs);
        double g_rel = rel_diff(together[i].grad, alone[i].grad, together[i].n_grad, &g_abs);
        double loss_d = fabs(together[i].res.loss - alone[i].res.loss);
        int same = together[i].res.n_metrics == alone[i].res.n_metrics;
        for (int k = 0; same && k < alone[i].res.n_metrics; k++)
            same = exact_i ? together[i].res.values[k] == alone[i].res.values[k]
                         : fabs(together[i].res.values[k] - alone[i].res.values[k]) <= tol * fmax(1, fabs(alone[i].res.values[k]));
        if (exact_i)
            same = same && !memcmp(together[i].lp, alone[i].lp, (size_t)n * sizeof(float)) &&
                   !memcmp(together[i].grad, alone[i].grad, (size_t)together[i].n_grad * sizeof(float)) &&
                   together[i].res.loss == alone[i].res.loss;
        else
            same = same && lp_rel <= tol && g_rel <= tol && loss_d <= tol * fmax(1, fabs(alone[i].res.loss));
        char what[300];
        snprintf(what, sizeof what,
                 "job %d (%s%s, rank %d) together == alone%s: logprobs max abs diff %.3g (%.2e rel), gradients %.3g "
                 "(%.2e rel, %lld values), loss %.3g",
                 i, d[i].spec.def->name, d[i].backward ? "" : ", forward only", twk_trainer_lora(t[i])->rank,
                 exact_i ? " (bit for bit)" : moved ? " (within 1e-5: logits together, two-product alone)" : " (within 1e-5)",
                 lp_abs, lp_rel, g_abs, g_rel, (long long)together[i].n_grad, loss_d);
        check(same, what);
    }

    /* the jobs without an lm_head adapter together: every pass keeps its unembedding path (on the CPU
     * the two-product one), so bit for bit against alone */
    outcome apart[NJ];
    memset(apart, 0, sizeof apart);
    twk_loss_job some[NJ];
    int ns = 0, idx[NJ];
    for (int i = 0; i < NJ; i++)
        if (!twk_trainer_lora(t[i])->train_unembed) {
            idx[ns] = i;
            some[ns] = jobs[i];
            some[ns++].logprobs = apart[i].lp;
        }
    ok = twk_pack_new(m, 512, 8, &p) == TWK_OK && twk_loss_steps(p, some, ns) == TWK_OK;
    for (int k = 0; k < ns; k++) {
        int i = idx[k];
        ok &= some[k].st == TWK_OK;
        apart[i].res = some[k].res;
        take_grads(t[i], &apart[i]);
        int64_t n = d[i].off[NSEQ];
        double lp_rel = rel_diff(apart[i].lp, alone[i].lp, n, NULL), g_rel = rel_diff(apart[i].grad, alone[i].grad, apart[i].n_grad, NULL);
        int same = exact ? !memcmp(apart[i].lp, alone[i].lp, (size_t)n * sizeof(float)) &&
                               !memcmp(apart[i].grad, alone[i].grad, (size_t)apart[i].n_grad * sizeof(float)) &&
                               apart[i].res.loss == alone[i].res.loss
                         : lp_rel <= tol && g_rel <= tol;
        char what[300];
        snprintf(what, sizeof what, "job %d together with the %d jobs without an lm_head adapter (%s) == alone %s: logprobs %.2e, gradients %.2e relative",
                 i, ns, twk_trainer_unembed_path(t[i]), exact ? "bit for bit" : "within 1e-5", lp_rel, g_rel);
        check(ok && same, what);
    }
    twk_pack_free(p);

    /* the packed path against the plain trainer (GEMM LoRA) */
    for (int i = 0; i < NJ; i++) {
        ok = twk_loss_step(t[i], &d[i].spec, &d[i].b, d[i].backward, plain[i].lp, &plain[i].res) == TWK_OK;
        take_grads(t[i], &plain[i]);
        int64_t n = d[i].off[NSEQ];
        double lp_rel = rel_diff(alone[i].lp, plain[i].lp, n, NULL);
        double g_rel = rel_diff(alone[i].grad, plain[i].grad, plain[i].n_grad, NULL);
        double loss_rel = fabs(alone[i].res.loss - plain[i].res.loss) / fmax(1e-30, fabs(plain[i].res.loss));
        char what[300];
        snprintf(what, sizeof what, "job %d packed vs the plain trainer: logprobs %.2e, gradients %.2e, loss %.2e relative (tol 1e-5)",
                 i, lp_rel, g_rel, loss_rel);
        check(ok && lp_rel <= tol && g_rel <= tol && loss_rel <= tol, what);
    }

    /* refusals: a trainer twice, a pass past the capacity */
    twk_pack *small = NULL;
    twk_pack_new(m, 16, 2, &small);
    twk_loss_job twice[2] = {jobs[0], jobs[0]};
    check(twk_loss_steps(small, twice, 2) == TWK_ERR_INVALID_ARG && strstr(twk_last_error(), "share a trainer"),
          "one trainer in two jobs is refused");
    twk_loss_job big = jobs[0];
    big.logprobs = NULL;
    int rc = twk_loss_steps(small, &big, 1);
    check(rc == TWK_OK && big.st == TWK_ERR_INVALID_ARG && strstr(big.err, "pack holds 16"),
          "a pass past the pack's capacity fails its job, naming the capacity");
    printf("     (%s)\n", big.err);
    twk_pack_free(small);

    for (int i = 0; i < NJ; i++) {
        free(alone[i].grad);
        free(together[i].grad);
        free(apart[i].grad);
        free(plain[i].grad);
        twk_trainer_free(t[i]);
    }
    twk_model_free(m);
    twk_device_close(dev);
    printf("%s\n", fails ? "FAILED" : "all passed");
    return fails ? 1 : 0;
}
