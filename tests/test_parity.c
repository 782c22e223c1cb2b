/* Parity with transformers + PEFT: replays the fixtures that
 * tests/parity/generate.py recorded (no Python needed) — per-token logprobs of
 * the base model and with a LoRA adapter (max abs error <= 1e-4), the loss,
 * every LoRA gradient and, for one model, every full-parameter gradient
 * (relative error ||d|| / ||ref|| <= 1e-3). Measured errors are printed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "../train/safetensors.h"
#include "twinkle/twinkle.h"

#define LOGPROB_TOL 1e-4
#define GRAD_TOL 1e-3

static int fails;

static void report(int ok, const char *model, const char *what, double err, double tol) {
    printf("%s %-7s %-44s err %.2e (tol %.0e)\n", ok ? "ok  " : "FAIL", model, what, err, tol);
    fails += !ok;
}

static float *f32_of(const twk_safetensors *st, const char *name, int64_t *n) {
    const twk_st_tensor *t = twk_st_find(st, name);
    if (!t) return NULL;
    float *d = malloc((size_t)t->nelem * 4 + 4);
    if (twk_st_to_f32(t, d) != TWK_OK) {
        free(d);
        return NULL;
    }
    if (n) *n = t->nelem;
    return d;
}

static double max_abs_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - (double)b[i]));
    return m;
}

static double rel_err(const float *a, const float *ref, int64_t n) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        d += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        r += (double)ref[i] * ref[i];
    }
    return sqrt(d) / fmax(sqrt(r), 1e-30);
}

/* Checks every gradient named prefix.<name> in the fixture; returns the worst error. */
static double check_grads(twk_trainer *t, const twk_safetensors *exp, const char *prefix, int *count) {
    double worst = 0;
    *count = 0;
    for (int i = 0; i < twk_trainer_param_count(t); i++) {
        int64_t n = 0;
        const char *name = twk_trainer_param_name(t, i, &n);
        char key[300];
        snprintf(key, sizeof key, "%s.%s", prefix, name);
        int64_t rn = 0;
        float *ref = f32_of(exp, key, &rn);
        if (!ref || rn != n) {
            printf("FAIL fixture has no %s (%lld elements)\n", key, (long long)n);
            fails++;
            free(ref);
            continue;
        }
        float *g = malloc((size_t)n * 4);
        twk_trainer_get_grad(t, name, g, n);
        double e = rel_err(g, ref, n);
        if (e > worst) worst = e;
        if (e > GRAD_TOL) printf("     %s: rel err %.2e\n", name, e);
        (*count)++;
        free(g);
        free(ref);
    }
    return worst;
}

static void replay(const char *root, const char *model) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/%s", root, model);
    snprintf(path, sizeof path, "%s/expected.json", dir);
    char *text = twk_read_file(path, NULL);
    cJSON *js = text ? cJSON_Parse(text) : NULL;
    twk_host_free(text);
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    twk_safetensors *exp = NULL;
    if (!js || twk_st_open(path, &exp) != TWK_OK) {
        printf("FAIL %s: cannot read the fixture: %s\n", model, twk_last_error());
        fails++;
        cJSON_Delete(js);
        return;
    }
    twk_device *dev = NULL;
    twk_model *m = NULL;
    twk_device_open(getenv("TWK_TEST_DEVICE") ? getenv("TWK_TEST_DEVICE") : "cpu", &dev);
    if (twk_model_load(dir, dev, &m) != TWK_OK) {
        printf("FAIL %s: load: %s\n", model, twk_last_error());
        fails++;
        goto out;
    }
    const cJSON *lj = cJSON_GetObjectItem(js, "lora");
    twk_lora_config lc = twk_lora_default();
    lc.rank = cJSON_GetObjectItem(lj ? lj : js, "r") ? cJSON_GetObjectItem(lj ? lj : js, "r")->valueint : 4;
    lc.alpha = (float)(cJSON_GetObjectItem(lj ? lj : js, "lora_alpha") ? cJSON_GetObjectItem(lj ? lj : js, "lora_alpha")->valuedouble : 8);
    char *all = cJSON_PrintUnformatted(js);
    lc.train_unembed = all && strstr(all, "\"lm_head\"") != NULL; /* the target list names it */
    free(all);
    int64_t n = 0;
    int32_t *ids[4];
    const char *in_names[4] = {"tokens", "targets", "positions", "seg_start"};
    for (int i = 0; i < 4; i++) {
        const twk_st_tensor *t = twk_st_find(exp, in_names[i]);
        ids[i] = t ? (int32_t *)(uintptr_t)t->data : NULL;
        if (t) n = t->nelem;
    }
    float *w = f32_of(exp, "weights", NULL), *lp_base = f32_of(exp, "logprobs_base", NULL),
          *lp_ref = f32_of(exp, "logprobs", NULL), *loss_ref = f32_of(exp, "loss", NULL);
    if (!ids[0] || !ids[1] || !ids[2] || !ids[3] || !w || !lp_base || !lp_ref || !loss_ref) {
        printf("FAIL %s: fixture lacks batch tensors\n", model);
        fails++;
        goto out2;
    }
    twk_batch b = {n, ids[0], ids[1], ids[2], ids[3], w};
    twk_trainer *t = NULL;
    if (twk_trainer_new(m, &lc, n, &t) != TWK_OK) {
        printf("FAIL %s: trainer: %s\n", model, twk_last_error());
        fails++;
        goto out2;
    }
    float *lp = malloc((size_t)n * 4), loss = 0;
    twk_trainer_forward(t, &b, lp, &loss); /* B = 0: the base model */
    double e = max_abs_diff(lp, lp_base, n);
    report(e <= LOGPROB_TOL, model, "base logprobs (adapter B = 0)", e, LOGPROB_TOL);
    /* the fixture's adapter */
    for (int i = 0; i < twk_trainer_param_count(t); i++) {
        int64_t pn = 0, rn = 0;
        const char *name = twk_trainer_param_name(t, i, &pn);
        char key[300];
        snprintf(key, sizeof key, "lora_init.%s", name);
        float *v = f32_of(exp, key, &rn);
        if (!v || rn != pn) {
            printf("FAIL %s: fixture has no %s\n", model, key);
            fails++;
        } else {
            twk_trainer_set(t, name, v, pn);
        }
        free(v);
    }
    twk_status st = twk_trainer_forward_backward(t, &b, lp, &loss);
    if (st != TWK_OK) printf("     %s\n", twk_last_error());
    e = max_abs_diff(lp, lp_ref, n);
    report(st == TWK_OK && e <= LOGPROB_TOL, model, "logprobs with the LoRA adapter", e, LOGPROB_TOL);
    e = fabs(loss - loss_ref[0]) / fmax(1.0, fabs(loss_ref[0]));
    report(e <= LOGPROB_TOL, model, "loss -sum(w * logprobs)", e, LOGPROB_TOL);
    int count = 0;
    e = check_grads(t, exp, "lora_grad", &count);
    char what[96];
    snprintf(what, sizeof what, "%d LoRA gradients (worst)", count);
    report(count > 0 && e <= GRAD_TOL, model, what, e, GRAD_TOL);
    twk_trainer_free(t);
    free(lp);
    if (twk_st_find(exp, "full_grad.model.embed_tokens.weight")) {
        if (twk_trainer_new(m, NULL, n, &t) != TWK_OK) {
            printf("FAIL %s: full trainer: %s\n", model, twk_last_error());
            fails++;
        } else {
            twk_trainer_forward_backward(t, &b, NULL, NULL);
            e = check_grads(t, exp, "full_grad", &count);
            snprintf(what, sizeof what, "%d full-parameter gradients (worst)", count);
            report(count > 0 && e <= GRAD_TOL, model, what, e, GRAD_TOL);
            twk_trainer_free(t);
        }
    }
out2:
    free(w);
    free(lp_base);
    free(lp_ref);
    free(loss_ref);
out:
    twk_model_free(m);
    twk_device_close(dev);
    twk_st_close(exp);
    cJSON_Delete(js);
}

int main(int argc, char **argv) {
    const char *root = argc > 1 ? argv[1] : TWK_PARITY_DIR;
    const char *models[] = {"llama", "qwen2", "qwen3"};
    for (int i = 0; i < 3; i++) replay(root, models[i]);
    printf("%d failures\n", fails);
    return fails ? 1 : 0;
}
