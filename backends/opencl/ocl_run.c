/* Plans on the OpenCL backend: prepare checks every launch lowers and
 * creates its kernels; run lowers each launch for the token count (kd_lower),
 * sets the arguments and enqueues it, MATMUL through CLBlast. Work is queued
 * in order and runs asynchronously; when the plan has launches that check
 * ids, run waits for the queue and reads the error words (one per launch)
 * to return TWK_ERR_RANGE naming the first failing op and node. */
#include <stdio.h>
#include <string.h>

#include "kd.h"
#include "ocl_internal.h"

typedef struct ocl_prepared {
    int n_launches;
    int checks;   /* some launch takes the error words */
    cl_mem err;   /* one int per launch */
    int *err_host;
    cl_mem scratch; /* a 16-bit weight's widened panel or attn_back's delta (kd_gemm_scratch_bytes, kd_scratch_bytes), shared */
} ocl_prepared;

static int calls_check(const kd_call *calls, int n) {
    for (int c = 0; c < n; c++)
        for (int a = 0; a < calls[c].nargs; a++)
            if (calls[c].args[a].kind == KD_ERR) return 1;
    return 0;
}

void ocl_release(void *ctx, void *prepared) {
    (void)ctx;
    ocl_prepared *pp = prepared;
    if (!pp) return;
    if (pp->err) clReleaseMemObject(pp->err);
    if (pp->scratch) clReleaseMemObject(pp->scratch);
    twk_host_free(pp->err_host);
    twk_host_free(pp);
}

twk_status ocl_prepare(void *vctx, const twk_hal_plan *plan, void **out) {
    ocl_ctx *ctx = vctx;
    ocl_prepared *pp = twk_host_calloc(sizeof *pp, "opencl plan");
    if (!pp) return TWK_ERR_OOM;
    pp->n_launches = plan->n_launches;
    twk_status s = TWK_OK;
    kd_call calls[KD_MAX_CALLS];
    kd_gemm gemm;
    size_t scratch = 0;
    kd_device kdev = {ctx->compute_units};
    pthread_mutex_lock(&ctx->lock);
    for (int i = 0; i < plan->n_launches && s == TWK_OK; i++) {
        int is_gemm = 0;
        int nc = kd_lower(&plan->launches[i], plan->capacity, &kdev, calls, &gemm, &is_gemm);
        if (nc < 0) {
            s = TWK_ERR_UNSUPPORTED; /* kd_lower set the message */
            break;
        }
        if (is_gemm && kd_gemm_scratch_bytes(&gemm) > scratch) scratch = kd_gemm_scratch_bytes(&gemm);
        if (kd_scratch_bytes(&plan->launches[i], plan->capacity, &kdev) > scratch)
            scratch = kd_scratch_bytes(&plan->launches[i], plan->capacity, &kdev);
        if (is_gemm && gemm.b_half && !ocl_kernel(ctx, "widen_h16")) s = TWK_ERR_BACKEND;
        pp->checks |= calls_check(calls, nc);
        for (int c = 0; c < nc; c++)
            if (!ocl_kernel(ctx, calls[c].kernel)) {
                s = TWK_ERR_BACKEND;
                break;
            }
    }
    pthread_mutex_unlock(&ctx->lock);
    if (s == TWK_OK && pp->checks) {
        size_t bytes = (size_t)(plan->n_launches ? plan->n_launches : 1) * sizeof(cl_int);
        cl_int e;
        pp->err = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, bytes, NULL, &e);
        if (e != CL_SUCCESS) s = ocl_fail(e, "error words");
        else if (!(pp->err_host = twk_host_alloc(bytes, "opencl error words"))) s = TWK_ERR_OOM;
    }
    if (s == TWK_OK && scratch) {
        cl_int e;
        pp->scratch = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, scratch, NULL, &e);
        if (e != CL_SUCCESS) s = ocl_fail(e, "16-bit weight panel");
    }
    if (s != TWK_OK) {
        ocl_release(ctx, pp);
        return s;
    }
    *out = pp;
    return TWK_OK;
}

static cl_mem mem_of(const twk_tensor_desc *d) { return d->buf ? ((ocl_buffer *)d->buf)->mem : NULL; }

/* The tensor's offset into its buffer in elements of its dtype (CLBlast counts elements). */
static size_t elem_offset(const twk_tensor_desc *d) { return d->offset / twk_dtype_size(d->type); }

static twk_status enqueue_call(ocl_ctx *ctx, const twk_launch *l, const kd_call *c, cl_mem err, cl_mem scratch,
                               int launch);

static twk_status blas_fail(const twk_launch *l, const kd_gemm *g, CLBlastStatusCode st) {
    return twk_error(TWK_ERR_BACKEND, "opencl: matmul '%s' (%lld x %lld x %lld, batch %lld): CLBlast status %d", l->name,
                     (long long)g->m, (long long)g->n, (long long)g->k, (long long)g->batch, (int)st);
}

/* A 16-bit B: each panel widened into the scratch, then one f32 Sgemm of it (kd_gemm_half.c). */
static twk_status run_gemm_half(ocl_ctx *ctx, const twk_launch *l, const kd_gemm *g, cl_mem scratch) {
    cl_mem a = mem_of(&l->src[0]), c = mem_of(&l->dst);
    size_t ao = elem_offset(&l->src[0]), co = elem_offset(&l->dst);
    CLBlastTranspose ta = g->trans_a ? CLBlastTransposeYes : CLBlastTransposeNo;
    CLBlastTranspose tb = g->trans_b ? CLBlastTransposeYes : CLBlastTransposeNo;
    for (int64_t p = 0; p < kd_gemm_panels(g); p++) {
        kd_call call;
        kd_gemm_part part;
        kd_widen_call(l, g, p, &call, &part);
        twk_status s = enqueue_call(ctx, l, &call, NULL, scratch, 0);
        if (s != TWK_OK) return s;
        CLBlastStatusCode st = CLBlastSgemm(CLBlastLayoutRowMajor, ta, tb, (size_t)part.m, (size_t)part.n, (size_t)part.k,
                                            1.0f, a, ao + (size_t)part.a_off, (size_t)g->lda, scratch, 0, (size_t)g->ldb,
                                            part.beta, c, co + (size_t)part.c_off, (size_t)g->ldc, &ctx->queue, NULL);
        if (st != CLBlastSuccess) return blas_fail(l, g, st);
    }
    return TWK_OK;
}

static twk_status run_gemm(ocl_ctx *ctx, const twk_launch *l, const kd_gemm *g, cl_mem scratch) {
    if (g->m == 0 || g->n == 0 || g->batch == 0) return TWK_OK;
    cl_mem a = mem_of(&l->src[0]), b = mem_of(&l->src[1]), c = mem_of(&l->dst);
    size_t ao = elem_offset(&l->src[0]), bo = elem_offset(&l->src[1]), co = elem_offset(&l->dst);
    if (g->k == 0) { /* an empty sum: C = 0 */
        unsigned char zero = 0;
        size_t es = twk_dtype_size(l->dst.type);
        cl_int e = clEnqueueFillBuffer(ctx->queue, c, &zero, 1, co * es, (size_t)(g->m * g->n * g->batch) * es, 0,
                                       NULL, NULL);
        return e == CL_SUCCESS ? TWK_OK : ocl_fail(e, "matmul (k = 0)");
    }
    if (g->b_half) return run_gemm_half(ctx, l, g, scratch);
    CLBlastTranspose ta = g->trans_a ? CLBlastTransposeYes : CLBlastTransposeNo;
    CLBlastTranspose tb = g->trans_b ? CLBlastTransposeYes : CLBlastTransposeNo;
    CLBlastStatusCode st;
    if (g->batch == 1)
        st = CLBlastSgemm(CLBlastLayoutRowMajor, ta, tb, (size_t)g->m, (size_t)g->n, (size_t)g->k, 1.0f, a, ao,
                          (size_t)g->lda, b, bo, (size_t)g->ldb, 0.0f, c, co, (size_t)g->ldc, &ctx->queue, NULL);
    else
        st = CLBlastSgemmStridedBatched(CLBlastLayoutRowMajor, ta, tb, (size_t)g->m, (size_t)g->n, (size_t)g->k,
                                        1.0f, a, ao, (size_t)g->lda, (size_t)g->stride_a, b, bo, (size_t)g->ldb,
                                        (size_t)g->stride_b, 0.0f, c, co, (size_t)g->ldc, (size_t)g->stride_c,
                                        (size_t)g->batch, &ctx->queue, NULL);
    if (st != CLBlastSuccess) return blas_fail(l, g, st);
    return TWK_OK;
}

static twk_status enqueue_call(ocl_ctx *ctx, const twk_launch *l, const kd_call *c, cl_mem err, cl_mem scratch,
                               int launch) {
    cl_kernel k = ocl_kernel(ctx, c->kernel);
    if (!k) return TWK_ERR_BACKEND;
    cl_uint ai = 0;
    cl_int e = CL_SUCCESS;
    for (int a = 0; a < c->nargs && e == CL_SUCCESS; a++) {
        const kd_arg *x = &c->args[a];
        switch (x->kind) {
        case KD_BUF: {
            cl_mem m = mem_of(x->tensor < 0 ? &l->dst : &l->src[x->tensor]);
            cl_long off = x->i64;
            e = clSetKernelArg(k, ai++, sizeof m, &m);
            if (e == CL_SUCCESS) e = clSetKernelArg(k, ai++, sizeof off, &off);
            break;
        }
        case KD_SCRATCH: {
            cl_long off = x->i64;
            e = clSetKernelArg(k, ai++, sizeof scratch, &scratch);
            if (e == CL_SUCCESS) e = clSetKernelArg(k, ai++, sizeof off, &off);
            break;
        }
        case KD_ERR: {
            cl_long off = launch;
            e = clSetKernelArg(k, ai++, sizeof err, &err);
            if (e == CL_SUCCESS) e = clSetKernelArg(k, ai++, sizeof off, &off);
            break;
        }
        case KD_I32: {
            cl_int v = x->i32;
            e = clSetKernelArg(k, ai++, sizeof v, &v);
            break;
        }
        case KD_I64: {
            cl_long v = x->i64;
            e = clSetKernelArg(k, ai++, sizeof v, &v);
            break;
        }
        case KD_F32: {
            cl_float v = x->f32;
            e = clSetKernelArg(k, ai++, sizeof v, &v);
            break;
        }
        }
    }
    if (e == CL_SUCCESS)
        e = clEnqueueNDRangeKernel(ctx->queue, k, (cl_uint)c->dims, NULL, c->global, c->local, 0, NULL, NULL);
    if (e != CL_SUCCESS) {
        char what[160];
        snprintf(what, sizeof what, "%s '%s' (kernel %s)", twk_op_name(l->op), l->name, c->kernel);
        return ocl_fail(e, what);
    }
    return TWK_OK;
}

/* TWK_ERR_RANGE for launch l whose kernel stored `code`: the first bad id,
 * found on the host from copies of its id sources, else the code's meaning. */
static twk_status range_error(ocl_ctx *ctx, const twk_launch *l, int64_t n, int code) {
    const void *host[TWK_MAX_SRC] = {0};
    unsigned mask = kd_checked_sources(l);
    char msg[256] = "";
    int ok = 1;
    for (int i = 0; i < l->nsrc && ok; i++) {
        if (!(mask >> i & 1u)) continue;
        size_t bytes = (size_t)twk_desc_nelem(&l->src[i], n) * twk_dtype_size(l->src[i].type);
        void *h = twk_host_alloc(bytes ? bytes : 1, "opencl error ids");
        host[i] = h;
        ok = h && clEnqueueReadBuffer(ctx->queue, mem_of(&l->src[i]), CL_TRUE, l->src[i].offset, bytes, h, 0, NULL,
                                      NULL) == CL_SUCCESS;
    }
    if (ok) kd_error_detail(l, n, host, msg, sizeof msg);
    for (int i = 0; i < TWK_MAX_SRC; i++) twk_host_free((void *)host[i]);
    if (msg[0]) return twk_error(TWK_ERR_RANGE, "%s", msg);
    return twk_error(TWK_ERR_RANGE, "%s '%s': %s (opencl, n = %lld)", twk_op_name(l->op), l->name,
                     kd_error_message(code), (long long)n);
}

static twk_status run_locked(ocl_ctx *ctx, ocl_prepared *pp, const twk_hal_plan *plan, int64_t n) {
    kd_call calls[KD_MAX_CALLS];
    kd_gemm gemm;
    kd_device kdev = {ctx->compute_units};
    cl_int e;
    if (pp->checks) {
        cl_int zero = 0;
        e = clEnqueueFillBuffer(ctx->queue, pp->err, &zero, sizeof zero, 0,
                                (size_t)plan->n_launches * sizeof(cl_int), 0, NULL, NULL);
        if (e != CL_SUCCESS) return ocl_fail(e, "clearing the error words");
    }
    for (int i = 0; i < plan->n_launches; i++) {
        const twk_launch *l = &plan->launches[i];
        int is_gemm = 0;
        int nc = kd_lower(l, n, &kdev, calls, &gemm, &is_gemm);
        if (nc < 0) return TWK_ERR_UNSUPPORTED;
        twk_status s = TWK_OK;
        if (is_gemm) s = run_gemm(ctx, l, &gemm, pp->scratch);
        for (int c = 0; c < nc && s == TWK_OK; c++) s = enqueue_call(ctx, l, &calls[c], pp->err, pp->scratch, i);
        if (s != TWK_OK) return s;
    }
    if (!pp->checks) return TWK_OK;
    e = clEnqueueReadBuffer(ctx->queue, pp->err, CL_TRUE, 0, (size_t)plan->n_launches * sizeof(cl_int),
                            pp->err_host, 0, NULL, NULL);
    if (e != CL_SUCCESS) return ocl_fail(e, "reading the error words");
    for (int i = 0; i < plan->n_launches; i++)
        if (pp->err_host[i] != KD_ERR_NONE) return range_error(ctx, &plan->launches[i], n, pp->err_host[i]);
    return TWK_OK;
}

twk_status ocl_run(void *vctx, void *prepared, const twk_hal_plan *plan, int64_t n) {
    ocl_ctx *ctx = vctx;
    ocl_prepared *pp = prepared;
    if (!pp || pp->n_launches != plan->n_launches)
        return twk_error(TWK_ERR_STATE, "opencl: run: the plan was not prepared on this backend");
    pthread_mutex_lock(&ctx->lock);
    twk_status s = run_locked(ctx, pp, plan, n);
    pthread_mutex_unlock(&ctx->lock);
    return s;
}

twk_status ocl_synchronize(void *vctx) {
    ocl_ctx *ctx = vctx;
    cl_int e = clFinish(ctx->queue);
    return e == CL_SUCCESS ? TWK_OK : ocl_fail(e, "clFinish");
}
