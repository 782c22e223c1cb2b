/* Split-K decode attention (ATTN_CACHE over a long KV cache; kd_lower_nn.c chooses it, and the
 * number of splits S, from the cache rows, the window and a scratch budget). Query t's key
 * range [j0, j1) (kd_key_range mode 1, window applied) is cut into S consecutive pieces of
 * cs = max(KD_SPLIT_KEYS, ceil((j1 - j0) / S) rounded up to KD_ATTN_L) keys; one 64-item group
 * per (query, head, piece) runs attn_fwd's online softmax over its piece (KD_ATTN_LOOP) and
 * stores the partial (m, l, acc[D]) unnormalized in the plan scratch, [T, Hq, S, D + 2]; then
 * attn_split_reduce merges the pieces in order s = 0, 1, ...: M = max m_s over pieces with keys,
 * o = (sum acc_s w_s) * (1 / sum l_s w_s), w_s = exp(m_s - M) (1 when m_s = M). Empty pieces
 * (l = 0) are skipped, so masked keys never reach exp(); a range within one piece gives the bits
 * of attn_fwd (w = 1, 0 + x = x). Fixed order everywhere: deterministic. */

#define KD_SPLIT_KEYS 256 /* keys per piece at least */
#define KD_SPLIT_MAX 32   /* pieces per (query, head) */

/* The body of attn_split_f32 / _h16: group g = ((t Hq) + h) S + s. */
#define KD_ATTN_SPLIT_BODY \
    int lid = TWK_LID(0), L = TWK_LSIZE(0);                                                                   \
    long gs = TWK_GROUP(0), gi = gs / S, sp = gs % S, i = gi / Hq, h = gi % Hq, hk = h / (Hq / Hkv);          \
    long j0, j1;                                                                                              \
    if (!kd_key_range(ra + ra_off, rb + rb_off, i, R, 1, a64, b64, window, &j0, &j1) && lid == 0 && sp == 0)  \
        err[err_off] = KD_ERR_ID_RANGE;                                                                       \
    long len = j1 - j0, cs = (len + S - 1) / S;                                                               \
    cs = (cs + KD_ATTN_L - 1) / KD_ATTN_L * KD_ATTN_L;                                                        \
    if (cs < KD_SPLIT_KEYS) cs = KD_SPLIT_KEYS;                                                               \
    long a0 = j0 + sp * cs;                                                                                   \
    j1 = a0 + cs < j1 ? a0 + cs : j1;                                                                         \
    j0 = a0;                                                                                                  \
    const TWK_GLOBAL float *qi = q + q_off + gi * D;                                                          \
    for (long d = lid; d < D; d += L) qs[d] = qi[d];                                                          \
    TWK_BARRIER();                                                                                            \
    int want_o = 1;                                                                                           \
    KD_ATTN_LOOP                                                                                              \
    TWK_GLOBAL float *pt = part + part_off + gs * (D + 2);                                                    \
    if (lid == 0) {                                                                                           \
        pt[0] = m;                                                                                            \
        pt[1] = l;                                                                                            \
    }                                                                                                         \
    for (int e = 0; e < KD_ATTN_DPI; e++) {                                                                   \
        long d = lid + (long)e * L;                                                                           \
        if (d >= D) break;                                                                                    \
        pt[2 + d] = acc[e];                                                                                   \
    }

/* The partials [T, Hq, S, D + 2] of q [T, Hq, D] over k, v [R, Hkv, D], rows lo[t]..hi[t]-1. */
#define KD_KV(p, i) (p)[i]
TWK_KERNEL attn_split_f32(TWK_GLOBAL float *part, long part_off, TWK_GLOBAL const float *q, long q_off,
                          TWK_GLOBAL const float *k, long k_off, TWK_GLOBAL const float *v, long v_off,
                          TWK_GLOBAL const int *ra, long ra_off, TWK_GLOBAL const int *rb, long rb_off,
                          TWK_GLOBAL int *err, long err_off, long Hq, long Hkv, long D, long R, long S, float scale,
                          int a64, int b64, long window, float cap) {
    TWK_LOCAL(float, qs, KD_ATTN_MAXD);
    TWK_LOCAL(float, ps, KD_ATTN_L);
    KD_ATTN_SPLIT_BODY
}
#undef KD_KV

/* attn_split_f32 over 16-bit k, v (f16 = 1 for f16, else bf16), widened as read */
#define KD_KV(p, i) kd_h16((p), (i), f16)
TWK_KERNEL attn_split_h16(TWK_GLOBAL float *part, long part_off, TWK_GLOBAL const float *q, long q_off,
                          TWK_GLOBAL const ushort *k, long k_off, TWK_GLOBAL const ushort *v, long v_off,
                          TWK_GLOBAL const int *ra, long ra_off, TWK_GLOBAL const int *rb, long rb_off,
                          TWK_GLOBAL int *err, long err_off, long Hq, long Hkv, long D, long R, long S, float scale,
                          int a64, int b64, long window, float cap, int f16) {
    TWK_LOCAL(float, qs, KD_ATTN_MAXD);
    TWK_LOCAL(float, ps, KD_ATTN_L);
    KD_ATTN_SPLIT_BODY
}
#undef KD_KV

/* o [rows, D] from the partials [rows, S, D + 2]: one item per output element, pieces in order. */
TWK_KERNEL attn_split_reduce_f32(TWK_GLOBAL float *o, long o_off, TWK_GLOBAL const float *part, long part_off,
                                 long rows, long D, long S) {
    long g = TWK_GID(0);
    if (g >= rows * D) return;
    long r = g / D, d = g % D;
    const TWK_GLOBAL float *p = part + part_off + r * S * (D + 2);
    float M = KD_NEG_BIG;
    for (long s = 0; s < S; s++)
        if (p[s * (D + 2) + 1] > 0.0f) M = fmax(M, p[s * (D + 2)]);
    float ls = 0.0f, a = 0.0f;
    for (long s = 0; s < S; s++) {
        float l = p[s * (D + 2) + 1], m = p[s * (D + 2)];
        if (!(l > 0.0f)) continue;
        float w = m == M ? 1.0f : exp(m - M);
        ls += l * w;
        a += p[s * (D + 2) + 2 + d] * w;
    }
    o[o_off + g] = ls > 0.0f ? a * (1.0f / ls) : 0.0f;
}
