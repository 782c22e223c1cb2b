/* twinkle — API-neutral kernel launches, shared by the OpenCL and CUDA
 * backends. Both compile the same kernel sources (kernels/<family>.cl, written in
 * the dialect of kd_prelude_*.h) and take the same per-op decisions here:
 * which kernel, which arguments, which grid. A backend only spells the
 * launch in its API (clEnqueueNDRangeKernel / cuLaunchKernel) and runs GEMM
 * through its BLAS library (CLBlast / cuBLAS).
 *
 * Sees only hal/ and the op list. */
#ifndef TWK_KD_H
#define TWK_KD_H

#include <stddef.h>
#include <stdint.h>

#include "twk_backend.h"

#define KD_MAX_ARGS 24
#define KD_MAX_CALLS 4

typedef enum kd_arg_kind {
    KD_BUF,  /* a tensor's buffer + element offset: `tensor` = -1 dst, 0.. src index; passed as a pointer
                argument followed by an i64 element offset (kernels take (GLOBAL T *p, long p_off)).
                kd_lower computes the offset: `i64` = desc.offset / sizeof(T), T the kernel's element
                type (ids of either width are read as int words, so i64 tensors get offset / 4) */
    KD_ERR,  /* the backend's error words, passed like a buffer: (GLOBAL int *err, long err_off); the
                backend picks err_off (e.g. one word per launch of the plan) and zeroes the words
                before a run; kernels store a nonzero KD_ERR_* code at err[err_off] on bad input */
    KD_I32,
    KD_I64,
    KD_F32,
    KD_SCRATCH, /* the backend's f32 scratch buffer of the plan (a widened weight panel), passed like a
                   buffer with `i64` as its element offset (kd_widen_call) */
} kd_arg_kind;

typedef struct kd_arg {
    kd_arg_kind kind;
    int tensor;   /* KD_BUF: -1 = dst, i = src[i] */
    int32_t i32;
    int64_t i64;
    float f32;
} kd_arg;

/* One kernel launch: a 1-, 2- or 3-D grid of work-groups of `local` items. */
typedef struct kd_call {
    const char *kernel; /* the kernel's name in the sources */
    int nargs;
    kd_arg args[KD_MAX_ARGS];
    int dims;
    size_t global[3]; /* total work items per dim (a multiple of local) */
    size_t local[3];
} kd_call;

/* A matrix product the backend hands to its BLAS: C = op(A) op(B), row-major,
 * batched with strides in elements (batch 1 for rank 2). A = src[0], B = src[1],
 * C = dst; their buffer offsets (desc.offset / 4 elements) are added by the
 * backend. */
typedef struct kd_gemm {
    int trans_a, trans_b;
    int64_t m, n, k, batch;
    int64_t lda, ldb, ldc;
    int64_t stride_a, stride_b, stride_c;
    /* a 16-bit B (a frozen weight; batch 1): b_half is its dtype (TWK_BF16, TWK_F16; 0 for f32).
     * B is read as panels of panel_rows of its b_rows stored rows of ldb elements, each widened
     * into the scratch (kd_widen_call) and multiplied in f32 (kd_gemm_panel). */
    int b_half;
    int64_t b_rows, panel_rows;
} kd_gemm;

/* One f32 GEMM of a 16-bit B's panel: C[c_off..] (+)= op(A)[a_off..] panel, row-major, ldc and
 * lda as in the whole product, the panel in the scratch with leading dimension ldb. */
typedef struct kd_gemm_part {
    int64_t m, n, k;
    int64_t a_off, c_off; /* elements past the tensors' own offsets */
    float beta;
} kd_gemm_part;

/* The scratch bytes (f32) a 16-bit B's panels need; 0 for an f32 B. */
size_t kd_gemm_scratch_bytes(const kd_gemm *g);
/* The widening call of panel p (rows [p * panel_rows, ...) of B) into the scratch, and the GEMM
 * that consumes it; the number of panels is kd_gemm_panels(g). */
int64_t kd_gemm_panels(const kd_gemm *g);
void kd_widen_call(const twk_launch *l, const kd_gemm *g, int64_t p, kd_call *call, kd_gemm_part *part);

/* What the lowering sizes to besides the shapes: the device's compute units (SMs, CUs, cores;
 * <= 0 when unknown), from which the wide reductions take their number of work-groups. */
typedef struct kd_device {
    int compute_units;
} kd_device;

/* The f32 scratch bytes a kernel launch of l at token count n on dev needs besides a GEMM's
 * panels (attn_back's delta, the wide reductions' partials); 0 for none. Nondecreasing in n; the
 * backend's plan scratch is the largest of them all at capacity. */
size_t kd_scratch_bytes(const twk_launch *l, int64_t n, const kd_device *dev);

/* The work of one launch at token count n on dev: either *gemm is filled (return
 * 0, *is_gemm = 1) or up to KD_MAX_CALLS kernel calls, run in order, are
 * written to calls (returns their count, 0 for a no-op). -1 (error set)
 * if the op or its dtypes are not supported; the message names the op. */
int kd_lower(const twk_launch *l, int64_t n, const kd_device *dev, kd_call *calls, kd_gemm *gemm, int *is_gemm);

/* The kernel table's entry for op: 1 when the kernels run it (or hand it to
 * the BLAS); else 0 and *why = the declared reason, or NULL when it is missing. */
int kd_op_kernel(twk_op op, const char **why);
/* The sources of op whose bf16 / f16 the kernels widen (the backend's half_srcs); 0 for none. */
unsigned kd_half_srcs(twk_op op);

/* true when kd_lower handles the launch (op, dtypes, ranks); else a reason in why. */
int kd_supports(const twk_launch *l, char *why, size_t why_len);

/* The kernel sources (all families, without a prelude) as one string. */
const char *kd_kernel_source(void);

/* Error codes kernels store in the error word; kd_error_message names them. */
enum { KD_ERR_NONE = 0, KD_ERR_ID_RANGE = 1, KD_ERR_SEGMENT = 2 };
const char *kd_error_message(int code);

/* For messages after a kernel stored an error code: the sources of l whose
 * ids the kernels check (a bitmask over src indices; 0 if none). */
unsigned kd_checked_sources(const twk_launch *l);
/* Names the first bad id of l at token count n, worded like the CPU backend
 * ("get_rows 'embed': ids[2] = 7 is outside [0, 5)"), from host copies of
 * the checked sources (host[i] for each bit i of kd_checked_sources, the
 * tensor's n-token contents). Writes "" to msg when every id is in range. */
void kd_error_detail(const twk_launch *l, int64_t n, const void *const *host, char *msg, size_t len);

#endif
