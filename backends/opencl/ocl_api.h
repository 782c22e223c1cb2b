/* The OpenCL and CLBlast entry points the backend calls, loaded with dlopen
 * (libOpenCL.so.1, libclblast.so.1) so that the twinkle binary loads and
 * runs on machines without them: the backend then reports zero devices.
 * After this header, clXxx / CLBlastXxx in the backend's files name the
 * loaded pointers (ocl_api.c, which fills them, defines OCL_API_IMPL). */
#ifndef TWK_OCL_API_H
#define TWK_OCL_API_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120 /* the 1.2 API (clCreateCommandQueue) */
#endif
#include <CL/cl.h>
#include <clblast_c.h>

#define OCL_CL_LIST(X)                                                                                      \
    X(clGetPlatformIDs) X(clGetPlatformInfo) X(clGetDeviceIDs) X(clGetDeviceInfo) X(clCreateContext)     \
    X(clReleaseContext) X(clCreateCommandQueue) X(clReleaseCommandQueue) X(clFinish) X(clCreateBuffer)   \
    X(clReleaseMemObject) X(clEnqueueWriteBuffer) X(clEnqueueReadBuffer) X(clEnqueueCopyBuffer)          \
    X(clEnqueueFillBuffer) X(clCreateProgramWithSource) X(clCreateProgramWithBinary) X(clBuildProgram)   \
    X(clGetProgramBuildInfo) X(clGetProgramInfo) X(clReleaseProgram) X(clCreateKernel)                  \
    X(clReleaseKernel) X(clSetKernelArg) X(clEnqueueNDRangeKernel)

#define OCL_BLAS_LIST(X) X(CLBlastSgemm) X(CLBlastSgemmStridedBatched) X(CLBlastClearCache)

typedef struct ocl_api_table {
#define OCL_PTR_(f) __typeof__(&f) f;
    OCL_CL_LIST(OCL_PTR_)
    OCL_BLAS_LIST(OCL_PTR_)
#undef OCL_PTR_
} ocl_api_table;

extern ocl_api_table ocl_api;

/* Loads libOpenCL once; 1 when every OpenCL entry point was found. */
int ocl_api_load_cl(void);
/* Loads CLBlast once; 1 when found, else 0 and *why names the library. */
int ocl_api_load_blas(const char **why);

#ifndef OCL_API_IMPL
#define OCL_USE_(f) ocl_api.f
#define clGetPlatformIDs OCL_USE_(clGetPlatformIDs)
#define clGetPlatformInfo OCL_USE_(clGetPlatformInfo)
#define clGetDeviceIDs OCL_USE_(clGetDeviceIDs)
#define clGetDeviceInfo OCL_USE_(clGetDeviceInfo)
#define clCreateContext OCL_USE_(clCreateContext)
#define clReleaseContext OCL_USE_(clReleaseContext)
#define clCreateCommandQueue OCL_USE_(clCreateCommandQueue)
#define clReleaseCommandQueue OCL_USE_(clReleaseCommandQueue)
#define clFinish OCL_USE_(clFinish)
#define clCreateBuffer OCL_USE_(clCreateBuffer)
#define clReleaseMemObject OCL_USE_(clReleaseMemObject)
#define clEnqueueWriteBuffer OCL_USE_(clEnqueueWriteBuffer)
#define clEnqueueReadBuffer OCL_USE_(clEnqueueReadBuffer)
#define clEnqueueCopyBuffer OCL_USE_(clEnqueueCopyBuffer)
#define clEnqueueFillBuffer OCL_USE_(clEnqueueFillBuffer)
#define clCreateProgramWithSource OCL_USE_(clCreateProgramWithSource)
#define clCreateProgramWithBinary OCL_USE_(clCreateProgramWithBinary)
#define clBuildProgram OCL_USE_(clBuildProgram)
#define clGetProgramBuildInfo OCL_USE_(clGetProgramBuildInfo)
#define clGetProgramInfo OCL_USE_(clGetProgramInfo)
#define clReleaseProgram OCL_USE_(clReleaseProgram)
#define clCreateKernel OCL_USE_(clCreateKernel)
#define clReleaseKernel OCL_USE_(clReleaseKernel)
#define clSetKernelArg OCL_USE_(clSetKernelArg)
#define clEnqueueNDRangeKernel OCL_USE_(clEnqueueNDRangeKernel)
#define CLBlastSgemm OCL_USE_(CLBlastSgemm)
#define CLBlastSgemmStridedBatched OCL_USE_(CLBlastSgemmStridedBatched)
#define CLBlastClearCache OCL_USE_(CLBlastClearCache)
#endif

#endif
