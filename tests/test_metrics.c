/* The service's metrics table (server/metrics.c) and its helpers: concurrent updates from several
 * threads lose nothing (exact counts), the tenant-summed and admin views render what was added,
 * label values are escaped, the queue/stall bookkeeping, route labels (svc_metrics_route), the
 * TWK_FAULT parser, and hal's host and device byte counters. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "svc.h"
#include "twinkle/hal.h"

static int fails;

static void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    if (!ok) fails++;
}

#define N_THREADS 4
#define N_ADDS 20000

typedef struct worker_arg {
    twk_metrics *m;
    const char *tenant;
} worker_arg;

static void *hammer(void *p) {
    worker_arg *a = p;
    for (int i = 0; i < N_ADDS; i++) {
        twk_metrics_add(a->m, TWK_M_HTTP_REQUESTS, a->tenant, "route=\"x\"", 1);
        twk_metrics_observe(a->m, TWK_M_HTTP_DURATION, a->tenant, "route=\"x\"", (i % 3) * 0.02);
        double t = twk_metrics_job_queued(a->m, a->tenant, "train");
        twk_metrics_job_done(a->m, a->tenant, "train", t, t);
        if (i % 1000 == 0) twk_host_free(twk_metrics_render(a->m, i % 2000 == 0, NULL));
    }
    return NULL;
}

/* The value of the sample line that starts with `prefix` (the name and its labels), or -1. */
static double sample(const char *text, const char *prefix) {
    size_t n = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, prefix, n) && p[n] == ' ') return atof(p + n + 1);
    return -1;
}

static void test_concurrent_counts(void) {
    twk_metrics *m = twk_metrics_new();
    pthread_t th[N_THREADS];
    worker_arg args[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        args[i] = (worker_arg){m, i % 2 ? "b\"ob\\" : "alice"};
        pthread_create(&th[i], NULL, hammer, &args[i]);
    }
    for (int i = 0; i < N_THREADS; i++) pthread_join(th[i], NULL);
    char *sum = twk_metrics_render(m, 0, NULL), *admin = twk_metrics_render(m, 1, NULL);
    double total = N_THREADS * N_ADDS, per = total / 2;
    double got = sample(sum, "twinkle_http_requests_total{route=\"x\"}");
    check(got == total, "%d threads x %d adds: the summed counter is %.0f (want %.0f)", N_THREADS, N_ADDS, got, total);
    got = sample(admin, "twinkle_http_requests_total{tenant=\"alice\",route=\"x\"}");
    check(got == per, "admin view: alice's counter %.0f (want %.0f)", got, per);
    got = sample(admin, "twinkle_http_requests_total{tenant=\"b\\\"ob\\\\\",route=\"x\"}");
    check(got == per, "admin view: the escaped tenant b\\\"ob\\\\ has %.0f (want %.0f)", got, per);
    check(!strstr(sum, "tenant="), "the summed view names no tenant");
    got = sample(sum, "twinkle_http_request_duration_seconds_count{route=\"x\"}");
    check(got == total, "histogram count %.0f (want %.0f)", got, total);
    /* (i % 3) * 0.02: 0 and 0.02 are <= 0.025, 0.04 is not */
    double le = sample(sum, "twinkle_http_request_duration_seconds_bucket{route=\"x\",le=\"0.025\"}");
    double want = 0;
    for (int i = 0; i < N_ADDS; i++) want += (i % 3) != 2;
    check(le == want * N_THREADS, "bucket le=0.025 holds %.0f (want %.0f)", le, want * N_THREADS);
    check(sample(sum, "twinkle_http_request_duration_seconds_bucket{route=\"x\",le=\"+Inf\"}") == total, "le=+Inf = count");
    got = sample(sum, "twinkle_queue_depth{kind=\"train\"}");
    check(got == 0, "queue depth back to %.0f after every job finished", got);
    got = sample(sum, "twinkle_queue_wait_seconds_count{kind=\"train\"}");
    check(got == total, "queue waits observed %.0f (want %.0f)", got, total);
    check(twk_metrics_stall(m) == 0, "no stall when idle");
    check(sample(sum, "twinkle_alerts_dropped_total") == 0, "an unlabelled counter shows 0 before it moves");
    twk_host_free(sum);
    twk_host_free(admin);

    double t = twk_metrics_job_queued(m, "alice", "sample");
    check(twk_metrics_stall(m) >= 0 && t > 0, "a job in flight: stall %.3f s", twk_metrics_stall(m));
    twk_metrics_job_done(m, "alice", "sample", t, 0);
    check(twk_metrics_stall(m) == 0, "finished: no stall");
    twk_metrics_set_spilled(m, "runs", "alice", 3);
    twk_metrics_set_spilled(m, "samplers", "alice", 2);
    twk_metrics_tokens(m, "alice", "forward_backward", 17);
    twk_metrics_tokens(m, "b", "forward_backward", 5);
    sum = twk_metrics_render(m, 0, NULL);
    check(sample(sum, "twinkle_runs_spilled") == 3 && sample(sum, "twinkle_samplers_spilled") == 2,
          "the spilled setters feed their gauges");
    check(sample(sum, "twinkle_tokens_total{op=\"forward_backward\"}") == 22, "tokens summed over tenants: %g",
          sample(sum, "twinkle_tokens_total{op=\"forward_backward\"}"));
    twk_host_free(sum);
    twk_metrics_clear(m, TWK_M_RUNS_SPILLED);
    sum = twk_metrics_render(m, 0, NULL);
    check(sample(sum, "twinkle_runs_spilled") == -1, "clear removes a family's series");
    twk_host_free(sum);
    twk_metrics_free(m);
}

static void test_routes(void) {
    static const char *const cases[][2] = {
        {"forward_backward", "forward_backward"},
        {"training_runs/sess-1:train:0/checkpoints/weights/step-3", "training_runs/{id}/checkpoints/weights/{id}"},
        {"training_runs/r/checkpoints/sampler_weights/n/publish", "training_runs/{id}/checkpoints/sampler_weights/{id}/publish"},
        {"samplers/abc", "samplers/{id}"},
        {"sessions/s-1/trace_export", "sessions/{id}/trace_export"},
        {"no-such-route/x", "other"},
        {"/v1/chat/completions", "/v1/chat/completions"},
        {"/v1/secret", "other"},
        {"/metrics", "/metrics"},
        {"", "none"},
        {"-", "none"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[160];
        svc_metrics_route(cases[i][0], out, sizeof out);
        check(!strcmp(out, cases[i][1]), "route '%s' -> '%s' (want '%s')", cases[i][0], out, cases[i][1]);
    }
}

static void test_fault(void) {
    setenv("TWK_FAULT", "fail:optim_step,sleep:forward_backward:2.5", 1);
    double arg = -1;
    check(svc_fault("fail", "optim_step", NULL) == 1, "fail:optim_step listed");
    check(svc_fault("fail", "forward_backward", NULL) == 0, "fail:forward_backward not listed");
    check(svc_fault("sleep", "forward_backward", &arg) == 1 && arg == 2.5, "sleep:forward_backward:2.5 (arg %g)", arg);
    check(svc_fault("sleep", "forward", &arg) == 0 && arg == 0, "a prefix of a route does not match");
    check(svc_fault("fail", "optim", NULL) == 0, "a prefix of a listed route does not match");
    unsetenv("TWK_FAULT");
    check(svc_fault("fail", "optim_step", NULL) == 0, "inert when unset");
}

static void test_hal_bytes(void) {
    size_t h0 = twk_host_bytes_in_use();
    void *p = twk_host_alloc(1 << 20, "test");
    size_t h1 = twk_host_bytes_in_use();
    twk_host_free(p);
    size_t h2 = twk_host_bytes_in_use();
    check(h1 >= h0 + (1 << 20) && h2 + (1 << 20) <= h1, "host bytes %zu -> %zu -> %zu around a 1 MiB block", h0, h1, h2);
    twk_device *dev = NULL;
    if (twk_device_open("cpu", &dev) != TWK_OK) {
        check(0, "open cpu: %s", twk_last_error());
        return;
    }
    size_t d0 = twk_device_buffer_bytes(dev);
    twk_buffer *b = NULL;
    twk_buffer_alloc(dev, 4096, &b);
    size_t d1 = twk_device_buffer_bytes(dev);
    twk_buffer_free(dev, b);
    size_t d2 = twk_device_buffer_bytes(dev);
    check(d1 == d0 + 4096 && d2 == d0, "device buffer bytes %zu -> %zu -> %zu around a 4096-byte buffer", d0, d1, d2);
    twk_device_close(dev);
}

int main(void) {
    test_concurrent_counts();
    test_routes();
    test_fault();
    test_hal_bytes();
    printf("%s\n", fails ? "FAILED" : "all passed");
    return fails ? 1 : 0;
}
