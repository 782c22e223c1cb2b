/* The Tinker API's endpoints: routing, authentication, validation, and either
 * an answer at once or an op queued with a future. REST listings are in
 * api_rest.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api_util.h"
#include "svc.h"
#include "dist_serve.h" /* /healthz of the multi-rank service */

void api_rest(svc *s, twk_http_conn *c, const twk_http_req *req, const char *tenant, const char *route);

static double wall_now(void) { return (double)time(NULL); }

static void future_reply(twk_http_conn *c, const char *request_id, const char *model_id) {
    twk_log_request_id(request_id); /* also a resubmission's original future */
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "request_id", request_id);
    if (model_id) cJSON_AddStringToObject(j, "model_id", model_id);
    api_ok(c, j);
}

/* Queues o in its run's seq order and answers with its future, or 429 past the buffering limits. */
static void submit_reply(svc *s, twk_http_conn *c, run_state *r, op *o) {
    char request_id[64], err[512];
    int status = svc_submit_op(s, r, o, request_id, err, sizeof err);
    if (status) api_error(c, status, "%s", err);
    else future_reply(c, request_id, r->id);
}

/* ---- client and session endpoints ---- */

static void h_client_config(svc *s, twk_http_conn *c) {
    char buf[640];
    snprintf(buf, sizeof buf,
             "{\"pjwt_auth_enabled\":%s,\"use_pyqwest_transport\":false,\"proto_compress_fwdbwd\":false,"
             "\"parallel_fwdbwd_chunks\":true,\"fwdbwd_max_chunk_len\":%d,\"sample_max_concurrent_requests\":64,"
             "\"create_model_via_load_weights\":false,\"sample_use_retrieve_futures\":true,"
             "\"sample_join_sampling_session\":true,\"credential_default_source\":\"api_key\"}",
             s->cfg.jwt_auth ? "true" : "false", s->cfg.fwdbwd_chunk_len);
    twk_http_respond_json(c, 200, buf);
}

static void h_create_session(svc *s, twk_http_conn *c, const cJSON *b, const char *tenant) {
    twk_store_session sess;
    memset(&sess, 0, sizeof sess);
    svc_new_id(s, "sess", sess.id, sizeof sess.id);
    snprintf(sess.tenant, sizeof sess.tenant, "%s", tenant);
    const cJSON *tags = cJSON_GetObjectItemCaseSensitive(b, "tags");
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(b, "user_metadata");
    if (tags && !cJSON_IsArray(tags) && !cJSON_IsNull(tags)) {
        api_error(c, 400, "field 'tags' must be a list of strings");
        return;
    }
    if (meta && !cJSON_IsObject(meta) && !cJSON_IsNull(meta)) {
        api_error(c, 400, "field 'user_metadata' must be an object");
        return;
    }
    sess.tags_json = tags && cJSON_IsArray(tags) ? cJSON_PrintUnformatted(tags) : NULL;
    sess.user_metadata_json = meta && cJSON_IsObject(meta) ? cJSON_PrintUnformatted(meta) : NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, "sdk_version");
    snprintf(sess.sdk_version, sizeof sess.sdk_version, "%s", cJSON_IsString(v) ? v->valuestring : "");
    sess.created = sess.last_heartbeat = wall_now();
    char *t = sess.tags_json, *m = sess.user_metadata_json;
    if (!t) sess.tags_json = "[]";
    if (!m) sess.user_metadata_json = "{}";
    twk_status st = twk_store_session_create(s->store, &sess);
    cJSON_free(t);
    cJSON_free(m);
    if (st != TWK_OK) {
        api_error(c, 500, "creating the session failed: %s", twk_last_error());
        return;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "session_id", sess.id);
    cJSON_AddStringToObject(j, "type", "create_session");
    api_ok(c, j);
}

static void h_heartbeat(svc *s, twk_http_conn *c, const cJSON *b, const char *tenant) {
    const char *id;
    char err[256];
    if (!api_str(b, "session_id", 1, &id, err, sizeof err)) {
        api_error(c, 400, "%s", err);
        return;
    }
    twk_store_session sess;
    if (twk_store_session_get(s->store, tenant, id, &sess) != TWK_OK) {
        api_error(c, 404, "session '%s' not found", id);
        return;
    }
    int finished = sess.finished;
    twk_store_session_clear(&sess);
    if (finished) {
        api_error(c, 410, "session '%s' has finished", id);
        return;
    }
    twk_store_session_heartbeat(s->store, tenant, id, wall_now());
    twk_http_respond_json(c, 200, "{\"type\":\"session_heartbeat\"}");
}

/* ---- models ---- */

/* create_model's optimizer_config: absent, null or {"type": "adamw"} (all this
 * server trains with). 0 with the field named in err otherwise. */
static int optimizer_config_ok(const cJSON *oc, char *err, size_t n) {
    if (!oc || cJSON_IsNull(oc)) return 1;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(oc, "type");
    if (!cJSON_IsObject(oc) || !cJSON_IsString(ty)) {
        snprintf(err, n, "field 'optimizer_config' must be an object with a string 'type'");
        return 0;
    }
    if (strcmp(ty->valuestring, "adamw")) {
        snprintf(err, n, "optimizer_config.type '%.64s' is not supported by this server; it trains with 'adamw'",
                 ty->valuestring);
        return 0;
    }
    for (const cJSON *v = oc->child; v; v = v->next)
        if (strcmp(v->string, "type")) {
            snprintf(err, n, "optimizer_config.%.64s is not supported by this server (adamw takes no options here)",
                     v->string);
            return 0;
        }
    return 1;
}

static void h_create_model(svc *s, twk_http_conn *c, const cJSON *b, const char *tenant) {
    const char *session_id, *base;
    long long model_seq;
    char err[512];
    if (!api_str(b, "session_id", 1, &session_id, err, sizeof err) ||
        !api_int(b, "model_seq_id", 1, 0, 1000000000, 0, &model_seq, err, sizeof err) ||
        !api_str(b, "base_model", 1, &base, err, sizeof err)) {
        api_error(c, 400, "%s", err);
        return;
    }
    if (!svc_session_exists(s, c, tenant, session_id)) return;
    const cJSON *lc = cJSON_GetObjectItemCaseSensitive(b, "lora_config");
    if (lc && !cJSON_IsObject(lc) && !cJSON_IsNull(lc)) {
        api_error(c, 400, "field 'lora_config' must be an object");
        return;
    }
    twk_lora_config lora = twk_lora_default();
    long long rank, seed;
    int ta, tm, tu;
    if (!api_int(lc, "rank", 0, 1, s->cfg.max_lora_rank, lora.rank, &rank, err, sizeof err) ||
        !api_int(lc, "seed", 0, 0, (1ll << 62), 0, &seed, err, sizeof err) ||
        !api_bool(lc, "train_attn", 1, &ta, err, sizeof err) || !api_bool(lc, "train_mlp", 1, &tm, err, sizeof err) ||
        !api_bool(lc, "train_unembed", 1, &tu, err, sizeof err)) {
        api_error(c, 400, "lora_config: %s (the server's maximum rank is %d)", err, s->cfg.max_lora_rank);
        return;
    }
    if (!ta && !tm && !tu) {
        api_error(c, 400, "lora_config: train_attn, train_mlp and train_unembed are all false");
        return;
    }
    lora.rank = (int)rank;
    /* lora.alpha stays the default's, 32 whatever the rank (Tinker's convention) */
    lora.seed = (uint64_t)seed;
    lora.train_attn = ta;
    lora.train_mlp = tm;
    lora.train_experts = tm; /* a mixture of experts' routed experts too (svc_run_lora); a dense model ignores it */
    lora.train_unembed = tu;
    if (!optimizer_config_ok(cJSON_GetObjectItemCaseSensitive(b, "optimizer_config"), err, sizeof err)) {
        api_error(c, 400, "%s", err);
        return;
    }
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(b, "user_metadata");
    if (meta && !cJSON_IsObject(meta) && !cJSON_IsNull(meta)) {
        api_error(c, 400, "field 'user_metadata' must be an object");
        return;
    }
    char *meta_json = meta && cJSON_IsObject(meta) ? cJSON_PrintUnformatted(meta) : NULL;
    char request_id[64], model_id[128];
    int status = svc_create_run(s, tenant, session_id, (int)model_seq, base, &lora, meta_json, request_id, model_id,
                                err, sizeof err);
    cJSON_free(meta_json);
    if (status) {
        api_error(c, status, "%s", err);
        return;
    }
    future_reply(c, request_id, model_id);
}

static run_state *need_run(svc *s, twk_http_conn *c, const cJSON *b, const char *tenant, int32_t *seq) {
    const char *model_id;
    long long sq = 0;
    char err[256];
    if (!api_str(b, "model_id", 1, &model_id, err, sizeof err) ||
        (seq && !api_int(b, "seq_id", 1, 0, 2147483647, 0, &sq, err, sizeof err))) {
        api_error(c, 400, "%s", err);
        return NULL;
    }
    run_state *r = svc_find_run(s, tenant, model_id);
    if (!r) {
        api_error(c, 404, "model '%s' not found", model_id);
        return NULL;
    }
    if (seq) *seq = (int32_t)sq;
    return r;
}

static void h_get_info(svc *s, twk_http_conn *c, const cJSON *b, const char *tenant) {
    run_state *r = need_run(s, c, b, tenant, NULL);
    if (!r) return;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "type", "get_info");
    cJSON_AddStringToObject(j, "model_id", r->id);
    cJSON *md = cJSON_AddObjectToObject(j, "model_data");
    const char *name = r->base ? r->base->name : "unknown";
    cJSON_AddStringToObject(md, "arch", r->base ? twk_model_cfg(r->base->m)->arch_name : "unknown");
    cJSON_AddStringToObject(md, "model_name", name);
    if (r->base && r->base->has_tokenizer) cJSON_AddStringToObject(md, "tokenizer_id", r->base->dir);
    else cJSON_AddNullToObject(md, "tokenizer_id");
    cJSON_AddBoolToObject(j, "is_lora", 1);
    cJSON_AddNumberToObject(j, "lora_rank", r->lora.rank);
    cJSON_AddStringToObject(j, "model_name", name);
    api_ok(c, j);
}

/* ---- training ops (futures, in seq_id order) ---- */

/* forward_backward validation, in steps: the loss and its config against the
 * registry, the data's size, then each datum's tokens, targets and inputs.
 * Each writes the first problem (naming the field) into err and returns 0. */

static int fb_check_loss(const twk_wire_fb_request *q, twk_loss_spec *loss, char *err, size_t n) {
    if (twk_loss_spec_init(q->loss_fn, loss) != TWK_OK) {
        snprintf(err, n, "loss_fn: %s", twk_last_error());
        return 0;
    }
    for (int i = 0; i < q->n_config; i++)
        if (twk_loss_spec_set(loss, q->config[i].key, q->config[i].value) != TWK_OK) {
            snprintf(err, n, "%s", twk_last_error());
            return 0;
        }
    if (q->n_data % loss->def->group) {
        snprintf(err, n, "loss_fn '%s' takes pairs (chosen, rejected): data has %d datums, an odd count", q->loss_fn,
                 q->n_data);
        return 0;
    }
    return 1;
}

static int fb_check_size(svc *s, const twk_wire_fb_request *q, char *err, size_t n) {
    if (q->n_data < 1) {
        snprintf(err, n, "data is empty");
        return 0;
    }
    if (q->n_data > s->cfg.max_datums) {
        snprintf(err, n, "data has %d datums; the limit is %lld per request", q->n_data, (long long)s->cfg.max_datums);
        return 0;
    }
    return 1;
}

static int fb_check_tokens(svc *s, int i, const twk_wire_datum *d, int vocab, char *err, size_t n) {
    if (d->n_tokens > s->cfg.max_context) {
        snprintf(err, n, "data[%d].model_input has %lld tokens; the context limit is %lld", i, (long long)d->n_tokens,
                 (long long)s->cfg.max_context);
        return 0;
    }
    for (int64_t k = 0; k < d->n_tokens; k++)
        if (d->tokens[k] < 0 || d->tokens[k] >= vocab) {
            snprintf(err, n, "data[%d].model_input.tokens[%lld] = %d is outside the vocabulary [0, %d)", i, (long long)k,
                     d->tokens[k], vocab);
            return 0;
        }
    return 1;
}

/* Whether tensor x has the shape `rule` asks for a datum of N tokens and top-K width K (0: 1-D targets). */
static int fb_shape_ok(const twk_wire_tensor *x, twk_loss_shape rule, int64_t N, int64_t K) {
    if (rule == TWK_SHAPE_TOKENS || (rule == TWK_SHAPE_TOKENS_OR_K && K == 0)) return x->ndim == 1 && x->n == N;
    return x->ndim == 2 && x->shape[0] == N && x->shape[1] == K;
}

static void fb_shape_text(twk_loss_shape rule, int64_t N, int64_t K, char *out, size_t n) {
    if (rule == TWK_SHAPE_TOKENS || (rule == TWK_SHAPE_TOKENS_OR_K && K == 0)) snprintf(out, n, "[%lld] (one per token)", (long long)N);
    else snprintf(out, n, "[%lld, %lld] like target_tokens", (long long)N, (long long)K);
}

/* target_tokens: int64, its rank by the loss's rule (top-K: 1 <= K <= 64, one K per request), in the vocabulary. */
static int fb_check_targets(const twk_wire_fb_request *q, const twk_loss_def *loss, int i, int vocab, char *err,
                            size_t n) {
    const twk_wire_datum *d = &q->data[i];
    const twk_wire_tensor *t = twk_wire_datum_input(d, "target_tokens"), *t0 = twk_wire_datum_input(&q->data[0], "target_tokens");
    twk_loss_shape rule = twk_loss_input_find(loss, "target_tokens")->shape;
    if (!t) {
        snprintf(err, n, "data[%d].loss_fn_inputs: target_tokens is required", i);
        return 0;
    }
    if (t->dtype != TWK_WIRE_I64) {
        snprintf(err, n, "data[%d].loss_fn_inputs[target_tokens] must be int64", i);
        return 0;
    }
    if (t->ndim == 2 && rule == TWK_SHAPE_TOKENS) {
        snprintf(err, n, "data[%d].loss_fn_inputs[target_tokens] is 2-D (top-K targets): loss_fn '%s' takes [%lld]; "
                         "top-K targets need cross_entropy or a distillation loss", i, q->loss_fn, (long long)d->n_tokens);
        return 0;
    }
    if (t->ndim != 2 && rule == TWK_SHAPE_TOKENS_K) {
        snprintf(err, n, "data[%d].loss_fn_inputs[target_tokens] must be 2-D [tokens, K] (the teacher's top-K) for "
                         "loss_fn '%s'", i, q->loss_fn);
        return 0;
    }
    if (t->ndim != 1 && t->ndim != 2) {
        snprintf(err, n, "data[%d].loss_fn_inputs[target_tokens] must be 1-D or 2-D", i);
        return 0;
    }
    if (!t0 || t0->ndim != t->ndim) {
        snprintf(err, n, "data[%d].loss_fn_inputs[target_tokens]: 1-D and 2-D targets are mixed", i);
        return 0;
    }
    if (t->ndim == 2 && (t->shape[0] != d->n_tokens || t->shape[1] < 1 || t->shape[1] > 64 || t0->shape[1] != t->shape[1])) {
        snprintf(err, n, "data[%d].loss_fn_inputs[target_tokens] is 2-D: it needs shape [%lld, K] with 1 <= K <= 64, "
                         "and the same K in every datum", i, (long long)d->n_tokens);
        return 0;
    }
    if (t->ndim == 1 && t->n != d->n_tokens) {
        snprintf(err, n, "data[%d].loss_fn_inputs[target_tokens] has %lld entries; model_input has %lld tokens", i,
                 (long long)t->n, (long long)d->n_tokens);
        return 0;
    }
    for (int64_t k = 0; k < t->n; k++) {
        int64_t v = ((const int64_t *)t->data)[k];
        if (v < 0 || v >= vocab) {
            snprintf(err, n, "data[%d].loss_fn_inputs[target_tokens][%lld] = %lld is outside the vocabulary [0, %d)", i,
                     (long long)k, (long long)v, vocab);
            return 0;
        }
    }
    return 1;
}

/* The float inputs the loss reads: present where required (and in every datum
 * or none where the registry says so), float32 of the rule's shape, finite. */
static int fb_check_inputs(const twk_wire_fb_request *q, const twk_loss_def *loss, int i, char *err, size_t n) {
    const twk_wire_datum *d = &q->data[i];
    const twk_wire_tensor *t = twk_wire_datum_input(d, "target_tokens");
    int64_t K = t->ndim == 2 ? t->shape[1] : 0;
    for (int j = 0; j < d->n_inputs; j++) /* never silently ignored: a key the loss does not read */
        if (!strcmp(d->inputs[j].key, twk_loss_input_key(TWK_IN_RECORDED_LOGPROBS))) {
            snprintf(err, n, "data[%d].loss_fn_inputs[%s] is filled by the server from the sampled sequences the "
                             "datum's provenance names; do not send it", i, d->inputs[j].key);
            return 0;
        } else if (!twk_loss_input_find(loss, d->inputs[j].key)) {
            char keys[256];
            twk_loss_input_keys(loss, keys, sizeof keys);
            snprintf(err, n, "data[%d].loss_fn_inputs[%s]: loss_fn '%s' does not read this key (it reads: %s)", i,
                     d->inputs[j].key, q->loss_fn, keys);
            return 0;
        }
    for (int j = 0; j < loss->n_inputs; j++) {
        const twk_loss_input_def *in = &loss->inputs[j];
        const char *key = twk_loss_input_key(in->id);
        if (in->dtype != TWK_LOSS_F32) continue;
        const twk_wire_tensor *x = twk_wire_datum_input(d, key);
        if (!x && in->required) {
            snprintf(err, n, "data[%d].loss_fn_inputs: %s is required by loss_fn '%s'", i, key, q->loss_fn);
            return 0;
        }
        if (in->all_or_none && !x != !twk_wire_datum_input(&q->data[0], key)) {
            snprintf(err, n, "data[%d].loss_fn_inputs: %s must be given for every datum or for none "
                             "(none: the server computes them from the base model)", i, key);
            return 0;
        }
        if (!x) continue;
        if (x->dtype != TWK_WIRE_F32 || !fb_shape_ok(x, in->shape, d->n_tokens, K)) {
            char shape[96];
            fb_shape_text(in->shape, d->n_tokens, K, shape, sizeof shape);
            snprintf(err, n, "data[%d].loss_fn_inputs[%s] must be float32 %s for loss_fn '%s'", i, key, shape, q->loss_fn);
            return 0;
        }
        for (int64_t k = 0; k < x->n; k++)
            if (!isfinite(((const float *)x->data)[k])) {
                snprintf(err, n, "data[%d].loss_fn_inputs[%s][%lld] is not finite", i, key, (long long)k);
                return 0;
            }
    }
    return 1;
}

/* Checks one provenance field of datum i (which = 0: model_input_spans over
 * its tokens; 1: loss_fn_input_spans over its targets): the spans tile the
 * field, each names a sequence this run's session sampled with
 * record_stability_info and that has not expired, and the tokens equal the
 * recorded ones (targets: the sampled ones; prompt targets are placeholders). lp (which = 1) gets the recorded logprobs of sampled
 * positions (NaN elsewhere). */
static int fb_check_spans(svc *s, const run_state *r, const twk_wire_datum *d, int i, int which, float *lp, char *err,
                          size_t n) {
    static const char *const field[2] = {"model_input_spans", "loss_fn_input_spans"};
    const twk_wire_tensor *t = twk_wire_datum_input(d, "target_tokens");
    int64_t N = d->n_tokens, pos = 0;
    int32_t *tok = twk_host_alloc((size_t)N * sizeof(int32_t), "provenance tokens");
    int ok = tok != NULL;
    if (!ok) snprintf(err, n, "out of memory checking data[%d].%s", i, field[which]);
    for (int j = 0; ok && j < d->n_spans[which]; j++) {
        const twk_wire_span *sp = &d->spans[which][j];
        const char *kind = sp->sampled ? "sampled" : "prompt";
        char other[160] = "";
        int64_t avail = 0;
        if (sp->length > N - pos) {
            snprintf(err, n, "data[%d].%s cover more than the datum's %lld positions", i, field[which], (long long)N);
            ok = 0;
            break;
        }
        twk_stab_found f = twk_stab_get(s->stab, r->tenant, r->session_id, sp->sequence_id, sp->sampled, sp->offset,
                                        sp->length, tok + pos, sp->sampled && lp ? lp + pos : NULL, &avail, other,
                                        sizeof other);
        if (f != TWK_STAB_OK) {
            if (f == TWK_STAB_OTHER_SESSION)
                snprintf(err, n, "data[%d].%s[%d]: sequence '%s' was sampled in session '%s', not in this run's session "
                                 "'%s'; a training request can only name sequences sampled in its own session",
                         i, field[which], j, sp->sequence_id, other, r->session_id);
            else
                snprintf(err, n, "data[%d].%s[%d]: sequence '%s' is %s (sample with record_stability_info=True; a "
                                 "recorded sequence stays usable for %g s after its last use)",
                         i, field[which], j, sp->sequence_id, f == TWK_STAB_EXPIRED ? "expired" : "not recorded here",
                         s->cfg.stability_ttl_s);
            ok = 0;
            break;
        }
        if (sp->offset + sp->length > avail) {
            snprintf(err, n, "data[%d].%s[%d]: [%lld, %lld) is past the %lld %s tokens of sequence '%s'", i, field[which], j,
                     (long long)sp->offset, (long long)(sp->offset + sp->length), (long long)avail, kind, sp->sequence_id);
            ok = 0;
            break;
        }
        /* targets under a prompt span are placeholders (the cookbook pads them with 0): only sampled ones are checked */
        for (int64_t k = pos; ok && (!which || sp->sampled) && k < pos + sp->length; k++) {
            int64_t want = which ? ((const int64_t *)t->data)[k] : d->tokens[k];
            if (tok[k] != want) {
                snprintf(err, n, "data[%d].%s[%d]: position %lld is token %lld, but %s token %lld of sequence '%s' is %d", i,
                         field[which], j, (long long)k, (long long)want, kind, (long long)(sp->offset + k - pos),
                         sp->sequence_id, tok[k]);
                ok = 0;
            }
        }
        pos += sp->length;
    }
    if (ok && pos != N) {
        snprintf(err, n, "data[%d].%s cover %lld positions; the datum has %lld", i, field[which], (long long)pos,
                 (long long)N);
        ok = 0;
    }
    twk_host_free(tok);
    return ok;
}

/* A loss with provenance (stable_reinforce): every datum names its sampled
 * sequences; advantages only on sampled tokens; the client's logprobs, where
 * given, equal the recorded ones; the recorded logprobs become the datum's
 * recorded_logprobs input (NaN off the sampled tokens). */
static int fb_check_provenance(svc *s, const run_state *r, twk_wire_fb_request *q, int i, char *err, size_t n) {
    twk_wire_datum *d = &q->data[i];
    if (!d->n_spans[1] && d->n_tokens) {
        snprintf(err, n, "data[%d]: loss_fn '%s' needs loss_fn_input_spans naming the sampled sequence behind each "
                         "target (Datum.with_provenance)", i, q->loss_fn);
        return 0;
    }
    float *lp = twk_host_alloc((size_t)d->n_tokens * sizeof(float), "api lp"); /* freed with the request (twk_wire_fb_request_free) */
    twk_wire_input *grown = lp ? twk_host_realloc(d->inputs, (size_t)d->n_inputs * sizeof *d->inputs,
                                                 (size_t)(d->n_inputs + 1) * sizeof *d->inputs, "datum inputs")
                              : NULL;
    char *key = grown ? twk_host_strdup(twk_loss_input_key(TWK_IN_RECORDED_LOGPROBS), "input key") : NULL;
    if (grown) d->inputs = grown;
    if (!key) {
        twk_host_free(lp);
        snprintf(err, n, "out of memory checking data[%d]'s provenance", i);
        return -1;
    }
    for (int64_t k = 0; k < d->n_tokens; k++) lp[k] = NAN;
    int ok = (!d->n_spans[0] || fb_check_spans(s, r, d, i, 0, NULL, err, n)) && fb_check_spans(s, r, d, i, 1, lp, err, n);
    const twk_wire_tensor *adv = twk_wire_datum_input(d, "advantages"), *clp = twk_wire_datum_input(d, "logprobs");
    for (int64_t k = 0; ok && k < d->n_tokens; k++) {
        float a = ((const float *)adv->data)[k], c = clp ? ((const float *)clp->data)[k] : lp[k];
        if (isnan(lp[k]) && a != 0.0f) {
            snprintf(err, n, "data[%d].loss_fn_inputs[advantages][%lld] = %g: loss_fn '%s' takes advantages only on "
                             "sampled tokens (a loss_fn_input_spans sampled_tokens span); this position is a prompt token",
                     i, (long long)k, a, q->loss_fn);
            ok = 0;
        } else if (!isnan(lp[k]) && !(fabsf(c - lp[k]) <= 1e-4f * fmaxf(1.0f, fabsf(lp[k])))) {
            snprintf(err, n, "data[%d].loss_fn_inputs[logprobs][%lld] = %g, but the sampler recorded %g for that token", i,
                     (long long)k, c, lp[k]);
            ok = 0;
        }
    }
    twk_wire_tensor t = {TWK_WIRE_F32, 1, {d->n_tokens, 0}, d->n_tokens, lp};
    d->inputs[d->n_inputs++] = (twk_wire_input){key, t}; /* owned by the request from here on */
    return ok;
}

/* Checks a decoded forward_backward request against the loss registry and
 * the model; sets *loss; writes the first problem into err, or returns 1. */
static int validate_fb(svc *s, const run_state *r, twk_wire_fb_request *q, twk_loss_spec *loss, char *err, size_t n) {
    int vocab = r->base ? twk_model_cfg(r->base->m)->vocab : 0, p = 1;
    if (!fb_check_loss(q, loss, err, n) || !fb_check_size(s, q, err, n)) return 0;
    for (int i = 0; i < q->n_data; i++)
        if (!fb_check_tokens(s, i, &q->data[i], vocab, err, n) || !fb_check_targets(q, loss->def, i, vocab, err, n) ||
            !fb_check_inputs(q, loss->def, i, err, n) ||
            (loss->def->provenance && (p = fb_check_provenance(s, r, q, i, err, n)) <= 0))
            return p < 0 ? -1 : 0;
    return 1;
}

/* Reads top-level fields 1 (model_id) and 2 (seq_id) of a request the full
 * decoder refused, so a well-framed request with bad content still takes its
 * seq_id slot (and fails there) instead of stalling the run. 0 if unreadable. */
static int peek_ids(const unsigned char *p, size_t len, char *model_id, size_t mlen, int32_t *seq) {
    size_t i = 0;
    int have_model = 0, have_seq = 0;
    while (i < len) {
        uint64_t key = 0, v = 0;
        int sh = 0;
        while (i < len && sh < 64) {
            key |= (uint64_t)(p[i] & 0x7f) << sh;
            sh += 7;
            if (!(p[i++] & 0x80)) break;
        }
        unsigned field = (unsigned)(key >> 3), wt = (unsigned)(key & 7);
        if (wt == 0) {
            sh = 0;
            while (i < len && sh < 64) {
                v |= (uint64_t)(p[i] & 0x7f) << sh;
                sh += 7;
                if (!(p[i++] & 0x80)) break;
            }
            if (field == 2) {
                *seq = (int32_t)v;
                have_seq = 1;
            }
        } else if (wt == 2) {
            sh = 0;
            while (i < len && sh < 64) {
                v |= (uint64_t)(p[i] & 0x7f) << sh;
                sh += 7;
                if (!(p[i++] & 0x80)) break;
            }
            if (v > len - i) return 0;
            if (field == 1) {
                if (v == 0 || v >= mlen) return 0;
                memcpy(model_id, p + i, v);
                model_id[v] = 0;
                have_model = 1;
            }
            i += v;
        } else if (wt == 1) {
            i += 8;
        } else if (wt == 5) {
            i += 4;
        } else {
            return 0;
        }
    }
    return have_model && have_seq && i == len && !strchr(model_id, '/');
}

static void h_forward_backward(svc *s, twk_http_conn *c, const twk_http_req *req, const char *tenant) {
    twk_wire_fb_request *q = NULL;
    twk_status ds = twk_wire_decode_fb_request(req->body, req->body_len, &q);
    if (ds == TWK_ERR_OOM) {
        api_error(c, 503, "%s", twk_last_error());
        return;
    }
    if (ds != TWK_OK) {
        char why[512], model_id[128];
        int32_t seq = 0;
        snprintf(why, sizeof why, "%s", twk_last_error());
        run_state *r = peek_ids(req->body, req->body_len, model_id, sizeof model_id, &seq)
                           ? svc_find_run(s, tenant, model_id) : NULL;
        op *o = r ? svc_op_new(s, r, OP_FB, seq) : NULL;
        if (!o) {
            api_error(c, 400, "invalid ForwardBackwardRequest protobuf: %s", why);
            return;
        }
        snprintf(o->prefail, sizeof o->prefail, "%s", why);
        o->body_bytes = req->body_len;
        submit_reply(s, c, r, o);
        return;
    }
    run_state *r = svc_find_run(s, tenant, q->model_id);
    if (!r) {
        api_error(c, 404, "model '%s' not found", q->model_id);
        twk_wire_fb_request_free(q);
        return;
    }
    op *o = svc_op_new(s, r, OP_FB, q->seq_id);
    if (!o) {
        twk_wire_fb_request_free(q);
        api_error(c, 503, "out of memory");
        return;
    }
    o->fb = q;
    o->body_bytes = req->body_len;
    int valid = validate_fb(s, r, q, &o->loss, o->prefail, sizeof o->prefail);
    if (!valid && !o->prefail[0]) snprintf(o->prefail, sizeof o->prefail, "invalid request");
    o->prefail_server = valid < 0;
    submit_reply(s, c, r, o);
}

/* adam_params names only AdamW's hyperparameters, none of them null (the SDK
 * sends NaN and infinity as null). 0 with the field named in err otherwise. */
static int adam_keys_ok(const cJSON *ap, char *err, size_t n) {
    static const char *const keys[] = {"learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm"};
    for (const cJSON *v = ap ? ap->child : NULL; v; v = v->next) {
        size_t k = 0;
        while (k < sizeof keys / sizeof *keys && strcmp(keys[k], v->string)) k++;
        if (k == sizeof keys / sizeof *keys) {
            snprintf(err, n, "field '%.64s' is not an AdamW hyperparameter (learning_rate, beta1, beta2, eps, "
                             "weight_decay, grad_clip_norm)", v->string);
            return 0;
        }
        if (cJSON_IsNull(v)) {
            snprintf(err, n, "field '%s' is null: it must be a finite number (NaN and infinity arrive as null)",
                     v->string);
            return 0;
        }
    }
    return 1;
}

static void h_optim_step(svc *s, twk_http_conn *c, const cJSON *b, const char *tenant) {
    int32_t seq;
    run_state *r = need_run(s, c, b, tenant, &seq);
    if (!r) return;
    op *o = svc_op_new(s, r, OP_OPTIM, seq);
    if (!o) {
        api_error(c, 503, "out of memory");
        return;
    }
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(b, "adam_params");
    const cJSON *other = cJSON_GetObjectItemCaseSensitive(b, "optimizer_params");
    twk_adam_params d = twk_adam_default();
    double lr, b1, b2, eps, wd, clip;
    char err[256];
    if (other && !cJSON_IsNull(other)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(other, "type");
        snprintf(o->prefail, sizeof o->prefail,
                 "optimizer_params: optimizer '%s' is not supported by this server; it trains with AdamW (send "
                 "AdamParams)", cJSON_IsString(ty) ? ty->valuestring : "?");
    } else if (ap && !cJSON_IsObject(ap)) {
        snprintf(o->prefail, sizeof o->prefail, "field 'adam_params' must be an object");
    } else if (!adam_keys_ok(ap, err, sizeof err)) {
        snprintf(o->prefail, sizeof o->prefail, "adam_params: %s", err);
    } else if (!api_num(ap, "learning_rate", 0, d.learning_rate, &lr, err, sizeof err) ||
               !api_num(ap, "beta1", 0, d.beta1, &b1, err, sizeof err) ||
               !api_num(ap, "beta2", 0, d.beta2, &b2, err, sizeof err) || !api_num(ap, "eps", 0, d.eps, &eps, err, sizeof err) ||
               !api_num(ap, "weight_decay", 0, d.weight_decay, &wd, err, sizeof err) ||
               !api_num(ap, "grad_clip_norm", 0, d.grad_clip_norm, &clip, err, sizeof err)) {
        snprintf(o->prefail, sizeof o->prefail, "adam_params: %s", err);
    } else if (!(lr >= 0) || !(b1 >= 0 && b1 < 1) || !(b2 >= 0 && b2 < 1) || !(eps > 0) || !(wd >= 0) || !(clip >= 0)) {
        snprintf(o->prefail, sizeof o->prefail,
                 "adam_params out of range: learning_rate >= 0, 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0, "
                 "grad_clip_norm >= 0");
    } else {
        o->adam = (twk_adam_params){(float)lr, (float)b1, (float)b2, (float)eps, (float)wd, (float)clip};
    }
    submit_reply(s, c, r, o);
}

/* save_weights, save_weights_for_sampler and save_weights_external (kind: OP_SAVE*). */
static void h_save(svc *s, twk_http_conn *c, const cJSON *b, const char *tenant, op_kind kind) {
    int32_t seq;
    int sampler = kind == OP_SAVE_SAMPLER;
    run_state *r = need_run(s, c, b, tenant, &seq);
    if (!r) return;
    op *o = svc_op_new(s, r, kind, seq);
    if (!o) {
        api_error(c, 503, "out of memory");
        return;
    }
    const char *name = NULL;
    char err[256];
    double ttl = 0;
    int overwrite = 0;
    if (!api_str(b, "path", 0, &name, err, sizeof err) || !api_ttl(b, &ttl, err, sizeof err) ||
        !api_bool(b, "overwrite", 0, &overwrite, err, sizeof err)) {
        snprintf(o->prefail, sizeof o->prefail, "%s", err);
    } else if (kind == OP_SAVE_EXTERNAL && cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(b, "age_encryption_recipients")) > 0) {
        snprintf(o->prefail, sizeof o->prefail, "field 'age_encryption_recipients': encrypted exports are not supported");
    } else if (!name && sampler) {
        long long ss_seq;
        if (!api_int(b, "sampling_session_seq_id", 1, 0, 1000000000, 0, &ss_seq, err, sizeof err)) {
            snprintf(o->prefail, sizeof o->prefail, "%s (needed without a path)", err);
        } else {
            char id[160];
            snprintf(id, sizeof id, "%s:sample:%lld", r->session_id, ss_seq);
            o->snapshot = svc_new_snapshot_session(s, r, id);
            if (!o->snapshot) snprintf(o->prefail, sizeof o->prefail, "sampling session '%s' exists already", id);
            else svc_snapshot_use(s, o->snapshot); /* released when the op is freed */
        }
    } else if (!api_valid_name(name)) {
        snprintf(o->prefail, sizeof o->prefail,
                 "path '%s' must be a checkpoint name: 1-100 of [A-Za-z0-9._-], not starting with '.'", name ? name : "");
    } else {
        const cJSON *meta = cJSON_GetObjectItemCaseSensitive(b, "user_metadata");
        if (meta && !cJSON_IsNull(meta)) {
            char *txt = cJSON_IsObject(meta) ? cJSON_PrintUnformatted(meta) : NULL;
            if (!txt && cJSON_IsObject(meta)) {
                snprintf(o->prefail, sizeof o->prefail, "out of memory reading user_metadata");
                o->prefail_server = 1;
            } else if (!txt) snprintf(o->prefail, sizeof o->prefail, "field 'user_metadata' must be an object");
            else if (strlen(txt) >= sizeof o->user_metadata_json)
                snprintf(o->prefail, sizeof o->prefail, "field 'user_metadata' is over %zu bytes",
                         sizeof o->user_metadata_json - 1);
            else snprintf(o->user_metadata_json, sizeof o->user_metadata_json, "%s", txt);
            cJSON_free(txt);
        }
        snprintf(o->name, sizeof o->name, "%s", name);
        o->overwrite = overwrite;
        o->ttl_seconds = ttl;
        svc_ckpt_dir(s, r->id, svc_save_kind(kind), name, o->dir, sizeof o->dir);
    }
    submit_reply(s, c, r, o);
}

/* load_weights without a model_id: create_training_client_from_state. A new
 * run "<session>:train:<model_seq_id>" with the checkpoint's LoRA shape, then
 * the load; the future is the load's. */
static void h_create_from_state(svc *s, twk_http_conn *c, const cJSON *b, const char *tenant) {
    const char *session_id, *path;
    long long model_seq;
    int optimizer = 0;
    char err[512];
    if (!api_str(b, "session_id", 1, &session_id, err, sizeof err) ||
        !api_int(b, "model_seq_id", 1, 0, 1000000000, 0, &model_seq, err, sizeof err) ||
        !api_str(b, "path", 1, &path, err, sizeof err) || !api_bool(b, "optimizer", 0, &optimizer, err, sizeof err)) {
        api_error(c, 400, "%s", err);
        return;
    }
    if (!svc_session_exists(s, c, tenant, session_id)) return;
    twk_store_ckpt ck;
    twk_store_run src;
    char kind[32];
    int status;
    if (!svc_find_checkpoint(s, tenant, "path", path, &ck, &src, kind, sizeof kind, &status, err, sizeof err)) {
        api_error(c, status, "%s", err);
        return;
    }
    if (optimizer && strcmp(kind, "weights")) {
        twk_store_run_clear(&src);
        api_error(c, 400, "%s holds sampler weights only; it has no optimizer state", path);
        return;
    }
    twk_lora_config lora = svc_run_lora(&src);
    char base[128];
    snprintf(base, sizeof base, "%s", src.base_model);
    twk_store_run_clear(&src);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(b, "user_metadata");
    char *meta_json = meta && cJSON_IsObject(meta) ? cJSON_PrintUnformatted(meta) : NULL;
    char create_id[64], model_id[128];
    status = svc_create_run(s, tenant, session_id, (int)model_seq, base, &lora, meta_json, create_id, model_id, err,
                            sizeof err);
    cJSON_free(meta_json);
    if (status) {
        api_error(c, status, "%s", err);
        return;
    }
    run_state *r = svc_find_run(s, tenant, model_id);
    if (!r) {
        api_error(c, 500, "the new run vanished");
        return;
    }
    if (r->load_request[0]) { /* a retried create-from-state */
        future_reply(c, r->load_request, r->id);
        return;
    }
    op *o = svc_op_new(s, r, OP_LOAD, 0);
    if (!o) {
        api_error(c, 503, "out of memory");
        return;
    }
    snprintf(o->dir, sizeof o->dir, "%s", ck.path);
    o->load_optimizer = optimizer;
    if (svc_dispatch_now(s, r, o, r->load_request)) api_error(c, 503, "out of memory");
    else future_reply(c, r->load_request, r->id);
}

static void h_load(svc *s, twk_http_conn *c, const cJSON *b, const char *tenant) {
    if (!cJSON_GetObjectItemCaseSensitive(b, "model_id") && cJSON_GetObjectItemCaseSensitive(b, "session_id")) {
        h_create_from_state(s, c, b, tenant);
        return;
    }
    int32_t seq;
    run_state *r = need_run(s, c, b, tenant, &seq);
    if (!r) return;
    op *o = svc_op_new(s, r, OP_LOAD, seq);
    if (!o) {
        api_error(c, 503, "out of memory");
        return;
    }
    const char *path;
    char err[256], kind[32];
    int optimizer = 0, status;
    twk_store_ckpt ck;
    twk_store_run src;
    if (!api_str(b, "path", 1, &path, err, sizeof err) || !api_bool(b, "optimizer", 0, &optimizer, err, sizeof err)) {
        snprintf(o->prefail, sizeof o->prefail, "%s", err);
    } else if (!svc_find_checkpoint(s, tenant, "path", path, &ck, &src, kind, sizeof kind, &status, err, sizeof err)) {
        snprintf(o->prefail, sizeof o->prefail, "%s", err);
    } else {
        if (optimizer && strcmp(kind, "weights"))
            snprintf(o->prefail, sizeof o->prefail, "%s holds sampler weights only; it has no optimizer state", path);
        else if (!r->base || strcmp(src.base_model, r->base->name))
            snprintf(o->prefail, sizeof o->prefail, "%s was trained on base model '%s'; model %s uses '%s'", path,
                     src.base_model, r->id, r->base ? r->base->name : "?");
        else if (src.lora_rank != r->lora.rank || src.train_attn != r->lora.train_attn ||
                 src.train_mlp != r->lora.train_mlp || src.train_unembed != r->lora.train_unembed)
            snprintf(o->prefail, sizeof o->prefail,
                     "%s has LoRA rank %d (attn %d, mlp %d, unembed %d); model %s has rank %d (attn %d, mlp %d, "
                     "unembed %d)",
                     path, src.lora_rank, src.train_attn, src.train_mlp, src.train_unembed, r->id, r->lora.rank,
                     r->lora.train_attn, r->lora.train_mlp, r->lora.train_unembed);
        snprintf(o->dir, sizeof o->dir, "%s", ck.path);
        o->load_optimizer = optimizer;
        twk_store_run_clear(&src);
    }
    submit_reply(s, c, r, o);
}

static void h_unload(svc *s, twk_http_conn *c, const cJSON *b, const char *tenant) {
    run_state *r = need_run(s, c, b, tenant, NULL);
    if (!r) return;
    /* unload carries no seq_id: it runs after whatever was already dispatched */
    op *o = svc_op_new(s, r, OP_UNLOAD, 0);
    if (!o) {
        api_error(c, 503, "out of memory");
        return;
    }
    char request_id[64];
    if (svc_dispatch_now(s, r, o, request_id)) api_error(c, 503, "out of memory");
    else future_reply(c, request_id, r->id);
}

static void h_weights_info(svc *s, twk_http_conn *c, const cJSON *b, const char *tenant) {
    const char *path;
    char err[256], kind[32];
    int status;
    twk_store_ckpt ck;
    twk_store_run src;
    if (!api_str(b, "tinker_path", 1, &path, err, sizeof err)) {
        api_error(c, 400, "%s", err);
        return;
    }
    if (!svc_find_checkpoint(s, tenant, "tinker_path", path, &ck, &src, kind, sizeof kind, &status, err, sizeof err)) {
        api_error(c, status, "%s", err);
        return;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "base_model", src.base_model);
    cJSON_AddBoolToObject(j, "is_lora", src.is_lora);
    cJSON_AddNumberToObject(j, "lora_rank", src.lora_rank);
    cJSON_AddBoolToObject(j, "train_attn", src.train_attn);
    cJSON_AddBoolToObject(j, "train_mlp", src.train_mlp);
    cJSON_AddBoolToObject(j, "train_unembed", src.train_unembed);
    twk_store_run_clear(&src);
    api_ok(c, j);
}

static void h_retrieve(svc *s, twk_http_conn *c, const cJSON *b, const char *tenant) {
    const char *id;
    char err[256];
    if (!api_str(b, "request_id", 1, &id, err, sizeof err)) {
        api_error(c, 400, "%s", err);
        return;
    }
    twk_futures_poll(s->futures, c, tenant, id);
}

/* ---- routing ---- */

/* A refused request that names a run of the tenant and a seq_id: its slot is
 * filled (svc_skip_seq), so the SDK's next op on that run proceeds at once. */
static void skip_seq(svc *s, const cJSON *b, const char *tenant) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(b, "model_id"), *q = cJSON_GetObjectItemCaseSensitive(b, "seq_id");
    if (!cJSON_IsString(m) || !cJSON_IsNumber(q) || q->valuedouble < 0 || q->valuedouble > 2147483647.0 ||
        q->valuedouble != (double)(int64_t)q->valuedouble)
        return;
    run_state *r = svc_find_run(s, tenant, m->valuestring);
    if (r) svc_skip_seq(s, r, (int64_t)q->valuedouble);
}

void svc_handle(twk_http_conn *c, const twk_http_req *req, void *user) {
    svc *s = user;
    api_json_oom(); /* a cJSON allocation failed since: the answer is 5xx */
    twk_log_context(NULL, req->path);
    twk_log_request_id(NULL);
    twk_http_log_fields(c, NULL, req->path, NULL);
    if (!strcmp(req->path, "/metrics")) { /* Prometheus (svc_metrics.c) */
        api_metrics(s, c, req);
        return;
    }
    if (!strncmp(req->path, "/v1/", 4)) { /* the OpenAI-compatible routes (api_openai.c) */
        api_openai(s, c, req);
        return;
    }
    if (api_dashboard_static(c, req)) return; /* GET /: the dashboard's page (api_dashboard.c) */
    /* the path is normalised by http.c (no "..", ".", "//" or encoded separators);
     * every endpoint is under /api/v1/ exactly */
    if (strncmp(req->path, "/api/v1/", 8) != 0) {
        api_error(c, 404, "no such endpoint: %s %s", req->method, req->path);
        return;
    }
    const char *route = req->path + 8;
    twk_http_log_fields(c, NULL, route, NULL);
    int get = !strcmp(req->method, "GET"), post = !strcmp(req->method, "POST");
    if (get && api_weights_download(s, c, req)) return; /* signed URL: no API key */
    if (get && api_trace_download(s, c, req)) return;   /* signed URL: no API key (api_trace.c) */
    if (get && !strcmp(route, "healthz")) {
        char health[512]; /* multi-rank: the ranks and the decode batches sent to each (dist_serve.c) */
        twk_http_respond_json(c, 200, svc_dist_health(health, sizeof health) ? health : "{\"status\":\"ok\"}");
        return;
    }
    char tenant[64];
    twk_log_context(NULL, route);
    const char *key = twk_http_header_get(req, "X-API-Key");
    if (!twk_auth_tenant(s->auth, key, tenant)) {
        if (twk_auth_is_token(key)) { /* an expired or forgotten auth/token JWT: the SDK fetches a new one */
            static const char msg[] = "invalid or expired token (exchange the API key at auth/token again)";
            twk_log_failure(NULL, NULL, route, 401, NULL, msg);
            char body[160];
            int n = snprintf(body, sizeof body, "{\"error\":\"%s\",\"detail\":\"%s\"}", msg, msg);
            twk_http_respond(c, 401, "application/json", body, (size_t)n,
                             "WWW-Authenticate: Bearer error=\"invalid_token\"\r\n");
            return;
        }
        api_error(c, 401, "invalid or missing API key (send X-API-Key: tml-...)");
        return;
    }
    twk_http_set_authenticated(c);
    twk_log_context(tenant, route);
    twk_http_log_fields(c, tenant, NULL, NULL);
    if (api_sessions(s, c, req, tenant, route)) return;
    if (api_dashboard(s, c, req, tenant, key, route)) return;
    if (get || !strcmp(req->method, "DELETE") || !strcmp(req->method, "PUT") ||
        (post && (!strncmp(route, "training_runs/", 14) || !strncmp(route, "sessions/", 9)))) {
        api_rest(s, c, req, tenant, route);
        return;
    }
    if (!post) {
        api_error(c, 405, "method %s not allowed on %s", req->method, req->path);
        return;
    }
    if (!strcmp(route, "forward_backward")) {
        h_forward_backward(s, c, req, tenant);
        return;
    }
    cJSON *b = api_body(c, req);
    if (!b) return;
    if (!strcmp(route, "client/config")) h_client_config(s, c);
    else if (!strcmp(route, "client/dynamic_config")) twk_http_respond_json(c, 200, "{\"refresh_interval_sec\":3600,\"sample_cancel_enabled\":true}");
    else if (!strcmp(route, "create_session")) h_create_session(s, c, b, tenant);
    else if (!strcmp(route, "session_heartbeat")) h_heartbeat(s, c, b, tenant);
    else if (!strcmp(route, "telemetry")) twk_http_respond_json(c, 200, "{\"status\":\"accepted\"}");
    else if (!strcmp(route, "create_model")) h_create_model(s, c, b, tenant);
    else if (!strcmp(route, "get_info")) h_get_info(s, c, b, tenant);
    else if (!strcmp(route, "unload_model")) h_unload(s, c, b, tenant);
    else if (!strcmp(route, "optim_step")) h_optim_step(s, c, b, tenant);
    else if (!strcmp(route, "save_weights")) h_save(s, c, b, tenant, OP_SAVE);
    else if (!strcmp(route, "save_weights_for_sampler")) h_save(s, c, b, tenant, OP_SAVE_SAMPLER);
    else if (!strcmp(route, "save_weights_external")) h_save(s, c, b, tenant, OP_SAVE_EXTERNAL);
    else if (!strcmp(route, "copy_weights")) api_copy_weights(s, c, req, b, tenant);
    else if (!strcmp(route, "load_weights")) h_load(s, c, b, tenant);
    else if (!strcmp(route, "weights_info")) h_weights_info(s, c, b, tenant);
    else if (!strcmp(route, "retrieve_future")) h_retrieve(s, c, b, tenant);
    else if (!strcmp(route, "create_sampling_session") || !strcmp(route, "asample")) api_sampling(s, c, req, tenant, route, b);
    else {
        skip_seq(s, b, tenant);
        api_error(c, 404, "no such endpoint: POST /api/v1/%s", route);
    }
    cJSON_Delete(b);
}
