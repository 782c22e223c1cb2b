/* A small thread pool: workers sleep on a condition variable between jobs and
 * take chunks of a range through an atomic counter. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "cpu_internal.h"

struct cpu_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    uint64_t generation;
    int stop;
    /* the current job */
    cpu_range_fn fn;
    void *arg;
    int64_t n, chunk;
    atomic_llong next;
    int busy; /* workers still in the current job, under mu */
};

static _Thread_local int thread_index;

int cpu_thread_index(void) { return thread_index; }

static void run_chunks(cpu_pool *p) {
    for (;;) {
        int64_t b = atomic_fetch_add(&p->next, p->chunk);
        if (b >= p->n) break;
        int64_t e = b + p->chunk < p->n ? b + p->chunk : p->n;
        p->fn(p->arg, b, e);
    }
}

typedef struct { cpu_pool *p; int index; } worker_arg;

static void *worker(void *varg) {
    worker_arg wa = *(worker_arg *)varg;
    free(varg);
    cpu_pool *p = wa.p;
    thread_index = wa.index;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_chunks(p);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

cpu_pool *cpu_pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    cpu_pool *p = twk_host_calloc(sizeof *p, "cpu thread pool");
    if (!p) return NULL;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    if (n_threads > 1) {
        p->threads = twk_host_calloc((size_t)n_threads * sizeof *p->threads, "cpu thread pool");
        if (!p->threads) {
            cpu_pool_free(p);
            return NULL;
        }
        for (int i = 1; i < n_threads; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (!wa) {
                p->n_threads = i;
                break;
            }
            wa->p = p;
            wa->index = i;
            if (pthread_create(&p->threads[i], NULL, worker, wa) != 0) {
                free(wa);
                p->n_threads = i; /* run with the threads we got */
                break;
            }
        }
    }
    return p;
}

void cpu_pool_free(cpu_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads && p->threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    twk_host_free(p->threads);
    twk_host_free(p);
}

int cpu_pool_threads(const cpu_pool *p) { return p ? p->n_threads : 1; }

void cpu_parallel_for(cpu_pool *p, int64_t n, int64_t grain, cpu_range_fn fn, void *arg) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (!p || p->n_threads == 1 || n <= grain) {
        fn(arg, 0, n);
        return;
    }
    /* about 4 chunks per thread for balance, never smaller than grain */
    int64_t chunk = (n + 4 * p->n_threads - 1) / (4 * p->n_threads);
    if (chunk < grain) chunk = grain;
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->chunk = chunk;
    atomic_store(&p->next, 0);
    p->busy = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    run_chunks(p);
    pthread_mutex_lock(&p->mu);
    while (p->busy > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
