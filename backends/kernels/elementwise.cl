/* Elementwise kernels: fill, scale, silu, gelu, tanh, swiglu and their gradients, add/mul
 * with b broadcast to a, broadcast and its adjoint sum_to. One work item per
 * output element (grids are rounded up; items past n return). Broadcast
 * shapes arrive as 4-D right-aligned dims with strides 0 where broadcast. */

TWK_KERNEL fill_f32(TWK_GLOBAL float *y, long y_off, long n, float v) {
    long i = TWK_GID(0);
    if (i < n) y[y_off + i] = v;
}

/* zeroes n int words (any dtype, by size) */
TWK_KERNEL zero_words(TWK_GLOBAL int *y, long y_off, long n) {
    long i = TWK_GID(0);
    if (i < n) y[y_off + i] = 0;
}

TWK_KERNEL scale_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *x, long x_off, long n, float s) {
    long i = TWK_GID(0);
    if (i < n) y[y_off + i] = x[x_off + i] * s;
}

TWK_KERNEL silu_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *x, long x_off, long n) {
    long i = TWK_GID(0);
    if (i >= n) return;
    float v = x[x_off + i];
    y[y_off + i] = v * kd_sigmoid(v);
}

TWK_KERNEL silu_back_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *x, long x_off,
                         TWK_GLOBAL const float *dy, long dy_off, long n) {
    long i = TWK_GID(0);
    if (i >= n) return;
    float v = x[x_off + i], s = kd_sigmoid(v);
    y[y_off + i] = dy[dy_off + i] * s * (1.0f + v * (1.0f - s));
}

/* GELU, tanh approximation: x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3) */
TWK_FN float kd_gelu_2u(float x) { return 1.5957691216057308f * (x + 0.044715f * x * x * x); }

TWK_KERNEL gelu_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *x, long x_off, long n) {
    long i = TWK_GID(0);
    if (i >= n) return;
    float v = x[x_off + i];
    y[y_off + i] = v * kd_sigmoid(kd_gelu_2u(v));
}

TWK_KERNEL gelu_back_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *x, long x_off,
                         TWK_GLOBAL const float *dy, long dy_off, long n) {
    long i = TWK_GID(0);
    if (i >= n) return;
    float v = x[x_off + i], s = kd_sigmoid(kd_gelu_2u(v));
    y[y_off + i] = dy[dy_off + i] * (s + v * s * (1.0f - s) * 1.5957691216057308f * (1.0f + 0.134145f * v * v));
}

/* tanh (Gemma's final-logit soft-cap), |x| clamped at 15 where tanh is 1 in float */
TWK_KERNEL tanh_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *x, long x_off, long n) {
    long i = TWK_GID(0);
    if (i >= n) return;
    y[y_off + i] = tanh(fmin(fmax(x[x_off + i], -15.0f), 15.0f));
}

TWK_KERNEL tanh_back_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *x, long x_off,
                         TWK_GLOBAL const float *dy, long dy_off, long n) {
    long i = TWK_GID(0);
    if (i >= n) return;
    float t = tanh(fmin(fmax(x[x_off + i], -15.0f), 15.0f));
    y[y_off + i] = dy[dy_off + i] * (1.0f - t * t);
}

TWK_KERNEL swiglu_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *g, long g_off,
                      TWK_GLOBAL const float *u, long u_off, long n) {
    long i = TWK_GID(0);
    if (i >= n) return;
    float v = g[g_off + i];
    y[y_off + i] = v * kd_sigmoid(v) * u[u_off + i];
}

/* which = 0: d/dgate, 1: d/dup */
TWK_KERNEL swiglu_back_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *g, long g_off,
                           TWK_GLOBAL const float *u, long u_off, TWK_GLOBAL const float *dy, long dy_off,
                           long n, int which) {
    long i = TWK_GID(0);
    if (i >= n) return;
    float v = g[g_off + i], s = kd_sigmoid(v), d = dy[dy_off + i];
    if (which == 0)
        y[y_off + i] = d * u[u_off + i] * s * (1.0f + v * (1.0f - s));
    else
        y[y_off + i] = d * v * s;
}

/* y = a op b, b indexed through strides st0..st3 over y's dims (B1, B2, B3
 * the inner three of the padded 4-D shape); op 0 add, 1 mul */
TWK_KERNEL binary_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *a, long a_off,
                      TWK_GLOBAL const float *b, long b_off, long n, long B1, long B2, long B3,
                      long st0, long st1, long st2, long st3, int op) {
    long i = TWK_GID(0);
    if (i >= n) return;
    long i3 = i % B3, r = i / B3;
    long i2 = r % B2;
    r /= B2;
    long i1 = r % B1, i0 = r / B1;
    float bv = b[b_off + i0 * st0 + i1 * st1 + i2 * st2 + i3 * st3];
    float av = a[a_off + i];
    y[y_off + i] = op == 0 ? av + bv : av * bv;
}

/* y (dims D0..D3) = x broadcast (strides st) times scale */
TWK_KERNEL broadcast_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *x, long x_off, long n,
                         long D1, long D2, long D3, long st0, long st1, long st2, long st3, float scale) {
    long i = TWK_GID(0);
    if (i >= n) return;
    long i3 = i % D3, r = i / D3;
    long i2 = r % D2;
    r /= D2;
    long i1 = r % D1, i0 = r / D1;
    y[y_off + i] = x[x_off + i0 * st0 + i1 * st1 + i2 * st2 + i3 * st3] * scale;
}

/* y (dims D0..D3) = x (dims S0..S3) summed over the dims where D is 1 and S
 * is not, in a fixed order (compensated), one item per output element */
TWK_KERNEL sum_to_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *x, long x_off, long n,
                      long D1, long D2, long D3, long S0, long S1, long S2, long S3) {
    long i = TWK_GID(0);
    if (i >= n) return;
    long d3 = i % D3, r = i / D3;
    long d2 = r % D2;
    r /= D2;
    long d1 = r % D1, d0 = r / D1;
    long t3 = 1, t2 = S3, t1 = S3 * S2, t0 = S3 * S2 * S1; /* src strides */
    long D0 = n / (D1 * D2 * D3);
    long n0 = D0 == S0 ? 1 : S0, n1 = D1 == S1 ? 1 : S1, n2 = D2 == S2 ? 1 : S2, n3 = D3 == S3 ? 1 : S3;
    float s = 0.0f, c = 0.0f;
    for (long a0 = 0; a0 < n0; a0++)
        for (long a1 = 0; a1 < n1; a1++)
            for (long a2 = 0; a2 < n2; a2++) {
                long base = (n0 == 1 ? d0 : a0) * t0 + (n1 == 1 ? d1 : a1) * t1 + (n2 == 1 ? d2 : a2) * t2;
                for (long a3 = 0; a3 < n3; a3++) kd_kahan(&s, &c, x[x_off + base + (n3 == 1 ? d3 : a3) * t3]);
            }
    y[y_off + i] = s;
}

/* FUSED_EW (graph/fuse.c): a chain of up to 8 same-shape maps in one kernel, the intermediates in
 * registers. Step k is w_k: bits 0..7 the map (1 add, 2 mul, 3 scale, 4 silu, 5 silu_back,
 * 6 swiglu, 7 swiglu_back, 8 gelu, 9 gelu_back, 10 tanh, 11 tanh_back; 0 ends the chain), bits
 * 8..11, 12..15, 16..19 its operands (0..5 the sources s0..s5, 6 + j step j's result), bit 20
 * swiglu_back's which; f_k scale's factor. Each map is its own kernel's expression above. */
TWK_FN float kd_fused_step(int op, float a, float b, float c, int which, float f) {
    float s;
    switch (op) {
    case 1: return a + b;
    case 2: return a * b;
    case 3: return a * f;
    case 4: return a * kd_sigmoid(a);
    case 5: s = kd_sigmoid(a); return b * s * (1.0f + a * (1.0f - s));
    case 6: return a * kd_sigmoid(a) * b;
    case 7: s = kd_sigmoid(a); return which == 0 ? c * b * s * (1.0f + a * (1.0f - s)) : c * a * s;
    case 8: return a * kd_sigmoid(kd_gelu_2u(a));
    case 9:
        s = kd_sigmoid(kd_gelu_2u(a));
        return b * (s + a * s * (1.0f - s) * 1.5957691216057308f * (1.0f + 0.134145f * a * a));
    case 10: return tanh(fmin(fmax(a, -15.0f), 15.0f));
    case 11: s = tanh(fmin(fmax(a, -15.0f), 15.0f)); return b * (1.0f - s * s);
    default: return 0.0f;
    }
}

TWK_KERNEL fused_ew_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *s0, long o0,
                        TWK_GLOBAL const float *s1, long o1, TWK_GLOBAL const float *s2, long o2,
                        TWK_GLOBAL const float *s3, long o3, TWK_GLOBAL const float *s4, long o4,
                        TWK_GLOBAL const float *s5, long o5, long n, int w0, int w1, int w2, int w3, int w4,
                        int w5, int w6, int w7, float f0, float f1, float f2, float f3, float f4, float f5,
                        float f6, float f7) {
    long i = TWK_GID(0);
    if (i >= n) return;
    float v[14];
    int w[8];
    float f[8];
    w[0] = w0; w[1] = w1; w[2] = w2; w[3] = w3; w[4] = w4; w[5] = w5; w[6] = w6; w[7] = w7;
    f[0] = f0; f[1] = f1; f[2] = f2; f[3] = f3; f[4] = f4; f[5] = f5; f[6] = f6; f[7] = f7;
    v[0] = s0[o0 + i]; v[1] = s1[o1 + i]; v[2] = s2[o2 + i];
    v[3] = s3[o3 + i]; v[4] = s4[o4 + i]; v[5] = s5[o5 + i];
    float r = 0.0f;
    for (int k = 0; k < 8 && w[k] != 0; k++) {
        int s = w[k];
        r = kd_fused_step(s & 255, v[(s >> 8) & 15], v[(s >> 12) & 15], v[(s >> 16) & 15], (s >> 20) & 1, f[k]);
        v[6 + k] = r;
    }
    y[y_off + i] = r;
}
