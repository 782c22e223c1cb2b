/* UNEMBED_LOGPROBS and its backward: log_softmax(h w^T)[t, target[t]] without the [T, V] logits.
 * One work-group of KD_UE_L items per tile of KD_UE_TT tokens walks the vocabulary in chunks of
 * KD_UE_L words, item i holding word v0 + i of the chunk: the chunk's logits of the tile come
 * from KD_UE_KS-wide slabs of h and w staged in local memory (w widened there when 16-bit), each
 * dot summed over k in order; nothing but the tile's running max / sum (forward) or the chunk's
 * d logits (backward) is held. The forward keeps an online logsumexp per item and token, then
 * trees across the group; the backward takes lse = logit[target] - logprob (the saved output,
 * the target's logit recomputed in the same order), forms dy (onehot - softmax) per chunk in
 * local memory and accumulates dh = dlogits w, item i owning columns i, i + KD_UE_L, ... of dh
 * (fixed order: deterministic, no atomics). Targets outside [0, V) store KD_ERR_ID_RANGE and
 * give 0 (forward) or a zero row of dh. */

#define KD_UE_TT 8
#define KD_UE_L 256
#define KD_UE_KS 16

/* z[tt] = h[t0 + tt] . w[v0 + lid] for the tile (0 past T or V); every item of the group runs it */
#define KD_UE_LOGITS                                                                                   \
    for (int tt = 0; tt < KD_UE_TT; tt++) z[tt] = 0.0f;                                                \
    for (long k0 = 0; k0 < H; k0 += KD_UE_KS) {                                                        \
        if (lid < KD_UE_TT * KD_UE_KS) {                                                               \
            long t = t0 + lid / KD_UE_KS, k = k0 + lid % KD_UE_KS;                                     \
            hs[lid] = t < T && k < H ? h[h_off + t * H + k] : 0.0f;                                    \
        }                                                                                              \
        for (int e = lid; e < KD_UE_L * KD_UE_KS; e += KD_UE_L) {                                      \
            long v = v0 + e / KD_UE_KS, k = k0 + e % KD_UE_KS;                                         \
            ws[(e / KD_UE_KS) * (KD_UE_KS + 1) + e % KD_UE_KS] = v < V && k < H ? KD_UW(v * H + k) : 0.0f; \
        }                                                                                              \
        TWK_BARRIER();                                                                                 \
        int kn = H - k0 < KD_UE_KS ? (int)(H - k0) : KD_UE_KS;                                         \
        for (int kk = 0; kk < kn; kk++) {                                                              \
            float wv = ws[lid * (KD_UE_KS + 1) + kk];                                                  \
            for (int tt = 0; tt < KD_UE_TT; tt++) z[tt] += hs[tt * KD_UE_KS + kk] * wv;                \
        }                                                                                              \
        TWK_BARRIER();                                                                                 \
    }

/* y [T] = logits[t, target] - logsumexp(logits[t, :]); the kernel declares its locals hs, ws,
 * red, tg first (in its own body: the host emulator looks for them there) */
#define KD_UE_FWD_BODY                                                                                 \
    int lid = TWK_LID(0);                                                                              \
    long t0 = TWK_GROUP(0) * KD_UE_TT;                                                                 \
    if (lid < KD_UE_TT) {                                                                              \
        long t = t0 + lid, id = t < T ? kd_id(tgt + tgt_off, t, is64) : 0;                             \
        if (id < 0 || id >= V) {                                                                       \
            err[err_off] = KD_ERR_ID_RANGE;                                                            \
            id = -1;                                                                                   \
        }                                                                                              \
        tg[lid] = id;                                                                                  \
    }                                                                                                  \
    TWK_BARRIER();                                                                                     \
    float z[KD_UE_TT], m[KD_UE_TT], s[KD_UE_TT], zt[KD_UE_TT];                                         \
    for (int tt = 0; tt < KD_UE_TT; tt++) {                                                            \
        m[tt] = KD_NEG_BIG;                                                                            \
        s[tt] = 0.0f;                                                                                  \
        zt[tt] = 0.0f;                                                                                 \
    }                                                                                                  \
    for (long v0 = 0; v0 < V; v0 += KD_UE_L) {                                                         \
        KD_UE_LOGITS                                                                                   \
        long v = v0 + lid;                                                                             \
        for (int tt = 0; v < V && tt < KD_UE_TT; tt++) {                                               \
            if (z[tt] > m[tt]) {                                                                       \
                s[tt] = s[tt] * exp(m[tt] - z[tt]) + 1.0f;                                             \
                m[tt] = z[tt];                                                                         \
            } else {                                                                                   \
                s[tt] += exp(z[tt] - m[tt]);                                                           \
            }                                                                                          \
            if (v == tg[tt]) zt[tt] = z[tt];                                                           \
        }                                                                                              \
    }                                                                                                  \
    for (int tt = 0; tt < KD_UE_TT; tt++) {                                                            \
        red[lid] = m[tt];                                                                              \
        TWK_BARRIER();                                                                                 \
        KD_TREE_MAX(red, lid, KD_UE_L)                                                                 \
        float mx = red[0];                                                                             \
        TWK_BARRIER();                                                                                 \
        red[lid] = s[tt] * exp(m[tt] - mx);                                                            \
        TWK_BARRIER();                                                                                 \
        KD_TREE_SUM(red, lid, KD_UE_L)                                                                 \
        float sum = red[0];                                                                            \
        TWK_BARRIER();                                                                                 \
        red[lid] = zt[tt]; /* one item holds the target's logit, the others 0 */                      \
        TWK_BARRIER();                                                                                 \
        KD_TREE_SUM(red, lid, KD_UE_L)                                                                 \
        if (lid == 0 && t0 + tt < T) y[y_off + t0 + tt] = tg[tt] < 0 ? 0.0f : red[0] - (mx + log(sum)); \
        TWK_BARRIER();                                                                                 \
    }

/* dh [T, H] = dlogits w, dlogits[t, v] = dy[t] (onehot(target) - exp(logits[t, v] - lse[t]));
 * the kernel declares hs, ws, gs, tg, dd, lse first */
#define KD_UE_BACK_BODY                                                                                \
    int lid = TWK_LID(0);                                                                              \
    long t0 = TWK_GROUP(0) * KD_UE_TT;                                                                 \
    if (lid < KD_UE_TT) {                                                                              \
        long t = t0 + lid, id = t < T ? kd_id(tgt + tgt_off, t, is64) : -1;                            \
        if (t < T && (id < 0 || id >= V)) {                                                            \
            err[err_off] = KD_ERR_ID_RANGE;                                                            \
            id = -1;                                                                                   \
        }                                                                                              \
        float a = 0.0f, d = 0.0f;                                                                      \
        if (id >= 0) { /* the target's logit, summed as KD_UE_LOGITS sums it */                        \
            for (long k = 0; k < H; k++) a += h[h_off + t * H + k] * KD_UW(id * H + k);                \
            d = dy[dy_off + t];                                                                        \
            a -= lp[lp_off + t];                                                                       \
        }                                                                                              \
        tg[lid] = id;                                                                                  \
        dd[lid] = d;                                                                                   \
        lse[lid] = a;                                                                                  \
    }                                                                                                  \
    TWK_BARRIER();                                                                                     \
    float z[KD_UE_TT], acc[KD_UE_TT];                                                                  \
    for (long v0 = 0; v0 < V; v0 += KD_UE_L) {                                                         \
        KD_UE_LOGITS                                                                                   \
        long v = v0 + lid;                                                                             \
        for (int tt = 0; tt < KD_UE_TT; tt++) {                                                        \
            float g = 0.0f;                                                                            \
            if (v < V && tg[tt] >= 0) {                                                                \
                g = -dd[tt] * exp(z[tt] - lse[tt]);                                                    \
                if (v == tg[tt]) g += dd[tt];                                                          \
            }                                                                                          \
            gs[tt * KD_UE_L + lid] = g;                                                                \
        }                                                                                              \
        TWK_BARRIER();                                                                                 \
        int vn = V - v0 < KD_UE_L ? (int)(V - v0) : KD_UE_L;                                           \
        for (long k = lid; k < H; k += KD_UE_L) {                                                      \
            for (int tt = 0; tt < KD_UE_TT; tt++) acc[tt] = 0.0f;                                      \
            for (int r = 0; r < vn; r++) {                                                             \
                float wv = KD_UW((v0 + r) * H + k);                                                    \
                for (int tt = 0; tt < KD_UE_TT; tt++) acc[tt] += gs[tt * KD_UE_L + r] * wv;            \
            }                                                                                          \
            for (int tt = 0; tt < KD_UE_TT && t0 + tt < T; tt++) {                                     \
                long i = dh_off + (t0 + tt) * H + k;                                                   \
                dh[i] = v0 == 0 ? acc[tt] : dh[i] + acc[tt];                                           \
            }                                                                                          \
        }                                                                                              \
        TWK_BARRIER();                                                                                 \
    }

#define KD_UW(i) w[w_off + (i)]
TWK_KERNEL unembed_logprobs_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *h, long h_off,
                                TWK_GLOBAL const float *w, long w_off, TWK_GLOBAL const int *tgt, long tgt_off,
                                TWK_GLOBAL int *err, long err_off, long T, long H, long V, int is64) {
    TWK_LOCAL(float, hs, KD_UE_TT * KD_UE_KS);
    TWK_LOCAL(float, ws, KD_UE_L * (KD_UE_KS + 1));
    TWK_LOCAL(float, red, KD_UE_L);
    TWK_LOCAL(long, tg, KD_UE_TT);
    KD_UE_FWD_BODY
}
TWK_KERNEL unembed_logprobs_back_f32(TWK_GLOBAL float *dh, long dh_off, TWK_GLOBAL const float *h, long h_off,
                                     TWK_GLOBAL const float *w, long w_off, TWK_GLOBAL const int *tgt, long tgt_off,
                                     TWK_GLOBAL const float *dy, long dy_off, TWK_GLOBAL const float *lp, long lp_off,
                                     TWK_GLOBAL int *err, long err_off, long T, long H, long V, int is64) {
    TWK_LOCAL(float, hs, KD_UE_TT * KD_UE_KS);
    TWK_LOCAL(float, ws, KD_UE_L * (KD_UE_KS + 1));
    TWK_LOCAL(float, gs, KD_UE_TT * KD_UE_L);
    TWK_LOCAL(long, tg, KD_UE_TT);
    TWK_LOCAL(float, dd, KD_UE_TT);
    TWK_LOCAL(float, lse, KD_UE_TT);
    KD_UE_BACK_BODY
}
#undef KD_UW

/* the same over a 16-bit w (f16: 1 for f16, 0 for bf16), widened as it is read */
#define KD_UW(i) kd_h16(w + w_off, (i), f16)
TWK_KERNEL unembed_logprobs_h16(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *h, long h_off,
                                TWK_GLOBAL const ushort *w, long w_off, TWK_GLOBAL const int *tgt, long tgt_off,
                                TWK_GLOBAL int *err, long err_off, long T, long H, long V, int is64, int f16) {
    TWK_LOCAL(float, hs, KD_UE_TT * KD_UE_KS);
    TWK_LOCAL(float, ws, KD_UE_L * (KD_UE_KS + 1));
    TWK_LOCAL(float, red, KD_UE_L);
    TWK_LOCAL(long, tg, KD_UE_TT);
    KD_UE_FWD_BODY
}
TWK_KERNEL unembed_logprobs_back_h16(TWK_GLOBAL float *dh, long dh_off, TWK_GLOBAL const float *h, long h_off,
                                     TWK_GLOBAL const ushort *w, long w_off, TWK_GLOBAL const int *tgt, long tgt_off,
                                     TWK_GLOBAL const float *dy, long dy_off, TWK_GLOBAL const float *lp, long lp_off,
                                     TWK_GLOBAL int *err, long err_off, long T, long H, long V, int is64, int f16) {
    TWK_LOCAL(float, hs, KD_UE_TT * KD_UE_KS);
    TWK_LOCAL(float, ws, KD_UE_L * (KD_UE_KS + 1));
    TWK_LOCAL(float, gs, KD_UE_TT * KD_UE_L);
    TWK_LOCAL(long, tg, KD_UE_TT);
    TWK_LOCAL(float, dd, KD_UE_TT);
    TWK_LOCAL(float, lse, KD_UE_TT);
    KD_UE_BACK_BODY
}
#undef KD_UW
