#version 450
// unembed_logprobs and its gradient without the [T, V] logits, the design of
// backends/kernels/unembed.cl: one work-group of WG invocations per tile of TT
// tokens walks the vocabulary in chunks of WG words (invocation i: word v0 + i),
// the chunk's logits from KS-wide slabs of h and w staged in shared memory
// (w widened there when 16-bit), each dot summed over k in order.
// MODE 0 forward:  y[t] = z[t, tgt] - logsumexp(z[t, :]) (online per invocation, then trees)
// MODE 1 backward: y = dh [T, H] = dz w, dz = dy (onehot - exp(z - lse)), lse = z[t, tgt] - lp[t];
//                  invocation i owns columns i, i + WG, ... of dh (fixed order, no atomics)
// Bindings: 0 y, 1 h, 2 w (H16A: its dtype), 3 targets, 4 dy, 5 logprobs.
// p: 0 T, 1 H, 2 V, 7 targets are i64. Bad targets (check.comp reports them) give 0.
#include "common.glsl"
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) buffer Hb { float h[]; };
layout(std430, binding = 2) buffer Wb { float w[]; };
layout(std430, binding = 2) buffer WHb { uint wh[]; };
layout(std430, binding = 3) buffer Ib { uint ids[]; };
layout(std430, binding = 4) buffer Db { float dy[]; };
layout(std430, binding = 5) buffer Lb { float lp[]; };
#define W_AT(i) (H16A != 0 ? h16_f32(H16_BITS(wh, (i)), H16A) : w[i])

#define TT 8u
#define KS 16u
shared float hs[TT * KS];
shared float ws[WG * (KS + 1u)];
shared float gs[TT * WG];
shared float red[WG];
shared int tg[TT];
shared float dd[TT];
shared float lse[TT];

uint T, H, V, lid, t0;
float z[TT];

// z[tt] = h[t0 + tt] . w[v0 + lid] (0 past T or V); the whole group runs it
void logits(uint v0) {
    for (uint tt = 0u; tt < TT; tt++) z[tt] = 0.0;
    for (uint k0 = 0u; k0 < H; k0 += KS) {
        if (lid < TT * KS) {
            uint t = t0 + lid / KS, k = k0 + lid % KS;
            hs[lid] = t < T && k < H ? h[pc.off[1] + t * H + k] : 0.0;
        }
        for (uint e = lid; e < WG * KS; e += WG) {
            uint v = v0 + e / KS, k = k0 + e % KS;
            ws[(e / KS) * (KS + 1u) + e % KS] = v < V && k < H ? W_AT(pc.off[2] + v * H + k) : 0.0;
        }
        barrier();
        uint kn = min(KS, H - k0);
        for (uint kk = 0u; kk < kn; kk++) {
            float wv = ws[lid * (KS + 1u) + kk];
            for (uint tt = 0u; tt < TT; tt++) z[tt] += hs[tt * KS + kk] * wv;
        }
        barrier();
    }
}

float tree(float v, bool is_max) {
    red[lid] = v;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (lid < s) red[lid] = is_max ? max(red[lid], red[lid + s]) : red[lid] + red[lid + s];
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

void forward() {
    float m[TT], s[TT], zt[TT];
    for (uint tt = 0u; tt < TT; tt++) {
        m[tt] = NEG_INF;
        s[tt] = 0.0;
        zt[tt] = 0.0;
    }
    for (uint v0 = 0u; v0 < V; v0 += WG) {
        logits(v0);
        uint v = v0 + lid;
        for (uint tt = 0u; v < V && tt < TT; tt++) {
            if (z[tt] > m[tt]) {
                s[tt] = s[tt] * exp(m[tt] - z[tt]) + 1.0;
                m[tt] = z[tt];
            } else {
                s[tt] += exp(z[tt] - m[tt]);
            }
            if (int(v) == tg[tt]) zt[tt] = z[tt];
        }
    }
    for (uint tt = 0u; tt < TT; tt++) {
        float mx = tree(m[tt], true);
        float sum = tree(s[tt] * exp(m[tt] - mx), false);
        float zg = tree(zt[tt], false); // one invocation holds the target's logit, the others 0
        if (lid == 0u && t0 + tt < T) y[pc.off[0] + t0 + tt] = tg[tt] < 0 ? 0.0 : zg - (mx + log(sum));
    }
}

void backward() {
    for (uint v0 = 0u; v0 < V; v0 += WG) {
        logits(v0);
        uint v = v0 + lid;
        for (uint tt = 0u; tt < TT; tt++) {
            float g = 0.0;
            if (v < V && tg[tt] >= 0) {
                g = -dd[tt] * exp(z[tt] - lse[tt]);
                if (int(v) == tg[tt]) g += dd[tt];
            }
            gs[tt * WG + lid] = g;
        }
        barrier();
        uint vn = min(WG, V - v0);
        for (uint k = lid; k < H; k += WG) {
            float acc[TT];
            for (uint tt = 0u; tt < TT; tt++) acc[tt] = 0.0;
            for (uint r = 0u; r < vn; r++) {
                float wv = W_AT(pc.off[2] + (v0 + r) * H + k);
                for (uint tt = 0u; tt < TT; tt++) acc[tt] += gs[tt * WG + r] * wv;
            }
            for (uint tt = 0u; tt < TT && t0 + tt < T; tt++) {
                uint i = pc.off[0] + (t0 + tt) * H + k;
                y[i] = v0 == 0u ? acc[tt] : y[i] + acc[tt];
            }
        }
        barrier();
    }
}

void main() {
    T = uint(pc.p[0]);
    H = uint(pc.p[1]);
    V = uint(pc.p[2]);
    lid = gl_LocalInvocationID.x;
    for (uint tile = gl_WorkGroupID.x; tile * TT < T; tile += gl_NumWorkGroups.x) {
        t0 = tile * TT;
        if (lid < TT) {
            uint t = t0 + lid;
            int id = t < T ? ID_AT(ids, pc.off[3], t, pc.p[7]) : -1;
            if (id >= int(V)) id = -1;
            tg[lid] = id;
            float a = 0.0, d = 0.0;
            if (MODE == 1 && id >= 0) { // the target's logit, summed as logits() sums it
                for (uint k = 0u; k < H; k++) a += h[pc.off[1] + t * H + k] * W_AT(pc.off[2] + uint(id) * H + k);
                d = dy[pc.off[4] + t];
                a -= lp[pc.off[5] + t];
            }
            dd[lid] = d;
            lse[lid] = a;
        }
        barrier();
        if (MODE == 0) forward();
        else backward();
        barrier();
    }
}
