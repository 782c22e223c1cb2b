/* server/ — the service's shared state: base models, training runs with their
 * ordered op queues, and the handles of the loop. Loop thread only, except
 * where an op's fields are marked "worker". */
#ifndef TWK_SERVER_SVC_H
#define TWK_SERVER_SVC_H

#include <pthread.h>
#include <stdatomic.h>

#include <uv.h>

#include <cJSON.h>

#include "twinkle/chat.h"

#include "auth.h"
#include "futures.h"
#include "http.h"
#include "serve_limits.h"
#include "log.h"
#include "service.h"
#include "stability.h"
#include "store.h"
#include "wire.h"
#include "worker.h"

struct sampler_unit;

typedef struct base_model {
    char name[128];
    char dir[1024];
    twk_model *m;
    twk_pack *pack;              /* batch_train.c: its runs' forward / forward_backward passes (worker) */
    twk_buffer *arena;           /* the activation arena every run's trainer shares (runs execute on one worker) */
    int recompute;               /* runs use per-layer activation recompute */
    int has_tokenizer;
    twk_tokenizer *tok;          /* DIR/tokenizer.json when present (stop strings) */
    struct sampler_unit *shared; /* base-model sampling for every tenant */
    twk_chat_template *chat;     /* api_openai.c: DIR/tokenizer_config.json's chat_template, loaded on first use */
    int chat_tried;
    char chat_err[1400];         /* why chat is NULL */
} base_model;

typedef struct run_state run_state;

/* OP_SKIP fills the seq_id slot of a request that was refused before it was queued
 * (an unknown route): it runs nothing and has no future. */
typedef enum op_kind {
    OP_CREATE, OP_FB, OP_OPTIM, OP_SAVE, OP_SAVE_SAMPLER, OP_SAVE_EXTERNAL, OP_LOAD, OP_UNLOAD, OP_SKIP
} op_kind;

typedef struct op {
    op_kind kind;
    int64_t seq;               /* int64: seq_id 2147483647 is valid and its successor must not wrap */
    char request_id[64];
    run_state *run;
    struct svc *svc;
    size_t body_bytes;         /* the request body's size (held while the op waits ahead of its seq order) */
    /* inputs */
    twk_wire_fb_request *fb;   /* OP_FB */
    twk_loss_spec loss;        /* OP_FB: the loss (registry entry and config), set by validation */
    twk_adam_params adam;      /* OP_OPTIM */
    char name[128];            /* OP_SAVE*: checkpoint name */
    int overwrite;
    double ttl_seconds;
    char dir[1024];            /* OP_SAVE*: final folder; OP_LOAD: folder to read */
    int load_optimizer;
    char prefail[512];         /* validation error: fail in order without running */
    int prefail_server;        /* prefail is the server's (out of memory), category "server" */
    char user_metadata_json[2048]; /* OP_SAVE*: stored with the checkpoint */
    struct sampler_session *snapshot; /* OP_SAVE_SAMPLER without a name: the session to fill */
    /* results (worker) */
    twk_status st;
    int user_error;            /* category "user" rather than "server" */
    char err[768];
    unsigned char *out;
    size_t out_len;
    int out_proto;
    int64_t size_bytes;
    double t_queued, t_started; /* metrics: when it was submitted to the worker, and started there (worker) */
    double loss_value;         /* OP_FB: the loss:sum metric (worker), for the non-finite-loss alert */
    twk_loss_result fb_res;    /* OP_FB (worker): the loss's metrics, for the per-step log (steps.c) */
    int64_t trainer_step;      /* OP_FB / OP_OPTIM (worker): optimizer steps taken (after an optim_step) */
    float grad_norm;           /* OP_OPTIM (worker) */
    twk_job job;
    struct op *next;
} op;

/* A sampling session: base model, or base + adapter (from a checkpoint folder,
 * or a snapshot of a training run's adapter). Its sampler (KV caches) is
 * created and used on the worker. */
struct sample_job;

/* A sampler and the requests waiting for it. Requests that wait together are
 * decoded in one batch (several tenants on the base model share one unit). */
typedef struct sampler_unit {
    base_model *base;
    int has_lora;
    twk_lora_config lora;
    char adapter_dir[1024];   /* "" for a snapshot or the base model */
    twk_sampler *sampler;     /* created and used on the worker */
    void *adapter_copy;       /* worker: a snapshot's adapter, kept while its sampler is dropped */
    size_t adapter_copy_bytes;
    unsigned long long last_use; /* worker: for dropping the least recently used sampler */
    _Atomic int evicted;      /* 1 while its sampler is dropped off the device (the worker writes, /metrics reads) */
    pthread_mutex_t mu;       /* guards pending: the loop adds, the worker takes */
    struct sample_job *pending;
    /* a base model's shared unit: a sampler with adapter slots, so requests of
     * the base model and of different adapters decode in one batch */
    int n_slots;
    struct sampler_session *slot_owner[TWK_SERVE_CAP_SAMPLER_SLOTS]; /* worker: whose adapter each slot holds (slot 0: the base) */
    unsigned long long slot_use[TWK_SERVE_CAP_SAMPLER_SLOTS];
} sampler_unit;

/* An adapter kept on the host (a snapshot of a run's adapter). */
typedef struct host_adapter {
    int n;
    char (*names)[224];
    float **data;
    int64_t *nelem;
} host_adapter;

typedef struct sampler_session {
    char id[160];
    char tenant[64];
    base_model *base;
    char model_path[600];
    sampler_unit *unit;       /* owned, or the base model's shared one */
    int owns_unit;
    /* in a shared (slotted) unit: where this session's adapter comes from */
    int has_adapter;
    int rank;
    float alpha;
    char adapter_dir[1024];   /* a checkpoint folder, or "" */
    host_adapter *copy;       /* worker-written snapshot copy, or NULL */
    int n_clients;            /* join_sampling_session: clients allocated so far (the original is 0) */
    /* an unnamed snapshot (save_weights_and_get_sampling_client) is freed by spill.c when its
     * training session finishes, when unused --sampler-idle-s, or past --max-sampler-host-mb */
    int snapshot;
    int doomed;               /* to be freed once inflight reaches 0 */
    int inflight;             /* requests (and the save op filling it) that still point at it */
    double last_used;         /* wall time of its last request */
    size_t host_bytes;        /* its host copy's size, once captured */
    struct session_events *events; /* retrieve_futures: finished requests not yet acknowledged */
    struct sampler_session *next;
} sampler_session;


typedef struct seq_ring seq_ring;

struct run_state {
    char id[128];
    char tenant[64];
    char session_id[96];
    base_model *base;
    twk_lora_config lora;
    twk_trainer *trainer;      /* created and used on the worker */
    int lost;                  /* known from the store, but its live state did not survive a restart */
    int unloaded;
    char create_request[64];
    char load_request[64];     /* created by load_weights (create_training_client_from_state) */
    int64_t next_seq;
    op *pending;               /* arrived ahead of next_seq, sorted by seq */
    size_t early_bytes;        /* held by pending: body bytes + sizeof(op) each (--max-early-mb-run) */
    int running;               /* ops handed to the worker and not done yet (the dashboard's queue) */
    double gap_since;          /* loop time when ops started waiting on a gap */
    double last_touch;         /* wall time of the last last_request update in the store */
    struct seq_ring *ring;     /* seq_id -> request id of its future (seq_ring.c); NULL before the first op */
    /* residency (spill.c): loop view */
    int resident;              /* its trainer is (or will be, once queued ops run) in memory */
    int inflight;              /* ops on the worker */
    double last_used;          /* wall time of its last op */
    /* a run restored from its spill after a restart (spill.c) */
    int restored;              /* until an op arrives in order: ops after its spill may have been lost */
    int64_t restored_step;     /* the optimizer step of the spilled state */
    int diverged;              /* ops after the spill were lost: every op fails with lost_msg */
    char lost_msg[600];
    /* worker */
    int on_disk;               /* the trainer was freed after spilling; restored before its next op */
    run_state *next;
};

typedef struct svc {
    twk_serve_config cfg;
    uv_loop_t *loop;
    twk_http_server *http;
    twk_worker *worker;
    twk_futures *futures;
    twk_store *store;
    twk_stab *stab;            /* sequences sampled with record_stability_info (stable_reinforce) */
    twk_auth *auth;
    twk_device *dev;
    base_model models[TWK_MAX_BASE_MODELS];
    int n_models;
    run_state *runs;
    sampler_session *samplers;
    int sample_inflight;
    struct sampler_unit *live_units[TWK_SERVE_CAP_LIVE_SAMPLERS]; /* worker: units holding a sampler (KV cache) now; at most --live-samplers */
    int n_live_units;
    unsigned long long use_clock;      /* asample jobs queued or running (429 past the limit) */
    uv_timer_t gap_timer;
    uv_timer_t sweep_timer;    /* expired checkpoints (sweeper.c) */
    uv_signal_t sigint, sigterm;
    unsigned long long id_counter;
    int stopping;
    unsigned char url_key[32];  /* HMAC key of signed download URLs (DATA_DIR/url_signing.key) */
    struct twk_metrics *metrics; /* svc_metrics.c: GET /metrics */
    struct twk_alerts *alerts;   /* alerts.c: webhooks */
    struct svc_steps *steps;    /* steps.c: per-step metrics waiting to be stored */
    struct svc_timeline *timeline; /* timeline.c: settled requests waiting to be stored (trace_export) */
    /* spill.c */
    uv_timer_t spill_timer;    /* idle runs and idle snapshots */
    int n_resident;            /* runs with resident set */
    unsigned long long runs_spilled; /* spills written since start (a counter for /metrics) */
    unsigned long long snapshots_freed;
    uint64_t gone_hash[TWK_SERVE_GONE_RING]; /* freed unnamed snapshots (tenant + id hashed), for a clear 404 */
    unsigned char gone_why[TWK_SERVE_GONE_RING];
    int gone_next;
} svc;

/* ---- lookups.c ---- */
base_model *svc_find_model(svc *s, const char *name);
/* A run of `tenant` by id: live, or restored from the store as lost; NULL if absent. */
run_state *svc_find_run(svc *s, const char *tenant, const char *id);
/* A new live run (registered in the service), NULL without memory. */
run_state *svc_run_new(svc *s, const char *id, const char *tenant);
/* 1 if the tenant's session exists; else answers 404 (unknown) or 5xx (the store failed) and returns 0. */
int svc_session_exists(svc *s, twk_http_conn *c, const char *tenant, const char *session_id);
/* tinker://<run>/<kind>/<name> → parts; 0 if malformed. */
int svc_parse_tinker_path(const char *path, char *run, size_t run_len, char *kind, size_t kind_len, char *name,
                          size_t name_len);
/* The checkpoint a tinker:// path (request field `field`) names among tenant's, and its run's
 * record (the tenant's own, or another tenant's published one); kind gets "weights",
 * "sampler_weights" or "external_weights". 0 otherwise, with *status 400 (malformed)
 * or 404 (unknown) and a message in err. After a success the caller clears *src. */
int svc_find_checkpoint(svc *s, const char *tenant, const char *field, const char *path, twk_store_ckpt *ck,
                        twk_store_run *src, char *kind, size_t kind_len, int *status, char *err, size_t err_len);
/* The LoRA shape of a run record (every run is created with alpha 32). */
twk_lora_config svc_run_lora(const twk_store_run *src);
/* The checkpoint kind a save op writes ("weights", "sampler_weights", "external_weights"),
 * and the `type` its result carries. */
const char *svc_save_kind(op_kind k);
const char *svc_save_type(op_kind k);
/* The checkpoint_type of a stored checkpoint id ("weights/…", "sampler_weights/…", "external_weights/…"):
 * "training", "sampler" or "external". */
const char *svc_ckpt_type(const char *checkpoint_id);
/* DATA_DIR/checkpoints/<run>/<kind>/<name> */
void svc_ckpt_dir(const svc *s, const char *run, const char *kind, const char *name, char *out, size_t len);

/* ---- runs.c ---- */
/* Starts create_model; writes the future's id. Returns 0, or an HTTP status
 * with a message in err (400/404). */
int svc_create_run(svc *s, const char *tenant, const char *session_id, int model_seq_id, const char *base,
                   const twk_lora_config *lora, const char *user_metadata_json, char *request_id, char *model_id,
                   char *err, size_t err_len);
/* Queues an op in seq order (dedupe on seq: *request_id gets the original
 * id). Takes ownership of o. Returns 0, or 429 with a message naming the
 * limit in err (o freed, nothing queued) when holding o ahead of the run's
 * seq order would pass --max-early-mb-run or the tenant's --max-early-mb-tenant. */
int svc_submit_op(svc *s, run_state *r, op *o, char *request_id, char *err, size_t err_len);
/* A request of run r with this seq_id was refused before it was queued: the
 * slot is filled with a no-op so the run's later ops do not wait for it.
 * Nothing happens when the seq_id was already taken or is behind the run. */
void svc_skip_seq(svc *s, run_state *r, int64_t seq);
/* Runs an op outside the seq order (after what is already dispatched). 0, or 503 out of memory
 * (o freed). */
int svc_dispatch_now(svc *s, run_state *r, op *o, char *request_id);
op *svc_op_new(svc *s, run_state *r, op_kind kind, int64_t seq);
void svc_op_free(op *o);
/* Starts op o on the worker (status and error cleared); 0 when it failed
 * already (its run's trainer is not loaded). */
int svc_op_start(op *o);
/* Fails op o (worker): the message, category user (1) or server (0). */
void svc_op_fail(op *o, int user, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- batch_train.c: forward / forward_backward, packed ---- */
/* Runs n forward / forward_backward ops of distinct runs on one base model
 * (worker) as packed passes of the model's pack (twk_loss_steps); each op
 * gets its result or its error (its future is settled by op_done). */
void svc_run_fb(op **ops, int n);
/* The worker's run_batch for packed OP_FB jobs: svc_run_fb over their ops. */
void svc_run_fb_jobs(twk_job **jobs, int n);
/* The pass counter of a base model's pack (zeros before its first pass); worker-written. */
void svc_pack_stats(const base_model *bm, twk_pack_stats *out);
/* bm's pack as cfg sizes it (capacity max(pack_tokens, max_context), pack_runs slots), made at its
 * first use — on rank 0's worker, and on a multi-rank service's other ranks. NULL with the error set. */
twk_pack *svc_base_pack(const twk_serve_config *cfg, base_model *bm);
/* Fails ops stuck behind a missing seq_id longer than the configured timeout. */
void svc_check_gaps(svc *s);
void svc_free_runs(svc *s);
/* Removes a folder tree (checkpoint folders); errors are ignored. */
void svc_rm_tree(const char *dir);
/* A unique id with a prefix ("sess", ...). */
void svc_new_id(svc *s, const char *prefix, char *out, size_t len);

/* The route that queues an op of kind k ("forward_backward" also for forward). */
const char *svc_op_route(op_kind k);

/* ---- fault.c ---- */
/* Fault injection for tests: 1 when the environment's TWK_FAULT (a comma-separated list of
 * ACTION:ROUTE[:ARG], e.g. "fail:optim_step,sleep:forward_backward:2") lists action for route, with
 * ARG (0 when absent) in *arg; 0 otherwise (inert unless set). */
int svc_fault(const char *action, const char *route, double *arg);

/* ---- ckpt_fs.c ---- */
/* Fault injection: _exit(86)s when the environment's TWK_CRASH_AT is "<mode>:<step>" (mode "save" or
 * "overwrite"); inert otherwise. */
void svc_crash_point(const char *mode, const char *step);
/* Publishes the written folder tmp as dir (existed: dir holds the checkpoint it replaces; old: the
 * name to park it under where RENAME_EXCHANGE is unavailable): fsyncs, swaps, fsyncs the folders
 * above, removes the replaced one. -1 with a message in err; a crash at any point leaves dir
 * holding the old or the new checkpoint, or (a first save) absent, plus leftovers svc_ckpt_recover handles. */
int svc_ckpt_publish(const char *tmp, const char *dir, const char *old, int existed, char *err, size_t err_len);
/* Start-up recovery of one folder of published folders that have no store rows (DATA_DIR/spill):
 * .old-* put back where their folder is missing, .tmp-* removed. */
void svc_ckpt_recover_folder(svc *s, const char *dir);
/* The same with TWK_CRASH_AT's mode named (spill.c publishes as "spill"). */
int svc_ckpt_publish_mode(const char *mode, const char *tmp, const char *dir, const char *old, int existed, char *err,
                          size_t err_len);
/* Start-up: puts back a replaced checkpoint whose replacement never arrived (.old-*), removes
 * interrupted saves (.tmp-*), replaced copies and folders published but never recorded in the
 * store; logs one line for each. */
void svc_ckpt_recover(svc *s);
/* Deletes a checkpoint: its store row (the commit point), then its folder, renamed aside at once as a
 * .tmp-* leftover (which start-up recovery removes after a crash) and removed on the worker.
 * -1 with a message in err when the row could not be deleted (nothing changed). */
int svc_ckpt_remove(svc *s, const twk_store_ckpt *ck, char *err, size_t err_len);

/* ---- spill.c: bounded memory and live state across restarts ---- */
/* Starts the idle timer (runs past --run-idle-s, snapshots past --sampler-idle-s) after putting
 * back or removing what a crash left in DATA_DIR/spill. */
void svc_spill_start(svc *s);
/* Shutdown: queues a spill of every resident run (before the worker stops) and stops the timer. */
void svc_spill_stop(svc *s);
/* An op of r is about to go to the worker: r becomes resident (least recently used runs are
 * spilled past --max-live-runs) and in flight. */
void svc_run_dispatched(svc *s, run_state *r);
/* An op of r finished (loop). */
void svc_run_op_done(svc *s, run_state *r);
/* Queues a spill of r (its state written to DATA_DIR/spill/<run>, the trainer freed; its seq_id
 * ring packed); nothing when r is not resident. */
void svc_spill_run(svc *s, run_state *r);
/* seq_ring.c: remembers that seq_id seq of r got the future request_id (a `req-` id of
 * futures.c); -1 when out of memory or the id is not of that form (nothing remembered). */
int svc_ring_put(run_state *r, int64_t seq, const char *request_id);
/* 1 with the request id (37 bytes written when request_id is not NULL) seq_id seq of r got, 0 when not remembered. */
int svc_ring_get(const run_state *r, int64_t seq, char *request_id);
/* Shrinks r's ring to its used entries (a spilled run); kept as it is when out of memory. */
void svc_ring_pack(run_state *r);
/* Frees r's ring. */
void svc_ring_free(run_state *r);
/* Worker: the trainer of a spilled run read back; else an error naming the folder. */
twk_status svc_restore_run(svc *s, run_state *r);
/* Worker: removes r's spill folder (unload). */
void svc_spill_remove(svc *s, const run_state *r);
/* A run known from the store after a restart: 1 when it has a spill (r continues from it, its
 * next seq_id and step set), else 0 (lost). */
int svc_spill_adopt(svc *s, run_state *r, const twk_store_run *sr);
/* The tenant's session `session_id` finished: its unnamed snapshots are freed and its runs spilled. */
void svc_session_finished(svc *s, const char *tenant, const char *session_id);
/* A request of ss starts / ends (loop). */
void svc_snapshot_use(svc *s, sampler_session *ss);
void svc_snapshot_release(svc *s, sampler_session *ss);
/* An unnamed snapshot's host copy was captured (bytes): the --max-sampler-host-mb cap is applied. */
void svc_snapshot_captured(svc *s, sampler_session *ss, size_t bytes);
/* Why tenant's sampling session `id` is gone (a freed unnamed snapshot), or NULL. */
const char *svc_sampler_gone(const svc *s, const char *tenant, const char *id);
/* 429 text when tenant has --max-queue-per-tenant jobs waiting for the worker: 1 with err set. */
int svc_queue_full(svc *s, const char *tenant, char *err, size_t err_len);
/* Worker, sampling.c: frees a snapshot session's worker-side state (slots pointing at it, its
 * own unit, its host copy). */
void svc_snapshot_drop_worker(svc *s, sampler_session *ss);
/* Loop, sampling.c: takes ss out of the session list (lookups no longer find it). */
void svc_sampler_unlink(svc *s, sampler_session *ss);
/* Loop, sampling.c: frees an unlinked session (its retrieve_futures events answered). */
void svc_sampler_free(sampler_session *ss);

/* ---- sweeper.c ---- */
/* Starts the timer that deletes expired checkpoints every --checkpoint-sweep seconds. */
void svc_sweeper_start(svc *s);
void svc_sweeper_stop(svc *s);
/* Deletes every checkpoint whose expires_at has passed; returns how many. */
int svc_sweep_expired(svc *s);

/* ---- sampling.c ---- */
sampler_session *svc_find_sampler(svc *s, const char *tenant, const char *id);
/* A session for the snapshot of a run's adapter (unnamed save_weights_for_sampler). */
sampler_session *svc_new_snapshot_session(svc *s, run_state *r, const char *id);
/* Worker: keeps a host copy of `from`'s adapter for a snapshot session on a
 * shared (slotted) unit; TWK_ERR_STATE when the session has its own sampler. */
twk_status svc_snapshot_capture(sampler_session *ss, twk_trainer *from);
/* Worker: makes (if needed) the unit's sampler; copies `from`'s adapter into it when given. */
twk_status svc_sampler_ready(svc *s, sampler_unit *u, twk_trainer *from);
void svc_free_samplers(svc *s);
/* The sampling session `id` of tenant, made when absent: the base model `base` when path is NULL,
 * else the checkpoint `path` (tinker://; its base must be `base` when both are given). NULL with
 * *status (400 / 404 / 503) and a message naming base_field / path_field in err. */
sampler_session *svc_session_for(svc *s, const char *tenant, const char *id, const char *base, const char *path,
                                 const char *base_field, const char *path_field, int *status, char *err, size_t err_len);
/* A finished svc_generate request (loop thread). seqs: n sequences; with top_k > 0, top_ids[i] /
 * top_lps[i] hold top_k entries per generated token of sequence i (most likely first). On failure
 * ok is 0 and err says why (user_error: the request's fault). Freed after the callback returns. */
typedef struct svc_gen_result {
    int ok, user_error;
    const char *err;
    twk_sampled_seq *seqs;
    int n, top_k;
    int32_t **top_ids;
    float **top_lps;
} svc_gen_result;
typedef void (*svc_gen_fn)(void *ctx, const svc_gen_result *r);
/* Queues num_samples continuations of prompt (taken: from the host allocator, freed by the server) on
 * ss's unit, decoded in the shared batches with Tinker's asample; p's stop arrays must live until
 * done(ctx, ...) runs on the loop thread. Returns 0, or 429 (queue full) / 503 with a message in err
 * (done is then never called). */
/* step (may be NULL): called on the loop thread while it decodes, with sequence i's tokens so far
 * (n of them; several passes may arrive at once, never after done). */
typedef void (*svc_gen_step_fn)(void *ctx, int i, const int32_t *tokens, int64_t n);
int svc_generate(svc *s, sampler_session *ss, int32_t *prompt, int64_t n_prompt, int num_samples,
                 const twk_sample_params *p, int top_k, svc_gen_fn done, svc_gen_step_fn step, void *ctx, char *err,
                 size_t err_len);

/* ---- gen_progress.c: a generation's tokens from the worker to the loop while it decodes ---- */
typedef struct svc_gen_progress svc_gen_progress;
/* Loop: a buffer for n sequences of up to max_tokens each; NULL when out of memory. */
svc_gen_progress *svc_gen_progress_new(uv_loop_t *loop, int n, int64_t max_tokens, svc_gen_step_fn step, void *ctx);
/* Worker (twk_sample_request.on_step): copies the new tokens and wakes the loop. */
void svc_gen_progress_step(void *progress, const twk_sampled_seq *out, int num_samples);
/* Loop, after the worker is done with it: no more steps; freed once libuv closed its handle. */
void svc_gen_progress_close(svc_gen_progress *g);
void api_sampling(svc *s, twk_http_conn *c, const twk_http_req *req, const char *tenant, const char *route, cJSON *body);

/* ---- api_weights.c ---- */
/* GET .../checkpoints/external_weights/<name>/external_weights_urls: one signed URL per file. */
void api_weights_urls(svc *s, twk_http_conn *c, const twk_http_req *req, const twk_store_ckpt *ck);
/* GET /api/v1/external_weights/<run>/<name>/<file>?expires=&sig=: no API key; 403 on a bad
 * signature, 410 past expiry, 404 when the file is gone. Returns 0 when the path is not this route. */
int api_weights_download(svc *s, twk_http_conn *c, const twk_http_req *req);
/* The signature (lowercase hex HMAC-SHA256 under DATA_DIR/url_signing.key) of a download URL for
 * `what` (a text naming the file: "<run>/<name>/<file>", "trace/<session>") until `expires`. */
void svc_url_sign(const svc *s, const char *what, long long expires, char sig[65]);
/* Checks a download request's expires= and sig= against `what`: 1 when valid; else answers 403 (a
 * signature that does not match) or 410 (expired; `renew` says what to ask for instead) and returns 0. */
int svc_url_check(svc *s, twk_http_conn *c, const twk_http_req *req, const char *what, const char *renew);
/* "http(s)://host:port" as the client reached this server (its Host header), else the listen address. */
void svc_base_url(const svc *s, const twk_http_req *req, char *out, size_t len);
/* Answers 200 with the bytes of the file at path, read on libuv's thread pool (the loop never
 * blocks on the disk), or 404 with `missing` when it cannot be read; 503 when out of memory. */
void svc_send_file(svc *s, twk_http_conn *c, const char *path, const char *missing);
/* POST copy_weights: the checkpoint copied (hard links) into a new run of the caller. */
void api_copy_weights(svc *s, twk_http_conn *c, const twk_http_req *req, const cJSON *b, const char *tenant);

/* ---- session_futures.c: retrieve_futures, the batched poll of a sampling session ---- */
/* A request of ss's client `clone` (its seq_id / 1e9) finished (failed: 1) with a result of
 * `size` bytes: recorded for retrieve_futures, and parked polls of that client are answered. */
void svc_session_event(svc *s, sampler_session *ss, int64_t clone, const char *request_id, int failed, size_t size);
/* POST retrieve_futures. */
void api_retrieve_futures(svc *s, twk_http_conn *c, const cJSON *b, const char *tenant);
/* Frees ss's events and answers its parked polls (shutdown, or the session going away). */
void svc_session_events_free(sampler_session *ss);

/* ---- api_sessions.c: cancel_future, join_sampling_session, sessions/search, auth/token, trace_export ---- */
/* Routes those; 0 if route is none of them (nothing answered). */
int api_sessions(svc *s, twk_http_conn *c, const twk_http_req *req, const char *tenant, const char *route);
/* cancel_future's dropping of queued work: a sampling request still waiting for its sampler is
 * taken out of the queue (1), else 0. Its future must already be finished (cancelled). */
int svc_sample_cancel(svc *s, const char *request_id);
/* A training op of tenant still held in its run's seq order becomes a no-op that fails "cancelled"
 * in its turn (1), else 0 (dispatched ops run, and their result is discarded). */
int svc_op_cancel(svc *s, const char *tenant, const char *request_id);

/* ---- svc_metrics.c: GET /metrics, and the hooks that feed the metrics and the alerts ---- */
/* Starts the metrics and the alerts (the unclean-shutdown check); an error status (the reason set)
 * when out of memory or when webhooks are configured and libcurl cannot be loaded. */
twk_status svc_metrics_open(svc *s);
/* Hooks them to the HTTP server and the futures (once both run). */
void svc_metrics_attach(svc *s);
/* Stops the alert thread (a clean shutdown: the marker goes) and frees the metrics. */
void svc_metrics_close(svc *s);
/* GET /metrics (--metrics-auth decides who may read it; an admin key sees tenant labels). */
void api_metrics(svc *s, twk_http_conn *c, const twk_http_req *req);
/* A training op was submitted to the worker (its tenant's queue depth). */
void svc_metrics_op_queued(svc *s, op *o);
/* A training op finished (loop thread): queue, tokens, and the alerts for a server error or a loss
 * that is not finite. */
void svc_metrics_op_done(svc *s, const op *o);
/* Worker, after a packed pass of bm's runs: its pack's pass counters into the metrics. */
void svc_metrics_pack(svc *s, const base_model *bm);
/* A route for metric labels: the path below /api/v1/ (or /v1/...) with every segment that is not
 * a word of the API replaced by {id}; "other" for unknown routes, "none" for none. */
void svc_metrics_route(const char *route, char *out, size_t len);
/* ---- steps.c: the per-step metrics log (the dashboard's curves) ---- */
/* Starts the timer that writes collected rows to the store; -1 without memory. */
int svc_steps_start(svc *s);
/* Writes what is collected, stops the timer (the loop frees it). */
void svc_steps_stop(svc *s);
/* A finished op (loop thread): a successful forward_backward, forward or optim_step becomes a row. */
void svc_steps_note(svc *s, const op *o);
/* Writes the collected rows now (one transaction); a store failure is logged, the rows dropped. */
void svc_steps_flush(svc *s);

/* ---- timeline.c: the sessions' timelines (trace_export) ---- */
/* Starts collecting settled futures that belong to a session (the futures' settle observer) and the
 * timer that writes them to the store; -1 without memory (nothing is recorded then). */
int svc_timeline_start(svc *s);
/* Writes what is collected and stops (before the futures are freed). */
void svc_timeline_stop(svc *s);
/* Writes the collected records now (one transaction); a store failure is logged, the records lost. */
void svc_timeline_flush(svc *s);

/* ---- pftrace.c / api_trace.c: sessions/{id}/trace_export and its signed download ---- */
/* GET sessions/{id}/trace_export: the session's timeline as a Perfetto trace under DATA_DIR/traces,
 * answered "ready" with a signed URL (built now; rebuilt only when the session has new records). */
void api_trace_export(svc *s, twk_http_conn *c, const twk_http_req *req, const char *tenant, const char *session_id);
/* GET /api/v1/session_traces/<session>.pftrace?expires=&sig=: no API key; 403 on a bad signature,
 * 410 past expiry, 404 when the trace is gone. Returns 0 when the path is not this route. */
int api_trace_download(svc *s, twk_http_conn *c, const twk_http_req *req);

/* ---- api_dashboard.c: the runs dashboard ---- */
/* GET / and /dashboard/<file>: the page embedded at build time (no key needed). 0 if the path is not
 * one of them (nothing answered). */
int api_dashboard_static(twk_http_conn *c, const twk_http_req *req);
/* GET dashboard, dashboard/steps (under /api/v1/, key checked): 0 if route is neither. */
int api_dashboard(svc *s, twk_http_conn *c, const twk_http_req *req, const char *tenant, const char *key,
                  const char *route);

/* ---- api.c ---- */

void svc_handle(twk_http_conn *c, const twk_http_req *req, void *user);

/* ---- api_openai.c ---- */
/* The OpenAI-compatible routes under /v1/ (models, completions, chat/completions). */
void api_openai(svc *s, twk_http_conn *c, const twk_http_req *req);

#endif
