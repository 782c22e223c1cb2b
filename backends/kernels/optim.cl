/* The optimizer step on the device: gradient accumulation, the global norm
 * in two stages (slices of squares as (hi, lo) pairs, then their sum) and
 * AdamW as torch.optim.AdamW writes it (train/optim.c is the reference).
 * hyper is ops.h's twk_hyper vector: 0 clip, 1 beta1, 2 beta2, 3 eps,
 * 4 step size, 5 sqrt of the second bias correction, 6 decay factor. */

#define KD_OPT_LOCAL 256
#define KD_FLT_MAX 3.4028235e38f

/* acc += g (y and a are the same storage: the accumulator) */
TWK_KERNEL grad_acc_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *a, long a_off,
                        TWK_GLOBAL const float *g, long g_off, long n) {
    long i = TWK_GID(0);
    if (i < n) y[y_off + i] = a[a_off + i] + g[g_off + i];
}

/* one work-group per slice p of x: y[p] = (hi, lo) of sum x^2 (compensated per item, then a tree) */
TWK_KERNEL sqsum_parts_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *x, long x_off, long n,
                           long parts) {
    TWK_LOCAL(float, hi, KD_OPT_LOCAL);
    TWK_LOCAL(float, lo, KD_OPT_LOCAL);
    int lid = TWK_LID(0), L = TWK_LSIZE(0);
    long p = TWK_GROUP(0), q = n / parts, r = n % parts;
    long b = p * q + (p < r ? p : r), e = b + q + (p < r ? 1 : 0); /* slices as every backend cuts them */
    float s = 0.0f, c = 0.0f;
    for (long i = b + lid; i < e; i += L) {
        float v = x[x_off + i];
        kd_kahan(&s, &c, v * v);
    }
    hi[lid] = s;
    lo[lid] = -c;
    TWK_BARRIER();
    KD_TREE_SUM(hi, lid, L)
    KD_TREE_SUM(lo, lid, L)
    if (lid == 0) {
        y[y_off + 2 * p] = hi[0];
        y[y_off + 2 * p + 1] = lo[0];
    }
}

/* item 0: y = (norm, clip coefficient) from the slices' pairs */
TWK_KERNEL grad_norm_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *parts, long p_off,
                         TWK_GLOBAL const float *h, long h_off, long np) {
    if (TWK_GID(0) != 0) return;
    float s = 0.0f, c = 0.0f;
    for (long p = 0; p < np; p++) {
        kd_kahan(&s, &c, parts[p_off + 2 * p]);
        kd_kahan(&s, &c, parts[p_off + 2 * p + 1]);
    }
    float norm = sqrt(s - c), max_norm = h[h_off + 0], clip = 1.0f;
    if (max_norm > 0.0f) {
        float coef = max_norm / (norm + 1e-6f);
        if (coef < 1.0f) clip = coef;
    }
    y[y_off] = norm;
    y[y_off + 1] = clip;
}

/* the wide norm's last stage: one work-group folds the slices' pairs in a compensated tree, then
 * item 0 writes y = (norm, clip coefficient) as grad_norm_f32 does */
TWK_KERNEL grad_norm_tree_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *parts, long p_off,
                              TWK_GLOBAL const float *h, long h_off, long np) {
    TWK_LOCAL(float, hi, KD_OPT_LOCAL);
    TWK_LOCAL(float, lo, KD_OPT_LOCAL);
    int lid = TWK_LID(0), L = TWK_LSIZE(0);
    float s = 0.0f, c = 0.0f;
    for (long p = lid; p < np; p += L) {
        kd_two_sum(&s, &c, parts[p_off + 2 * p]);
        c += parts[p_off + 2 * p + 1];
    }
    hi[lid] = s;
    lo[lid] = c;
    TWK_BARRIER();
    KD_TREE_SUM2(hi, lo, lid, L, 1)
    if (lid != 0) return;
    float norm = sqrt(hi[0] + lo[0]), max_norm = h[h_off + 0], clip = 1.0f;
    if (max_norm > 0.0f) {
        float coef = max_norm / (norm + 1e-6f);
        if (coef < 1.0f) clip = coef;
    }
    y[y_off] = norm;
    y[y_off + 1] = clip;
}

/* one item per element: w, m, v updated in place, the gradient zeroed; nothing when the norm is not finite */
TWK_KERNEL adamw_f32(TWK_GLOBAL float *w, long w_off, TWK_GLOBAL float *g, long g_off, TWK_GLOBAL float *m,
                     long m_off, TWK_GLOBAL float *v, long v_off, TWK_GLOBAL const float *h, long h_off,
                     TWK_GLOBAL const float *nc, long nc_off, long n) {
    long i = TWK_GID(0);
    if (i >= n || !(nc[nc_off] <= KD_FLT_MAX)) return;
    float b1 = h[h_off + 1], b2 = h[h_off + 2], eps = h[h_off + 3];
    float step_size = h[h_off + 4], c2_sqrt = h[h_off + 5], decay = h[h_off + 6];
    float gr = g[g_off + i] * nc[nc_off + 1];
    float mi = b1 * m[m_off + i] + (1.0f - b1) * gr;
    float vi = b2 * v[v_off + i] + (1.0f - b2) * gr * gr;
    float wi = w[w_off + i] * decay;
    w[w_off + i] = wi - step_size * mi / (sqrt(vi) / c2_sqrt + eps);
    m[m_off + i] = mi;
    v[v_off + i] = vi;
    g[g_off + i] = 0.0f;
}
