/* server/ — the service's limits in one place: the default of every numeric
 * `twinkle serve` option (twk_serve_config_default sets them, `--help` prints
 * them, server/README.md lists them) and the caps that size fixed arrays
 * (an option's upper bound is its cap, and a static_assert ties each default
 * to its cap). */
#ifndef TWK_SERVER_LIMITS_H
#define TWK_SERVER_LIMITS_H

#include <assert.h>

/* ---- defaults of the options ---- */
#define TWK_SERVE_DEF_PORT 8000
#define TWK_SERVE_DEF_MAX_LORA_RANK 128      /* --max-lora-rank */
#define TWK_SERVE_DEF_MAX_CONTEXT 2048       /* --max-context: tokens per datum and per compute pass */
#define TWK_SERVE_DEF_MAX_DATUMS 4096        /* --max-datums: per request */
#define TWK_SERVE_DEF_MAX_BODY_MB 64         /* --max-body-mb */
#define TWK_SERVE_DEF_SEQ_TIMEOUT_S 120      /* --seq-timeout */
#define TWK_SERVE_DEF_STABILITY_TTL_S 86400  /* --stability-ttl */
#define TWK_SERVE_DEF_STABILITY_RECORDS 65536 /* --stability-records: recorded sequences kept at most */
#define TWK_SERVE_DEF_POLL_TIMEOUT_S 25      /* --poll-timeout */
#define TWK_SERVE_DEF_FWDBWD_CHUNK_LEN 1024  /* --fwdbwd-chunk-len */
#define TWK_SERVE_DEF_EARLY_MB_RUN 256       /* --max-early-mb-run (queue cap per run) */
#define TWK_SERVE_DEF_EARLY_MB_TENANT 1024   /* --max-early-mb-tenant (queue cap per tenant) */
#define TWK_SERVE_DEF_RESULTS_MB_TENANT 256  /* --max-results-mb-tenant */
#define TWK_SERVE_DEF_RESULT_KEEP_S 120      /* --result-keep */
#define TWK_SERVE_DEF_RESULT_TTL_S 3600      /* --result-ttl */
#define TWK_SERVE_DEF_SAMPLE_QUEUE 64        /* --sample-queue: asample requests queued or running (429 past it) */
#define TWK_SERVE_DEF_SAMPLER_SLOTS 8        /* --sampler-slots: adapter slots of a base model's shared sampler (slot 0: the base) */
#define TWK_SERVE_DEF_LIVE_SAMPLERS 4        /* --live-samplers: samplers (each a KV cache) alive at once */
/* scheduling and memory (scheduler.c, spill.c) */
#define TWK_SERVE_DEF_MAX_QUEUE_TENANT 32    /* --max-queue-per-tenant: jobs of a tenant waiting for the worker (429 past it) */
#define TWK_SERVE_DEF_RUN_IDLE_S 600         /* --run-idle-s: a run idle this long is spilled to the data dir */
#define TWK_SERVE_DEF_MAX_LIVE_RUNS 64       /* --max-live-runs: runs resident in memory (least recently used spilled) */
#define TWK_SERVE_DEF_SAMPLER_IDLE_S 600     /* --sampler-idle-s: an unnamed snapshot unused this long is freed */
#define TWK_SERVE_DEF_SAMPLER_HOST_MB 1024   /* --max-sampler-host-mb: host copies of unnamed snapshots, least recently used freed past it */
#define TWK_SERVE_DEF_PACK_RUNS 32           /* --pack-runs: runs' forward / forward_backward ops packed into one pass at most (1: time-shared) */
/* --slot-rank: adapters up to this rank share the base model's sampler; its default is the
 * default LoRA rank, twk_lora_default().rank (train/model.c) */

/* ---- caps (the options' upper bounds; they size arrays) ---- */
#define TWK_SERVE_CAP_SAMPLER_SLOTS 64
#define TWK_SERVE_CAP_LIVE_SAMPLERS 64
#define TWK_SERVE_CAP_PACK_RUNS 256
static_assert(TWK_SERVE_DEF_PACK_RUNS >= 1 && TWK_SERVE_DEF_PACK_RUNS <= TWK_SERVE_CAP_PACK_RUNS, "--pack-runs default within its cap");
static_assert(TWK_SERVE_DEF_SAMPLER_SLOTS >= 2 && TWK_SERVE_DEF_SAMPLER_SLOTS <= TWK_SERVE_CAP_SAMPLER_SLOTS,
              "--sampler-slots default within its cap");
static_assert(TWK_SERVE_DEF_LIVE_SAMPLERS >= 1 && TWK_SERVE_DEF_LIVE_SAMPLERS <= TWK_SERVE_CAP_LIVE_SAMPLERS,
              "--live-samplers default within its cap");

/* ---- fixed limits of a request (not options) ---- */
#define TWK_SERVE_MAX_NUM_SAMPLES 256        /* asample num_samples */
#define TWK_SERVE_SAMPLER_SEQS 16            /* sequences one sampler decodes in a batch */
#define TWK_SERVE_DEF_MAX_TOKENS 128         /* asample max_tokens when absent (or the context left) */
#define TWK_SERVE_MAX_STOP_TOKENS 64
#define TWK_SERVE_MAX_STOP_STRINGS 16
#define TWK_SERVE_MAX_STOP_STRING_LEN 256
#define TWK_SERVE_GONE_RING 4096             /* freed unnamed snapshots remembered for a clear 404 */
#define TWK_SERVE_DEDUPE_RING 512            /* resubmitted seq_ids answered with their original future, per run */

/* ---- the per-step metrics log (steps.c: the dashboard's curves; fixed, not options) ---- */
#define TWK_SERVE_STEP_POINTS 4096           /* rows kept per run and kind (forward_backward, forward, optim_step);
                                                one more thins that series to every second row (twk_store_steps_add) */
#define TWK_SERVE_STEP_FLUSH_MS 1000         /* rows wait at most this long to be written, one transaction per write */
#define TWK_SERVE_STEP_BATCH 1024            /* ... or are written at once when this many wait */
#define TWK_SERVE_DASH_RUNS 200              /* runs (newest first) GET /api/v1/dashboard lists at most */
#define TWK_SERVE_DASH_CKPTS 500             /* checkpoints (newest first) it lists at most */

/* ---- the sessions' timelines (timeline.c, api_trace.c: trace_export; fixed, not options) ---- */
#define TWK_SERVE_TRACE_RECORDS 65536        /* requests kept per session (the newest; older ones are dropped and
                                                counted): a trace of ~10 MiB at most */
#define TWK_SERVE_TRACE_FLUSH_MS 1000        /* records wait at most this long to be written, one transaction */
#define TWK_SERVE_TRACE_BATCH 1024           /* ... or are written at once when this many wait */

#endif
