#version 450
// Same-shape maps. MODE: 0 fill f[0], 1 scale x*f[0], 2 silu, 3 silu_back (x, dy),
// 4 swiglu (g, u), 5 swiglu_back d/dgate (g, u, dy), 6 swiglu_back d/dup.
// p[0] = element count.
#include "common.glsl"
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) buffer A { float a[]; };
layout(std430, binding = 2) buffer B { float b[]; };
layout(std430, binding = 3) buffer C { float c[]; };

float sigm(float x) { return 1.0 / (1.0 + exp(-x)); }

void main() {
    uint n = uint(pc.p[0]);
    for (uint i = gl_GlobalInvocationID.x; i < n; i += GSTRIDE) {
        float r = 0.0;
        if (MODE == 0) {
            r = pc.f[0];
        } else {
            float x = a[pc.off[1] + i];
            if (MODE == 1) r = x * pc.f[0];
            else if (MODE == 2) r = x * sigm(x);
            else if (MODE == 3) { float s = sigm(x); r = b[pc.off[2] + i] * s * (1.0 + x * (1.0 - s)); }
            else if (MODE == 4) r = x * sigm(x) * b[pc.off[2] + i];
            else if (MODE == 5) { float s = sigm(x); r = c[pc.off[3] + i] * b[pc.off[2] + i] * s * (1.0 + x * (1.0 - s)); }
            else r = c[pc.off[3] + i] * x * sigm(x);
        }
        y[pc.off[0] + i] = r;
    }
}
