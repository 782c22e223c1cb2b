/* twinkle — the backend author's interface (private: not installed).
 *
 * A backend is a function table plus a context (one per opened device), in
 * the spirit of ggml-backend. Work is a whole plan of kernel launches
 * (twk_hal_plan), prepared once and run many times with a run-time token
 * count; run may be asynchronous until synchronize.
 *
 * Only hal/, graph/ (which lowers graphs to launches), the backends, tests and
 * benchmarks see this header: their targets get the include directory and
 * TWK_BACKEND_AUTHOR (the CMake target twk_backend_api). Anything above them
 * that includes it fails to build.
 *
 * TWK_BACKEND_ABI_VERSION changes whenever a struct here changes layout or a
 * table entry changes meaning; a backend built outside the tree checks it. */
#ifndef TWINKLE_BACKEND_H
#define TWINKLE_BACKEND_H

#ifndef TWK_BACKEND_AUTHOR
#error "twk_backend.h is the private backend interface: only hal/, graph/ and backends/ may include it"
#endif

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "twinkle/hal.h"
#include "twinkle/ops.h"

#define TWK_BACKEND_ABI_VERSION 4

#ifdef __cplusplus
extern "C" {
#endif

#define TWK_MAX_SRC 8
#define TWK_MAX_PARAMS 8

/* Backends embed struct twk_buffer first in their buffer struct so the HAL
 * can check bounds. */
struct twk_buffer {
    size_t size;
    int pool; /* the twk_device_pool it is counted in (set by the HAL after buffer_alloc) */
};

/* ---- tensors as backends see them --------------------------------------- */

/* A tensor: contiguous, row-major, dims ne[0] outermost .. ne[ndim-1]
 * innermost. A dim whose bit is set in `dyn` scales with the run-time token
 * count n: its size is ne[i] * n (ne[i] is then the per-token coefficient).
 * At capacity C the storage reserved is for n = C. */
typedef struct twk_tensor_desc {
    twk_dtype type;
    int ndim;
    int64_t ne[TWK_MAX_DIMS];
    uint8_t dyn;
    twk_buffer *buf;
    size_t offset; /* bytes into buf */
} twk_tensor_desc;

/* Size of dim i for token count n. */
static inline int64_t twk_desc_dim(const twk_tensor_desc *t, int i, int64_t n) {
    return (t->dyn >> i & 1) ? t->ne[i] * n : t->ne[i];
}
/* Number of elements for token count n. */
static inline int64_t twk_desc_nelem(const twk_tensor_desc *t, int64_t n) {
    int64_t e = 1;
    for (int i = 0; i < t->ndim; i++) e *= twk_desc_dim(t, i, n);
    return e;
}

/* One kernel launch: dst = op(src...), with the op's parameters. */
typedef struct twk_launch {
    twk_op op;
    const char *name; /* the node's name, for messages; may be "" */
    int nsrc;
    twk_tensor_desc dst;
    twk_tensor_desc src[TWK_MAX_SRC];
    int32_t ip[TWK_MAX_PARAMS];
    float fp[TWK_MAX_PARAMS];
} twk_launch;

/* TWK_OP_FUSED_EW (graph/fuse.c): a chain of same-shape f32 elementwise ops (add, mul, scale,
 * silu, gelu, tanh, swiglu and their gradients) as one launch. Step k is ip[k] (a 0 ends the
 * list; at most TWK_MAX_PARAMS steps): its op, its operands (0..7: the launch's source i;
 * TWK_FUSE_RESULT(j): step j's result, j < k), its iparam 0 (swiglu_back's `which`); fp[k] is its
 * fparam 0 (scale's factor). The last step's result is dst. Every source has dst's shape, so a
 * backend may treat them all as flat arrays of nelem elements. */
#define TWK_FUSE_STEP(op, a, b, c, i) ((int32_t)((unsigned)(op) | (unsigned)(a) << 8 | (unsigned)(b) << 12 | \
                                                 (unsigned)(c) << 16 | (unsigned)(i) << 20))
#define TWK_FUSE_OP(s) ((twk_op)((unsigned)(s) & 0xffu))
#define TWK_FUSE_ARG(s, k) ((int)((unsigned)(s) >> (8 + 4 * (k)) & 0xfu))
#define TWK_FUSE_IP(s) ((int)((unsigned)(s) >> 20 & 1u))
#define TWK_FUSE_RESULT(j) (8 + (j))

/* The dtype rule every backend shares: copies keep the element size; other ops
 * compute f32 from f32 sources and index sources, and also take bf16 / f16 in
 * the sources of `half` (the backend's half_srcs(l->op), within the op's
 * TWK_OP_HALF_SRCS; KV_WRITE: its cache and output alike). false with a reason
 * naming `backend` in why (may be NULL) otherwise. */
bool twk_launch_dtypes_ok(const twk_launch *l, unsigned half, const char *backend, char *why, size_t why_len);

/* Writes printf-style text to why[why_len] when why is not NULL; returns false (not supported),
 * so a support check can end in `return twk_why(why, why_len, "...", ...)`. */
bool twk_why(char *why, size_t why_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The first bad id of launch l at token count n, worded alike on every backend
 * ("get_rows 'embed': ids[2] = 7 is outside [0, 5)"), by the op table's IDS
 * rule, from host copies of the checked sources (host[i] for each bit i of the
 * op's `checked` mask: the tensor's n-token contents; others may be NULL).
 * true and the message in msg when one is bad; false and "" otherwise. */
bool twk_launch_bad_id(const twk_launch *l, int64_t n, const void *const *host, char *msg, size_t len);

/* A compiled plan as the backend receives it: launches in order. */
struct twk_hal_plan {
    int n_launches;
    const twk_launch *launches;
    int64_t capacity; /* the largest token count run() may be given */
};

/* ---- the backend's function table ---------------------------------------- */

struct twk_backend_iface {
    const char *name; /* "cpu", "opencl", ... */
    /* Number of devices (0 when the runtime or device is missing). */
    int (*device_count)(void);
    twk_status (*device_props)(int index, twk_device_props *out);
    twk_status (*open)(int index, void **ctx);
    void (*close)(void *ctx);

    twk_status (*buffer_alloc)(void *ctx, size_t bytes, twk_buffer **out);
    void (*buffer_free)(void *ctx, twk_buffer *buf);
    twk_status (*upload)(void *ctx, twk_buffer *dst, size_t off, const void *src, size_t bytes);
    twk_status (*download)(void *ctx, const twk_buffer *src, size_t off, void *dst, size_t bytes);
    twk_status (*copy)(void *ctx, twk_buffer *dst, size_t doff, const twk_buffer *src,
                       size_t soff, size_t bytes);
    twk_status (*memset_zero)(void *ctx, twk_buffer *dst, size_t off, size_t bytes);

    /* true if the backend runs this launch (op, dtypes, ranks); else false and,
     * if why != NULL, a reason in why[why_len]. */
    bool (*supports_op)(void *ctx, const twk_launch *l, char *why, size_t why_len);
    /* The backend's kernel table: 1 when it has a kernel for op; else 0 and *why
     * = the reason it declares for not running op (its table's entry), or NULL
     * when the op is simply missing (twk_backend_missing_kernels finds those). */
    int (*op_kernel)(twk_op op, const char **why);
    /* Turns a plan into native objects once; *prepared is passed to run. */
    twk_status (*prepare)(void *ctx, const twk_hal_plan *plan, void **prepared);
    void (*release)(void *ctx, void *prepared);
    /* Runs every launch for token count n (1 <= n <= capacity). */
    twk_status (*run)(void *ctx, void *prepared, const twk_hal_plan *plan, int64_t n);
    twk_status (*synchronize)(void *ctx);
    /* The sources of op (a TWK_SRC mask within twk_op_half_srcs(op)) whose bf16 / f16
     * the backend's kernels read, widening to f32; 0 for none. NULL: no op takes them. */
    unsigned (*half_srcs)(twk_op op);
};

/* Adds a backend to the registry (built-in backends register themselves on
 * first use). TWK_ERR_INVALID_ARG if the name is taken or the table is
 * incomplete. The table must outlive the process. */
twk_status twk_backend_register(const twk_backend_iface *iface);
/* Removes a backend registered by name; TWK_ERR_NOT_FOUND if none. */
twk_status twk_backend_unregister(const char *name);

/* The ops that need a kernel (twk_op_has_kernel), that the CPU backend runs,
 * and that b neither runs nor declares unsupported: their count, their names
 * listed in msg (may be NULL). A backend's declared reasons are listed too,
 * after "declared:", in note (may be NULL). */
int twk_backend_missing_kernels(const twk_backend_iface *b, char *msg, size_t len, char *note, size_t note_len);

/* An opened device's backend table and context. */
const twk_backend_iface *twk_device_backend(const twk_device *dev);
void *twk_device_ctx(const twk_device *dev);

/* The built-in CPU backend's table (always available). */
const twk_backend_iface *twk_cpu_backend(void);

#ifdef __cplusplus
}
#endif
#endif
