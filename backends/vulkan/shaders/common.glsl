// Shared declarations of every twinkle compute shader.
// Push constants (128 bytes, one layout for all pipelines): element offsets
// (in 32-bit words) of the buffers at bindings 0..7, then op sizes and
// parameters. Spec constants: 0 = work-group size, 1 = the shader's MODE.
layout(push_constant) uniform PC {
    uint off[8];
    int p[16];
    float f[8];
} pc;

layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const int MODE = 0;
layout(local_size_x_id = 0) in;

// atomicMin(err_word[0], launch index) when a launch meets a bad id.
layout(std430, binding = 8) buffer ErrB { uint err_word[]; };

#define NEG_INF (-3.402823466e+38)

// An i64 id from its two words; one that does not fit in an int becomes
// INT_MIN, which every range check rejects.
int id64(uint lo, uint hi) {
    bool ok = (hi == 0u && lo < 0x80000000u) || (hi == 0xffffffffu && lo >= 0x80000000u);
    return ok ? int(lo) : int(0x80000000u);
}
#define ID_AT(buf, base, i, w64) ((w64) != 0 ? id64(buf[(base) + 2u * (i)], buf[(base) + 2u * (i) + 1u]) : int(buf[(base) + (i)]))

// Grid-stride loops: dispatches are capped at 65535 groups per dim.
#define GSTRIDE (gl_NumWorkGroups.x * WG)

// 16-bit storage (frozen bf16 / f16 weights, KV caches), read and written as
// packed 32-bit words through a uint[] binding of the same buffer: element i
// lies in word i >> 1, low half first (little-endian), so no 16-bit storage
// feature is needed. Offsets of such bindings in pc.off count 2-byte
// elements (vk_plan.c). Spec constants 10 and 11: the dtype of the shader's
// first and second 16-bit operand, 0 none (f32), 1 bf16, 2 f16 (attn_tile.comp
// declares a third, 12).
layout(constant_id = 10) const int H16A = 0;
layout(constant_id = 11) const int H16B = 0;
#define H16_BF16 1
#define H16_F16 2
#define H16_BITS(buf, i) ((buf[(i) >> 1] >> (((i) & 1u) << 4)) & 0xffffu)

// the 16 bits h of dtype dt widened (exact)
float h16_f32(uint h, int dt) {
    return dt == H16_F16 ? unpackHalf2x16(h).x : uintBitsToFloat(h << 16);
}

// f narrowed with round to nearest even, bit for bit as hal/half.c
uint f32_bf16(float f) {
    uint x = floatBitsToUint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (x >> 16) | 0x40u; // NaN stays a quiet NaN
    return (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
}

uint f32_f16(float f) {
    uint bits = floatBitsToUint(f), sign = (bits >> 16) & 0x8000u, x = bits & 0x7fffffffu;
    if (x >= 0x7f800000u) return sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u);
    if (x >= 0x477ff000u) return sign | 0x7c00u; // >= 65520 rounds past 65504
    uint h, rem, tie;
    if (x < 0x38800000u) { // below 2^-14: a subnormal half
        if (x < 0x33000000u) return sign;
        uint shift = 126u - (x >> 23), m = (x & 0x7fffffu) | 0x800000u;
        h = m >> shift;
        rem = m & ((1u << shift) - 1u);
        tie = 1u << (shift - 1u);
    } else {
        h = (((x >> 23) - 112u) << 10) | ((x & 0x7fffffu) >> 13);
        rem = x & 0x1fffu;
        tie = 0x1000u;
    }
    if (rem > tie || (rem == tie && (h & 1u) != 0u)) h++;
    return sign | h;
}

uint f32_h16(float f, int dt) { return dt == H16_F16 ? f32_f16(f) : f32_bf16(f); }
