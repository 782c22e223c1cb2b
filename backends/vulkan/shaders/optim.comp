#version 450
// The optimizer step (train/optim.c is the reference). MODE 0: acc += g
// (binding 0 the accumulator, 1 g); 1: sums of squares of p[1] slices of x
// (binding 1, p[0] elements) as (hi, lo) pairs, one work-group per slice;
// 2: (norm, clip coefficient) from the pairs (binding 1, p[1] of them) and
// hyper (binding 2); 3: AdamW of w (binding 0) with g, m, v, hyper, norm
// (bindings 1-5): w, m, v updated in place, g zeroed, nothing when the norm
// is not finite; 4: MODE 2 as one work-group folding the pairs in a
// compensated tree (the wide norm's last stage; MODE 1 and 2 are the older
// kernels, TWK_REDUCE_NARROW=1). hyper is ops.h's twk_hyper vector: 0 clip, 1 beta1,
// 2 beta2, 3 eps, 4 step size, 5 sqrt(1 - beta2^step), 6 decay factor.
#include "common.glsl"
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) buffer G { float g[]; };
layout(std430, binding = 2) buffer M { float m[]; };
layout(std430, binding = 3) buffer V { float v[]; };
layout(std430, binding = 4) buffer H { float h[]; };
layout(std430, binding = 5) buffer N { float nc[]; };
shared float red_hi[WG];
shared float red_lo[WG];

void two_sum(inout float hi, inout float lo, float x) {
    precise float s = hi + x;
    precise float bb = s - hi;
    precise float err = (hi - (s - bb)) + (x - bb);
    hi = s;
    lo += err;
}

// slice p of n elements over `parts`: [p q + min(p, r), ...) with q = n / parts, r = n % parts
uint slice_start(uint p, uint n, uint parts) { return p * (n / parts) + min(p, n % parts); }

void main() {
    uint n = uint(pc.p[0]), lid = gl_LocalInvocationID.x;
    if (MODE == 0) {
        for (uint i = gl_GlobalInvocationID.x; i < n; i += GSTRIDE) y[pc.off[0] + i] += g[pc.off[1] + i];
    } else if (MODE == 1) {
        uint parts = uint(pc.p[1]), p = gl_WorkGroupID.x;
        uint b = slice_start(p, n, parts), e = slice_start(p + 1u, n, parts);
        float hi = 0.0, lo = 0.0;
        for (uint i = b + lid; i < e; i += WG) {
            float x = g[pc.off[1] + i];
            precise float sq = x * x;
            lo += fma(x, x, -sq); // the square's rounding error
            two_sum(hi, lo, sq);
        }
        red_hi[lid] = hi;
        red_lo[lid] = lo;
        barrier();
        for (uint s = WG / 2u; s > 0u; s >>= 1) {
            if (lid < s) {
                float a = red_hi[lid], l = red_lo[lid] + red_lo[lid + s];
                two_sum(a, l, red_hi[lid + s]);
                red_hi[lid] = a;
                red_lo[lid] = l;
            }
            barrier();
        }
        if (lid == 0u) {
            y[pc.off[0] + 2u * p] = red_hi[0];
            y[pc.off[0] + 2u * p + 1u] = red_lo[0];
        }
    } else if (MODE == 2 || MODE == 4) {
        float hi = 0.0, lo = 0.0;
        if (MODE == 4) {
            for (uint p = lid; p < uint(pc.p[1]); p += WG) {
                two_sum(hi, lo, g[pc.off[1] + 2u * p]);
                lo += g[pc.off[1] + 2u * p + 1u];
            }
            red_hi[lid] = hi;
            red_lo[lid] = lo;
            barrier();
            for (uint s = WG / 2u; s > 0u; s >>= 1) {
                if (lid < s) {
                    float a = red_hi[lid], l = red_lo[lid] + red_lo[lid + s];
                    two_sum(a, l, red_hi[lid + s]);
                    red_hi[lid] = a;
                    red_lo[lid] = l;
                }
                barrier();
            }
            hi = red_hi[0];
            lo = red_lo[0];
        }
        if (gl_GlobalInvocationID.x != 0u) return;
        for (uint p = 0u; MODE == 2 && p < uint(pc.p[1]); p++) {
            two_sum(hi, lo, g[pc.off[1] + 2u * p]);
            lo += g[pc.off[1] + 2u * p + 1u];
        }
        precise float total = hi + lo;
        float norm = sqrt(total), max_norm = m[pc.off[2]], clip = 1.0;
        if (max_norm > 0.0) {
            float coef = max_norm / (norm + 1e-6);
            if (coef < 1.0) clip = coef;
        }
        y[pc.off[0]] = norm;
        y[pc.off[0] + 1u] = clip;
    } else {
        float norm = nc[pc.off[5]];
        if (isnan(norm) || isinf(norm)) return;
        uint ho = pc.off[4];
        float b1 = h[ho + 1u], b2 = h[ho + 2u], eps = h[ho + 3u], step_size = h[ho + 4u], c2_sqrt = h[ho + 5u];
        float decay = h[ho + 6u], clip = nc[pc.off[5] + 1u];
        for (uint i = gl_GlobalInvocationID.x; i < n; i += GSTRIDE) {
            float gr = g[pc.off[1] + i] * clip;
            float mi = b1 * m[pc.off[2] + i] + (1.0 - b1) * gr;
            float vi = b2 * v[pc.off[3] + i] + (1.0 - b2) * gr * gr;
            float wi = y[pc.off[0] + i] * decay;
            y[pc.off[0] + i] = wi - step_size * mi / (sqrt(vi) / c2_sqrt + eps);
            m[pc.off[2] + i] = mi;
            v[pc.off[3] + i] = vi;
            g[pc.off[1] + i] = 0.0;
        }
    }
}
