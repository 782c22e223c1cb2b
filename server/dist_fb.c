/* The multi-rank service's forward / forward_backward, rank 0's side: the
 * ops the worker took together (a packed pass of several runs, or one op
 * alone) are split across the ranks, each op's datums by tokens; every rank
 * runs its shares of all the ops through twk_loss_steps on its own pack of
 * the base model (dist_follower.c's run_fb), so the ranks' passes are packed
 * exactly as one process packs the whole ops. Logprobs and metrics are
 * combined as one process reports them; an op whose share failed anywhere is
 * rolled back on every rank and rerun whole on rank 0 alone. */
#include <stdio.h>
#include <string.h>

#include "dist.h"
#include "dist_serve.h"

/* The job's share [s0, s1) for a follower: padding to 8 bytes, a dsv_cmd, then offsets, tokens,
 * targets and the loss's float inputs in the registry's order (run_fb walks them alike). */
static void put_share(dsv_buf *m, const run_state *r, const twk_loss_job *j, const twk_loss_whole *whole, int s0, int s1) {
    const twk_loss_batch *b = j->b;
    const twk_loss_def *d = j->spec->def;
    dsv_cmd h;
    memset(&h, 0, sizeof h);
    h.kind = DSV_FB;
    snprintf(h.run, sizeof h.run, "%s", r->id);
    snprintf(h.loss, sizeof h.loss, "%s", d->name);
    memcpy(h.config, j->spec->config, sizeof h.config);
    h.backward = j->backward;
    h.k = b->k;
    h.n_seqs = s1 - s0;
    int64_t a = b->offsets[s0], ntok = b->offsets[s1] - a, kw = b->k > 0 ? b->k : 1;
    h.n_tokens = ntok;
    if (whole) h.has_whole = 1, h.whole = *whole;
    for (int i = 0; i < d->n_inputs; i++)
        if (d->inputs[i].dtype == TWK_LOSS_F32 && b->in[d->inputs[i].id]) h.in_mask |= 1u << d->inputs[i].id;
    static const unsigned char zeros[8];
    dsv_put(m, zeros, (8 - m->n % 8) % 8); /* each share at an 8-byte boundary: its offsets are read in place */
    dsv_put(m, &h, sizeof h);
    for (int i = s0; i <= s1; i++) {
        int64_t o = b->offsets[i] - a;
        dsv_put(m, &o, sizeof o);
    }
    dsv_put(m, b->tokens + a, ntok * (int64_t)sizeof(int32_t));
    dsv_put(m, b->targets + a * kw, ntok * kw * (int64_t)sizeof(int32_t));
    for (int i = 0; i < d->n_inputs; i++) {
        const twk_loss_input_def *in = &d->inputs[i];
        if (!(h.in_mask & (1u << in->id))) continue;
        int64_t w = dsv_input_width(in, b->k);
        dsv_put(m, b->in[in->id] + a * w, ntok * w * (int64_t)sizeof(float));
    }
}

/* What share r's `:mean` metric i averaged over: pairs (preference losses); for the RL losses the
 * KL term's counted tokens, GSPO's sequences, else tokens. */
static double mean_weight(const twk_loss_def *d, const twk_loss_result *part, int i, double seqs, double masked) {
    if (i >= d->n_metrics) return part->values[1]; /* TWK_METRIC_ROUTER_AUX: per token */
    if (d->family == TWK_FAMILY_PREF) return part->values[2];
    if (d->family != TWK_FAMILY_RL) return part->values[1];
    if (!strcmp(d->metrics[i], "kl:mean")) return masked;
    return d->aggregation == TWK_AGG_GSPO ? seqs : part->values[1];
}

/* The whole batch's metrics from the shares' (cells of one job: used, results, sequence counts,
 * masked tokens): sums add, means weigh each share by what it averaged over, which gives the whole
 * batch's mean; `mean` as twk_loss_step sets it. */
static void combine(const twk_loss_def *d, const twk_loss_result *parts, const int *used, const double *seqs,
                    const double *masked, int n, twk_loss_result *res) {
    memset(res, 0, sizeof *res);
    for (int r = 0; r < n; r++)
        if (used[r]) res->n_metrics = parts[r].n_metrics;
    for (int i = 0; i < res->n_metrics; i++) {
        res->keys[i] = i < d->n_metrics ? d->metrics[i] : TWK_METRIC_ROUTER_AUX;
        int is_mean = strstr(res->keys[i], ":mean") != NULL;
        double wsum = 0;
        for (int r = 0; is_mean && r < n; r++)
            if (used[r]) wsum += mean_weight(d, &parts[r], i, seqs[r], masked[r]);
        for (int r = 0; r < n; r++)
            if (used[r])
                res->values[i] += !is_mean ? parts[r].values[i]
                                  : wsum > 0 ? parts[r].values[i] * mean_weight(d, &parts[r], i, seqs[r], masked[r]) / wsum
                                             : 0;
    }
    res->loss = res->values[0];
    if (d->family == TWK_FAMILY_RL) /* the GRPO family's loss is already normalised (twk_loss_step) */
        res->mean = d->aggregation != TWK_AGG_SUM ? res->loss : res->values[1] ? res->loss / res->values[1] : 0;
    else
        res->mean = res->values[2] != 0 ? res->loss / res->values[2] : res->loss;
}

/* The call's bookkeeping: per job j and rank k (cell j * nr + k) the share, whether it ran, its result. */
typedef struct fb_call {
    int n, nr;
    int *s0, *s1, *used, *ok;
    double *seqs, *masked;  /* per cell: the share's sequences and masked tokens (combine's weights) */
    twk_loss_whole *whole;  /* per job: the RL losses' whole-batch statistics */
    twk_loss_result *parts;
    float **saved;        /* per job: its gradients before the call (backward jobs) */
    twk_loss_batch *mine; /* per job: rank 0's share */
    twk_loss_job *sub;    /* jobs of one twk_loss_steps call on rank 0 */
    int *sub_of;
    int *sent;            /* per rank: a message went out (it answers and waits for its verdicts) */
} fb_call;

static void call_free(fb_call *c) {
    for (int j = 0; c->saved && j < c->n; j++) twk_host_free(c->saved[j]);
    twk_host_free(c->s0);
    twk_host_free(c->seqs);
    twk_host_free(c->whole);
    twk_host_free(c->parts);
    twk_host_free(c->saved);
    twk_host_free(c->mine);
    twk_host_free(c->sub);
    twk_host_free(c->sub_of);
    twk_host_free(c->sent);
}

static int call_init(fb_call *c, twk_loss_job *jobs, int n) {
    memset(c, 0, sizeof *c);
    c->n = n;
    c->nr = twk_dist_size();
    size_t cells = (size_t)n * (size_t)c->nr;
    c->s0 = twk_host_calloc(cells * 4 * sizeof(int), "shares");
    c->seqs = twk_host_calloc(cells * 2 * sizeof(double), "share weights");
    c->whole = twk_host_calloc((size_t)n * sizeof *c->whole, "whole batches");
    c->parts = twk_host_calloc(cells * sizeof *c->parts, "share results");
    c->saved = twk_host_calloc((size_t)n * sizeof *c->saved, "gradient snapshots");
    c->mine = twk_host_calloc((size_t)n * sizeof *c->mine, "rank 0's shares");
    c->sub = twk_host_calloc((size_t)n * sizeof *c->sub, "rank 0's jobs");
    c->sub_of = twk_host_calloc((size_t)n * sizeof *c->sub_of, "rank 0's jobs");
    c->sent = twk_host_calloc((size_t)c->nr * sizeof *c->sent, "ranks sent to");
    if (!c->s0 || !c->seqs || !c->whole || !c->parts || !c->saved || !c->mine || !c->sub || !c->sub_of || !c->sent) return 0;
    c->s1 = c->s0 + cells;
    c->used = c->s0 + 2 * cells;
    c->ok = c->s0 + 3 * cells;
    c->masked = c->seqs + cells;
    for (int j = 0; j < n; j++) {
        const twk_loss_batch *b = jobs[j].b;
        twk_loss_whole share;
        for (int k = 0; k < c->nr; k++) {
            int at = j * c->nr + k;
            twk_dist_shard(b->offsets, b->n_seqs, jobs[j].spec->def->group, k, c->nr, &c->s0[at], &c->s1[at]);
            c->used[at] = c->s1[at] > c->s0[at];
            if (twk_loss_whole_of(b, c->s0[at], c->s1[at], &share) == TWK_OK)
                c->seqs[at] = (double)share.n_seqs, c->masked[at] = share.masked_tokens;
        }
        /* the RL losses normalise by the whole batch (agreed here: rank 0 holds it all) */
        if (twk_loss_whole_of(b, 0, b->n_seqs, &c->whole[j]) != TWK_OK) return 0;
        /* each rank keeps a copy while its share runs: a failure anywhere puts every rank's back */
        if (jobs[j].backward && !(c->saved[j] = dsv_grads_save(jobs[j].t))) return 0;
    }
    return 1;
}

/* What job j's shares normalise by: the whole batch's statistics for an RL loss, else nothing. */
static const twk_loss_whole *whole_of_job(const fb_call *c, const twk_loss_job *job, int j) {
    return job->spec->def->family == TWK_FAMILY_RL ? &c->whole[j] : NULL;
}

/* Follower k's shares of every job, in one message; 1 when it went out (0: k has no share, or the
 * send failed — its shares stay !ok). */
static int send_shares(const fb_call *c, int k, int model, run_state *const *runs, const twk_loss_job *jobs) {
    dsv_cmd h;
    memset(&h, 0, sizeof h);
    h.kind = DSV_FB;
    h.model = model;
    for (int j = 0; j < c->n; j++) h.n_jobs += c->used[j * c->nr + k];
    if (!h.n_jobs) return 0;
    dsv_buf m = {0};
    dsv_put(&m, &h, sizeof h);
    for (int j = 0; j < c->n; j++) {
        int at = j * c->nr + k;
        if (c->used[at]) put_share(&m, runs[j], &jobs[j], whole_of_job(c, &jobs[j], j), c->s0[at], c->s1[at]);
    }
    twk_status st = m.oom ? twk_error(TWK_ERR_OOM, "out of memory for the shares of rank %d", k)
                          : twk_dist_send(k, DSV_TAG_CMD, m.p, m.n);
    twk_host_free(m.p);
    return st == TWK_OK;
}

/* Follower k's answer: per job of its message a dsv_reply, then its logprobs. A share that failed
 * (or a message that did not come) stays !ok. */
static void recv_shares(fb_call *c, int k, twk_loss_job *jobs) {
    void *buf = NULL;
    int64_t len = 0, at = 0;
    if (twk_dist_recv(k, DSV_TAG_REPLY, &buf, &len) != TWK_OK) return;
    for (int j = 0; j < c->n; j++) {
        int cell = j * c->nr + k;
        if (!c->used[cell]) continue;
        dsv_reply rep;
        const void *p = dsv_take(buf, len, &at, sizeof rep);
        if (!p) break;
        memcpy(&rep, p, sizeof rep);
        int64_t kw = jobs[j].b->k > 0 ? jobs[j].b->k : 1, a = jobs[j].b->offsets[c->s0[cell]];
        int64_t want = (jobs[j].b->offsets[c->s1[cell]] - a) * kw;
        const void *lp = rep.n_logprobs == want ? dsv_take(buf, len, &at, want * (int64_t)sizeof(float)) : NULL;
        if (rep.st != TWK_OK || !lp) continue;
        if (jobs[j].logprobs) memcpy(jobs[j].logprobs + a * kw, lp, (size_t)want * sizeof(float));
        c->parts[cell].n_metrics = rep.n_metrics;
        c->parts[cell].loss = rep.loss;
        memcpy(c->parts[cell].values, rep.values, sizeof rep.values);
        c->ok[cell] = 1;
    }
    twk_host_free(buf);
}

/* Runs jobs `which` (sub_of, m of them; batches as given) in one twk_loss_steps on rank 0, each
 * job's result and status into jobs[] (rank 0's cell when `share`). */
static void run_here(fb_call *c, twk_pack *pack, twk_loss_job *jobs, int m, int share) {
    if (!m) return;
    twk_status st = twk_loss_steps(pack, c->sub, m);
    for (int x = 0; x < m; x++) {
        int j = c->sub_of[x];
        if (share) {
            c->ok[j * c->nr] = st == TWK_OK && c->sub[x].st == TWK_OK;
            c->parts[j * c->nr] = c->sub[x].res;
            continue;
        }
        jobs[j].res = c->sub[x].res;
        jobs[j].st = st == TWK_OK ? c->sub[x].st : st;
        snprintf(jobs[j].err, sizeof jobs[j].err, "%s", st == TWK_OK ? c->sub[x].err : twk_last_error());
    }
}

twk_status svc_dist_loss_steps(twk_pack *pack, int model, run_state *const *runs, twk_loss_job *jobs, int n) {
    if (!svc_dist_active()) return twk_loss_steps(pack, jobs, n);
    if (!pack || !jobs || n < 1) return twk_error(TWK_ERR_INVALID_ARG, "loss_steps: NULL pack or jobs, or n < 1");
    fb_call c;
    if (!call_init(&c, jobs, n)) {
        call_free(&c);
        return twk_error(TWK_ERR_OOM, "out of memory splitting %d forward_backward requests over the ranks", n);
    }
    for (int j = 0; j < n; j++) jobs[j].st = TWK_OK, jobs[j].err[0] = 0;
    for (int k = 1; k < c.nr; k++) c.sent[k] = send_shares(&c, k, model, runs, jobs);
    int m = 0; /* rank 0's own shares, packed, while the others run theirs */
    for (int j = 0; j < n; j++) {
        if (!c.used[j * c.nr]) continue;
        c.mine[j] = *jobs[j].b;
        c.mine[j].n_seqs = c.s1[j * c.nr]; /* rank 0's share starts at sequence 0: the same arrays, fewer sequences */
        c.mine[j].whole = whole_of_job(&c, &jobs[j], j);
        c.sub[m] = jobs[j];
        c.sub[m].b = &c.mine[j];
        c.sub_of[m++] = j;
    }
    run_here(&c, pack, jobs, m, 1);
    for (int k = 1; k < c.nr; k++)
        if (c.sent[k]) recv_shares(&c, k, jobs);
    /* the verdicts: a job keeps its shares' gradients only when every share succeeded */
    int *keep = twk_host_calloc((size_t)n * sizeof(int), "verdicts");
    int32_t *v = twk_host_calloc((size_t)n * sizeof(int32_t), "verdicts");
    for (int j = 0; keep && j < n; j++) {
        keep[j] = 1;
        for (int k = 0; k < c.nr; k++) keep[j] &= !c.used[j * c.nr + k] || c.ok[j * c.nr + k];
    }
    for (int k = 1; k < c.nr; k++) {
        if (!c.sent[k]) continue;
        int nv = 0;
        for (int j = 0; j < n; j++)
            if (c.used[j * c.nr + k] && v) v[nv++] = keep ? keep[j] : 0;
        (void)twk_dist_send(k, DSV_TAG_VERDICT, v, nv * (int64_t)sizeof(int32_t));
    }
    m = 0;
    for (int j = 0; j < n; j++) {
        if (keep && keep[j]) {
            int at = j * c.nr;
            combine(jobs[j].spec->def, c.parts + at, c.used + at, c.seqs + at, c.masked + at, c.nr, &jobs[j].res);
            continue;
        }
        if (c.saved[j]) dsv_grads_restore(jobs[j].t, c.saved[j]);
        if (twk_dist_failed() || !keep) { /* a rank was lost: the run's gradients are gone with it */
            jobs[j].st = twk_error(TWK_ERR_BACKEND, "forward_backward over the ranks: %s", keep ? twk_last_error() : "out of memory");
            snprintf(jobs[j].err, sizeof jobs[j].err, "%s", twk_last_error());
            continue;
        }
        c.sub[m] = jobs[j]; /* the whole batch on rank 0: its result, or the single process's failure */
        c.sub_of[m++] = j;
    }
    run_here(&c, pack, jobs, m, 0);
    twk_host_free(keep);
    twk_host_free(v);
    call_free(&c);
    return TWK_OK;
}
