/* server/ — the service's metrics in memory and their Prometheus text exposition (GET /metrics,
 * svc_metrics.c). A series is a family, the tenant it belongs to ("" for service-wide ones) and its
 * other labels; the admin view renders the tenant as a label, every other view sums the series of
 * all tenants per label set, so no tenant's name or own numbers appear in it. Every function may be
 * called from any thread (one mutex guards the table): the loop thread, the compute worker and the
 * alert thread all update it. */
#ifndef TWK_SERVER_METRICS_H
#define TWK_SERVER_METRICS_H

#include <stddef.h>

#include "twinkle/trainer.h"

typedef enum twk_metric {
    TWK_M_HTTP_REQUESTS,    /* counter {tenant; method, route, status} */
    TWK_M_HTTP_DURATION,    /* histogram {tenant; route, status}, seconds */
    TWK_M_QUEUE_DEPTH,      /* gauge {tenant; kind}: compute jobs submitted and not finished */
    TWK_M_QUEUE_WAIT,       /* histogram {tenant; kind}, seconds from submission to start on the worker */
    TWK_M_COMPUTE_SECONDS,  /* counter {tenant; kind}: worker time */
    TWK_M_TOKENS,           /* counter {tenant; op}: forward_backward, forward, sample */
    TWK_M_TOKENS_RATE,      /* gauge {op}: tokens per second over the last minute */
    TWK_M_RUNS_LIVE,        /* gauge {tenant} */
    TWK_M_RUNS_SPILLED,     /* gauge {tenant}: live runs not resident (spilled to the data dir), set at each scrape */
    TWK_M_SESSIONS_LIVE,    /* gauge {tenant} */
    TWK_M_SAMPLERS_LIVE,    /* gauge {tenant} */
    TWK_M_SAMPLERS_SPILLED, /* gauge {tenant}: sampling sessions whose sampler is evicted off the device, set at each scrape */
    TWK_M_CHECKPOINTS,      /* gauge {tenant} */
    TWK_M_CHECKPOINT_BYTES, /* gauge {tenant} */
    TWK_M_HOST_MEMORY,      /* gauge: bytes held through twk_host_alloc */
    TWK_M_HOST_MEMORY_POOL, /* gauge {pool}: the same bytes per twk_host_pool (they sum to TWK_M_HOST_MEMORY) */
    TWK_M_PROCESS_RSS,      /* gauge: process_resident_memory_bytes */
    TWK_M_DEVICE_MEMORY,    /* gauge {device}: bytes of the HAL's buffers */
    TWK_M_DEVICE_MEMORY_POOL, /* gauge {device, pool}: the same bytes per twk_device_pool */
    TWK_M_DEVICE_MEMORY_TOTAL, /* gauge {device} (where the backend knows it) */
    TWK_M_TRAIN_PASSES,     /* counter {model, kind}: training passes, kind "packed" (several runs), "alone" or "own_trainer" (MoE expert LoRA) */
    TWK_M_TRAIN_PACKED_RUNS, /* counter {model}: run segments carried by packed passes */
    TWK_M_TRAIN_PASS_RUNS_MAX, /* gauge {model}: the most runs one pass has held */
    TWK_M_ERRORS,           /* counter {tenant; category, source}: failed futures and 4xx/5xx answers */
    TWK_M_WORKER_STALL,     /* gauge: seconds the worker has had work and finished none */
    TWK_M_ALERTS,           /* counter {kind}: alert events raised */
    TWK_M_ALERTS_SUPPRESSED, /* counter {kind}: events not sent (rate limit) */
    TWK_M_ALERTS_DROPPED,   /* counter: deliveries dropped (queue full) */
    TWK_M_ALERT_DELIVERIES, /* counter {target, format}: webhook posts that succeeded */
    TWK_M_ALERT_RETRIES,    /* counter {target, format}: attempts after a failed one */
    TWK_M_ALERT_FAILURES,   /* counter {target, format}: deliveries given up after the last retry */
    TWK_M_COUNT
} twk_metric;

typedef struct twk_metrics twk_metrics;

/* NULL when out of memory. */
twk_metrics *twk_metrics_new(void);
void twk_metrics_free(twk_metrics *m);

/* labels: the rendered label list without the tenant, e.g. `route="asample",status="200"` ("" for none;
 * values must be escaped already: twk_metrics_escape). tenant: NULL or "" for service-wide series.
 * Past TWK_METRICS_MAX_SERIES series, new ones are counted under tenant "(other)"; when even that is
 * impossible (out of memory) the update is dropped. */
void twk_metrics_add(twk_metrics *m, twk_metric f, const char *tenant, const char *labels, double v);
void twk_metrics_set(twk_metrics *m, twk_metric f, const char *tenant, const char *labels, double v);
void twk_metrics_observe(twk_metrics *m, twk_metric f, const char *tenant, const char *labels, double v);
/* Removes every series of family f (gauges recomputed at each scrape). */
void twk_metrics_clear(twk_metrics *m, twk_metric f);
#define TWK_METRICS_MAX_SERIES 20000


/* Tokens processed by op ("forward_backward", "forward", "sample"): the counter and the per-minute
 * rate behind TWK_M_TOKENS_RATE. */
void twk_metrics_tokens(twk_metrics *m, const char *tenant, const char *op, double n);

/* The packed-training counters of base model `model` (TWK_M_TRAIN_*) from its pack's totals
 * (twk_pack_get_stats; NULL: zeros, so the series exist before the first pass). */
void twk_metrics_pack(twk_metrics *m, const char *model, const twk_pack_stats *st);

/* Compute jobs: queued (returns the time stamp to pass on, seconds), then done with the time it
 * started on the worker (0: never ran, e.g. cancelled). These keep TWK_M_QUEUE_DEPTH,
 * TWK_M_QUEUE_WAIT, TWK_M_COMPUTE_SECONDS and the worker's progress (twk_metrics_stall). */
double twk_metrics_job_queued(twk_metrics *m, const char *tenant, const char *kind);
void twk_metrics_job_done(twk_metrics *m, const char *tenant, const char *kind, double t_queued, double t_started);
/* Seconds the worker has had jobs in flight without finishing any (0 when idle). */
double twk_metrics_stall(twk_metrics *m);

/* A monotonic clock in seconds (the time stamps above). */
double twk_metrics_now(void);

/* The exposition text (version 0.0.4), NUL-terminated, from twk_host_alloc; with per_tenant the
 * tenant label is shown, else series are summed over tenants. NULL when out of memory. */
char *twk_metrics_render(twk_metrics *m, int per_tenant, size_t *len);

/* Escapes a label value (backslash, quote, newline) into out[cap], cut to fit. */
void twk_metrics_escape(char *out, size_t cap, const char *v);

#endif
