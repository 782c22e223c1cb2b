/* bench_moe_step: one LoRA training step (forward + backward + AdamW; rank 16 on q, k, v, o)
 * on a 4-layer Qwen3-MoE-shaped model (hidden 1024, 16 experts, top-4, experts of 384: Qwen3-30B-A3B's
 * proportions), random weights — tokens/s and peak memory against transformers' Qwen3MoeForCausalLM
 * + PEFT on the CPU with the same thread count (bench/peer/moe_step.py); then the experts' grouped
 * product alone (lora_gather over rows grouped by expert) against one GEMM of the same FLOPs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench_util.h"
#include "twinkle/twinkle.h"
#include "twk_backend.h" /* device_props: the thread count */

static double peak_rss_mib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

typedef struct moe_shape {
    long layers, tokens, seqs, rank, steps, vocab, hidden, heads, kv_heads, experts, top_k, moe_ffn;
} moe_shape;

/* The step's best time over sh->steps after a warm-up; 0 (message printed) on failure. */
static int run_step(twk_device *dev, const moe_shape *sh, double *best, double *warm, float *loss, double *lora) {
    twk_model *m = NULL;
    twk_trainer *t = NULL;
    int32_t *ids = NULL;
    float *w = NULL;
    int ok = 0;
    twk_model_config c = {.arch = TWK_ARCH_QWEN3_MOE, .vocab = (int)sh->vocab, .hidden = (int)sh->hidden,
                          .layers = (int)sh->layers, .heads = (int)sh->heads, .kv_heads = (int)sh->kv_heads,
                          .head_dim = 128, .ffn = 3 * (int)sh->hidden, .rope_theta = 1e6, .rms_eps = 1e-6,
                          .tie_embeddings = 0, .qk_norm = 1, .max_positions = 40960, .n_experts = (int)sh->experts,
                          .top_k = (int)sh->top_k, .moe_ffn = (int)sh->moe_ffn, .sparse_step = 1, .norm_topk = 1};
    snprintf(c.arch_name, sizeof c.arch_name, "Qwen3MoeForCausalLM");
    twk_lora_config lc = twk_lora_default();
    lc.rank = (int)sh->rank;
    lc.alpha = 32;
    if (twk_model_random(&c, dev, 1, &m) != TWK_OK || twk_trainer_new(m, &lc, sh->tokens, &t) != TWK_OK) goto out;
    *lora = 0;
    for (int i = 0; i < twk_trainer_param_count(t); i++) {
        int64_t ne = 0;
        twk_trainer_param_name(t, i, &ne);
        *lora += (double)ne;
    }
    int tokens = (int)sh->tokens, per = tokens / (int)sh->seqs;
    ids = malloc((size_t)tokens * 4 * sizeof *ids);
    w = malloc((size_t)tokens * sizeof *w);
    if (!ids || !w) goto out;
    int32_t *tgt = ids + tokens, *pos = tgt + tokens, *seg = pos + tokens;
    srand(3);
    for (int i = 0; i < tokens; i++) {
        ids[i] = rand() % (int)sh->vocab;
        tgt[i] = rand() % (int)sh->vocab;
        pos[i] = i % per;
        seg[i] = i / per * per;
        w[i] = 1.0f;
    }
    twk_batch b = {tokens, ids, tgt, pos, seg, w};
    twk_adam_params ap = twk_adam_default();
    ap.learning_rate = 1e-4f;
    double t0 = twk_now();
    if (twk_trainer_forward_backward(t, &b, NULL, loss) != TWK_OK || twk_trainer_optim_step(t, &ap, NULL) != TWK_OK)
        goto out;
    *warm = twk_now() - t0;
    *best = 1e30;
    for (long s = 0; s < sh->steps; s++) {
        t0 = twk_now();
        if (twk_trainer_forward_backward(t, &b, NULL, loss) != TWK_OK || twk_trainer_optim_step(t, &ap, NULL) != TWK_OK)
            goto out;
        double dt = twk_now() - t0;
        if (dt < *best) *best = dt;
    }
    ok = isfinite(*loss);
    if (!ok) twk_error(TWK_ERR_STATE, "the loss is %g", (double)*loss);
out:
    if (!ok) fprintf(stderr, "bench_moe_step: %s\n", twk_last_error());
    twk_trainer_free(t);
    twk_model_free(m);
    free(ids);
    free(w);
    return ok;
}

/* Runs the peer and reads its RESULT line; 0 when it failed. */
static int run_peer(const char *peer, const moe_shape *sh, int threads, double *tps, double *rss) {
    const char *slash = strrchr(__FILE__, '/');
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s %.*s/peer/moe_step.py --layers %ld --tokens %ld --seqs %ld --rank %ld --steps %ld --vocab %ld "
             "--threads %d --hidden %ld --heads %ld --kv-heads %ld --experts %ld --top-k %ld --moe-ffn %ld",
             peer, (int)(slash ? slash - __FILE__ : 1), slash ? __FILE__ : ".", sh->layers, sh->tokens, sh->seqs, sh->rank,
             sh->steps, sh->vocab, threads, sh->hidden, sh->heads, sh->kv_heads, sh->experts, sh->top_k, sh->moe_ffn);
    FILE *f = popen(cmd, "r");
    char line[512];
    *tps = *rss = 0;
    while (f && fgets(line, sizeof line, f)) {
        char *p = strstr(line, "RESULT");
        if (p) sscanf(p, "RESULT %lf %lf", tps, rss);
        else fputs(line, stdout);
    }
    int rc = f ? pclose(f) : -1;
    if (rc != 0 || *tps <= 0) {
        printf("peer     failed (exit %d): %s\n", rc, cmd);
        return 0;
    }
    return 1;
}

/* Seconds of the best of `reps` runs of a compiled plan (after one warm-up); < 0 on failure. */
static double time_plan(twk_plan *p, int64_t n, int reps) {
    if (twk_plan_run(p, n) != TWK_OK) return -1;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = twk_now();
        if (twk_plan_run(p, n) != TWK_OK) return -1;
        double dt = twk_now() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

/* One projection of the experts: R = tokens * top_k rows routed at random, grouped by expert,
 * x [R, K] through w [E, N, K] (lora_gather, each row's expert as its slot) against one
 * MATMUL [R, K] x [N, K]^T of the same FLOPs. Checks sampled entries against float64; 0 on failure. */
static int grouped_case(twk_device *dev, const char *what, int64_t R, int64_t E, int64_t N, int64_t K, int reps) {
    float *x = malloc((size_t)(R * K) * sizeof *x), *w = malloc((size_t)(E * N * K) * sizeof *w);
    float *y = malloc((size_t)(R * N) * sizeof *y);
    int32_t *slot = malloc((size_t)R * sizeof *slot);
    int ok = 0, checked = 0;
    twk_graph *g = NULL, *g1 = NULL;
    twk_plan *p = NULL, *p1 = NULL;
    if (!x || !w || !y || !slot) goto out;
    twk_rng rng;
    twk_rng_seed(&rng, 7);
    for (int64_t i = 0; i < R * K; i++) x[i] = (float)(2 * twk_rng_uniform(&rng) - 1);
    for (int64_t i = 0; i < E * N * K; i++) w[i] = (float)(2 * twk_rng_uniform(&rng) - 1);
    /* each row an expert drawn uniformly, then sorted (the rows as moe_sort groups them) */
    int64_t *count = calloc((size_t)E, sizeof *count);
    if (!count) goto out;
    for (int64_t r = 0; r < R; r++) count[twk_rng_below(&rng, (uint64_t)E)]++;
    for (int64_t e = 0, r = 0; e < E; e++)
        for (int64_t i = 0; i < count[e]; i++) slot[r++] = (int32_t)e;
    free(count);
    g = twk_graph_new();
    g1 = twk_graph_new();
    if (!g || !g1) goto out;
    int64_t xne[2] = {R, K}, wne[3] = {E, N, K}, sne[1] = {R}, bne[2] = {N, K};
    twk_id xi = twk_input(g, "x", TWK_F32, 2, xne), wi = twk_input(g, "w", TWK_F32, 3, wne);
    twk_id si = twk_input(g, "slot", TWK_I32, 1, sne);
    twk_id yi = twk_lora_gather_grouped(g, xi, wi, si, false);
    twk_id ai = twk_input(g1, "a", TWK_F32, 2, xne), bi = twk_input(g1, "b", TWK_F32, 2, bne);
    twk_id mi = twk_matmul(g1, ai, bi, false, true);
    if (twk_graph_output(g, yi) != TWK_OK || twk_graph_output(g1, mi) != TWK_OK ||
        twk_plan_compile(g, dev, 1, NULL, 0, &p) != TWK_OK || twk_plan_compile(g1, dev, 1, NULL, 0, &p1) != TWK_OK)
        goto out;
    if (twk_plan_write(p, xi, 1, x, (size_t)(R * K) * 4) != TWK_OK ||
        twk_plan_write(p, wi, 1, w, (size_t)(E * N * K) * 4) != TWK_OK ||
        twk_plan_write(p, si, 1, slot, (size_t)R * 4) != TWK_OK || twk_plan_write(p1, ai, 1, x, (size_t)(R * K) * 4) != TWK_OK ||
        twk_plan_write(p1, bi, 1, w, (size_t)(N * K) * 4) != TWK_OK)
        goto out;
    double tg = time_plan(p, 1, reps), tm = time_plan(p1, 1, reps);
    if (tg < 0 || tm < 0 || twk_plan_read(p, yi, 1, y, (size_t)(R * N) * 4) != TWK_OK) goto out;
    double worst = 0, ref_max = 0;
    for (int i = 0; i < 256; i++) {
        int64_t r = (int64_t)twk_rng_below(&rng, (uint64_t)R), n = (int64_t)twk_rng_below(&rng, (uint64_t)N);
        double acc = 0;
        for (int64_t k = 0; k < K; k++) acc += (double)w[(slot[r] * N + n) * K + k] * x[r * K + k];
        double d = fabs(acc - y[r * N + n]);
        worst = d > worst ? d : worst;
        ref_max = fabs(acc) > ref_max ? fabs(acc) : ref_max;
    }
    double flops = 2.0 * (double)R * (double)N * (double)K;
    int right = worst <= 1e-4 * ref_max;
    printf("%-28s R %5lld  E %3lld  N %5lld  K %5lld   grouped %7.2f ms %6.1f GFLOP/s   one GEMM %7.2f ms %6.1f GFLOP/s   "
           "grouped/GEMM %.2f   max|diff| %.2g of %.3g %s\n",
           what, (long long)R, (long long)E, (long long)N, (long long)K, tg * 1e3, flops / tg * 1e-9, tm * 1e3,
           flops / tm * 1e-9, tm / tg, worst, ref_max, right ? "ok" : "MISMATCH");
    printf("SUMMARY bench_moe_gemm case=%s grouped_gflops=%.2f gemm_gflops=%.2f ratio=%.3f\n", what, flops / tg * 1e-9,
           flops / tm * 1e-9, tm / tg);
    ok = right;
    checked = 1;
out:
    if (!ok && !checked) fprintf(stderr, "bench_moe_step: %s: %s\n", what, twk_last_error());
    twk_plan_free(p);
    twk_plan_free(p1);
    twk_graph_free(g);
    twk_graph_free(g1);
    free(x);
    free(w);
    free(y);
    free(slot);
    return ok;
}

int main(int argc, char **argv) {
    moe_shape sh = {4, 1024, 4, 16, 3, 8192, 1024, 16, 2, 16, 4, 384};
    const char *peer = getenv("TWK_PEER_PYTHON");
    int do_step = 1, do_gemm = 1;
    struct {
        const char *flag;
        long *v, lo, hi;
    } opts[] = {{"--layers", &sh.layers, 1, 256},     {"--tokens", &sh.tokens, 1, 1 << 20}, {"--seqs", &sh.seqs, 1, 1 << 20},
                {"--rank", &sh.rank, 1, 4096},        {"--steps", &sh.steps, 1, 1000},      {"--vocab", &sh.vocab, 2, 1 << 22},
                {"--hidden", &sh.hidden, 128, 65536}, {"--heads", &sh.heads, 1, 512},       {"--kv-heads", &sh.kv_heads, 1, 512},
                {"--experts", &sh.experts, 2, 4096},  {"--top-k", &sh.top_k, 1, 64},        {"--moe-ffn", &sh.moe_ffn, 1, 65536}};
    for (int i = 1; i < argc; i++) {
        int known = 0;
        for (size_t o = 0; o < sizeof opts / sizeof opts[0] && !known; o++)
            if (!strcmp(argv[i], opts[o].flag) && i + 1 < argc) {
                if (!bench_parse_long("bench_moe_step", argv[++i], opts[o].flag, opts[o].lo, opts[o].hi, opts[o].v)) return 2;
                known = 1;
            }
        if (known) continue;
        if (!strcmp(argv[i], "--peer") && i + 1 < argc) peer = argv[++i];
        else if (!strcmp(argv[i], "--gemm-only")) do_step = 0;
        else if (!strcmp(argv[i], "--step-only")) do_gemm = 0;
        else {
            fprintf(stderr, "usage: bench_moe_step [--layers 4] [--tokens 1024] [--seqs 4] [--rank 16] [--steps 3] [--vocab 8192]\n"
                            "                      [--hidden 1024] [--heads 16] [--kv-heads 2] [--experts 16] [--top-k 4]\n"
                            "                      [--moe-ffn 384] [--peer PYTHON] [--gemm-only | --step-only]\n"
                            "  --peer (or TWK_PEER_PYTHON): a python with torch, transformers and peft; runs\n"
                            "  bench/peer/moe_step.py with the same shapes and thread count and prints the ratio.\n");
            return 2;
        }
    }
    if (sh.tokens % sh.seqs || sh.top_k > sh.experts || sh.heads % sh.kv_heads) {
        fprintf(stderr, "bench_moe_step: bad sizes (tokens a multiple of seqs, top-k <= experts, heads a multiple of kv-heads)\n");
        return 2;
    }
    twk_device *dev = NULL;
    twk_device_props props;
    if (twk_device_open("cpu", &dev) != TWK_OK || twk_device_backend(dev)->device_props(0, &props) != TWK_OK) {
        fprintf(stderr, "bench_moe_step: %s\n", twk_last_error());
        return 1;
    }
    int threads = props.max_threads, rc = 0;
    printf("model: Qwen3-MoE shape, %ld layers, hidden %ld, %ld heads / %ld kv, head_dim 128, %ld experts of %ld, top-%ld, "
           "vocab %ld (untied); LoRA rank %ld on q,k,v,o; %ld tokens in %ld sequences; %d threads\n",
           sh.layers, sh.hidden, sh.heads, sh.kv_heads, sh.experts, sh.moe_ffn, sh.top_k, sh.vocab, sh.rank, sh.tokens,
           sh.seqs, threads);
    if (do_step) {
        double best = 0, warm = 0, lora = 0;
        float loss = 0;
        if (!run_step(dev, &sh, &best, &warm, &loss, &lora)) {
            twk_device_close(dev);
            return 1;
        }
        double tps = sh.tokens / best, rss = peak_rss_mib();
        printf("twinkle  %8.1f tokens/s  (best step %.3f s of %ld, first %.3f s)  peak RSS %.0f MiB  loss %.3f  "
               "%.2fM LoRA parameters\n", tps, best, sh.steps, warm, rss, (double)loss, lora * 1e-6);
        double ptps = 0, prss = 0;
        if (!peer) {
            printf("peer     skipped (set TWK_PEER_PYTHON or --peer to a python with torch, transformers, peft)\n");
        } else if (run_peer(peer, &sh, threads, &ptps, &prss)) {
            printf("ratio twinkle/pytorch: %.2f tokens/s (aim >= 1.5), peak memory %.2f (%.0f vs %.0f MiB)\n", tps / ptps,
                   rss / prss, rss, prss);
        } else {
            rc = 1;
        }
        printf("SUMMARY bench_moe_step tokens_per_s=%.2f peer_tokens_per_s=%.2f peak_rss_mib=%.0f peer_peak_rss_mib=%.0f\n",
               tps, ptps, rss, prss);
    }
    if (do_gemm) {
        int64_t R = sh.tokens * sh.top_k;
        printf("experts' grouped product (lora_gather over rows grouped by expert) vs one GEMM of the same FLOPs, "
               "%ld tokens x top-%ld = %lld rows routed uniformly:\n", sh.tokens, sh.top_k, (long long)R);
        if (!grouped_case(dev, "gate / up [E, moe_ffn, hidden]", R, sh.experts, sh.moe_ffn, sh.hidden, 5) ||
            !grouped_case(dev, "down [E, hidden, moe_ffn]", R, sh.experts, sh.hidden, sh.moe_ffn, 5))
            rc = 1;
    }
    twk_device_close(dev);
    return rc;
}
