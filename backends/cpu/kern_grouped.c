/* lora_gather over rows grouped by slot (twk_lora_gather_grouped: a mixture of experts' rows
 * sorted by expert through a frozen expert stack): one product per run of equal slots through
 * MATMUL's kernels (cpu_gemm: OpenBLAS sgemm, a 16-bit stack widened in panels), in place of the
 * per-row kernel of kern_lora.c, which streams a slot's whole weight for every 4 rows.
 *
 * The kernel is the same for every run whatever its length (sgemm for f32, never sgemv; panels for
 * 16-bit, never the skinny kernel, which only sampling plans take), so a row's result does not depend on how many rows share its expert as
 * far as the BLAS gives a row the same bits whatever the row count (SkylakeX's sgemm does). */
#include <limits.h>

#include "cpu_internal.h"

#define GROUPED_HALF_PASS_M 1024 /* a pass_m past CPU_SKINNY_ROWS: widened panels always */

twk_status cpu_lora_gather_grouped(const cpu_call *c) {
    const cpu_tensor *x = &c->src[0], *w = &c->src[1], *slot = &c->src[2];
    int trans = c->l->ip[0] != 0; /* w [S, K, N] instead of [S, N, K] */
    int64_t T = x->ne[0], K = x->ne[1], N = c->dst.ne[1];
    if (T > INT_MAX || N > INT_MAX || K > INT_MAX)
        return twk_error(TWK_ERR_UNSUPPORTED, "lora_gather '%s': dims %lld x %lld x %lld exceed the BLAS's int range",
                         c->l->name, (long long)T, (long long)N, (long long)K);
    int half = twk_dtype_is_half(w->type);
    size_t es = twk_dtype_size(w->type);
    cpu_gemm_args g = {.ta = 0, .tb = !trans, .pass_m = half ? GROUPED_HALF_PASS_M : 2, .M = T, .N = N, .K = K, .lda = K,
                       .ldb = trans ? N : K, .ldc = N, .bt = w->type};
    int64_t wf = cpu_gemm_work_floats(c->ctx, &g);
    float *work = wf ? cpu_scratch(c->ctx, (size_t)wf * sizeof *work) : NULL;
    if (wf && !work) return TWK_ERR_OOM;
    const float *xd = x->data;
    float *y = c->dst.data;
    for (int64_t t0 = 0, t1; t0 < T; t0 = t1) { /* ids checked before the launch (cpu_backend.c) */
        int64_t s = cpu_id_at(slot, t0);
        for (t1 = t0 + 1; t1 < T && cpu_id_at(slot, t1) == s; t1++) {
        }
        g.M = t1 - t0;
        g.A = xd + t0 * K;
        g.B = (const unsigned char *)w->data + es * (size_t)(s * N * K);
        g.C = y + t0 * N;
        cpu_gemm(c->ctx, &g, work);
    }
    return TWK_OK;
}
