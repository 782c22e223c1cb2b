/* LoRA on a mixture of experts' experts in the service's training path (twk_loss_steps over a
 * pack): the packed trainer's slots hold no expert stacks, so a trainer with train_experts (or
 * train_router) runs its passes on its own trainer, never packed, counted in the pack's
 * own_passes. Checked on the mixtral fixture's model: such a run's loss, logprobs and gradients
 * through twk_loss_steps — alone and beside a plain attention-LoRA run that is packed — equal
 * twk_loss_step of the same run in-process, bit for bit (the same code path on the same
 * trainer kind), for cross-entropy and ppo (a forward, then a backward); the plain run equals its pass alone through the pack; twk_pack_pass refuses
 * the expert run by name; the saved adapter has PEFT's target_parameters. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "twinkle/twinkle.h"

static int fails;

static void check(int ok, const char *what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    if (!ok) fails++;
}

/* Every LoRA tensor of t set to small deterministic values (so A and B both get gradients). */
static int fill_params(twk_trainer *t, uint32_t seed) {
    for (int i = 0; i < twk_trainer_param_count(t); i++) {
        int64_t n = 0;
        const char *name = twk_trainer_param_name(t, i, &n);
        float *v = malloc((size_t)n * sizeof *v);
        if (!v) return 0;
        for (int64_t k = 0; k < n; k++) {
            seed = seed * 1664525u + 1013904223u;
            v[k] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 0.2f;
        }
        twk_status st = twk_trainer_set(t, name, v, n);
        free(v);
        if (st != TWK_OK) return 0;
    }
    return 1;
}

/* The largest |a - b| over every gradient of two trainers with the same tensors; -1 when they differ. */
static double grad_diff(twk_trainer *a, twk_trainer *b, int *n_expert) {
    double worst = 0;
    *n_expert = 0;
    if (twk_trainer_param_count(a) != twk_trainer_param_count(b)) return -1;
    for (int i = 0; i < twk_trainer_param_count(a); i++) {
        int64_t n = 0;
        const char *name = twk_trainer_param_name(a, i, &n);
        float *ga = malloc((size_t)n * 4), *gb = malloc((size_t)n * 4);
        double nz = 0;
        if (!ga || !gb || twk_trainer_get_grad(a, name, ga, n) != TWK_OK || twk_trainer_get_grad(b, name, gb, n) != TWK_OK)
            worst = -1;
        for (int64_t k = 0; worst >= 0 && k < n; k++) {
            worst = fmax(worst, fabs((double)ga[k] - gb[k]));
            nz += fabs(ga[k]);
        }
        if (strstr(name, ".experts.") && nz > 0) (*n_expert)++;
        free(ga);
        free(gb);
        if (worst < 0) return -1;
    }
    return worst;
}

static int file_has(const char *path, const char *what) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strstr(buf, what) != NULL;
}

int main(void) {
    enum { N_SEQS = 3, N = 24 };
    twk_device *dev = NULL;
    twk_model *m = NULL;
    if (twk_device_open("cpu", &dev) != TWK_OK || twk_model_load(TWK_PARITY_DIR "/mixtral/model", dev, &m) != TWK_OK) {
        printf("FAIL loading the mixtral fixture: %s\n", twk_last_error());
        return 1;
    }
    int64_t off[N_SEQS + 1] = {0, 7, 19, 24};
    int32_t tok[N], tgt[N];
    for (int i = 0; i < N; i++) tok[i] = (i * 37 + 11) % 256, tgt[i] = (i * 53 + 5) % 256;
    twk_loss_batch lb = {.n_seqs = N_SEQS, .offsets = off, .tokens = tok, .targets = tgt};
    twk_loss_spec spec;
    twk_lora_config ex = twk_lora_default(), plain = twk_lora_default();
    ex.rank = 4, ex.alpha = 8, ex.train_experts = 1; /* the service's train_mlp on a mixture of experts */
    plain.rank = 4, plain.alpha = 8, plain.train_mlp = 0; /* attention only: packed */
    twk_trainer *ref = NULL, *a = NULL, *b = NULL, *b_ref = NULL;
    twk_pack *pack = NULL, *pack_ref = NULL;
    if (twk_loss_spec_init("cross_entropy", &spec) != TWK_OK || twk_trainer_new(m, &ex, N, &ref) != TWK_OK ||
        twk_trainer_new(m, &ex, N, &a) != TWK_OK || twk_trainer_new(m, &plain, N, &b) != TWK_OK ||
        twk_trainer_new(m, &plain, N, &b_ref) != TWK_OK || twk_pack_new(m, 4 * N, 4, &pack) != TWK_OK ||
        twk_pack_new(m, 4 * N, 4, &pack_ref) != TWK_OK || !fill_params(ref, 7) || !fill_params(a, 7) ||
        !fill_params(b, 9) || !fill_params(b_ref, 9)) {
        printf("FAIL setting up: %s\n", twk_last_error());
        return 1;
    }

    /* in-process: the run's own twk_loss_step (what `twinkle train` does) */
    float lp_ref[N], lp_a[N], lp_b[N], lp_bref[N];
    twk_loss_result res_ref;
    check(twk_loss_step(ref, &spec, &lb, 1, lp_ref, &res_ref) == TWK_OK, "in-process loss step of the expert run");

    /* the service's path: twk_loss_steps over a pack, the expert run beside a packed plain run */
    twk_loss_job jobs[2] = {{.t = a, .spec = &spec, .b = &lb, .backward = 1, .logprobs = lp_a},
                            {.t = b, .spec = &spec, .b = &lb, .backward = 1, .logprobs = lp_b}};
    twk_status st = twk_loss_steps(pack, jobs, 2);
    check(st == TWK_OK && jobs[0].st == TWK_OK && jobs[1].st == TWK_OK, "twk_loss_steps with an expert run and a plain run");
    int n_expert = 0;
    double gd = grad_diff(a, ref, &n_expert), ld = fabs(jobs[0].res.loss - res_ref.loss), pd = 0;
    for (int i = 0; i < N; i++) pd = fmax(pd, fabs((double)lp_a[i] - lp_ref[i]));
    printf("     expert run vs in-process: loss %.9g vs %.9g (|d| %.1e), logprobs |d| %.1e, gradients |d| %.1e, "
           "%d expert tensors with gradients\n", jobs[0].res.loss, res_ref.loss, ld, pd, gd, n_expert);
    check(ld == 0 && pd == 0 && gd == 0, "the expert run's loss, logprobs and gradients equal in-process, bit for bit");
    check(n_expert == 8, "the expert stacks' LoRA (gate_up_proj and down_proj, A and B, 2 layers) have gradients");

    twk_loss_job alone = {.t = b_ref, .spec = &spec, .b = &lb, .backward = 1, .logprobs = lp_bref};
    st = twk_loss_steps(pack_ref, &alone, 1);
    int dummy = 0;
    double bd = st == TWK_OK ? grad_diff(b, b_ref, &dummy) : -1;
    check(bd == 0 && jobs[1].res.loss == alone.res.loss, "the plain run equals itself alone through the pack");

    twk_pack_stats ps;
    twk_pack_get_stats(pack, &ps);
    printf("     pack: passes %lld, segments %lld, own_passes %lld\n", (long long)ps.passes, (long long)ps.segments,
           (long long)ps.own_passes);
    check(ps.passes == 1 && ps.segments == 1 && ps.own_passes == 1, "one packed pass of the plain run, one own pass");

    /* a forward-only step (forward / the service's forward) alone through twk_loss_steps */
    twk_loss_job fwd = {.t = a, .spec = &spec, .b = &lb, .backward = 0, .logprobs = lp_a};
    st = twk_loss_steps(pack, &fwd, 1);
    twk_pack_get_stats(pack, &ps);
    check(st == TWK_OK && fwd.st == TWK_OK && fwd.res.loss == res_ref.loss && ps.own_passes == 2 && ps.passes == 1,
          "a forward-only step runs on its own trainer too, same loss");

    /* an RL loss (ppo: a forward, then a backward) of both runs together: the expert run's step
     * equals the same step in-process, bit for bit */
    twk_loss_spec ppo;
    float adv[N], old_lp[N], lp_r[N];
    for (int i = 0; i < N; i++) adv[i] = (float)((i % 5) - 2) * 0.25f, old_lp[i] = lp_ref[i] - 0.01f * (float)(i % 3);
    twk_loss_batch rb = lb;
    rb.in[TWK_IN_ADVANTAGES] = adv;
    rb.in[TWK_IN_LOGPROBS] = old_lp;
    twk_trainer_zero_grad(ref);
    twk_trainer_zero_grad(a);
    twk_trainer_zero_grad(b);
    twk_loss_result rr;
    twk_pack_get_stats(pack, &ps);
    int64_t own0 = ps.own_passes;
    st = twk_loss_spec_init("ppo", &ppo);
    if (st == TWK_OK) st = twk_loss_step(ref, &ppo, &rb, 1, lp_r, &rr);
    twk_loss_job rl[2] = {{.t = b, .spec = &ppo, .b = &rb, .backward = 1}, {.t = a, .spec = &ppo, .b = &rb, .backward = 1}};
    if (st == TWK_OK) st = twk_loss_steps(pack, rl, 2);
    gd = st == TWK_OK && rl[1].st == TWK_OK && rl[0].st == TWK_OK ? grad_diff(a, ref, &n_expert) : -1;
    twk_pack_get_stats(pack, &ps);
    printf("     ppo: loss %.9g vs in-process %.9g, gradients |d| %.1e, own passes %lld\n", rl[1].res.loss, rr.loss, gd,
           (long long)(ps.own_passes - own0));
    check(gd == 0 && rl[1].res.loss == rr.loss && n_expert == 8 && ps.own_passes - own0 == 2,
          "a ppo step (forward + backward, beside a packed run) equals in-process, 2 own passes");

    /* twk_pack_pass refuses it by name */
    twk_batch pb = {0};
    int32_t pos[N], seg[N];
    float w[N];
    for (int s = 0; s < N_SEQS; s++)
        for (int64_t i = off[s]; i < off[s + 1]; i++) pos[i] = (int32_t)(i - off[s]), seg[i] = (int32_t)off[s], w[i] = 1;
    pb = (twk_batch){N, tok, tgt, pos, seg, w};
    twk_pack_seg sg = {.t = a, .b = pb};
    st = twk_pack_pass(pack, 1, &sg, 1);
    check(st == TWK_ERR_UNSUPPORTED && strstr(twk_last_error(), "train_experts"), "twk_pack_pass refuses an expert run by name");
    printf("     %s\n", twk_last_error());

    /* its adapter in PEFT's layout */
    char dir[] = "/tmp/twk_moe_pack_XXXXXX";
    char cfg[256];
    if (mkdtemp(dir)) {
        snprintf(cfg, sizeof cfg, "%s/adapter_config.json", dir);
        st = twk_adapter_save(a, dir, NULL);
        check(st == TWK_OK && file_has(cfg, "\"target_parameters\"") && file_has(cfg, "gate_up_proj") &&
                  file_has(cfg, "down_proj"),
              "the saved adapter lists target_parameters gate_up_proj / down_proj");
        twk_lora_config back;
        check(twk_adapter_read_config(dir, &back) == TWK_OK && back.train_experts && !back.train_router,
              "its config reads back with train_experts on, train_router off");
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0) fails++;
    }

    twk_pack_free(pack);
    twk_pack_free(pack_ref);
    twk_trainer_free(ref);
    twk_trainer_free(a);
    twk_trainer_free(b);
    twk_trainer_free(b_ref);
    twk_model_free(m);
    twk_device_close(dev);
    printf("%s\n", fails ? "FAILED" : "all passed");
    return fails ? 1 : 0;
}
