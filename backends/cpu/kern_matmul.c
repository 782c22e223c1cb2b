/* MATMUL through the BLAS (OpenBLAS sgemm), batched by a loop over dim 0.
 * A bf16 / f16 b (a frozen weight) is widened to f32 as it is read: in a sampling plan a few rows
 * of a (decoding) take kern_matmul16.c's skinny kernel, which widens b in registers; everything
 * else goes to sgemm on f32 panels of b widened in cache-sized blocks. Every sum is in f32. Every
 * f32 sgemm runs as tiles cut at 48-row periods and fixed column blocks (cpu_sgemm), so a row's
 * bits do not depend on how many rows the product has (packed passes). */
#include <limits.h>

#include <cblas.h>

#include "cpu_internal.h"

/* The tiles of an f32 product: columns of C in blocks of SGEMM_COLS (fixed by N: a column's place
 * in OpenBLAS's kernels must not move with the row count), rows in blocks of whole
 * TWK_GEMM_ROW_PERIODs — one block up to SGEMM_MAX_ROWS (below OpenBLAS's own row blocking), or
 * for a threaded product the rows shared evenly between the threads — so a row sits at the same
 * place of a 48-row period whatever the row count or the thread count. 256-column tiles ran the
 * two-product unembedding 2.5x slower on the AVX2 EPYC (OpenBLAS Zen, one thread); 1024 as fast
 * as one call. */
#define SGEMM_COLS 1024
#define SGEMM_MAX_ROWS (64 * TWK_GEMM_ROW_PERIOD)

typedef struct {
    int ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
    const float *A, *B;
    float beta, *C;
    int64_t rows, col_tiles;
} sgemm_job;

/* Tiles [t0, t1) of the product (row blocks, then column blocks), one single-threaded sgemm each. */
static void sgemm_tiles(void *arg, int64_t t0, int64_t t1) {
    const sgemm_job *j = arg;
    for (int64_t t = t0; t < t1; t++) {
        int64_t r0 = t / j->col_tiles * j->rows, c0 = t % j->col_tiles * SGEMM_COLS;
        int64_t m = j->M - r0 < j->rows ? j->M - r0 : j->rows, n = j->N - c0 < SGEMM_COLS ? j->N - c0 : SGEMM_COLS;
        cblas_sgemm(CblasRowMajor, j->ta ? CblasTrans : CblasNoTrans, j->tb ? CblasTrans : CblasNoTrans, (int)m, (int)n,
                    (int)j->K, 1.0f, j->A + (j->ta ? r0 : r0 * j->lda), (int)j->lda, j->B + (j->tb ? c0 * j->ldb : c0),
                    (int)j->ldb, j->beta, j->C + r0 * j->ldc + c0, (int)j->ldc);
    }
}

void cpu_sgemm(cpu_ctx *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
               int64_t ldb, float beta, float *C, int64_t ldc) {
    const int64_t P = TWK_GEMM_ROW_PERIOD;
    sgemm_job j = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc, .A = A, .B = B,
                   .beta = beta, .C = C, .col_tiles = (N + SGEMM_COLS - 1) / SGEMM_COLS};
    int threaded = ctx->n_threads > 1 && (double)M * (double)N * (double)K >= CPU_POOL_SGEMM_FMAS;
    int64_t per = threaded ? (M + ctx->n_threads - 1) / ctx->n_threads : M;
    j.rows = (per + P - 1) / P * P;
    if (j.rows > SGEMM_MAX_ROWS) j.rows = SGEMM_MAX_ROWS;
    if (j.rows < 1) j.rows = 1;
    int64_t tiles = (M + j.rows - 1) / j.rows * j.col_tiles;
    cpu_blas_threads(ctx, 1, 1, 1); /* OpenBLAS's own split of the rows moves them inside its row blocks: never */
    if (threaded && tiles > 1)
        cpu_parallel_for(ctx->pool, tiles, 1, sgemm_tiles, &j);
    else
        sgemm_tiles(&j, 0, tiles);
}

typedef struct {
    const float *A;
    const unsigned char *B; /* 16-bit elements */
    float *C;
    twk_dtype bt;
    int64_t M, N, K, lda, ldb, ldc;
    float *buf; /* the panel */
    int64_t n0; /* panel: its first row (of b^T when transposed, of b otherwise) */
    int64_t nb; /* panel: rows */
    int tb;
} half_job;

/* Widens rows [r0, r1) of the panel: b's rows n0.. when b is transposed ([nb, K] of b^T), else b's
 * rows k0.. (the panel is [nb, N]); both are contiguous runs of b. */
static void half_widen(void *arg, int64_t r0, int64_t r1) {
    const half_job *j = arg;
    int64_t row = j->tb ? j->K : j->N;
    twk_dtype_to_f32(j->bt, j->B + 2 * (j->n0 + r0) * j->ldb, j->buf + r0 * row, (r1 - r0) * row);
}

/* C [M, N] = op(A) op(B) for a 16-bit B, in f32 panels of B of TWK_HALF_PANEL_ROWS rows: blocks of
 * N (b transposed: C's columns, one sgemm each) or blocks of K (not transposed: every sgemm
 * adds its block's share to all of C, so op(A) is packed once over the calls). j->buf: the panel. */
static void half_panels(cpu_ctx *ctx, half_job *j, int ta) {
    int64_t row = j->tb ? j->K : j->N, total = j->tb ? j->N : j->K; /* a panel is nb rows of `row` */
    int64_t nb = TWK_HALF_PANEL_ROWS(row, total);
    for (j->n0 = 0; j->n0 < total; j->n0 += nb) {
        j->nb = total - j->n0 < nb ? total - j->n0 : nb;
        cpu_parallel_for(ctx->pool, j->nb, CPU_GRAIN_ELEMS / row + 1, half_widen, j);
        if (j->tb) /* C[:, n0 : n0 + nb] = op(A) panel^T */
            cpu_sgemm(ctx, ta, 1, j->M, j->nb, j->K, j->A, j->lda, j->buf, j->K, 0.0f, j->C + j->n0, j->ldc);
        else /* C += op(A)[:, k0 : k0 + kb] panel */
            cpu_sgemm(ctx, ta, 0, j->M, j->N, j->nb, j->A + (ta ? j->n0 * j->lda : j->n0), j->lda, j->buf, j->N,
                      j->n0 ? 1.0f : 0.0f, j->C, j->ldc);
    }
}

/* Which kernel a product takes: a 16-bit b's skinny product (few rows of a, a sampling plan's),
 * its widened panels, f32 sgemv (one row, unbatched) or sgemm. pass_m: the rows of the whole pass
 * the product belongs to, so every token tile of a pass takes the pass's kernel.
 * The skinny kernel gives other last bits than sgemm, and a training pass's rows must be the same
 * whether a sequence runs alone or packed with others (pass_m small or large): so training plans
 * (infer 0) always take the panels, and only sampling plans, which no pass is compared with bit
 * for bit, choose by pass_m. */
typedef enum { GEMM_HALF_SKINNY, GEMM_HALF_PANELS, GEMM_GEMV, GEMM_SGEMM } gemm_kind;

static gemm_kind gemm_choose(const cpu_gemm_args *g) {
    if (twk_dtype_is_half(g->bt))
        return g->infer && !g->ta && g->pass_m <= CPU_SKINNY_ROWS ? GEMM_HALF_SKINNY : GEMM_HALF_PANELS;
    return g->pass_m == 1 ? GEMM_GEMV : GEMM_SGEMM;
}

int64_t cpu_gemm_work_floats(const cpu_ctx *ctx, const cpu_gemm_args *g) {
    (void)ctx;
    switch (gemm_choose(g)) {
    case GEMM_HALF_SKINNY: return cpu_skinny_work_floats(g);
    case GEMM_HALF_PANELS: {
        int64_t row = g->tb ? g->K : g->N, total = g->tb ? g->N : g->K;
        return TWK_HALF_PANEL_ROWS(row, total) * row;
    }
    default: return 0;
    }
}

void cpu_gemm(cpu_ctx *ctx, const cpu_gemm_args *g, float *work) {
    gemm_kind k = gemm_choose(g);
    if (k == GEMM_HALF_SKINNY) {
        cpu_gemm_skinny(ctx, g, work);
    } else if (k == GEMM_HALF_PANELS) {
        half_job j = {.A = g->A, .B = g->B, .C = g->C, .bt = g->bt, .M = g->M, .N = g->N, .K = g->K, .lda = g->lda,
                      .ldb = g->ldb, .ldc = g->ldc, .tb = g->tb, .buf = work};
        half_panels(ctx, &j, g->ta);
    } else if (k == GEMM_GEMV) {
        cpu_blas_threads(ctx, 1, g->N, g->K);
        /* one row (decoding one token): a matrix-vector product reads the weights once, several
         * times faster than sgemm's packing at M = 1; the row of A is contiguous either way */
        cblas_sgemv(CblasRowMajor, g->tb ? CblasNoTrans : CblasTrans, (int)(g->tb ? g->N : g->K), (int)(g->tb ? g->K : g->N),
                    1.0f, g->B, (int)g->ldb, g->A, 1, 0.0f, g->C, 1);
    } else {
        cpu_sgemm(ctx, g->ta, g->tb, g->M, g->N, g->K, g->A, g->lda, g->B, g->ldb, 0.0f, g->C, g->ldc);
    }
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
    size_t esz = twk_dtype_size(b->type);
    /* a batched f32 product of one row stays on sgemm (sgemv is for a decoding row) */
    cpu_gemm_args g = {.ta = ta, .tb = tb, .infer = c->infer, .pass_m = batch > 1 && !twk_dtype_is_half(b->type) ? 2 : M, .M = M, .N = N,
                       .K = K, .lda = lda, .ldb = ldb, .ldc = N, .bt = b->type};
    int64_t wf = cpu_gemm_work_floats(c->ctx, &g);
    float *work = wf ? cpu_scratch(c->ctx, (size_t)wf * sizeof *work) : NULL;
    if (wf && !work) return TWK_ERR_OOM;
    for (int64_t i = 0; i < batch; i++) {
        g.A = (const float *)a->data + i * M * K;
        g.B = (const unsigned char *)b->data + esz * (size_t)(i * K * N);
        g.C = (float *)c->dst.data + i * M * N;
        cpu_gemm(c->ctx, &g, work);
    }
    return TWK_OK;
}
