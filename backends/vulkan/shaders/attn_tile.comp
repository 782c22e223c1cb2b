#version 450
// Tiled training attention (ATTN, ATTN_LSE, ATTN_BACK), FlashAttention-2's scheme, the design of
// backends/kernels/attn_tile.cl: causal within packed segments (token i sees keys seg[i]..i, with
// a sliding window the last p[8] of them), grouped-query heads, scores scale * q.k soft-capped
// to cap * tanh(s / cap) where cap > 0. Tiles of B queries and B keys sit in shared memory; no
// [T x T] array exists anywhere. The backward recomputes P = exp(s - lse) tile by tile from the
// saved log-sum-exp, with delta = rowsum(dO * o) computed first (MODE 2, into the plan scratch).
//
// Every output element is one chain of operations over its keys (forward, dQ) or (head, query)
// pairs (dK, dV) in ascending order, masked and zero terms skipped, and the forward's running
// max moves key by key (one invocation walks a query's keys in order and records the rescale
// factor each key brings, 1 when the max stays): a row's bits do not depend on its tile, on B
// or on what is packed beside it. Masked keys never reach exp().
//
// MODE 0 o [T, Hq, D], 1 lse [T, Hq] (one work-group per tile of B queries and head);
// MODE 2 delta [T, Hq] = rowsum(dO * o) (one invocation per row; o at binding 1, dO at 5);
// MODE 3 dQ (per query tile and head, keys in tiles); MODE 4 dK, 5 dV (per key tile and kv head,
// the group's heads and the query tiles that see it).
// Bindings: 0 y, 1 q, 2 k, 3 v, 4 seg, 5 dO, 6 lse, 7 delta (the plan scratch).
// p: 0 T, 1 Hq, 2 Hkv, 3 D, 4 B, 6 i64 seg, 8 window (0: none); f[0] scale, f[1] soft-cap.
// Spec 10 / 11 / 12 (H16A, H16B, H16C): the dtype of q / k / v (0 f32, 1 bf16, 2 f16: read as
// packed words at the same binding and widened as a tile is staged, common.glsl; all else is
// f32, so a 16-bit operand gives the bits of the f32 one holding its widened values).
// Spec 2: SM, the shared floats (>= 2 B D + 2 B B forward, 4 B D + B B backward; vk_lower_attn.c
// picks B from the head size and the device's shared memory). WG = 64.
#include "common.glsl"
layout(constant_id = 2) const int SM = 4096;
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer Q { float q[]; };
layout(std430, binding = 2) readonly buffer K { float k[]; };
layout(std430, binding = 3) readonly buffer V { float v[]; };
layout(std430, binding = 1) readonly buffer QH { uint qh[]; };
layout(std430, binding = 2) readonly buffer KH { uint kh[]; };
layout(std430, binding = 3) readonly buffer VH { uint vh[]; };
layout(constant_id = 12) const int H16C = 0;
#define Q_AT(i) (H16A != 0 ? h16_f32(H16_BITS(qh, i), H16A) : q[i])
#define K_AT(i) (H16B != 0 ? h16_f32(H16_BITS(kh, i), H16B) : k[i])
#define V_AT(i) (H16C != 0 ? h16_f32(H16_BITS(vh, i), H16C) : v[i])
#define DO_AT(i) dO[i]
layout(std430, binding = 4) readonly buffer S { uint seg[]; };
layout(std430, binding = 5) readonly buffer DO { float dO[]; };
layout(std430, binding = 6) readonly buffer L { float lse[]; };
layout(std430, binding = 7) readonly buffer DL { float delta[]; };

#define MAXB 32
#define ACC_F 64 // accumulators per invocation: B * D <= 4096 forward
#define ACC_B 32 // B * D <= 2048 backward
shared float sm[SM];
shared int fst[MAXB];
shared float rl[MAXB];
shared float rd[MAXB];

uint T, Hq, Hkv, D, B, lid;
float scale, cap;
int window;

// First key of query i (seg[i], or the window's start, wn > 0), or -1 when seg is malformed at i.
int first_key(uint i, int wn) {
    int s = ID_AT(seg, pc.off[4], i, pc.p[6]), prev = i > 0u ? ID_AT(seg, pc.off[4], i - 1u, pc.p[6]) : 0;
    if (s < 0 || s > int(i) || (s != prev && s != int(i))) return -1;
    return wn > 0 && int(i) + 1 - wn > s ? int(i) + 1 - wn : s;
}

float capped(float s) { return cap > 0.0 ? cap * tanh(s / cap) : s; }
float capped_d(float sc) { return cap > 0.0 ? 1.0 - (sc / cap) * (sc / cap) : 1.0; }

// a . b over D floats of shared memory, d in ascending order
float sdot(uint a, uint b) {
    float s = 0.0;
    for (uint d = 0u; d < D; d++) s = fma(sm[a + d], sm[b + d], s);
    return s;
}

// rows [r0, r0 + B) of a [T, H, D] tensor at head h (element i: AT(i), widened) into sm[dst..]
// as [B, D] (zeros past T)
#define LOAD(dst, AT, boff, r0, H, h)                                               \
    for (uint e_ = lid; e_ < B * D; e_ += WG) {                                     \
        uint r_ = e_ / D, t_ = (r0) + r_;                                           \
        sm[(dst) + e_] = t_ < T ? AT((boff) + (t_ * (H) + (h)) * D + e_ % D) : 0.0; \
    }

void forward() {
    uint nt = (T + B - 1u) / B, grp = Hq / Hkv;
    uint qs = 0u, kv = B * D, ps = 2u * B * D, as_ = ps + B * B;
    uint nx = (B * D - lid + WG - 1u) / WG; // the accumulators this invocation owns
    for (uint g = gl_WorkGroupID.x; g < nt * Hq; g += gl_NumWorkGroups.x) {
        uint i0 = (g % nt) * B, h = g / nt, hk = h / grp;
        barrier();
        if (lid < B) {
            uint i = i0 + lid;
            int f = i < T ? first_key(i, window) : int(i);
            fst[lid] = f < 0 ? int(i) + 1 : f; // malformed (check.comp names it): no keys, zeros
        }
        LOAD(qs, Q_AT, pc.off[1], i0, Hq, h)
        barrier();
        uint iend = min(i0 + B, T);
        int c_lo = fst[0];
        for (uint r = 1u; r < iend - i0; r++) c_lo = min(c_lo, fst[r]);
        float acc[ACC_F];
        for (int x = 0; x < ACC_F; x++) acc[x] = 0.0;
        float m = NEG_INF, l = 0.0; // invocation lid < B: query i0 + lid's running max and sum
        for (uint c0 = uint(c_lo); c0 < iend; c0 += B) {
            LOAD(kv, K_AT, pc.off[2], c0, Hkv, hk)
            barrier();
            for (uint e = lid; e < B * B; e += WG) {
                uint r = e / B, c = e % B, i = i0 + r, j = c0 + c;
                if (i < iend && int(j) >= fst[r] && j <= i) sm[ps + e] = capped(sdot(qs + r * D, kv + c * D) * scale);
            }
            barrier();
            if (MODE == 0) LOAD(kv, V_AT, pc.off[3], c0, Hkv, hk)
            barrier();
            if (lid < B) { // query i0 + lid walks the tile's keys in order
                uint i = i0 + lid;
                for (uint c = 0u; c < B; c++) {
                    uint j = c0 + c, e = lid * B + c;
                    if (i >= iend || int(j) < fst[lid] || j > i) {
                        sm[ps + e] = 0.0;
                        sm[as_ + e] = 1.0;
                        continue;
                    }
                    float s = sm[ps + e], a = 1.0;
                    if (s > m) {
                        a = exp(m - s); // m is finite (NEG_INF is -FLT_MAX): never inf - inf
                        m = s;
                    }
                    float p = exp(s - m);
                    l = l * a + p;
                    sm[ps + e] = p;
                    sm[as_ + e] = a;
                }
            }
            barrier();
            if (MODE == 0)
                for (int x = 0; x < ACC_F; x++) {
                    if (uint(x) >= nx) break;
                    uint e = lid + uint(x) * WG, r = e / D, d = e % D;
                    float a_ = acc[x];
                    for (uint c = 0u; c < B; c++) {
                        float a = sm[as_ + r * B + c], p = sm[ps + r * B + c];
                        if (a != 1.0) a_ *= a;
                        if (p != 0.0) a_ = fma(p, sm[kv + c * D + d], a_);
                    }
                    acc[x] = a_;
                }
            barrier();
        }
        if (lid < B) { // each row's 1 / l through shared memory to the invocations that own its dims
            sm[ps + lid] = l > 0.0 ? 1.0 / l : 0.0;
            if (MODE == 1 && i0 + lid < T) y[pc.off[0] + (i0 + lid) * Hq + h] = l > 0.0 ? m + log(l) : 0.0;
        }
        barrier();
        if (MODE == 0)
            for (int x = 0; x < ACC_F; x++) {
                if (uint(x) >= nx) break;
                uint e = lid + uint(x) * WG, r = e / D, d = e % D;
                if (i0 + r < T) y[pc.off[0] + ((i0 + r) * Hq + h) * D + d] = acc[x] * sm[ps + r];
            }
    }
}

void delta_rows() {
    for (uint g = gl_GlobalInvocationID.x; g < T * Hq; g += GSTRIDE) {
        float s = 0.0;
        for (uint d = 0u; d < D; d++) s = fma(dO[pc.off[5] + g * D + d], q[pc.off[1] + g * D + d], s);
        y[pc.off[0] + g] = s;
    }
}

void back_q() {
    uint nt = (T + B - 1u) / B, grp = Hq / Hkv;
    uint qs = 0u, gs = B * D, ks = 2u * B * D, vs = 3u * B * D, ds = 4u * B * D;
    uint nx = (B * D - lid + WG - 1u) / WG;
    for (uint g = gl_WorkGroupID.x; g < nt * Hq; g += gl_NumWorkGroups.x) {
        uint i0 = (g % nt) * B, h = g / nt, hk = h / grp;
        barrier();
        if (lid < B) {
            uint i = i0 + lid;
            int f = i < T ? first_key(i, window) : int(i);
            fst[lid] = f < 0 ? int(i) + 1 : f;
            rl[lid] = i < T ? lse[pc.off[6] + i * Hq + h] : 0.0;
            rd[lid] = i < T ? delta[pc.off[7] + i * Hq + h] : 0.0;
        }
        LOAD(qs, Q_AT, pc.off[1], i0, Hq, h)
        LOAD(gs, DO_AT, pc.off[5], i0, Hq, h)
        barrier();
        uint iend = min(i0 + B, T);
        int c_lo = fst[0];
        for (uint r = 1u; r < iend - i0; r++) c_lo = min(c_lo, fst[r]);
        float acc[ACC_B];
        for (int x = 0; x < ACC_B; x++) acc[x] = 0.0;
        for (uint c0 = uint(c_lo); c0 < iend; c0 += B) {
            LOAD(ks, K_AT, pc.off[2], c0, Hkv, hk)
            LOAD(vs, V_AT, pc.off[3], c0, Hkv, hk)
            barrier();
            for (uint e = lid; e < B * B; e += WG) {
                uint r = e / B, c = e % B, i = i0 + r, j = c0 + c;
                float gr = 0.0;
                if (i < iend && int(j) >= fst[r] && j <= i) {
                    float sc = capped(sdot(qs + r * D, ks + c * D) * scale), dp = sdot(gs + r * D, vs + c * D);
                    gr = exp(sc - rl[r]) * (dp - rd[r]) * capped_d(sc) * scale;
                }
                sm[ds + e] = gr;
            }
            barrier();
            for (int x = 0; x < ACC_B; x++) {
                if (uint(x) >= nx) break;
                uint e = lid + uint(x) * WG, r = e / D, d = e % D;
                float a_ = acc[x];
                for (uint c = 0u; c < B; c++) {
                    float gr = sm[ds + r * B + c];
                    if (gr != 0.0) a_ = fma(gr, sm[ks + c * D + d], a_);
                }
                acc[x] = a_;
            }
            barrier();
        }
        for (int x = 0; x < ACC_B; x++) {
            if (uint(x) >= nx) break;
            uint e = lid + uint(x) * WG, r = e / D, d = e % D;
            if (i0 + r < T) y[pc.off[0] + ((i0 + r) * Hq + h) * D + d] = acc[x];
        }
    }
}

void back_kv() {
    uint nt = (T + B - 1u) / B, grp = Hq / Hkv;
    uint ks = 0u, vs = B * D, qs = 2u * B * D, gs = 3u * B * D, cs = 4u * B * D, xs = MODE == 5 ? gs : qs;
    uint nx = (B * D - lid + WG - 1u) / WG;
    for (uint g = gl_WorkGroupID.x; g < nt * Hkv; g += gl_NumWorkGroups.x) {
        uint c0 = (g % nt) * B, hk = g / nt, cend = min(c0 + B, T), jl = cend - 1u;
        barrier();
        LOAD(ks, K_AT, pc.off[2], c0, Hkv, hk)
        if (MODE == 4) LOAD(vs, V_AT, pc.off[3], c0, Hkv, hk)
        float acc[ACC_B];
        for (int x = 0; x < ACC_B; x++) acc[x] = 0.0;
        for (uint h = hk * grp; h < (hk + 1u) * grp; h++) {
            // query tiles from the first key on, while a query can still see the tile's last key
            for (uint i0 = c0; i0 < T && ID_AT(seg, pc.off[4], i0, pc.p[6]) <= int(jl) &&
                               (window <= 0 || i0 < jl + uint(window));
                 i0 += B) {
                barrier();
                if (lid < B) {
                    uint i = i0 + lid;
                    int f = i < T ? first_key(i, window) : int(i) + 1;
                    fst[lid] = f < 0 ? int(i) + 1 : f;
                    rl[lid] = i < T ? lse[pc.off[6] + i * Hq + h] : 0.0;
                    rd[lid] = i < T && MODE == 4 ? delta[pc.off[7] + i * Hq + h] : 0.0;
                }
                LOAD(qs, Q_AT, pc.off[1], i0, Hq, h)
                LOAD(gs, DO_AT, pc.off[5], i0, Hq, h)
                barrier();
                for (uint e = lid; e < B * B; e += WG) {
                    uint r = e / B, c = e % B, i = i0 + r, j = c0 + c;
                    float cf = 0.0;
                    if (i < T && j < cend && int(j) >= fst[r] && j <= i) {
                        float sc = capped(sdot(qs + r * D, ks + c * D) * scale), p = exp(sc - rl[r]);
                        if (MODE == 5) cf = p;
                        else cf = p * (sdot(gs + r * D, vs + c * D) - rd[r]) * capped_d(sc) * scale;
                    }
                    sm[cs + e] = cf;
                }
                barrier();
                for (int x = 0; x < ACC_B; x++) {
                    if (uint(x) >= nx) break;
                    uint e = lid + uint(x) * WG, c = e / D, d = e % D;
                    float a_ = acc[x];
                    for (uint r = 0u; r < B; r++) {
                        float gr = sm[cs + r * B + c];
                        if (gr != 0.0) a_ = fma(gr, sm[xs + r * D + d], a_);
                    }
                    acc[x] = a_;
                }
            }
        }
        for (int x = 0; x < ACC_B; x++) {
            if (uint(x) >= nx) break;
            uint e = lid + uint(x) * WG, c = e / D, d = e % D;
            if (c0 + c < T) y[pc.off[0] + ((c0 + c) * Hkv + hk) * D + d] = acc[x];
        }
    }
}

void main() {
    T = uint(pc.p[0]);
    Hq = uint(pc.p[1]);
    Hkv = uint(pc.p[2]);
    D = uint(pc.p[3]);
    B = uint(pc.p[4]);
    window = pc.p[8];
    scale = pc.f[0];
    cap = pc.f[1];
    lid = gl_LocalInvocationID.x;
    if (MODE <= 1) forward();
    else if (MODE == 2) delta_rows();
    else if (MODE == 3) back_q();
    else back_kv();
}
