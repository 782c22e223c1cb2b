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
