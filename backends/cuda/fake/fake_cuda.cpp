/* A fake libcuda.so.1 + libcublas.so.13 for machines without a GPU (a test
 * tool, never shipped; see README.md): device
 * memory is host memory, streams are synchronous, kernels are the shared
 * .cl kernels compiled for the host (fake_kernels.cpp) and run group by
 * group, stream capture records closures that graphs replay. Checks the
 * launch configuration and parameter count like the driver would. */
#include <cuda.h>
#include <cublas_v2.h>
#include <ucontext.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fake_prelude.h"

extern "C" const fake_kernel fake_kernels[];
fake_item fake_cur;

typedef std::vector<std::function<void()>> op_list;
struct fake_stream { bool capturing = false; op_list *rec = nullptr; };
static std::map<uintptr_t, size_t> allocs;
static long n_launches, n_graph_launches, n_captures;

static void fail(const char *fmt, const char *a = "", long b = 0) {
    fprintf(stderr, "FAKE CUDA: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    abort();
}

static void submit(CUstream s, std::function<void()> f) {
    fake_stream *fs = (fake_stream *)s;
    if (fs && fs->capturing) fs->rec->push_back(f);
    else f();
}

/* ---- coroutines for groups with barriers ---- */
static const size_t STACK = 512 << 10;
/* coroutine stacks, kept between launches and freed at exit */
static struct stack_pool {
    std::vector<char *> v;
    ~stack_pool() {
        for (char *s : v) free(s);
    }
} stacks;
static ucontext_t sched_ctx;
static std::vector<ucontext_t> item_ctx;
static std::vector<int> item_done;
static int cur_item;
static bool in_coroutines;
static const fake_kernel *cur_kernel;
static void **cur_params;

void fake_barrier(void) {
    if (!in_coroutines) fail("kernel %s reached a barrier without local memory", cur_kernel->name);
    swapcontext(&item_ctx[cur_item], &sched_ctx);
}

static void item_entry(void) {
    cur_kernel->fn(cur_params);
    item_done[cur_item] = 1;
    /* returns to uc_link = sched_ctx */
}

static void run_group(const fake_kernel *k, void **params, const unsigned g[3], const unsigned gr[3],
                      const unsigned b[3]) {
    int L = (int)(b[0] * b[1] * b[2]);
    for (int d = 0; d < 3; d++) {
        fake_cur.group[d] = g[d];
        fake_cur.lsize[d] = b[d];
        fake_cur.ngroups[d] = gr[d];
    }
    auto set_item = [&](int i) {
        fake_cur.lid[0] = i % b[0];
        fake_cur.lid[1] = (i / b[0]) % b[1];
        fake_cur.lid[2] = i / (b[0] * b[1]);
    };
    if (!k->uses_local) {
        for (int i = 0; i < L; i++) {
            set_item(i);
            k->fn(params);
        }
        return;
    }
    while ((int)stacks.v.size() < L) stacks.v.push_back((char *)malloc(STACK));
    item_ctx.resize(L);
    item_done.assign(L, 0);
    cur_kernel = k;
    cur_params = params;
    in_coroutines = true;
    for (int i = 0; i < L; i++) {
        getcontext(&item_ctx[i]);
        item_ctx[i].uc_stack.ss_sp = stacks.v[i];
        item_ctx[i].uc_stack.ss_size = STACK;
        item_ctx[i].uc_link = &sched_ctx;
        makecontext(&item_ctx[i], item_entry, 0);
    }
    for (;;) {
        int alive = 0;
        for (int i = 0; i < L; i++) {
            if (item_done[i]) continue;
            cur_item = i;
            set_item(i);
            swapcontext(&sched_ctx, &item_ctx[i]);
            alive += !item_done[i];
        }
        if (!alive) break;
        int done = 0;
        for (int i = 0; i < L; i++) done += item_done[i];
        if (done) fail("kernel %s: some items returned while others wait at a barrier (%ld done)", k->name, done);
    }
    in_coroutines = false;
}

extern "C" {

CUresult cuGetErrorName(CUresult e, const char **s) { *s = e == CUDA_SUCCESS ? "CUDA_SUCCESS" : "CUDA_ERROR_FAKE"; return CUDA_SUCCESS; }
CUresult cuGetErrorString(CUresult e, const char **s) { *s = e == CUDA_SUCCESS ? "no error" : "fake error"; return CUDA_SUCCESS; }
CUresult cuInit(unsigned) { return CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return CUDA_SUCCESS; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice *d, int i) { if (i != 0) return CUDA_ERROR_INVALID_DEVICE; *d = 0; return CUDA_SUCCESS; }
CUresult cuDeviceGetName(char *name, int len, CUdevice) { snprintf(name, len, "Fake GPU (host emulation)"); return CUDA_SUCCESS; }
CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice) {
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *v = 2048; break;
    default: *v = 0;
    }
    return CUDA_SUCCESS;
}
CUresult cuDeviceTotalMem(size_t *b, CUdevice) { *b = (size_t)141 << 30; return CUDA_SUCCESS; }
static int ctx_dummy, ctx_refs;
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice) { ctx_refs++; *c = (CUcontext)&ctx_dummy; return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxRelease(CUdevice) { if (--ctx_refs < 0) fail("primary ctx released too often"); return CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext) { return CUDA_SUCCESS; }
CUresult cuStreamCreate(CUstream *s, unsigned) { *s = (CUstream) new fake_stream; return CUDA_SUCCESS; }
CUresult cuStreamDestroy(CUstream s) { delete (fake_stream *)s; return CUDA_SUCCESS; }
CUresult cuStreamSynchronize(CUstream s) {
    if (s && ((fake_stream *)s)->capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return CUDA_SUCCESS;
}
CUresult cuMemAlloc(CUdeviceptr *p, size_t n) {
    if (n == 0) return CUDA_ERROR_INVALID_VALUE;
    void *m = malloc(n);
    memset(m, 0xA5, n); /* garbage, like fresh device memory */
    *p = (CUdeviceptr)(uintptr_t)m;
    allocs[(uintptr_t)m] = n;
    return CUDA_SUCCESS;
}
CUresult cuMemFree(CUdeviceptr p) {
    if (!allocs.erase((uintptr_t)p)) fail("cuMemFree of an unknown pointer");
    free((void *)(uintptr_t)p);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyHtoDAsync(CUdeviceptr d, const void *s, size_t n, CUstream st) {
    submit(st, [=] { memcpy((void *)(uintptr_t)d, s, n); });
    return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoHAsync(void *d, CUdeviceptr s, size_t n, CUstream st) {
    submit(st, [=] { memcpy(d, (void *)(uintptr_t)s, n); });
    return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
    submit(st, [=] { memcpy((void *)(uintptr_t)d, (void *)(uintptr_t)s, n); });
    return CUDA_SUCCESS;
}
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream st) {
    submit(st, [=] { memset((void *)(uintptr_t)d, v, n); });
    return CUDA_SUCCESS;
}
static int module_dummy;
CUresult cuModuleLoadData(CUmodule *m, const void *img) {
    if (!img || ((const uint32_t *)img)[0] != 0xba55ed50u) return CUDA_ERROR_INVALID_IMAGE; /* fatbin magic */
    *m = (CUmodule)&module_dummy;
    return CUDA_SUCCESS;
}
CUresult cuModuleUnload(CUmodule) { return CUDA_SUCCESS; }
CUresult cuModuleGetFunction(CUfunction *f, CUmodule, const char *name) {
    for (const fake_kernel *k = fake_kernels; k->name; k++)
        if (!strcmp(k->name, name)) {
            *f = (CUfunction)k;
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_NOT_FOUND;
}
CUresult cuFuncGetParamInfo(CUfunction f, size_t i, size_t *off, size_t *size) {
    const fake_kernel *k = (const fake_kernel *)f;
    if ((int)i >= k->nparams) return CUDA_ERROR_INVALID_VALUE;
    size_t o = 0;
    for (size_t j = 0; j < i; j++) o += k->sizes[j];
    *off = o;
    *size = k->sizes[i];
    return CUDA_SUCCESS;
}
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, CUstream st, void **params, void **extra) {
    const fake_kernel *k = (const fake_kernel *)f;
    if (extra || shmem) fail("kernel %s: unexpected extra/shared memory", k->name);
    if (!gx || !gy || !gz || !bx || !by || !bz || (long)bx * by * bz > 1024 || gy > 65535 || gz > 65535)
        return CUDA_ERROR_INVALID_VALUE;
    /* copy the values now, as the driver does */
    std::vector<std::vector<char>> vals(k->nparams);
    for (int i = 0; i < k->nparams; i++) {
        if (!params[i]) fail("kernel %s: NULL parameter pointer %ld", k->name, i);
        vals[i].assign((char *)params[i], (char *)params[i] + k->sizes[i]);
    }
    unsigned grid[3] = {gx, gy, gz}, blk[3] = {bx, by, bz};
    submit(st, [=]() mutable {
        std::vector<void *> p(k->nparams);
        for (int i = 0; i < k->nparams; i++) p[i] = vals[i].data();
        n_launches++;
        for (unsigned z = 0; z < grid[2]; z++)
            for (unsigned y = 0; y < grid[1]; y++)
                for (unsigned x = 0; x < grid[0]; x++) {
                    unsigned g[3] = {x, y, z};
                    run_group(k, p.data(), g, grid, blk);
                }
    });
    return CUDA_SUCCESS;
}
CUresult cuStreamBeginCapture(CUstream s, CUstreamCaptureMode) {
    fake_stream *fs = (fake_stream *)s;
    if (fs->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    fs->capturing = true;
    fs->rec = new op_list;
    n_captures++;
    return CUDA_SUCCESS;
}
CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
    fake_stream *fs = (fake_stream *)s;
    if (!fs->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    fs->capturing = false;
    if (getenv("FAKE_CUDA_FAIL_CAPTURE")) { /* test the caller's fallback */
        delete fs->rec;
        fs->rec = nullptr;
        *g = nullptr;
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *g = (CUgraph)fs->rec;
    fs->rec = nullptr;
    return CUDA_SUCCESS;
}
CUresult cuGraphInstantiate(CUgraphExec *e, CUgraph g, unsigned long long) {
    *e = (CUgraphExec) new op_list(*(op_list *)g);
    return CUDA_SUCCESS;
}
CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
    if (((fake_stream *)s)->capturing) fail("graph launch while capturing");
    n_graph_launches++;
    for (auto &f : *(op_list *)e) f();
    return CUDA_SUCCESS;
}
CUresult cuGraphExecDestroy(CUgraphExec e) { delete (op_list *)e; return CUDA_SUCCESS; }
CUresult cuGraphDestroy(CUgraph g) { delete (op_list *)g; return CUDA_SUCCESS; }

/* ---- cuBLAS ---- */
struct fake_blas { CUstream stream = nullptr; void *ws = nullptr; };
cublasStatus_t cublasCreate(cublasHandle_t *h) { *h = (cublasHandle_t) new fake_blas; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasDestroy(cublasHandle_t h) { delete (fake_blas *)h; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasGetVersion(cublasHandle_t, int *v) { *v = 130000; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    ((fake_blas *)h)->stream = (CUstream)s;
    ((fake_blas *)h)->ws = nullptr;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t) { ((fake_blas *)h)->ws = ws; return CUBLAS_STATUS_SUCCESS; }
const char *cublasGetStatusString(cublasStatus_t) { return "fake status"; }

static cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, long long sa, const float *B, int ldb,
                           long long sb, const float *beta, float *C, int ldc, long long sc, int batch) {
    fake_blas *fb = (fake_blas *)h;
    fake_stream *fs = (fake_stream *)fb->stream;
    if (fs && fs->capturing && !fb->ws) fail("cuBLAS GEMM captured without a workspace");
    if (m < 0 || n < 0 || k < 0 || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (lda < (ta == CUBLAS_OP_N ? (m > 1 ? m : 1) : (k > 1 ? k : 1))) return CUBLAS_STATUS_INVALID_VALUE;
    if (ldb < (tb == CUBLAS_OP_N ? (k > 1 ? k : 1) : (n > 1 ? n : 1))) return CUBLAS_STATUS_INVALID_VALUE;
    if (ldc < (m > 1 ? m : 1)) return CUBLAS_STATUS_INVALID_VALUE;
    float al = *alpha, be = *beta;
    submit(fb->stream, [=] {
        for (int bi = 0; bi < batch; bi++) {
            const float *a = A + bi * sa, *b = B + bi * sb;
            float *c = C + bi * sc;
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++) {
                    float s = 0;
                    for (int l = 0; l < k; l++) {
                        float av = ta == CUBLAS_OP_N ? a[i + (long)l * lda] : a[l + (long)i * lda];
                        float bv = tb == CUBLAS_OP_N ? b[l + (long)j * ldb] : b[j + (long)l * ldb];
                        s += av * bv;
                    }
                    c[i + (long)j * ldc] = al * s + (be != 0 ? be * c[i + (long)j * ldc] : 0.0f);
                }
        }
    });
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                         int k, const float *alpha, const float *A, int lda, long long sa,
                                         const float *B, int ldb, long long sb, const float *beta, float *C, int ldc,
                                         long long sc, int batch) {
    return gemm(h, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch);
}
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType at, int lda,
                                          long long sa, const void *B, cudaDataType bt, int ldb, long long sb,
                                          const void *beta, void *C, cudaDataType ct, int ldc, long long sc,
                                          int batch, cublasComputeType_t comp, cublasGemmAlgo_t) {
    if (at != CUDA_R_32F || bt != CUDA_R_32F || ct != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (comp != CUBLAS_COMPUTE_32F_FAST_TF32 && comp != CUBLAS_COMPUTE_32F_FAST_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
    return gemm(h, ta, tb, m, n, k, (const float *)alpha, (const float *)A, lda, sa, (const float *)B, ldb, sb,
                (const float *)beta, (float *)C, ldc, sc, batch);
}

__attribute__((destructor)) static void report(void) {
    if (getenv("FAKE_CUDA_STATS"))
        fprintf(stderr, "fake cuda: %ld kernel runs, %ld graph launches, %ld captures, %zu live allocations\n",
                n_launches, n_graph_launches, n_captures, allocs.size());
}
}
