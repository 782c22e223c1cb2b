/* CPU backend internals: the thread pool, scratch memory and kernel table. */
#ifndef TWK_CPU_INTERNAL_H
#define TWK_CPU_INTERNAL_H

#include <stdint.h>

#include "twk_backend.h"
#include "twinkle/log.h"

typedef struct cpu_pool cpu_pool;

/* fn(arg, begin, end) over [0, n) in chunks of at least `grain` items, on the
 * pool's threads and the caller. Each item must write only its own outputs:
 * chunks are taken dynamically, so results never depend on thread timing. */
typedef void (*cpu_range_fn)(void *arg, int64_t begin, int64_t end);

/* A pool of n_threads - 1 workers (the caller is the n-th); NULL on failure. */
cpu_pool *cpu_pool_new(int n_threads);
void cpu_pool_free(cpu_pool *p);
int cpu_pool_threads(const cpu_pool *p);
/* Runs fn over [0, n). Serial when n <= grain or the pool has one thread. */
void cpu_parallel_for(cpu_pool *p, int64_t n, int64_t grain, cpu_range_fn fn, void *arg);
/* The index (0..n_threads-1) of the calling thread inside a parallel_for. */
int cpu_thread_index(void);

typedef struct cpu_ctx {
    cpu_pool *pool;
    int n_threads;
    void *scratch;
    size_t scratch_bytes;
    int profile;                 /* TWK_PROFILE=1: time each op, print at close */
    double prof_s[TWK_OP_COUNT];
    long prof_n[TWK_OP_COUNT];
} cpu_ctx;

/* Per-run scratch of at least `bytes`; NULL (error set) on failure. Valid
 * until the next call. */
void *cpu_scratch(cpu_ctx *ctx, size_t bytes);

typedef struct cpu_tensor {
    void *data;
    twk_dtype type;
    int ndim;
    int64_t ne[TWK_MAX_DIMS];
    int64_t nelem;
} cpu_tensor;

typedef struct cpu_call {
    const twk_launch *l;
    cpu_ctx *ctx;
    int64_t ntok;
    cpu_tensor dst;
    cpu_tensor src[TWK_MAX_SRC];
} cpu_call;

typedef twk_status (*cpu_kernel)(const cpu_call *c);

/* Kernels, one per op (grouped by family in kern_*.c). */
twk_status cpu_fill(const cpu_call *c);
twk_status cpu_permute(const cpu_call *c);
twk_status cpu_slice(const cpu_call *c);
twk_status cpu_slice_back(const cpu_call *c);
twk_status cpu_concat(const cpu_call *c);
twk_status cpu_broadcast(const cpu_call *c);
twk_status cpu_sum_to(const cpu_call *c);
twk_status cpu_add(const cpu_call *c);
twk_status cpu_mul(const cpu_call *c);
twk_status cpu_scale(const cpu_call *c);
twk_status cpu_silu(const cpu_call *c);
twk_status cpu_silu_back(const cpu_call *c);
twk_status cpu_swiglu(const cpu_call *c);
twk_status cpu_swiglu_back(const cpu_call *c);
twk_status cpu_sum(const cpu_call *c);
twk_status cpu_mean(const cpu_call *c);
twk_status cpu_weighted_sum(const cpu_call *c);
twk_status cpu_matmul(const cpu_call *c);
twk_status cpu_get_rows(const cpu_call *c);
twk_status cpu_get_rows_back(const cpu_call *c);
twk_status cpu_rmsnorm(const cpu_call *c);
twk_status cpu_rmsnorm_back_x(const cpu_call *c);
twk_status cpu_rmsnorm_back_w(const cpu_call *c);
twk_status cpu_rope(const cpu_call *c);
twk_status cpu_attn(const cpu_call *c);
twk_status cpu_attn_lse(const cpu_call *c);
twk_status cpu_attn_back(const cpu_call *c);
twk_status cpu_logprobs(const cpu_call *c);
twk_status cpu_logprobs_back(const cpu_call *c);
twk_status cpu_kv_write(const cpu_call *c);
twk_status cpu_attn_cache(const cpu_call *c);
twk_status cpu_lora_gather(const cpu_call *c);

/* Reads id i of an i32/i64 tensor. */
static inline int64_t cpu_id_at(const cpu_tensor *t, int64_t i) {
    return t->type == TWK_I64 ? ((const int64_t *)t->data)[i] : ((const int32_t *)t->data)[i];
}

/* Items per task below which a kernel runs serially (thread wake-up costs more). */
#define CPU_GRAIN_ELEMS 16384

/* Elements in dims [from, ndim) of t. */
static inline int64_t cpu_inner(const cpu_tensor *t, int from) {
    int64_t e = 1;
    for (int i = from; i < t->ndim; i++) e *= t->ne[i];
    return e;
}

#endif
