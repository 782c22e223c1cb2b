/* The metrics table and its Prometheus text exposition (see metrics.h). */
#include "metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "twinkle/hal.h"

#define MAX_BUCKETS 16
#define RATE_WINDOW 60 /* seconds behind TWK_M_TOKENS_RATE */

static const double dur_buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
/* queue waits: a small step waits milliseconds, a flooded one seconds (bench/server/sdk_bench.py estimates
 * per-tenant p50 / p99 from these buckets) */
static const double wait_buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                      0.5,   1,      2.5,   5,    10,    30,   60,  300};
_Static_assert(sizeof wait_buckets / sizeof wait_buckets[0] <= MAX_BUCKETS, "MAX_BUCKETS");
_Static_assert(sizeof dur_buckets / sizeof dur_buckets[0] <= MAX_BUCKETS, "MAX_BUCKETS");

typedef struct family_def {
    const char *name, *type, *help;
    const double *buckets;
    int n_buckets;
} family_def;

#define NB(a) a, (int)(sizeof a / sizeof a[0])
static const family_def defs[TWK_M_COUNT] = {
    [TWK_M_HTTP_REQUESTS] = {"twinkle_http_requests_total", "counter", "HTTP requests answered, by route and status", NULL, 0},
    [TWK_M_HTTP_DURATION] = {"twinkle_http_request_duration_seconds", "histogram",
                             "Time from the parsed request to its answer (a parked retrieve_future counts its wait)", NB(dur_buckets)},
    [TWK_M_QUEUE_DEPTH] = {"twinkle_queue_depth", "gauge", "Compute jobs submitted to the worker and not finished (queued or running)", NULL, 0},
    [TWK_M_QUEUE_WAIT] = {"twinkle_queue_wait_seconds", "histogram", "Time a compute job waited before the worker started it", NB(wait_buckets)},
    [TWK_M_COMPUTE_SECONDS] = {"twinkle_compute_seconds_total", "counter", "Worker time spent on compute jobs", NULL, 0},
    [TWK_M_TOKENS] = {"twinkle_tokens_total", "counter",
                      "Tokens processed: forward_backward and forward (input tokens), sample (generated tokens)", NULL, 0},
    [TWK_M_TOKENS_RATE] = {"twinkle_tokens_per_second", "gauge", "Tokens per second over the last minute, service-wide", NULL, 0},
    [TWK_M_RUNS_LIVE] = {"twinkle_runs_live", "gauge", "Training runs held by the server (created or loaded, not unloaded)", NULL, 0},
    [TWK_M_RUNS_SPILLED] = {"twinkle_runs_spilled", "gauge", "Training runs whose state is spilled off the device", NULL, 0},
    [TWK_M_SESSIONS_LIVE] = {"twinkle_sessions_live", "gauge", "Sessions not finished with a heartbeat in the last 5 minutes", NULL, 0},
    [TWK_M_SAMPLERS_LIVE] = {"twinkle_samplers_live", "gauge", "Sampling sessions", NULL, 0},
    [TWK_M_SAMPLERS_SPILLED] = {"twinkle_samplers_spilled", "gauge", "Sampling sessions whose sampler is spilled off the device", NULL, 0},
    [TWK_M_CHECKPOINTS] = {"twinkle_checkpoints", "gauge", "Checkpoints in the store", NULL, 0},
    [TWK_M_CHECKPOINT_BYTES] = {"twinkle_checkpoint_bytes", "gauge", "Bytes of checkpoint files on disk", NULL, 0},
    [TWK_M_HOST_MEMORY] = {"twinkle_host_memory_bytes", "gauge", "Host memory held through the engine's allocator (twk_host_alloc)", NULL, 0},
    [TWK_M_HOST_MEMORY_POOL] = {"twinkle_host_memory_pool_bytes", "gauge",
                                "twinkle_host_memory_bytes by pool (hal's twk_host_pool); the pools sum to it", NULL, 0},
    [TWK_M_PROCESS_RSS] = {"process_resident_memory_bytes", "gauge", "Resident memory of the server process", NULL, 0},
    [TWK_M_DEVICE_MEMORY] = {"twinkle_device_memory_bytes", "gauge", "Device memory in buffers allocated through the HAL", NULL, 0},
    [TWK_M_DEVICE_MEMORY_POOL] = {"twinkle_device_memory_pool_bytes", "gauge",
                                  "twinkle_device_memory_bytes by pool (hal's twk_device_pool); the pools sum to it", NULL, 0},
    [TWK_M_DEVICE_MEMORY_TOTAL] = {"twinkle_device_memory_total_bytes", "gauge", "Device memory the backend reports", NULL, 0},
    [TWK_M_TRAIN_PASSES] = {"twinkle_train_passes_total", "counter",
                            "forward / forward_backward passes of a base model: packed (several runs shared one pass), alone (one run in "
                            "the pack), or own_trainer (a run with LoRA on a mixture of experts' experts or router, never packed)",
                            NULL, 0},
    [TWK_M_TRAIN_PACKED_RUNS] = {"twinkle_train_packed_runs_total", "counter", "Run segments carried by packed passes", NULL, 0},
    [TWK_M_TRAIN_PASS_RUNS_MAX] = {"twinkle_train_pass_runs_max", "gauge", "The most runs one training pass has held", NULL, 0},
    [TWK_M_ERRORS] = {"twinkle_errors_total", "counter",
                      "Errors by category: failed futures (source=future) and 4xx/5xx answers (source=answer)", NULL, 0},
    [TWK_M_WORKER_STALL] = {"twinkle_worker_stall_seconds", "gauge", "Seconds the compute worker has had work without finishing a job", NULL, 0},
    [TWK_M_ALERTS] = {"twinkle_alerts_total", "counter", "Alert events raised", NULL, 0},
    [TWK_M_ALERTS_SUPPRESSED] = {"twinkle_alerts_suppressed_total", "counter", "Alert events not sent (rate limit per kind)", NULL, 0},
    [TWK_M_ALERTS_DROPPED] = {"twinkle_alerts_dropped_total", "counter", "Alert deliveries dropped because the queue was full", NULL, 0},
    [TWK_M_ALERT_DELIVERIES] = {"twinkle_alert_deliveries_total", "counter", "Webhook posts that succeeded", NULL, 0},
    [TWK_M_ALERT_RETRIES] = {"twinkle_alert_retries_total", "counter", "Webhook posts retried after a failed attempt", NULL, 0},
    [TWK_M_ALERT_FAILURES] = {"twinkle_alert_failures_total", "counter", "Alert deliveries given up after the last retry", NULL, 0},
};

typedef struct series {
    char tenant[64];
    char labels[192];
    double v, sum;
    uint64_t count, b[MAX_BUCKETS];
} series;

static const char *const rate_ops[] = {"forward_backward", "forward", "sample"};
#define N_RATE_OPS 3

struct twk_metrics {
    pthread_mutex_t mu;
    series *s[TWK_M_COUNT];
    int n[TWK_M_COUNT], cap[TWK_M_COUNT], total;
    double rate[N_RATE_OPS][RATE_WINDOW];
    long rate_sec[N_RATE_OPS][RATE_WINDOW];
    int in_flight;
    double progress; /* the start of the current stretch without a finished job */
};

double twk_metrics_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

twk_metrics *twk_metrics_new(void) {
    twk_metrics *m = twk_host_calloc(sizeof *m, "metrics");
    if (m) pthread_mutex_init(&m->mu, NULL);
    return m;
}

void twk_metrics_free(twk_metrics *m) {
    if (!m) return;
    for (int f = 0; f < TWK_M_COUNT; f++) twk_host_free(m->s[f]);
    pthread_mutex_destroy(&m->mu);
    twk_host_free(m);
}

/* The series (f, tenant, labels), made when absent; NULL when out of memory. Lock held. */
static series *find(twk_metrics *m, twk_metric f, const char *tenant, const char *labels) {
    tenant = tenant ? tenant : "";
    labels = labels ? labels : "";
    for (int i = 0; i < m->n[f]; i++)
        if (!strcmp(m->s[f][i].tenant, tenant) && !strcmp(m->s[f][i].labels, labels)) return &m->s[f][i];
    if (m->total >= TWK_METRICS_MAX_SERIES && *tenant && strcmp(tenant, "(other)"))
        return find(m, f, "(other)", labels);
    if (m->n[f] == m->cap[f]) {
        int cap = m->cap[f] ? m->cap[f] * 2 : 8;
        series *ns = twk_host_realloc(m->s[f], (size_t)m->cap[f] * sizeof *ns, (size_t)cap * sizeof *ns, "metric series");
        if (!ns) return NULL;
        m->s[f] = ns;
        m->cap[f] = cap;
    }
    series *x = &m->s[f][m->n[f]++];
    memset(x, 0, sizeof *x);
    snprintf(x->tenant, sizeof x->tenant, "%s", tenant);
    snprintf(x->labels, sizeof x->labels, "%s", labels);
    m->total++;
    return x;
}

static void update(twk_metrics *m, twk_metric f, const char *tenant, const char *labels, double v, int how) {
    if (!m || f < 0 || f >= TWK_M_COUNT) return;
    pthread_mutex_lock(&m->mu);
    series *x = find(m, f, tenant, labels);
    if (x && how == 0) x->v += v;
    else if (x && how == 1) x->v = v;
    else if (x) {
        const family_def *d = &defs[f];
        int b = 0;
        while (b < d->n_buckets && v > d->buckets[b]) b++;
        if (b < d->n_buckets) x->b[b]++;
        x->count++;
        x->sum += v;
    }
    pthread_mutex_unlock(&m->mu);
}

void twk_metrics_add(twk_metrics *m, twk_metric f, const char *tenant, const char *labels, double v) {
    update(m, f, tenant, labels, v, 0);
}
void twk_metrics_set(twk_metrics *m, twk_metric f, const char *tenant, const char *labels, double v) {
    update(m, f, tenant, labels, v, 1);
}
void twk_metrics_observe(twk_metrics *m, twk_metric f, const char *tenant, const char *labels, double v) {
    update(m, f, tenant, labels, v, 2);
}

void twk_metrics_clear(twk_metrics *m, twk_metric f) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->total -= m->n[f];
    m->n[f] = 0;
    pthread_mutex_unlock(&m->mu);
}

void twk_metrics_tokens(twk_metrics *m, const char *tenant, const char *op, double n) {
    if (!m) return;
    char l[64];
    snprintf(l, sizeof l, "op=\"%s\"", op);
    twk_metrics_add(m, TWK_M_TOKENS, tenant, l, n);
    long sec = (long)twk_metrics_now();
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < N_RATE_OPS; i++)
        if (!strcmp(op, rate_ops[i])) {
            int k = (int)(sec % RATE_WINDOW);
            if (m->rate_sec[i][k] != sec) m->rate_sec[i][k] = sec, m->rate[i][k] = 0;
            m->rate[i][k] += n;
        }
    pthread_mutex_unlock(&m->mu);
}

void twk_metrics_pack(twk_metrics *m, const char *model, const twk_pack_stats *st) {
    twk_pack_stats zero = {0};
    if (!st) st = &zero;
    char mo[96], l[160];
    twk_metrics_escape(mo, sizeof mo, model);
    snprintf(l, sizeof l, "model=\"%s\",kind=\"packed\"", mo);
    twk_metrics_set(m, TWK_M_TRAIN_PASSES, NULL, l, (double)st->shared_passes);
    snprintf(l, sizeof l, "model=\"%s\",kind=\"alone\"", mo);
    twk_metrics_set(m, TWK_M_TRAIN_PASSES, NULL, l, (double)(st->passes - st->shared_passes));
    snprintf(l, sizeof l, "model=\"%s\",kind=\"own_trainer\"", mo);
    twk_metrics_set(m, TWK_M_TRAIN_PASSES, NULL, l, (double)st->own_passes);
    snprintf(l, sizeof l, "model=\"%s\"", mo);
    /* a pass alone holds one segment: the rest were in packed passes */
    twk_metrics_set(m, TWK_M_TRAIN_PACKED_RUNS, NULL, l, (double)(st->segments - (st->passes - st->shared_passes)));
    twk_metrics_set(m, TWK_M_TRAIN_PASS_RUNS_MAX, NULL, l, (double)st->max_segments);
}

double twk_metrics_job_queued(twk_metrics *m, const char *tenant, const char *kind) {
    double now = twk_metrics_now();
    if (!m) return now;
    char l[48];
    snprintf(l, sizeof l, "kind=\"%s\"", kind);
    twk_metrics_add(m, TWK_M_QUEUE_DEPTH, tenant, l, 1);
    pthread_mutex_lock(&m->mu);
    if (m->in_flight++ == 0) m->progress = now;
    pthread_mutex_unlock(&m->mu);
    return now;
}

void twk_metrics_job_done(twk_metrics *m, const char *tenant, const char *kind, double t_queued, double t_started) {
    if (!m) return;
    double now = twk_metrics_now();
    char l[48];
    snprintf(l, sizeof l, "kind=\"%s\"", kind);
    twk_metrics_add(m, TWK_M_QUEUE_DEPTH, tenant, l, -1);
    if (t_started > 0) {
        twk_metrics_observe(m, TWK_M_QUEUE_WAIT, tenant, l, t_started > t_queued ? t_started - t_queued : 0);
        twk_metrics_add(m, TWK_M_COMPUTE_SECONDS, tenant, l, now > t_started ? now - t_started : 0);
    }
    pthread_mutex_lock(&m->mu);
    if (m->in_flight > 0) m->in_flight--;
    m->progress = now;
    pthread_mutex_unlock(&m->mu);
}

double twk_metrics_stall(twk_metrics *m) {
    if (!m) return 0;
    double now = twk_metrics_now();
    pthread_mutex_lock(&m->mu);
    double s = m->in_flight > 0 && now > m->progress ? now - m->progress : 0;
    pthread_mutex_unlock(&m->mu);
    return s;
}

void twk_metrics_escape(char *out, size_t cap, const char *v) {
    size_t o = 0;
    for (; v && *v && o + 3 < cap; v++) {
        if (*v == '\\' || *v == '"') out[o++] = '\\', out[o++] = *v;
        else if (*v == '\n') out[o++] = '\\', out[o++] = 'n';
        else out[o++] = *v;
    }
    out[o] = 0;
}

/* ---- rendering ---- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = (b->cap + (size_t)k) * 2;
        char *np = twk_host_realloc(b->p, b->cap, cap, "metrics text");
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
}

static void put_value(sbuf *b, double v) {
    if (isnan(v)) put(b, "NaN\n");
    else if (isinf(v)) put(b, v > 0 ? "+Inf\n" : "-Inf\n");
    else if (v == (double)(int64_t)v && fabs(v) < 9e15) put(b, "%lld\n", (long long)v);
    else put(b, "%.10g\n", v);
}

/* name{tenant="t",labels[,extra]} */
static void put_name(sbuf *b, const char *name, const char *suffix, const char *tenant, const char *labels,
                     const char *extra) {
    char t[160] = "";
    if (tenant && *tenant) twk_metrics_escape(t, sizeof t, tenant);
    int any = *t || *labels || (extra && *extra);
    put(b, "%s%s%s", name, suffix, any ? "{" : "");
    const char *sep = "";
    if (*t) put(b, "tenant=\"%s\"", t), sep = ",";
    if (*labels) put(b, "%s%s", sep, labels), sep = ",";
    if (extra && *extra) put(b, "%s%s", sep, extra);
    put(b, "%s ", any ? "}" : "");
}

static void put_series(sbuf *b, const family_def *d, const series *x, const char *tenant) {
    if (!d->n_buckets) {
        put_name(b, d->name, "", tenant, x->labels, NULL);
        put_value(b, x->v);
        return;
    }
    uint64_t cum = 0;
    char le[48];
    for (int i = 0; i < d->n_buckets; i++) {
        cum += x->b[i];
        snprintf(le, sizeof le, "le=\"%g\"", d->buckets[i]);
        put_name(b, d->name, "_bucket", tenant, x->labels, le);
        put_value(b, (double)cum);
    }
    put_name(b, d->name, "_bucket", tenant, x->labels, "le=\"+Inf\"");
    put_value(b, (double)x->count);
    put_name(b, d->name, "_sum", tenant, x->labels, NULL);
    put_value(b, x->sum);
    put_name(b, d->name, "_count", tenant, x->labels, NULL);
    put_value(b, (double)x->count);
}

static int by_labels(const void *a, const void *b) {
    return strcmp(((const series *)a)->labels, ((const series *)b)->labels);
}

/* The family's series summed over tenants per label set, rendered; 0 when out of memory. */
static int put_summed(sbuf *b, const family_def *d, const series *xs, int n) {
    if (n == 0) return 1;
    series *c = twk_host_alloc((size_t)n * sizeof *c, "metrics copy");
    if (!c) return 0;
    memcpy(c, xs, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, by_labels);
    for (int i = 0; i < n;) {
        series acc = c[i];
        int j = i + 1;
        for (; j < n && !strcmp(c[j].labels, acc.labels); j++) {
            acc.v += c[j].v;
            acc.sum += c[j].sum;
            acc.count += c[j].count;
            for (int k = 0; k < MAX_BUCKETS; k++) acc.b[k] += c[j].b[k];
        }
        put_series(b, d, &acc, NULL);
        i = j;
    }
    twk_host_free(c);
    return 1;
}

char *twk_metrics_render(twk_metrics *m, int per_tenant, size_t *len) {
    if (!m) return NULL;
    sbuf b = {twk_host_alloc(16384, "metrics text"), 0, 16384, 0};
    if (!b.p) return NULL;
    b.p[0] = 0;
    pthread_mutex_lock(&m->mu);
    /* the rate gauge from the last RATE_WINDOW whole seconds */
    long now = (long)twk_metrics_now();
    for (int i = 0; i < N_RATE_OPS; i++) {
        double sum = 0;
        for (int k = 0; k < RATE_WINDOW; k++)
            if (m->rate_sec[i][k] < now && m->rate_sec[i][k] >= now - RATE_WINDOW) sum += m->rate[i][k];
        char l[64];
        snprintf(l, sizeof l, "op=\"%s\"", rate_ops[i]);
        series *x = find(m, TWK_M_TOKENS_RATE, NULL, l);
        if (x) x->v = sum / RATE_WINDOW;
    }
    if (m->n[TWK_M_ALERTS_DROPPED] == 0) find(m, TWK_M_ALERTS_DROPPED, NULL, ""); /* 0 before any drop */
    for (int f = 0; f < TWK_M_COUNT && !b.oom; f++) {
        const family_def *d = &defs[f];
        put(&b, "# HELP %s %s\n# TYPE %s %s\n", d->name, d->help, d->name, d->type);
        if (per_tenant) {
            for (int i = 0; i < m->n[f]; i++) put_series(&b, d, &m->s[f][i], m->s[f][i].tenant);
        } else if (!put_summed(&b, d, m->s[f], m->n[f])) {
            b.oom = 1;
        }
    }
    pthread_mutex_unlock(&m->mu);
    if (b.oom) {
        twk_host_free(b.p);
        return NULL;
    }
    if (len) *len = b.n;
    return b.p;
}
