/* Tiled attention for training (ATTN, ATTN_LSE, ATTN_BACK), FlashAttention-2's scheme:
 * causal within packed segments (token i sees keys seg[i]..i, with a sliding window the
 * last `window` of them), grouped-query heads (head h reads kv head h / (Hq / Hkv)),
 * scores scale * q.k soft-capped to cap * tanh(s / cap) where cap > 0.
 *
 * Tiles of B queries and B keys (B chosen by kd_lower_nn.c from the head size, B * D <=
 * KD_FA_FWD_BD forward, KD_FA_BWD_BD backward) sit in local memory; no [T x T] array
 * exists anywhere. The forward keeps a running max m and sum l per query; the backward
 * recomputes the probabilities tile by tile as exp(s - lse) from the saved log-sum-exp,
 * with delta_i = dO_i . o_i computed first (attn_tile_delta, into the plan scratch).
 *
 * Bits do not depend on the tiling: every output element is one chain of operations over
 * the keys (forward, dQ) or (head, query) pairs (dK, dV) in ascending order, where masked
 * or zero terms are skipped rather than added; the forward's running max is updated key by
 * key (one thread walks a query's keys in order and records the rescale factor a key
 * brings, 1 when the max stays), so a query gives the same bits whatever tile it falls in
 * and whatever segments are packed beside it. Masked keys never reach exp().
 *
 * q, k and v arrive untyped with a dtype code each (q_ty, k_ty, v_ty: KD_FA_F32, KD_FA_BF16,
 * KD_FA_F16; their offsets in elements of that dtype) and are widened to f32 as a tile is
 * staged (half.cl); everything after the staging is f32, so a 16-bit operand gives the bits
 * of the f32 operand holding its widened values. o, dO, lse, delta and the outputs are f32. */

#define KD_FA_L 64          /* items per work-group */
#define KD_FA_FWD_BD 4096   /* B * D of a forward tile (<= 64 accumulators per item) */
#define KD_FA_BWD_BD 2048   /* B * D of a backward tile (<= 32 accumulators per item) */
#define KD_FA_MAXB 32
#define KD_FA_ACC_FWD (KD_FA_FWD_BD / KD_FA_L)
#define KD_FA_ACC_BWD (KD_FA_BWD_BD / KD_FA_L)
#define KD_FA_SMEM (2 * KD_FA_FWD_BD + 2 * KD_FA_MAXB * KD_FA_MAXB) /* floats; also >= 4 * KD_FA_BWD_BD + B * B */

#define KD_FA_F32 0
#define KD_FA_BF16 1
#define KD_FA_F16 2

/* Element i of an f32 / bf16 / f16 tensor (dtype code ty), widened. */
TWK_FN float kd_fa_at(const TWK_GLOBAL void *p, long i, int ty) {
    if (ty == KD_FA_F32) return ((const TWK_GLOBAL float *)p)[i];
    return kd_h16((const TWK_GLOBAL ushort *)p, i, ty == KD_FA_F16);
}

/* First key of query i (seg[i], or the window's start), or -1 when seg is malformed at i. */
TWK_FN long kd_fa_first(const TWK_GLOBAL int *seg, long i, int is64, long window) {
    long s = kd_id(seg, i, is64), prev = i > 0 ? kd_id(seg, i - 1, is64) : 0;
    if (s < 0 || s > i || (s != prev && s != i)) return -1;
    return window > 0 && i + 1 - window > s ? i + 1 - window : s;
}

/* The capped score of q_i (qs, local) against k_j (ks, local), d in ascending order. */
TWK_FN float kd_fa_score(const TWK_LOCAL_PTR float *qs, const TWK_LOCAL_PTR float *ks, long D, float scale,
                         float cap) {
    float dot = 0.0f;
    for (long d = 0; d < D; d++) dot += qs[d] * ks[d];
    return kd_softcap(dot * scale, cap);
}

/* Rows [r0, r0 + B) of a [T, H, D] tensor (from element off, dtype code ty) at head h into
 * dst [B, D] as f32 (zeros past T). */
TWK_FN void kd_fa_load(TWK_LOCAL_PTR float *dst, const TWK_GLOBAL void *src, long off, int ty, long r0, long B,
                       long T, long H, long h, long D, int lid) {
    for (long e = lid; e < B * D; e += KD_FA_L) {
        long r = e / D, d = e % D, t = r0 + r;
        dst[e] = t < T ? kd_fa_at(src, off + (t * H + h) * D + d, ty) : 0.0f;
    }
}

/* o [T, Hq, D] (want_o) and lse [T, Hq] (want_lse) of q [T, Hq, D] over k, v [T, Hkv, D]:
 * one group per (tile of B queries, head). */
TWK_KERNEL attn_tile_fwd_f32(TWK_GLOBAL float *o, long o_off, TWK_GLOBAL float *lse, long lse_off,
                             TWK_GLOBAL const void *q, long q_off, TWK_GLOBAL const void *k, long k_off,
                             TWK_GLOBAL const void *v, long v_off, TWK_GLOBAL const int *seg, long seg_off,
                             TWK_GLOBAL int *err, long err_off, long T, long Hq, long Hkv, long D, long B,
                             float scale, int want_o, int want_lse, int is64, long window, float cap, int q_ty,
                             int k_ty, int v_ty) {
    TWK_LOCAL(float, sm, KD_FA_SMEM);
    TWK_LOCAL(long, first, KD_FA_MAXB);
    int lid = TWK_LID(0);
    long nt = (T + B - 1) / B, i0 = (TWK_GROUP(0) % nt) * B, h = TWK_GROUP(0) / nt, hk = h / (Hq / Hkv);
    TWK_LOCAL_PTR float *qs = sm, *kv = sm + B * D, *ps = sm + 2 * B * D, *as = ps + B * B;
    const TWK_GLOBAL int *sg = seg + seg_off;
    if (lid < B) {
        long i = i0 + lid, f = i < T ? kd_fa_first(sg, i, is64, window) : i;
        if (f < 0) {
            err[err_off] = KD_ERR_SEGMENT;
            f = i + 1; /* no keys: the row's outputs are zeros */
        }
        first[lid] = f;
    }
    kd_fa_load(qs, q, q_off, q_ty, i0, B, T, Hq, h, D, lid);
    TWK_BARRIER();
    long iend = i0 + B < T ? i0 + B : T, c_lo = first[0];
    for (long r = 1; r < iend - i0; r++) c_lo = first[r] < c_lo ? first[r] : c_lo;
    int nx = (int)((B * D - lid + KD_FA_L - 1) / KD_FA_L); /* the accumulators item lid owns */
    float acc[KD_FA_ACC_FWD];
    for (int e = 0; e < KD_FA_ACC_FWD; e++) acc[e] = 0.0f;
    float m = KD_NEG_BIG, l = 0.0f; /* item lid < B: the running max and sum of query i0 + lid */
    for (long c0 = c_lo; c0 < iend; c0 += B) {
        kd_fa_load(kv, k, k_off, k_ty, c0, B, T, Hkv, hk, D, lid);
        TWK_BARRIER();
        for (long e = lid; e < B * B; e += KD_FA_L) {
            long r = e / B, c = e % B, i = i0 + r, j = c0 + c;
            if (i < iend && j >= first[r] && j <= i) ps[e] = kd_fa_score(qs + r * D, kv + c * D, D, scale, cap);
        }
        TWK_BARRIER();
        kd_fa_load(kv, v, v_off, v_ty, c0, B, T, Hkv, hk, D, lid);
        TWK_BARRIER(); /* (PoCL lost the V tile at D = 1 when the walk below shared this phase) */
        if (lid < B) { /* query i0 + lid walks the tile's keys in order */
            long i = i0 + lid;
            for (long c = 0; c < B; c++) {
                long j = c0 + c, e = lid * B + c;
                if (i >= iend || j < first[lid] || j > i) {
                    ps[e] = 0.0f;
                    as[e] = 1.0f;
                    continue;
                }
                float s = ps[e], a = 1.0f;
                if (s > m) {
                    a = exp(m - s); /* m is finite (KD_NEG_BIG at first): never inf - inf */
                    m = s;
                }
                float p = exp(s - m);
                l = l * a + p;
                ps[e] = p;
                as[e] = a;
            }
        }
        TWK_BARRIER();
        if (want_o)
            for (int x = 0; x < nx; x++) {
                long e = lid + (long)x * KD_FA_L, r = e / D, d = e % D;
                float a_ = acc[x];
                for (long c = 0; c < B; c++) {
                    float a = as[r * B + c], p = ps[r * B + c];
                    if (a != 1.0f) a_ *= a;
                    if (p != 0.0f) a_ += p * kv[c * D + d];
                }
                acc[x] = a_;
            }
        TWK_BARRIER();
    }
    if (lid < B) { /* each row's 1 / l through local memory to the items that own its dims */
        ps[lid] = l > 0.0f ? 1.0f / l : 0.0f;
        if (want_lse && i0 + lid < T) lse[lse_off + (i0 + lid) * Hq + h] = l > 0.0f ? m + log(l) : 0.0f;
    }
    TWK_BARRIER();
    if (want_o)
        for (int x = 0; x < nx; x++) {
            long e = lid + (long)x * KD_FA_L, r = e / D, d = e % D;
            if (i0 + r < T) o[o_off + ((i0 + r) * Hq + h) * D + d] = acc[x] * ps[r];
        }
}

/* delta [T, Hq] = rowsum(dO * o), d in ascending order: one item per (token, head). */
TWK_KERNEL attn_tile_delta_f32(TWK_GLOBAL float *delta, long delta_off, TWK_GLOBAL const float *o, long o_off,
                               TWK_GLOBAL const float *dO, long dO_off, long rows, long D) {
    long g = TWK_GID(0);
    if (g >= rows) return;
    float s = 0.0f;
    for (long d = 0; d < D; d++) s += dO[dO_off + g * D + d] * o[o_off + g * D + d];
    delta[delta_off + g] = s;
}

/* dQ [T, Hq, D]: dq_i = sum_j dS_ij k_j, dS = P (dO_i . v_j - delta_i) cap' scale with
 * P = exp(s_ij - lse_i); one group per (tile of B queries, head), keys in tiles. */
TWK_KERNEL attn_tile_back_q_f32(TWK_GLOBAL float *dq, long dq_off, TWK_GLOBAL const void *q, long q_off,
                                TWK_GLOBAL const void *k, long k_off, TWK_GLOBAL const void *v, long v_off,
                                TWK_GLOBAL const int *seg, long seg_off, TWK_GLOBAL const float *dO, long dO_off,
                                TWK_GLOBAL const float *lse, long lse_off, TWK_GLOBAL const float *delta,
                                long delta_off, TWK_GLOBAL int *err, long err_off, long T, long Hq, long Hkv, long D,
                                long B, float scale, int is64, long window, float cap, int q_ty, int k_ty, int v_ty) {
    TWK_LOCAL(float, sm, KD_FA_SMEM);
    TWK_LOCAL(long, first, KD_FA_MAXB);
    TWK_LOCAL(float, rl, KD_FA_MAXB);
    TWK_LOCAL(float, rd, KD_FA_MAXB);
    int lid = TWK_LID(0);
    long nt = (T + B - 1) / B, i0 = (TWK_GROUP(0) % nt) * B, h = TWK_GROUP(0) / nt, hk = h / (Hq / Hkv);
    TWK_LOCAL_PTR float *qs = sm, *gs = sm + B * D, *ks = sm + 2 * B * D, *vs = sm + 3 * B * D,
                        *ds = sm + 4 * B * D;
    const TWK_GLOBAL int *sg = seg + seg_off;
    if (lid < B) {
        long i = i0 + lid, f = i < T ? kd_fa_first(sg, i, is64, window) : i;
        if (f < 0) {
            err[err_off] = KD_ERR_SEGMENT;
            f = i + 1;
        }
        first[lid] = f;
        rl[lid] = i < T ? lse[lse_off + i * Hq + h] : 0.0f;
        rd[lid] = i < T ? delta[delta_off + i * Hq + h] : 0.0f;
    }
    kd_fa_load(qs, q, q_off, q_ty, i0, B, T, Hq, h, D, lid);
    kd_fa_load(gs, dO, dO_off, KD_FA_F32, i0, B, T, Hq, h, D, lid);
    TWK_BARRIER();
    long iend = i0 + B < T ? i0 + B : T, c_lo = first[0];
    for (long r = 1; r < iend - i0; r++) c_lo = first[r] < c_lo ? first[r] : c_lo;
    int nx = (int)((B * D - lid + KD_FA_L - 1) / KD_FA_L); /* the accumulators item lid owns */
    float acc[KD_FA_ACC_BWD];
    for (int e = 0; e < KD_FA_ACC_BWD; e++) acc[e] = 0.0f;
    for (long c0 = c_lo; c0 < iend; c0 += B) {
        kd_fa_load(ks, k, k_off, k_ty, c0, B, T, Hkv, hk, D, lid);
        kd_fa_load(vs, v, v_off, v_ty, c0, B, T, Hkv, hk, D, lid);
        TWK_BARRIER();
        for (long e = lid; e < B * B; e += KD_FA_L) {
            long r = e / B, c = e % B, i = i0 + r, j = c0 + c;
            float g = 0.0f;
            if (i < iend && j >= first[r] && j <= i) {
                float sc = kd_fa_score(qs + r * D, ks + c * D, D, scale, cap), dp = 0.0f;
                for (long d = 0; d < D; d++) dp += gs[r * D + d] * vs[c * D + d];
                g = exp(sc - rl[r]) * (dp - rd[r]) * kd_softcap_d(sc, cap) * scale;
            }
            ds[e] = g;
        }
        TWK_BARRIER();
        for (int x = 0; x < nx; x++) {
            long e = lid + (long)x * KD_FA_L, r = e / D, d = e % D;
            float a_ = acc[x];
            for (long c = 0; c < B; c++) {
                float g = ds[r * B + c];
                if (g != 0.0f) a_ += g * ks[c * D + d];
            }
            acc[x] = a_;
        }
        TWK_BARRIER();
    }
    for (int x = 0; x < nx; x++) {
        long e = lid + (long)x * KD_FA_L, r = e / D, d = e % D;
        if (i0 + r < T) dq[dq_off + ((i0 + r) * Hq + h) * D + d] = acc[x];
    }
}

/* dK (which 1) or dV (which 2) [T, Hkv, D]: key j of kv head hk gathers over the query heads
 * of its group (in order) and the queries i >= j that see it (in order): dV_j = sum P_ij dO_i,
 * dK_j = sum dS_ij q_i; one group per (tile of B keys, kv head), queries in tiles. */
TWK_KERNEL attn_tile_back_kv_f32(TWK_GLOBAL float *dst, long dst_off, TWK_GLOBAL const void *q, long q_off,
                                 TWK_GLOBAL const void *k, long k_off, TWK_GLOBAL const void *v, long v_off,
                                 TWK_GLOBAL const int *seg, long seg_off, TWK_GLOBAL const float *dO, long dO_off,
                                 TWK_GLOBAL const float *lse, long lse_off, TWK_GLOBAL const float *delta,
                                 long delta_off, TWK_GLOBAL int *err, long err_off, long T, long Hq, long Hkv,
                                 long D, long B, float scale, int which, int is64, long window, float cap, int q_ty,
                                 int k_ty, int v_ty) {
    TWK_LOCAL(float, sm, KD_FA_SMEM);
    TWK_LOCAL(long, first, KD_FA_MAXB);
    TWK_LOCAL(float, rl, KD_FA_MAXB);
    TWK_LOCAL(float, rd, KD_FA_MAXB);
    int lid = TWK_LID(0);
    long nt = (T + B - 1) / B, c0 = (TWK_GROUP(0) % nt) * B, hk = TWK_GROUP(0) / nt, grp = Hq / Hkv;
    TWK_LOCAL_PTR float *ks = sm, *vs = sm + B * D, *qs = sm + 2 * B * D, *gs = sm + 3 * B * D,
                        *cs = sm + 4 * B * D;
    const TWK_GLOBAL int *sg = seg + seg_off;
    long cend = c0 + B < T ? c0 + B : T, jl = cend - 1;
    if (lid < B && c0 + lid < T && kd_fa_first(sg, c0 + lid, is64, 0) < 0) err[err_off] = KD_ERR_SEGMENT;
    kd_fa_load(ks, k, k_off, k_ty, c0, B, T, Hkv, hk, D, lid);
    if (which == 1) kd_fa_load(vs, v, v_off, v_ty, c0, B, T, Hkv, hk, D, lid);
    int nx = (int)((B * D - lid + KD_FA_L - 1) / KD_FA_L); /* the accumulators item lid owns */
    float acc[KD_FA_ACC_BWD];
    for (int e = 0; e < KD_FA_ACC_BWD; e++) acc[e] = 0.0f;
    TWK_LOCAL_PTR float *xs = which == 2 ? gs : qs;
    for (long h = hk * grp; h < (hk + 1) * grp; h++) {
        /* query tiles from the first key on, while a query can still see the tile's last key */
        for (long i0 = c0; i0 < T && kd_id(sg, i0, is64) <= jl && (window <= 0 || i0 < jl + window); i0 += B) {
            TWK_BARRIER();
            if (lid < B) {
                long i = i0 + lid, f = i < T ? kd_fa_first(sg, i, is64, window) : i + 1;
                first[lid] = f < 0 ? i + 1 : f;
                rl[lid] = i < T ? lse[lse_off + i * Hq + h] : 0.0f;
                rd[lid] = i < T && which == 1 ? delta[delta_off + i * Hq + h] : 0.0f;
            }
            kd_fa_load(qs, q, q_off, q_ty, i0, B, T, Hq, h, D, lid);
            kd_fa_load(gs, dO, dO_off, KD_FA_F32, i0, B, T, Hq, h, D, lid);
            TWK_BARRIER();
            for (long e = lid; e < B * B; e += KD_FA_L) {
                long r = e / B, c = e % B, i = i0 + r, j = c0 + c;
                float cf = 0.0f;
                if (i < T && j < cend && j >= first[r] && j <= i) {
                    float sc = kd_fa_score(qs + r * D, ks + c * D, D, scale, cap), p = exp(sc - rl[r]);
                    if (which == 2) {
                        cf = p;
                    } else {
                        float dp = 0.0f;
                        for (long d = 0; d < D; d++) dp += gs[r * D + d] * vs[c * D + d];
                        cf = p * (dp - rd[r]) * kd_softcap_d(sc, cap) * scale;
                    }
                }
                cs[e] = cf;
            }
            TWK_BARRIER();
            for (int x = 0; x < nx; x++) {
                long e = lid + (long)x * KD_FA_L, c = e / D, d = e % D;
                float a_ = acc[x];
                for (long r = 0; r < B; r++) {
                    float g = cs[r * B + c];
                    if (g != 0.0f) a_ += g * xs[r * D + d];
                }
                acc[x] = a_;
            }
        }
    }
    for (int x = 0; x < nx; x++) {
        long e = lid + (long)x * KD_FA_L, c = e / D, d = e % D;
        if (c0 + c < T) dst[dst_off + ((c0 + c) * Hkv + hk) * D + d] = acc[x];
    }
}
