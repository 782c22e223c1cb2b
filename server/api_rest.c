/* REST listings of the Tinker API: training runs, checkpoints (list, delete,
 * ttl, publish) and sessions. Every lookup goes through the store with the
 * caller's tenant, so another tenant's objects are simply absent (404). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api_util.h"
#include "svc.h"


static cJSON *run_json(const twk_store_run *r, const twk_store_ckpt *last_w, const twk_store_ckpt *last_s);

static cJSON *ckpt_json(const twk_store_ckpt *c) {
    cJSON *j = cJSON_CreateObject();
    char t[40], path[512];
    cJSON_AddStringToObject(j, "checkpoint_id", c->checkpoint_id);
    cJSON_AddStringToObject(j, "checkpoint_type", svc_ckpt_type(c->checkpoint_id));
    api_iso_time(c->created, t, sizeof t);
    cJSON_AddStringToObject(j, "time", t);
    snprintf(path, sizeof path, "tinker://%s/%s", c->run_id, c->checkpoint_id);
    cJSON_AddStringToObject(j, "tinker_path", path);
    cJSON_AddNumberToObject(j, "size_bytes", (double)c->size_bytes);
    cJSON_AddBoolToObject(j, "public", c->is_public);
    if (c->expires_at > 0) {
        api_iso_time(c->expires_at, t, sizeof t);
        cJSON_AddStringToObject(j, "expires_at", t);
    } else {
        cJSON_AddNullToObject(j, "expires_at");
    }
    cJSON *meta = cJSON_Parse(c->user_metadata_json[0] ? c->user_metadata_json : "{}");
    api_json_put(j, "user_metadata", meta ? meta : cJSON_CreateObject());
    return j;
}

static cJSON *run_json(const twk_store_run *r, const twk_store_ckpt *last_w, const twk_store_ckpt *last_s) {
    cJSON *j = cJSON_CreateObject();
    char t[40];
    cJSON_AddStringToObject(j, "training_run_id", r->id);
    cJSON_AddStringToObject(j, "base_model", r->base_model);
    cJSON_AddStringToObject(j, "model_owner", r->tenant);
    cJSON_AddBoolToObject(j, "is_lora", r->is_lora);
    cJSON_AddBoolToObject(j, "corrupted", 0);
    cJSON_AddNumberToObject(j, "lora_rank", r->lora_rank);
    api_iso_time(r->last_request, t, sizeof t);
    cJSON_AddStringToObject(j, "last_request_time", t);
    if (last_w) api_json_put(j, "last_checkpoint", ckpt_json(last_w));
    else cJSON_AddNullToObject(j, "last_checkpoint");
    if (last_s) api_json_put(j, "last_sampler_checkpoint", ckpt_json(last_s));
    else cJSON_AddNullToObject(j, "last_sampler_checkpoint");
    cJSON *meta = cJSON_Parse(r->user_metadata_json ? r->user_metadata_json : "{}");
    api_json_put(j, "user_metadata", meta ? meta : cJSON_CreateObject());
    return j;
}

static cJSON *cursor_json(long offset, long limit, int total) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "offset", (double)offset);
    cJSON_AddNumberToObject(c, "limit", (double)limit);
    cJSON_AddNumberToObject(c, "total_count", total);
    return c;
}

/* Checkpoints of a run as `tenant` sees them: its own run's, or (tenant NULL) another tenant's
 * published ones. */
static twk_status list_run_ckpts(svc *s, const char *tenant, const char *run_id, int limit, int offset,
                                 twk_store_ckpt **out, int *n, int *total) {
    return tenant ? twk_store_ckpt_list(s->store, tenant, run_id, limit, offset, out, n, total)
                  : twk_store_ckpt_list_public(s->store, run_id, limit, offset, out, n, total);
}

/* The run's newest checkpoint of each kind, for TrainingRun (tenant NULL: published ones only). */
static cJSON *run_with_last(svc *s, const char *tenant, const twk_store_run *r) {
    twk_store_ckpt *list = NULL, *w = NULL, *sp = NULL;
    int n = 0, total = 0;
    if (list_run_ckpts(s, tenant, r->id, 1000, 0, &list, &n, &total) == TWK_OK)
        for (int i = 0; i < n; i++) {
            if (!w && !strncmp(list[i].checkpoint_id, "weights/", 8)) w = &list[i];
            if (!sp && !strncmp(list[i].checkpoint_id, "sampler_weights/", 16)) sp = &list[i];
        }
    cJSON *j = run_json(r, w, sp);
    twk_host_free(list);
    return j;
}

static void list_runs(svc *s, twk_http_conn *c, const twk_http_req *req, const char *tenant) {
    long limit = api_query_int(req->query, "limit", 20, 1, 1000), offset = api_query_int(req->query, "offset", 0, 0, 2147483647L);
    twk_store_run *runs = NULL;
    int n = 0, total = 0;
    if (twk_store_run_list(s->store, tenant, NULL, (int)limit, (int)offset, &runs, &n, &total) != TWK_OK) {
        api_error(c, 500, "listing runs failed: %s", twk_last_error());
        return;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(j, "training_runs");
    for (int i = 0; i < n; i++) {
        api_json_push(arr, run_with_last(s, tenant, &runs[i]));
        twk_store_run_clear(&runs[i]);
    }
    twk_host_free(runs);
    api_json_put(j, "cursor", cursor_json(offset, limit, total));
    api_ok(c, j);
}

/* The run record `tenant` may read: its own run, or another tenant's run with a published
 * checkpoint. 0 if neither. */
static int visible_run(svc *s, const char *tenant, const char *run_id, twk_store_run *r) {
    if (twk_store_run_get(s->store, tenant, run_id, r) == TWK_OK) return 1;
    twk_store_ckpt *pub = NULL;
    int n = 0, total = 0;
    int ok = twk_store_ckpt_list_public(s->store, run_id, 1, 0, &pub, &n, &total) == TWK_OK && n == 1 &&
             twk_store_run_get(s->store, pub[0].tenant, run_id, r) == TWK_OK;
    twk_host_free(pub);
    return ok;
}

static void list_ckpts(svc *s, twk_http_conn *c, const twk_http_req *req, const char *tenant, const char *run_id) {
    long limit = api_query_int(req->query, "limit", 100, 1, 1000), offset = api_query_int(req->query, "offset", 0, 0, 2147483647L);
    if (run_id) {
        twk_store_run r;
        if (!visible_run(s, tenant, run_id, &r)) {
            api_error(c, 404, "training run '%s' not found", run_id);
            return;
        }
        if (strcmp(r.tenant, tenant)) tenant = NULL; /* another tenant's run: its published checkpoints */
        twk_store_run_clear(&r);
    }
    twk_store_ckpt *list = NULL;
    int n = 0, total = 0;
    if (list_run_ckpts(s, tenant, run_id, (int)limit, (int)offset, &list, &n, &total) != TWK_OK) {
        api_error(c, 500, "listing checkpoints failed: %s", twk_last_error());
        return;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(j, "checkpoints");
    for (int i = 0; i < n; i++) api_json_push(arr, ckpt_json(&list[i]));
    twk_host_free(list);
    api_json_put(j, "cursor", cursor_json(offset, limit, total));
    api_ok(c, j);
}

/* /training_runs/{run}/checkpoints/{kind}/{name}[/ttl|/publish] */
static void ckpt_action(svc *s, twk_http_conn *c, const twk_http_req *req, const char *tenant, const char *run,
                        const char *rest) {
    char kind[32], name[128], action[32] = "";
    const char *a = strchr(rest, '/');
    if (!a || (size_t)(a - rest) >= sizeof kind) {
        api_error(c, 404, "no such checkpoint");
        return;
    }
    memcpy(kind, rest, (size_t)(a - rest));
    kind[a - rest] = 0;
    const char *b = strchr(a + 1, '/');
    size_t nl = b ? (size_t)(b - a - 1) : strlen(a + 1);
    if (nl == 0 || nl >= sizeof name || (b && strlen(b + 1) >= sizeof action)) {
        api_error(c, 404, "no such checkpoint");
        return;
    }
    memcpy(name, a + 1, nl);
    name[nl] = 0;
    if (b) snprintf(action, sizeof action, "%s", b + 1);
    char ckid[200];
    snprintf(ckid, sizeof ckid, "%s/%s", kind, name);
    twk_store_ckpt ck;
    if (twk_store_ckpt_get(s->store, tenant, run, ckid, &ck) != TWK_OK) {
        /* another tenant's published checkpoint: readable, never changed */
        if (!action[0] && !strcmp(req->method, "GET") && twk_store_ckpt_get_public(s->store, run, ckid, &ck) == TWK_OK)
            api_ok(c, ckpt_json(&ck));
        else api_error(c, 404, "checkpoint tinker://%s/%s not found", run, ckid);
        return;
    }
    char err[600];
    if (!action[0] && !strcmp(req->method, "DELETE")) {
        if (svc_ckpt_remove(s, &ck, err, sizeof err) != 0) api_error(c, 500, "%s", err);
        else twk_http_respond_json(c, 200, "{}");
    } else if (!action[0] && !strcmp(req->method, "GET")) {
        api_ok(c, ckpt_json(&ck));
    } else if (!strcmp(action, "ttl") && !strcmp(req->method, "PUT")) {
        cJSON *body = api_body(c, req);
        if (!body) return;
        double ttl = 0;
        int ok = api_ttl(body, &ttl, err, sizeof err);
        cJSON_Delete(body);
        if (!ok) api_error(c, 400, "%s", err);
        else if (twk_store_ckpt_set_ttl(s->store, tenant, run, ckid, ttl > 0 ? (double)time(NULL) + ttl : 0) != TWK_OK)
            api_error(c, 500, "storing the ttl failed: %s", twk_last_error());
        else twk_http_respond_json(c, 200, "{}");
    } else if (!strcmp(action, "external_weights_urls") && !strcmp(req->method, "GET") &&
               !strcmp(kind, "external_weights")) {
        api_weights_urls(s, c, req, &ck);
    } else if (!strcmp(action, "publish") && (!strcmp(req->method, "POST") || !strcmp(req->method, "DELETE"))) {
        if (twk_store_ckpt_set_public(s->store, tenant, run, ckid, !strcmp(req->method, "POST")) != TWK_OK)
            api_error(c, 500, "storing the published state failed: %s", twk_last_error());
        else twk_http_respond_json(c, 200, "{}");
    } else {
        api_error(c, 404, "no such endpoint: %s %s", req->method, req->path);
    }
}

static void session_get(svc *s, twk_http_conn *c, const char *tenant, const char *id) {
    twk_store_session sess;
    if (twk_store_session_get(s->store, tenant, id, &sess) != TWK_OK) {
        api_error(c, 404, "session '%s' not found", id);
        return;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON *ids = cJSON_AddArrayToObject(j, "training_run_ids");
    twk_store_run *runs = NULL;
    int n = 0, total = 0;
    if (twk_store_run_list(s->store, tenant, id, 1000, 0, &runs, &n, &total) == TWK_OK) {
        for (int i = 0; i < n; i++) {
            api_json_push(ids, cJSON_CreateString(runs[i].id));
            twk_store_run_clear(&runs[i]);
        }
        twk_host_free(runs);
    }
    cJSON_AddArrayToObject(j, "sampler_ids");
    cJSON *meta = cJSON_Parse(sess.user_metadata_json ? sess.user_metadata_json : "{}");
    api_json_put(j, "user_metadata", meta ? meta : cJSON_CreateObject());
    twk_store_session_clear(&sess);
    api_ok(c, j);
}

/* GET get_server_capabilities: the served base models. */
static void capabilities(svc *s, twk_http_conn *c) {
    cJSON *j = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(j, "supported_models");
    for (int i = 0; i < s->n_models; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "model_name", s->models[i].name);
        cJSON_AddNumberToObject(m, "max_context_length", (double)s->cfg.max_context);
        cJSON_AddBoolToObject(m, "trainable", 1);
        cJSON_AddBoolToObject(m, "sampleable", 1);
        api_json_push(arr, m);
    }
    api_ok(c, j);
}

void api_rest(svc *s, twk_http_conn *c, const twk_http_req *req, const char *tenant, const char *route) {
    int get = !strcmp(req->method, "GET");
    if (get && !strcmp(route, "get_server_capabilities")) {
        capabilities(s, c);
        return;
    }
    if (get && !strncmp(route, "samplers/", 9)) {
        api_sampling(s, c, req, tenant, route, NULL);
        return;
    }
    if (get && !strcmp(route, "training_runs")) {
        list_runs(s, c, req, tenant);
        return;
    }
    if (get && !strcmp(route, "checkpoints")) {
        list_ckpts(s, c, req, tenant, NULL);
        return;
    }
    if (get && !strcmp(route, "sessions")) {
        long limit = api_query_int(req->query, "limit", 20, 1, 1000), offset = api_query_int(req->query, "offset", 0, 0, 2147483647L);
        char **ids = NULL;
        int n = 0, total = 0;
        if (twk_store_session_list(s->store, tenant, (int)limit, (int)offset, &ids, &n, &total) != TWK_OK) {
            api_error(c, 500, "listing sessions failed: %s", twk_last_error());
            return;
        }
        cJSON *j = cJSON_CreateObject();
        cJSON *arr = cJSON_AddArrayToObject(j, "sessions");
        for (int i = 0; i < n; i++) {
            api_json_push(arr, cJSON_CreateString(ids[i]));
            twk_host_free(ids[i]);
        }
        twk_host_free(ids);
        api_json_put(j, "cursor", cursor_json(offset, limit, total));
        api_ok(c, j);
        return;
    }
    if (!strncmp(route, "sessions/", 9)) {
        char id[96];
        const char *rest = route + 9, *slash = strchr(rest, '/');
        size_t n = slash ? (size_t)(slash - rest) : strlen(rest);
        if (n == 0 || n >= sizeof id) {
            api_error(c, 404, "session not found");
            return;
        }
        memcpy(id, rest, n);
        id[n] = 0;
        if (get && !slash) {
            session_get(s, c, tenant, id);
        } else if (!strcmp(req->method, "POST") && slash && !strcmp(slash, "/finish")) {
            if (twk_store_session_finish(s->store, tenant, id) != TWK_OK) api_error(c, 404, "session '%s' not found", id);
            else {
                svc_session_finished(s, tenant, id); /* its unnamed snapshots freed, its runs spilled */
                twk_http_respond_json(c, 200, "{}");
            }
        } else {
            api_error(c, 404, "no such endpoint: %s %s", req->method, req->path);
        }
        return;
    }
    if (!strncmp(route, "training_runs/", 14)) {
        char run[128];
        const char *rest = route + 14, *slash = strchr(rest, '/');
        size_t n = slash ? (size_t)(slash - rest) : strlen(rest);
        if (n == 0 || n >= sizeof run) {
            api_error(c, 404, "training run not found");
            return;
        }
        memcpy(run, rest, n);
        run[n] = 0;
        if (!slash && get) {
            twk_store_run r;
            if (!visible_run(s, tenant, run, &r)) {
                api_error(c, 404, "training run '%s' not found", run);
                return;
            }
            cJSON *j = run_with_last(s, strcmp(r.tenant, tenant) ? NULL : tenant, &r);
            twk_store_run_clear(&r);
            api_ok(c, j);
            return;
        }
        if (slash && !strcmp(slash, "/checkpoints") && get) {
            list_ckpts(s, c, req, tenant, run);
            return;
        }
        if (slash && !strncmp(slash, "/checkpoints/", 13)) {
            ckpt_action(s, c, req, tenant, run, slash + 13);
            return;
        }
    }
    api_error(c, 404, "no such endpoint: %s %s", req->method, req->path);
}
