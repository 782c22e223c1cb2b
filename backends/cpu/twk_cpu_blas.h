/* The CPU backend's BLAS (OpenBLAS) as a process sees it: which kernel set it chose, and a
 * better one where it chose badly. For the command-line program's start-up (cli/main.c). */
#ifndef TWK_CPU_BLAS_H
#define TWK_CPU_BLAS_H

#ifdef __cplusplus
extern "C" {
#endif

/* OpenBLAS's kernel set ("SkylakeX", "Haswell", "Prescott", ...); never NULL. */
const char *twk_cpu_blas_core(void);
/* The kernel set to ask for with OPENBLAS_CORETYPE when OpenBLAS chose one older than the CPU
 * runs ("SkylakeX" on AVX-512, "Haswell" on AVX2 + FMA); NULL when its choice is fine. */
const char *twk_cpu_blas_better_core(void);
/* The row block of the kernel set's f32 products (twk_device_props.gemm_row_period): 12 for Haswell
 * and Zen, whose sgemm sums each 12-row block's two halves of 6 in different orders; 0 for the
 * others, whose period this build has not checked (TWK_GEMM_ROW_PERIOD, 48, covers them). */
int twk_cpu_blas_row_period(void);

#ifdef __cplusplus
}
#endif

#endif
