/* FUSED_EW (graph/fuse.c's elementwise chains) on fused.comp: one dispatch whose push constants
 * hold the step table (written when the plan's command buffer is recorded), the sources at
 * bindings 1..7. Each map is computed by the expression of its unfused shader (ew_maps.glsl). */
#include <stdarg.h>
#include <stdio.h>

#include "vk_internal.h"

/* fused.comp's code of a map (0: not one it runs); swiglu_back's which picks 5 or 6 */
static int fused_code(twk_op op, int which) {
    switch (op) {
    case TWK_OP_SCALE: return 1;
    case TWK_OP_SILU: return 2;
    case TWK_OP_SILU_BACK: return 3;
    case TWK_OP_SWIGLU: return 4;
    case TWK_OP_SWIGLU_BACK: return which ? 6 : 5;
    case TWK_OP_GELU: return 7;
    case TWK_OP_GELU_BACK: return 8;
    case TWK_OP_TANH: return 9;
    case TWK_OP_TANH_BACK: return 10;
    case TWK_OP_ADD: return 11;
    case TWK_OP_MUL: return 12;
    default: return 0;
    }
}

bool vk_fused_ok(const twk_launch *l, char *why, size_t why_len) {
    if (l->nsrc < 1 || l->nsrc > VK_FUSED_MAX_SRC)
        return twk_why(why, why_len, "fused_ew with %d sources (fused.comp binds 1..%d)", l->nsrc, VK_FUSED_MAX_SRC);
    int k = 0;
    for (; k < TWK_MAX_PARAMS && l->ip[k]; k++) {
        int32_t st = l->ip[k];
        twk_op op = TWK_FUSE_OP(st);
        bool bad = !fused_code(op, 0);
        for (int j = 0; !bad && j < 3 && j < twk_op_info(op)->nsrc; j++) {
            int a = TWK_FUSE_ARG(st, j);
            bad = a >= TWK_FUSE_RESULT(0) ? a - TWK_FUSE_RESULT(0) >= k : a >= l->nsrc;
        }
        if (bad) return twk_why(why, why_len, "fused_ew step %d (%s) is not one fused.comp runs", k, twk_op_name(op));
    }
    return k ? true : twk_why(why, why_len, "fused_ew with no steps");
}

int vk_lower_fused(const vk_ctx *c, const twk_launch *l, int64_t ny, vk_dispatch *d, int *k) {
    if (!vk_fused_ok(l, NULL, 0)) {
        twk_error(TWK_ERR_UNSUPPORTED, "vulkan: fused_ew '%s' is not a chain fused.comp runs", l->name);
        return -1;
    }
    vk_dispatch *x = vk_next_dispatch(d, k, VKS_FUSED, 128, 0);
    x->bind[0] = VKB_DST;
    for (int i = 0; i < l->nsrc; i++) x->bind[1 + i] = i;
    x->p[0] = (int32_t)ny;
    x->p[1] = l->nsrc;
    for (int s = 0; s < TWK_MAX_PARAMS && l->ip[s]; s++) {
        int32_t st = l->ip[s];
        unsigned w = (unsigned)fused_code(TWK_FUSE_OP(st), TWK_FUSE_IP(st));
        for (int j = 0; j < 3; j++) w |= (unsigned)TWK_FUSE_ARG(st, j) << (8 + 4 * j);
        x->p[2 + s] = (int32_t)w;
        x->fp[s] = l->fp[s];
    }
    int64_t g = (ny + 127) / 128;
    x->groups[0] = g < 1 ? 1u : g > (int64_t)c->max_groups ? c->max_groups : (uint32_t)g;
    return 0;
}
