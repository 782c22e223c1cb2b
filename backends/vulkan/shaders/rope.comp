#version 450
// Rotary embedding (half-rotation layout) on x [T, H, D]: one thread per
// (t, h, i < D/2). pos at binding 2 (i64 if p[7]), inv_freq [D/2] at 3.
// p: 0 T, 1 H, 2 D; f[0] = +1 forward, -1 for the inverse rotation.
#include "common.glsl"
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) buffer X { float x[]; };
layout(std430, binding = 2) buffer P { uint pos[]; };
layout(std430, binding = 3) buffer F { float freq[]; };

void main() {
    uint T = uint(pc.p[0]), H = uint(pc.p[1]), D = uint(pc.p[2]), half_ = D / 2u;
    uint n = T * H * half_;
    for (uint it = gl_GlobalInvocationID.x; it < n; it += GSTRIDE) {
        uint i = it % half_, th = it / half_, t = th / H;
        float p = float(ID_AT(pos, pc.off[2], t, pc.p[7]));
        float ang = p * freq[pc.off[3] + i];
        float c = cos(ang), s = pc.f[0] * sin(ang);
        uint b = th * D;
        float x1 = x[pc.off[1] + b + i], x2 = x[pc.off[1] + b + i + half_];
        y[pc.off[0] + b + i] = x1 * c - x2 * s;
        y[pc.off[0] + b + i + half_] = x2 * c + x1 * s;
    }
}
