/* CUDA plans: each launch lowered by kd_lower (backends/kernels) to kernel
 * calls (cuLaunchKernel) or a GEMM (cuBLAS), all on the context's stream.
 *
 * Error words: every launch has its own int in a per-plan device buffer, so
 * a bad id names the op and node that saw it. The buffer is zeroed before
 * and read back after each run (only when some launch can store an error).
 *
 * CUDA graphs: the launches for a token count n are captured once and
 * replayed with cuGraphLaunch; a few n's are kept per plan (LRU). A count's
 * first run is eager (it loads kernels and lets cuBLAS pick its algorithms
 * outside capture); its second run captures. Any capture failure turns
 * graphs off for that plan (eager from then on, same results), and so do
 * many captures that are rarely replayed (token counts cycling through more
 * values than the cache holds).
 * TWK_CUDA_GRAPHS=0 disables graphs. */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "kd.h"
#include "cuda_internal.h"

#define GRAPH_CACHE 4 /* captured n's per plan */
#define SEEN_CACHE 8  /* n's run once (eagerly), waiting for a second run */
#define GRAPH_GIVE_UP 16 /* captures after which a plan whose graphs are rarely replayed goes eager */

typedef struct graph_entry {
    int64_t n; /* 0: empty */
    CUgraphExec exec;
    uint64_t used; /* LRU tick */
} graph_entry;

typedef struct cuda_prepared {
    int n_launches;
    bool has_err;       /* some launch takes the error word */
    CUdeviceptr err;    /* n_launches ints */
    int *err_host;
    graph_entry graphs[GRAPH_CACHE];
    int64_t seen[SEEN_CACHE];
    int seen_next;
    uint64_t tick;
    long captures, replays;
    bool graphs_off; /* a capture failed, or captures did not pay: eager from then on */
    CUdeviceptr scratch; /* a 16-bit weight's widened panel or attn_back's delta (kd_gemm_scratch_bytes, kd_scratch_bytes), shared */
    size_t scratch_bytes;
} cuda_prepared;

/* ---- support --------------------------------------------------------------- */

bool cuda_supports_op(void *vctx, const twk_launch *l, char *why, size_t why_len) {
    cuda_ctx *c = vctx;
    char buf[256];
    if (!why || !why_len) {
        why = buf;
        why_len = sizeof buf;
    }
    why[0] = 0;
    if (!kd_supports(l, why, why_len)) return false;
    if (l->op == TWK_OP_MATMUL && !c->blas) {
        snprintf(why, why_len, "no cuBLAS: %s", c->blas_why);
        return false;
    }
    return true;
}

/* ---- one launch -------------------------------------------------------------- */

static const twk_tensor_desc *arg_tensor(const twk_launch *l, int t) {
    if (t < 0) return &l->dst;
    return t < l->nsrc ? &l->src[t] : NULL;
}

static twk_status bad_call(const twk_launch *l, const kd_call *k, const char *what) {
    return twk_error(TWK_ERR_BACKEND, "cuda: %s '%s': kernel %s: %s", twk_op_name(l->op), l->name, k->kernel, what);
}

/* Packs the arguments of one kd_call (KD_BUF and KD_ERR become a pointer
 * and an i64 element offset) and launches it on the stream. */
static twk_status launch_call(cuda_ctx *c, cuda_prepared *pp, const twk_launch *l, int li, const kd_call *k) {
    const cu_api *cu = c->cu;
    union {
        CUdeviceptr ptr;
        int64_t i64;
        int32_t i32;
        float f32;
    } vals[2 * KD_MAX_ARGS];
    void *params[2 * KD_MAX_ARGS];
    int np = 0;
    if (k->nargs < 0 || k->nargs > KD_MAX_ARGS) return bad_call(l, k, "argument count out of range");
    for (int a = 0; a < k->nargs; a++) {
        const kd_arg *ar = &k->args[a];
        switch (ar->kind) {
        case KD_BUF: {
            const twk_tensor_desc *d = arg_tensor(l, ar->tensor);
            if (!d || !d->buf) return bad_call(l, k, "a buffer argument names a tensor without storage");
            vals[np].ptr = ((const cuda_buffer *)d->buf)->ptr;
            params[np] = &vals[np];
            np++;
            vals[np].i64 = ar->i64; /* d->offset in the kernel's elements (kd_buf) */
            params[np] = &vals[np];
            np++;
            break;
        }
        case KD_SCRATCH:
            if (!pp->scratch) return bad_call(l, k, "no scratch buffer was prepared");
            vals[np].ptr = pp->scratch;
            params[np] = &vals[np];
            np++;
            vals[np].i64 = ar->i64;
            params[np] = &vals[np];
            np++;
            break;
        case KD_ERR:
            pp->has_err = true; /* normally known from prepare */
            vals[np].ptr = pp->err;
            params[np] = &vals[np];
            np++;
            vals[np].i64 = li; /* this launch's own word */
            params[np] = &vals[np];
            np++;
            break;
        case KD_I32:
            vals[np].i32 = ar->i32;
            params[np] = &vals[np];
            np++;
            break;
        case KD_I64:
            vals[np].i64 = ar->i64;
            params[np] = &vals[np];
            np++;
            break;
        case KD_F32:
            vals[np].f32 = ar->f32;
            params[np] = &vals[np];
            np++;
            break;
        default: return bad_call(l, k, "unknown argument kind");
        }
    }
    /* grid: kd gives total items per dim; CUDA wants groups per dim */
    unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
    int dims = k->dims < 1 ? 1 : k->dims;
    if (dims > 3) return bad_call(l, k, "more than 3 grid dims");
    size_t threads = 1;
    for (int d = 0; d < dims; d++) {
        size_t loc = k->local[d] ? k->local[d] : 1, glob = k->global[d];
        if (glob == 0) return TWK_OK; /* nothing to do */
        if (glob % loc) return bad_call(l, k, "global size not a multiple of the local size");
        size_t groups = glob / loc;
        size_t gmax = d == 0 ? (size_t)INT_MAX : 65535;
        if (groups > gmax || loc > 1024) {
            char w[160];
            snprintf(w, sizeof w, "dim %d: %zu groups of %zu items exceed CUDA's grid limits (%zu groups, 1024 items)", d,
                     groups, loc, gmax);
            return bad_call(l, k, w);
        }
        grid[d] = (unsigned)groups;
        block[d] = (unsigned)loc;
        threads *= loc;
    }
    if (threads > 1024) return bad_call(l, k, "more than 1024 items in a work-group");
    CUfunction fn = NULL;
    twk_status st = cuda_kernel(c, k->kernel, &fn);
    if (st != TWK_OK) return st;
    CUresult r = cu->cuLaunchKernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], 0, c->stream,
                                    params, NULL);
    if (r != CUDA_SUCCESS) {
        char what[200];
        snprintf(what, sizeof what, "cuLaunchKernel %s (%s '%s', grid %u x %u x %u, block %u x %u x %u)", k->kernel,
                 twk_op_name(l->op), l->name, grid[0], grid[1], grid[2], block[0], block[1], block[2]);
        return cuda_check(c, r, what);
    }
    return TWK_OK;
}

static twk_status blas_fail(cuda_ctx *c, const twk_launch *l, const kd_gemm *g, cublasStatus_t s) {
    char what[160];
    snprintf(what, sizeof what, "matmul '%s' (%lld x %lld x %lld, batch %lld, trans %d%d)", l->name, (long long)g->m,
             (long long)g->n, (long long)g->k, (long long)g->batch, g->trans_a, g->trans_b);
    return cuda_blas_check(c, s, what);
}

/* A 16-bit B (a frozen weight): each panel widened into the scratch by widen_h16, then one f32
 * GEMM of it (kd_gemm_half.c). cublasGemmEx cannot take it as it is stored: its A and B share
 * one type (an f32 activation times a bf16 / f16 weight is not among its combinations), so the
 * weight is widened and the GEMM runs in the context's mode (FP32, or TF32 / BF16 compute). */
static twk_status run_gemm_half(cuda_ctx *c, cuda_prepared *pp, const twk_launch *l, int li, const kd_gemm *g,
                                CUdeviceptr A, CUdeviceptr C) {
    const cu_api *cu = c->cu;
    cublasOperation_t opa = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, opb = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const float alpha = 1.0f;
    for (int64_t p = 0; p < kd_gemm_panels(g); p++) {
        kd_call call;
        kd_gemm_part part;
        kd_widen_call(l, g, p, &call, &part);
        twk_status st = launch_call(c, pp, l, li, &call);
        if (st != TWK_OK) return st;
        CUdeviceptr Ap = A + (CUdeviceptr)part.a_off * sizeof(float), Cp = C + (CUdeviceptr)part.c_off * sizeof(float);
        const void *bp = (const void *)(uintptr_t)pp->scratch, *ap = (const void *)(uintptr_t)Ap;
        cublasStatus_t s;
        if (c->gemm_mode == CUDA_GEMM_FP32)
            s = cu->cublasSgemmStridedBatched(c->blas, opb, opa, (int)part.n, (int)part.m, (int)part.k, &alpha, bp,
                                              (int)g->ldb, 0, ap, (int)g->lda, 0, &part.beta, (float *)(uintptr_t)Cp,
                                              (int)g->ldc, 0, 1);
        else
            s = cu->cublasGemmStridedBatchedEx(c->blas, opb, opa, (int)part.n, (int)part.m, (int)part.k, &alpha, bp,
                                               CUDA_R_32F, (int)g->ldb, 0, ap, CUDA_R_32F, (int)g->lda, 0, &part.beta,
                                               (void *)(uintptr_t)Cp, CUDA_R_32F, (int)g->ldc, 0, 1,
                                               c->gemm_mode == CUDA_GEMM_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                              : CUBLAS_COMPUTE_32F_FAST_16BF,
                                               CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS) return blas_fail(c, l, g, s);
    }
    return TWK_OK;
}

/* Row-major C = op(A) op(B) as column-major C^T = op(B)^T op(A)^T: cuBLAS
 * gets B first, with m and n swapped. A = src 0, B = src 1, C = dst. */
static twk_status run_gemm(cuda_ctx *c, cuda_prepared *pp, const twk_launch *l, int li, const kd_gemm *g) {
    const cu_api *cu = c->cu;
    if (!c->blas) return twk_error(TWK_ERR_UNSUPPORTED, "cuda: matmul '%s': no cuBLAS: %s", l->name, c->blas_why);
    if (g->m == 0 || g->n == 0 || g->batch == 0) return TWK_OK;
    if (g->m > INT_MAX || g->n > INT_MAX || g->k > INT_MAX || g->lda > INT_MAX || g->ldb > INT_MAX ||
        g->ldc > INT_MAX || g->batch > INT_MAX || g->m < 0 || g->n < 0 || g->k < 0 || g->batch < 0)
        return twk_error(TWK_ERR_UNSUPPORTED, "cuda: matmul '%s': dims %lld x %lld x %lld (batch %lld) exceed cuBLAS's int range",
                         l->name, (long long)g->m, (long long)g->n, (long long)g->k, (long long)g->batch);
    const twk_tensor_desc *da = &l->src[0], *db = &l->src[1], *dc = &l->dst;
    if (!da->buf || !db->buf || !dc->buf)
        return twk_error(TWK_ERR_BACKEND, "cuda: matmul '%s': a tensor without storage", l->name);
    CUdeviceptr A = ((const cuda_buffer *)da->buf)->ptr + da->offset;
    CUdeviceptr B = ((const cuda_buffer *)db->buf)->ptr + db->offset;
    CUdeviceptr C = ((const cuda_buffer *)dc->buf)->ptr + dc->offset;
    if (g->k == 0) /* an empty sum: C = 0 (not left to cuBLAS's quick-return rules) */
        return cuda_check(c, cu->cuMemsetD8Async(C, 0, (size_t)(g->m * g->n * g->batch) * twk_dtype_size(dc->type), c->stream),
                          "matmul (k = 0)");
    if (g->b_half) return run_gemm_half(c, pp, l, li, g, A, C);
    cublasOperation_t opa = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, opb = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const float alpha = 1.0f, beta = 0.0f;
    int m = (int)g->m, n = (int)g->n, k = (int)g->k, batch = (int)g->batch;
    cublasStatus_t s;
    if (c->gemm_mode == CUDA_GEMM_FP32) {
        s = cu->cublasSgemmStridedBatched(c->blas, opb, opa, n, m, k, &alpha, (const float *)(uintptr_t)B, (int)g->ldb,
                                          g->stride_b, (const float *)(uintptr_t)A, (int)g->lda, g->stride_a, &beta,
                                          (float *)(uintptr_t)C, (int)g->ldc, g->stride_c, batch);
    } else {
        cublasComputeType_t ct =
            c->gemm_mode == CUDA_GEMM_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_FAST_16BF;
        s = cu->cublasGemmStridedBatchedEx(c->blas, opb, opa, n, m, k, &alpha, (const void *)(uintptr_t)B, CUDA_R_32F,
                                           (int)g->ldb, g->stride_b, (const void *)(uintptr_t)A, CUDA_R_32F,
                                           (int)g->lda, g->stride_a, &beta, (void *)(uintptr_t)C, CUDA_R_32F,
                                           (int)g->ldc, g->stride_c, batch, ct, CUBLAS_GEMM_DEFAULT);
    }
    if (s != CUBLAS_STATUS_SUCCESS) return blas_fail(c, l, g, s);
    return TWK_OK;
}

/* TWK_PROFILE: waits for the launch just queued (between the two events)
 * and adds its time to its op's total. */
static twk_status profile_launch(cuda_ctx *c, const twk_launch *l) {
    const cu_api *cu = c->cu;
    twk_status st = cuda_check(c, cu->cuEventRecord(c->ev[1], c->stream), "cuEventRecord");
    if (st == TWK_OK) st = cuda_check(c, cu->cuEventSynchronize(c->ev[1]), "cuEventSynchronize");
    float ms = 0;
    if (st == TWK_OK) st = cuda_check(c, cu->cuEventElapsedTime(&ms, c->ev[0], c->ev[1]), "cuEventElapsedTime");
    if (st == TWK_OK && (int)l->op >= 0 && l->op < TWK_OP_COUNT) {
        c->prof_s[l->op] += 1e-3 * ms;
        c->prof_n[l->op]++;
    }
    return st;
}

/* Queues every launch of the plan for token count n on the stream (under
 * TWK_PROFILE, runs them one at a time). */
static twk_status enqueue_all(cuda_ctx *c, cuda_prepared *pp, const twk_hal_plan *plan, int64_t n) {
    kd_call calls[KD_MAX_CALLS];
    kd_gemm gemm;
    for (int i = 0; i < plan->n_launches; i++) {
        const twk_launch *l = &plan->launches[i];
        int is_gemm = 0;
        kd_device kdev = {c->compute_units};
        int nc = kd_lower(l, n, &kdev, calls, &gemm, &is_gemm);
        if (nc < 0) return TWK_ERR_UNSUPPORTED; /* kd_lower set the message */
        twk_status st = TWK_OK;
        if (c->profile) st = cuda_check(c, c->cu->cuEventRecord(c->ev[0], c->stream), "cuEventRecord");
        if (is_gemm && st == TWK_OK) st = run_gemm(c, pp, l, i, &gemm);
        for (int k = 0; !is_gemm && k < nc && k < KD_MAX_CALLS && st == TWK_OK; k++)
            st = launch_call(c, pp, l, i, &calls[k]);
        if (c->profile && st == TWK_OK) st = profile_launch(c, l);
        if (st != TWK_OK) return st;
    }
    return TWK_OK;
}

/* ---- graphs -------------------------------------------------------------------- */

static graph_entry *graph_find(cuda_prepared *pp, int64_t n) {
    for (int i = 0; i < GRAPH_CACHE; i++)
        if (pp->graphs[i].n == n) return &pp->graphs[i];
    return NULL;
}

/* The slot a new graph goes to: an empty one, else the least recently used
 * (its graph destroyed). */
static graph_entry *graph_slot(cuda_ctx *c, cuda_prepared *pp) {
    graph_entry *best = &pp->graphs[0];
    for (int i = 0; i < GRAPH_CACHE; i++) {
        if (pp->graphs[i].n == 0) return &pp->graphs[i];
        if (pp->graphs[i].used < best->used) best = &pp->graphs[i];
    }
    if (best->exec) c->cu->cuGraphExecDestroy(best->exec);
    memset(best, 0, sizeof *best);
    return best;
}

/* true the second time n is seen (the first time it is remembered). */
static bool seen_before(cuda_prepared *pp, int64_t n) {
    for (int i = 0; i < SEEN_CACHE; i++)
        if (pp->seen[i] == n) return true;
    pp->seen[pp->seen_next] = n;
    pp->seen_next = (pp->seen_next + 1) % SEEN_CACHE;
    return false;
}

/* Captures the plan at n into an executable graph; TWK_ERR_BACKEND (and
 * nothing queued) when capture or instantiation fails. */
static twk_status capture(cuda_ctx *c, cuda_prepared *pp, const twk_hal_plan *plan, int64_t n, CUgraphExec *out) {
    const cu_api *cu = c->cu;
    twk_status st = cuda_check(c, cu->cuStreamBeginCapture(c->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                               "cuStreamBeginCapture");
    if (st != TWK_OK) return st;
    twk_status qst = enqueue_all(c, pp, plan, n);
    CUgraph graph = NULL;
    CUresult r = cu->cuStreamEndCapture(c->stream, &graph);
    if (qst != TWK_OK) {
        if (graph) cu->cuGraphDestroy(graph);
        return qst;
    }
    st = cuda_check(c, r, "cuStreamEndCapture");
    if (st != TWK_OK) {
        if (graph) cu->cuGraphDestroy(graph);
        return st;
    }
    r = cu->cuGraphInstantiate(out, graph, 0);
    cu->cuGraphDestroy(graph);
    return cuda_check(c, r, "cuGraphInstantiate");
}

static twk_status enqueue_graph(cuda_ctx *c, cuda_prepared *pp, const twk_hal_plan *plan, int64_t n) {
    const cu_api *cu = c->cu;
    graph_entry *g = graph_find(pp, n);
    if (!g) {
        if (!seen_before(pp, n)) return enqueue_all(c, pp, plan, n);
        CUgraphExec exec = NULL;
        if (capture(c, pp, plan, n, &exec) != TWK_OK) {
            /* e.g. an op cuBLAS cannot capture on this driver: run eagerly
             * (which reports any real error of the launches themselves);
             * said once per process, since it costs speed, not results */
            static atomic_int warned;
            if (!atomic_exchange(&warned, 1))
                twk_log(TWK_LOG_WARN, "twinkle: cuda: CUDA graph capture failed (%s); such plans run eagerly",
                        twk_last_error());
            pp->graphs_off = true;
            twk_clear_error();
            return enqueue_all(c, pp, plan, n);
        }
        g = graph_slot(c, pp);
        g->n = n;
        g->exec = exec;
        /* more token counts in turn than the cache holds: each capture costs more
         * than the launches it saves, so such a plan runs eagerly */
        if (++pp->captures >= GRAPH_GIVE_UP && pp->replays < 2 * pp->captures) pp->graphs_off = true;
    } else {
        pp->replays++;
    }
    g->used = ++pp->tick;
    return cuda_check(c, cu->cuGraphLaunch(g->exec, c->stream), "cuGraphLaunch");
}

/* ---- prepare / release / run ------------------------------------------------------ */

static void release_locked(cuda_ctx *c, cuda_prepared *pp) {
    if (!pp) return;
    if (cuda_set_current(c) == TWK_OK) {
        c->cu->cuStreamSynchronize(c->stream);
        for (int i = 0; i < GRAPH_CACHE; i++)
            if (pp->graphs[i].exec) c->cu->cuGraphExecDestroy(pp->graphs[i].exec);
        if (pp->err) c->cu->cuMemFree(pp->err);
        if (pp->scratch) c->cu->cuMemFree(pp->scratch);
    }
    twk_host_free(pp->err_host);
    twk_host_free(pp);
}

/* The byte size of each parameter launch_call packs for k; returns the count. */
static int packed_sizes(const kd_call *k, size_t *sizes) {
    int np = 0;
    for (int a = 0; a < k->nargs && a < KD_MAX_ARGS; a++) {
        switch (k->args[a].kind) {
        case KD_BUF:
        case KD_ERR:
        case KD_SCRATCH:
            sizes[np++] = sizeof(CUdeviceptr);
            sizes[np++] = sizeof(int64_t);
            break;
        case KD_I32: sizes[np++] = sizeof(int32_t); break;
        case KD_I64: sizes[np++] = sizeof(int64_t); break;
        case KD_F32: sizes[np++] = sizeof(float); break;
        default: sizes[np++] = 0; break;
        }
    }
    return np;
}

/* Compares the packed argument list with the kernel's parameters (drivers
 * 12.4+ report them): a mismatch would corrupt the launch, so it fails
 * prepare with both lists' sizes instead. */
static twk_status check_params(cuda_ctx *c, CUfunction fn, const twk_launch *l, const kd_call *k) {
    if (!c->cu->cuFuncGetParamInfo) return TWK_OK;
    size_t sizes[2 * KD_MAX_ARGS];
    int np = packed_sizes(k, sizes);
    for (int i = 0; i <= np; i++) {
        size_t off = 0, sz = 0;
        CUresult r = c->cu->cuFuncGetParamInfo(fn, (size_t)i, &off, &sz);
        if (i == np && r != CUDA_SUCCESS) return TWK_OK; /* no parameter past ours */
        if (i == np || r != CUDA_SUCCESS || sz != sizes[i]) {
            char w[200];
            if (i == np) snprintf(w, sizeof w, "the kernel takes more than the %d parameters kd_lower passes", np);
            else if (r != CUDA_SUCCESS) snprintf(w, sizeof w, "kd_lower passes %d parameters; the kernel takes %d", np, i);
            else snprintf(w, sizeof w, "parameter %d is %zu bytes in the kernel, %zu as packed", i, sz, sizes[i]);
            return twk_error(TWK_ERR_BACKEND, "cuda: %s '%s': kernel %s: %s", twk_op_name(l->op), l->name, k->kernel, w);
        }
    }
    return TWK_OK;
}

/* Looks up every kernel the plan uses (at capacity and at n = 1, the
 * extremes of kd_lower's choices) so a missing one fails here, not mid-run. */
static twk_status check_launch(cuda_ctx *c, cuda_prepared *pp, const twk_hal_plan *plan, int i) {
    const twk_launch *l = &plan->launches[i];
    kd_call calls[KD_MAX_CALLS];
    kd_gemm gemm;
    int64_t ns[2] = {plan->capacity, 1};
    for (int t = 0; t < 2; t++) {
        int is_gemm = 0;
        kd_device kdev = {c->compute_units};
        int nc = kd_lower(l, ns[t], &kdev, calls, &gemm, &is_gemm);
        if (nc < 0) return TWK_ERR_UNSUPPORTED;
        if (is_gemm && !c->blas)
            return twk_error(TWK_ERR_UNSUPPORTED, "cuda: matmul '%s': no cuBLAS: %s", l->name, c->blas_why);
        if (is_gemm && gemm.b_half) { /* the widening kernel, and the panel it fills */
            kd_call wc;
            kd_gemm_part part;
            kd_widen_call(l, &gemm, 0, &wc, &part);
            CUfunction fn;
            twk_status st = cuda_kernel(c, wc.kernel, &fn);
            if (st == TWK_OK) st = check_params(c, fn, l, &wc);
            if (st != TWK_OK) return st;
            if (kd_gemm_scratch_bytes(&gemm) > pp->scratch_bytes) pp->scratch_bytes = kd_gemm_scratch_bytes(&gemm);
        }
        if (kd_scratch_bytes(l, ns[t], &kdev) > pp->scratch_bytes) pp->scratch_bytes = kd_scratch_bytes(l, ns[t], &kdev);
        for (int k = 0; !is_gemm && k < nc && k < KD_MAX_CALLS; k++) {
            CUfunction fn;
            twk_status st = cuda_kernel(c, calls[k].kernel, &fn);
            if (st == TWK_OK) st = check_params(c, fn, l, &calls[k]);
            if (st != TWK_OK) return st;
            for (int a = 0; a < calls[k].nargs; a++)
                if (calls[k].args[a].kind == KD_ERR) pp->has_err = true;
        }
    }
    return TWK_OK;
}

static twk_status prepare_locked(cuda_ctx *c, const twk_hal_plan *plan, void **out) {
    twk_status st = cuda_set_current(c);
    if (st != TWK_OK) return st;
    cuda_prepared *pp = twk_host_calloc(sizeof *pp, "cuda plan");
    if (!pp) return TWK_ERR_OOM;
    pp->n_launches = plan->n_launches;
    for (int i = 0; i < plan->n_launches && st == TWK_OK; i++) st = check_launch(c, pp, plan, i);
    if (st == TWK_OK && plan->n_launches > 0) {
        size_t bytes = (size_t)plan->n_launches * sizeof(int);
        pp->err_host = twk_host_alloc(bytes, "cuda error words");
        if (!pp->err_host) st = TWK_ERR_OOM;
        if (st == TWK_OK) st = cuda_check(c, c->cu->cuMemAlloc(&pp->err, bytes), "cuMemAlloc (error words)");
        if (st == TWK_OK) st = cuda_check(c, c->cu->cuMemsetD8Async(pp->err, 0, bytes, c->stream), "memset");
    }
    if (st == TWK_OK && pp->scratch_bytes)
        st = cuda_check(c, c->cu->cuMemAlloc(&pp->scratch, pp->scratch_bytes), "cuMemAlloc (plan scratch)");
    if (st != TWK_OK) {
        release_locked(c, pp);
        return st;
    }
    *out = pp;
    return TWK_OK;
}

/* TWK_ERR_RANGE for launch l whose kernel stored `code`: the first bad id,
 * found on the host from copies of its id sources (kd_error_detail, worded
 * like the CPU backend), else the code's meaning. */
static twk_status range_error(cuda_ctx *c, const twk_launch *l, int64_t n, int code) {
    const void *host[TWK_MAX_SRC] = {0};
    unsigned mask = kd_checked_sources(l);
    char msg[256] = "";
    bool ok = true;
    for (int i = 0; i < l->nsrc && i < TWK_MAX_SRC && ok; i++) {
        if (!(mask >> i & 1u) || !l->src[i].buf) continue;
        size_t bytes = (size_t)twk_desc_nelem(&l->src[i], n) * twk_dtype_size(l->src[i].type);
        void *h = twk_host_alloc(bytes ? bytes : 1, "cuda error ids");
        host[i] = h;
        ok = h && c->cu->cuMemcpyDtoHAsync(h, ((const cuda_buffer *)l->src[i].buf)->ptr + l->src[i].offset, bytes,
                                           c->stream) == CUDA_SUCCESS;
    }
    if (ok) ok = c->cu->cuStreamSynchronize(c->stream) == CUDA_SUCCESS;
    if (ok) kd_error_detail(l, n, host, msg, sizeof msg);
    for (int i = 0; i < TWK_MAX_SRC; i++) twk_host_free((void *)host[i]);
    if (msg[0]) return twk_error(TWK_ERR_RANGE, "%s", msg);
    return twk_error(TWK_ERR_RANGE, "%s '%s': %s (cuda, n = %lld)", twk_op_name(l->op), l->name,
                     kd_error_message(code), (long long)n);
}

/* The first launch whose error word is set, as TWK_ERR_RANGE naming it. */
static twk_status check_errors(cuda_ctx *c, cuda_prepared *pp, const twk_hal_plan *plan, int64_t n) {
    size_t bytes = (size_t)pp->n_launches * sizeof(int);
    twk_status st = cuda_check(c, c->cu->cuMemcpyDtoHAsync(pp->err_host, pp->err, bytes, c->stream), "reading the error words");
    twk_status s2 = cuda_check(c, c->cu->cuStreamSynchronize(c->stream), "synchronize");
    if (st != TWK_OK) return st;
    if (s2 != TWK_OK) return s2;
    for (int i = 0; i < pp->n_launches; i++)
        if (pp->err_host[i] != KD_ERR_NONE) return range_error(c, &plan->launches[i], n, pp->err_host[i]);
    return TWK_OK;
}

static twk_status run_locked(cuda_ctx *c, cuda_prepared *pp, const twk_hal_plan *plan, int64_t n) {
    if (!pp || plan->n_launches != pp->n_launches)
        return twk_error(TWK_ERR_STATE, "cuda: run: the plan does not match its prepared state");
    if (n < 1 || n > plan->capacity)
        return twk_error(TWK_ERR_INVALID_ARG, "cuda: run: token count %lld outside 1..%lld", (long long)n,
                         (long long)plan->capacity);
    if (plan->n_launches == 0) return TWK_OK;
    twk_status st = cuda_set_current(c);
    if (st != TWK_OK) return st;
    if (pp->has_err) {
        st = cuda_check(c, c->cu->cuMemsetD8Async(pp->err, 0, (size_t)pp->n_launches * sizeof(int), c->stream),
                        "clearing the error words");
        if (st != TWK_OK) return st;
    }
    if (c->graphs && !pp->graphs_off && !c->profile) st = enqueue_graph(c, pp, plan, n);
    else st = enqueue_all(c, pp, plan, n);
    if (st != TWK_OK) return st;
    return pp->has_err ? check_errors(c, pp, plan, n) : TWK_OK;
}

/* ---- entry points: one thread at a time (see cuda_ctx.lock) ---- */

void cuda_release(void *vctx, void *prepared) {
    cuda_ctx *c = vctx;
    pthread_mutex_lock(&c->lock);
    release_locked(c, prepared);
    pthread_mutex_unlock(&c->lock);
}

twk_status cuda_prepare(void *vctx, const twk_hal_plan *plan, void **out) {
    cuda_ctx *c = vctx;
    pthread_mutex_lock(&c->lock);
    twk_status st = prepare_locked(c, plan, out);
    pthread_mutex_unlock(&c->lock);
    return st;
}

twk_status cuda_run(void *vctx, void *prepared, const twk_hal_plan *plan, int64_t n) {
    cuda_ctx *c = vctx;
    pthread_mutex_lock(&c->lock);
    twk_status st = run_locked(c, prepared, plan, n);
    pthread_mutex_unlock(&c->lock);
    return st;
}
