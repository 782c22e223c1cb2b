/* bench_train_step: tokens/s and peak memory of one LoRA training step
 * (forward + backward + AdamW; rank 16; q,k,v,o,gate,up,down) on a 4-layer
 * model with Qwen3-0.6B's widths at 1024 packed tokens, random weights — and
 * the same step in PyTorch + PEFT on the CPU with the same thread count, in
 * the same run (bench/peer/train_step.py), with the ratio twinkle/PyTorch.
 * --device SPEC runs it on another device, --compare SPEC on a second one in
 * the same run (ratio device/compare), --peak-tflops P adds the MFU. The step also runs with
 * elementwise fusion off (TWK_FUSION=0; --fusion on skips it): launches per step and tokens/s
 * before and after. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "twinkle/twinkle.h"
#include "twk_backend.h" /* the backend interface: tables, launches */

static double peak_rss_mib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

typedef struct step_shape {
    int layers, tokens, seqs, rank, steps, vocab;
    int widths_8b;   /* Qwen3-8B's widths (untied) instead of Qwen3-0.6B's (tied) */
    twk_dtype dtype; /* the frozen base weights (LoRA, gradients and moments are f32) */
    int logits;      /* the [T, V] logits path instead of the fused unembedding */
    int unembed_recompute; /* the fused unembedding that recomputes its logits, not the two-product one */
} step_shape;

typedef struct step_result {
    double tps, best, warm, loss;
    double matmul_params; /* weights a token passes through in matmuls (LoRA included) */
    double lora_params;
    double up, down; /* bytes per step after warm-up (twk_backend_transfers) */
    double launches; /* kernel launches per step (twk_plan_launches_run) */
    int threads;
    char name[200];
    char path[16]; /* the unembedding path the trainer took (twk_trainer_unembed_path) */
} step_result;

/* Builds the model and trainer on `spec` and times the step; 0 (message printed) on failure. */
static int run_step(const char *spec, const step_shape *sh, step_result *res) {
    twk_device *dev = NULL;
    twk_model *m = NULL;
    twk_trainer *t = NULL;
    int32_t *ids = NULL;
    float *w = NULL;
    int ok = 0;
    if (twk_device_open(spec, &dev) != TWK_OK) goto out;
    twk_device_props props;
    if (twk_device_backend(dev)->device_props(0, &props) != TWK_OK) goto out;
    res->threads = props.max_threads;
    snprintf(res->name, sizeof res->name, "%.48s (%.128s)", twk_device_spec(dev), props.name);
    twk_model_config c = {.arch = TWK_ARCH_QWEN3, .vocab = sh->vocab, .hidden = 1024, .layers = sh->layers, .heads = 16,
                          .kv_heads = 8, .head_dim = 128, .ffn = 3072, .rope_theta = 1e6, .rms_eps = 1e-6,
                          .tie_embeddings = 1, .qk_norm = 1, .max_positions = 40960};
    if (sh->widths_8b) c.hidden = 4096, c.heads = 32, c.ffn = 12288, c.tie_embeddings = 0;
    snprintf(c.arch_name, sizeof c.arch_name, "Qwen3ForCausalLM");
    twk_lora_config lc = twk_lora_default();
    lc.rank = sh->rank;
    lc.alpha = 32;
    if (twk_model_random_as(&c, dev, 1, sh->dtype, &m) != TWK_OK ||
        twk_trainer_new_opts(m, &lc, sh->tokens,
                             &(twk_trainer_opts){.logits = sh->logits, .unembed_recompute = sh->unembed_recompute}, &t) != TWK_OK)
        goto out;
    snprintf(res->path, sizeof res->path, "%s", twk_trainer_unembed_path(t));
    double per_layer = (double)c.hidden * c.heads * c.head_dim * 2 + (double)c.hidden * c.kv_heads * c.head_dim * 2 +
                       3.0 * c.hidden * c.ffn;
    res->lora_params = 0;
    for (int i = 0; i < twk_trainer_param_count(t); i++) {
        int64_t ne = 0;
        twk_trainer_param_name(t, i, &ne);
        res->lora_params += (double)ne;
    }
    res->matmul_params = per_layer * c.layers + (double)c.vocab * c.hidden + res->lora_params; /* the unembedding once */
    int tokens = sh->tokens;
    ids = malloc((size_t)tokens * 4 * 4);
    w = malloc((size_t)tokens * 4);
    if (!ids || !w) goto out;
    int32_t *tgt = ids + tokens, *pos = tgt + tokens, *seg = pos + tokens;
    int per = tokens / sh->seqs;
    srand(3);
    for (int i = 0; i < tokens; i++) {
        ids[i] = rand() % sh->vocab;
        tgt[i] = rand() % sh->vocab;
        pos[i] = i % per;
        seg[i] = i / per * per;
        w[i] = 1.0f;
    }
    twk_batch b = {tokens, ids, tgt, pos, seg, w};
    twk_adam_params ap = twk_adam_default();
    ap.learning_rate = 1e-4f;
    float loss = 0;
    double t0 = twk_now();
    if (twk_trainer_forward_backward(t, &b, NULL, &loss) != TWK_OK || twk_trainer_optim_step(t, &ap, NULL) != TWK_OK)
        goto out;
    res->warm = twk_now() - t0;
    res->best = 1e30;
    const twk_backend_iface *be = twk_device_backend(dev);
    twk_backend_transfers_reset(be);
    uint64_t l0 = twk_plan_launches_run();
    for (int s = 0; s < sh->steps; s++) {
        t0 = twk_now();
        if (twk_trainer_forward_backward(t, &b, NULL, &loss) != TWK_OK || twk_trainer_optim_step(t, &ap, NULL) != TWK_OK)
            goto out;
        double dt = twk_now() - t0;
        if (dt < res->best) res->best = dt;
    }
    res->launches = (double)(twk_plan_launches_run() - l0) / sh->steps;
    twk_transfer_stats moved = twk_backend_transfers(be);
    res->up = (double)moved.upload_bytes / sh->steps;
    res->down = (double)moved.download_bytes / sh->steps;
    res->tps = tokens / res->best;
    res->loss = loss;
    ok = 1;
out:
    if (!ok) fprintf(stderr, "bench_train_step: %s: %s\n", spec, twk_last_error());
    twk_trainer_free(t);
    twk_model_free(m);
    twk_device_close(dev);
    free(ids);
    free(w);
    return ok;
}

static void print_result(const step_result *r, const step_shape *sh, double peak) {
    printf("twinkle  %8.1f tokens/s  (best step %.3f s of %d, first %.3f s)  peak RSS %.0f MiB  loss %.3f  on %s\n",
           r->tps, r->best, sh->steps, r->warm, peak_rss_mib(), r->loss, r->name);
    printf("         bytes per step after warm-up: %.0f up (the batch: %d tokens x 20 bytes = %d, + 32 of hyper-parameters), "
           "%.0f down (loss + norm); the %.1f MB of trainable weights and their gradients stay on the device\n",
           r->up, sh->tokens, sh->tokens * 20, r->down, r->lora_params * 4e-6);
    if (peak > 0) {
        double n = r->matmul_params;
        printf("         MFU %.2f%% (6 N tokens / time / peak; N = %.1fM matmul parameters incl. the unembedding and "
               "%.2fM LoRA; peak %.4g TFLOP/s); counting 4 N (a frozen base has no weight gradients): %.2f%%\n",
               100 * 6 * n * r->tps / (peak * 1e12), n * 1e-6, r->lora_params * 1e-6, peak,
               100 * 4 * n * r->tps / (peak * 1e12));
    }
}

int main(int argc, char **argv) {
    int layers = 4, tokens = 1024, seqs = 4, rank = 16, steps = 3, vocab = 151936;
    const char *peer = getenv("TWK_PEER_PYTHON"), *device = "cpu", *compare = NULL, *dtype = "f32";
    double peak = 0;
    int logits = 0, unembed_recompute = 0, widths_8b = 0, fusion_both = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seqs") && i + 1 < argc) seqs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rank") && i + 1 < argc) rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--vocab") && i + 1 < argc) vocab = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--peer") && i + 1 < argc) peer = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "--compare") && i + 1 < argc) compare = argv[++i];
        else if (!strcmp(argv[i], "--peak-tflops") && i + 1 < argc) peak = atof(argv[++i]);
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc && twk_dtype_parse_float(argv[i + 1]) >= 0) dtype = argv[++i];
        else if (!strcmp(argv[i], "--logits")) logits = 1;
        else if (!strcmp(argv[i], "--unembed-recompute")) unembed_recompute = 1;
        else if (!strcmp(argv[i], "--fusion") && i + 1 < argc && (!strcmp(argv[i + 1], "on") || !strcmp(argv[i + 1], "both")))
            fusion_both = !strcmp(argv[++i], "both");
        else if (!strcmp(argv[i], "--widths") && i + 1 < argc && (!strcmp(argv[i + 1], "0.6b") || !strcmp(argv[i + 1], "8b")))
            widths_8b = !strcmp(argv[++i], "8b");
        else {
            fprintf(stderr,
                    "usage: bench_train_step [--layers 4] [--tokens 1024] [--seqs 4] [--rank 16] [--steps 3]\n"
                    "                        [--vocab 151936] [--peer PYTHON] [--device cpu] [--compare SPEC]\n"
                    "                        [--peak-tflops P] [--dtype f32|bf16|f16] [--logits] [--widths 0.6b|8b]\n"
                    "                        [--fusion both|on] [--unembed-recompute]\n"
                    "  --peer (or TWK_PEER_PYTHON): a python with torch, transformers and peft; runs\n"
                    "  bench/peer/train_step.py with the same shapes and thread count and prints the ratio.\n"
                    "  --device: where twinkle runs; --compare SPEC: the same step on SPEC too, and the\n"
                    "  ratio device/SPEC; --peak-tflops P: the device's peak, for the MFU; --dtype: the\n"
                    "  frozen base weights' dtype, the peer's too (LoRA, gradients, moments stay f32);\n"
                    "  --logits: twinkle's [T, V] logits path instead of the fused unembedding;\n"
                    "  --unembed-recompute: the fused unembedding that recomputes its logits in the\n"
                    "  backward (three products) instead of the two-product one (the CPU's default);\n"
                    "  --widths: Qwen3-0.6B's layer widths (tied embeddings) or Qwen3-8B's (untied);\n"
                    "  --fusion both (default): also the step with elementwise fusion off (TWK_FUSION=0),\n"
                    "  its launches per step and tokens/s beside the fused step's; on: only the fused step.\n");
            return 2;
        }
    }
    if (layers < 1 || tokens < seqs || seqs < 1 || tokens % seqs || rank < 1 || steps < 1 || vocab < 2 || peak < 0) {
        fprintf(stderr, "bench_train_step: bad sizes\n");
        return 2;
    }
    step_shape sh = {layers, tokens, seqs, rank, steps, vocab, widths_8b, (twk_dtype)twk_dtype_parse_float(dtype), logits,
                     unembed_recompute};
    step_result r, rcmp;
    if (!run_step(device, &sh, &r)) return 1;
    printf("model: Qwen3-%s widths (hidden %d, %d heads / 8 kv, head_dim 128, ffn %d, vocab %d), %d layers, "
           "%s; LoRA rank %d on q,k,v,o,gate,up,down; %d tokens in %d sequences; %d threads; weights %s; %s\n",
           widths_8b ? "8B" : "0.6B", widths_8b ? 4096 : 1024, widths_8b ? 32 : 16, widths_8b ? 12288 : 3072, vocab,
           layers, widths_8b ? "untied" : "tied", rank, tokens, seqs, r.threads, dtype,
           !strcmp(r.path, "logits") ? "[T, V] logits" : !strcmp(r.path, "recompute") ? "fused unembedding (logits recomputed)"
                                                                                    : "fused unembedding (two products)");
    print_result(&r, &sh, peak);
    step_result ru = {0};
    if (fusion_both && getenv("TWK_FUSION") && !strcmp(getenv("TWK_FUSION"), "0")) fusion_both = 0;
    if (fusion_both) {
        setenv("TWK_FUSION", "0", 1);
        int ok = run_step(device, &sh, &ru);
        unsetenv("TWK_FUSION");
        if (!ok) return 1;
        printf("fusion   launches per step: %.0f unfused -> %.0f fused (%.0f fewer); tokens/s %.1f unfused, %.1f fused "
               "(ratio fused/unfused %.3f); loss %.6f unfused, %.6f fused\n",
               ru.launches, r.launches, ru.launches - r.launches, ru.tps, r.tps, r.tps / ru.tps, ru.loss, r.loss);
    } else {
        printf("fusion   launches per step: %.0f (TWK_FUSION=%s)\n", r.launches,
               getenv("TWK_FUSION") ? getenv("TWK_FUSION") : "unset: on");
    }
    if (compare) {
        if (!run_step(compare, &sh, &rcmp)) return 1;
        print_result(&rcmp, &sh, 0);
        printf("ratio %s / %s: %.2f tokens/s\n", device, compare, r.tps / rcmp.tps);
    }
    /* one line for scripts (bench/device/run.sh) */
    printf("SUMMARY bench_train_step device=%s tokens_per_s=%.2f mfu=%.5f compare_tokens_per_s=%.2f up_bytes=%.0f "
           "down_bytes=%.0f launches=%.0f launches_unfused=%.0f unfused_tokens_per_s=%.2f\n", device, r.tps,
           peak > 0 ? 6 * r.matmul_params * r.tps / (peak * 1e12) : 0.0, compare ? rcmp.tps : 0.0, r.up, r.down, r.launches,
           fusion_both ? ru.launches : r.launches, fusion_both ? ru.tps : 0.0);
    int threads = r.threads;
    double tps = r.tps, rss = peak_rss_mib();
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
             "%s %s --layers %d --tokens %d --seqs %d --rank %d --steps %d --vocab %d --threads %d --dtype %s --widths %s",
             peer, script, layers, tokens, seqs, rank, steps, vocab, threads, dtype, widths_8b ? "8b" : "0.6b");
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
