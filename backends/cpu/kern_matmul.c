/* MATMUL through the BLAS (OpenBLAS sgemm), batched by a loop over dim 0. */
#include <limits.h>

#include <cblas.h>

#include "cpu_internal.h"

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
