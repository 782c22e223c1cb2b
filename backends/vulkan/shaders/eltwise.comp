#version 450
// Same-shape maps. MODE: 0 fill f[0], else map MODE of ew_maps.glsl (1 scale x*f[0], 2 silu,
// 3 silu_back (x, dy), 4 swiglu (g, u), 5 swiglu_back d/dgate (g, u, dy), 6 swiglu_back d/dup,
// 7 gelu, 8 gelu_back (x, dy), 9 tanh, 10 tanh_back (x, dy)); fused.comp runs the same maps.
// p[0] = element count.
#include "common.glsl"
#include "ew_maps.glsl"
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) buffer A { float a[]; };
layout(std430, binding = 2) buffer B { float b[]; };
layout(std430, binding = 3) buffer C { float c[]; };

void main() {
    uint n = uint(pc.p[0]);
    for (uint i = gl_GlobalInvocationID.x; i < n; i += GSTRIDE) {
        float r = 0.0;
        if (MODE == 0) {
            r = pc.f[0];
        } else {
            float x = a[pc.off[1] + i];
            float bv = ew_reads_b(MODE) ? b[pc.off[2] + i] : 0.0;
            float cv = ew_reads_c(MODE) ? c[pc.off[3] + i] : 0.0;
            r = ew_map(MODE, x, bv, cv, pc.f[0]);
        }
        y[pc.off[0] + i] = r;
    }
}
