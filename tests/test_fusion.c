/* Elementwise fusion (graph/fuse.c): a LoRA transformer block's training plan (Llama-style,
 * Gemma-style: gelu(gate) * up and a tanh soft-cap, and Qwen3's: q / k norm + rope pairs, forward
 * and backward, one launch each where the device has the kernels) and a long elementwise chain, each compiled
 * with fusion on and off on the CPU. The fused plan must have fewer launches, a valid memory
 * plan with a peak no larger than the unfused one, and outputs and gradients bit-identical
 * (memcmp) to the unfused plan's at two token counts. Intermediates inside a fused launch are
 * not readable (a clear error), and TWK_FUSION=0 turns fusion off. Chains of adds and muls over
 * 6, 7 and 8 sources fuse where the backend's fused kernel binds that many sources and stay
 * unfused (the device refuses the group) where it does not. The blocks' plans from 1 to 512
 * tokens, and a one-layer Qwen3 LoRA trainer's step at 1, 16 and 32 tokens (on the CPU), have
 * fewer launches fused than unfused at no more arena. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "twinkle/twinkle.h"
#include "twk_backend.h" /* the device's kernel table: whether it runs fused launches */

#define CAP 24

typedef struct built {
    twk_graph *g;
    int n_in;
    twk_id in[64];    /* every input and parameter, written with seeded data */
    int n_out;
    twk_id out[32];   /* the loss and the gradients (compared) */
    twk_id inner;     /* an intermediate the fusion pass takes (-1 none) */
    twk_id norm_rope[2]; /* q's per-head norm and its rotation (qk-norm blocks; -1 none) */
    int kind;            /* a block's: LLAMA, GEMMA, QWEN3 */
    int wide;         /* a wide chain's sources (0: not one) */
} built;

static uint64_t rng_state;
static float rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static twk_id add_in(built *b, twk_id id) {
    if (id >= 0 && b->n_in < 64) b->in[b->n_in++] = id;
    return id;
}

/* x W^T (+ scale * x A^T B^T): a frozen weight with a trainable LoRA pair. */
static twk_id linear(built *b, twk_id x, int64_t in, int64_t out, const char *name) {
    twk_graph *g = b->g;
    char nm[64];
    int64_t ws[2] = {out, in}, as[2] = {8, in}, bs[2] = {out, 8};
    snprintf(nm, sizeof nm, "%s.w", name);
    twk_id w = add_in(b, twk_param(g, nm, 2, ws, false));
    snprintf(nm, sizeof nm, "%s.a", name);
    twk_id a = add_in(b, twk_param(g, nm, 2, as, true));
    snprintf(nm, sizeof nm, "%s.b", name);
    twk_id bb = add_in(b, twk_param(g, nm, 2, bs, true));
    twk_id y = twk_matmul(g, x, w, false, true); /* built in train/model.c's order */
    twk_id low = twk_matmul(g, twk_matmul(g, x, a, false, true), bb, false, true);
    return twk_add(g, y, twk_scale(g, low, 2.0f));
}

enum { LLAMA, GEMMA, QWEN3, NOT_A_BLOCK };

/* One decoder layer and a head, D = 64, 4 query heads and 2 kv heads of 16, ffn 128: Llama's,
 * Gemma-style (gelu(gate) * up, a tanh soft-cap) or Qwen3's (a per-head RMSNorm of q and k, its
 * weights frozen, before the rotation). */
static built block(int kind) {
    built b = {.g = twk_graph_new(), .inner = -1, .norm_rope = {-1, -1}, .kind = kind};
    int gemma = kind == GEMMA;
    twk_graph *g = b.g;
    const int64_t D = 64, H = 4, KV = 2, HD = 16, F = 128;
    int64_t xs[2] = {TWK_T, D}, ts[1] = {TWK_T}, ds[1] = {D};
    twk_id x = add_in(&b, twk_input(g, "x", TWK_F32, 2, xs));
    twk_id pos = add_in(&b, twk_input(g, "pos", TWK_I32, 1, ts));
    twk_id seg = add_in(&b, twk_input(g, "seg", TWK_I32, 1, ts));
    twk_id r = add_in(&b, twk_input(g, "r", TWK_F32, 2, xs));
    twk_id n1 = add_in(&b, twk_param(g, "ln1", 1, ds, false)), n2 = add_in(&b, twk_param(g, "ln2", 1, ds, false));
    twk_id h = twk_rmsnorm(g, x, n1, 1e-6f);
    int64_t q3[3] = {TWK_T, H, HD}, k3[3] = {TWK_T, KV, HD};
    twk_id q = twk_reshape(g, linear(&b, h, D, H * HD, "q"), 3, q3);
    twk_id k = twk_reshape(g, linear(&b, h, D, KV * HD, "k"), 3, k3);
    if (kind == QWEN3) { /* both norms, then both rotations, as train/model.c builds them */
        int64_t hs[1] = {HD};
        q = twk_rmsnorm(g, q, add_in(&b, twk_param(g, "q_norm", 1, hs, false)), 1e-6f);
        k = twk_rmsnorm(g, k, add_in(&b, twk_param(g, "k_norm", 1, hs, false)), 1e-6f);
        b.norm_rope[0] = q;
    }
    q = twk_rope(g, q, pos, -1, 10000.0f);
    k = twk_rope(g, k, pos, -1, 10000.0f);
    if (kind == QWEN3) b.norm_rope[1] = q;
    twk_id v = twk_reshape(g, linear(&b, h, D, KV * HD, "v"), 3, k3);
    twk_id a = twk_attention(g, q, k, v, seg, 0.25f);
    int64_t a2[2] = {TWK_T, H * HD};
    x = twk_add(g, x, linear(&b, twk_reshape(g, a, 2, a2), H * HD, D, "o"));
    h = twk_rmsnorm(g, x, n2, 1e-6f);
    twk_id gate = linear(&b, h, D, F, "gate"), up = linear(&b, h, D, F, "up");
    twk_id ff = gemma ? twk_mul(g, twk_map(g, TWK_OP_GELU, gate), up) : twk_swiglu(g, gate, up);
    x = twk_add(g, x, linear(&b, ff, F, D, "down"));
    if (gemma) x = twk_scale(g, twk_map(g, TWK_OP_TANH, twk_scale(g, x, 1.0f / 30.0f)), 30.0f); /* soft-cap */
    twk_id loss = twk_weighted_sum(g, x, r);
    twk_graph_output(g, loss);
    twk_graph_backward(g, loss);
    b.out[b.n_out++] = loss;
    for (int i = 0; i < b.n_in; i++) {
        twk_id gr = twk_graph_grad(g, b.in[i]);
        if (gr >= 0) {
            twk_graph_output(g, gr);
            b.out[b.n_out++] = gr;
        }
    }
    return b;
}

/* scale, mul, silu, add, gelu, tanh and their gradients: one long chain each way. */
static built chain(void) {
    built b = {.g = twk_graph_new(), .norm_rope = {-1, -1}, .kind = NOT_A_BLOCK};
    twk_graph *g = b.g;
    int64_t s[2] = {TWK_TOK(3), 37};
    twk_id x = add_in(&b, twk_param(g, "x", 2, s, true));
    twk_id y = add_in(&b, twk_input(g, "y", TWK_F32, 2, s));
    twk_id z = add_in(&b, twk_input(g, "z", TWK_F32, 2, s));
    twk_id r = add_in(&b, twk_input(g, "r", TWK_F32, 2, s));
    twk_id t = twk_scale(g, x, 0.7f);
    b.inner = t;
    t = twk_silu(g, twk_mul(g, t, y));
    t = twk_map(g, TWK_OP_TANH, twk_map(g, TWK_OP_GELU, twk_add(g, t, z)));
    t = twk_swiglu(g, t, y);
    twk_id loss = twk_weighted_sum(g, t, r);
    twk_graph_output(g, loss);
    twk_graph_backward(g, loss);
    b.out[b.n_out++] = loss;
    b.out[b.n_out++] = twk_graph_grad(g, x);
    twk_graph_output(g, b.out[1]);
    return b;
}

/* x0 * x1 + x2 * ... (k - 1 steps): one fusable group reading k sources, forward only. */
static built wide_chain(int k) {
    built b = {.g = twk_graph_new(), .inner = -1, .norm_rope = {-1, -1}, .kind = NOT_A_BLOCK, .wide = k};
    twk_graph *g = b.g;
    int64_t s[2] = {TWK_T, 19};
    twk_id t = add_in(&b, twk_input(g, "x0", TWK_F32, 2, s));
    for (int i = 1; i < k; i++) {
        char nm[8];
        snprintf(nm, sizeof nm, "x%d", i);
        twk_id x = add_in(&b, twk_input(g, nm, TWK_F32, 2, s));
        t = i % 2 ? twk_mul(g, t, x) : twk_add(g, t, x);
    }
    twk_graph_output(g, t);
    b.out[b.n_out++] = t;
    return b;
}

/* The sources a backend's fused kernel reads (its README): the CPU any (TWK_MAX_SRC), Vulkan's
 * fused.comp 7 (bindings 1..7), OpenCL / CUDA's fused_ew_f32 6. */
static int fused_max_src(const char *backend) {
    if (!strcmp(backend, "cpu")) return TWK_MAX_SRC;
    return !strcmp(backend, "vulkan") ? 7 : 6;
}

static size_t bytes_of(const twk_graph *g, twk_id id, int64_t n) {
    int64_t ne[8];
    int ndim = twk_node_shape(g, id, n, ne);
    size_t e = 1;
    for (int i = 0; i < ndim; i++) e *= (size_t)ne[i];
    return e * 4;
}

/* Compiles b's graph with fusion on or off, writes seeded inputs, runs n tokens and reads every
 * output into out (concatenated); NULL plan on failure. */
static twk_plan *run(const built *b, twk_device *dev, int fused, int64_t n, float *out, size_t *out_bytes) {
    twk_graph_set_fusion(b->g, fused);
    twk_plan *p = NULL;
    if (twk_plan_compile(b->g, dev, CAP, NULL, 0, &p) != TWK_OK) {
        printf("     compile: %s\n", twk_last_error());
        return NULL;
    }
    rng_state = 42;
    for (int i = 0; i < b->n_in; i++) {
        twk_id id = b->in[i];
        size_t bytes = bytes_of(b->g, id, n), cnt = bytes / 4;
        void *h = malloc(bytes);
        twk_dtype t = twk_node_dtype(b->g, id);
        for (size_t k = 0; k < cnt; k++) {
            if (t == TWK_I32) ((int32_t *)h)[k] = !strcmp(twk_node_name(b->g, id), "pos") ? (int32_t)k : (int32_t)(k / 5 * 5);
            else ((float *)h)[k] = rnd() * 0.5f;
        }
        twk_status st = twk_plan_write(p, id, n, h, bytes);
        free(h);
        if (st != TWK_OK) {
            printf("     write %s: %s\n", twk_node_name(b->g, id), twk_last_error());
            twk_plan_free(p);
            return NULL;
        }
    }
    if (twk_plan_run(p, n) != TWK_OK) {
        printf("     run: %s\n", twk_last_error());
        twk_plan_free(p);
        return NULL;
    }
    size_t off = 0;
    for (int i = 0; i < b->n_out; i++) {
        size_t bytes = bytes_of(b->g, b->out[i], n);
        twk_plan_read(p, b->out[i], n, (char *)out + off, bytes);
        off += bytes;
    }
    *out_bytes = off;
    return p;
}

/* NMSE of f against u over each output (the largest), and the floats that differ at all. */
static double worst_nmse(const built *b, int64_t n, const float *u, const float *f, size_t *differ) {
    double worst = 0;
    size_t off = 0;
    *differ = 0;
    for (int i = 0; i < b->n_out; i++) {
        size_t cnt = bytes_of(b->g, b->out[i], n) / 4;
        double err = 0, den = 0;
        for (size_t k = 0; k < cnt; k++) {
            double d = (double)f[off + k] - (double)u[off + k];
            err += d * d;
            den += (double)u[off + k] * u[off + k];
            *differ += memcmp(&u[off + k], &f[off + k], 4) != 0;
        }
        double e = den > 0 ? err / den : err;
        if (e > worst) worst = e;
        off += cnt;
    }
    return worst;
}

/* On the CPU and on lavapipe fused and unfused plans must agree bit for bit; on another device
 * within the elementwise maps' cross-library tolerance (backend_ops' TRANSCENDENTAL class, NMSE 1e-10:
 * the fused kernel computes the maps' own expressions, its compiler may contract them). */
#define DEVICE_NMSE 1e-10

static int llama_saved; /* the launches fusion saves on the Llama block (compared first) */

static void compare(const char *what, built b, twk_device *dev) {
    const char *why = NULL;
    int fuses = twk_device_backend(dev)->op_kernel(TWK_OP_FUSED_EW, &why);
    /* exact on the CPU, and on Vulkan's lavapipe: fused.comp and the unfused shaders share their
     * maps' source (ew_maps.glsl) and llvmpipe contracts no a * b + c in either */
    twk_device_props props = {0};
    twk_device_get_props(dev, &props);
    const char *be = twk_device_backend(dev)->name;
    int exact = !strcmp(be, "cpu") || (!strcmp(be, "vulkan") && strstr(props.name, "llvmpipe"));
    int refused = fuses && b.wide > fused_max_src(be); /* too many sources */
    check(twk_graph_status(b.g) == TWK_OK, "%s: graph builds (%s)", what, twk_graph_error(b.g));
    size_t cap_bytes = 0;
    for (int i = 0; i < b.n_out; i++) cap_bytes += bytes_of(b.g, b.out[i], CAP);
    float *u = malloc(cap_bytes), *f = malloc(cap_bytes);
    int64_t ns[2] = {CAP, 7};
    for (int r = 0; r < 2; r++) {
        size_t ub = 0, fb = 0;
        twk_plan *pu = run(&b, dev, 0, ns[r], u, &ub), *pf = run(&b, dev, 1, ns[r], f, &fb);
        check(pu && pf, "%s: both plans compile and run", what);
        if (!pu || !pf) {
            twk_plan_free(pu);
            twk_plan_free(pf);
            break;
        }
        twk_plan_stats su, sf;
        twk_plan_get_stats(pu, &su);
        twk_plan_get_stats(pf, &sf);
        if (r == 0) {
            printf("     %s on %s: %d launches unfused, %d fused (%d fused launches), arena %zu -> %zu bytes\n", what,
                   twk_device_spec(dev), su.n_launches, sf.n_launches, sf.n_fused_groups, su.arena_bytes, sf.arena_bytes);
            if (refused)
                check(sf.n_launches == su.n_launches && sf.n_fused_groups == 0,
                      "%s: %s refuses a fused launch of %d sources: the plan is unchanged", what, twk_device_spec(dev),
                      b.wide);
            else if (fuses)
                check(sf.n_launches < su.n_launches && sf.n_launches_unfused == su.n_launches && su.n_fused_groups == 0,
                      "%s: the fused plan has fewer launches (%d < %d)", what, sf.n_launches, su.n_launches);
            else
                check(sf.n_launches == su.n_launches && sf.n_fused_groups == 0,
                      "%s: %s declares no fused launches (%s): the plan is unchanged", what, twk_device_spec(dev), why);
            if (fuses && !refused && b.wide)
                check(sf.n_launches == 1, "%s: the chain is one launch (%d)", what, sf.n_launches);
            check(twk_plan_validate_memory(pf) == TWK_OK, "%s: fused memory plan: no live tensors overlap", what);
            check(sf.arena_bytes <= su.arena_bytes, "%s: fused arena peak %zu <= unfused %zu", what, sf.arena_bytes,
                  su.arena_bytes);
            if (b.norm_rope[0] < 0) { /* the Llama block: what its elementwise groups save */
                if (b.kind == LLAMA) llama_saved = su.n_launches - sf.n_launches;
            } else {
                const char *nwhy = NULL;
                const twk_backend_iface *bi = twk_device_backend(dev);
                int fwd = bi->op_kernel(TWK_OP_RMSNORM_ROPE, &nwhy), bwd = bi->op_kernel(TWK_OP_ROPE_RMSNORM_BACK_X, &nwhy);
                int ln = twk_plan_launch_of(pf, b.norm_rope[0]), lr = twk_plan_launch_of(pf, b.norm_rope[1]);
                check(lr >= 0 && (fwd ? ln == lr : ln >= 0 && ln < lr),
                      "%s: q's norm and rotation are %s (launches %d and %d)", what,
                      fwd ? "one launch (rmsnorm_rope)" : "two launches (no rmsnorm_rope kernel here)", ln, lr);
                /* the same block as Llama's but for the two norms (and their two gradients): the
                 * same elementwise groups, and one launch fewer per pair of q's and k's */
                int want = llama_saved + 2 * fwd + 2 * bwd;
                check(su.n_launches - sf.n_launches == want,
                      "%s: %d launches fewer fused (the Llama block's %d, + %d norm + rope pairs, + %d rope + norm "
                      "gradient pairs)", what, su.n_launches - sf.n_launches, llama_saved, 2 * fwd, 2 * bwd);
            }
            if (b.inner >= 0 && fuses) {
                float tmp[CAP * 3 * 37];
                twk_status st = twk_plan_read(pf, b.inner, CAP, tmp, bytes_of(b.g, b.inner, CAP));
                check(st == TWK_ERR_INVALID_ARG && strstr(twk_last_error(), "fused"),
                      "%s: reading an intermediate inside a fused launch is a clear error (%s)", what, twk_last_error());
                check(twk_plan_launch_of(pf, b.inner) >= 0,
                      "%s: launch_of a fused intermediate is its group's launch", what);
            }
        }
        size_t diff = 0;
        double e = ub == fb ? worst_nmse(&b, ns[r], u, f, &diff) : 1.0;
        if (exact || !fuses)
            check(ub == fb && diff == 0, "%s, %lld tokens: outputs and gradients bit-identical fused vs unfused (%zu of %zu floats differ)",
                  what, (long long)ns[r], diff, ub / 4);
        else
            check(ub == fb && e <= DEVICE_NMSE,
                  "%s, %lld tokens, %s: outputs and gradients fused vs unfused within NMSE %.0e (worst output %.2e; %zu of %zu floats differ)",
                  what, (long long)ns[r], twk_device_spec(dev), DEVICE_NMSE, e, diff, ub / 4);
        twk_plan_free(pu);
        twk_plan_free(pf);
    }
    free(u);
    free(f);
    twk_graph_free(b.g);
}

/* Plans of b's graph at capacities from one token up (where the arena's greedy placement of the
 * fused plan can come out larger than the unfused one's: then the groups that fit are kept, not
 * none): fewer launches fused than unfused, at no more arena. */
static void small_counts(const char *what, built b, twk_device *dev) {
    const char *why = NULL;
    if (!twk_device_backend(dev)->op_kernel(TWK_OP_FUSED_EW, &why)) {
        twk_graph_free(b.g);
        return;
    }
    int64_t caps[] = {1, 2, 8, 16, 32, 512};
    for (int c = 0; c < (int)(sizeof caps / sizeof caps[0]); c++) {
        twk_plan *pl[2] = {NULL, NULL};
        twk_plan_stats s[2] = {{0}, {0}};
        for (int f = 0; f < 2; f++) {
            twk_graph_set_fusion(b.g, f);
            if (twk_plan_compile(b.g, dev, caps[c], NULL, 0, &pl[f]) == TWK_OK) twk_plan_get_stats(pl[f], &s[f]);
        }
        check(pl[0] && pl[1] && s[1].n_launches < s[0].n_launches && s[1].arena_bytes <= s[0].arena_bytes &&
                  twk_plan_validate_memory(pl[1]) == TWK_OK,
              "%s at capacity %lld: %d launches fused < %d unfused (%d fused launches), arena %zu <= %zu", what,
              (long long)caps[c], s[1].n_launches, s[0].n_launches, s[1].n_fused_groups, s[1].arena_bytes,
              s[0].arena_bytes);
        twk_plan_free(pl[0]);
        twk_plan_free(pl[1]);
    }
    twk_graph_free(b.g);
}

/* A LoRA trainer's step (forward and backward) on a one-layer Qwen3 of bench_train_step's widths
 * at 1, 16 and 32 tokens, fused and unfused (TWK_FUSION=0): fewer launches fused, and no more
 * device memory for activations (the trainer's arena is sized by the unfused estimate: a fused
 * plan that needed more would allocate an arena of its own). At 16 tokens the greedy placement
 * of the fused plan with all its groups comes out larger than the unfused one (by an alignment
 * unit), which once dropped every group (124 launches both ways); the groups that fit are kept. */
static void trainer_counts(twk_device *dev) {
    twk_model_config c;
    twk_model_builtin_config(&c);
    c.vocab = 2048, c.hidden = 1024, c.layers = 1, c.heads = 16, c.kv_heads = 8, c.head_dim = 128, c.ffn = 3072;
    c.rope_theta = 1e6;
    twk_model *m = NULL;
    if (twk_model_random(&c, dev, 1, &m) != TWK_OK) {
        check(0, "trainer step: random model (%s)", twk_last_error());
        return;
    }
    twk_lora_config lc = twk_lora_default();
    lc.rank = 16;
    lc.alpha = 32;
    int32_t ids[32], pos[32], seg[32];
    float wt[32];
    for (int k = 0; k < 32; k++) ids[k] = (k * 37) % 2048, pos[k] = k, seg[k] = 0, wt[k] = 1.0f;
    int64_t caps[] = {1, 16, 32};
    for (int ci = 0; ci < 3; ci++) {
        uint64_t launches[2] = {0, 0};
        size_t act[2] = {0, 0};
        float loss[2] = {0, 0};
        for (int f = 0; f < 2; f++) {
            if (!f) setenv("TWK_FUSION", "0", 1);
            twk_trainer *t = NULL;
            twk_batch bt = {caps[ci], ids, ids, pos, seg, wt};
            uint64_t l0 = twk_plan_launches_run();
            if (twk_trainer_new(m, &lc, caps[ci], &t) == TWK_OK && twk_trainer_forward_backward(t, &bt, NULL, &loss[f]) == TWK_OK) {
                launches[f] = twk_plan_launches_run() - l0;
                act[f] = twk_device_pool_bytes(dev, TWK_DPOOL_ACTIVATIONS);
            }
            unsetenv("TWK_FUSION");
            twk_trainer_free(t);
        }
        check(launches[1] && launches[1] < launches[0] && act[1] <= act[0] && !memcmp(&loss[0], &loss[1], sizeof loss[0]),
              "trainer step at %lld tokens: %llu launches fused < %llu unfused, activations %zu <= %zu bytes, loss %.6f both",
              (long long)caps[ci], (unsigned long long)launches[1], (unsigned long long)launches[0], act[1], act[0],
              (double)loss[1]);
    }
    twk_model_free(m);
}

int main(void) {
    twk_device *dev = NULL;
    const char *spec = getenv("TWK_TEST_DEVICE") ? getenv("TWK_TEST_DEVICE") : "cpu";
    if (twk_device_open(spec, &dev) != TWK_OK) {
        printf("FAIL open %s: %s\n", spec, twk_last_error());
        return 1;
    }
    compare("llama block (LoRA, training)", block(LLAMA), dev);
    compare("gemma-style block (gelu * up, soft-cap)", block(GEMMA), dev);
    compare("qwen3 block (qk-norm, LoRA, training)", block(QWEN3), dev);
    compare("elementwise chain", chain(), dev);
    compare("add/mul chain over 6 sources", wide_chain(6), dev);
    compare("add/mul chain over 7 sources", wide_chain(7), dev);
    compare("add/mul chain over 8 sources", wide_chain(8), dev);
    small_counts("llama block", block(LLAMA), dev);
    small_counts("gemma-style block", block(GEMMA), dev);
    small_counts("qwen3 block", block(QWEN3), dev);
    if (!strcmp(twk_device_backend(dev)->name, "cpu")) trainer_counts(dev);
    /* TWK_FUSION=0 turns fusion off for every plan */
    built b = chain();
    setenv("TWK_FUSION", "0", 1);
    twk_plan *p = NULL;
    twk_plan_stats s = {0};
    if (twk_plan_compile(b.g, dev, CAP, NULL, 0, &p) == TWK_OK) twk_plan_get_stats(p, &s);
    check(p && s.n_fused_groups == 0 && s.n_launches == s.n_launches_unfused, "TWK_FUSION=0: nothing fused (%d launches)",
          s.n_launches);
    unsetenv("TWK_FUSION");
    twk_plan_free(p);
    twk_graph_free(b.g);
    check(twk_graph_set_fusion(NULL, true) == TWK_ERR_INVALID_ARG, "twk_graph_set_fusion(NULL) is an error");
    twk_device_close(dev);
    return check_failures;
}
