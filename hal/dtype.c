/* Names and sizes of dtypes; the op table's rows (include/twinkle/ops.h). */
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
