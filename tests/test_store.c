/* The SQLite store (server/store.c): create/get/list of sessions, runs and
 * checkpoints; pagination and totals; tenant isolation (another tenant's
 * rows are absent for get/list/update/delete and stay unchanged); duplicate
 * creates; upsert; ttl/public; overlong and malformed input refused; the
 * data survives close + reopen; injected allocation failures; and a child
 * killed with SIGKILL while it writes loses no row it reported committed,
 * leaving a database that passes PRAGMA integrity_check; per-step metrics (run_steps): tenant
 * isolation, bad rows skipped, thinning against a reference, removal with their run. */
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "check.h"
#include "store.h"
#include "twinkle/hal.h"
#include "twinkle/status.h"


/* A status check: prints the message for expected errors. */
static int expect(twk_status got, twk_status want, const char *what) {
    int ok = got == want;
    printf("%s %-58s -> %s%s%s\n", ok ? "ok  " : "FAIL", what, twk_status_name(got), got != TWK_OK ? ": " : "",
           got != TWK_OK ? twk_last_error() : "");
    if (!ok) {
        printf("     want %s\n", twk_status_name(want));
        check_failures++;
    }
    return ok;
}

#define COPY(dst, src) snprintf((dst), sizeof(dst), "%s", (src))

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- sessions ----------------------------------------------------------- */

static twk_store_session mk_session(const char *tenant, const char *id, double created) {
    twk_store_session s;
    memset(&s, 0, sizeof s);
    COPY(s.id, id);
    COPY(s.tenant, tenant);
    COPY(s.sdk_version, "0.7.1");
    s.created = created;
    s.last_heartbeat = created;
    return s;
}

static void test_sessions(twk_store *st) {
    twk_store_session a = mk_session("tenA", "sess-1", 100.0);
    a.tags_json = "[\"x\",\"y\"]";
    a.user_metadata_json = "{\"k\":\"v\"}";
    expect(twk_store_session_create(st, &a), TWK_OK, "session create");
    expect(twk_store_session_create(st, &a), TWK_ERR_STATE, "session create again");
    twk_store_session b = mk_session("tenB", "sess-1", 100.0);
    expect(twk_store_session_create(st, &b), TWK_ERR_STATE, "session create same id, other tenant");

    for (int i = 2; i <= 7; i++) { /* two share created=150 to test the id tiebreak */
        char id[32];
        snprintf(id, sizeof id, "sess-%d", i);
        twk_store_session x = mk_session("tenA", id, i == 3 || i == 4 ? 145.0 : 100.0 + i * 10);
        if (twk_store_session_create(st, &x) != TWK_OK) check(0, "session create %s", id);
    }
    twk_store_session nb = mk_session("tenB", "sess-b1", 500.0);
    expect(twk_store_session_create(st, &nb), TWK_OK, "session create tenant B");

    twk_store_session g;
    expect(twk_store_session_get(st, "tenA", "sess-1", &g), TWK_OK, "session get");
    check(!strcmp(g.id, "sess-1") && !strcmp(g.tenant, "tenA") && !strcmp(g.sdk_version, "0.7.1") &&
              !strcmp(g.tags_json, "[\"x\",\"y\"]") && !strcmp(g.user_metadata_json, "{\"k\":\"v\"}") &&
              g.created == 100.0 && g.last_heartbeat == 100.0 && !g.finished,
          "session fields round trip");
    twk_store_session_clear(&g);
    check(g.tags_json == NULL && g.user_metadata_json == NULL, "session clear nulls the owned strings");
    expect(twk_store_session_get(st, "tenA", "sess-2", &g), TWK_OK, "session get (no tags/metadata given)");
    check(!strcmp(g.tags_json, "[]") && !strcmp(g.user_metadata_json, "{}"), "defaults [] and {} (%s %s)",
          g.tags_json, g.user_metadata_json);
    twk_store_session_clear(&g);

    /* tenant isolation */
    expect(twk_store_session_get(st, "tenB", "sess-1", &g), TWK_ERR_NOT_FOUND, "session get by tenant B");
    check(g.tags_json == NULL && g.id[0] == 0, "failed get leaves nothing to free");
    char other_msg[1024];
    snprintf(other_msg, sizeof other_msg, "%s", twk_last_error());
    twk_store_session_get(st, "tenA", "nope", &g);
    check(!strcmp(other_msg, "store: session get: session 'sess-1' not found") &&
              !strcmp(twk_last_error(), "store: session get: session 'nope' not found"),
          "other tenant's row and an absent one read the same");
    expect(twk_store_session_heartbeat(st, "tenB", "sess-1", 999.0), TWK_ERR_NOT_FOUND, "heartbeat by tenant B");
    expect(twk_store_session_finish(st, "tenB", "sess-1"), TWK_ERR_NOT_FOUND, "finish by tenant B");
    twk_store_session_get(st, "tenA", "sess-1", &g);
    check(g.last_heartbeat == 100.0 && !g.finished, "tenant B changed nothing");
    twk_store_session_clear(&g);

    expect(twk_store_session_heartbeat(st, "tenA", "sess-1", 250.5), TWK_OK, "heartbeat");
    expect(twk_store_session_finish(st, "tenA", "sess-1"), TWK_OK, "finish");
    expect(twk_store_session_heartbeat(st, "tenA", "missing", 1.0), TWK_ERR_NOT_FOUND, "heartbeat absent");
    twk_store_session_get(st, "tenA", "sess-1", &g);
    check(g.last_heartbeat == 250.5 && g.finished == 1, "heartbeat and finish stored");
    twk_store_session_clear(&g);

    /* list: created desc, then id asc */
    const char *want[] = {"sess-7", "sess-6", "sess-5", "sess-3", "sess-4", "sess-2", "sess-1"};
    char **ids = NULL;
    int n = 0, total = 0;
    expect(twk_store_session_list(st, "tenA", 100, 0, &ids, &n, &total), TWK_OK, "session list");
    int order_ok = n == 7 && total == 7;
    for (int i = 0; order_ok && i < n; i++) order_ok = !strcmp(ids[i], want[i]);
    check(order_ok, "session list newest first, ties by id (n=%d total=%d)", n, total);
    for (int i = 0; i < n; i++) twk_host_free(ids[i]);
    twk_host_free(ids);
    expect(twk_store_session_list(st, "tenA", 3, 5, &ids, &n, &total), TWK_OK, "session list limit 3 offset 5");
    check(n == 2 && total == 7 && !strcmp(ids[0], "sess-2") && !strcmp(ids[1], "sess-1"),
          "second page: n=%d total=%d", n, total);
    for (int i = 0; i < n; i++) twk_host_free(ids[i]);
    twk_host_free(ids);
    expect(twk_store_session_list(st, "tenB", 100, 0, &ids, &n, &total), TWK_OK, "session list tenant B");
    check(n == 1 && total == 1 && !strcmp(ids[0], "sess-b1"), "tenant B sees only its session");
    for (int i = 0; i < n; i++) twk_host_free(ids[i]);
    twk_host_free(ids);
    expect(twk_store_session_list(st, "tenC", 100, 0, &ids, &n, &total), TWK_OK, "session list unknown tenant");
    check(n == 0 && total == 0 && ids == NULL, "empty list: n=0 total=0 ids=NULL");

    /* refused input */
    twk_store_session bad = mk_session("tenA", "x", 1.0);
    memset(bad.id, 'a', sizeof bad.id); /* no terminator inside the field */
    expect(twk_store_session_create(st, &bad), TWK_ERR_INVALID_ARG, "session id of 96 bytes");
    bad = mk_session("tenA", "x", 1.0);
    memset(bad.tenant, 't', sizeof bad.tenant);
    expect(twk_store_session_create(st, &bad), TWK_ERR_INVALID_ARG, "tenant of 64 bytes");
    bad = mk_session("tenA", "x", 1.0);
    memset(bad.sdk_version, 'v', sizeof bad.sdk_version);
    expect(twk_store_session_create(st, &bad), TWK_ERR_INVALID_ARG, "sdk_version of 32 bytes");
    bad = mk_session("tenA", "", 1.0);
    expect(twk_store_session_create(st, &bad), TWK_ERR_INVALID_ARG, "empty session id");
    bad = mk_session("tenA", "x", 1.0);
    bad.tags_json = "{\"not\":\"array\"}";
    expect(twk_store_session_create(st, &bad), TWK_ERR_INVALID_ARG, "tags not an array");
    bad.tags_json = NULL;
    bad.user_metadata_json = "{broken";
    expect(twk_store_session_create(st, &bad), TWK_ERR_INVALID_ARG, "user_metadata not JSON");
    bad.user_metadata_json = NULL;
    bad.created = NAN;
    expect(twk_store_session_create(st, &bad), TWK_ERR_INVALID_ARG, "created NaN");
    expect(twk_store_session_get(st, "tenA", "x", &g), TWK_ERR_NOT_FOUND, "no refused session was stored");
    twk_store_session ok95 = mk_session("tenA", "", 90.0);
    memset(ok95.id, 'z', sizeof ok95.id - 1);
    expect(twk_store_session_create(st, &ok95), TWK_OK, "session id of 95 bytes (fits)");
    expect(twk_store_session_get(st, "tenA", ok95.id, &g), TWK_OK, "get it back");
    check(strlen(g.id) == 95, "95-byte id round trip");
    twk_store_session_clear(&g);

    /* hostile text is data, not SQL */
    twk_store_session inj = mk_session("tenA' OR '1'='1", "x'); DROP TABLE sessions; --", 1.0);
    expect(twk_store_session_create(st, &inj), TWK_OK, "session with SQL in id and tenant");
    expect(twk_store_session_get(st, "tenA' OR '1'='1", "x'); DROP TABLE sessions; --", &g), TWK_OK,
           "get it back verbatim");
    twk_store_session_clear(&g);
    expect(twk_store_session_list(st, "tenA' OR '1'='1", 100, 0, &ids, &n, &total), TWK_OK, "list that tenant");
    check(total == 1, "the quoted tenant sees one session, total=%d", total);
    for (int i = 0; i < n; i++) twk_host_free(ids[i]);
    twk_host_free(ids);
}

/* ---- runs --------------------------------------------------------------- */

static twk_store_run mk_run(const char *tenant, const char *id, const char *session, double created) {
    twk_store_run r;
    memset(&r, 0, sizeof r);
    COPY(r.id, id);
    COPY(r.tenant, tenant);
    COPY(r.session_id, session);
    COPY(r.base_model, "Qwen/Qwen3-0.6B");
    r.is_lora = 1;
    r.lora_rank = 32;
    r.train_attn = 1;
    r.train_mlp = 1;
    r.train_unembed = 0;
    r.seed = -1234567890123LL;
    r.created = created;
    r.last_request = created;
    return r;
}

static void test_runs(twk_store *st) {
    /* 25 runs of tenant A: even in sess-1, odd in sess-2; created = 1000 + i */
    for (int i = 0; i < 25; i++) {
        char id[32];
        snprintf(id, sizeof id, "run-%02d", i);
        twk_store_run r = mk_run("tenA", id, i % 2 ? "sess-2" : "sess-1", 1000.0 + i);
        if (i == 3) r.user_metadata_json = "{\"name\":\"three\",\"n\":[1,2]}";
        if (twk_store_run_create(st, &r) != TWK_OK) check(0, "run create %s", id);
    }
    twk_store_run rb = mk_run("tenB", "run-b", "sess-b1", 5000.0);
    expect(twk_store_run_create(st, &rb), TWK_OK, "run create tenant B");
    twk_store_run dup = mk_run("tenA", "run-03", "sess-1", 1.0);
    expect(twk_store_run_create(st, &dup), TWK_ERR_STATE, "run create duplicate");

    twk_store_run g;
    expect(twk_store_run_get(st, "tenA", "run-03", &g), TWK_OK, "run get");
    check(!strcmp(g.id, "run-03") && !strcmp(g.tenant, "tenA") && !strcmp(g.session_id, "sess-2") &&
              !strcmp(g.base_model, "Qwen/Qwen3-0.6B") && g.is_lora == 1 && g.lora_rank == 32 && g.train_attn == 1 &&
              g.train_mlp == 1 && g.train_unembed == 0 && g.seed == -1234567890123LL &&
              !strcmp(g.user_metadata_json, "{\"name\":\"three\",\"n\":[1,2]}") && g.created == 1003.0 &&
              g.last_request == 1003.0,
          "run fields round trip");
    twk_store_run_clear(&g);
    expect(twk_store_run_get(st, "tenA", "run-04", &g), TWK_OK, "run get (no metadata given)");
    check(!strcmp(g.user_metadata_json, "{}"), "metadata defaults to {}");
    twk_store_run_clear(&g);
    expect(twk_store_run_get(st, "tenB", "run-03", &g), TWK_ERR_NOT_FOUND, "run get by tenant B");
    expect(twk_store_run_get(st, "tenA", "run-b", &g), TWK_ERR_NOT_FOUND, "run get of B's run by A");

    expect(twk_store_run_touch(st, "run-03", 2000.25), TWK_OK, "run touch");
    expect(twk_store_run_touch(st, "no-such-run", 1.0), TWK_ERR_NOT_FOUND, "run touch absent");
    twk_store_run_get(st, "tenA", "run-03", &g);
    check(g.last_request == 2000.25 && g.created == 1003.0, "touch sets last_request only");
    twk_store_run_clear(&g);

    /* pagination */
    int seen[25] = {0}, pages_ok = 1, expect_next = 24;
    for (int off = 0; off < 30; off += 10) {
        twk_store_run *runs = NULL;
        int n = 0, total = 0;
        if (twk_store_run_list(st, "tenA", NULL, 10, off, &runs, &n, &total) != TWK_OK) pages_ok = 0;
        if (total != 25 || n != (off < 20 ? 10 : 5)) pages_ok = 0;
        for (int i = 0; i < n; i++) {
            int idx = atoi(runs[i].id + 4);
            if (idx != expect_next-- || strcmp(runs[i].tenant, "tenA")) pages_ok = 0;
            if (idx >= 0 && idx < 25) seen[idx]++;
            twk_store_run_clear(&runs[i]);
        }
        twk_host_free(runs);
    }
    for (int i = 0; i < 25; i++) pages_ok &= seen[i] == 1;
    check(pages_ok, "run list: 3 pages of limit 10 = 10+10+5, newest first, each run once, total 25");

    twk_store_run *runs = NULL;
    int n = 0, total = 0;
    expect(twk_store_run_list(st, "tenA", "sess-1", 1000, 0, &runs, &n, &total), TWK_OK, "run list of sess-1");
    int sess_ok = n == 13 && total == 13;
    for (int i = 0; sess_ok && i < n; i++) sess_ok = !strcmp(runs[i].session_id, "sess-1");
    check(sess_ok, "sess-1 has the 13 even runs (n=%d total=%d)", n, total);
    for (int i = 0; i < n; i++) twk_store_run_clear(&runs[i]);
    twk_host_free(runs);

    expect(twk_store_run_list(st, "tenB", NULL, 100, 0, &runs, &n, &total), TWK_OK, "run list tenant B");
    check(n == 1 && total == 1 && !strcmp(runs[0].id, "run-b"), "tenant B sees only run-b");
    for (int i = 0; i < n; i++) twk_store_run_clear(&runs[i]);
    twk_host_free(runs);
    expect(twk_store_run_list(st, "tenB", "sess-1", 100, 0, &runs, &n, &total), TWK_OK,
           "run list tenant B, A's session id");
    check(n == 0 && total == 0 && runs == NULL, "nothing of A's session");

    expect(twk_store_run_list(st, "tenA", NULL, 0, 0, &runs, &n, &total), TWK_OK, "run list limit 0");
    check(n == 1 && total == 25 && !strcmp(runs[0].id, "run-24"), "limit 0 clamps to 1 (n=%d)", n);
    for (int i = 0; i < n; i++) twk_store_run_clear(&runs[i]);
    twk_host_free(runs);
    expect(twk_store_run_list(st, "tenA", NULL, 5000, 0, &runs, &n, &total), TWK_OK, "run list limit 5000");
    check(n == 25 && total == 25, "limit 5000 clamps to 1000 (all 25 here)");
    for (int i = 0; i < n; i++) twk_store_run_clear(&runs[i]);
    twk_host_free(runs);
    expect(twk_store_run_list(st, "tenA", NULL, 10, 40, &runs, &n, &total), TWK_OK, "run list offset past the end");
    check(n == 0 && total == 25 && runs == NULL, "offset past the end: n=0, total still 25");
    expect(twk_store_run_list(st, "tenA", NULL, 10, -1, &runs, &n, &total), TWK_ERR_INVALID_ARG,
           "run list offset -1");

    twk_store_run bad = mk_run("tenA", "run-bad", "sess-1", 1.0);
    memset(bad.base_model, 'm', sizeof bad.base_model);
    expect(twk_store_run_create(st, &bad), TWK_ERR_INVALID_ARG, "base_model of 128 bytes");
    bad = mk_run("tenA", "run-bad", "sess-1", 1.0);
    memset(bad.id, 'r', sizeof bad.id);
    expect(twk_store_run_create(st, &bad), TWK_ERR_INVALID_ARG, "run id of 128 bytes");
    bad = mk_run("tenA", "run-bad", "sess-1", 1.0);
    memset(bad.session_id, 's', sizeof bad.session_id);
    expect(twk_store_run_create(st, &bad), TWK_ERR_INVALID_ARG, "run session_id of 96 bytes");
    bad = mk_run("tenA", "run-bad", "sess-1", 1.0);
    bad.user_metadata_json = "[1,2]";
    expect(twk_store_run_create(st, &bad), TWK_ERR_INVALID_ARG, "run user_metadata not an object");
    expect(twk_store_run_get(st, "tenA", "run-bad", &g), TWK_ERR_NOT_FOUND, "no refused run was stored");
}

/* ---- checkpoints -------------------------------------------------------- */

static twk_store_ckpt mk_ckpt(const char *tenant, const char *run, const char *name, double created) {
    twk_store_ckpt c;
    memset(&c, 0, sizeof c);
    COPY(c.run_id, run);
    COPY(c.checkpoint_id, name);
    COPY(c.tenant, tenant);
    snprintf(c.path, sizeof c.path, "/data/ckpt/%s/%s", run, name);
    c.size_bytes = 123456789012LL;
    c.created = created;
    return c;
}

static int ckpt_eq(const twk_store_ckpt *a, const twk_store_ckpt *b) {
    return !strcmp(a->run_id, b->run_id) && !strcmp(a->checkpoint_id, b->checkpoint_id) &&
           !strcmp(a->tenant, b->tenant) && !strcmp(a->path, b->path) && a->size_bytes == b->size_bytes &&
           a->created == b->created && a->expires_at == b->expires_at && a->is_public == b->is_public;
}

static void test_ckpts(twk_store *st) {
    twk_store_ckpt c1 = mk_ckpt("tenA", "run-01", "weights/step-1", 3000.0);
    expect(twk_store_ckpt_create(st, &c1), TWK_OK, "checkpoint create");
    expect(twk_store_ckpt_create(st, &c1), TWK_ERR_STATE, "checkpoint create duplicate");
    twk_store_ckpt c1b = mk_ckpt("tenB", "run-01", "weights/step-1", 3000.0);
    expect(twk_store_ckpt_create(st, &c1b), TWK_ERR_STATE, "checkpoint create duplicate, other tenant");
    for (int i = 2; i <= 12; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s/step-%d", i % 2 ? "sampler_weights" : "weights", i);
        twk_store_ckpt c = mk_ckpt("tenA", i <= 8 ? "run-01" : "run-02", name, 3000.0 + i);
        if (twk_store_ckpt_create(st, &c) != TWK_OK) check(0, "checkpoint create %s", name);
    }
    twk_store_ckpt cb = mk_ckpt("tenB", "run-b", "weights/b", 9000.0);
    expect(twk_store_ckpt_create(st, &cb), TWK_OK, "checkpoint create tenant B");

    twk_store_ckpt g;
    expect(twk_store_ckpt_get(st, "tenA", "run-01", "weights/step-1", &g), TWK_OK, "checkpoint get");
    check(ckpt_eq(&g, &c1), "checkpoint fields round trip (size %lld path %s)", (long long)g.size_bytes, g.path);

    /* upsert */
    twk_store_ckpt up = c1;
    up.size_bytes = 42;
    up.created = 3500.0;
    COPY(up.path, "/data/ckpt/run-01/weights/step-1.v2");
    expect(twk_store_ckpt_upsert(st, &up), TWK_OK, "checkpoint upsert over existing");
    twk_store_ckpt_get(st, "tenA", "run-01", "weights/step-1", &g);
    check(ckpt_eq(&g, &up), "upsert replaced the row (size %lld)", (long long)g.size_bytes);
    twk_store_ckpt fresh = mk_ckpt("tenA", "run-02", "weights/fresh", 2000.0);
    expect(twk_store_ckpt_upsert(st, &fresh), TWK_OK, "checkpoint upsert new");
    expect(twk_store_ckpt_get(st, "tenA", "run-02", "weights/fresh", &g), TWK_OK, "get the upserted one");
    check(ckpt_eq(&g, &fresh), "upsert inserted the row");
    twk_store_ckpt steal = up;
    COPY(steal.tenant, "tenB");
    steal.size_bytes = 1;
    expect(twk_store_ckpt_upsert(st, &steal), TWK_ERR_NOT_FOUND, "upsert by tenant B onto A's row");
    twk_store_ckpt_get(st, "tenA", "run-01", "weights/step-1", &g);
    check(ckpt_eq(&g, &up), "A's row unchanged after B's upsert");

    /* ttl / public */
    expect(twk_store_ckpt_set_ttl(st, "tenA", "run-01", "weights/step-1", 86400.0 + 3500), TWK_OK, "set ttl");
    expect(twk_store_ckpt_set_public(st, "tenA", "run-01", "weights/step-1", 7), TWK_OK, "set public");
    twk_store_ckpt_get(st, "tenA", "run-01", "weights/step-1", &g);
    check(g.expires_at == 86400.0 + 3500 && g.is_public == 1, "ttl and public stored (is_public=%d)", g.is_public);
    expect(twk_store_ckpt_set_ttl(st, "tenA", "run-01", "weights/step-1", -5), TWK_ERR_INVALID_ARG,
           "negative expires_at");
    expect(twk_store_ckpt_set_ttl(st, "tenA", "run-01", "weights/nope", 1), TWK_ERR_NOT_FOUND, "set ttl absent");

    /* isolation */
    expect(twk_store_ckpt_get(st, "tenB", "run-01", "weights/step-1", &g), TWK_ERR_NOT_FOUND, "get by tenant B");
    expect(twk_store_ckpt_set_ttl(st, "tenB", "run-01", "weights/step-1", 0), TWK_ERR_NOT_FOUND,
           "set ttl by tenant B");
    expect(twk_store_ckpt_set_public(st, "tenB", "run-01", "weights/step-1", 0), TWK_ERR_NOT_FOUND,
           "set public by tenant B");
    expect(twk_store_ckpt_delete(st, "tenB", "run-01", "weights/step-1"), TWK_ERR_NOT_FOUND, "delete by tenant B");
    expect(twk_store_ckpt_get(st, "tenA", "run-01", "weights/step-1", &g), TWK_OK, "A's checkpoint still there");
    check(g.expires_at == 86400.0 + 3500 && g.is_public == 1, "tenant B changed nothing");

    /* lists */
    twk_store_ckpt *cs = NULL;
    int n = 0, total = 0;
    expect(twk_store_ckpt_list(st, "tenA", "run-01", 100, 0, &cs, &n, &total), TWK_OK, "checkpoint list of run-01");
    int ok = n == 8 && total == 8 && !strcmp(cs[0].checkpoint_id, "weights/step-1") && cs[0].created == 3500.0;
    for (int i = 0; ok && i < n; i++) ok = !strcmp(cs[i].run_id, "run-01") && (i == 0 || cs[i].created <= cs[i - 1].created);
    check(ok, "run-01: 8 checkpoints newest first (n=%d total=%d)", n, total);
    twk_host_free(cs);
    expect(twk_store_ckpt_list(st, "tenA", NULL, 5, 0, &cs, &n, &total), TWK_OK, "checkpoint list tenant-wide");
    check(n == 5 && total == 13 && !strcmp(cs[0].checkpoint_id, "weights/step-1") &&
              !strcmp(cs[1].checkpoint_id, "weights/step-12"),
          "tenant-wide: 5 of 13, newest first (first %s)", n ? cs[0].checkpoint_id : "-");
    twk_host_free(cs);
    expect(twk_store_ckpt_list(st, "tenA", NULL, 5, 10, &cs, &n, &total), TWK_OK, "checkpoint list last page");
    check(n == 3 && total == 13 && !strcmp(cs[2].checkpoint_id, "weights/fresh"), "last page 3 of 13, oldest last");
    twk_host_free(cs);
    expect(twk_store_ckpt_list(st, "tenB", NULL, 100, 0, &cs, &n, &total), TWK_OK, "checkpoint list tenant B");
    check(n == 1 && total == 1 && !strcmp(cs[0].run_id, "run-b"), "tenant B sees only its checkpoint");
    twk_host_free(cs);
    expect(twk_store_ckpt_list(st, "tenB", "run-01", 100, 0, &cs, &n, &total), TWK_OK,
           "checkpoint list tenant B, A's run");
    check(n == 0 && total == 0 && cs == NULL, "nothing of A's run");

    /* delete */
    expect(twk_store_ckpt_delete(st, "tenA", "run-02", "weights/fresh"), TWK_OK, "checkpoint delete");
    expect(twk_store_ckpt_delete(st, "tenA", "run-02", "weights/fresh"), TWK_ERR_NOT_FOUND, "delete again");
    expect(twk_store_ckpt_get(st, "tenA", "run-02", "weights/fresh", &g), TWK_ERR_NOT_FOUND, "deleted is gone");

    /* refused input */
    twk_store_ckpt bad = mk_ckpt("tenA", "run-01", "weights/x", 1.0);
    memset(bad.checkpoint_id, 'c', sizeof bad.checkpoint_id);
    expect(twk_store_ckpt_create(st, &bad), TWK_ERR_INVALID_ARG, "checkpoint_id of 200 bytes");
    bad = mk_ckpt("tenA", "run-01", "weights/x", 1.0);
    memset(bad.path, 'p', sizeof bad.path);
    expect(twk_store_ckpt_create(st, &bad), TWK_ERR_INVALID_ARG, "path of 1024 bytes");
    expect(twk_store_ckpt_upsert(st, &bad), TWK_ERR_INVALID_ARG, "upsert with path of 1024 bytes");
    bad = mk_ckpt("tenA", "run-01", "weights/x", 1.0);
    memset(bad.run_id, 'r', sizeof bad.run_id);
    expect(twk_store_ckpt_create(st, &bad), TWK_ERR_INVALID_ARG, "checkpoint run_id of 128 bytes");
    bad = mk_ckpt("tenA", "run-01", "weights/x", 1.0);
    bad.size_bytes = -1;
    expect(twk_store_ckpt_create(st, &bad), TWK_ERR_INVALID_ARG, "negative size");
    expect(twk_store_ckpt_get(st, "tenA", "run-01", "weights/x", &g), TWK_ERR_NOT_FOUND,
           "no refused checkpoint was stored");
}

/* After close + reopen, everything is still there. */
static void test_reopen(const char *dir) {
    twk_store *st = NULL;
    if (!expect(twk_store_open(dir, &st), TWK_OK, "reopen")) return;
    char **ids = NULL;
    twk_store_run *runs = NULL;
    twk_store_ckpt *cs = NULL;
    int n = 0, total = 0;
    twk_store_session_list(st, "tenA", 1000, 0, &ids, &n, &total);
    check(total == 8, "reopen: tenant A's 8 sessions (total=%d)", total);
    for (int i = 0; i < n; i++) twk_host_free(ids[i]);
    twk_host_free(ids);
    twk_store_session g;
    twk_store_session_get(st, "tenA", "sess-1", &g);
    check(g.finished == 1 && g.last_heartbeat == 250.5 && g.tags_json && !strcmp(g.tags_json, "[\"x\",\"y\"]"),
          "reopen: session sess-1 with its updates");
    twk_store_session_clear(&g);
    twk_store_run_list(st, "tenA", NULL, 1000, 0, &runs, &n, &total);
    check(total == 25 && n == 25, "reopen: 25 runs");
    for (int i = 0; i < n; i++) twk_store_run_clear(&runs[i]);
    twk_host_free(runs);
    twk_store_run r;
    twk_store_run_get(st, "tenA", "run-03", &r);
    check(r.last_request == 2000.25 && r.user_metadata_json &&
              !strcmp(r.user_metadata_json, "{\"name\":\"three\",\"n\":[1,2]}"),
          "reopen: run-03 with its metadata and touch");
    twk_store_run_clear(&r);
    twk_store_ckpt_list(st, "tenA", NULL, 1000, 0, &cs, &n, &total);
    check(total == 12, "reopen: 12 checkpoints of tenant A (total=%d)", total);
    twk_host_free(cs);
    twk_store_ckpt c;
    twk_store_ckpt_get(st, "tenA", "run-01", "weights/step-1", &c);
    check(c.size_bytes == 42 && c.is_public == 1 && c.expires_at == 86400.0 + 3500, "reopen: upserted checkpoint");
    twk_store_close(st);
}

/* ---- per-step metrics (run_steps) --------------------------------------- */

static twk_store_step mk_step(const char *tenant, const char *run, int kind, int64_t seq, const char *metrics) {
    twk_store_step r;
    memset(&r, 0, sizeof r);
    COPY(r.run_id, run);
    COPY(r.tenant, tenant);
    r.kind = kind;
    r.seq = seq;
    r.step = seq / 2;
    r.time = 1000.0 + (double)seq;
    r.metrics_json = (char *)metrics;
    return r;
}

/* The seqs of a run's rows of one kind, in order; -1 on a store error. */
static int list_seqs(twk_store *st, const char *tenant, const char *run, int kind, int64_t *seqs, int cap) {
    twk_store_step *rows = NULL;
    int n = 0, k = 0;
    if (twk_store_steps_list(st, tenant, run, &rows, &n) != TWK_OK) return -1;
    for (int i = 0; i < n; i++)
        if (rows[i].kind == kind && k < cap) seqs[k++] = rows[i].seq;
    twk_store_steps_free(rows, n);
    return k;
}

/* The reference of thinning: past cap, drop every second entry (1-based even ranks) but the last,
 * until at most cap are left. */
static void ref_thin(int64_t *v, int *n, int cap) {
    while (*n > cap) {
        int k = 0;
        for (int i = 0; i < *n; i++)
            if ((i + 1) % 2 == 1 || i == *n - 1) v[k++] = v[i];
        *n = k;
    }
}

static void test_steps(const char *root) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/steps", root);
    twk_store *st = NULL;
    if (!expect(twk_store_open(dir, &st), TWK_OK, "steps: open")) return;
    twk_store_run ra = mk_run("tenA", "run-a", "sess-a", 10.0), rb = mk_run("tenB", "run-b", "sess-b", 20.0);
    expect(twk_store_run_create(st, &ra), TWK_OK, "steps: run A");
    expect(twk_store_run_create(st, &rb), TWK_OK, "steps: run B");

    /* rows round trip, per tenant */
    twk_store_step rows[64];
    char metrics[64][64];
    for (int i = 0; i < 10; i++) {
        snprintf(metrics[i], sizeof metrics[i], "{\"loss:sum\":%d.5,\"x\":null}", i);
        rows[i] = mk_step("tenA", "run-a", TWK_STEP_FORWARD_BACKWARD, 2 * i, metrics[i]);
    }
    rows[10] = mk_step("tenA", "run-a", TWK_STEP_OPTIM, 1, "{\"learning_rate\":0.01}");
    rows[11] = mk_step("tenB", "run-b", TWK_STEP_FORWARD, 0, "{}");
    int failed = -1;
    expect(twk_store_steps_add(st, rows, 12, 100, &failed), TWK_OK, "steps: add 12 rows");
    check(failed == 0, "steps: none failed (%d)", failed);
    twk_store_step *got = NULL;
    int n = 0;
    expect(twk_store_steps_list(st, "tenA", "run-a", &got, &n), TWK_OK, "steps: list tenant A's run");
    int same = n == 11;
    for (int i = 0; same && i < 10; i++)
        same = got[i].kind == TWK_STEP_FORWARD_BACKWARD && got[i].seq == 2 * i && got[i].step == i &&
               got[i].time == 1000.0 + 2 * i && !strcmp(got[i].metrics_json, metrics[i]) && !strcmp(got[i].tenant, "tenA");
    same = same && got[10].kind == TWK_STEP_OPTIM && !strcmp(got[10].metrics_json, "{\"learning_rate\":0.01}");
    check(same, "steps: 11 rows back by kind then seq, fields equal (%d)", n);
    twk_store_steps_free(got, n);
    expect(twk_store_steps_list(st, "tenB", "run-a", &got, &n), TWK_OK, "steps: tenant B lists tenant A's run");
    check(n == 0 && !got, "steps: another tenant's rows are absent (%d)", n);
    expect(twk_store_steps_list(st, NULL, "run-a", &got, &n), TWK_OK, "steps: admin lists tenant A's run");
    check(n == 11, "steps: the admin view sees them (%d)", n);
    twk_store_steps_free(got, n);

    /* bad rows are skipped, the rest committed */
    twk_store_step bad[4] = {mk_step("tenA", "no-such-run", TWK_STEP_OPTIM, 1, "{}"),
                             mk_step("tenA", "run-a", TWK_STEP_OPTIM, 3, "[1]"),
                             mk_step("tenA", "run-a", 7, 5, "{}"),
                             mk_step("tenA", "run-a", TWK_STEP_OPTIM, 7, "{\"learning_rate\":0.02}")};
    twk_status bst = twk_store_steps_add(st, bad, 4, 100, &failed);
    check(bst != TWK_OK && failed == 3, "steps: a run not in runs, non-object metrics, a bad kind refused (%d: %s)",
          failed, twk_last_error());
    int64_t seqs[256];
    int k = list_seqs(st, "tenA", "run-a", TWK_STEP_OPTIM, seqs, 256);
    check(k == 2 && seqs[1] == 7, "steps: the good row of that batch is stored (%d)", k);

    /* thinning: one row at a time, and batches, against the reference */
    int64_t ref[256];
    int nref = 0, ok_all = 1;
    const int cap = 8;
    for (int i = 0; i < 70; i++) {
        twk_store_step r = mk_step("tenB", "run-b", TWK_STEP_FORWARD_BACKWARD, 100 + i, "{\"loss:sum\":1}");
        if (twk_store_steps_add(st, &r, 1, cap, &failed) != TWK_OK) ok_all = 0;
        ref[nref++] = 100 + i;
        ref_thin(ref, &nref, cap);
        k = list_seqs(st, "tenB", "run-b", TWK_STEP_FORWARD_BACKWARD, seqs, 256);
        int eq = k == nref;
        for (int j = 0; eq && j < k; j++) eq = seqs[j] == ref[j];
        if (!eq) ok_all = 0;
    }
    check(ok_all && nref <= cap && ref[0] == 100 && ref[nref - 1] == 169,
          "steps: 70 rows one by one with cap %d keep the reference's %d rows, first and newest", cap, nref);
    for (int i = 0; i < 40; i++) rows[i] = mk_step("tenB", "run-b", TWK_STEP_FORWARD_BACKWARD, 200 + i, "{}");
    expect(twk_store_steps_add(st, rows, 40, cap, &failed), TWK_OK, "steps: add a batch of 40");
    for (int i = 0; i < 40; i++) ref[nref++] = 200 + i;
    ref_thin(ref, &nref, cap);
    k = list_seqs(st, "tenB", "run-b", TWK_STEP_FORWARD_BACKWARD, seqs, 256);
    int eq = k == nref;
    for (int j = 0; eq && j < k; j++) eq = seqs[j] == ref[j];
    check(eq && k <= cap && seqs[k - 1] == 239, "steps: a batch past the cap thins to the reference (%d rows)", k);
    k = list_seqs(st, "tenB", "run-b", TWK_STEP_FORWARD, seqs, 256);
    check(k == 1, "steps: thinning leaves the run's other kinds alone (%d)", k);
    expect(twk_store_steps_add(st, rows, 1, 1, &failed), TWK_ERR_INVALID_ARG, "steps: cap 1 refused");

    /* the admin's lists; a tenant list never reads NULL as "all" */
    twk_store_run *runs = NULL;
    int total = 0;
    expect(twk_store_run_list_all(st, 10, 0, &runs, &n, &total), TWK_OK, "steps: run list, all tenants");
    check(n == 2 && total == 2 && !strcmp(runs[0].id, "run-b") && !strcmp(runs[1].id, "run-a"),
          "steps: both tenants' runs, newest first");
    for (int i = 0; i < n; i++) twk_store_run_clear(&runs[i]);
    twk_host_free(runs);
    expect(twk_store_run_list(st, NULL, NULL, 10, 0, &runs, &n, &total), TWK_ERR_INVALID_ARG,
           "steps: run list with a NULL tenant refused");
    twk_store_ckpt ca = mk_ckpt("tenA", "run-a", "weights/x", 30.0), cb = mk_ckpt("tenB", "run-b", "weights/y", 40.0);
    twk_store_ckpt_create(st, &ca);
    twk_store_ckpt_create(st, &cb);
    twk_store_ckpt *cs = NULL;
    expect(twk_store_ckpt_list_all(st, 10, 0, &cs, &n, &total), TWK_OK, "steps: checkpoint list, all tenants");
    check(n == 2 && !strcmp(cs[0].tenant, "tenB") && !strcmp(cs[1].tenant, "tenA"), "steps: both tenants' checkpoints");
    twk_host_free(cs);
    expect(twk_store_ckpt_list(st, "tenA", NULL, 10, 0, &cs, &n, &total), TWK_OK, "steps: checkpoint list, tenant A");
    check(n == 1 && total == 1, "steps: tenant A's one checkpoint only");
    twk_host_free(cs);
    twk_store_close(st);

    /* a run's rows go with the run's row */
    char db_path[600];
    snprintf(db_path, sizeof db_path, "%s/twinkle.db", dir);
    sqlite3 *db = NULL;
    int rc = sqlite3_open(db_path, &db);
    if (rc == SQLITE_OK) rc = sqlite3_exec(db, "PRAGMA foreign_keys=ON; DELETE FROM runs WHERE id = 'run-a'", NULL, NULL, NULL);
    sqlite3_close(db);
    check(rc == SQLITE_OK, "steps: run-a's row deleted");
    if (!expect(twk_store_open(dir, &st), TWK_OK, "steps: reopen")) return;
    expect(twk_store_steps_list(st, NULL, "run-a", &got, &n), TWK_OK, "steps: list the deleted run");
    check(n == 0, "steps: the deleted run's rows are gone (%d)", n);
    k = list_seqs(st, NULL, "run-b", TWK_STEP_FORWARD_BACKWARD, seqs, 256);
    check(k == nref, "steps: the other run's rows stay (%d)", k);
    twk_store_close(st);
}

/* ---- injected allocation failures --------------------------------------- */

static int alloc_countdown = -1; /* fail when it reaches 0; -1 = never */

static void *failing_alloc(void *user, size_t bytes, size_t align) {
    (void)user;
    if (alloc_countdown == 0) return NULL;
    if (alloc_countdown > 0) alloc_countdown--;
    void *p = NULL;
    if (posix_memalign(&p, align, bytes ? (bytes + align - 1) / align * align : align) != 0) return NULL;
    return p;
}

static void failing_free(void *user, void *p) {
    (void)user;
    free(p);
}

static void test_oom(const char *dir) {
    twk_store *st = NULL;
    if (!expect(twk_store_open(dir, &st), TWK_OK, "open for allocation failures")) return;
    twk_allocator a = {failing_alloc, failing_free, NULL};
    twk_set_allocator(&a);
    int ok = 1, fails_seen = 0;
    for (int op = 0; op < 4; op++) {
        for (int k = 0; k < 100; k++) {
            alloc_countdown = k;
            twk_status s;
            int n = 0, total = 0;
            if (op == 0) {
                twk_store_session g;
                s = twk_store_session_get(st, "tenA", "sess-1", &g);
                twk_store_session_clear(&g);
            } else if (op == 1) {
                char **ids = NULL;
                s = twk_store_session_list(st, "tenA", 1000, 0, &ids, &n, &total);
                for (int i = 0; i < n; i++) twk_host_free(ids[i]);
                twk_host_free(ids);
                if (s != TWK_OK && (ids || n)) ok = 0;
            } else if (op == 2) {
                twk_store_run *runs = NULL;
                s = twk_store_run_list(st, "tenA", NULL, 1000, 0, &runs, &n, &total);
                for (int i = 0; i < n; i++) twk_store_run_clear(&runs[i]);
                twk_host_free(runs);
                if (s != TWK_OK && (runs || n)) ok = 0;
            } else {
                twk_store_ckpt *cs = NULL;
                s = twk_store_ckpt_list(st, "tenA", NULL, 1000, 0, &cs, &n, &total);
                twk_host_free(cs);
                if (s != TWK_OK && (cs || n)) ok = 0;
            }
            if (s == TWK_OK) break;
            if (s != TWK_ERR_OOM) ok = 0;
            fails_seen++;
        }
    }
    alloc_countdown = -1;
    twk_set_allocator(NULL);
    check(ok && fails_seen > 30, "every allocation of get/list failed in turn -> oom, nothing returned (%d failures)",
          fails_seen);
    twk_store_close(st);
}

/* ---- schema version ----------------------------------------------------- */

static void test_schema_version(const char *root) {
    char dir[512], db[600];
    snprintf(dir, sizeof dir, "%s/newer", root);
    twk_store *st = NULL;
    if (!expect(twk_store_open(dir, &st), TWK_OK, "open a second store")) return;
    twk_store_close(st);
    snprintf(db, sizeof db, "%s/twinkle.db", dir);
    sqlite3 *h = NULL;
    sqlite3_open(db, &h);
    int rc = sqlite3_exec(h, "UPDATE schema_version SET version = 2", NULL, NULL, NULL);
    sqlite3_close(h);
    check(rc == SQLITE_OK, "bumped the schema version by hand");
    expect(twk_store_open(dir, &st), TWK_ERR_STATE, "open a db of a newer schema");
    check(st == NULL, "no store returned");
    char file[600];
    snprintf(file, sizeof file, "%s/file", root);
    FILE *f = fopen(file, "w");
    if (f) fclose(f);
    expect(twk_store_open(file, &st), TWK_ERR_IO, "open with a file as data dir");
}

/* ---- kill -9 while writing ---------------------------------------------- */

#define CRASH_N 200

static void crash_child(const char *dir, int round, int wfd) {
    twk_store *st = NULL;
    if (twk_store_open(dir, &st) != TWK_OK) _exit(2);
    char run[32];
    snprintf(run, sizeof run, "crash-%d", round);
    for (int i = 0; i < CRASH_N; i++) {
        char name[32];
        snprintf(name, sizeof name, "weights/%d", i);
        twk_store_ckpt c = mk_ckpt("tenC", run, name, 100.0 + i);
        if (twk_store_ckpt_create(st, &c) != TWK_OK) _exit(3);
        int32_t v = i;
        if (write(wfd, &v, sizeof v) != (ssize_t)sizeof v) _exit(4);
    }
    twk_store_close(st);
    _exit(0);
}

static void crash_round(const char *dir, int round, int kill_after) {
    int fds[2];
    if (pipe(fds) != 0) {
        check(0, "pipe: %s", strerror(errno));
        return;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        check(0, "fork: %s", strerror(errno));
        return;
    }
    if (pid == 0) {
        close(fds[0]);
        crash_child(dir, round, fds[1]);
    }
    close(fds[1]);
    unsigned char buf[4 * CRASH_N + 4];
    size_t got = 0;
    double t0 = now_s();
    int killed = 0;
    double kill_ms = 0;
    for (;;) {
        if (!killed && (got / 4 >= (size_t)kill_after || now_s() - t0 >= 0.05)) {
            kill(pid, SIGKILL);
            killed = 1;
            kill_ms = (now_s() - t0) * 1e3;
        }
        struct pollfd p = {fds[0], POLLIN, 0};
        int wait_ms = killed ? 1000 : 1;
        if (poll(&p, 1, wait_ms) < 0 && errno != EINTR) break;
        ssize_t r = read(fds[0], buf + got, sizeof buf - got);
        if (r == 0) break; /* EOF: the child is gone */
        if (r < 0) {
            if (errno == EINTR) continue;
            break;
        }
        got += (size_t)r;
    }
    close(fds[0]);
    int wst = 0;
    waitpid(pid, &wst, 0);
    int by_kill = WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL;
    if (WIFEXITED(wst) && WEXITSTATUS(wst) != 0) check(0, "crash child exited with %d", WEXITSTATUS(wst));
    int reported = (int)(got / 4), seq_ok = 1;
    for (int i = 0; i < reported; i++) {
        int32_t v;
        memcpy(&v, buf + 4 * i, 4);
        if (v != i) seq_ok = 0;
    }

    twk_store *st = NULL;
    if (!expect(twk_store_open(dir, &st), TWK_OK, "reopen after the kill")) return;
    char run[32];
    snprintf(run, sizeof run, "crash-%d", round);
    int present_prefix = 0, missing_reported = 0, present_total = 0;
    for (int i = 0; i < CRASH_N; i++) {
        char name[32];
        snprintf(name, sizeof name, "weights/%d", i);
        twk_store_ckpt c;
        twk_status s = twk_store_ckpt_get(st, "tenC", run, name, &c);
        if (s == TWK_OK) {
            present_total++;
            if (present_prefix == i) present_prefix++;
        } else if (i < reported) {
            missing_reported++;
        }
    }
    twk_store_ckpt *cs = NULL;
    int n = 0, total = 0;
    twk_store_ckpt_list(st, "tenC", run, 1000, 0, &cs, &n, &total);
    twk_host_free(cs);
    twk_store_close(st);

    char db[600];
    snprintf(db, sizeof db, "%s/twinkle.db", dir);
    sqlite3 *h = NULL;
    sqlite3_stmt *q = NULL;
    char integrity[256] = "?";
    if (sqlite3_open_v2(db, &h, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(h, "PRAGMA integrity_check", -1, &q, NULL) == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW)
        snprintf(integrity, sizeof integrity, "%s", (const char *)sqlite3_column_text(q, 0));
    sqlite3_finalize(q);
    sqlite3_close(h);

    /* every reported row is there; at most one more (committed, killed before reporting it) */
    check(seq_ok && missing_reported == 0 && present_total == present_prefix &&
              (present_prefix == reported || present_prefix == reported + 1) && total == present_total,
          "kill -9 round %d (%s at %.1f ms): %d reported committed, %d present, none lost", round,
          by_kill ? "killed" : "had finished when killed", kill_ms, reported, present_total);
    check(!strcmp(integrity, "ok"), "integrity_check after kill -9 round %d: %s", round, integrity);
}

int main(void) {
    check_last_error = 1;
    char root[] = "/tmp/twk_store_test_XXXXXX";
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    char dir[512];
    snprintf(dir, sizeof dir, "%s/data/nested", root);

    twk_store *st = NULL;
    if (!expect(twk_store_open(dir, &st), TWK_OK, "open (creates data/nested)")) return 1;
    struct stat sb;
    memset(&sb, 0, sizeof sb);
    int stat_rc = stat(dir, &sb);
    check(stat_rc == 0 && (sb.st_mode & 0777) == 0700, "data dir created with mode 0700 (%o)",
          (unsigned)(sb.st_mode & 0777));
    test_sessions(st);
    test_runs(st);
    test_ckpts(st);
    twk_store_close(st);
    test_reopen(dir);
    test_oom(dir);
    test_schema_version(root);
    test_steps(root);

    char crash_dir[512];
    snprintf(crash_dir, sizeof crash_dir, "%s/crash", root);
    const int kill_after[] = {1, 37, 120, 1 << 30};
    for (int r = 0; r < 4; r++) crash_round(crash_dir, r, kill_after[r]);

    nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    stat_rc = stat(root, &sb);
    check(stat_rc != 0, "removed %s", root);
    printf("%s (%d failures)\n", check_failures ? "FAIL" : "all ok", check_failures);
    return check_failures ? 1 : 0;
}
