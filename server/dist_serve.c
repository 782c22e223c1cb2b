/* The multi-rank service, rank 0's side: every op that touches a trainer is
 * replayed on the other ranks (dist_follower.c), forward_backward split across
 * them by tokens, decode batches sent to them in turn. Called on the compute
 * worker (start and stop on the main thread, before the worker starts and
 * after it stopped), so MPI is only ever entered by one thread at a time
 * (MPI_THREAD_SERIALIZED). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dist.h"
#include "dist_serve.h"

int svc_dist_active(void) { return twk_dist_size() > 1 && !twk_dist_failed(); }

int64_t dsv_input_width(const twk_loss_input_def *def, int k) {
    return def->shape == TWK_SHAPE_TOKENS ? 1 : k > 0 ? k : 1;
}

float *dsv_grads_save(twk_trainer *t) {
    int64_t total = 0, ne = 0;
    for (int i = 0; i < twk_trainer_param_count(t); i++) twk_trainer_grad_data(t, i, &ne), total += ne;
    float *g = twk_host_alloc((size_t)(total ? total : 1) * sizeof(float), "gradient snapshot");
    int64_t at = 0;
    for (int i = 0; g && i < twk_trainer_param_count(t); i++) {
        const float *src = twk_trainer_grad_data(t, i, &ne);
        memcpy(g + at, src, (size_t)ne * sizeof(float));
        at += ne;
    }
    return g;
}

void dsv_grads_restore(twk_trainer *t, const float *g) {
    int64_t at = 0, ne = 0;
    for (int i = 0; g && i < twk_trainer_param_count(t); i++) {
        float *dst = twk_trainer_grad_data(t, i, &ne);
        memcpy(dst, g + at, (size_t)ne * sizeof(float));
        at += ne;
    }
}

/* A command: the header, then `n` arrays. */
static twk_status send_cmd(int rank, const dsv_cmd *h, const void *const *parts, const int64_t *sizes, int n) {
    dsv_buf b = {0};
    dsv_put(&b, h, sizeof *h);
    for (int i = 0; i < n; i++) dsv_put(&b, parts[i], sizes[i]);
    twk_status st = b.oom ? twk_error(TWK_ERR_OOM, "out of memory for a command to rank %d", rank)
                          : twk_dist_send(rank, DSV_TAG_CMD, b.p, b.n);
    twk_host_free(b.p);
    return st;
}

/* A follower's answer; its failure becomes this thread's error, naming the rank. *extra (may be
 * NULL) gets the floats after the header (host allocator). */
static twk_status recv_reply(int rank, dsv_reply *rep, float **extra) {
    void *buf = NULL;
    int64_t n = 0;
    if (extra) *extra = NULL;
    twk_status st = twk_dist_recv(rank, DSV_TAG_REPLY, &buf, &n);
    if (st != TWK_OK) return st;
    if (n < (int64_t)sizeof *rep) {
        twk_host_free(buf);
        return twk_error(TWK_ERR_BACKEND, "rank %d sent a short reply", rank);
    }
    memcpy(rep, buf, sizeof *rep);
    rep->err[sizeof rep->err - 1] = 0;
    if (extra && rep->n_logprobs > 0 && n >= (int64_t)sizeof *rep + rep->n_logprobs * (int64_t)sizeof(float)) {
        *extra = twk_host_alloc((size_t)rep->n_logprobs * sizeof(float), "logprobs");
        if (*extra) memcpy(*extra, (unsigned char *)buf + sizeof *rep, (size_t)rep->n_logprobs * sizeof(float));
    }
    twk_host_free(buf);
    if (rep->st != TWK_OK) return twk_error((twk_status)rep->st, "%s", rep->err);
    return TWK_OK;
}

/* Sends h to every follower and collects their replies; the first failure's message (prefixed
 * with its rank when `name_rank`) is the thread's error. */
static twk_status all_followers(const dsv_cmd *h, int name_rank) {
    int n = twk_dist_size();
    twk_status first = TWK_OK;
    char msg[900] = "";
    for (int r = 1; r < n; r++) {
        twk_status st = send_cmd(r, h, NULL, NULL, 0);
        if (st != TWK_OK) return st;
    }
    for (int r = 1; r < n; r++) {
        dsv_reply rep;
        twk_status st = recv_reply(r, &rep, NULL);
        if (st != TWK_OK && first == TWK_OK) {
            first = st;
            snprintf(msg, sizeof msg, "%s", twk_last_error());
            if (name_rank) snprintf(msg, sizeof msg, "rank %d of %d: %.800s", r, n, twk_last_error());
        }
    }
    return first == TWK_OK ? TWK_OK : twk_error(first, "%s", msg);
}

static dsv_cmd cmd_for(dsv_kind kind, const run_state *r) {
    dsv_cmd h;
    memset(&h, 0, sizeof h);
    h.kind = kind;
    if (r) snprintf(h.run, sizeof h.run, "%s", r->id);
    return h;
}

int svc_dist_start(char *err, size_t err_len) {
    if (!svc_dist_active()) return 0;
    dsv_cmd h = cmd_for(DSV_START, NULL);
    if (all_followers(&h, 1) != TWK_OK) {
        snprintf(err, err_len, "%s", twk_last_error());
        svc_dist_stop();
        return -1;
    }
    return 0;
}

void svc_dist_stop(void) {
    static int stopped;
    if (!svc_dist_active() || stopped) return;
    stopped = 1;
    dsv_cmd h = cmd_for(DSV_STOP, NULL);
    (void)all_followers(&h, 1);
}

twk_status svc_dist_trainer_new(svc *s, run_state *r) {
    twk_trainer_opts to = {.recompute = r->base->recompute, .arena = r->base->arena}; /* runs take turns on the worker */
    twk_status st = twk_trainer_new_opts(r->base->m, &r->lora, s->cfg.max_context, &to, &r->trainer);
    if (st != TWK_OK || !svc_dist_active()) return st;
    dsv_cmd h = cmd_for(DSV_CREATE, r);
    h.model = (int32_t)(r->base - s->models);
    h.lora = r->lora;
    h.capacity = s->cfg.max_context;
    if ((st = all_followers(&h, 1)) != TWK_OK) {
        char msg[900];
        snprintf(msg, sizeof msg, "%s", twk_last_error());
        svc_dist_trainer_free(r); /* nothing stays on any rank (unloading an absent run is a no-op there) */
        return twk_error(st, "%s", msg);
    }
    return TWK_OK;
}

void svc_dist_trainer_free(run_state *r) {
    if (svc_dist_active()) {
        dsv_cmd h = cmd_for(DSV_UNLOAD, r);
        (void)all_followers(&h, 1);
    }
    twk_trainer_free(r->trainer);
    r->trainer = NULL;
}

twk_status svc_dist_load_state(run_state *r, const char *dir, int load_optimizer) {
    twk_status st = twk_trainer_load_state(r->trainer, dir, load_optimizer);
    if (st != TWK_OK || !svc_dist_active()) return st;
    dsv_cmd h = cmd_for(DSV_LOAD, r);
    snprintf(h.path, sizeof h.path, "%s", dir);
    h.load_optimizer = load_optimizer;
    return all_followers(&h, 1);
}

twk_status svc_dist_optim_step(run_state *r, const twk_adam_params *p, float *grad_norm) {
    if (!svc_dist_active()) return twk_trainer_optim_step(r->trainer, p, grad_norm);
    dsv_cmd h = cmd_for(DSV_OPTIM, r);
    h.adam = *p;
    int n = twk_dist_size();
    /* this rank's share of the gradients, put back if the step is refused (a bad hyper-parameter, a
     * non-finite norm), so a later step does not sum the sum again: as one process, the gradients stay */
    float *saved = dsv_grads_save(r->trainer);
    if (!saved) return twk_error(TWK_ERR_OOM, "out of memory for optim_step");
    for (int k = 1; k < n; k++) {
        twk_status st = send_cmd(k, &h, NULL, NULL, 0);
        if (st != TWK_OK) {
            twk_host_free(saved);
            return st;
        }
    }
    /* every rank in the same collective: the sum lands bit-identical on each, so the steps agree */
    twk_status st = twk_dist_sum_grads(r->trainer, DSV_BUCKET_BYTES, NULL);
    if (st == TWK_OK) st = twk_trainer_optim_step(r->trainer, p, grad_norm);
    if (st != TWK_OK) dsv_grads_restore(r->trainer, saved);
    twk_host_free(saved);
    char msg[900];
    snprintf(msg, sizeof msg, "%s", twk_last_error());
    for (int k = 1; k < n; k++) {
        dsv_reply rep;
        if (recv_reply(k, &rep, NULL) != TWK_OK && st == TWK_OK) /* rank 0 succeeded: the follower's error */
            st = twk_error((twk_status)rep.st, "rank %d of %d: %.800s", k, n, rep.err), snprintf(msg, sizeof msg, "%s", twk_last_error());
    }
    return st == TWK_OK ? TWK_OK : twk_error(st, "%s", msg);
}

/* ---- forward_backward across the ranks ---- */

/* Whether the loss is a sum over datums (or pairs), so shares' results add up to the whole batch's.
 * The GRPO family and GSPO normalise over the batch, and the KL term's kl:mean over its counted
 * tokens: those run on rank 0 alone (exact, not faster). */
static int shardable(const twk_loss_spec *spec) {
    const twk_loss_def *d = spec->def;
    double kl = spec->config[TWK_CFG_KL_BETA];
    return d->family != TWK_FAMILY_RL || (d->aggregation == TWK_AGG_SUM && !(kl > 0));
}

/* Sends sequences [s0, s1) of b to rank `to`. */
static twk_status send_share(int to, const run_state *r, const twk_loss_spec *spec, const twk_loss_batch *b,
                             int backward, int s0, int s1) {
    dsv_cmd h = cmd_for(DSV_FB, r);
    const twk_loss_def *d = spec->def;
    snprintf(h.loss, sizeof h.loss, "%s", d->name);
    memcpy(h.config, spec->config, sizeof h.config);
    h.backward = backward;
    h.k = b->k;
    h.n_seqs = s1 - s0;
    int64_t a = b->offsets[s0], ntok = b->offsets[s1] - a, kw = b->k > 0 ? b->k : 1;
    h.n_tokens = ntok;
    int64_t *off = twk_host_alloc((size_t)(h.n_seqs + 1) * sizeof(int64_t), "share offsets");
    if (!off) return twk_error(TWK_ERR_OOM, "out of memory for a share of %d sequences", h.n_seqs);
    for (int i = s0; i <= s1; i++) off[i - s0] = b->offsets[i] - a;
    const void *parts[3 + TWK_LOSS_MAX_INPUTS];
    int64_t sizes[3 + TWK_LOSS_MAX_INPUTS];
    int np = 0;
    parts[np] = off, sizes[np++] = (int64_t)(h.n_seqs + 1) * (int64_t)sizeof(int64_t);
    parts[np] = b->tokens + a, sizes[np++] = ntok * (int64_t)sizeof(int32_t);
    parts[np] = b->targets + a * kw, sizes[np++] = ntok * kw * (int64_t)sizeof(int32_t);
    for (int i = 0; i < d->n_inputs; i++) { /* in the registry's order, which the follower walks too */
        const twk_loss_input_def *in = &d->inputs[i];
        if (in->dtype != TWK_LOSS_F32 || !b->in[in->id]) continue;
        int64_t w = dsv_input_width(in, b->k);
        h.in_mask |= 1u << in->id;
        parts[np] = b->in[in->id] + a * w, sizes[np++] = ntok * w * (int64_t)sizeof(float);
    }
    twk_status st = send_cmd(to, &h, parts, sizes, np);
    twk_host_free(off);
    return st;
}

/* The whole batch's metrics from the shares': sums add; means weigh each share by what it averaged
 * over (tokens for the RL losses, pairs for the preference losses); `mean` as twk_loss_step sets it. */
static void combine(const twk_loss_def *d, const twk_loss_result *parts, const int *used, int n, twk_loss_result *res) {
    memset(res, 0, sizeof *res);
    int wi = d->family == TWK_FAMILY_PREF ? 2 : 1;
    double wsum = 0;
    for (int r = 0; r < n; r++)
        if (used[r]) {
            res->n_metrics = parts[r].n_metrics;
            wsum += parts[r].values[wi];
        }
    for (int i = 0; i < res->n_metrics; i++) {
        res->keys[i] = d->metrics[i];
        int is_mean = strstr(d->metrics[i], ":mean") != NULL;
        for (int r = 0; r < n; r++)
            if (used[r])
                res->values[i] += is_mean ? (wsum > 0 ? parts[r].values[i] * parts[r].values[wi] / wsum : 0) : parts[r].values[i];
    }
    res->loss = res->values[0];
    double norm = d->family == TWK_FAMILY_RL ? res->values[1] : res->values[2];
    res->mean = d->family == TWK_FAMILY_RL ? (norm ? res->loss / norm : 0) : norm != 0 ? res->loss / norm : res->loss;
}

twk_status svc_dist_loss_step(run_state *r, twk_pack *pack, const twk_loss_spec *spec, const twk_loss_batch *b,
                              int backward, float *logprobs, twk_loss_result *res) {
    twk_trainer *t = r->trainer;
    if (!svc_dist_active() || !shardable(spec)) return svc_pack_step(pack, t, spec, b, backward, logprobs, res);
    int n = twk_dist_size(), kw = b->k > 0 ? b->k : 1;
    int *s0 = twk_host_calloc((size_t)n * 3 * sizeof(int), "shares");
    twk_loss_result *parts = twk_host_calloc((size_t)n * sizeof *parts, "share results");
    float *saved = backward ? dsv_grads_save(t) : NULL;
    if (!s0 || !parts || (backward && !saved)) {
        twk_host_free(s0);
        twk_host_free(parts);
        twk_host_free(saved);
        return twk_error(TWK_ERR_OOM, "out of memory splitting a batch of %d sequences", b->n_seqs);
    }
    int *s1 = s0 + n, *used = s0 + 2 * n;
    for (int k = 0; k < n; k++) {
        twk_dist_shard(b->offsets, b->n_seqs, spec->def->group, k, n, &s0[k], &s1[k]);
        used[k] = s1[k] > s0[k];
    }
    twk_status st = TWK_OK, sent = TWK_OK;
    for (int k = 1; k < n && sent == TWK_OK; k++)
        if (used[k] && (sent = send_share(k, r, spec, b, backward, s0[k], s1[k])) != TWK_OK) used[k] = 0;
    if (sent != TWK_OK) st = sent;
    if (used[0]) { /* rank 0's own share, while the others run theirs */
        twk_loss_batch mine = *b;
        mine.n_seqs = s1[0]; /* rank 0's share starts at sequence 0: the same arrays, fewer sequences */
        twk_status own = svc_pack_step(pack, t, spec, &mine, backward, logprobs, &parts[0]);
        if (st == TWK_OK) st = own;
    }
    for (int k = 1; k < n; k++) {
        if (!used[k]) continue;
        dsv_reply rep;
        float *lp = NULL;
        twk_status rs = recv_reply(k, &rep, &lp);
        if (rs == TWK_OK && logprobs && lp && rep.n_logprobs == (b->offsets[s1[k]] - b->offsets[s0[k]]) * kw)
            memcpy(logprobs + b->offsets[s0[k]] * kw, lp, (size_t)rep.n_logprobs * sizeof(float));
        parts[k].n_metrics = rep.n_metrics;
        parts[k].loss = rep.loss;
        memcpy(parts[k].values, rep.values, sizeof rep.values);
        twk_host_free(lp);
        if (st == TWK_OK) st = rs;
    }
    if (backward) { /* the verdict: keep the shares' gradients, or put every rank's back */
        int32_t verdict = st == TWK_OK;
        for (int k = 1; k < n; k++)
            if (used[k]) (void)twk_dist_send(k, DSV_TAG_VERDICT, &verdict, sizeof verdict);
        if (st != TWK_OK) dsv_grads_restore(t, saved);
    }
    if (st == TWK_OK) combine(spec->def, parts, used, n, res);
    else if (twk_dist_failed()) /* a rank was lost: the run's gradients are gone with it */
        st = twk_error(TWK_ERR_BACKEND, "%s", twk_last_error());
    else /* the whole batch on rank 0: its result, or its failure with the single process's message */
        st = svc_pack_step(pack, t, spec, b, backward, logprobs, res);
    twk_host_free(s0);
    twk_host_free(parts);
    twk_host_free(saved);
    return st;
}

/* ---- decode batches on the other ranks ---- */

void dsv_put(dsv_buf *b, const void *src, int64_t n) {
    if (b->oom || n <= 0) return;
    if (b->n + n > b->cap) {
        int64_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        unsigned char *p = twk_host_realloc(b->p, (size_t)b->cap, (size_t)cap, "dist message");
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, (size_t)n);
    b->n += n;
}

const void *dsv_take(const unsigned char *msg, int64_t len, int64_t *at, int64_t n) {
    if (n < 0 || *at + n > len) return NULL;
    const void *p = msg + *at;
    *at += n;
    return p;
}

/* decode batches sent to each rank (written by the worker, read by /healthz on the loop) */
static _Atomic long g_batches_to[64];

int svc_dist_health(char *body, size_t len) {
    int n = twk_dist_size();
    if (n == 1) return 0;
    int at = snprintf(body, len, "{\"status\":\"ok\",\"ranks\":%d,\"decode_batches_sent\":[", n);
    for (int r = 1; r < n && at > 0 && (size_t)at < len; r++)
        at += snprintf(body + at, len - (size_t)at, "%s%ld", r > 1 ? "," : "", r < 64 ? (long)g_batches_to[r] : -1L);
    if (at > 0 && (size_t)at < len) snprintf(body + at, len - (size_t)at, "]}");
    return 1;
}

int svc_dist_sample_rank(void) {
    static unsigned next;
    return svc_dist_active() ? (int)(next++ % (unsigned)twk_dist_size()) : 0;
}

/* The adapter of a session as the other rank loads it: kind 0 the base model, 1 a checkpoint
 * folder, 2 a snapshot's tensors. */
static void put_adapter(dsv_buf *b, const sampler_session *ss) {
    int32_t kind = !ss->has_adapter ? 0 : ss->adapter_dir[0] ? 1 : 2, rank = ss->rank, n = ss->copy ? ss->copy->n : 0;
    char dir[sizeof ss->adapter_dir];
    snprintf(dir, sizeof dir, "%s", ss->adapter_dir);
    dsv_put(b, &kind, 4);
    dsv_put(b, &rank, 4);
    dsv_put(b, &ss->alpha, 4);
    dsv_put(b, dir, sizeof dir);
    dsv_put(b, &n, 4);
    for (int i = 0; kind == 2 && i < n; i++) {
        dsv_put(b, ss->copy->names[i], sizeof ss->copy->names[i]);
        dsv_put(b, &ss->copy->nelem[i], 8);
        dsv_put(b, ss->copy->data[i], ss->copy->nelem[i] * (int64_t)sizeof(float));
    }
}

twk_status svc_dist_sample_send(int rank, int model, const twk_sample_request *reqs, sampler_session *const *sessions,
                                int n, int *tag) {
    static unsigned counter;
    dsv_cmd h = cmd_for(DSV_SAMPLE, NULL);
    h.model = model;
    h.n_seqs = n;
    h.tag = (int32_t)(counter++ % DSV_SAMPLE_TAGS);
    *tag = h.tag;
    /* the batch's distinct adapters (slot 0 the base model), then each request naming its own */
    const sampler_session *adapters[TWK_SERVE_CAP_SAMPLER_SLOTS];
    int32_t which[TWK_SERVE_SAMPLER_SEQS];
    int n_ad = 0;
    if (n > TWK_SERVE_SAMPLER_SEQS) return twk_error(TWK_ERR_STATE, "a decode batch of %d requests", n);
    for (int i = 0; i < n; i++) {
        which[i] = 0;
        for (int a = 0; sessions[i]->has_adapter && !which[i] && a < n_ad; a++)
            if (adapters[a] == sessions[i]) which[i] = a + 1;
        if (sessions[i]->has_adapter && !which[i]) {
            if (n_ad + 1 >= TWK_SERVE_CAP_SAMPLER_SLOTS) return twk_error(TWK_ERR_STATE, "too many adapters in a batch");
            adapters[n_ad++] = sessions[i];
            which[i] = n_ad;
        }
    }
    h.k = n_ad;
    dsv_buf b = {0};
    dsv_put(&b, &h, sizeof h);
    for (int a = 0; a < n_ad; a++) put_adapter(&b, adapters[a]);
    for (int i = 0; i < n; i++) {
        const twk_sample_params *p = reqs[i].params;
        int32_t head[8] = {which[i], reqs[i].num_samples, p->max_tokens, p->top_k, p->has_seed, p->n_stop_tokens,
                           p->n_stop_strings, 0};
        float f[2] = {p->temperature, p->top_p};
        dsv_put(&b, head, sizeof head);
        dsv_put(&b, f, sizeof f);
        dsv_put(&b, &p->seed, 8);
        dsv_put(&b, &reqs[i].n_prompt, 8);
        dsv_put(&b, reqs[i].prompt, reqs[i].n_prompt * 4);
        dsv_put(&b, p->stop_tokens, p->n_stop_tokens * 4);
        for (int k = 0; k < p->n_stop_strings; k++) {
            int32_t len = (int32_t)strlen(p->stop_strings[k]);
            dsv_put(&b, &len, 4);
            dsv_put(&b, p->stop_strings[k], len);
        }
    }
    twk_status st = b.oom ? twk_error(TWK_ERR_OOM, "out of memory for a decode batch") : twk_dist_send(rank, DSV_TAG_CMD, b.p, b.n);
    twk_host_free(b.p);
    if (st == TWK_OK && rank < 64) g_batches_to[rank]++;
    return st;
}

twk_status svc_dist_sample_recv(int rank, int tag, twk_sampled_seq *res, int n_seqs) {
    void *buf = NULL;
    int64_t len = 0, at = 0;
    twk_status st = twk_dist_recv(rank, DSV_TAG_SAMPLE + tag, &buf, &len);
    if (st != TWK_OK) return st;
    const dsv_reply *rep = dsv_take(buf, len, &at, sizeof *rep);
    if (!rep) st = twk_error(TWK_ERR_BACKEND, "rank %d sent a short decode answer", rank);
    else if (rep->st != TWK_OK) st = twk_error((twk_status)rep->st, "%.700s", rep->err);
    for (int i = 0; st == TWK_OK && i < n_seqs; i++) {
        const void *nn_at = dsv_take(buf, len, &at, 8), *why = dsv_take(buf, len, &at, 4);
        int64_t nn = -1;
        int32_t reason = 0;
        if (nn_at && why) memcpy(&nn, nn_at, 8), memcpy(&reason, why, 4); /* 8-byte fields at 4-byte offsets */
        const void *tok = nn >= 0 ? dsv_take(buf, len, &at, nn * 4) : NULL;
        const void *lp = tok ? dsv_take(buf, len, &at, nn * 4) : NULL;
        if (!lp) {
            st = twk_error(TWK_ERR_BACKEND, "rank %d sent a short decode answer", rank);
            break;
        }
        res[i].n = nn;
        res[i].stop_reason = (twk_stop_reason)reason;
        res[i].tokens = twk_host_alloc((size_t)(nn ? nn : 1) * 4, "sampled tokens");
        res[i].logprobs = twk_host_alloc((size_t)(nn ? nn : 1) * 4, "sampled logprobs");
        if (!res[i].tokens || !res[i].logprobs) st = twk_error(TWK_ERR_OOM, "out of memory for sampled sequences");
        else {
            memcpy(res[i].tokens, tok, (size_t)nn * 4);
            memcpy(res[i].logprobs, lp, (size_t)nn * 4);
        }
    }
    twk_host_free(buf);
    return st;
}
