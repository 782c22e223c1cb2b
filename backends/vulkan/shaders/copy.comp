#version 450
// Strided 4-D copy of 32-bit words (permute, slice, concat, slice_back):
// element (i0..i3) of the box p[0..3] moves from x at strides p[4..7] to y at
// strides p[8..11]; p[12] = words per element (1 or 2), p[13] = box elements.
// MODE 1 instead zeroes p[13] words of y.
#include "common.glsl"
layout(std430, binding = 0) buffer Y { uint y[]; };
layout(std430, binding = 1) buffer X { uint x[]; };

void main() {
    uint n = uint(pc.p[13]);
    if (MODE == 1) {
        for (uint i = gl_GlobalInvocationID.x; i < n; i += GSTRIDE) y[pc.off[0] + i] = 0u;
        return;
    }
    uint B1 = uint(pc.p[1]), B2 = uint(pc.p[2]), B3 = uint(pc.p[3]), es = uint(pc.p[12]);
    for (uint i = gl_GlobalInvocationID.x; i < n; i += GSTRIDE) {
        uint i3 = i % B3, r = i / B3;
        uint i2 = r % B2; r /= B2;
        uint i1 = r % B1, i0 = r / B1;
        uint s = i0 * uint(pc.p[4]) + i1 * uint(pc.p[5]) + i2 * uint(pc.p[6]) + i3 * uint(pc.p[7]);
        uint d = i0 * uint(pc.p[8]) + i1 * uint(pc.p[9]) + i2 * uint(pc.p[10]) + i3 * uint(pc.p[11]);
        for (uint w = 0u; w < es; w++) y[pc.off[0] + d * es + w] = x[pc.off[1] + s * es + w];
    }
}
