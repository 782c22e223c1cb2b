/* loss_curve: a 20-step LoRA training run (forward + backward + AdamW on one
 * packed batch) on the CPU and on each available device; the per-step losses
 * must agree within 1e-4 relative. Each step runs through train/'s loss step
 * (twk_loss_step, cross_entropy), as the service and `twinkle train` do.
 * Prints the curves side by side. The model is the qwen3 parity fixture
 * (tests/parity/fixtures/qwen3/model) when it is there, else a random tiny Qwen3. On the CPU the loss must also fall.
 *
 * usage: test_curve [MODEL_DIR]   TWK_TEST_DEVICE=spec compares only that device */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "twinkle/twinkle.h"
#include "twk_backend.h" /* the backend interface: tables, launches */

#define STEPS 20
#define REL_TOL 1e-4
#define MAX_DEVS 8
#define SEQS 4
#define SEQ_LEN 29 /* 116 tokens: odd sizes on purpose */

static const char *model_dir(int argc, char **argv) {
    if (argc > 1) return argv[1];
#ifdef TWK_PARITY_DIR
    static char dir[600];
    snprintf(dir, sizeof dir, "%s/qwen3/model/config.json", TWK_PARITY_DIR);
    FILE *f = fopen(dir, "r");
    if (f) {
        fclose(f);
        snprintf(dir, sizeof dir, "%s/qwen3/model", TWK_PARITY_DIR);
        return dir;
    }
#endif
    return NULL;
}

/* The run on one device: losses[STEPS]. Returns 0 and prints why on failure. */
static int run_curve(const char *spec, const char *dir, float *losses) {
    twk_device *dev = NULL;
    twk_model *m = NULL;
    twk_trainer *t = NULL;
    int ok = 0;
    if (twk_device_open(spec, &dev) != TWK_OK) goto fail;
    if (dir) {
        if (twk_model_load(dir, dev, &m) != TWK_OK) goto fail;
    } else {
        twk_model_config c = {.arch = TWK_ARCH_QWEN3, .vocab = 397, .hidden = 64, .layers = 2, .heads = 4,
                              .kv_heads = 2, .head_dim = 24, .ffn = 136, .rope_theta = 1e6, .rms_eps = 1e-6,
                              .tie_embeddings = 1, .qk_norm = 1, .max_positions = 256};
        snprintf(c.arch_name, sizeof c.arch_name, "Qwen3ForCausalLM");
        if (twk_model_random(&c, dev, 5, &m) != TWK_OK) goto fail;
    }
    twk_lora_config lc = twk_lora_default();
    lc.rank = 8;
    lc.alpha = 16;
    lc.seed = 11;
    const int n = SEQS * SEQ_LEN, vocab = twk_model_cfg(m)->vocab;
    if (twk_trainer_new(m, &lc, n, &t) != TWK_OK) goto fail;
    int32_t tok[SEQS * SEQ_LEN], tgt[SEQS * SEQ_LEN];
    float w[SEQS * SEQ_LEN];
    twk_rng r;
    twk_rng_seed(&r, 2026);
    for (int s = 0; s < SEQS; s++) { /* each sequence a random walk of ids, to be memorised */
        int32_t cur = (int32_t)twk_rng_below(&r, vocab);
        for (int i = 0; i < SEQ_LEN; i++) {
            int k = s * SEQ_LEN + i;
            tok[k] = cur;
            cur = (int32_t)twk_rng_below(&r, vocab);
            tgt[k] = cur;
            w[k] = 1.0f / n;
        }
    }
    /* the step as every caller runs it: train/'s loss step with the cross_entropy spec */
    int64_t off[SEQS + 1];
    for (int s = 0; s <= SEQS; s++) off[s] = (int64_t)s * SEQ_LEN;
    twk_loss_batch b = {SEQS, off, tok, 0, tgt, {0}, NULL};
    b.in[TWK_IN_WEIGHTS] = w;
    twk_loss_spec ce;
    twk_loss_result res;
    twk_adam_params ap = twk_adam_default();
    ap.learning_rate = 5e-3f;
    ap.grad_clip_norm = 1.0f;
    if (twk_loss_spec_init("cross_entropy", &ce) != TWK_OK) goto fail;
    for (int s = 0; s < STEPS; s++) {
        if (twk_loss_step(t, &ce, &b, 1, NULL, &res) != TWK_OK || twk_trainer_optim_step(t, &ap, NULL) != TWK_OK)
            goto fail;
        losses[s] = (float)res.loss; /* the trainer's float loss, exactly */
    }
    ok = 1;
fail:
    if (!ok) printf("FAIL %s: %s\n", spec, twk_last_error());
    twk_trainer_free(t);
    twk_model_free(m);
    twk_device_close(dev);
    return ok;
}

int main(int argc, char **argv) {
    const char *dir = model_dir(argc, argv);
    const char *want = getenv("TWK_TEST_DEVICE");
    char specs[MAX_DEVS][48];
    int n_dev = 0, fails = 0;
    if (want && *want) { /* that device only (the CPU against itself when it is "cpu") */
        snprintf(specs[n_dev++], sizeof specs[0], "%s", want);
    } else {
        for (int i = 0; i < twk_backend_count(); i++) {
            const twk_backend_iface *b = twk_backend_get(i);
            if (!strcmp(b->name, "cpu")) continue;
            int nd = b->device_count();
            if (nd == 0) printf("skip %s: registered, but no device\n", b->name);
            for (int d = 0; d < nd && n_dev < MAX_DEVS; d++) snprintf(specs[n_dev++], sizeof specs[0], "%s:%d", b->name, d);
        }
    }
    printf("model: %s; LoRA rank 8 on q,k,v,o,gate,up,down; %d sequences x %d tokens; AdamW lr 5e-3, clip 1; "
           "%d steps\n", dir ? dir : "random tiny Qwen3 (no fixture)", SEQS, SEQ_LEN, STEPS);
    float cpu[STEPS], dev[MAX_DEVS][STEPS];
    int ran[MAX_DEVS] = {0};
    if (!run_curve("cpu", dir, cpu)) return 1;
    for (int d = 0; d < n_dev; d++) {
        ran[d] = run_curve(specs[d], dir, dev[d]);
        fails += !ran[d];
    }
    printf("step %12s", "cpu");
    for (int d = 0; d < n_dev; d++) printf(" %14s %9s", specs[d], "rel diff");
    printf("\n");
    double worst[MAX_DEVS] = {0};
    for (int s = 0; s < STEPS; s++) {
        printf("%4d %12.6f", s + 1, cpu[s]);
        for (int d = 0; d < n_dev; d++) {
            if (!ran[d]) {
                printf(" %14s %9s", "-", "-");
                continue;
            }
            double rel = fabs((double)dev[d][s] - cpu[s]) / fmax(fabs((double)cpu[s]), 1e-12);
            if (!(rel <= worst[d])) worst[d] = isnan(rel) ? INFINITY : rel;
            printf(" %14.6f %9.1e", dev[d][s], rel);
        }
        printf("\n");
    }
    /* exact bits of the CPU curve, to compare two builds (a refactor must leave them unchanged) */
    printf("cpu losses %%a:");
    for (int s = 0; s < STEPS; s++) printf(" %a", (double)cpu[s]);
    printf("\n");
    int falls = cpu[STEPS - 1] < 0.8f * cpu[0];
    printf("%s cpu loss falls: %.4f -> %.4f (want < 0.8x)\n", falls ? "ok  " : "FAIL", cpu[0], cpu[STEPS - 1]);
    fails += !falls;
    for (int d = 0; d < n_dev; d++) {
        if (!ran[d]) continue;
        int ok = worst[d] <= REL_TOL;
        printf("%s %s: per-step losses within %.0e of the CPU's (worst %.2e)\n", ok ? "ok  " : "FAIL", specs[d],
               REL_TOL, worst[d]);
        fails += !ok;
    }
    if (n_dev == 0) printf("no device other than the CPU: only the CPU's curve was run\n");
    printf("%d failures\n", fails);
    return fails ? 1 : 0;
}
