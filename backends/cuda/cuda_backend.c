/* The CUDA backend: devices, the context (primary context, one stream, the
 * kernel module, a cuBLAS handle), buffers and transfers. Plans are in
 * cuda_plan.c. Everything runs on one stream in order; transfers to and
 * from the host wait for the stream, kernels and GEMMs do not. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "kd.h"

/* cuBLAS's workspace: the size NVIDIA recommends for Hopper; needed so GEMMs
 * inside CUDA-graph capture never allocate. */
#define CUDA_BLAS_WORKSPACE (32u << 20)

twk_status cuda_check(const cuda_ctx *c, CUresult r, const char *what) {
    (void)c;
    if (r == CUDA_SUCCESS) return TWK_OK;
    char b[200];
    cu_errstr(r, b, sizeof b);
    return twk_error(r == CUDA_ERROR_OUT_OF_MEMORY ? TWK_ERR_OOM : TWK_ERR_BACKEND, "cuda: %s: %s", what, b);
}

twk_status cuda_blas_check(const cuda_ctx *c, cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return TWK_OK;
    const char *txt = c && c->cu && c->cu->cublasGetStatusString ? c->cu->cublasGetStatusString(s) : NULL;
    return twk_error(s == CUBLAS_STATUS_ALLOC_FAILED ? TWK_ERR_OOM : TWK_ERR_BACKEND, "cuda: %s: cuBLAS status %d (%s)",
                     what, (int)s, txt ? txt : "?");
}

twk_status cuda_set_current(const cuda_ctx *c) {
    return cuda_check(c, c->cu->cuCtxSetCurrent(c->cuctx), "cuCtxSetCurrent");
}

twk_status cuda_kernel(cuda_ctx *c, const char *name, CUfunction *out) {
    for (int i = 0; i < c->n_kfns; i++)
        if (c->kfns[i].name == name || strcmp(c->kfns[i].name, name) == 0) {
            *out = c->kfns[i].fn;
            return TWK_OK;
        }
    CUfunction fn = NULL;
    CUresult r = c->cu->cuModuleGetFunction(&fn, c->module, name);
    if (r == CUDA_ERROR_NOT_FOUND)
        return twk_error(TWK_ERR_NOT_FOUND, "cuda: kernel '%s' is not in the embedded module (rebuild backends/cuda)",
                         name);
    twk_status st = cuda_check(c, r, "cuModuleGetFunction");
    if (st != TWK_OK) return st;
    if (c->n_kfns == c->cap_kfns) {
        int cap = c->cap_kfns ? 2 * c->cap_kfns : 64;
        cuda_kfn *k = twk_host_alloc((size_t)cap * sizeof *k, "cuda kernel table");
        if (!k) return TWK_ERR_OOM;
        if (c->n_kfns) memcpy(k, c->kfns, (size_t)c->n_kfns * sizeof *k);
        twk_host_free(c->kfns);
        c->kfns = k;
        c->cap_kfns = cap;
    }
    c->kfns[c->n_kfns].name = name;
    c->kfns[c->n_kfns].fn = fn;
    c->n_kfns++;
    *out = fn;
    return TWK_OK;
}

/* ---- devices -------------------------------------------------------------- */

static int cuda_device_count(void) {
    const cu_api *cu = cu_load();
    if (!cu) {
        twk_error(TWK_ERR_NOT_FOUND, "%s", cu_unavailable());
        return 0;
    }
    int n = 0;
    CUresult r = cu->cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS || n <= 0) {
        char b[200];
        if (r != CUDA_SUCCESS)
            twk_error(TWK_ERR_NOT_FOUND, "cuDeviceGetCount: %s", cu_errstr(r, b, sizeof b));
        else
            twk_error(TWK_ERR_NOT_FOUND, "the NVIDIA driver sees no GPU (check CUDA_VISIBLE_DEVICES)");
        return 0;
    }
    return n;
}

static twk_status get_device(int index, const cu_api **cu_out, CUdevice *dev) {
    const cu_api *cu = cu_load();
    if (!cu) return twk_error(TWK_ERR_NOT_FOUND, "cuda: %s", cu_unavailable());
    int n = 0;
    if (cu->cuDeviceGetCount(&n) != CUDA_SUCCESS) n = 0;
    if (index < 0 || index >= n) return twk_error(TWK_ERR_NOT_FOUND, "cuda: no device %d (%d present)", index, n);
    CUresult r = cu->cuDeviceGet(dev, index);
    if (r != CUDA_SUCCESS) {
        char b[200];
        return twk_error(TWK_ERR_BACKEND, "cuda: cuDeviceGet(%d): %s", index, cu_errstr(r, b, sizeof b));
    }
    *cu_out = cu;
    return TWK_OK;
}

static int attr(const cu_api *cu, CUdevice dev, CUdevice_attribute a) {
    int v = 0;
    if (cu->cuDeviceGetAttribute(&v, a, dev) != CUDA_SUCCESS) v = 0;
    return v;
}

static twk_status cuda_device_props(int index, twk_device_props *out) {
    const cu_api *cu = NULL;
    CUdevice dev = 0;
    twk_status st = get_device(index, &cu, &dev);
    if (st != TWK_OK) return st;
    memset(out, 0, sizeof *out);
    char name[96] = "NVIDIA GPU";
    if (cu->cuDeviceGetName(name, (int)sizeof name, dev) != CUDA_SUCCESS) snprintf(name, sizeof name, "NVIDIA GPU");
    int major = attr(cu, dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    int minor = attr(cu, dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    snprintf(out->name, sizeof out->name, "%s (sm_%d%d, driver %d.%d)", name, major, minor,
             cu->driver_version / 1000, cu->driver_version % 1000 / 10);
    snprintf(out->kind, sizeof out->kind, "gpu");
    size_t mem = 0;
    if (cu->cuDeviceTotalMem(&mem, dev) != CUDA_SUCCESS) mem = 0;
    out->memory_bytes = mem;
    out->compute_units = attr(cu, dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    out->max_threads = out->compute_units * attr(cu, dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
    return TWK_OK;
}

/* ---- open / close ------------------------------------------------------------ */

static twk_status parse_env(cuda_ctx *c) {
    const char *g = getenv("TWK_CUDA_GEMM");
    if (!g || !*g || !strcmp(g, "fp32")) c->gemm_mode = CUDA_GEMM_FP32;
    else if (!strcmp(g, "tf32")) c->gemm_mode = CUDA_GEMM_TF32;
    else if (!strcmp(g, "bf16")) c->gemm_mode = CUDA_GEMM_BF16;
    else return twk_error(TWK_ERR_INVALID_ARG, "cuda: TWK_CUDA_GEMM='%s'; want fp32, tf32 or bf16", g);
    const char *gr = getenv("TWK_CUDA_GRAPHS");
    c->graphs = !(gr && !strcmp(gr, "0"));
    const char *pr = getenv("TWK_PROFILE");
    c->profile = pr && atoi(pr) > 0;
    return TWK_OK;
}

static void cuda_close(void *vctx) {
    cuda_ctx *c = vctx;
    if (!c) return;
    const cu_api *cu = c->cu;
    if (c->profile) {
        double total = 0;
        for (int i = 0; i < TWK_OP_COUNT; i++) total += c->prof_s[i];
        twk_log(TWK_LOG_INFO, "cuda profile (%.3f s in launches, each timed alone):", total);
        for (int i = 0; i < TWK_OP_COUNT; i++)
            if (c->prof_n[i])
                twk_log(TWK_LOG_INFO, "  %-16s %8ld launches %9.3f s %5.1f%%", twk_op_name((twk_op)i), c->prof_n[i],
                        c->prof_s[i], 100 * c->prof_s[i] / (total > 0 ? total : 1));
    }
    if (c->cuctx) {
        cu->cuCtxSetCurrent(c->cuctx);
        if (c->stream) cu->cuStreamSynchronize(c->stream);
        for (int i = 0; i < 2; i++)
            if (c->ev[i]) cu->cuEventDestroy(c->ev[i]);
        if (c->blas) cu->cublasDestroy(c->blas);
        if (c->blas_ws) cu->cuMemFree(c->blas_ws);
        if (c->module) cu->cuModuleUnload(c->module);
        if (c->stream) cu->cuStreamDestroy(c->stream);
        cu->cuCtxSetCurrent(NULL);
        cu->cuDevicePrimaryCtxRelease(c->dev);
    }
    twk_host_free(c->kfns);
    pthread_mutex_destroy(&c->lock);
    twk_host_free(c);
}

/* cuBLAS on the context's stream with its own workspace. Failure leaves
 * c->blas NULL and the reason in c->blas_why: MATMUL is then unsupported,
 * the rest of the backend still works. */
static void open_blas(cuda_ctx *c) {
    const cu_api *cu = c->cu;
    if (!cu_load_blas(c->blas_why, sizeof c->blas_why)) return;
    cublasStatus_t s = cu->cublasCreate(&c->blas);
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(c->blas_why, sizeof c->blas_why, "cublasCreate failed: status %d (%s)", (int)s,
                 cu->cublasGetStatusString(s));
        c->blas = NULL;
        return;
    }
    CUresult r = cu->cuMemAlloc(&c->blas_ws, CUDA_BLAS_WORKSPACE);
    if (r != CUDA_SUCCESS) {
        char b[200];
        snprintf(c->blas_why, sizeof c->blas_why, "cuBLAS workspace: %s", cu_errstr(r, b, sizeof b));
        c->blas_ws = 0;
        cu->cublasDestroy(c->blas);
        c->blas = NULL;
        return;
    }
    c->blas_ws_bytes = CUDA_BLAS_WORKSPACE;
    /* SetStream resets the workspace to cuBLAS's pool, so the workspace comes second */
    s = cu->cublasSetStream(c->blas, c->stream);
    if (s == CUBLAS_STATUS_SUCCESS) s = cu->cublasSetWorkspace(c->blas, (void *)(uintptr_t)c->blas_ws, c->blas_ws_bytes);
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(c->blas_why, sizeof c->blas_why, "cublasSetStream/SetWorkspace failed: status %d (%s)", (int)s,
                 cu->cublasGetStatusString(s));
        cu->cublasDestroy(c->blas);
        c->blas = NULL;
        return;
    }
    if (cu->cublasGetVersion(c->blas, &c->blas_version) != CUBLAS_STATUS_SUCCESS) c->blas_version = 0;
}

static twk_status cuda_open(int index, void **out) {
    const cu_api *cu = NULL;
    CUdevice dev = 0;
    twk_status st = get_device(index, &cu, &dev);
    if (st != TWK_OK) return st;
    cuda_ctx *c = twk_host_calloc(sizeof *c, "cuda context");
    if (!c) return TWK_ERR_OOM;
    pthread_mutex_init(&c->lock, NULL);
    c->cu = cu;
    c->index = index;
    c->dev = dev;
    c->compute_units = attr(cu, dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    st = parse_env(c);
    if (st != TWK_OK) goto fail;
    st = cuda_check(c, cu->cuDevicePrimaryCtxRetain(&c->cuctx, dev), "cuDevicePrimaryCtxRetain");
    if (st != TWK_OK) {
        c->cuctx = NULL;
        goto fail;
    }
    st = cuda_set_current(c);
    if (st == TWK_OK) st = cuda_check(c, cu->cuStreamCreate(&c->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    if (st != TWK_OK) goto fail;
    CUresult r = cu->cuModuleLoadData(&c->module, twk_cuda_fatbin);
    if (r != CUDA_SUCCESS) {
        char b[200];
        st = twk_error(TWK_ERR_BACKEND,
                       "cuda: loading the kernels (fatbin for %s, %zu bytes) on sm_%d%d with driver %d.%d failed: %s",
                       twk_cuda_fatbin_archs, twk_cuda_fatbin_size, attr(cu, dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                       attr(cu, dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR), cu->driver_version / 1000,
                       cu->driver_version % 1000 / 10, cu_errstr(r, b, sizeof b));
        c->module = NULL;
        goto fail;
    }
    open_blas(c);
    if (c->profile) {
        bool ok = cu->cuEventCreate && cu->cuEventRecord && cu->cuEventSynchronize && cu->cuEventElapsedTime &&
                  cu->cuEventDestroy;
        for (int i = 0; ok && i < 2; i++) ok = cu->cuEventCreate(&c->ev[i], CU_EVENT_DEFAULT) == CUDA_SUCCESS;
        if (!ok) {
            twk_log(TWK_LOG_WARN, "twinkle: cuda: TWK_PROFILE needs the driver's events (12.8+); not profiling");
            c->profile = false;
        }
    }
    *out = c;
    return TWK_OK;
fail:
    cuda_close(c);
    return st;
}

/* ---- buffers ------------------------------------------------------------------ */

static twk_status cuda_buffer_alloc_locked(void *vctx, size_t bytes, twk_buffer **out) {
    cuda_ctx *c = vctx;
    twk_status st = cuda_set_current(c);
    if (st != TWK_OK) return st;
    cuda_buffer *b = twk_host_calloc(sizeof *b, "cuda buffer");
    if (!b) return TWK_ERR_OOM;
    CUresult r = c->cu->cuMemAlloc(&b->ptr, bytes ? bytes : 1);
    if (r != CUDA_SUCCESS) {
        twk_host_free(b);
        char what[64];
        snprintf(what, sizeof what, "cuMemAlloc(%zu bytes)", bytes);
        return cuda_check(c, r, what);
    }
    b->base.size = bytes;
    *out = &b->base;
    return TWK_OK;
}

static void cuda_buffer_free_locked(cuda_ctx *c, twk_buffer *buf) {
    cuda_buffer *b = (cuda_buffer *)buf;
    if (!b) return;
    if (cuda_set_current(c) == TWK_OK) {
        c->cu->cuStreamSynchronize(c->stream); /* no queued kernel may still use it */
        c->cu->cuMemFree(b->ptr);
    }
    twk_host_free(b);
}

static twk_status cuda_upload_locked(void *vctx, twk_buffer *dst, size_t off, const void *src, size_t n) {
    cuda_ctx *c = vctx;
    twk_status st = cuda_set_current(c);
    if (st != TWK_OK) return st;
    st = cuda_check(c, c->cu->cuMemcpyHtoDAsync(((cuda_buffer *)dst)->ptr + off, src, n, c->stream), "upload");
    /* the caller may reuse src as soon as we return */
    twk_status s2 = cuda_check(c, c->cu->cuStreamSynchronize(c->stream), "upload (synchronize)");
    return st != TWK_OK ? st : s2;
}

static twk_status cuda_download_locked(void *vctx, const twk_buffer *src, size_t off, void *dst, size_t n) {
    cuda_ctx *c = vctx;
    twk_status st = cuda_set_current(c);
    if (st != TWK_OK) return st;
    st = cuda_check(c, c->cu->cuMemcpyDtoHAsync(dst, ((const cuda_buffer *)src)->ptr + off, n, c->stream), "download");
    twk_status s2 = cuda_check(c, c->cu->cuStreamSynchronize(c->stream), "download (synchronize)");
    return st != TWK_OK ? st : s2;
}

static twk_status cuda_copy_locked(void *vctx, twk_buffer *dst, size_t doff, const twk_buffer *src, size_t soff,
                            size_t n) {
    cuda_ctx *c = vctx;
    twk_status st = cuda_set_current(c);
    if (st != TWK_OK) return st;
    CUdeviceptr d = ((cuda_buffer *)dst)->ptr + doff, s = ((const cuda_buffer *)src)->ptr + soff;
    if (d == s) return TWK_OK;
    if (d < s + n && s < d + n) { /* overlapping (memmove semantics): through a temporary */
        CUdeviceptr tmp = 0;
        st = cuda_check(c, c->cu->cuMemAlloc(&tmp, n), "copy (temporary)");
        if (st != TWK_OK) return st;
        st = cuda_check(c, c->cu->cuMemcpyDtoDAsync(tmp, s, n, c->stream), "copy");
        if (st == TWK_OK) st = cuda_check(c, c->cu->cuMemcpyDtoDAsync(d, tmp, n, c->stream), "copy");
        c->cu->cuStreamSynchronize(c->stream);
        c->cu->cuMemFree(tmp);
        return st;
    }
    return cuda_check(c, c->cu->cuMemcpyDtoDAsync(d, s, n, c->stream), "copy");
}

static twk_status cuda_memset_zero_locked(void *vctx, twk_buffer *dst, size_t off, size_t n) {
    cuda_ctx *c = vctx;
    twk_status st = cuda_set_current(c);
    if (st != TWK_OK) return st;
    return cuda_check(c, c->cu->cuMemsetD8Async(((cuda_buffer *)dst)->ptr + off, 0, n, c->stream), "memset");
}

static twk_status cuda_synchronize_locked(void *vctx) {
    cuda_ctx *c = vctx;
    twk_status st = cuda_set_current(c);
    if (st != TWK_OK) return st;
    return cuda_check(c, c->cu->cuStreamSynchronize(c->stream), "synchronize");
}

/* ---- entry points: one thread at a time ---------------------------------------- */

#define LOCKED_(call)                           \
    cuda_ctx *c_ = vctx;                        \
    pthread_mutex_lock(&c_->lock);              \
    twk_status st_ = call;                      \
    pthread_mutex_unlock(&c_->lock);            \
    return st_;

static twk_status cuda_buffer_alloc(void *vctx, size_t bytes, twk_buffer **out) {
    LOCKED_(cuda_buffer_alloc_locked(vctx, bytes, out))
}
static void cuda_buffer_free(void *vctx, twk_buffer *buf) {
    cuda_ctx *c = vctx;
    pthread_mutex_lock(&c->lock);
    cuda_buffer_free_locked(c, buf);
    pthread_mutex_unlock(&c->lock);
}
static twk_status cuda_upload(void *vctx, twk_buffer *dst, size_t off, const void *src, size_t n) {
    LOCKED_(cuda_upload_locked(vctx, dst, off, src, n))
}
static twk_status cuda_download(void *vctx, const twk_buffer *src, size_t off, void *dst, size_t n) {
    LOCKED_(cuda_download_locked(vctx, src, off, dst, n))
}
static twk_status cuda_copy(void *vctx, twk_buffer *dst, size_t doff, const twk_buffer *src, size_t soff, size_t n) {
    LOCKED_(cuda_copy_locked(vctx, dst, doff, src, soff, n))
}
static twk_status cuda_memset_zero(void *vctx, twk_buffer *dst, size_t off, size_t n) {
    LOCKED_(cuda_memset_zero_locked(vctx, dst, off, n))
}
static twk_status cuda_synchronize(void *vctx) { LOCKED_(cuda_synchronize_locked(vctx)) }

static const twk_backend_iface cuda_iface = {
    .name = "cuda",
    .device_count = cuda_device_count,
    .device_props = cuda_device_props,
    .open = cuda_open,
    .close = cuda_close,
    .buffer_alloc = cuda_buffer_alloc,
    .buffer_free = cuda_buffer_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .memset_zero = cuda_memset_zero,
    .supports_op = cuda_supports_op,
    .op_kernel = kd_op_kernel,
    .prepare = cuda_prepare,
    .release = cuda_release,
    .run = cuda_run,
    .synchronize = cuda_synchronize,
    .half_srcs = kd_half_srcs,
};

const twk_backend_iface *twk_cuda_backend(void) { return &cuda_iface; }
