/* Layout kernels that copy: permute, slice, slice_back and concat. They move
 * elements of any dtype by size (4 or 8 bytes). */
#include <string.h>

#include "cpu_internal.h"

typedef struct {
    const cpu_call *c;
    int64_t O[4];  /* output dims, padded to 4 */
    int64_t st[4]; /* input stride for each output dim */
    size_t es;
} perm_job;

static void perm_rows(void *arg, int64_t r0, int64_t r1) {
    const perm_job *j = arg;
    const unsigned char *x = j->c->src[0].data;
    unsigned char *y = j->c->dst.data;
    int64_t inner = j->O[3], s3 = j->st[3];
    for (int64_t r = r0; r < r1; r++) {
        int64_t i2 = r % j->O[2], i1 = (r / j->O[2]) % j->O[1], i0 = r / (j->O[2] * j->O[1]);
        int64_t base = i0 * j->st[0] + i1 * j->st[1] + i2 * j->st[2];
        if (j->es == 4) {
            const float *xs = (const float *)x + base;
            float *yr = (float *)y + r * inner;
            for (int64_t k = 0; k < inner; k++) yr[k] = xs[k * s3];
        } else {
            const int64_t *xs = (const int64_t *)x + base;
            int64_t *yr = (int64_t *)y + r * inner;
            for (int64_t k = 0; k < inner; k++) yr[k] = xs[k * s3];
        }
    }
}

twk_status cpu_permute(const cpu_call *c) {
    perm_job j = {.c = c, .es = twk_dtype_size(c->dst.type)};
    const cpu_tensor *x = &c->src[0];
    int nd = x->ndim, off = 4 - nd;
    int64_t in_st[TWK_MAX_DIMS];
    in_st[nd - 1] = 1;
    for (int i = nd - 2; i >= 0; i--) in_st[i] = in_st[i + 1] * x->ne[i + 1];
    for (int i = 0; i < 4; i++) {
        if (i < off) {
            j.O[i] = 1;
            j.st[i] = 0;
        } else {
            int p = c->l->ip[i - off];
            j.O[i] = x->ne[p];
            j.st[i] = in_st[p];
        }
    }
    int64_t rows = j.O[0] * j.O[1] * j.O[2];
    cpu_parallel_for(c->ctx->pool, rows, CPU_GRAIN_ELEMS / (j.O[3] ? j.O[3] : 1) + 1, perm_rows, &j);
    return TWK_OK;
}

/* Copies blocks between two tensors that differ only in the size of `axis`:
 * for every outer index, `len` rows of `inner` elements move from src at
 * src_start to dst at dst_start. */
static void copy_axis(const cpu_call *c, const cpu_tensor *src, int axis, int64_t src_start,
                      int64_t dst_start, int64_t len) {
    size_t es = twk_dtype_size(c->dst.type);
    int64_t outer = 1;
    for (int i = 0; i < axis; i++) outer *= c->dst.ne[i];
    int64_t inner = cpu_inner(&c->dst, axis + 1);
    int64_t dst_axis = c->dst.ne[axis], src_axis = src->ne[axis];
    const unsigned char *x = src->data;
    unsigned char *y = c->dst.data;
    size_t block = (size_t)(len * inner) * es;
    for (int64_t o = 0; o < outer; o++)
        memcpy(y + (size_t)((o * dst_axis + dst_start) * inner) * es,
               x + (size_t)((o * src_axis + src_start) * inner) * es, block);
}

twk_status cpu_slice(const cpu_call *c) {
    int axis = c->l->ip[0];
    copy_axis(c, &c->src[0], axis, c->l->ip[1], 0, c->dst.ne[axis]);
    return TWK_OK;
}

twk_status cpu_slice_back(const cpu_call *c) {
    int axis = c->l->ip[0];
    memset(c->dst.data, 0, (size_t)c->dst.nelem * twk_dtype_size(c->dst.type));
    copy_axis(c, &c->src[0], axis, 0, c->l->ip[1], c->src[0].ne[axis]);
    return TWK_OK;
}

twk_status cpu_concat(const cpu_call *c) {
    int axis = c->l->ip[0];
    copy_axis(c, &c->src[0], axis, 0, 0, c->src[0].ne[axis]);
    copy_axis(c, &c->src[1], axis, 0, c->src[0].ne[axis], c->src[1].ne[axis]);
    return TWK_OK;
}
