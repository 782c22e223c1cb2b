#version 450
// FUSED_EW (graph/fuse.c): a chain of up to 8 same-shape maps per element, the intermediates in
// registers, each map the expression of the unfused shader (ew_maps.glsl; add and mul as
// broadcast.comp's a + b and a * b). The step table is in the push constants: p[0] = element
// count, p[1] = sources (1..7, at bindings 1..7), p[2 + k] = step k (0 ends the chain): bits
// 0..7 the map (1..10: ew_maps.glsl's m, swiglu_back's which already chosen; 11 add, 12 mul),
// bits 8..11, 12..15, 16..19 its operands (0..6 source j, 8 + j step j's result, as
// TWK_FUSE_STEP); f[k] is step k's scale factor. The last step's result is y.
#include "common.glsl"
#include "ew_maps.glsl"
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) buffer S0 { float s0[]; };
layout(std430, binding = 2) buffer S1 { float s1[]; };
layout(std430, binding = 3) buffer S2 { float s2[]; };
layout(std430, binding = 4) buffer S3 { float s3[]; };
layout(std430, binding = 5) buffer S4 { float s4[]; };
layout(std430, binding = 6) buffer S5 { float s5[]; };
layout(std430, binding = 7) buffer S6 { float s6[]; };

void main() {
    uint n = uint(pc.p[0]);
    int ns = pc.p[1];
    for (uint i = gl_GlobalInvocationID.x; i < n; i += GSTRIDE) {
        float v[16];
        v[0] = s0[pc.off[1] + i];
        if (ns > 1) v[1] = s1[pc.off[2] + i];
        if (ns > 2) v[2] = s2[pc.off[3] + i];
        if (ns > 3) v[3] = s3[pc.off[4] + i];
        if (ns > 4) v[4] = s4[pc.off[5] + i];
        if (ns > 5) v[5] = s5[pc.off[6] + i];
        if (ns > 6) v[6] = s6[pc.off[7] + i];
        float r = 0.0;
        for (int k = 0; k < 8; k++) {
            int w = pc.p[2 + k];
            if (w == 0) break;
            int m = w & 255;
            float a = v[(w >> 8) & 15], b = v[(w >> 12) & 15], c = v[(w >> 16) & 15];
            if (m == 11) r = a + b;
            else if (m == 12) r = a * b;
            else r = ew_map(m, a, b, c, pc.f[k]);
            v[8 + k] = r;
        }
        y[pc.off[0] + i] = r;
    }
}
