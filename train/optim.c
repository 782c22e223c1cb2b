/* AdamW equal to torch.optim.AdamW after torch.nn.utils.clip_grad_norm_,
 * over a trainer's accumulated gradients. */
#include <math.h>
#include <string.h>

#include "trainer_internal.h"

twk_adam_params twk_adam_default(void) {
    twk_adam_params p = {.learning_rate = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-12f,
                         .weight_decay = 0.0f, .grad_clip_norm = 0.0f};
    return p;
}

twk_status twk_trainer_optim_step(twk_trainer *t, const twk_adam_params *p, float *grad_norm) {
    if (!t || !p) return twk_error(TWK_ERR_INVALID_ARG, "optim_step: NULL argument");
    if (!(p->learning_rate >= 0) || !isfinite(p->learning_rate))
        return twk_error(TWK_ERR_INVALID_ARG, "optim_step: learning_rate %g must be finite and >= 0", (double)p->learning_rate);
    if (!(p->beta1 >= 0 && p->beta1 < 1)) return twk_error(TWK_ERR_INVALID_ARG, "optim_step: beta1 %g must be in [0, 1)", (double)p->beta1);
    if (!(p->beta2 >= 0 && p->beta2 < 1)) return twk_error(TWK_ERR_INVALID_ARG, "optim_step: beta2 %g must be in [0, 1)", (double)p->beta2);
    if (!(p->eps > 0)) return twk_error(TWK_ERR_INVALID_ARG, "optim_step: eps %g must be > 0", (double)p->eps);
    if (!(p->weight_decay >= 0) || !isfinite(p->weight_decay))
        return twk_error(TWK_ERR_INVALID_ARG, "optim_step: weight_decay %g must be finite and >= 0", (double)p->weight_decay);
    if (!(p->grad_clip_norm >= 0) || !isfinite(p->grad_clip_norm))
        return twk_error(TWK_ERR_INVALID_ARG, "optim_step: grad_clip_norm %g must be finite and >= 0", (double)p->grad_clip_norm);
    double ss = 0;
    for (int i = 0; i < t->n_tp; i++)
        for (int64_t k = 0; k < t->tp[i].nb->nelem; k++) ss += (double)t->tp[i].acc[k] * t->tp[i].acc[k];
    double norm = sqrt(ss);
    if (grad_norm) *grad_norm = (float)norm;
    if (!isfinite(norm)) return twk_error(TWK_ERR_RANGE, "optim_step: the gradient is not finite (norm %g)", norm);
    /* torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied when < 1 */
    float clip = 1.0f;
    if (p->grad_clip_norm > 0) {
        float coef = (float)(p->grad_clip_norm / (norm + 1e-6));
        if (coef < 1.0f) clip = coef;
    }
    for (int i = 0; i < t->n_tp; i++) {
        tparam *tp = &t->tp[i];
        if (!tp->m) {
            tp->m = twk_host_calloc(nb_bytes(tp->nb), "adam m");
            tp->v = twk_host_calloc(nb_bytes(tp->nb), "adam v");
            if (!tp->m || !tp->v) return TWK_ERR_OOM;
        }
    }
    t->step++;
    float b1 = p->beta1, b2 = p->beta2, lr = p->learning_rate;
    float c1 = 1.0f - powf(b1, (float)t->step), c2 = 1.0f - powf(b2, (float)t->step);
    float step_size = lr / c1, c2_sqrt = sqrtf(c2), decay = 1.0f - lr * p->weight_decay;
    twk_status st = TWK_OK;
    for (int i = 0; i < t->n_tp && st == TWK_OK; i++) {
        tparam *tp = &t->tp[i];
        int64_t n = tp->nb->nelem;
        float *w = twk_host_alloc((size_t)n * sizeof *w, "optimizer weights");
        if (!w) return TWK_ERR_OOM;
        st = twk_buffer_download(t->m->dev, tp->nb->buf, 0, w, nb_bytes(tp->nb));
        for (int64_t k = 0; st == TWK_OK && k < n; k++) {
            float g = tp->acc[k] * clip;
            w[k] *= decay;
            tp->m[k] = b1 * tp->m[k] + (1 - b1) * g;
            tp->v[k] = b2 * tp->v[k] + (1 - b2) * g * g;
            float denom = sqrtf(tp->v[k]) / c2_sqrt + p->eps;
            w[k] -= step_size * tp->m[k] / denom;
        }
        if (st == TWK_OK) st = twk_buffer_upload(t->m->dev, tp->nb->buf, 0, w, nb_bytes(tp->nb));
        twk_host_free(w);
    }
    twk_trainer_zero_grad(t);
    return st;
}

