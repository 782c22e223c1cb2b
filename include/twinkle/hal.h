/* twinkle — hardware abstraction layer as a program embedding the engine sees
 * it: devices, buffers on them, the host allocator, dtypes.
 *
 * Backends (CPU, OpenCL, Vulkan, CUDA) are found by name; their function table,
 * the insides of buffers, launches and plans are the backend author's interface
 * (hal/twk_backend.h in the source tree, not installed). Device memory is not
 * host memory: data moves only through upload/download/copy.
 *
 * Thread-safety: the registry functions (twk_backend_*, twk_device_open) may be
 * called from any thread. An opened twk_device and the buffers on it belong to
 * one thread at a time: calls on one device must not run concurrently; different
 * devices may be used from different threads. twk_set_allocator is not
 * thread-safe; call it before any work starts. */
#ifndef TWINKLE_HAL_H
#define TWINKLE_HAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "twinkle/export.h"
#include "twinkle/ops.h"
#include "twinkle/status.h"

#ifdef __cplusplus
extern "C" {
#endif
TWK_API_BEGIN

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
/* Grows or shrinks a twk_host_alloc block of old_bytes to new_bytes (ptr NULL: a new block),
 * keeping its first min(old, new) bytes; NULL on failure, ptr then untouched. */
void *twk_host_realloc(void *ptr, size_t old_bytes, size_t new_bytes, const char *what);
/* A copy of the string s through the allocator; NULL on failure. */
char *twk_host_strdup(const char *s, const char *what);
/* Frees memory from twk_host_alloc; NULL is ignored. */
void twk_host_free(void *ptr);
/* Bytes the default allocator holds now (usable sizes of its live blocks, each with the small
 * header that records its pool); blocks of an allocator installed with twk_set_allocator are not
 * counted. The sum of twk_host_pool_bytes over every pool. Any thread. */
size_t twk_host_bytes_in_use(void);

/* Host memory pools: every block is counted in the pool that was this thread's current one when it
 * was allocated (twk_host_realloc keeps the old block's pool), so the pools sum exactly to
 * twk_host_bytes_in_use. */
typedef enum twk_host_pool {
    TWK_HPOOL_OTHER = 0,       /* "other": everything not tagged below */
    TWK_HPOOL_ADAPTER_COPIES,  /* "adapter_copies": host copies of adapters (snapshots, evicted samplers) */
    TWK_HPOOL_REQUESTS,        /* "requests": request and answer bodies, their decoded forms, results held */
    TWK_HPOOL_DEVICE_BUFFERS,  /* "device_buffers": the buffers of a device that lives in host memory (CPU) */
    TWK_HPOOL_COUNT
} twk_host_pool;
/* Makes p this thread's current host pool; returns the one it replaces (to restore). An
 * out-of-range p means TWK_HPOOL_OTHER. Never fails. */
twk_host_pool twk_host_pool_enter(twk_host_pool p);
/* twk_host_alloc charged to pool p whatever this thread's current pool is; NULL on failure. */
void *twk_host_pool_alloc(twk_host_pool p, size_t bytes, const char *what);
/* Bytes the default allocator holds in pool p (0 for an out-of-range p). Any thread. */
size_t twk_host_pool_bytes(twk_host_pool p);
/* Every pool's bytes into out[TWK_HPOOL_COUNT]; returns their sum, the total as of these reads
 * (report it beside them and the pools add up to it exactly). */
size_t twk_host_pool_snapshot(size_t out[TWK_HPOOL_COUNT]);
/* The pool's name above; "?" for an out-of-range p. */
const char *twk_host_pool_name(twk_host_pool p);

/* ---- element types ------------------------------------------------------- */

/* TWK_BF16 and TWK_F16 hold frozen weights and KV caches (the 2-byte encodings, host byte
 * order); kernels widen them to f32 and accumulate in f32. */
typedef enum twk_dtype { TWK_F32 = 0, TWK_I32, TWK_I64, TWK_BF16, TWK_F16, TWK_DTYPE_COUNT } twk_dtype;

/* "f32", "i32", "i64", "bf16", "f16"; "?" otherwise. */
const char *twk_dtype_name(twk_dtype t);
/* Bytes per element; 0 for an unknown dtype. */
size_t twk_dtype_size(twk_dtype t);
/* The float dtype named "f32", "bf16" or "f16"; -1 for any other name (NULL included). */
int twk_dtype_parse_float(const char *name);
/* Whether t is a 16-bit float (bf16 or f16). */
static inline int twk_dtype_is_half(twk_dtype t) { return t == TWK_BF16 || t == TWK_F16; }

/* One value between f32 and bf16 / f16: widening is exact; narrowing rounds to
 * nearest even, NaN stays a quiet NaN, f16 overflows to infinity. */
float twk_bf16_to_f32(uint16_t h);
uint16_t twk_f32_to_bf16(float f);
float twk_f16_to_f32(uint16_t h);
uint16_t twk_f32_to_f16(float f);
/* n values of a float dtype (f32, bf16, f16) to f32 / from f32; src and dst must not
 * overlap, except a narrowing in place (dst == src). TWK_ERR_DTYPE for another dtype. */
twk_status twk_dtype_to_f32(twk_dtype t, const void *src, float *dst, int64_t n);
twk_status twk_dtype_from_f32(twk_dtype t, const float *src, void *dst, int64_t n);
/* Rounds n f32 values in place to the values dtype t holds (f32: unchanged). TWK_ERR_DTYPE for a
 * non-float t. */
twk_status twk_dtype_round(twk_dtype t, float *x, int64_t n);

/* The largest tensor rank. */
#define TWK_MAX_DIMS 4

/* ---- opaque handles ------------------------------------------------------ */

typedef struct twk_buffer twk_buffer;               /* device memory, owned by a backend */
typedef struct twk_device twk_device;               /* an opened device: backend + context */
typedef struct twk_backend_iface twk_backend_iface; /* a registered backend */
typedef struct twk_hal_plan twk_hal_plan;           /* a plan as a backend receives it */

/* ---- backends and devices ------------------------------------------------ */

typedef struct twk_device_props {
    char name[128];       /* e.g. "AMD EPYC 9R14 (2 threads)" */
    char kind[16];        /* "cpu", "gpu", ... */
    uint64_t memory_bytes; /* total device memory; 0 if unknown */
    int compute_units;    /* cores / SMs / CUs */
    int max_threads;      /* threads the backend will use (CPU) */
    int gemm_row_period;  /* a product's row keeps its bits wherever it sits at a multiple of this many rows
                             in a product of a multiple of it (a divisor of TWK_GEMM_ROW_PERIOD, twinkle/ops.h);
                             0 when the backend does not know a smaller one than TWK_GEMM_ROW_PERIOD */
} twk_device_props;

/* Number of registered backends, and the i-th one (NULL past the end). */
int twk_backend_count(void);
const twk_backend_iface *twk_backend_get(int i);
/* The backend named `name`, or NULL. */
const twk_backend_iface *twk_backend_find(const char *name);
/* The backend's name ("cpu", "opencl", ...); "" for NULL. */
const char *twk_backend_name(const twk_backend_iface *b);
/* Its number of devices (0 when the runtime or device is missing: twk_last_error
 * may then give the reason). */
int twk_backend_device_count(const twk_backend_iface *b);
/* Properties of its device `index`; TWK_ERR_INVALID_ARG / the backend's error otherwise. */
twk_status twk_backend_device_props(const twk_backend_iface *b, int index, twk_device_props *out);

/* Opens a device by spec "cpu", "opencl:1", ... (index 0 by default).
 * TWK_ERR_NOT_FOUND names the backend or index when absent. */
twk_status twk_device_open(const char *spec, twk_device **out);
void twk_device_close(twk_device *dev);
/* "cpu:0". */
const char *twk_device_spec(const twk_device *dev);
/* Properties of an opened device; the backend's error otherwise. */
twk_status twk_device_get_props(const twk_device *dev, twk_device_props *out);

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
/* Size in bytes the buffer was allocated with (0 for NULL). */
size_t twk_buffer_size(const twk_buffer *buf);
/* Bytes of the buffers now allocated on dev through twk_buffer_alloc (0 for NULL). Any thread. */
size_t twk_device_buffer_bytes(const twk_device *dev);

/* Device memory pools: every buffer is counted in the pool that was this thread's current one when
 * twk_buffer_alloc made it, so on each device the pools sum exactly to twk_device_buffer_bytes. */
typedef enum twk_device_pool {
    TWK_DPOOL_OTHER = 0,         /* "other": everything not tagged below */
    TWK_DPOOL_WEIGHTS,           /* "weights": base model weights */
    TWK_DPOOL_ADAPTERS,          /* "adapters": trainers' LoRA adapters, gradient accumulators, AdamW moments */
    TWK_DPOOL_SAMPLER_ADAPTERS,  /* "sampler_adapters": samplers' adapters (one, or stacked slots) */
    TWK_DPOOL_PACK_SLOTS,        /* "pack_slots": a packed pass's stacked adapter slots and their gradients */
    TWK_DPOOL_ACTIVATIONS,       /* "activations": plan arenas (activations, intermediates) and plan inputs */
    TWK_DPOOL_KV_CACHE,          /* "kv_cache": samplers' KV caches */
    TWK_DPOOL_COUNT
} twk_device_pool;
/* Makes p this thread's current device pool; returns the one it replaces (to restore). An
 * out-of-range p means TWK_DPOOL_OTHER. Never fails. */
twk_device_pool twk_device_pool_enter(twk_device_pool p);
/* Bytes of dev's buffers in pool p (0 for NULL or an out-of-range p). Any thread. */
size_t twk_device_pool_bytes(const twk_device *dev, twk_device_pool p);
/* Every pool's bytes on dev into out[TWK_DPOOL_COUNT] (zeros for NULL); returns their sum, the
 * total as of these reads. */
size_t twk_device_pool_snapshot(const twk_device *dev, size_t out[TWK_DPOOL_COUNT]);
/* The pool's name above; "?" for an out-of-range p. */
const char *twk_device_pool_name(twk_device_pool p);

/* Data moved between the host and a backend's devices through twk_buffer_upload and
 * twk_buffer_download (plan writes and reads go through them), counted per backend since the
 * process started or the last reset. A backend's own control words (the per-launch error words
 * GPU backends read after a run) are not data and are not counted. */
typedef struct twk_transfer_stats {
    uint64_t upload_bytes, download_bytes;
    uint64_t uploads, downloads; /* calls */
} twk_transfer_stats;

/* The counters of backend b (all backends together when b is NULL); zeros for an unregistered b. */
twk_transfer_stats twk_backend_transfers(const twk_backend_iface *b);
/* Sets backend b's counters (every backend's when b is NULL) to zero. */
void twk_backend_transfers_reset(const twk_backend_iface *b);
/* The device's allocation counters: bytes of its live buffers and their peak since it was
 * opened (or since the last reset_peak, which sets the peak to the live bytes); 0 for NULL. */
void twk_device_memory(twk_device *dev, uint64_t *live, uint64_t *peak, bool reset_peak);

/* The sources of op (a TWK_SRC mask within twk_op_half_srcs) whose bf16 / f16 the device's
 * kernels read; 0 for NULL, an op without 16-bit sources, or a backend without those kernels. */
unsigned twk_device_half_srcs(const twk_device *dev, twk_op op);
/* Whether the device's backend has a kernel for op (its kernel table); false for NULL. */
bool twk_device_has_op(const twk_device *dev, twk_op op);
/* Waits for all queued work on the device. */
twk_status twk_device_synchronize(twk_device *dev);

/* Seconds on a monotonic clock (for timing; never fails). */
double twk_now(void);

TWK_API_END
#ifdef __cplusplus
}
#endif
#endif
