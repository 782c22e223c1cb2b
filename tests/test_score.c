/* Prompt scoring in one pass (twk_sampler_score_prompt: what compute_logprobs and
 * prompt_logprobs run): every prompt row's logprob equals the training forward's on the
 * same tokens (<= 1e-5), for the base model, for a LoRA sampler holding a trainer's adapter
 * (every module, the unembedding too) and for a LoRA snapshot in an adapter slot; prompts
 * of 1, 2, 37 and 300 tokens (300: more rows than one tile of the head's logits for this
 * vocabulary, and not a multiple of the attention's 64-query blocks). The top-k rows agree
 * with those logprobs; a prefill (the sampler's first token) picks the forward's argmax.
 *
 * A random Qwen3-shaped model (2 layers, hidden 64, vocab 65536: the head holds 256 rows
 * of logits at a time). TWK_TEST_DEVICE=spec runs it on that device with vocab 4096 and
 * a longest prompt of 100 tokens: the loop over tiles of rows is host code (train/sampler.c),
 * covered on the CPU, while a multi-tile pass costs >= 16M logits x hidden multiply-adds,
 * minutes on lavapipe or PoCL; 100 rows still cross the attention's 64-query blocks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "twinkle/twinkle.h"

#define TOL 1e-5
#define MAXN 300 /* the longest prompt on the CPU (the buffers' size) */
#define MAXN_DEVICE 100
#define VOCAB 65536
#define VOCAB_DEVICE 4096

static int maxn = MAXN, vocab = VOCAB; /* this run's longest prompt and vocabulary */

static int fails;

static void check(int ok, const char *what, double err, double tol) {
    printf("%s %-66s", ok ? "ok  " : "FAIL", what);
    if (tol > 0) printf(" err %.2e (tol %.0e)", err, tol);
    printf("\n");
    fails += !ok;
}

/* The training forward's logprobs of prompt[1..n) (lp[i] predicts prompt[i + 1]). */
static int forward_lps(twk_trainer *t, const int32_t *prompt, int n, float *lp) {
    int32_t tgt[MAXN], pos[MAXN], seg[MAXN];
    float w[MAXN];
    for (int i = 0; i + 1 < n; i++) {
        tgt[i] = prompt[i + 1];
        pos[i] = i;
        seg[i] = 0;
        w[i] = 1;
    }
    twk_batch b = {n - 1, prompt, tgt, pos, seg, w};
    return twk_trainer_forward(t, &b, lp, NULL) == TWK_OK;
}

/* Scores each prompt length with s (top-4 too) against trainer t's forward. */
static void score_vs_forward(twk_sampler *s, twk_trainer *t, const int32_t *prompt, const char *what) {
    const int lens[] = {1, 2, 37, maxn};
    enum { K = 4 };
    static float lp[MAXN], lpk[MAXN], ref[MAXN], tlp[MAXN * K];
    static int32_t tid[MAXN * K];
    double err = 0, errk = 0, errt = 0;
    int ok = 1, nan0 = 1, order = 1;
    for (size_t c = 0; c < sizeof lens / sizeof *lens; c++) {
        int n = lens[c];
        if (twk_sampler_score_prompt(s, prompt, n, lp, 0, NULL, NULL) != TWK_OK ||
            twk_sampler_score_prompt(s, prompt, n, lpk, K, tid, tlp) != TWK_OK || (n > 1 && !forward_lps(t, prompt, n, ref))) {
            printf("  %s, %d tokens: %s\n", what, n, twk_last_error());
            ok = 0;
            continue;
        }
        nan0 &= isnan(lp[0]) && isnan(lpk[0]) && tid[0] == 0;
        for (int i = 1; i < n; i++) {
            err = fmax(err, fabs(lp[i] - ref[i - 1]));
            errk = fmax(errk, fabs(lpk[i] - ref[i - 1]));
            for (int q = 0; q < K; q++) {
                if (q) order &= tlp[i * K + q] <= tlp[i * K + q - 1];
                if (tid[i * K + q] == prompt[i]) errt = fmax(errt, fabs(tlp[i * K + q] - ref[i - 1]));
            }
            order &= tlp[i * K] >= ref[i - 1] - TOL; /* nothing above the best */
        }
    }
    char line[160];
    snprintf(line, sizeof line, "%s: prompts of 1, 2, 37, %d tokens score", what, maxn);
    check(ok, line, 0, 0);
    snprintf(line, sizeof line, "%s: logprobs[0] is NaN", what);
    check(nan0, line, 0, 0);
    snprintf(line, sizeof line, "%s: logprobs equal the training forward's", what);
    check(ok && err <= TOL, line, err, TOL);
    snprintf(line, sizeof line, "%s: ... with top-4 asked (the logits head)", what);
    check(ok && errk <= TOL, line, errk, TOL);
    snprintf(line, sizeof line, "%s: top-4 sorted, above the target; a target in it agrees", what);
    check(ok && order && errt <= TOL, line, errt, TOL);
}

/* Random values for every adapter tensor of t (B too, so the adapter changes the model). */
static void randomize_adapter(twk_trainer *t) {
    twk_rng r;
    twk_rng_seed(&r, 7);
    for (int i = 0; i < twk_trainer_param_count(t); i++) {
        int64_t n = 0;
        const char *name = twk_trainer_param_name(t, i, &n);
        float *v = malloc((size_t)n * sizeof *v);
        for (int64_t j = 0; j < n; j++) v[j] = (float)((2 * twk_rng_uniform(&r) - 1) * 0.05);
        twk_trainer_set(t, name, v, n);
        free(v);
    }
}

/* The sampler's first greedy token after a prefill is the forward's argmax at the last row. */
static void prefill_token(twk_sampler *s, const int32_t *prompt, int n) {
    twk_sample_params p = {.max_tokens = 1, .temperature = 0, .top_k = -1, .top_p = 1};
    twk_sampled_seq q = {0};
    static float lp[MAXN + 1];
    static int32_t tid[(MAXN + 1) * 1];
    static float tlp[MAXN + 1];
    int ok = twk_sampler_generate(s, prompt, n, 1, &p, &q) == TWK_OK;
    int32_t ext[MAXN + 1];
    memcpy(ext, prompt, (size_t)n * sizeof *ext);
    ext[n] = ok ? q.tokens[0] : 0;
    ok = ok && twk_sampler_score_prompt(s, ext, n + 1, lp, 1, tid, tlp) == TWK_OK;
    double err = ok ? fabs(q.logprobs[0] - lp[n]) : 0;
    char line[96];
    snprintf(line, sizeof line, "prefill of %d tokens: its token is the top-1, same logprob", n);
    check(ok && tid[n] == q.tokens[0] && err <= TOL, line, err, TOL);
    twk_sampled_seq_free(&q);
}

int main(void) {
    const char *spec = getenv("TWK_TEST_DEVICE");
    twk_device *dev = NULL;
    if (spec && *spec && strcmp(spec, "cpu") != 0) {
        maxn = MAXN_DEVICE;
        vocab = VOCAB_DEVICE;
    }
    printf("device %s: vocab %d, prompts up to %d tokens\n", spec && *spec ? spec : "cpu", vocab, maxn);
    if (twk_device_open(spec && *spec ? spec : "cpu", &dev) != TWK_OK) {
        printf("FAIL open device: %s\n", twk_last_error());
        return 1;
    }
    twk_model_config c = {.arch = TWK_ARCH_QWEN3, .vocab = vocab, .hidden = 64, .layers = 2, .heads = 4, .kv_heads = 2,
                          .head_dim = 16, .ffn = 128, .rope_theta = 1e6, .rms_eps = 1e-6, .tie_embeddings = 1,
                          .qk_norm = 1, .max_positions = 4096};
    snprintf(c.arch_name, sizeof c.arch_name, "Qwen3ForCausalLM");
    twk_model *m = NULL;
    if (twk_model_random(&c, dev, 3, &m) != TWK_OK) {
        printf("FAIL model: %s\n", twk_last_error());
        return 1;
    }
    int32_t prompt[MAXN];
    for (int i = 0; i < MAXN; i++) prompt[i] = (int32_t)((1000 + 7919 * (int64_t)i) % vocab);

    /* the base model: a sampler without an adapter against a trainer whose B = 0 */
    twk_lora_config base = twk_lora_default();
    base.rank = 1;
    twk_trainer *tb = NULL;
    twk_sampler *sb = NULL;
    if (twk_trainer_new(m, &base, maxn, &tb) != TWK_OK || twk_sampler_new(m, NULL, 2, maxn + 4, &sb) != TWK_OK) {
        printf("FAIL base: %s\n", twk_last_error());
        return 1;
    }
    score_vs_forward(sb, tb, prompt, "base");
    prefill_token(sb, prompt, maxn - 1);

    /* a LoRA on every module (the tied unembedding too), random A and B */
    twk_lora_config lc = twk_lora_default();
    lc.rank = 4;
    lc.alpha = 8;
    lc.train_unembed = 1;
    twk_trainer *tl = NULL;
    twk_sampler *sl = NULL, *ss = NULL;
    if (twk_trainer_new(m, &lc, maxn, &tl) != TWK_OK || twk_sampler_new(m, &lc, 2, maxn + 4, &sl) != TWK_OK ||
        twk_sampler_new_slots(m, 3, 8, 2, maxn + 4, &ss) != TWK_OK) {
        printf("FAIL lora: %s\n", twk_last_error());
        return 1;
    }
    randomize_adapter(tl);
    if (twk_sampler_copy_adapter(sl, tl) != TWK_OK || twk_sampler_slot_from_trainer(ss, 2, tl) != TWK_OK) {
        printf("FAIL adapter copy: %s\n", twk_last_error());
        return 1;
    }
    score_vs_forward(sl, tl, prompt, "lora sampler");
    twk_sampler_set_score_slot(ss, 2);
    score_vs_forward(ss, tl, prompt, "lora snapshot in slot 2");
    twk_sampler_set_score_slot(ss, 0); /* an empty slot: the base model */
    score_vs_forward(ss, tb, prompt, "empty slot 0 (base)");

    twk_sampler_free(sb);
    twk_sampler_free(sl);
    twk_sampler_free(ss);
    twk_trainer_free(tb);
    twk_trainer_free(tl);
    twk_model_free(m);
    twk_device_close(dev);
    printf("%d failures\n", fails);
    return fails ? 1 : 0;
}
