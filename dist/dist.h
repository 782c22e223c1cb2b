/* twinkle — data-parallel ranks: one API over MPI (dist_mpi.c, built when
 * TWK_MPI is on) or over a single process (dist_single.c), so callers never
 * test for MPI. Without mpirun (or built without MPI) the process is rank 0
 * of 1 and every collective is the identity.
 *
 * Thread-safety: call from the thread that called twk_dist_init only. */
#ifndef TWK_DIST_H
#define TWK_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "twinkle/twinkle.h"

/* The rank count a process manager (mpirun / mpiexec, srun) announced in the
 * environment, read without starting MPI; 0 when none launched this process. */
int twk_dist_launched_size(void);

/* Starts the rank (MPI_Init, only when a process manager launched this
 * process: otherwise it stays rank 0 of 1 without MPI) and, when TWK_THREADS is unset and several ranks
 * share this machine, sets TWK_THREADS = cores / local ranks (at least 1) so
 * CPU ranks split the cores. Idempotent; never fails (MPI errors abort the
 * job). */
void twk_dist_init(int *argc, char ***argv);
/* Ends the rank (MPI_Finalize; skipped after twk_dist_failed, whose peers may be gone); after it no
 * collective may be called. */
void twk_dist_finalize(void);
/* --device for this rank: a GPU kind without an index ("cuda") gets the node-local rank's
 * device ("cuda:LOCAL_RANK", written into buf); an explicit index or "cpu" is returned as is. */
const char *twk_dist_device(const char *spec, char *buf, size_t cap);
/* This process's rank, the number of ranks, and the same within this machine. */
int twk_dist_rank(void);
int twk_dist_size(void);
int twk_dist_local_rank(void);
int twk_dist_local_size(void);

/* Agreement: every rank passes its status; returns the lowest rank whose
 * status was not TWK_OK, or -1 when all succeeded. A collective: every rank
 * must call it at the same point, which is what keeps a failing rank from
 * leaving the others waiting in a later collective. */
int twk_dist_first_failure(twk_status st);

/* Sums n doubles across ranks in place (every rank gets the same values). */
void twk_dist_sum_f64(double *v, int n);

/* What the last gradient reduction did. */
typedef struct twk_dist_stats {
    double seconds;   /* wall time of the reduction on this rank (overlapped: the communication thread's) */
    double exposed;   /* of it, the time the training waited for (overlapped: after its backward) */
    int64_t bytes;    /* gradient bytes reduced (per rank) */
    int buckets;      /* buckets sent */
} twk_dist_stats;

/* Sums the trainer's accumulated gradients across ranks in buckets of
 * bucket_bytes (a reduce-scatter then an allgather per bucket, so every rank
 * ends with the same bits). TWK_ERR_OOM when a bucket cannot be allocated;
 * stats may be NULL. With one rank it returns at once. */
twk_status twk_dist_sum_grads(twk_trainer *t, size_t bucket_bytes, twk_dist_stats *stats);

/* The gradient sum overlapped with the backward pass that ends a step. */
typedef struct twk_dist_overlap twk_dist_overlap;
/* Begins this step's gradient sum, overlapped: the same buckets as twk_dist_sum_grads, and a
 * communication thread that runs each bucket's reduce-scatter + allgather as soon as its
 * gradients are final — the trainer's hook (twk_trainer_grad_hook_arm) on the last backward
 * pass of the next twk_loss_step, while the rest of that pass runs. *out is NULL (use
 * twk_dist_sum_grads) with one rank or when MPI does not give MPI_THREAD_SERIALIZED. Between
 * begin and end this thread must make no other dist call. Errors as the hook's. */
twk_status twk_dist_overlap_begin(twk_trainer *t, size_t bucket_bytes, twk_dist_overlap **out);
/* Ends it, after the step's passes whether they succeeded or not (every rank must call it, so
 * all run the same collectives in the same order): the buckets not started yet start now, in
 * that order, and it waits for all. The gradients are then summed bit for bit as
 * twk_dist_sum_grads sums them. ov NULL: nothing. stats may be NULL. The hook's download or
 * MPI's errors. */
twk_status twk_dist_overlap_end(twk_dist_overlap *ov, twk_dist_stats *stats);

/* FNV-1a over every trainable tensor's value; the lowest rank whose hash
 * differs from rank 0's, or -1 when all agree (-2 when a download failed). */
int twk_dist_params_differ(twk_trainer *t);

/* ---- point to point (the multi-rank service, server/dist_serve.c) ---- */

/* Survives the loss of another rank instead of aborting: MPI errors return
 * (MPI_ERRORS_RETURN), and the process manager's notice of a failed process
 * (MPICH's hydra sends SIGUSR1 when started with -disable-auto-cleanup) is
 * recorded. From then on twk_dist_send / twk_dist_recv / twk_dist_sum_grads
 * return TWK_ERR_BACKEND instead of waiting, and twk_dist_finalize skips
 * MPI_Finalize. */
void twk_dist_watch_failures(void);
/* 1 once a failure was noticed (a notice, or an MPI call that failed). */
int twk_dist_failed(void);

/* Sends n bytes to rank `to` with `tag` (blocking until the buffer may be
 * reused). TWK_ERR_INVALID_ARG past 2 GiB; TWK_ERR_BACKEND when MPI fails;
 * TWK_ERR_STATE with one rank. */
twk_status twk_dist_send(int to, int tag, const void *buf, int64_t n);
/* Sends n bytes without waiting: buf (host allocator) is taken and freed once the send completes,
 * which every later dist wait (and twk_dist_finalize) drives. So a rank may answer and move on
 * while the receiver is busy elsewhere. Errors as twk_dist_send (buf freed). */
twk_status twk_dist_send_async(int to, int tag, void *buf, int64_t n);
/* Waits for a message from rank `from` with `tag`, polling with short sleeps
 * (an idle rank does not spin a core), and returns it in *buf (host
 * allocator; the caller frees) with its size in *n. Errors as twk_dist_send,
 * TWK_ERR_OOM when the buffer cannot be allocated. */
twk_status twk_dist_recv(int from, int tag, void **buf, int64_t *n);

/* The share of n sequences (offsets: n + 1 token offsets) that rank `rank`
 * of `size` takes: sequences [*s0, *s1), whole groups of `group` (pairs for
 * DPO), contiguous, the boundaries at the group starts nearest each rank's
 * even share of the tokens. May be empty (*s0 == *s1). */
void twk_dist_shard(const int64_t *offsets, int n, int group, int rank, int size, int *s0, int *s1);

/* Ends every rank of the job at once with exit code `code` (MPI_Abort);
 * without MPI, exit(code). For fatal paths where agreement is impossible. */
void twk_dist_abort(int code);

#endif
