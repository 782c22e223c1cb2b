/* twinkle — the op list: the one place every op is named.
 *
 * Owned by graph/; included by hal/ and every backend (a backend sees only
 * hal/ and this list). Each entry: X(ENUM, "name", n_src).
 * n_src is the number of required sources; -1 means variable (see graph.h). */
#ifndef TWINKLE_OPS_H
#define TWINKLE_OPS_H

#include "twinkle/export.h"

#define TWK_OP_LIST(X)                                                        \
    /* leaves: no kernel; their storage is bound or planned */               \
    X(INPUT,          "input",          0)                                    \
    X(PARAM,          "param",          0)                                    \
    X(FILL,           "fill",           0)  /* every element = fparam[0]  */ \
    /* layout (RESHAPE is a view; the others copy) */                        \
    X(RESHAPE,        "reshape",        1)                                    \
    X(PERMUTE,        "permute",        1)  /* iparams = axis order */       \
    X(SLICE,          "slice",          1)  /* axis, start */                \
    X(SLICE_BACK,     "slice_back",     1)  /* zeros with src at axis/start */\
    X(CONCAT,         "concat",         2)  /* along axis */                 \
    X(BROADCAST,      "broadcast",      1)  /* src broadcast to dst shape */ \
    X(SUM_TO,         "sum_to",         1)  /* sum src down to dst shape */  \
    /* elementwise */                                                        \
    X(ADD,            "add",            2)  /* b broadcasts to a */          \
    X(MUL,            "mul",            2)  /* b broadcasts to a */          \
    X(SCALE,          "scale",          1)  /* x * fparam[0] */              \
    X(SILU,           "silu",           1)                                    \
    X(SILU_BACK,      "silu_back",      2)  /* (x, dy) */                    \
    X(SWIGLU,         "swiglu",         2)  /* silu(gate) * up */            \
    X(SWIGLU_BACK,    "swiglu_back",    3)  /* (gate, up, dy); iparam 0: d/dgate, 1: d/dup */ \
    /* reductions */                                                         \
    X(SUM,            "sum",            1)  /* all elements -> [1] */        \
    X(MEAN,           "mean",           1)  /* all elements -> [1] */        \
    X(WEIGHTED_SUM,   "weighted_sum",   2)  /* sum(x * w) -> [1] */          \
    /* linear algebra */                                                     \
    X(MATMUL,         "matmul",         2)  /* iparams: trans_a, trans_b */  \
    /* transformer */                                                        \
    X(GET_ROWS,       "get_rows",       2)  /* (table [V,D], ids [T]) */     \
    X(GET_ROWS_BACK,  "get_rows_back",  2)  /* (dy [T,D], ids [T]) -> [V,D] */\
    X(RMSNORM,        "rmsnorm",        2)  /* (x, w); fparam eps */          \
    X(RMSNORM_BACK_X, "rmsnorm_back_x", 3)  /* (x, w, dy) */                  \
    X(RMSNORM_BACK_W, "rmsnorm_back_w", 2)  /* (x, dy) -> [D]; fparam eps */  \
    X(ROPE,           "rope",           -1) /* (x [T,H,D], pos [T] [, inv_freq [D/2]]) */ \
    X(ATTN,           "attn",           4)  /* (q, k, v, seg_start) */       \
    X(ATTN_LSE,       "attn_lse",       3)  /* (q, k, seg_start) -> [T,Hq] */ \
    X(ATTN_BACK,      "attn_back",      7)  /* (q,k,v,seg,o,dO,lse); iparam 0: which */ \
    X(LOGPROBS,       "logprobs",       2)  /* (logits [T,V], targets [T]) -> [T] */ \
    X(LOGPROBS_BACK,  "logprobs_back",  4)  /* (logits, targets, dy, logprobs) -> [T,V] */ \
    /* decoding with a KV cache (no gradients) */                            \
    X(KV_WRITE,       "kv_write",       3)  /* (cache [R,H,D], x [T,H,D], rows [T]): in place */ \
    X(ATTN_CACHE,     "attn_cache",     5)  /* (q [T,Hq,D], kc, vc [R,Hkv,D], lo [T], hi [T]) */ \
    X(LORA_GATHER,    "lora_gather",    3)  /* (x [T,K], w [S,N,K], slot [T]) -> [T,N]: w[slot[t]] x[t] */

#ifdef __cplusplus
extern "C" {
#endif
TWK_API_BEGIN

typedef enum twk_op {
#define TWK_OP_ENUM_(e, s, n) TWK_OP_##e,
    TWK_OP_LIST(TWK_OP_ENUM_)
#undef TWK_OP_ENUM_
    TWK_OP_COUNT
} twk_op;

/* The op's lower-case name ("matmul"); "?" for an out-of-range value. */
const char *twk_op_name(twk_op op);

TWK_API_END
#ifdef __cplusplus
}
#endif

#endif
