/* Vectorisable float math for CPU kernels. */
#ifndef TWK_CPU_MATH_H
#define TWK_CPU_MATH_H

#include <stdint.h>
#include <string.h>

/* exp(x) in float32 with ~2 ulp error (Cephes' polynomial), written so the
 * compiler vectorises it inside `#pragma omp simd` loops. Inputs below -87.3
 * return ~1e-38 instead of 0, which no softmax can tell apart. */
static inline float cpu_expf(float x) {
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.7f ? 88.7f : x;
    /* round to nearest by the 1.5 * 2^23 trick (no libm call, so it vectorises) */
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

#endif
