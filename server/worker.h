/* server/ — the compute worker: one thread that runs engine jobs, picked
 * fairly across tenants by scheduler.c (each flow — a run, a sampling
 * session — in submission order); each finished job is handed back to the
 * loop thread (uv_async) where its `done` callback runs. The loop thread never
 * computes. */
#ifndef TWK_SERVER_WORKER_H
#define TWK_SERVER_WORKER_H

#include <uv.h>

typedef struct twk_job twk_job;
/* run: on the worker thread. done: on the loop thread, afterwards; it owns the job. */
typedef void (*twk_job_fn)(twk_job *j);

/* run_batch: on the worker thread, instead of run, for a job and the company it took. */
typedef void (*twk_job_batch_fn)(twk_job **jobs, int n);

#define TWK_JOB_TENANT_LEN 64
#define TWK_JOB_FLOW_LEN 160

struct twk_job {
    twk_job_fn run;
    twk_job_fn done;
    void *arg;
    twk_job *next;
    /* scheduling (set before submit; twk_job_route does it) */
    char tenant[TWK_JOB_TENANT_LEN]; /* fairness is between tenants ("" is the server's own work) */
    char flow[TWK_JOB_FLOW_LEN];     /* jobs of one flow run in submission order */
    double cost;                     /* estimated work: tokens x passes, or samples x max_tokens */
    int requeue;                     /* set by run: the job yields and goes back to its flow's tail
                                      * (with its updated cost) instead of finishing */
    /* packed training (batch_train.c): a job with a batch_key takes along the
     * queued jobs with the same key whose owner has no job queued before them
     * (each owner's first), up to the worker's batch size, and runs_batch runs
     * them all; owner: whose order must hold (a run), NULL for none */
    const void *batch_key;
    const void *owner;
    twk_job_batch_fn run_batch;
    int pack_gate; /* an optim_step: its run's next packable op waits on it, so it may go ahead of a
                    * packable op (scheduler.c, twk_sched_pop) */
};

/* Sets j's tenant, flow and cost (strings are cut to fit). */
void twk_job_route(twk_job *j, const char *tenant, const char *flow, double cost);

typedef struct twk_worker twk_worker;

/* Starts the worker thread; NULL on failure. */
twk_worker *twk_worker_start(uv_loop_t *loop);
/* Jobs run together at most (packed training); 1 = each alone. Call before submitting. */
void twk_worker_set_batch_max(twk_worker *w, int n);
/* Queues a job (loop thread). Never fails: a job the scheduler has no memory for waits in
 * a plain FIFO that the worker serves first. */
void twk_worker_submit(twk_worker *w, twk_job *j);
/* Jobs of `tenant` waiting for the worker (not running); for --max-queue-per-tenant. */
int twk_worker_tenant_depth(twk_worker *w, const char *tenant);
/* Worker thread, from inside a job's run: takes the waiting flow heads for which keep()
 * is nonzero out of the queue (at most max; charged to their tenants) so that the running
 * job can do their work in the same pass; the caller must then call each one's run-equivalent
 * and hand it back with twk_worker_finish. Returns how many were taken. */
int twk_worker_take_ready(twk_worker *w, int (*keep)(const twk_job *j, void *ctx), void *ctx, twk_job **out, int max);
/* Worker thread: hands a job taken by twk_worker_take_ready to the loop thread (its done runs). */
void twk_worker_finish(twk_worker *w, twk_job *j);
/* Finishes queued jobs, joins the thread, runs remaining done callbacks and
 * closes the async handle (the loop must run afterwards to free it). */
void twk_worker_stop(twk_worker *w);

#endif
