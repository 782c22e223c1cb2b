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

static twk_status save_full(twk_trainer *t, const char *dir) {
    twk_st_entry *e = calloc((size_t)t->n_tp, sizeof *e);
    float **d = calloc((size_t)t->n_tp, sizeof *d);
    twk_status st = e && d ? TWK_OK : twk_error(TWK_ERR_OOM, "save_state: out of memory");
    for (int i = 0; st == TWK_OK && i < t->n_tp; i++) {
        named_buf *nb = t->tp[i].nb;
        d[i] = malloc((size_t)nb->nelem * 4);
        if (!d[i]) st = twk_error(TWK_ERR_OOM, "save_state: out of memory");
        else st = twk_buffer_download(t->m->dev, nb->buf, 0, d[i], (size_t)nb->nelem * 4);
        e[i] = (twk_st_entry){nb->name, TWK_ST_F32, nb->ndim, {nb->ne[0], nb->ne[1]}, d[i]};
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const char *meta[2] = {"format", "pt"};
    if (st == TWK_OK) st = twk_st_write(path, e, t->n_tp, meta, 1);
    for (int i = 0; d && i < t->n_tp; i++) free(d[i]);
    free(d);
    free(e);
    return st;
}

static twk_status save_optimizer(twk_trainer *t, const char *dir) {
    int n = 2 * t->n_tp + 1;
    twk_st_entry *e = calloc((size_t)n, sizeof *e);
    char (*names)[240] = calloc((size_t)n, sizeof *names);
    float *zeros = NULL;
    twk_status st = e && names ? TWK_OK : twk_error(TWK_ERR_OOM, "save_state: out of memory");
    int64_t max = 1;
    for (int i = 0; i < t->n_tp; i++)
        if (t->tp[i].nb->nelem > max) max = t->tp[i].nb->nelem;
    if (st == TWK_OK && !(zeros = calloc((size_t)max, 4))) st = twk_error(TWK_ERR_OOM, "save_state: out of memory");
    for (int i = 0; st == TWK_OK && i < t->n_tp; i++) {
        named_buf *nb = t->tp[i].nb;
        snprintf(names[2 * i], sizeof names[0], "m.%s", nb->name);
        snprintf(names[2 * i + 1], sizeof names[0], "v.%s", nb->name);
        e[2 * i] = (twk_st_entry){names[2 * i], TWK_ST_F32, nb->ndim, {nb->ne[0], nb->ne[1]}, t->tp[i].m ? t->tp[i].m : zeros};
        e[2 * i + 1] = (twk_st_entry){names[2 * i + 1], TWK_ST_F32, nb->ndim, {nb->ne[0], nb->ne[1]}, t->tp[i].v ? t->tp[i].v : zeros};
    }
    int64_t step = t->step;
    if (st == TWK_OK) {
        e[n - 1] = (twk_st_entry){"step", TWK_ST_I64, 1, {1}, &step};
        char path[4200];
        snprintf(path, sizeof path, "%s/optimizer_state.safetensors", dir);
        st = twk_st_write(path, e, n, NULL, 0);
    }
    free(zeros);
    free(names);
    free(e);
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
        float *d = malloc((size_t)nb->nelem * 4);
        st = d ? twk_st_to_f32(ten, d) : twk_error(TWK_ERR_OOM, "load_state: out of memory");
        if (st == TWK_OK) st = twk_buffer_upload(t->m->dev, nb->buf, 0, d, (size_t)nb->nelem * 4);
        free(d);
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
    float **m = calloc((size_t)t->n_tp, sizeof *m), **v = calloc((size_t)t->n_tp, sizeof *v);
    if (st == TWK_OK && (!m || !v)) st = twk_error(TWK_ERR_OOM, "load_state: out of memory");
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
            float *d = twk_host_alloc((size_t)nb->nelem * 4, "adam moments");
            if (!d) st = TWK_ERR_OOM;
            else st = twk_st_to_f32(ten, d);
            if (k) v[i] = d;
            else m[i] = d;
        }
    }
    if (st == TWK_OK) {
        for (int i = 0; i < t->n_tp; i++) {
            twk_host_free(t->tp[i].m);
            twk_host_free(t->tp[i].v);
            t->tp[i].m = m[i];
            t->tp[i].v = v[i];
        }
        memcpy(&t->step, step->data, 8);
    } else {
        for (int i = 0; m && v && i < t->n_tp; i++) {
            twk_host_free(m[i]);
            twk_host_free(v[i]);
        }
    }
    free(m);
    free(v);
    twk_st_close(sf);
    return st;
}

twk_status twk_trainer_load_state(twk_trainer *t, const char *dir, bool with_optimizer) {
    if (!t || !dir) return twk_error(TWK_ERR_INVALID_ARG, "load_state: NULL argument");
    twk_status st = t->lora ? twk_adapter_load(t, dir) : load_full(t, dir);
    if (st != TWK_OK) return st;
    twk_trainer_zero_grad(t);
    if (with_optimizer) return load_optimizer(t, dir);
    for (int i = 0; i < t->n_tp; i++) {
        twk_host_free(t->tp[i].m);
        twk_host_free(t->tp[i].v);
        t->tp[i].m = t->tp[i].v = NULL;
    }
    t->step = 0;
    return TWK_OK;
}
