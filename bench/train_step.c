/* bench_train_step: tokens/s and peak memory of one LoRA training step
 * (forward + backward + AdamW; rank 16; q,k,v,o,gate,up,down) on a 4-layer
 * model with Qwen3-0.6B's widths at 1024 packed tokens, random weights — and
 * the same step in PyTorch + PEFT on the CPU with the same thread count, in
 * the same run (bench/peer/train_step.py), with the ratio twinkle/PyTorch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "twinkle/twinkle.h"

static double peak_rss_mib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

int main(int argc, char **argv) {
    int layers = 4, tokens = 1024, seqs = 4, rank = 16, steps = 3, vocab = 151936;
    const char *peer = getenv("TWK_PEER_PYTHON"), *device = "cpu";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seqs") && i + 1 < argc) seqs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rank") && i + 1 < argc) rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--vocab") && i + 1 < argc) vocab = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--peer") && i + 1 < argc) peer = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else {
            fprintf(stderr,
                    "usage: bench_train_step [--layers 4] [--tokens 1024] [--seqs 4] [--rank 16] [--steps 3]\n"
                    "                        [--vocab 151936] [--peer PYTHON] [--device cpu]\n"
                    "  --peer (or TWK_PEER_PYTHON): a python with torch, transformers and peft; runs\n"
                    "  bench/peer/train_step.py with the same shapes and thread count and prints the ratio.\n");
            return 2;
        }
    }
    if (layers < 1 || tokens < seqs || seqs < 1 || tokens % seqs || rank < 1 || steps < 1 || vocab < 2) {
        fprintf(stderr, "bench_train_step: bad sizes\n");
        return 2;
    }
    twk_device *dev = NULL;
    if (twk_device_open(device, &dev) != TWK_OK) {
        fprintf(stderr, "%s\n", twk_last_error());
        return 1;
    }
    twk_device_props props;
    twk_device_backend(dev)->device_props(0, &props);
    twk_model_config c = {.arch = TWK_ARCH_QWEN3, .vocab = vocab, .hidden = 1024, .layers = layers, .heads = 16,
                          .kv_heads = 8, .head_dim = 128, .ffn = 3072, .rope_theta = 1e6, .rms_eps = 1e-6,
                          .tie_embeddings = 1, .qk_norm = 1, .max_positions = 40960};
    snprintf(c.arch_name, sizeof c.arch_name, "Qwen3ForCausalLM");
    twk_model *m = NULL;
    twk_trainer *t = NULL;
    twk_lora_config lc = twk_lora_default();
    lc.rank = rank;
    lc.alpha = 32;
    if (twk_model_random(&c, dev, 1, &m) != TWK_OK || twk_trainer_new(m, &lc, tokens, &t) != TWK_OK) {
        fprintf(stderr, "%s\n", twk_last_error());
        return 1;
    }
    int32_t *ids = malloc((size_t)tokens * 4 * 4);
    float *w = malloc((size_t)tokens * 4);
    int32_t *tgt = ids + tokens, *pos = tgt + tokens, *seg = pos + tokens;
    int per = tokens / seqs;
    srand(3);
    for (int i = 0; i < tokens; i++) {
        ids[i] = rand() % vocab;
        tgt[i] = rand() % vocab;
        pos[i] = i % per;
        seg[i] = i / per * per;
        w[i] = 1.0f;
    }
    twk_batch b = {tokens, ids, tgt, pos, seg, w};
    twk_adam_params ap = twk_adam_default();
    ap.learning_rate = 1e-4f;
    float loss = 0;
    double t0 = twk_now();
    if (twk_trainer_forward_backward(t, &b, NULL, &loss) != TWK_OK || twk_trainer_optim_step(t, &ap, NULL) != TWK_OK) {
        fprintf(stderr, "%s\n", twk_last_error());
        return 1;
    }
    double warm = twk_now() - t0, best = 1e30;
    for (int s = 0; s < steps; s++) {
        t0 = twk_now();
        twk_trainer_forward_backward(t, &b, NULL, &loss);
        twk_trainer_optim_step(t, &ap, NULL);
        double dt = twk_now() - t0;
        if (dt < best) best = dt;
    }
    double tps = tokens / best, rss = peak_rss_mib();
    printf("model: Qwen3 widths (hidden 1024, 16 heads / 8 kv, head_dim 128, ffn 3072, vocab %d), %d layers, "
           "tied; LoRA rank %d on q,k,v,o,gate,up,down; %d tokens in %d sequences; %d threads\n",
           vocab, layers, rank, tokens, seqs, props.max_threads);
    printf("twinkle  %8.1f tokens/s  (best step %.3f s of %d, first %.3f s)  peak RSS %.0f MiB  loss %.3f\n", tps,
           best, steps, warm, rss, loss);
    twk_trainer_free(t);
    twk_model_free(m);
    twk_device_close(dev);
    free(ids);
    free(w);
    if (!peer) {
        printf("peer     skipped (set TWK_PEER_PYTHON or --peer to a python with torch, transformers, peft)\n");
        return 0;
    }
    char cmd[2048];
    const char *self = argv[0];
    const char *slash = strrchr(__FILE__, '/');
    char script[1024];
    snprintf(script, sizeof script, "%.*s/peer/train_step.py", (int)(slash ? slash - __FILE__ : 1),
             slash ? __FILE__ : ".");
    (void)self;
    snprintf(cmd, sizeof cmd,
             "%s %s --layers %d --tokens %d --seqs %d --rank %d --steps %d --vocab %d --threads %d", peer, script,
             layers, tokens, seqs, rank, steps, vocab, props.max_threads);
    FILE *f = popen(cmd, "r");
    double ptps = 0, prss = 0;
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        fputs(line, stdout);
        char *p = strstr(line, "RESULT");
        if (p) sscanf(p, "RESULT %lf %lf", &ptps, &prss);
    }
    int rc = f ? pclose(f) : -1;
    if (rc != 0 || ptps <= 0) {
        printf("peer     failed (exit %d): %s\n", rc, cmd);
        return 1;
    }
    printf("ratio twinkle/pytorch: %.2f tokens/s (expected >= 1.0; aim 1.5), peak memory %.2f\n", tps / ptps,
           rss / prss);
    return 0;
}
