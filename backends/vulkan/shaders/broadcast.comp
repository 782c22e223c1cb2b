#version 450
// y = a op b[broadcast] over a 4-D padded shape. MODE: 0 add, 1 mul,
// 2 broadcast (y = b[broadcast] * f[0]). p[0..3] = dst dims, p[4..7] = b's
// strides per dst dim (0 where broadcast), p[8] = element count.
#include "common.glsl"
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) buffer A { float a[]; };
layout(std430, binding = 2) buffer B { float b[]; };

void main() {
    uint n = uint(pc.p[8]);
    uint D1 = uint(pc.p[1]), D2 = uint(pc.p[2]), D3 = uint(pc.p[3]);
    for (uint i = gl_GlobalInvocationID.x; i < n; i += GSTRIDE) {
        uint i3 = i % D3, r = i / D3;
        uint i2 = r % D2; r /= D2;
        uint i1 = r % D1, i0 = r / D1;
        uint bi = i0 * uint(pc.p[4]) + i1 * uint(pc.p[5]) + i2 * uint(pc.p[6]) + i3 * uint(pc.p[7]);
        float bv = b[pc.off[2] + bi];
        float r2;
        if (MODE == 0) r2 = a[pc.off[1] + i] + bv;
        else if (MODE == 1) r2 = a[pc.off[1] + i] * bv;
        else r2 = bv * pc.f[0];
        y[pc.off[0] + i] = r2;
    }
}
