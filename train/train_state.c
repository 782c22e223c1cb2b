/* Training state on disk: weights (PEFT adapter or full safetensors) plus
 * optimizer_state.safetensors with AdamW moments ("m.<name>", "v.<name>")
 * and the step count. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "safetensors.h"
#include "trainer_internal.h"

int64_t twk_trainer_step(const twk_trainer *t) { return t ? t->step : 0; }
int64_t twk_trainer_capacity(const twk_trainer *t) { return t ? t->capacity : 0; }

const char *twk_trainer_unembed_path(const twk_trainer *t) {
    return !t ? "" : t->dir ? "two-product" : t->fused ? "recompute" : "logits";
}

static twk_status save_full(twk_trainer *t, const char *dir) {
    twk_st_entry *e = twk_host_calloc((size_t)t->n_tp * sizeof *e, "state entries");
    float **d = twk_host_calloc((size_t)t->n_tp * sizeof *d, "state data");
    twk_status st = e && d ? TWK_OK : TWK_ERR_OOM;
    for (int i = 0; st == TWK_OK && i < t->n_tp; i++) {
        named_buf *nb = t->tp[i].nb;
        d[i] = twk_host_alloc(nb_bytes(nb), nb->name);
        if (!d[i]) st = TWK_ERR_OOM;
        else st = twk_buffer_download(t->m->dev, nb->buf, 0, d[i], nb_bytes(nb));
        e[i] = (twk_st_entry){nb->name, TWK_ST_F32, nb->ndim, {nb->ne[0], nb->ne[1]}, d[i]};
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const char *meta[2] = {"format", "pt"};
    if (st == TWK_OK) st = twk_st_write(path, e, t->n_tp, meta, 1);
    for (int i = 0; d && i < t->n_tp; i++) twk_host_free(d[i]);
    twk_host_free(d);
    twk_host_free(e);
    return st;
}

/* The moments come from the device here, at save time only. */
static twk_status save_optimizer(twk_trainer *t, const char *dir) {
    int n = 2 * t->n_tp + 1;
    twk_st_entry *e = twk_host_calloc((size_t)n * sizeof *e, "optimizer entries");
    char (*names)[240] = twk_host_calloc((size_t)n * sizeof *names, "optimizer names");
    float **d = twk_host_calloc((size_t)n * sizeof *d, "optimizer moments");
    twk_status st = e && names && d ? TWK_OK : TWK_ERR_OOM;
    for (int i = 0; st == TWK_OK && i < t->n_tp; i++) {
        named_buf *nb = t->tp[i].nb;
        d[2 * i] = twk_host_alloc(nb_bytes(nb), "adam m");
        d[2 * i + 1] = twk_host_alloc(nb_bytes(nb), "adam v");
        st = d[2 * i] && d[2 * i + 1] ? twk_trainer_moments_get(t, i, d[2 * i], d[2 * i + 1]) : TWK_ERR_OOM;
        snprintf(names[2 * i], sizeof names[0], "m.%s", nb->name);
        snprintf(names[2 * i + 1], sizeof names[0], "v.%s", nb->name);
        e[2 * i] = (twk_st_entry){names[2 * i], TWK_ST_F32, nb->ndim, {nb->ne[0], nb->ne[1]}, d[2 * i]};
        e[2 * i + 1] = (twk_st_entry){names[2 * i + 1], TWK_ST_F32, nb->ndim, {nb->ne[0], nb->ne[1]}, d[2 * i + 1]};
    }
    int64_t step = t->step;
    if (st == TWK_OK) {
        e[n - 1] = (twk_st_entry){"step", TWK_ST_I64, 1, {1}, &step};
        char path[4200];
        snprintf(path, sizeof path, "%s/optimizer_state.safetensors", dir);
        st = twk_st_write(path, e, n, NULL, 0);
    }
    for (int i = 0; d && i < n; i++) twk_host_free(d[i]);
    twk_host_free(d);
    twk_host_free(names);
    twk_host_free(e);
    return st;
}

twk_status twk_trainer_save_state(twk_trainer *t, const char *dir, const char *base_model) {
    if (!t || !dir) return twk_error(TWK_ERR_INVALID_ARG, "save_state: NULL argument");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return twk_error(TWK_ERR_IO, "save_state: cannot create %s: %s", dir, strerror(errno));
    twk_status st = t->lora ? twk_adapter_save(t, dir, base_model) : save_full(t, dir);
    if (st == TWK_OK) st = save_optimizer(t, dir);
    return st;
}

static twk_status load_full(twk_trainer *t, const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    twk_safetensors *sf = NULL;
    twk_status st = twk_st_open(path, &sf);
    for (int i = 0; st == TWK_OK && i < t->n_tp; i++) {
        named_buf *nb = t->tp[i].nb;
        const twk_st_tensor *ten = twk_st_find(sf, nb->name);
        if (!ten || ten->nelem != nb->nelem) {
            st = twk_error(TWK_ERR_INVALID_ARG, "%s: tensor '%s' is missing or has the wrong size", path, nb->name);
            break;
        }
        float *d = twk_host_alloc(nb_bytes(nb), nb->name);
        st = d ? twk_st_to_f32(ten, d) : TWK_ERR_OOM;
        if (st == TWK_OK) st = twk_buffer_upload(t->m->dev, nb->buf, 0, d, nb_bytes(nb));
        twk_host_free(d);
    }
    twk_st_close(sf);
    return st;
}

static twk_status load_optimizer(twk_trainer *t, const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/optimizer_state.safetensors", dir);
    twk_safetensors *sf = NULL;
    twk_status st = twk_st_open(path, &sf);
    if (st != TWK_OK) return st;
    const twk_st_tensor *step = twk_st_find(sf, "step");
    if (!step || step->dtype != TWK_ST_I64 || step->nelem != 1)
        st = twk_error(TWK_ERR_INVALID_ARG, "%s: no I64 'step'", path);
    /* read everything first so a bad file changes nothing */
    float **m = twk_host_calloc((size_t)t->n_tp * sizeof *m, "adam m"), **v = twk_host_calloc((size_t)t->n_tp * sizeof *v, "adam v");
    if (st == TWK_OK && (!m || !v)) st = TWK_ERR_OOM;
    for (int i = 0; st == TWK_OK && i < t->n_tp; i++) {
        named_buf *nb = t->tp[i].nb;
        char key[240];
        for (int k = 0; st == TWK_OK && k < 2; k++) {
            snprintf(key, sizeof key, "%c.%s", k ? 'v' : 'm', nb->name);
            const twk_st_tensor *ten = twk_st_find(sf, key);
            if (!ten || ten->nelem != nb->nelem) {
                st = twk_error(TWK_ERR_INVALID_ARG, "%s: '%s' is missing or has the wrong size", path, key);
                break;
            }
            float *d = twk_host_alloc(nb_bytes(nb), "adam moments");
            if (!d) st = TWK_ERR_OOM;
            else st = twk_st_to_f32(ten, d);
            if (k) v[i] = d;
            else m[i] = d;
        }
    }
    for (int i = 0; st == TWK_OK && i < t->n_tp; i++) st = twk_trainer_moments_set(t, i, m[i], v[i]);
    if (st == TWK_OK) memcpy(&t->step, step->data, 8);
    for (int i = 0; m && v && i < t->n_tp; i++) {
        twk_host_free(m[i]);
        twk_host_free(v[i]);
    }
    twk_host_free(m);
    twk_host_free(v);
    twk_st_close(sf);
    return st;
}

twk_status twk_trainer_load_state(twk_trainer *t, const char *dir, bool with_optimizer) {
    if (!t || !dir) return twk_error(TWK_ERR_INVALID_ARG, "load_state: NULL argument");
    twk_status st = t->lora ? twk_adapter_load(t, dir) : load_full(t, dir);
    if (st != TWK_OK) return st;
    twk_trainer_zero_grad(t);
    if (with_optimizer) return load_optimizer(t, dir);
    t->step = 0;
    return twk_trainer_moments_zero(t);
}
