/* OpenCL devices over all platforms, and error-code names. A missing ICD
 * loader configuration or no platform gives zero devices, never a failure. */
#include <stdio.h>
#include <string.h>

#include "ocl_internal.h"

#define OCL_MAX_DEVICES 64

static struct {
    int n;
    cl_platform_id platform[OCL_MAX_DEVICES];
    cl_device_id device[OCL_MAX_DEVICES];
} devs;
static pthread_once_t devs_once = PTHREAD_ONCE_INIT;

static void enumerate(void) {
    if (!ocl_api_load_cl()) return; /* no libOpenCL: no devices */
    cl_uint np = 0;
    if (clGetPlatformIDs(0, NULL, &np) != CL_SUCCESS || np == 0) return;
    cl_platform_id plats[16];
    if (np > 16) np = 16;
    if (clGetPlatformIDs(np, plats, NULL) != CL_SUCCESS) return;
    for (cl_uint p = 0; p < np; p++) {
        cl_uint nd = 0;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) != CL_SUCCESS || nd == 0) continue;
        cl_device_id ids[OCL_MAX_DEVICES];
        if (nd > OCL_MAX_DEVICES) nd = OCL_MAX_DEVICES;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, nd, ids, NULL) != CL_SUCCESS) continue;
        for (cl_uint d = 0; d < nd && devs.n < OCL_MAX_DEVICES; d++) {
            devs.platform[devs.n] = plats[p];
            devs.device[devs.n] = ids[d];
            devs.n++;
        }
    }
}

int ocl_device_total(void) {
    pthread_once(&devs_once, enumerate);
    return devs.n;
}

int ocl_device_at(int i, cl_platform_id *platform, cl_device_id *device) {
    if (i < 0 || i >= ocl_device_total()) return 0;
    *platform = devs.platform[i];
    *device = devs.device[i];
    return 1;
}

const char *ocl_code_name(cl_int code) {
    switch (code) {
#define C_(x) case x: return #x;
        C_(CL_SUCCESS) C_(CL_DEVICE_NOT_FOUND) C_(CL_DEVICE_NOT_AVAILABLE) C_(CL_COMPILER_NOT_AVAILABLE)
        C_(CL_MEM_OBJECT_ALLOCATION_FAILURE) C_(CL_OUT_OF_RESOURCES) C_(CL_OUT_OF_HOST_MEMORY)
        C_(CL_BUILD_PROGRAM_FAILURE) C_(CL_MEM_COPY_OVERLAP) C_(CL_INVALID_VALUE) C_(CL_INVALID_DEVICE)
        C_(CL_INVALID_CONTEXT) C_(CL_INVALID_COMMAND_QUEUE) C_(CL_INVALID_MEM_OBJECT) C_(CL_INVALID_BINARY)
        C_(CL_INVALID_BUILD_OPTIONS) C_(CL_INVALID_PROGRAM) C_(CL_INVALID_PROGRAM_EXECUTABLE)
        C_(CL_INVALID_KERNEL_NAME) C_(CL_INVALID_KERNEL) C_(CL_INVALID_ARG_INDEX) C_(CL_INVALID_ARG_VALUE)
        C_(CL_INVALID_ARG_SIZE) C_(CL_INVALID_KERNEL_ARGS) C_(CL_INVALID_WORK_DIMENSION)
        C_(CL_INVALID_WORK_GROUP_SIZE) C_(CL_INVALID_WORK_ITEM_SIZE) C_(CL_INVALID_GLOBAL_OFFSET)
        C_(CL_INVALID_EVENT_WAIT_LIST) C_(CL_INVALID_OPERATION) C_(CL_INVALID_BUFFER_SIZE)
        C_(CL_INVALID_GLOBAL_WORK_SIZE) C_(CL_INVALID_PLATFORM)
#undef C_
    case -1001: return "CL_PLATFORM_NOT_FOUND_KHR (no ICD)";
    default: return "CL error";
    }
}

twk_status ocl_fail(cl_int code, const char *what) {
    twk_status s = (code == CL_MEM_OBJECT_ALLOCATION_FAILURE || code == CL_OUT_OF_HOST_MEMORY ||
                    code == CL_INVALID_BUFFER_SIZE)
                       ? TWK_ERR_OOM
                       : TWK_ERR_BACKEND;
    return twk_error(s, "opencl: %s: %s (%d)", what, ocl_code_name(code), (int)code);
}
