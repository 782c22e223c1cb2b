/* The compute worker thread, its fair queue (scheduler.c) and its hand-back
 * queue to the loop thread. */
#include "twinkle/hal.h"
#include "scheduler.h"
#include "worker.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

struct twk_worker {
    uv_loop_t *loop;
    uv_async_t async;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    twk_sched *sched;               /* submitted, not yet run */
    twk_job *fifo_head, *fifo_tail; /* submitted when the scheduler had no memory: served first */
    twk_job *done_head, *done_tail; /* run, waiting for the loop thread */
    int stop, depth;
    int batch_max;    /* packed training: jobs run together at most */
    twk_job **batch;  /* batch_max entries */
};

void twk_job_route(twk_job *j, const char *tenant, const char *flow, double cost) {
    snprintf(j->tenant, sizeof j->tenant, "%s", tenant ? tenant : "");
    snprintf(j->flow, sizeof j->flow, "%s", flow ? flow : "");
    j->cost = cost;
}

static void push(twk_job **head, twk_job **tail, twk_job *j) {
    j->next = NULL;
    if (*tail) (*tail)->next = j;
    else *head = j;
    *tail = j;
}

/* Queues j (mu held). */
static void enqueue_locked(twk_worker *w, twk_job *j) {
    if (twk_sched_push(w->sched, j) != 0) push(&w->fifo_head, &w->fifo_tail, j);
}

/* The next job to run (mu held); NULL when none waits. */
static twk_job *next_locked(twk_worker *w) {
    twk_job *j = w->fifo_head;
    if (j) {
        w->fifo_head = j->next;
        if (!w->fifo_head) w->fifo_tail = NULL;
        return j;
    }
    return twk_sched_pop(w->sched);
}

/* ---- packed training (server/batch_train.c): the company of a packable job ----
 * The flow heads (each run's first waiting op, so no run's own ops are reordered) with j's
 * batch_key of other owners, taken out of the scheduler and charged to their tenants, up to
 * max. Nothing waits for company: only what is queued now joins. Returns how many joined. */
static int same_batch(const twk_job *k, void *ctx) {
    const twk_job *j = ctx;
    return k->batch_key == j->batch_key && k->run_batch == j->run_batch && k->owner && k->owner != j->owner;
}

/* The waiting flow heads keep selects, taken out of the scheduler (mu held); how many. */
static int take_ready_locked(twk_worker *w, int (*keep)(const twk_job *j, void *ctx), void *ctx, twk_job **out,
                             int max) {
    int n = twk_sched_heads(w->sched, keep, ctx, out, max), k = 0;
    for (int i = 0; i < n; i++)
        if (twk_sched_take(w->sched, out[i]) == 0) out[k++] = out[i];
    return k;
}

static int take_company(twk_worker *w, twk_job *j, twk_job **out, int max) {
    return take_ready_locked(w, same_batch, j, out, max);
}

void twk_worker_set_batch_max(twk_worker *w, int n) {
    twk_job **b = n > 1 ? twk_host_alloc((size_t)n * sizeof *b, "worker batch") : NULL;
    pthread_mutex_lock(&w->mu);
    twk_host_free(w->batch);
    w->batch = b;
    w->batch_max = b ? n : 1;
    pthread_mutex_unlock(&w->mu);
}

static void *worker_main(void *arg) {
    twk_worker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        twk_job *j;
        while (!(j = next_locked(w)) && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
        if (!j) break;
        int n = 1; /* packed training: the jobs that run with j */
        if (j->batch_key && j->run_batch && w->batch_max > 1) {
            w->batch[0] = j;
            n += take_company(w, j, w->batch + 1, w->batch_max - 1);
        }
        pthread_mutex_unlock(&w->mu);
        j->requeue = 0;
        if (n > 1) j->run_batch(w->batch, n);
        else if (j->run) j->run(j);
        pthread_mutex_lock(&w->mu);
        if (n == 1 && j->requeue) { /* it yields: back to its flow's tail, others go first */
            enqueue_locked(w, j);
            continue;
        }
        for (int i = 0; i < n; i++) push(&w->done_head, &w->done_tail, n > 1 ? w->batch[i] : j);
        uv_async_send(&w->async);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void drain(uv_async_t *a) {
    twk_worker *w = a->data;
    pthread_mutex_lock(&w->mu);
    twk_job *j = w->done_head;
    w->done_head = w->done_tail = NULL;
    pthread_mutex_unlock(&w->mu);
    while (j) {
        twk_job *next = j->next;
        pthread_mutex_lock(&w->mu);
        w->depth--;
        pthread_mutex_unlock(&w->mu);
        if (j->done) j->done(j);
        j = next;
    }
}

twk_worker *twk_worker_start(uv_loop_t *loop) {
    twk_worker *w = twk_host_calloc(sizeof *w, "worker w");
    if (!w) return NULL;
    w->loop = loop;
    if (!(w->sched = twk_sched_new())) {
        twk_host_free(w);
        return NULL;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (uv_async_init(loop, &w->async, drain) != 0) {
        twk_sched_free(w->sched);
        twk_host_free(w);
        return NULL;
    }
    w->async.data = w;
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
        uv_close((uv_handle_t *)&w->async, NULL);
        return NULL; /* the handle is closed by the loop; w leaks only in this fatal path */
    }
    return w;
}

void twk_worker_submit(twk_worker *w, twk_job *j) {
    pthread_mutex_lock(&w->mu);
    j->requeue = 0;
    enqueue_locked(w, j);
    w->depth++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

int twk_worker_tenant_depth(twk_worker *w, const char *tenant) {
    pthread_mutex_lock(&w->mu);
    int n = twk_sched_depth(w->sched, tenant);
    pthread_mutex_unlock(&w->mu);
    return n;
}

int twk_worker_take_ready(twk_worker *w, int (*keep)(const twk_job *j, void *ctx), void *ctx, twk_job **out, int max) {
    pthread_mutex_lock(&w->mu);
    int k = take_ready_locked(w, keep, ctx, out, max);
    pthread_mutex_unlock(&w->mu);
    return k;
}

void twk_worker_finish(twk_worker *w, twk_job *j) {
    pthread_mutex_lock(&w->mu);
    push(&w->done_head, &w->done_tail, j);
    uv_async_send(&w->async);
    pthread_mutex_unlock(&w->mu);
}

static void free_after_close(uv_handle_t *h) {
    twk_worker *w = h->data;
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    twk_sched_free(w->sched);
    twk_host_free(w->batch);
    twk_host_free(w);
}

void twk_worker_stop(twk_worker *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    drain(&w->async);
    uv_close((uv_handle_t *)&w->async, free_after_close);
}
