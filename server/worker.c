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
};

static void push(twk_job **head, twk_job **tail, twk_job *j) {
    j->next = NULL;
    if (*tail) (*tail)->next = j;
    else *head = j;
    *tail = j;
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
        pthread_mutex_unlock(&w->mu);
        if (j->run) j->run(j);
        pthread_mutex_lock(&w->mu);
        push(&w->done_head, &w->done_tail, j);
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
