#version 450
// Row-wise ops, one work-group per row with fixed-tree reductions.
// MODE 0 rmsnorm:        y = w * x * rstd;  (x at 1, w at 2), p: 0 rows, 1 D; f[0] eps
// MODE 1 rmsnorm_back_x: (x 1, w 2, dy 3)
// MODE 2 rstd per row into y (scratch), for rmsnorm_back_w (the sum of squares compensated)
// MODE 3 rmsnorm_back_w: one thread per column: y[d] = sum_r dy[r,d] x[r,d] rstd[r]
//                        (x 1, dy 2, rstd 3); the older kernel (TWK_REDUCE_NARROW=1)
// MODE 6 rmsnorm_back_w, the wide stage 1 (hal/twk_wide.h): work-group g (column
//        block b = g % nb of C columns, row tile t = g / nb of T over R rows) sums
//        dy x rstd over its rows, each of its WG / C lanes walking every
//        (WG / C)-th row, then a compensated tree over the lanes: the pair of
//        (t, d) into the planes y[t D + d] (hi) and y[T D + t D + d] (lo);
//        p: 0 R, 1 D, 2 T, 3 C; reduce.comp MODE 5 folds the planes
// MODE 4 logprobs:       y[r] = x[r, tgt[r]] - logsumexp(x[r]); (logits 1, targets 2), p: 0 rows, 1 V, 7 i64
// MODE 5 logprobs_back:  y[r, i] = dy[r] (onehot - softmax); (logits 1, targets 2, dy 3, logprobs 4)
// MODE 7 rmsnorm_rope:   rope.comp's rotation of MODE 0's rows (x 1, w 2, pos 3, inv_freq 4), a row
//                        per (t, h): p: 0 rows, 1 D, 2 H, 7 i64 pos; f[0] eps, f[1] the rotation's sign
// MODE 8 rope_rmsnorm_back_x: MODE 1 of rope.comp's rotation of dy (x 1, w 2, dy 3, pos 4,
//                        inv_freq 5), each rotated element computed where MODE 1 reads dy
#include "common.glsl"
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) buffer X { float x[]; };
layout(std430, binding = 2) buffer B2 { float b2[]; };
layout(std430, binding = 3) buffer B3 { float b3[]; };
layout(std430, binding = 4) buffer B4 { float b4[]; };
layout(std430, binding = 2) buffer I2 { uint ids[]; };
layout(std430, binding = 3) buffer I3 { uint ids3[]; };
layout(std430, binding = 4) buffer I4 { uint ids4[]; };
layout(std430, binding = 5) buffer B5 { float b5[]; };
shared float red[WG];
shared float red2[WG];

float tree_sum(float v, uint lid) {
    red[lid] = v;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (lid < s) red[lid] += red[lid + s];
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

void two_sum(inout float hi, inout float lo, float v) {
    precise float s = hi + v;
    precise float bb = s - hi;
    precise float err = (hi - (s - bb)) + (v - bb);
    hi = s;
    lo += err;
}

// compensated tree over (red, red2) pairs, lane-major with C columns, into indices 0..C-1
void tree2(uint lid, uint C) {
    for (uint s = WG / 2u; s >= C && s > 0u; s >>= 1) {
        if (lid < s) {
            float h = red[lid], l = red2[lid] + red2[lid + s];
            two_sum(h, l, red[lid + s]);
            red[lid] = h;
            red2[lid] = l;
        }
        barrier();
    }
}

// element k of rope.comp's rotation of dy's row at word db (position p; MODE 8: inv_freq at 5)
float rot_at(uint db, uint k, uint D, float p) {
    uint hd = D / 2u, i = k < hd ? k : k - hd;
    float ang = p * b5[pc.off[5] + i];
    float c = cos(ang), s = pc.f[1] * sin(ang);
    float x1 = b3[db + i], x2 = b3[db + i + hd];
    return k < hd ? x1 * c - x2 * s : x2 * c + x1 * s;
}

uint tile_start(uint n, uint tiles, uint t) { return t * (n / tiles) + min(t, n % tiles); }

float tree_max(float v, uint lid) {
    red[lid] = v;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (lid < s) red[lid] = max(red[lid], red[lid + s]);
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

void main() {
    uint R = uint(pc.p[0]), D = uint(pc.p[1]), lid = gl_LocalInvocationID.x;
    float eps = pc.f[0];
    if (MODE == 6) {
        uint T = uint(pc.p[2]), C = uint(pc.p[3]), lanes = WG / C, lane = lid / C, nb = (D + C - 1u) / C;
        { // one work-group per (block, tile), dispatched exactly
            uint g = gl_WorkGroupID.x;
            uint t = g / nb, d = (g % nb) * C + lid % C;
            uint rb = tile_start(R, T, t), re = tile_start(R, T, t + 1u);
            float hi = 0.0, lo = 0.0;
            if (d < D)
                for (uint r = rb + lane; r < re; r += lanes) {
                    precise float v = b2[pc.off[2] + r * D + d] * x[pc.off[1] + r * D + d] * b3[pc.off[3] + r];
                    two_sum(hi, lo, v);
                }
            red[lid] = hi;
            red2[lid] = lo;
            barrier();
            tree2(lid, C);
            if (lane == 0u && d < D) {
                y[pc.off[0] + t * D + d] = red[lid];
                y[pc.off[0] + T * D + t * D + d] = red2[lid];
            }
            barrier();
        }
        return;
    }
    if (MODE == 3) {
        for (uint d = gl_GlobalInvocationID.x; d < D; d += GSTRIDE) {
            float acc = 0.0;
            for (uint r = 0u; r < R; r++)
                acc += b2[pc.off[2] + r * D + d] * x[pc.off[1] + r * D + d] * b3[pc.off[3] + r];
            y[pc.off[0] + d] = acc;
        }
        return;
    }
    for (uint r = gl_WorkGroupID.x; r < R; r += gl_NumWorkGroups.x) {
        uint xb = pc.off[1] + r * D;
        if (MODE == 2) {
            float hi = 0.0, lo = 0.0;
            for (uint i = lid; i < D; i += WG) two_sum(hi, lo, x[xb + i] * x[xb + i]);
            red[lid] = hi;
            red2[lid] = lo;
            barrier();
            tree2(lid, 1u);
            precise float ss = red[0] + red2[0];
            if (lid == 0u) y[pc.off[0] + r] = 1.0 / sqrt(ss / float(D) + eps);
            barrier();
        } else if (MODE <= 1 || MODE >= 7) {
            float ss = 0.0;
            for (uint i = lid; i < D; i += WG) ss += x[xb + i] * x[xb + i];
            float rs = 1.0 / sqrt(tree_sum(ss, lid) / float(D) + eps);
            if (MODE == 7) {
                uint hd = D / 2u, wb = pc.off[2], yb = pc.off[0] + r * D;
                float p = float(ID_AT(ids3, pc.off[3], r / uint(pc.p[2]), pc.p[7]));
                for (uint i = lid; i < hd; i += WG) {
                    float ang = p * b4[pc.off[4] + i];
                    float c = cos(ang), s = pc.f[1] * sin(ang);
                    float x1 = b2[wb + i] * (x[xb + i] * rs), x2 = b2[wb + i + hd] * (x[xb + i + hd] * rs);
                    y[yb + i] = x1 * c - x2 * s;
                    y[yb + i + hd] = x2 * c + x1 * s;
                }
            } else if (MODE == 8) {
                uint db = pc.off[3] + r * D;
                float p = float(ID_AT(ids4, pc.off[4], r / uint(pc.p[2]), pc.p[7]));
                float dt = 0.0;
                for (uint i = lid; i < D; i += WG) dt += rot_at(db, i, D, p) * b2[pc.off[2] + i] * x[xb + i];
                float k = tree_sum(dt, lid) * rs * rs * rs / float(D);
                for (uint i = lid; i < D; i += WG)
                    y[pc.off[0] + r * D + i] = rot_at(db, i, D, p) * b2[pc.off[2] + i] * rs - x[xb + i] * k;
            } else if (MODE == 0) {
                for (uint i = lid; i < D; i += WG) y[pc.off[0] + r * D + i] = b2[pc.off[2] + i] * (x[xb + i] * rs);
            } else {
                uint db = pc.off[3] + r * D;
                float dt = 0.0;
                for (uint i = lid; i < D; i += WG) dt += b3[db + i] * b2[pc.off[2] + i] * x[xb + i];
                float k = tree_sum(dt, lid) * rs * rs * rs / float(D);
                for (uint i = lid; i < D; i += WG)
                    y[pc.off[0] + r * D + i] = b3[db + i] * b2[pc.off[2] + i] * rs - x[xb + i] * k;
            }
        } else {
            int tgt = ID_AT(ids, pc.off[2], r, pc.p[7]);
            bool ok = tgt >= 0 && tgt < int(D);
            if (MODE == 4) {
                float m = NEG_INF;
                for (uint i = lid; i < D; i += WG) m = max(m, x[xb + i]);
                m = tree_max(m, lid);
                float s = 0.0;
                for (uint i = lid; i < D; i += WG) s += exp(x[xb + i] - m);
                s = tree_sum(s, lid);
                if (lid == 0u) y[pc.off[0] + r] = ok ? x[xb + uint(tgt)] - (m + log(s)) : 0.0;
            } else {
                float lse = ok ? x[xb + uint(tgt)] - b4[pc.off[4] + r] : 0.0, dv = b3[pc.off[3] + r];
                for (uint i = lid; i < D; i += WG)
                    y[pc.off[0] + r * D + i] = -dv * exp(x[xb + i] - lse) + (int(i) == tgt ? dv : 0.0);
            }
        }
    }
}
