/* Sampling: sessions (base model, a checkpoint's adapter, or a snapshot of a
 * run's adapter), asample futures executed on the worker with the KV-cache
 * sampler, and GET samplers/{id}. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_util.h"
#include "svc.h"

#define MAX_SAMPLE_INFLIGHT 64
#define MAX_NUM_SAMPLES 256
#define SAMPLER_SEQS 16
#define DEFAULT_MAX_TOKENS 128
#define MAX_STOP_TOKENS 64

sampler_session *svc_find_sampler(svc *s, const char *tenant, const char *id) {
    for (sampler_session *ss = s->samplers; ss; ss = ss->next)
        if (!strcmp(ss->id, id)) return strcmp(ss->tenant, tenant) ? NULL : ss;
    return NULL;
}

static sampler_session *new_session(svc *s, const char *tenant, const char *id, base_model *base) {
    for (sampler_session *x = s->samplers; x; x = x->next)
        if (!strcmp(x->id, id)) return NULL;
    sampler_session *ss = calloc(1, sizeof *ss);
    if (!ss) return NULL;
    snprintf(ss->id, sizeof ss->id, "%s", id);
    snprintf(ss->tenant, sizeof ss->tenant, "%s", tenant);
    ss->base = base;
    ss->next = s->samplers;
    s->samplers = ss;
    return ss;
}

sampler_session *svc_new_snapshot_session(svc *s, run_state *r, const char *id) {
    sampler_session *ss = new_session(s, r->tenant, id, r->base);
    if (!ss) return NULL;
    ss->has_lora = 1;
    ss->lora = r->lora;
    snprintf(ss->model_path, sizeof ss->model_path, "tinker://%s/sampler_weights/%s", r->id, id);
    return ss;
}

twk_status svc_sampler_ready(svc *s, sampler_session *ss, twk_trainer *from) {
    if (!ss->base) return twk_error(TWK_ERR_STATE, "the session's base model is not loaded");
    if (!ss->sampler) {
        twk_status st = twk_sampler_new(ss->base->m, ss->has_lora ? &ss->lora : NULL, SAMPLER_SEQS, s->cfg.max_context,
                                        &ss->sampler);
        if (st == TWK_OK && ss->adapter_dir[0]) st = twk_sampler_load_adapter(ss->sampler, ss->adapter_dir);
        if (st != TWK_OK) {
            twk_sampler_free(ss->sampler);
            ss->sampler = NULL;
            return st;
        }
    }
    if (from) {
        if (!ss->has_lora) return twk_error(TWK_ERR_STATE, "the session has no adapter");
        return twk_sampler_copy_adapter(ss->sampler, from);
    }
    return TWK_OK;
}

void svc_free_samplers(svc *s) {
    sampler_session *ss = s->samplers;
    while (ss) {
        sampler_session *next = ss->next;
        twk_sampler_free(ss->sampler);
        free(ss);
        ss = next;
    }
    s->samplers = NULL;
}

/* ---- asample ---- */

typedef struct sample_job {
    twk_job job;
    svc *s;
    sampler_session *ss;
    char request_id[64];
    int32_t *prompt;
    int64_t n_prompt;
    int num_samples;
    twk_sample_params p;
    int32_t stop[MAX_STOP_TOKENS];
    int prompt_logprobs, topk;
    char prefail[512];
    /* results (worker) */
    int ok, user_error;
    char err[512];
    uint8_t *out;
    size_t out_len;
} sample_job;

static void sample_run(twk_job *j) {
    sample_job *sj = j->arg;
    twk_wire_seq *seqs = calloc((size_t)sj->num_samples, sizeof *seqs);
    twk_sampled_seq *res = calloc((size_t)sj->num_samples, sizeof *res);
    float *plp = NULL, *tlp = NULL;
    int32_t *tid = NULL;
    twk_status st = seqs && res ? svc_sampler_ready(sj->s, sj->ss, NULL) : TWK_ERR_OOM;
    if (st != TWK_OK) {
        snprintf(sj->err, sizeof sj->err, "sampler unavailable: %s", twk_last_error());
        goto out;
    }
    /* rounds of at most the sampler's sequence count; a seed gives every round its own stream */
    for (int done = 0; st == TWK_OK && done < sj->num_samples;) {
        int n = sj->num_samples - done < SAMPLER_SEQS ? sj->num_samples - done : SAMPLER_SEQS;
        twk_sample_params p = sj->p;
        if (p.has_seed) p.seed = sj->p.seed + 0x2545f4914f6cdd1dull * (uint64_t)done;
        st = twk_sampler_generate(sj->ss->sampler, sj->prompt, sj->n_prompt, n, &p, res + done);
        done += n;
    }
    if (st == TWK_OK && (sj->prompt_logprobs || sj->topk > 0)) {
        plp = malloc((size_t)sj->n_prompt * 4);
        if (sj->topk > 0) {
            tid = malloc((size_t)sj->n_prompt * (size_t)sj->topk * 4);
            tlp = malloc((size_t)sj->n_prompt * (size_t)sj->topk * 4);
        }
        st = plp && (!sj->topk || (tid && tlp)) ? twk_sampler_score_prompt(sj->ss->sampler, sj->prompt, sj->n_prompt, plp,
                                                                           sj->topk, tid, tlp)
                                                : TWK_ERR_OOM;
    }
    if (st != TWK_OK) {
        snprintf(sj->err, sizeof sj->err, "%s", twk_last_error());
        sj->user_error = st == TWK_ERR_INVALID_ARG;
        goto out;
    }
    for (int i = 0; i < sj->num_samples; i++)
        seqs[i] = (twk_wire_seq){res[i].stop_reason, res[i].tokens, res[i].logprobs, res[i].n};
    st = twk_wire_encode_sample_response(seqs, sj->num_samples, sj->prompt_logprobs ? plp : NULL, sj->n_prompt,
                                         sj->topk > 0 ? tid : NULL, sj->topk > 0 ? tlp : NULL, sj->topk, &sj->out,
                                         &sj->out_len);
    if (st != TWK_OK) snprintf(sj->err, sizeof sj->err, "encoding the result failed: %s", twk_last_error());
    else sj->ok = 1;
out:
    for (int i = 0; res && i < sj->num_samples; i++) twk_sampled_seq_free(&res[i]);
    free(res);
    free(seqs);
    free(plp);
    free(tid);
    free(tlp);
}

static void sample_done(twk_job *j) {
    sample_job *sj = j->arg;
    svc *s = sj->s;
    s->sample_inflight--;
    if (sj->ok)
        twk_futures_complete(s->futures, sj->request_id, "application/x-protobuf", sj->out, sj->out_len);
    else
        twk_futures_fail(s->futures, sj->request_id, sj->user_error ? "user" : "server", sj->err);
    twk_host_free(sj->out);
    free(sj->prompt);
    free(sj);
}

/* Parses and checks an asample body into sj; a problem goes to sj->prefail. */
static void parse_sample(svc *s, const cJSON *b, sample_job *sj) {
    char err[256];
    int vocab = twk_model_cfg(sj->ss->base->m)->vocab;
    long long ns, max_tokens, top_k, seed, tk, tsl = 0, alt = 0;
    double temp, top_p;
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(b, "sampling_params");
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(b, "prompt");
    const cJSON *chunks = cJSON_GetObjectItemCaseSensitive(prompt, "chunks");
    if (!api_int(b, "num_samples", 0, 1, MAX_NUM_SAMPLES, 1, &ns, err, sizeof err) ||
        !api_bool(b, "prompt_logprobs", 0, &sj->prompt_logprobs, err, sizeof err) ||
        !api_int(b, "topk_prompt_logprobs", 0, 0, 64, 0, &tk, err, sizeof err) ||
        !api_int(b, "topk_sample_logprobs", 0, 0, 1 << 20, 0, &tsl, err, sizeof err) ||
        !api_int(b, "prompt_alt_tokens_k", 0, 0, 1 << 20, 0, &alt, err, sizeof err)) {
        snprintf(sj->prefail, sizeof sj->prefail, "%s", err);
        return;
    }
    if (tsl > 0 || alt > 0 || cJSON_GetObjectItemCaseSensitive(b, "target_prompt_logprobs")) {
        snprintf(sj->prefail, sizeof sj->prefail,
                 "%s is not supported by this server (topk_sample_logprobs, prompt_alt_tokens_k and "
                 "target_prompt_logprobs must be absent or 0)",
                 tsl > 0 ? "topk_sample_logprobs > 0" : alt > 0 ? "prompt_alt_tokens_k > 0" : "target_prompt_logprobs");
        return;
    }
    if (sp && !cJSON_IsObject(sp)) {
        snprintf(sj->prefail, sizeof sj->prefail, "field 'sampling_params' must be an object");
        return;
    }
    if (!cJSON_IsArray(chunks) || cJSON_GetArraySize(chunks) < 1) {
        snprintf(sj->prefail, sizeof sj->prefail, "prompt.chunks must be a non-empty list");
        return;
    }
    int64_t n = 0;
    for (const cJSON *ch = chunks->child; ch; ch = ch->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(ch, "type"), *toks = cJSON_GetObjectItemCaseSensitive(ch, "tokens");
        if (cJSON_IsString(type) && strcmp(type->valuestring, "encoded_text")) {
            snprintf(sj->prefail, sizeof sj->prefail, "prompt chunk type '%s' is not supported (encoded_text is)", type->valuestring);
            return;
        }
        if (!cJSON_IsArray(toks)) {
            snprintf(sj->prefail, sizeof sj->prefail, "prompt.chunks[].tokens must be a list of token ids");
            return;
        }
        n += cJSON_GetArraySize(toks);
    }
    if (n < 1 || n >= s->cfg.max_context) {
        snprintf(sj->prefail, sizeof sj->prefail, "the prompt has %lld tokens; it must be 1..%lld", (long long)n,
                 (long long)s->cfg.max_context - 1);
        return;
    }
    sj->prompt = malloc((size_t)n * 4);
    if (!sj->prompt) {
        snprintf(sj->prefail, sizeof sj->prefail, "out of memory");
        return;
    }
    int64_t k = 0;
    for (const cJSON *ch = chunks->child; ch; ch = ch->next)
        for (const cJSON *t = cJSON_GetObjectItemCaseSensitive(ch, "tokens")->child; t; t = t->next, k++) {
            if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 || t->valuedouble >= vocab) {
                snprintf(sj->prefail, sizeof sj->prefail, "prompt token %lld is not a token id in [0, %d)", (long long)k, vocab);
                return;
            }
            sj->prompt[k] = (int32_t)t->valuedouble;
        }
    sj->n_prompt = n;
    sj->num_samples = (int)ns;
    sj->topk = (int)tk;
    int64_t room = s->cfg.max_context - n;
    if (!api_int(sp, "max_tokens", 0, 1, 1 << 30, room < DEFAULT_MAX_TOKENS ? room : DEFAULT_MAX_TOKENS, &max_tokens, err,
                 sizeof err) ||
        !api_num(sp, "temperature", 0, 1.0, &temp, err, sizeof err) ||
        !api_int(sp, "top_k", 0, -1, 1 << 30, -1, &top_k, err, sizeof err) ||
        !api_num(sp, "top_p", 0, 1.0, &top_p, err, sizeof err) ||
        !api_int(sp, "seed", 0, -(1ll << 62), (1ll << 62), 0, &seed, err, sizeof err)) {
        snprintf(sj->prefail, sizeof sj->prefail, "sampling_params: %s", err);
        return;
    }
    if (max_tokens > room) {
        snprintf(sj->prefail, sizeof sj->prefail,
                 "sampling_params.max_tokens %lld with a %lld-token prompt exceeds the context length %lld", max_tokens,
                 (long long)n, (long long)s->cfg.max_context);
        return;
    }
    if (temp < 0) {
        snprintf(sj->prefail, sizeof sj->prefail, "sampling_params.temperature %g must be >= 0", temp);
        return;
    }
    if (!(top_p > 0 && top_p <= 1)) {
        snprintf(sj->prefail, sizeof sj->prefail, "sampling_params.top_p %g must be in (0, 1]", top_p);
        return;
    }
    if (top_k == 0) {
        snprintf(sj->prefail, sizeof sj->prefail, "sampling_params.top_k 0 is not allowed (-1 turns it off)");
        return;
    }
    sj->p = (twk_sample_params){.max_tokens = (int)max_tokens, .temperature = (float)temp, .top_k = (int)top_k,
                                .top_p = (float)top_p, .seed = (uint64_t)seed,
                                .has_seed = cJSON_GetObjectItemCaseSensitive(sp, "seed") &&
                                            !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(sp, "seed"))};
    /* stop: absent = the model's EOS ids; [] = none; ints = token ids; strings need a tokenizer */
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(sp, "stop");
    int ns_tok = 0;
    if (!stop || cJSON_IsNull(stop)) {
        const twk_model_config *mc = twk_model_cfg(sj->ss->base->m);
        for (int i = 0; i < mc->n_eos; i++) sj->stop[ns_tok++] = mc->eos[i];
    } else if (cJSON_IsString(stop)) {
        snprintf(sj->prefail, sizeof sj->prefail,
                 "sampling_params.stop: stop strings need the model's tokenizer, which this server does not load yet; "
                 "pass stop token ids");
        return;
    } else if (cJSON_IsArray(stop)) {
        for (const cJSON *e = stop->child; e; e = e->next) {
            if (cJSON_IsString(e)) {
                snprintf(sj->prefail, sizeof sj->prefail,
                         "sampling_params.stop: stop strings need the model's tokenizer, which this server does not load "
                         "yet; pass stop token ids");
                return;
            }
            if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= vocab || ns_tok == MAX_STOP_TOKENS) {
                snprintf(sj->prefail, sizeof sj->prefail,
                         "sampling_params.stop: at most %d token ids in [0, %d)", MAX_STOP_TOKENS, vocab);
                return;
            }
            sj->stop[ns_tok++] = (int32_t)e->valuedouble;
        }
    } else {
        snprintf(sj->prefail, sizeof sj->prefail, "sampling_params.stop must be a string, a list, or null");
        return;
    }
    sj->p.stop_tokens = sj->stop;
    sj->p.n_stop_tokens = ns_tok;
}

static void h_asample(svc *s, twk_http_conn *c, const cJSON *b, const char *tenant) {
    const char *sid;
    char err[256];
    if (!api_str(b, "sampling_session_id", 1, &sid, err, sizeof err)) {
        api_error(c, 400, "%s (base_model / model_path sampling needs create_sampling_session first)", err);
        return;
    }
    sampler_session *ss = svc_find_sampler(s, tenant, sid);
    if (!ss) {
        api_error(c, 404, "sampling session '%s' not found", sid);
        return;
    }
    if (s->sample_inflight >= MAX_SAMPLE_INFLIGHT) {
        api_error(c, 429, "the sampling queue is full (%d requests); retry shortly", s->sample_inflight);
        return;
    }
    sample_job *sj = calloc(1, sizeof *sj);
    if (!sj) {
        api_error(c, 503, "out of memory");
        return;
    }
    sj->s = s;
    sj->ss = ss;
    parse_sample(s, b, sj);
    twk_futures_create(s->futures, tenant, sj->request_id);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "request_id", sj->request_id);
    cJSON *ids = cJSON_AddArrayToObject(j, "sample_sequence_ids");
    int n = sj->num_samples > 0 ? sj->num_samples : 1;
    long long want;
    char e2[64];
    if (!sj->num_samples && api_int(b, "num_samples", 0, 1, MAX_NUM_SAMPLES, 1, &want, e2, sizeof e2)) n = (int)want;
    for (int i = 0; i < n; i++) {
        char sq[96];
        snprintf(sq, sizeof sq, "%s:%d", sj->request_id, i);
        cJSON_AddItemToArray(ids, cJSON_CreateString(sq));
    }
    if (sj->prefail[0]) {
        twk_futures_fail(s->futures, sj->request_id, "user", sj->prefail);
        free(sj->prompt);
        free(sj);
    } else {
        s->sample_inflight++;
        sj->job.run = sample_run;
        sj->job.done = sample_done;
        sj->job.arg = sj;
        twk_worker_submit(s->worker, &sj->job);
    }
    api_ok(c, j);
}

static void h_create_session(svc *s, twk_http_conn *c, const cJSON *b, const char *tenant) {
    const char *session_id, *base = NULL, *path = NULL;
    long long seq;
    char err[256];
    if (!api_str(b, "session_id", 1, &session_id, err, sizeof err) ||
        !api_int(b, "sampling_session_seq_id", 1, 0, 1000000000, 0, &seq, err, sizeof err) ||
        !api_str(b, "base_model", 0, &base, err, sizeof err) || !api_str(b, "model_path", 0, &path, err, sizeof err)) {
        api_error(c, 400, "%s", err);
        return;
    }
    if ((!base) == (!path)) {
        api_error(c, 400, "give exactly one of base_model and model_path");
        return;
    }
    twk_store_session sess;
    if (twk_store_session_get(s->store, tenant, session_id, &sess) != TWK_OK) {
        api_error(c, 404, "session '%s' not found", session_id);
        return;
    }
    twk_store_session_clear(&sess);
    char id[160];
    snprintf(id, sizeof id, "%s:sample:%lld", session_id, seq);
    sampler_session *ss = svc_find_sampler(s, tenant, id);
    if (!ss) {
        if (base) {
            base_model *bm = svc_find_model(s, base);
            if (!bm) {
                api_error(c, 400, "base_model '%s' is not served here (see get_server_capabilities)", base);
                return;
            }
            ss = new_session(s, tenant, id, bm);
        } else {
            char run[128], kind[32], name[128], ckid[200];
            twk_store_ckpt ck;
            twk_store_run src;
            if (!svc_parse_tinker_path(path, run, sizeof run, kind, sizeof kind, name, sizeof name)) {
                api_error(c, 400, "model_path '%s' is not tinker://<run>/(weights|sampler_weights)/<name>", path);
                return;
            }
            snprintf(ckid, sizeof ckid, "%s/%s", kind, name);
            if (twk_store_ckpt_get(s->store, tenant, run, ckid, &ck) != TWK_OK ||
                twk_store_run_get(s->store, tenant, run, &src) != TWK_OK) {
                api_error(c, 404, "checkpoint %s not found", path);
                return;
            }
            base_model *bm = svc_find_model(s, src.base_model);
            if (!bm) {
                twk_store_run_clear(&src);
                api_error(c, 400, "%s was trained on '%s', which this server does not serve now", path, src.base_model);
                return;
            }
            ss = new_session(s, tenant, id, bm);
            if (ss) {
                ss->has_lora = 1;
                ss->lora = twk_lora_default();
                ss->lora.rank = src.lora_rank;
                ss->lora.alpha = 32;
                ss->lora.train_attn = src.train_attn;
                ss->lora.train_mlp = src.train_mlp;
                ss->lora.train_unembed = src.train_unembed;
                snprintf(ss->adapter_dir, sizeof ss->adapter_dir, "%s", ck.path);
                snprintf(ss->model_path, sizeof ss->model_path, "%s", path);
            }
            twk_store_run_clear(&src);
        }
        if (!ss) {
            api_error(c, 503, "out of memory");
            return;
        }
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "sampling_session_id", ss->id);
    cJSON_AddStringToObject(j, "type", "create_sampling_session");
    api_ok(c, j);
}

void api_sampling(svc *s, twk_http_conn *c, const twk_http_req *req, const char *tenant, const char *route, cJSON *body) {
    (void)req;
    if (!strncmp(route, "samplers/", 9)) {
        sampler_session *ss = svc_find_sampler(s, tenant, route + 9);
        if (!ss) {
            api_error(c, 404, "sampler '%s' not found", route + 9);
            return;
        }
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "sampler_id", ss->id);
        cJSON_AddStringToObject(j, "base_model", ss->base ? ss->base->name : "");
        if (ss->model_path[0]) cJSON_AddStringToObject(j, "model_path", ss->model_path);
        else cJSON_AddNullToObject(j, "model_path");
        api_ok(c, j);
    } else if (!strcmp(route, "create_sampling_session")) {
        h_create_session(s, c, body, tenant);
    } else {
        h_asample(s, c, body, tenant);
    }
}
