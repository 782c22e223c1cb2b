/* twinkle — the kernel dialect spelled in CUDA C++ (compiled by nvcc to a
 * fatbin that backends/cuda embeds; see backends/cuda/CMakeLists.txt).
 *
 * The kernels in backends/kernels (the .cl files) are written once in the TWK_ macros
 * and a small set of OpenCL C built-ins; this header gives both their CUDA
 * meaning, so the same source compiles unchanged as OpenCL C and as CUDA.
 * Kernels get C linkage so the host finds them by their source name
 * (cuModuleGetFunction). Indices follow OpenCL: dim 0 is x. FMA contraction
 * is off as in the OpenCL prelude, by nvcc -fmad=false (backends/cuda). */
#ifndef TWK_KD_PRELUDE_CUDA_H
#define TWK_KD_PRELUDE_CUDA_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define TWK_CUDA 1

/* ---- the dialect ---------------------------------------------------------- */

#define TWK_KERNEL extern "C" __global__ void
#define TWK_GLOBAL
/* a work-group (shared) array, declared at the top level of a kernel body */
#define TWK_LOCAL(type, name, count) __shared__ type name[count]
/* the address space of a pointer into such an array (none in CUDA) */
#define TWK_LOCAL_PTR
#define TWK_BARRIER() __syncthreads()
/* a helper function kernels call (device code only) */
#define TWK_FN static __device__ __forceinline__

static __device__ __forceinline__ unsigned twk_cuda_lid_(int d) {
    return d == 0 ? threadIdx.x : d == 1 ? threadIdx.y : threadIdx.z;
}
static __device__ __forceinline__ unsigned twk_cuda_group_(int d) {
    return d == 0 ? blockIdx.x : d == 1 ? blockIdx.y : blockIdx.z;
}
static __device__ __forceinline__ unsigned twk_cuda_lsize_(int d) {
    return d == 0 ? blockDim.x : d == 1 ? blockDim.y : blockDim.z;
}
static __device__ __forceinline__ unsigned twk_cuda_ngroups_(int d) {
    return d == 0 ? gridDim.x : d == 1 ? gridDim.y : gridDim.z;
}

/* the same types as kd_prelude_opencl.h: ids and counts long, local ones int
 * (the product in 64 bits: grids may exceed 2^32 items) */
#define TWK_GID(d) ((long)twk_cuda_group_(d) * (long)twk_cuda_lsize_(d) + (long)twk_cuda_lid_(d))
#define TWK_LID(d) ((int)twk_cuda_lid_(d))
#define TWK_GROUP(d) ((long)twk_cuda_group_(d))
#define TWK_LSIZE(d) ((int)twk_cuda_lsize_(d))
#define TWK_NGROUPS(d) ((long)twk_cuda_ngroups_(d))
#define TWK_GSIZE(d) ((long)twk_cuda_ngroups_(d) * (long)twk_cuda_lsize_(d))

/* ---- OpenCL C built-ins and types CUDA lacks (for kernels that use them) --- */

/* OpenCL C scalar types (long is 64-bit in both: LP64 hosts, OpenCL C by definition) */
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;

#ifndef MAXFLOAT
#define MAXFLOAT FLT_MAX
#endif
#ifndef M_PI_F
#define M_PI_F 3.14159265358979323846f
#endif
#ifndef M_LN2_F
#define M_LN2_F 0.693147180559945309417f
#endif
#ifndef M_LOG2E_F
#define M_LOG2E_F 1.44269504088896340736f
#endif
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif

/* math built-ins CUDA spells differently (CUDA already has the float
 * overloads of exp, log, sqrt, rsqrt, fmax, fmin, fabs, tanh, pow, floor, ...) */
TWK_FN float mad(float a, float b, float c) { return fmaf(a, b, c); }
TWK_FN float native_exp(float x) { return __expf(x); }
TWK_FN float native_log(float x) { return __logf(x); }
TWK_FN float native_sqrt(float x) { return sqrtf(x); }
TWK_FN float native_rsqrt(float x) { return rsqrtf(x); }
TWK_FN float native_recip(float x) { return __frcp_rn(x); }
TWK_FN float native_divide(float a, float b) { return __fdividef(a, b); }
TWK_FN float native_sin(float x) { return __sinf(x); }
TWK_FN float native_cos(float x) { return __cosf(x); }
TWK_FN float half_exp(float x) { return __expf(x); }
TWK_FN float clamp(float x, float lo, float hi) { return fminf(fmaxf(x, lo), hi); }
TWK_FN int clamp(int x, int lo, int hi) { return min(max(x, lo), hi); }
TWK_FN long clamp(long x, long lo, long hi) { return x < lo ? lo : x > hi ? hi : x; }
TWK_FN float mix(float a, float b, float t) { return a + (b - a) * t; }
TWK_FN float sign(float x) { return x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : 0.0f; }
TWK_FN float as_float(int x) { return __int_as_float(x); }
TWK_FN float as_float(uint x) { return __uint_as_float(x); }
TWK_FN int as_int(float x) { return __float_as_int(x); }
TWK_FN uint as_uint(float x) { return __float_as_uint(x); }
TWK_FN int convert_int(float x) { return (int)x; }
TWK_FN long convert_long(float x) { return (long)x; }
TWK_FN float convert_float(int x) { return (float)x; }
TWK_FN float convert_float(long x) { return (float)x; }

/* 32-bit integer atomics (for an error word or a flag) */
TWK_FN int atomic_cmpxchg(volatile int *p, int cmp, int val) { return atomicCAS((int *)p, cmp, val); }
TWK_FN int atomic_xchg(volatile int *p, int val) { return atomicExch((int *)p, val); }
TWK_FN int atomic_add(volatile int *p, int val) { return atomicAdd((int *)p, val); }
TWK_FN int atomic_sub(volatile int *p, int val) { return atomicSub((int *)p, val); }
TWK_FN int atomic_inc(volatile int *p) { return atomicAdd((int *)p, 1); }
TWK_FN int atomic_dec(volatile int *p) { return atomicSub((int *)p, 1); }
TWK_FN int atomic_max(volatile int *p, int val) { return atomicMax((int *)p, val); }
TWK_FN int atomic_min(volatile int *p, int val) { return atomicMin((int *)p, val); }
TWK_FN int atomic_or(volatile int *p, int val) { return atomicOr((int *)p, val); }
TWK_FN int atomic_and(volatile int *p, int val) { return atomicAnd((int *)p, val); }
TWK_FN uint atomic_cmpxchg(volatile uint *p, uint cmp, uint val) { return atomicCAS((uint *)p, cmp, val); }
TWK_FN uint atomic_add(volatile uint *p, uint val) { return atomicAdd((uint *)p, val); }
TWK_FN uint atomic_max(volatile uint *p, uint val) { return atomicMax((uint *)p, val); }
TWK_FN uint atomic_or(volatile uint *p, uint val) { return atomicOr((uint *)p, val); }

#endif
