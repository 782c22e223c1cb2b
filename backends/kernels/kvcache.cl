/* Decoding with a KV cache: rows of x written into the cache in place, and
 * the per-row matrix product of several LoRA adapters in one batch.
 * (Attention over cache rows is attn_fwd_f32 mode 1, in attn.cl.) */

/* cache[rows[t], :] = x[t, :] for x [T, E] (E = H * D); one item per element */
TWK_KERNEL kv_write_f32(TWK_GLOBAL float *cache, long cache_off, TWK_GLOBAL const float *x, long x_off,
                        TWK_GLOBAL const int *rows, long rows_off, TWK_GLOBAL int *err, long err_off, long T,
                        long E, long R, int is64) {
    long i = TWK_GID(0);
    if (i >= T * E) return;
    long t = i / E, e = i % E;
    long r = kd_id(rows + rows_off, t, is64);
    if (r < 0 || r >= R) {
        err[err_off] = KD_ERR_ID_RANGE;
        return;
    }
    cache[cache_off + r * E + e] = x[x_off + i];
}

/* y[t, n] = w[slot[t], n, :] . x[t, :] for x [T, K], w [S, N, K] (trans: w [S, K, N] and
 * y[t, n] = w[slot[t], :, n] . x[t, :]); one item per (t, n), the sum over k in order from 0.
 * KD_W(j) reads element j of w (f32, or 16-bit widened). */
#define KD_LORA_GATHER_BODY \
    long i = TWK_GID(0); \
    if (i >= T * N) return; \
    long t = i / N, n = i % N; \
    long sl = kd_id(slot + slot_off, t, is64); \
    if (sl < 0 || sl >= S) { \
        err[err_off] = KD_ERR_ID_RANGE; \
        y[y_off + i] = 0.0f; \
        return; \
    } \
    long wn = trans ? 1 : K, wk = trans ? N : 1, wb = w_off + sl * N * K + n * wn; \
    const TWK_GLOBAL float *xt = x + x_off + t * K; \
    float s = 0.0f; \
    for (long k = 0; k < K; k++) s += KD_W(wb + k * wk) * xt[k]; \
    y[y_off + i] = s;

#define KD_W(j) w[j]
TWK_KERNEL lora_gather_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *x, long x_off,
                           TWK_GLOBAL const float *w, long w_off, TWK_GLOBAL const int *slot, long slot_off,
                           TWK_GLOBAL int *err, long err_off, long T, long N, long K, long S, int is64, int trans) {
    KD_LORA_GATHER_BODY
}
#undef KD_W

/* lora_gather_f32 over a 16-bit stack (frozen bf16 / f16 expert weights: f16 = 1 for f16), widened
 * as read, the same f32 sums; w_off in 2-byte elements */
#define KD_W(j) kd_h16(w, (j), f16)
TWK_KERNEL lora_gather_h16(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *x, long x_off,
                           TWK_GLOBAL const ushort *w, long w_off, TWK_GLOBAL const int *slot, long slot_off,
                           TWK_GLOBAL int *err, long err_off, long T, long N, long K, long S, int is64, int trans,
                           int f16) {
    KD_LORA_GATHER_BODY
}
#undef KD_W

/* dw[s, n, k] = sum over the tokens t of slot s, in order, of dy[t, n] x[t, k]
 * for x [T, K], dy [T, N]; one item per (n, k) walks the tokens once for every slot, each slot's
 * running sum parked in dw while other slots' tokens pass (the same sums, in the same order) */
TWK_KERNEL lora_gather_back_f32(TWK_GLOBAL float *dw, long dw_off, TWK_GLOBAL const float *x, long x_off,
                                TWK_GLOBAL const float *dy, long dy_off, TWK_GLOBAL const int *slot, long slot_off,
                                TWK_GLOBAL int *err, long err_off, long T, long N, long K, long S, int is64) {
    long i = TWK_GID(0);
    if (i >= N * K) return;
    long n = i / K, k = i % K, slab = N * K, cur = -1;
    for (long s = 0; s < S; s++) dw[dw_off + s * slab + i] = 0.0f;
    float acc = 0.0f;
    for (long t = 0; t < T; t++) {
        long sl = kd_id(slot + slot_off, t, is64);
        if (sl < 0 || sl >= S) {
            err[err_off] = KD_ERR_ID_RANGE;
            continue;
        }
        if (sl != cur) {
            if (cur >= 0) dw[dw_off + cur * slab + i] = acc;
            cur = sl;
            acc = dw[dw_off + sl * slab + i];
        }
        acc += dy[dy_off + t * N + n] * x[x_off + t * K + k];
    }
    if (cur >= 0) dw[dw_off + cur * slab + i] = acc;
}
