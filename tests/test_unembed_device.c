/* The fused unembedding (twk_unembed_logprobs: token tiles, no [T, V] logits) in a LoRA
 * training pass on a device (TWK_TEST_DEVICE, default the CPU): the device has the op, the
 * trainer takes it, and against the same trainer on the logits path (matmul + logprobs) on the
 * same device the loss, logprobs and LoRA gradients agree (tolerances below: float32 sums in
 * another order), while the device's peak allocation drops by at least the [T, V] f32 logits.
 * The memory plan's forward+backward arena drops by the same and counts the tile instead. The
 * peaks are printed. Models: a random 4-layer Qwen3 with a 4,099-word vocabulary (the logits
 * dominate) and the qwen3 parity fixture when present. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "twinkle/twinkle.h"

#ifndef TWK_PARITY_DIR
#define TWK_PARITY_DIR "tests/parity/fixtures"
#endif

static int fails;

static void check(int cond, const char *what) {
    printf("%s %s\n", cond ? "ok  " : "FAIL", what);
    fails += !cond;
}

typedef struct pass {
    float loss, *lp, **grads;
    int64_t *ne;   /* each gradient's elements */
    uint64_t peak; /* the device's peak allocation over trainer_new + forward_backward */
} pass;

/* One LoRA pass of n tokens (logits: the [T, V] path) into p; 0 and a FAIL line on error. */
static int run_pass(twk_model *m, twk_device *dev, int64_t n, bool logits, pass *p) {
    const twk_model_config *c = twk_model_cfg(m);
    int32_t *tok = malloc((size_t)n * 4), *tgt = malloc((size_t)n * 4), *pos = malloc((size_t)n * 4), *seg = malloc((size_t)n * 4);
    float *w = malloc((size_t)n * 4);
    twk_rng r;
    twk_rng_seed(&r, 11);
    for (int64_t i = 0; i < n; i++) {
        tok[i] = (int32_t)twk_rng_below(&r, (uint64_t)c->vocab);
        tgt[i] = i == n - 1 ? c->vocab - 1 : (int32_t)twk_rng_below(&r, (uint64_t)c->vocab); /* the top word too */
        seg[i] = i < n / 2 ? 0 : (int32_t)(n / 2);
        pos[i] = (int32_t)(i - seg[i]);
        w[i] = 1.0f;
    }
    twk_batch b = {.n = n, .tokens = tok, .targets = tgt, .positions = pos, .seg_start = seg, .weights = w};
    twk_lora_config lc = twk_lora_default();
    lc.rank = 8;
    lc.alpha = 16;
    twk_trainer_opts o = {.logits = logits};
    twk_trainer *t = NULL;
    uint64_t base = 0;
    twk_device_memory(dev, &base, NULL, true);
    p->lp = calloc((size_t)n, sizeof(float));
    twk_status st = twk_trainer_new_opts(m, &lc, n, &o, &t);
    if (st == TWK_OK) st = twk_trainer_forward_backward(t, &b, p->lp, &p->loss);
    twk_device_memory(dev, NULL, &p->peak, false);
    p->peak -= base;
    int np = st == TWK_OK ? twk_trainer_param_count(t) : 0;
    p->grads = calloc((size_t)np + 1, sizeof *p->grads);
    p->ne = calloc((size_t)np + 1, sizeof *p->ne);
    for (int i = 0; i < np && st == TWK_OK; i++) {
        const char *name = twk_trainer_param_name(t, i, &p->ne[i]);
        p->grads[i] = malloc((size_t)p->ne[i] * sizeof(float));
        st = twk_trainer_get_grad(t, name, p->grads[i], p->ne[i]);
    }
    if (st != TWK_OK) printf("FAIL %s pass: %s\n", logits ? "logits" : "fused", twk_last_error());
    twk_trainer_free(t);
    free(tok), free(tgt), free(pos), free(seg), free(w);
    return st == TWK_OK ? np : -1;
}

static void pass_free(pass *p, int np) {
    for (int i = 0; i < np; i++) free(p->grads[i]);
    free(p->grads);
    free(p->ne);
    free(p->lp);
}

static void model_case(twk_model *m, twk_device *dev, const char *name, int64_t n) {
    const twk_model_config *c = twk_model_cfg(m);
    pass a = {0}, f = {0};
    int np = run_pass(m, dev, n, true, &a), npf = run_pass(m, dev, n, false, &f);
    char what[256];
    if (np < 1 || npf != np) {
        fails++;
        goto out;
    }
    double lp_err = 0, g_num = 0, g_den = 0;
    for (int64_t i = 0; i < n; i++) lp_err = fmax(lp_err, fabs((double)a.lp[i] - (double)f.lp[i]));
    for (int i = 0; i < np; i++)
        for (int64_t k = 0; k < a.ne[i] && a.ne[i] == f.ne[i]; k++) {
            double d = (double)a.grads[i][k] - (double)f.grads[i][k];
            g_num += d * d;
            g_den += (double)a.grads[i][k] * a.grads[i][k];
        }
    double g_nmse = g_den > 0 ? g_num / g_den : g_num, dl = fabs((double)a.loss - (double)f.loss);
    uint64_t tv = (uint64_t)n * (uint64_t)c->vocab * 4;
    printf("     %s on %s, %lld tokens, vocab %d: loss %.7f (logits) / %.7f (fused), |dlogprob| max %.2e, gradient NMSE %.2e\n",
           name, twk_device_spec(dev), (long long)n, c->vocab, (double)a.loss, (double)f.loss, lp_err, g_nmse);
    printf("     device peak: logits path %llu bytes, fused %llu bytes (-%llu; [T, V] f32 = %llu)\n",
           (unsigned long long)a.peak, (unsigned long long)f.peak,
           (unsigned long long)(a.peak > f.peak ? a.peak - f.peak : 0), (unsigned long long)tv);
    /* float32 in another order: logprobs of magnitude ~log V within 1e-4, gradients within NMSE 1e-8 */
    snprintf(what, sizeof what, "%s: the fused pass's loss and logprobs within 1e-4 and LoRA gradients within NMSE 1e-8 of the logits path",
             name);
    check(dl <= 1e-4 && lp_err <= 1e-4 && g_nmse <= 1e-8, what);
    snprintf(what, sizeof what, "%s: the fused pass peaks at least the [T, V] logits (%llu bytes) lower on the device", name,
             (unsigned long long)tv);
    check(a.peak >= f.peak + tv, what);
    twk_mem_request rq = {.tokens = n, .rank = 8, .dtype = "f32", .logits = true};
    twk_mem_plan pl, pf;
    twk_mem_plan_config(c, &rq, &pl);
    rq.logits = false;
    twk_mem_plan_config(c, &rq, &pf);
    printf("     plan: forward+backward arena %llu (logits) -> %llu (fused) bytes, logits tile %llu\n",
           (unsigned long long)pl.act_train, (unsigned long long)pf.act_train, (unsigned long long)pf.scratch);
    snprintf(what, sizeof what, "%s: the plan's arena drops by the [T, V] logits and counts the tile", name);
    check(pl.act_train >= pf.act_train + tv && pf.scratch > 0 && pl.scratch == 0, what);
out:
    pass_free(&a, np > 0 ? np : 0);
    pass_free(&f, npf > 0 ? npf : 0);
}

int main(void) {
    const char *spec = getenv("TWK_TEST_DEVICE");
    twk_device *dev = NULL;
    if (twk_device_open(spec && *spec ? spec : "cpu", &dev) != TWK_OK) {
        printf("FAIL open %s: %s\n", spec, twk_last_error());
        return 1;
    }
    check(twk_device_has_op(dev, TWK_OP_UNEMBED_LOGPROBS) && twk_device_has_op(dev, TWK_OP_UNEMBED_LOGPROBS_BACK),
          "the device runs unembed_logprobs and its backward");
    twk_model_config cfg = {.arch = TWK_ARCH_QWEN3, .vocab = 4099, .hidden = 64, .layers = 4, .heads = 4, .kv_heads = 2,
                            .head_dim = 16, .ffn = 96, .rope_theta = 1e4, .rms_eps = 1e-6, .qk_norm = true};
    twk_model *m = NULL;
    if (twk_model_random_as(&cfg, dev, 7, TWK_F32, &m) == TWK_OK) {
        model_case(m, dev, "random 4-layer", 37);
        twk_model_free(m);
    } else {
        printf("FAIL random model: %s\n", twk_last_error());
        fails++;
    }
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/qwen3/model", TWK_PARITY_DIR);
    if (twk_model_load_as(dir, dev, TWK_F32, -1, &m) == TWK_OK) {
        model_case(m, dev, "qwen3 fixture", 40);
        twk_model_free(m);
    } else {
        printf("skip qwen3 fixture: %s\n", twk_last_error());
    }
    twk_device_close(dev);
    printf("%d failures\n", fails);
    return fails ? 1 : 0;
}
