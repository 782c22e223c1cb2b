/* f32 <-> bf16 / f16 conversions: the one implementation the safetensors
 * reader and writer, the backends and the tests share. */
#include <string.h>

#include "twinkle/hal.h"

#ifdef __F16C__
#include <immintrin.h>
#endif

static uint32_t bits_of(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

static float float_of(uint32_t b) {
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

float twk_bf16_to_f32(uint16_t h) { return float_of((uint32_t)h << 16); }

uint16_t twk_f32_to_bf16(float f) {
    uint32_t x = bits_of(f);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)(x >> 16 | 0x40); /* NaN stays a (quiet) NaN */
    return (uint16_t)((x + 0x7fff + (x >> 16 & 1)) >> 16);
}

float twk_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) bits = sign;
        else { /* subnormal: normalise */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            bits = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | man << 13;
    } else {
        bits = sign | (exp + 112) << 23 | man << 13;
    }
    return float_of(bits);
}

uint16_t twk_f32_to_f16(float f) {
    uint32_t bits = bits_of(f), sign = bits >> 16 & 0x8000, x = bits & 0x7fffffff;
    if (x >= 0x7f800000) return (uint16_t)(sign | (x > 0x7f800000 ? 0x7e00 : 0x7c00));
    if (x >= 0x477ff000) return (uint16_t)(sign | 0x7c00); /* >= 65520 rounds past 65504 */
    uint32_t h, rem, half;
    if (x < 0x38800000) { /* below 2^-14: a subnormal half, k * 2^-24 */
        if (x < 0x33000000) return (uint16_t)sign; /* <= 2^-25 (ties to even 0) */
        uint32_t shift = 126 - (x >> 23), m = (x & 0x7fffff) | 0x800000;
        h = m >> shift;
        rem = m & ((1u << shift) - 1);
        half = 1u << (shift - 1);
    } else {
        h = ((x >> 23) - 112) << 10 | (x & 0x7fffff) >> 13;
        rem = x & 0x1fff;
        half = 0x1000;
    }
    if (rem > half || (rem == half && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

/* Element i of 16-bit values at any alignment (a safetensors mapping need not be 2-aligned). */
static uint16_t load16(const unsigned char *p, int64_t i) {
    uint16_t v;
    memcpy(&v, p + 2 * i, sizeof v);
    return v;
}

twk_status twk_dtype_to_f32(twk_dtype t, const void *src, float *dst, int64_t n) {
    const unsigned char *h = src;
    int64_t i = 0;
    switch (t) {
    case TWK_F32: memcpy(dst, src, (size_t)n * sizeof *dst); return TWK_OK;
    case TWK_BF16:
        for (; i < n; i++) dst[i] = float_of((uint32_t)load16(h, i) << 16);
        return TWK_OK;
    case TWK_F16:
#ifdef __F16C__
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + 2 * i))));
#endif
        for (; i < n; i++) dst[i] = twk_f16_to_f32(load16(h, i));
        return TWK_OK;
    default: return twk_error(TWK_ERR_DTYPE, "dtype_to_f32: %s is not a float dtype", twk_dtype_name(t));
    }
}

twk_status twk_dtype_from_f32(twk_dtype t, const float *src, void *dst, int64_t n) {
    if (t == TWK_F32) {
        memmove(dst, src, (size_t)n * sizeof *src);
        return TWK_OK;
    }
    if (!twk_dtype_is_half(t)) return twk_error(TWK_ERR_DTYPE, "dtype_from_f32: %s is not a float dtype", twk_dtype_name(t));
    unsigned char *p = dst;
    for (int64_t i = 0; i < n; i++) { /* front to back: element i's 2 bytes never pass element i's 4 */
        uint16_t v = t == TWK_BF16 ? twk_f32_to_bf16(src[i]) : twk_f32_to_f16(src[i]);
        memcpy(p + 2 * i, &v, sizeof v);
    }
    return TWK_OK;
}

twk_status twk_dtype_round(twk_dtype t, float *x, int64_t n) {
    if (t == TWK_F32) return TWK_OK;
    if (!twk_dtype_is_half(t)) return twk_error(TWK_ERR_DTYPE, "dtype_round: %s is not a float dtype", twk_dtype_name(t));
    for (int64_t i = 0; i < n; i++) x[i] = t == TWK_BF16 ? twk_bf16_to_f32(twk_f32_to_bf16(x[i])) : twk_f16_to_f32(twk_f32_to_f16(x[i]));
    return TWK_OK;
}
