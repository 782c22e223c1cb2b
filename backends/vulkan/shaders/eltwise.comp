#version 450
// Same-shape maps. MODE: 0 fill f[0], 1 scale x*f[0], 2 silu, 3 silu_back (x, dy),
// 4 swiglu (g, u), 5 swiglu_back d/dgate (g, u, dy), 6 swiglu_back d/dup,
// 7 gelu (tanh approximation: x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)), 8 gelu_back (x, dy),
// 9 tanh (|x| clamped at 15, where tanh is 1 in float), 10 tanh_back (x, dy).
// p[0] = element count.
#include "common.glsl"
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) buffer A { float a[]; };
layout(std430, binding = 2) buffer B { float b[]; };
layout(std430, binding = 3) buffer C { float c[]; };

float sigm(float x) { return 1.0 / (1.0 + exp(-x)); }
float gelu_2u(float x) { return 1.5957691216057308 * (x + 0.044715 * x * x * x); }

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
            else if (MODE == 6) r = c[pc.off[3] + i] * x * sigm(x);
            else if (MODE == 7) r = x * sigm(gelu_2u(x));
            else if (MODE == 9) r = tanh(clamp(x, -15.0, 15.0));
            else if (MODE == 10) { float t = tanh(clamp(x, -15.0, 15.0)); r = b[pc.off[2] + i] * (1.0 - t * t); }
            else { float s = sigm(gelu_2u(x)); r = b[pc.off[2] + i] * (s + x * s * (1.0 - s) * 1.5957691216057308 * (1.0 + 0.134145 * x * x)); }
        }
        y[pc.off[0] + i] = r;
    }
}
