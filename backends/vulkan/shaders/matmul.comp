#version 450
// Tiled GEMM C = op(A) op(B), row-major, batched over work-group z.
// Spec constants: 0 threads (= (BM/TM)*(BN/TN)), 2..6 BM, BN, BK, TM, TN,
// 7 TA, 8 TB (transpose A / B). p: 0 M, 1 N, 2 K, 3 lda, 4 ldb, 5 ldc,
// 6 batch stride of A, 7 of B, 8 of C (elements), 9 batch count.
// H16A (spec 10): B is bf16 / f16 (a frozen weight), read as packed words and
// widened as it is loaded; every product and sum stays f32.
#include "common.glsl"
layout(constant_id = 2) const uint BM = 64;
layout(constant_id = 3) const uint BN = 64;
layout(constant_id = 4) const uint BK = 16;
layout(constant_id = 5) const uint TM = 4;
layout(constant_id = 6) const uint TN = 4;
layout(constant_id = 7) const int TA = 0;
layout(constant_id = 8) const int TB = 0;

layout(std430, binding = 0) buffer Cb { float C[]; };
layout(std430, binding = 1) buffer Ab { float A[]; };
layout(std430, binding = 2) buffer Bb { float B[]; };
layout(std430, binding = 2) buffer BHb { uint BH[]; };
#define B_AT(i) (H16A != 0 ? h16_f32(H16_BITS(BH, i), H16A) : B[i])

shared float As[BK * BM];
shared float Bs[BK * BN];

// MODE 1: no shared memory or barriers, one output per thread (grid-stride
// over M*N, batch over z): for matrix-vector products and for devices like
// lavapipe where work-group barriers cost more than the reuse they buy.
void simple() {
    uint M = uint(pc.p[0]), N = uint(pc.p[1]), K = uint(pc.p[2]);
    uint lda = uint(pc.p[3]), ldb = uint(pc.p[4]), ldc = uint(pc.p[5]);
    for (uint bz = gl_WorkGroupID.z; bz < uint(pc.p[9]); bz += gl_NumWorkGroups.z) {
        uint abase = pc.off[1] + bz * uint(pc.p[6]);
        uint bbase = pc.off[2] + bz * uint(pc.p[7]);
        uint cbase = pc.off[0] + bz * uint(pc.p[8]);
        for (uint i = gl_GlobalInvocationID.x; i < M * N; i += GSTRIDE) {
            uint m = i / N, n = i % N;
            float acc = 0.0;
            uint ai = TA != 0 ? abase + m : abase + m * lda, as = TA != 0 ? lda : 1u;
            uint bi = TB != 0 ? bbase + n * ldb : bbase + n, bs = TB != 0 ? 1u : ldb;
            for (uint k = 0u; k < K; k++) acc = fma(A[ai + k * as], B_AT(bi + k * bs), acc);
            C[cbase + m * ldc + n] = acc;
        }
    }
}

void main() {
    if (MODE == 1) {
        simple();
        return;
    }
    uint M = uint(pc.p[0]), N = uint(pc.p[1]), K = uint(pc.p[2]);
    uint lda = uint(pc.p[3]), ldb = uint(pc.p[4]), ldc = uint(pc.p[5]);
    uint lid = gl_LocalInvocationID.x;
    uint tr = lid / (BN / TN), tc = lid % (BN / TN);
    uint n0 = gl_WorkGroupID.x * BN;
    for (uint bz = gl_WorkGroupID.z; bz < uint(pc.p[9]); bz += gl_NumWorkGroups.z)
    for (uint m0 = gl_WorkGroupID.y * BM; m0 < M; m0 += gl_NumWorkGroups.y * BM) {
        uint abase = pc.off[1] + bz * uint(pc.p[6]);
        uint bbase = pc.off[2] + bz * uint(pc.p[7]);
        uint cbase = pc.off[0] + bz * uint(pc.p[8]);
        float acc[TM * TN];
        for (uint i = 0u; i < TM * TN; i++) acc[i] = 0.0;
        for (uint k0 = 0u; k0 < K; k0 += BK) {
            for (uint i = lid; i < BK * BM; i += WG) {
                uint kk, mm;
                if (TA != 0) { kk = i / BM; mm = i % BM; } else { mm = i / BK; kk = i % BK; }
                uint m = m0 + mm, k = k0 + kk;
                float v = 0.0;
                if (m < M && k < K) v = TA != 0 ? A[abase + k * lda + m] : A[abase + m * lda + k];
                As[kk * BM + mm] = v;
            }
            for (uint i = lid; i < BK * BN; i += WG) {
                uint kk, nn;
                if (TB != 0) { nn = i / BK; kk = i % BK; } else { kk = i / BN; nn = i % BN; }
                uint n = n0 + nn, k = k0 + kk;
                float v = 0.0;
                if (n < N && k < K) v = TB != 0 ? B_AT(bbase + n * ldb + k) : B_AT(bbase + k * ldb + n);
                Bs[kk * BN + nn] = v;
            }
            barrier();
            for (uint kk = 0u; kk < BK; kk++) {
                float a[TM], b[TN];
                for (uint r = 0u; r < TM; r++) a[r] = As[kk * BM + tr * TM + r];
                for (uint c = 0u; c < TN; c++) b[c] = Bs[kk * BN + tc * TN + c];
                for (uint r = 0u; r < TM; r++)
                    for (uint c = 0u; c < TN; c++) acc[r * TN + c] = fma(a[r], b[c], acc[r * TN + c]);
            }
            barrier();
        }
        for (uint r = 0u; r < TM; r++) {
            uint m = m0 + tr * TM + r;
            if (m >= M) continue;
            for (uint c = 0u; c < TN; c++) {
                uint n = n0 + tc * TN + c;
                if (n < N) C[cbase + m * ldc + n] = acc[r * TN + c];
            }
        }
    }
}
