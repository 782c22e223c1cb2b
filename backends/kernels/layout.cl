/* Layout kernels that copy (permute, slice, slice_back, concat). They move
 * elements of any dtype as w int words each (w = 1 for 4-byte, 2 for 8-byte
 * elements), so values are copied bit for bit. */

/* y (dims O0..O3, padded) = x read through strides st (in elements) */
TWK_KERNEL permute_words(TWK_GLOBAL int *y, long y_off, TWK_GLOBAL const int *x, long x_off, long n,
                         long O1, long O2, long O3, long st0, long st1, long st2, long st3, int w) {
    long i = TWK_GID(0);
    if (i >= n) return;
    long i3 = i % O3, r = i / O3;
    long i2 = r % O2;
    r /= O2;
    long i1 = r % O1, i0 = r / O1;
    long src = i0 * st0 + i1 * st1 + i2 * st2 + i3 * st3;
    for (int k = 0; k < w; k++) y[y_off + i * w + k] = x[x_off + src * w + k];
}

/* For each outer index o < outer: rows [src_start, src_start + len) of x's
 * axis (size src_axis) go to rows [dst_start, ...) of y's axis (size
 * dst_axis); `inner` counts the words of one row. n = outer * len * inner. */
TWK_KERNEL copy_axis_words(TWK_GLOBAL int *y, long y_off, TWK_GLOBAL const int *x, long x_off, long n,
                           long len, long inner, long dst_axis, long src_axis, long dst_start, long src_start) {
    long i = TWK_GID(0);
    if (i >= n) return;
    long e = i % inner, r = i / inner;
    long j = r % len, o = r / len;
    y[y_off + (o * dst_axis + dst_start + j) * inner + e] = x[x_off + (o * src_axis + src_start + j) * inner + e];
}
