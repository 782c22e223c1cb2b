/* server/ — internals of `twinkle serve` shared by its parts. The loop
 * thread (libuv) parses, authenticates, validates and answers; one compute
 * worker thread runs the engine; futures connect the two. */
#ifndef TWK_SERVER_SERVICE_H
#define TWK_SERVER_SERVICE_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "alerts.h"
#include "http.h"
#include "store.h"
#include "twinkle/twinkle.h"

#define TWK_MAX_BASE_MODELS 16

typedef struct twk_serve_model_spec {
    char dir[1024];
    char name[128];
} twk_serve_model_spec;

enum { TWK_METRICS_KEY = 0, TWK_METRICS_OPEN, TWK_METRICS_ADMIN };

typedef struct twk_serve_config {
    char host[64];
    int port;
    char data_dir[512];
    char keys_file[1024];     /* "" = open mode: any tml- key, one tenant per key */
    char device[32];
    int dtype, kv_dtype;      /* base weights and KV caches: a twk_dtype, -1 = the checkpoint's / the weights' */
    twk_serve_model_spec models[TWK_MAX_BASE_MODELS];
    int n_models;             /* 0 = the built-in default model */
    int max_lora_rank;        /* default 128 */
    int64_t max_context;      /* tokens per datum and per compute pass; default 2048 */
    int64_t max_datums;       /* per request; default 4096 */
    size_t max_body_bytes;    /* default 64 MiB */
    double seq_timeout_s;     /* a missing seq_id fails its successors after this; default 120 */
    double stability_ttl_s;   /* stable_reinforce: a recorded sequence is usable this long after its last use; default 86400 */
    double poll_timeout_s;    /* long-poll hold; default 25 */
    double url_ttl_s;         /* signed download URLs (external_weights_urls) expire after this; default 3600 */
    int fwdbwd_chunk_len;     /* datums per forward_backward request the SDK may send; default 1024 */
    /* buffering limits */
    size_t max_early_bytes_run;    /* ops held ahead of a run's seq order: request bytes + overhead; 429 past it; default 256 MiB */
    size_t max_early_bytes_tenant; /* the same over all runs of a tenant; default 1 GiB */
    size_t max_result_bytes_tenant; /* finished, unretrieved future results per tenant; oldest dropped past it; default 256 MiB */
    double result_keep_s;     /* a retrieved result stays this long for re-polls; default 120 */
    double result_ttl_s;      /* an unretrieved result stays this long; default 3600 */
    double ckpt_sweep_s;      /* expired checkpoints are deleted every this many seconds; default 60 */
    /* metrics and alerts (svc_metrics.c, alerts.c) */
    int metrics_auth;         /* GET /metrics: TWK_METRICS_OPEN, _KEY (default) or _ADMIN (--metrics-auth) */
    twk_alert_config alerts;  /* --alert-webhook and the other --alert-* options */
    /* connection limits (server/http.h): idle unauthenticated connections are
     * closed first to make room, and time out after header_timeout_s */
    int max_connections;          /* in total; default 4096 */
    int max_connections_per_addr; /* per client IP address; default 512 */
    double header_timeout_s;      /* a request's headers, and an unauthenticated idle connection; default 10 */
    double idle_timeout_s;        /* an authenticated keep-alive connection idle; default 75 */
    double read_timeout_s;        /* a whole request from its first byte; default 30 */
    /* sampling limits (defaults in serve_limits.h) */
    int sample_queue;         /* asample requests queued or running; 429 past it */
    int sampler_slots;        /* adapter slots of a base model's shared sampler, slot 0 the base; <= TWK_SERVE_CAP_SAMPLER_SLOTS */
    int slot_rank;            /* adapters up to this rank use a slot; larger ones get their own sampler */
    int live_samplers;        /* samplers (each a KV cache) alive at once; <= TWK_SERVE_CAP_LIVE_SAMPLERS */
    /* packed training (batch_train.c) */
    int pack_runs;            /* runs' forward / forward_backward ops in one pass at most; 1 = time-shared */
    int64_t pack_tokens;      /* tokens of one packed pass; 0 (default) = max_context; at least max_context */
    int stability_records;    /* stable_reinforce: recorded sequences kept at most (least recently used go first) */
    /* scheduling and memory (defaults in serve_limits.h) */
    int max_queue_tenant;     /* jobs of one tenant waiting for the worker; 429 past it */
    double run_idle_s;        /* a run idle this long is spilled to DATA_DIR/spill */
    int max_live_runs;        /* runs resident in memory; the least recently used are spilled */
    double sampler_idle_s;    /* an unnamed sampler snapshot unused this long is freed */
    size_t max_sampler_host_bytes; /* host copies of unnamed snapshots; the least recently used freed past it */
    int quiet;
    int recompute;            /* --recompute: per-layer activation recompute in every run (else chosen when only it fits) */
    int jwt_auth;             /* --jwt-auth: client/config turns on the SDK's JWT exchange (auth/token, whoami) */
    int log_json;             /* --log-format json: one JSON object per line, every request */
} twk_serve_config;

/* Defaults as documented above (port 8000, data dir ./twinkle-data; the numbers from serve_limits.h). */
void twk_serve_config_default(twk_serve_config *c);
/* Reads `key = value` lines (keys as the long options without "--"; model
 * may repeat). Errors name the file, line and key. */
twk_status twk_serve_config_file(twk_serve_config *c, const char *path);
/* Parses one option (`--port`, `--model DIR[=NAME]`, ...); *used = values
 * consumed. TWK_ERR_INVALID_ARG names the option. */
twk_status twk_serve_config_arg(twk_serve_config *c, const char *opt, const char *val, int *used);

/* Runs the service until SIGINT/SIGTERM; returns the exit code. */
int twk_serve_run(const twk_serve_config *cfg);

/* The service on a thread of this process (tests drive it over HTTP): starts it and returns once
 * it listens (cfg->port 0: any free port, see twk_serve_port). TWK_ERR_IO when it does not start
 * (the reason on stderr). twk_serve_stop shuts it down as SIGTERM would, joins and frees. */
typedef struct twk_serve twk_serve;
twk_status twk_serve_start(const twk_serve_config *cfg, twk_serve **out);
int twk_serve_port(const twk_serve *h);
/* Packed training's pass counter summed over the base models (train/'s
 * twk_pack_stats: passes, runs in them, passes shared by several runs, the
 * most runs in one). Written by the worker: read it when no op is running. */
void twk_serve_pack_stats(const twk_serve *h, twk_pack_stats *out);
void twk_serve_stop(twk_serve *h);

/* The built-in default model: a small Qwen3-architecture model generated
 * deterministically (random weights, vocab 512) into DATA_DIR/models/tiny
 * on first use. *dir receives its folder. */
twk_status twk_serve_default_model(const char *data_dir, char *dir, size_t dir_len);
/* The folder of checkpoint tinker://<run>/<kind>/<name> under data_dir (it may not exist);
 * TWK_ERR_INVALID_ARG naming the path when it is malformed. */
twk_status twk_serve_checkpoint_dir(const char *data_dir, const char *tinker_path, char *dir, size_t len);
#define TWK_DEFAULT_MODEL_NAME "twinkle/tiny-qwen3"

#endif
