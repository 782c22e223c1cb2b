/* Names and sizes of dtypes and ops. */
#include "twinkle/hal.h"

const char *twk_dtype_name(twk_dtype t) {
    switch (t) {
    case TWK_F32: return "f32";
    case TWK_I32: return "i32";
    case TWK_I64: return "i64";
    default: return "?";
    }
}

size_t twk_dtype_size(twk_dtype t) {
    switch (t) {
    case TWK_F32: return 4;
    case TWK_I32: return 4;
    case TWK_I64: return 8;
    default: return 0;
    }
}

const char *twk_op_name(twk_op op) {
    static const char *const names[] = {
#define TWK_OP_NAME_(e, s, n) s,
        TWK_OP_LIST(TWK_OP_NAME_)
#undef TWK_OP_NAME_
    };
    if ((int)op < 0 || op >= TWK_OP_COUNT) return "?";
    return names[op];
}
