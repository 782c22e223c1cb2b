/* dist/ internals (MPI builds): the buckets the gradient sum lays the
 * trainer's gradients into — the same for the plain sum (dist_mpi.c) and the
 * overlapped one (dist_overlap.c), so both give the same bits — and one
 * bucket's reduction. Not a public header. */
#ifndef TWK_DIST_INTERNAL_H
#define TWK_DIST_INTERNAL_H

#include "dist.h"

typedef struct dist_buckets {
    int n;          /* buckets */
    int size;       /* ranks */
    int64_t cap;    /* elements per bucket, a multiple of the rank count */
    int64_t total;  /* gradient elements, the tensors end to end */
    int n_tp;
    int64_t *start; /* per tensor: its first element end to end (n_tp + 1 entries) */
    float **g;      /* per tensor: its host gradient */
    float *buf, *slice;
} dist_buckets;

/* The layout over t's trainable tensors for `size` ranks, buckets of bucket_bytes. TWK_ERR_OOM. */
twk_status twk_dist_buckets_init(dist_buckets *b, twk_trainer *t, size_t bucket_bytes, int size);
/* The gradients the buckets read and write: twk_trainer_grad_data's (downloading the accumulator)
 * or, with host_only, twk_trainer_grad_host's. TWK_ERR_BACKEND when one is missing. */
twk_status twk_dist_buckets_bind(dist_buckets *b, twk_trainer *t, int host_only);
void twk_dist_buckets_free(dist_buckets *b);
/* The tensors bucket k holds a part of: [*first, *last]. */
void twk_dist_bucket_tensors(const dist_buckets *b, int k, int *first, int *last);
/* Bucket k: packed from the host gradients, summed over the ranks (twk_dist_reduce_bucket),
 * unpacked into them. MPI's errors. */
twk_status twk_dist_bucket_sum(dist_buckets *b, int k);

/* dist_mpi.c: one bucket of n floats (a multiple of the rank count) summed in place over the
 * ranks by a reduce-scatter and an allgather (slice: n / ranks floats). */
twk_status twk_dist_reduce_bucket(float *buf, float *slice, int64_t n);
/* dist_mpi.c: 1 when MPI gave MPI_THREAD_SERIALIZED (another thread may make the calls). */
int twk_dist_thread_ok(void);

#endif
