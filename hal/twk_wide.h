/* twinkle — how wide (two-stage) reductions are cut, shared by the GPU backends (the OpenCL / CUDA
 * lowering in backends/kernels and Vulkan's) and the tests that check their error bound.
 *
 * Stage 1 runs `tiles` work-groups per independent reduction, each summing one contiguous tile
 * of the terms into a compensated (hi, lo) partial in the plan's scratch; stage 2 is one
 * work-group (per reduction) summing the partials in a fixed tree. The tile count depends only on
 * the shapes and the device's compute units, so a result's bits are the same run to run. */
#ifndef TWK_WIDE_H
#define TWK_WIDE_H

#include <stdint.h>

#define TWK_WIDE_LOCAL 256      /* items of a stage-1 / stage-2 work-group (sums) */
#define TWK_WIDE_PER_CU 8       /* stage-1 work-groups per compute unit, over all reductions */
#define TWK_WIDE_CU_UNKNOWN 16  /* compute units assumed when the device reports none */
#define TWK_WIDE_MAX_TILES 4096 /* tiles per reduction at most */
#define TWK_WIDE_GRAIN 4        /* terms per item of a tile at least (below: fewer tiles) */
#define TWK_WIDE_COLS 32        /* columns of a column-sum work-group (rmsnorm_back_w) at most */

/* Tiles per reduction when `reductions` reductions of `terms` terms each run side by side on a
 * device with compute_units (<= 0: unknown) and each tile should hold >= `grain` terms:
 * min(ceil(PER_CU * cu / reductions), ceil(terms / grain)), clamped to [1, MAX_TILES]. Never fails. */
int64_t twk_wide_tiles(int compute_units, int64_t reductions, int64_t terms, int64_t grain);

/* Start of tile t of [0, n) cut into `tiles`: t * (n / tiles) + min(t, n % tiles) (the first
 * n % tiles tiles are one longer). */
int64_t twk_wide_tile_start(int64_t n, int64_t tiles, int64_t t);

/* The columns C of a column-sum work-group for rows of D columns: the power of two >= D, at most
 * TWK_WIDE_COLS; the group's other dimension is TWK_WIDE_LOCAL / C row lanes. */
int twk_wide_cols(int64_t D);

/* 1 when the environment has TWK_REDUCE_NARROW=1 (read once per process): the backends then run
 * the older one-work-group reductions, for benchmarks that compare the two; else 0. */
int twk_reduce_narrow(void);

#endif
