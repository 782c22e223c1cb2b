/* The compute worker thread and its hand-back queue to the loop thread. */
#include "twinkle/hal.h"
#include "worker.h"

#include <pthread.h>
#include <stdlib.h>

struct twk_worker {
    uv_loop_t *loop;
    uv_async_t async;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    twk_job *todo_head, *todo_tail; /* submitted, not yet run */
    twk_job *done_head, *done_tail; /* run, waiting for the loop thread */
    int stop, depth;
    int batch_max;    /* packed training: jobs run together at most */
    twk_job **batch;  /* batch_max entries */
};

static void push(twk_job **head, twk_job **tail, twk_job *j) {
    j->next = NULL;
    if (*tail) (*tail)->next = j;
    else *head = j;
    *tail = j;
}

/* ---- packed training (server/batch_train.c): the company of a packable job ----
 * Takes out of the queue, in queue order, the jobs with j's batch_key whose
 * owner has no job ahead of them in the queue (so no run's own ops are
 * reordered) and is not in the batch yet, up to the batch size. Nothing waits
 * for company: only what is queued now joins. Returns how many joined. */
#define TWK_WORKER_SCAN_MAX 4096
static int take_company(twk_worker *w, twk_job *j, twk_job **out, int max) {
    int n = 0, scanned = 0;
    twk_job *prev = NULL;
    for (twk_job *k = w->todo_head; k && n < max && scanned < TWK_WORKER_SCAN_MAX; scanned++) {
        twk_job *next = k->next;
        int free_owner = k->owner && k->owner != j->owner;
        for (twk_job *e = w->todo_head; free_owner && e != k; e = e->next) free_owner = e->owner != k->owner;
        for (int i = 0; free_owner && i < n; i++) free_owner = out[i]->owner != k->owner;
        if (k->batch_key == j->batch_key && k->run_batch == j->run_batch && free_owner) {
            if (prev) prev->next = next;
            else w->todo_head = next;
            if (w->todo_tail == k) w->todo_tail = prev;
            out[n++] = k;
        } else {
            prev = k;
        }
        k = next;
    }
    return n;
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
        while (!w->todo_head && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->todo_head && w->stop) break;
        twk_job *j = w->todo_head;
        w->todo_head = j->next;
        if (!w->todo_head) w->todo_tail = NULL;
        int n = 1; /* packed training: the jobs that run with j */
        if (j->batch_key && j->run_batch && w->batch_max > 1) {
            w->batch[0] = j;
            n += take_company(w, j, w->batch + 1, w->batch_max - 1);
        }
        pthread_mutex_unlock(&w->mu);
        if (n > 1) j->run_batch(w->batch, n);
        else if (j->run) j->run(j);
        pthread_mutex_lock(&w->mu);
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
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (uv_async_init(loop, &w->async, drain) != 0) {
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
    push(&w->todo_head, &w->todo_tail, j);
    w->depth++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}


static void free_after_close(uv_handle_t *h) {
    twk_worker *w = h->data;
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
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
