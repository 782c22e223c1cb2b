/* The dtype rule of a launch that every backend shares, read from the op
 * table: copies keep the element size, index sources are i32/i64, the rest f32. */
#include <stdio.h>

#include "twinkle/hal.h"

bool twk_launch_dtypes_ok(const twk_launch *l, const char *backend, char *why, size_t why_len) {
    const twk_op_traits *op = twk_op_info(l->op);
    if (op->kind == TWK_OPK_COPY) {
        size_t es = twk_dtype_size(l->dst.type);
        for (int i = 0; i < l->nsrc; i++)
            if (twk_dtype_size(l->src[i].type) != es || es == 0) {
                if (why) snprintf(why, why_len, "source %d dtype %s differs from %s", i, twk_dtype_name(l->src[i].type),
                                  twk_dtype_name(l->dst.type));
                return false;
            }
        return true;
    }
    if (l->dst.type != TWK_F32) {
        if (why) snprintf(why, why_len, "output dtype %s; %s computes f32", twk_dtype_name(l->dst.type), backend);
        return false;
    }
    for (int i = 0; i < l->nsrc; i++) {
        twk_dtype t = l->src[i].type;
        bool ok = (op->index >> i & 1) ? (t == TWK_I32 || t == TWK_I64) : t == TWK_F32;
        if (!ok) {
            if (why) snprintf(why, why_len, "source %d has dtype %s", i, twk_dtype_name(t));
            return false;
        }
    }
    return true;
}
