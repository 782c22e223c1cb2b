#version 450
// Sums x (4-D padded dims S) down to y (dims D; each D[i] is S[i] or 1), one
// thread per output element, reducing in a fixed order. p[0..3] = D,
// p[4..7] = S, p[8] = output count.
#include "common.glsl"
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) buffer X { float x[]; };

void main() {
    uint n = uint(pc.p[8]);
    uint D[4] = uint[4](uint(pc.p[0]), uint(pc.p[1]), uint(pc.p[2]), uint(pc.p[3]));
    uint S[4] = uint[4](uint(pc.p[4]), uint(pc.p[5]), uint(pc.p[6]), uint(pc.p[7]));
    uint st[4];
    st[3] = 1u;
    for (int k = 2; k >= 0; k--) st[k] = st[k + 1] * S[k + 1];
    uint nr[4];
    for (int k = 0; k < 4; k++) nr[k] = D[k] == S[k] ? 1u : S[k];
    for (uint i = gl_GlobalInvocationID.x; i < n; i += GSTRIDE) {
        uint d3 = i % D[3], r = i / D[3];
        uint d2 = r % D[2]; r /= D[2];
        uint d1 = r % D[1], d0 = r / D[1];
        float acc = 0.0;
        for (uint a0 = 0u; a0 < nr[0]; a0++)
            for (uint a1 = 0u; a1 < nr[1]; a1++)
                for (uint a2 = 0u; a2 < nr[2]; a2++) {
                    uint s0 = nr[0] == 1u ? d0 : a0, s1 = nr[1] == 1u ? d1 : a1, s2 = nr[2] == 1u ? d2 : a2;
                    uint row = pc.off[1] + s0 * st[0] + s1 * st[1] + s2 * st[2];
                    if (nr[3] == 1u) acc += x[row + d3];
                    else for (uint a3 = 0u; a3 < nr[3]; a3++) acc += x[row + a3];
                }
        y[pc.off[0] + i] = acc;
    }
}
