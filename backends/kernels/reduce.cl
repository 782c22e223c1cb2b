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

/* ---- wide (two-stage) sums, hal/twk_wide.h: stage 1 cuts the terms into tiles, one work-group
 * each, into compensated (hi, lo) pairs in the plan scratch; stage 2 folds a reduction's pairs in
 * one work-group. Every addition is a TwoSum (kd_two_sum), its error carried in lo. ---- */

#define KD_WIDE_L 256

/* Stage 1: work-group g = p * k + j sums tile j (of k) of slice p (of `slices`, over [0, n)) of
 * the terms t_i (mode 0 x_i, 1 x_i * w_i, 2 x_i * x_i; a product's rounding error, fma(a, b, -ab),
 * is added to lo) into part[2 g], part[2 g + 1]. */
TWK_KERNEL wide_parts_f32(TWK_GLOBAL float *part, long part_off, TWK_GLOBAL const float *x, long x_off,
                          TWK_GLOBAL const float *w, long w_off, long n, long slices, long k, int mode) {
    TWK_LOCAL(float, hi, KD_WIDE_L);
    TWK_LOCAL(float, lo, KD_WIDE_L);
    int lid = TWK_LID(0), L = TWK_LSIZE(0);
    long g = TWK_GROUP(0), p = g / k, j = g % k;
    long sb = kd_tile_start(n, slices, p), sl = kd_tile_start(n, slices, p + 1) - sb;
    long b = sb + kd_tile_start(sl, k, j), e = sb + kd_tile_start(sl, k, j + 1);
    float h = 0.0f, c = 0.0f;
    for (long i = b + lid; i < e; i += L) {
        float v = x[x_off + i], u = mode == 1 ? w[w_off + i] : v;
        float t = mode == 0 ? v : v * u;
        if (mode != 0) c += fma(v, u, -t); /* the product's rounding error, exactly */
        kd_two_sum(&h, &c, t);
    }
    hi[lid] = h;
    lo[lid] = c;
    TWK_BARRIER();
    KD_TREE_SUM2(hi, lo, lid, L, 1)
    if (lid == 0) {
        part[part_off + 2 * g] = hi[0];
        part[part_off + 2 * g + 1] = lo[0];
    }
}

/* Stage 2: work-group p folds the pairs [p k, p k + k) of part; out_pair: the pair into y[2 p],
 * y[2 p + 1], else y[p] = scale * (hi + lo). */
TWK_KERNEL wide_fold_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *part, long part_off, long k,
                         int out_pair, float scale) {
    TWK_LOCAL(float, hi, KD_WIDE_L);
    TWK_LOCAL(float, lo, KD_WIDE_L);
    int lid = TWK_LID(0), L = TWK_LSIZE(0);
    long p = TWK_GROUP(0);
    float h = 0.0f, c = 0.0f;
    for (long i = lid; i < k; i += L) {
        kd_two_sum(&h, &c, part[part_off + 2 * (p * k + i)]);
        c += part[part_off + 2 * (p * k + i) + 1];
    }
    hi[lid] = h;
    lo[lid] = c;
    TWK_BARRIER();
    KD_TREE_SUM2(hi, lo, lid, L, 1)
    if (lid == 0) {
        if (out_pair) {
            y[y_off + 2 * p] = hi[0];
            y[y_off + 2 * p + 1] = lo[0];
        } else {
            y[y_off + p] = scale * (hi[0] + lo[0]);
        }
    }
}

/* Stage 2 of column sums: work-group b folds columns [b C, b C + C) of the tiles' pairs (hi
 * plane part[t D + d], lo plane part[T D + t D + d], t < T) with its L / C lanes, y[d] = hi + lo. */
TWK_KERNEL col_fold_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *part, long part_off, long T,
                        long D, int C) {
    TWK_LOCAL(float, hi, KD_WIDE_L);
    TWK_LOCAL(float, lo, KD_WIDE_L);
    int lid = TWK_LID(0), L = TWK_LSIZE(0), lanes = L / C, lane = lid / C;
    long d = TWK_GROUP(0) * C + lid % C;
    float h = 0.0f, c = 0.0f;
    if (d < D)
        for (long t = lane; t < T; t += lanes) {
            kd_two_sum(&h, &c, part[part_off + t * D + d]);
            c += part[part_off + T * D + t * D + d];
        }
    hi[lid] = h;
    lo[lid] = c;
    TWK_BARRIER();
    KD_TREE_SUM2(hi, lo, lid, L, C)
    if (lane == 0 && d < D) y[y_off + d] = hi[lid] + lo[lid];
}
