/* The training step's gradients and optimizer on the device: one flat
 * accumulator (every trainable tensor at its offset) that the backward plan
 * adds each pass into (GRAD_ACC), AdamW moments beside it, and the
 * optimizer plan — global norm in two stages, clipping, AdamW — compiled
 * once, its hyper-parameters a small run-time input. After the model is
 * loaded a step moves only the batch and what the caller asks back. */
#include <string.h>

#include "trainer_internal.h"

#define OPT_ALIGN 64   /* elements: each tensor starts 256 bytes into the flat buffers */
#define OPT_PARTS 256  /* slices of the norm's first stage */

twk_status twk_trainer_grads_init(twk_trainer *t) {
    if (t->n_slots) { /* a packed trainer: its pass reads the slots' gradients themselves (lora_pack.c); no
                         accumulators, no moments, no optimizer */
        for (int i = 0; i < t->n_tp; i++) {
            t->tp[i].acc = t->tp[i].acc_op = -1;
            twk_graph_output(t->g, t->tp[i].grad);
        }
        twk_status st = twk_graph_status(t->g);
        return st == TWK_OK ? TWK_OK : twk_error(st, "trainer: %s", twk_graph_error(t->g));
    }
    int64_t n = 0;
    for (int i = 0; i < t->n_tp; i++) {
        t->tp[i].off = n;
        n += (t->tp[i].nb->nelem + OPT_ALIGN - 1) / OPT_ALIGN * OPT_ALIGN;
    }
    t->flat_n = n ? n : 1;
    size_t bytes = (size_t)t->flat_n * sizeof(float);
    twk_buffer **bufs[3] = {&t->grad_acc, &t->adam_m, &t->adam_v};
    for (int k = 0; k < 3 && !t->dry; k++) { /* a dry trainer (memplan.c): the graph only */
        twk_status st = twk_buffer_alloc(t->m->dev, bytes, bufs[k]);
        if (st == TWK_OK) st = twk_buffer_zero(t->m->dev, *bufs[k], 0, bytes);
        if (st != TWK_OK) return st;
    }
    for (int i = 0; i < t->n_tp; i++) {
        tparam *p = &t->tp[i];
        p->acc = twk_param(t->g, "grad_acc", p->nb->ndim, p->nb->ne, false);
        p->acc_op = twk_grad_acc(t->g, p->acc, p->grad);
        twk_graph_output(t->g, p->acc_op);
    }
    twk_status st = twk_graph_status(t->g);
    return st == TWK_OK ? TWK_OK : twk_error(st, "trainer: %s", twk_graph_error(t->g));
}

int twk_trainer_grad_bindings(const twk_trainer *t, twk_binding *b) {
    if (t->n_slots) return 0; /* a packed trainer: none (grads_init) */
    for (int i = 0; i < t->n_tp; i++) b[i] = (twk_binding){t->tp[i].acc, t->grad_acc, (size_t)t->tp[i].off * sizeof(float)};
    return t->n_tp;
}

twk_status twk_trainer_optim_plan(twk_trainer *t) {
    if (t->n_slots) return TWK_OK; /* a packed trainer has no optimizer: each run steps its own */
    twk_graph *g = t->g_opt = twk_graph_new();
    int nb = 1 + 4 * t->n_tp;
    twk_binding *b = twk_host_alloc((size_t)nb * sizeof *b, "optimizer bindings");
    if (!g || !b) {
        twk_host_free(b);
        return TWK_ERR_OOM;
    }
    int64_t hn[1] = {TWK_HYPER_N}, fn[1] = {t->flat_n};
    t->opt_hyper = twk_input(g, "hyper", TWK_F32, 1, hn);
    twk_id flat = twk_param(g, "grad_flat", 1, fn, false);
    b[0] = (twk_binding){flat, t->grad_acc, 0};
    int parts = t->flat_n < OPT_PARTS ? (int)t->flat_n : OPT_PARTS;
    t->opt_norm = twk_grad_norm(g, twk_sqsum_parts(g, flat, parts), t->opt_hyper);
    twk_node_set_name(g, t->opt_norm, "grad_norm");
    twk_graph_output(g, t->opt_norm);
    for (int i = 0; i < t->n_tp; i++) {
        named_buf *w = t->tp[i].nb;
        size_t off = (size_t)t->tp[i].off * sizeof(float);
        twk_id wi = twk_param(g, w->name, w->ndim, w->ne, false), gi = twk_param(g, "grad", w->ndim, w->ne, false);
        twk_id mi = twk_param(g, "adam_m", w->ndim, w->ne, false), vi = twk_param(g, "adam_v", w->ndim, w->ne, false);
        b[1 + 4 * i] = (twk_binding){wi, w->buf, 0};
        b[2 + 4 * i] = (twk_binding){gi, t->grad_acc, off};
        b[3 + 4 * i] = (twk_binding){mi, t->adam_m, off};
        b[4 + 4 * i] = (twk_binding){vi, t->adam_v, off};
        twk_graph_output(g, twk_adamw(g, wi, gi, mi, vi, t->opt_hyper, t->opt_norm));
    }
    twk_status st = twk_graph_status(g);
    if (st != TWK_OK) st = twk_error(st, "optimizer plan: %s", twk_graph_error(g));
    else st = twk_plan_compile(g, t->m->dev, 1, b, nb, &t->opt);
    twk_host_free(b);
    return st;
}

twk_status twk_trainer_grads_to_device(twk_trainer *t) {
    if (!t->grads_on_host) return TWK_OK;
    twk_status st = twk_buffer_upload(t->m->dev, t->grad_acc, 0, t->grad_host, (size_t)t->flat_n * sizeof(float));
    if (st == TWK_OK) t->grads_on_host = 0;
    return st;
}

void twk_trainer_grads_free(twk_trainer *t) {
    twk_plan_free(t->opt);
    twk_graph_free(t->g_opt);
    twk_buffer_free(t->m->dev, t->grad_acc);
    twk_buffer_free(t->m->dev, t->adam_m);
    twk_buffer_free(t->m->dev, t->adam_v);
    twk_host_free(t->grad_host);
    twk_trainer_grad_hook_free(t);
}

/* The i-th tensor's range in the flat buffers, or NULL when there is none (a sampler). */
static const tparam *flat_tp(const twk_trainer *t, int i, size_t *off, size_t *bytes) {
    if (!t || !t->grad_acc || i < 0 || i >= t->n_tp) return NULL;
    *off = (size_t)t->tp[i].off * sizeof(float);
    *bytes = nb_bytes(t->tp[i].nb);
    return &t->tp[i];
}

twk_status twk_trainer_moments_get(twk_trainer *t, int i, float *m, float *v) {
    size_t off, bytes;
    if (!flat_tp(t, i, &off, &bytes)) return twk_error(TWK_ERR_STATE, "trainer: no optimizer state here");
    twk_status st = twk_buffer_download(t->m->dev, t->adam_m, off, m, bytes);
    return st == TWK_OK ? twk_buffer_download(t->m->dev, t->adam_v, off, v, bytes) : st;
}

twk_status twk_trainer_moments_set(twk_trainer *t, int i, const float *m, const float *v) {
    size_t off, bytes;
    if (!flat_tp(t, i, &off, &bytes)) return twk_error(TWK_ERR_STATE, "trainer: no optimizer state here");
    twk_status st = twk_buffer_upload(t->m->dev, t->adam_m, off, m, bytes);
    return st == TWK_OK ? twk_buffer_upload(t->m->dev, t->adam_v, off, v, bytes) : st;
}

twk_status twk_trainer_moments_zero(twk_trainer *t) {
    if (!t->adam_m) return TWK_OK;
    size_t bytes = (size_t)t->flat_n * sizeof(float);
    twk_status st = twk_buffer_zero(t->m->dev, t->adam_m, 0, bytes);
    return st == TWK_OK ? twk_buffer_zero(t->m->dev, t->adam_v, 0, bytes) : st;
}

twk_status twk_trainer_get_grad(twk_trainer *t, const char *name, float *dst, int64_t nelem) {
    for (int i = 0; t && name && i < t->n_tp; i++) {
        size_t off, bytes;
        if (strcmp(t->tp[i].nb->name, name)) continue;
        if (t->tp[i].nb->nelem != nelem)
            return twk_error(TWK_ERR_INVALID_ARG, "trainer: '%s' has %lld elements, not %lld", name,
                             (long long)t->tp[i].nb->nelem, (long long)nelem);
        if (!flat_tp(t, i, &off, &bytes)) return twk_error(TWK_ERR_STATE, "trainer: '%s' has no gradient here (a sampler)", name);
        if (t->grads_on_host) {
            memcpy(dst, t->grad_host + t->tp[i].off, bytes);
            return TWK_OK;
        }
        return twk_buffer_download(t->m->dev, t->grad_acc, off, dst, bytes);
    }
    return twk_error(TWK_ERR_NOT_FOUND, "trainer: no trainable tensor '%s'", name ? name : "(null)");
}

float *twk_trainer_grad_data(twk_trainer *t, int i, int64_t *nelem) {
    size_t off, bytes;
    int ok = flat_tp(t, i, &off, &bytes) != NULL;
    if (ok && !t->grads_on_host) { /* the whole accumulator comes to the host once */
        size_t all = (size_t)t->flat_n * sizeof(float);
        if (!t->grad_host) t->grad_host = twk_host_alloc(all, "gradient host copy");
        ok = t->grad_host && twk_buffer_download(t->m->dev, t->grad_acc, 0, t->grad_host, all) == TWK_OK;
        t->grads_on_host = ok;
    }
    if (nelem) *nelem = ok ? t->tp[i].nb->nelem : 0;
    return ok ? t->grad_host + t->tp[i].off : NULL;
}

float *twk_trainer_grad_host(twk_trainer *t, int i, int64_t *nelem) {
    size_t off, bytes;
    int ok = flat_tp(t, i, &off, &bytes) && t->grad_host;
    if (nelem) *nelem = ok ? t->tp[i].nb->nelem : 0;
    return ok ? t->grad_host + t->tp[i].off : NULL;
}

void twk_trainer_zero_grad(twk_trainer *t) {
    if (!t || !t->grad_acc) return;
    t->grads_on_host = 0;
    twk_buffer_zero(t->m->dev, t->grad_acc, 0, (size_t)t->flat_n * sizeof(float));
}
