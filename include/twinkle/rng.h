/* twinkle — a small deterministic random generator (splitmix64 seeding a
 * xoshiro256** stream), shared by initialisation, tests and benchmarks so the
 * same seed gives the same numbers everywhere. Header-only.
 *
 * Thread-safety: a twk_rng is plain state; use one per thread. */
#ifndef TWINKLE_RNG_H
#define TWINKLE_RNG_H

#include <math.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct twk_rng {
    uint64_t s[4];
} twk_rng;

static inline uint64_t twk_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline void twk_rng_seed(twk_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = twk_splitmix64(&seed);
}

static inline uint64_t twk_rng_next(twk_rng *r) {
    uint64_t *s = r->s;
    uint64_t x = s[1] * 5, result = ((x << 7) | (x >> 57)) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return result;
}

/* Uniform in [0, 1). */
static inline double twk_rng_uniform(twk_rng *r) { return (double)(twk_rng_next(r) >> 11) * 0x1.0p-53; }

/* Uniform integer in [0, n). */
static inline int64_t twk_rng_below(twk_rng *r, int64_t n) { return (int64_t)(twk_rng_uniform(r) * (double)n); }

/* Standard normal (Box-Muller). */
static inline double twk_rng_normal(twk_rng *r) {
    double u1 = twk_rng_uniform(r), u2 = twk_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#ifdef __cplusplus
}
#endif
#endif
