/* The dtype rules of a launch that every backend shares: which sources hold
 * indices, which ops only move bytes, and what each op may be given. */
#include <stdio.h>

#include "twk_backend.h"

bool twk_op_src_is_index(twk_op op, int i) {
    switch (op) {
    case TWK_OP_GET_ROWS:
    case TWK_OP_GET_ROWS_BACK:
    case TWK_OP_ROPE:
    case TWK_OP_LOGPROBS:
    case TWK_OP_LOGPROBS_BACK: return i == 1;
    case TWK_OP_ATTN:
    case TWK_OP_ATTN_BACK: return i == 3;
    case TWK_OP_ATTN_LSE: return i == 2;
    case TWK_OP_KV_WRITE: return i == 2;
    case TWK_OP_ATTN_CACHE: return i >= 3;
    case TWK_OP_LORA_GATHER: return i == 2;
    default: return false;
    }
}

bool twk_op_is_copy(twk_op op) {
    return op == TWK_OP_PERMUTE || op == TWK_OP_SLICE || op == TWK_OP_SLICE_BACK || op == TWK_OP_CONCAT;
}

bool twk_launch_dtypes_ok(const twk_launch *l, const char *backend, char *why, size_t why_len) {
    if (twk_op_is_copy(l->op)) {
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
        bool ok = twk_op_src_is_index(l->op, i) ? (t == TWK_I32 || t == TWK_I64) : t == TWK_F32;
        if (!ok) {
            if (why) snprintf(why, why_len, "source %d has dtype %s", i, twk_dtype_name(t));
            return false;
        }
    }
    return true;
}
