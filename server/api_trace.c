/* sessions/{id}/trace_export: a session's timeline (timeline.c, the store's session_trace) as a
 * Perfetto trace, written to DATA_DIR/traces/<session>/<last seq>.pftrace and handed out as a
 * signed, expiring URL of this server (the signing of external_weights_urls: svc_url_sign). The
 * trace is built synchronously when asked (so the answer is "ready" at once, never "pending"),
 * and again only when the session has records newer than the file.
 *
 * Layout: a top-level track "session <id>"; under it one track per run and per sampling session,
 * named by its id; one slice per request, from its submission to its result (named by its route,
 * category "train" or "sample", annotated with the request id, status, failure category and
 * error, and tokens). Requests of one run overlap (the SDK pipelines them), so a run's slices are
 * laid on as many same-named tracks as it needs for no two to overlap on one, which the UI shows
 * merged. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api_util.h"
#include "pftrace.h"
#include "svc.h"

#define TRACE_ROUTE "/api/v1/session_traces/"
#define SESSION_TRACK 1 /* uuid of the session's track; lanes are 2.. */

/* One request, its strings in the rows' string pool. */
typedef struct row {
    int64_t start, end, tokens;
    uint32_t request_id, route, subject, category, error; /* offsets into strs */
    int ok;
    int subj;  /* index of its subject */
    int lane;  /* index of its lane (a track) */
} row;

typedef struct lane {
    int subj;
    int64_t end; /* end of its last slice */
} lane;

typedef struct rows {
    row *r;
    int n, cap;
    char *strs;
    size_t ns, cap_s;
    int *subj_of;    /* hash table: subject offset + 1 per slot, 0 empty */
    uint32_t *subj;  /* distinct subjects, by index */
    int n_subj, cap_subj;
    size_t hcap;
} rows;

static twk_status grow(void **p, size_t *cap, size_t need, size_t elem, const char *what) {
    if (need <= *cap) return TWK_OK;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *g = twk_host_realloc(*p, *cap * elem, c * elem, what);
    if (!g) return twk_error(TWK_ERR_OOM, "out of memory building the trace");
    *p = g;
    *cap = c;
    return TWK_OK;
}

static twk_status pool_str(rows *t, const char *s, uint32_t *off) {
    size_t n = strlen(s) + 1;
    if (t->ns + n > UINT32_MAX) return twk_error(TWK_ERR_OOM, "the trace's strings passed 4 GiB");
    twk_status st = grow((void **)&t->strs, &t->cap_s, t->ns + n, 1, "trace strings");
    if (st != TWK_OK) return st;
    memcpy(t->strs + t->ns, s, n);
    *off = (uint32_t)t->ns;
    t->ns += n;
    return TWK_OK;
}

static twk_status add_row(void *user, const twk_store_trace_rec *rec) {
    rows *t = user;
    size_t cap = (size_t)t->cap;
    twk_status st = grow((void **)&t->r, &cap, (size_t)t->n + 1, sizeof *t->r, "trace rows");
    if (st != TWK_OK) return st;
    t->cap = (int)cap;
    row *r = &t->r[t->n];
    memset(r, 0, sizeof *r);
    r->start = rec->start_ns;
    r->end = rec->end_ns > rec->start_ns ? rec->end_ns : rec->start_ns + 1;
    r->tokens = rec->tokens;
    r->ok = rec->ok;
    st = pool_str(t, rec->request_id, &r->request_id);
    if (st == TWK_OK) st = pool_str(t, rec->route[0] ? rec->route : "request", &r->route);
    if (st == TWK_OK) st = pool_str(t, rec->subject[0] ? rec->subject : "session", &r->subject);
    if (st == TWK_OK) st = pool_str(t, rec->category, &r->category);
    if (st == TWK_OK) st = pool_str(t, rec->error, &r->error);
    if (st == TWK_OK) t->n++;
    return st;
}

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    while (*s) h = (h ^ (unsigned char)*s++) * 1099511628211ull;
    return h;
}

/* Gives every row the index of its subject (distinct subjects in t->subj, in order of first use). */
static twk_status index_subjects(rows *t) {
    t->hcap = 64;
    while (t->hcap < (size_t)t->n * 2) t->hcap *= 2;
    t->subj_of = twk_host_calloc(t->hcap * sizeof *t->subj_of, "trace subjects");
    if (!t->subj_of) return twk_error(TWK_ERR_OOM, "out of memory building the trace");
    for (int i = 0; i < t->n; i++) {
        const char *name = t->strs + t->r[i].subject;
        size_t h = (size_t)hash_str(name) & (t->hcap - 1);
        while (t->subj_of[h] && strcmp(t->strs + t->subj[t->subj_of[h] - 1], name)) h = (h + 1) & (t->hcap - 1);
        if (!t->subj_of[h]) {
            size_t cap = (size_t)t->cap_subj;
            twk_status st = grow((void **)&t->subj, &cap, (size_t)t->n_subj + 1, sizeof *t->subj, "trace subjects");
            if (st != TWK_OK) return st;
            t->cap_subj = (int)cap;
            t->subj[t->n_subj++] = t->r[i].subject;
            t->subj_of[h] = t->n_subj;
        }
        t->r[i].subj = t->subj_of[h] - 1;
    }
    return TWK_OK;
}

static int by_subject_start(const void *a, const void *b) {
    const row *x = a, *y = b;
    if (x->subj != y->subj) return x->subj < y->subj ? -1 : 1;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* One event of the trace: a slice's begin or end. */
typedef struct event {
    int64_t ts;
    int end;
    int row;
} event;

/* Time order; at one instant ends go first (a lane's next slice may begin as its last one ends). */
static int by_time(const void *a, const void *b) {
    const event *x = a, *y = b;
    if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
    if (x->end != y->end) return x->end ? -1 : 1;
    return x->row < y->row ? -1 : x->row > y->row;
}

/* Lays the rows on lanes (a lane per subject at first; another whenever a slice overlaps every lane
 * of its subject), then writes the trace into *pt. */
static twk_status encode(rows *t, const char *session_id, int64_t last_seq, twk_pf_trace *pt) {
    if (t->n) qsort(t->r, (size_t)t->n, sizeof *t->r, by_subject_start); /* (never with NULL: UB) */
    lane *lanes = NULL;
    size_t cap_l = 0;
    int n_lanes = 0;
    twk_status st = TWK_OK;
    for (int i = 0, first = 0; st == TWK_OK && i < t->n; i++) {
        if (i == 0 || t->r[i].subj != t->r[i - 1].subj) first = n_lanes; /* the subject's lanes start here */
        int l = first;
        while (l < n_lanes && lanes[l].end > t->r[i].start) l++;
        if (l == n_lanes) {
            st = grow((void **)&lanes, &cap_l, (size_t)n_lanes + 1, sizeof *lanes, "trace lanes");
            if (st != TWK_OK) break;
            lanes[n_lanes++] = (lane){t->r[i].subj, 0};
        }
        lanes[l].end = t->r[i].end;
        t->r[i].lane = l;
    }
    event *ev = st == TWK_OK && t->n ? twk_host_alloc((size_t)t->n * 2 * sizeof *ev, "trace events") : NULL;
    if (st == TWK_OK && t->n && !ev) st = twk_error(TWK_ERR_OOM, "out of memory building the trace");
    if (st != TWK_OK) {
        twk_host_free(lanes);
        return st;
    }
    for (int i = 0; i < t->n; i++) {
        ev[2 * i] = (event){t->r[i].start, 0, i};
        ev[2 * i + 1] = (event){t->r[i].end, 1, i};
    }
    if (t->n) qsort(ev, (size_t)t->n * 2, sizeof *ev, by_time);

    twk_pf_init(pt, 1);
    int64_t t0 = t->n ? ev[0].ts : (int64_t)time(NULL) * 1000000000;
    twk_pf_clock_identity(pt, (uint64_t)t0);
    char name[160], desc[200];
    snprintf(name, sizeof name, "session %s", session_id);
    snprintf(desc, sizeof desc, "%d requests recorded, %lld dropped (the newest %d are kept)", t->n,
             (long long)(last_seq - t->n), TWK_SERVE_TRACE_RECORDS);
    twk_pf_track(pt, SESSION_TRACK, 0, name, desc);
    for (int l = 0; l < n_lanes; l++)
        twk_pf_track(pt, SESSION_TRACK + 1 + (uint64_t)l, SESSION_TRACK, t->strs + t->subj[lanes[l].subj], NULL);
    for (int k = 0; k < 2 * t->n; k++) {
        const row *r = &t->r[ev[k].row];
        uint64_t track = SESSION_TRACK + 1 + (uint64_t)r->lane;
        if (ev[k].end) {
            twk_pf_slice_end(pt, (uint64_t)ev[k].ts, track);
            continue;
        }
        const char *route = t->strs + r->route;
        twk_pf_arg args[5];
        int n = 0;
        args[n++] = (twk_pf_arg){"request_id", t->strs + r->request_id, 0};
        args[n++] = (twk_pf_arg){"status", r->ok ? "ok" : "failed", 0};
        if (!r->ok) args[n++] = (twk_pf_arg){"category", t->strs + r->category, 0};
        if (!r->ok) args[n++] = (twk_pf_arg){"error", t->strs + r->error, 0};
        if (r->tokens >= 0) args[n++] = (twk_pf_arg){"tokens", NULL, r->tokens};
        twk_pf_slice_begin(pt, (uint64_t)ev[k].ts, track, route, strcmp(route, "asample") ? "train" : "sample", args,
                           n);
    }
    twk_host_free(ev);
    twk_host_free(lanes);
    if (!twk_pf_ok(pt)) {
        twk_pf_free(pt);
        return twk_error(TWK_ERR_OOM, "out of memory encoding the trace");
    }
    return TWK_OK;
}

static void rows_free(rows *t) {
    twk_host_free(t->r);
    twk_host_free(t->strs);
    twk_host_free(t->subj_of);
    twk_host_free(t->subj);
}

/* Removes every file of dir but `keep`. */
static void remove_others(const char *dir, const char *keep) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        char p[1600];
        if (e->d_name[0] == '.' || !strcmp(e->d_name, keep)) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
}

/* The trace of the session's records up to last_seq at DATA_DIR/traces/<session>/<last_seq>.pftrace,
 * built unless it is there already; *status 500/503 with a message in err on failure. */
static int build(svc *s, const char *tenant, const char *session_id, int64_t last_seq, int *status, char *err,
                 size_t err_len) {
    char dir[1200], file[40], path[1300];
    snprintf(dir, sizeof dir, "%s/traces/%s", s->cfg.data_dir, session_id);
    snprintf(file, sizeof file, "%lld.pftrace", (long long)last_seq);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) return 1; /* up to date */
    rows t;
    memset(&t, 0, sizeof t);
    twk_pf_trace pt;
    twk_status st = twk_store_trace_each(s->store, tenant, session_id, add_row, &t);
    if (st == TWK_OK) st = index_subjects(&t);
    if (st == TWK_OK) st = encode(&t, session_id, last_seq, &pt);
    rows_free(&t);
    if (st != TWK_OK) {
        *status = st == TWK_ERR_OOM ? 503 : 500;
        snprintf(err, err_len, "building the trace failed: %s", twk_last_error());
        return 0;
    }
    st = twk_mkdir_p(dir, 0755);
    if (st == TWK_OK) st = twk_write_file_atomic(path, pt.out.p, pt.out.n);
    twk_pf_free(&pt);
    if (st != TWK_OK) {
        *status = st == TWK_ERR_OOM ? 503 : 500;
        snprintf(err, err_len, "writing the trace failed: %s", twk_last_error());
        return 0;
    }
    remove_others(dir, file);
    return 1;
}

void api_trace_export(svc *s, twk_http_conn *c, const twk_http_req *req, const char *tenant, const char *session_id) {
    if (!svc_session_exists(s, c, tenant, session_id)) return;
    if (!api_valid_name(session_id)) { /* ids are made here ("sess-<hex>"): never true for a stored one */
        api_error(c, 400, "session_id '%s' cannot name a trace file", session_id);
        return;
    }
    svc_timeline_flush(s); /* what finished until now is in the trace */
    int64_t last_seq = 0, n_rows = 0;
    if (twk_store_trace_stats(s->store, tenant, session_id, &last_seq, &n_rows) != TWK_OK) {
        api_error(c, 500, "reading the session's timeline failed: %s", twk_last_error());
        return;
    }
    int status = 0;
    char err[1400];
    if (!build(s, tenant, session_id, last_seq, &status, err, sizeof err)) {
        api_error(c, status, "%s", err);
        return;
    }
    long long expires = (long long)time(NULL) + (long long)s->cfg.url_ttl_s;
    char what[128], sig[65], base[300], url[700];
    snprintf(what, sizeof what, "trace/%s", session_id);
    svc_url_sign(s, what, expires, sig);
    svc_base_url(s, req, base, sizeof base);
    snprintf(url, sizeof url, "%s" TRACE_ROUTE "%s.pftrace?expires=%lld&sig=%s", base, session_id, expires, sig);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "status", "ready");
    cJSON_AddStringToObject(j, "url", url);
    cJSON_AddNullToObject(j, "error");
    cJSON_AddNumberToObject(j, "requests", (double)n_rows);
    cJSON_AddNumberToObject(j, "dropped", (double)(last_seq - n_rows));
    api_ok(c, j);
}

/* The newest trace file of dir (the largest <seq>.pftrace) into name; 0 when there is none. */
static int newest_trace(const char *dir, char *name, size_t len) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    long long best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end = NULL;
        long long v = strtoll(e->d_name, &end, 10);
        if (e->d_name[0] < '0' || e->d_name[0] > '9' || !end || strcmp(end, ".pftrace") || v <= best) continue;
        best = v;
        snprintf(name, len, "%s", e->d_name);
    }
    closedir(d);
    return best >= 0;
}

int api_trace_download(svc *s, twk_http_conn *c, const twk_http_req *req) {
    if (strncmp(req->path, TRACE_ROUTE, strlen(TRACE_ROUTE))) return 0;
    const char *p = req->path + strlen(TRACE_ROUTE);
    size_t n = strlen(p);
    char session_id[128];
    if (n <= 8 || n - 8 >= sizeof session_id || strcmp(p + n - 8, ".pftrace")) {
        api_error(c, 404, "no such download");
        return 1;
    }
    memcpy(session_id, p, n - 8);
    session_id[n - 8] = 0;
    if (!api_valid_name(session_id)) {
        api_error(c, 404, "no such download");
        return 1;
    }
    char what[160], dir[1200], name[300], path[1600], missing[300];
    snprintf(what, sizeof what, "trace/%s", session_id);
    if (!svc_url_check(s, c, req, what, "ask trace_export (tinker session export-trace) for a new one")) return 1;
    snprintf(dir, sizeof dir, "%s/traces/%s", s->cfg.data_dir, session_id);
    snprintf(missing, sizeof missing, "the trace of session '%s' is gone; ask trace_export again", session_id);
    if (!newest_trace(dir, name, sizeof name)) {
        api_error(c, 404, "%s", missing);
        return 1;
    }
    snprintf(path, sizeof path, "%s/%s", dir, name);
    svc_send_file(s, c, path, missing);
    return 1;
}
