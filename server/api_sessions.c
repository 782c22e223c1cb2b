/* The SDK's remaining service calls: cancel_future, join_sampling_session,
 * sessions/search, auth/token (the JWT that the SDK's whoami reads), and the
 * routing of sessions/{id}/trace_export (api_trace.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api_util.h"
#include "svc.h"

#define TOKEN_LIFETIME_S 3600
#define SEARCH_PAGE 1000 /* sessions read from the store at a time (its page limit) */

/* ---- cancel_future ---- */

static void h_cancel(svc *s, twk_http_conn *c, const cJSON *b, const char *tenant) {
    const char *id;
    char err[256];
    if (!api_str(b, "request_id", 1, &id, err, sizeof err)) {
        api_error(c, 400, "%s", err);
        return;
    }
    int r = twk_futures_cancel(s->futures, tenant, id);
    if (r < 0) {
        api_error(c, 404, "request_id '%s' not found", id);
        return;
    }
    /* queued work is dropped; work already running finishes and its result is discarded */
    if (r > 0 && !svc_sample_cancel(s, id)) svc_op_cancel(s, tenant, id);
    twk_http_respond_json(c, 200, "{}");
}

/* ---- join_sampling_session ---- */

static void h_join(svc *s, twk_http_conn *c, const cJSON *b, const char *tenant) {
    const char *sid;
    char err[256], out[96];
    if (!api_str(b, "sampling_session_id", 1, &sid, err, sizeof err)) {
        api_error(c, 400, "%s", err);
        return;
    }
    sampler_session *ss = svc_find_sampler(s, tenant, sid);
    if (!ss) {
        api_error(c, 404, "sampling session '%s' not found", sid);
        return;
    }
    snprintf(out, sizeof out, "{\"type\":\"join_sampling_session\",\"client_counter\":%d}", ++ss->n_clients);
    twk_http_respond_json(c, 200, out);
}

/* ---- auth/token ---- */

/* base64url without padding of n bytes into out (4n/3 + 4 bytes). */
static void b64url(const unsigned char *in, size_t n, char *out) {
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)in[i] << 16 | (i + 1 < n ? (unsigned)in[i + 1] << 8 : 0) | (i + 2 < n ? in[i + 2] : 0);
        out[o++] = a[v >> 18 & 63];
        out[o++] = a[v >> 12 & 63];
        if (i + 1 < n) out[o++] = a[v >> 6 & 63];
        if (i + 2 < n) out[o++] = a[v & 63];
    }
    out[o] = 0;
}

/* A JWT naming tenant (sub tml:user:<tenant>, org_id <tenant>), signed with 32 random bytes that
 * only this server's memory knows (twk_auth_token_add): the SDK reads its claims, the server
 * accepts it back as a key until exp. */
static void h_auth_token(svc *s, twk_http_conn *c, const char *tenant) {
    char hex[72], head[64], payload[512], claims[400], sig[64], token[700];
    double now = (double)time(NULL), exp = now + TOKEN_LIFETIME_S;
    if (twk_random_hex(hex, 32) != 0) {
        api_error(c, 503, "no randomness for a token");
        return;
    }
    b64url((const unsigned char *)"{\"alg\":\"HS256\",\"typ\":\"JWT\"}", 27, head);
    int n = snprintf(claims, sizeof claims,
                     "{\"iss\":\"twinkle\",\"sub\":\"tml:user:%s\",\"org_id\":\"%s\",\"email\":\"\",\"iat\":%.0f,"
                     "\"exp\":%.0f}", tenant, tenant, now, exp);
    b64url((const unsigned char *)claims, (size_t)n, payload);
    b64url((const unsigned char *)hex, 32, sig);
    snprintf(token, sizeof token, "%s.%s.%s", head, payload, sig);
    if (twk_auth_token_add(s->auth, token, tenant, exp) != 0) {
        api_error(c, 503, "out of memory for the token");
        return;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "jwt", token);
    api_ok(c, j);
}

/* ---- sessions/search ---- */

/* The search's filters on one session (session_id / display_name, user_metadata, statuses). */
static int session_matches(const cJSON *b, const twk_store_session *sess) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "session_id");
    const cJSON *dn = cJSON_GetObjectItemCaseSensitive(b, "display_name");
    /* sessions here have no display name: only session_id can match (either one matches) */
    if (cJSON_IsString(id) || cJSON_IsString(dn))
        if (!cJSON_IsString(id) || strcmp(id->valuestring, sess->id)) return 0;
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(b, "user_metadata");
    if (cJSON_IsObject(want) && want->child) {
        cJSON *meta = cJSON_Parse(sess->user_metadata_json ? sess->user_metadata_json : "{}");
        int ok = 1;
        for (const cJSON *kv = want->child; ok && kv; kv = kv->next) {
            const cJSON *have = cJSON_GetObjectItemCaseSensitive(meta, kv->string);
            ok = cJSON_IsString(kv) && cJSON_IsString(have) && !strcmp(have->valuestring, kv->valuestring);
        }
        cJSON_Delete(meta);
        if (!ok) return 0;
    }
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(b, "statuses");
    if (cJSON_IsArray(st)) {
        const char *mine = sess->finished ? "client_finished" : "active";
        int any = 0;
        for (const cJSON *q = st->child; q && !any; q = q->next) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(q, "type");
            any = cJSON_IsString(t) && !strcmp(t->valuestring, mine);
        }
        if (!any) return 0;
    }
    return 1;
}

static cJSON *session_summary(svc *s, const char *tenant, const twk_store_session *sess) {
    cJSON *j = cJSON_CreateObject();
    char t[40], owner[96];
    cJSON_AddStringToObject(j, "session_id", sess->id);
    api_iso_time(sess->created, t, sizeof t);
    cJSON_AddStringToObject(j, "created_at", t);
    snprintf(owner, sizeof owner, "tml:user:%s", tenant);
    cJSON_AddStringToObject(j, "owner", owner);
    cJSON_AddStringToObject(j, "project_id", "default");
    cJSON *status = cJSON_AddObjectToObject(j, "status");
    if (sess->finished) {
        cJSON_AddStringToObject(status, "type", "client_finished");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(status, "reason"), "type", "success");
    } else {
        cJSON_AddStringToObject(status, "type", "active");
    }
    int64_t n_ck = 0, bytes = 0;
    twk_store_run *runs = NULL;
    int n = 0, total = 0;
    if (twk_store_run_list(s->store, tenant, sess->id, 1000, 0, &runs, &n, &total) == TWK_OK) {
        for (int i = 0; i < n; i++) {
            twk_store_ckpt *ck = NULL;
            int nc = 0, tc = 0;
            if (twk_store_ckpt_list(s->store, tenant, runs[i].id, 1000, 0, &ck, &nc, &tc) == TWK_OK) {
                n_ck += tc;
                for (int k = 0; k < nc; k++) bytes += ck[k].size_bytes;
                twk_host_free(ck);
            }
            twk_store_run_clear(&runs[i]);
        }
        twk_host_free(runs);
    }
    cJSON_AddNumberToObject(j, "checkpoints_count", (double)n_ck);
    cJSON_AddNumberToObject(j, "checkpoint_storage_bytes", (double)bytes);
    cJSON_AddNullToObject(j, "display_name");
    cJSON *meta = cJSON_Parse(sess->user_metadata_json ? sess->user_metadata_json : "{}");
    cJSON_AddItemToObject(j, "user_metadata", meta ? meta : cJSON_CreateObject());
    return j;
}

/* Whose sessions: "own" and "accessible" are the caller's (a tenant reads only its own);
 * "user" matches when the caller's URN is listed. 0 with err when malformed. */
static int search_owner(const cJSON *b, const char *tenant, int *mine, char *err, size_t n) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(b, "owner");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    *mine = 1;
    if (!o || cJSON_IsNull(o)) return 1;
    if (!cJSON_IsString(t)) {
        snprintf(err, n, "owner.type must be 'own', 'accessible' or 'user'");
        return 0;
    }
    if (!strcmp(t->valuestring, "own") || !strcmp(t->valuestring, "accessible")) return 1;
    const cJSON *urns = cJSON_GetObjectItemCaseSensitive(o, "owner_urns");
    if (strcmp(t->valuestring, "user") || !cJSON_IsArray(urns)) {
        snprintf(err, n, "owner.type must be 'own', 'accessible' or 'user' (with owner_urns)");
        return 0;
    }
    char me[96];
    snprintf(me, sizeof me, "tml:user:%s", tenant);
    *mine = 0;
    for (const cJSON *u = urns->child; u; u = u->next)
        if (cJSON_IsString(u) && !strcmp(u->valuestring, me)) *mine = 1;
    return 1;
}

/* Whether (created, id) comes after the cursor in the listing's order (newest first, then id). */
static int after_cursor(const cJSON *cur, const twk_store_session *sess) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(cur, "last_session_id");
    const cJSON *at = cJSON_GetObjectItemCaseSensitive(cur, "last_created_at");
    if (!cJSON_IsString(id) || !cJSON_IsString(at)) return 1;
    char t[40];
    api_iso_time(sess->created, t, sizeof t);
    int c = strncmp(t, at->valuestring, 19); /* ISO seconds compare as text */
    return c < 0 || (c == 0 && strcmp(sess->id, id->valuestring) > 0);
}

static void h_search(svc *s, twk_http_conn *c, const cJSON *b, const char *tenant) {
    long long limit;
    int mine;
    char err[256];
    if (!api_int(b, "limit", 0, 1, 200, 50, &limit, err, sizeof err) || !search_owner(b, tenant, &mine, err, sizeof err)) {
        api_error(c, 400, "%s", err);
        return;
    }
    const cJSON *proj = cJSON_GetObjectItemCaseSensitive(b, "project_ids");
    if (cJSON_IsArray(proj) && proj->child) {
        api_error(c, 400, "project_ids: this server has no projects (every session is in 'default'); leave it null");
        return;
    }
    const cJSON *cur = cJSON_GetObjectItemCaseSensitive(b, "cursor");
    cJSON *j = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(j, "sessions");
    int taken = 0, more = 0, total = 0;
    char last_id[96] = "", last_at[40] = "";
    /* the tenant's sessions, newest first, a store page at a time */
    for (int offset = 0; mine && !more && (offset == 0 || offset < total); offset += SEARCH_PAGE) {
        char **ids = NULL;
        int n = 0;
        if (twk_store_session_list(s->store, tenant, SEARCH_PAGE, offset, &ids, &n, &total) != TWK_OK) {
            cJSON_Delete(j);
            api_error(c, 500, "listing sessions failed: %s", twk_last_error());
            return;
        }
        for (int i = 0; i < n; i++) {
            twk_store_session sess;
            if (!more && twk_store_session_get(s->store, tenant, ids[i], &sess) == TWK_OK) {
                if ((!cJSON_IsObject(cur) || after_cursor(cur, &sess)) && session_matches(b, &sess)) {
                    if (taken == limit) {
                        more = 1;
                    } else {
                        cJSON_AddItemToArray(arr, session_summary(s, tenant, &sess));
                        taken++;
                        snprintf(last_id, sizeof last_id, "%s", sess.id);
                        api_iso_time(sess.created, last_at, sizeof last_at);
                    }
                }
                twk_store_session_clear(&sess);
            }
            twk_host_free(ids[i]);
        }
        twk_host_free(ids);
        if (n == 0) break;
    }
    if (more) {
        cJSON *nc = cJSON_AddObjectToObject(j, "next_cursor");
        cJSON_AddStringToObject(nc, "last_created_at", last_at);
        cJSON_AddStringToObject(nc, "last_session_id", last_id);
    } else {
        cJSON_AddNullToObject(j, "next_cursor");
    }
    api_ok(c, j);
}

int api_sessions(svc *s, twk_http_conn *c, const twk_http_req *req, const char *tenant, const char *route) {
    int post = !strcmp(req->method, "POST");
    size_t rl = strlen(route);
    if (!strcmp(req->method, "GET") && !strncmp(route, "sessions/", 9) && rl > 9 + 13 &&
        !strcmp(route + rl - 13, "/trace_export")) {
        char id[96];
        size_t n = rl - 9 - 13;
        if (n >= sizeof id || memchr(route + 9, '/', n)) return 0;
        memcpy(id, route + 9, n);
        id[n] = 0;
        api_trace_export(s, c, req, tenant, id); /* api_trace.c */
        return 1;
    }
    if (!post || (strcmp(route, "cancel_future") && strcmp(route, "join_sampling_session") &&
                  strcmp(route, "sessions/search") && strcmp(route, "auth/token") && strcmp(route, "retrieve_futures")))
        return 0;
    cJSON *b = api_body(c, req);
    if (!b) return 1;
    if (!strcmp(route, "cancel_future")) h_cancel(s, c, b, tenant);
    else if (!strcmp(route, "join_sampling_session")) h_join(s, c, b, tenant);
    else if (!strcmp(route, "sessions/search")) h_search(s, c, b, tenant);
    else if (!strcmp(route, "retrieve_futures")) api_retrieve_futures(s, c, b, tenant);
    else h_auth_token(s, c, tenant);
    cJSON_Delete(b);
    return 1;
}
