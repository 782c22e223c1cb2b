/* twinkle — hardware abstraction layer: devices, buffers, the backend
 * interface and its registry.
 *
 * A backend is a function table plus a context (one per opened device), in
 * the spirit of ggml-backend. Device memory is not host memory: data moves
 * only through upload/download/copy. Work is a whole plan of kernel launches
 * (twk_hal_plan), prepared once and run many times with a run-time token
 * count; run may be asynchronous until synchronize. */
#ifndef TWINKLE_HAL_H
#define TWINKLE_HAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "twinkle/ops.h"
#include "twinkle/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- host allocator (pluggable, so tests can inject failures) ---------- */

typedef struct twk_allocator {
    void *(*alloc)(void *user, size_t bytes, size_t align); /* NULL = failure */
    void (*free)(void *user, void *ptr);
    void *user;
} twk_allocator;

/* Installs `a` for all later host allocations (NULL restores the default).
 * Not thread-safe against concurrent allocations; set it before work starts. */
void twk_set_allocator(const twk_allocator *a);

/* Aligned host allocation through the current allocator; NULL on failure
 * (and the thread's error is set to TWK_ERR_OOM naming `what`). */
void *twk_host_alloc(size_t bytes, const char *what);
/* Zeroed twk_host_alloc. */
void *twk_host_calloc(size_t bytes, const char *what);
/* Frees memory from twk_host_alloc; NULL is ignored. */
void twk_host_free(void *ptr);

/* ---- tensors as backends see them --------------------------------------- */

typedef enum twk_dtype { TWK_F32 = 0, TWK_I32, TWK_I64, TWK_DTYPE_COUNT } twk_dtype;

/* "f32", "i32", "i64"; "?" otherwise. */
const char *twk_dtype_name(twk_dtype t);
/* Bytes per element; 0 for an unknown dtype. */
size_t twk_dtype_size(twk_dtype t);

#define TWK_MAX_DIMS 4
#define TWK_MAX_SRC 8
#define TWK_MAX_PARAMS 8

typedef struct twk_buffer twk_buffer; /* opaque, owned by a backend */

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

/* The dtype rule every backend shares (from the op table): copies keep the
 * element size; other ops compute f32 from f32 sources and index sources. false with a reason naming
 * `backend` in why (may be NULL) otherwise. */
bool twk_launch_dtypes_ok(const twk_launch *l, const char *backend, char *why, size_t why_len);

/* The first bad id of launch l at token count n, worded alike on every backend
 * ("get_rows 'embed': ids[2] = 7 is outside [0, 5)"), by the op table's IDS
 * rule, from host copies of the checked sources (host[i] for each bit i of the
 * op's `checked` mask: the tensor's n-token contents; others may be NULL).
 * true and the message in msg when one is bad; false and "" otherwise. */
bool twk_launch_bad_id(const twk_launch *l, int64_t n, const void *const *host, char *msg, size_t len);

/* A compiled plan as the backend receives it: launches in order. */
typedef struct twk_hal_plan {
    int n_launches;
    const twk_launch *launches;
    int64_t capacity; /* the largest token count run() may be given */
} twk_hal_plan;

/* ---- devices and backends ------------------------------------------------ */

typedef struct twk_device_props {
    char name[128];       /* e.g. "AMD EPYC 9R14 (2 threads)" */
    char kind[16];        /* "cpu", "gpu", ... */
    uint64_t memory_bytes; /* total device memory; 0 if unknown */
    int compute_units;    /* cores / SMs / CUs */
    int max_threads;      /* threads the backend will use (CPU) */
} twk_device_props;

typedef struct twk_device twk_device; /* an opened device: backend + context */

typedef struct twk_backend_iface {
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
} twk_backend_iface;

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

/* Number of registered backends, and the i-th one (NULL past the end). */
int twk_backend_count(void);
const twk_backend_iface *twk_backend_get(int i);
/* The backend named `name`, or NULL. */
const twk_backend_iface *twk_backend_find(const char *name);

/* Opens a device by spec "cpu", "opencl:1", ... (index 0 by default).
 * TWK_ERR_NOT_FOUND names the backend or index when absent. */
twk_status twk_device_open(const char *spec, twk_device **out);
void twk_device_close(twk_device *dev);

const twk_backend_iface *twk_device_backend(const twk_device *dev);
void *twk_device_ctx(const twk_device *dev);
/* "cpu:0". */
const char *twk_device_spec(const twk_device *dev);

/* Buffers on a device; every call returns TWK_OK or an error with message. */
twk_status twk_buffer_alloc(twk_device *dev, size_t bytes, twk_buffer **out);
void twk_buffer_free(twk_device *dev, twk_buffer *buf);
twk_status twk_buffer_upload(twk_device *dev, twk_buffer *dst, size_t off, const void *src,
                             size_t bytes);
twk_status twk_buffer_download(twk_device *dev, const twk_buffer *src, size_t off, void *dst,
                               size_t bytes);
twk_status twk_buffer_copy(twk_device *dev, twk_buffer *dst, size_t doff,
                           const twk_buffer *src, size_t soff, size_t bytes);
twk_status twk_buffer_zero(twk_device *dev, twk_buffer *dst, size_t off, size_t bytes);
/* Size in bytes the buffer was allocated with. Backends embed struct twk_buffer
 * first in their buffer struct so the HAL can check bounds. */
size_t twk_buffer_size(const twk_buffer *buf);

struct twk_buffer {
    size_t size;
};

/* Waits for all queued work on the device. */
twk_status twk_device_synchronize(twk_device *dev);

/* Seconds on a monotonic clock (for timing; never fails). */
double twk_now(void);

/* The built-in CPU backend's table (always available). */
const twk_backend_iface *twk_cpu_backend(void);

#ifdef __cplusplus
}
#endif
#endif
