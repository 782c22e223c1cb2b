/* twinkle — the kernel dialect spelled in OpenCL C (prepended to
 * kd_kernel_source() when the OpenCL backend builds its program).
 * kd_prelude_cuda.h spells the same macros for CUDA C++. */
#ifndef TWK_KD_PRELUDE_OPENCL_H
#define TWK_KD_PRELUDE_OPENCL_H

/* no fused multiply-add contraction: the CPU reference (ISO C) rounds a*b+c twice,
 * and cancellation-prone gradients (rmsnorm at D = 1) must agree with it */
#pragma OPENCL FP_CONTRACT OFF

#define TWK_KERNEL __kernel void
#define TWK_GLOBAL __global
/* a work-group (shared) array, declared at the top level of a kernel body */
#define TWK_LOCAL(type, name, count) __local type name[count]
/* the address space of a pointer into such an array (a helper's parameter) */
#define TWK_LOCAL_PTR __local
#define TWK_BARRIER() barrier(CLK_LOCAL_MEM_FENCE)
/* a helper function kernels call (device code only) */
#define TWK_FN static inline
#define TWK_GID(d) ((long)get_global_id(d))
#define TWK_LID(d) ((int)get_local_id(d))
#define TWK_GROUP(d) ((long)get_group_id(d))
#define TWK_LSIZE(d) ((int)get_local_size(d))
#define TWK_NGROUPS(d) ((long)get_num_groups(d))
/* element i of f16 storage (a ushort pointer) widened: OpenCL's vload_half, no cl_khr_fp16 needed */
#define TWK_LOAD_HALF(p, i) vload_half((size_t)(i), (const __global half *)(p))

#endif
