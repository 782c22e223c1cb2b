#version 450
// Whole-tensor reductions to one value in a single work-group: each thread
// sums a fixed strided slice, then a fixed tree. MODE: 0 sum, 1 mean,
// 2 weighted sum (x * w). p[0] = element count.
#include "common.glsl"
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) buffer X { float x[]; };
layout(std430, binding = 2) buffer W { float w[]; };
shared float red[WG];

void main() {
    uint n = uint(pc.p[0]), lid = gl_LocalInvocationID.x;
    float acc = 0.0;
    for (uint i = lid; i < n; i += WG) acc += MODE == 2 ? x[pc.off[1] + i] * w[pc.off[2] + i] : x[pc.off[1] + i];
    red[lid] = acc;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (lid < s) red[lid] += red[lid + s];
        barrier();
    }
    if (lid == 0u) y[pc.off[0]] = MODE == 1 ? red[0] / float(n) : red[0];
}
