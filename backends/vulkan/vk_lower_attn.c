/* Lowerings of attention onto the tiled training shader (attn_tile.comp: ATTN, ATTN_LSE,
 * ATTN_BACK), and the split-K rule of the decode path (attn.comp MODE 3 / 4: ATTN_CACHE over long
 * caches; its dispatches are in vk_lower.c's lower_attn).
 * TWK_ATTN_UNTILED=1 keeps the older per-token shaders (attn.comp MODE 0 / 1, attn_back.comp)
 * for benchmark comparisons; head sizes above 512 take them too. Those read f32 only: a launch
 * with a bf16 / f16 q, k or v stays tiled (vk_supports refuses one above 512). */
#include <stdlib.h>

#include "vk_internal.h"

int vk_attn_untiled(void) {
    const char *e = getenv("TWK_ATTN_UNTILED");
    return e && e[0] == '1';
}

#define SPLIT_KEYS 256            /* attn_cache split-K, as backends/kernels/attn_split.cl: keys per piece at least, */
#define SPLIT_MAX 32              /* pieces at most, */
#define SPLIT_BUDGET (32ll << 20) /* the partials' bytes at most */

int64_t vk_attn_splits(const twk_launch *l, int64_t cap) {
    const char *e = getenv("TWK_ATTN_UNSPLIT");
    if (l->op != TWK_OP_ATTN_CACHE || (e && e[0] == '1')) return 1;
    int64_t R = twk_desc_dim(&l->src[1], 0, cap), w = l->ip[1], ctx = w > 0 && w < R ? w : R;
    if (ctx <= SPLIT_KEYS) return 1;
    const twk_tensor_desc *q = &l->src[0];
    int64_t per = twk_desc_dim(q, 0, cap) * twk_desc_dim(q, 1, cap) * (twk_desc_dim(q, 2, cap) + 2) * 4;
    int64_t S = (ctx + SPLIT_KEYS - 1) / SPLIT_KEYS;
    if (S > SPLIT_MAX) S = SPLIT_MAX;
    while (S > 1 && per * S > SPLIT_BUDGET) S--;
    return S;
}

#define TILE_MAXB 32
#define TILE_FWD_BD 4096 /* B * D of a forward tile: <= 64 accumulators per invocation (ACC_F) */
#define TILE_BWD_BD 2048 /* backward: <= 32 (ACC_B) */

static int64_t tile_floats(int64_t B, int64_t D, int back) { return back ? 4 * B * D + B * B : 2 * B * D + 2 * B * B; }

/* Queries (and keys) per tile: the largest power of two <= 32 with B * D within the accumulator
 * budget and the tile's shared floats (plus fst / rl / rd, 3 x 32 words) within the device's
 * shared memory; *sm gets the floats. */
static int64_t tile_of(const vk_ctx *c, int64_t D, int back, uint32_t *sm) {
    int64_t lim = (int64_t)c->props.limits.maxComputeSharedMemorySize - 3 * TILE_MAXB * 4, b = TILE_MAXB;
    while (b > 1 && (b * D > (back ? TILE_BWD_BD : TILE_FWD_BD) || 4 * tile_floats(b, D, back) > lim)) b /= 2;
    *sm = (uint32_t)tile_floats(b, D, back);
    return b;
}

int vk_attn_half(const twk_launch *l) {
    if (l->op != TWK_OP_ATTN && l->op != TWK_OP_ATTN_LSE && l->op != TWK_OP_ATTN_BACK) return 0;
    for (int i = 0; i < 3 && i < l->nsrc - 1; i++) /* q, k (and v) */
        if (twk_dtype_is_half(l->src[i].type)) return 1;
    return 0;
}

int vk_attn_tiled(const vk_ctx *c, const twk_launch *l, int64_t D) {
    uint32_t sm;
    if (l->op != TWK_OP_ATTN && l->op != TWK_OP_ATTN_LSE && l->op != TWK_OP_ATTN_BACK) return 0;
    if (D > VK_ATTN_TILE_MAXD || (vk_attn_untiled() && !vk_attn_half(l))) return 0;
    int64_t b = tile_of(c, D, l->op == TWK_OP_ATTN_BACK, &sm);
    return 4 * (int64_t)sm + 3 * TILE_MAXB * 4 <= (int64_t)c->props.limits.maxComputeSharedMemorySize && b >= 1;
}

static uint32_t clamp_groups(const vk_ctx *c, int64_t g) {
    if (g < 1) g = 1;
    return g > (int64_t)c->max_groups ? c->max_groups : (uint32_t)g;
}

static void dims(vk_dispatch *x, const twk_launch *l, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, int64_t B,
                 int segi) {
    x->p[0] = (int32_t)T;
    x->p[1] = (int32_t)Hq;
    x->p[2] = (int32_t)Hkv;
    x->p[3] = (int32_t)D;
    x->p[4] = (int32_t)B;
    x->p[6] = l->src[segi].type == TWK_I64;
    x->p[8] = l->ip[1] > 0 ? l->ip[1] : 0; /* sliding window */
    x->fp[0] = l->fp[0];                   /* scale */
    x->fp[1] = l->fp[1];                   /* soft-cap */
}

static uint32_t h16_code(twk_dtype t) { return t == TWK_BF16 ? 1u : t == TWK_F16 ? 2u : 0u; }

/* The dtypes of q, k and v (spec constants 10..12) for the dispatches that stage them. */
static void qkv_codes(vk_dispatch *x, const twk_launch *l) {
    for (int i = 0; i < 3 && i < l->nsrc - 1; i++) x->spec[10 + i] = h16_code(l->src[i].type);
}

int vk_lower_attn_tile(const vk_ctx *c, const twk_launch *l, int64_t n, vk_dispatch *d, int *k, size_t *scratch) {
    const twk_tensor_desc *s = l->src;
    int64_t T = twk_desc_dim(&s[0], 0, n), Hq = twk_desc_dim(&s[0], 1, n), D = twk_desc_dim(&s[0], 2, n);
    int64_t Hkv = twk_desc_dim(&s[1], 1, n);
    int back = l->op == TWK_OP_ATTN_BACK, segi = l->op == TWK_OP_ATTN_LSE ? 2 : 3;
    uint32_t sm;
    int64_t B = tile_of(c, D, back, &sm), nt = (T + B - 1) / B;
    vk_dispatch *x;
    if (!back) {
        x = vk_next_dispatch(d, k, VKS_ATTN_TILE, 64, l->op == TWK_OP_ATTN_LSE);
        x->spec[2] = sm;
        x->bind[0] = VKB_DST;
        x->bind[1] = 0;
        x->bind[2] = 1;
        if (l->op == TWK_OP_ATTN) x->bind[3] = 2;
        x->bind[4] = segi;
        dims(x, l, T, Hq, Hkv, D, B, segi);
        qkv_codes(x, l);
        x->groups[0] = clamp_groups(c, nt * Hq);
        return 0;
    }
    /* (q, k, v, seg, o, dO, lse): which 0 dQ, 1 dK (both after delta into the scratch), 2 dV. delta
     * first is also what keeps the bindings at 8: dQ / dK read q, k, v, seg, dO, lse and delta, not o */
    int which = l->ip[0];
    if (which != 2) {
        x = vk_next_dispatch(d, k, VKS_ATTN_TILE, 64, 2);
        x->spec[2] = 1;
        x->bind[0] = VKB_SCRATCH;
        x->bind[1] = 4; /* o */
        x->bind[5] = 5; /* dO */
        dims(x, l, T, Hq, Hkv, D, B, segi);
        x->groups[0] = clamp_groups(c, (T * Hq + 63) / 64);
        *scratch = (size_t)(T * Hq) * sizeof(float);
    }
    x = vk_next_dispatch(d, k, VKS_ATTN_TILE, 64, 3 + which);
    x->spec[2] = sm;
    x->bind[0] = VKB_DST;
    for (int i = 0; i < 4; i++) x->bind[1 + i] = i; /* q, k, v, seg */
    x->bind[5] = 5;                                 /* dO */
    x->bind[6] = 6;                                 /* lse */
    if (which != 2) x->bind[7] = VKB_SCRATCH;       /* delta */
    dims(x, l, T, Hq, Hkv, D, B, segi);
    qkv_codes(x, l);
    x->groups[0] = clamp_groups(c, nt * (which == 0 ? Hq : Hkv));
    return 0;
}
