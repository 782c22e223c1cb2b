/* MATMUL with a 16-bit B (a frozen bf16 / f16 weight): B is widened in panels of
 * TWK_HALF_PANEL_ROWS stored rows (at most 4 MiB of f32, the CPU backend's panel) into the
 * backend's scratch by widen_h16 (half.cl), and each panel goes to the f32 GEMM of the BLAS
 * (CLBlast Sgemm, cuBLAS Sgemm): B transposed ([N, K]) gives C's columns panel by panel; B
 * as stored ([K, N]) gives a block of K, summed into C (beta 1 after the first). Every sum is f32. */
#include "kd_internal.h"

static int64_t total_rows(const kd_gemm *g) { return g->b_rows; }

int64_t kd_gemm_panels(const kd_gemm *g) {
    if (!g->b_half || g->panel_rows < 1) return 0;
    return (total_rows(g) + g->panel_rows - 1) / g->panel_rows;
}

size_t kd_gemm_scratch_bytes(const kd_gemm *g) {
    return g->b_half ? (size_t)(g->panel_rows * g->ldb) * sizeof(float) : 0;
}

void kd_widen_call(const twk_launch *l, const kd_gemm *g, int64_t p, kd_call *call, kd_gemm_part *part) {
    int64_t r0 = p * g->panel_rows, rows = total_rows(g) - r0 < g->panel_rows ? total_rows(g) - r0 : g->panel_rows;
    kd_begin(call, "widen_h16");
    kd_arg *y = &call->args[call->nargs++];
    y->kind = KD_SCRATCH;
    y->i64 = 0;
    kd_buf(call, l, 1, 2);
    call->args[call->nargs - 1].i64 += r0 * g->ldb;
    kd_i64(call, rows * g->ldb);
    kd_i32(call, g->b_half == TWK_F16);
    kd_grid_items(call, rows * g->ldb, KD_LOCAL_1D);
    if (g->trans_b) /* C[:, r0 : r0 + rows] = op(A) panel^T */
        *part = (kd_gemm_part){.m = g->m, .n = rows, .k = g->k, .a_off = 0, .c_off = r0, .beta = 0.0f};
    else /* C += op(A)[:, r0 : r0 + rows] panel */
        *part = (kd_gemm_part){.m = g->m, .n = g->n, .k = rows, .a_off = g->trans_a ? r0 * g->lda : r0, .c_off = 0,
                               .beta = p ? 1.0f : 0.0f};
}
