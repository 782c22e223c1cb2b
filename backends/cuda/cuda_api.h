/* The CUDA driver API and cuBLAS, loaded with dlopen at run time, so the
 * twinkle binary starts (and reports "no devices") on machines without an
 * NVIDIA driver. The CUDA headers give only types and prototypes: every
 * call goes through a pointer filled by dlsym. Names go through cuda.h's
 * own macros (cuMemAlloc -> cuMemAlloc_v2), so the symbol looked up and the
 * pointer's type always agree with the headers we compile against. */
#ifndef TWK_CUDA_API_H
#define TWK_CUDA_API_H

#include <stddef.h>

#include <cuda.h>
#include <cublas_v2.h>

#define CU_FUNCS(X)                 \
    X(cuGetErrorName)               \
    X(cuGetErrorString)             \
    X(cuInit)                       \
    X(cuDriverGetVersion)           \
    X(cuDeviceGetCount)             \
    X(cuDeviceGet)                  \
    X(cuDeviceGetName)              \
    X(cuDeviceGetAttribute)         \
    X(cuDeviceTotalMem)             \
    X(cuDevicePrimaryCtxRetain)     \
    X(cuDevicePrimaryCtxRelease)    \
    X(cuCtxSetCurrent)              \
    X(cuStreamCreate)               \
    X(cuStreamDestroy)              \
    X(cuStreamSynchronize)          \
    X(cuMemAlloc)                   \
    X(cuMemFree)                    \
    X(cuMemcpyHtoDAsync)            \
    X(cuMemcpyDtoHAsync)            \
    X(cuMemcpyDtoDAsync)            \
    X(cuMemsetD8Async)              \
    X(cuModuleLoadData)             \
    X(cuModuleUnload)               \
    X(cuModuleGetFunction)          \
    X(cuLaunchKernel)               \
    X(cuStreamBeginCapture)         \
    X(cuStreamEndCapture)           \
    X(cuGraphInstantiate)           \
    X(cuGraphLaunch)                \
    X(cuGraphExecDestroy)           \
    X(cuGraphDestroy)

/* optional: NULL when the driver lacks them */
#define CU_OPT_FUNCS(X)             \
    X(cuFuncGetParamInfo) /* 12.4+: lets prepare check argument lists */ \
    X(cuEventCreate)      /* the events: TWK_PROFILE only */ \
    X(cuEventRecord)                \
    X(cuEventSynchronize)           \
    X(cuEventElapsedTime)           \
    X(cuEventDestroy)

#define CUBLAS_FUNCS(X)             \
    X(cublasCreate)                 \
    X(cublasDestroy)                \
    X(cublasGetVersion)             \
    X(cublasSetStream)              \
    X(cublasSetWorkspace)           \
    X(cublasGetStatusString)        \
    X(cublasSgemmStridedBatched)    \
    X(cublasGemmStridedBatchedEx)

/* Members are named as the functions (after cuda.h's renaming), so calls
 * read cu->cuMemAlloc(...). */
typedef struct cu_api {
#define CU_API_MEMBER_(f) __typeof__(&f) f;
    CU_FUNCS(CU_API_MEMBER_)
    CU_OPT_FUNCS(CU_API_MEMBER_)
    CUBLAS_FUNCS(CU_API_MEMBER_)
#undef CU_API_MEMBER_
    int driver_version; /* e.g. 13000 */
    int blas_loaded;    /* cuBLAS found (GEMM available) */
} cu_api;

/* The loaded driver API after cuInit, or NULL when the driver, its symbols
 * or cuInit are missing or failed; the reason is then in cu_unavailable(). */
const cu_api *cu_load(void);
/* Why cu_load() returned NULL ("" when it did not). */
const char *cu_unavailable(void);
/* Loads cuBLAS into the table (once); TWK_ERR_BACKEND with the reason when
 * libcublas cannot be loaded. Needs cu_load() to have succeeded. */
int cu_load_blas(char *why, size_t why_len);

/* "CUDA_ERROR_OUT_OF_MEMORY (out of memory)" for a driver result. */
const char *cu_errstr(CUresult r, char *buf, size_t len);

#endif
