#version 450
// Row-indexed ops (ids at binding 2 are i64 when p[7] != 0; bad ids were
// flagged by check.comp and are skipped here).
// MODE 0 get_rows:      y[t, d] = tab[id[t], d]; p: 0 T, 1 D, 2 V.
// MODE 1 get_rows_back: per column d, y[id[t], d] += dy[t, d] in token order
//                       (y zeroed by copy.comp first); p: 0 T, 1 D, 2 V.
// MODE 2 kv_write:      cache[rows[t], e] = x[t, e]; p: 0 T, 1 row, 2 R
//                       (binding 0 = the cache, binding 1 = x).
// MODE 3 lora_gather:   y[t, n] = sum_k w[slot[t], n, k] x[t, k]; p: 0 T, 1 N,
//                       2 S, 3 K, 4 trans (w [S, K, N]: y[t, n] = sum_k
//                       w[slot[t], k, n] x[t, k]) (binding 1 = x, 3 = w).
// MODE 4 lora_gather_back: y[s, n, k] = sum over t with slot[t] = s, in token
//                       order, of dy[t, n] x[t, k]; p as MODE 3 (binding 3 = dy);
//                       one invocation per (n, k) walks the tokens once for all slots.
// H16A (spec 10): get_rows' table (binding 1), kv_write's cache (binding 0)
// or lora_gather's w (binding 3) is bf16 / f16, read or written as packed
// words (common.glsl). Each
// specialization reaches a binding through one view only.
#include "common.glsl"
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 0) buffer YH { uint yh[]; };
layout(std430, binding = 1) buffer X { float x[]; };
layout(std430, binding = 1) buffer XH { uint xh[]; };
layout(std430, binding = 2) buffer I { uint ids[]; };
layout(std430, binding = 3) buffer W { float w[]; };
layout(std430, binding = 3) buffer WH { uint wh[]; };

// kv_write into a 16-bit cache: one invocation per word a written row
// touches (row r's D halves start at half a = off[0] + r D, so it spans words
// a/2 .. (a + D - 1)/2), so no two invocations store the same word of a row;
// a word shared with a neighbouring row (odd D or offset) is updated by a
// compare-and-swap that keeps the other half. Narrowing rounds to nearest even.
void kv_write_h16(uint T, uint D, int lim, int w64) {
    uint wpr = D / 2u + 1u, n = T * wpr;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += GSTRIDE) {
        uint t = i / wpr, j = i % wpr;
        int id = ID_AT(ids, pc.off[2], t, w64);
        if (id < 0 || id >= lim) continue;
        uint a = pc.off[0] + uint(id) * D, wi = (a >> 1) + j, e0 = 2u * wi, xb = pc.off[1] + t * D;
        bool lo_in = e0 >= a && e0 < a + D, hi_in = e0 + 1u >= a && e0 + 1u < a + D;
        uint lo = lo_in ? f32_h16(x[xb + e0 - a], H16A) : 0u;
        uint hi = hi_in ? f32_h16(x[xb + e0 + 1u - a], H16A) << 16 : 0u;
        if (lo_in && hi_in) {
            yh[wi] = lo | hi;
        } else if (lo_in || hi_in) {
            uint keep = lo_in ? 0xffff0000u : 0x0000ffffu, old = yh[wi];
            for (;;) {
                uint prev = atomicCompSwap(yh[wi], old, (old & keep) | lo | hi);
                if (prev == old) break;
                old = prev;
            }
        }
    }
}

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
    if (MODE == 4) { /* one invocation per (n, k), every slot: one walk over the tokens, each slot's sum
                      * parked in y while other slots' tokens pass (the same sums, in the same order) */
        uint K = uint(pc.p[3]), S = uint(lim), total = D * K, slab = D * K;
        for (uint i = gl_GlobalInvocationID.x; i < total; i += GSTRIDE) {
            uint nn = i / K, k = i % K;
            for (uint s = 0u; s < S; s++) y[pc.off[0] + s * slab + i] = 0.0;
            int cur = -1;
            float acc = 0.0;
            for (uint t = 0u; t < T; t++) {
                int s = ID_AT(ids, pc.off[2], t, w64);
                if (s < 0 || s >= lim) continue;
                if (s != cur) {
                    if (cur >= 0) y[pc.off[0] + uint(cur) * slab + i] = acc;
                    cur = s;
                    acc = y[pc.off[0] + uint(s) * slab + i];
                }
                acc = fma(w[pc.off[3] + t * D + nn], x[pc.off[1] + t * K + k], acc);
            }
            if (cur >= 0) y[pc.off[0] + uint(cur) * slab + i] = acc;
        }
        return;
    }
    if (MODE == 2 && H16A != 0) {
        kv_write_h16(T, D, lim, w64);
        return;
    }
    uint n = T * D;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += GSTRIDE) {
        uint t = i / D, d = i % D;
        int id = ID_AT(ids, pc.off[2], t, w64);
        bool ok = id >= 0 && id < lim;
        if (MODE == 0) {
            if (H16A != 0) y[pc.off[0] + i] = ok ? h16_f32(H16_BITS(xh, pc.off[1] + uint(id) * D + d), H16A) : 0.0;
            else y[pc.off[0] + i] = ok ? x[pc.off[1] + uint(id) * D + d] : 0.0;
        } else if (MODE == 2) {
            if (ok) y[pc.off[0] + uint(id) * D + d] = x[pc.off[1] + i];
        } else {
            uint K = uint(pc.p[3]);
            float s = 0.0;
            if (ok) {
                bool tr = pc.p[4] != 0;
                uint wn = tr ? 1u : K, wk = tr ? D : 1u, wb = pc.off[3] + uint(id) * D * K + d * wn, xb = pc.off[1] + t * K;
                if (H16A != 0)
                    for (uint k = 0u; k < K; k++) s = fma(h16_f32(H16_BITS(wh, wb + k * wk), H16A), x[xb + k], s);
                else
                    for (uint k = 0u; k < K; k++) s = fma(w[wb + k * wk], x[xb + k], s);
            }
            y[pc.off[0] + i] = s;
        }
    }
}
