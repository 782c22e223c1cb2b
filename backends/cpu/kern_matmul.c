/* MATMUL through the BLAS (OpenBLAS sgemm), batched by a loop over dim 0.
 * A bf16 / f16 b (a frozen weight) is widened to f32 as it is read: a few
 * rows of a (decoding) dot each widened weight row while it is in L1; more
 * rows go to sgemm on f32 panels of b widened in cache-sized blocks. Every
 * sum is in f32. */
#include <limits.h>

#include <cblas.h>

#include "cpu_internal.h"

/* Rows of a up to which a half b is read once, row by row (dots), instead of as sgemm panels. */
#define HALF_DOT_ROWS 16

typedef struct {
    const float *A;
    const unsigned char *B; /* 16-bit elements */
    float *C;
    twk_dtype bt;
    int64_t M, N, K, lda, ldb, ldc;
    float *buf; /* per thread: K floats (dots) */
    int64_t n0; /* panel: its first row (of b^T when transposed, of b otherwise) */
    int64_t nb; /* panel: rows */
    int tb;
} half_job;

/* C[m, n] = A[m, :] . B[n, :] for every m, for n in [n0, n1) (b transposed: rows of b are contiguous). */
static void half_dots(void *arg, int64_t n0, int64_t n1) {
    const half_job *j = arg;
    float *w = j->buf + (int64_t)cpu_thread_index() * j->K;
    for (int64_t n = n0; n < n1; n++) {
        twk_dtype_to_f32(j->bt, j->B + 2 * n * j->ldb, w, j->K);
        for (int64_t m = 0; m < j->M; m++) {
            const float *a = j->A + m * j->lda;
            float s = 0;
#pragma omp simd reduction(+ : s)
            for (int64_t k = 0; k < j->K; k++) s += a[k] * w[k];
            j->C[m * j->ldc + n] = s;
        }
    }
}

/* Widens rows [r0, r1) of the panel: b's rows n0.. when b is transposed ([nb, K] of b^T), else b's
 * rows k0.. (the panel is [nb, N]); both are contiguous runs of b. */
static void half_widen(void *arg, int64_t r0, int64_t r1) {
    const half_job *j = arg;
    int64_t row = j->tb ? j->K : j->N;
    twk_dtype_to_f32(j->bt, j->B + 2 * (j->n0 + r0) * j->ldb, j->buf + r0 * row, (r1 - r0) * row);
}

/* C [M, N] = op(A) op(B) for a 16-bit B, in f32 panels of B of TWK_HALF_PANEL_ROWS rows: blocks of
 * N (b transposed: C's columns, one sgemm each) or blocks of K (not transposed: every sgemm
 * adds its block's share to all of C, so op(A) is packed once over the calls). */
static twk_status half_gemm(const cpu_call *c, half_job *j, int ta) {
    cpu_ctx *ctx = c->ctx;
    if (!ta && j->tb && j->M <= HALF_DOT_ROWS) {
        j->buf = cpu_scratch(ctx, (size_t)(ctx->n_threads * j->K) * sizeof *j->buf);
        if (!j->buf) return TWK_ERR_OOM;
        cpu_parallel_for(ctx->pool, j->N, CPU_GRAIN_ELEMS / (j->K * j->M + 1) + 1, half_dots, j);
        return TWK_OK;
    }
    int64_t row = j->tb ? j->K : j->N, total = j->tb ? j->N : j->K; /* a panel is nb rows of `row` */
    int64_t nb = TWK_HALF_PANEL_ROWS(row, total);
    j->buf = cpu_scratch(ctx, (size_t)(nb * row) * sizeof *j->buf);
    if (!j->buf) return TWK_ERR_OOM;
    for (j->n0 = 0; j->n0 < total; j->n0 += nb) {
        j->nb = total - j->n0 < nb ? total - j->n0 : nb;
        cpu_parallel_for(ctx->pool, j->nb, CPU_GRAIN_ELEMS / row + 1, half_widen, j);
        if (j->tb) /* C[:, n0 : n0 + nb] = op(A) panel^T */
            cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, CblasTrans, (int)j->M, (int)j->nb, (int)j->K, 1.0f,
                        j->A, (int)j->lda, j->buf, (int)j->K, 0.0f, j->C + j->n0, (int)j->ldc);
        else /* C += op(A)[:, k0 : k0 + kb] panel */
            cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, CblasNoTrans, (int)j->M, (int)j->N, (int)j->nb, 1.0f,
                        j->A + (ta ? j->n0 * j->lda : j->n0), (int)j->lda, j->buf, (int)j->N, j->n0 ? 1.0f : 0.0f, j->C,
                        (int)j->ldc);
    }
    return TWK_OK;
}

twk_status cpu_matmul(const cpu_call *c) {
    const cpu_tensor *a = &c->src[0], *b = &c->src[1];
    int r = a->ndim;
    int ta = c->l->ip[0], tb = c->l->ip[1];
    int64_t batch = r == 3 ? a->ne[0] : 1;
    int64_t M = c->dst.ne[r - 2], N = c->dst.ne[r - 1];
    int64_t K = ta ? a->ne[r - 2] : a->ne[r - 1];
    int64_t lda = a->ne[r - 1], ldb = b->ne[r - 1];
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX || lda > INT_MAX || ldb > INT_MAX)
        return twk_error(TWK_ERR_UNSUPPORTED, "matmul '%s': dims %lld x %lld x %lld exceed the BLAS's int range",
                         c->l->name, (long long)M, (long long)N, (long long)K);
    const float *A = a->data, *B = b->data;
    float *C = c->dst.data;
    if (twk_dtype_is_half(b->type)) {
        for (int64_t i = 0; i < batch; i++) {
            half_job j = {.A = A + i * M * K, .B = (const unsigned char *)b->data + 2 * i * K * N, .C = C + i * M * N,
                          .bt = b->type, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = N, .tb = tb};
            twk_status st = half_gemm(c, &j, ta);
            if (st != TWK_OK) return st;
        }
        return TWK_OK;
    }
    if (M == 1 && batch == 1) {
        /* one row (decoding one token): a matrix-vector product reads the
         * weights once, several times faster than sgemm's packing at M = 1;
         * the row of A is contiguous whether or not A is transposed */
        if (tb)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)N, (int)K, 1.0f, B, (int)ldb, A, 1, 0.0f, C, 1);
        else
            cblas_sgemv(CblasRowMajor, CblasTrans, (int)K, (int)N, 1.0f, B, (int)ldb, A, 1, 0.0f, C, 1);
        return TWK_OK;
    }
    for (int64_t i = 0; i < batch; i++) {
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    (int)M, (int)N, (int)K, 1.0f, A + i * M * K, (int)lda, B + i * K * N, (int)ldb,
                    0.0f, C + i * M * N, (int)N);
    }
    return TWK_OK;
}
