/* The service's metrics table (server/metrics.c) and its helpers: concurrent updates from several
 * threads lose nothing (exact counts), the tenant-summed and admin views render what was added,
 * label values are escaped, the queue/stall bookkeeping, route labels (svc_metrics_route), the
 * TWK_FAULT parser, hal's host and device byte counters and their pools (the pools sum to the totals
 * exactly; the weights pool is the model's parameter bytes and a trainer adds its adapter, gradients
 * and moments to the adapters pool, both computed here from the model's config), and the packed
 * training counters as rendered. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "metrics.h"
#include "svc.h"
#include "twinkle/hal.h"
#include "twinkle/model.h"
#include "twinkle/sampler.h"
#include "twinkle/trainer.h"


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
    twk_metrics_set(m, TWK_M_RUNS_SPILLED, "alice", "", 3);
    twk_metrics_set(m, TWK_M_SAMPLERS_SPILLED, "alice", "", 2);
    twk_metrics_tokens(m, "alice", "forward_backward", 17);
    twk_metrics_tokens(m, "b", "forward_backward", 5);
    sum = twk_metrics_render(m, 0, NULL);
    check(sample(sum, "twinkle_runs_spilled") == 3 && sample(sum, "twinkle_samplers_spilled") == 2,
          "the spilled gauges render their values");
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


/* Host pools: a block counts in the pool current when it was made (realloc keeps it), and every
 * snapshot sums to the total. */
static void test_host_pools(void) {
    size_t v[TWK_HPOOL_COUNT];
    size_t total = twk_host_pool_snapshot(v);
    check(total == twk_host_bytes_in_use(), "host pools sum to the total (%zu)", total);
    size_t r0 = twk_host_pool_bytes(TWK_HPOOL_REQUESTS), c0 = twk_host_pool_bytes(TWK_HPOOL_ADAPTER_COPIES);
    void *a = twk_host_pool_alloc(TWK_HPOOL_REQUESTS, 1 << 20, "test");
    size_t r1 = twk_host_pool_bytes(TWK_HPOOL_REQUESTS);
    check(a && r1 >= r0 + (1 << 20) && twk_host_bytes_in_use() - total == r1 - r0,
          "a 1 MiB block of the requests pool: +%zu bytes there and in the total", r1 - r0);
    twk_host_pool prev = twk_host_pool_enter(TWK_HPOOL_ADAPTER_COPIES);
    void *b = twk_host_alloc(4096, "test");
    a = twk_host_realloc(a, 1 << 20, 2 << 20, "test"); /* stays in requests */
    twk_host_pool_enter(prev);
    size_t c1 = twk_host_pool_bytes(TWK_HPOOL_ADAPTER_COPIES), r2 = twk_host_pool_bytes(TWK_HPOOL_REQUESTS);
    check(prev == TWK_HPOOL_OTHER && c1 >= c0 + 4096 && c1 < c0 + 8192 && r2 >= r0 + (2 << 20),
          "the scope tags its blocks (adapter_copies +%zu), a realloc keeps its block's pool (requests +%zu)",
          c1 - c0, r2 - r0);
    twk_host_free(a);
    twk_host_free(b);
    check(twk_host_pool_bytes(TWK_HPOOL_REQUESTS) == r0 && twk_host_pool_bytes(TWK_HPOOL_ADAPTER_COPIES) == c0 &&
              twk_host_bytes_in_use() == total,
          "freed: every pool and the total back where they were");
    check(!strcmp(twk_host_pool_name(TWK_HPOOL_DEVICE_BUFFERS), "device_buffers") && !strcmp(twk_host_pool_name(99), "?"),
          "host pool names");
}

/* Parameter bytes of a Qwen3 model at f32, from its config. */
static size_t param_bytes(const twk_model_config *c) {
    size_t h = (size_t)c->hidden, q = (size_t)c->heads * (size_t)c->head_dim, kv = (size_t)c->kv_heads * (size_t)c->head_dim;
    size_t layer = h * q + 2 * h * kv + q * h + 3 * h * (size_t)c->ffn + 2 * h + (c->qk_norm ? 2 * (size_t)c->head_dim : 0);
    size_t n = (size_t)c->vocab * h * (c->tie_embeddings ? 1 : 2) + (size_t)c->layers * layer + h;
    return n * 4;
}

/* A LoRA trainer's device bytes at rank r over attention, MLP and unembedding: the adapter (A r x in,
 * B out x r) and three flat f32 buffers (gradients, two AdamW moments), each tensor padded to 64 floats. */
static size_t run_bytes(const twk_model_config *c, size_t r) {
    size_t h = (size_t)c->hidden, q = (size_t)c->heads * (size_t)c->head_dim, kv = (size_t)c->kv_heads * (size_t)c->head_dim;
    size_t f = (size_t)c->ffn, mods[8][2] = {{h, q}, {h, kv}, {h, kv}, {q, h}, {h, f}, {h, f}, {f, h}, {h, (size_t)c->vocab}};
    size_t plain = 0, padded = 0;
    for (int l = 0; l <= c->layers; l++)
        for (int k = l == c->layers ? 7 : 0; k < (l == c->layers ? 8 : 7); k++) {
            size_t t[2] = {r * mods[k][0], mods[k][1] * r};
            for (int ab = 0; ab < 2; ab++) plain += t[ab], padded += (t[ab] + 63) / 64 * 64;
        }
    return plain * 4 + 3 * padded * 4;
}

static int device_sums(twk_device *dev, size_t out[TWK_DPOOL_COUNT]) {
    return twk_device_pool_snapshot(dev, out) == twk_device_buffer_bytes(dev);
}

/* Device pools: the built-in model's weights, a trainer's adapter + gradients + moments, a sampler's
 * KV cache; the pools sum to the device's total after each step. */
static void test_device_pools(void) {
    twk_device *dev = NULL;
    twk_model *m = NULL;
    if (twk_device_open("cpu", &dev) != TWK_OK || twk_model_builtin(dev, &m) != TWK_OK) {
        check(0, "open cpu and the built-in model: %s", twk_last_error());
        twk_device_close(dev);
        return;
    }
    twk_model_config c;
    twk_model_builtin_config(&c);
    size_t p0[TWK_DPOOL_COUNT], p1[TWK_DPOOL_COUNT], p2[TWK_DPOOL_COUNT], p3[TWK_DPOOL_COUNT];
    check(device_sums(dev, p0), "device pools sum to the total after loading the model");
    check(p0[TWK_DPOOL_WEIGHTS] == param_bytes(&c), "weights pool %zu bytes = the model's parameters %zu",
          p0[TWK_DPOOL_WEIGHTS], param_bytes(&c));
    size_t hv[TWK_HPOOL_COUNT];
    twk_host_pool_snapshot(hv);
    check(hv[TWK_HPOOL_DEVICE_BUFFERS] >= twk_device_buffer_bytes(dev),
          "the CPU device's buffers are host memory of the device_buffers pool (%zu >= %zu)", hv[TWK_HPOOL_DEVICE_BUFFERS],
          twk_device_buffer_bytes(dev));
    twk_lora_config lc = {.rank = 8, .alpha = 16, .train_attn = true, .train_mlp = true, .train_unembed = true, .seed = 1};
    twk_trainer *t = NULL;
    if (twk_trainer_new(m, &lc, 64, &t) != TWK_OK) {
        check(0, "trainer: %s", twk_last_error());
    } else {
        check(device_sums(dev, p1), "device pools sum to the total with a trainer");
        check(p1[TWK_DPOOL_ADAPTERS] - p0[TWK_DPOOL_ADAPTERS] == run_bytes(&c, 8),
              "a rank-8 trainer adds %zu bytes to the adapters pool (expected %zu)",
              p1[TWK_DPOOL_ADAPTERS] - p0[TWK_DPOOL_ADAPTERS], run_bytes(&c, 8));
        check(p1[TWK_DPOOL_WEIGHTS] == p0[TWK_DPOOL_WEIGHTS] && p1[TWK_DPOOL_ACTIVATIONS] > p0[TWK_DPOOL_ACTIVATIONS],
              "its arena is in activations, the weights unchanged");
        twk_trainer_free(t);
    }
    twk_device_pool_snapshot(dev, p2);
    check(p2[TWK_DPOOL_ADAPTERS] == p0[TWK_DPOOL_ADAPTERS] && p2[TWK_DPOOL_ACTIVATIONS] == p0[TWK_DPOOL_ACTIVATIONS],
          "freed: the adapters and activations pools back where they were");
    int seqs = 2;
    int64_t len = 32;
    lc.train_unembed = false;
    twk_sampler *sp = NULL;
    if (twk_sampler_new(m, &lc, seqs, len, &sp) != TWK_OK) {
        check(0, "sampler: %s", twk_last_error());
    } else {
        check(device_sums(dev, p3), "device pools sum to the total with a sampler");
        size_t kv = 2 * (size_t)c.layers * (size_t)seqs * (size_t)len * (size_t)c.kv_heads * (size_t)c.head_dim * 4;
        check(p3[TWK_DPOOL_KV_CACHE] - p0[TWK_DPOOL_KV_CACHE] == kv, "a sampler of %d x %lld tokens: kv_cache +%zu (expected %zu)",
              seqs, (long long)len, p3[TWK_DPOOL_KV_CACHE] - p0[TWK_DPOOL_KV_CACHE], kv);
        check(p3[TWK_DPOOL_SAMPLER_ADAPTERS] > p0[TWK_DPOOL_SAMPLER_ADAPTERS] && p3[TWK_DPOOL_ADAPTERS] == p0[TWK_DPOOL_ADAPTERS],
              "its adapter is in sampler_adapters, not in the runs' adapters");
        twk_sampler_free(sp);
    }
    twk_model_free(m);
    check(twk_device_buffer_bytes(dev) == 0 && device_sums(dev, p0), "everything freed: every pool at 0");
    twk_device_close(dev);
}

/* The packed-training counters as GET /metrics shows them. */
static void test_pack_counters(void) {
    twk_metrics *m = twk_metrics_new();
    twk_metrics_pack(m, "base", NULL);
    char *text = twk_metrics_render(m, 0, NULL);
    check(text && sample(text, "twinkle_train_passes_total{model=\"base\",kind=\"packed\"}") == 0 &&
              sample(text, "twinkle_train_passes_total{model=\"base\",kind=\"alone\"}") == 0 &&
              sample(text, "twinkle_train_passes_total{model=\"base\",kind=\"own_trainer\"}") == 0,
          "the pass counters exist at 0 before any pass");
    twk_host_free(text);
    twk_pack_stats st = {.passes = 5, .segments = 12, .shared_passes = 3, .own_passes = 7, .max_segments = 4};
    twk_metrics_pack(m, "base", &st);
    text = twk_metrics_render(m, 0, NULL);
    check(text && sample(text, "twinkle_train_passes_total{model=\"base\",kind=\"packed\"}") == 3 &&
              sample(text, "twinkle_train_passes_total{model=\"base\",kind=\"alone\"}") == 2 &&
              sample(text, "twinkle_train_packed_runs_total{model=\"base\"}") == 10 &&
              sample(text, "twinkle_train_pass_runs_max{model=\"base\"}") == 4 &&
              sample(text, "twinkle_train_passes_total{model=\"base\",kind=\"own_trainer\"}") == 7,
          "5 passes of 12 segments, 3 shared: packed 3, alone 2, 10 runs in packed passes, at most 4; 7 on own trainers");
    twk_host_free(text);
    twk_metrics_free(m);
}

int main(void) {
    test_concurrent_counts();
    test_routes();
    test_fault();
    test_hal_bytes();
    test_host_pools();
    test_device_pools();
    test_pack_counters();
    printf("%s\n", check_failures ? "FAILED" : "all passed");
    return check_failures ? 1 : 0;
}
