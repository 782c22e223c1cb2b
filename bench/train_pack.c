/* bench_train_pack: packed multi-LoRA training in process (train/lora_pack.c,
 * twk_loss_steps) against the same runs time-shared. N LoRA runs of one base
 * model each take a step on their
 * own batch of D datums x T tokens (cross_entropy forward_backward; each
 * run's optim_step follows, untimed, as it is the same work both ways):
 *   time-shared  each run's pass alone through a pack (what the server does
 *                with --pack-runs 1: the base weights are read N times);
 *   packed       one twk_loss_steps over all N runs (the server's default:
 *                one base GEMM over every run's tokens).
 * Prints steps/s and tokens/s of both and their ratio, and checks that every
 * run's loss is bit-identical both ways (the CPU).
 *
 *   bench_train_pack [--model tiny|qwen] [--runs 8] [--datums 4] [--tokens 16] [--rank 8]
 *                    [--steps 20] [--layers 4] [--vocab 32768] [--device cpu]
 * --model tiny: the server's built-in twinkle/tiny-qwen3; qwen: Qwen3-0.6B's
 * widths (hidden 1024, 16 / 8 heads of 128, ffn 3072), --layers layers, random
 * weights, --vocab tokens (the real 151936 needs ~1.2 GB per 2048-token pass
 * for the logits alone). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "twinkle/twinkle.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct run_data {
    twk_trainer *t;
    int64_t *off;
    int32_t *tok, *tgt;
    twk_loss_batch b;
} run_data;

int main(int argc, char **argv) {
    const char *prog = "bench_train_pack", *model = "tiny", *device = "cpu";
    long runs = 8, datums = 4, tokens = 16, rank = 8, steps = 20, layers = 4, vocab = 32768;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        int ok = 1;
        if (!strcmp(argv[i], "--model")) model = v;
        else if (!strcmp(argv[i], "--device")) device = v;
        else if (!strcmp(argv[i], "--runs")) ok = bench_parse_long(prog, v, "--runs", 1, 256, &runs);
        else if (!strcmp(argv[i], "--datums")) ok = bench_parse_long(prog, v, "--datums", 1, 4096, &datums);
        else if (!strcmp(argv[i], "--tokens")) ok = bench_parse_long(prog, v, "--tokens", 2, 1 << 16, &tokens);
        else if (!strcmp(argv[i], "--rank")) ok = bench_parse_long(prog, v, "--rank", 1, 4096, &rank);
        else if (!strcmp(argv[i], "--steps")) ok = bench_parse_long(prog, v, "--steps", 1, 1 << 20, &steps);
        else if (!strcmp(argv[i], "--layers")) ok = bench_parse_long(prog, v, "--layers", 1, 64, &layers);
        else if (!strcmp(argv[i], "--vocab")) ok = bench_parse_long(prog, v, "--vocab", 16, 1 << 20, &vocab);
        else {
            fprintf(stderr, "usage: %s [--model tiny|qwen] [--runs N] [--datums D] [--tokens T] [--rank R] "
                            "[--steps S] [--layers L] [--vocab V] [--device SPEC]\n", prog);
            return 2;
        }
        if (!ok) return 2;
        i++;
    }
    twk_device *dev = NULL;
    twk_model *m = NULL;
    twk_status st = twk_device_open(device, &dev);
    if (st == TWK_OK && !strcmp(model, "qwen")) {
        twk_model_config c = {.arch = TWK_ARCH_QWEN3, .vocab = (int)vocab, .hidden = 1024, .layers = (int)layers,
                              .heads = 16, .kv_heads = 8, .head_dim = 128, .ffn = 3072, .rope_theta = 1e6,
                              .rms_eps = 1e-6, .tie_embeddings = 1, .qk_norm = 1, .max_positions = 40960};
        snprintf(c.arch_name, sizeof c.arch_name, "Qwen3ForCausalLM");
        st = twk_model_random(&c, dev, 1, &m);
    } else if (st == TWK_OK) {
        st = twk_model_builtin(dev, &m);
    }
    if (st != TWK_OK) {
        fprintf(stderr, "%s: %s\n", prog, twk_last_error());
        return 1;
    }
    int V = twk_model_cfg(m)->vocab;
    int64_t per_run = datums * tokens;
    run_data *r = calloc((size_t)runs, sizeof *r);
    twk_loss_job *jobs = calloc((size_t)runs, sizeof *jobs);
    twk_loss_spec ce;
    twk_loss_spec_init("cross_entropy", &ce);
    twk_adam_params adam = twk_adam_default();
    adam.learning_rate = 1e-4f;
    twk_pack *pack = NULL;
    st = twk_pack_new(m, per_run * runs, (int)runs, &pack);
    srand(5);
    for (long i = 0; st == TWK_OK && i < runs; i++) {
        twk_lora_config lc = twk_lora_default();
        lc.rank = (int)rank;
        lc.seed = (uint64_t)i;
        st = twk_trainer_new(m, &lc, per_run, &r[i].t);
        r[i].off = malloc((size_t)(datums + 1) * sizeof *r[i].off);
        r[i].tok = malloc((size_t)per_run * sizeof *r[i].tok);
        r[i].tgt = malloc((size_t)per_run * sizeof *r[i].tgt);
        for (long d = 0; d <= datums; d++) r[i].off[d] = d * tokens;
        for (int64_t k = 0; k < per_run; k++) {
            r[i].tok[k] = rand() % V;
            r[i].tgt[k] = rand() % V;
        }
        r[i].b = (twk_loss_batch){(int)datums, r[i].off, r[i].tok, 0, r[i].tgt, {0}, NULL};
        jobs[i] = (twk_loss_job){.t = r[i].t, .spec = &ce, .b = &r[i].b, .backward = 1};
    }
    if (st != TWK_OK) {
        fprintf(stderr, "%s: %s\n", prog, twk_last_error());
        return 1;
    }
    printf("%s: %s model (%d layers, hidden %d, vocab %d) on %s; %ld runs x (%ld datums x %ld tokens), LoRA rank %ld\n",
           prog, model, twk_model_cfg(m)->layers, twk_model_cfg(m)->hidden, V, device, runs, datums, tokens, rank);
    double *loss_shared = calloc((size_t)runs, sizeof *loss_shared), *loss_packed = calloc((size_t)runs, sizeof *loss_packed);
    double secs[2] = {0, 0};
    int bad = 0;
    /* warm-up: one step each way, so both time steady state; then alternate the two */
    for (long s = -1; s < steps && !bad; s++) {
        for (int mode = 0; mode < 2 && !bad; mode++) {
            double t0 = now_s();
            if (mode == 0)
                for (long i = 0; i < runs && !bad; i++) bad |= twk_loss_steps(pack, &jobs[i], 1) != TWK_OK;
            else
                bad |= twk_loss_steps(pack, jobs, (int)runs) != TWK_OK;
            if (s >= 0) secs[mode] += now_s() - t0;
            for (long i = 0; i < runs && !bad; i++) { /* untimed: the same adapters for both modes, then a step */
                bad |= jobs[i].st != TWK_OK;
                (mode ? loss_packed : loss_shared)[i] = jobs[i].res.loss;
                float norm = 0;
                if (mode == 0) twk_trainer_zero_grad(r[i].t);
                else bad |= twk_trainer_optim_step(r[i].t, &adam, &norm) != TWK_OK;
            }
        }
        for (long i = 0; i < runs; i++)
            if (loss_shared[i] != loss_packed[i]) {
                printf("MISMATCH step %ld run %ld: time-shared loss %.9g, packed %.9g\n", s, i, loss_shared[i], loss_packed[i]);
                bad = 1;
            }
    }
    if (bad) {
        fprintf(stderr, "%s: failed: %s\n", prog, twk_last_error());
        return 1;
    }
    twk_pack_stats ps;
    twk_pack_get_stats(pack, &ps);
    double sps[2], tps[2];
    for (int k = 0; k < 2; k++) {
        sps[k] = (double)runs * steps / secs[k];
        tps[k] = sps[k] * (double)per_run;
    }
    printf("forward_backward steps (optim_step untimed: the same in both modes)\n");
    printf("  time-shared (each run's pass alone): %.1f steps/s, %.0f tokens/s\n", sps[0], tps[0]);
    printf("  packed (%ld runs per pass):          %.1f steps/s, %.0f tokens/s\n", runs, sps[1], tps[1]);
    printf("ratio packed / time-shared %.2fx; every run's loss bit-identical both ways; pack passes %lld (%lld shared)\n",
           sps[1] / sps[0], (long long)ps.passes, (long long)ps.shared_passes);
    printf("RESULT %ld %.6f %.6f %.6f %.6f\n", runs, sps[0], sps[1], tps[0], tps[1]);
    for (long i = 0; i < runs; i++) {
        twk_trainer_free(r[i].t);
        free(r[i].off);
        free(r[i].tok);
        free(r[i].tgt);
    }
    free(r);
    free(jobs);
    free(loss_shared);
    free(loss_packed);
    twk_pack_free(pack);
    twk_model_free(m);
    twk_device_close(dev);
    return 0;
}
