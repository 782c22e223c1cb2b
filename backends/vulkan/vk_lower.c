/* Per-op lowering: each launch becomes 1-3 dispatches of the shaders in
 * shaders/ (pipeline = shader + spec constants, sizes in push constants).
 * Launches with ids get a check.comp dispatch first. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "vk_internal.h"



static int has_lowering(twk_op op) {
    return op != TWK_OP_INPUT && op != TWK_OP_PARAM && op != TWK_OP_RESHAPE && op < TWK_OP_COUNT;
}

bool vk_supports(const twk_launch *l, char *why, size_t why_len) {
    if (!has_lowering(l->op)) {
        if (why) snprintf(why, why_len, "no vulkan kernel for %s", twk_op_name(l->op));
        return false;
    }
    if (l->dst.ndim > 4 || l->dst.ndim < 1) {
        if (why) snprintf(why, why_len, "rank %d", l->dst.ndim);
        return false;
    }
    if (!twk_launch_dtypes_ok(l, "vulkan", why, why_len)) return false;
    if (twk_op_is_copy(l->op)) return true;
    if (l->op == TWK_OP_MATMUL && l->src[0].ndim != 2 && l->src[0].ndim != 3) {
        if (why) snprintf(why, why_len, "matmul of rank %d", l->src[0].ndim);
        return false;
    }
    return true;
}

/* ---- helpers ---- */

static int64_t dim(const twk_tensor_desc *t, int i, int64_t n) { return twk_desc_dim(t, i, n); }

static void pad4(const twk_tensor_desc *t, int64_t n, int64_t d[4]) {
    int off = 4 - t->ndim;
    for (int i = 0; i < 4; i++) d[i] = i < off ? 1 : dim(t, i - off, n);
}

static int64_t inner_of(const twk_tensor_desc *t, int from, int64_t n) {
    int64_t e = 1;
    for (int i = from; i < t->ndim; i++) e *= dim(t, i, n);
    return e;
}

static void bcast_strides(const int64_t s[4], int32_t st[4]) {
    int64_t acc = 1;
    for (int i = 3; i >= 0; i--) {
        st[i] = s[i] == 1 ? 0 : (int32_t)acc;
        acc *= s[i];
    }
}

static vk_dispatch *start(vk_dispatch *d, int *k, vk_shader s, uint32_t wg, int mode) {
    vk_dispatch *x = &d[(*k)++];
    memset(x, 0, sizeof *x);
    x->shader = s;
    x->spec[0] = wg;
    x->spec[1] = (uint32_t)mode;
    for (int i = 0; i < VK_NBIND; i++) x->bind[i] = VKB_NONE;
    x->groups[0] = x->groups[1] = x->groups[2] = 1;
    return x;
}

static uint32_t groups_for(const vk_ctx *c, int64_t items, uint32_t per_group) {
    int64_t g = (items + per_group - 1) / per_group;
    if (g < 1) g = 1;
    if (g > (int64_t)c->max_groups) g = c->max_groups;
    return (uint32_t)g;
}

/* A check.comp dispatch over the `count` ids of source `src`. */
static void check_ids(const vk_ctx *c, vk_dispatch *d, int *k, const twk_launch *l, int li, int src, int64_t count,
                      int64_t limit, int mode) {
    vk_dispatch *x = start(d, k, VKS_CHECK, 64, mode);
    x->bind[1] = src;
    x->p[0] = (int32_t)count;
    x->p[1] = (int32_t)(limit > INT32_MAX ? INT32_MAX : limit);
    x->p[2] = l->src[src].type == TWK_I64;
    x->p[4] = li;
    if (mode == 2) {
        x->bind[2] = src + 1;
        x->p[3] = l->src[src + 1].type == TWK_I64;
    }
    x->groups[0] = groups_for(c, count, 64);
}

static void copy_box(vk_dispatch *x, const int64_t box[4], const int64_t sst[4], const int64_t dst_st[4], int es) {
    int64_t n = 1;
    for (int i = 0; i < 4; i++) {
        x->p[i] = (int32_t)box[i];
        x->p[4 + i] = (int32_t)sst[i];
        x->p[8 + i] = (int32_t)dst_st[i];
        n *= box[i];
    }
    x->p[12] = es;
    x->p[13] = (int32_t)n;
}

size_t vk_const_bytes(const twk_launch *l) {
    if (l->op == TWK_OP_ROPE && l->nsrc <= 2) return ((size_t)(l->dst.ne[2] / 2) * 4 + 15) / 16 * 16;
    return 0;
}

void vk_write_consts(const twk_launch *l, void *dst) {
    if (l->op == TWK_OP_ROPE && l->nsrc <= 2) { /* inv_freq as transformers computes it (as the CPU does) */
        int64_t half = l->dst.ne[2] / 2;
        float *f = dst;
        for (int64_t i = 0; i < half; i++)
            f[i] = (float)(1.0 / pow((double)l->fp[0], (double)(2 * i) / (double)(2 * half)));
    }
}

/* ---- lowering ---- */

int vk_lower(const vk_ctx *c, const twk_launch *l, int li, int64_t n, size_t const_off, vk_dispatch *d,
             size_t *scratch_bytes) {
    int k = 0;
    vk_dispatch *x;
    const twk_tensor_desc *y = &l->dst, *s = l->src;
    int64_t ny = twk_desc_nelem(y, n);
    *scratch_bytes = 0;
    for (int i = 0; i < l->nsrc; i++)
        if (twk_desc_nelem(&s[i], n) > INT32_MAX) goto too_big;
    if (ny > INT32_MAX) goto too_big;
    switch (l->op) {
    case TWK_OP_FILL:
    case TWK_OP_SCALE:
    case TWK_OP_SILU:
    case TWK_OP_SILU_BACK:
    case TWK_OP_SWIGLU:
    case TWK_OP_SWIGLU_BACK: {
        int mode = l->op == TWK_OP_FILL ? 0 : l->op == TWK_OP_SCALE ? 1 : l->op == TWK_OP_SILU ? 2
                 : l->op == TWK_OP_SILU_BACK ? 3 : l->op == TWK_OP_SWIGLU ? 4 : (l->ip[0] == 0 ? 5 : 6);
        x = start(d, &k, VKS_ELTWISE, 128, mode);
        x->bind[0] = VKB_DST;
        for (int i = 0; i < l->nsrc && i < 3; i++) x->bind[1 + i] = i;
        x->p[0] = (int32_t)ny;
        x->fp[0] = l->fp[0];
        x->groups[0] = groups_for(c, ny, 128);
        break;
    }
    case TWK_OP_ADD:
    case TWK_OP_MUL:
    case TWK_OP_BROADCAST: {
        int bc = l->op == TWK_OP_BROADCAST;
        x = start(d, &k, VKS_BROADCAST, 128, l->op == TWK_OP_ADD ? 0 : l->op == TWK_OP_MUL ? 1 : 2);
        int64_t D[4], S[4];
        pad4(y, n, D);
        pad4(bc ? &s[0] : &s[1], n, S);
        int32_t st[4];
        bcast_strides(S, st);
        for (int i = 0; i < 4; i++) {
            x->p[i] = (int32_t)D[i];
            x->p[4 + i] = st[i];
        }
        x->p[8] = (int32_t)ny;
        x->bind[0] = VKB_DST;
        x->bind[1] = 0;
        x->bind[2] = bc ? 0 : 1;
        x->fp[0] = bc && l->ip[0] ? (float)(1.0 / (double)ny) : 1.0f;
        x->groups[0] = groups_for(c, ny, 128);
        break;
    }
    case TWK_OP_SUM_TO: {
        x = start(d, &k, VKS_SUM_TO, 64, 0);
        int64_t D[4], S[4];
        pad4(y, n, D);
        pad4(&s[0], n, S);
        for (int i = 0; i < 4; i++) {
            x->p[i] = (int32_t)D[i];
            x->p[4 + i] = (int32_t)S[i];
        }
        x->p[8] = (int32_t)ny;
        x->bind[0] = VKB_DST;
        x->bind[1] = 0;
        x->groups[0] = groups_for(c, ny, 64);
        break;
    }
    case TWK_OP_SUM:
    case TWK_OP_MEAN:
    case TWK_OP_WEIGHTED_SUM:
    {
        uint32_t wg = 256; /* a power of two the device allows (Vulkan guarantees 128) */
        while (wg > c->props.limits.maxComputeWorkGroupInvocations) wg /= 2;
        x = start(d, &k, VKS_REDUCE, wg, l->op == TWK_OP_SUM ? 0 : l->op == TWK_OP_MEAN ? 1 : 2);
        x->bind[0] = VKB_DST;
        x->bind[1] = 0;
        if (l->op == TWK_OP_WEIGHTED_SUM) x->bind[2] = 1;
        x->p[0] = (int32_t)twk_desc_nelem(&s[0], n);
        break;
    }
    case TWK_OP_PERMUTE: {
        x = start(d, &k, VKS_COPY, 128, 0);
        const twk_tensor_desc *in = &s[0];
        int nd = in->ndim, off = 4 - nd;
        int64_t in_st[TWK_MAX_DIMS], box[4], sst[4], dst_st[4];
        in_st[nd - 1] = 1;
        for (int i = nd - 2; i >= 0; i--) in_st[i] = in_st[i + 1] * dim(in, i + 1, n);
        for (int i = 0; i < 4; i++) {
            int p = i < off ? -1 : l->ip[i - off];
            if (p < 0 || p >= nd) {
                box[i] = 1;
                sst[i] = 0;
            } else {
                box[i] = dim(in, p, n);
                sst[i] = in_st[p];
            }
        }
        dst_st[3] = 1;
        for (int i = 2; i >= 0; i--) dst_st[i] = dst_st[i + 1] * box[i + 1];
        copy_box(x, box, sst, dst_st, (int)(twk_dtype_size(y->type) / 4));
        x->bind[0] = VKB_DST;
        x->bind[1] = 0;
        x->groups[0] = groups_for(c, ny, 128);
        break;
    }
    case TWK_OP_SLICE:
    case TWK_OP_SLICE_BACK:
    case TWK_OP_CONCAT: {
        int axis = l->ip[0], es = (int)(twk_dtype_size(y->type) / 4);
        int64_t outer = 1;
        for (int i = 0; i < axis; i++) outer *= dim(y, i, n);
        int64_t inner = inner_of(y, axis + 1, n), yax = dim(y, axis, n);
        if (l->op == TWK_OP_SLICE_BACK) {
            x = start(d, &k, VKS_COPY, 128, 1);
            x->bind[0] = VKB_DST;
            x->p[13] = (int32_t)(ny * es);
            x->groups[0] = groups_for(c, ny * es, 128);
        }
        for (int part = 0; part < (l->op == TWK_OP_CONCAT ? 2 : 1); part++) {
            const twk_tensor_desc *src = &s[part];
            int64_t sax = dim(src, axis, n);
            int64_t len = l->op == TWK_OP_SLICE ? yax : sax;
            int64_t src_start = l->op == TWK_OP_SLICE ? l->ip[1] : 0;
            int64_t dst_start = l->op == TWK_OP_SLICE_BACK ? l->ip[1] : part ? dim(&s[0], axis, n) : 0;
            int64_t box[4] = {1, outer, len, inner}, sst[4] = {0, sax * inner, inner, 1},
                    dst_st[4] = {0, yax * inner, inner, 1};
            x = start(d, &k, VKS_COPY, 128, 0);
            copy_box(x, box, sst, dst_st, es);
            x->bind[0] = VKB_DST;
            x->bind[1] = part;
            x->add_off[0] = (uint32_t)(dst_start * inner * es);
            x->add_off[1] = (uint32_t)(src_start * inner * es);
            x->groups[0] = groups_for(c, outer * len * inner, 128);
        }
        break;
    }
    case TWK_OP_MATMUL: {
        int r = s[0].ndim, ta = l->ip[0] != 0, tb = l->ip[1] != 0;
        int64_t batch = r == 3 ? dim(&s[0], 0, n) : 1;
        int64_t M = dim(y, r - 2, n), N = dim(y, r - 1, n);
        int64_t K = ta ? dim(&s[0], r - 2, n) : dim(&s[0], r - 1, n);
        /* M <= 8 (decoding): one output per thread, no barriers; else 64 x 64
         * tiles, K in steps of 8, 8 x 8 outputs per thread (64 threads) */
        int simple = M <= 8;
        uint32_t BM = 64, BN = 64, BK = 8, TM = 8, TN = 8;
        if (c->gemm_fp16) {
            /* TWK_VULKAN_GEMM=fp16: every MATMUL on cooperative matrices. 2 x 2
             * subgroups, each with 2 x 2 tiles of the device's MM x MN shape; K in
             * steps of 2 MK (vk_coopmat.c checked the limits for this shape) */
            simple = 0;
            BM = 4 * c->coop.m;
            BN = 4 * c->coop.n;
            x = start(d, &k, VKS_MATMUL_COOPMAT, 4 * c->coop.subgroup, 0);
            x->spec[2] = BM;
            x->spec[3] = BN;
            x->spec[4] = 2 * c->coop.k;
            x->spec[5] = c->coop.m;
            x->spec[6] = c->coop.n;
            x->spec[9] = c->coop.k;
        } else {
            x = start(d, &k, VKS_MATMUL, simple ? 64 : (BM / TM) * (BN / TN), simple);
            x->spec[2] = BM;
            x->spec[3] = BN;
            x->spec[4] = BK;
            x->spec[5] = TM;
            x->spec[6] = TN;
        }
        x->spec[7] = (uint32_t)ta;
        x->spec[8] = (uint32_t)tb;
        x->p[0] = (int32_t)M;
        x->p[1] = (int32_t)N;
        x->p[2] = (int32_t)K;
        x->p[3] = (int32_t)dim(&s[0], r - 1, n);
        x->p[4] = (int32_t)dim(&s[1], r - 1, n);
        x->p[5] = (int32_t)N;
        x->p[6] = (int32_t)(M * K);
        x->p[7] = (int32_t)(K * N);
        x->p[8] = (int32_t)(M * N);
        x->p[9] = (int32_t)batch;
        x->bind[0] = VKB_DST;
        x->bind[1] = 0;
        x->bind[2] = 1;
        if ((N + BN - 1) / BN > (int64_t)c->max_groups) goto too_big;
        x->groups[0] = (uint32_t)((N + BN - 1) / BN);
        x->groups[1] = groups_for(c, M, BM);
        x->groups[2] = groups_for(c, batch, 1);
        if (simple) {
            x->groups[0] = groups_for(c, M * N, 64);
            x->groups[1] = 1;
        }
        break;
    }
    case TWK_OP_GET_ROWS:
    case TWK_OP_GET_ROWS_BACK: {
        int back = l->op == TWK_OP_GET_ROWS_BACK;
        int64_t T = dim(&s[1], 0, n), D = dim(y, 1, n), V = back ? dim(y, 0, n) : dim(&s[0], 0, n);
        check_ids(c, d, &k, l, li, 1, T, V, 0);
        if (back) { /* zero the whole table in parallel; the columns then accumulate */
            x = start(d, &k, VKS_COPY, 128, 1);
            x->bind[0] = VKB_DST;
            x->p[13] = (int32_t)ny;
            x->groups[0] = groups_for(c, ny, 128);
        }
        x = start(d, &k, VKS_ROWS, 64, back ? 1 : 0);
        x->bind[0] = VKB_DST;
        x->bind[1] = 0;
        x->bind[2] = 1;
        x->p[0] = (int32_t)T;
        x->p[1] = (int32_t)D;
        x->p[2] = (int32_t)V;
        x->p[7] = s[1].type == TWK_I64;
        x->groups[0] = groups_for(c, back ? D : T * D, 64);
        break;
    }
    case TWK_OP_KV_WRITE: {
        int64_t T = dim(&s[1], 0, n), row = dim(&s[1], 1, n) * dim(&s[1], 2, n), R = dim(y, 0, n);
        check_ids(c, d, &k, l, li, 2, T, R, 0);
        x = start(d, &k, VKS_ROWS, 64, 2);
        x->bind[0] = VKB_DST;
        x->bind[1] = 1;
        x->bind[2] = 2;
        x->p[0] = (int32_t)T;
        x->p[1] = (int32_t)row;
        x->p[2] = (int32_t)R;
        x->p[7] = s[2].type == TWK_I64;
        x->groups[0] = groups_for(c, T * row, 64);
        break;
    }
    case TWK_OP_LORA_GATHER: {
        int64_t T = dim(&s[0], 0, n), K = dim(&s[0], 1, n), S = dim(&s[1], 0, n), N = dim(&s[1], 1, n);
        check_ids(c, d, &k, l, li, 2, T, S, 0);
        x = start(d, &k, VKS_ROWS, 64, 3);
        x->bind[0] = VKB_DST;
        x->bind[1] = 0;
        x->bind[2] = 2;
        x->bind[3] = 1;
        x->p[0] = (int32_t)T;
        x->p[1] = (int32_t)N;
        x->p[2] = (int32_t)S;
        x->p[3] = (int32_t)K;
        x->p[7] = s[2].type == TWK_I64;
        x->groups[0] = groups_for(c, T * N, 64);
        break;
    }
    case TWK_OP_RMSNORM:
    case TWK_OP_RMSNORM_BACK_X: {
        int64_t D = dim(y, y->ndim - 1, n), R = ny / (D ? D : 1);
        x = start(d, &k, VKS_ROWNORM, 128, l->op == TWK_OP_RMSNORM ? 0 : 1);
        x->bind[0] = VKB_DST;
        for (int i = 0; i < l->nsrc; i++) x->bind[1 + i] = i;
        x->p[0] = (int32_t)R;
        x->p[1] = (int32_t)D;
        x->fp[0] = l->fp[0];
        x->groups[0] = groups_for(c, R, 1);
        break;
    }
    case TWK_OP_RMSNORM_BACK_W: {
        int64_t D = dim(y, 0, n), R = twk_desc_nelem(&s[0], n) / (D ? D : 1);
        x = start(d, &k, VKS_ROWNORM, 128, 2);
        x->bind[0] = VKB_SCRATCH;
        x->bind[1] = 0;
        x->p[0] = (int32_t)R;
        x->p[1] = (int32_t)D;
        x->fp[0] = l->fp[0];
        x->groups[0] = groups_for(c, R, 1);
        x = start(d, &k, VKS_ROWNORM, 64, 3);
        x->bind[0] = VKB_DST;
        x->bind[1] = 0;
        x->bind[2] = 1;
        x->bind[3] = VKB_SCRATCH;
        x->p[0] = (int32_t)R;
        x->p[1] = (int32_t)D;
        x->groups[0] = groups_for(c, D, 64);
        *scratch_bytes = (size_t)R * 4;
        break;
    }
    case TWK_OP_ROPE: {
        int64_t T = dim(y, 0, n), H = dim(y, 1, n), D = dim(y, 2, n);
        x = start(d, &k, VKS_ROPE, 64, 0);
        x->bind[0] = VKB_DST;
        x->bind[1] = 0;
        x->bind[2] = 1;
        if (l->nsrc > 2) {
            x->bind[3] = 2;
        } else {
            x->bind[3] = VKB_CONST;
            x->add_off[3] = (uint32_t)(const_off / 4);
        }
        x->p[0] = (int32_t)T;
        x->p[1] = (int32_t)H;
        x->p[2] = (int32_t)D;
        x->p[7] = s[1].type == TWK_I64;
        x->fp[0] = l->ip[0] ? -1.0f : 1.0f;
        x->groups[0] = groups_for(c, T * H * (D / 2), 64);
        break;
    }
    case TWK_OP_LOGPROBS:
    case TWK_OP_LOGPROBS_BACK: {
        int64_t T = dim(&s[0], 0, n), V = dim(&s[0], 1, n);
        check_ids(c, d, &k, l, li, 1, T, V, 0);
        x = start(d, &k, VKS_ROWNORM, 128, l->op == TWK_OP_LOGPROBS ? 4 : 5);
        x->bind[0] = VKB_DST;
        for (int i = 0; i < l->nsrc; i++) x->bind[1 + i] = i;
        x->p[0] = (int32_t)T;
        x->p[1] = (int32_t)V;
        x->p[7] = s[1].type == TWK_I64;
        x->groups[0] = groups_for(c, T, 1);
        break;
    }
    case TWK_OP_ATTN:
    case TWK_OP_ATTN_LSE:
    case TWK_OP_ATTN_BACK:
    case TWK_OP_ATTN_CACHE: {
        int segi = l->op == TWK_OP_ATTN_LSE ? 2 : 3;
        int64_t T = dim(&s[0], 0, n), Hq = dim(&s[0], 1, n), D = dim(&s[0], 2, n), Hkv = dim(&s[1], 1, n);
        int64_t rows = l->op == TWK_OP_ATTN_CACHE ? dim(&s[1], 0, n) : T;
        if (l->op == TWK_OP_ATTN_CACHE) check_ids(c, d, &k, l, li, 3, T, rows, 2);
        else check_ids(c, d, &k, l, li, segi, T, T, 1);
        if (l->op == TWK_OP_ATTN_BACK) {
            x = start(d, &k, VKS_ATTN_BACK, 64, l->ip[0]);
            for (int i = 0; i < 7; i++) x->bind[1 + i] = i;
        } else {
            x = start(d, &k, VKS_ATTN, 64, l->op == TWK_OP_ATTN ? 0 : l->op == TWK_OP_ATTN_LSE ? 1 : 2);
            x->bind[1] = 0;
            x->bind[2] = 1;
            if (l->op != TWK_OP_ATTN_LSE) x->bind[3] = 2;
            x->bind[4] = segi;
            if (l->op == TWK_OP_ATTN_CACHE) {
                x->bind[5] = 4;
                x->p[7] = s[4].type == TWK_I64;
            }
        }
        x->bind[0] = VKB_DST;
        x->p[0] = (int32_t)T;
        x->p[1] = (int32_t)Hq;
        x->p[2] = (int32_t)Hkv;
        x->p[3] = (int32_t)D;
        x->p[4] = (int32_t)rows;
        x->p[6] = s[segi].type == TWK_I64;
        x->fp[0] = l->fp[0];
        if (Hkv < 1 || Hq % Hkv) {
            twk_error(TWK_ERR_SHAPE, "vulkan: %s '%s': %lld query heads over %lld kv heads", twk_op_name(l->op),
                      l->name, (long long)Hq, (long long)Hkv);
            return -1;
        }
        int kv_groups = l->op == TWK_OP_ATTN_BACK && l->ip[0] != 0;
        if ((kv_groups ? Hkv : Hq) > (int64_t)c->max_groups) goto too_big;
        x->groups[0] = (uint32_t)(kv_groups ? Hkv : Hq);
        x->groups[1] = groups_for(c, T, 1);
        break;
    }
    default:
        twk_error(TWK_ERR_UNSUPPORTED, "vulkan: no kernel for op %s ('%s')", twk_op_name(l->op), l->name);
        return -1;
    }
    return k;
too_big:
    twk_error(TWK_ERR_UNSUPPORTED, "vulkan: %s '%s' is too large for 32-bit shader indexing", twk_op_name(l->op),
              l->name);
    return -1;
}
