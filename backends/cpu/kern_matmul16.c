/* The skinny product of MATMUL over a 16-bit b (a frozen bf16 / f16 weight): C [M, N] = A op(B)
 * for a few rows of A (decoding: M <= CPU_SKINNY_ROWS), reading B once, straight from memory,
 * widened in registers (AVX2 + FMA; f16 also F16C) instead of into f32 panels for sgemm, which
 * at one row is bound by the widening stores, not by memory.
 *
 * b transposed (B [N, K], the model's linears and the tied unembedding): blocks of 4 rows of B
 * stream side by side, each loaded 16-element vector of A (packed once per call) feeding all 4
 * (several rows of A: two at a time against 2 + 2 rows of B, each widened vector feeding both);
 * bf16 loads 16 halves as 8 words, the even elements shifted up and the odd ones masked (A is
 * packed in that even / odd order), f16 converts 8 halves twice. Two accumulators per (m, n),
 * added and reduced across lanes once at the end; K's last partial block comes zero-padded.
 * b not transposed (B [K, N]): blocks of 32 columns, rows k in order, one FMA chain per element.
 *
 * Every (m, n) is the same sequence of operations whatever M, the row's place in its block and
 * the thread split (threads take whole blocks), so a row of C does not depend on the others. It
 * does differ in its last bits from the panels' sgemm: kern_matmul.c takes this kernel only in
 * sampling plans (cpu_call.infer), never in training, where a pass's rows must not depend on how
 * many tokens share the pass. Sums are f32. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_internal.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SKINNY_AVX2 1
/* inlined into each (dtype, rows) wrapper below, so R, G and V are constants and the
 * accumulators stay in registers */
#define SKINNY_INLINE static inline __attribute__((always_inline))
#if defined(__F16C__)
#define SKINNY_F16C 1
#endif
#endif

#define KB 16                    /* elements of K per block (b transposed) */
#define RB 4                     /* rows of B per block (b transposed) */
#define SKINNY_AHEAD (2 * RB)    /* rows prefetched ahead: a stream two blocks on (single-core reads 8.4 GB/s, not 6) */
#define CB 32                    /* columns per block (b not transposed) */
#define SKINNY_GRAIN ((int64_t)1 << 18) /* elements of B below which one thread streams it all */

typedef struct {
    const float *A; /* b transposed: packed (skinny_pack); else A itself */
    const uint16_t *B;
    float *C;
    twk_dtype bt;
    int64_t M, N, K, Kp, lda, ldb, ldc;
} skinny_job;

/* A's rows, K zero-padded to Kp (a multiple of KB); for bf16 each block in the order its widened
 * halves come out: the 8 even elements, then the 8 odd ones. */
static void skinny_pack(const skinny_job *j, const float *A, float *P) {
    int bf = j->bt == TWK_BF16;
    for (int64_t m = 0; m < j->M; m++) {
        const float *a = A + m * j->lda;
        float *p = P + m * j->Kp;
        for (int64_t k0 = 0; k0 < j->Kp; k0 += KB)
            for (int i = 0; i < KB; i++) {
                int64_t k = k0 + (bf ? (i < 8 ? 2 * i : 2 * (i - 8) + 1) : i);
                p[k0 + i] = k < j->K ? a[k] : 0.0f;
            }
    }
}

#if SKINNY_AVX2
static float half_value(twk_dtype t, uint16_t h) {
    float f;
    twk_dtype_to_f32(t, &h, &f, 1);
    return f;
}

SKINNY_INLINE __m256 widen8(twk_dtype t, const uint16_t *p) { /* 8 consecutive halves */
    __m128i h = _mm_loadu_si128((const __m128i *)p);
#if SKINNY_F16C
    if (t == TWK_F16) return _mm256_cvtph_ps(h);
#endif
    (void)t;
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* The two widened halves of one block of KB: bf16 even / odd elements, f16 the first / last 8. */
SKINNY_INLINE void widen16(twk_dtype t, const uint16_t *p, __m256 *lo, __m256 *hi) {
#if SKINNY_F16C
    if (t == TWK_F16) {
        *lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        *hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)));
        return;
    }
#endif
    (void)t;
    __m256i w = _mm256_loadu_si256((const __m256i *)p);
    *lo = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    *hi = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xffff0000u)));
}

SKINNY_INLINE float hsum(__m256 v) { /* one fixed order */
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* out[g * RB + r] = a_g . b_r for G (1 or 2) rows of A (a, a + Kp) and R (1, 2 or RB) rows of B
 * from b; a packed, Kp = nfull * KB (+ KB when K has a tail). Every output is the same two FMA
 * chains over k and one reduction whatever R and G, so grouping never changes a bit; two rows of A
 * share each widened vector of B (batched decoding). */
SKINNY_INLINE void rows_dot(twk_dtype t, int R, int G, const float *a, int64_t Kp, const uint16_t *b, int64_t ldb,
                            int64_t K, float *out) {
    __m256 lo[2][RB], hi[2][RB];
    for (int g = 0; g < 2; g++)
        for (int r = 0; r < RB; r++) lo[g][r] = hi[g][r] = _mm256_setzero_ps();
    int64_t nfull = K / KB, k0 = 0;
    for (int64_t i = 0; i < nfull; i++, k0 += KB) {
        __m256 alo[2], ahi[2];
        for (int g = 0; g < G; g++) alo[g] = _mm256_loadu_ps(a + g * Kp + k0), ahi[g] = _mm256_loadu_ps(a + g * Kp + k0 + 8);
        for (int r = 0; r < R; r++) {
            __m256 wl, wh;
            /* a prefetch never faults; past B's end (integer arithmetic, no pointer) it is wasted */
            _mm_prefetch((const char *)((uintptr_t)(b + r * ldb + k0) + (uintptr_t)(SKINNY_AHEAD * ldb) * 2u), _MM_HINT_T0);
            widen16(t, b + r * ldb + k0, &wl, &wh);
            for (int g = 0; g < G; g++) {
                lo[g][r] = _mm256_fmadd_ps(wl, alo[g], lo[g][r]);
                hi[g][r] = _mm256_fmadd_ps(wh, ahi[g], hi[g][r]);
            }
        }
    }
    if (k0 < K) { /* the tail, zero-padded (A's padding is zero too) */
        __m256 alo[2], ahi[2];
        for (int g = 0; g < G; g++) alo[g] = _mm256_loadu_ps(a + g * Kp + k0), ahi[g] = _mm256_loadu_ps(a + g * Kp + k0 + 8);
        for (int r = 0; r < R; r++) {
            uint16_t tail[KB] = {0};
            memcpy(tail, b + r * ldb + k0, (size_t)(K - k0) * sizeof *tail);
            __m256 wl, wh;
            widen16(t, tail, &wl, &wh);
            for (int g = 0; g < G; g++) {
                lo[g][r] = _mm256_fmadd_ps(wl, alo[g], lo[g][r]);
                hi[g][r] = _mm256_fmadd_ps(wh, ahi[g], hi[g][r]);
            }
        }
    }
    for (int g = 0; g < G; g++)
        for (int r = 0; r < R; r++) out[g * RB + r] = hsum(_mm256_add_ps(lo[g][r], hi[g][r]));
}

typedef void (*rows_fn)(const float *a, int64_t Kp, const uint16_t *b, int64_t ldb, int64_t K, float *out);
/* one wrapper per (dtype, R, G), so rows_dot's loops see constants */
#define ROWS_FN(name, dtype, R, G)                                                                       \
    static void name(const float *a, int64_t Kp, const uint16_t *b, int64_t ldb, int64_t K, float *out) { \
        rows_dot(dtype, R, G, a, Kp, b, ldb, K, out);                                                     \
    }
ROWS_FN(rows_bf16_4, TWK_BF16, RB, 1)
ROWS_FN(rows_bf16_1, TWK_BF16, 1, 1)
ROWS_FN(rows_bf16_2x2, TWK_BF16, 2, 2)
#if SKINNY_F16C
ROWS_FN(rows_f16_4, TWK_F16, RB, 1)
ROWS_FN(rows_f16_1, TWK_F16, 1, 1)
ROWS_FN(rows_f16_2x2, TWK_F16, 2, 2)
#endif

/* C[m, n] for every m, n in blocks [b0, b1) of RB rows of B (b transposed). */
static void skinny_t_avx2(const skinny_job *j, int64_t b0, int64_t b1) {
    int f16 = j->bt == TWK_F16;
    rows_fn four = f16 ? NULL : rows_bf16_4, one = f16 ? NULL : rows_bf16_1, pair = f16 ? NULL : rows_bf16_2x2;
#if SKINNY_F16C
    if (f16) four = rows_f16_4, one = rows_f16_1, pair = rows_f16_2x2;
#endif
    for (int64_t blk = b0; blk < b1; blk++) {
        int64_t n = blk * RB, nr = j->N - n < RB ? j->N - n : RB;
        const uint16_t *b = j->B + n * j->ldb;
        int64_t m = 0;
        if (nr == RB) /* two rows of A at a time against 2 + 2 rows of B: each widened vector used twice */
            for (; m + 2 <= j->M; m += 2) {
                float out[2 * RB];
                const float *a = j->A + m * j->Kp;
                for (int h = 0; h < RB; h += 2) {
                    pair(a, j->Kp, b + h * j->ldb, j->ldb, j->K, out + h);
                    for (int g = 0; g < 2; g++)
                        for (int r = 0; r < 2; r++) j->C[(m + g) * j->ldc + n + h + r] = out[g * RB + h + r];
                }
            }
        for (; m < j->M; m++) {
            float out[RB];
            const float *a = j->A + m * j->Kp;
            if (nr == RB) four(a, j->Kp, b, j->ldb, j->K, out);
            else
                for (int64_t r = 0; r < nr; r++) one(a, j->Kp, b + r * j->ldb, j->ldb, j->K, out + r);
            for (int64_t r = 0; r < nr; r++) j->C[m * j->ldc + n + r] = out[r];
        }
    }
}

/* C[m, c0 .. c0 + 8 V) over all k for G (1 or 2) rows of A from m (b not transposed). */
SKINNY_INLINE void cols_fma(twk_dtype t, int G, int V, const skinny_job *j, int64_t m, int64_t c0) {
    __m256 acc[2][4];
    for (int g = 0; g < 2; g++)
        for (int v = 0; v < 4; v++) acc[g][v] = _mm256_setzero_ps();
    const uint16_t *b = j->B + c0;
    for (int64_t k = 0; k < j->K; k++, b += j->ldb) {
        __m256 w[4];
        for (int v = 0; v < V; v++) w[v] = widen8(t, b + 8 * v);
        for (int g = 0; g < G; g++) {
            __m256 a = _mm256_broadcast_ss(j->A + (m + g) * j->lda + k);
            for (int v = 0; v < V; v++) acc[g][v] = _mm256_fmadd_ps(w[v], a, acc[g][v]);
        }
    }
    for (int g = 0; g < G; g++)
        for (int v = 0; v < V; v++) _mm256_storeu_ps(j->C + (m + g) * j->ldc + c0 + 8 * v, acc[g][v]);
}

static void cols_bf16_2x4(const skinny_job *j, int64_t m, int64_t c0) { cols_fma(TWK_BF16, 2, 4, j, m, c0); }
static void cols_bf16_1x4(const skinny_job *j, int64_t m, int64_t c0) { cols_fma(TWK_BF16, 1, 4, j, m, c0); }
static void cols_bf16_1x1(const skinny_job *j, int64_t m, int64_t c0) { cols_fma(TWK_BF16, 1, 1, j, m, c0); }
#if SKINNY_F16C
static void cols_f16_2x4(const skinny_job *j, int64_t m, int64_t c0) { cols_fma(TWK_F16, 2, 4, j, m, c0); }
static void cols_f16_1x4(const skinny_job *j, int64_t m, int64_t c0) { cols_fma(TWK_F16, 1, 4, j, m, c0); }
static void cols_f16_1x1(const skinny_job *j, int64_t m, int64_t c0) { cols_fma(TWK_F16, 1, 1, j, m, c0); }
#endif

/* Blocks [b0, b1) of CB columns (b not transposed): full blocks 2 rows of A at a time, the last
 * partial one in vectors of 8, its last columns one by one (the same FMA chain over k in order). */
static void skinny_n_avx2(const skinny_job *j, int64_t b0, int64_t b1) {
    int f16 = j->bt == TWK_F16;
    void (*two4)(const skinny_job *, int64_t, int64_t) = f16 ? NULL : cols_bf16_2x4;
    void (*one4)(const skinny_job *, int64_t, int64_t) = f16 ? NULL : cols_bf16_1x4;
    void (*one1)(const skinny_job *, int64_t, int64_t) = f16 ? NULL : cols_bf16_1x1;
#if SKINNY_F16C
    if (f16) two4 = cols_f16_2x4, one4 = cols_f16_1x4, one1 = cols_f16_1x1;
#endif
    for (int64_t blk = b0; blk < b1; blk++) {
        int64_t c0 = blk * CB, nc = j->N - c0 < CB ? j->N - c0 : CB;
        if (nc == CB) {
            int64_t m = 0;
            for (; m + 2 <= j->M; m += 2) two4(j, m, c0);
            if (m < j->M) one4(j, m, c0);
            continue;
        }
        int64_t c = c0;
        for (; c + 8 <= c0 + nc; c += 8)
            for (int64_t m = 0; m < j->M; m++) one1(j, m, c);
        for (; c < c0 + nc; c++)
            for (int64_t m = 0; m < j->M; m++) {
                float s = 0;
                for (int64_t k = 0; k < j->K; k++)
                    s = fmaf(j->A[m * j->lda + k], half_value(j->bt, j->B[k * j->ldb + c]), s);
                j->C[m * j->ldc + c] = s;
            }
    }
}
#endif

#if !SKINNY_AVX2 || !SKINNY_F16C
/* The portable kernels: B widened 256 elements at a time into a stack buffer, then f32 loops. */
#define CHUNK 256
static void skinny_t_scalar(const skinny_job *j, int64_t b0, int64_t b1) {
    float w[CHUNK];
    for (int64_t n = b0 * RB; n < b1 * RB && n < j->N; n++)
        for (int64_t m = 0; m < j->M; m++) {
            const float *a = j->A + m * j->Kp; /* packed: the element order of skinny_pack */
            float s = 0;
            for (int64_t k0 = 0; k0 < j->K; k0 += CHUNK) {
                int64_t nk = j->K - k0 < CHUNK ? j->K - k0 : CHUNK;
                twk_dtype_to_f32(j->bt, j->B + n * j->ldb + k0, w, nk);
                for (int64_t k = 0; k < nk; k++) {
                    int64_t kk = k0 + k, i = kk % KB;
                    int64_t p = j->bt == TWK_BF16 ? kk - i + (i % 2 ? 8 + i / 2 : i / 2) : kk;
                    s += a[p] * w[k];
                }
            }
            j->C[m * j->ldc + n] = s;
        }
}

static void skinny_n_scalar(const skinny_job *j, int64_t b0, int64_t b1) {
    float w[CHUNK];
    int64_t n1 = b1 * CB < j->N ? b1 * CB : j->N;
    for (int64_t c0 = b0 * CB; c0 < n1; c0 += CHUNK) {
        int64_t nc = n1 - c0 < CHUNK ? n1 - c0 : CHUNK;
        for (int64_t m = 0; m < j->M; m++) memset(j->C + m * j->ldc + c0, 0, (size_t)nc * sizeof(float));
        for (int64_t k = 0; k < j->K; k++) {
            twk_dtype_to_f32(j->bt, j->B + k * j->ldb + c0, w, nc);
            for (int64_t m = 0; m < j->M; m++) {
                float a = j->A[m * j->lda + k], *c = j->C + m * j->ldc + c0;
                for (int64_t i = 0; i < nc; i++) c[i] += a * w[i];
            }
        }
    }
}

#endif

static void skinny_t_range(void *arg, int64_t b0, int64_t b1) {
    const skinny_job *j = arg;
#if SKINNY_AVX2
#if !SKINNY_F16C
    if (j->bt == TWK_F16) {
        skinny_t_scalar(j, b0, b1);
        return;
    }
#endif
    skinny_t_avx2(j, b0, b1);
#else
    skinny_t_scalar(j, b0, b1);
#endif
}

static void skinny_n_range(void *arg, int64_t b0, int64_t b1) {
    const skinny_job *j = arg;
#if SKINNY_AVX2
#if !SKINNY_F16C
    if (j->bt == TWK_F16) {
        skinny_n_scalar(j, b0, b1);
        return;
    }
#endif
    skinny_n_avx2(j, b0, b1);
#else
    skinny_n_scalar(j, b0, b1);
#endif
}

static int64_t padded_k(int64_t K) { return (K + KB - 1) / KB * KB; }

int64_t cpu_skinny_work_floats(const cpu_gemm_args *g) { return g->tb ? g->M * padded_k(g->K) : 0; }

void cpu_gemm_skinny(cpu_ctx *ctx, const cpu_gemm_args *g, float *work) {
    skinny_job j = {.A = g->A, .B = g->B, .C = g->C, .bt = g->bt, .M = g->M, .N = g->N, .K = g->K, .Kp = padded_k(g->K),
                    .lda = g->lda, .ldb = g->ldb, .ldc = g->ldc};
    int64_t blocks = g->tb ? (g->N + RB - 1) / RB : (g->N + CB - 1) / CB, per = (g->tb ? RB : CB) * g->K;
    /* one contiguous run of blocks per thread; a small B on one thread */
    int64_t grain = (blocks + ctx->n_threads - 1) / ctx->n_threads, small = SKINNY_GRAIN / (per ? per : 1) + 1;
    if (grain < small) grain = small;
    if (g->tb) {
        skinny_pack(&j, g->A, work);
        j.A = work;
        cpu_parallel_for(ctx->pool, blocks, grain, skinny_t_range, &j);
    } else {
        cpu_parallel_for(ctx->pool, blocks, grain, skinny_n_range, &j);
    }
}
