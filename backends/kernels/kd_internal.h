/* kd internals: the kd_call builders (kd_args.c) the per-op lowerings use
 * (kd_lower_*.c), and those lowerings, which kd.c's table names. */
#ifndef TWK_KD_INTERNAL_H
#define TWK_KD_INTERNAL_H

#include "kd.h"

/* Block sizes the kernels are written for (see the .cl files). */
#define KD_LOCAL_1D 256  /* elementwise grids */
#define KD_REDUCE_LOCAL 256
#define KD_ROW_LOCAL 256 /* the largest row group (nn.cl) */
#define KD_ATTN_L 64
#define KD_ATTN_MAXD 512
#define KD_FA_L 64 /* attn_tile.cl: items per group, B * D per forward / backward tile, largest B */
#define KD_FA_FWD_BD 4096
#define KD_FA_BWD_BD 2048
#define KD_FA_MAXB 32
#define KD_SPLIT_KEYS 256 /* attn_split.cl: keys per piece at least, pieces at most; the partials' budget */
#define KD_SPLIT_MAX 32
#define KD_SPLIT_BUDGET (32 << 20)
#define KD_UE_TT 8  /* unembed.cl: tokens per work-group */
#define KD_UE_L 256 /* unembed.cl: its items (vocabulary words per chunk) */

/* Starts call c of kernel `name` with no arguments. */
void kd_begin(kd_call *c, const char *name);
/* Appends tensor t's buffer (-1 dst, i src[i]) and its offset in elements of `elem` bytes. */
void kd_buf(kd_call *c, const twk_launch *l, int t, size_t elem);
void kd_err(kd_call *c);
void kd_i32(kd_call *c, int32_t v);
void kd_i64(kd_call *c, int64_t v);
void kd_f32(kd_call *c, float v);
/* A 1-D grid of `items` work items (rounded up to groups of `local`). */
void kd_grid_items(kd_call *c, int64_t items, size_t local);
/* A 1-D grid of `groups` work-groups of `local` items. */
void kd_grid_groups(kd_call *c, int64_t groups, size_t local);
/* The power of two >= n, clamped to [32, max]. */
size_t kd_pow2_local(int64_t n, size_t max);

/* Dims of a desc at token count n, right-aligned into 4 (1 before). */
void kd_pad4(const twk_tensor_desc *t, int64_t n, int64_t d[4]);
int64_t kd_dim(const twk_tensor_desc *t, int i, int64_t n);
int64_t kd_nelem(const twk_tensor_desc *t, int64_t n);

/* A lowering: writes the calls of launch l at token count n (`kernel` is
 * its table entry's kernel name); their number (0 = nothing to do), or -1
 * with an error. kd.c's table names one per op. */
typedef int (*kd_lower_fn)(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);

/* kd_lower_ew.c: maps (y, sources..., n [, fparam 0 | iparam 0]), add/mul,
 * broadcast, sum_to, reductions, layout. */
int kd_lower_map(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_map_f(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_map_i(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_binary(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
/* FUSED_EW through fused_ew_f32 (elementwise.cl): at most KD_FUSED_MAX_SRC sources and 8 steps. */
#define KD_FUSED_MAX_SRC 6
int kd_lower_fused(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
/* 1 when fused_ew_f32 runs the FUSED_EW launch l (sources, steps); else 0 and the reason in why (may be NULL). */
int kd_fused_ok(const twk_launch *l, char *why, size_t why_len);
int kd_lower_broadcast(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_sum_to(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_reduce(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_permute(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_slice(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_slice_back(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_concat(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
/* kd_lower_ew.c: the optimizer step (optim.cl); grad_acc is a plain map. */
int kd_lower_sqsum_parts(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_grad_norm(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_adamw(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
/* kd_lower_nn.c: transformer ops, the KV cache, attention. */
int kd_lower_get_rows(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_get_rows_back(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_rmsnorm(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_rmsnorm_back_w(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_rope(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_rmsnorm_rope(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_rope_rmsnorm_back_x(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_logprobs(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_logprobs_back(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
/* unembed_logprobs and its backward (unembed.cl): a group per tile of KD_UE_TT tokens. */
int kd_lower_unembed(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_kv_write(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_lora_gather(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_lora_gather_back(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_attn_fwd(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_attn_back(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
/* kd_lower_attn.c: attn / attn_lse / attn_back on the tiled kernels (attn_tile.cl); whether
 * TWK_ATTN_UNTILED=1 asks for the older per-token kernels instead. */
int kd_lower_attn_tile_fwd(const twk_launch *l, int64_t n, kd_call *calls);
int kd_lower_attn_tile_back(const twk_launch *l, int64_t n, kd_call *calls);
/* attn_cache's pieces at n (1: no split) and its split-K lowering (attn_split.cl; 2 calls). */
int64_t kd_attn_splits(const twk_launch *l, int64_t n);
int kd_lower_attn_split(const twk_launch *l, int64_t n, kd_call *calls);
/* 1 when TWK_ATTN_UNTILED=1 asks for attn.cl's kernels and l's q, k, v are f32 (they read no 16-bit). */
int kd_attn_untiled(const twk_launch *l);
/* kd_lower_moe.c: the mixture-of-experts routing (moe.cl); moe_gate_back shares moe_gate's,
 * moe_combine moe_dispatch's (kd_lower_moe_move). */
int kd_lower_moe_topk(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_moe_gate(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_moe_sort(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_moe_move(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
int kd_lower_moe_combine_back_w(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);
/* moe_router_stats and its backward (whole pass or per slot) */
int kd_lower_moe_router_stats(const twk_launch *l, int64_t n, kd_call *calls, const char *kernel);

/* attn_back's delta (kd_lower_attn.c); 0 for other launches. */
size_t kd_attn_scratch_bytes(const twk_launch *l, int64_t n);

/* kd_lower_reduce.c: the wide (two-stage) reductions of hal/twk_wide.h, sized to dev: sum, mean,
 * weighted_sum and sum_to a scalar, rmsnorm_back_w, sqsum_parts and grad_norm. A wide lowering
 * returns KD_NOT_WIDE for a launch it leaves to the entry's `lower` (sum_to to more than one
 * value; every launch under TWK_REDUCE_NARROW=1). */
#define KD_NOT_WIDE (-2)
typedef int (*kd_wide_fn)(const twk_launch *l, int64_t n, const kd_device *dev, kd_call *calls);
int kd_wide_sum(const twk_launch *l, int64_t n, const kd_device *dev, kd_call *calls);
int kd_wide_rmsnorm_back_w(const twk_launch *l, int64_t n, const kd_device *dev, kd_call *calls);
int kd_wide_sqsum_parts(const twk_launch *l, int64_t n, const kd_device *dev, kd_call *calls);
int kd_wide_grad_norm(const twk_launch *l, int64_t n, const kd_device *dev, kd_call *calls);
/* Their plan scratch (f32 partials, rmsnorm_back_w's rstd); 0 for other launches. */
size_t kd_wide_scratch_bytes(const twk_launch *l, int64_t n, const kd_device *dev);

#endif
