/* Attention: causal within packed segments (mode 0: token i sees keys
 * seg[i]..i) or over cache rows (mode 1: query t sees rows lo[t]..hi[t]-1),
 * with a sliding window (window > 0) only the last `window` of those,
 * grouped-query heads (head h reads kv head h / (Hq / Hkv)), scores scaled
 * by `scale` and soft-capped to cap * tanh(s / cap) where cap > 0. One work-group of KD_ATTN_L items per (query, head) walks the
 * keys in chunks of KD_ATTN_L with an online softmax: item l scores key
 * c0 + l, then each item updates the output dims d = l, l + L, ... (D <=
 * KD_ATTN_L * KD_ATTN_DPI). The gradient kernels recompute probabilities from
 * the saved log-sum-exp. Everything runs in a fixed order: deterministic. */

#define KD_ATTN_L 64
#define KD_ATTN_DPI 8
#define KD_ATTN_MAXD (KD_ATTN_L * KD_ATTN_DPI)

/* Key range [*j0, *j1) of query i in mode 0 (seg) or 1 (lo/hi); returns 0
 * and an empty range when the input is malformed. */
TWK_FN int kd_key_range(const TWK_GLOBAL int *ra, const TWK_GLOBAL int *rb, long i, long R, int mode, int a64,
                        int b64, long window, long *j0, long *j1) {
    *j0 = 0;
    *j1 = 0;
    if (mode == 0) {
        long s = kd_id(ra, i, a64), prev = i > 0 ? kd_id(ra, i - 1, a64) : 0;
        if (s < 0 || s > i || (s != prev && s != i)) return 0;
        *j0 = window > 0 && i + 1 - window > s ? i + 1 - window : s;
        *j1 = i + 1;
        return 1;
    }
    long lo = kd_id(ra, i, a64), hi = kd_id(rb, i, b64);
    if (lo < 0 || hi <= lo || hi > R) return 0;
    *j0 = window > 0 && hi - window > lo ? hi - window : lo;
    *j1 = hi;
    return 1;
}

/* A score soft-capped (cap > 0) or as it is. */
TWK_FN float kd_softcap(float s, float cap) { return cap > 0.0f ? cap * tanh(s / cap) : s; }
/* d capped / d raw from the capped score: 1 - tanh^2 (1 without a cap). */
TWK_FN float kd_softcap_d(float sc, float cap) { return cap > 0.0f ? 1.0f - (sc / cap) * (sc / cap) : 1.0f; }

/* The online-softmax walk of keys [j0, j1) shared by attn_fwd_* and attn_split_* (attn_split.cl):
 * declares m, l and acc[KD_ATTN_DPI] (item lid owns dims lid, lid + L, ...) and leaves them for
 * the caller's epilogue; qs holds the query, ps is [KD_ATTN_L] of local memory. Keys and values
 * are read through KD_KV(p, i). */
#define KD_ATTN_LOOP \
    float acc[KD_ATTN_DPI];                                                                                   \
    for (int e = 0; e < KD_ATTN_DPI; e++) acc[e] = 0.0f;                                                      \
    float m = KD_NEG_BIG, l = 0.0f;                                                                           \
    for (long c0 = j0; c0 < j1; c0 += L) {                                                                    \
        long j = c0 + lid;                                                                                    \
        float s = KD_NEG_BIG;                                                                                 \
        if (j < j1) {                                                                                         \
            long kj = (j * Hkv + hk) * D;                                                                     \
            float dot = 0.0f;                                                                                 \
            for (long d = 0; d < D; d++) dot += qs[d] * KD_KV(k + k_off, kj + d);                             \
            s = kd_softcap(dot * scale, cap);                                                                 \
        }                                                                                                     \
        ps[lid] = s;                                                                                          \
        TWK_BARRIER();                                                                                        \
        long nc = j1 - c0 < L ? j1 - c0 : L;                                                                  \
        float mc = m;                                                                                         \
        for (long t = 0; t < nc; t++) mc = fmax(mc, ps[t]);                                                   \
        float alpha = exp(m - mc);                                                                            \
        TWK_BARRIER();                                                                                        \
        ps[lid] = lid < nc ? exp(s - mc) : 0.0f;                                                              \
        TWK_BARRIER();                                                                                        \
        float ls = 0.0f;                                                                                      \
        for (long t = 0; t < nc; t++) ls += ps[t];                                                            \
        l = l * alpha + ls;                                                                                   \
        if (want_o)                                                                                           \
            for (int e = 0; e < KD_ATTN_DPI; e++) {                                                           \
                long d = lid + (long)e * L;                                                                   \
                if (d >= D) break;                                                                            \
                float a = 0.0f;                                                                               \
                for (long t = 0; t < nc; t++) a += ps[t] * KD_KV(v + v_off, ((c0 + t) * Hkv + hk) * D + d);   \
                acc[e] = acc[e] * alpha + a;                                                                  \
            }                                                                                                 \
        m = mc;                                                                                               \
        TWK_BARRIER();                                                                                        \
    }

/* The body of attn_fwd_f32 / attn_fwd_h16 (each declares its local qs [KD_ATTN_MAXD] and ps
 * [KD_ATTN_L] first): keys and values read through KD_KV(p, i). */
#define KD_ATTN_FWD_BODY \
    int lid = TWK_LID(0), L = TWK_LSIZE(0);                                                                   \
    long gi = TWK_GROUP(0), i = gi / Hq, h = gi % Hq, hk = h / (Hq / Hkv);                                    \
    long j0, j1;                                                                                              \
    if (!kd_key_range(ra + ra_off, rb + rb_off, i, R, mode, a64, b64, window, &j0, &j1) && lid == 0)          \
        err[err_off] = mode == 0 ? KD_ERR_SEGMENT : KD_ERR_ID_RANGE;                                          \
    const TWK_GLOBAL float *qi = q + q_off + gi * D;                                                          \
    for (long d = lid; d < D; d += L) qs[d] = qi[d];                                                          \
    TWK_BARRIER();                                                                                            \
    KD_ATTN_LOOP                                                                                              \
    float inv = l > 0.0f ? 1.0f / l : 0.0f;                                                                   \
    if (want_o)                                                                                               \
        for (int e = 0; e < KD_ATTN_DPI; e++) {                                                               \
            long d = lid + (long)e * L;                                                                       \
            if (d >= D) break;                                                                                \
            o[o_off + gi * D + d] = acc[e] * inv;                                                             \
        }                                                                                                     \
    if (want_lse && lid == 0) lse[lse_off + gi] = l > 0.0f ? m + log(l) : 0.0f;

/* o [T, Hq, D] (want_o) and lse [T, Hq] (want_lse) of q [T, Hq, D] over k, v
 * [R, Hkv, D]; ra/rb as in kd_key_range (mode 0: R = T). */
#define KD_KV(p, i) (p)[i]
TWK_KERNEL attn_fwd_f32(TWK_GLOBAL float *o, long o_off, TWK_GLOBAL float *lse, long lse_off,
                        TWK_GLOBAL const float *q, long q_off, TWK_GLOBAL const float *k, long k_off,
                        TWK_GLOBAL const float *v, long v_off, TWK_GLOBAL const int *ra, long ra_off,
                        TWK_GLOBAL const int *rb, long rb_off, TWK_GLOBAL int *err, long err_off, long Hq,
                        long Hkv, long D, long R, float scale, int mode, int want_o, int want_lse, int a64,
                        int b64, long window, float cap) {
    TWK_LOCAL(float, qs, KD_ATTN_MAXD);
    TWK_LOCAL(float, ps, KD_ATTN_L);
    KD_ATTN_FWD_BODY
}
#undef KD_KV

/* attn_fwd_f32 over 16-bit k, v (a bf16 / f16 KV cache: f16 = 1 for f16), widened as read */
#define KD_KV(p, i) kd_h16((p), (i), f16)
TWK_KERNEL attn_fwd_h16(TWK_GLOBAL float *o, long o_off, TWK_GLOBAL float *lse, long lse_off,
                        TWK_GLOBAL const float *q, long q_off, TWK_GLOBAL const ushort *k, long k_off,
                        TWK_GLOBAL const ushort *v, long v_off, TWK_GLOBAL const int *ra, long ra_off,
                        TWK_GLOBAL const int *rb, long rb_off, TWK_GLOBAL int *err, long err_off, long Hq,
                        long Hkv, long D, long R, float scale, int mode, int want_o, int want_lse, int a64,
                        int b64, long window, float cap, int f16) {
    TWK_LOCAL(float, qs, KD_ATTN_MAXD);
    TWK_LOCAL(float, ps, KD_ATTN_L);
    KD_ATTN_FWD_BODY
}
#undef KD_KV

/* dQ [T, Hq, D]: dq_i = sum_j dS_ij k_j with dS = P (dO_i . v_j - dO_i . o_i) scale,
 * P = exp(scale q_i . k_j - lse_i); one group per (query, head) */
TWK_KERNEL attn_back_q_f32(TWK_GLOBAL float *dq, long dq_off, TWK_GLOBAL const float *q, long q_off,
                           TWK_GLOBAL const float *k, long k_off, TWK_GLOBAL const float *v, long v_off,
                           TWK_GLOBAL const int *seg, long seg_off, TWK_GLOBAL const float *o, long o_off,
                           TWK_GLOBAL const float *dO, long dO_off, TWK_GLOBAL const float *lse, long lse_off,
                           TWK_GLOBAL int *err, long err_off, long Hq, long Hkv, long D, float scale,
                           int is64, long window, float cap) {
    TWK_LOCAL(float, qs, KD_ATTN_MAXD);
    TWK_LOCAL(float, gs, KD_ATTN_MAXD);
    TWK_LOCAL(float, ps, KD_ATTN_L);
    int lid = TWK_LID(0), L = TWK_LSIZE(0);
    long gi = TWK_GROUP(0), i = gi / Hq, h = gi % Hq, hk = h / (Hq / Hkv);
    long j0, j1;
    if (!kd_key_range(seg + seg_off, seg + seg_off, i, 0, 0, is64, is64, window, &j0, &j1) && lid == 0)
        err[err_off] = KD_ERR_SEGMENT;
    float pd = 0.0f;
    for (long d = lid; d < D; d += L) {
        qs[d] = q[q_off + gi * D + d];
        gs[d] = dO[dO_off + gi * D + d];
        pd += gs[d] * o[o_off + gi * D + d];
    }
    ps[lid] = pd;
    TWK_BARRIER();
    KD_TREE_SUM(ps, lid, L)
    float delta = ps[0], li = lse[lse_off + gi];
    TWK_BARRIER();
    float acc[KD_ATTN_DPI];
    for (int e = 0; e < KD_ATTN_DPI; e++) acc[e] = 0.0f;
    for (long c0 = j0; c0 < j1; c0 += L) {
        long j = c0 + lid;
        float ds = 0.0f;
        if (j < j1) {
            const TWK_GLOBAL float *kj = k + k_off + (j * Hkv + hk) * D;
            const TWK_GLOBAL float *vj = v + v_off + (j * Hkv + hk) * D;
            float s = 0.0f, dp = 0.0f;
            for (long d = 0; d < D; d++) {
                s += qs[d] * kj[d];
                dp += gs[d] * vj[d];
            }
            float sc = kd_softcap(s * scale, cap);
            float p = exp(sc - li);
            ds = p * (dp - delta) * kd_softcap_d(sc, cap) * scale;
        }
        ps[lid] = ds;
        TWK_BARRIER();
        long nc = j1 - c0 < L ? j1 - c0 : L;
        for (int e = 0; e < KD_ATTN_DPI; e++) {
            long d = lid + (long)e * L;
            if (d >= D) break;
            float a = 0.0f;
            for (long t = 0; t < nc; t++) a += ps[t] * k[k_off + ((c0 + t) * Hkv + hk) * D + d];
            acc[e] += a;
        }
        TWK_BARRIER();
    }
    for (int e = 0; e < KD_ATTN_DPI; e++) {
        long d = lid + (long)e * L;
        if (d >= D) break;
        dq[dq_off + gi * D + d] = acc[e];
    }
}

/* dK (which 1) or dV (which 2) [T, Hkv, D]: key j of kv head hk gathers over
 * the query heads of its group and the queries i >= j of its segment:
 * dV_j = sum P_ij dO_i, dK_j = sum dS_ij q_i; one group per (key, kv head) */
TWK_KERNEL attn_back_kv_f32(TWK_GLOBAL float *dst, long dst_off, TWK_GLOBAL const float *q, long q_off,
                            TWK_GLOBAL const float *k, long k_off, TWK_GLOBAL const float *v, long v_off,
                            TWK_GLOBAL const int *seg, long seg_off, TWK_GLOBAL const float *o, long o_off,
                            TWK_GLOBAL const float *dO, long dO_off, TWK_GLOBAL const float *lse, long lse_off,
                            TWK_GLOBAL int *err, long err_off, long T, long Hq, long Hkv, long D, float scale,
                            int which, int is64, long window, float cap) {
    TWK_LOCAL(float, ks, KD_ATTN_MAXD);
    TWK_LOCAL(float, vs, KD_ATTN_MAXD);
    TWK_LOCAL(float, ps, KD_ATTN_L);
    int lid = TWK_LID(0), L = TWK_LSIZE(0);
    long gi = TWK_GROUP(0), j = gi / Hkv, hk = gi % Hkv, grp = Hq / Hkv;
    const TWK_GLOBAL int *sg = seg + seg_off;
    long j0, j1;
    if (!kd_key_range(sg, sg, j, 0, 0, is64, is64, 0, &j0, &j1) && lid == 0) err[err_off] = KD_ERR_SEGMENT;
    long iend = window > 0 && j + window < T ? j + window : T; /* queries i < j + window see key j */
    long sj = kd_id(sg, j, is64);
    for (long d = lid; d < D; d += L) {
        ks[d] = k[k_off + gi * D + d];
        vs[d] = v[v_off + gi * D + d];
    }
    TWK_BARRIER();
    const TWK_GLOBAL float *X = which == 2 ? dO + dO_off : q + q_off;
    float acc[KD_ATTN_DPI];
    for (int e = 0; e < KD_ATTN_DPI; e++) acc[e] = 0.0f;
    for (long h = hk * grp; h < (hk + 1) * grp; h++) {
        for (long c0 = j; c0 < iend && kd_id(sg, c0, is64) == sj; c0 += L) {
            long i = c0 + lid;
            float cf = 0.0f;
            if (i < iend && kd_id(sg, i, is64) == sj) {
                long qi = (i * Hq + h) * D;
                float s = 0.0f;
                for (long d = 0; d < D; d++) s += q[q_off + qi + d] * ks[d];
                float sc = kd_softcap(s * scale, cap);
                float p = exp(sc - lse[lse_off + i * Hq + h]);
                if (which == 2) {
                    cf = p;
                } else {
                    float dp = 0.0f, delta = 0.0f;
                    for (long d = 0; d < D; d++) {
                        float g = dO[dO_off + qi + d];
                        dp += g * vs[d];
                        delta += g * o[o_off + qi + d];
                    }
                    cf = p * (dp - delta) * kd_softcap_d(sc, cap) * scale;
                }
            }
            ps[lid] = cf;
            TWK_BARRIER();
            long nc = iend - c0 < L ? iend - c0 : L;
            for (int e = 0; e < KD_ATTN_DPI; e++) {
                long d = lid + (long)e * L;
                if (d >= D) break;
                float a = 0.0f;
                for (long t = 0; t < nc; t++) a += ps[t] * X[((c0 + t) * Hq + h) * D + d];
                acc[e] += a;
            }
            TWK_BARRIER();
        }
    }
    for (int e = 0; e < KD_ATTN_DPI; e++) {
        long d = lid + (long)e * L;
        if (d >= D) break;
        dst[dst_off + gi * D + d] = acc[e];
    }
}
