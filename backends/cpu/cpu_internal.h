/* CPU backend internals: the thread pool, scratch memory and the kernel list. */
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

/* Products below this many multiply-adds (~0.3 ms on one AVX-512 core) run on one thread.
 * OpenBLAS's own threshold (~2.6e5) wakes its threads for products of a few microseconds, where
 * the hand-off costs about what the second thread saves, and after each threaded call they spin
 * (sched_yield) waiting for the next (`twinkle serve` shortens that: cli/main.c). A row of C is
 * the same sum with either count, but OpenBLAS's split of the rows between its threads moves rows
 * inside its kernels' row blocks (Haswell / Zen sum a 12-row block's rows in two orders), so the
 * products over a pass's rows (cpu_sgemm) split them between the pool's threads at
 * TWK_GEMM_ROW_PERIOD multiples instead; OpenBLAS's threads serve sgemv only (attention runs
 * its (segment, head) tasks on the pool, one BLAS thread each). */
#define CPU_BLAS_THREADED_FMAS (1 << 24)
/* cpu_sgemm shares a product's row tiles between the pool's threads (sleeping on a condition
 * variable, never spinning) from this many multiply-adds (~0.07 ms on one Zen core): the packed
 * tiny-model passes of `twinkle serve` (8 runs, 576 rows: q / k / v / o products of 4.7-9.4 M)
 * ran 15% more steps/s with it than at CPU_BLAS_THREADED_FMAS, and 2^19 was slower again. */
#define CPU_POOL_SGEMM_FMAS (1 << 21)
/* Sets OpenBLAS's thread count for a product of m x n x k multiply-adds about to run: 1 below
 * CPU_BLAS_THREADED_FMAS, else the context's threads. Cannot fail. */
void cpu_blas_threads(const cpu_ctx *ctx, int64_t m, int64_t n, int64_t k);

/* C [M, N] = op(A) op(B) + beta C (beta 0 or 1), all f32, row-major, as tiles — 1024 columns (fixed
 * by N), rows in whole TWK_GEMM_ROW_PERIODs (at most 3072; shared evenly between the pool's threads
 * for products of CPU_POOL_SGEMM_FMAS or more) — one single-threaded OpenBLAS sgemm each: a row
 * at a multiple of the period gets the same bits whatever the row count or the thread count.
 * Cannot fail. */
void cpu_sgemm(cpu_ctx *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
               int64_t ldb, float beta, float *C, int64_t ldc);

/* Per-run scratch of at least `bytes`; NULL (error set) on failure. Valid
 * until the next call. */
void *cpu_scratch(cpu_ctx *ctx, size_t bytes);

/* One product C [M, N] = op(A) op(B) of MATMUL's kernels, B f32 or 16-bit (bt, widened to f32 as read).
 * pass_m: the rows of the pass it belongs to, which picks the kernel (a token tile of a pass then
 * gives that pass's rows bit for bit). infer: the product is a sampling plan's (cpu_call.infer),
 * which lets a 16-bit B of few rows take the skinny kernel (kern_matmul16.c). */
typedef struct {
    int ta, tb, infer;
    int64_t pass_m, M, N, K, lda, ldb, ldc;
    const float *A;
    const void *B;
    twk_dtype bt;
    float *C;
} cpu_gemm_args;
/* The scratch floats cpu_gemm needs for g's kernel (0: none). */
int64_t cpu_gemm_work_floats(const cpu_ctx *ctx, const cpu_gemm_args *g);
/* Runs the product; work: cpu_gemm_work_floats(g) floats the caller owns. Cannot fail (dims are
 * checked against the BLAS's int range by the caller). */
void cpu_gemm(cpu_ctx *ctx, const cpu_gemm_args *g, float *work);

/* Rows of A up to which a sampling plan's product over a 16-bit B takes the skinny kernel (a
 * decode step of up to 16 sequences: widening B into panels for sgemm cost 1.8x the f32 step at 16). */
#define CPU_SKINNY_ROWS 16
/* The scratch floats cpu_gemm_skinny needs (A packed when B is transposed; 0 otherwise). */
int64_t cpu_skinny_work_floats(const cpu_gemm_args *g);
/* C = A op(B) for a 16-bit B, !ta, B streamed once and widened in registers (kern_matmul16.c);
 * work: cpu_skinny_work_floats(g) floats. Cannot fail. */
void cpu_gemm_skinny(cpu_ctx *ctx, const cpu_gemm_args *g, float *work);

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
    int infer; /* the plan writes or reads a KV cache: a sampler's plan, no training pass */
    cpu_tensor dst;
    cpu_tensor src[TWK_MAX_SRC];
} cpu_call;

typedef twk_status (*cpu_kernel)(const cpu_call *c);

/* Every CPU kernel: X(OP, function), defined by family in kern_*.c.
 * cpu_backend.c builds its [TWK_OP_COUNT] dispatch table from this list. */
#define CPU_KERNELS(X)                                                                                   \
    X(FILL, cpu_fill) X(PERMUTE, cpu_permute) X(SLICE, cpu_slice) X(SLICE_BACK, cpu_slice_back)         \
    X(CONCAT, cpu_concat) X(BROADCAST, cpu_broadcast) X(SUM_TO, cpu_sum_to) X(ADD, cpu_add)             \
    X(MUL, cpu_mul) X(SCALE, cpu_scale) X(SILU, cpu_silu) X(SILU_BACK, cpu_silu_back)                   \
    X(SWIGLU, cpu_swiglu) X(SWIGLU_BACK, cpu_swiglu_back) X(SUM, cpu_sum) X(MEAN, cpu_mean)             \
    X(WEIGHTED_SUM, cpu_weighted_sum) X(MATMUL, cpu_matmul) X(GET_ROWS, cpu_get_rows)                   \
    X(GET_ROWS_BACK, cpu_get_rows_back) X(RMSNORM, cpu_rmsnorm) X(RMSNORM_BACK_X, cpu_rmsnorm_back_x)   \
    X(RMSNORM_BACK_W, cpu_rmsnorm_back_w) X(ROPE, cpu_rope) X(ATTN, cpu_attn) X(ATTN_LSE, cpu_attn_lse) \
    X(ATTN_BACK, cpu_attn_back) X(LOGPROBS, cpu_logprobs) X(LOGPROBS_BACK, cpu_logprobs_back) X(UNEMBED_LOGPROBS, cpu_unembed_logprobs)           \
    X(UNEMBED_LOGPROBS_BACK, cpu_unembed_logprobs_back) X(UNEMBED_LOGPROBS_DIR, cpu_unembed_logprobs_dir)           \
    X(KV_WRITE, cpu_kv_write) X(ATTN_CACHE, cpu_attn_cache) X(LORA_GATHER, cpu_lora_gather) X(LORA_GATHER_BACK, cpu_lora_gather_back)               \
    X(GELU, cpu_gelu) X(GELU_BACK, cpu_gelu_back) X(TANH, cpu_tanh) X(TANH_BACK, cpu_tanh_back)                                                       \
    X(GRAD_ACC, cpu_grad_acc) X(SQSUM_PARTS, cpu_sqsum_parts) X(GRAD_NORM, cpu_grad_norm)               \
    X(ADAMW, cpu_adamw) X(MOE_TOPK, cpu_moe_topk) X(MOE_GATE, cpu_moe_gate) X(MOE_GATE_BACK, cpu_moe_gate_back)      \
    X(MOE_SORT, cpu_moe_sort) X(MOE_DISPATCH, cpu_moe_dispatch) X(MOE_COMBINE, cpu_moe_combine)                  \
    X(MOE_COMBINE_BACK_W, cpu_moe_combine_back_w) X(MOE_ROUTER_STATS, cpu_moe_router_stats)                     \
    X(MOE_ROUTER_STATS_BACK, cpu_moe_router_stats_back) X(FUSED_EW, cpu_fused_ew) X(RMSNORM_ROPE, cpu_rmsnorm_rope) \
    X(ROPE_RMSNORM_BACK_X, cpu_rope_rmsnorm_back_x)

/* y[0..n) = op(a, b, c)[0..n) for a same-shape elementwise op (add, mul, scale: fp0, silu, gelu,
 * tanh, swiglu, their gradients; swiglu_back's which: ip0): the loop its unfused kernel runs, so
 * kern_fused.c's chains are bit-identical to it. false (nothing written) for any other op. */
bool cpu_ew_span(twk_op op, int ip0, float fp0, float *y, const float *a, const float *b, const float *c, int64_t n);

#define CPU_DECLARE_(op, fn) twk_status fn(const cpu_call *c);
CPU_KERNELS(CPU_DECLARE_)
#undef CPU_DECLARE_

/* LORA_GATHER of a node made by twk_lora_gather_grouped (iparam 1): one product per run of equal
 * slots (kern_grouped.c); TWK_ERR_OOM / TWK_ERR_UNSUPPORTED (dims past the BLAS's int range). */
twk_status cpu_lora_gather_grouped(const cpu_call *c);

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
