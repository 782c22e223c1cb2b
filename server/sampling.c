/* Sampling: sessions (base model, a checkpoint's adapter, or a snapshot of a
 * run's adapter), asample futures executed on the worker with the KV-cache
 * sampler, and GET samplers/{id}. */
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_util.h"
#include "metrics.h"
#include "svc.h"
#include "dist_serve.h" /* multi-rank: decode batches on other ranks */

#define MAX_NUM_SAMPLES TWK_SERVE_MAX_NUM_SAMPLES
#define SAMPLER_SEQS TWK_SERVE_SAMPLER_SEQS
#define DEFAULT_MAX_TOKENS TWK_SERVE_DEF_MAX_TOKENS
#define MAX_STOP_TOKENS TWK_SERVE_MAX_STOP_TOKENS
#define MAX_STOP_STRINGS TWK_SERVE_MAX_STOP_STRINGS
#define MAX_STOP_STRING_LEN TWK_SERVE_MAX_STOP_STRING_LEN

sampler_session *svc_find_sampler(svc *s, const char *tenant, const char *id) {
    for (sampler_session *ss = s->samplers; ss; ss = ss->next)
        if (!strcmp(ss->id, id)) return strcmp(ss->tenant, tenant) ? NULL : ss;
    return NULL;
}

static sampler_unit *unit_new(base_model *base, const twk_lora_config *lora, const char *adapter_dir) {
    sampler_unit *u = twk_host_calloc(sizeof *u, "sampling u");
    if (!u) return NULL;
    u->base = base;
    if (lora) {
        u->has_lora = 1;
        u->lora = *lora;
    }
    if (adapter_dir) snprintf(u->adapter_dir, sizeof u->adapter_dir, "%s", adapter_dir);
    pthread_mutex_init(&u->mu, NULL);
    return u;
}

static void unit_free(sampler_unit *u) {
    if (!u) return;
    twk_sampler_free(u->sampler);
    twk_host_free(u->adapter_copy);
    pthread_mutex_destroy(&u->mu);
    twk_host_free(u);
}

/* A session bound to `unit` (owned when own != 0); NULL if the id exists or memory ran out. */
static sampler_session *new_session(svc *s, const char *tenant, const char *id, base_model *base, sampler_unit *unit,
                                    int own) {
    for (sampler_session *x = s->samplers; x; x = x->next)
        if (!strcmp(x->id, id)) return NULL;
    sampler_session *ss = unit ? twk_host_calloc(sizeof *ss, "sampling") : NULL;
    if (!ss) {
        if (own) unit_free(unit);
        return NULL;
    }
    snprintf(ss->id, sizeof ss->id, "%s", id);
    snprintf(ss->tenant, sizeof ss->tenant, "%s", tenant);
    ss->base = base;
    ss->unit = unit;
    ss->owns_unit = own;
    ss->next = s->samplers;
    s->samplers = ss;
    return ss;
}

/* The base model's shared unit (adapter slots), made on first use. */
static sampler_unit *shared_unit(svc *s, base_model *bm) {
    if (!bm->shared) {
        bm->shared = unit_new(bm, NULL, NULL);
        if (bm->shared) bm->shared->n_slots = s->cfg.sampler_slots;
    }
    return bm->shared;
}

/* A session on the shared unit when its adapter fits a slot, else on its own unit: a larger rank
 * than --slot-rank, or LoRA on a mixture of experts' experts / router (slots hold no expert stacks). */
static sampler_session *adapter_session(svc *s, const char *tenant, const char *id, base_model *bm,
                                        const twk_lora_config *lc, const char *dir) {
    int moe = bm->m && twk_model_cfg(bm->m)->n_experts > 0 && (lc->train_experts || lc->train_router);
    int fits = s->cfg.max_lora_rank >= 1 && lc->rank <= s->cfg.slot_rank && !moe;
    sampler_session *ss = fits ? new_session(s, tenant, id, bm, shared_unit(s, bm), 0)
                               : new_session(s, tenant, id, bm, unit_new(bm, lc, dir), 1);
    if (ss && fits) {
        ss->has_adapter = 1;
        ss->rank = lc->rank;
        ss->alpha = lc->alpha;
        if (dir) snprintf(ss->adapter_dir, sizeof ss->adapter_dir, "%s", dir);
    }
    return ss;
}

sampler_session *svc_new_snapshot_session(svc *s, run_state *r, const char *id) {
    if (!r->base) return NULL;
    sampler_session *ss = adapter_session(s, r->tenant, id, r->base, &r->lora, NULL);
    if (!ss) return NULL;
    ss->snapshot = 1;
    snprintf(ss->model_path, sizeof ss->model_path, "tinker://%s/sampler_weights/%s", r->id, id);
    return ss;
}

static void host_adapter_free(host_adapter *h) {
    for (int i = 0; h && i < h->n; i++) twk_host_free(h->data[i]);
    if (h) {
        twk_host_free(h->names);
        twk_host_free(h->data);
        twk_host_free(h->nelem);
    }
    twk_host_free(h);
}

/* Worker: the trainer's adapter copied to the host, for a snapshot session. */
static twk_status capture_adapter_in(sampler_session *ss, twk_trainer *from) {
    int n = twk_trainer_param_count(from);
    host_adapter *h = twk_host_calloc(sizeof *h, "sampling h");
    if (h) {
        h->names = twk_host_calloc((size_t)n * sizeof *h->names, "sampling names");
        h->data = twk_host_calloc((size_t)n * sizeof *h->data, "sampling data");
        h->nelem = twk_host_calloc((size_t)n * sizeof *h->nelem, "sampling nelem");
    }
    if (!h || !h->names || !h->data || !h->nelem) {
        host_adapter_free(h);
        return twk_error(TWK_ERR_OOM, "snapshot: out of memory");
    }
    for (int i = 0; i < n; i++) {
        int64_t ne = 0;
        const char *name = twk_trainer_param_name(from, i, &ne);
        snprintf(h->names[i], sizeof h->names[i], "%s", name);
        h->data[i] = twk_host_alloc((size_t)ne * sizeof **h->data, "snapshot adapter tensor");
        h->nelem[i] = ne;
        h->n = i + 1;
        if (!h->data[i] || twk_trainer_get(from, name, h->data[i], ne) != TWK_OK) {
            host_adapter_free(h);
            return twk_error(TWK_ERR_OOM, "snapshot: copying %s failed", name);
        }
    }
    host_adapter_free(ss->copy);
    ss->copy = h;
    return TWK_OK;
}

/* capture_adapter_in, its copy counted in the host's adapter_copies pool. */
static twk_status capture_adapter(sampler_session *ss, twk_trainer *from) {
    twk_host_pool pool = twk_host_pool_enter(TWK_HPOOL_ADAPTER_COPIES);
    twk_status st = capture_adapter_in(ss, from);
    twk_host_pool_enter(pool);
    return st;
}

static int get_from_host(void *ctx, const char *name, float *dst, int64_t nelem) {
    const host_adapter *h = ctx;
    for (int i = 0; i < h->n; i++)
        if (!strcmp(h->names[i], name)) {
            if (h->nelem[i] != nelem) return 0;
            memcpy(dst, h->data[i], (size_t)nelem * sizeof *dst);
            return 1;
        }
    return 0;
}

twk_status svc_snapshot_capture(sampler_session *ss, twk_trainer *from) {
    if (ss->owns_unit) return TWK_ERR_STATE; /* not a slotted session: the caller copies into its sampler */
    return capture_adapter(ss, from);
}

/* Worker: drops the sampler (KV cache) of the least recently used unit; a
 * snapshot keeps its adapter on the host to be restored when used again. */
static void evict_one(svc *s, const sampler_unit *keep) {
    int victim = -1;
    for (int i = 0; i < s->n_live_units; i++)
        if (s->live_units[i] != keep && (victim < 0 || s->live_units[i]->last_use < s->live_units[victim]->last_use))
            victim = i;
    if (victim < 0) return;
    sampler_unit *u = s->live_units[victim];
    if (u->has_lora && !u->adapter_dir[0] && !u->adapter_copy) {
        size_t n = twk_sampler_adapter_bytes(u->sampler);
        u->adapter_copy = twk_host_pool_alloc(TWK_HPOOL_ADAPTER_COPIES, n ? n : 1, "sampling adapter_copy");
        if (!u->adapter_copy || twk_sampler_adapter_to_host(u->sampler, u->adapter_copy, n) != TWK_OK) {
            twk_host_free(u->adapter_copy);
            u->adapter_copy = NULL;
            return; /* keep it rather than lose the snapshot */
        }
        u->adapter_copy_bytes = n;
    }
    twk_sampler_free(u->sampler);
    u->sampler = NULL;
    atomic_store(&u->evicted, 1);
    s->live_units[victim] = s->live_units[--s->n_live_units];
    malloc_trim(0); /* give the cache's pages back to the system */
}

twk_status svc_sampler_ready(svc *s, sampler_unit *u, twk_trainer *from) {
    if (!u->base) return twk_error(TWK_ERR_STATE, "the sampler's base model is not loaded");
    u->last_use = ++s->use_clock;
    if (!u->sampler) {
        while (s->n_live_units >= s->cfg.live_samplers) {
            int before = s->n_live_units;
            evict_one(s, u);
            if (s->n_live_units == before) break;
        }
        twk_status st = u->n_slots ? twk_sampler_new_slots(u->base->m, u->n_slots, s->cfg.slot_rank, SAMPLER_SEQS,
                                                           s->cfg.max_context, &u->sampler)
                                   : twk_sampler_new(u->base->m, u->has_lora ? &u->lora : NULL, SAMPLER_SEQS,
                                                     s->cfg.max_context, &u->sampler);
        for (int i = 0; i < TWK_SERVE_CAP_SAMPLER_SLOTS; i++) u->slot_owner[i] = NULL; /* fresh slots are zeros: the base */
        if (st == TWK_OK && u->adapter_dir[0]) st = twk_sampler_load_adapter(u->sampler, u->adapter_dir);
        if (st == TWK_OK && u->adapter_copy)
            st = twk_sampler_adapter_from_host(u->sampler, u->adapter_copy, u->adapter_copy_bytes);
        if (st != TWK_OK) {
            twk_sampler_free(u->sampler);
            u->sampler = NULL;
            return st;
        }
        if (s->n_live_units < s->cfg.live_samplers) s->live_units[s->n_live_units++] = u;
        atomic_store(&u->evicted, 0);
    }
    if (from) {
        if (!u->has_lora) return twk_error(TWK_ERR_STATE, "the sampler has no adapter");
        return twk_sampler_copy_adapter(u->sampler, from);
    }
    return TWK_OK;
}

void svc_snapshot_drop_worker(svc *s, sampler_session *ss) {
    sampler_unit *u = ss->unit;
    if (ss->owns_unit) {
        for (int i = 0; i < s->n_live_units; i++)
            if (s->live_units[i] == u) s->live_units[i--] = s->live_units[--s->n_live_units];
        unit_free(u);
        ss->unit = NULL;
    } else {
        for (int i = 0; i < u->n_slots; i++)
            if (u->slot_owner[i] == ss) u->slot_owner[i] = NULL;
    }
    host_adapter_free(ss->copy);
    ss->copy = NULL;
}

void svc_sampler_unlink(svc *s, sampler_session *ss) {
    for (sampler_session **pp = &s->samplers; *pp; pp = &(*pp)->next)
        if (*pp == ss) {
            *pp = ss->next;
            return;
        }
}

void svc_sampler_free(sampler_session *ss) {
    if (ss->owns_unit) unit_free(ss->unit);
    host_adapter_free(ss->copy);
    svc_session_events_free(ss);
    twk_host_free(ss);
}

void svc_free_samplers(svc *s) {
    sampler_session *ss = s->samplers;
    while (ss) {
        sampler_session *next = ss->next;
        svc_sampler_free(ss);
        ss = next;
    }
    s->samplers = NULL;
    for (int i = 0; i < s->n_models; i++) {
        unit_free(s->models[i].shared);
        s->models[i].shared = NULL;
    }
}

/* ---- asample ---- */

typedef struct sample_job {
    struct sample_job *next; /* in its unit's pending list, then in a batch */
    svc *s;
    sampler_session *ss;
    int slot;                /* worker: the adapter slot it decodes with (shared units) */
    char request_id[64];
    int64_t clone;           /* the client of the session that sent it: seq_id / 1e9 (retrieve_futures) */
    int32_t *prompt;
    int64_t n_prompt;
    int num_samples;
    twk_sample_params p;
    int32_t stop[MAX_STOP_TOKENS];
    char stop_str[MAX_STOP_STRINGS][MAX_STOP_STRING_LEN + 1];
    const char *stop_ptr[MAX_STOP_STRINGS];
    unsigned long long serial; /* which drain job may take it when it needs rounds of its own */
    int prompt_logprobs, topk;
    int record; /* record_stability_info: keep each sequence for stable_reinforce */
    int64_t last_n; /* prompt_logprobs_last_n: score only the last N prompt tokens (0 = all) */
    char prefail[512];
    int prefail_server; /* prefail is the server's (out of memory): category "server" */
    /* a generation for another front end (svc_generate): results handed to done, not a future */
    svc_gen_fn done;
    void *done_ctx;
    int gen_topk;
    svc_gen_result gen;
    svc_gen_progress *progress; /* with a step callback: tokens handed to the loop while decoding */
    /* results (worker) */
    int ok, user_error;
    char err[512];
    uint8_t *out;
    size_t out_len;
    double t_queued, t_started; /* metrics: queued (loop), started (worker) */
    int64_t gen_tokens;         /* generated tokens (worker) */
} sample_job;

/* record_stability_info: each sequence under its id ("<request_id>:<i>", as
 * asample answered), owned by the client session that made the sampler. */
static twk_status record_stability(sample_job *sj, const twk_sampled_seq *res) {
    char session[160], seq_id[96];
    snprintf(session, sizeof session, "%s", sj->ss->id);
    char *cut = strstr(session, ":sample:");
    if (cut) *cut = 0;
    for (int i = 0; i < sj->num_samples; i++) {
        snprintf(seq_id, sizeof seq_id, "%s:%d", sj->request_id, i);
        twk_stab_seq q = {sj->prompt, sj->n_prompt, res[i].tokens, res[i].logprobs, res[i].n};
        if (!twk_stab_record(sj->s->stab, sj->ss->tenant, session, seq_id, &q))
            return twk_error(TWK_ERR_OOM, "out of memory recording stability information");
    }
    return TWK_OK;
}

/* Worker: a svc_generate job keeps its sequences (res entries are moved out) and, with gen_topk,
 * the gen_topk most likely tokens at each generated position. */
static twk_status keep_generation(sample_job *sj, twk_sampled_seq *res) {
    sampler_unit *u = sj->ss->unit;
    svc_gen_result *g = &sj->gen;
    int n = sj->num_samples, k = sj->gen_topk;
    g->seqs = twk_host_calloc((size_t)n * sizeof *g->seqs, "generation");
    if (k > 0) {
        g->top_ids = twk_host_calloc((size_t)n * sizeof *g->top_ids, "generation top-k");
        g->top_lps = twk_host_calloc((size_t)n * sizeof *g->top_lps, "generation top-k");
    }
    if (!g->seqs || (k > 0 && (!g->top_ids || !g->top_lps))) return twk_error(TWK_ERR_OOM, "out of memory");
    g->n = n;
    g->top_k = k;
    for (int i = 0; i < n; i++) {
        g->seqs[i] = res[i];
        memset(&res[i], 0, sizeof res[i]);
    }
    if (k <= 0) return TWK_OK;
    twk_sampler_set_score_slot(u->sampler, sj->slot);
    for (int i = 0; i < n; i++) {
        int64_t len = sj->n_prompt + g->seqs[i].n, ng = g->seqs[i].n;
        int32_t *all = twk_host_alloc((size_t)len * 4, "generation top-k"),
                *ids = twk_host_alloc((size_t)len * (size_t)k * 4, "generation top-k");
        float *lps = twk_host_alloc((size_t)len * (size_t)k * 4, "generation top-k");
        twk_status st = all && ids && lps ? TWK_OK : twk_error(TWK_ERR_OOM, "out of memory");
        if (st == TWK_OK) {
            memcpy(all, sj->prompt, (size_t)sj->n_prompt * 4);
            memcpy(all + sj->n_prompt, g->seqs[i].tokens, (size_t)ng * 4);
            st = twk_sampler_score_prompt(u->sampler, all, len, NULL, k, ids, lps);
        }
        if (st == TWK_OK) { /* row p: the next token given all[:p]; generated token j sits at p = n_prompt + j */
            memmove(ids, ids + sj->n_prompt * k, (size_t)(ng * k) * 4);
            memmove(lps, lps + sj->n_prompt * k, (size_t)(ng * k) * 4);
        }
        twk_host_free(all);
        g->top_ids[i] = ids;
        g->top_lps[i] = lps;
        if (st != TWK_OK) return st;
    }
    return TWK_OK;
}

static void gen_result_free(svc_gen_result *g) {
    for (int i = 0; i < g->n; i++) {
        if (g->seqs) twk_sampled_seq_free(&g->seqs[i]);
        if (g->top_ids) twk_host_free(g->top_ids[i]);
        if (g->top_lps) twk_host_free(g->top_lps[i]);
    }
    twk_host_free(g->seqs);
    twk_host_free(g->top_ids);
    twk_host_free(g->top_lps);
    memset(g, 0, sizeof *g);
}

/* Encodes one finished request (or records why it failed). */
static void finish_request(sample_job *sj, twk_sampled_seq *res, twk_status st) {
    sampler_unit *u = sj->ss->unit;
    for (int i = 0; st == TWK_OK && res && i < sj->num_samples; i++) sj->gen_tokens += res[i].n;
    if (sj->done) {
        if (st == TWK_OK) st = keep_generation(sj, res);
        if (st == TWK_OK) sj->ok = 1;
        else if (!sj->err[0]) {
            snprintf(sj->err, sizeof sj->err, "%s", twk_last_error());
            sj->user_error = st == TWK_ERR_INVALID_ARG;
        }
        return;
    }
    float *plp = NULL, *tlp = NULL;
    int32_t *tid = NULL;
    twk_wire_seq *seqs = NULL;
    if (st == TWK_OK && (sj->prompt_logprobs || sj->topk > 0)) {
        twk_sampler_set_score_slot(u->sampler, sj->slot);
        plp = twk_host_alloc((size_t)sj->n_prompt * sizeof *plp, "prompt logprobs");
        if (sj->topk > 0) {
            tid = twk_host_alloc((size_t)sj->n_prompt * (size_t)sj->topk * sizeof *tid, "prompt top-k ids");
            tlp = twk_host_alloc((size_t)sj->n_prompt * (size_t)sj->topk * sizeof *tlp, "prompt top-k logprobs");
        }
        st = plp && (!sj->topk || (tid && tlp))
                 ? twk_sampler_score_prompt(u->sampler, sj->prompt, sj->n_prompt, plp, sj->topk, tid, tlp)
                 : TWK_ERR_OOM;
        /* prompt_logprobs_last_n: positions before the suffix are "not computed" */
        for (int64_t i = 0; st == TWK_OK && sj->last_n > 0 && i < sj->n_prompt - sj->last_n; i++) {
            plp[i] = NAN;
            for (int q = 0; tid && q < sj->topk; q++) {
                tid[i * sj->topk + q] = 0;
                tlp[i * sj->topk + q] = -99999.0f;
            }
        }
    }
    if (st == TWK_OK) {
        seqs = twk_host_calloc((size_t)sj->num_samples * sizeof *seqs, "sampling seqs");
        if (!seqs) st = TWK_ERR_OOM;
        for (int i = 0; seqs && i < sj->num_samples; i++)
            seqs[i] = (twk_wire_seq){res[i].stop_reason, res[i].tokens, res[i].logprobs, res[i].n};
        if (st == TWK_OK)
            st = twk_wire_encode_sample_response(seqs, sj->num_samples, sj->prompt_logprobs ? plp : NULL, sj->n_prompt,
                                                 sj->topk > 0 ? tid : NULL, sj->topk > 0 ? tlp : NULL, sj->topk, &sj->out,
                                                 &sj->out_len);
    }
    if (st == TWK_OK && sj->record) st = record_stability(sj, res);
    if (st == TWK_OK) sj->ok = 1;
    else if (!sj->err[0]) {
        snprintf(sj->err, sizeof sj->err, "%s", twk_last_error());
        sj->user_error = st == TWK_ERR_INVALID_ARG;
    }
    twk_host_free(seqs);
    twk_host_free(plp);
    twk_host_free(tid);
    twk_host_free(tlp);
}

/* Worker: the slot holding ss's adapter in u's sampler, loading it into the
 * least recently used slot no request of this batch uses when needed. */
static int assign_slot(svc *s, sampler_unit *u, sampler_session *ss, int *busy, twk_status *st) {
    *st = TWK_OK;
    if (!ss->has_adapter) return 0;
    for (int i = 1; i < u->n_slots; i++)
        if (u->slot_owner[i] == ss) {
            u->slot_use[i] = ++s->use_clock;
            busy[i] = 1;
            return i;
        }
    int v = -1;
    for (int i = 1; i < u->n_slots; i++)
        if (!busy[i] && (v < 0 || !u->slot_owner[i] || (u->slot_owner[v] && u->slot_use[i] < u->slot_use[v]))) v = i;
    if (v < 0) {
        *st = twk_error(TWK_ERR_STATE, "no free adapter slot");
        return 0;
    }
    u->slot_owner[v] = NULL;
    if (ss->adapter_dir[0]) *st = twk_sampler_slot_load_dir(u->sampler, v, ss->adapter_dir);
    else if (ss->copy) *st = twk_sampler_slot_set(u->sampler, v, ss->rank, ss->alpha, get_from_host, ss->copy);
    else *st = twk_error(TWK_ERR_STATE, "the snapshot's adapter was not captured");
    if (*st != TWK_OK) return 0;
    u->slot_owner[v] = ss;
    u->slot_use[v] = ++s->use_clock;
    busy[v] = 1;
    return v;
}

typedef struct drain_job {
    twk_job job;
    svc *s;
    sampler_unit *unit;
    unsigned long long own;  /* the serial of the request this job was queued for */
    sample_job *batch;       /* the requests this job took */
    twk_sampled_seq *res;    /* a request for more samples than a batch holds: its rounds so far */
    int rounds_done;         /* samples of it decoded */
    int rank, tag;           /* multi-rank: the batch decodes on this rank (> 0), answered under tag */
} drain_job;

/* ---- multi-rank: decode batches on the other ranks' sampler replicas (dist_serve.c) ---- */

static void drain_done(twk_job *j);

/* Worker: the sequences of a batch another rank decoded, finished as a local batch would be. */
static void remote_collect(twk_job *j) {
    drain_job *dj = j->arg;
    int used = 0;
    for (sample_job *sj = dj->batch; sj; sj = sj->next) used += sj->num_samples;
    twk_sampled_seq *res = twk_host_calloc((size_t)used * sizeof *res, "sampling res");
    twk_status st = res ? svc_dist_sample_recv(dj->rank, dj->tag, res, used) : TWK_ERR_OOM;
    int off = 0;
    for (sample_job *sj = dj->batch; sj; off += sj->num_samples, sj = sj->next) {
        if (st != TWK_OK) snprintf(sj->err, sizeof sj->err, "sampling on rank %d failed: %s", dj->rank, twk_last_error());
        finish_request(sj, res ? res + off : NULL, st);
    }
    for (int i = 0; res && i < used; i++) twk_sampled_seq_free(&res[i]);
    twk_host_free(res);
}

/* Worker: sends the batch to the next rank in turn when it is another one and the batch needs
 * nothing but decoding (a shared unit; no prompt scoring, top-k or other front end, which use
 * this rank's sampler); a job collecting its answer queues behind the work already waiting, so
 * the ranks decode side by side. 1 when sent (dj keeps no batch), 0 to decode here. */
static int sample_remote(drain_job *dj) {
    sampler_unit *u = dj->unit;
    int n = 0;
    for (sample_job *sj = dj->batch; sj; sj = sj->next, n++)
        if (!u->n_slots || sj->prompt_logprobs || sj->topk > 0 || sj->done || n >= SAMPLER_SEQS) return 0;
    int rank = svc_dist_sample_rank();
    drain_job *cj = rank > 0 ? twk_host_calloc(sizeof *cj, "sampling collect") : NULL;
    if (!cj) return 0;
    twk_sample_request reqs[SAMPLER_SEQS];
    sampler_session *sessions[SAMPLER_SEQS];
    int k = 0;
    for (sample_job *sj = dj->batch; sj; sj = sj->next, k++) {
        reqs[k] = (twk_sample_request){sj->prompt, sj->n_prompt, sj->num_samples, &sj->p, NULL, 0, NULL, NULL};
        sessions[k] = sj->ss;
    }
    if (svc_dist_sample_send(rank, (int)(u->base - dj->s->models), reqs, sessions, n, &cj->tag) != TWK_OK) {
        twk_host_free(cj);
        return 0; /* decoded here instead */
    }
    *cj = (drain_job){.job = {.run = remote_collect, .done = drain_done, .arg = cj}, .s = dj->s, .unit = u, .batch = dj->batch,
                      .rank = rank, .tag = cj->tag};
    dj->batch = NULL;
    twk_worker_submit(dj->s->worker, &cj->job);
    return 1;
}

/* Worker: the unit's sampler ready and every adapter of the batch in a slot; else each request's
 * err says why. */
static twk_status batch_ready(drain_job *dj) {
    sampler_unit *u = dj->unit;
    twk_status st = svc_sampler_ready(dj->s, u, NULL);
    if (st != TWK_OK) {
        for (sample_job *sj = dj->batch; sj; sj = sj->next)
            snprintf(sj->err, sizeof sj->err, "sampler unavailable: %s", twk_last_error());
        return st;
    }
    if (!u->n_slots) return TWK_OK;
    int busy[TWK_SERVE_CAP_SAMPLER_SLOTS] = {0};
    for (sample_job *sj = dj->batch; sj; sj = sj->next) {
        sj->slot = assign_slot(dj->s, u, sj->ss, busy, &st);
        if (st != TWK_OK) {
            for (sample_job *x = dj->batch; x; x = x->next)
                snprintf(x->err, sizeof x->err, "loading the adapter failed: %s", twk_last_error());
            return st;
        }
    }
    return TWK_OK;
}

/* Worker: the estimated cost of decoding n samples of sj (the scheduler's unit: tokens). */
static double sample_cost(const sample_job *sj, int n) {
    return (double)n * (double)(sj->p.max_tokens > 0 ? sj->p.max_tokens : 1) + (double)sj->n_prompt;
}

/* Worker: one round (at most a batch) of a request for more samples than a batch holds, with
 * its own seed stream per round; between rounds the job yields to the scheduler (requeue), so
 * other tenants' work runs in between. */
static void big_round(twk_job *j, drain_job *dj) {
    sample_job *take = dj->batch;
    twk_status st = TWK_OK;
    if (!dj->res) {
        dj->res = twk_host_calloc((size_t)take->num_samples * sizeof *dj->res, "sampling res");
        st = dj->res ? TWK_OK : TWK_ERR_OOM;
    }
    if (st == TWK_OK) st = batch_ready(dj);
    int done = dj->rounds_done;
    if (st == TWK_OK) {
        int n = take->num_samples - done < SAMPLER_SEQS ? take->num_samples - done : SAMPLER_SEQS;
        twk_sample_params p = take->p;
        if (p.has_seed) p.seed = take->p.seed + 0x2545f4914f6cdd1dull * (uint64_t)done;
        twk_sample_request one = {take->prompt, take->n_prompt, n, &p, dj->res + done, take->slot, NULL, NULL};
        st = twk_sampler_generate_many(dj->unit->sampler, &one, 1);
        dj->rounds_done = done += n;
    }
    if (st == TWK_OK && done < take->num_samples) {
        int next = take->num_samples - done < SAMPLER_SEQS ? take->num_samples - done : SAMPLER_SEQS;
        j->cost = sample_cost(take, next);
        j->requeue = 1;
        return;
    }
    finish_request(take, dj->res, st);
    for (int i = 0; dj->res && i < take->num_samples; i++) twk_sampled_seq_free(&dj->res[i]);
    twk_host_free(dj->res);
    dj->res = NULL;
}

/* Worker: takes every waiting request of the unit that fits one decode batch
 * and decodes them together; a request for more samples than a batch holds
 * is taken only by its own job and runs alone, a round per turn (big_round). */
static void drain_run(twk_job *j) {
    drain_job *dj = j->arg;
    sampler_unit *u = dj->unit;
    if (dj->batch) { /* a yielded big request: its next round */
        big_round(j, dj);
        return;
    }
    pthread_mutex_lock(&u->mu);
    sample_job *take = NULL, **tail = &take, **pp = &u->pending;
    int used = 0, n_adapters = 0;
    sampler_session *adapters[TWK_SERVE_CAP_SAMPLER_SLOTS];
    int alone = 0;
    for (sample_job **own = &u->pending; *own; own = &(*own)->next) /* its own big request: alone, in rounds */
        if ((*own)->serial == dj->own && (*own)->num_samples > SAMPLER_SEQS) {
            take = *own;
            *own = take->next;
            take->next = NULL;
            alone = 1;
            break;
        }
    while (!alone && *pp) {
        sample_job *sj = *pp;
        int n = sj->num_samples;
        /* a shared unit fits n_slots - 1 different adapters per batch */
        int new_adapter = u->n_slots && sj->ss->has_adapter;
        for (int a = 0; new_adapter && a < n_adapters; a++)
            if (adapters[a] == sj->ss) new_adapter = 0;
        if (new_adapter && n_adapters >= u->n_slots - 1) {
            pp = &sj->next;
            continue;
        }
        if (n <= SAMPLER_SEQS && used + n <= SAMPLER_SEQS) { /* big requests are their own job's */
            if (new_adapter) adapters[n_adapters++] = sj->ss;
            *pp = sj->next;
            sj->next = NULL;
            *tail = sj;
            tail = &sj->next;
            used += n;
        } else {
            pp = &sj->next;
        }
    }
    pthread_mutex_unlock(&u->mu);
    dj->batch = take;
    for (sample_job *sj = take; sj; sj = sj->next) sj->t_started = twk_metrics_now();
    if (!take) return;
    if (take->num_samples <= SAMPLER_SEQS && sample_remote(dj)) return; /* multi-rank: another rank decodes it */
    if (take->num_samples > SAMPLER_SEQS) {
        big_round(j, dj);
        return;
    }
    twk_status st = batch_ready(dj);
    if (st != TWK_OK) return;
    int n_req = 0;
    for (sample_job *sj = take; sj; sj = sj->next) n_req++;
    twk_sample_request *reqs = twk_host_calloc((size_t)n_req * sizeof *reqs, "sampling reqs");
    twk_sampled_seq *res = twk_host_calloc((size_t)used * sizeof *res, "sampling res");
    st = reqs && res ? TWK_OK : TWK_ERR_OOM;
    int k = 0, off = 0;
    for (sample_job *sj = take; st == TWK_OK && sj; sj = sj->next, k++) {
        reqs[k] = (twk_sample_request){sj->prompt,   sj->n_prompt, sj->num_samples,       &sj->p,
                                       res + off,    sj->slot,     svc_gen_progress_step, sj->progress};
        if (!sj->progress) reqs[k].on_step = NULL;
        off += sj->num_samples;
    }
    if (st == TWK_OK) st = twk_sampler_generate_many(u->sampler, reqs, n_req);
    off = 0;
    for (sample_job *sj = take; sj; sj = sj->next) {
        finish_request(sj, res ? res + off : NULL, st);
        off += sj->num_samples;
    }
    for (int i = 0; res && i < used; i++) twk_sampled_seq_free(&res[i]);
    twk_host_free(res);
    twk_host_free(reqs);
}

/* Loop: finishes sj's future (a result when ok, else a failure of category cat with msg),
 * tells the session's retrieve_futures pollers, and frees sj. */
static void sample_finish(svc *s, sample_job *sj, int ok, const char *cat, const char *msg) {
    if (ok) twk_futures_set_tokens(s->futures, sj->request_id, sj->gen_tokens);
    if (ok) twk_futures_complete(s->futures, sj->request_id, "application/x-protobuf", sj->out, sj->out_len);
    else twk_futures_fail(s->futures, sj->request_id, cat, msg);
    ok = twk_futures_succeeded(s->futures, sj->request_id); /* a cancelled one's result was discarded */
    svc_session_event(s, sj->ss, sj->clone, sj->request_id, !ok, ok ? sj->out_len : 0);
    twk_host_free(sj->out);
    twk_host_free(sj->prompt);
    twk_host_free(sj);
}

static void drain_done(twk_job *j) {
    drain_job *dj = j->arg;
    svc *s = dj->s;
    sample_job *sj = dj->batch;
    while (sj) {
        sample_job *next = sj->next;
        sampler_session *ss = sj->ss;
        s->sample_inflight--;
        twk_metrics_job_done(s->metrics, sj->ss->tenant, "sample", sj->t_queued, sj->t_started);
        if (sj->ok) twk_metrics_tokens(s->metrics, sj->ss->tenant, "sample", (double)sj->gen_tokens);
        if (sj->done) { /* a generation for another front end: no future, no session event */
            sj->gen.ok = sj->ok;
            sj->gen.user_error = sj->user_error;
            sj->gen.err = sj->err[0] ? sj->err : "sampling failed";
            svc_gen_progress_close(sj->progress); /* no step after done */
            sj->done(sj->done_ctx, &sj->gen);
            gen_result_free(&sj->gen);
            twk_host_free(sj->out);
            twk_host_free(sj->prompt); /* svc_generate's caller's: host allocator, like encode's ids */
            twk_host_free(sj);
        } else
            sample_finish(s, sj, sj->ok, sj->user_error ? "user" : "server", sj->err[0] ? sj->err : "sampling failed");
        svc_snapshot_release(s, ss);
        sj = next;
    }
    twk_host_free(dj);
}

int svc_sample_cancel(svc *s, const char *request_id) {
    for (sampler_session *ss = s->samplers; ss; ss = ss->next) {
        sampler_unit *u = ss->unit;
        sample_job *found = NULL;
        pthread_mutex_lock(&u->mu);
        for (sample_job **pp = &u->pending; *pp; pp = &(*pp)->next)
            if (!strcmp((*pp)->request_id, request_id)) {
                found = *pp;
                *pp = found->next;
                break;
            }
        pthread_mutex_unlock(&u->mu);
        if (found) { /* its drain job finds one request fewer */
            s->sample_inflight--;
            twk_metrics_job_done(s->metrics, found->ss->tenant, "sample", found->t_queued, 0);
            sample_finish(s, found, 0, "cancelled", "cancelled by the client (cancel_future)");
            svc_snapshot_release(s, ss);
            return 1;
        }
    }
    return 0;
}

/* Parses and checks an asample body into sj; a problem goes to sj->prefail. */
/* parse_sample's steps: each returns 0 with sj->prefail set when the request is bad. */

/* The request's flags: num_samples, prompt logprobs, stability records; the unsupported fields refused. */
static int sample_flags(const cJSON *b, sample_job *sj, long long *ns, long long *tk) {
    char err[256];
    long long tsl = 0, alt = 0;
    if (!api_int(b, "num_samples", 0, 1, MAX_NUM_SAMPLES, 1, ns, err, sizeof err) ||
        !api_bool(b, "prompt_logprobs", 0, &sj->prompt_logprobs, err, sizeof err) ||
        !api_bool(b, "record_stability_info", 0, &sj->record, err, sizeof err) ||
        !api_int(b, "topk_prompt_logprobs", 0, 0, 64, 0, tk, err, sizeof err) ||
        !api_int(b, "topk_sample_logprobs", 0, 0, 1 << 20, 0, &tsl, err, sizeof err) ||
        !api_int(b, "prompt_alt_tokens_k", 0, 0, 1 << 20, 0, &alt, err, sizeof err)) {
        snprintf(sj->prefail, sizeof sj->prefail, "%s", err);
        return 0;
    }
    if (tsl > 0 || alt > 0 || cJSON_GetObjectItemCaseSensitive(b, "target_prompt_logprobs")) {
        snprintf(sj->prefail, sizeof sj->prefail,
                 "%s is not supported by this server (topk_sample_logprobs, prompt_alt_tokens_k and "
                 "target_prompt_logprobs must be absent or 0)",
                 tsl > 0 ? "topk_sample_logprobs > 0" : alt > 0 ? "prompt_alt_tokens_k > 0" : "target_prompt_logprobs");
        return 0;
    }
    return 1;
}

/* prompt.chunks → sj->prompt / n_prompt: encoded_text chunks of token ids below the vocabulary,
 * 1 .. max_context - 1 tokens in all. */
static int sample_prompt(svc *s, const cJSON *chunks, int vocab, sample_job *sj) {
    if (!cJSON_IsArray(chunks) || cJSON_GetArraySize(chunks) < 1) {
        snprintf(sj->prefail, sizeof sj->prefail, "prompt.chunks must be a non-empty list");
        return 0;
    }
    int64_t n = 0;
    for (const cJSON *ch = chunks->child; ch; ch = ch->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(ch, "type"), *toks = cJSON_GetObjectItemCaseSensitive(ch, "tokens");
        if (cJSON_IsString(type) && strcmp(type->valuestring, "encoded_text")) {
            snprintf(sj->prefail, sizeof sj->prefail, "prompt chunk type '%s' is not supported (encoded_text is)", type->valuestring);
            return 0;
        }
        if (!cJSON_IsArray(toks)) {
            snprintf(sj->prefail, sizeof sj->prefail, "prompt.chunks[].tokens must be a list of token ids");
            return 0;
        }
        n += cJSON_GetArraySize(toks);
    }
    if (n < 1 || n >= s->cfg.max_context) {
        snprintf(sj->prefail, sizeof sj->prefail, "the prompt has %lld tokens; it must be 1..%lld", (long long)n,
                 (long long)s->cfg.max_context - 1);
        return 0;
    }
    sj->prompt = twk_host_alloc((size_t)n * sizeof *sj->prompt, "prompt");
    if (!sj->prompt) {
        snprintf(sj->prefail, sizeof sj->prefail, "out of memory");
        sj->prefail_server = 1;
        return 0;
    }
    int64_t k = 0;
    for (const cJSON *ch = chunks->child; ch; ch = ch->next)
        for (const cJSON *t = cJSON_GetObjectItemCaseSensitive(ch, "tokens")->child; t; t = t->next, k++) {
            if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 || t->valuedouble >= vocab) {
                snprintf(sj->prefail, sizeof sj->prefail, "prompt token %lld is not a token id in [0, %d)", (long long)k, vocab);
                return 0;
            }
            sj->prompt[k] = (int32_t)t->valuedouble;
        }
    sj->n_prompt = n;
    return 1;
}

/* prompt_logprobs_last_n and sampling_params (max_tokens within the context left, temperature, top_k, top_p,
 * seed) → sj->last_n, sj->p. */
static int sample_params(svc *s, const cJSON *b, const cJSON *sp, sample_job *sj) {
    char err[256];
    int64_t n = sj->n_prompt;
    long long last_n = 0, max_tokens, top_k, seed;
    double temp, top_p;
    if (!api_int(b, "prompt_logprobs_last_n", 0, 1, n, 0, &last_n, err, sizeof err)) {
        snprintf(sj->prefail, sizeof sj->prefail, "%s (the prompt has %lld tokens)", err, (long long)n);
        return 0;
    }
    if (last_n > 0 && !sj->prompt_logprobs && !sj->topk) {
        snprintf(sj->prefail, sizeof sj->prefail, "prompt_logprobs_last_n applies to prompt logprobs; set prompt_logprobs");
        return 0;
    }
    sj->last_n = last_n;
    int64_t room = s->cfg.max_context - n;
    if (!api_int(sp, "max_tokens", 0, 1, 1 << 30, room < DEFAULT_MAX_TOKENS ? room : DEFAULT_MAX_TOKENS, &max_tokens, err,
                 sizeof err) ||
        !api_num(sp, "temperature", 0, 1.0, &temp, err, sizeof err) ||
        !api_int(sp, "top_k", 0, -1, 1 << 30, -1, &top_k, err, sizeof err) ||
        !api_num(sp, "top_p", 0, 1.0, &top_p, err, sizeof err) ||
        !api_int(sp, "seed", 0, -(1ll << 62), (1ll << 62), 0, &seed, err, sizeof err)) {
        snprintf(sj->prefail, sizeof sj->prefail, "sampling_params: %s", err);
        return 0;
    }
    if (max_tokens > room) {
        snprintf(sj->prefail, sizeof sj->prefail,
                 "sampling_params.max_tokens %lld with a %lld-token prompt exceeds the context length %lld", max_tokens,
                 (long long)n, (long long)s->cfg.max_context);
        return 0;
    }
    if (temp < 0) {
        snprintf(sj->prefail, sizeof sj->prefail, "sampling_params.temperature %g must be >= 0", temp);
        return 0;
    }
    if (!(top_p > 0 && top_p <= 1)) {
        snprintf(sj->prefail, sizeof sj->prefail, "sampling_params.top_p %g must be in (0, 1]", top_p);
        return 0;
    }
    if (top_k == 0) {
        snprintf(sj->prefail, sizeof sj->prefail, "sampling_params.top_k 0 is not allowed (-1 turns it off)");
        return 0;
    }
    sj->p = (twk_sample_params){.max_tokens = (int)max_tokens, .temperature = (float)temp, .top_k = (int)top_k,
                                .top_p = (float)top_p, .seed = (uint64_t)seed,
                                .has_seed = cJSON_GetObjectItemCaseSensitive(sp, "seed") &&
                                            !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(sp, "seed"))};
    return 1;
}

/* sampling_params.stop: absent = the model's EOS ids; [] = none; ints = token ids; strings need a tokenizer. */
static int sample_stop(const cJSON *sp, int vocab, sample_job *sj) {
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(sp, "stop");
    int ns_tok = 0, ns_str = 0;
    const twk_tokenizer *tok = sj->ss->base->tok;
    if (!stop || cJSON_IsNull(stop)) {
        const twk_model_config *mc = twk_model_cfg(sj->ss->base->m);
        for (int i = 0; i < mc->n_eos; i++) sj->stop[ns_tok++] = mc->eos[i];
    } else if (cJSON_IsString(stop) || (cJSON_IsArray(stop) && cJSON_IsString(stop->child))) {
        if (!tok) {
            snprintf(sj->prefail, sizeof sj->prefail,
                     "sampling_params.stop: stop strings need the model's tokenizer, and '%s' has no tokenizer.json; pass "
                     "stop token ids",
                     sj->ss->base->name);
            return 0;
        }
        const cJSON *e = cJSON_IsString(stop) ? stop : stop->child;
        for (; e; e = cJSON_IsString(stop) ? NULL : e->next) {
            if (!cJSON_IsString(e) || !e->valuestring[0] || strlen(e->valuestring) > MAX_STOP_STRING_LEN ||
                ns_str == MAX_STOP_STRINGS) {
                snprintf(sj->prefail, sizeof sj->prefail,
                         "sampling_params.stop: at most %d non-empty strings of at most %d bytes (not mixed with ids)",
                         MAX_STOP_STRINGS, MAX_STOP_STRING_LEN);
                return 0;
            }
            snprintf(sj->stop_str[ns_str], sizeof sj->stop_str[0], "%s", e->valuestring);
            sj->stop_ptr[ns_str] = sj->stop_str[ns_str];
            ns_str++;
        }
    } else if (cJSON_IsArray(stop)) {
        for (const cJSON *e = stop->child; e; e = e->next) {
            if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= vocab || ns_tok == MAX_STOP_TOKENS) {
                snprintf(sj->prefail, sizeof sj->prefail,
                         "sampling_params.stop: at most %d token ids in [0, %d)", MAX_STOP_TOKENS, vocab);
                return 0;
            }
            sj->stop[ns_tok++] = (int32_t)e->valuedouble;
        }
    } else {
        snprintf(sj->prefail, sizeof sj->prefail, "sampling_params.stop must be a string, a list, or null");
        return 0;
    }
    sj->p.stop_tokens = sj->stop;
    sj->p.n_stop_tokens = ns_tok;
    sj->p.stop_strings = sj->stop_ptr;
    sj->p.n_stop_strings = ns_str;
    sj->p.tokenizer = tok;
    return 1;
}

/* An asample body → sj (prompt, sampling parameters, stop conditions); a bad field sets sj->prefail. */
static void parse_sample(svc *s, const cJSON *b, sample_job *sj) {
    int vocab = twk_model_cfg(sj->ss->base->m)->vocab;
    long long ns, tk;
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(b, "sampling_params");
    const cJSON *chunks = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(b, "prompt"), "chunks");
    if (!sample_flags(b, sj, &ns, &tk)) return;
    if (sp && !cJSON_IsObject(sp)) {
        snprintf(sj->prefail, sizeof sj->prefail, "field 'sampling_params' must be an object");
        return;
    }
    if (!sample_prompt(s, chunks, vocab, sj)) return;
    sj->num_samples = (int)ns;
    sj->topk = (int)tk;
    if (sample_params(s, b, sp, sj)) sample_stop(sp, vocab, sj);
}

/* Puts sj in its unit's waiting list and queues a drain job on the worker (whichever drain job runs
 * next takes it with the others waiting). 0 when out of memory (nothing queued). */
static int enqueue(svc *s, sample_job *sj) {
    drain_job *dj = twk_host_calloc(sizeof *dj, "sampling dj");
    if (!dj) return 0;
    s->sample_inflight++;
    sj->t_queued = twk_metrics_job_queued(s->metrics, sj->ss->tenant, "sample");
    svc_snapshot_use(s, sj->ss);
    sampler_unit *u = sj->ss->unit;
    sj->serial = ++s->id_counter;
    pthread_mutex_lock(&u->mu);
    sample_job **pp = &u->pending;
    while (*pp) pp = &(*pp)->next;
    *pp = sj;
    pthread_mutex_unlock(&u->mu);
    dj->s = s;
    dj->unit = u;
    dj->own = sj->serial;
    twk_job_route(&dj->job, sj->ss->tenant, sj->ss->id,
                  sample_cost(sj, sj->num_samples < SAMPLER_SEQS ? sj->num_samples : SAMPLER_SEQS));
    dj->job.run = drain_run;
    dj->job.done = drain_done;
    dj->job.arg = dj;
    twk_worker_submit(s->worker, &dj->job);
    return 1;
}

/* 404 for a sampling session that is not (or no longer) there; a freed unnamed snapshot says why. */
static void sampler_not_found(svc *s, twk_http_conn *c, const char *tenant, const char *id) {
    const char *why = svc_sampler_gone(s, tenant, id);
    if (why)
        api_error(c, 404,
                  "sampling session '%s' was an unnamed snapshot (save_weights_and_get_sampling_client) and has been "
                  "freed: %s; save it with a name (save_weights_for_sampler) to keep it",
                  id, why);
    else
        api_error(c, 404, "sampling session '%s' not found", id);
}

static void h_asample(svc *s, twk_http_conn *c, const cJSON *b, const char *tenant) {
    const char *sid;
    char err[512];
    if (!api_str(b, "sampling_session_id", 1, &sid, err, sizeof err)) {
        api_error(c, 400, "%s (base_model / model_path sampling needs create_sampling_session first)", err);
        return;
    }
    sampler_session *ss = svc_find_sampler(s, tenant, sid);
    if (!ss) {
        sampler_not_found(s, c, tenant, sid);
        return;
    }
    if (svc_queue_full(s, tenant, err, sizeof err)) {
        api_error(c, 429, "%s", err);
        return;
    }
    if (s->sample_inflight >= s->cfg.sample_queue) {
        api_error(c, 429, "the sampling queue is full (%d requests); retry shortly", s->sample_inflight);
        return;
    }
    sample_job *sj = twk_host_calloc(sizeof *sj, "sampling sj");
    if (!sj) {
        api_error(c, 503, "out of memory");
        return;
    }
    sj->s = s;
    sj->ss = ss;
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(b, "seq_id");
    if (cJSON_IsNumber(seq) && seq->valuedouble >= 0 && seq->valuedouble < 9.2e18)
        sj->clone = (int64_t)(seq->valuedouble / 1e9);
    parse_sample(s, b, sj);
    char session[96]; /* "<session>:sample:<n>" (a snapshot's too): the session it belongs to */
    const char *cut = strstr(ss->id, ":sample:");
    snprintf(session, sizeof session, "%.*s", cut ? (int)(cut - ss->id) : 0, ss->id);
    if (twk_futures_create(s->futures, tenant, cut ? session : NULL, ss->id, sj->request_id)) {
        api_error(c, 503, "out of memory creating the request's future");
        twk_host_free(sj->prompt);
        twk_host_free(sj);
        return;
    }
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
        api_json_push(ids, cJSON_CreateString(sq));
    }
    if (sj->prefail[0]) {
        sample_finish(s, sj, 0, sj->prefail_server ? "server" : "user", sj->prefail);
    } else {
        if (!enqueue(s, sj)) sample_finish(s, sj, 0, "server", "out of memory");
    }
    api_ok(c, j);
}

int svc_generate(svc *s, sampler_session *ss, int32_t *prompt, int64_t n_prompt, int num_samples,
                 const twk_sample_params *p, int top_k, svc_gen_fn done, svc_gen_step_fn step, void *ctx, char *err,
                 size_t err_len) {
    if (svc_queue_full(s, ss->tenant, err, err_len)) {
        twk_host_free(prompt);
        return 429;
    }
    if (s->sample_inflight >= s->cfg.sample_queue) {
        twk_host_free(prompt);
        snprintf(err, err_len, "the sampling queue is full (%d requests); retry shortly", s->sample_inflight);
        return 429;
    }
    sample_job *sj = twk_host_calloc(sizeof *sj, "generation job");
    if (!sj) {
        twk_host_free(prompt);
        snprintf(err, err_len, "out of memory");
        return 503;
    }
    *sj = (sample_job){.s = s, .ss = ss, .prompt = prompt, .n_prompt = n_prompt, .num_samples = num_samples,
                       .p = *p, .done = done, .done_ctx = ctx, .gen_topk = top_k};
    /* streaming needs a batch of its own size at most (the rounds of a larger request are not streamed) */
    if (step && num_samples <= SAMPLER_SEQS) {
        sj->progress = svc_gen_progress_new(s->loop, num_samples, p->max_tokens, step, ctx);
        if (!sj->progress) {
            twk_host_free(prompt);
            twk_host_free(sj);
            snprintf(err, err_len, "out of memory");
            return 503;
        }
    }
    if (!enqueue(s, sj)) {
        svc_gen_progress_close(sj->progress);
        twk_host_free(prompt);
        twk_host_free(sj);
        snprintf(err, err_len, "out of memory");
        return 503;
    }
    return 0;
}

sampler_session *svc_session_for(svc *s, const char *tenant, const char *id, const char *base, const char *path,
                                 const char *base_field, const char *path_field, int *status, char *err, size_t err_len) {
    sampler_session *ss = svc_find_sampler(s, tenant, id);
    if (ss) return ss;
    *status = 400;
    if (!path) {
        base_model *bm = svc_find_model(s, base);
        if (!bm) {
            snprintf(err, err_len, "%s '%s' is not served here (see get_server_capabilities)", base_field, base);
            return NULL;
        }
        ss = shared_unit(s, bm) ? new_session(s, tenant, id, bm, bm->shared, 0) : NULL;
    } else {
        char kind[32];
        twk_store_ckpt ck;
        twk_store_run src;
        if (!svc_find_checkpoint(s, tenant, path_field, path, &ck, &src, kind, sizeof kind, status, err, err_len))
            return NULL;
        *status = 400;
        if (base && strcmp(base, src.base_model)) { /* both named: they must agree */
            snprintf(err, err_len, "%s %s was trained on base model '%s', not %s '%s'", path_field, path, src.base_model,
                     base_field, base);
            twk_store_run_clear(&src);
            return NULL;
        }
        base_model *bm = svc_find_model(s, src.base_model);
        if (!bm) {
            snprintf(err, err_len, "%s was trained on '%s', which this server does not serve now", path, src.base_model);
            twk_store_run_clear(&src);
            return NULL;
        }
        twk_lora_config lc = svc_run_lora(&src), on_disk = lc;
        /* the modules the folder holds (a mixture of experts' checkpoint saved with or without the experts) */
        if (twk_adapter_read_config(ck.path, &on_disk) == TWK_OK) lc = on_disk;
        ss = adapter_session(s, tenant, id, bm, &lc, ck.path);
        if (ss) snprintf(ss->model_path, sizeof ss->model_path, "%s", path);
        twk_store_run_clear(&src);
    }
    if (!ss) {
        *status = 503;
        snprintf(err, err_len, "out of memory");
    }
    return ss;
}

static void h_create_session(svc *s, twk_http_conn *c, const cJSON *b, const char *tenant) {
    const char *session_id, *base = NULL, *path = NULL;
    long long seq;
    char err[512];
    if (!api_str(b, "session_id", 1, &session_id, err, sizeof err) ||
        !api_int(b, "sampling_session_seq_id", 1, 0, 1000000000, 0, &seq, err, sizeof err) ||
        !api_str(b, "base_model", 0, &base, err, sizeof err) || !api_str(b, "model_path", 0, &path, err, sizeof err)) {
        api_error(c, 400, "%s", err);
        return;
    }
    if (!base && !path) {
        api_error(c, 400, "give base_model or model_path (or both: the checkpoint's base model must be base_model)");
        return;
    }
    if (!svc_session_exists(s, c, tenant, session_id)) return;
    char id[160];
    snprintf(id, sizeof id, "%s:sample:%lld", session_id, seq);
    int status;
    sampler_session *ss = svc_session_for(s, tenant, id, base, path, "base_model", "model_path", &status, err, sizeof err);
    if (!ss) {
        api_error(c, status, "%s", err);
        return;
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
            sampler_not_found(s, c, tenant, route + 9);
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
