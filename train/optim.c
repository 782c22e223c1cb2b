/* AdamW equal to torch.optim.AdamW after torch.nn.utils.clip_grad_norm_:
 * the device step (the trainer's optimizer plan, train/optim_plan.c) and
 * the host reference it must equal (twk_adamw_host). Both take their
 * constants from adam_hyper. */
#include <math.h>
#include <string.h>

#include "trainer_internal.h"

twk_adam_params twk_adam_default(void) {
    twk_adam_params p = {.learning_rate = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-12f,
                         .weight_decay = 0.0f, .grad_clip_norm = 0.0f};
    return p;
}

static twk_status adam_check(const twk_adam_params *p) {
    if (!(p->learning_rate >= 0) || !isfinite(p->learning_rate))
        return twk_error(TWK_ERR_INVALID_ARG, "optim_step: learning_rate %g must be finite and >= 0", (double)p->learning_rate);
    if (!(p->beta1 >= 0 && p->beta1 < 1)) return twk_error(TWK_ERR_INVALID_ARG, "optim_step: beta1 %g must be in [0, 1)", (double)p->beta1);
    if (!(p->beta2 >= 0 && p->beta2 < 1)) return twk_error(TWK_ERR_INVALID_ARG, "optim_step: beta2 %g must be in [0, 1)", (double)p->beta2);
    if (!(p->eps > 0)) return twk_error(TWK_ERR_INVALID_ARG, "optim_step: eps %g must be > 0", (double)p->eps);
    if (!(p->weight_decay >= 0) || !isfinite(p->weight_decay))
        return twk_error(TWK_ERR_INVALID_ARG, "optim_step: weight_decay %g must be finite and >= 0", (double)p->weight_decay);
    if (!(p->grad_clip_norm >= 0) || !isfinite(p->grad_clip_norm))
        return twk_error(TWK_ERR_INVALID_ARG, "optim_step: grad_clip_norm %g must be finite and >= 0", (double)p->grad_clip_norm);
    return TWK_OK;
}

/* The constants of step number `step` (ops.h's twk_hyper vector). */
static void adam_hyper(const twk_adam_params *p, int64_t step, float h[TWK_HYPER_N]) {
    float b1 = p->beta1, b2 = p->beta2, lr = p->learning_rate;
    float c1 = 1.0f - powf(b1, (float)step), c2 = 1.0f - powf(b2, (float)step);
    memset(h, 0, TWK_HYPER_N * sizeof *h);
    h[TWK_HYPER_CLIP] = p->grad_clip_norm;
    h[TWK_HYPER_BETA1] = b1;
    h[TWK_HYPER_BETA2] = b2;
    h[TWK_HYPER_EPS] = p->eps;
    h[TWK_HYPER_STEP_SIZE] = lr / c1;
    h[TWK_HYPER_C2_SQRT] = sqrtf(c2);
    h[TWK_HYPER_DECAY] = 1.0f - lr * p->weight_decay;
}

twk_status twk_adamw_host(float *const *w, const float *const *g, float *const *m, float *const *v, const int64_t *n,
                          int count, const twk_adam_params *p, int64_t step, float *grad_norm) {
    if (!w || !g || !m || !v || !n || count < 0 || !p || step < 1)
        return twk_error(TWK_ERR_INVALID_ARG, "adamw_host: NULL argument or step < 1");
    twk_status st = adam_check(p);
    if (st != TWK_OK) return st;
    double ss = 0;
    for (int i = 0; i < count; i++)
        for (int64_t k = 0; k < n[i]; k++) ss += (double)g[i][k] * g[i][k];
    double norm = sqrt(ss);
    if (grad_norm) *grad_norm = (float)norm;
    if (!isfinite(norm)) return twk_error(TWK_ERR_RANGE, "optim_step: the gradient is not finite (norm %g)", norm);
    /* torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied when < 1 */
    float clip = 1.0f;
    if (p->grad_clip_norm > 0) {
        float coef = (float)(p->grad_clip_norm / (norm + 1e-6));
        if (coef < 1.0f) clip = coef;
    }
    float h[TWK_HYPER_N];
    adam_hyper(p, step, h);
    float b1 = h[TWK_HYPER_BETA1], b2 = h[TWK_HYPER_BETA2], eps = h[TWK_HYPER_EPS];
    float step_size = h[TWK_HYPER_STEP_SIZE], c2_sqrt = h[TWK_HYPER_C2_SQRT], decay = h[TWK_HYPER_DECAY];
    for (int i = 0; i < count; i++)
        for (int64_t k = 0; k < n[i]; k++) {
            float gk = g[i][k] * clip;
            w[i][k] *= decay;
            m[i][k] = b1 * m[i][k] + (1 - b1) * gk;
            v[i][k] = b2 * v[i][k] + (1 - b2) * gk * gk;
            float denom = sqrtf(v[i][k]) / c2_sqrt + eps;
            w[i][k] -= step_size * m[i][k] / denom;
        }
    return TWK_OK;
}

twk_status twk_trainer_optim_step(twk_trainer *t, const twk_adam_params *p, float *grad_norm) {
    if (!t || !p) return twk_error(TWK_ERR_INVALID_ARG, "optim_step: NULL argument");
    twk_status st = adam_check(p);
    if (st != TWK_OK) return st;
    if (!t->opt) return twk_error(TWK_ERR_STATE, "optim_step: a sampler has no optimizer");
    float h[TWK_HYPER_N], norm[2];
    adam_hyper(p, t->step + 1, h);
    st = twk_trainer_grads_to_device(t);
    if (st == TWK_OK) st = twk_plan_write(t->opt, t->opt_hyper, 1, h, sizeof h);
    if (st == TWK_OK) st = twk_plan_run(t->opt, 1);
    if (st == TWK_OK) st = twk_plan_read(t->opt, t->opt_norm, 1, norm, sizeof norm);
    if (st != TWK_OK) return st;
    if (grad_norm) *grad_norm = norm[0];
    /* the plan changed nothing (gradients kept, as the reference does) */
    if (!isfinite(norm[0])) return twk_error(TWK_ERR_RANGE, "optim_step: the gradient is not finite (norm %g)", (double)norm[0]);
    t->step++;
    return TWK_OK;
}
