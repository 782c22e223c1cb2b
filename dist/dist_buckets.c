/* The gradient sum's buckets (dist_internal.h): the trainable tensors' host
 * gradients laid end to end and cut every `cap` elements; a bucket is packed
 * into one buffer (the last padded with zeros to a multiple of the rank
 * count), summed over the ranks and unpacked. */
#include <string.h>

#include "dist_internal.h"

void twk_dist_buckets_free(dist_buckets *b) {
    twk_host_free(b->start);
    twk_host_free(b->g);
    twk_host_free(b->buf);
    twk_host_free(b->slice);
    memset(b, 0, sizeof *b);
}

twk_status twk_dist_buckets_init(dist_buckets *b, twk_trainer *t, size_t bucket_bytes, int size) {
    memset(b, 0, sizeof *b);
    b->size = size;
    b->n_tp = twk_trainer_param_count(t);
    int64_t cap = (int64_t)(bucket_bytes / sizeof(float));
    cap -= cap % size;
    b->cap = cap < size ? size : cap;
    b->start = twk_host_alloc((size_t)(b->n_tp + 1) * sizeof *b->start, "gradient buckets");
    b->g = twk_host_calloc((size_t)(b->n_tp ? b->n_tp : 1) * sizeof *b->g, "gradient buckets");
    b->buf = twk_host_alloc((size_t)b->cap * sizeof(float), "gradient bucket");
    b->slice = twk_host_alloc((size_t)(b->cap / size) * sizeof(float), "gradient bucket slice");
    if (!b->start || !b->g || !b->buf || !b->slice) {
        twk_dist_buckets_free(b);
        return twk_error(TWK_ERR_OOM, "gradient allreduce: no memory for a %lld-byte bucket", (long long)b->cap * 4);
    }
    b->start[0] = 0;
    for (int i = 0; i < b->n_tp; i++) {
        int64_t ne = 0;
        twk_trainer_param_name(t, i, &ne);
        b->start[i + 1] = b->start[i] + ne;
    }
    b->total = b->start[b->n_tp];
    b->n = (int)((b->total + b->cap - 1) / b->cap);
    return TWK_OK;
}

twk_status twk_dist_buckets_bind(dist_buckets *b, twk_trainer *t, int host_only) {
    for (int i = 0; i < b->n_tp; i++) {
        int64_t ne = 0;
        b->g[i] = host_only ? twk_trainer_grad_host(t, i, &ne) : twk_trainer_grad_data(t, i, &ne);
        if (!b->g[i] || ne != b->start[i + 1] - b->start[i])
            return twk_error(TWK_ERR_BACKEND, "gradient allreduce: no gradient for tensor %d", i);
    }
    return TWK_OK;
}

/* The tensor holding element e end to end (e < total). */
static int tensor_at(const dist_buckets *b, int64_t e) {
    int lo = 0, hi = b->n_tp - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (b->start[mid] <= e) lo = mid;
        else hi = mid - 1;
    }
    while (lo + 1 < b->n_tp && b->start[lo + 1] <= e) lo++; /* past empty tensors */
    return lo;
}

void twk_dist_bucket_tensors(const dist_buckets *b, int k, int *first, int *last) {
    int64_t a = (int64_t)k * b->cap, e = a + b->cap < b->total ? a + b->cap : b->total;
    *first = tensor_at(b, a);
    *last = tensor_at(b, e - 1);
}

twk_status twk_dist_bucket_sum(dist_buckets *b, int k) {
    int64_t a = (int64_t)k * b->cap, e = a + b->cap < b->total ? a + b->cap : b->total, fill = e - a;
    int first, last;
    twk_dist_bucket_tensors(b, k, &first, &last);
    for (int i = first; i <= last; i++) { /* pack */
        int64_t lo = b->start[i] > a ? b->start[i] : a, hi = b->start[i + 1] < e ? b->start[i + 1] : e;
        if (hi > lo) memcpy(b->buf + (lo - a), b->g[i] + (lo - b->start[i]), (size_t)(hi - lo) * sizeof(float));
    }
    int64_t padded = (fill + b->size - 1) / b->size * b->size;
    memset(b->buf + fill, 0, (size_t)(padded - fill) * sizeof(float));
    twk_status st = twk_dist_reduce_bucket(b->buf, b->slice, padded);
    for (int i = first; st == TWK_OK && i <= last; i++) { /* unpack */
        int64_t lo = b->start[i] > a ? b->start[i] : a, hi = b->start[i + 1] < e ? b->start[i + 1] : e;
        if (hi > lo) memcpy(b->g[i] + (lo - b->start[i]), b->buf + (lo - a), (size_t)(hi - lo) * sizeof(float));
    }
    return st;
}
