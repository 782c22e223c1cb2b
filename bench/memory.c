/* bench_memory: the peak memory of one LoRA training step (forward + backward + AdamW)
 * of a model with Qwen3-0.6B's widths (vocab 151,936, hidden 1024; --layers, default 2)
 * at --tokens (default 4096), with or without the fused unembedding (--logits keeps the
 * [T, V] logits) and activation recompute (--recompute): the plan's table
 * (twk_mem_plan_config), the device's allocation counter and the process's peak RSS.
 * One configuration per process, so that the RSS is its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "twinkle/twinkle.h"

static long rss_peak_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atol(line + 6);
    if (f) fclose(f);
    return kb;
}

int main(int argc, char **argv) {
    int64_t n = 4096;
    int layers = 2, logits = 0, recompute = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc) n = atol(argv[++i]);
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--logits")) logits = 1;
        else if (!strcmp(argv[i], "--recompute")) recompute = 1;
        else {
            fprintf(stderr, "usage: bench_memory [--tokens T] [--layers L] [--logits] [--recompute]\n");
            return 2;
        }
    }
    twk_model_config q = {.arch = TWK_ARCH_QWEN3, .vocab = 151936, .hidden = 1024, .layers = layers, .heads = 16,
                          .kv_heads = 8, .head_dim = 128, .ffn = 3072, .rope_theta = 1e6, .rms_eps = 1e-6,
                          .qk_norm = true, .tie_embeddings = true};
    snprintf(q.arch_name, sizeof q.arch_name, "Qwen3ForCausalLM");
    twk_mem_request rq = {.tokens = n, .rank = 32, .dtype = "f32", .recompute = recompute, .logits = logits};
    twk_mem_plan p;
    twk_device *dev = NULL;
    twk_model *m = NULL;
    twk_trainer *t = NULL;
    if (twk_mem_plan_config(&q, &rq, &p) != TWK_OK || twk_device_open("cpu", &dev) != TWK_OK ||
        twk_model_random(&q, dev, 1, &m) != TWK_OK) {
        fprintf(stderr, "bench_memory: %s\n", twk_last_error());
        return 1;
    }
    long rss_model = rss_peak_kb();
    int32_t *tok = malloc((size_t)n * sizeof *tok), *pos = malloc((size_t)n * sizeof *pos), *seg = calloc((size_t)n, sizeof *seg);
    float *w = malloc((size_t)n * sizeof *w);
    for (int64_t i = 0; i < n; i++) tok[i] = (int32_t)((i * 7919) % q.vocab), pos[i] = (int32_t)i, w[i] = 1;
    twk_batch b = {.n = n, .tokens = tok, .targets = tok, .positions = pos, .seg_start = seg, .weights = w};
    twk_lora_config lc = twk_lora_default();
    twk_trainer_opts o = {.recompute = recompute, .logits = logits};
    uint64_t dev_peak = 0;
    float loss = 0;
    twk_adam_params ap = twk_adam_default();
    twk_status st = twk_trainer_new_opts(m, &lc, n, &o, &t);
    if (st == TWK_OK) st = twk_trainer_forward_backward(t, &b, NULL, &loss);
    if (st == TWK_OK) st = twk_trainer_optim_step(t, &ap, NULL);
    if (st != TWK_OK) {
        fprintf(stderr, "bench_memory: %s\n", twk_last_error());
        return 1;
    }
    twk_device_memory(dev, NULL, &dev_peak, false);
    char a[32], c[32], d[32], e[32];
    printf("%lld tokens, %d layers, %s, recompute %s: planned activations %s + logits tile %s, total %s; device counter "
           "peak %s; peak RSS %ld MiB (%ld MiB after the weights); loss %.3f\n",
           (long long)n, layers, logits ? "[T, V] logits" : "fused unembedding", recompute ? "on" : "off",
           twk_mem_bytes_str(p.activations, a, sizeof a), twk_mem_bytes_str(p.scratch, c, sizeof c),
           twk_mem_bytes_str(p.total, d, sizeof d), twk_mem_bytes_str(dev_peak, e, sizeof e), rss_peak_kb() / 1024,
           rss_model / 1024, (double)loss / (double)n);
    twk_trainer_free(t);
    twk_model_free(m);
    twk_device_close(dev);
    free(tok);
    free(pos);
    free(seg);
    free(w);
    return 0;
}
