/* Getting weights out: signed, expiring download URLs for external-weights
 * checkpoints (served by this server, no API key: the signature is the
 * permission, as a presigned URL), and copy_weights. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api_util.h"
#include "sign.h"
#include "svc.h"

#define URL_ROUTE "external_weights/"
#define COPY_TTL_MIN_S 3600.0

/* The signed text of a URL: "<what>\n<expires>" (a file of a checkpoint: "<run>/<name>/<file>"). */
void svc_url_sign(const svc *s, const char *what, long long expires, char sig[65]) {
    char msg[700];
    snprintf(msg, sizeof msg, "%s\n%lld", what, expires);
    twk_hmac_hex(s->url_key, msg, sig);
}

static void sign_file(const svc *s, const char *run, const char *name, const char *file, long long expires,
                      char sig[65]) {
    char what[600];
    snprintf(what, sizeof what, "%s/%s/%s", run, name, file);
    svc_url_sign(s, what, expires, sig);
}

/* 1 if every byte of v is in [A-Za-z0-9] or `extra`. */
static int chars_ok(const char *v, const char *extra) {
    if (!v || !*v) return 0;
    for (; *v; v++)
        if (!isalnum((unsigned char)*v) && !strchr(extra, *v)) return 0;
    return 1;
}

void svc_base_url(const svc *s, const twk_http_req *req, char *out, size_t len) {
    const char *host = twk_http_header_get(req, "Host");
    const char *proto = twk_http_header_get(req, "X-Forwarded-Proto");
    const char *scheme = proto && !strcmp(proto, "https") ? "https" : "http";
    if (host && strlen(host) < 256 && chars_ok(host, ".-:[]_")) snprintf(out, len, "%s://%s", scheme, host);
    else snprintf(out, len, "http://%s:%d", s->cfg.host, twk_http_server_port(s->http));
}

void api_weights_urls(svc *s, twk_http_conn *c, const twk_http_req *req, const twk_store_ckpt *ck) {
    const char *name = strchr(ck->checkpoint_id, '/') + 1; /* "external_weights/<name>" */
    DIR *d = opendir(ck->path);
    if (!d) {
        api_error(c, 500, "checkpoint folder of tinker://%s/%s is missing", ck->run_id, ck->checkpoint_id);
        return;
    }
    long long expires = (long long)time(NULL) + (long long)s->cfg.url_ttl_s;
    char base[300], t[40];
    svc_base_url(s, req, base, sizeof base);
    cJSON *j = cJSON_CreateObject();
    cJSON *urls = cJSON_AddObjectToObject(j, "urls");
    struct dirent *e;
    while ((e = readdir(d))) {
        char file[1400], sig[65], url[1200];
        struct stat sb;
        snprintf(file, sizeof file, "%s/%s", ck->path, e->d_name);
        if (!api_valid_name(e->d_name) || stat(file, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        sign_file(s, ck->run_id, name, e->d_name, expires, sig);
        snprintf(url, sizeof url, "%s/api/v1/" URL_ROUTE "%s/%s/%s?expires=%lld&sig=%s", base, ck->run_id, name,
                 e->d_name, expires, sig);
        cJSON_AddStringToObject(urls, e->d_name, url);
    }
    closedir(d);
    api_iso_time((double)expires, t, sizeof t);
    cJSON_AddStringToObject(j, "expires", t);
    api_ok(c, j);
}

/* Query parameter `key` of "a=1&b=2" into out; 0 when absent or too long. */
static int query_str(const char *q, const char *key, char *out, size_t len) {
    size_t kl = strlen(key);
    for (const char *p = q; p && *p; p = strchr(p, '&') ? strchr(p, '&') + 1 : NULL) {
        if (strncmp(p, key, kl) || p[kl] != '=') continue;
        const char *v = p + kl + 1, *end = strchr(v, '&');
        size_t n = end ? (size_t)(end - v) : strlen(v);
        if (n >= len) return 0;
        memcpy(out, v, n);
        out[n] = 0;
        return 1;
    }
    return 0;
}

/* A download in flight: the file is read on libuv's thread pool, not the loop thread. */
typedef struct download {
    uv_work_t work;
    twk_http_conn *c; /* NULL once the client went away */
    char path[1400];
    char what[500];   /* the 404 message */
    char *data;       /* thread pool: the file's bytes */
    size_t len;
} download;

static void dl_read(uv_work_t *w) {
    download *d = w->data;
    d->data = twk_read_file(d->path, &d->len);
}

static void dl_abandon(twk_http_conn *c, void *user) {
    (void)c;
    ((download *)user)->c = NULL;
}

static void dl_done(uv_work_t *w, int status) {
    download *d = w->data;
    (void)status;
    if (d->c) {
        twk_http_set_abandon(d->c, NULL, NULL);
        if (d->data) twk_http_respond(d->c, 200, "application/octet-stream", d->data, d->len, NULL);
        else api_error(d->c, 404, "%s", d->what);
    }
    twk_host_free(d->data);
    twk_host_free(d);
}

void svc_send_file(svc *s, twk_http_conn *c, const char *path, const char *missing) {
    download *d = twk_host_calloc(sizeof *d, "download");
    if (!d) {
        api_error(c, 503, "out of memory");
        return;
    }
    snprintf(d->path, sizeof d->path, "%s", path);
    snprintf(d->what, sizeof d->what, "%s", missing);
    d->c = c;
    d->work.data = d;
    twk_http_set_abandon(c, dl_abandon, d);
    if (uv_queue_work(s->loop, &d->work, dl_read, dl_done) != 0) {
        twk_http_set_abandon(c, NULL, NULL);
        twk_host_free(d);
        api_error(c, 503, "cannot queue the download");
    }
}

int svc_url_check(svc *s, twk_http_conn *c, const twk_http_req *req, const char *what, const char *renew) {
    char exp_txt[24], sig[80], want[65];
    char *end = NULL;
    long long expires = query_str(req->query, "expires", exp_txt, sizeof exp_txt) ? strtoll(exp_txt, &end, 10) : 0;
    int have = end && !*end && query_str(req->query, "sig", sig, sizeof sig);
    svc_url_sign(s, what, expires, want);
    if (!have || !twk_const_eq(sig, want)) {
        api_error(c, 403, "the download URL's signature does not match (altered or not signed by this server)");
        return 0;
    }
    if ((long long)time(NULL) > expires) {
        api_error(c, 410, "the download URL expired; %s", renew);
        return 0;
    }
    return 1;
}

int api_weights_download(svc *s, twk_http_conn *c, const twk_http_req *req) {
    const char *p = strstr(req->path, "/api/v1/" URL_ROUTE);
    if (!p) return 0;
    p += strlen("/api/v1/" URL_ROUTE);
    char run[128], name[128], file[128];
    const char *a = strchr(p, '/'), *b = a ? strchr(a + 1, '/') : NULL;
    size_t lr = a ? (size_t)(a - p) : 0, ln = b ? (size_t)(b - a - 1) : 0;
    if (!b || !lr || lr >= sizeof run || !ln || ln >= sizeof name || strlen(b + 1) >= sizeof file) {
        api_error(c, 404, "no such download");
        return 1;
    }
    memcpy(run, p, lr);
    run[lr] = 0;
    memcpy(name, a + 1, ln);
    name[ln] = 0;
    snprintf(file, sizeof file, "%s", b + 1);
    if (!chars_ok(run, ":._-") || run[0] == '.' || !api_valid_name(name) || !api_valid_name(file)) {
        api_error(c, 404, "no such download");
        return 1;
    }
    char what[400], dir[1200], path[1400], missing[500];
    snprintf(what, sizeof what, "%s/%s/%s", run, name, file);
    if (!svc_url_check(s, c, req, what, "ask external_weights_urls for a new one")) return 1;
    svc_ckpt_dir(s, run, "external_weights", name, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    snprintf(missing, sizeof missing, "tinker://%s/external_weights/%s has no file '%s' (deleted?)", run, name, file);
    svc_send_file(s, c, path, missing);
    return 1;
}

/* ---- copy_weights ---- */

/* Hard-links (or copies, across file systems) every regular file of src into the new folder dst. */
static int link_files(const char *src, const char *dst, char *err, size_t err_len) {
    if (mkdir(dst, 0755) != 0) {
        snprintf(err, err_len, "cannot create %.500s: %s", dst, strerror(errno));
        return -1;
    }
    DIR *d = opendir(src);
    if (!d) {
        snprintf(err, err_len, "cannot read %.500s: %s", src, strerror(errno));
        return -1;
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        char from[1700], to[1700];
        struct stat sb;
        snprintf(from, sizeof from, "%s/%s", src, e->d_name);
        snprintf(to, sizeof to, "%s/%s", dst, e->d_name);
        if (e->d_name[0] == '.' || stat(from, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        if (link(from, to) == 0) continue;
        size_t len = 0;
        char *data = twk_read_file(from, &len);
        if (!data || twk_write_file_atomic(to, data, len) != TWK_OK) {
            snprintf(err, err_len, "cannot copy %.500s: %.100s", from, twk_last_error());
            rc = -1;
        }
        twk_host_free(data);
    }
    closedir(d);
    return rc;
}

/* The id of the run that receives a copy: the SDK's session slot "<session>:train:<seq>",
 * or "copy-" + a digest of the tenant and idempotency key (a retried request finds its copy),
 * or a random one. Returns 0, or an HTTP status with a message. */
static int copy_run_id(svc *s, twk_http_conn *c, const twk_http_req *req, const cJSON *b, const char *tenant,
                       char *id, size_t id_len, char *session, size_t session_len, char *err, size_t err_len) {
    const char *sess = NULL, *project = NULL;
    long long seq = 0;
    if (!api_str(b, "session_id", 0, &sess, err, err_len) || !api_str(b, "destination_project_id", 0, &project, err, err_len) ||
        !api_int(b, "model_seq_id", sess != NULL, 0, 1000000000, 0, &seq, err, err_len))
        return 400;
    if (!sess && !project) {
        snprintf(err, err_len, "field 'destination_project_id' (or 'session_id' with 'model_seq_id') is required");
        return 400;
    }
    if (sess) {
        if (!svc_session_exists(s, c, tenant, sess)) return -1; /* answered */
        snprintf(session, session_len, "%s", sess);
        snprintf(id, id_len, "%s:train:%lld", sess, seq);
        return 0;
    }
    snprintf(session, session_len, "project:%.80s", project);
    const char *idem = twk_http_header_get(req, "X-Idempotency-Key");
    if (!idem) {
        svc_new_id(s, "copy", id, id_len);
        return 0;
    }
    char msg[600], mac[65];
    snprintf(msg, sizeof msg, "copy\n%s\n%.200s\n%.300s", tenant, project, idem);
    twk_hmac_hex(s->url_key, msg, mac);
    snprintf(id, id_len, "copy-%.24s", mac);
    return 0;
}

void api_copy_weights(svc *s, twk_http_conn *c, const twk_http_req *req, const cJSON *b, const char *tenant) {
    const char *source;
    char err[700], kind[32], run_id[128], session[96], tmp[1400], dir[1024], ckid[200];
    double ttl = 0;
    int status;
    /* the ttl rule of every checkpoint (api_ttl), plus copy_weights' own floor of an hour */
    if (!api_str(b, "source_path", 1, &source, err, sizeof err) || !api_ttl(b, &ttl, err, sizeof err)) {
        api_error(c, 400, "%s", err);
        return;
    }
    if (ttl > 0 && ttl < COPY_TTL_MIN_S) {
        api_error(c, 400, "field 'ttl_seconds' = %g is below %.0f (1 hour): copy_weights keeps a copy at least that long",
                  ttl, COPY_TTL_MIN_S);
        return;
    }
    twk_store_ckpt ck;
    twk_store_run src;
    if (!svc_find_checkpoint(s, tenant, "source_path", source, &ck, &src, kind, sizeof kind, &status, err, sizeof err)) {
        api_error(c, status, "%s", err);
        return;
    }
    status = copy_run_id(s, c, req, b, tenant, run_id, sizeof run_id, session, sizeof session, err, sizeof err);
    const char *name = strchr(ck.checkpoint_id, '/') + 1;
    snprintf(ckid, sizeof ckid, "%s/%s", kind, name);
    twk_store_ckpt existing;
    twk_store_run dst;
    if (status == 0 && twk_store_run_get(s->store, tenant, run_id, &dst) == TWK_OK) { /* a retry, or a taken slot */
        twk_store_run_clear(&dst);
        if (twk_store_ckpt_get(s->store, tenant, run_id, ckid, &existing) != TWK_OK) {
            snprintf(err, sizeof err, "training run '%s' exists already; copy into a free model_seq_id", run_id);
            status = 409;
        } else {
            status = 200;
        }
    } else if (status == 0) {
        twk_store_run nr = src;
        snprintf(nr.id, sizeof nr.id, "%s", run_id);
        snprintf(nr.session_id, sizeof nr.session_id, "%s", session);
        nr.created = nr.last_request = (double)time(NULL);
        nr.user_metadata_json = "{}";
        svc_ckpt_dir(s, run_id, kind, name, dir, sizeof dir);
        snprintf(tmp, sizeof tmp, "%s/checkpoints/%s/%s", s->cfg.data_dir, run_id, kind);
        int made = twk_mkdir_p(tmp, 0755) == TWK_OK;
        snprintf(tmp, sizeof tmp, "%s/checkpoints/%s/%s/.tmp-%s-copy", s->cfg.data_dir, run_id, kind, name);
        svc_rm_tree(tmp);
        if (!made) snprintf(err, sizeof err, "%s", twk_last_error());
        if (!made || link_files(ck.path, tmp, err, sizeof err) != 0 ||
            svc_ckpt_publish(tmp, dir, "", 0, err, sizeof err) != 0) {
            svc_rm_tree(tmp);
            status = 500;
        } else if (twk_store_run_create(s->store, &nr) != TWK_OK) {
            snprintf(err, sizeof err, "recording the run failed: %s", twk_last_error());
            status = 500;
        } else {
            twk_store_ckpt cc = ck;
            snprintf(cc.run_id, sizeof cc.run_id, "%s", run_id);
            snprintf(cc.path, sizeof cc.path, "%s", dir);
            cc.created = (double)time(NULL);
            cc.expires_at = ttl > 0 ? cc.created + ttl : 0;
            cc.is_public = 0;
            if (twk_store_ckpt_create(s->store, &cc) != TWK_OK) {
                snprintf(err, sizeof err, "recording the copy failed: %s", twk_last_error());
                status = 500;
            } else {
                status = 200;
            }
        }
    }
    twk_store_run_clear(&src);
    if (status < 0) return; /* answered */
    if (status != 200) {
        api_error(c, status, "%s", err);
        return;
    }
    char path[600];
    snprintf(path, sizeof path, "tinker://%s/%s", run_id, ckid);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "tinker_path", path);
    api_ok(c, j);
}
