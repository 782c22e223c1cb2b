/* bench_sample_inproc: twinkle's sampler (twk_sampler_new / twk_sampler_generate,
 * KV cache, greedy) on a model with Qwen3-0.6B's widths and fewer layers,
 * random weights: prefill tokens/s, decode tokens/s at batch 1 and batch 16,
 * decode at batch 16 and temperature 1 (the host-side choice of tokens), and
 * twk_sampler_score_prompt (compute_logprobs) against a prefill (no peer).
 * It checks itself: the 16 greedy sequences equal the batch-1 one, and the
 * greedy logprobs equal the scoring pass's. With --save DIR it writes the
 * model as a Hugging Face folder for bench/sample/peer_generate.py
 * (bench/sample/run.sh runs both and prints the ratios).
 *
 * Decode tokens/s = batch * (N - 1) / (T(N new tokens) - T(1 new token)):
 * the prefill and the first token cancel out, so the figure is the cost of a
 * decode step, measured the same way for transformers' generate. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "twinkle/twinkle.h"
#include "twk_backend.h" /* the backend interface: tables, launches */

static double peak_rss_mib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

static int fail(void) {
    fprintf(stderr, "bench_sample_inproc: %s\n", twk_last_error());
    return 1;
}

/* Best (least) wall time of `reps` generate calls; out[0..batch) kept from the last one.
 * The short (1 new token) runs get 2 more reps than the long ones: a disturbed
 * short run inflates T(1) and so the decode figure. */
static twk_status timed(twk_sampler *s, const int32_t *prompt, int64_t n, int batch, const twk_sample_params *p,
                        int reps, double *best, twk_sampled_seq *out) {
    *best = 1e30;
    for (int r = 0; r < reps; r++) {
        for (int i = 0; i < batch; i++) twk_sampled_seq_free(&out[i]);
        double t0 = twk_now();
        twk_status st = twk_sampler_generate(s, prompt, n, batch, p, out);
        double dt = twk_now() - t0;
        if (st != TWK_OK) return st;
        if (dt < *best) *best = dt;
    }
    return TWK_OK;
}

/* The machine's copy bandwidth in GB/s (STREAM's convention: bytes read + bytes written, per
 * second), best of 5 memcpy's of 256 MiB. */
static double copy_gbs(void) {
    size_t n = (size_t)256 << 20;
    char *a = malloc(n), *b = malloc(n);
    double best = 1e30;
    if (!a || !b) return 0;
    memset(a, 1, n), memset(b, 2, n);
    for (int r = 0; r < 5; r++) {
        double t0 = twk_now();
        memcpy(r % 2 ? a : b, r % 2 ? b : a, n);
        double dt = twk_now() - t0;
        if (dt < best) best = dt;
    }
    free(a), free(b);
    return 2.0 * n / best * 1e-9;
}

static int want(const char *phase, const char *name) { return !strcmp(phase, "all") || !strcmp(phase, name); }

int main(int argc, char **argv) {
    int layers = 4, vocab = 151936, ctx = 1024, prompt_len = 256, n_new = 32, prefill_len = 960, reps = 2, batch = 16;
    const char *save = NULL, *phase = "all", *device = "cpu", *dtype = "f32", *kv = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--vocab") && i + 1 < argc) vocab = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) prompt_len = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--new") && i + 1 < argc) n_new = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prefill") && i + 1 < argc) prefill_len = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--save") && i + 1 < argc) save = argv[++i];
        else if (!strcmp(argv[i], "--phase") && i + 1 < argc) phase = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc && twk_dtype_parse_float(argv[i + 1]) >= 0) dtype = argv[++i];
        else if (!strcmp(argv[i], "--kv-dtype") && i + 1 < argc && twk_dtype_parse_float(argv[i + 1]) >= 0) kv = argv[++i];
        else {
            fprintf(stderr,
                    "usage: bench_sample_inproc [--layers 4] [--vocab 151936] [--ctx 1024] [--prompt 256] [--new 32]\n"
                    "                           [--prefill 960] [--batch 16] [--reps 2] [--save DIR]\n"
                    "                           [--phase all|prefill|decode1|decode16|temp1|score] [--device cpu]\n"
                    "                           [--dtype f32|bf16|f16] [--kv-dtype f32|bf16|f16]\n"
                    "  --save DIR: also write the model as a Hugging Face folder (for bench/sample/peer_generate.py)\n"
                    "  --phase: run one measurement only (with TWK_PROFILE=1, the per-op time of that phase)\n"
                    "  --dtype: the weights twinkle decodes with (--save writes f32 first); --kv-dtype: the KV\n"
                    "  cache (default: the weights' dtype)\n");
            return 2;
        }
    }
    if (layers < 1 || vocab < 2 || n_new < 2 || prompt_len < 1 || prefill_len < 1 || reps < 1 || batch < 1 ||
        prompt_len + n_new > ctx || prefill_len + 1 > ctx) {
        fprintf(stderr, "bench_sample_inproc: bad sizes (prompt + new and prefill + 1 must fit --ctx)\n");
        return 2;
    }
    twk_device *dev = NULL;
    if (twk_device_open(device, &dev) != TWK_OK) return fail();
    twk_device_props props;
    twk_device_backend(dev)->device_props(0, &props);
    twk_model_config c = {.arch = TWK_ARCH_QWEN3, .vocab = vocab, .hidden = 1024, .layers = layers, .heads = 16,
                          .kv_heads = 8, .head_dim = 128, .ffn = 3072, .rope_theta = 1e6, .rms_eps = 1e-6,
                          .tie_embeddings = 1, .qk_norm = 1, .max_positions = 40960};
    snprintf(c.arch_name, sizeof c.arch_name, "Qwen3ForCausalLM");
    twk_model *m = NULL;
    twk_sampler *s = NULL;
    twk_dtype wt = (twk_dtype)twk_dtype_parse_float(dtype);
    /* made in f32 only to save it for the peer; else in the decoding dtype (peak memory) */
    if (twk_model_random_as(&c, dev, 1, save ? TWK_F32 : wt, &m) != TWK_OK) return fail();
    if (save && twk_model_save(m, save) != TWK_OK) return fail();
    if (twk_model_convert(m, wt) != TWK_OK || (kv && twk_model_set_kv_dtype(m, (twk_dtype)twk_dtype_parse_float(kv)) != TWK_OK))
        return fail();
    if (twk_sampler_new(m, NULL, batch, ctx, &s) != TWK_OK) return fail();

    /* the prompts: fixed, the same formula as peer_generate.py */
    int64_t plen = prefill_len > prompt_len ? prefill_len : prompt_len;
    int32_t *prompt = malloc((size_t)(plen + n_new) * 4);
    for (int64_t i = 0; i < plen; i++) prompt[i] = (int32_t)((1000 + 7919 * i) % vocab);
    twk_sampled_seq *out = calloc((size_t)batch, sizeof *out), one = {0};
    twk_sample_params g = {.max_tokens = 1, .temperature = 0, .top_k = -1, .top_p = 1};
    printf("model: Qwen3 widths (hidden 1024, 16 heads / 8 kv, head_dim 128, ffn 3072, vocab %d, tied), %d layers, "
           "random weights, %s (KV cache %s); sampler %d seqs x %d context; %d threads\n",
           vocab, layers, dtype, twk_dtype_name(twk_model_kv_dtype(m)), batch, ctx, props.max_threads);
    /* warm-up: plans, first-touch of the KV cache */
    twk_sample_params w = g;
    w.max_tokens = 2;
    if (twk_sampler_generate(s, prompt, prompt_len, batch, &w, out) != TWK_OK) return fail();
    for (int i = 0; i < batch; i++) twk_sampled_seq_free(&out[i]);

    double t_pf = 0, t1_1 = 0, tn_1 = 0, t1_b = 0, tn_b = 0, t1_t = 0, tn_t = 0;
    int bad = 0;
    if (want(phase, "prefill")) {
        if (timed(s, prompt, prefill_len, 1, &g, reps, &t_pf, &one) != TWK_OK) return fail();
        printf("twinkle prefill   %9.1f tokens/s  (%d-token prompt, best %.3f s of %d, 1 new token)\n",
               prefill_len / t_pf, prefill_len, t_pf, reps);
    }
    twk_sample_params gn = g;
    gn.max_tokens = n_new;
    if (want(phase, "decode1")) {
        if (timed(s, prompt, prompt_len, 1, &g, reps + 2, &t1_1, &one) != TWK_OK) return fail();
        if (timed(s, prompt, prompt_len, 1, &gn, reps, &tn_1, &one) != TWK_OK) return fail();
        printf("twinkle decode b1 %9.1f tokens/s  (%d-token prompt, %d new: %.3f s; 1 new: %.3f s; %.1f ms/step)\n",
               (n_new - 1) / (tn_1 - t1_1), prompt_len, n_new, tn_1, t1_1, 1e3 * (tn_1 - t1_1) / (n_new - 1));
        /* bytes a step reads: every matrix once (the tied embedding as the unembedding), the KV rows so far */
        double per_layer = (double)c.hidden * c.heads * c.head_dim * 2 + (double)c.hidden * c.kv_heads * c.head_dim * 2 +
                           3.0 * c.hidden * c.ffn;
        double wbytes = (per_layer * layers + (double)vocab * c.hidden) * (double)twk_dtype_size(wt);
        double kvbytes = 2.0 * layers * (prompt_len + n_new / 2) * c.kv_heads * c.head_dim *
                         (double)twk_dtype_size(twk_model_kv_dtype(m));
        double step = (tn_1 - t1_1) / (n_new - 1);
        printf("twinkle decode b1 reads %.0f MB of weights + %.0f MB of KV cache per step: %.1f GB/s; this machine's "
               "copy bandwidth (memcpy, read + write) %.1f GB/s\n",
               wbytes * 1e-6, kvbytes * 1e-6, (wbytes + kvbytes) / step * 1e-9, copy_gbs());
    }
    if (want(phase, "decode16")) {
        if (timed(s, prompt, prompt_len, batch, &g, reps + 2, &t1_b, out) != TWK_OK) return fail();
        if (timed(s, prompt, prompt_len, batch, &gn, reps, &tn_b, out) != TWK_OK) return fail();
        printf("twinkle decode b%-2d%9.1f tokens/s  (%d-token prompt, %d new: %.3f s; 1 new: %.3f s; %.1f ms/step)\n",
               batch, (double)batch * (n_new - 1) / (tn_b - t1_b), prompt_len, n_new, tn_b, t1_b,
               1e3 * (tn_b - t1_b) / (n_new - 1));
        /* greedy: every one of the batch equals the batch-1 sequence */
        if (one.n == n_new)
            for (int i = 0; i < batch; i++)
                if (out[i].n != n_new || memcmp(out[i].tokens, one.tokens, (size_t)n_new * 4)) {
                    printf("MISMATCH: greedy sequence %d of the batch differs from the batch-1 sequence\n", i);
                    bad = 1;
                    break;
                }
    }
    if (want(phase, "temp1")) {
        twk_sample_params t = gn;
        t.temperature = 1;
        t.has_seed = 1;
        t.seed = 7;
        t.max_tokens = 1; /* one rep of the long run: the host-side sampling makes it slow */
        if (timed(s, prompt, prompt_len, batch, &t, 2, &t1_t, out) != TWK_OK) return fail();
        t.max_tokens = n_new;
        if (timed(s, prompt, prompt_len, batch, &t, 1, &tn_t, out) != TWK_OK) return fail();
        printf("twinkle decode b%-2d%9.1f tokens/s  at temperature 1, top_k/top_p off (%.1f ms/step; against greedy, "
               "the difference is choosing tokens on the host)\n",
               batch, (double)batch * (n_new - 1) / (tn_t - t1_t), 1e3 * (tn_t - t1_t) / (n_new - 1));
    }
    if (want(phase, "score") && one.n != n_new) {
        twk_sampled_seq_free(&one);
        if (twk_sampler_generate(s, prompt, prompt_len, 1, &gn, &one) != TWK_OK) return fail();
    }
    if (want(phase, "score")) {
        /* compute_logprobs of prompt + the greedy tokens, against a prefill of the same length */
        int64_t n = prompt_len + n_new;
        memcpy(prompt + prompt_len, one.tokens, (size_t)n_new * 4);
        float *lp = malloc((size_t)n * 4);
        double t_sc = 1e30, t_p = 0;
        for (int r = 0; r <= reps; r++) { /* a warm-up (it compiles the scoring head), then best of reps */
            double t0 = twk_now();
            if (twk_sampler_score_prompt(s, prompt, n, lp, 0, NULL, NULL) != TWK_OK) return fail();
            if (r > 0) t_sc = fmin(t_sc, twk_now() - t0);
        }
        twk_sampled_seq q = {0};
        if (timed(s, prompt, n - 1, 1, &g, reps, &t_p, &q) != TWK_OK) return fail();
        double err = 0;
        for (int i = 0; i < n_new; i++) err = fmax(err, fabs(lp[prompt_len + i] - one.logprobs[i]));
        /* the floor of that ratio: the unembedding of every row against of one (matmul and attention FLOPs) */
        double dq = (double)c.heads * c.head_dim, dk = (double)c.kv_heads * c.head_dim;
        double layer = 2.0 * c.layers * (c.hidden * (2 * dq + 2 * dk) + 3.0 * c.hidden * c.ffn) * (double)(n - 1) +
                       2.0 * c.layers * dq * (double)(n - 1) * (double)n; /* QK^T and PV, causal */
        double unembed = 2.0 * c.hidden * (double)c.vocab;
        printf("twinkle score_prompt %d tokens (compute_logprobs): %.3f s = %.2f x a prefill of that prompt (%.3f s); "
               "FLOPs %.2f x (every row's unembedding)\n",
               (int)n, t_sc, t_sc / t_p, t_p, (layer + unembed * (double)(n - 1)) / (layer + unembed));
        /* decoding reads K and V back from the cache in its dtype, the scoring pass keeps them in f32:
         * a 16-bit cache moves a logprob by a few units of its rounding (bf16 2^-9, f16 2^-12) */
        twk_dtype kvd = twk_model_kv_dtype(m);
        double tol = 1e-3 + (kvd == TWK_BF16 ? 8 * 0x1p-9 : kvd == TWK_F16 ? 8 * 0x1p-12 : 0);
        printf("check: greedy logprobs vs the scoring pass: max |diff| %.2e (bound %.1e, KV cache %s)%s\n", err, tol,
               twk_dtype_name(kvd), err > tol ? "  MISMATCH" : "");
        if (!(err <= tol)) bad = 1;
        /* the last greedy token is the argmax after the prompt + the others */
        if (q.n != 1 || q.tokens[0] != one.tokens[n_new - 1]) {
            printf("MISMATCH: a prefill of prompt + greedy tokens does not choose the last greedy token\n");
            bad = 1;
        }
        twk_sampled_seq_free(&q);
        free(lp);
    }
    if (one.n == n_new) {
        printf("TOKENS");
        for (int i = 0; i < n_new; i++) printf(" %d", one.tokens[i]);
        printf("\nLOGPROBS");
        for (int i = 0; i < n_new; i++) printf(" %.6f", one.logprobs[i]);
        printf("\n");
    }
    printf("peak RSS %.0f MiB\n", peak_rss_mib());
    printf("RESULT %.3f %.3f %.3f %.3f\n", t_pf > 0 ? prefill_len / t_pf : 0,
           tn_1 > t1_1 ? (n_new - 1) / (tn_1 - t1_1) : 0, tn_b > t1_b ? (double)batch * (n_new - 1) / (tn_b - t1_b) : 0,
           tn_t > t1_t ? (double)batch * (n_new - 1) / (tn_t - t1_t) : 0);
    for (int i = 0; i < batch; i++) twk_sampled_seq_free(&out[i]);
    twk_sampled_seq_free(&one);
    free(out);
    free(prompt);
    twk_sampler_free(s);
    twk_model_free(m);
    twk_device_close(dev);
    return bad;
}
