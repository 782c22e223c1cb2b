#version 450
// Run-time id checks, one thread per id; a bad one stores the launch index
// p[4] with atomicMin into the error word (the host re-checks that launch to
// name the index). MODE 0: ids (binding 1, i64 if p[2]) in [0, p[1]);
// 1: segment starts (s == i or s == the previous start, s in [0, i]);
// 2: (lo, hi) pairs at bindings 1 and 2 (i64 if p[2], p[3]) with
// 0 <= lo < hi <= p[1]. p[0] = count.
#include "common.glsl"
layout(std430, binding = 1) buffer I { uint ids[]; };
layout(std430, binding = 2) buffer J { uint ids2[]; };

void main() {
    uint n = uint(pc.p[0]);
    int lim = pc.p[1], w = pc.p[2], w2 = pc.p[3];
    for (uint i = gl_GlobalInvocationID.x; i < n; i += GSTRIDE) {
        int v = ID_AT(ids, pc.off[1], i, w);
        bool bad;
        if (MODE == 0) {
            bad = v < 0 || v >= lim;
        } else if (MODE == 1) {
            int prev = i > 0u ? ID_AT(ids, pc.off[1], i - 1u, w) : 0;
            bad = v < 0 || v > int(i) || (v != prev && v != int(i));
        } else {
            int hi = ID_AT(ids2, pc.off[2], i, w2);
            bad = v < 0 || hi <= v || hi > lim;
        }
        if (bad) atomicMin(err_word[0], uint(pc.p[4]));
    }
}
