/* Shared by the CUDA backend's files: the device context, buffers and the
 * helpers that turn driver / cuBLAS results into twk_status. */
#ifndef TWK_CUDA_INTERNAL_H
#define TWK_CUDA_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "twk_backend.h"
#include "twinkle/log.h"

#include "cuda_api.h"

typedef struct cuda_buffer {
    struct twk_buffer base; /* first: the HAL reads the size */
    CUdeviceptr ptr;
} cuda_buffer;

typedef enum cuda_gemm_mode { CUDA_GEMM_FP32 = 0, CUDA_GEMM_TF32, CUDA_GEMM_BF16 } cuda_gemm_mode;

typedef struct cuda_kfn {
    const char *name; /* as kd_lower spells it (a string with static storage) */
    CUfunction fn;
} cuda_kfn;

typedef struct cuda_ctx {
    /* one thread at a time on the stream: a CUDA-graph capture must not see
     * another thread's copies, and the kernel table is shared */
    pthread_mutex_t lock;
    const cu_api *cu;
    int index;
    CUdevice dev;
    int compute_units; /* SMs: the wide reductions' work-groups (kd_device) */
    CUcontext cuctx; /* the device's primary context (shared with cuBLAS's runtime) */
    CUstream stream; /* every copy, kernel and GEMM goes here, in order */
    CUmodule module; /* the embedded fatbin */
    cublasHandle_t blas;
    char blas_why[320]; /* why blas is NULL */
    CUdeviceptr blas_ws;
    size_t blas_ws_bytes;
    int blas_version;
    cuda_gemm_mode gemm_mode;
    bool graphs; /* TWK_CUDA_GRAPHS != 0 */
    cuda_kfn *kfns;
    int n_kfns, cap_kfns;
    /* TWK_PROFILE=1: each launch timed alone (eager, events around it), totals per op at close */
    bool profile;
    CUevent ev[2];
    double prof_s[TWK_OP_COUNT];
    long prof_n[TWK_OP_COUNT];
} cuda_ctx;

/* The fatbin built from backends/kernels (generated file). */
extern const unsigned char twk_cuda_fatbin[];
extern const size_t twk_cuda_fatbin_size;
extern const char twk_cuda_fatbin_archs[]; /* "sm_80, sm_90 + compute_90 PTX" */

/* TWK_OK for CUDA_SUCCESS; else TWK_ERR_OOM / TWK_ERR_BACKEND with "cuda: what: ERROR (text)". */
twk_status cuda_check(const cuda_ctx *c, CUresult r, const char *what);
/* TWK_OK for CUBLAS_STATUS_SUCCESS; else TWK_ERR_BACKEND naming what and the status. */
twk_status cuda_blas_check(const cuda_ctx *c, cublasStatus_t s, const char *what);
/* Makes the device's context current on this thread; TWK_ERR_BACKEND on failure. */
twk_status cuda_set_current(const cuda_ctx *c);
/* The kernel named `name` in the module (cached); TWK_ERR_NOT_FOUND if absent. */
twk_status cuda_kernel(cuda_ctx *c, const char *name, CUfunction *out);

/* plan side (cuda_plan.c) */
bool cuda_supports_op(void *ctx, const twk_launch *l, char *why, size_t why_len);
twk_status cuda_prepare(void *ctx, const twk_hal_plan *plan, void **prepared);
void cuda_release(void *ctx, void *prepared);
twk_status cuda_run(void *ctx, void *prepared, const twk_hal_plan *plan, int64_t n);

#endif
