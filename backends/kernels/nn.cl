/* Transformer kernels: embedding gather and its gradient, RMSNorm and its
 * gradients, RoPE, log-probabilities and their gradient. Ids outside their
 * range store KD_ERR_ID_RANGE in err[err_off] and the item writes zeros. Row
 * kernels run one work-group (a power-of-two size <= KD_ROW_LOCAL) per row. */

#define KD_ROW_LOCAL 256

/* y[t, :] = table[ids[t], :]; one item per element of y [T, D] */
TWK_KERNEL get_rows_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *tab, long tab_off,
                        TWK_GLOBAL const int *ids, long ids_off, TWK_GLOBAL int *err, long err_off,
                        long T, long D, long V, int is64) {
    long i = TWK_GID(0);
    if (i >= T * D) return;
    long t = i / D, d = i % D;
    long id = kd_id(ids + ids_off, t, is64);
    if (id < 0 || id >= V) {
        err[err_off] = KD_ERR_ID_RANGE;
        y[y_off + i] = 0.0f;
        return;
    }
    y[y_off + i] = tab[tab_off + id * D + d];
}

/* g [V, D] += dy [T, D] scattered by ids: one item per column d walks the
 * tokens in order (g zeroed before), so repeated ids add deterministically */
TWK_KERNEL get_rows_back_f32(TWK_GLOBAL float *g, long g_off, TWK_GLOBAL const float *dy, long dy_off,
                             TWK_GLOBAL const int *ids, long ids_off, TWK_GLOBAL int *err, long err_off,
                             long T, long D, long V, int is64) {
    long d = TWK_GID(0);
    if (d >= D) return;
    for (long t = 0; t < T; t++) {
        long id = kd_id(ids + ids_off, t, is64);
        if (id < 0 || id >= V) {
            err[err_off] = KD_ERR_ID_RANGE;
            continue;
        }
        g[g_off + id * D + d] += dy[dy_off + t * D + d];
    }
}

/* sum of x[r, :]^2 over the row by the group, into part[0] (all items wait) */
#define KD_ROW_SUMSQ(part, xr, D, lid, L)                                      \
    {                                                                          \
        float s_ = 0.0f;                                                       \
        for (long k_ = (lid); k_ < (D); k_ += (L)) s_ += (xr)[k_] * (xr)[k_];  \
        part[(lid)] = s_;                                                      \
        TWK_BARRIER();                                                         \
        KD_TREE_SUM(part, (lid), (L))                                          \
    }

/* y = w * x / sqrt(mean(x^2) + eps) over the last dim D, one group per row */
TWK_KERNEL rmsnorm_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *x, long x_off,
                       TWK_GLOBAL const float *w, long w_off, long D, float eps) {
    TWK_LOCAL(float, part, KD_ROW_LOCAL);
    int lid = TWK_LID(0), L = TWK_LSIZE(0);
    long r = TWK_GROUP(0);
    const TWK_GLOBAL float *xr = x + x_off + r * D;
    KD_ROW_SUMSQ(part, xr, D, lid, L)
    float rs = 1.0f / sqrt(part[0] / (float)D + eps);
    for (long k = lid; k < D; k += L) y[y_off + r * D + k] = w[w_off + k] * (xr[k] * rs);
}

/* dx = dy*w*rs - x * (sum(dy*w*x) * rs^3 / D), one group per row */
TWK_KERNEL rmsnorm_back_x_f32(TWK_GLOBAL float *dx, long dx_off, TWK_GLOBAL const float *x, long x_off,
                              TWK_GLOBAL const float *w, long w_off, TWK_GLOBAL const float *dy, long dy_off,
                              long D, float eps) {
    TWK_LOCAL(float, part, KD_ROW_LOCAL);
    int lid = TWK_LID(0), L = TWK_LSIZE(0);
    long r = TWK_GROUP(0);
    const TWK_GLOBAL float *xr = x + x_off + r * D;
    const TWK_GLOBAL float *dr = dy + dy_off + r * D;
    KD_ROW_SUMSQ(part, xr, D, lid, L)
    float rs = 1.0f / sqrt(part[0] / (float)D + eps);
    TWK_BARRIER();
    float s = 0.0f;
    for (long k = lid; k < D; k += L) s += dr[k] * w[w_off + k] * xr[k];
    part[lid] = s;
    TWK_BARRIER();
    KD_TREE_SUM(part, lid, L)
    float kk = part[0] * rs * rs * rs / (float)D;
    for (long k = lid; k < D; k += L) dx[dx_off + r * D + k] = dr[k] * w[w_off + k] * rs - xr[k] * kk;
}

/* dw[d] = sum over rows of dy*x*rstd(row): one group per block of L columns
 * walks the rows L at a time: item l first computes the rstd of row r0 + l
 * (a sequential sum over D) into local memory, then each item adds its
 * column over those rows in order (compensated) */
TWK_KERNEL rmsnorm_back_w_f32(TWK_GLOBAL float *dw, long dw_off, TWK_GLOBAL const float *x, long x_off,
                              TWK_GLOBAL const float *dy, long dy_off, long R, long D, float eps) {
    TWK_LOCAL(float, rsl, KD_ROW_LOCAL);
    int lid = TWK_LID(0), L = TWK_LSIZE(0);
    long d = TWK_GROUP(0) * L + lid;
    float s = 0.0f, c = 0.0f;
    for (long r0 = 0; r0 < R; r0 += L) {
        long r = r0 + lid;
        if (r < R) {
            const TWK_GLOBAL float *xr = x + x_off + r * D;
            float ss = 0.0f;
            for (long k = 0; k < D; k++) ss += xr[k] * xr[k];
            rsl[lid] = 1.0f / sqrt(ss / (float)D + eps);
        }
        TWK_BARRIER();
        long nr = R - r0 < L ? R - r0 : L;
        if (d < D)
            for (long t = 0; t < nr; t++) {
                long o = (r0 + t) * D + d;
                kd_kahan(&s, &c, dy[dy_off + o] * x[x_off + o] * rsl[t]);
            }
        TWK_BARRIER();
    }
    if (d < D) dw[dw_off + d] = s;
}

/* The wide rmsnorm_back_w (hal/twk_wide.h), three launches: rms_rstd (a group per row), the
 * parts (a group per block of C columns and tile of rows), col_fold (reduce.cl). */

/* rs[r] = 1 / sqrt(sum(x[r, :]^2) / D + eps), one group per row, the sum compensated */
TWK_KERNEL rms_rstd_f32(TWK_GLOBAL float *rs, long rs_off, TWK_GLOBAL const float *x, long x_off, long D, float eps) {
    TWK_LOCAL(float, hi, KD_ROW_LOCAL);
    TWK_LOCAL(float, lo, KD_ROW_LOCAL);
    int lid = TWK_LID(0), L = TWK_LSIZE(0);
    long r = TWK_GROUP(0);
    const TWK_GLOBAL float *xr = x + x_off + r * D;
    float h = 0.0f, c = 0.0f;
    for (long k = lid; k < D; k += L) kd_two_sum(&h, &c, xr[k] * xr[k]);
    hi[lid] = h;
    lo[lid] = c;
    TWK_BARRIER();
    KD_TREE_SUM2(hi, lo, lid, L, 1)
    if (lid == 0) rs[rs_off + r] = 1.0f / sqrt((hi[0] + lo[0]) / (float)D + eps);
}

/* Stage 1: group g (column block b = g % nb, row tile t = g / nb of T over R rows) sums
 * dy * x * rs over its rows for columns [b C, b C + C), each of its L / C lanes walking every
 * (L / C)-th row of the tile, then a tree over the lanes: the pair (hi, lo) of (t, d) into the
 * planes part[t D + d] and part[T D + t D + d]. */
TWK_KERNEL rmsnorm_back_w_parts_f32(TWK_GLOBAL float *part, long part_off, TWK_GLOBAL const float *x, long x_off,
                                    TWK_GLOBAL const float *dy, long dy_off, TWK_GLOBAL const float *rs, long rs_off,
                                    long R, long D, long T, int C) {
    TWK_LOCAL(float, hi, KD_ROW_LOCAL);
    TWK_LOCAL(float, lo, KD_ROW_LOCAL);
    int lid = TWK_LID(0), L = TWK_LSIZE(0), lanes = L / C, lane = lid / C;
    long nb = (D + C - 1) / C, g = TWK_GROUP(0), t = g / nb;
    long d = (g % nb) * C + lid % C;
    long rb = kd_tile_start(R, T, t), re = kd_tile_start(R, T, t + 1);
    float h = 0.0f, c = 0.0f;
    if (d < D)
        for (long r = rb + lane; r < re; r += lanes) {
            long o = r * D + d;
            kd_two_sum(&h, &c, dy[dy_off + o] * x[x_off + o] * rs[rs_off + r]);
        }
    hi[lid] = h;
    lo[lid] = c;
    TWK_BARRIER();
    KD_TREE_SUM2(hi, lo, lid, L, C)
    if (lane == 0 && d < D) {
        part[part_off + t * D + d] = hi[lid];
        part[part_off + T * D + t * D + d] = lo[lid];
    }
}

/* Rotary embedding, half-rotation layout, on x [T, H, D]; one item per
 * (t, h, i < D/2). inv_freq from the tensor (has_freq) or theta^(-2i/D) in
 * float32 as transformers computes it; sign -1 rotates back (the gradient). */
TWK_KERNEL rope_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *x, long x_off,
                    TWK_GLOBAL const int *pos, long pos_off, TWK_GLOBAL const float *freq, long freq_off,
                    long T, long H, long D, float theta, float sign, int has_freq, int is64) {
    long hd = D / 2;
    long g = TWK_GID(0);
    if (g >= T * H * hd) return;
    long i = g % hd, th = g / hd, t = th / H;
    float f = has_freq ? freq[freq_off + i] : 1.0f / pow(theta, (float)(2 * i) / (float)D);
    float ang = (float)kd_id(pos + pos_off, t, is64) * f;
    float cs = cos(ang), sn = sign * sin(ang);
    const TWK_GLOBAL float *xr = x + x_off + th * D;
    TWK_GLOBAL float *yr = y + y_off + th * D;
    float x1 = xr[i], x2 = xr[i + hd];
    yr[i] = x1 * cs - x2 * sn;
    yr[i + hd] = x2 * cs + x1 * sn;
}

/* rope_f32 of rmsnorm_f32's rows (the fusion pass's RMSNORM_ROPE), one group per row (t, h): the
 * row's rstd as rmsnorm_f32 sums it, then each item rotates pairs (i, i + D/2) of the normalized
 * values, computed by both kernels' expressions */
TWK_KERNEL rmsnorm_rope_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *x, long x_off,
                            TWK_GLOBAL const float *w, long w_off, TWK_GLOBAL const int *pos, long pos_off,
                            TWK_GLOBAL const float *freq, long freq_off, long H, long D, float eps, float theta,
                            float sign, int has_freq, int is64) {
    TWK_LOCAL(float, part, KD_ROW_LOCAL);
    int lid = TWK_LID(0), L = TWK_LSIZE(0);
    long r = TWK_GROUP(0), t = r / H, hd = D / 2;
    const TWK_GLOBAL float *xr = x + x_off + r * D;
    TWK_GLOBAL float *yr = y + y_off + r * D;
    KD_ROW_SUMSQ(part, xr, D, lid, L)
    float rs = 1.0f / sqrt(part[0] / (float)D + eps);
    float p = (float)kd_id(pos + pos_off, t, is64);
    for (long i = lid; i < hd; i += L) {
        float f = has_freq ? freq[freq_off + i] : 1.0f / pow(theta, (float)(2 * i) / (float)D);
        float ang = p * f;
        float cs = cos(ang), sn = sign * sin(ang);
        float x1 = w[w_off + i] * (xr[i] * rs), x2 = w[w_off + i + hd] * (xr[i + hd] * rs);
        yr[i] = x1 * cs - x2 * sn;
        yr[i + hd] = x2 * cs + x1 * sn;
    }
}

/* Element k of rope_f32's rotation of row g (position p): as rope_f32 computes it */
TWK_FN float kd_rope_at(const TWK_GLOBAL float *g, long k, long D, float p, const TWK_GLOBAL float *freq,
                        float theta, float sign, int has_freq) {
    long hd = D / 2, i = k < hd ? k : k - hd;
    float f = has_freq ? freq[i] : 1.0f / pow(theta, (float)(2 * i) / (float)D);
    float ang = p * f;
    float cs = cos(ang), sn = sign * sin(ang);
    float x1 = g[i], x2 = g[i + hd];
    return k < hd ? x1 * cs - x2 * sn : x2 * cs + x1 * sn;
}

/* rmsnorm_back_x_f32 of rope_f32's rotation of dy (the fusion pass's ROPE_RMSNORM_BACK_X), one
 * group per row (t, h): each rotated element computed where rmsnorm_back_x_f32 reads it, by
 * rope_f32's expressions, so the sums run in its order */
TWK_KERNEL rope_rmsnorm_back_x_f32(TWK_GLOBAL float *dx, long dx_off, TWK_GLOBAL const float *x, long x_off,
                                   TWK_GLOBAL const float *w, long w_off, TWK_GLOBAL const float *dy, long dy_off,
                                   TWK_GLOBAL const int *pos, long pos_off, TWK_GLOBAL const float *freq,
                                   long freq_off, long H, long D, float eps, float theta, float sign, int has_freq,
                                   int is64) {
    TWK_LOCAL(float, part, KD_ROW_LOCAL);
    int lid = TWK_LID(0), L = TWK_LSIZE(0);
    long r = TWK_GROUP(0);
    const TWK_GLOBAL float *xr = x + x_off + r * D;
    const TWK_GLOBAL float *gr = dy + dy_off + r * D;
    const TWK_GLOBAL float *fr = freq + freq_off;
    float p = (float)kd_id(pos + pos_off, r / H, is64);
    KD_ROW_SUMSQ(part, xr, D, lid, L)
    float rs = 1.0f / sqrt(part[0] / (float)D + eps);
    TWK_BARRIER();
    float s = 0.0f;
    for (long k = lid; k < D; k += L) s += kd_rope_at(gr, k, D, p, fr, theta, sign, has_freq) * w[w_off + k] * xr[k];
    part[lid] = s;
    TWK_BARRIER();
    KD_TREE_SUM(part, lid, L)
    float kk = part[0] * rs * rs * rs / (float)D;
    for (long k = lid; k < D; k += L)
        dx[dx_off + r * D + k] = kd_rope_at(gr, k, D, p, fr, theta, sign, has_freq) * w[w_off + k] * rs - xr[k] * kk;
}

/* y[t] = logits[t, tgt] - logsumexp(logits[t, :]); one group per row */
TWK_KERNEL logprobs_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *x, long x_off,
                        TWK_GLOBAL const int *tg, long tg_off, TWK_GLOBAL int *err, long err_off, long V,
                        int is64) {
    TWK_LOCAL(float, part, KD_ROW_LOCAL);
    int lid = TWK_LID(0), L = TWK_LSIZE(0);
    long r = TWK_GROUP(0);
    const TWK_GLOBAL float *xr = x + x_off + r * V;
    float m = KD_NEG_BIG;
    for (long k = lid; k < V; k += L) m = fmax(m, xr[k]);
    part[lid] = m;
    TWK_BARRIER();
    KD_TREE_MAX(part, lid, L)
    m = part[0];
    TWK_BARRIER();
    float s = 0.0f;
    for (long k = lid; k < V; k += L) s += exp(xr[k] - m);
    part[lid] = s;
    TWK_BARRIER();
    KD_TREE_SUM(part, lid, L)
    if (lid == 0) {
        long t = kd_id(tg + tg_off, r, is64);
        if (t < 0 || t >= V) {
            err[err_off] = KD_ERR_ID_RANGE;
            y[y_off + r] = 0.0f;
        } else {
            y[y_off + r] = xr[t] - (m + log(part[0]));
        }
    }
}

/* g[t, :] = dy[t] * (onehot(tgt) - softmax(logits[t, :])), softmax from the
 * saved log-prob: lse = logits[t, tgt] - lp[t]; one item per element */
TWK_KERNEL logprobs_back_f32(TWK_GLOBAL float *g, long g_off, TWK_GLOBAL const float *x, long x_off,
                             TWK_GLOBAL const int *tg, long tg_off, TWK_GLOBAL const float *dy, long dy_off,
                             TWK_GLOBAL const float *lp, long lp_off, TWK_GLOBAL int *err, long err_off,
                             long T, long V, int is64) {
    long i = TWK_GID(0);
    if (i >= T * V) return;
    long r = i / V, k = i % V;
    long t = kd_id(tg + tg_off, r, is64);
    if (t < 0 || t >= V) {
        err[err_off] = KD_ERR_ID_RANGE;
        g[g_off + i] = 0.0f;
        return;
    }
    const TWK_GLOBAL float *xr = x + x_off + r * V;
    float d = dy[dy_off + r], lse = xr[t] - lp[lp_off + r];
    float v = -d * exp(xr[k] - lse);
    g[g_off + i] = k == t ? v + d : v;
}
