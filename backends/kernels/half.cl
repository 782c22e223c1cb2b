/* 16-bit storage (frozen bf16 / f16 weights, KV caches): widening to f32 as values are read,
 * narrowing with round to nearest even as they are written (hal/half.c is the host
 * reference, bit for bit). A 16-bit tensor arrives as (TWK_GLOBAL ushort *p, long p_off) with
 * the offset in 2-byte elements, and an int `f16` flag (0: bf16, 1: f16). bf16 widens as
 * bits << 16; f16 through the prelude's TWK_LOAD_HALF (OpenCL: vload_half) where it has one,
 * else the bit-level helper below (CUDA, the host emulator). */

TWK_FN float kd_bf16_f32(uint h) { return as_float(h << 16); }

TWK_FN ushort kd_f32_bf16(float f) {
    uint x = as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (ushort)(x >> 16 | 0x40u); /* NaN stays a quiet NaN */
    return (ushort)((x + 0x7fffu + (x >> 16 & 1u)) >> 16);
}

TWK_FN float kd_f16_bits_f32(uint h) {
    uint sign = (h >> 15) << 31, e = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (e == 0) {
        if (man == 0) bits = sign;
        else { /* subnormal: normalise */
            int s = -1;
            do { man <<= 1; s++; } while (!(man & 0x400u));
            bits = sign | (uint)(127 - 15 - s) << 23 | (man & 0x3ffu) << 13;
        }
    } else if (e == 31) {
        bits = sign | 0x7f800000u | man << 13;
    } else {
        bits = sign | (e + 112) << 23 | man << 13;
    }
    return as_float(bits);
}

TWK_FN ushort kd_f32_f16(float f) {
    uint bits = as_uint(f), sign = bits >> 16 & 0x8000u, x = bits & 0x7fffffffu;
    if (x >= 0x7f800000u) return (ushort)(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (x >= 0x477ff000u) return (ushort)(sign | 0x7c00u); /* >= 65520 rounds past 65504 */
    uint h, rem, tie;
    if (x < 0x38800000u) { /* below 2^-14: a subnormal half */
        if (x < 0x33000000u) return (ushort)sign;
        uint shift = 126 - (x >> 23), m = (x & 0x7fffffu) | 0x800000u;
        h = m >> shift;
        rem = m & ((1u << shift) - 1);
        tie = 1u << (shift - 1);
    } else {
        h = ((x >> 23) - 112) << 10 | (x & 0x7fffffu) >> 13;
        rem = x & 0x1fffu;
        tie = 0x1000u;
    }
    if (rem > tie || (rem == tie && (h & 1u))) h++;
    return (ushort)(sign | h);
}

/* element i of a 16-bit tensor, widened */
TWK_FN float kd_h16(const TWK_GLOBAL ushort *p, long i, int f16) {
#ifdef TWK_LOAD_HALF
    if (f16) return TWK_LOAD_HALF(p, i);
#else
    if (f16) return kd_f16_bits_f32((uint)p[i]);
#endif
    return kd_bf16_f32((uint)p[i]);
}

/* f narrowed into element i of a 16-bit tensor */
TWK_FN void kd_h16_store(TWK_GLOBAL ushort *p, long i, float f, int f16) { p[i] = f16 ? kd_f32_f16(f) : kd_f32_bf16(f); }

/* y [n] = the 16-bit x [n] widened (a panel of a weight before the f32 GEMM); one item per element */
TWK_KERNEL widen_h16(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const ushort *x, long x_off, long n, int f16) {
    long i = TWK_GID(0);
    if (i < n) y[y_off + i] = kd_h16(x + x_off, i, f16);
}

/* get_rows_f32 (nn.cl) from a 16-bit table */
TWK_KERNEL get_rows_h16(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const ushort *tab, long tab_off,
                        TWK_GLOBAL const int *ids, long ids_off, TWK_GLOBAL int *err, long err_off, long T, long D,
                        long V, int is64, int f16) {
    long i = TWK_GID(0);
    if (i >= T * D) return;
    long t = i / D, d = i % D;
    long id = kd_id(ids + ids_off, t, is64);
    if (id < 0 || id >= V) {
        err[err_off] = KD_ERR_ID_RANGE;
        y[y_off + i] = 0.0f;
        return;
    }
    y[y_off + i] = kd_h16(tab + tab_off, id * D + d, f16);
}

/* kv_write_f32 (kvcache.cl) into a 16-bit cache: x narrowed */
TWK_KERNEL kv_write_h16(TWK_GLOBAL ushort *cache, long cache_off, TWK_GLOBAL const float *x, long x_off,
                        TWK_GLOBAL const int *rows, long rows_off, TWK_GLOBAL int *err, long err_off, long T, long E,
                        long R, int is64, int f16) {
    long i = TWK_GID(0);
    if (i >= T * E) return;
    long t = i / E, e = i % E;
    long r = kd_id(rows + rows_off, t, is64);
    if (r < 0 || r >= R) {
        err[err_off] = KD_ERR_ID_RANGE;
        return;
    }
    kd_h16_store(cache + cache_off, r * E + e, x[x_off + i], f16);
}
