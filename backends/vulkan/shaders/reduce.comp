#version 450
// Whole-tensor reductions. Sums are compensated: every addition is a TwoSum
// whose rounding error is carried in lo, so hi + lo is close to a
// double-precision sum; every order is fixed, so two runs give the same bits.
// MODE 0 sum, 1 mean, 2 weighted sum (x * w): the older single work-group
//   (TWK_REDUCE_NARROW=1); p[0] = element count.
// The wide (two-stage) reductions of hal/twk_wide.h, sized to the device; one
// work-group per tile / fold, dispatched exactly (no grid-stride loop around a
// barrier: lavapipe runs those several times slower):
// MODE 3, 6, 7 stage 1: work-group g = s * k + j sums tile j (of k) of slice s
//   (of p[1] slices over p[0] elements) of the terms (MODE 3 x, 6 x * w, 7 x * x;
//   x at binding 1, w at 2; a product's rounding error, fma(a, b, -ab), goes
//   to lo) into the pair y[2 g], y[2 g + 1] (the plan scratch).
// MODE 4 stage 2: work-group s folds the pairs [s k, s k + k) of binding 1
//   (p[2] = k); p[3] = 1: the pair into y[2 s], else y[s] = f[0] * (hi + lo);
//   p[1] groups.
// MODE 5 stage 2 of column sums (rmsnorm_back_w): work-group b folds columns
//   [b C, b C + C) of the tiles' pairs at binding 1 (hi plane [T, D], then the
//   lo plane) with its WG / C lanes into y[d]; p: 0 T, 1 D, 2 C.
#include "common.glsl"
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) buffer X { float x[]; };
layout(std430, binding = 2) buffer W { float w[]; };
shared float red_hi[WG];
shared float red_lo[WG];

// (hi, lo) += v, keeping the rounding error of the addition in lo.
void two_sum(inout float hi, inout float lo, float v) {
    precise float s = hi + v;
    precise float bb = s - hi;
    precise float err = (hi - (s - bb)) + (v - bb);
    hi = s;
    lo += err;
}

// the group's pairs (red_hi, red_lo), lane-major with C columns, summed over
// the lanes of each column into indices 0..C-1 (C = 1: one tree)
void tree2(uint lid, uint C) {
    for (uint s = WG / 2u; s >= C && s > 0u; s >>= 1) {
        if (lid < s) {
            float h = red_hi[lid], l = red_lo[lid] + red_lo[lid + s];
            two_sum(h, l, red_hi[lid + s]);
            red_hi[lid] = h;
            red_lo[lid] = l;
        }
        barrier();
    }
}

// start of tile t of [0, n) cut into `tiles` (hal/twk_wide.h)
uint tile_start(uint n, uint tiles, uint t) { return t * (n / tiles) + min(t, n % tiles); }

void main() {
    uint lid = gl_LocalInvocationID.x;
    if (MODE == 3 || MODE == 6 || MODE == 7) {
        uint n = uint(pc.p[0]), slices = uint(pc.p[1]), k = uint(pc.p[2]);
        const int kind = MODE == 3 ? 0 : MODE == 6 ? 1 : 2; // a spec constant: no branch in the loop
        {
            uint g = gl_WorkGroupID.x;
            uint s = g / k, j = g % k;
            uint sb = tile_start(n, slices, s), sl = tile_start(n, slices, s + 1u) - sb;
            uint b = sb + tile_start(sl, k, j), e = sb + tile_start(sl, k, j + 1u);
            float hi = 0.0, lo = 0.0;
            for (uint i = b + lid; i < e; i += WG) {
                float v = x[pc.off[1] + i], u = kind == 1 ? w[pc.off[2] + i] : v;
                precise float t = kind == 0 ? v : v * u;
                precise float pe = fma(v, u, -t); // the product's rounding error, where the driver fuses fma (lavapipe does not)
                if (kind != 0) lo += pe;
                two_sum(hi, lo, t);
            }
            red_hi[lid] = hi;
            red_lo[lid] = lo;
            barrier();
            tree2(lid, 1u);
            if (lid == 0u) {
                y[pc.off[0] + 2u * g] = red_hi[0];
                y[pc.off[0] + 2u * g + 1u] = red_lo[0];
            }
            barrier();
        }
        return;
    }
    if (MODE == 4) {
        uint k = uint(pc.p[2]);
        {
            uint s = gl_WorkGroupID.x;
            float hi = 0.0, lo = 0.0;
            for (uint i = lid; i < k; i += WG) {
                two_sum(hi, lo, x[pc.off[1] + 2u * (s * k + i)]);
                lo += x[pc.off[1] + 2u * (s * k + i) + 1u];
            }
            red_hi[lid] = hi;
            red_lo[lid] = lo;
            barrier();
            tree2(lid, 1u);
            if (lid == 0u) {
                if (pc.p[3] != 0) {
                    y[pc.off[0] + 2u * s] = red_hi[0];
                    y[pc.off[0] + 2u * s + 1u] = red_lo[0];
                } else {
                    precise float total = red_hi[0] + red_lo[0];
                    precise float scaled = total * pc.f[0];
                    y[pc.off[0] + s] = scaled;
                }
            }
            barrier();
        }
        return;
    }
    if (MODE == 5) {
        uint T = uint(pc.p[0]), D = uint(pc.p[1]), C = uint(pc.p[2]), lanes = WG / C, lane = lid / C;
        {
            uint d = gl_WorkGroupID.x * C + lid % C;
            float hi = 0.0, lo = 0.0;
            if (d < D)
                for (uint t = lane; t < T; t += lanes) {
                    two_sum(hi, lo, x[pc.off[1] + t * D + d]);
                    lo += x[pc.off[1] + T * D + t * D + d];
                }
            red_hi[lid] = hi;
            red_lo[lid] = lo;
            barrier();
            tree2(lid, C);
            if (lane == 0u && d < D) {
                precise float total = red_hi[lid] + red_lo[lid];
                y[pc.off[0] + d] = total;
            }
            barrier();
        }
        return;
    }
    uint n = uint(pc.p[0]);
    float hi = 0.0, lo = 0.0;
    for (uint i = lid; i < n; i += WG) {
        precise float v = MODE == 2 ? x[pc.off[1] + i] * w[pc.off[2] + i] : x[pc.off[1] + i];
        if (MODE == 2) lo += fma(x[pc.off[1] + i], w[pc.off[2] + i], -v); // the product's rounding error
        two_sum(hi, lo, v);
    }
    red_hi[lid] = hi;
    red_lo[lid] = lo;
    barrier();
    tree2(lid, 1u);
    if (lid == 0u) {
        precise float total = red_hi[0] + red_lo[0];
        y[pc.off[0]] = MODE == 1 ? total / float(n) : total;
    }
}
