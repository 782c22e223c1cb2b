/* The sampler (KV-cache decoding): greedy decoding equals transformers'
 * generate token for token on the parity models, base and with the PEFT
 * adapter, with per-token logprobs within 1e-4; sampled tokens' logprobs
 * equal the training forward's for the same tokens; seeded sampling repeats;
 * at temperature 1 the empirical frequencies of the first token match the
 * softmax (chi-square at significance 0.001); top_k / top_p never emit
 * outside their set; bad parameters are refused by name.
 *
 * TWK_TEST_DEVICE=spec runs everything on that device; on a device other
 * than the CPU the greedy tokens are also compared with the CPU's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cJSON.h>

#include "../train/safetensors.h"
#include "twinkle/twinkle.h"

#define LP_TOL 1e-4

static int fails;

static void check(int ok, const char *model, const char *what, double err, double tol) {
    printf("%s %-7s %-52s", ok ? "ok  " : "FAIL", model, what);
    if (tol > 0) printf(" err %.2e (tol %.0e)", err, tol);
    printf("\n");
    fails += !ok;
}

/* The device under test: TWK_TEST_DEVICE, "cpu" by default. */
static const char *test_device(void) {
    const char *d = getenv("TWK_TEST_DEVICE");
    return d && *d ? d : "cpu";
}

/* Opens the device under test; 0 (a failed check naming the device) if it cannot. */
static int open_device(twk_device **dev, const char *model) {
    if (twk_device_open(test_device(), dev) == TWK_OK) return 1;
    char what[200];
    snprintf(what, sizeof what, "open device %s: %s", test_device(), twk_last_error());
    check(0, model, what, 0, 0);
    return 0;
}

static twk_sample_params greedy(int n) {
    twk_sample_params p = {.max_tokens = n, .temperature = 0, .top_k = -1, .top_p = 1};
    return p;
}

/* Greedy decoding of each fixture prompt against tokens/logprobs of transformers. */
static void greedy_parity(twk_sampler *s, const twk_safetensors *gen, const char *which, const char *model) {
    char kt[64], kl[64];
    snprintf(kt, sizeof kt, "greedy_%s", which);
    snprintf(kl, sizeof kl, "greedy_%s_logprobs", which);
    const twk_st_tensor *pt = twk_st_find(gen, "prompt_tokens"), *pl = twk_st_find(gen, "prompt_lens");
    const twk_st_tensor *gt = twk_st_find(gen, kt), *gl = twk_st_find(gen, kl);
    if (!pt || !pl || !gt || !gl) {
        check(0, model, "generate.safetensors has the greedy tensors", 0, 0);
        return;
    }
    const int32_t *prompts = (const int32_t *)(const void *)pt->data, *lens = (const int32_t *)(const void *)pl->data;
    const int32_t *ref = (const int32_t *)(const void *)gt->data;
    float *ref_lp = malloc((size_t)gl->nelem * 4);
    twk_st_to_f32(gl, ref_lp);
    int n_new = (int)gt->shape[1], same = 1;
    double err = 0;
    int64_t off = 0;
    for (int k = 0; k < (int)pl->nelem; k++) {
        twk_sample_params p = greedy(n_new);
        twk_sampled_seq q;
        if (twk_sampler_generate(s, prompts + off, lens[k], 1, &p, &q) != TWK_OK) {
            printf("     %s\n", twk_last_error());
            same = 0;
            break;
        }
        for (int i = 0; i < n_new; i++) {
            if (i >= q.n || q.tokens[i] != ref[k * n_new + i]) {
                if (same) printf("     prompt %d: token %d is %d, transformers %d\n", k, i, i < q.n ? q.tokens[i] : -1,
                                 ref[k * n_new + i]);
                same = 0;
                break;
            }
            err = fmax(err, fabs(q.logprobs[i] - ref_lp[k * n_new + i]));
        }
        twk_sampled_seq_free(&q);
        off += lens[k];
    }
    char what[96];
    snprintf(what, sizeof what, "greedy %s: %lld prompts x %d tokens equal generate", which, (long long)pl->nelem, n_new);
    check(same, model, what, 0, 0);
    snprintf(what, sizeof what, "greedy %s: logprobs of the chosen tokens", which);
    check(same && err <= LP_TOL, model, what, err, LP_TOL);
    free(ref_lp);
}

/* On a device other than the CPU: the greedy tokens of the fixture prompts
 * (base and with the PEFT adapter) equal the CPU's, logprobs within LP_TOL. */
static void greedy_vs_cpu(twk_sampler *base, twk_sampler *lora, const char *model_dir, const twk_lora_config *lc,
                          const char *adapter_dir, const twk_safetensors *gen, const char *model) {
    twk_device *cpu = NULL;
    twk_model *m = NULL;
    twk_sampler *cb = NULL, *cl = NULL;
    const twk_st_tensor *pt = twk_st_find(gen, "prompt_tokens"), *pl = twk_st_find(gen, "prompt_lens");
    if (!pt || !pl || twk_device_open("cpu", &cpu) != TWK_OK || twk_model_load(model_dir, cpu, &m) != TWK_OK ||
        twk_sampler_new(m, NULL, 4, 64, &cb) != TWK_OK || twk_sampler_new(m, lc, 4, 64, &cl) != TWK_OK ||
        twk_sampler_load_adapter(cl, adapter_dir) != TWK_OK) {
        check(0, model, "greedy vs cpu: the CPU side", 0, 0);
        goto out;
    }
    const int32_t *prompts = (const int32_t *)(const void *)pt->data, *lens = (const int32_t *)(const void *)pl->data;
    int same = 1, tokens = 0;
    double err = 0;
    for (int which = 0; which < 2; which++) {
        int64_t off = 0;
        for (int k = 0; k < (int)pl->nelem; k++) {
            twk_sample_params p = greedy(16);
            twk_sampled_seq a, b;
            if (twk_sampler_generate(which ? lora : base, prompts + off, lens[k], 1, &p, &a) != TWK_OK) {
                printf("     %s\n", twk_last_error());
                same = 0;
                break;
            }
            if (twk_sampler_generate(which ? cl : cb, prompts + off, lens[k], 1, &p, &b) != TWK_OK) {
                printf("     %s\n", twk_last_error());
                twk_sampled_seq_free(&a);
                same = 0;
                break;
            }
            for (int64_t i = 0; i < a.n || i < b.n; i++) {
                if (i >= a.n || i >= b.n || a.tokens[i] != b.tokens[i]) {
                    if (same) printf("     %s prompt %d: token %lld differs from the CPU's\n", which ? "lora" : "base", k, (long long)i);
                    same = 0;
                    break;
                }
                err = fmax(err, fabs(a.logprobs[i] - b.logprobs[i]));
                tokens++;
            }
            twk_sampled_seq_free(&a);
            twk_sampled_seq_free(&b);
            off += lens[k];
        }
    }
    char what[128];
    snprintf(what, sizeof what, "greedy on %s equals the CPU (%d tokens, base + lora)", test_device(), tokens);
    check(same, model, what, 0, 0);
    check(same && err <= LP_TOL, model, "greedy on the device vs the CPU: logprobs", err, LP_TOL);
out:
    twk_sampler_free(cb);
    twk_sampler_free(cl);
    twk_model_free(m);
    twk_device_close(cpu);
}

/* A sampler with adapter slots: the base model (slot 0) and the PEFT adapter
 * (slot 1) decoded in one batch, against transformers' greedy tokens of each. */
static void slots_parity(twk_model *m, const twk_safetensors *gen, const char *adapter_dir, const char *model) {
    twk_sampler *s = NULL;
    if (twk_sampler_new_slots(m, 3, 8, 8, 64, &s) != TWK_OK || twk_sampler_slot_load_dir(s, 1, adapter_dir) != TWK_OK) {
        check(0, model, twk_last_error(), 0, 0);
        twk_sampler_free(s);
        return;
    }
    const twk_st_tensor *pt = twk_st_find(gen, "prompt_tokens"), *pl = twk_st_find(gen, "prompt_lens");
    const twk_st_tensor *gb = twk_st_find(gen, "greedy_base"), *gl = twk_st_find(gen, "greedy_lora");
    const twk_st_tensor *lb = twk_st_find(gen, "greedy_base_logprobs"), *ll = twk_st_find(gen, "greedy_lora_logprobs");
    const int32_t *prompts = (const int32_t *)(const void *)pt->data, *lens = (const int32_t *)(const void *)pl->data;
    const int32_t *rb = (const int32_t *)(const void *)gb->data, *rl = (const int32_t *)(const void *)gl->data;
    float *rlb = malloc((size_t)lb->nelem * 4), *rll = malloc((size_t)ll->nelem * 4);
    twk_st_to_f32(lb, rlb);
    twk_st_to_f32(ll, rll);
    int n_new = (int)gb->shape[1], same = 1;
    double err = 0;
    int64_t off = 0;
    for (int k = 0; k < (int)pl->nelem; k++) {
        twk_sample_params p = greedy(n_new);
        twk_sampled_seq a, b;
        twk_sample_request reqs[2] = {{prompts + off, lens[k], 1, &p, &a, 0, NULL, NULL}, {prompts + off, lens[k], 1, &p, &b, 1, NULL, NULL}};
        if (twk_sampler_generate_many(s, reqs, 2) != TWK_OK) {
            printf("     %s\n", twk_last_error());
            same = 0;
            break;
        }
        for (int i = 0; i < n_new; i++) {
            same &= a.tokens[i] == rb[k * n_new + i] && b.tokens[i] == rl[k * n_new + i];
            err = fmax(err, fmax(fabs(a.logprobs[i] - rlb[k * n_new + i]), fabs(b.logprobs[i] - rll[k * n_new + i])));
        }
        twk_sampled_seq_free(&a);
        twk_sampled_seq_free(&b);
        off += lens[k];
    }
    check(same, model, "slots: base + adapter in one batch equal generate (both)", 0, 0);
    check(same && err <= LP_TOL, model, "slots: their logprobs", err, LP_TOL);
    free(rlb);
    free(rll);
    twk_sampler_free(s);
}

/* Sampled tokens' logprobs against the training forward on prompt + sample. */
static void sampled_vs_forward(twk_model *m, twk_sampler *s, const char *model) {
    int32_t prompt[5] = {3, 14, 15, 92, 65};
    twk_sample_params p = {.max_tokens = 12, .temperature = 1, .top_k = -1, .top_p = 1, .seed = 42, .has_seed = 1};
    twk_sampled_seq q[3];
    if (twk_sampler_generate(s, prompt, 5, 3, &p, q) != TWK_OK) {
        check(0, model, twk_last_error(), 0, 0);
        return;
    }
    twk_lora_config lc = twk_lora_default();
    lc.rank = 1; /* B = 0: the base model */
    twk_trainer *t = NULL;
    twk_trainer_new(m, &lc, 64, &t);
    double err = 0;
    for (int k = 0; k < 3; k++) {
        int32_t tok[32], tgt[32], pos[32], seg[32];
        float w[32], lp[32];
        int n = 0;
        for (int i = 0; i < 5 + q[k].n - 1; i++, n++) {
            tok[n] = i < 5 ? prompt[i] : q[k].tokens[i - 5];
            tgt[n] = i + 1 < 5 ? prompt[i + 1] : q[k].tokens[i + 1 - 5];
            pos[n] = i;
            seg[n] = 0;
            w[n] = 1;
        }
        twk_batch b = {n, tok, tgt, pos, seg, w};
        twk_trainer_forward(t, &b, lp, NULL);
        for (int i = 0; i < q[k].n; i++) err = fmax(err, fabs(lp[4 + i] - q[k].logprobs[i]));
        twk_sampled_seq_free(&q[k]);
    }
    twk_trainer_free(t);
    check(err <= LP_TOL, model, "sampled logprobs equal the forward's (3 x 12 tokens)", err, LP_TOL);
}

/* prompt_logprobs (base, lora) and top-4 prompt logprobs (lora) against transformers. */
static void prompt_scores(twk_sampler *base, twk_sampler *lora, const twk_safetensors *gen, const char *model) {
    const twk_st_tensor *pt = twk_st_find(gen, "prompt_tokens"), *pl = twk_st_find(gen, "prompt_lens");
    const twk_st_tensor *rb = twk_st_find(gen, "prompt_logprobs_base"), *rl = twk_st_find(gen, "prompt_logprobs_lora");
    const twk_st_tensor *ti = twk_st_find(gen, "topk_prompt_logprobs_lora_ids"), *tl = twk_st_find(gen, "topk_prompt_logprobs_lora_lps");
    if (!pt || !pl || !rb || !rl || !ti || !tl) {
        check(0, model, "generate.safetensors has the prompt-score tensors", 0, 0);
        return;
    }
    const int32_t *prompts = (const int32_t *)(const void *)pt->data, *lens = (const int32_t *)(const void *)pl->data;
    const int32_t *ref_ids = (const int32_t *)(const void *)ti->data;
    int K = (int)ti->shape[1];
    float *ref_b = malloc((size_t)rb->nelem * 4), *ref_l = malloc((size_t)rl->nelem * 4), *ref_t = malloc((size_t)tl->nelem * 4);
    twk_st_to_f32(rb, ref_b);
    twk_st_to_f32(rl, ref_l);
    twk_st_to_f32(tl, ref_t);
    double eb = 0, el = 0, et = 0;
    int nan_ok = 1, ids_ok = 1;
    int64_t off = 0;
    for (int k = 0; k < (int)pl->nelem; k++) {
        int n = lens[k];
        float lb[64], ll[64], tk[64 * 8];
        int32_t tid[64 * 8];
        twk_sampler_score_prompt(base, prompts + off, n, lb, 0, NULL, NULL);
        twk_sampler_score_prompt(lora, prompts + off, n, ll, K, tid, tk);
        nan_ok &= isnan(lb[0]) && isnan(ll[0]);
        for (int i = 1; i < n; i++) {
            eb = fmax(eb, fabs(lb[i] - ref_b[off + i]));
            el = fmax(el, fabs(ll[i] - ref_l[off + i]));
        }
        for (int i = 0; i < n; i++)
            for (int q = 0; q < K; q++) {
                ids_ok &= tid[i * K + q] == ref_ids[(off + i) * K + q];
                et = fmax(et, fabs(tk[i * K + q] - ref_t[(off + i) * K + q]));
            }
        off += n;
    }
    check(nan_ok, model, "prompt_logprobs[0] is NaN", 0, 0);
    check(eb <= LP_TOL, model, "prompt_logprobs (base)", eb, LP_TOL);
    check(el <= LP_TOL, model, "prompt_logprobs (lora)", el, LP_TOL);
    char what[96];
    snprintf(what, sizeof what, "top-%d prompt logprobs (lora): same ids, same order", K);
    check(ids_ok, model, what, 0, 0);
    check(ids_ok && et <= LP_TOL, model, "top-k prompt logprobs (lora): values", et, LP_TOL);
    free(ref_b);
    free(ref_l);
    free(ref_t);
}

static cJSON *read_json(const char *path) {
    char *text = twk_read_file(path, NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    twk_host_free(text);
    return j;
}

static void parity(const char *root, const char *model) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s/generate.safetensors", root, model);
    twk_safetensors *gen = NULL;
    if (twk_st_open(path, &gen) != TWK_OK) {
        check(0, model, "generate.safetensors opens", 0, 0);
        return;
    }
    snprintf(path, sizeof path, "%s/%s/expected.json", root, model);
    cJSON *js = read_json(path);
    const cJSON *lj = cJSON_GetObjectItem(js, "lora");
    twk_lora_config lc = twk_lora_default();
    lc.rank = cJSON_GetObjectItem(lj, "r")->valueint;
    lc.alpha = (float)cJSON_GetObjectItem(lj, "alpha")->valuedouble;
    lc.train_unembed = cJSON_IsTrue(cJSON_GetObjectItem(lj, "lm_head_targeted"));
    snprintf(path, sizeof path, "%s/%s/peft_adapter", root, model); /* the MoE fixtures: the experts, the router */
    if (twk_adapter_read_config(path, &lc) != TWK_OK) check(0, model, twk_last_error(), 0, 0);
    twk_device *dev = NULL;
    twk_model *m = NULL;
    twk_sampler *base = NULL, *lora = NULL;
    if (!open_device(&dev, model)) goto out;
    snprintf(path, sizeof path, "%s/%s/model", root, model);
    if (twk_model_load(path, dev, &m) != TWK_OK) {
        check(0, model, twk_last_error(), 0, 0);
        goto out;
    }
    if (twk_sampler_new(m, NULL, 4, 64, &base) != TWK_OK || twk_sampler_new(m, &lc, 4, 64, &lora) != TWK_OK) {
        check(0, model, twk_last_error(), 0, 0);
        goto out;
    }
    snprintf(path, sizeof path, "%s/%s/peft_adapter", root, model);
    if (twk_sampler_load_adapter(lora, path) != TWK_OK) {
        check(0, model, twk_last_error(), 0, 0);
        goto out;
    }
    greedy_parity(base, gen, "base", model);
    greedy_parity(lora, gen, "lora", model);
    if (strcspn(test_device(), ":") != 3 || strncmp(test_device(), "cpu", 3)) { /* not "cpu" or "cpu:N" */
        char mdir[700];
        snprintf(mdir, sizeof mdir, "%s/%s/model", root, model);
        greedy_vs_cpu(base, lora, mdir, &lc, path, gen, model);
    }
    if (lc.train_experts || lc.train_router) { /* adapter slots hold no expert / router adapters: refused by name */
        twk_sampler *sl = NULL;
        twk_status st = twk_sampler_new_slots(m, 2, 8, 8, 64, &sl);
        if (st == TWK_OK) st = twk_sampler_slot_load_dir(sl, 1, path);
        int named = st == TWK_ERR_UNSUPPORTED && strstr(twk_last_error(), "experts or the router");
        printf("%s %s: adapter slots refuse an expert / router adapter: %s\n", named ? "ok  " : "FAIL", model, twk_last_error());
        fails += !named;
        twk_sampler_free(sl);
    } else {
        slots_parity(m, gen, path, model);
    }
    sampled_vs_forward(m, base, model);
    prompt_scores(base, lora, gen, model);
out:
    twk_sampler_free(base);
    twk_sampler_free(lora);
    twk_model_free(m);
    twk_device_close(dev);
    cJSON_Delete(js);
    twk_st_close(gen);
}

/* Upper critical value of chi-square with df degrees of freedom at
 * significance 0.001 (Wilson-Hilferty; z = 3.0902). */
static double chi2_crit(int df) {
    double z = 3.090232, a = 2.0 / (9.0 * df);
    double c = 1 - a + z * sqrt(a);
    return df * c * c * c;
}

/* prob[v] = the CPU training forward's probability of token v after prompt[0..P): V copies of
 * the prompt, each with another target at the end. The reference of statistics() on every
 * device (the device's logits are compared with the CPU's by the parity checks); 0 on failure. */
static int next_token_probs(const char *path, const int32_t *prompt, int P, float *prob, int V) {
    twk_device *cpu = NULL;
    twk_model *m = NULL;
    twk_trainer *t = NULL;
    twk_lora_config lc = twk_lora_default();
    lc.rank = 1;
    int32_t *tok = malloc((size_t)V * P * 16);
    float *w = malloc((size_t)V * P * 4), *lp = malloc((size_t)V * P * 4);
    int ok = tok && w && lp && twk_device_open("cpu", &cpu) == TWK_OK && twk_model_load(path, cpu, &m) == TWK_OK &&
             twk_model_cfg(m)->vocab == V && twk_trainer_new(m, &lc, (int64_t)V * P, &t) == TWK_OK;
    if (ok) {
        int32_t *tgt = tok + V * P, *pos = tgt + V * P, *seg = pos + V * P;
        for (int v = 0; v < V; v++)
            for (int i = 0; i < P; i++) {
                int k = v * P + i;
                tok[k] = prompt[i];
                tgt[k] = i + 1 < P ? prompt[i + 1] : v;
                pos[k] = i;
                seg[k] = v * P;
                w[k] = 1;
            }
        twk_batch b = {(int64_t)V * P, tok, tgt, pos, seg, w};
        ok = twk_trainer_forward(t, &b, lp, NULL) == TWK_OK;
        for (int v = 0; ok && v < V; v++) prob[v] = expf(lp[v * P + P - 1]);
    }
    if (!ok) check(0, "qwen3", twk_last_error(), 0, 0);
    twk_trainer_free(t);
    twk_model_free(m);
    twk_device_close(cpu);
    free(tok);
    free(w);
    free(lp);
    return ok;
}

/* Distribution of the first sampled token vs the softmax of the next-token
 * logprobs (from the forward over every candidate target). */
static void statistics(const char *root) {
    char path[700];
    snprintf(path, sizeof path, "%s/qwen3/model", root);
    twk_device *dev = NULL;
    twk_model *m = NULL;
    if (!open_device(&dev, "qwen3")) return;
    if (twk_model_load(path, dev, &m) != TWK_OK) {
        check(0, "qwen3", twk_last_error(), 0, 0);
        twk_device_close(dev);
        return;
    }
    int V = twk_model_cfg(m)->vocab, P = 4;
    int32_t prompt[4] = {7, 77, 777, 17};
    float *prob = malloc((size_t)V * sizeof(float));
    if (!prob || !next_token_probs(path, prompt, P, prob, V)) {
        free(prob);
        twk_model_free(m);
        twk_device_close(dev);
        return;
    }
    /* S samples a call: one prefill each (on lavapipe a prefill is ~70 ms; 1,000 calls of 16 took 75 s) */
    enum { S = 200 };
    twk_sampler *s = NULL;
    twk_sampler_new(m, NULL, S, 16, &s);
    /* the choice of tokens is host code (train/sampler.c), the same on every device: a device
     * (whose logits the parity checks above compare with the CPU's) draws 3,200, the CPU 16,000 */
    int N = strcmp(test_device(), "cpu") ? 3200 : 16000;
    long *count = calloc((size_t)V, sizeof(long));
    twk_sample_params p = {.max_tokens = 1, .temperature = 1, .top_k = -1, .top_p = 1, .has_seed = 1};
    static twk_sampled_seq qs[S];
    for (int r = 0; r < N / S; r++) {
        p.seed = 1000 + (uint64_t)r;
        twk_sampler_generate(s, prompt, P, S, &p, qs);
        for (int i = 0; i < S; i++) {
            count[qs[i].tokens[0]]++;
            twk_sampled_seq_free(&qs[i]);
        }
    }
    /* categories with an expected count >= 5; the rest pooled */
    double chi = 0, pool_e = 0, pool_o = 0;
    int df = 0;
    for (int v = 0; v < V; v++) {
        double e = N * (double)prob[v];
        if (e >= 5) {
            chi += (count[v] - e) * (count[v] - e) / e;
            df++;
        } else {
            pool_e += e;
            pool_o += (double)count[v];
        }
    }
    if (pool_e > 0) {
        chi += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        df++;
    }
    df -= 1;
    char what[128];
    snprintf(what, sizeof what, "T=1: %d samples, chi2 %.1f vs %.1f (df %d, p=0.001)", N, chi, chi2_crit(df), df);
    check(chi < chi2_crit(df), "qwen3", what, 0, 0);

    /* top_k and top_p sets */
    int order[4096];
    for (int v = 0; v < V; v++) order[v] = v;
    for (int i = 0; i < V; i++) /* selection sort of the few top entries is enough; full sort for simplicity */
        for (int j = i + 1; j < V; j++)
            if (prob[order[j]] > prob[order[i]]) {
                int x = order[i];
                order[i] = order[j];
                order[j] = x;
            }
    int outside_k = 0, outside_p = 0, K = 5;
    double top_p = 0.5, acc = 0;
    int nucleus = 0;
    while (nucleus < V && acc < top_p) acc += prob[order[nucleus++]];
    for (int r = 0; r < 1600 / S; r++) {
        twk_sample_params pk = {.max_tokens = 1, .temperature = 1.5f, .top_k = K, .top_p = 1, .seed = (uint64_t)r, .has_seed = 1};
        twk_sampler_generate(s, prompt, P, S, &pk, qs);
        for (int i = 0; i < S; i++) {
            int in = 0;
            for (int k = 0; k < K; k++) in |= order[k] == qs[i].tokens[0];
            outside_k += !in;
            twk_sampled_seq_free(&qs[i]);
        }
        twk_sample_params pp = {.max_tokens = 1, .temperature = 1, .top_k = -1, .top_p = (float)top_p, .seed = (uint64_t)r,
                                .has_seed = 1};
        twk_sampler_generate(s, prompt, P, S, &pp, qs);
        for (int i = 0; i < S; i++) {
            int in = 0;
            for (int k = 0; k < nucleus; k++) in |= order[k] == qs[i].tokens[0];
            outside_p += !in;
            twk_sampled_seq_free(&qs[i]);
        }
    }
    snprintf(what, sizeof what, "top_k=%d: 1600 samples, %d outside the top %d", K, outside_k, K);
    check(outside_k == 0, "qwen3", what, 0, 0);
    snprintf(what, sizeof what, "top_p=%.1f: 1600 samples, %d outside the %d-token nucleus", top_p, outside_p, nucleus);
    check(outside_p == 0, "qwen3", what, 0, 0);

    /* seeds */
    twk_sampled_seq a[2], c2[2], d[2];
    twk_sample_params ps = {.max_tokens = 6, .temperature = 1, .top_k = -1, .top_p = 1, .seed = 5, .has_seed = 1};
    twk_sampler_generate(s, prompt, P, 2, &ps, a);
    twk_sampler_generate(s, prompt, P, 2, &ps, c2);
    ps.seed = 6;
    twk_sampler_generate(s, prompt, P, 2, &ps, d);
    int same = a[0].n == c2[0].n && !memcmp(a[0].tokens, c2[0].tokens, (size_t)a[0].n * 4) &&
               !memcmp(a[1].tokens, c2[1].tokens, (size_t)a[1].n * 4);
    int differ = memcmp(a[0].tokens, d[0].tokens, (size_t)a[0].n * 4) || memcmp(a[1].tokens, d[1].tokens, (size_t)a[1].n * 4);
    check(same, "qwen3", "the same seed repeats exactly", 0, 0);
    check(differ, "qwen3", "another seed gives other tokens", 0, 0);
    for (int i = 0; i < 2; i++) {
        twk_sampled_seq_free(&a[i]);
        twk_sampled_seq_free(&c2[i]);
        twk_sampled_seq_free(&d[i]);
    }
    /* stop tokens: the stop token is included and ends the sequence */
    twk_sampled_seq g;
    twk_sample_params pg = greedy(6);
    twk_sampler_generate(s, prompt, P, 1, &pg, &g);
    int32_t stop = g.tokens[2];
    twk_sampled_seq_free(&g);
    pg.stop_tokens = &stop;
    pg.n_stop_tokens = 1;
    twk_sampler_generate(s, prompt, P, 1, &pg, &g);
    int first = 0;
    while (first < g.n && g.tokens[first] != stop) first++;
    check(g.n == first + 1 && g.stop_reason == 0, "qwen3", "a stop token ends the sequence and is included", 0, 0);
    twk_sampled_seq_free(&g);

    /* several requests in one decode batch equal separate calls */
    {
        int32_t pa[3] = {11, 12, 13}, pb[6] = {400, 401, 402, 403, 404, 405};
        twk_sample_params qa = {.max_tokens = 7, .temperature = 0.9f, .top_k = 50, .top_p = 0.95f, .seed = 77, .has_seed = 1};
        twk_sample_params qb = {.max_tokens = 5, .temperature = 0, .top_k = -1, .top_p = 1};
        twk_sampled_seq ma[3], mb[2], sa[3], sb[2];
        twk_sample_request reqs[2] = {{pa, 3, 3, &qa, ma, 0, NULL, NULL}, {pb, 6, 2, &qb, mb, 0, NULL, NULL}};
        twk_status st1 = twk_sampler_generate_many(s, reqs, 2);
        twk_status st2 = twk_sampler_generate(s, pa, 3, 3, &qa, sa);
        twk_status st3 = twk_sampler_generate(s, pb, 6, 2, &qb, sb);
        int alike = st1 == TWK_OK && st2 == TWK_OK && st3 == TWK_OK;
        double err = 0;
        for (int i = 0; alike && i < 3; i++) {
            alike &= ma[i].n == sa[i].n && !memcmp(ma[i].tokens, sa[i].tokens, (size_t)sa[i].n * 4);
            for (int k = 0; alike && k < sa[i].n; k++) err = fmax(err, fabs(ma[i].logprobs[k] - sa[i].logprobs[k]));
        }
        for (int i = 0; alike && i < 2; i++) {
            alike &= mb[i].n == sb[i].n && !memcmp(mb[i].tokens, sb[i].tokens, (size_t)sb[i].n * 4);
            for (int k = 0; alike && k < sb[i].n; k++) err = fmax(err, fabs(mb[i].logprobs[k] - sb[i].logprobs[k]));
        }
        check(alike, "qwen3", "2 requests (3 + 2 samples) in one batch: the same tokens as alone", 0, 0);
        check(alike && err <= 1e-5, "qwen3", "... and the same logprobs", err, 1e-5);
        for (int i = 0; i < 3; i++) {
            twk_sampled_seq_free(&ma[i]);
            twk_sampled_seq_free(&sa[i]);
        }
        for (int i = 0; i < 2; i++) {
            twk_sampled_seq_free(&mb[i]);
            twk_sampled_seq_free(&sb[i]);
        }
    }

    /* bad parameters */
    struct { twk_sample_params p; int32_t tok; const char *needle; } bad[] = {
        {{.max_tokens = 1, .temperature = 1, .top_p = 1}, 5000, "vocabulary"},
        {{.max_tokens = 15, .temperature = 1, .top_p = 1}, 1, "max_tokens"},
        {{.max_tokens = 1, .temperature = -1, .top_p = 1}, 1, "temperature"},
        {{.max_tokens = 1, .temperature = 1, .top_p = 0}, 1, "top_p"},
        {{.max_tokens = 1, .temperature = 1, .top_p = 1.5f}, 1, "top_p"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        twk_sampled_seq q;
        int32_t pr[2] = {1, bad[i].tok};
        twk_status st = twk_sampler_generate(s, pr, 2, 1, &bad[i].p, &q);
        snprintf(what, sizeof what, "refused: %s", twk_last_error());
        check(st != TWK_OK && strstr(twk_last_error(), bad[i].needle), "qwen3", what, 0, 0);
    }
    free(count);
    free(prob);
    twk_sampler_free(s);
    twk_model_free(m);
    twk_device_close(dev);
}

/* Stop strings with a byte-level tokenizer: the sequence ends with the token
 * that completes the string's first occurrence in the generated text. */
static void stop_strings(void) {
    twk_device *dev = NULL;
    open_device(&dev, "random");
    twk_model_config c = {.arch = TWK_ARCH_QWEN3, .vocab = 512, .hidden = 64, .layers = 2, .heads = 4, .kv_heads = 2,
                          .head_dim = 16, .ffn = 128, .rope_theta = 10000, .rms_eps = 1e-6, .tie_embeddings = 1,
                          .qk_norm = 1, .max_positions = 256};
    twk_model *m = NULL;
    twk_sampler *s = NULL;
    twk_tokenizer *tk = NULL;
    char path[600];
    snprintf(path, sizeof path, "%s/bytelevel/tokenizer.json", TWK_TOKENIZER_DIR);
    if (!dev || twk_model_random(&c, dev, 3, &m) != TWK_OK || twk_sampler_new(m, NULL, 2, 64, &s) != TWK_OK ||
        twk_tokenizer_load(path, &tk) != TWK_OK) {
        check(0, "random", twk_last_error(), 0, 0);
        goto out;
    }
    int32_t prompt[3] = {40, 41, 42};
    twk_sample_params p = greedy(16);
    twk_sampled_seq g;
    twk_sampler_generate(s, prompt, 3, 1, &p, &g);
    char text[4096], piece[512];
    int len = 0, ends[16] = {0};
    for (int i = 0; i < g.n; i++) {
        int n = twk_tokenizer_token_bytes(tk, g.tokens[i], piece, (int)sizeof piece);
        if (n > 0) {
            memcpy(text + len, piece, (size_t)n);
            len += n;
        }
        ends[i] = len;
    }
    /* the stop string: the text of tokens 5 and 6 (or what exists) */
    int a = ends[4], b = ends[6];
    char stop[512];
    memcpy(stop, text + a, (size_t)(b - a));
    stop[b - a] = 0;
    int expect = -1;
    for (int i = 0; i < g.n && expect < 0; i++)
        for (int k = 0; k + (b - a) <= ends[i]; k++)
            if (b > a && !memcmp(text + k, stop, (size_t)(b - a))) {
                expect = i;
                break;
            }
    twk_sampled_seq_free(&g);
    const char *stops[1] = {stop};
    p.stop_strings = stops;
    p.n_stop_strings = 1;
    p.tokenizer = tk;
    twk_sampler_generate(s, prompt, 3, 1, &p, &g);
    char what[160];
    snprintf(what, sizeof what, "a stop string ends the sequence with the token completing it (%d tokens)", expect + 1);
    check(expect >= 0 && g.n == expect + 1 && g.stop_reason == 0, "random", what, 0, 0);
    twk_sampled_seq_free(&g);
    p.tokenizer = NULL;
    twk_status st = twk_sampler_generate(s, prompt, 3, 1, &p, &g);
    check(st != TWK_OK && strstr(twk_last_error(), "tokenizer"), "random", "stop strings without a tokenizer are refused", 0, 0);
out:
    twk_tokenizer_free(tk);
    twk_sampler_free(s);
    twk_model_free(m);
    twk_device_close(dev);
}

/* EOS ids come from config.json and generation_config.json together. */
static void eos_ids(const char *root) {
    char dir[] = "/tmp/twk_eos_XXXXXX", src[700], dst[700];
    if (!mkdtemp(dir)) return;
    snprintf(src, sizeof src, "%s/qwen3/model/config.json", root);
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    size_t n = 0;
    char *cfg = twk_read_file(src, &n);
    FILE *f = fopen(dst, "wb");
    if (f && cfg) fwrite(cfg, 1, n, f);
    if (f) fclose(f);
    twk_host_free(cfg);
    snprintf(src, sizeof src, "%s/qwen3/model/model.safetensors", root);
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    int linked = symlink(src, dst) == 0;
    snprintf(dst, sizeof dst, "%s/generation_config.json", dir);
    f = fopen(dst, "wb");
    if (f) {
        fputs("{\"eos_token_id\": [5, 7], \"bos_token_id\": 1}", f);
        fclose(f);
    }
    twk_device *dev = NULL;
    twk_model *m = NULL;
    open_device(&dev, "qwen3");
    twk_status st = linked && dev ? twk_model_load(dir, dev, &m) : TWK_ERR_IO;
    int has5 = 0, has7 = 0, n_eos = st == TWK_OK ? twk_model_cfg(m)->n_eos : 0;
    for (int i = 0; i < n_eos; i++) {
        has5 |= twk_model_cfg(m)->eos[i] == 5;
        has7 |= twk_model_cfg(m)->eos[i] == 7;
    }
    check(st == TWK_OK && has5 && has7, "qwen3", "EOS ids of generation_config.json join config.json's", 0, 0);
    twk_model_free(m);
    twk_device_close(dev);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fails++;
}

/* Sliding-window layers keep a ring of `sliding_window` rows per sequence: the cache's bytes are
 * those config.json implies (its layer_types, else every layer windowed), and several samples
 * of a prompt longer than the window (their rings copied from the prefill's) decode as one does
 * (20 tokens: the rings wrap several times; greedy_parity's prompts of 6 and 11 tokens check the
 * ring's tokens against transformers). */
static void window_rings(const char *root, const char *model) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s/model/config.json", root, model);
    cJSON *js = read_json(path);
    int W = cJSON_GetObjectItem(js, "sliding_window")->valueint, L = cJSON_GetObjectItem(js, "num_hidden_layers")->valueint;
    size_t row = (size_t)cJSON_GetObjectItem(js, "num_key_value_heads")->valueint *
                 (size_t)cJSON_GetObjectItem(js, "head_dim")->valueint * sizeof(float);
    const cJSON *types = cJSON_GetObjectItem(js, "layer_types");
    int seqs = 3;
    int64_t len = 64;
    size_t want = 0, full = 2 * (size_t)L * (size_t)seqs * (size_t)len * row;
    for (int l = 0; l < L; l++) {
        const cJSON *ty = types ? cJSON_GetArrayItem(types, l) : NULL;
        int local = !types || !strcmp(ty->valuestring, "sliding_attention");
        want += 2 * (local ? (size_t)seqs * (size_t)W + 1 : (size_t)seqs * (size_t)len) * row;
    }
    cJSON_Delete(js);
    twk_device *dev = NULL;
    twk_model *m = NULL;
    twk_sampler *s = NULL;
    size_t p0[TWK_DPOOL_COUNT], p1[TWK_DPOOL_COUNT];
    if (!open_device(&dev, model)) return;
    snprintf(path, sizeof path, "%s/%s/model", root, model);
    twk_device_pool_snapshot(dev, p0);
    if (twk_model_load(path, dev, &m) != TWK_OK || twk_sampler_new(m, NULL, seqs, len, &s) != TWK_OK) {
        check(0, model, twk_last_error(), 0, 0);
        goto out;
    }
    twk_device_pool_snapshot(dev, p1);
    char what[200];
    snprintf(what, sizeof what, "window %d: KV cache %zu bytes (unbounded: %zu)", W, p1[TWK_DPOOL_KV_CACHE] - p0[TWK_DPOOL_KV_CACHE], full);
    check(p1[TWK_DPOOL_KV_CACHE] - p0[TWK_DPOOL_KV_CACHE] == want, model, what, 0, 0);
    int32_t prompt[11];
    for (int i = 0; i < 11; i++) prompt[i] = (int32_t)(7 + 37 * i) % 1000;
    twk_sample_params p = greedy(20);
    twk_sampled_seq one = {0}, three[3] = {{0}};
    int same = twk_sampler_generate(s, prompt, 11, 1, &p, &one) == TWK_OK &&
               twk_sampler_generate(s, prompt, 11, 3, &p, three) == TWK_OK;
    double err = 0;
    for (int k = 0; same && k < 3; k++) {
        same = three[k].n == one.n && !memcmp(three[k].tokens, one.tokens, (size_t)one.n * sizeof *one.tokens);
        for (int i = 0; same && i < one.n; i++) err = fmax(err, fabs((double)three[k].logprobs[i] - one.logprobs[i]));
    }
    /* a decode batch of 3 rows vs 1 changes the GEMM blocking: float reordering only */
    snprintf(what, sizeof what, "3 samples of an 11-token prompt (window %d) decode as 1", W);
    check(same && err <= 1e-5, model, what, err, 1e-5);
    twk_sampled_seq_free(&one);
    for (int k = 0; k < 3; k++) twk_sampled_seq_free(&three[k]);
out:
    twk_sampler_free(s);
    twk_model_free(m);
    twk_device_close(dev);
}

int main(int argc, char **argv) {
    const char *root = argc > 1 ? argv[1] : TWK_PARITY_DIR;
    const char *models[] = {"llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "qwen3_moe", "mixtral", "qwen2_moe"};
    for (int i = 0; i < 9; i++) parity(root, models[i]);
    for (int i = 3; i < 6; i++) window_rings(root, models[i]);
    statistics(root);
    stop_strings();
    eos_ids(root);
    printf("%d failures\n", fails);
    return fails ? 1 : 0;
}
