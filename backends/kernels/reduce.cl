/* Whole-tensor reductions to one value (sum, mean, weighted_sum). One
 * work-group of a power-of-two size: each item sums a fixed strided slice
 * (compensated), then a tree in local memory; the order never changes, so
 * two runs give the same bits. */

#define KD_REDUCE_LOCAL 256

/* y[0] = scale * sum(x * w) (w_on = 0: w is ignored) */
TWK_KERNEL reduce_sum_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *x, long x_off,
                          TWK_GLOBAL const float *w, long w_off, long n, int w_on, float scale) {
    TWK_LOCAL(float, part, KD_REDUCE_LOCAL);
    int lid = TWK_LID(0), L = TWK_LSIZE(0);
    float s = 0.0f, c = 0.0f;
    for (long i = lid; i < n; i += L) kd_kahan(&s, &c, w_on ? x[x_off + i] * w[w_off + i] : x[x_off + i]);
    part[lid] = s;
    TWK_BARRIER();
    KD_TREE_SUM(part, lid, L)
    if (lid == 0) y[y_off] = part[0] * scale;
}
