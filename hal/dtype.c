/* Names and sizes of dtypes; the op table's rows (include/twinkle/ops.h). */
#include <string.h>

#include "twinkle/hal.h"

const char *twk_dtype_name(twk_dtype t) {
    switch (t) {
    case TWK_F32: return "f32";
    case TWK_I32: return "i32";
    case TWK_I64: return "i64";
    case TWK_BF16: return "bf16";
    case TWK_F16: return "f16";
    default: return "?";
    }
}

size_t twk_dtype_size(twk_dtype t) {
    switch (t) {
    case TWK_F32: return 4;
    case TWK_I32: return 4;
    case TWK_I64: return 8;
    case TWK_BF16: return 2;
    case TWK_F16: return 2;
    default: return 0;
    }
}

int twk_dtype_parse_float(const char *name) {
    static const twk_dtype floats[] = {TWK_F32, TWK_BF16, TWK_F16};
    for (size_t i = 0; name && i < sizeof floats / sizeof floats[0]; i++)
        if (!strcmp(name, twk_dtype_name(floats[i]))) return (int)floats[i];
    return -1;
}

static const twk_op_traits op_table[] = {
#define TWK_OP_ROW_(e, name, nsrc, kind, index, checked, diff, back, tol, ids) \
    {name, nsrc, TWK_OPK_##kind, index, checked, diff, TWK_OP_##back, TWK_TOL_##tol, ids},
    TWK_OP_LIST(TWK_OP_ROW_)
#undef TWK_OP_ROW_
};
_Static_assert(sizeof op_table / sizeof op_table[0] == TWK_OP_COUNT, "one row per op");

static const twk_op_traits no_op = {"?", 0, TWK_OPK_LEAF, 0, 0, 0, TWK_OP_NONE, TWK_TOL_EXACT, TWK_NO_IDS};

const twk_op_traits *twk_op_info(twk_op op) {
    return (int)op < 0 || op >= TWK_OP_COUNT ? &no_op : &op_table[op];
}

const char *twk_op_name(twk_op op) { return twk_op_info(op)->name; }

bool twk_op_has_kernel(twk_op op) {
    twk_op_kind k = twk_op_info(op)->kind;
    return (int)op >= 0 && op < TWK_OP_COUNT && k != TWK_OPK_LEAF && k != TWK_OPK_VIEW;
}

unsigned twk_op_half_srcs(twk_op op) {
    switch (op) {
#define TWK_HALF_CASE_(e, mask) \
    case TWK_OP_##e: return mask;
        TWK_OP_HALF_SRCS(TWK_HALF_CASE_)
#undef TWK_HALF_CASE_
    default: return 0;
    }
}

bool twk_op_index_out(twk_op op) {
    switch (op) {
#define TWK_INDEX_CASE_(e) \
    case TWK_OP_##e: return true;
        TWK_OP_INDEX_OUT(TWK_INDEX_CASE_)
#undef TWK_INDEX_CASE_
    default: return false;
    }
}
