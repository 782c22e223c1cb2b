/* kd_call builders: argument lists and grids for the per-op lowering
 * (kd_lower_*.c). Depends on nothing but kd_internal.h. */
#include <string.h>

#include "kd_internal.h"

void kd_begin(kd_call *c, const char *name) {
    memset(c, 0, sizeof *c);
    c->kernel = name;
}

static kd_arg *next_arg(kd_call *c) {
    /* the kernels' signatures are fixed and below KD_MAX_ARGS; clamp defensively */
    if (c->nargs >= KD_MAX_ARGS) return &c->args[KD_MAX_ARGS - 1];
    kd_arg *a = &c->args[c->nargs++];
    memset(a, 0, sizeof *a);
    return a;
}

void kd_buf(kd_call *c, const twk_launch *l, int t, size_t elem) {
    kd_arg *a = next_arg(c);
    const twk_tensor_desc *d = t < 0 ? &l->dst : &l->src[t];
    a->kind = KD_BUF;
    a->tensor = t;
    a->i64 = (int64_t)(d->offset / elem);
}

void kd_err(kd_call *c) { next_arg(c)->kind = KD_ERR; }

void kd_i32(kd_call *c, int32_t v) {
    kd_arg *a = next_arg(c);
    a->kind = KD_I32;
    a->i32 = v;
}

void kd_i64(kd_call *c, int64_t v) {
    kd_arg *a = next_arg(c);
    a->kind = KD_I64;
    a->i64 = v;
}

void kd_f32(kd_call *c, float v) {
    kd_arg *a = next_arg(c);
    a->kind = KD_F32;
    a->f32 = v;
}

void kd_grid_items(kd_call *c, int64_t items, size_t local) {
    size_t groups = (size_t)((items + (int64_t)local - 1) / (int64_t)local);
    kd_grid_groups(c, (int64_t)(groups ? groups : 1), local);
}

void kd_grid_groups(kd_call *c, int64_t groups, size_t local) {
    c->dims = 1;
    c->local[0] = local;
    c->global[0] = (size_t)groups * local;
    c->local[1] = c->local[2] = c->global[1] = c->global[2] = 1;
}

size_t kd_pow2_local(int64_t n, size_t max) {
    size_t p = 32;
    while (p < max && (int64_t)p < n) p *= 2;
    return p;
}

int64_t kd_dim(const twk_tensor_desc *t, int i, int64_t n) { return twk_desc_dim(t, i, n); }

int64_t kd_nelem(const twk_tensor_desc *t, int64_t n) { return twk_desc_nelem(t, n); }

void kd_pad4(const twk_tensor_desc *t, int64_t n, int64_t d[4]) {
    int off = 4 - t->ndim;
    for (int i = 0; i < 4; i++) d[i] = i < off ? 1 : twk_desc_dim(t, i - off, n);
}
