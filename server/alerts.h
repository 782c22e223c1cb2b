/* server/ — failure alerts posted to webhooks (`--alert-webhook [FORMAT=]URL`, repeatable; formats
 * slack, feishu, dingtalk, generic JSON). Events: a training op failed with a server error, a loss
 * that is not finite, a compute worker that finishes nothing for --alert-stall-s, the data dir's
 * disk or the host's memory past a watermark, and a start after an unclean shutdown (the marker
 * DATA_DIR/serve.running left behind). Delivery runs on its own thread with libcurl, retried with
 * exponential backoff, rate-limited per event kind, from a bounded queue; every step is counted in
 * the metrics (metrics.h). Raising an event never blocks on the network. */
#ifndef TWK_SERVER_ALERTS_H
#define TWK_SERVER_ALERTS_H

#include "twinkle/status.h"

#define TWK_ALERT_MAX_TARGETS 8

typedef enum twk_alert_format { TWK_ALERT_GENERIC, TWK_ALERT_SLACK, TWK_ALERT_FEISHU, TWK_ALERT_DINGTALK } twk_alert_format;

typedef enum twk_alert_kind {
    TWK_ALERT_OP_FAILED,        /* a training op's future failed with category "server" */
    TWK_ALERT_LOSS_NONFINITE,   /* forward / forward_backward returned a loss that is NaN or infinite */
    TWK_ALERT_WORKER_STALL,     /* the worker had work and finished nothing for --alert-stall-s */
    TWK_ALERT_DISK,             /* the data dir's file system is fuller than --alert-disk-pct */
    TWK_ALERT_MEMORY,           /* the host's memory in use is past --alert-mem-pct */
    TWK_ALERT_UNCLEAN_SHUTDOWN, /* the server started after a crash or kill */
    TWK_ALERT_KIND_COUNT
} twk_alert_kind;

/* The defaults (twk_alert_config_default, serve --help). */
#define TWK_ALERT_DEF_STALL_S 600
#define TWK_ALERT_DEF_DISK_PCT 90
#define TWK_ALERT_DEF_MEM_PCT 90
#define TWK_ALERT_DEF_CHECK_S 5
#define TWK_ALERT_DEF_RATE_S 60
#define TWK_ALERT_DEF_BACKOFF_S 1
#define TWK_ALERT_DEF_RETRIES 5
#define TWK_ALERT_DEF_TIMEOUT_S 10

typedef struct twk_alert_config {
    int n_targets;
    struct {
        char url[1024];
        twk_alert_format format;
    } targets[TWK_ALERT_MAX_TARGETS];
    double stall_s;   /* default 600; 0 = off */
    double disk_pct;  /* default 90; 0 = off */
    double mem_pct;   /* default 90; 0 = off */
    double check_s;   /* how often the stall and watermark checks run; default 5 */
    double rate_s;    /* at most one event of a kind per this many seconds; default 60 */
    double backoff_s; /* the first retry's delay, doubled each retry (capped at 300 s); default 1 */
    int retries;      /* retries after the first attempt; default 5 */
    double timeout_s; /* one post's time limit; default 10 */
} twk_alert_config;

/* The defaults above (no targets). */
void twk_alert_config_default(twk_alert_config *a);
/* Parses one --alert-* option into a; 1 if opt was one (*st the result, naming the option on
 * error), 0 if it is not an alert option. */
int twk_alert_config_arg(twk_alert_config *a, const char *opt, const char *val, twk_status *st);
/* "generic", "slack", ... */
const char *twk_alert_format_name(twk_alert_format f);
/* "op_failed", "loss_nonfinite", "worker_stall", "disk_watermark", "memory_watermark", "unclean_shutdown". */
const char *twk_alert_kind_name(twk_alert_kind k);

struct twk_metrics;
typedef struct twk_alerts twk_alerts;

/* Checks the unclean-shutdown marker in data_dir (raising that event when it is there), writes it,
 * and starts the delivery thread when cfg has targets. NULL with the error set when out of memory
 * or when there are targets and libcurl.so.4 cannot be loaded (nothing started). */
twk_alerts *twk_alerts_start(const twk_alert_config *cfg, const char *data_dir, struct twk_metrics *m);
/* Stops the thread (a post in progress is aborted; undelivered alerts are dropped), removes the
 * marker (a clean shutdown) and frees. NULL is ignored. */
void twk_alerts_stop(twk_alerts *a);
/* Raises an event (any thread; never blocks on delivery). tenant, run_id and request_id may be NULL. */
void twk_alerts_raise(twk_alerts *a, twk_alert_kind kind, const char *tenant, const char *run_id, const char *request_id,
                      const char *fmt, ...) __attribute__((format(printf, 6, 7)));

#endif
