/* FUSED_EW: a chain of same-shape elementwise ops (graph/fuse.c) in one pass over the elements,
 * a block at a time: each step runs its unfused kernel's span (cpu_ew_span) on the block, into a
 * block-sized temporary, so the chain's intermediates never reach memory and every element is
 * computed exactly as the unfused launches compute it. */
#include "cpu_internal.h"

#define FUSED_BLOCK 512 /* elements per block: 8 temporaries of 2 KiB stay in L1 */

typedef struct {
    const cpu_call *c;
    int n_steps;
} fused_job;

static const float *operand(const cpu_call *c, int arg, float tmp[][FUSED_BLOCK], int64_t b) {
    if (arg >= TWK_FUSE_RESULT(0)) return tmp[arg - TWK_FUSE_RESULT(0)];
    return arg < c->l->nsrc ? (const float *)c->src[arg].data + b : NULL;
}

static void fused_blocks(void *arg, int64_t b0, int64_t b1) {
    const fused_job *j = arg;
    const cpu_call *c = j->c;
    float tmp[TWK_MAX_PARAMS][FUSED_BLOCK];
    for (int64_t blk = b0; blk < b1; blk++) {
        int64_t b = blk * FUSED_BLOCK, n = c->dst.nelem - b < FUSED_BLOCK ? c->dst.nelem - b : FUSED_BLOCK;
        for (int k = 0; k < j->n_steps; k++) {
            int32_t s = c->l->ip[k];
            float *y = k == j->n_steps - 1 ? (float *)c->dst.data + b : tmp[k];
            cpu_ew_span(TWK_FUSE_OP(s), TWK_FUSE_IP(s), c->l->fp[k], y, operand(c, TWK_FUSE_ARG(s, 0), tmp, b),
                        operand(c, TWK_FUSE_ARG(s, 1), tmp, b), operand(c, TWK_FUSE_ARG(s, 2), tmp, b), n);
        }
    }
}

twk_status cpu_fused_ew(const cpu_call *c) {
    fused_job j = {c, 0};
    while (j.n_steps < TWK_MAX_PARAMS && c->l->ip[j.n_steps]) {
        int32_t s = c->l->ip[j.n_steps];
        if (!cpu_ew_span(TWK_FUSE_OP(s), 0, 0.0f, NULL, NULL, NULL, NULL, 0))
            return twk_error(TWK_ERR_INVALID_ARG, "cpu: fused_ew '%s': step %d is op %s, not a fusable elementwise op",
                             c->l->name, j.n_steps, twk_op_name(TWK_FUSE_OP(s)));
        j.n_steps++;
    }
    if (!j.n_steps) return twk_error(TWK_ERR_INVALID_ARG, "cpu: fused_ew '%s' has no steps", c->l->name);
    int64_t blocks = (c->dst.nelem + FUSED_BLOCK - 1) / FUSED_BLOCK;
    cpu_parallel_for(c->ctx->pool, blocks, CPU_GRAIN_ELEMS / FUSED_BLOCK + 1, fused_blocks, &j);
    return TWK_OK;
}
