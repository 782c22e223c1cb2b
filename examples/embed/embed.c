/* A program embedding twinkle through its installed library only (pkg-config twinkle):
 * the built-in tiny model on the CPU, LoRA steps on one sequence cycling through 8 token
 * ids (the loss must fall below a tenth), then a greedy continuation of a prompt from
 * the trained adapter (it must continue the cycle).
 * Exit status 0 on success, 1 with a message otherwise. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <twinkle/twinkle.h>

#define SEQ 48   /* tokens in the training sequence */
#define STEPS 40 /* LoRA steps (about 0.2 s on one core) */
#define NEW 8    /* tokens sampled */

static int n_warnings;

/* The engine's messages come here instead of stderr. */
static void on_log(twk_log_level level, const char *msg, void *user) {
    (void)user;
    if (level >= TWK_LOG_WARN) n_warnings++;
    printf("[twinkle] %s\n", msg);
}

static int fail(const char *what) {
    printf("FAIL %s: %s\n", what, twk_last_error());
    return 1;
}

int main(void) {
    if (twk_api_version() / 10000 != TWK_API_VERSION_MAJOR) {
        printf("FAIL built with twinkle %s, running with %s\n", TWK_VERSION, twk_version_string());
        return 1;
    }
    printf("twinkle %s (headers %s)\n", twk_version_string(), TWK_VERSION);
    twk_set_log_fn(TWK_LOG_INFO, on_log, NULL);

    twk_device *dev = NULL;
    twk_model *model = NULL;
    twk_trainer *trainer = NULL;
    twk_sampler *sampler = NULL;
    int rc = 1;
    if (twk_device_open("cpu", &dev) != TWK_OK) return fail("device_open");
    if (twk_model_builtin(dev, &model) != TWK_OK) {
        rc = fail("model_builtin");
        goto out;
    }
    const twk_model_config *cfg = twk_model_cfg(model);
    printf("model %s: %s, vocab %d, hidden %d, %d layers\n", TWK_BUILTIN_MODEL_NAME, cfg->arch_name, cfg->vocab,
           cfg->hidden, cfg->layers);

    twk_lora_config lora = twk_lora_default();
    lora.rank = 16;
    lora.alpha = 32;
    lora.train_unembed = true; /* the tied unembedding too: without it the logits stay small */
    if (twk_trainer_new(model, &lora, SEQ, &trainer) != TWK_OK) {
        rc = fail("trainer_new");
        goto out;
    }
    /* one sequence cycling through 100..107: token 100 + k predicts 100 + (k + 1) % 8 */
    int32_t tokens[SEQ], targets[SEQ], positions[SEQ], seg_start[SEQ];
    float weights[SEQ];
    for (int i = 0; i < SEQ; i++) {
        tokens[i] = 100 + i % 8;
        targets[i] = 100 + (i + 1) % 8;
        positions[i] = i;
        seg_start[i] = 0;
        weights[i] = 1.0f / SEQ; /* the loss is the mean over tokens */
    }
    twk_batch batch = {.n = SEQ, .tokens = tokens, .targets = targets, .positions = positions,
                       .seg_start = seg_start, .weights = weights};
    twk_adam_params adam = twk_adam_default();
    adam.learning_rate = 5e-3f;
    adam.eps = 1e-8f;
    float first = 0, last = 0;
    for (int s = 0; s < STEPS; s++) {
        float loss;
        if (twk_trainer_forward_backward(trainer, &batch, NULL, &loss) != TWK_OK ||
            twk_trainer_optim_step(trainer, &adam, NULL) != TWK_OK) {
            rc = fail("training step");
            goto out;
        }
        printf("step %2d  loss %.4f\n", s, loss);
        if (s == 0) first = loss;
        last = loss;
    }
    if (!(isfinite(last) && last < 0.1f * first)) {
        printf("FAIL the loss did not fall below a tenth: %.4f -> %.4f\n", first, last);
        goto out;
    }

    if (twk_sampler_new(model, &lora, 1, 64, &sampler) != TWK_OK ||
        twk_sampler_copy_adapter(sampler, trainer) != TWK_OK) {
        rc = fail("sampler");
        goto out;
    }
    const int32_t prompt[4] = {102, 103, 104, 105};
    twk_sample_params params = {.max_tokens = NEW, .temperature = 0, .top_p = 1};
    twk_sampled_seq seq;
    if (twk_sampler_generate(sampler, prompt, 4, 1, &params, &seq) != TWK_OK) {
        rc = fail("sampler_generate");
        goto out;
    }
    printf("prompt 102 103 104 105 ->");
    int counted = 0, finite = 1;
    for (int64_t i = 0; i < seq.n; i++) {
        printf(" %d", seq.tokens[i]);
        counted += seq.tokens[i] == 100 + (6 + i) % 8;
        finite &= isfinite(seq.logprobs[i]) && seq.logprobs[i] <= 0;
    }
    printf("  (%d of %lld continue the cycle; %s)\n", counted, (long long)seq.n,
           seq.stop_reason == TWK_STOP_LENGTH ? "length" : "stop token");
    int ok = seq.n == NEW && counted == NEW && finite;
    twk_sampled_seq_free(&seq);
    if (!ok) {
        printf("FAIL the sample: %lld tokens (want %d), %d continue the cycle, logprobs finite and <= 0: %d\n",
               (long long)seq.n, NEW, counted, finite);
        goto out;
    }
    printf("ok: loss %.4f -> %.4f in %d LoRA steps, %d engine warnings\n", first, last, STEPS, n_warnings);
    rc = 0;
out:
    twk_sampler_free(sampler);
    twk_trainer_free(trainer);
    twk_model_free(model);
    twk_device_close(dev);
    return rc;
}
