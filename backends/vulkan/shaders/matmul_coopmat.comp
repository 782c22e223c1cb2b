#version 450
// GEMM C = op(A) op(B) on cooperative matrices (GL_NV_cooperative_matrix):
// fp32 A and B are read from the buffers, rounded to fp16 into shared
// memory (zero-padded past M, N, K), multiplied by subgroups on MM x MN x MK
// fp16 tiles with fp32 accumulators, staged through shared memory as fp32
// and stored with guards. Same bindings, push constants, transposes and
// batching (over work-group z) as matmul.comp. Used only under
// TWK_VULKAN_GEMM=fp16 (vk_lower.c).
// Spec constants: 0 threads (a whole number of subgroups), 2 BM, 3 BN, 4 BK
// (the work-group tile; BM a multiple of SM*MM, BN of SN*MN, BK of MK),
// 5 MM, 6 MN (the cooperative-matrix shape the device reports), 7 TA, 8 TB,
// 9 MK. p: 0 M, 1 N, 2 K, 3 lda, 4 ldb, 5 ldc, 6..8 batch strides of A, B,
// C (elements), 9 batch count. H16A (spec 10): a bf16 / f16 B read as
// packed words, as in matmul.comp (f16 reaches the fp16 tiles exactly).
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#include "common.glsl"
layout(constant_id = 2) const uint BM = 64;
layout(constant_id = 3) const uint BN = 64;
layout(constant_id = 4) const uint BK = 32;
layout(constant_id = 5) const uint MM = 16;
layout(constant_id = 6) const uint MN = 16;
layout(constant_id = 7) const int TA = 0;
layout(constant_id = 8) const int TB = 0;
layout(constant_id = 9) const uint MK = 16;

layout(std430, binding = 0) buffer Cb { float C[]; };
layout(std430, binding = 1) buffer Ab { float A[]; };
layout(std430, binding = 2) buffer Bb { float B[]; };
layout(std430, binding = 2) buffer BHb { uint BH[]; };
#define B_AT(i) (H16A != 0 ? h16_f32(H16_BITS(BH, i), H16A) : B[i])

// Each subgroup owns a block of SM x SN accumulator tiles.
const uint SM = 2;
const uint SN = 2;
const uint BLK_N = BN / (SN * MN);          // blocks across the tile
const uint NBLK = (BM / (SM * MM)) * BLK_N; // blocks in the tile
// Row strides of the shared tiles, padded to spread banks; each keeps a
// tile row start 16-byte aligned (8 halves, 4 floats), as the loads and
// stores of cooperative matrices require.
const uint LDA = BK + 8u; // As: BM rows of BK halves (row-major M x K)
const uint LDB = BN + 8u; // Bs: BK rows of BN halves (row-major K x N)
const uint LDC = BN + 4u; // Cs: BM rows of BN floats

shared float16_t As[BM * LDA];
shared float16_t Bs[BK * LDB];
shared float Cs[BM * LDC];

void main() {
    uint M = uint(pc.p[0]), N = uint(pc.p[1]), K = uint(pc.p[2]);
    uint lda = uint(pc.p[3]), ldb = uint(pc.p[4]), ldc = uint(pc.p[5]);
    uint lid = gl_LocalInvocationID.x;
    uint n0 = gl_WorkGroupID.x * BN;
    // Blocks are dealt to subgroups in rounds, so a driver that forms more
    // or fewer subgroups than the host planned for still covers the tile;
    // `rounds` and every barrier below are uniform over the work-group.
    uint nsub = gl_NumSubgroups;
    uint rounds = (NBLK + nsub - 1u) / nsub;
    for (uint bz = gl_WorkGroupID.z; bz < uint(pc.p[9]); bz += gl_NumWorkGroups.z)
    for (uint m0 = gl_WorkGroupID.y * BM; m0 < M; m0 += gl_NumWorkGroups.y * BM) {
        uint abase = pc.off[1] + bz * uint(pc.p[6]);
        uint bbase = pc.off[2] + bz * uint(pc.p[7]);
        uint cbase = pc.off[0] + bz * uint(pc.p[8]);
        for (uint r = 0u; r < rounds; r++) {
            uint blk = r * nsub + gl_SubgroupID;
            bool mine = blk < NBLK; // uniform within the subgroup
            uint bm = (blk / BLK_N) * (SM * MM), bn = (blk % BLK_N) * (SN * MN);
            fcoopmatNV<32, gl_ScopeSubgroup, MM, MN> acc[SM][SN];
            for (uint i = 0u; i < SM; i++)
                for (uint j = 0u; j < SN; j++) acc[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, MM, MN>(0.0);
            for (uint k0 = 0u; k0 < K; k0 += BK) {
                // A tile (m, k) -> As[m * LDA + k]; consecutive threads read
                // consecutive addresses of A in either layout
                for (uint i = lid; i < BM * BK; i += WG) {
                    uint kk, mm;
                    if (TA != 0) { kk = i / BM; mm = i % BM; } else { mm = i / BK; kk = i % BK; }
                    uint m = m0 + mm, k = k0 + kk;
                    float v = 0.0;
                    if (m < M && k < K) v = TA != 0 ? A[abase + k * lda + m] : A[abase + m * lda + k];
                    As[mm * LDA + kk] = float16_t(v);
                }
                // B tile (k, n) -> Bs[k * LDB + n]
                for (uint i = lid; i < BK * BN; i += WG) {
                    uint kk, nn;
                    if (TB != 0) { nn = i / BK; kk = i % BK; } else { kk = i / BN; nn = i % BN; }
                    uint n = n0 + nn, k = k0 + kk;
                    float v = 0.0;
                    if (n < N && k < K) v = TB != 0 ? B_AT(bbase + n * ldb + k) : B_AT(bbase + k * ldb + n);
                    Bs[kk * LDB + nn] = float16_t(v);
                }
                barrier();
                if (mine) {
                    for (uint kk = 0u; kk < BK; kk += MK) {
                        fcoopmatNV<16, gl_ScopeSubgroup, MM, MK> a[SM];
                        fcoopmatNV<16, gl_ScopeSubgroup, MK, MN> b[SN];
                        for (uint i = 0u; i < SM; i++) coopMatLoadNV(a[i], As, (bm + i * MM) * LDA + kk, LDA, false);
                        for (uint j = 0u; j < SN; j++) coopMatLoadNV(b[j], Bs, kk * LDB + bn + j * MN, LDB, false);
                        for (uint i = 0u; i < SM; i++)
                            for (uint j = 0u; j < SN; j++) acc[i][j] = coopMatMulAddNV(a[i], b[j], acc[i][j]);
                    }
                }
                barrier();
            }
            if (mine)
                for (uint i = 0u; i < SM; i++)
                    for (uint j = 0u; j < SN; j++)
                        coopMatStoreNV(acc[i][j], Cs, (bm + i * MM) * LDC + bn + j * MN, LDC, false);
        }
        barrier();
        // Cs holds the whole BM x BN tile: store what lies inside C
        for (uint i = lid; i < BM * BN; i += WG) {
            uint mm = i / BN, nn = i % BN;
            uint m = m0 + mm, n = n0 + nn;
            if (m < M && n < N) C[cbase + m * ldc + n] = Cs[mm * LDC + nn];
        }
        barrier(); // before the next tile writes Cs
    }
}
