/* twk_loss_steps: the loss steps of several LoRA trainers of one model, their
 * passes packed together (lora_pack.c).
 *
 * Each job runs twk_loss_step's own code (loss_step.c) — whatever passes its
 * loss family needs (cross-entropy: one; RL, DPO: a forward, maybe a base
 * forward, then a backward) — on a thread of its own, but only one thread
 * runs at a time (a baton, as coroutines): a job runs until it asks for a
 * pass, then hands the baton back. When every unfinished job is waiting, the
 * waiting forward passes (adapter on or off) run packed together; only when
 * no job waits for a forward do the waiting backward passes run — so jobs
 * whose losses need forwards first (RL, DPO) still share the backward pass
 * with plain cross-entropy jobs. As many jobs per pass as fit the pack's
 * capacity and slots. So every job sees exactly the passes it would alone, in the same
 * order, and host code never runs concurrently (allocators, error texts and
 * the caller's state need no locks). A job whose trainer has LoRA on a
 * mixture of experts' experts or router runs its passes on its own trainer
 * while it holds the baton (never packed: the slots hold no expert stacks),
 * exactly as twk_loss_step alone; the pack counts them (own_passes). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "loss_pack.h"

#define BATON_MAIN (-1)

typedef struct pass_req {
    twk_trainer *t;
    pass_mode mode;
    twk_batch b;
    float *lp;
    float loss;
    twk_status st;
    char err[512];
    int waiting; /* a pass asked for and not run yet */
    int finished;
} pass_req;

struct twk_packer {
    twk_pack *pack;
    twk_loss_job *jobs;
    pass_req *req;
    int n;
    int sync; /* one job on the caller's thread: passes run at once */
    int baton; /* the job whose thread runs, or BATON_MAIN */
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

typedef struct job_arg {
    twk_packer *pk;
    int i;
} job_arg;

static void run_job(twk_packer *pk, int i) {
    twk_loss_job *j = &pk->jobs[i];
    twk_clear_error();
    j->st = twk_loss_step_in(pk, i, j->t, j->spec, j->b, j->backward, j->logprobs, &j->res);
    if (j->st != TWK_OK) snprintf(j->err, sizeof j->err, "%s", twk_last_error());
}

/* Waits (mutex held) until the baton is job i's. */
static void take_baton(twk_packer *pk, int i) {
    while (pk->baton != i) pthread_cond_wait(&pk->cv, &pk->mu);
}

static void give_baton(twk_packer *pk, int to) {
    pk->baton = to;
    pthread_cond_broadcast(&pk->cv);
}

static void *job_main(void *arg) {
    job_arg *a = arg;
    twk_packer *pk = a->pk;
    pthread_mutex_lock(&pk->mu);
    take_baton(pk, a->i);
    pthread_mutex_unlock(&pk->mu);
    run_job(pk, a->i);
    pthread_mutex_lock(&pk->mu);
    pk->req[a->i].finished = 1;
    give_baton(pk, BATON_MAIN);
    pthread_mutex_unlock(&pk->mu);
    return NULL;
}

/* Runs the waiting passes of one kind (backward or not) in as few packed passes as fit. */
static void run_kind(twk_packer *pk, int backward, twk_pack_seg *segs, int *who) {
    int64_t cap = twk_pack_capacity(pk->pack);
    int max = twk_pack_max_slots(pk->pack);
    for (;;) {
        int n = 0;
        int64_t tokens = 0;
        for (int i = 0; i < pk->n && n < max; i++) {
            pass_req *r = &pk->req[i];
            if (!r->waiting || (r->mode == PASS_BACKWARD) != backward) continue;
            if (n && tokens + r->b.n > cap) continue; /* the next pass takes it */
            segs[n] = (twk_pack_seg){.t = r->t, .b = r->b, .base = r->mode == PASS_BASE, .lp = r->lp};
            who[n++] = i;
            tokens += r->b.n;
        }
        if (!n) return;
        twk_clear_error();
        twk_status st = twk_pack_pass(pk->pack, backward, segs, n);
        for (int k = 0; k < n; k++) {
            pass_req *r = &pk->req[who[k]];
            r->st = st;
            r->loss = segs[k].loss;
            if (st != TWK_OK) snprintf(r->err, sizeof r->err, "%s", twk_last_error());
            r->waiting = 0;
        }
    }
}

twk_status twk_packer_pass(twk_packer *pk, int job, twk_trainer *t, pass_mode mode, const twk_batch *b, float *lp,
                           float *loss) {
    pass_req *r = &pk->req[job];
    *r = (pass_req){t, mode, *b, lp, 0, TWK_OK, "", 1, 0};
    if (pk->sync) {
        twk_pack_seg seg = {.t = t, .b = *b, .base = mode == PASS_BASE, .lp = lp};
        twk_status st = twk_pack_pass(pk->pack, mode == PASS_BACKWARD, &seg, 1);
        *loss = seg.loss;
        r->waiting = 0;
        return st;
    }
    pthread_mutex_lock(&pk->mu);
    give_baton(pk, BATON_MAIN);
    take_baton(pk, job);
    pthread_mutex_unlock(&pk->mu);
    *loss = r->loss;
    if (r->st != TWK_OK) return twk_error(r->st, "%s", r->err);
    return TWK_OK;
}

void twk_packer_count_own(twk_packer *pk) { twk_pack_count_own(pk->pack); }

twk_status twk_loss_steps(twk_pack *pack, twk_loss_job *jobs, int n) {
    if (!pack || !jobs || n < 1) return twk_error(TWK_ERR_INVALID_ARG, "loss_steps: NULL pack or jobs, or n < 1");
    for (int i = 0; i < n; i++) {
        jobs[i].st = TWK_OK;
        jobs[i].err[0] = 0;
        for (int k = 0; k < i; k++)
            if (jobs[k].t == jobs[i].t) return twk_error(TWK_ERR_INVALID_ARG, "loss_steps: jobs %d and %d share a trainer", k, i);
    }
    twk_packer pk = {.pack = pack, .jobs = jobs, .n = n, .sync = n == 1, .baton = BATON_MAIN};
    pk.req = twk_host_calloc((size_t)n * sizeof *pk.req, "packer requests");
    twk_pack_seg *segs = twk_host_alloc((size_t)n * sizeof *segs, "packer segments");
    int *who = twk_host_alloc((size_t)n * sizeof *who, "packer segments");
    pthread_t *th = twk_host_alloc((size_t)n * sizeof *th, "packer threads");
    job_arg *args = twk_host_alloc((size_t)n * sizeof *args, "packer threads");
    twk_status st = pk.req && segs && who && th && args ? TWK_OK : TWK_ERR_OOM;
    if (st == TWK_OK && pk.sync) run_job(&pk, 0);
    if (st == TWK_OK && !pk.sync) {
        pthread_mutex_init(&pk.mu, NULL);
        pthread_cond_init(&pk.cv, NULL);
        int started = 0;
        for (; started < n; started++) {
            args[started] = (job_arg){&pk, started};
            if (pthread_create(&th[started], NULL, job_main, &args[started]) != 0) break;
        }
        for (int i = started; i < n; i++) { /* no thread: the job fails, the others run */
            jobs[i].st = twk_error(TWK_ERR_OOM, "loss_steps: could not start a thread for job %d", i);
            snprintf(jobs[i].err, sizeof jobs[i].err, "%s", twk_last_error());
            pk.req[i].finished = 1;
        }
        pthread_mutex_lock(&pk.mu);
        for (;;) {
            int any = 0;
            for (int i = 0; i < n; i++) { /* each unfinished job runs up to its next pass (or its end) */
                if (pk.req[i].finished || pk.req[i].waiting) continue;
                give_baton(&pk, i);
                take_baton(&pk, BATON_MAIN);
            }
            int forward = 0;
            for (int i = 0; i < n; i++) {
                any |= pk.req[i].waiting;
                forward |= pk.req[i].waiting && pk.req[i].mode != PASS_BACKWARD;
            }
            if (!any) break;
            pthread_mutex_unlock(&pk.mu);
            run_kind(&pk, !forward, segs, who); /* forwards first: backwards wait to gather more company */
            pthread_mutex_lock(&pk.mu);
        }
        pthread_mutex_unlock(&pk.mu);
        for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
        pthread_mutex_destroy(&pk.mu);
        pthread_cond_destroy(&pk.cv);
    }
    twk_host_free(pk.req);
    twk_host_free(segs);
    twk_host_free(who);
    twk_host_free(th);
    twk_host_free(args);
    return st == TWK_OK ? TWK_OK : twk_error(st, "loss_steps: out of memory");
}
