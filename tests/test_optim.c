/* The training step on the device: the trainer's optimizer plan (gradient
 * accumulation over passes, global norm, clipping, AdamW with weight decay)
 * against the host reference twk_adamw_host, for LoRA and full-parameter
 * training, on TWK_TEST_DEVICE (default cpu): bit-identical on the CPU,
 * within stated tolerances elsewhere. Then the HAL's transfer counters: after
 * warm-up a step moves exactly the batch, the loss and the norm, and the
 * hyper-parameters (no weight, gradient or moment), and a checkpoint's
 * moments and step resume the same trajectory. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "twinkle/twinkle.h"

static int failures;
static int on_cpu;

#define CHECK(c, ...)                                 \
    do {                                              \
        if (!(c)) {                                   \
            failures++;                               \
            printf("FAIL %s:%d: ", __FILE__, __LINE__); \
            printf(__VA_ARGS__);                      \
            printf("\n");                             \
        }                                             \
    } while (0)

#define OK(x)                                                                            \
    do {                                                                                 \
        twk_status st_ = (x);                                                            \
        if (st_ != TWK_OK) {                                                             \
            printf("FAIL %s:%d: %s -> %s\n", __FILE__, __LINE__, #x, twk_last_error()); \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

enum { N_TOK = 24, MAX_PASSES = 3, STEPS = 3 };
static int n_passes = MAX_PASSES; /* passes per step: 2 with --quick (the fake CUDA driver is slow) */

/* The backend name of a device spec ("opencl:0" -> "opencl"). */
static const char *spec_backend(const char *spec) {
    static char name[32];
    snprintf(name, sizeof name, "%s", spec);
    name[strcspn(name, ":")] = 0;
    return name;
}

/* Pass p of step s: two packed sequences of random ids, weights on most targets. */
typedef struct {
    int32_t tok[N_TOK], tgt[N_TOK], pos[N_TOK], seg[N_TOK];
    float w[N_TOK];
    twk_batch b;
} batch_buf;

static void make_batch(batch_buf *bb, int vocab, unsigned seed) {
    srand(seed);
    for (int i = 0; i < N_TOK; i++) {
        int start = i < 10 ? 0 : 10;
        bb->tok[i] = rand() % vocab;
        bb->tgt[i] = rand() % vocab;
        bb->pos[i] = i - start;
        bb->seg[i] = start;
        bb->w[i] = i % 5 == 0 ? 0.0f : 0.5f + (float)(rand() % 100) / 100.0f;
    }
    bb->b = (twk_batch){N_TOK, bb->tok, bb->tgt, bb->pos, bb->seg, bb->w};
}

/* Host copies of every trainable tensor of a trainer: values (or gradients). */
typedef struct {
    int n;
    int64_t *ne;
    float **x;
} host_set;

static host_set host_new(twk_trainer *t) {
    host_set h = {twk_trainer_param_count(t), NULL, NULL};
    h.ne = calloc((size_t)h.n, sizeof *h.ne);
    h.x = calloc((size_t)h.n, sizeof *h.x);
    for (int i = 0; i < h.n; i++) {
        twk_trainer_param_name(t, i, &h.ne[i]);
        h.x[i] = calloc((size_t)h.ne[i], sizeof(float));
    }
    return h;
}

static void host_free(host_set *h) {
    for (int i = 0; i < h->n; i++) free(h->x[i]);
    free(h->x);
    free(h->ne);
}

static void host_get(twk_trainer *t, host_set *h, int grads) {
    for (int i = 0; i < h->n; i++) {
        const char *name = twk_trainer_param_name(t, i, NULL);
        OK(grads ? twk_trainer_get_grad(t, name, h->x[i], h->ne[i]) : twk_trainer_get(t, name, h->x[i], h->ne[i]));
    }
}

/* Elements that differ in their bits, and the largest |a - b| relative to max(|b|, 1e-3). */
static int64_t compare(const host_set *a, const host_set *b, double *max_rel) {
    int64_t diff = 0;
    *max_rel = 0;
    for (int i = 0; i < a->n; i++)
        for (int64_t k = 0; k < a->ne[i]; k++) {
            float x = a->x[i][k], y = b->x[i][k];
            if (memcmp(&x, &y, sizeof x)) diff++;
            double r = fabs((double)x - y) / fmax(fabs((double)y), 1e-3);
            if (!(r <= *max_rel)) *max_rel = r;
        }
    return diff;
}

static twk_adam_params step_params(int s) {
    twk_adam_params p = twk_adam_default();
    p.learning_rate = 1e-3f * (float)(s + 1); /* a new lr every step: an input, not a recompile */
    p.beta1 = 0.9f;
    p.beta2 = 0.95f;
    p.eps = 1e-8f;
    p.weight_decay = 0.1f;
    p.grad_clip_norm = s == 0 ? 0.05f : s == 1 ? 0.0f : 1e6f; /* clipping on, off, inactive */
    return p;
}

/* STEPS optimizer steps of n_passes passes on trainer `dev_t` (the device's
 * optimizer) against the host reference fed with per-pass gradients from a
 * twin trainer `ref_t` on an identical model. */
static void check_against_reference(const char *what, twk_trainer *dev_t, twk_trainer *ref_t, int vocab) {
    host_set w = host_new(ref_t), m = host_new(ref_t), v = host_new(ref_t), acc = host_new(ref_t),
             g = host_new(ref_t), got = host_new(dev_t);
    host_get(ref_t, &w, 0);
    /* the worst errors GPU backends may show: their gradients differ from the CPU's in the last bits */
    double w_tol = on_cpu ? 0 : 1e-4, norm_tol = on_cpu ? 0 : 1e-5;
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < acc.n; i++) memset(acc.x[i], 0, (size_t)acc.ne[i] * sizeof(float));
        for (int p = 0; p < n_passes; p++) {
            batch_buf bb;
            make_batch(&bb, vocab, (unsigned)(100 * s + p + 1));
            float l_dev = 0, l_ref = 0;
            OK(twk_trainer_forward_backward(dev_t, &bb.b, NULL, &l_dev));
            twk_trainer_zero_grad(ref_t);
            OK(twk_trainer_forward_backward(ref_t, &bb.b, NULL, &l_ref));
            host_get(ref_t, &g, 1);
            for (int i = 0; i < acc.n; i++) /* the accumulation the host used to do */
                for (int64_t k = 0; k < acc.ne[i]; k++) acc.x[i][k] += g.x[i][k];
            CHECK(on_cpu ? l_dev == l_ref : fabs(l_dev - l_ref) <= 1e-4 * fabs(l_ref), "%s step %d pass %d loss %.9g vs %.9g",
                  what, s + 1, p + 1, l_dev, l_ref);
        }
        host_get(dev_t, &got, 1);
        double rel;
        int64_t nd = compare(&got, &acc, &rel);
        printf("     %s step %d: accumulated gradients over %d passes: %lld elements differ, max rel err %.3g\n", what, s + 1,
               n_passes, (long long)nd, rel);
        CHECK(on_cpu ? nd == 0 : rel <= 1e-3, "%s step %d: accumulated gradient differs (%lld, %.3g)", what, s + 1,
              (long long)nd, rel);
        if (s == 2) { /* a gradient changed through the host copy (as dist's allreduce does) is the one used */
            int64_t ne = 0;
            float *hg = twk_trainer_grad_data(dev_t, 0, &ne);
            CHECK(hg && ne == acc.ne[0], "%s: grad_data", what);
            for (int64_t k = 0; hg && k < ne; k++) hg[k] *= 0.5f, acc.x[0][k] *= 0.5f;
        }
        twk_adam_params ap = step_params(s);
        float n_dev = 0, n_ref = 0;
        OK(twk_trainer_optim_step(dev_t, &ap, &n_dev));
        OK(twk_adamw_host(w.x, (const float *const *)acc.x, m.x, v.x, w.ne, w.n, &ap, s + 1, &n_ref));
        host_get(dev_t, &got, 0);
        nd = compare(&got, &w, &rel);
        double nrel = fabs((double)n_dev - n_ref) / n_ref;
        printf("     %s step %d (lr %g, clip %g, decay %g): norm %.9g vs host %.9g (rel err %.3g); %lld of the weights differ "
               "in bits, max rel err %.3g (tol %g)\n",
               what, s + 1, (double)ap.learning_rate, (double)ap.grad_clip_norm, (double)ap.weight_decay, n_dev, n_ref, nrel,
               (long long)nd, rel, w_tol);
        CHECK(nrel <= norm_tol, "%s step %d: norm %.9g vs %.9g", what, s + 1, n_dev, n_ref);
        CHECK(on_cpu ? nd == 0 : rel <= w_tol, "%s step %d: weights differ from the host AdamW (%lld, %.3g)", what, s + 1,
              (long long)nd, rel);
        CHECK(twk_trainer_step(dev_t) == s + 1, "%s: step count %lld", what, (long long)twk_trainer_step(dev_t));
        host_get(dev_t, &g, 1);
        double gmax = 0;
        for (int i = 0; i < g.n; i++)
            for (int64_t k = 0; k < g.ne[i]; k++) gmax = fmax(gmax, fabs(g.x[i][k]));
        CHECK(gmax == 0, "%s step %d: the step leaves the gradients zeroed (max %g)", what, s + 1, gmax);
        /* both trainers continue from the host's weights: a one-ulp difference in a weight (the device's float
         * AdamW against the host's double one) would otherwise move the next step's gradients of the two
         * trainers apart and grow step by step, so each step is checked from one state */
        for (int i = 0; i < w.n; i++) {
            OK(twk_trainer_set(ref_t, twk_trainer_param_name(ref_t, i, NULL), w.x[i], w.ne[i]));
            OK(twk_trainer_set(dev_t, twk_trainer_param_name(dev_t, i, NULL), w.x[i], w.ne[i]));
        }
    }
    host_free(&w), host_free(&m), host_free(&v), host_free(&acc), host_free(&g), host_free(&got);
}

/* A non-finite gradient: optim_step fails with TWK_ERR_RANGE and changes nothing. */
static void check_non_finite(twk_trainer *t, int vocab) {
    batch_buf bb;
    make_batch(&bb, vocab, 7);
    OK(twk_trainer_forward_backward(t, &bb.b, NULL, NULL));
    host_set before = host_new(t), after = host_new(t);
    host_get(t, &before, 0);
    int64_t ne = 0;
    float *g = twk_trainer_grad_data(t, 1, &ne);
    g[ne / 2] = NAN;
    int64_t step = twk_trainer_step(t);
    twk_adam_params ap = step_params(0);
    float norm = 0;
    twk_status st = twk_trainer_optim_step(t, &ap, &norm);
    host_get(t, &after, 0);
    double rel;
    int64_t nd = compare(&after, &before, &rel);
    printf("     non-finite gradient: status %s, norm %g, %lld weights changed, step %lld -> %lld\n", twk_status_name(st),
           (double)norm, (long long)nd, (long long)step, (long long)twk_trainer_step(t));
    CHECK(st == TWK_ERR_RANGE && nd == 0 && twk_trainer_step(t) == step, "a NaN gradient must change nothing");
    twk_trainer_zero_grad(t);
    host_free(&before), host_free(&after);
}

/* After warm-up, a step of n_passes passes moves the batch, the loss, the hyper-parameters and the norm. */
static void check_bytes(twk_trainer *t, twk_device *dev, int vocab, const char *what) {
    const twk_backend_iface *be = twk_backend_find(spec_backend(twk_device_spec(dev)));
    batch_buf bb[MAX_PASSES];
    for (int p = 0; p < n_passes; p++) make_batch(&bb[p], vocab, (unsigned)(900 + p));
    twk_adam_params ap = step_params(1);
    for (int warm = 0; warm < 2; warm++) {
        twk_backend_transfers_reset(be);
        float loss, norm, lp[N_TOK];
        for (int p = 0; p < n_passes; p++) OK(twk_trainer_forward_backward(t, &bb[p].b, p == 0 ? lp : NULL, &loss));
        OK(twk_trainer_optim_step(t, &ap, &norm));
        twk_transfer_stats s = twk_backend_transfers(be);
        uint64_t batch = (uint64_t)n_passes * N_TOK * (4 * sizeof(int32_t) + sizeof(float)), hyper = 8 * sizeof(float);
        uint64_t back = (uint64_t)n_passes * sizeof(float) + N_TOK * sizeof(float) + 2 * sizeof(float);
        int64_t params = 0;
        for (int i = 0; i < twk_trainer_param_count(t); i++) {
            int64_t ne = 0;
            twk_trainer_param_name(t, i, &ne);
            params += ne;
        }
        printf("     %s bytes per step (%s): up %llu (batch %llu + hyper %llu), down %llu (losses, one pass's logprobs, "
               "norm: %llu); trainable %lld bytes\n",
               what, warm ? "after warm-up" : "first step", (unsigned long long)s.upload_bytes, (unsigned long long)batch,
               (unsigned long long)hyper, (unsigned long long)s.download_bytes, (unsigned long long)back,
               (long long)params * 4);
        if (warm)
            CHECK(s.upload_bytes == batch + hyper && s.download_bytes == back,
                  "%s: a step moved more than the batch and what was asked back", what);
    }
    twk_backend_transfers_reset(be);
    twk_transfer_stats z = twk_backend_transfers(be);
    CHECK(z.upload_bytes == 0 && z.download_bytes == 0 && z.uploads == 0, "reset");
}

/* The step every caller runs (train/'s twk_loss_step, as the service and `twinkle train` do):
 * cross-entropy moves the batch up and the loss and logprobs down; ppo (a forward for the
 * logprobs, then a backward pass with -dL/dp as weights) at most twice that. */
static void check_loss_step_bytes(twk_trainer *t, const twk_backend_iface *be, int vocab) {
    batch_buf bb;
    make_batch(&bb, vocab, 77);
    int64_t off[3] = {0, 10, N_TOK};
    float adv[N_TOK], q[N_TOK];
    for (int i = 0; i < N_TOK; i++) adv[i] = (float)(i % 3) - 1.0f, q[i] = -3.0f;
    twk_loss_batch b = {2, off, bb.tok, 0, bb.tgt, {0}, NULL};
    b.in[TWK_IN_WEIGHTS] = bb.w;
    b.in[TWK_IN_ADVANTAGES] = adv;
    b.in[TWK_IN_LOGPROBS] = q;
    twk_adam_params ap = step_params(1);
    uint64_t batch = N_TOK * (4 * sizeof(int32_t) + sizeof(float)), hyper = 8 * sizeof(float);
    uint64_t back = N_TOK * sizeof(float) + sizeof(float) + 2 * sizeof(float);
    const char *losses[2] = {"cross_entropy", "ppo"};
    for (int k = 0; k < 2; k++) {
        twk_loss_spec spec;
        twk_loss_result res;
        OK(twk_loss_spec_init(losses[k], &spec));
        for (int warm = 0; warm < 2; warm++) {
            twk_backend_transfers_reset(be);
            OK(twk_loss_step(t, &spec, &b, 1, NULL, &res));
            OK(twk_trainer_optim_step(t, &ap, NULL));
        }
        twk_transfer_stats s = twk_backend_transfers(be);
        printf("     loss_step %s: up %llu, down %llu bytes per step (one pass: batch %llu up, logprobs + loss %llu down)\n",
               losses[k], (unsigned long long)s.upload_bytes, (unsigned long long)s.download_bytes,
               (unsigned long long)batch, (unsigned long long)back - 8);
        if (k == 0) CHECK(s.upload_bytes == batch + hyper && s.download_bytes == back, "loss_step %s bytes", losses[k]);
        else CHECK(s.upload_bytes <= 2 * batch + hyper && s.download_bytes <= 2 * back, "loss_step %s bytes", losses[k]);
    }
}

/* Save after step 2, resume in a fresh trainer: step 3 gives the same bits as the original's. */
static void check_resume(twk_device *dev, const twk_lora_config *lc, int vocab) {
    twk_model *ma = NULL, *mb = NULL;
    twk_trainer *a = NULL, *b = NULL;
    OK(twk_model_builtin(dev, &ma));
    OK(twk_model_builtin(dev, &mb));
    OK(twk_trainer_new(ma, lc, N_TOK, &a));
    OK(twk_trainer_new(mb, lc, N_TOK, &b));
    char dir[] = "/tmp/twk_optim_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    batch_buf bb;
    for (int s = 0; s < 3; s++) {
        make_batch(&bb, vocab, (unsigned)(50 + s));
        twk_adam_params ap = step_params(s);
        OK(twk_trainer_forward_backward(a, &bb.b, NULL, NULL));
        OK(twk_trainer_optim_step(a, &ap, NULL));
        if (s == 1) {
            twk_backend_transfers_reset(NULL);
            OK(twk_trainer_save_state(a, dir, NULL));
            OK(twk_trainer_load_state(b, dir, true));
            printf("     checkpoint: save + load moved %llu bytes down, %llu up (weights and moments)\n",
                   (unsigned long long)twk_backend_transfers(NULL).download_bytes,
                   (unsigned long long)twk_backend_transfers(NULL).upload_bytes);
        }
        if (s == 2) {
            OK(twk_trainer_forward_backward(b, &bb.b, NULL, NULL));
            OK(twk_trainer_optim_step(b, &ap, NULL));
        }
    }
    host_set wa = host_new(a), wb = host_new(b);
    host_get(a, &wa, 0);
    host_get(b, &wb, 0);
    double rel;
    int64_t nd = compare(&wb, &wa, &rel);
    printf("     resumed at step %lld: step 3 differs in %lld elements (max rel err %.3g)\n", (long long)twk_trainer_step(b),
           (long long)nd, rel);
    CHECK(nd == 0 && twk_trainer_step(b) == 3, "resume from a checkpoint continues exactly");
    host_free(&wa), host_free(&wb);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "rm");
    twk_trainer_free(a), twk_trainer_free(b);
    twk_model_free(ma), twk_model_free(mb);
}

/* --quick: LoRA only, 2 passes a step (for the host-emulated CUDA driver, slow under sanitizers). */
int main(int argc, char **argv) {
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    if (quick) n_passes = 2;
    const char *spec = getenv("TWK_TEST_DEVICE") ? getenv("TWK_TEST_DEVICE") : "cpu";
    twk_device *dev = NULL;
    OK(twk_device_open(spec, &dev));
    on_cpu = !strncmp(spec, "cpu", 3);
    printf("device %s\n", twk_device_spec(dev));
    twk_model_config cfg;
    twk_model_builtin_config(&cfg);
    twk_lora_config lc = twk_lora_default();
    lc.rank = 8;
    lc.train_unembed = true;
    for (int full = 0; full < (quick ? 1 : 2); full++) {
        const char *what = full ? "full" : "lora";
        twk_model *m1 = NULL, *m2 = NULL;
        twk_trainer *t1 = NULL, *t2 = NULL;
        OK(twk_model_builtin(dev, &m1));
        OK(twk_model_builtin(dev, &m2));
        OK(twk_trainer_new(m1, full ? NULL : &lc, N_TOK, &t1));
        OK(twk_trainer_new(m2, full ? NULL : &lc, N_TOK, &t2));
        check_against_reference(what, t1, t2, cfg.vocab);
        check_non_finite(t1, cfg.vocab);
        check_bytes(t1, dev, cfg.vocab, what);
        if (!full) check_loss_step_bytes(t1, twk_backend_find(spec_backend(spec)), cfg.vocab);
        twk_trainer_free(t1), twk_trainer_free(t2);
        twk_model_free(m1), twk_model_free(m2);
    }
    check_resume(dev, &lc, cfg.vocab);
    twk_device_close(dev);
    printf("%d failures\n", failures);
    return failures ? 1 : 0;
}
