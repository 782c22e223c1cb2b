/* The OpenCL backend's table: devices, contexts, buffers and op support.
 * Plans are prepared and run in ocl_run.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kd.h"
#include "ocl_internal.h"

static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static int n_open; /* contexts alive; CLBlast's program cache is cleared when the last closes */

static int ocl_device_count(void) { return ocl_device_total(); }

/* Copies s into out[len] without leading/trailing blanks. */
static void trimmed(char *out, size_t len, const char *s) {
    while (*s == ' ') s++;
    snprintf(out, len, "%s", s);
    size_t n = strlen(out);
    while (n && (out[n - 1] == ' ' || out[n - 1] == '\n')) out[--n] = 0;
}

static twk_status no_device(int index) {
    int n = ocl_device_total();
    if (n == 0)
        return twk_error(TWK_ERR_NOT_FOUND,
                         "opencl: no OpenCL platform or device found (is an ICD such as PoCL installed and "
                         "listed in /etc/OpenCL/vendors? `clinfo -l` shows what the loader sees)");
    return twk_error(TWK_ERR_NOT_FOUND, "opencl: no device %d (%d device(s) over all platforms)", index, n);
}

static twk_status ocl_device_props(int index, twk_device_props *out) {
    cl_platform_id p;
    cl_device_id d;
    if (!out) return twk_error(TWK_ERR_INVALID_ARG, "opencl: device_props: out is NULL");
    if (!ocl_device_at(index, &p, &d)) return no_device(index);
    memset(out, 0, sizeof *out);
    char name[256] = "", pname[128] = "";
    clGetDeviceInfo(d, CL_DEVICE_NAME, sizeof name - 1, name, NULL);
    clGetPlatformInfo(p, CL_PLATFORM_NAME, sizeof pname - 1, pname, NULL);
    char tn[256], tp[128];
    trimmed(tn, sizeof tn, name);
    trimmed(tp, sizeof tp, pname);
    snprintf(out->name, sizeof out->name, "%.80s (%.40s)", tn, tp);
    cl_device_type type = 0;
    clGetDeviceInfo(d, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    snprintf(out->kind, sizeof out->kind, "%s",
             (type & CL_DEVICE_TYPE_GPU) ? "gpu" : (type & CL_DEVICE_TYPE_CPU) ? "cpu"
                                                 : (type & CL_DEVICE_TYPE_ACCELERATOR) ? "accelerator" : "other");
    cl_ulong mem = 0;
    cl_uint cu = 0;
    clGetDeviceInfo(d, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof mem, &mem, NULL);
    clGetDeviceInfo(d, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL);
    out->memory_bytes = mem;
    out->compute_units = (int)cu;
    out->max_threads = (type & CL_DEVICE_TYPE_CPU) ? (int)cu : 0;
    return TWK_OK;
}

static void ocl_close(void *vctx) {
    ocl_ctx *ctx = vctx;
    if (!ctx) return;
    if (ctx->queue) clFinish(ctx->queue);
    for (int i = 0; i < ctx->n_kernels; i++) clReleaseKernel(ctx->kernels[i]);
    if (ctx->program) clReleaseProgram(ctx->program);
    if (ctx->queue) clReleaseCommandQueue(ctx->queue);
    pthread_mutex_lock(&open_lock);
    if (--n_open == 0) CLBlastClearCache(); /* its programs hold the context */
    pthread_mutex_unlock(&open_lock);
    if (ctx->context) clReleaseContext(ctx->context);
    pthread_mutex_destroy(&ctx->lock);
    twk_host_free(ctx);
}

static twk_status ocl_open(int index, void **out) {
    cl_platform_id p;
    cl_device_id d;
    if (!out) return twk_error(TWK_ERR_INVALID_ARG, "opencl: open: out is NULL");
    if (!ocl_device_at(index, &p, &d)) return no_device(index);
    const char *why = NULL;
    if (!ocl_api_load_blas(&why)) return twk_error(TWK_ERR_NOT_FOUND, "opencl: %s; matmul needs it", why);
    ocl_ctx *ctx = twk_host_calloc(sizeof *ctx, "opencl context");
    if (!ctx) return TWK_ERR_OOM;
    pthread_mutex_init(&ctx->lock, NULL);
    pthread_mutex_lock(&open_lock);
    n_open++;
    pthread_mutex_unlock(&open_lock);
    ctx->platform = p;
    ctx->device = d;
    char name[256] = "";
    clGetDeviceInfo(d, CL_DEVICE_NAME, sizeof name - 1, name, NULL);
    trimmed(ctx->device_name, sizeof ctx->device_name, name);
    clGetDeviceInfo(d, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof ctx->max_group, &ctx->max_group, NULL);
    cl_uint cus = 0;
    if (clGetDeviceInfo(d, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cus, &cus, NULL) == CL_SUCCESS) ctx->compute_units = (int)cus;
    twk_status s;
    cl_int e;
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)p, 0};
    ctx->context = clCreateContext(props, 1, &d, NULL, NULL, &e);
    if (e != CL_SUCCESS) {
        s = ocl_fail(e, "clCreateContext");
        goto fail;
    }
    ctx->queue = clCreateCommandQueue(ctx->context, d, 0, &e);
    if (e != CL_SUCCESS) {
        s = ocl_fail(e, "clCreateCommandQueue");
        goto fail;
    }
    if (ctx->max_group < 256) {
        s = twk_error(TWK_ERR_UNSUPPORTED, "opencl: %s allows work-groups of %zu items; the kernels need 256",
                      ctx->device_name, ctx->max_group);
        goto fail;
    }
    s = ocl_program_build(ctx);
    if (s != TWK_OK) goto fail;
    *out = ctx;
    return TWK_OK;
fail:
    ocl_close(ctx);
    return s;
}

static twk_status ocl_buffer_alloc(void *vctx, size_t bytes, twk_buffer **out) {
    ocl_ctx *ctx = vctx;
    ocl_buffer *b = twk_host_calloc(sizeof *b, "opencl buffer");
    if (!b) return TWK_ERR_OOM;
    cl_int e;
    b->mem = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, bytes ? bytes : 4, NULL, &e);
    if (e != CL_SUCCESS) {
        twk_host_free(b);
        char what[96];
        snprintf(what, sizeof what, "allocating %zu bytes", bytes);
        return ocl_fail(e, what);
    }
    b->base.size = bytes;
    *out = &b->base;
    return TWK_OK;
}

static void ocl_buffer_free(void *ctx, twk_buffer *buf) {
    (void)ctx;
    ocl_buffer *b = (ocl_buffer *)buf;
    if (!b) return;
    clReleaseMemObject(b->mem); /* OpenCL frees it once queued work using it is done */
    twk_host_free(b);
}

static twk_status ocl_upload(void *vctx, twk_buffer *dst, size_t off, const void *src, size_t n) {
    ocl_ctx *ctx = vctx;
    cl_int e = clEnqueueWriteBuffer(ctx->queue, ((ocl_buffer *)dst)->mem, CL_TRUE, off, n, src, 0, NULL, NULL);
    return e == CL_SUCCESS ? TWK_OK : ocl_fail(e, "upload");
}

static twk_status ocl_download(void *vctx, const twk_buffer *src, size_t off, void *dst, size_t n) {
    ocl_ctx *ctx = vctx;
    cl_int e = clEnqueueReadBuffer(ctx->queue, ((const ocl_buffer *)src)->mem, CL_TRUE, off, n, dst, 0, NULL, NULL);
    return e == CL_SUCCESS ? TWK_OK : ocl_fail(e, "download");
}

static twk_status ocl_copy(void *vctx, twk_buffer *dst, size_t doff, const twk_buffer *src, size_t soff,
                           size_t n) {
    ocl_ctx *ctx = vctx;
    cl_mem d = ((ocl_buffer *)dst)->mem, s = ((const ocl_buffer *)src)->mem;
    cl_int e;
    if (d == s && doff < soff + n && soff < doff + n) { /* overlapping: through a temporary, like memmove */
        if (doff == soff) return TWK_OK;
        cl_mem tmp = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, n, NULL, &e);
        if (e != CL_SUCCESS) return ocl_fail(e, "copy (temporary)");
        e = clEnqueueCopyBuffer(ctx->queue, s, tmp, soff, 0, n, 0, NULL, NULL);
        if (e == CL_SUCCESS) e = clEnqueueCopyBuffer(ctx->queue, tmp, d, 0, doff, n, 0, NULL, NULL);
        clReleaseMemObject(tmp);
    } else {
        e = clEnqueueCopyBuffer(ctx->queue, s, d, soff, doff, n, 0, NULL, NULL);
    }
    return e == CL_SUCCESS ? TWK_OK : ocl_fail(e, "copy");
}

static twk_status ocl_memset_zero(void *vctx, twk_buffer *dst, size_t off, size_t n) {
    ocl_ctx *ctx = vctx;
    unsigned char zero = 0;
    cl_int e = clEnqueueFillBuffer(ctx->queue, ((ocl_buffer *)dst)->mem, &zero, 1, off, n, 0, NULL, NULL);
    return e == CL_SUCCESS ? TWK_OK : ocl_fail(e, "zero");
}

static bool ocl_supports_op(void *ctx, const twk_launch *l, char *why, size_t why_len) {
    (void)ctx;
    return kd_supports(l, why, why_len) != 0;
}

static const twk_backend_iface ocl_iface = {
    .name = "opencl",
    .device_count = ocl_device_count,
    .device_props = ocl_device_props,
    .open = ocl_open,
    .close = ocl_close,
    .buffer_alloc = ocl_buffer_alloc,
    .buffer_free = ocl_buffer_free,
    .upload = ocl_upload,
    .download = ocl_download,
    .copy = ocl_copy,
    .memset_zero = ocl_memset_zero,
    .supports_op = ocl_supports_op,
    .op_kernel = kd_op_kernel,
    .prepare = ocl_prepare,
    .release = ocl_release,
    .run = ocl_run,
    .synchronize = ocl_synchronize,
    .half_srcs = kd_half_srcs,
};

/* The OpenCL backend's table (never NULL; with no runtime it lists no devices). */
const twk_backend_iface *twk_opencl_backend(void) { return &ocl_iface; }
