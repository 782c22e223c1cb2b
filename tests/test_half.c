/* bf16 / f16 weights on the device TWK_TEST_DEVICE names (default cpu; ctest also runs it on
 * opencl, vulkan and the fake cuda): matmul with a 16-bit b (the CPU's skinny sampling kernel and sgemm
 * panels, the OpenCL / CUDA widened panels, Vulkan's GEMM loading packed words; b transposed or
 * not, the backward product dX = dY W), get_rows from a 16-bit table, KV caches in 16 bits (the
 * cache's bits equal the host's round-to-nearest-even), training attention over bf16 / f16 q, k,
 * v (forward and each gradient bit for bit as over their f32 widening), every 16-bit pattern widened and edge
 * values narrowed bit for bit as hal/half.c, against float64 references computed
 * from the same 16-bit values; a whole model (forward, LoRA gradients, greedy decoding) held
 * in bf16 against the same weights held in f32 on that device; the grouped lora_gather of the
 * experts over a 16-bit stack (both orientations) against float64; on the CPU run, the demo task
 * and the capability checks: a trainable 16-bit parameter is refused, and every backend
 * compiles a bf16 matmul exactly when it declares 16-bit matmul weights
 * (twk_device_half_srcs), else refuses it naming the backend and dtype. Tolerances are the
 * same on every device (the bounds do not depend on the summation order) and are stated with
 * each check; the measured errors are printed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "twinkle/twinkle.h"

static int fails;

static void check(int cond, const char *what) {
    printf("%s %s%s%s\n", cond ? "ok  " : "FAIL", what, cond ? "" : " — ", cond ? "" : twk_last_error());
    fails += !cond;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float urand(void) { /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2 - 1);
}

/* n random values stored as dtype t (h) and the same values widened (w). */
static void random_half(twk_dtype t, int64_t n, uint16_t *h, float *w) {
    for (int64_t i = 0; i < n; i++) {
        float f = urand();
        h[i] = t == TWK_BF16 ? twk_f32_to_bf16(f) : twk_f32_to_f16(f);
        w[i] = t == TWK_BF16 ? twk_bf16_to_f32(h[i]) : twk_f16_to_f32(h[i]);
    }
}

/* Runs y = a op(b) with a f32 [M, K], b 16-bit ([N, K] when tb, else [K, N]) and checks it
 * against float64 sums of the widened values: |err| <= K * 2^-23 * sum_k |a_k b_k| (the
 * f32 summation bound gamma_K, doubled for the product's rounding). With `back`, also the
 * gradient of sum(y * r) with respect to a, r W (the product dX = dY W, which reads b the
 * other way round). With `sampling`, the graph also writes a KV cache, which makes its plan a
 * sampler's (the CPU's skinny kernel for M <= 8). Returns the worst err / bound; *max_err
 * (may be NULL) the largest |err| of y, and y itself goes to y_out (may be NULL). */
static double matmul_case_ex(twk_device *dev, twk_dtype t, int64_t M, int64_t K, int64_t N, int tb, int back,
                             int sampling, double *max_err, float *y_out) {
    int64_t sa[2] = {M, K}, sb[2] = {tb ? N : K, tb ? K : N}, sy[2] = {M, N};
    float *a = malloc((size_t)(M * K) * 4), *w = malloc((size_t)(K * N) * 4), *y = malloc((size_t)(M * N) * 4);
    float *r = malloc((size_t)(M * N) * 4), *da = malloc((size_t)(M * K) * 4);
    uint16_t *h = malloc((size_t)(K * N) * 2);
    random_half(t, K * N, h, w); /* b first: from one seed, b and a's first rows are the same whatever M */
    for (int64_t i = 0; i < M * K; i++) a[i] = urand();
    for (int64_t i = 0; i < M * N; i++) r[i] = urand();
    twk_graph *g = twk_graph_new();
    twk_id A = twk_param(g, "a", 2, sa, back), B = twk_param_dtype(g, "b", t, 2, sb, false);
    twk_id R = twk_input(g, "r", TWK_F32, 2, sy);
    twk_id Y = twk_matmul(g, A, B, false, tb), L = twk_sum(g, twk_mul(g, Y, R));
    twk_graph_output(g, Y);
    int64_t s1[1] = {1}, sc[3] = {1, 1, 1};
    float kx = 1;
    int32_t row0 = 0;
    twk_id Kx = -1, Kr = -1;
    if (sampling) { /* a one-element cache written beside the product */
        twk_id Kc = twk_param_dtype(g, "kc", TWK_F32, 3, sc, false);
        Kx = twk_input(g, "kx", TWK_F32, 3, sc), Kr = twk_input(g, "kr", TWK_I32, 1, s1);
        twk_graph_output(g, twk_kv_write(g, Kc, Kx, Kr));
    }
    twk_id dA = -1;
    if (back && twk_graph_backward(g, L) == TWK_OK) dA = twk_graph_grad(g, A), twk_graph_output(g, dA);
    twk_plan *p = NULL;
    double worst = INFINITY;
    if (twk_graph_status(g) == TWK_OK && twk_plan_compile(g, dev, 1, NULL, 0, &p) == TWK_OK &&
        twk_plan_write(p, A, 1, a, (size_t)(M * K) * 4) == TWK_OK &&
        twk_plan_write(p, B, 1, h, (size_t)(K * N) * 2) == TWK_OK &&
        (!back || twk_plan_write(p, R, 1, r, (size_t)(M * N) * 4) == TWK_OK) &&
        (!sampling || (twk_plan_write(p, Kx, 1, &kx, sizeof kx) == TWK_OK && twk_plan_write(p, Kr, 1, &row0, sizeof row0) == TWK_OK)) &&
        twk_plan_run(p, 1) == TWK_OK &&
        twk_plan_read(p, Y, 1, y, (size_t)(M * N) * 4) == TWK_OK &&
        (!back || twk_plan_read(p, dA, 1, da, (size_t)(M * K) * 4) == TWK_OK)) {
        worst = 0;
        if (max_err) *max_err = 0;
        if (y_out) memcpy(y_out, y, (size_t)(M * N) * 4);
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double s = 0, mag = 0;
                for (int64_t k = 0; k < K; k++) {
                    double bk = tb ? w[n * K + k] : w[k * N + n];
                    s += (double)a[m * K + k] * bk;
                    mag += fabs((double)a[m * K + k] * bk);
                }
                double e = fabs(y[m * N + n] - s) / (K * ldexp(1, -23) * mag + 1e-30);
                worst = e > worst ? e : worst;
                if (max_err && fabs(y[m * N + n] - s) > *max_err) *max_err = fabs(y[m * N + n] - s);
            }
        for (int64_t m = 0; back && m < M; m++)
            for (int64_t k = 0; k < K; k++) {
                double s = 0, mag = 0;
                for (int64_t n = 0; n < N; n++) {
                    double bk = tb ? w[n * K + k] : w[k * N + n];
                    s += (double)r[m * N + n] * bk;
                    mag += fabs((double)r[m * N + n] * bk);
                }
                double e = fabs(da[m * K + k] - s) / (N * ldexp(1, -23) * mag + 1e-30);
                worst = e > worst ? e : worst;
            }
    }
    twk_plan_free(p);
    twk_graph_free(g);
    free(a), free(w), free(y), free(r), free(da), free(h);
    return worst;
}

static double matmul_case(twk_device *dev, twk_dtype t, int64_t M, int64_t K, int64_t N, int tb, int back) {
    return matmul_case_ex(dev, t, M, K, N, tb, back, 0, NULL, NULL);
}

/* get_rows from a 16-bit table: exactly the widened rows. */
/* The grouped lora_gather (twk_lora_gather_grouped: a mixture of experts' projections; the CPU
 * runs one sgemm per run of equal slots, OpenCL / CUDA / Vulkan one f32 dot per output element,
 * the stack widened as read) over a 16-bit expert stack w [E, N, K] (or [E, K, N] when trans:
 * the experts' dX = dY W), runs of 1, 2, 17 and 30 rows and a slot revisited, against float64
 * sums of the widened values with matmul_case's bound (K 2^-23 sum|w x|, twice the worst case of
 * K f32 additions). Returns the worst err / bound (1e9 when the plan fails); *abs gets the worst
 * absolute error. */
static double grouped_case(twk_device *dev, twk_dtype t, int trans, double *abs_err) {
    enum { T = 56, E = 4, K = 70, N = 33 };
    static const int32_t runs[][2] = {{0, 1}, {2, 2}, {1, 17}, {3, 30}, {0, 6}}; /* {slot, rows} */
    int32_t slot[T];
    for (int r = 0, i = 0; r < 5; r++)
        for (int j = 0; j < runs[r][1]; j++) slot[i++] = runs[r][0];
    float *x = malloc(sizeof(float) * T * K), *w = malloc(sizeof(float) * E * N * K), *y = malloc(sizeof(float) * T * N);
    uint16_t *h = malloc(sizeof(uint16_t) * E * N * K);
    double worst = 1e9;
    twk_graph *g = twk_graph_new();
    twk_plan *p = NULL;
    if (!x || !w || !y || !h || !g) goto out;
    for (int i = 0; i < T * K; i++) x[i] = urand();
    random_half(t, E * N * K, h, w);
    int64_t sx[2] = {T, K}, sw[3] = {E, trans ? K : N, trans ? N : K}, ss[1] = {T};
    twk_id xi = twk_input(g, "x", TWK_F32, 2, sx), wi = twk_input(g, "w", t, 3, sw), si = twk_input(g, "slot", TWK_I32, 1, ss);
    twk_id yi = twk_lora_gather_grouped(g, xi, wi, si, trans != 0);
    if (twk_graph_output(g, yi) != TWK_OK || twk_plan_compile(g, dev, 1, NULL, 0, &p) != TWK_OK ||
        twk_plan_write(p, xi, 1, x, sizeof(float) * T * K) != TWK_OK ||
        twk_plan_write(p, wi, 1, h, sizeof(uint16_t) * E * N * K) != TWK_OK ||
        twk_plan_write(p, si, 1, slot, sizeof slot) != TWK_OK || twk_plan_run(p, 1) != TWK_OK ||
        twk_plan_read(p, yi, 1, y, sizeof(float) * T * N) != TWK_OK)
        goto out;
    worst = 0;
    for (int r = 0; r < T; r++)
        for (int n = 0; n < N; n++) {
            double s = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                double wv = w[(int64_t)slot[r] * N * K + (trans ? k * N + n : n * K + k)];
                s += wv * x[r * K + k];
                mag += fabs(wv * x[r * K + k]);
            }
            double d = fabs(y[r * N + n] - s), e = d / (K * ldexp(1.0, -23) * mag + 1e-30);
            worst = e > worst ? e : worst;
            *abs_err = d > *abs_err ? d : *abs_err;
        }
out:
    twk_plan_free(p);
    twk_graph_free(g);
    free(x);
    free(w);
    free(y);
    free(h);
    return worst;
}

static void get_rows_case(twk_device *dev, twk_dtype t) {
    enum { V = 37, D = 19, T = 6 };
    uint16_t h[V * D];
    float w[V * D], y[T * D];
    int32_t ids[T] = {0, 36, 5, 5, 17, 2};
    random_half(t, V * D, h, w);
    int64_t st[2] = {V, D}, si[1] = {T};
    twk_graph *g = twk_graph_new();
    twk_id Tb = twk_param_dtype(g, "table", t, 2, st, false), I = twk_input(g, "ids", TWK_I32, 1, si);
    twk_id Y = twk_get_rows(g, Tb, I);
    twk_graph_output(g, Y);
    twk_plan *p = NULL;
    int ok = twk_plan_compile(g, dev, 1, NULL, 0, &p) == TWK_OK && twk_plan_write(p, Tb, 1, h, sizeof h) == TWK_OK &&
             twk_plan_write(p, I, 1, ids, sizeof ids) == TWK_OK && twk_plan_run(p, 1) == TWK_OK &&
             twk_plan_read(p, Y, 1, y, sizeof y) == TWK_OK;
    for (int i = 0; ok && i < T; i++) ok = !memcmp(y + i * D, w + ids[i] * D, sizeof(float) * D);
    char what[96];
    snprintf(what, sizeof what, "get_rows from a %s table: the rows widened exactly", twk_dtype_name(t));
    check(ok, what);
    twk_plan_free(p);
    twk_graph_free(g);
}

/* Every bf16 / f16 bit pattern through get_rows (65536 values, rows of 16): each widens to the
 * host's value bit for bit (a NaN to a NaN). And kv_write of 35 f32 values — ties to even in
 * both formats, f16 overflow (65519, 65520) and subnormal edges, f32 subnormals, infinities,
 * NaNs with payloads — into a cache whose rows have 5 halves (so a 32-bit word holds the end of
 * one row and the start of the next, the rows written by different threads), rows 4 and 7 not
 * written: the written halves equal hal/half.c's rounding, every other half is kept. */
static int same_f32(float a, float b) { return (isnan(a) && isnan(b)) || !memcmp(&a, &b, sizeof a); }

static void bits_case(twk_device *dev, twk_dtype t) {
    enum { V = 4096, D = 16, R = 9, E = 5, T = 7 };
    uint16_t *tab = malloc((size_t)V * D * 2);
    float *y = malloc((size_t)V * D * 4);
    int32_t *ids = malloc((size_t)V * 4);
    for (int i = 0; i < V * D; i++) tab[i] = (uint16_t)i;
    for (int i = 0; i < V; i++) ids[i] = (i * 7) % V; /* a permutation: every row once */
    int64_t st[2] = {V, D}, si[1] = {V};
    twk_graph *g = twk_graph_new();
    twk_id Tb = twk_param_dtype(g, "table", t, 2, st, false), I = twk_input(g, "ids", TWK_I32, 1, si);
    twk_id Y = twk_get_rows(g, Tb, I);
    twk_graph_output(g, Y);
    twk_plan *p = NULL;
    int ok = twk_plan_compile(g, dev, 1, NULL, 0, &p) == TWK_OK &&
             twk_plan_write(p, Tb, 1, tab, (size_t)V * D * 2) == TWK_OK &&
             twk_plan_write(p, I, 1, ids, (size_t)V * 4) == TWK_OK && twk_plan_run(p, 1) == TWK_OK &&
             twk_plan_read(p, Y, 1, y, (size_t)V * D * 4) == TWK_OK;
    int bad = 0;
    for (int i = 0; ok && i < V; i++)
        for (int d = 0; d < D; d++) {
            uint16_t h = tab[ids[i] * D + d];
            bad += !same_f32(y[i * D + d], t == TWK_BF16 ? twk_bf16_to_f32(h) : twk_f16_to_f32(h));
        }
    char what[200];
    snprintf(what, sizeof what, "every %s bit pattern widened by get_rows as the host widens it (%d differ)",
             twk_dtype_name(t), bad);
    check(ok && !bad, what);
    twk_plan_free(p);
    twk_graph_free(g);
    free(tab), free(y), free(ids);

    static const uint32_t special[] = {
        0x00000000, 0x80000000, 0x3f800000, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0xffc12345,
        0x477fe000 /* 65504 */, 0x477fefff /* 65519 */, 0x477ff000 /* 65520 */, 0x7f7fffff, 0xff7fffff,
        0x33800000 /* 2^-24 */, 0x33000000 /* 2^-25: a tie to 0 */, 0x33000001, 0x33c00000 /* 1.5 2^-24 */,
        0x38800000 /* 2^-14 */, 0x387fffff, 0x387fe000, 0x3f801000 /* f16 tie, to even */, 0x3f803000,
        0x3f808000 /* bf16 tie, to even */, 0x3f818000, 0x3f807fff, 0x00000001, 0x807fffff, 0x00400000,
        0xc7000100, 0x40490fdb, 0xbf7fffff, 0x3effffff, 0x477fefff, 0x4b7fffff, 0x3f800001};
    _Static_assert(sizeof special / sizeof special[0] == T * E, "one value per cache element written");
    float x[T * E];
    memcpy(x, special, sizeof x);
    int32_t rows[T] = {0, 1, 2, 3, 5, 6, 8};
    uint16_t init[R * E], got[R * E];
    for (int i = 0; i < R * E; i++) init[i] = (uint16_t)(0xa5a5u + 977u * (unsigned)i);
    int64_t sc[3] = {R, 1, E}, sx[3] = {T, 1, E}, s1[1] = {T};
    g = twk_graph_new();
    twk_id Kc = twk_param_dtype(g, "kc", t, 3, sc, false), X = twk_input(g, "x", TWK_F32, 3, sx);
    twk_id Rw = twk_input(g, "rows", TWK_I32, 1, s1);
    twk_graph_output(g, twk_kv_write(g, Kc, X, Rw));
    p = NULL;
    ok = twk_plan_compile(g, dev, 1, NULL, 0, &p) == TWK_OK && twk_plan_write(p, Kc, 1, init, sizeof init) == TWK_OK &&
         twk_plan_write(p, X, 1, x, sizeof x) == TWK_OK && twk_plan_write(p, Rw, 1, rows, sizeof rows) == TWK_OK &&
         twk_plan_run(p, 1) == TWK_OK && twk_plan_read(p, Kc, 1, got, sizeof got) == TWK_OK;
    uint16_t want[R * E];
    memcpy(want, init, sizeof want);
    for (int i = 0; i < T * E; i++)
        want[rows[i / E] * E + i % E] = t == TWK_BF16 ? twk_f32_to_bf16(x[i]) : twk_f32_to_f16(x[i]);
    bad = 0;
    for (int i = 0; ok && i < R * E; i++) bad += got[i] != want[i];
    snprintf(what, sizeof what, "kv_write of %d edge values into %s rows of %d halves: host rounding, unwritten halves kept "
             "(%d differ)", T * E, twk_dtype_name(t), E, bad);
    check(ok && !bad, what);
    twk_plan_free(p);
    twk_graph_free(g);
}

/* kv_write of f32 keys/values into 16-bit caches, then attn_cache over them, against a float64
 * softmax attention of the rounded keys/values: |err| <= 1e-5 (f32 dots of D = 16 terms
 * and an f32 softmax of <= 9 rows; the values are <= 1). */
static void kv_case(twk_device *dev, twk_dtype t) {
    enum { R = 12, H = 2, D = 16, T = 9 };
    float x[T * H * D], v[T * H * D], q[T * H * D], o[T * H * D];
    int32_t rows[T], lo[T], hi[T];
    for (int i = 0; i < T * H * D; i++) x[i] = urand(), v[i] = urand(), q[i] = urand();
    for (int i = 0; i < T; i++) rows[i] = i + 2, lo[i] = 2, hi[i] = i + 3; /* causal over rows 2.. */
    int64_t sc[3] = {R, H, D}, sx[3] = {T, H, D}, s1[1] = {T};
    twk_graph *g = twk_graph_new();
    twk_id Kc = twk_param_dtype(g, "kc", t, 3, sc, false), Vc = twk_param_dtype(g, "vc", t, 3, sc, false);
    twk_id X = twk_input(g, "k", TWK_F32, 3, sx), Vx = twk_input(g, "v", TWK_F32, 3, sx), Q = twk_input(g, "q", TWK_F32, 3, sx);
    twk_id Rw = twk_input(g, "rows", TWK_I32, 1, s1), Lo = twk_input(g, "lo", TWK_I32, 1, s1), Hi = twk_input(g, "hi", TWK_I32, 1, s1);
    twk_id kc = twk_kv_write(g, Kc, X, Rw), vc = twk_kv_write(g, Vc, Vx, Rw);
    twk_id O = twk_attention_cached(g, Q, kc, vc, Lo, Hi, 0.25f);
    twk_graph_output(g, O);
    twk_plan *p = NULL;
    double worst = INFINITY;
    if (twk_plan_compile(g, dev, 1, NULL, 0, &p) == TWK_OK && twk_plan_write(p, X, 1, x, sizeof x) == TWK_OK &&
        twk_plan_write(p, Vx, 1, v, sizeof v) == TWK_OK && twk_plan_write(p, Q, 1, q, sizeof q) == TWK_OK &&
        twk_plan_write(p, Rw, 1, rows, sizeof rows) == TWK_OK && twk_plan_write(p, Lo, 1, lo, sizeof lo) == TWK_OK &&
        twk_plan_write(p, Hi, 1, hi, sizeof hi) == TWK_OK && twk_plan_run(p, 1) == TWK_OK &&
        twk_plan_read(p, O, 1, o, sizeof o) == TWK_OK) {
        worst = 0;
        float kr[T * H * D], vr[T * H * D];
        memcpy(kr, x, sizeof kr), memcpy(vr, v, sizeof vr); /* rounded as the caches hold them */
        twk_dtype_round(t, kr, T * H * D), twk_dtype_round(t, vr, T * H * D);
        for (int i = 0; i < T; i++)
            for (int hh = 0; hh < H; hh++) {
                double s[T], mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    s[j] = 0;
                    for (int d = 0; d < D; d++) s[j] += (double)q[(i * H + hh) * D + d] * kr[(j * H + hh) * D + d];
                    s[j] *= 0.25;
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int j = 0; j <= i; j++) sum += s[j] = exp(s[j] - mx);
                for (int d = 0; d < D; d++) {
                    double ref = 0;
                    for (int j = 0; j <= i; j++) ref += s[j] / sum * vr[(j * H + hh) * D + d];
                    double e = fabs(o[(i * H + hh) * D + d] - ref);
                    worst = e > worst ? e : worst;
                }
            }
    }
    /* the cache's bits: every written row narrowed with round to nearest even (hal/half.c) */
    uint16_t kh[R * H * D];
    int exact = p && twk_plan_read(p, Kc, 1, kh, sizeof kh) == TWK_OK;
    for (int i = 0; exact && i < T * H * D; i++)
        exact = kh[2 * H * D + i] == (t == TWK_BF16 ? twk_f32_to_bf16(x[i]) : twk_f32_to_f16(x[i]));
    char what[160];
    snprintf(what, sizeof what, "kv_write + attn_cache in %s caches: max |err| %.2e <= 1e-5; cache bits = host rounding",
             twk_dtype_name(t), worst);
    check(worst <= 1e-5 && exact, what);
    twk_plan_free(p);
    twk_graph_free(g);
}

/* Training attention over 16-bit q, k, v (each widened as read, f32 after): on the device, the
 * forward over bf16 / f16 q, k and v, and each gradient with the other two operands 16-bit (dQ
 * over 16-bit k, v; dK over q, v; dV over q, k: a 16-bit tensor is frozen), equal bit for bit to
 * the same graph over f32 tensors holding the widened values; and the device declares all three
 * sources of attn / attn_back and q, k of attn_lse (twk_device_half_srcs). T = 40 tokens in
 * segments of 1, 2 and 37 (longer than a tile), 4 query heads over 2 kv heads, head size 64. */
static void attn_case(twk_device *dev, twk_dtype t) {
    enum { T = 40, HQ = 4, HK = 2, D = 64, NQ = T * HQ * D, NK = T * HK * D };
    static uint16_t qh[NQ], kh[NK], vh[NK];
    static float qw[NQ], kw[NK], vw[NK], r[NQ], ref[4][NQ], got[4][NQ];
    int32_t seg[T];
    for (int i = 0; i < T; i++) seg[i] = i < 1 ? 0 : i < 3 ? 1 : 3;
    random_half(t, NQ, qh, qw), random_half(t, NK, kh, kw), random_half(t, NK, vh, vw);
    for (int i = 0; i < NQ; i++) r[i] = urand();
    int64_t sq[3] = {T, HQ, D}, sk[3] = {T, HK, D}, s1[1] = {T};
    twk_graph *g = twk_graph_new();
    twk_id Qh = twk_param_dtype(g, "qh", t, 3, sq, false), Kh = twk_param_dtype(g, "kh", t, 3, sk, false);
    twk_id Vh = twk_param_dtype(g, "vh", t, 3, sk, false), S = twk_input(g, "seg", TWK_I32, 1, s1);
    twk_id R = twk_input(g, "r", TWK_F32, 3, sq);
    /* f32 copies: set 0 (all three, the reference), and one each beside the 16-bit others */
    twk_id Q0 = twk_param(g, "q0", 3, sq, true), K0 = twk_param(g, "k0", 3, sk, true), V0 = twk_param(g, "v0", 3, sk, true);
    twk_id Q1 = twk_param(g, "q1", 3, sq, true), K2 = twk_param(g, "k2", 3, sk, true), V3 = twk_param(g, "v3", 3, sk, true);
    const float sc = 0.125f;
    twk_id O0 = twk_attention(g, Q0, K0, V0, S, sc), Oh = twk_attention(g, Qh, Kh, Vh, S, sc);
    twk_id L = twk_weighted_sum(g, O0, R);
    L = twk_add(g, L, twk_weighted_sum(g, twk_attention(g, Q1, Kh, Vh, S, sc), R));
    L = twk_add(g, L, twk_weighted_sum(g, twk_attention(g, Qh, K2, Vh, S, sc), R));
    L = twk_add(g, L, twk_weighted_sum(g, twk_attention(g, Qh, Kh, V3, S, sc), R));
    int ok = twk_graph_status(g) == TWK_OK && twk_graph_backward(g, L) == TWK_OK;
    twk_id outs[4][2] = {{O0, Oh}, {-1, -1}, {-1, -1}, {-1, -1}}; /* (f32 reference, 16-bit operands) */
    if (ok) {
        outs[1][0] = twk_graph_grad(g, Q0), outs[1][1] = twk_graph_grad(g, Q1);
        outs[2][0] = twk_graph_grad(g, K0), outs[2][1] = twk_graph_grad(g, K2);
        outs[3][0] = twk_graph_grad(g, V0), outs[3][1] = twk_graph_grad(g, V3);
        for (int i = 0; i < 4; i++) twk_graph_output(g, outs[i][0]), twk_graph_output(g, outs[i][1]);
    }
    twk_plan *p = NULL;
    ok = ok && twk_plan_compile(g, dev, 1, NULL, 0, &p) == TWK_OK;
    const twk_id ins[] = {Qh, Kh, Vh, S, R, Q0, K0, V0, Q1, K2, V3};
    const void *data[] = {qh, kh, vh, seg, r, qw, kw, vw, qw, kw, vw};
    const size_t bytes[] = {sizeof qh, sizeof kh, sizeof vh, sizeof seg, sizeof r, sizeof qw, sizeof kw, sizeof vw,
                            sizeof qw, sizeof kw, sizeof vw};
    for (int i = 0; ok && i < 11; i++) ok = twk_plan_write(p, ins[i], 1, data[i], bytes[i]) == TWK_OK;
    ok = ok && twk_plan_run(p, 1) == TWK_OK;
    static const char *const names[4] = {"o", "dQ", "dK", "dV"};
    int64_t differ[4] = {0}, n[4] = {NQ, NQ, NK, NK};
    for (int i = 0; ok && i < 4; i++) {
        ok = twk_plan_read(p, outs[i][0], 1, ref[i], (size_t)n[i] * 4) == TWK_OK &&
             twk_plan_read(p, outs[i][1], 1, got[i], (size_t)n[i] * 4) == TWK_OK;
        for (int64_t e = 0; ok && e < n[i]; e++) differ[i] += !same_f32(ref[i][e], got[i][e]);
    }
    unsigned all = TWK_SRC(0) | TWK_SRC(1) | TWK_SRC(2);
    int declared = twk_device_half_srcs(dev, TWK_OP_ATTN) == all && twk_device_half_srcs(dev, TWK_OP_ATTN_BACK) == all &&
                   twk_device_half_srcs(dev, TWK_OP_ATTN_LSE) == (TWK_SRC(0) | TWK_SRC(1));
    for (int i = 0; i < 4; i++) {
        char what[200];
        snprintf(what, sizeof what, "attention %s over %s operands = over their f32 widening, bit for bit: %lld of %lld differ",
                 names[i], twk_dtype_name(t), (long long)differ[i], (long long)n[i]);
        check(ok && differ[i] == 0, what);
    }
    check(declared, "the device declares 16-bit q, k, v for attn / attn_back and q, k for attn_lse");
    twk_plan_free(p);
    twk_graph_free(g);
}

/* A fixture model held in bf16 against the same bf16 values held in f32 (loaded as bf16, widened
 * with twk_model_convert): logprobs, loss and LoRA gradients agree to f32 summation order
 * (|err| <= 2e-4 on logprobs of ~-7, relative 1e-3 of the largest gradient), and greedy decoding
 * with bf16 KV caches picks the same tokens as with f32 ones (the fixture's top-1/top-2 gaps
 * exceed 1e-3). */
static void model_case(twk_device *dev, const char *dir) {
    twk_model *mh = NULL, *mf = NULL;
    if (twk_model_load_as(dir, dev, TWK_BF16, -1, &mh) != TWK_OK || twk_model_load_as(dir, dev, TWK_BF16, TWK_F32, &mf) != TWK_OK ||
        twk_model_convert(mf, TWK_F32) != TWK_OK) {
        check(0, "load the fixture model in bf16");
        twk_model_free(mh), twk_model_free(mf);
        return;
    }
    char dtypes[160];
    snprintf(dtypes, sizeof dtypes, "model dtypes: bf16 held as %s (KV %s), converted copy %s", twk_dtype_name(twk_model_dtype(mh)),
             twk_dtype_name(twk_model_kv_dtype(mh)), twk_dtype_name(twk_model_dtype(mf)));
    check(twk_model_dtype(mh) == TWK_BF16 && twk_model_dtype(mf) == TWK_F32 && twk_model_kv_dtype(mh) == TWK_BF16, dtypes);
    enum { T = 24 };
    int32_t tok[T], tgt[T], pos[T], seg[T];
    float wts[T], lp_h[T], lp_f[T], loss_h = 0, loss_f = 0;
    int vocab = twk_model_cfg(mh)->vocab;
    for (int i = 0; i < T; i++) {
        tok[i] = (i * 37 + 11) % vocab, tgt[i] = (i * 53 + 5) % vocab;
        pos[i] = i < 10 ? i : i - 10, seg[i] = i < 10 ? 0 : 10, wts[i] = i % 3 ? 1.0f : 0.5f;
    }
    twk_batch b = {.n = T, .tokens = tok, .targets = tgt, .positions = pos, .seg_start = seg, .weights = wts};
    twk_lora_config lc = twk_lora_default();
    lc.rank = 4, lc.seed = 3;
    twk_trainer *th = NULL, *tf = NULL;
    int ok = twk_trainer_new(mh, &lc, T, &th) == TWK_OK && twk_trainer_new(mf, &lc, T, &tf) == TWK_OK;
    /* a nonzero B so that A gets a gradient too */
    for (int i = 0; ok && i < twk_trainer_param_count(th); i++) {
        int64_t ne = 0;
        const char *name = twk_trainer_param_name(th, i, &ne);
        float *v = malloc((size_t)ne * 4);
        ok = twk_trainer_get(th, name, v, ne) == TWK_OK;
        for (int64_t k = 0; ok && strstr(name, "lora_B") && k < ne; k++) v[k] = 0.05f * urand();
        ok = ok && twk_trainer_set(th, name, v, ne) == TWK_OK && twk_trainer_set(tf, name, v, ne) == TWK_OK;
        free(v);
    }
    ok = ok && twk_trainer_forward_backward(th, &b, lp_h, &loss_h) == TWK_OK &&
         twk_trainer_forward_backward(tf, &b, lp_f, &loss_f) == TWK_OK;
    double lp_err = 0, g_err = 0, g_max = 0;
    for (int i = 0; ok && i < T; i++) lp_err = fmax(lp_err, fabs(lp_h[i] - lp_f[i]));
    for (int i = 0; ok && i < twk_trainer_param_count(th); i++) {
        int64_t n1 = 0, n2 = 0;
        float *gh = twk_trainer_grad_data(th, i, &n1), *gf = twk_trainer_grad_data(tf, i, &n2);
        for (int64_t k = 0; gh && gf && n1 == n2 && k < n1; k++)
            g_err = fmax(g_err, fabs(gh[k] - gf[k])), g_max = fmax(g_max, fabs(gf[k]));
    }
    char what[200];
    snprintf(what, sizeof what, "model in bf16 vs the same values in f32: logprobs max |err| %.2e <= 2e-4, loss %.6f vs %.6f, "
             "LoRA grads max |err| %.2e <= 1e-3 x %.3e", lp_err, loss_h, loss_f, g_err, g_max);
    check(ok && lp_err <= 2e-4 && g_err <= 1e-3 * g_max && g_max > 0, what);
    twk_trainer_free(th), twk_trainer_free(tf);

    /* greedy decoding: bf16 weights + bf16 KV caches vs f32 copies + f32 caches */
    twk_sampler *sh = NULL, *sf = NULL;
    twk_sampled_seq oh[1] = {0}, of[1] = {0};
    int32_t prompt[6] = {1, 5, 9, 22, 40, 3};
    twk_sample_params sp = {.max_tokens = 12, .temperature = 0, .top_k = -1, .top_p = 1};
    ok = twk_sampler_new(mh, NULL, 1, 64, &sh) == TWK_OK && twk_sampler_new(mf, NULL, 1, 64, &sf) == TWK_OK &&
         twk_sampler_generate(sh, prompt, 6, 1, &sp, oh) == TWK_OK && twk_sampler_generate(sf, prompt, 6, 1, &sp, of) == TWK_OK;
    int same = ok && oh[0].n == of[0].n;
    double dlp = 0;
    for (int i = 0; same && i < oh[0].n; i++) {
        same = oh[0].tokens[i] == of[0].tokens[i];
        dlp = fmax(dlp, fabs(oh[0].logprobs[i] - of[0].logprobs[i]));
    }
    snprintf(what, sizeof what, "greedy decoding, bf16 weights + bf16 KV cache: same %d tokens as f32, logprobs max |err| %.2e "
             "(bf16 cache rounding) <= 5e-2", ok ? (int)oh[0].n : 0, dlp);
    check(same && dlp <= 5e-2, what);
    twk_sampled_seq_free(oh), twk_sampled_seq_free(of);
    twk_sampler_free(sh), twk_sampler_free(sf);
    twk_model_free(mh), twk_model_free(mf);
}

/* The demo task (examples/tinker_lora_demo.py: continue counting on a clock of 32 digits, ids
 * 100..131; rank 16, AdamW lr 5e-3, 40 steps of 16 sequences of 16 targets) on the built-in
 * model, its weights in f32 and in bf16, the same LoRA init and batches: the mean held-out
 * logprob per token after training agrees within 0.01 nats (bf16 rounding of the random base
 * weights, std 0.02, moves each by <= 2^-9 relative; the adapter absorbs it), and both learn
 * (from about -6.3 to above -0.5). Returns 0 on failure. */
static double demo_run(twk_dtype t, double *before) {
    enum { DIGITS = 32, FIRST = 100, LEN = 16, BATCH = 16, STEPS = 40, N = BATCH * LEN };
    twk_device *dev = NULL;
    twk_model *m = NULL;
    twk_trainer *tr = NULL;
    double heldout = NAN;
    int32_t tok[N], tgt[N], pos[N], seg[N];
    float w[N], lp[N], loss = 0;
    twk_batch b = {.n = N, .tokens = tok, .targets = tgt, .positions = pos, .seg_start = seg, .weights = w};
    twk_lora_config lc = twk_lora_default();
    lc.rank = 16, lc.alpha = 32, lc.seed = 1, lc.train_unembed = 1; /* the service's default targets */
    twk_adam_params ap = twk_adam_default();
    ap.learning_rate = 5e-3f, ap.beta1 = 0.9f, ap.beta2 = 0.95f, ap.eps = 1e-8f;
    if (twk_device_open("cpu", &dev) != TWK_OK || twk_model_builtin(dev, &m) != TWK_OK || twk_model_convert(m, t) != TWK_OK ||
        twk_trainer_new(m, &lc, N, &tr) != TWK_OK)
        goto out;
    uint64_t seed = 7;
    for (int step = 0; step <= STEPS; step++) {
        for (int s = 0; s < BATCH; s++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            int start = step == STEPS ? s * 2 + 1 : (int)(seed >> 33) % DIGITS; /* the last batch: held out */
            for (int i = 0; i < LEN; i++) {
                int k = s * LEN + i;
                tok[k] = FIRST + (start + i) % DIGITS, tgt[k] = FIRST + (start + i + 1) % DIGITS;
                pos[k] = i, seg[k] = s * LEN, w[k] = 1;
            }
        }
        if (step == STEPS || step == 0) { /* held-out logprob before and after training */
            if (twk_trainer_forward(tr, &b, lp, &loss) != TWK_OK) goto out;
            double sum = 0;
            for (int k = 0; k < N; k++) sum += lp[k];
            if (step == 0) *before = sum / N;
            else heldout = sum / N;
            if (step == STEPS) break;
        }
        if (twk_trainer_forward_backward(tr, &b, NULL, &loss) != TWK_OK || twk_trainer_optim_step(tr, &ap, NULL) != TWK_OK)
            goto out;
    }
out:
    if (isnan(heldout)) printf("     demo run in %s: %s\n", twk_dtype_name(t), twk_last_error());
    twk_trainer_free(tr);
    twk_model_free(m);
    twk_device_close(dev);
    return heldout;
}

static void demo_case(void) {
    double b32 = 0, b16 = 0, f32 = demo_run(TWK_F32, &b32), bf16 = demo_run(TWK_BF16, &b16);
    char what[200];
    snprintf(what, sizeof what, "demo task: held-out logprob/token %.4f -> %.4f (f32), %.4f -> %.4f (bf16); |diff| %.4f <= 0.01",
             b32, f32, b16, bf16, fabs(f32 - bf16));
    check(fabs(f32 - bf16) <= 0.01 && f32 > -0.5 && bf16 > -0.5, what);
}

/* A 16-bit trainable parameter is refused; each backend compiles a bf16 matmul exactly when
 * it declares 16-bit matmul weights, and otherwise refuses it naming itself and the dtype. */
static void refusals(void) {
    int64_t s[2] = {4, 4};
    twk_graph *g = twk_graph_new();
    twk_param_dtype(g, "w", TWK_BF16, 2, s, true);
    check(twk_graph_status(g) == TWK_ERR_DTYPE && strstr(twk_graph_error(g), "bf16"),
          "a trainable bf16 parameter is refused (trainable parameters are f32)");
    twk_graph_free(g);
    static const char *const others[] = {"opencl", "vulkan", "cuda"};
    for (int i = 0; i < 3; i++) {
        twk_device *dev = NULL;
        if (twk_device_open(others[i], &dev) != TWK_OK) {
            printf("skip %s: no device\n", others[i]);
            continue;
        }
        g = twk_graph_new();
        int64_t sa[2] = {3, 4};
        twk_id A = twk_input(g, "a", TWK_F32, 2, sa), B = twk_param_dtype(g, "b", TWK_BF16, 2, s, false);
        twk_graph_output(g, twk_matmul(g, A, B, false, true));
        twk_plan *p = NULL;
        twk_status st = twk_plan_compile(g, dev, 1, NULL, 0, &p);
        int declared = (twk_device_half_srcs(dev, TWK_OP_MATMUL) & TWK_SRC(1)) != 0;
        char what[160];
        if (declared) {
            snprintf(what, sizeof what, "%s declares 16-bit matmul weights and compiles a bf16 matmul", others[i]);
            check(st == TWK_OK, what);
        } else {
            snprintf(what, sizeof what, "%s has no 16-bit matmul and refuses a bf16 matmul, naming the backend and dtype",
                     others[i]);
            check(st == TWK_ERR_UNSUPPORTED && strstr(twk_last_error(), others[i]) && strstr(twk_last_error(), "bf16"), what);
        }
        if (st != TWK_OK) printf("     (%s)\n", twk_last_error());
        twk_plan_free(p);
        twk_graph_free(g);
        /* the experts' grouped product over a bf16 stack, and its dX (the stack read transposed) */
        g = twk_graph_new();
        int64_t sx[2] = {3, 4}, sw[3] = {2, 5, 4}, ss[1] = {3};
        twk_id X = twk_param(g, "x", 2, sx, true), W = twk_param_dtype(g, "w", TWK_BF16, 3, sw, false);
        twk_id S = twk_input(g, "slot", TWK_I32, 1, ss), Y = twk_lora_gather_grouped(g, X, W, S, false);
        twk_id L = twk_sum(g, Y);
        p = NULL;
        twk_graph_output(g, Y);
        if (twk_graph_backward(g, L) == TWK_OK) twk_graph_output(g, twk_graph_grad(g, X));
        st = twk_graph_status(g) == TWK_OK ? twk_plan_compile(g, dev, 1, NULL, 0, &p) : twk_graph_status(g);
        declared = (twk_device_half_srcs(dev, TWK_OP_LORA_GATHER) & TWK_SRC(1)) != 0;
        if (declared) {
            snprintf(what, sizeof what, "%s declares 16-bit expert stacks and compiles a bf16 grouped lora_gather with its dX", others[i]);
            check(st == TWK_OK, what);
        } else {
            snprintf(what, sizeof what, "%s has no 16-bit lora_gather and refuses a bf16 stack, naming the backend and dtype", others[i]);
            check(st == TWK_ERR_UNSUPPORTED && strstr(twk_last_error(), others[i]) && strstr(twk_last_error(), "bf16"), what);
        }
        if (st != TWK_OK) printf("     (%s)\n", twk_last_error());
        twk_plan_free(p);
        twk_graph_free(g);
        twk_device_close(dev);
    }
}

int main(int argc, char **argv) {
    twk_device *dev = NULL;
    const char *spec = getenv("TWK_TEST_DEVICE");
    if (!spec || !spec[0]) spec = "cpu";
    if (twk_device_open(spec, &dev) != TWK_OK) {
        printf("FAIL: no %s device (%s)\n", spec, twk_last_error());
        return 1;
    }
    int on_cpu = !strncmp(spec, "cpu", 3);
    printf("device %s\n", spec);
    static const twk_dtype types[2] = {TWK_BF16, TWK_F16};
    /* training plans: sgemm panels at every M (several panels when N K > 2^20), odd K tails */
    static const int64_t shapes[][3] = {{1, 100, 130}, {5, 37, 70}, {16, 64, 33}, {17, 100, 130}, {40, 64, 17000}};
    for (int ti = 0; ti < 2; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (int tb = 0; tb < 2; tb++) {
                const int64_t *sh = shapes[si];
                double e = matmul_case(dev, types[ti], sh[0], sh[1], sh[2], tb, sh[2] < 1000);
                char what[200];
                snprintf(what, sizeof what, "matmul f32 x %s [M %lld, K %lld, N %lld]%s%s: worst err / (K 2^-23 sum|ab|) = %.3f <= 1",
                         twk_dtype_name(types[ti]), (long long)sh[0], (long long)sh[1], (long long)sh[2], tb ? " b^T" : "",
                         sh[2] < 1000 ? " + dX = dY W" : "", e);
                check(e <= 1, what);
            }
    /* a sampler's plan (CPU: the skinny kernel up to M = 16, widened in registers; M = 17 the panels):
     * M 1, 2, 3, 7, 8, 9, 16, 17; K 37 / 100 / 1029 (not multiples of 8 or 16); N odd, below and above
     * the kernel's blocks (4 rows of b^T, 32 columns of b); 4099 x 1024 splits over the threads */
    static const int64_t sshapes[][3] = {{1, 37, 33},  {2, 100, 77}, {3, 1029, 131},  {7, 37, 77}, {8, 100, 5},
                                         {9, 37, 33},  {16, 100, 77}, {17, 37, 33}, {1, 1024, 4099}, {3, 16, 1},
                                         {1, 7, 3}};
    for (int ti = 0; ti < 2; ti++)
        for (size_t si = 0; si < sizeof sshapes / sizeof sshapes[0]; si++)
            for (int tb = 0; tb < 2; tb++) {
                const int64_t *sh = sshapes[si];
                double mx = 0, e = matmul_case_ex(dev, types[ti], sh[0], sh[1], sh[2], tb, 0, 1, &mx, NULL);
                char what[220];
                snprintf(what, sizeof what,
                         "matmul f32 x %s [M %lld, K %lld, N %lld]%s in a sampling plan: worst err / (K 2^-23 sum|ab|) = %.3f <= 1 (max |err| %.2e)",
                         twk_dtype_name(types[ti]), (long long)sh[0], (long long)sh[1], (long long)sh[2], tb ? " b^T" : "", e, mx);
                check(e <= 1, what);
            }
    /* in a sampling plan a row's result does not depend on the rows beside it: row 0 of M = 7, 8 and 16
     * (same a row, same b) equal M = 1's bit for bit (the CPU's kernel; devices promise no such thing) */
    for (int ti = 0; on_cpu && ti < 2; ti++)
        for (int tb = 0; tb < 2; tb++) {
            enum { K1 = 1029, N1 = 135 };
            static float y1[N1], y7[16 * N1];
            int same = 1;
            rng_state = 12345;
            double e = matmul_case_ex(dev, types[ti], 1, K1, N1, tb, 0, 1, NULL, y1);
            for (int64_t m = 7; m <= 16; m += m == 8 ? 8 : 1) {
                rng_state = 12345;
                e += matmul_case_ex(dev, types[ti], m, K1, N1, tb, 0, 1, NULL, y7);
                same = same && !memcmp(y1, y7, sizeof y1);
            }
            char what[200];
            snprintf(what, sizeof what, "matmul f32 x %s [K %d, N %d]%s in a sampling plan: row 0 at M = 7, 8, 16 = at M = 1, bit for bit",
                     twk_dtype_name(types[ti]), K1, N1, tb ? " b^T" : "");
            check(same && isfinite(e), what);
        }
    for (int ti = 0; ti < 2; ti++)
        get_rows_case(dev, types[ti]), kv_case(dev, types[ti]), bits_case(dev, types[ti]), attn_case(dev, types[ti]);
    const char *dir = argc > 1 ? argv[1] : NULL;
    if (dir) model_case(dev, dir);
    for (int ti = 0; ti < 2; ti++)
        for (int trans = 0; trans < 2; trans++) {
            double a = 0, e = grouped_case(dev, types[ti], trans, &a);
            char what[240];
            snprintf(what, sizeof what, "lora_gather grouped (runs of 1..30 rows) over a %s expert stack%s: worst err / bound = %.3f <= 1 (max |err| %.2e)",
                     twk_dtype_name(types[ti]), trans ? " read transposed (dX = dY W)" : "", e, a);
            check(e <= 1, what);
        }
    if (on_cpu) demo_case(), refusals(); /* once, on the CPU run: 40 training steps; every backend opened */
    twk_device_close(dev);
    printf("%s\n", fails ? "FAILED" : "all ok");
    return fails != 0;
}
