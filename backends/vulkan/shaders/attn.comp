#version 450
// Attention forward, one work-group per (query t, head h): keys in chunks of
// WG (one key per thread), online softmax with fixed-tree reductions, each
// thread owning output dims d = lid, lid + WG, ... (accumulated in y).
// MODE 0 attn:       keys [seg[t], t]; y = o [T, Hq, D]
// MODE 1 attn_lse:   keys [seg[t], t]; y = lse [T, Hq]
// MODE 2 attn_cache: keys [lo[t], hi[t]) of kc, vc [R, Hkv, D]; y = o
// MODE 3 attn_cache split-K (backends/kernels/attn_split.cl's scheme): work-group z = piece s of
//        S = p[9] of the key range (cs = max(256, ceil(len / S) rounded up to 64) keys each);
//        y = the partials [T, Hq, S, D + 2] (m, l, acc unnormalized) in the plan scratch
// MODE 4 the merge of MODE 3's partials (binding 1) into o, one invocation per element, pieces
//        in order: o = (sum acc_s w_s) * (1 / sum l_s w_s), w_s = exp(m_s - M), 1 when m_s = M,
//        empty pieces skipped (a range within one piece gives MODE 2's bits)
// Bindings: 0 y, 1 q (MODE 4: the partials), 2 k, 3 v, 4 seg/lo, 5 hi. p: 0 T, 1 Hq, 2 Hkv, 3 D,
// 4 key rows (T or R), 6 i64 seg/lo, 7 i64 hi, 9 S (MODE 3 / 4), 8 sliding window (0: none; the
// last p[8] keys of the range); f[0] scale, f[1] soft-cap (0: none; scores
// become cap * tanh(s / cap)).
// H16A, H16B (spec 10, 11): attn_cache's K / V caches are bf16 / f16, read as
// packed words and widened (common.glsl).
#include "common.glsl"
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) buffer Q { float q[]; };
layout(std430, binding = 2) buffer K { float k[]; };
layout(std430, binding = 3) buffer V { float v[]; };
layout(std430, binding = 2) buffer KH { uint kh[]; };
layout(std430, binding = 3) buffer VH { uint vh[]; };
#define K_AT(i) (H16A != 0 ? h16_f32(H16_BITS(kh, i), H16A) : k[i])
#define V_AT(i) (H16B != 0 ? h16_f32(H16_BITS(vh, i), H16B) : v[i])
layout(std430, binding = 4) buffer S { uint seg[]; };
layout(std430, binding = 5) buffer H { uint hiv[]; };
shared float red[WG];
shared float pj[WG];

void main() {
    uint T = uint(pc.p[0]), Hq = uint(pc.p[1]), Hkv = uint(pc.p[2]), D = uint(pc.p[3]);
    int rows = pc.p[4];
    uint group = Hq / Hkv, lid = gl_LocalInvocationID.x;
    float scale = pc.f[0], cap = pc.f[1];
    int window = pc.p[8];
    if (MODE == 4) {
        uint S = uint(pc.p[9]), W = D + 2u;
        for (uint g = gl_GlobalInvocationID.x; g < T * Hq * D; g += GSTRIDE) {
            uint r = g / D, d = g % D, pb = pc.off[1] + r * S * W;
            float M = NEG_INF, ls = 0.0, a = 0.0;
            for (uint sp = 0u; sp < S; sp++)
                if (q[pb + sp * W + 1u] > 0.0) M = max(M, q[pb + sp * W]);
            for (uint sp = 0u; sp < S; sp++) {
                float l = q[pb + sp * W + 1u], m = q[pb + sp * W];
                if (!(l > 0.0)) continue;
                float w = m == M ? 1.0 : exp(m - M);
                ls = fma(l, w, ls);
                a = fma(q[pb + sp * W + 2u + d], w, a);
            }
            y[pc.off[0] + g] = ls > 0.0 ? a * (1.0 / ls) : 0.0;
        }
        return;
    }
    uint h = gl_WorkGroupID.x, hk = h / group;
    for (uint t = gl_WorkGroupID.y; t < T; t += gl_NumWorkGroups.y) {
        int lo, hi;
        if (MODE >= 2) {
            lo = max(ID_AT(seg, pc.off[4], t, pc.p[6]), 0);
            hi = min(ID_AT(hiv, pc.off[5], t, pc.p[7]), rows);
        } else {
            lo = clamp(ID_AT(seg, pc.off[4], t, pc.p[6]), 0, int(t));
            hi = int(t) + 1;
        }
        if (window > 0) lo = max(lo, hi - window);
        uint qb = pc.off[1] + (t * Hq + h) * D, ob = pc.off[0] + (t * Hq + h) * D;
        if (MODE == 3) { // piece z of the range; the partial's acc after its m and l
            int S = pc.p[9], len = max(hi - lo, 0), cs = (len + S - 1) / S;
            cs = max((cs + 63) / 64 * 64, 256);
            int a0 = lo + int(gl_WorkGroupID.z) * cs;
            hi = min(hi, a0 + cs);
            lo = a0;
            ob = pc.off[0] + ((t * Hq + h) * uint(S) + gl_WorkGroupID.z) * (D + 2u) + 2u;
        }
        if (MODE != 1)
            for (uint d = lid; d < D; d += WG) y[ob + d] = 0.0;
        float m = NEG_INF, l = 0.0;
        for (int j0 = lo; j0 < hi; j0 += int(WG)) {
            int j = j0 + int(lid);
            float s = NEG_INF;
            if (j < hi) {
                uint kb = pc.off[2] + (uint(j) * Hkv + hk) * D;
                float acc = 0.0;
                for (uint d = 0u; d < D; d++) acc = fma(q[qb + d], K_AT(kb + d), acc);
                s = acc * scale;
                if (cap > 0.0) s = cap * tanh(s / cap);
            }
            red[lid] = s;
            barrier();
            for (uint st = WG / 2u; st > 0u; st >>= 1) {
                if (lid < st) red[lid] = max(red[lid], red[lid + st]);
                barrier();
            }
            float mn = max(m, red[0]);
            barrier();
            float p = j < hi ? exp(s - mn) : 0.0;
            pj[lid] = p;
            red[lid] = p;
            barrier();
            for (uint st = WG / 2u; st > 0u; st >>= 1) {
                if (lid < st) red[lid] += red[lid + st];
                barrier();
            }
            float alpha = exp(m - mn);
            l = l * alpha + red[0];
            if (MODE != 1) {
                uint nk = uint(min(int(WG), hi - j0));
                for (uint d = lid; d < D; d += WG) {
                    float acc = y[ob + d] * alpha;
                    for (uint jj = 0u; jj < nk; jj++)
                        acc = fma(pj[jj], V_AT(pc.off[3] + ((uint(j0) + jj) * Hkv + hk) * D + d), acc);
                    y[ob + d] = acc;
                }
            }
            m = mn;
            barrier();
        }
        if (MODE == 1) {
            if (lid == 0u) y[pc.off[0] + t * Hq + h] = m + log(l);
        } else if (MODE == 3) {
            if (lid == 0u) {
                y[ob - 2u] = m;
                y[ob - 1u] = l;
            }
        } else if (l > 0.0) {
            float inv = 1.0 / l;
            for (uint d = lid; d < D; d += WG) y[ob + d] *= inv;
        }
    }
}
