#version 450
// Attention backward (probabilities recomputed from the saved lse), fixed
// summation order, no atomics. Bindings: 0 y, 1 q, 2 k, 3 v, 4 seg, 5 o,
// 6 dO, 7 lse. p: 0 T, 1 Hq, 2 Hkv, 3 D, 6 i64 seg, 8 sliding window (0: none;
// query i sees key j when i - j < p[8]); f[0] scale, f[1] soft-cap (0: none).
// MODE 0 dQ: a work-group per (query t, head h) over keys [seg[t], t].
// MODE 1 dK, 2 dV: a work-group per (key j, kv head hk) over the heads of
// its group and the queries i >= j of j's segment (one query per thread).
#include "common.glsl"
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) buffer Q { float q[]; };
layout(std430, binding = 2) buffer K { float k[]; };
layout(std430, binding = 3) buffer V { float v[]; };
layout(std430, binding = 4) buffer S { uint seg[]; };
layout(std430, binding = 5) buffer O { float o[]; };
layout(std430, binding = 6) buffer DO { float dO[]; };
layout(std430, binding = 7) buffer L { float lse[]; };
shared float red[WG];
shared float cj[WG];

float dotq(uint a, uint b, uint D) { float s = 0.0; for (uint d = 0u; d < D; d++) s = fma(q[a + d], k[b + d], s); return s; }
float dotv(uint a, uint b, uint D) { float s = 0.0; for (uint d = 0u; d < D; d++) s = fma(dO[a + d], v[b + d], s); return s; }
// a capped score (cap > 0) and d capped / d raw from it
float capped(float s, float cap) { return cap > 0.0 ? cap * tanh(s / cap) : s; }
float capped_d(float sc, float cap) { return cap > 0.0 ? 1.0 - (sc / cap) * (sc / cap) : 1.0; }
float doto(uint a, uint D) { float s = 0.0; for (uint d = 0u; d < D; d++) s = fma(dO[pc.off[6] + a + d], o[pc.off[5] + a + d], s); return s; }

void main() {
    uint T = uint(pc.p[0]), Hq = uint(pc.p[1]), Hkv = uint(pc.p[2]), D = uint(pc.p[3]);
    uint group = Hq / Hkv, lid = gl_LocalInvocationID.x;
    float scale = pc.f[0], cap = pc.f[1];
    int window = pc.p[8];
    if (MODE == 0) {
        uint h = gl_WorkGroupID.x, hk = h / group;
        for (uint t = gl_WorkGroupID.y; t < T; t += gl_NumWorkGroups.y) {
            int lo = clamp(ID_AT(seg, pc.off[4], t, pc.p[6]), 0, int(t)), hi = int(t) + 1;
            if (window > 0) lo = max(lo, hi - window);
            uint row = (t * Hq + h) * D, ob = pc.off[0] + row;
            float l = lse[pc.off[7] + t * Hq + h];
            // delta = dO . o, split over threads and summed by a fixed tree
            float part = 0.0;
            for (uint d = lid; d < D; d += WG) part += dO[pc.off[6] + row + d] * o[pc.off[5] + row + d];
            red[lid] = part;
            barrier();
            for (uint st = WG / 2u; st > 0u; st >>= 1) {
                if (lid < st) red[lid] += red[lid + st];
                barrier();
            }
            float delta = red[0];
            for (uint d = lid; d < D; d += WG) y[ob + d] = 0.0;
            barrier();
            for (int j0 = lo; j0 < hi; j0 += int(WG)) {
                int j = j0 + int(lid);
                float ds = 0.0;
                if (j < hi) {
                    uint kb = (uint(j) * Hkv + hk) * D;
                    float sc = capped(dotq(pc.off[1] + row, pc.off[2] + kb, D) * scale, cap);
                    float p = exp(sc - l);
                    ds = p * (dotv(pc.off[6] + row, pc.off[3] + kb, D) - delta) * capped_d(sc, cap) * scale;
                }
                cj[lid] = ds;
                barrier();
                uint nk = uint(min(int(WG), hi - j0));
                for (uint d = lid; d < D; d += WG) {
                    float acc = y[ob + d];
                    for (uint jj = 0u; jj < nk; jj++)
                        acc = fma(cj[jj], k[pc.off[2] + ((uint(j0) + jj) * Hkv + hk) * D + d], acc);
                    y[ob + d] = acc;
                }
                barrier();
            }
        }
        return;
    }
    uint hk = gl_WorkGroupID.x;
    for (uint j = gl_WorkGroupID.y; j < T; j += gl_NumWorkGroups.y) {
        int sj = clamp(ID_AT(seg, pc.off[4], j, pc.p[6]), 0, int(j));
        uint kb = (j * Hkv + hk) * D, yb = pc.off[0] + kb;
        uint iend = window > 0 ? min(T, j + uint(window)) : T; // queries i < j + window see key j
        for (uint d = lid; d < D; d += WG) y[yb + d] = 0.0;
        for (uint g = 0u; g < group; g++) {
            uint h = hk * group + g;
            for (uint i0 = j; i0 < iend; i0 += WG) {
                if (ID_AT(seg, pc.off[4], i0, pc.p[6]) != sj) break; // past j's segment (uniform)
                uint i = i0 + lid;
                float c = 0.0;
                if (i < iend && ID_AT(seg, pc.off[4], i, pc.p[6]) == sj) {
                    uint row = (i * Hq + h) * D;
                    float sc = capped(dotq(pc.off[1] + row, pc.off[2] + kb, D) * scale, cap);
                    float p = exp(sc - lse[pc.off[7] + i * Hq + h]);
                    if (MODE == 2) c = p;
                    else c = p * (dotv(pc.off[6] + row, pc.off[3] + kb, D) - doto(row, D)) * capped_d(sc, cap) * scale;
                }
                cj[lid] = c;
                barrier();
                uint nq = min(WG, iend - i0);
                for (uint d = lid; d < D; d += WG) {
                    float acc = y[yb + d];
                    for (uint ii = 0u; ii < nq; ii++) {
                        uint r = ((i0 + ii) * Hq + h) * D + d;
                        acc = fma(cj[ii], MODE == 2 ? dO[pc.off[6] + r] : q[pc.off[1] + r], acc);
                    }
                    y[yb + d] = acc;
                }
                barrier();
            }
        }
    }
}
