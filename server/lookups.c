/* Lookups shared by the endpoints, the runs and the sampling sessions: base
 * models by name, the run registry (live runs, and runs known only from the
 * store after a restart), sessions, and checkpoints by tinker:// path. They
 * read the service's state and the store and call no other part of the
 * service, so api.c, runs.c and sampling.c depend on this file and not on
 * each other's lookups. Loop thread only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_util.h"
#include "svc.h"

base_model *svc_find_model(svc *s, const char *name) {
    for (int i = 0; name && i < s->n_models; i++)
        if (!strcmp(s->models[i].name, name)) return &s->models[i];
    return NULL;
}

static void ckpt_dir_in(const char *data_dir, const char *run, const char *kind, const char *name, char *out,
                        size_t len) {
    snprintf(out, len, "%s/checkpoints/%s/%s/%s", data_dir, run, kind, name);
}

void svc_ckpt_dir(const svc *s, const char *run, const char *kind, const char *name, char *out, size_t len) {
    ckpt_dir_in(s->cfg.data_dir, run, kind, name, out, len);
}

twk_status twk_serve_checkpoint_dir(const char *data_dir, const char *tinker_path, char *dir, size_t len) {
    char run[128], kind[32], name[128];
    if (!svc_parse_tinker_path(tinker_path, run, sizeof run, kind, sizeof kind, name, sizeof name))
        return twk_error(TWK_ERR_INVALID_ARG, "'%s' is not tinker://<run>/(weights|sampler_weights|external_weights)/<name>",
                         tinker_path);
    ckpt_dir_in(data_dir, run, kind, name, dir, len);
    return TWK_OK;
}

int svc_parse_tinker_path(const char *path, char *run, size_t run_len, char *kind, size_t kind_len, char *name,
                          size_t name_len) {
    const char *pre = "tinker://";
    if (!path || strncmp(path, pre, strlen(pre))) return 0;
    const char *p = path + strlen(pre);
    const char *a = strchr(p, '/');
    if (!a) return 0;
    const char *b = strchr(a + 1, '/');
    if (!b || strchr(b + 1, '/')) return 0;
    size_t lr = (size_t)(a - p), lk = (size_t)(b - a - 1), ln = strlen(b + 1);
    if (!lr || !lk || !ln || lr >= run_len || lk >= kind_len || ln >= name_len) return 0;
    memcpy(run, p, lr);
    run[lr] = 0;
    memcpy(kind, a + 1, lk);
    kind[lk] = 0;
    memcpy(name, b + 1, ln + 1);
    if (strcmp(kind, "weights") && strcmp(kind, "sampler_weights") && strcmp(kind, "external_weights")) return 0;
    if (!strcmp(name, ".") || !strcmp(name, "..") || strchr(run, '.') == run) return 0;
    return 1;
}

int svc_find_checkpoint(svc *s, const char *tenant, const char *field, const char *path, twk_store_ckpt *ck,
                        twk_store_run *src, char *kind, size_t kind_len, int *status, char *err, size_t err_len) {
    char run[128], name[128], ckid[200];
    if (!svc_parse_tinker_path(path, run, sizeof run, kind, kind_len, name, sizeof name)) {
        *status = 400;
        snprintf(err, err_len, "%s '%s' is not tinker://<run>/(weights|sampler_weights|external_weights)/<name>", field, path);
        return 0;
    }
    snprintf(ckid, sizeof ckid, "%s/%s", kind, name);
    /* the tenant's own, or another tenant's published one (read-only: every caller only reads it) */
    if (twk_store_ckpt_get(s->store, tenant, run, ckid, ck) != TWK_OK &&
        twk_store_ckpt_get_public(s->store, run, ckid, ck) != TWK_OK) {
        *status = 404;
        snprintf(err, err_len, "checkpoint %s not found", path);
        return 0;
    }
    if (twk_store_run_get(s->store, ck->tenant, run, src) != TWK_OK) {
        *status = 404;
        snprintf(err, err_len, "the run of checkpoint %s is gone", path);
        return 0;
    }
    return 1;
}

twk_lora_config svc_run_lora(const twk_store_run *src) {
    twk_lora_config lc = twk_lora_default();
    lc.rank = src->lora_rank;
    lc.train_attn = src->train_attn;
    lc.train_mlp = src->train_mlp;
    /* Tinker's train_mlp adapts a mixture of experts' routed experts too (as PEFT's conversion of
     * target_modules gate/up/down does); ignored by a dense model. The router stays off (no flag). */
    lc.train_experts = src->train_mlp;
    lc.train_unembed = src->train_unembed;
    lc.seed = (uint64_t)src->seed;
    return lc;
}

run_state *svc_run_new(svc *s, const char *id, const char *tenant) {
    run_state *r = twk_host_calloc(sizeof *r, "lookups r");
    if (!r) return NULL;
    snprintf(r->id, sizeof r->id, "%s", id);
    snprintf(r->tenant, sizeof r->tenant, "%s", tenant);
    r->next_seq = 1;
    r->next = s->runs;
    s->runs = r;
    return r;
}

run_state *svc_find_run(svc *s, const char *tenant, const char *id) {
    for (run_state *r = s->runs; r; r = r->next)
        if (!strcmp(r->id, id)) return strcmp(r->tenant, tenant) ? NULL : r;
    /* not live: a run from before a restart? */
    twk_store_run sr;
    if (twk_store_run_get(s->store, tenant, id, &sr) != TWK_OK) return NULL;
    run_state *r = svc_run_new(s, id, tenant);
    if (r) {
        r->lost = 1;
        r->base = svc_find_model(s, sr.base_model);
        r->lora.rank = sr.lora_rank;
        snprintf(r->session_id, sizeof r->session_id, "%s", sr.session_id);
        svc_spill_adopt(s, r, &sr); /* its state was spilled: it continues from there */
    }
    twk_store_run_clear(&sr);
    return r;
}

int svc_session_exists(svc *s, twk_http_conn *c, const char *tenant, const char *session_id) {
    twk_store_session sess;
    twk_status st = twk_store_session_get(s->store, tenant, session_id, &sess);
    if (st == TWK_ERR_NOT_FOUND) {
        api_error(c, 404, "session '%s' not found", session_id);
        return 0;
    }
    if (st != TWK_OK) { /* out of memory, a store failure: not an unknown session */
        api_error(c, st == TWK_ERR_OOM ? 503 : 500, "reading session '%s' failed: %s", session_id, twk_last_error());
        return 0;
    }
    twk_store_session_clear(&sess);
    return 1;
}


const char *svc_ckpt_type(const char *checkpoint_id) {
    return !strncmp(checkpoint_id, "weights/", 8)            ? "training"
           : !strncmp(checkpoint_id, "external_weights/", 17) ? "external"
                                                              : "sampler";
}
