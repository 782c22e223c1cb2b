/* A fake libcuda.so.1 + libcublas.so.13 for machines without a GPU (a test
 * tool, never shipped; see README.md): device memory is host memory,
 * streams are synchronous, kernels are the shared .cl kernels compiled for
 * the host (fake_kernels.c, written by gen_kernels.py) and run group by
 * group, stream capture records the work that graphs replay. Checks launch
 * configurations and parameter lists as the driver would. */
#define _GNU_SOURCE
#include <cuda.h>
#include <cublas_v2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>

#include "fake_prelude.h"

extern const fake_kernel fake_kernels[];
fake_item fake_cur;

static long n_launches, n_graph_launches, n_captures, n_allocs;

static void fail(const char *what, const char *name) {
    fprintf(stderr, "FAKE CUDA: %s%s%s\n", what, name ? ": " : "", name ? name : "");
    abort();
}

/* ---- queued work: run at once, or recorded while a stream captures ---- */

typedef enum { OP_COPY, OP_SET, OP_LAUNCH, OP_GEMM, OP_EVENT } op_kind;

typedef struct gemm_args {
    cublasOperation_t ta, tb;
    int m, n, k, lda, ldb, ldc, batch;
    long long sa, sb, sc;
    const float *A, *B;
    float *C;
    float alpha, beta;
} gemm_args;

typedef struct fake_op {
    op_kind kind;
    void *dst;
    const void *src;
    size_t bytes;
    unsigned char value;
    const fake_kernel *k;
    unsigned grid[3], block[3];
    unsigned char *params; /* the kernel's parameter values, packed by k->sizes */
    gemm_args g;
} fake_op;

typedef struct op_list {
    fake_op *v;
    int n, cap;
} op_list;

typedef struct fake_stream {
    int capturing;
    op_list *rec;
} fake_stream;

static void push(op_list *l, const fake_op *o) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->v = realloc(l->v, (size_t)l->cap * sizeof *l->v);
        if (!l->v) fail("out of host memory", NULL);
    }
    l->v[l->n++] = *o;
}

static void list_free(op_list *l) {
    if (!l) return;
    for (int i = 0; i < l->n; i++) free(l->v[i].params);
    free(l->v);
    free(l);
}

static void run_op(const fake_op *o);

/* takes ownership of o->params */
static void submit(CUstream s, fake_op *o) {
    fake_stream *fs = (fake_stream *)s;
    if (fs && fs->capturing) {
        push(fs->rec, o);
        return;
    }
    run_op(o);
    free(o->params);
}

/* ---- kernels: coroutines for the items of groups that use local memory ---- */

/* On x86-64 the items switch with fake_switch below: glibc's swapcontext / getcontext make an
 * rt_sigprocmask system call at every switch, which was ~3/4 of the fake driver's time in the
 * barrier-heavy kernels (test_reduce). Under AddressSanitizer each switch tells ASan which stack
 * it moves to (its fiber annotations), as its swapcontext interceptor would. */
#if defined(__x86_64__)
#define FAKE_OWN_SWITCH 1
#else
#define FAKE_OWN_SWITCH 0
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define FAKE_ASAN 1
#else
#define FAKE_ASAN 0
#endif

#define STACK_BYTES (512u << 10)
#define MAX_ITEMS 1024
static char *stacks[MAX_ITEMS];
static int item_done[MAX_ITEMS];
static int cur_item, in_coroutines;
static const fake_kernel *cur_kernel;
static void **cur_params;

static void item_entry(void) {
    cur_kernel->fn(cur_params);
    item_done[cur_item] = 1;
}

#if FAKE_OWN_SWITCH
/* fake_switch(save, load): pushes the callee-saved registers (rbp, rbx, r12-r15) and the MXCSR /
 * x87 control words, stores the stack pointer in *save, then restores the same from the stack at
 * load and returns on it. */
__attribute__((visibility("hidden"))) void fake_switch(void **save, void *load);
__asm__(".text\n"
        ".p2align 4\n"
        ".globl fake_switch\n"
        ".hidden fake_switch\n"
        ".type fake_switch, @function\n"
        "fake_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size fake_switch, .-fake_switch\n");

static void *sched_sp, *item_sp[MAX_ITEMS];

#if FAKE_ASAN
/* ASan's view of the switches: the scheduler's stack (learned at an item's first landing), and
 * each side's saved fake stack (stack-use-after-return frames). */
static const void *sched_bottom;
static size_t sched_size;
static void *sched_fake, *item_fake[MAX_ITEMS];
static void to_item(int i) { __sanitizer_start_switch_fiber(&sched_fake, stacks[i], STACK_BYTES); }
static void back_in_scheduler(void) { __sanitizer_finish_switch_fiber(sched_fake, NULL, NULL); }
static void to_scheduler(int i, int finished) {
    __sanitizer_start_switch_fiber(finished ? NULL : &item_fake[i], sched_bottom, sched_size);
}
static void landed_in_item(int i, int first) {
    __sanitizer_finish_switch_fiber(first ? NULL : item_fake[i], &sched_bottom, &sched_size);
}
/* a finished item's last frame stays poisoned on its stack, which the next item reuses */
static void stack_reset(char *stack) { ASAN_UNPOISON_MEMORY_REGION(stack, STACK_BYTES); }
#else
static void to_item(int i) { (void)i; }
static void back_in_scheduler(void) {}
static void to_scheduler(int i, int finished) { (void)i, (void)finished; }
static void landed_in_item(int i, int first) { (void)i, (void)first; }
static void stack_reset(char *stack) { (void)stack; }
#endif

/* An item's first frame: runs it, then hands control back for good. */
static void item_start(void) {
    landed_in_item(cur_item, 1);
    item_entry();
    void *dead;
    to_scheduler(cur_item, 1);
    fake_switch(&dead, sched_sp);
    fail("a finished item was resumed", cur_kernel->name);
}

/* A new item's stack: the frame fake_switch pops (zeroed registers, this thread's control words),
 * returning into item_start with the stack aligned as at a function's entry. */
static void *item_stack(char *stack) {
    void **sp = (void **)(((uintptr_t)(stack + STACK_BYTES)) & ~(uintptr_t)15);
    *--sp = NULL; /* item_start's return address slot: it never returns */
    *--sp = (void *)item_start;
    for (int r = 0; r < 6; r++) *--sp = NULL;
    uint32_t mxcsr = 0;
    uint16_t fpucw = 0;
    __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
    __asm__ volatile("fnstcw %0" : "=m"(fpucw));
    unsigned char words[8] = {0}; /* as fake_switch stores them: MXCSR at 0, the x87 word at 4 */
    memcpy(words, &mxcsr, sizeof mxcsr);
    memcpy(words + 4, &fpucw, sizeof fpucw);
    memcpy(--sp, words, sizeof words);
    return sp;
}

void fake_barrier(void) {
    if (!in_coroutines) fail("a barrier in a kernel without local memory", cur_kernel ? cur_kernel->name : NULL);
    int i = cur_item;
    to_scheduler(i, 0);
    fake_switch(&item_sp[i], sched_sp);
    landed_in_item(i, 0);
}

static void item_prepare(int i) {
    stack_reset(stacks[i]);
    item_sp[i] = item_stack(stacks[i]);
}
static void item_resume(int i) {
    to_item(i);
    fake_switch(&sched_sp, item_sp[i]);
    back_in_scheduler();
}
#else
static ucontext_t sched_ctx, item_ctx[MAX_ITEMS];

void fake_barrier(void) {
    if (!in_coroutines) fail("a barrier in a kernel without local memory", cur_kernel ? cur_kernel->name : NULL);
    swapcontext(&item_ctx[cur_item], &sched_ctx);
}

static void item_prepare(int i) {
    getcontext(&item_ctx[i]);
    item_ctx[i].uc_stack.ss_sp = stacks[i];
    item_ctx[i].uc_stack.ss_size = STACK_BYTES;
    item_ctx[i].uc_link = &sched_ctx; /* item_entry's return goes back to the scheduler */
    makecontext(&item_ctx[i], item_entry, 0);
}
static void item_resume(int i) { swapcontext(&sched_ctx, &item_ctx[i]); }
#endif

static void set_item(int i, const unsigned b[3]) {
    fake_cur.lid[0] = i % (int)b[0];
    fake_cur.lid[1] = (i / (int)b[0]) % (int)b[1];
    fake_cur.lid[2] = i / (int)(b[0] * b[1]);
}

static void run_group(const fake_kernel *k, void **params, const unsigned g[3], const unsigned gr[3],
                      const unsigned b[3]) {
    int L = (int)(b[0] * b[1] * b[2]);
    for (int d = 0; d < 3; d++) {
        fake_cur.group[d] = g[d];
        fake_cur.lsize[d] = b[d];
        fake_cur.ngroups[d] = gr[d];
    }
    cur_kernel = k;
    if (!k->uses_local) {
        for (int i = 0; i < L; i++) {
            set_item(i, b);
            k->fn(params);
        }
        return;
    }
    cur_params = params;
    in_coroutines = 1;
    for (int i = 0; i < L; i++) {
        if (!stacks[i] && !(stacks[i] = malloc(STACK_BYTES))) fail("out of host memory", NULL);
        item_done[i] = 0;
        item_prepare(i);
    }
    for (;;) { /* one round: every live item runs to its next barrier or its end */
        int alive = 0, done = 0;
        for (int i = 0; i < L; i++) {
            if (item_done[i]) continue;
            cur_item = i;
            set_item(i, b);
            item_resume(i);
            alive += !item_done[i];
        }
        if (!alive) break;
        for (int i = 0; i < L; i++) done += item_done[i];
        if (done) fail("items returned while others wait at a barrier", k->name);
    }
    in_coroutines = 0;
}

static void run_gemm(const gemm_args *a) {
    for (int bi = 0; bi < a->batch; bi++) {
        const float *A = a->A + bi * a->sa, *B = a->B + bi * a->sb;
        float *C = a->C + bi * a->sc;
        for (int j = 0; j < a->n; j++)
            for (int i = 0; i < a->m; i++) {
                float s = 0;
                for (int l = 0; l < a->k; l++) {
                    float av = a->ta == CUBLAS_OP_N ? A[i + (long)l * a->lda] : A[l + (long)i * a->lda];
                    float bv = a->tb == CUBLAS_OP_N ? B[l + (long)j * a->ldb] : B[j + (long)l * a->ldb];
                    s += av * bv;
                }
                float *c = &C[i + (long)j * a->ldc];
                *c = a->alpha * s + (a->beta != 0 ? a->beta * *c : 0.0f);
            }
    }
}

/* Offset of parameter i in a launch's copied parameter buffer: each at its natural alignment (its
 * size: 4 or 8), as CUDA lays kernel parameters out; param_offset(k, nparams) is the buffer's size. */
static size_t param_offset(const fake_kernel *k, int i) {
    size_t o = 0;
    for (int j = 0; j < i; j++) {
        size_t sz = (size_t)k->sizes[j], next = j + 1 < k->nparams ? (size_t)k->sizes[j + 1] : 8;
        o += sz;
        if (next) o = (o + next - 1) / next * next;
    }
    return o;
}

static void run_op(const fake_op *o) {
    switch (o->kind) {
    case OP_COPY: memcpy(o->dst, o->src, o->bytes); break;
    case OP_SET: memset(o->dst, o->value, o->bytes); break;
    case OP_GEMM: run_gemm(&o->g); break;
    case OP_EVENT: {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        *(double *)o->dst = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
        break;
    }
    case OP_LAUNCH: {
        void *p[64];
        for (int i = 0; i < o->k->nparams; i++) p[i] = o->params + param_offset(o->k, i);
        n_launches++;
        for (unsigned z = 0; z < o->grid[2]; z++)
            for (unsigned y = 0; y < o->grid[1]; y++)
                for (unsigned x = 0; x < o->grid[0]; x++) {
                    unsigned g[3] = {x, y, z};
                    run_group(o->k, p, g, o->grid, o->block);
                }
        break;
    }
    }
}

/* ---- the driver API ---- */

CUresult cuGetErrorName(CUresult e, const char **s) {
    *s = e == CUDA_SUCCESS ? "CUDA_SUCCESS" : "CUDA_ERROR_FAKE";
    return CUDA_SUCCESS;
}
CUresult cuGetErrorString(CUresult e, const char **s) {
    *s = e == CUDA_SUCCESS ? "no error" : "fake error";
    return CUDA_SUCCESS;
}
CUresult cuInit(unsigned flags) {
    (void)flags;
    return CUDA_SUCCESS;
}
CUresult cuDriverGetVersion(int *v) {
    *v = 13000;
    return CUDA_SUCCESS;
}
CUresult cuDeviceGetCount(int *n) {
    *n = 1;
    return CUDA_SUCCESS;
}
CUresult cuDeviceGet(CUdevice *d, int i) {
    if (i != 0) return CUDA_ERROR_INVALID_DEVICE;
    *d = 0;
    return CUDA_SUCCESS;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    (void)d;
    snprintf(name, (size_t)len, "Fake GPU (host emulation)");
    return CUDA_SUCCESS;
}
CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
    (void)d;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *v = 2048; break;
    default: *v = 0;
    }
    return CUDA_SUCCESS;
}
CUresult cuDeviceTotalMem(size_t *b, CUdevice d) {
    (void)d;
    *b = (size_t)141 << 30;
    return CUDA_SUCCESS;
}
static int ctx_dummy, ctx_refs;
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    (void)d;
    ctx_refs++;
    *c = (CUcontext)(void *)&ctx_dummy;
    return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease(CUdevice d) {
    (void)d;
    if (--ctx_refs < 0) fail("primary context released more often than retained", NULL);
    return CUDA_SUCCESS;
}
CUresult cuCtxSetCurrent(CUcontext c) {
    (void)c;
    return CUDA_SUCCESS;
}
CUresult cuStreamCreate(CUstream *s, unsigned flags) {
    (void)flags;
    *s = (CUstream)calloc(1, sizeof(fake_stream));
    return CUDA_SUCCESS;
}
CUresult cuStreamDestroy(CUstream s) {
    free(s);
    return CUDA_SUCCESS;
}
CUresult cuStreamSynchronize(CUstream s) {
    if (s && ((fake_stream *)s)->capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return CUDA_SUCCESS;
}
CUresult cuMemAlloc(CUdeviceptr *p, size_t n) {
    if (n == 0) return CUDA_ERROR_INVALID_VALUE;
    void *m = malloc(n);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    memset(m, 0xA5, n); /* garbage, like fresh device memory */
    n_allocs++;
    *p = (CUdeviceptr)(uintptr_t)m;
    return CUDA_SUCCESS;
}
CUresult cuMemFree(CUdeviceptr p) {
    n_allocs--;
    free((void *)(uintptr_t)p);
    return CUDA_SUCCESS;
}
static CUresult copy(void *d, const void *s, size_t n, CUstream st) {
    fake_op o = {.kind = OP_COPY, .dst = d, .src = s, .bytes = n};
    submit(st, &o);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyHtoDAsync(CUdeviceptr d, const void *s, size_t n, CUstream st) {
    return copy((void *)(uintptr_t)d, s, n, st);
}
CUresult cuMemcpyDtoHAsync(void *d, CUdeviceptr s, size_t n, CUstream st) {
    return copy(d, (const void *)(uintptr_t)s, n, st);
}
CUresult cuMemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
    return copy((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n, st);
}
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream st) {
    fake_op o = {.kind = OP_SET, .dst = (void *)(uintptr_t)d, .bytes = n, .value = v};
    submit(st, &o);
    return CUDA_SUCCESS;
}
static int module_dummy;
CUresult cuModuleLoadData(CUmodule *m, const void *img) {
    uint32_t magic = 0;
    if (img) memcpy(&magic, img, sizeof magic);
    if (magic != 0xba55ed50u) return CUDA_ERROR_INVALID_IMAGE; /* a fatbin starts so */
    *m = (CUmodule)(void *)&module_dummy;
    return CUDA_SUCCESS;
}
CUresult cuModuleUnload(CUmodule m) {
    (void)m;
    return CUDA_SUCCESS;
}
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    (void)m;
    for (const fake_kernel *k = fake_kernels; k->name; k++)
        if (!strcmp(k->name, name)) {
            *f = (CUfunction)(void *)k;
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_NOT_FOUND;
}
CUresult cuFuncGetParamInfo(CUfunction f, size_t i, size_t *off, size_t *size) {
    const fake_kernel *k = (const fake_kernel *)(void *)f;
    if ((int)i >= k->nparams) return CUDA_ERROR_INVALID_VALUE;
    *off = param_offset(k, (int)i);
    *size = (size_t)k->sizes[i];
    return CUDA_SUCCESS;
}
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, CUstream st, void **params, void **extra) {
    const fake_kernel *k = (const fake_kernel *)(void *)f;
    if (extra || shmem) fail("unexpected extra arguments or dynamic shared memory", k->name);
    if (!gx || !gy || !gz || !bx || !by || !bz || (long)bx * by * bz > MAX_ITEMS || gy > 65535 || gz > 65535 ||
        bz > 64)
        return CUDA_ERROR_INVALID_VALUE;
    size_t total = param_offset(k, k->nparams);
    fake_op o = {.kind = OP_LAUNCH, .k = k, .grid = {gx, gy, gz}, .block = {bx, by, bz}};
    o.params = malloc(total ? total : 1);
    if (!o.params) fail("out of host memory", NULL);
    for (int i = 0; i < k->nparams; i++) { /* the values are copied now, as the driver does */
        if (!params[i]) fail("a NULL parameter pointer", k->name);
        memcpy(o.params + param_offset(k, i), params[i], (size_t)k->sizes[i]);
    }
    submit(st, &o);
    return CUDA_SUCCESS;
}
CUresult cuStreamBeginCapture(CUstream s, CUstreamCaptureMode mode) {
    (void)mode;
    fake_stream *fs = (fake_stream *)s;
    if (fs->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    fs->capturing = 1;
    fs->rec = calloc(1, sizeof(op_list));
    n_captures++;
    return CUDA_SUCCESS;
}
CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
    fake_stream *fs = (fake_stream *)s;
    if (!fs->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    fs->capturing = 0;
    if (getenv("FAKE_CUDA_FAIL_CAPTURE")) { /* tests the caller's fallback */
        list_free(fs->rec);
        fs->rec = NULL;
        *g = NULL;
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *g = (CUgraph)(void *)fs->rec;
    fs->rec = NULL;
    return CUDA_SUCCESS;
}
CUresult cuGraphInstantiate(CUgraphExec *e, CUgraph g, unsigned long long flags) {
    (void)flags;
    const op_list *src = (const op_list *)(void *)g;
    op_list *l = calloc(1, sizeof *l);
    for (int i = 0; i < src->n; i++) {
        fake_op o = src->v[i];
        if (o.params) {
            size_t total = param_offset(o.k, o.k->nparams);
            o.params = malloc(total ? total : 1);
            memcpy(o.params, src->v[i].params, total);
        }
        push(l, &o);
    }
    *e = (CUgraphExec)(void *)l;
    return CUDA_SUCCESS;
}
CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
    if (((fake_stream *)s)->capturing) fail("a graph launched while capturing", NULL);
    const op_list *l = (const op_list *)(void *)e;
    n_graph_launches++;
    for (int i = 0; i < l->n; i++) run_op(&l->v[i]);
    return CUDA_SUCCESS;
}
CUresult cuGraphExecDestroy(CUgraphExec e) {
    list_free((op_list *)(void *)e);
    return CUDA_SUCCESS;
}
CUresult cuGraphDestroy(CUgraph g) {
    list_free((op_list *)(void *)g);
    return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent *e, unsigned flags) {
    (void)flags;
    *e = (CUevent)calloc(1, sizeof(double));
    return CUDA_SUCCESS;
}
CUresult cuEventRecord(CUevent e, CUstream st) {
    fake_op o = {.kind = OP_EVENT, .dst = (void *)e};
    submit(st, &o);
    return CUDA_SUCCESS;
}
CUresult cuEventSynchronize(CUevent e) {
    (void)e;
    return CUDA_SUCCESS;
}
CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    *ms = (float)(1e3 * (*(double *)(void *)b - *(double *)(void *)a));
    return CUDA_SUCCESS;
}
CUresult cuEventDestroy(CUevent e) {
    free(e);
    return CUDA_SUCCESS;
}

/* ---- cuBLAS ---- */

typedef struct fake_blas {
    CUstream stream;
    void *ws;
} fake_blas;

cublasStatus_t cublasCreate(cublasHandle_t *h) {
    *h = (cublasHandle_t)calloc(1, sizeof(fake_blas));
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGetVersion(cublasHandle_t h, int *v) {
    (void)h;
    *v = 130000;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    ((fake_blas *)h)->stream = (CUstream)s;
    ((fake_blas *)h)->ws = NULL; /* as cuBLAS: back to its own pool */
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes) {
    (void)bytes;
    ((fake_blas *)h)->ws = ws;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s) {
    (void)s;
    return "fake status";
}

static int at_least_1(int v) { return v > 1 ? v : 1; }

static cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, long long sa, const float *B, int ldb,
                           long long sb, const float *beta, float *C, int ldc, long long sc, int batch) {
    fake_blas *fb = (fake_blas *)h;
    fake_stream *fs = (fake_stream *)fb->stream;
    if (fs && fs->capturing && !fb->ws) fail("cuBLAS GEMM captured without cublasSetWorkspace", NULL);
    if (m < 0 || n < 0 || k < 0 || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (lda < at_least_1(ta == CUBLAS_OP_N ? m : k) || ldb < at_least_1(tb == CUBLAS_OP_N ? k : n) ||
        ldc < at_least_1(m))
        return CUBLAS_STATUS_INVALID_VALUE;
    fake_op o = {.kind = OP_GEMM};
    o.g = (gemm_args){.ta = ta, .tb = tb, .m = m, .n = n, .k = k, .lda = lda, .ldb = ldb, .ldc = ldc, .batch = batch,
                      .sa = sa, .sb = sb, .sc = sc, .A = A, .B = B, .C = C, .alpha = *alpha, .beta = *beta};
    submit(fb->stream, &o);
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
                                          int batch, cublasComputeType_t comp, cublasGemmAlgo_t algo) {
    (void)algo;
    if (at != CUDA_R_32F || bt != CUDA_R_32F || ct != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (comp != CUBLAS_COMPUTE_32F_FAST_TF32 && comp != CUBLAS_COMPUTE_32F_FAST_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
    return gemm(h, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch);
}

__attribute__((destructor)) static void fake_report(void) {
    for (int i = 0; i < MAX_ITEMS; i++) free(stacks[i]);
    if (getenv("FAKE_CUDA_STATS"))
        fprintf(stderr, "fake cuda: %ld kernel runs, %ld graph launches, %ld captures, %ld live allocations\n",
                n_launches, n_graph_launches, n_captures, n_allocs);
}
