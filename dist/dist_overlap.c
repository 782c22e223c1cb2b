/* The gradient sum overlapped with the backward pass that ends a step
 * (dist.h, twk_dist_overlap_begin / _end; MPI builds). The buckets are
 * twk_dist_sum_grads' (dist_buckets.c), each one a group of the trainer's
 * gradient hook (train/grad_hook.c): when the pass has made a bucket's
 * gradients final, the hook brings them to the host and queues the bucket;
 * a communication thread reduces the queued buckets in the order they became
 * final — an order that depends only on the compiled plan, so every rank runs
 * the same collectives in the same order — while the pass goes on. The
 * caller's thread makes no MPI call meanwhile (MPI_THREAD_SERIALIZED).
 * Buckets the pass did not queue (it failed, or this rank had no share) are
 * queued by twk_dist_overlap_end in the same order, so no rank is left in a
 * collective. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "dist_internal.h"

struct twk_dist_overlap {
    twk_trainer *t;
    dist_buckets bk;
    int *first, *last, *order; /* per bucket: its tensors; the order they become final */
    int pushed, done;          /* buckets queued, buckets reduced (prefixes of order) */
    twk_status st;
    char err[512];
    double busy;               /* seconds the thread spent reducing */
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *comm_main(void *arg) {
    twk_dist_overlap *ov = arg;
    pthread_mutex_lock(&ov->mu);
    while (ov->done < ov->bk.n) {
        if (ov->done == ov->pushed) {
            pthread_cond_wait(&ov->cv, &ov->mu);
            continue;
        }
        int k = ov->order[ov->done];
        pthread_mutex_unlock(&ov->mu);
        double t0 = now();
        twk_status st = twk_dist_bucket_sum(&ov->bk, k); /* after a failure too: the peers are in it */
        double dt = now() - t0;
        pthread_mutex_lock(&ov->mu);
        ov->busy += dt;
        if (st != TWK_OK && ov->st == TWK_OK) {
            ov->st = st;
            snprintf(ov->err, sizeof ov->err, "%s", twk_last_error());
        }
        ov->done++;
        pthread_cond_broadcast(&ov->cv);
    }
    pthread_mutex_unlock(&ov->mu);
    return NULL;
}

/* The hook's ready: bucket g is the next in order. */
static twk_status queue_bucket(void *ctx, int g) {
    twk_dist_overlap *ov = ctx;
    pthread_mutex_lock(&ov->mu);
    twk_status st = ov->pushed < ov->bk.n && ov->order[ov->pushed] == g
                        ? TWK_OK : twk_error(TWK_ERR_STATE, "gradient overlap: bucket %d out of order", g);
    ov->pushed++;
    pthread_cond_broadcast(&ov->cv);
    pthread_mutex_unlock(&ov->mu);
    return st;
}

static void overlap_free(twk_dist_overlap *ov) {
    twk_dist_buckets_free(&ov->bk);
    twk_host_free(ov->first);
    twk_host_free(ov->last);
    twk_host_free(ov->order);
    twk_host_free(ov);
}

twk_status twk_dist_overlap_begin(twk_trainer *t, size_t bucket_bytes, twk_dist_overlap **out) {
    *out = NULL;
    if (twk_dist_size() == 1 || !twk_dist_thread_ok()) return TWK_OK;
    twk_dist_overlap *ov = twk_host_calloc(sizeof *ov, "gradient overlap");
    if (!ov) return twk_error(TWK_ERR_OOM, "gradient overlap: out of memory");
    ov->t = t;
    twk_status st = twk_dist_buckets_init(&ov->bk, t, bucket_bytes, twk_dist_size());
    int n = ov->bk.n;
    if (st == TWK_OK && n < 1) st = twk_error(TWK_ERR_STATE, "gradient overlap: the trainer has no gradients");
    if (st == TWK_OK) {
        ov->first = twk_host_alloc((size_t)n * sizeof(int), "gradient overlap");
        ov->last = twk_host_alloc((size_t)n * sizeof(int), "gradient overlap");
        ov->order = twk_host_alloc((size_t)n * sizeof(int), "gradient overlap");
        if (!ov->first || !ov->last || !ov->order) st = twk_error(TWK_ERR_OOM, "gradient overlap: out of memory");
    }
    for (int k = 0; st == TWK_OK && k < n; k++) twk_dist_bucket_tensors(&ov->bk, k, &ov->first[k], &ov->last[k]);
    twk_grad_hook h = {n, ov->first, ov->last, queue_bucket, ov};
    if (st == TWK_OK) st = twk_trainer_grad_hook_arm(t, &h, ov->order);
    int armed = st == TWK_OK;
    if (st == TWK_OK) st = twk_dist_buckets_bind(&ov->bk, t, 1); /* into the host copy the hook made */
    if (st == TWK_OK) {
        pthread_mutex_init(&ov->mu, NULL);
        pthread_cond_init(&ov->cv, NULL);
        if (pthread_create(&ov->th, NULL, comm_main, ov) != 0) {
            pthread_mutex_destroy(&ov->mu);
            pthread_cond_destroy(&ov->cv);
            st = twk_error(TWK_ERR_OOM, "gradient overlap: no communication thread");
        }
    }
    if (st != TWK_OK) {
        if (armed) (void)twk_trainer_grad_hook_finish(t, NULL);
        overlap_free(ov);
        return st;
    }
    *out = ov;
    return TWK_OK;
}

twk_status twk_dist_overlap_end(twk_dist_overlap *ov, twk_dist_stats *stats) {
    if (stats) *stats = (twk_dist_stats){0, 0, 0, 0};
    if (!ov) return TWK_OK;
    double t0 = now();
    /* what the pass did not bring to the host comes now (never over a queued bucket's tensors) */
    twk_status st = twk_trainer_grad_hook_finish(ov->t, NULL);
    char msg[512] = "";
    if (st != TWK_OK) snprintf(msg, sizeof msg, "%s", twk_last_error());
    pthread_mutex_lock(&ov->mu);
    ov->pushed = ov->bk.n; /* the rest, in the same order on every rank */
    pthread_cond_broadcast(&ov->cv);
    while (ov->done < ov->bk.n) pthread_cond_wait(&ov->cv, &ov->mu);
    pthread_mutex_unlock(&ov->mu);
    pthread_join(ov->th, NULL);
    pthread_mutex_destroy(&ov->mu);
    pthread_cond_destroy(&ov->cv);
    if (st == TWK_OK && ov->st != TWK_OK) st = ov->st, snprintf(msg, sizeof msg, "%s", ov->err);
    if (stats) *stats = (twk_dist_stats){ov->busy, now() - t0, ov->bk.total * (int64_t)sizeof(float), ov->bk.n};
    overlap_free(ov);
    return st == TWK_OK ? TWK_OK : twk_error(st, "%s", msg);
}
