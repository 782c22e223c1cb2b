/* bench_server_inproc: the in-process peer of bench/server/run.sh. Loads a
 * model folder (the server's DATA_DIR/models/tiny), builds a trainer with the
 * LoRA configuration `twinkle serve` gives an SDK client's
 * create_lora_training_client(rank=8) — rank 8, alpha 32, attention + MLP,
 * seed 0, capacity = --max-context (2048) — and times N back-to-back
 * twk_trainer_forward_backward calls on the same fixed batch the SDK client
 * sends (bench/server/sdk_bench.py): D datums of T tokens, datum d being
 * s[j] = (5 + 37*d + 11*j) mod 512 for j = 0..T, inputs s[0..T-1], targets
 * s[1..T], weights 1, packed the way server/runs.c packs them. Prints p50 /
 * p99 / mean in ms and the loss (Tinker's sum), which run.sh compares with the
 * server's loss:sum for the same batch. With --steps K (default 200) it also
 * times K training steps (forward_backward + optim_step) for the steps/s
 * ceiling of the compute alone; exits 1 on a non-finite loss, or one that does
 * not fall over the steps. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "twinkle/twinkle.h"
#include "twk_backend.h" /* the backend interface: tables, launches */

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* nearest-rank percentile of a sorted array (the same rule as sdk_bench.py) */
static double pct(const double *s, int n, double p) {
    int k = (int)ceil(p * n) - 1;
    if (k < 0) k = 0;
    if (k >= n) k = n - 1;
    return s[k];
}

int main(int argc, char **argv) {
    const char *dir = NULL, *device = "cpu";
    long n = 200, warm = 10, datums = 4, tokens = 16, rank = 8, cap = 2048, steps = 200;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1;
        if (!v) ok = 0;
        else if (!strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--n")) ok = bench_parse_long("bench_server_inproc", v, a, 1, 1000000, &n);
        else if (!strcmp(a, "--warmup")) ok = bench_parse_long("bench_server_inproc", v, a, 0, 1000000, &warm);
        else if (!strcmp(a, "--datums")) ok = bench_parse_long("bench_server_inproc", v, a, 1, 4096, &datums);
        else if (!strcmp(a, "--tokens")) ok = bench_parse_long("bench_server_inproc", v, a, 1, 1 << 20, &tokens);
        else if (!strcmp(a, "--rank")) ok = bench_parse_long("bench_server_inproc", v, a, 1, 1024, &rank);
        else if (!strcmp(a, "--steps")) ok = bench_parse_long("bench_server_inproc", v, a, 0, 1000000, &steps);
        else if (!strcmp(a, "--max-context")) ok = bench_parse_long("bench_server_inproc", v, a, 1, 1 << 24, &cap);
        else ok = 0;
        if (!ok) {
            fprintf(stderr,
                    "usage: bench_server_inproc --model DIR [--n 200] [--warmup 10] [--datums 4] [--tokens 16]\n"
                    "                           [--rank 8] [--max-context 2048] [--steps 200] [--device cpu]\n"
                    "  --steps: also time that many training steps (forward_backward + optim_step, AdamW lr 1e-4)\n");
            return 2;
        }
        i++;
    }
    if (!dir || datums * tokens > cap) {
        fprintf(stderr, "bench_server_inproc: --model DIR is required and datums x tokens must fit --max-context\n");
        return 2;
    }
    twk_device *dev = NULL;
    twk_model *m = NULL;
    twk_trainer *t = NULL;
    twk_lora_config lc = twk_lora_default(); /* seed 0, attn + mlp, as the server's default */
    lc.rank = (int)rank;
    lc.alpha = 32;
    lc.train_attn = 1;
    lc.train_mlp = 1;
    lc.train_unembed = 0;
    if (twk_device_open(device, &dev) != TWK_OK || twk_model_load(dir, dev, &m) != TWK_OK ||
        twk_trainer_new(m, &lc, cap, &t) != TWK_OK) {
        fprintf(stderr, "bench_server_inproc: %s\n", twk_last_error());
        return 1;
    }
    if (twk_model_cfg(m)->vocab < 512) {
        fprintf(stderr, "bench_server_inproc: the batch uses token ids < 512; the model's vocabulary is %d\n",
                twk_model_cfg(m)->vocab);
        return 1;
    }
    int64_t tot = datums * tokens;
    int32_t *buf = malloc((size_t)cap * 4 * 4);
    float *w = malloc((size_t)cap * 4), *lp = malloc((size_t)tot * 4);
    double *ms = malloc((size_t)n * sizeof *ms);
    int32_t *tok = buf, *tgt = buf + cap, *pos = buf + 2 * cap, *seg = buf + 3 * cap;
    for (int64_t d = 0, k = 0; d < datums; d++)
        for (int64_t j = 0; j < tokens; j++, k++) {
            tok[k] = (int32_t)((5 + 37 * d + 11 * j) % 512);
            tgt[k] = (int32_t)((5 + 37 * d + 11 * (j + 1)) % 512);
            pos[k] = (int32_t)j;
            seg[k] = (int32_t)(k - j);
            w[k] = 1.0f;
        }
    twk_batch b = {tot, tok, tgt, pos, seg, w};
    float loss = 0;
    double c0 = 0, c1 = 0;
    for (long i = 0; i < warm + n; i++) {
        if (i == warm) c0 = cpu_s();
        double t0 = twk_now();
        if (twk_trainer_forward_backward(t, &b, lp, &loss) != TWK_OK) {
            fprintf(stderr, "bench_server_inproc: %s\n", twk_last_error());
            return 1;
        }
        if (i >= warm) ms[i - warm] = (twk_now() - t0) * 1e3;
    }
    c1 = cpu_s();
    /* training steps on the same batch: forward_backward + AdamW (the gradients accumulated above are dropped) */
    twk_trainer_zero_grad(t);
    twk_adam_params ap = twk_adam_default();
    ap.learning_rate = 1e-4f;
    ap.eps = 1e-8f;
    float first = loss, last = loss;
    double st0 = twk_now(), sc0 = cpu_s();
    for (long i = 0; i < steps; i++) {
        if (twk_trainer_forward_backward(t, &b, lp, &last) != TWK_OK || twk_trainer_optim_step(t, &ap, NULL) != TWK_OK) {
            fprintf(stderr, "bench_server_inproc: %s\n", twk_last_error());
            return 1;
        }
    }
    double st1 = twk_now(), sc1 = cpu_s();
    double sum = 0;
    for (long i = 0; i < n; i++) sum += ms[i];
    qsort(ms, (size_t)n, sizeof *ms, cmp_double);
    twk_device_props props;
    twk_device_backend(dev)->device_props(0, &props);
    printf("in-process forward_backward: %ld datums x %ld tokens, LoRA rank %ld (alpha 32, attn+mlp), capacity %ld, "
           "%d threads: p50 %.3f ms  p99 %.3f ms  mean %.3f ms  (%ld calls after %ld warm-up)  loss %.4f\n",
           datums, tokens, rank, cap, props.max_threads, pct(ms, (int)n, 0.50), pct(ms, (int)n, 0.99), sum / n, n,
           warm, loss);
    printf("  CPU per call: %.2f ms (all threads of this process)\n", 1e3 * (c1 - c0) / n);
    double sps = steps ? steps / (st1 - st0) : 0;
    if (steps)
        printf("in-process training steps (forward_backward + optim_step): %.1f steps/s over %ld steps, CPU per step "
               "%.2f ms; loss %.4f -> %.4f\n",
               sps, steps, 1e3 * (sc1 - sc0) / steps, first, last);
    printf("RESULT %.6f %.6f %.6f %.6f %.6f\n", pct(ms, (int)n, 0.50), pct(ms, (int)n, 0.99), sum / n, loss, sps);
    int bad = !isfinite(loss) || (steps >= 10 && !(last < first));
    twk_trainer_free(t);
    twk_model_free(m);
    twk_device_close(dev);
    free(buf);
    free(w);
    free(lp);
    free(ms);
    if (bad) fprintf(stderr, "bench_server_inproc: non-finite loss, or the loss did not fall over the steps\n");
    return bad;
}
