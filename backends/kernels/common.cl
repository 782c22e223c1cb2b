/* Helpers every kernel family uses (first in kd_kernel_source()).
 *
 * The dialect: TWK_KERNEL, TWK_GLOBAL, TWK_LOCAL(type, name, n), TWK_BARRIER(),
 * TWK_FN, TWK_GID/LID/GROUP/LSIZE/NGROUPS(d) from the prelude; `long` is 64-bit
 * and `int` 32-bit on both APIs; float math: exp, log, sqrt, pow, sin, cos,
 * fmax, fmin. Buffers arrive as (TWK_GLOBAL T *p, long p_off). */

#define KD_ERR_ID_RANGE 1
#define KD_ERR_SEGMENT 2

/* a finite stand-in for -infinity as the start of a running maximum */
#define KD_NEG_BIG (-3.0e38f)

/* id i of an i32 (is64 = 0) or little-endian i64 (is64 = 1) tensor read as int words */
TWK_FN long kd_id(const TWK_GLOBAL int *p, long i, int is64) {
    if (!is64) return (long)p[i];
    return (long)(((unsigned long)(unsigned int)p[2 * i + 1] << 32) | (unsigned long)(unsigned int)p[2 * i]);
}

TWK_FN float kd_sigmoid(float x) { return 1.0f / (1.0f + exp(-x)); }

/* Tree sum of buf[0..n) (n = the work-group size, a power of two) into
 * buf[0]; every item of the group must reach it. */
#define KD_TREE_SUM(buf, lid, n)                                      \
    for (int s_ = (n) / 2; s_ > 0; s_ >>= 1) {                        \
        if ((lid) < s_) buf[(lid)] += buf[(lid) + s_];                \
        TWK_BARRIER();                                                \
    }
#define KD_TREE_MAX(buf, lid, n)                                      \
    for (int s_ = (n) / 2; s_ > 0; s_ >>= 1) {                        \
        if ((lid) < s_) buf[(lid)] = fmax(buf[(lid)], buf[(lid) + s_]); \
        TWK_BARRIER();                                                \
    }

/* (*hi, *lo) += x with the rounding error of the addition kept exactly (TwoSum: s + e = *hi + x
 * in exact arithmetic) and added to *lo; hi + lo is then the sum of everything added up to
 * the rounding of the lo additions (second order). */
TWK_FN void kd_two_sum(float *hi, float *lo, float x) {
    float s = *hi + x;
    float bb = s - *hi;
    float e = (*hi - (s - bb)) + (x - bb);
    *hi = s;
    *lo += e;
}

/* Compensated tree over pairs (hi[i], lo[i]) of a work-group of n items (a power of two) laid
 * out lane-major with C columns (index = lane * C + column): the lanes of each column are summed
 * into its lane 0 (indices 0..C-1). C = 1: one tree over the group. Every item must reach it. */
#define KD_TREE_SUM2(hi, lo, lid, n, C)                                    \
    for (int s_ = (n) / 2; s_ >= (C); s_ >>= 1) {                          \
        if ((lid) < s_) {                                                  \
            float h_ = hi[(lid)], l_ = lo[(lid)] + lo[(lid) + s_];         \
            kd_two_sum(&h_, &l_, hi[(lid) + s_]);                          \
            hi[(lid)] = h_;                                                \
            lo[(lid)] = l_;                                                \
        }                                                                  \
        TWK_BARRIER();                                                     \
    }

/* Start of tile t of [0, n) cut into `tiles` (hal/twk_wide.h's rule): the first n % tiles are one longer. */
TWK_FN long kd_tile_start(long n, long tiles, long t) {
    long q = n / tiles, r = n % tiles;
    return t * q + (t < r ? t : r);
}

/* Kahan-compensated accumulation: *s += x with the lost low bits kept in *c. */
TWK_FN void kd_kahan(float *s, float *c, float x) {
    float y = x - *c;
    float t = *s + y;
    *c = (t - *s) - y;
    *s = t;
}
