/* The router's load-balancing loss (config output_router_logits) against transformers 5.24:
 * fixtures/router_aux (tests/parity/generate.py --router-aux) holds, for the qwen3_moe
 * fixture's weights, batch and LoRA init with router_aux_loss_coef 0.1, the loss, transformers'
 * aux_loss (its padded batch with an attention_mask = twinkle's packed batch) and float64
 * gradients of loss + coef * aux (LoRA on the attention), of coef * aux alone (LoRA), and of
 * coef * aux for the full model's router weights. Also: the metric's mean and reset, a
 * cross-entropy loss step, distillation's column passes adding the aux gradient once, packed
 * passes (twk_loss_steps over a pack, the service's path) alone and shared with a second run,
 * recompute / early_grads / the logits path bit-identical, a config without output_router_logits
 * giving NAN, and a non-numeric router_aux_loss_coef refused by name. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../train/safetensors.h"
#include "twinkle/twinkle.h"

#define VALUE_TOL 1e-5 /* relative, loss and aux loss (float32 passes) */
#define GRAD_TOL 1e-4  /* relative L2 norm error (measured ~2e-6) */

static int fails;

static void report(int ok, const char *what, double err, double tol) {
    printf("%s %-58s err %.2e (tol %.0e)\n", ok ? "ok  " : "FAIL", what, err, tol);
    if (!ok) fails++;
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

static double rel_err(const float *a, const float *ref, int64_t n) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        d += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        r += (double)ref[i] * ref[i];
    }
    return sqrt(d) / fmax(sqrt(r), 1e-30);
}

/* The worst relative error of the trainer's gradients against group prefix.<name> (only the
 * names `only` contains, when set); *count of them. */
static double grads_vs(twk_trainer *t, const twk_safetensors *exp, const char *prefix, const char *only, int *count) {
    double worst = 0;
    *count = 0;
    for (int i = 0; i < twk_trainer_param_count(t); i++) {
        int64_t n = 0, rn = 0;
        const char *name = twk_trainer_param_name(t, i, &n);
        if (only && !strstr(name, only)) continue;
        char key[300];
        snprintf(key, sizeof key, "%s.%s", prefix, name);
        float *ref = f32_of(exp, key, &rn), *g = malloc((size_t)n * 4 + 4);
        if (!ref || rn != n || twk_trainer_get_grad(t, name, g, n) != TWK_OK) {
            printf("FAIL no %s (%lld elements) or its gradient\n", key, (long long)n);
            fails++;
        } else {
            double e = rel_err(g, ref, n);
            worst = fmax(worst, e);
            (*count)++;
        }
        free(ref);
        free(g);
    }
    return worst;
}

/* dir: a temp folder with router_aux's config.json and qwen3_moe's weights (a symlink). */
static int make_model_dir(char *dir, size_t cap) {
    snprintf(dir, cap, "/tmp/twk_moe_aux_XXXXXX");
    if (!mkdtemp(dir)) return 0;
    char src[700], dst[700];
    snprintf(src, sizeof src, "%s/router_aux/model/config.json", TWK_PARITY_DIR);
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    size_t len = 0;
    char *text = twk_read_file(src, &len);
    FILE *f = text ? fopen(dst, "wb") : NULL;
    int ok = f && fwrite(text, 1, len, f) == len;
    if (f) ok &= fclose(f) == 0;
    twk_host_free(text);
    snprintf(src, sizeof src, "%s/qwen3_moe/model/model.safetensors", TWK_PARITY_DIR);
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    return ok && symlink(src, dst) == 0;
}

static void remove_model_dir(const char *dir) {
    char p[700];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    rmdir(dir);
}

/* The value of metric key in res (NAN when absent). */
static double metric_of(const twk_loss_result *res, const char *key) {
    for (int i = 0; i < res->n_metrics; i++)
        if (res->keys[i] && !strcmp(res->keys[i], key)) return res->values[i];
    return NAN;
}

int main(void) {
    char path[700], dir[256];
    twk_safetensors *base = NULL, *exp = NULL;
    snprintf(path, sizeof path, "%s/qwen3_moe/expected.safetensors", TWK_PARITY_DIR);
    twk_status st = twk_st_open(path, &base);
    snprintf(path, sizeof path, "%s/router_aux/expected.safetensors", TWK_PARITY_DIR);
    if (st == TWK_OK) st = twk_st_open(path, &exp);
    if (st != TWK_OK || !make_model_dir(dir, sizeof dir)) {
        printf("FAIL cannot read the fixtures: %s\n", twk_last_error());
        return 1;
    }
    const char *dev_name = getenv("TWK_TEST_DEVICE") ? getenv("TWK_TEST_DEVICE") : "cpu";
    int on_cpu = !strncmp(dev_name, "cpu", 3);
    printf("     device %s\n", dev_name);
    twk_device *dev = NULL;
    twk_model *m = NULL;
    if (twk_device_open(dev_name, &dev) != TWK_OK || twk_model_load(dir, dev, &m) != TWK_OK) {
        printf("FAIL load %s: %s\n", dir, twk_last_error());
        return 1;
    }
    const twk_model_config *c = twk_model_cfg(m);
    report(c->router_aux && fabs(c->router_aux_coef - 0.1) < 1e-12, "config: output_router_logits, router_aux_loss_coef 0.1", 0, 0);

    const char *in_names[4] = {"tokens", "targets", "positions", "seg_start"};
    int32_t *ids[4];
    int64_t n = 0;
    for (int i = 0; i < 4; i++) {
        const twk_st_tensor *t = twk_st_find(base, in_names[i]);
        ids[i] = t ? (int32_t *)(uintptr_t)t->data : NULL;
        if (t) n = t->nelem;
    }
    float *w = f32_of(base, "weights", NULL), *zero = calloc((size_t)n, sizeof(float));
    float *loss_ref = f32_of(exp, "loss", NULL), *aux_ref = f32_of(exp, "router_aux_loss", NULL);
    if (!ids[0] || !ids[1] || !ids[2] || !ids[3] || !w || !loss_ref || !aux_ref) {
        printf("FAIL the fixtures lack batch tensors\n");
        return 1;
    }
    twk_batch b = {n, ids[0], ids[1], ids[2], ids[3], w}, b0 = b;
    b0.weights = zero;

    /* LoRA on the attention (r 4, alpha 8) at the fixture's lora_init */
    twk_lora_config lc = twk_lora_default();
    lc.rank = 4;
    lc.alpha = 8;
    lc.train_mlp = lc.train_unembed = 0;
    twk_trainer *t = NULL;
    if (twk_trainer_new(m, &lc, n, &t) != TWK_OK) {
        printf("FAIL trainer: %s\n", twk_last_error());
        return 1;
    }
    for (int i = 0; i < twk_trainer_param_count(t); i++) {
        int64_t pn = 0, rn = 0;
        const char *name = twk_trainer_param_name(t, i, &pn);
        char key[300];
        snprintf(key, sizeof key, "lora_init.%s", name);
        float *v = f32_of(base, key, &rn);
        if (!v || rn != pn || twk_trainer_set(t, name, v, pn) != TWK_OK) {
            printf("FAIL no %s\n", key);
            fails++;
        }
        free(v);
    }
    float loss = 0;
    int count = 0;
    report(isnan(twk_trainer_router_aux_loss(t, true)), "no pass yet: router_aux_loss NAN", 0, 0);
    twk_trainer_zero_grad(t);
    if (twk_trainer_forward_backward(t, &b, NULL, &loss) != TWK_OK) {
        printf("FAIL forward_backward: %s\n", twk_last_error());
        return 1;
    }
    double aux = twk_trainer_router_aux_loss(t, false);
    printf("     loss %.7f (transformers %.7f), router_aux_loss %.7f (transformers %.7f)\n", loss, loss_ref[0], aux, aux_ref[0]);
    report(fabs(loss - loss_ref[0]) <= VALUE_TOL * fabs(loss_ref[0]), "loss = -sum(w lp), the aux loss not in it",
           fabs(loss - loss_ref[0]) / fabs(loss_ref[0]), VALUE_TOL);
    report(fabs(aux - aux_ref[0]) <= VALUE_TOL * fabs(aux_ref[0]), "router_aux_loss = transformers' aux_loss",
           fabs(aux - aux_ref[0]) / fabs(aux_ref[0]), VALUE_TOL);
    double e = grads_vs(t, exp, "objective_grad", NULL, &count);
    report(count == 16 && e <= GRAD_TOL, "LoRA gradients of loss + coef * aux (16 tensors)", e, GRAD_TOL);
    twk_trainer_zero_grad(t);
    if (twk_trainer_forward(t, &b, NULL, NULL) != TWK_OK || twk_trainer_forward_backward(t, &b0, NULL, &loss) != TWK_OK) {
        printf("FAIL forward_backward: %s\n", twk_last_error());
        return 1;
    }
    e = grads_vs(t, exp, "aux_grad", NULL, &count);
    report(count == 16 && e <= GRAD_TOL, "LoRA gradients of coef * aux alone (weights 0)", e, GRAD_TOL);
    double mean = twk_trainer_router_aux_loss(t, true); /* three passes, the same batch and adapter */
    report(fabs(mean - aux) <= 1e-6 * fabs(aux) && isnan(twk_trainer_router_aux_loss(t, false)),
           "router_aux_loss: the mean over passes, then reset", fabs(mean - aux) / fabs(aux), 1e-6);

    /* a cross-entropy loss step (what `twinkle train` and the service run): loss:sum stays the
     * cross-entropy, the trainer's metric holds the aux loss, the gradients are the objective's */
    twk_loss_spec spec;
    int64_t off[8];
    int n_seqs = 0;
    for (int64_t i = 0; i < n && n_seqs < 7; i++)
        if (ids[3][i] == (int32_t)i) off[n_seqs++] = i; /* a segment starts where seg_start is itself */
    off[n_seqs] = n;
    twk_loss_batch lb = {.n_seqs = n_seqs, .offsets = off, .tokens = ids[0], .targets = ids[1]};
    lb.in[TWK_IN_WEIGHTS] = w;
    twk_loss_result res;
    twk_trainer_zero_grad(t);
    if (twk_loss_spec_init("cross_entropy", &spec) != TWK_OK || twk_loss_step(t, &spec, &lb, 1, NULL, &res) != TWK_OK) {
        printf("FAIL loss step: %s\n", twk_last_error());
        return 1;
    }
    aux = twk_trainer_router_aux_loss(t, true);
    report(n_seqs == 3 && fabs(res.loss - loss_ref[0]) <= VALUE_TOL * fabs(loss_ref[0]) &&
               fabs(aux - aux_ref[0]) <= VALUE_TOL * fabs(aux_ref[0]),
           "loss step (3 sequences): loss:sum and router_aux_loss", fabs(aux - aux_ref[0]) / fabs(aux_ref[0]), VALUE_TOL);
    double mr = metric_of(&res, TWK_METRIC_ROUTER_AUX); /* what the service's forward_backward reports */
    report(fabs(mr - aux_ref[0]) <= VALUE_TOL * fabs(aux_ref[0]), "loss step: the result's " TWK_METRIC_ROUTER_AUX " metric",
           fabs(mr - aux_ref[0]) / fabs(aux_ref[0]), VALUE_TOL);
    e = grads_vs(t, exp, "objective_grad", NULL, &count);
    report(count == 16 && e <= GRAD_TOL, "loss step: LoRA gradients of loss + coef * aux", e, GRAD_TOL);

    /* packed passes (the service's path, twk_loss_steps over a pack): alone, and sharing its passes
     * with a second run (a DPO-free forward_kl job of other targets, its own adapter copy): each run's
     * statistics over its own rows only, so the same aux loss and gradients as above */
    twk_pack *pack = NULL;
    twk_trainer *t2 = NULL;
    int32_t *tk2 = malloc((size_t)n * 2 * sizeof *tk2);
    float *tlp2 = malloc((size_t)n * 2 * sizeof *tlp2);
    for (int64_t i = 0; i < n; i++) {
        tk2[2 * i] = (ids[1][i] + 7) % 1000, tk2[2 * i + 1] = (ids[1][i] + 3) % 1000;
        tlp2[2 * i] = -0.25f, tlp2[2 * i + 1] = -2.0f;
    }
    twk_loss_batch db2 = {.n_seqs = n_seqs, .offsets = off, .tokens = ids[0], .k = 2, .targets = tk2};
    db2.in[TWK_IN_TEACHER_LOGPROBS] = tlp2;
    twk_loss_spec spec_kl;
    if (twk_pack_new(m, 4 * n, 4, &pack) != TWK_OK || twk_trainer_new(m, &lc, n, &t2) != TWK_OK ||
        twk_loss_spec_init("cross_entropy", &spec) != TWK_OK || twk_loss_spec_init("forward_kl", &spec_kl) != TWK_OK) {
        printf("FAIL pack: %s\n", twk_last_error());
        return 1;
    }
    for (int i = 0; i < twk_trainer_param_count(t); i++) { /* t2: t's adapter */
        int64_t pn = 0;
        const char *name = twk_trainer_param_name(t, i, &pn);
        float *a = malloc((size_t)pn * 4);
        twk_trainer_get(t, name, a, pn);
        twk_trainer_set(t2, name, a, pn);
        free(a);
    }
    for (int with = 0; with < 2; with++) {
        twk_loss_job jobs[2] = {{.t = t, .spec = &spec, .b = &lb, .backward = 1}, {.t = t2, .spec = &spec_kl, .b = &db2, .backward = 1}};
        twk_trainer_zero_grad(t);
        twk_trainer_zero_grad(t2);
        twk_trainer_router_aux_loss(t, true);
        st = twk_loss_steps(pack, jobs, with + 1);
        if (st != TWK_OK || jobs[0].st != TWK_OK || (with && jobs[1].st != TWK_OK)) {
            printf("FAIL loss_steps: %s %s %s\n", twk_last_error(), jobs[0].err, jobs[1].err);
            return 1;
        }
        aux = twk_trainer_router_aux_loss(t, true);
        double mp = metric_of(&jobs[0].res, TWK_METRIC_ROUTER_AUX);
        report(fabs(mp - aux) <= 1e-12 * fabs(aux), "packed: the job result's " TWK_METRIC_ROUTER_AUX " metric = the trainer's",
               fabs(mp - aux), 1e-12 * fabs(aux));
        e = grads_vs(t, exp, "objective_grad", NULL, &count);
        char what[120];
        snprintf(what, sizeof what, "packed%s: router_aux_loss and LoRA gradients", with ? ", sharing with a 2nd run" : ", alone");
        report(count == 16 && e <= GRAD_TOL && fabs(aux - aux_ref[0]) <= VALUE_TOL * fabs(aux_ref[0]) &&
                   fabs(jobs[0].res.loss - loss_ref[0]) <= VALUE_TOL * fabs(loss_ref[0]),
               what, fmax(e, fabs(aux - aux_ref[0]) / fabs(aux_ref[0])), GRAD_TOL);
        if (with) { /* the second run's aux: over its own rows, the same tokens and adapter -> the same value */
            double a2 = twk_trainer_router_aux_loss(t2, true);
            report(fabs(a2 - aux_ref[0]) <= VALUE_TOL * fabs(aux_ref[0]), "packed: the 2nd run's own router_aux_loss",
                   fabs(a2 - aux_ref[0]) / fabs(aux_ref[0]), VALUE_TOL);
        }
    }
    twk_pack_free(pack);
    twk_trainer_free(t2);
    free(tk2);
    free(tlp2);

    /* distillation runs K = 2 column passes: the aux gradient is added once (weights 0: it alone) */
    int32_t *tk = malloc((size_t)n * 2 * sizeof *tk);
    float *tlp = malloc((size_t)n * 2 * sizeof *tlp);
    for (int64_t i = 0; i < n; i++) {
        tk[2 * i] = ids[1][i], tk[2 * i + 1] = (ids[1][i] + 1) % 1000;
        tlp[2 * i] = -0.5f, tlp[2 * i + 1] = -1.5f;
    }
    twk_loss_batch db = {.n_seqs = n_seqs, .offsets = off, .tokens = ids[0], .k = 2, .targets = tk};
    db.in[TWK_IN_WEIGHTS] = zero;
    db.in[TWK_IN_TEACHER_LOGPROBS] = tlp;
    twk_trainer_zero_grad(t);
    if (twk_loss_spec_init("forward_kl", &spec) != TWK_OK || twk_loss_step(t, &spec, &db, 1, NULL, &res) != TWK_OK) {
        printf("FAIL distillation step: %s\n", twk_last_error());
        return 1;
    }
    e = grads_vs(t, exp, "aux_grad", NULL, &count);
    report(count == 16 && e <= GRAD_TOL, "forward_kl, 2 columns, weights 0: the aux gradient once", e, GRAD_TOL);
    twk_trainer_router_aux_loss(t, true);
    free(tk);
    free(tlp);

    /* recompute, early gradients, the logits path: the same objective, gradients bit-identical */
    const twk_trainer_opts variants[3] = {{.recompute = true}, {.early_grads = true}, {.logits = true}};
    const char *vnames[3] = {"recompute", "early_grads", "logits"};
    for (int v = 0; v < 3; v++) {
        twk_trainer *tv = NULL;
        if (twk_trainer_new_opts(m, &lc, n, &variants[v], &tv) != TWK_OK) {
            printf("FAIL trainer (%s): %s\n", vnames[v], twk_last_error());
            fails++;
            continue;
        }
        int64_t differ = 0, total = 0;
        double gd = 0, gr = 0; /* the gradients' squared difference and norm */
        for (int i = 0; i < twk_trainer_param_count(t); i++) { /* the same adapter as t */
            int64_t pn = 0;
            const char *name = twk_trainer_param_name(t, i, &pn);
            float *a = malloc((size_t)pn * 4);
            if (twk_trainer_get(t, name, a, pn) != TWK_OK || twk_trainer_set(tv, name, a, pn) != TWK_OK) differ++;
            free(a);
        }
        twk_trainer_zero_grad(t);
        twk_trainer_zero_grad(tv);
        float l1 = 0, l2 = 0;
        if (twk_trainer_forward_backward(t, &b, NULL, &l1) != TWK_OK || twk_trainer_forward_backward(tv, &b, NULL, &l2) != TWK_OK)
            differ++;
        for (int i = 0; i < twk_trainer_param_count(t); i++) {
            int64_t pn = 0;
            const char *name = twk_trainer_param_name(t, i, &pn);
            float *g1 = malloc((size_t)pn * 4), *g2 = malloc((size_t)pn * 4);
            twk_trainer_get_grad(t, name, g1, pn);
            if (twk_trainer_get_grad(tv, name, g2, pn) != TWK_OK) differ += pn;
            for (int64_t k = 0; k < pn; k++) {
                differ += g1[k] != g2[k];
                gd += ((double)g1[k] - g2[k]) * ((double)g1[k] - g2[k]);
                gr += (double)g1[k] * g1[k];
            }
            total += pn;
            free(g1);
            free(g2);
        }
        double a1 = twk_trainer_router_aux_loss(t, true), a2 = twk_trainer_router_aux_loss(tv, true);
        char what[96];
        /* a device's fused unembedding, and the CPU's two-product one, round apart from GEMM + logprobs */
        if (v == 2 && !(on_cpu && !strcmp(twk_trainer_unembed_path(t), "recompute"))) {
            double ge = sqrt(gd) / fmax(sqrt(gr), 1e-30), le = fabs((double)l1 - l2) / fabs((double)l1);
            snprintf(what, sizeof what, "%s: aux bit-identical, loss and gradients (%lld)", vnames[v], (long long)total);
            report(a1 == a2 && !isnan(a2) && le <= VALUE_TOL && ge <= GRAD_TOL, what, fmax(ge, le), GRAD_TOL);
        } else {
            snprintf(what, sizeof what, "%s: loss, aux and %lld gradient elements bit-identical", vnames[v], (long long)total);
            report(differ == 0 && l1 == l2 && a1 == a2 && !isnan(a2), what, (double)differ, 0);
        }
        twk_trainer_free(tv);
    }

    /* full training: the router weights' gradient of coef * aux */
    twk_trainer *full = NULL;
    if (twk_trainer_new(m, NULL, n, &full) != TWK_OK) {
        printf("FAIL full trainer: %s\n", twk_last_error());
        return 1;
    }
    twk_trainer_zero_grad(full);
    if (twk_trainer_forward_backward(full, &b0, NULL, &loss) != TWK_OK) {
        printf("FAIL full forward_backward: %s\n", twk_last_error());
        return 1;
    }
    e = grads_vs(full, exp, "aux_router_grad", ".mlp.gate.weight", &count);
    report(count == 2 && e <= GRAD_TOL, "full model: router weights' gradient of coef * aux", e, GRAD_TOL);
    twk_trainer_free(full);
    twk_trainer_free(t);
    twk_model_free(m);

    /* the committed qwen3_moe config (output_router_logits false): no aux loss */
    snprintf(path, sizeof path, "%s/qwen3_moe/model", TWK_PARITY_DIR);
    if (twk_model_load(path, dev, &m) == TWK_OK && twk_trainer_new(m, &lc, n, &t) == TWK_OK) {
        twk_trainer_forward(t, &b, NULL, NULL);
        report(!twk_model_cfg(m)->router_aux && isnan(twk_trainer_router_aux_loss(t, true)),
               "output_router_logits false: no router_aux_loss", 0, 0);
        twk_trainer_free(t);
        twk_model_free(m);
    } else {
        printf("FAIL load qwen3_moe: %s\n", twk_last_error());
        fails++;
    }
    /* a router_aux_loss_coef that is not a number: refused, naming the field */
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t len = 0;
    char *text = twk_read_file(path, &len), *at = text ? strstr(text, "\"router_aux_loss_coef\": 0.1") : NULL;
    FILE *f = at ? fopen(path, "wb") : NULL;
    if (f) {
        fwrite(text, 1, (size_t)(at - text), f);
        fputs("\"router_aux_loss_coef\": \"0.1\"", f);
        fputs(at + strlen("\"router_aux_loss_coef\": 0.1"), f);
        fclose(f);
    }
    twk_host_free(text);
    m = NULL;
    st = f ? twk_model_load(dir, dev, &m) : TWK_OK;
    report(f && st == TWK_ERR_INVALID_ARG && strstr(twk_last_error(), "router_aux_loss_coef"),
           "router_aux_loss_coef \"0.1\" refused naming the field", 0, 0);
    if (m) twk_model_free(m);
    twk_device_close(dev);
    remove_model_dir(dir);
    free(w);
    free(zero);
    free(loss_ref);
    free(aux_ref);
    twk_st_close(exp);
    twk_st_close(base);
    printf("%s\n", fails ? "FAILED" : "all passed");
    return fails ? 1 : 0;
}
