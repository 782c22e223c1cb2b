/* Failure alerts to webhooks (see alerts.h): options, payloads per format, the bounded delivery
 * queue and its thread (libcurl), the stall and watermark checks, the unclean-shutdown marker. */
#include "alerts.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>

#include "api_util.h"
#include "curl_dl.h"
#include "metrics.h"
#include "twinkle/hal.h"

#define QUEUE_CAP 64          /* deliveries waiting (first attempt or retry); past it new ones are dropped */
#define MAX_BACKOFF_S 300.0

static const char *const kind_names[TWK_ALERT_KIND_COUNT] = {
    "op_failed", "loss_nonfinite", "worker_stall", "disk_watermark", "memory_watermark", "unclean_shutdown"};
static const char *const kind_severity[TWK_ALERT_KIND_COUNT] = {"error", "warning", "error", "warning", "warning", "warning"};
static const char *const format_names[] = {"generic", "slack", "feishu", "dingtalk"};

const char *twk_alert_kind_name(twk_alert_kind k) { return k >= 0 && k < TWK_ALERT_KIND_COUNT ? kind_names[k] : "?"; }
const char *twk_alert_format_name(twk_alert_format f) { return f >= 0 && f <= TWK_ALERT_DINGTALK ? format_names[f] : "?"; }

void twk_alert_config_default(twk_alert_config *a) {
    memset(a, 0, sizeof *a);
    a->stall_s = TWK_ALERT_DEF_STALL_S;
    a->disk_pct = TWK_ALERT_DEF_DISK_PCT;
    a->mem_pct = TWK_ALERT_DEF_MEM_PCT;
    a->check_s = TWK_ALERT_DEF_CHECK_S;
    a->rate_s = TWK_ALERT_DEF_RATE_S;
    a->backoff_s = TWK_ALERT_DEF_BACKOFF_S;
    a->retries = TWK_ALERT_DEF_RETRIES;
    a->timeout_s = TWK_ALERT_DEF_TIMEOUT_S;
}

/* The format a URL's host implies when none is named. */
static twk_alert_format guess_format(const char *url) {
    if (strstr(url, "hooks.slack.com")) return TWK_ALERT_SLACK;
    if (strstr(url, "open.feishu.cn") || strstr(url, "open.larksuite.com")) return TWK_ALERT_FEISHU;
    if (strstr(url, "oapi.dingtalk.com")) return TWK_ALERT_DINGTALK;
    return TWK_ALERT_GENERIC;
}

static twk_status add_target(twk_alert_config *a, const char *val) {
    if (a->n_targets == TWK_ALERT_MAX_TARGETS)
        return twk_error(TWK_ERR_INVALID_ARG, "--alert-webhook: at most %d webhooks", TWK_ALERT_MAX_TARGETS);
    const char *url = val;
    int format = -1;
    const char *eq = strchr(val, '=');
    const char *colon = strstr(val, "://");
    if (eq && (!colon || eq < colon)) { /* FORMAT=URL */
        for (int f = 0; f <= TWK_ALERT_DINGTALK; f++)
            if (strlen(format_names[f]) == (size_t)(eq - val) && !strncmp(val, format_names[f], (size_t)(eq - val)))
                format = f;
        if (format < 0)
            return twk_error(TWK_ERR_INVALID_ARG, "--alert-webhook: unknown format '%.*s' (slack, feishu, dingtalk or generic)",
                             (int)(eq - val), val);
        url = eq + 1;
    }
    if (strncmp(url, "http://", 7) && strncmp(url, "https://", 8))
        return twk_error(TWK_ERR_INVALID_ARG, "--alert-webhook: '%s' is not an http:// or https:// URL", url);
    if (strlen(url) >= sizeof a->targets[0].url) return twk_error(TWK_ERR_INVALID_ARG, "--alert-webhook: URL too long");
    snprintf(a->targets[a->n_targets].url, sizeof a->targets[0].url, "%s", url);
    a->targets[a->n_targets].format = format >= 0 ? (twk_alert_format)format : guess_format(url);
    a->n_targets++;
    return TWK_OK;
}

int twk_alert_config_arg(twk_alert_config *a, const char *opt, const char *val, twk_status *st) {
    while (*opt == '-') opt++;
    if (strncmp(opt, "alert-", 6)) return 0;
    if (!val) {
        *st = twk_error(TWK_ERR_INVALID_ARG, "--%s needs a value", opt);
        return 1;
    }
    if (!strcmp(opt, "alert-webhook")) {
        *st = add_target(a, val);
        return 1;
    }
    struct { const char *name; double *dst; double lo, hi; } nums[] = {
        {"alert-stall-s", &a->stall_s, 0, 86400 * 7}, {"alert-disk-pct", &a->disk_pct, 0, 100},
        {"alert-mem-pct", &a->mem_pct, 0, 100},       {"alert-check-s", &a->check_s, 0.05, 3600},
        {"alert-rate-s", &a->rate_s, 0, 86400},       {"alert-backoff-s", &a->backoff_s, 0.01, 3600},
        {"alert-timeout-s", &a->timeout_s, 0.1, 600},
    };
    double retries = 0, *dst = NULL, lo = 0, hi = 100;
    if (!strcmp(opt, "alert-retries")) dst = &retries;
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        if (!strcmp(opt, nums[i].name)) dst = nums[i].dst, lo = nums[i].lo, hi = nums[i].hi;
    if (!dst) {
        *st = twk_error(TWK_ERR_INVALID_ARG, "unknown option --%s", opt);
        return 1;
    }
    char *end = NULL;
    double v = strtod(val, &end);
    if (!*val || *end || !(v >= lo && v <= hi)) {
        *st = twk_error(TWK_ERR_INVALID_ARG, "--%s wants a number in [%g, %g], got '%s'", opt, lo, hi, val);
        return 1;
    }
    *dst = v;
    if (dst == &retries) a->retries = (int)v;
    *st = TWK_OK;
    return 1;
}

/* ---- the queue and its thread ---- */

typedef struct delivery {
    int target, attempt;
    double due; /* monotonic seconds */
    char *body;
} delivery;

struct twk_alerts {
    twk_alert_config cfg;
    twk_metrics *m;
    char marker[1100];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int running, stop;
    delivery q[QUEUE_CAP];
    int n;
    double last_sent[TWK_ALERT_KIND_COUNT]; /* monotonic; 0 = never */
    int suppressed[TWK_ALERT_KIND_COUNT];   /* since the last one sent */
    int stalled, disk_high, mem_high;       /* the condition is on (raised once per episode) */
    char host[128];
    char data_dir[1024];
    const twk_curl_api *curl; /* loaded when there are targets */
};

static void target_labels(const twk_alerts *a, int t, char *out, size_t n) {
    snprintf(out, n, "target=\"%d\",format=\"%s\"", t, twk_alert_format_name(a->cfg.targets[t].format));
}

/* The webhook body for format f; NULL when out of memory. */
static char *payload(twk_alert_format f, twk_alert_kind kind, const char *text, const char *msg, const char *tenant,
                     const char *run_id, const char *request_id, const char *host, int suppressed) {
    cJSON *j = cJSON_CreateObject();
    if (f == TWK_ALERT_SLACK) {
        cJSON_AddStringToObject(j, "text", text);
    } else if (f == TWK_ALERT_FEISHU) {
        cJSON_AddStringToObject(j, "msg_type", "text");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(j, "content"), "text", text);
    } else if (f == TWK_ALERT_DINGTALK) {
        cJSON_AddStringToObject(j, "msgtype", "text");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(j, "text"), "content", text);
    } else {
        char ts[40];
        api_iso_time((double)time(NULL), ts, sizeof ts);
        cJSON_AddStringToObject(j, "source", "twinkle");
        cJSON_AddStringToObject(j, "kind", kind_names[kind]);
        cJSON_AddStringToObject(j, "severity", kind_severity[kind]);
        cJSON_AddStringToObject(j, "message", msg);
        cJSON_AddStringToObject(j, "text", text);
        cJSON *x;
        x = tenant ? cJSON_AddStringToObject(j, "tenant", tenant) : cJSON_AddNullToObject(j, "tenant");
        x = run_id ? cJSON_AddStringToObject(j, "run_id", run_id) : cJSON_AddNullToObject(j, "run_id");
        x = request_id ? cJSON_AddStringToObject(j, "request_id", request_id) : cJSON_AddNullToObject(j, "request_id");
        (void)x;
        cJSON_AddStringToObject(j, "host", host);
        cJSON_AddStringToObject(j, "time", ts);
        cJSON_AddNumberToObject(j, "suppressed", suppressed);
    }
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (api_json_oom()) {
        cJSON_free(s);
        return NULL;
    }
    return s;
}

void twk_alerts_raise(twk_alerts *a, twk_alert_kind kind, const char *tenant, const char *run_id, const char *request_id,
                      const char *fmt, ...) {
    if (!a || kind < 0 || kind >= TWK_ALERT_KIND_COUNT) return;
    char msg[1024], text[1700], lk[48];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(lk, sizeof lk, "kind=\"%s\"", kind_names[kind]);
    twk_metrics_add(a->m, TWK_M_ALERTS, NULL, lk, 1);
    double now = twk_metrics_now();
    pthread_mutex_lock(&a->mu);
    if (a->last_sent[kind] > 0 && now - a->last_sent[kind] < a->cfg.rate_s) {
        a->suppressed[kind]++;
        pthread_mutex_unlock(&a->mu);
        twk_metrics_add(a->m, TWK_M_ALERTS_SUPPRESSED, NULL, lk, 1);
        return;
    }
    a->last_sent[kind] = now;
    int suppressed = a->suppressed[kind];
    a->suppressed[kind] = 0;
    int n = snprintf(text, sizeof text, "[twinkle] %s on %s: %s", kind_names[kind], a->host, msg);
    if (tenant && n < (int)sizeof text) n += snprintf(text + n, sizeof text - (size_t)n, " (tenant %s", tenant);
    if (tenant && run_id && n < (int)sizeof text) n += snprintf(text + n, sizeof text - (size_t)n, ", run %s", run_id);
    if (tenant && n < (int)sizeof text) n += snprintf(text + n, sizeof text - (size_t)n, ")");
    if (suppressed && n < (int)sizeof text)
        snprintf(text + n, sizeof text - (size_t)n, " [%d more %s events suppressed]", suppressed, kind_names[kind]);
    for (int t = 0; t < a->cfg.n_targets; t++) {
        char *body = payload(a->cfg.targets[t].format, kind, text, msg, tenant, run_id, request_id, a->host, suppressed);
        if (!body || a->n == QUEUE_CAP) {
            cJSON_free(body);
            twk_metrics_add(a->m, TWK_M_ALERTS_DROPPED, NULL, "", 1);
            continue;
        }
        a->q[a->n++] = (delivery){t, 0, now, body};
    }
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

/* ---- one post ---- */

typedef struct reply {
    char buf[2048];
    size_t n;
} reply;

static size_t on_data(char *p, size_t size, size_t nmemb, void *user) {
    reply *r = user;
    size_t n = size * nmemb, room = sizeof r->buf - 1 - r->n;
    memcpy(r->buf + r->n, p, n < room ? n : room);
    r->n += n < room ? n : room;
    r->buf[r->n] = 0;
    return n;
}

static int on_progress(void *user, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
    (void)dt, (void)dn, (void)ut, (void)un;
    twk_alerts *a = user;
    pthread_mutex_lock(&a->mu);
    int stop = a->stop;
    pthread_mutex_unlock(&a->mu);
    return stop; /* non-zero aborts the transfer */
}

/* 1 if the webhook took the post: a 2xx answer and, for feishu and dingtalk (which answer 200 to
 * refused messages), a JSON "code" / "errcode" of 0 where the answer has one. */
static int post(twk_alerts *a, int t, const char *body) {
    const twk_curl_api *cu = a->curl;
    CURL *h = cu->easy_init();
    if (!h) return 0;
    struct curl_slist *hdr = cu->slist_append(NULL, "Content-Type: application/json");
    reply r = {.n = 0};
    r.buf[0] = 0;
    cu->easy_setopt(h, CURLOPT_URL, a->cfg.targets[t].url);
    cu->easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    cu->easy_setopt(h, CURLOPT_POSTFIELDS, body);
    cu->easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    cu->easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    cu->easy_setopt(h, CURLOPT_USERAGENT, "twinkle-alerts");
    cu->easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    cu->easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(a->cfg.timeout_s * 1000));
    cu->easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    cu->easy_setopt(h, CURLOPT_WRITEDATA, &r);
    cu->easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    cu->easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    cu->easy_setopt(h, CURLOPT_XFERINFODATA, a);
    long code = 0;
    CURLcode rc = cu->easy_perform(h);
    if (rc == CURLE_OK) cu->easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    cu->slist_free_all(hdr);
    cu->easy_cleanup(h);
    int ok = rc == CURLE_OK && code >= 200 && code < 300;
    twk_alert_format f = a->cfg.targets[t].format;
    if (ok && (f == TWK_ALERT_FEISHU || f == TWK_ALERT_DINGTALK)) {
        cJSON *j = cJSON_Parse(r.buf);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, f == TWK_ALERT_FEISHU ? "code" : "errcode");
        if (cJSON_IsNumber(c) && c->valuedouble != 0) ok = 0;
        cJSON_Delete(j);
        api_json_oom();
    }
    return ok;
}

/* ---- the checks ---- */

/* Percent of the data dir's file system in use (as df counts it); -1 if unknown. */
static double disk_pct(const char *dir) {
    struct statvfs v;
    if (statvfs(dir, &v) != 0 || v.f_blocks == 0) return -1;
    double used = (double)(v.f_blocks - v.f_bfree), avail = (double)v.f_bavail;
    return used + avail > 0 ? 100.0 * used / (used + avail) : -1;
}

/* Percent of the host's memory in use (MemTotal - MemAvailable); -1 if unknown. */
static double mem_pct(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    double total = 0, avail = -1, v;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemTotal: %lf", &v) == 1) total = v;
        else if (sscanf(line, "MemAvailable: %lf", &v) == 1) avail = v;
    }
    fclose(f);
    return total > 0 && avail >= 0 ? 100.0 * (total - avail) / total : -1;
}

/* Raises a watermark or stall event when its condition turns on; re-arms when it turns off. */
static void edge(twk_alerts *a, int *flag, int on, twk_alert_kind kind, const char *fmt, double v, double limit) {
    if (on && !*flag) twk_alerts_raise(a, kind, NULL, NULL, NULL, fmt, v, limit);
    *flag = on;
}

static void check(twk_alerts *a) {
    double stall = twk_metrics_stall(a->m);
    if (a->cfg.stall_s > 0)
        edge(a, &a->stalled, stall >= a->cfg.stall_s, TWK_ALERT_WORKER_STALL,
             "the compute worker has finished no job for %.1f s (threshold %.1f s)", stall, a->cfg.stall_s);
    double d = a->cfg.disk_pct > 0 ? disk_pct(a->data_dir) : -1;
    if (a->cfg.disk_pct > 0)
        edge(a, &a->disk_high, d >= a->cfg.disk_pct, TWK_ALERT_DISK, "the data dir's disk is %.1f%% full (watermark %.1f%%)",
             d, a->cfg.disk_pct);
    double mm = a->cfg.mem_pct > 0 ? mem_pct() : -1;
    if (a->cfg.mem_pct > 0)
        edge(a, &a->mem_high, mm >= a->cfg.mem_pct, TWK_ALERT_MEMORY, "host memory is %.1f%% in use (watermark %.1f%%)", mm,
             a->cfg.mem_pct);
}

static void *alert_main(void *arg) {
    twk_alerts *a = arg;
    double next_check = twk_metrics_now();
    pthread_mutex_lock(&a->mu);
    while (!a->stop) {
        double now = twk_metrics_now();
        if (now >= next_check) {
            pthread_mutex_unlock(&a->mu);
            check(a);
            pthread_mutex_lock(&a->mu);
            next_check = now + a->cfg.check_s;
            continue;
        }
        int pick = -1;
        for (int i = 0; i < a->n; i++)
            if (a->q[i].due <= now && (pick < 0 || a->q[i].due < a->q[pick].due)) pick = i;
        if (pick < 0) {
            double wake = next_check;
            for (int i = 0; i < a->n; i++)
                if (a->q[i].due < wake) wake = a->q[i].due;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            double dt = wake - now, w = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + (dt > 0 ? dt : 0);
            ts.tv_sec = (time_t)w;
            ts.tv_nsec = (long)((w - (double)ts.tv_sec) * 1e9);
            pthread_cond_timedwait(&a->cv, &a->mu, &ts);
            continue;
        }
        delivery d = a->q[pick];
        a->q[pick] = a->q[--a->n];
        pthread_mutex_unlock(&a->mu);
        int ok = post(a, d.target, d.body);
        char l[96];
        target_labels(a, d.target, l, sizeof l);
        pthread_mutex_lock(&a->mu);
        if (ok) {
            twk_metrics_add(a->m, TWK_M_ALERT_DELIVERIES, NULL, l, 1);
            cJSON_free(d.body);
        } else if (d.attempt < a->cfg.retries && !a->stop && a->n < QUEUE_CAP) {
            double delay = a->cfg.backoff_s * pow(2.0, d.attempt);
            d.attempt++;
            d.due = twk_metrics_now() + (delay < MAX_BACKOFF_S ? delay : MAX_BACKOFF_S);
            a->q[a->n++] = d;
            twk_metrics_add(a->m, TWK_M_ALERT_RETRIES, NULL, l, 1);
        } else { /* out of retries (or stopping): failed; a retry with no room in the queue: dropped */
            int no_room = d.attempt < a->cfg.retries && !a->stop;
            twk_metrics_add(a->m, no_room ? TWK_M_ALERTS_DROPPED : TWK_M_ALERT_FAILURES, NULL, no_room ? "" : l, 1);
            cJSON_free(d.body);
        }
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

twk_alerts *twk_alerts_start(const twk_alert_config *cfg, const char *data_dir, twk_metrics *m) {
    const twk_curl_api *curl = NULL;
    const char *why = NULL;
    if (cfg->n_targets > 0 && !(curl = twk_curl_load(&why))) {
        twk_error(TWK_ERR_BACKEND, "--alert-webhook: %s", why);
        return NULL;
    }
    twk_alerts *a = twk_host_calloc(sizeof *a, "alerts");
    if (!a) {
        twk_error(TWK_ERR_OOM, "out of memory starting the alerts");
        return NULL;
    }
    a->cfg = *cfg;
    a->curl = curl;
    a->m = m;
    snprintf(a->data_dir, sizeof a->data_dir, "%s", data_dir);
    if (gethostname(a->host, sizeof a->host) != 0) snprintf(a->host, sizeof a->host, "?");
    a->host[sizeof a->host - 1] = 0;
    pthread_mutex_init(&a->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->cv, &ca);
    pthread_condattr_destroy(&ca);
    snprintf(a->marker, sizeof a->marker, "%s/serve.running", data_dir);
    FILE *f = fopen(a->marker, "r");
    char prev[128] = "";
    if (f) {
        if (!fgets(prev, sizeof prev, f)) prev[0] = 0;
        prev[strcspn(prev, "\n")] = 0;
        fclose(f);
    }
    if (a->cfg.n_targets > 0) {
        a->curl->global_init(CURL_GLOBAL_DEFAULT);
        a->running = pthread_create(&a->thread, NULL, alert_main, a) == 0;
    }
    if (f)
        twk_alerts_raise(a, TWK_ALERT_UNCLEAN_SHUTDOWN, NULL, NULL, NULL,
                         "the server started after an unclean shutdown (%s was left by %s)", a->marker,
                         prev[0] ? prev : "an earlier run");
    f = fopen(a->marker, "w");
    if (f) {
        fprintf(f, "pid %ld\n", (long)getpid());
        fclose(f);
    }
    return a;
}

void twk_alerts_stop(twk_alerts *a) {
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    a->stop = 1;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
    if (a->running) pthread_join(a->thread, NULL);
    if (a->curl) a->curl->global_cleanup();
    for (int i = 0; i < a->n; i++) cJSON_free(a->q[i].body);
    unlink(a->marker);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    twk_host_free(a);
}
