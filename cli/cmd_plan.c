/* `twinkle plan`: the memory a training configuration will take, from the model
 * folder's config.json and the real graphs built with shapes only (no weights
 * are read), and whether it fits a device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "twinkle/twinkle.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: twinkle plan --model DIR --tokens T [options]\n"
            "\n"
            "Prints the memory of a trainer of T tokens per pass on the model folder DIR (its\n"
            "config.json only; no weights are read): weights, LoRA adapter, gradients, AdamW moments,\n"
            "activations (the arena peak of the real forward+backward plan), KV cache, and the total.\n"
            "\n"
            "  --model DIR      Hugging Face model folder (config.json)\n"
            "  --tokens T       tokens per pass (train's --batch-tokens, serve's --max-context)\n"
            "  --rank R         LoRA rank (default 32; 0 = full-parameter training)\n"
            "  --train-unembed  LoRA on lm_head too\n"
            "  --train-experts  mixture of experts: LoRA on the experts (twinkle train's default);\n"
            "  --train-router   and on the router\n"
            "  --dtype D        the weights' dtype: f32, bf16, f16 (default: as the checkpoint stores them\n"
            "                   (config.json's torch_dtype without weights); with --device, as train\n"
            "                   and serve load them there)\n"
            "  --recompute      per-layer activation recompute\n"
            "  --logits         the [T, V] logits path instead of the fused unembedding (backends without\n"
            "                   it; full training and --train-unembed always take it)\n"
            "  --kv-seqs N      a sampler's KV cache of N sequences of T tokens (default 0: none)\n"
            "  --device SPEC    also check that it fits this device (exit status 1 when it does not)\n"
            "\n"
            "TWK_MEM_BUDGET=SIZE (bytes, or with K, M, G, T: 512M, 1.5GiB) caps the memory a device offers\n"
            "(for the CPU, the host's RAM) here and in train and serve's start-up checks.\n");
}

static int num(const char *flag, const char *s, double lo, double hi, double *out) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (!*s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "twinkle plan: %s wants a number in [%g, %g], got '%s'\n", flag, lo, hi, s);
        return 0;
    }
    *out = v;
    return 1;
}

int twk_cmd_plan(int argc, char **argv) {
    const char *model = NULL, *device = NULL;
    twk_mem_request rq = {.rank = 32}; /* dtype NULL: as the checkpoint stores its weights */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        double v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--recompute")) { rq.recompute = true; continue; }
        if (!strcmp(a, "--train-unembed")) { rq.train_unembed = true; continue; }
        if (!strcmp(a, "--train-experts")) { rq.train_experts = true; continue; }
        if (!strcmp(a, "--train-router")) { rq.train_router = true; continue; }
        if (!strcmp(a, "--logits")) { rq.logits = true; continue; }
        if (i + 1 >= argc) {
            fprintf(stderr, "twinkle plan: %s needs a value (or is unknown)\n", a);
            return 2;
        }
        const char *val = argv[++i];
        if (!strcmp(a, "--model")) model = val;
        else if (!strcmp(a, "--device")) device = val;
        else if (!strcmp(a, "--dtype")) {
            if (!twk_mem_dtype_bytes(val)) {
                fprintf(stderr, "twinkle plan: --dtype wants f32, bf16 or f16, got '%s'\n", val);
                return 2;
            }
            rq.dtype = val;
        }
        else if (!strcmp(a, "--tokens")) { if (!num(a, val, 1, 1e8, &v)) return 2; rq.tokens = (int64_t)v; }
        else if (!strcmp(a, "--rank")) { if (!num(a, val, 0, 4096, &v)) return 2; rq.rank = (int)v; }
        else if (!strcmp(a, "--kv-seqs")) { if (!num(a, val, 0, 1e6, &v)) return 2; rq.kv_seqs = (int)v; }
        else {
            fprintf(stderr, "twinkle plan: unknown option %s\n", a);
            return 2;
        }
    }
    if (!model || rq.tokens < 1) {
        fprintf(stderr, "twinkle plan: --model and --tokens are required\n");
        return 2;
    }
    rq.kv_len = rq.kv_seqs ? rq.tokens : 0;
    twk_device *dev = NULL;
    if (device && twk_device_open(device, &dev) != TWK_OK) {
        fprintf(stderr, "twinkle plan: %s\n", twk_last_error());
        return 2;
    }
    if (!rq.dtype) { /* as twinkle train / serve would load it on that device (as stored without one) */
        int t = twk_model_weights_dtype(model, dev, -1);
        if (t < 0) {
            fprintf(stderr, "twinkle plan: %s\n", twk_last_error());
            twk_device_close(dev);
            return 2;
        }
        rq.dtype = twk_dtype_name((twk_dtype)t);
    }
    if (dev && !twk_mem_fused_unembed(dev, rq.dtype)) rq.logits = true; /* that backend keeps the logits */
    if (dev && !twk_mem_dir_unembed(dev, rq.dtype)) rq.unembed_recompute = true; /* its fused one recomputes */
    twk_mem_plan p;
    if (twk_mem_plan_dir(model, &rq, &p) != TWK_OK) {
        fprintf(stderr, "twinkle plan: %s\n", twk_last_error());
        twk_device_close(dev);
        return 2;
    }
    char table[2048];
    printf("memory plan: %s, %lld tokens per pass, %s, %s weights%s\n", model, (long long)rq.tokens,
           rq.rank ? "LoRA" : "full-parameter training", rq.dtype, rq.recompute ? ", activation recompute" : "");
    fputs(twk_mem_plan_table(&p, &rq, table, sizeof table), stdout);
    if (!dev) return 0;
    twk_device_props pr;
    twk_device_get_props(dev, &pr);
    char b[32];
    uint64_t cap = 0;
    bool budgeted = false;
    twk_status st = twk_mem_plan_fits(&p, dev);
    if (st == TWK_OK && twk_mem_capacity(dev, &cap, &budgeted) == TWK_OK)
        printf("fits %s (%s, %s%s)\n", twk_device_spec(dev), pr.name, twk_mem_bytes_str(cap, b, sizeof b),
               budgeted ? ", TWK_MEM_BUDGET" : "");
    else printf("does not fit: %s\n", twk_last_error());
    twk_device_close(dev);
    return st == TWK_OK ? 0 : 1;
}
