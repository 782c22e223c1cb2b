/* Trainer helpers the C tests share: random adapter tensors, every gradient end to end. */
#ifndef TWK_TESTS_TRAINER_UTIL_H
#define TWK_TESTS_TRAINER_UTIL_H

#include <stdint.h>
#include <stdlib.h>

#include "twinkle/twinkle.h"

/* Every trainable tensor of t set to scale * N(0, 1) draws of r (so B != 0 and both A and B get
 * gradients). */
static inline void trainer_randomize(twk_trainer *t, twk_rng *r, double scale) {
    for (int p = 0; p < twk_trainer_param_count(t); p++) {
        int64_t ne = 0;
        const char *name = twk_trainer_param_name(t, p, &ne);
        float *v = malloc((size_t)ne * sizeof *v);
        for (int64_t k = 0; k < ne; k++) v[k] = (float)(scale * twk_rng_normal(r));
        twk_trainer_set(t, name, v, ne);
        free(v);
    }
}

/* Every trainable tensor's gradient, end to end, in a malloc'ed array (*n floats; the caller frees
 * it), then the gradients zeroed. */
static inline float *trainer_take_grads(twk_trainer *t, int64_t *n) {
    *n = 0;
    for (int p = 0; p < twk_trainer_param_count(t); p++) {
        int64_t ne = 0;
        twk_trainer_param_name(t, p, &ne);
        *n += ne;
    }
    float *g = malloc((size_t)*n * sizeof *g);
    int64_t at = 0;
    for (int p = 0; p < twk_trainer_param_count(t); p++) {
        int64_t ne = 0;
        const char *name = twk_trainer_param_name(t, p, &ne);
        twk_trainer_get_grad(t, name, g + at, ne);
        at += ne;
    }
    twk_trainer_zero_grad(t);
    return g;
}

#endif
