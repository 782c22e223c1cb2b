/* server/store.c — the SQLite store: sessions, runs and checkpoints, each
 * owned by a tenant.
 *
 * One connection, used from the loop thread only. Every statement is a
 * constant SQL text prepared once (lazily) and cached; user data only ever
 * reaches SQLite through bound parameters. Every get/list/update/delete has
 * `tenant = ?` in its WHERE clause, so another tenant's row is
 * indistinguishable from an absent one (same code, same message).
 *
 * Durability: WAL journaling with synchronous=FULL — each successful create /
 * update has been fsynced to the WAL before the call returns, so committed
 * rows survive kill -9 (and power loss) and are there after the next open. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <cJSON.h>
#include <sqlite3.h>

#include "store.h"
#include "twinkle/hal.h"

#define STORE_SCHEMA_VERSION 1
#define STORE_LIST_MAX 1000

enum {
    ST_BEGIN,
    ST_COMMIT,
    ST_ROLLBACK,
    ST_SESS_INSERT,
    ST_SESS_GET,
    ST_SESS_HEARTBEAT,
    ST_SESS_FINISH,
    ST_SESS_COUNT,
    ST_SESS_LIST,
    ST_RUN_INSERT,
    ST_RUN_GET,
    ST_RUN_TOUCH,
    ST_RUN_COUNT,
    ST_RUN_LIST,
    ST_CK_INSERT,
    ST_CK_UPSERT,
    ST_CK_GET,
    ST_CK_DELETE,
    ST_CK_COUNT,
    ST_CK_LIST,
    ST_CK_TTL,
    ST_CK_PUBLIC,
    ST_CK_LISTED,
    ST_CK_GET_PUBLIC,
    ST_CK_EXPIRED,
    ST_STEP_INSERT,
    ST_STEP_THIN,
    ST_STEP_LIST,
    ST_TRACE_INSERT,
    ST_TRACE_TRIM,
    ST_TRACE_STATS,
    ST_TRACE_LIST,
    ST_COUNT
};

#define RUN_COLS                                                                                                  \
    "id, tenant, session_id, base_model, is_lora, lora_rank, train_attn, train_mlp, train_unembed, seed, "      \
    "user_metadata, created, last_request"
#define CK_COLS "run_id, checkpoint_id, tenant, path, size_bytes, created, expires_at, is_public, user_metadata"

static const char *const stmt_sql[ST_COUNT] = {
    [ST_BEGIN] = "BEGIN",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
    [ST_SESS_INSERT] = "INSERT INTO sessions (id, tenant, tags, user_metadata, sdk_version, created, last_heartbeat, "
                       "finished) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    [ST_SESS_GET] = "SELECT id, tenant, tags, user_metadata, sdk_version, created, last_heartbeat, finished "
                    "FROM sessions WHERE tenant = ?1 AND id = ?2",
    [ST_SESS_HEARTBEAT] = "UPDATE sessions SET last_heartbeat = ?3 WHERE tenant = ?1 AND id = ?2",
    [ST_SESS_FINISH] = "UPDATE sessions SET finished = 1 WHERE tenant = ?1 AND id = ?2",
    [ST_SESS_COUNT] = "SELECT COUNT(*) FROM sessions WHERE tenant = ?1",
    [ST_SESS_LIST] = "SELECT id FROM sessions WHERE tenant = ?1 ORDER BY created DESC, id ASC LIMIT ?2 OFFSET ?3",
    [ST_RUN_INSERT] = "INSERT INTO runs (" RUN_COLS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    [ST_RUN_GET] = "SELECT " RUN_COLS " FROM runs WHERE tenant = ?1 AND id = ?2",
    [ST_RUN_TOUCH] = "UPDATE runs SET last_request = ?2 WHERE id = ?1",
    /* ?5 = 1: every tenant's (twk_store_run_list_all, the admin's dashboard) */
    [ST_RUN_COUNT] = "SELECT COUNT(*) FROM runs WHERE (tenant = ?1 OR ?5 = 1) AND (?2 IS NULL OR session_id = ?2)",
    [ST_RUN_LIST] = "SELECT " RUN_COLS " FROM runs WHERE (tenant = ?1 OR ?5 = 1) AND (?2 IS NULL OR session_id = ?2) "
                    "ORDER BY created DESC, id ASC LIMIT ?3 OFFSET ?4",
    [ST_CK_INSERT] = "INSERT INTO checkpoints (" CK_COLS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    /* a conflicting row of another tenant is left alone (changes() == 0) */
    [ST_CK_UPSERT] = "INSERT INTO checkpoints (" CK_COLS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) "
                     "ON CONFLICT (run_id, checkpoint_id) DO UPDATE SET path = excluded.path, "
                     "size_bytes = excluded.size_bytes, created = excluded.created, "
                     "expires_at = excluded.expires_at, is_public = excluded.is_public, "
                     "user_metadata = excluded.user_metadata "
                     "WHERE checkpoints.tenant = excluded.tenant",
    [ST_CK_GET] = "SELECT " CK_COLS " FROM checkpoints WHERE tenant = ?1 AND run_id = ?2 AND checkpoint_id = ?3",
    [ST_CK_DELETE] = "DELETE FROM checkpoints WHERE tenant = ?1 AND run_id = ?2 AND checkpoint_id = ?3",
    /* tenant NULL: the published checkpoints of run ?2 (twk_store_ckpt_list_public); ?5 = 1: every
     * tenant's (twk_store_ckpt_list_all) */
    [ST_CK_COUNT] = "SELECT COUNT(*) FROM checkpoints WHERE (tenant = ?1 OR (?1 IS NULL AND is_public = 1) OR ?5 = 1) "
                    "AND (?2 IS NULL OR run_id = ?2)",
    [ST_CK_LIST] = "SELECT " CK_COLS " FROM checkpoints WHERE (tenant = ?1 OR (?1 IS NULL AND is_public = 1) OR ?5 = 1) "
                   "AND (?2 IS NULL OR run_id = ?2) "
                   "ORDER BY created DESC, run_id ASC, checkpoint_id ASC LIMIT ?3 OFFSET ?4",
    [ST_CK_TTL] = "UPDATE checkpoints SET expires_at = ?4 WHERE tenant = ?1 AND run_id = ?2 AND checkpoint_id = ?3",
    [ST_CK_PUBLIC] = "UPDATE checkpoints SET is_public = ?4 WHERE tenant = ?1 AND run_id = ?2 AND checkpoint_id = ?3",
    [ST_CK_LISTED] = "SELECT COUNT(*) FROM checkpoints WHERE run_id = ?1 AND checkpoint_id = ?2",
    [ST_CK_GET_PUBLIC] = "SELECT " CK_COLS " FROM checkpoints WHERE is_public = 1 AND ?1 IS NOT NULL AND run_id = ?2 "
                         "AND checkpoint_id = ?3",
    [ST_CK_EXPIRED] = "SELECT " CK_COLS " FROM checkpoints WHERE expires_at > 0 AND expires_at <= ?1 "
                      "ORDER BY expires_at LIMIT ?2",
    [ST_STEP_INSERT] = "INSERT OR REPLACE INTO run_steps (run_id, tenant, kind, seq, step, time, metrics) "
                       "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    /* every second row of (run, kind) by seq, never the newest: what thinning drops */
    [ST_STEP_THIN] = "DELETE FROM run_steps WHERE run_id = ?1 AND kind = ?2 AND seq IN (SELECT seq FROM (SELECT seq, "
                     "ROW_NUMBER() OVER (ORDER BY seq) AS rn, COUNT(*) OVER () AS n FROM run_steps "
                     "WHERE run_id = ?1 AND kind = ?2) WHERE rn % 2 = 0 AND rn < n AND n > ?3)",
    /* ?1 NULL: any tenant's run (the admin's dashboard) */
    [ST_STEP_LIST] = "SELECT run_id, tenant, kind, seq, step, time, metrics FROM run_steps "
                     "WHERE (?1 IS NULL OR tenant = ?1) AND run_id = ?2 ORDER BY kind, seq",
    /* the session's next seq; nothing when the tenant has no such session */
    [ST_TRACE_INSERT] = "INSERT INTO session_trace (session_id, tenant, seq, request_id, route, subject, start_ns, "
                        "end_ns, ok, category, error, tokens) SELECT ?1, ?2, COALESCE((SELECT MAX(seq) FROM "
                        "session_trace WHERE session_id = ?1), 0) + 1, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11 "
                        "WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ?1 AND tenant = ?2)",
    /* keeps the newest ?2 */
    [ST_TRACE_TRIM] = "DELETE FROM session_trace WHERE session_id = ?1 AND seq <= (SELECT MAX(seq) FROM session_trace "
                      "WHERE session_id = ?1) - ?2",
    [ST_TRACE_STATS] = "SELECT COALESCE(MAX(seq), 0), COUNT(*) FROM session_trace WHERE tenant = ?1 AND session_id = ?2",
    [ST_TRACE_LIST] = "SELECT seq, request_id, route, subject, start_ns, end_ns, ok, category, error, tokens "
                      "FROM session_trace WHERE tenant = ?1 AND session_id = ?2 ORDER BY seq",
};

/* Constant DDL (no user data), run once at open inside a write transaction. */
static const char schema_sql[] =
    "CREATE TABLE IF NOT EXISTS sessions ("
    " id TEXT NOT NULL PRIMARY KEY,"
    " tenant TEXT NOT NULL,"
    " tags TEXT NOT NULL DEFAULT '[]',"
    " user_metadata TEXT NOT NULL DEFAULT '{}',"
    " sdk_version TEXT NOT NULL DEFAULT '',"
    " created REAL NOT NULL,"
    " last_heartbeat REAL NOT NULL,"
    " finished INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX IF NOT EXISTS sessions_tenant_created ON sessions (tenant, created);"
    "CREATE TABLE IF NOT EXISTS runs ("
    " id TEXT NOT NULL PRIMARY KEY,"
    " tenant TEXT NOT NULL,"
    " session_id TEXT NOT NULL,"
    " base_model TEXT NOT NULL,"
    " is_lora INTEGER NOT NULL,"
    " lora_rank INTEGER NOT NULL,"
    " train_attn INTEGER NOT NULL,"
    " train_mlp INTEGER NOT NULL,"
    " train_unembed INTEGER NOT NULL,"
    " seed INTEGER NOT NULL,"
    " user_metadata TEXT NOT NULL DEFAULT '{}',"
    " created REAL NOT NULL,"
    " last_request REAL NOT NULL);"
    "CREATE INDEX IF NOT EXISTS runs_tenant_created ON runs (tenant, created);"
    "CREATE TABLE IF NOT EXISTS checkpoints ("
    " run_id TEXT NOT NULL,"
    " checkpoint_id TEXT NOT NULL,"
    " tenant TEXT NOT NULL,"
    " path TEXT NOT NULL,"
    " size_bytes INTEGER NOT NULL,"
    " created REAL NOT NULL,"
    " expires_at REAL NOT NULL DEFAULT 0,"
    " is_public INTEGER NOT NULL DEFAULT 0,"
    " user_metadata TEXT NOT NULL DEFAULT '{}',"
    " PRIMARY KEY (run_id, checkpoint_id));"
    "CREATE INDEX IF NOT EXISTS checkpoints_tenant_created ON checkpoints (tenant, created);"
    /* per-step metrics of training ops (the dashboard's curves), gone with their run's row */
    "CREATE TABLE IF NOT EXISTS run_steps ("
    " run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,"
    " tenant TEXT NOT NULL,"
    " kind INTEGER NOT NULL,"
    " seq INTEGER NOT NULL,"
    " step INTEGER NOT NULL,"
    " time REAL NOT NULL,"
    " metrics TEXT NOT NULL DEFAULT '{}',"
    " PRIMARY KEY (run_id, kind, seq));"
    /* the sessions' timelines (trace_export): one row per finished request, numbered per session */
    "CREATE TABLE IF NOT EXISTS session_trace ("
    " session_id TEXT NOT NULL,"
    " tenant TEXT NOT NULL,"
    " seq INTEGER NOT NULL,"
    " request_id TEXT NOT NULL,"
    " route TEXT NOT NULL,"
    " subject TEXT NOT NULL,"
    " start_ns INTEGER NOT NULL,"
    " end_ns INTEGER NOT NULL,"
    " ok INTEGER NOT NULL,"
    " category TEXT NOT NULL DEFAULT '',"
    " error TEXT NOT NULL DEFAULT '',"
    " tokens INTEGER NOT NULL DEFAULT -1,"
    " PRIMARY KEY (session_id, seq));";

struct twk_store {
    sqlite3 *db;
    char *path; /* DATA_DIR/twinkle.db, for messages */
    sqlite3_stmt *st[ST_COUNT];
};

/* ---- helpers ------------------------------------------------------------ */

#define TRY(expr)                                                                                                 \
    do {                                                                                                          \
        twk_status try_st_ = (expr);                                                                              \
        if (try_st_ != TWK_OK) return try_st_;                                                                    \
    } while (0)

/* Binds in the statement; on failure resets it and returns. */
#define BIND(expr)                                                                                                \
    do {                                                                                                          \
        twk_status bind_st_ = (expr);                                                                             \
        if (bind_st_ != TWK_OK) {                                                                                 \
            stmt_done(st);                                                                                        \
            return bind_st_;                                                                                      \
        }                                                                                                         \
    } while (0)

#define NEED(p, what, op)                                                                                         \
    do {                                                                                                          \
        if (!(p)) return twk_error(TWK_ERR_INVALID_ARG, "store: %s: %s is NULL", op, what);                       \
    } while (0)

static char *dup_str(const char *src, size_t n, const char *what) {
    char *p = twk_host_alloc(n + 1, what);
    if (!p) return NULL;
    memcpy(p, src, n);
    p[n] = 0;
    return p;
}

/* Maps a failed SQLite call to a status; `op` names the store operation. */
static twk_status db_fail(twk_store *s, const char *op, int rc) {
    const char *msg = sqlite3_errmsg(s->db);
    switch (rc) {
    case SQLITE_CONSTRAINT_PRIMARYKEY:
    case SQLITE_CONSTRAINT_UNIQUE:
        return twk_error(TWK_ERR_STATE, "store: %s: already exists (%s)", op, msg);
    case SQLITE_CONSTRAINT_NOTNULL:
    case SQLITE_CONSTRAINT_CHECK:
        return twk_error(TWK_ERR_INVALID_ARG, "store: %s: %s", op, msg);
    case SQLITE_NOMEM: return twk_error(TWK_ERR_OOM, "store: %s: %s", op, msg);
    default: return twk_error(TWK_ERR_IO, "store: %s: %s (%s)", op, msg, s->path);
    }
}

/* The cached statement `which` (reset, no bindings) in *out; an error
 * naming `op` when it cannot be prepared. */
static twk_status stmt_get(twk_store *s, int which, const char *op, sqlite3_stmt **out) {
    *out = NULL;
    if (!s->st[which]) {
        int rc = sqlite3_prepare_v3(s->db, stmt_sql[which], -1, SQLITE_PREPARE_PERSISTENT, &s->st[which], NULL);
        if (rc != SQLITE_OK) {
            twk_status status = db_fail(s, op, sqlite3_extended_errcode(s->db));
            sqlite3_finalize(s->st[which]);
            s->st[which] = NULL;
            return status;
        }
    }
    *out = s->st[which];
    return TWK_OK;
}

static void stmt_done(sqlite3_stmt *st) {
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
}

static twk_status bind_text(twk_store *s, sqlite3_stmt *st, int i, const char *v, const char *op) {
    int rc = v ? sqlite3_bind_text(st, i, v, -1, SQLITE_TRANSIENT) : sqlite3_bind_null(st, i);
    return rc == SQLITE_OK ? TWK_OK : db_fail(s, op, rc);
}

static twk_status bind_int64(twk_store *s, sqlite3_stmt *st, int i, int64_t v, const char *op) {
    int rc = sqlite3_bind_int64(st, i, v);
    return rc == SQLITE_OK ? TWK_OK : db_fail(s, op, rc);
}

static twk_status bind_double(twk_store *s, sqlite3_stmt *st, int i, double v, const char *op) {
    int rc = sqlite3_bind_double(st, i, v);
    return rc == SQLITE_OK ? TWK_OK : db_fail(s, op, rc);
}

/* Runs a statement that returns no rows; *changes gets the rows it touched. */
static twk_status step_done(twk_store *s, sqlite3_stmt *st, const char *op, int *changes) {
    int rc = sqlite3_step(st);
    twk_status status = TWK_OK;
    if (rc != SQLITE_DONE) status = db_fail(s, op, sqlite3_extended_errcode(s->db));
    else if (changes) *changes = sqlite3_changes(s->db);
    stmt_done(st);
    return status;
}

static twk_status run_simple(twk_store *s, int which, const char *op) {
    sqlite3_stmt *st;
    twk_status status = stmt_get(s, which, op, &st);
    return status == TWK_OK ? step_done(s, st, op, NULL) : status;
}

/* A fixed-size struct field given to a create: NUL-terminated within its
 * size, and non-empty when `nonempty`. Never truncated. */
static twk_status check_field(const char *field, size_t cap, int nonempty, const char *name, const char *op) {
    size_t n = strnlen(field, cap);
    if (n == cap) return twk_error(TWK_ERR_INVALID_ARG, "store: %s: %s is longer than %zu bytes", op, name, cap - 1);
    if (nonempty && n == 0) return twk_error(TWK_ERR_INVALID_ARG, "store: %s: %s is empty", op, name);
    return TWK_OK;
}

static twk_status check_finite(double v, const char *name, const char *op) {
    if (!isfinite(v)) return twk_error(TWK_ERR_INVALID_ARG, "store: %s: %s is not a finite number", op, name);
    return TWK_OK;
}

/* JSON text of the expected kind (cJSON_Array / cJSON_Object); NULL is fine
 * (the column default is used). */
static twk_status check_json(const char *text, int want_array, const char *name, const char *op) {
    if (!text) return TWK_OK;
    cJSON *j = cJSON_ParseWithOpts(text, NULL, 1);
    int ok = j && (want_array ? cJSON_IsArray(j) : cJSON_IsObject(j));
    cJSON_Delete(j);
    if (!ok)
        return twk_error(TWK_ERR_INVALID_ARG, "store: %s: %s is not a JSON %s", op, name,
                         want_array ? "array" : "object");
    return TWK_OK;
}

/* Copies text column `col` into a fixed field; a value that does not fit
 * means the file was written by something else and is refused. */
static twk_status col_field(twk_store *s, sqlite3_stmt *st, int col, char *dst, size_t cap, const char *op) {
    const unsigned char *v = sqlite3_column_text(st, col);
    size_t n = (size_t)sqlite3_column_bytes(st, col);
    if (!v) {
        if (sqlite3_errcode(s->db) == SQLITE_NOMEM) return twk_error(TWK_ERR_OOM, "store: %s: out of memory", op);
        n = 0;
    }
    if (n >= cap || (v && strlen((const char *)v) != n))
        return twk_error(TWK_ERR_IO, "store: %s: column %s holds %zu bytes, more than the %zu the record takes (%s)",
                         op, sqlite3_column_name(st, col) ? sqlite3_column_name(st, col) : "?", n, cap - 1, s->path);
    if (n) memcpy(dst, v, n);
    dst[n] = 0;
    return TWK_OK;
}

static twk_status col_owned(twk_store *s, sqlite3_stmt *st, int col, const char *dflt, char **dst,
                            const char *what) {
    const unsigned char *v = sqlite3_column_text(st, col);
    if (!v && sqlite3_errcode(s->db) == SQLITE_NOMEM)
        return twk_error(TWK_ERR_OOM, "store: out of memory reading %s", what);
    const char *src = v ? (const char *)v : dflt;
    *dst = dup_str(src, strlen(src), what);
    return *dst ? TWK_OK : TWK_ERR_OOM;
}

static twk_status list_args(int *limit, int offset, const char *op) {
    if (offset < 0) return twk_error(TWK_ERR_INVALID_ARG, "store: %s: offset %d is negative", op, offset);
    if (*limit < 1) *limit = 1;
    if (*limit > STORE_LIST_MAX) *limit = STORE_LIST_MAX;
    return TWK_OK;
}

/* Count + page are read in one transaction so they agree. */
static twk_status read_begin(twk_store *s, const char *op) { return run_simple(s, ST_BEGIN, op); }

static twk_status read_end(twk_store *s, twk_status status, const char *op) {
    if (status == TWK_OK) return run_simple(s, ST_COMMIT, op);
    /* keep the first error's message */
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", twk_last_error());
    run_simple(s, ST_ROLLBACK, op);
    twk_error(status, "%s", saved);
    return status;
}

static twk_status count_rows(twk_store *s, sqlite3_stmt *st, const char *op, int *total) {
    int rc = sqlite3_step(st);
    twk_status status = TWK_OK;
    if (rc == SQLITE_ROW) {
        sqlite3_int64 n = sqlite3_column_int64(st, 0);
        *total = n > 0x7fffffff ? 0x7fffffff : (int)n;
    } else {
        status = db_fail(s, op, sqlite3_extended_errcode(s->db));
    }
    stmt_done(st);
    return status;
}

static int page_cap(int total, int limit, int offset) {
    int left = total > offset ? total - offset : 0;
    return left < limit ? left : limit;
}

/* One paged list (sessions, runs, checkpoints): a count and a page of rows read in one transaction. */
typedef struct {
    int count_stmt, list_stmt;
    const char *tenant, *key; /* NULL binds SQL NULL */
    int all, keyed; /* keyed: (tenant, key, limit, offset, all) at ?1..?5; else (tenant, limit, offset) */
    int need_tenant; /* a NULL tenant is refused (it never means "all tenants") */
    const char *need_key; /* when set, the key's name: a NULL key is refused */
    size_t elem;
    const char *what; /* the array's allocation name */
    twk_status (*row)(twk_store *s, sqlite3_stmt *st, void *elem, const char *op); /* clears elem on failure */
    void (*clear)(void *elem);
} list_spec;

static void list_free(const list_spec *ls, void *arr, int n) {
    if (!arr) return;
    for (int i = 0; i < n; i++) ls->clear((char *)arr + (size_t)i * ls->elem);
    twk_host_free(arr);
}

/* Binds ls's parameters in st: the count's (page = 0) or the page's. */
static twk_status list_bind(twk_store *s, sqlite3_stmt *st, const list_spec *ls, int page, int limit, int offset,
                            const char *op) {
    int at = ls->keyed ? 3 : 2; /* where limit and offset go */
    twk_status status = bind_text(s, st, 1, ls->tenant, op);
    if (status == TWK_OK && ls->keyed) status = bind_text(s, st, 2, ls->key, op);
    if (status == TWK_OK && ls->keyed) status = bind_int64(s, st, 5, ls->all, op);
    if (status == TWK_OK && page) status = bind_int64(s, st, at, limit, op);
    if (status == TWK_OK && page) status = bind_int64(s, st, at + 1, offset, op);
    if (status != TWK_OK) stmt_done(st);
    return status;
}

static twk_status list_page(twk_store *s, const list_spec *ls, int limit, int offset, void **out, int *n_out,
                            int *total, const char *op) {
    sqlite3_stmt *st;
    TRY(stmt_get(s, ls->count_stmt, op, &st));
    TRY(list_bind(s, st, ls, 0, limit, offset, op));
    TRY(count_rows(s, st, op, total));
    int cap = page_cap(*total, limit, offset);
    if (cap == 0) return TWK_OK;
    char *arr = twk_host_calloc((size_t)cap * ls->elem, ls->what);
    if (!arr) return TWK_ERR_OOM;
    int n = 0;
    twk_status status = stmt_get(s, ls->list_stmt, op, &st);
    if (status == TWK_OK) status = list_bind(s, st, ls, 1, limit, offset, op);
    while (status == TWK_OK && n < cap) {
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE) break;
        if (rc != SQLITE_ROW) {
            status = db_fail(s, op, sqlite3_extended_errcode(s->db));
            break;
        }
        status = ls->row(s, st, arr + (size_t)n * ls->elem, op);
        if (status == TWK_OK) n++;
    }
    if (st) stmt_done(st);
    if (status != TWK_OK || n == 0) {
        list_free(ls, arr, n);
        return status;
    }
    *out = arr;
    *n_out = n;
    return TWK_OK;
}

/* The whole list call: arguments checked, *out / *n_out / *total zeroed, then set when it succeeds. */
static twk_status list_read(twk_store *s, const list_spec *ls, int limit, int offset, void **out, int *n_out,
                            int *total, const char *op) {
    NEED(out, "out", op);
    NEED(n_out, "n_out", op);
    NEED(total, "total", op);
    *out = NULL;
    *n_out = 0;
    *total = 0;
    NEED(s, "store", op);
    if (ls->need_tenant) NEED(ls->tenant, "tenant", op);
    if (ls->need_key) NEED(ls->key, ls->need_key, op);
    TRY(list_args(&limit, offset, op));
    TRY(read_begin(s, op));
    twk_status status = list_page(s, ls, limit, offset, out, n_out, total, op);
    status = read_end(s, status, op);
    if (status != TWK_OK) {
        list_free(ls, *out, *n_out);
        *out = NULL;
        *n_out = 0;
        *total = 0;
    }
    return status;
}

/* ---- open / close ------------------------------------------------------- */

static twk_status mkdir_p(const char *dir) {
    size_t n = strlen(dir);
    char *p = dup_str(dir, n, "store data dir");
    if (!p) return TWK_ERR_OOM;
    twk_status status = TWK_OK;
    for (size_t i = 1; i <= n && status == TWK_OK; i++) {
        if (p[i] != '/' && p[i] != 0) continue;
        char c = p[i];
        p[i] = 0;
        if (mkdir(p, 0700) != 0 && errno != EEXIST)
            status = twk_error(TWK_ERR_IO, "store: cannot create directory %s: %s", p, strerror(errno));
        p[i] = c;
    }
    struct stat sb;
    if (status == TWK_OK && (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)))
        status = twk_error(TWK_ERR_IO, "store: data dir %s is not a directory", dir);
    twk_host_free(p);
    return status;
}

static twk_status exec_sql(twk_store *s, const char *sql, const char *op) {
    char *err = NULL;
    int rc = sqlite3_exec(s->db, sql, NULL, NULL, &err);
    if (rc == SQLITE_OK) return TWK_OK;
    twk_status st = twk_error(rc == SQLITE_NOMEM ? TWK_ERR_OOM : TWK_ERR_IO, "store: %s: %s (%s)", op,
                              err ? err : sqlite3_errstr(rc), s->path);
    sqlite3_free(err);
    return st;
}

/* One-row, one-column pragma read into buf. */
static twk_status pragma_text(twk_store *s, const char *sql, char *buf, size_t cap, const char *op) {
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(s->db, sql, -1, &st, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_step(st);
    twk_status status = TWK_OK;
    if (rc == SQLITE_ROW) {
        const unsigned char *v = sqlite3_column_text(st, 0);
        snprintf(buf, cap, "%s", v ? (const char *)v : "");
    } else {
        status = twk_error(TWK_ERR_IO, "store: %s: %s (%s)", op, sqlite3_errmsg(s->db), s->path);
    }
    sqlite3_finalize(st);
    return status;
}

static twk_status open_schema(twk_store *s) {
    twk_status st = exec_sql(s,
                             "BEGIN IMMEDIATE;"
                             "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);",
                             "open: schema");
    if (st != TWK_OK) return st;
    char v[32];
    st = pragma_text(s, "SELECT COALESCE(MAX(version), 0) FROM schema_version", v, sizeof v, "open: schema version");
    if (st == TWK_OK) {
        long ver = strtol(v, NULL, 10);
        if (ver > STORE_SCHEMA_VERSION)
            st = twk_error(TWK_ERR_STATE, "store: open: %s has schema version %ld, newer than this build's %d",
                           s->path, ver, STORE_SCHEMA_VERSION);
        else
            st = exec_sql(s, schema_sql, "open: create tables");
        if (st == TWK_OK && ver == 0)
            st = exec_sql(s, "INSERT INTO schema_version (version) VALUES (1)", "open: schema version");
    }
    if (st == TWK_OK) return exec_sql(s, "COMMIT", "open: schema commit");
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", twk_last_error());
    sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    twk_error(st, "%s", saved);
    return st;
}

twk_status twk_store_open(const char *data_dir, twk_store **out) {
    if (!out) return twk_error(TWK_ERR_INVALID_ARG, "store: open: out is NULL");
    *out = NULL;
    if (!data_dir || !*data_dir) return twk_error(TWK_ERR_INVALID_ARG, "store: open: no data dir");
    twk_status status = mkdir_p(data_dir);
    if (status != TWK_OK) return status;

    twk_store *s = twk_host_calloc(sizeof *s, "store");
    if (!s) return TWK_ERR_OOM;
    size_t n = strlen(data_dir);
    s->path = twk_host_alloc(n + sizeof "/twinkle.db", "store path");
    if (!s->path) {
        twk_host_free(s);
        return TWK_ERR_OOM;
    }
    snprintf(s->path, n + sizeof "/twinkle.db", "%s/twinkle.db", data_dir);

    int rc = sqlite3_open_v2(s->path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    if (rc != SQLITE_OK) {
        status = twk_error(rc == SQLITE_NOMEM ? TWK_ERR_OOM : TWK_ERR_IO, "store: cannot open %s: %s", s->path,
                           s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc));
        twk_store_close(s);
        return status;
    }
    sqlite3_extended_result_codes(s->db, 1);
    char mode[32];
    status = exec_sql(s, "PRAGMA busy_timeout=5000", "open: busy_timeout");
    if (status == TWK_OK) status = pragma_text(s, "PRAGMA journal_mode=WAL", mode, sizeof mode, "open: journal_mode");
    if (status == TWK_OK && strcmp(mode, "wal") != 0)
        status = twk_error(TWK_ERR_IO, "store: open: %s: journal mode is '%s', WAL could not be enabled", s->path,
                           mode);
    if (status == TWK_OK) status = exec_sql(s, "PRAGMA synchronous=FULL", "open: synchronous");
    if (status == TWK_OK) status = exec_sql(s, "PRAGMA foreign_keys=ON", "open: foreign_keys");
    if (status == TWK_OK) status = open_schema(s);
    if (status != TWK_OK) {
        twk_store_close(s);
        return status;
    }
    *out = s;
    return TWK_OK;
}

void twk_store_close(twk_store *s) {
    if (!s) return;
    for (int i = 0; i < ST_COUNT; i++) sqlite3_finalize(s->st[i]);
    sqlite3_close(s->db);
    twk_host_free(s->path);
    twk_host_free(s);
}

/* ---- sessions ----------------------------------------------------------- */

void twk_store_session_clear(twk_store_session *sess) {
    if (!sess) return;
    twk_host_free(sess->tags_json);
    twk_host_free(sess->user_metadata_json);
    sess->tags_json = NULL;
    sess->user_metadata_json = NULL;
}

void twk_store_run_clear(twk_store_run *r) {
    if (!r) return;
    twk_host_free(r->user_metadata_json);
    r->user_metadata_json = NULL;
}

twk_status twk_store_session_create(twk_store *s, const twk_store_session *sess) {
    const char *op = "session create";
    NEED(s, "store", op);
    NEED(sess, "session", op);
    TRY(check_field(sess->id, sizeof sess->id, 1, "id", op));
    TRY(check_field(sess->tenant, sizeof sess->tenant, 0, "tenant", op));
    TRY(check_field(sess->sdk_version, sizeof sess->sdk_version, 0, "sdk_version", op));
    TRY(check_json(sess->tags_json, 1, "tags", op));
    TRY(check_json(sess->user_metadata_json, 0, "user_metadata", op));
    TRY(check_finite(sess->created, "created", op));
    TRY(check_finite(sess->last_heartbeat, "last_heartbeat", op));
    sqlite3_stmt *st;
    TRY(stmt_get(s, ST_SESS_INSERT, op, &st));
    BIND(bind_text(s, st, 1, sess->id, op));
    BIND(bind_text(s, st, 2, sess->tenant, op));
    BIND(bind_text(s, st, 3, sess->tags_json ? sess->tags_json : "[]", op));
    BIND(bind_text(s, st, 4, sess->user_metadata_json ? sess->user_metadata_json : "{}", op));
    BIND(bind_text(s, st, 5, sess->sdk_version, op));
    BIND(bind_double(s, st, 6, sess->created, op));
    BIND(bind_double(s, st, 7, sess->last_heartbeat, op));
    BIND(bind_int64(s, st, 8, sess->finished ? 1 : 0, op));
    twk_status status = step_done(s, st, op, NULL);
    if (status == TWK_ERR_STATE)
        return twk_error(TWK_ERR_STATE, "store: %s: session '%s' already exists", op, sess->id);
    return status;
}

twk_status twk_store_session_get(twk_store *s, const char *tenant, const char *id, twk_store_session *out) {
    const char *op = "session get";
    NEED(out, "out", op);
    memset(out, 0, sizeof *out);
    NEED(s, "store", op);
    NEED(tenant, "tenant", op);
    NEED(id, "id", op);
    sqlite3_stmt *st;
    TRY(stmt_get(s, ST_SESS_GET, op, &st));
    BIND(bind_text(s, st, 1, tenant, op));
    BIND(bind_text(s, st, 2, id, op));
    int rc = sqlite3_step(st);
    twk_status status = TWK_OK;
    if (rc == SQLITE_DONE) {
        status = twk_error(TWK_ERR_NOT_FOUND, "store: %s: session '%s' not found", op, id);
    } else if (rc != SQLITE_ROW) {
        status = db_fail(s, op, sqlite3_extended_errcode(s->db));
    } else {
        status = col_field(s, st, 0, out->id, sizeof out->id, op);
        if (status == TWK_OK) status = col_field(s, st, 1, out->tenant, sizeof out->tenant, op);
        if (status == TWK_OK) status = col_owned(s, st, 2, "[]", &out->tags_json, "session tags");
        if (status == TWK_OK) status = col_owned(s, st, 3, "{}", &out->user_metadata_json, "session user_metadata");
        if (status == TWK_OK) status = col_field(s, st, 4, out->sdk_version, sizeof out->sdk_version, op);
        out->created = sqlite3_column_double(st, 5);
        out->last_heartbeat = sqlite3_column_double(st, 6);
        out->finished = sqlite3_column_int(st, 7) != 0;
    }
    stmt_done(st);
    if (status != TWK_OK) twk_store_session_clear(out);
    return status;
}

static twk_status update_by_tenant_id(twk_store *s, int which, const char *op, const char *what, const char *tenant,
                                      const char *id, int has_val, double val) {
    NEED(s, "store", op);
    NEED(tenant, "tenant", op);
    NEED(id, "id", op);
    if (has_val) TRY(check_finite(val, "time", op));
    sqlite3_stmt *st;
    TRY(stmt_get(s, which, op, &st));
    BIND(bind_text(s, st, 1, tenant, op));
    BIND(bind_text(s, st, 2, id, op));
    if (has_val) BIND(bind_double(s, st, 3, val, op));
    int changes = 0;
    TRY(step_done(s, st, op, &changes));
    if (changes == 0) return twk_error(TWK_ERR_NOT_FOUND, "store: %s: %s '%s' not found", op, what, id);
    return TWK_OK;
}

twk_status twk_store_session_heartbeat(twk_store *s, const char *tenant, const char *id, double now) {
    return update_by_tenant_id(s, ST_SESS_HEARTBEAT, "session heartbeat", "session", tenant, id, 1, now);
}

twk_status twk_store_session_finish(twk_store *s, const char *tenant, const char *id) {
    return update_by_tenant_id(s, ST_SESS_FINISH, "session finish", "session", tenant, id, 0, 0);
}

static twk_status row_to_id(twk_store *s, sqlite3_stmt *st, void *elem, const char *op) {
    (void)s;
    (void)op;
    const unsigned char *v = sqlite3_column_text(st, 0);
    const char *src = v ? (const char *)v : "";
    char **id = elem;
    *id = dup_str(src, strlen(src), "session list id");
    return *id ? TWK_OK : TWK_ERR_OOM;
}

static void clear_id(void *elem) { twk_host_free(*(char **)elem); }

twk_status twk_store_session_list(twk_store *s, const char *tenant, int limit, int offset, char ***ids, int *n_out,
                                  int *total) {
    list_spec ls = {.count_stmt = ST_SESS_COUNT, .list_stmt = ST_SESS_LIST, .tenant = tenant, .need_tenant = 1,
                    .elem = sizeof(char *), .what = "session list", .row = row_to_id, .clear = clear_id};
    return list_read(s, &ls, limit, offset, (void **)ids, n_out, total, "session list");
}

/* ---- runs --------------------------------------------------------------- */

twk_status twk_store_run_create(twk_store *s, const twk_store_run *run) {
    const char *op = "run create";
    NEED(s, "store", op);
    NEED(run, "run", op);
    TRY(check_field(run->id, sizeof run->id, 1, "id", op));
    TRY(check_field(run->tenant, sizeof run->tenant, 0, "tenant", op));
    TRY(check_field(run->session_id, sizeof run->session_id, 0, "session_id", op));
    TRY(check_field(run->base_model, sizeof run->base_model, 0, "base_model", op));
    TRY(check_json(run->user_metadata_json, 0, "user_metadata", op));
    TRY(check_finite(run->created, "created", op));
    TRY(check_finite(run->last_request, "last_request", op));
    sqlite3_stmt *st;
    TRY(stmt_get(s, ST_RUN_INSERT, op, &st));
    BIND(bind_text(s, st, 1, run->id, op));
    BIND(bind_text(s, st, 2, run->tenant, op));
    BIND(bind_text(s, st, 3, run->session_id, op));
    BIND(bind_text(s, st, 4, run->base_model, op));
    BIND(bind_int64(s, st, 5, run->is_lora, op));
    BIND(bind_int64(s, st, 6, run->lora_rank, op));
    BIND(bind_int64(s, st, 7, run->train_attn, op));
    BIND(bind_int64(s, st, 8, run->train_mlp, op));
    BIND(bind_int64(s, st, 9, run->train_unembed, op));
    BIND(bind_int64(s, st, 10, run->seed, op));
    BIND(bind_text(s, st, 11, run->user_metadata_json ? run->user_metadata_json : "{}", op));
    BIND(bind_double(s, st, 12, run->created, op));
    BIND(bind_double(s, st, 13, run->last_request, op));
    twk_status status = step_done(s, st, op, NULL);
    if (status == TWK_ERR_STATE) return twk_error(TWK_ERR_STATE, "store: %s: run '%s' already exists", op, run->id);
    return status;
}

/* Reads a RUN_COLS row into *out (zeroed first; cleared on failure). */
static twk_status row_to_run(twk_store *s, sqlite3_stmt *st, twk_store_run *out, const char *op) {
    memset(out, 0, sizeof *out);
    twk_status status = col_field(s, st, 0, out->id, sizeof out->id, op);
    if (status == TWK_OK) status = col_field(s, st, 1, out->tenant, sizeof out->tenant, op);
    if (status == TWK_OK) status = col_field(s, st, 2, out->session_id, sizeof out->session_id, op);
    if (status == TWK_OK) status = col_field(s, st, 3, out->base_model, sizeof out->base_model, op);
    out->is_lora = sqlite3_column_int(st, 4);
    out->lora_rank = sqlite3_column_int(st, 5);
    out->train_attn = sqlite3_column_int(st, 6);
    out->train_mlp = sqlite3_column_int(st, 7);
    out->train_unembed = sqlite3_column_int(st, 8);
    out->seed = sqlite3_column_int64(st, 9);
    if (status == TWK_OK) status = col_owned(s, st, 10, "{}", &out->user_metadata_json, "run user_metadata");
    out->created = sqlite3_column_double(st, 11);
    out->last_request = sqlite3_column_double(st, 12);
    if (status != TWK_OK) twk_store_run_clear(out);
    return status;
}

twk_status twk_store_run_get(twk_store *s, const char *tenant, const char *id, twk_store_run *out) {
    const char *op = "run get";
    NEED(out, "out", op);
    memset(out, 0, sizeof *out);
    NEED(s, "store", op);
    NEED(tenant, "tenant", op);
    NEED(id, "id", op);
    sqlite3_stmt *st;
    TRY(stmt_get(s, ST_RUN_GET, op, &st));
    BIND(bind_text(s, st, 1, tenant, op));
    BIND(bind_text(s, st, 2, id, op));
    int rc = sqlite3_step(st);
    twk_status status;
    if (rc == SQLITE_DONE) status = twk_error(TWK_ERR_NOT_FOUND, "store: %s: run '%s' not found", op, id);
    else if (rc != SQLITE_ROW) status = db_fail(s, op, sqlite3_extended_errcode(s->db));
    else status = row_to_run(s, st, out, op);
    stmt_done(st);
    return status;
}

twk_status twk_store_run_touch(twk_store *s, const char *id, double now) {
    const char *op = "run touch";
    NEED(s, "store", op);
    NEED(id, "id", op);
    TRY(check_finite(now, "now", op));
    sqlite3_stmt *st;
    TRY(stmt_get(s, ST_RUN_TOUCH, op, &st));
    BIND(bind_text(s, st, 1, id, op));
    BIND(bind_double(s, st, 2, now, op));
    int changes = 0;
    TRY(step_done(s, st, op, &changes));
    if (changes == 0) return twk_error(TWK_ERR_NOT_FOUND, "store: %s: run '%s' not found", op, id);
    return TWK_OK;
}

static twk_status row_to_run_elem(twk_store *s, sqlite3_stmt *st, void *elem, const char *op) {
    return row_to_run(s, st, elem, op);
}

static void clear_run(void *elem) { twk_store_run_clear(elem); }

/* all: every tenant's runs (tenant and session_id NULL); else the tenant's, of session_id when set. */
static twk_status run_list(twk_store *s, const char *tenant, int all, const char *session_id, int limit, int offset,
                           twk_store_run **runs, int *n_out, int *total, const char *op) {
    list_spec ls = {.count_stmt = ST_RUN_COUNT, .list_stmt = ST_RUN_LIST, .tenant = tenant, .key = session_id,
                    .all = all, .keyed = 1, .need_tenant = !all, .elem = sizeof **runs,
                    .what = "run list", .row = row_to_run_elem, .clear = clear_run};
    return list_read(s, &ls, limit, offset, (void **)runs, n_out, total, op);
}

twk_status twk_store_tenant_stats(twk_store *s, double live_since, twk_store_stats_fn fn, void *user) {
    const char *op = "tenant stats";
    NEED(s, "store", op);
    NEED(fn, "fn", op);
    static const char sql[] =
        "SELECT tenant, SUM(live), SUM(ck), SUM(bytes) FROM ("
        " SELECT tenant, 1 AS live, 0 AS ck, 0 AS bytes FROM sessions WHERE finished = 0 AND last_heartbeat >= ?1"
        " UNION ALL SELECT tenant, 0, 1, size_bytes FROM checkpoints) GROUP BY tenant";
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(s->db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK) return db_fail(s, op, rc);
    sqlite3_bind_double(st, 1, live_since);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const unsigned char *t = sqlite3_column_text(st, 0);
        fn(user, t ? (const char *)t : "", sqlite3_column_int64(st, 1), sqlite3_column_int64(st, 2),
           sqlite3_column_int64(st, 3));
    }
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? TWK_OK : db_fail(s, op, rc);
}

twk_status twk_store_run_list(twk_store *s, const char *tenant, const char *session_id, int limit, int offset,
                              twk_store_run **runs, int *n_out, int *total) {
    return run_list(s, tenant, 0, session_id, limit, offset, runs, n_out, total, "run list");
}

twk_status twk_store_run_list_all(twk_store *s, int limit, int offset, twk_store_run **runs, int *n_out, int *total) {
    return run_list(s, NULL, 1, NULL, limit, offset, runs, n_out, total, "run list (all tenants)");
}

static twk_status ckpt_write(twk_store *s, const twk_store_ckpt *c, int which, const char *op) {
    NEED(s, "store", op);
    NEED(c, "checkpoint", op);
    TRY(check_field(c->run_id, sizeof c->run_id, 1, "run_id", op));
    TRY(check_field(c->checkpoint_id, sizeof c->checkpoint_id, 1, "checkpoint_id", op));
    TRY(check_field(c->tenant, sizeof c->tenant, 0, "tenant", op));
    TRY(check_field(c->path, sizeof c->path, 0, "path", op));
    TRY(check_field(c->user_metadata_json, sizeof c->user_metadata_json, 0, "user_metadata", op));
    TRY(check_finite(c->created, "created", op));
    TRY(check_finite(c->expires_at, "expires_at", op));
    if (c->size_bytes < 0) return twk_error(TWK_ERR_INVALID_ARG, "store: %s: size_bytes is negative", op);
    if (c->expires_at < 0) return twk_error(TWK_ERR_INVALID_ARG, "store: %s: expires_at is negative", op);
    sqlite3_stmt *st;
    TRY(stmt_get(s, which, op, &st));
    BIND(bind_text(s, st, 1, c->run_id, op));
    BIND(bind_text(s, st, 2, c->checkpoint_id, op));
    BIND(bind_text(s, st, 3, c->tenant, op));
    BIND(bind_text(s, st, 4, c->path, op));
    BIND(bind_int64(s, st, 5, c->size_bytes, op));
    BIND(bind_double(s, st, 6, c->created, op));
    BIND(bind_double(s, st, 7, c->expires_at, op));
    BIND(bind_int64(s, st, 8, c->is_public ? 1 : 0, op));
    BIND(bind_text(s, st, 9, c->user_metadata_json[0] ? c->user_metadata_json : "{}", op));
    int changes = 0;
    twk_status status = step_done(s, st, op, &changes);
    if (status == TWK_ERR_STATE)
        return twk_error(TWK_ERR_STATE, "store: %s: checkpoint '%s' of run '%s' already exists", op,
                         c->checkpoint_id, c->run_id);
    if (status == TWK_OK && changes == 0) /* upsert onto another tenant's row: left alone */
        return twk_error(TWK_ERR_NOT_FOUND, "store: %s: checkpoint '%s' of run '%s' not found", op,
                         c->checkpoint_id, c->run_id);
    return status;
}

twk_status twk_store_ckpt_create(twk_store *s, const twk_store_ckpt *c) {
    return ckpt_write(s, c, ST_CK_INSERT, "checkpoint create");
}

twk_status twk_store_ckpt_upsert(twk_store *s, const twk_store_ckpt *c) {
    return ckpt_write(s, c, ST_CK_UPSERT, "checkpoint upsert");
}

static twk_status row_to_ckpt(twk_store *s, sqlite3_stmt *st, twk_store_ckpt *out, const char *op) {
    memset(out, 0, sizeof *out);
    twk_status status = col_field(s, st, 0, out->run_id, sizeof out->run_id, op);
    if (status == TWK_OK) status = col_field(s, st, 1, out->checkpoint_id, sizeof out->checkpoint_id, op);
    if (status == TWK_OK) status = col_field(s, st, 2, out->tenant, sizeof out->tenant, op);
    if (status == TWK_OK) status = col_field(s, st, 3, out->path, sizeof out->path, op);
    out->size_bytes = sqlite3_column_int64(st, 4);
    out->created = sqlite3_column_double(st, 5);
    out->expires_at = sqlite3_column_double(st, 6);
    out->is_public = sqlite3_column_int(st, 7) != 0;
    if (status == TWK_OK) status = col_field(s, st, 8, out->user_metadata_json, sizeof out->user_metadata_json, op);
    return status;
}

static twk_status ckpt_get(twk_store *s, int which, const char *op, const char *tenant, const char *run_id,
                           const char *checkpoint_id, twk_store_ckpt *out);

/* Steps st, reading up to cap rows into arr; *n counts them. */
static twk_status ckpt_rows(twk_store *s, sqlite3_stmt *st, twk_store_ckpt *arr, int cap, int *n, const char *op) {
    twk_status status = TWK_OK;
    while (status == TWK_OK && *n < cap) {
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE) break;
        if (rc != SQLITE_ROW) return db_fail(s, op, sqlite3_extended_errcode(s->db));
        status = row_to_ckpt(s, st, &arr[*n], op);
        if (status == TWK_OK) (*n)++;
    }
    return status;
}

twk_status twk_store_ckpt_get(twk_store *s, const char *tenant, const char *run_id, const char *checkpoint_id,
                              twk_store_ckpt *out) {
    return ckpt_get(s, ST_CK_GET, "checkpoint get", tenant, run_id, checkpoint_id, out);
}

twk_status twk_store_ckpt_get_public(twk_store *s, const char *run_id, const char *checkpoint_id, twk_store_ckpt *out) {
    return ckpt_get(s, ST_CK_GET_PUBLIC, "public checkpoint get", "*", run_id, checkpoint_id, out);
}

twk_status twk_store_ckpt_expired(twk_store *s, double now, int max, twk_store_ckpt **out, int *n_out) {
    const char *op = "expired checkpoints";
    NEED(out, "out", op);
    NEED(n_out, "n_out", op);
    *out = NULL;
    *n_out = 0;
    NEED(s, "store", op);
    TRY(check_finite(now, "now", op));
    if (max < 1) return twk_error(TWK_ERR_INVALID_ARG, "store: %s: max must be >= 1", op);
    twk_store_ckpt *arr = twk_host_calloc((size_t)max * sizeof *arr, "expired checkpoints");
    if (!arr) return TWK_ERR_OOM;
    sqlite3_stmt *st = NULL;
    twk_status status = stmt_get(s, ST_CK_EXPIRED, op, &st);
    if (status == TWK_OK) status = bind_double(s, st, 1, now, op);
    if (status == TWK_OK) status = bind_int64(s, st, 2, max, op);
    int n = 0;
    if (status == TWK_OK) status = ckpt_rows(s, st, arr, max, &n, op);
    if (st) stmt_done(st);
    if (status != TWK_OK || n == 0) {
        twk_host_free(arr);
        return status;
    }
    *out = arr;
    *n_out = n;
    return TWK_OK;
}

static twk_status ckpt_get(twk_store *s, int which, const char *op, const char *tenant, const char *run_id,
                           const char *checkpoint_id, twk_store_ckpt *out) {
    NEED(out, "out", op);
    memset(out, 0, sizeof *out);
    NEED(s, "store", op);
    NEED(tenant, "tenant", op);
    NEED(run_id, "run_id", op);
    NEED(checkpoint_id, "checkpoint_id", op);
    sqlite3_stmt *st;
    TRY(stmt_get(s, which, op, &st));
    BIND(bind_text(s, st, 1, tenant, op));
    BIND(bind_text(s, st, 2, run_id, op));
    BIND(bind_text(s, st, 3, checkpoint_id, op));
    int rc = sqlite3_step(st);
    twk_status status;
    if (rc == SQLITE_DONE)
        status = twk_error(TWK_ERR_NOT_FOUND, "store: %s: checkpoint '%s' of run '%s' not found", op, checkpoint_id,
                           run_id);
    else if (rc != SQLITE_ROW) status = db_fail(s, op, sqlite3_extended_errcode(s->db));
    else status = row_to_ckpt(s, st, out, op);
    stmt_done(st);
    return status;
}

static twk_status ckpt_update(twk_store *s, int which, const char *op, const char *tenant, const char *run_id,
                              const char *checkpoint_id, int nvals, double dval, int64_t ival) {
    NEED(s, "store", op);
    NEED(tenant, "tenant", op);
    NEED(run_id, "run_id", op);
    NEED(checkpoint_id, "checkpoint_id", op);
    sqlite3_stmt *st;
    TRY(stmt_get(s, which, op, &st));
    BIND(bind_text(s, st, 1, tenant, op));
    BIND(bind_text(s, st, 2, run_id, op));
    BIND(bind_text(s, st, 3, checkpoint_id, op));
    if (nvals == 1) BIND(bind_double(s, st, 4, dval, op));
    if (nvals == 2) BIND(bind_int64(s, st, 4, ival, op));
    int changes = 0;
    TRY(step_done(s, st, op, &changes));
    if (changes == 0)
        return twk_error(TWK_ERR_NOT_FOUND, "store: %s: checkpoint '%s' of run '%s' not found", op, checkpoint_id,
                         run_id);
    return TWK_OK;
}

twk_status twk_store_ckpt_delete(twk_store *s, const char *tenant, const char *run_id, const char *checkpoint_id) {
    return ckpt_update(s, ST_CK_DELETE, "checkpoint delete", tenant, run_id, checkpoint_id, 0, 0, 0);
}

twk_status twk_store_ckpt_set_ttl(twk_store *s, const char *tenant, const char *run_id, const char *checkpoint_id,
                                  double expires_at) {
    const char *op = "checkpoint set ttl";
    TRY(check_finite(expires_at, "expires_at", op));
    if (expires_at < 0) return twk_error(TWK_ERR_INVALID_ARG, "store: %s: expires_at is negative", op);
    return ckpt_update(s, ST_CK_TTL, op, tenant, run_id, checkpoint_id, 1, expires_at, 0);
}

twk_status twk_store_ckpt_set_public(twk_store *s, const char *tenant, const char *run_id, const char *checkpoint_id,
                                     int is_public) {
    return ckpt_update(s, ST_CK_PUBLIC, "checkpoint set public", tenant, run_id, checkpoint_id, 2, 0,
                       is_public ? 1 : 0);
}

static twk_status row_to_ckpt_elem(twk_store *s, sqlite3_stmt *st, void *elem, const char *op) {
    return row_to_ckpt(s, st, elem, op);
}

static void clear_ckpt(void *elem) { (void)elem; /* a checkpoint row owns no memory */ }

/* all: every tenant's checkpoints; else those of run_id, the tenant's (need_tenant) or public ones (tenant NULL). */
static twk_status ckpt_list(twk_store *s, const char *tenant, int need_tenant, int all, const char *run_id, int limit,
                            int offset, twk_store_ckpt **out, int *n_out, int *total, const char *op) {
    list_spec ls = {.count_stmt = ST_CK_COUNT, .list_stmt = ST_CK_LIST, .tenant = tenant, .key = run_id, .all = all,
                    .keyed = 1, .need_tenant = need_tenant, .need_key = all || need_tenant ? NULL : "run_id",
                    .elem = sizeof **out, .what = "checkpoint list", .row = row_to_ckpt_elem, .clear = clear_ckpt};
    return list_read(s, &ls, limit, offset, (void **)out, n_out, total, op);
}

twk_status twk_store_ckpt_list(twk_store *s, const char *tenant, const char *run_id, int limit, int offset,
                               twk_store_ckpt **out, int *n_out, int *total) {
    return ckpt_list(s, tenant, 1, 0, run_id, limit, offset, out, n_out, total, "checkpoint list");
}

twk_status twk_store_ckpt_list_public(twk_store *s, const char *run_id, int limit, int offset, twk_store_ckpt **out,
                                      int *n_out, int *total) {
    return ckpt_list(s, NULL, 0, 0, run_id, limit, offset, out, n_out, total, "public checkpoint list");
}

twk_status twk_store_ckpt_list_all(twk_store *s, int limit, int offset, twk_store_ckpt **out, int *n_out, int *total) {
    return ckpt_list(s, NULL, 0, 1, NULL, limit, offset, out, n_out, total, "checkpoint list (all tenants)");
}

twk_status twk_store_ckpt_listed(twk_store *s, const char *run_id, const char *checkpoint_id, int *listed) {
    const char *op = "checkpoint listed";
    sqlite3_stmt *st;
    TRY(stmt_get(s, ST_CK_LISTED, op, &st));
    BIND(bind_text(s, st, 1, run_id, op));
    BIND(bind_text(s, st, 2, checkpoint_id, op));
    int n = 0;
    TRY(count_rows(s, st, op, &n));
    *listed = n > 0;
    return TWK_OK;
}

/* ---- per-step metrics (run_steps) --------------------------------------- */

void twk_store_steps_free(twk_store_step *rows, int n) {
    if (!rows) return;
    for (int i = 0; i < n; i++) twk_host_free(rows[i].metrics_json);
    twk_host_free(rows);
}

static twk_status step_insert(twk_store *s, const twk_store_step *r, const char *op) {
    TRY(check_field(r->run_id, sizeof r->run_id, 1, "run_id", op));
    TRY(check_field(r->tenant, sizeof r->tenant, 1, "tenant", op));
    TRY(check_finite(r->time, "time", op));
    if (r->kind < TWK_STEP_FORWARD_BACKWARD || r->kind > TWK_STEP_OPTIM)
        return twk_error(TWK_ERR_INVALID_ARG, "store: %s: kind %d is not a step kind", op, r->kind);
    TRY(check_json(r->metrics_json, 0, "metrics", op));
    sqlite3_stmt *st;
    TRY(stmt_get(s, ST_STEP_INSERT, op, &st));
    BIND(bind_text(s, st, 1, r->run_id, op));
    BIND(bind_text(s, st, 2, r->tenant, op));
    BIND(bind_int64(s, st, 3, r->kind, op));
    BIND(bind_int64(s, st, 4, r->seq, op));
    BIND(bind_int64(s, st, 5, r->step, op));
    BIND(bind_double(s, st, 6, r->time, op));
    BIND(bind_text(s, st, 7, r->metrics_json ? r->metrics_json : "{}", op));
    return step_done(s, st, op, NULL);
}

/* Halves (run, kind) until it holds at most cap rows: each pass drops every second row by seq but
 * the newest, and does nothing once the series is within cap. */
static twk_status step_thin(twk_store *s, const char *run_id, int kind, int cap, const char *op) {
    for (int changes = 1; changes > 0;) {
        sqlite3_stmt *st;
        TRY(stmt_get(s, ST_STEP_THIN, op, &st));
        BIND(bind_text(s, st, 1, run_id, op));
        BIND(bind_int64(s, st, 2, kind, op));
        BIND(bind_int64(s, st, 3, cap, op));
        TRY(step_done(s, st, op, &changes));
    }
    return TWK_OK;
}

/* One batch of rows inserted in one transaction, then each group of the batch trimmed once: what the
 * per-step metrics and the sessions' timelines share. A row that fails is counted in *n_failed and the
 * rest still go in; the first failure's error is returned. */
typedef struct {
    size_t size; /* one row's bytes */
    twk_status (*insert)(twk_store *s, const void *row, const char *op);
    int (*same_group)(const void *a, const void *b);
    twk_status (*trim)(twk_store *s, const void *row, int cap, const char *op); /* its group to cap rows */
} batch_spec;

static twk_status batch_add(twk_store *s, const batch_spec *bs, const void *rows, int n, int cap, int min_cap,
                            int *n_failed, const char *op) {
    NEED(n_failed, "n_failed", op);
    *n_failed = 0;
    NEED(s, "store", op);
    if (n <= 0) return TWK_OK;
    NEED(rows, "rows", op);
    if (cap < min_cap) return twk_error(TWK_ERR_INVALID_ARG, "store: %s: cap %d is below %d", op, cap, min_cap);
    const char *row = rows;
    TRY(exec_sql(s, "BEGIN IMMEDIATE", op));
    char first[1024] = "";
    twk_status first_st = TWK_OK;
    for (int i = 0; i < n; i++) {
        twk_status st = bs->insert(s, row + (size_t)i * bs->size, op);
        if (st == TWK_OK) continue;
        if (first_st == TWK_OK) {
            first_st = st;
            snprintf(first, sizeof first, "%s", twk_last_error());
        }
        ++*n_failed;
    }
    for (int i = 0; i < n; i++) { /* each group of the batch once, after its rows went in */
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = bs->same_group(row + (size_t)j * bs->size, row + (size_t)i * bs->size);
        if (seen) continue;
        twk_status st = bs->trim(s, row + (size_t)i * bs->size, cap, op);
        if (st != TWK_OK && first_st == TWK_OK) {
            first_st = st;
            snprintf(first, sizeof first, "%s", twk_last_error());
        }
    }
    twk_status st = exec_sql(s, "COMMIT", op);
    if (st != TWK_OK) {
        char saved[1024];
        snprintf(saved, sizeof saved, "%s", twk_last_error());
        sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
        *n_failed = n;
        return twk_error(st, "%s", saved);
    }
    return first_st == TWK_OK ? TWK_OK : twk_error(first_st, "%s", first);
}

static twk_status step_insert_row(twk_store *s, const void *row, const char *op) { return step_insert(s, row, op); }

static int step_same_series(const void *a, const void *b) {
    const twk_store_step *x = a, *y = b;
    return x->kind == y->kind && !strcmp(x->run_id, y->run_id);
}

static twk_status step_thin_row(twk_store *s, const void *row, int cap, const char *op) {
    const twk_store_step *r = row;
    return step_thin(s, r->run_id, r->kind, cap, op);
}

twk_status twk_store_steps_add(twk_store *s, const twk_store_step *rows, int n, int cap, int *n_failed) {
    static const batch_spec bs = {sizeof *rows, step_insert_row, step_same_series, step_thin_row};
    return batch_add(s, &bs, rows, n, cap, 2, n_failed, "steps add");
}

twk_status twk_store_steps_list(twk_store *s, const char *tenant, const char *run_id, twk_store_step **out,
                                int *n_out) {
    const char *op = "steps list";
    NEED(out, "out", op);
    NEED(n_out, "n_out", op);
    *out = NULL;
    *n_out = 0;
    NEED(s, "store", op);
    NEED(run_id, "run_id", op);
    sqlite3_stmt *st;
    TRY(stmt_get(s, ST_STEP_LIST, op, &st));
    BIND(bind_text(s, st, 1, tenant, op));
    BIND(bind_text(s, st, 2, run_id, op));
    twk_store_step *arr = NULL;
    int n = 0, cap = 0;
    twk_status status = TWK_OK;
    for (;;) {
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE) break;
        if (rc != SQLITE_ROW) {
            status = db_fail(s, op, sqlite3_extended_errcode(s->db));
            break;
        }
        if (n == cap) {
            int ncap = cap ? cap * 2 : 256;
            twk_store_step *grown = twk_host_realloc(arr, (size_t)cap * sizeof *arr, (size_t)ncap * sizeof *arr, "steps list");
            if (!grown) {
                status = TWK_ERR_OOM;
                break;
            }
            arr = grown;
            cap = ncap;
        }
        twk_store_step *r = &arr[n];
        memset(r, 0, sizeof *r);
        status = col_field(s, st, 0, r->run_id, sizeof r->run_id, op);
        if (status == TWK_OK) status = col_field(s, st, 1, r->tenant, sizeof r->tenant, op);
        r->kind = sqlite3_column_int(st, 2);
        r->seq = sqlite3_column_int64(st, 3);
        r->step = sqlite3_column_int64(st, 4);
        r->time = sqlite3_column_double(st, 5);
        if (status == TWK_OK) status = col_owned(s, st, 6, "{}", &r->metrics_json, "step metrics");
        if (status != TWK_OK) break;
        n++;
    }
    stmt_done(st);
    if (status != TWK_OK || n == 0) {
        twk_store_steps_free(arr, n);
        return status;
    }
    *out = arr;
    *n_out = n;
    return TWK_OK;
}

/* ---- the sessions' timelines (session_trace) ------------------------------ */

static twk_status trace_insert(twk_store *s, const twk_store_trace_rec *r, const char *op) {
    TRY(check_field(r->session_id, sizeof r->session_id, 1, "session_id", op));
    TRY(check_field(r->tenant, sizeof r->tenant, 1, "tenant", op));
    TRY(check_field(r->request_id, sizeof r->request_id, 1, "request_id", op));
    TRY(check_field(r->route, sizeof r->route, 0, "route", op));
    TRY(check_field(r->subject, sizeof r->subject, 0, "subject", op));
    TRY(check_field(r->category, sizeof r->category, 0, "category", op));
    TRY(check_field(r->error, sizeof r->error, 0, "error", op));
    sqlite3_stmt *st;
    TRY(stmt_get(s, ST_TRACE_INSERT, op, &st));
    BIND(bind_text(s, st, 1, r->session_id, op));
    BIND(bind_text(s, st, 2, r->tenant, op));
    BIND(bind_text(s, st, 3, r->request_id, op));
    BIND(bind_text(s, st, 4, r->route, op));
    BIND(bind_text(s, st, 5, r->subject, op));
    BIND(bind_int64(s, st, 6, r->start_ns, op));
    BIND(bind_int64(s, st, 7, r->end_ns, op));
    BIND(bind_int64(s, st, 8, r->ok ? 1 : 0, op));
    BIND(bind_text(s, st, 9, r->category, op));
    BIND(bind_text(s, st, 10, r->error, op));
    BIND(bind_int64(s, st, 11, r->tokens, op));
    return step_done(s, st, op, NULL);
}

static twk_status trace_insert_row(twk_store *s, const void *row, const char *op) { return trace_insert(s, row, op); }

static int trace_same_session(const void *a, const void *b) {
    return !strcmp(((const twk_store_trace_rec *)a)->session_id, ((const twk_store_trace_rec *)b)->session_id);
}

/* The session's oldest rows past cap go. */
static twk_status trace_trim(twk_store *s, const void *row, int cap, const char *op) {
    sqlite3_stmt *st;
    TRY(stmt_get(s, ST_TRACE_TRIM, op, &st));
    BIND(bind_text(s, st, 1, ((const twk_store_trace_rec *)row)->session_id, op));
    BIND(bind_int64(s, st, 2, cap, op));
    return step_done(s, st, op, NULL);
}

twk_status twk_store_trace_add(twk_store *s, const twk_store_trace_rec *rows, int n, int cap, int *n_failed) {
    static const batch_spec bs = {sizeof *rows, trace_insert_row, trace_same_session, trace_trim};
    return batch_add(s, &bs, rows, n, cap, 1, n_failed, "trace add");
}

twk_status twk_store_trace_stats(twk_store *s, const char *tenant, const char *session_id, int64_t *last_seq,
                                 int64_t *n_rows) {
    const char *op = "trace stats";
    NEED(last_seq, "last_seq", op);
    NEED(n_rows, "n_rows", op);
    *last_seq = *n_rows = 0;
    NEED(s, "store", op);
    NEED(tenant, "tenant", op);
    NEED(session_id, "session_id", op);
    sqlite3_stmt *st;
    TRY(stmt_get(s, ST_TRACE_STATS, op, &st));
    BIND(bind_text(s, st, 1, tenant, op));
    BIND(bind_text(s, st, 2, session_id, op));
    int rc = sqlite3_step(st);
    twk_status status = TWK_OK;
    if (rc == SQLITE_ROW) {
        *last_seq = sqlite3_column_int64(st, 0);
        *n_rows = sqlite3_column_int64(st, 1);
    } else {
        status = db_fail(s, op, sqlite3_extended_errcode(s->db));
    }
    stmt_done(st);
    return status;
}

twk_status twk_store_trace_each(twk_store *s, const char *tenant, const char *session_id, twk_store_trace_fn fn,
                                void *user) {
    const char *op = "trace list";
    NEED(s, "store", op);
    NEED(tenant, "tenant", op);
    NEED(session_id, "session_id", op);
    NEED(fn, "fn", op);
    sqlite3_stmt *st;
    TRY(stmt_get(s, ST_TRACE_LIST, op, &st));
    BIND(bind_text(s, st, 1, tenant, op));
    BIND(bind_text(s, st, 2, session_id, op));
    twk_status status = TWK_OK;
    twk_store_trace_rec *r = twk_host_calloc(sizeof *r, "trace row");
    if (!r) status = TWK_ERR_OOM;
    while (status == TWK_OK) {
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE) break;
        if (rc != SQLITE_ROW) {
            status = db_fail(s, op, sqlite3_extended_errcode(s->db));
            break;
        }
        memset(r, 0, sizeof *r);
        snprintf(r->session_id, sizeof r->session_id, "%s", session_id);
        snprintf(r->tenant, sizeof r->tenant, "%s", tenant);
        r->seq = sqlite3_column_int64(st, 0);
        status = col_field(s, st, 1, r->request_id, sizeof r->request_id, op);
        if (status == TWK_OK) status = col_field(s, st, 2, r->route, sizeof r->route, op);
        if (status == TWK_OK) status = col_field(s, st, 3, r->subject, sizeof r->subject, op);
        r->start_ns = sqlite3_column_int64(st, 4);
        r->end_ns = sqlite3_column_int64(st, 5);
        r->ok = sqlite3_column_int(st, 6) != 0;
        if (status == TWK_OK) status = col_field(s, st, 7, r->category, sizeof r->category, op);
        if (status == TWK_OK) status = col_field(s, st, 8, r->error, sizeof r->error, op);
        r->tokens = sqlite3_column_int64(st, 9);
        if (status == TWK_OK) status = fn(user, r);
    }
    stmt_done(st);
    twk_host_free(r);
    return status;
}
