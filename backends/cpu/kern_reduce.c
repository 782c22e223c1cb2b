/* Whole-tensor reductions to one value. Partial sums over fixed slices are
 * combined in order, so results do not depend on thread timing. */
#include "cpu_internal.h"

#define REDUCE_SLICES 64

typedef struct {
    const float *x, *w;
    int64_t n;
    double part[REDUCE_SLICES];
} reduce_job;

static void reduce_slices(void *arg, int64_t s0, int64_t s1) {
    reduce_job *j = arg;
    for (int64_t s = s0; s < s1; s++) {
        int64_t b = j->n * s / REDUCE_SLICES, e = j->n * (s + 1) / REDUCE_SLICES;
        double acc = 0;
        if (j->w)
            for (int64_t i = b; i < e; i++) acc += (double)j->x[i] * (double)j->w[i];
        else
            for (int64_t i = b; i < e; i++) acc += j->x[i];
        j->part[s] = acc;
    }
}

static double reduce_all(const cpu_call *c, const float *w) {
    reduce_job j = {.x = c->src[0].data, .w = w, .n = c->src[0].nelem};
    int64_t grain = c->src[0].nelem >= CPU_GRAIN_ELEMS ? 1 : REDUCE_SLICES;
    cpu_parallel_for(c->ctx->pool, REDUCE_SLICES, grain, reduce_slices, &j);
    double acc = 0;
    for (int s = 0; s < REDUCE_SLICES; s++) acc += j.part[s];
    return acc;
}

twk_status cpu_sum(const cpu_call *c) {
    ((float *)c->dst.data)[0] = (float)reduce_all(c, NULL);
    return TWK_OK;
}

twk_status cpu_mean(const cpu_call *c) {
    ((float *)c->dst.data)[0] = (float)(reduce_all(c, NULL) / (double)c->src[0].nelem);
    return TWK_OK;
}

twk_status cpu_weighted_sum(const cpu_call *c) {
    ((float *)c->dst.data)[0] = (float)reduce_all(c, c->src[1].data);
    return TWK_OK;
}
