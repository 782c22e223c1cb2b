#version 450
// Row-indexed ops (ids at binding 2 are i64 when p[7] != 0; bad ids were
// flagged by check.comp and are skipped here).
// MODE 0 get_rows:      y[t, d] = tab[id[t], d]; p: 0 T, 1 D, 2 V.
// MODE 1 get_rows_back: per column d, y[id[t], d] += dy[t, d] in token order
//                       (y zeroed by copy.comp first); p: 0 T, 1 D, 2 V.
// MODE 2 kv_write:      cache[rows[t], e] = x[t, e]; p: 0 T, 1 row, 2 R
//                       (binding 0 = the cache, binding 1 = x).
// MODE 3 lora_gather:   y[t, n] = sum_k w[slot[t], n, k] x[t, k]; p: 0 T, 1 N,
//                       2 S, 3 K (binding 1 = x, 3 = w).
// MODE 4 lora_gather_back: y[s, n, k] = sum over t with slot[t] = s, in token
//                       order, of dy[t, n] x[t, k]; p as MODE 3 (binding 3 = dy).
#include "common.glsl"
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) buffer X { float x[]; };
layout(std430, binding = 2) buffer I { uint ids[]; };
layout(std430, binding = 3) buffer W { float w[]; };

void main() {
    uint T = uint(pc.p[0]), D = uint(pc.p[1]);
    int lim = pc.p[2], w64 = pc.p[7];
    if (MODE == 1) {
        for (uint d = gl_GlobalInvocationID.x; d < D; d += GSTRIDE) {
            for (uint t = 0u; t < T; t++) {
                int id = ID_AT(ids, pc.off[2], t, w64);
                if (id >= 0 && id < lim) y[pc.off[0] + uint(id) * D + d] += x[pc.off[1] + t * D + d];
            }
        }
        return;
    }
    if (MODE == 4) {
        uint K = uint(pc.p[3]), S = uint(lim), total = S * D * K;
        for (uint i = gl_GlobalInvocationID.x; i < total; i += GSTRIDE) {
            uint s = i / (D * K), nn = (i / K) % D, k = i % K;
            float acc = 0.0;
            for (uint t = 0u; t < T; t++)
                if (ID_AT(ids, pc.off[2], t, w64) == int(s)) acc = fma(w[pc.off[3] + t * D + nn], x[pc.off[1] + t * K + k], acc);
            y[pc.off[0] + i] = acc;
        }
        return;
    }
    uint n = T * D;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += GSTRIDE) {
        uint t = i / D, d = i % D;
        int id = ID_AT(ids, pc.off[2], t, w64);
        bool ok = id >= 0 && id < lim;
        if (MODE == 0) {
            y[pc.off[0] + i] = ok ? x[pc.off[1] + uint(id) * D + d] : 0.0;
        } else if (MODE == 2) {
            if (ok) y[pc.off[0] + uint(id) * D + d] = x[pc.off[1] + i];
        } else {
            uint K = uint(pc.p[3]);
            float s = 0.0;
            if (ok) {
                uint wb = pc.off[3] + (uint(id) * D + d) * K, xb = pc.off[1] + t * K;
                for (uint k = 0u; k < K; k++) s = fma(w[wb + k], x[xb + k], s);
            }
            y[pc.off[0] + i] = s;
        }
    }
}
