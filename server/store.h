/* server/ — the SQLite store in the data directory: sessions, training runs
 * (with their user_metadata) and checkpoints, each owned by a tenant. Lookups
 * take the tenant and treat another tenant's rows as absent
 * (TWK_ERR_NOT_FOUND), so isolation is enforced here, once. Used from the
 * loop thread only. */
#ifndef TWK_SERVER_STORE_H
#define TWK_SERVER_STORE_H

#include <stdint.h>

#include "twinkle/status.h"

typedef struct twk_store twk_store;

/* Opens (creating if needed) DATA_DIR/twinkle.db with WAL journaling and the
 * schema; TWK_ERR_IO names the file on failure. */
twk_status twk_store_open(const char *data_dir, twk_store **out);
void twk_store_close(twk_store *s);

typedef struct twk_store_session {
    char id[96];
    char tenant[64];
    char *tags_json;          /* owned; JSON array text */
    char *user_metadata_json; /* owned; JSON object text */
    char sdk_version[32];
    double created, last_heartbeat; /* unix seconds */
    int finished;
} twk_store_session;

typedef struct twk_store_run {
    char id[128];
    char tenant[64];
    char session_id[96];
    char base_model[128];
    int is_lora, lora_rank, train_attn, train_mlp, train_unembed;
    int64_t seed;
    char *user_metadata_json; /* owned; "{}" when none */
    double created, last_request;
} twk_store_run;

typedef struct twk_store_ckpt {
    char run_id[128];
    char checkpoint_id[200]; /* "weights/<name>" or "sampler_weights/<name>" */
    char tenant[64];
    char path[1024];         /* folder on disk */
    int64_t size_bytes;
    double created;
    double expires_at;       /* 0 = never */
    int is_public;
    char user_metadata_json[2048]; /* JSON object text; "" or "{}" when none */
} twk_store_ckpt;

/* Creates refuse (TWK_ERR_INVALID_ARG, nothing stored) a fixed-size field
 * with no NUL inside its size (never truncated), an empty id, a non-finite
 * time, and JSON text of the wrong kind; NULL tags/metadata store "[]"/"{}".
 * Gets overwrite *out (zeroed on failure, nothing to free). Lists clamp limit
 * to 1..1000, refuse offset < 0 (TWK_ERR_INVALID_ARG), and return a NULL
 * array when n_out is 0. */

/* Frees the owned strings inside (not the struct). */
void twk_store_session_clear(twk_store_session *s);
void twk_store_run_clear(twk_store_run *r);

twk_status twk_store_session_create(twk_store *s, const twk_store_session *sess);
/* TWK_ERR_NOT_FOUND when absent or another tenant's. */
twk_status twk_store_session_get(twk_store *s, const char *tenant, const char *id, twk_store_session *out);
twk_status twk_store_session_heartbeat(twk_store *s, const char *tenant, const char *id, double now);
twk_status twk_store_session_finish(twk_store *s, const char *tenant, const char *id);
/* Session ids of a tenant, newest first; *ids is an array of n_out strings
 * (free each and the array with twk_host_free); *total counts all. */
twk_status twk_store_session_list(twk_store *s, const char *tenant, int limit, int offset, char ***ids, int *n_out,
                                  int *total);

/* TWK_ERR_STATE if the id exists. */
twk_status twk_store_run_create(twk_store *s, const twk_store_run *run);
twk_status twk_store_run_get(twk_store *s, const char *tenant, const char *id, twk_store_run *out);
twk_status twk_store_run_touch(twk_store *s, const char *id, double now);
/* Runs of a tenant, newest first; *runs is an array of n_out records (clear
 * each, then twk_host_free the array); *total counts all. session_id may be
 * NULL (all sessions). */
twk_status twk_store_run_list(twk_store *s, const char *tenant, const char *session_id, int limit, int offset,
                              twk_store_run **runs, int *n_out, int *total);

/* For the metrics: calls fn once per tenant with its sessions not finished whose last heartbeat is
 * at or after live_since, its checkpoints and their bytes. The store's error otherwise. */
typedef void (*twk_store_stats_fn)(void *user, const char *tenant, int64_t sessions_live, int64_t checkpoints,
                                   int64_t checkpoint_bytes);
twk_status twk_store_tenant_stats(twk_store *s, double live_since, twk_store_stats_fn fn, void *user);

/* TWK_ERR_STATE if (run_id, checkpoint_id) exists. */
twk_status twk_store_ckpt_create(twk_store *s, const twk_store_ckpt *c);
/* Replaces an existing row (overwrite=true saves). Another tenant's row is
 * left alone: TWK_ERR_NOT_FOUND. Neither call checks that run_id is the
 * tenant's run; the caller does (twk_store_run_get). */
twk_status twk_store_ckpt_upsert(twk_store *s, const twk_store_ckpt *c);
twk_status twk_store_ckpt_get(twk_store *s, const char *tenant, const char *run_id, const char *checkpoint_id,
                              twk_store_ckpt *out);
/* The row (run_id, checkpoint_id) of any tenant when it is published; TWK_ERR_NOT_FOUND otherwise. */
twk_status twk_store_ckpt_get_public(twk_store *s, const char *run_id, const char *checkpoint_id, twk_store_ckpt *out);
/* Up to max checkpoints of any tenant whose expires_at (> 0) is at or before now, soonest first.
 * *out: n_out records (twk_host_free the array; NULL when none). */
twk_status twk_store_ckpt_expired(twk_store *s, double now, int max, twk_store_ckpt **out, int *n_out);
twk_status twk_store_ckpt_delete(twk_store *s, const char *tenant, const char *run_id, const char *checkpoint_id);
/* *listed = 1 if any tenant's row (run_id, checkpoint_id) exists (start-up
 * recovery, which sees folders, not tenants). */
twk_status twk_store_ckpt_listed(twk_store *s, const char *run_id, const char *checkpoint_id, int *listed);
/* Checkpoints of one run (run_id) or of the whole tenant (run_id NULL),
 * newest first. *out: n_out records (twk_host_free the array). */
twk_status twk_store_ckpt_list(twk_store *s, const char *tenant, const char *run_id, int limit, int offset,
                               twk_store_ckpt **out, int *n_out, int *total);
/* The published checkpoints of run_id, of whichever tenant, newest first (another tenant's view). */
twk_status twk_store_ckpt_list_public(twk_store *s, const char *run_id, int limit, int offset, twk_store_ckpt **out,
                                      int *n_out, int *total);
twk_status twk_store_ckpt_set_ttl(twk_store *s, const char *tenant, const char *run_id, const char *checkpoint_id,
                                  double expires_at);
twk_status twk_store_ckpt_set_public(twk_store *s, const char *tenant, const char *run_id, const char *checkpoint_id,
                                     int is_public);

/* ---- all tenants (the admin's dashboard only) ---- */
/* Every tenant's runs / checkpoints, newest first; as twk_store_run_list / twk_store_ckpt_list. */
twk_status twk_store_run_list_all(twk_store *s, int limit, int offset, twk_store_run **runs, int *n_out, int *total);
twk_status twk_store_ckpt_list_all(twk_store *s, int limit, int offset, twk_store_ckpt **out, int *n_out, int *total);

/* ---- per-step metrics of training ops (table run_steps; the dashboard's curves) ---- */
typedef enum twk_step_kind { TWK_STEP_FORWARD_BACKWARD = 0, TWK_STEP_FORWARD = 1, TWK_STEP_OPTIM = 2 } twk_step_kind;
typedef struct twk_store_step {
    char run_id[128];
    char tenant[64];
    int kind;           /* twk_step_kind */
    int64_t seq;        /* the op's seq_id in its run */
    int64_t step;       /* optimizer steps the run had taken: before the op (forward_backward, forward),
                           after it (optim_step) */
    double time;        /* unix seconds when the op finished */
    char *metrics_json; /* owned; a JSON object {"loss:sum": 1.5, ...}, non-finite values as null */
} twk_store_step;
/* Adds rows in one transaction (a row of an existing (run_id, kind, seq) replaces it), then thins:
 * each (run, kind) of the batch that holds more than cap (>= 2) rows loses every second row in seq
 * order, the first and the newest always kept, until it holds at most cap — so a series keeps its
 * whole span, older stretches at coarser resolution. A row that cannot
 * be stored (bad field, run_id not in runs) is skipped and counted in *n_failed, the others are
 * committed, and the first such error is returned. A failed commit stores nothing (*n_failed = n).
 * The rows go with their run's row (ON DELETE CASCADE). */
twk_status twk_store_steps_add(twk_store *s, const twk_store_step *rows, int n, int cap, int *n_failed);
/* A run's rows ordered by kind, then seq; tenant NULL: any tenant's run (the admin's view). *out:
 * n_out rows (twk_store_steps_free), NULL when none. */
twk_status twk_store_steps_list(twk_store *s, const char *tenant, const char *run_id, twk_store_step **out,
                                int *n_out);
void twk_store_steps_free(twk_store_step *rows, int n);

/* ---- the sessions' timelines (table session_trace; trace_export) ---- */
typedef struct twk_store_trace_rec {
    char session_id[96];
    char tenant[64];
    int64_t seq;             /* the row's number in its session, from 1 (set by the store) */
    char request_id[64];
    char route[48];          /* the endpoint that made the request ("forward_backward", "asample", ...) */
    char subject[160];       /* the run or sampling session it worked for */
    int64_t start_ns, end_ns; /* unix nanoseconds: submitted, finished */
    int ok;                  /* 0: failed with category and error */
    char category[24];
    char error[256];
    int64_t tokens;          /* -1 when unknown */
} twk_store_trace_rec;
/* Adds rows in one transaction, each numbered after its session's newest (a row whose session the
 * tenant does not have is skipped silently), then keeps each session of the batch to its newest cap
 * (>= 1) rows. A row that cannot be stored is counted in *n_failed, the others are committed, and
 * the first error is returned; a failed commit stores nothing (*n_failed = n). */
twk_status twk_store_trace_add(twk_store *s, const twk_store_trace_rec *rows, int n, int cap, int *n_failed);
/* The newest row number of the tenant's session (0: none ever) and the rows kept; rows dropped to the
 * cap are last_seq - n_rows. An error status (message set) when the store fails. */
twk_status twk_store_trace_stats(twk_store *s, const char *tenant, const char *session_id, int64_t *last_seq,
                                 int64_t *n_rows);
/* Calls fn with each row of the tenant's session in seq order (the row is only valid during the call);
 * a status other than TWK_OK from fn stops and is returned, as is a store error or TWK_ERR_OOM. */
typedef twk_status (*twk_store_trace_fn)(void *user, const twk_store_trace_rec *row);
twk_status twk_store_trace_each(twk_store *s, const char *tenant, const char *session_id, twk_store_trace_fn fn,
                                void *user);

#endif
