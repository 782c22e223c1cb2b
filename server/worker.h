/* server/ — the compute worker: one thread that runs engine jobs in
 * submission order; each finished job is handed back to the loop thread
 * (uv_async) where its `done` callback runs. The loop thread never computes. */
#ifndef TWK_SERVER_WORKER_H
#define TWK_SERVER_WORKER_H

#include <uv.h>

typedef struct twk_job twk_job;
/* run: on the worker thread. done: on the loop thread, afterwards; it owns the job. */
typedef void (*twk_job_fn)(twk_job *j);

/* run_batch: on the worker thread, instead of run, for a job and the company it took. */
typedef void (*twk_job_batch_fn)(twk_job **jobs, int n);

struct twk_job {
    twk_job_fn run;
    twk_job_fn done;
    void *arg;
    twk_job *next;
    /* packed training (batch_train.c): a job with a batch_key takes along the
     * queued jobs with the same key whose owner has no job queued before them
     * (each owner's first), up to the worker's batch size, and runs_batch runs
     * them all; owner: whose order must hold (a run), NULL for none */
    const void *batch_key;
    const void *owner;
    twk_job_batch_fn run_batch;
};

typedef struct twk_worker twk_worker;

/* Starts the worker thread; NULL on failure. */
twk_worker *twk_worker_start(uv_loop_t *loop);
/* Jobs run together at most (packed training); 1 = each alone. Call before submitting. */
void twk_worker_set_batch_max(twk_worker *w, int n);
/* Queues a job (loop thread). */
void twk_worker_submit(twk_worker *w, twk_job *j);
/* Finishes queued jobs, joins the thread, runs remaining done callbacks and
 * closes the async handle (the loop must run afterwards to free it). */
void twk_worker_stop(twk_worker *w);

#endif
