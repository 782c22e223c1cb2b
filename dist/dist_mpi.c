/* twk_dist over MPI (MPICH): ranks, node-local ranks, agreement, and the
 * bucketed gradient sum. The only file that includes mpi.h. */
#include <mpi.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist.h"
#include "dist_internal.h"

static int g_init, g_rank, g_size = 1, g_local_rank, g_local_size = 1;
static int g_thread_ok; /* MPI gave MPI_THREAD_SERIALIZED: another thread may make the calls (dist_overlap.c) */
static volatile sig_atomic_t g_failed; /* a process of the job failed (twk_dist_watch_failures) */

static void on_failure_notice(int sig) {
    (void)sig;
    g_failed = 1;
}

void twk_dist_watch_failures(void) {
    if (!g_init || g_size == 1) return;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_failure_notice;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
}

int twk_dist_failed(void) { return g_failed != 0; }

/* twk_dist_send_async's sends in flight, completed (and their buffers freed) by every wait */
typedef struct pending_send {
    MPI_Request q;
    void *buf;
    struct pending_send *next;
} pending_send;
static pending_send *g_pending;

static void progress_sends(void) {
    for (pending_send **pp = &g_pending; *pp;) {
        int done = 0;
        if (MPI_Test(&(*pp)->q, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) g_failed = 1, done = 1;
        if (!done) {
            pp = &(*pp)->next;
            continue;
        }
        pending_send *p = *pp;
        *pp = p->next;
        twk_host_free(p->buf);
        twk_host_free(p);
    }
}

static twk_status lost(const char *what) {
    g_failed = 1;
    return twk_error(TWK_ERR_BACKEND, "a rank of the job was lost (%s)", what);
}

/* Waits for request q, polling with short sleeps; gives up once a failure is noticed. */
static twk_status wait_req(MPI_Request *q, const char *what) {
    long wait_ns = 20000; /* after 2 ms of spinning: sleeps of 20 us, doubling to 5 ms */
    double spin_until = MPI_Wtime() + 2e-3;
    for (int done = 0;;) {
        if (MPI_Test(q, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return lost(what);
        if (done) return TWK_OK;
        progress_sends();
        if (g_failed) return lost(what); /* the request is abandoned with its peer */
        if (MPI_Wtime() < spin_until) continue;
        struct timespec ts = {0, wait_ns};
        nanosleep(&ts, NULL);
        wait_ns = wait_ns < 5000000 ? wait_ns * 2 : 5000000;
    }
}

void twk_dist_init(int *argc, char ***argv) {
    /* not started by a process manager: one rank, and MPI stays out of the process */
    if (g_init || twk_dist_launched_size() == 0) return;
    int already = 0;
    MPI_Initialized(&already);
    /* serialized: the service makes its MPI calls on its compute worker, not the main thread */
    int provided = 0;
    if (!already) MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    else MPI_Query_thread(&provided);
    g_thread_ok = provided >= MPI_THREAD_SERIALIZED;
    g_init = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &g_local_rank);
    MPI_Comm_size(local, &g_local_size);
    MPI_Comm_free(&local);
    if (g_local_size > 1 && !getenv("TWK_THREADS")) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        char v[32];
        snprintf(v, sizeof v, "%ld", cores / g_local_size > 1 ? cores / g_local_size : 1);
        setenv("TWK_THREADS", v, 1);
    }
}

void twk_dist_finalize(void) {
    int done = 0;
    if (!g_init || g_failed) return; /* MPI_Finalize waits for every peer, and one is gone */
    while (g_pending && !g_failed) { /* the answers still on their way */
        progress_sends();
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    MPI_Finalized(&done);
    if (!done) MPI_Finalize();
}

int twk_dist_rank(void) { return g_rank; }
int twk_dist_size(void) { return g_size; }
int twk_dist_local_rank(void) { return g_local_rank; }
int twk_dist_local_size(void) { return g_local_size; }

int twk_dist_first_failure(twk_status st) {
    if (g_size == 1) return st == TWK_OK ? -1 : 0;
    int mine = st == TWK_OK ? g_size : g_rank, first = g_size;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return first == g_size ? -1 : first;
}

void twk_dist_sum_f64(double *v, int n) {
    if (g_size > 1 && n > 0) MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
}

/* One bucket: a reduce-scatter gives each rank the sum of its slice (summed
 * once, by one rank), the allgather hands every rank the same sums. n is a
 * multiple of the rank count. */
static twk_status reduce_bucket(float *buf, float *slice, int64_t n) {
    int per = (int)(n / g_size);
    MPI_Request q;
    if (MPI_Ireduce_scatter_block(buf, slice, per, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q) != MPI_SUCCESS)
        return lost("gradient sum");
    twk_status st = wait_req(&q, "gradient sum");
    if (st == TWK_OK && MPI_Iallgather(slice, per, MPI_FLOAT, buf, per, MPI_FLOAT, MPI_COMM_WORLD, &q) != MPI_SUCCESS)
        return lost("gradient sum");
    return st == TWK_OK ? wait_req(&q, "gradient sum") : st;
}

twk_status twk_dist_reduce_bucket(float *buf, float *slice, int64_t n) { return reduce_bucket(buf, slice, n); }

int twk_dist_thread_ok(void) { return g_thread_ok; }

twk_status twk_dist_sum_grads(twk_trainer *t, size_t bucket_bytes, twk_dist_stats *stats) {
    twk_dist_stats s = {0, 0, 0, 0};
    if (stats) *stats = s;
    if (g_size == 1) return TWK_OK;
    double t0 = MPI_Wtime();
    dist_buckets bk;
    twk_status st = twk_dist_buckets_init(&bk, t, bucket_bytes, g_size);
    if (st == TWK_OK) st = twk_dist_buckets_bind(&bk, t, 0);
    for (int k = 0; st == TWK_OK && k < bk.n; k++) {
        st = twk_dist_bucket_sum(&bk, k);
        s.buckets++;
    }
    s.bytes = bk.total * (int64_t)sizeof(float);
    twk_dist_buckets_free(&bk); /* (safe on a failed init: it zeroes itself) */
    s.seconds = s.exposed = MPI_Wtime() - t0;
    if (stats) *stats = s;
    return st;
}

int twk_dist_params_differ(twk_trainer *t) {
    if (g_size == 1) return -1;
    uint64_t h = 1469598103934665603ull;
    int ok = 1;
    for (int i = 0; ok && i < twk_trainer_param_count(t); i++) {
        int64_t ne = 0;
        const char *name = twk_trainer_param_name(t, i, &ne);
        float *v = twk_host_alloc((size_t)(ne ? ne : 1) * sizeof(float), "parameter hash");
        ok = v && twk_trainer_get(t, name, v, ne) == TWK_OK;
        const unsigned char *p = (const unsigned char *)v;
        for (size_t k = 0; ok && k < (size_t)ne * sizeof(float); k++) h = (h ^ p[k]) * 1099511628211ull;
        twk_host_free(v);
    }
    if (twk_dist_first_failure(ok ? TWK_OK : TWK_ERR_BACKEND) >= 0) return -2;
    uint64_t *all = malloc((size_t)g_size * sizeof *all);
    if (!all) twk_dist_abort(1);
    MPI_Allgather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD);
    int differ = -1;
    for (int r = 1; r < g_size && differ < 0; r++)
        if (all[r] != all[0]) differ = r;
    free(all);
    return differ;
}

twk_status twk_dist_send(int to, int tag, const void *buf, int64_t n) {
    if (g_size == 1) return twk_error(TWK_ERR_STATE, "dist: no other rank to send to");
    if (n < 0 || n > INT_MAX) return twk_error(TWK_ERR_INVALID_ARG, "dist: a message of %lld bytes", (long long)n);
    if (g_failed) return lost("sending");
    MPI_Request q;
    if (MPI_Isend(buf, (int)n, MPI_BYTE, to, tag, MPI_COMM_WORLD, &q) != MPI_SUCCESS) return lost("sending");
    return wait_req(&q, "sending");
}

twk_status twk_dist_send_async(int to, int tag, void *buf, int64_t n) {
    pending_send *p = g_size > 1 && !g_failed && n >= 0 && n <= INT_MAX ? twk_host_calloc(sizeof *p, "dist send") : NULL;
    if (!p) {
        twk_host_free(buf);
        return g_size == 1 ? twk_error(TWK_ERR_STATE, "dist: no other rank to send to")
                           : twk_error(TWK_ERR_OOM, "dist: an asynchronous send of %lld bytes failed", (long long)n);
    }
    if (MPI_Isend(buf, (int)n, MPI_BYTE, to, tag, MPI_COMM_WORLD, &p->q) != MPI_SUCCESS) {
        twk_host_free(buf);
        twk_host_free(p);
        return lost("sending");
    }
    p->buf = buf;
    p->next = g_pending;
    g_pending = p;
    return TWK_OK;
}

twk_status twk_dist_recv(int from, int tag, void **buf, int64_t *n) {
    *buf = NULL;
    *n = 0;
    if (g_size == 1) return twk_error(TWK_ERR_STATE, "dist: no other rank to receive from");
    MPI_Status st;
    long wait_ns = 20000; /* 20 us, doubling to 5 ms while nothing arrives */
    for (int flag = 0;;) {
        if (MPI_Iprobe(from, tag, MPI_COMM_WORLD, &flag, &st) != MPI_SUCCESS) return lost("receiving");
        if (flag) break;
        if (g_failed) return lost("receiving");
        progress_sends();
        struct timespec ts = {0, wait_ns};
        nanosleep(&ts, NULL);
        wait_ns = wait_ns < 5000000 ? wait_ns * 2 : 5000000;
    }
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    *buf = twk_host_alloc((size_t)(count ? count : 1), "dist message");
    if (!*buf) return twk_error(TWK_ERR_OOM, "dist: no memory for a %d-byte message from rank %d", count, from);
    if (MPI_Recv(*buf, count, MPI_BYTE, from, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        twk_host_free(*buf);
        *buf = NULL;
        return lost("receiving");
    }
    *n = count;
    return TWK_OK;
}

void twk_dist_abort(int code) {
    if (g_init && g_size > 1) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}
