/* OpenBLAS's kernel choice; see twk_cpu_blas.h. With DYNAMIC_ARCH (Debian's build) OpenBLAS picks
 * its kernels from the CPUID family and model when the library loads. Virtual machines that name
 * their CPU "Intel(R) Xeon(R) Processor" with a model OpenBLAS 0.3.21 does not know get its
 * Prescott (SSE3) kernels even where AVX-512 runs: sgemm measured 31-46 GFLOP/s on 2 such cores,
 * against ~150 GFLOP/s for the same products in PyTorch on them. */
#include <string.h>

#include "twk_cpu_blas.h"

char *openblas_get_corename(void); /* OpenBLAS's own API (cblas.h declares it too) */

const char *twk_cpu_blas_core(void) {
    const char *c = openblas_get_corename();
    return c ? c : "";
}

/* Kernel sets that use neither AVX2 nor AVX-512 (OpenBLAS's names, case-insensitive). */
static int pre_avx2(const char *core) {
    static const char *const old[] = {"prescott", "core2",   "penryn",    "dunnington", "nehalem",     "atom",
                                      "katmai",   "coppermine", "northwood", "banias",  "sandybridge", "barcelona",
                                      "bobcat",   "bulldozer", "piledriver", "steamroller", "excavator", "opteron",
                                      "opteron_sse3", "athlon", "generic"};
    for (size_t i = 0; i < sizeof old / sizeof old[0]; i++)
        if (!strcasecmp(core, old[i])) return 1;
    return 0;
}

const char *twk_cpu_blas_better_core(void) {
#if defined(__x86_64__) || defined(__i386__)
    const char *core = twk_cpu_blas_core();
    if (!pre_avx2(core)) return NULL;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
    return NULL;
}

int twk_cpu_blas_row_period(void) {
    const char *core = twk_cpu_blas_core();
    return !strcasecmp(core, "haswell") || !strcasecmp(core, "zen") ? 12 : 0;
}
