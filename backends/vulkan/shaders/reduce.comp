#version 450
// Whole-tensor reductions to one value in a single work-group: each thread
// sums a fixed strided slice, then a fixed tree. Sums are compensated (each
// value carries its rounding error, TwoSum), so the result is close to a
// double-precision sum. MODE: 0 sum, 1 mean, 2 weighted sum (x * w).
// p[0] = element count.
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

void main() {
    uint n = uint(pc.p[0]), lid = gl_LocalInvocationID.x;
    float hi = 0.0, lo = 0.0;
    for (uint i = lid; i < n; i += WG) {
        precise float v = MODE == 2 ? x[pc.off[1] + i] * w[pc.off[2] + i] : x[pc.off[1] + i];
        if (MODE == 2) lo += fma(x[pc.off[1] + i], w[pc.off[2] + i], -v); // the product's rounding error
        two_sum(hi, lo, v);
    }
    red_hi[lid] = hi;
    red_lo[lid] = lo;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (lid < s) {
            float h = red_hi[lid], l = red_lo[lid] + red_lo[lid + s];
            two_sum(h, l, red_hi[lid + s]);
            red_hi[lid] = h;
            red_lo[lid] = l;
        }
        barrier();
    }
    if (lid == 0u) {
        precise float total = red_hi[0] + red_lo[0];
        y[pc.off[0]] = MODE == 1 ? total / float(n) : total;
    }
}
