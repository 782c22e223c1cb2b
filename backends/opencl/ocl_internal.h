/* OpenCL backend internals: the context of an opened device, buffers, the
 * program (built from the shared kernels, cached on disk) and its kernels. */
#ifndef TWK_OCL_INTERNAL_H
#define TWK_OCL_INTERNAL_H

#include <pthread.h>

#include "ocl_api.h" /* the dlopen'ed OpenCL / CLBlast entry points */

#include "twk_backend.h"

typedef struct ocl_buffer {
    struct twk_buffer base; /* first: the HAL reads the size */
    cl_mem mem;
} ocl_buffer;

#define OCL_MAX_KERNELS 96

typedef struct ocl_ctx {
    cl_platform_id platform;
    cl_device_id device;
    cl_context context;
    cl_command_queue queue;
    cl_program program;
    char device_name[128];
    size_t max_group; /* CL_DEVICE_MAX_WORK_GROUP_SIZE */
    int compute_units; /* CL_DEVICE_MAX_COMPUTE_UNITS: the wide reductions' work-groups (kd_device) */
    int n_kernels;
    const char *kernel_names[OCL_MAX_KERNELS];
    cl_kernel kernels[OCL_MAX_KERNELS];
    pthread_mutex_t lock; /* kernels' arguments are set and enqueued under it */
} ocl_ctx;

/* A status for a failed OpenCL call: TWK_ERR_BACKEND (TWK_ERR_OOM for the
 * out-of-memory codes) with "opencl: <what>: <code name> (<code>)". */
twk_status ocl_fail(cl_int code, const char *what);
/* The name of an OpenCL error code ("CL_OUT_OF_RESOURCES"). */
const char *ocl_code_name(cl_int code);

/* The (platform, device) of device index i over all platforms; 0 if none. */
int ocl_device_at(int i, cl_platform_id *platform, cl_device_id *device);
/* Number of devices over all platforms (0 when no ICD or platform). */
int ocl_device_total(void);

/* Builds ctx->program from the prelude and kd_kernel_source(), through the
 * on-disk binary cache. TWK_ERR_BACKEND with the build log on failure. */
twk_status ocl_program_build(ocl_ctx *ctx);
/* The cl_kernel named `name` (created once per context); NULL with error set. */
cl_kernel ocl_kernel(ocl_ctx *ctx, const char *name);

/* Plans (ocl_run.c), as the backend table's prepare / release / run /
 * synchronize. prepare: TWK_ERR_UNSUPPORTED for a launch kd_lower refuses,
 * TWK_ERR_BACKEND when a kernel cannot be created. run: TWK_ERR_RANGE when a
 * kernel flagged bad ids, TWK_ERR_BACKEND when OpenCL or CLBlast fails. */
twk_status ocl_prepare(void *ctx, const twk_hal_plan *plan, void **prepared);
void ocl_release(void *ctx, void *prepared);
twk_status ocl_run(void *ctx, void *prepared, const twk_hal_plan *plan, int64_t n);
twk_status ocl_synchronize(void *ctx);

#endif
