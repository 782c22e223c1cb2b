/* The per-step metrics log: every successful forward_backward, forward and optim_step leaves a row
 * (its loss's metrics; the learning rate and gradient norm) in the store's run_steps table — the
 * dashboard's curves. Rows are collected on the loop thread as ops finish and written in one
 * transaction per TWK_SERVE_STEP_FLUSH_MS (or per TWK_SERVE_STEP_BATCH rows), so a busy run costs one
 * fsync a second, not one per op; the dashboard flushes before it reads. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "api_util.h"
#include "svc.h"

struct svc_steps {
    uv_timer_t timer;
    twk_store_step *rows; /* waiting to be written */
    int n, cap;
    long long failed;     /* rows the store refused since start (logged as they happen) */
};

static void add_num(cJSON *m, const char *key, double v) {
    api_json_put(m, key, isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull());
}

/* The op's metrics as a JSON object text (cJSON_free it); NULL without memory. */
static char *op_metrics(const op *o) {
    cJSON *m = cJSON_CreateObject();
    if (o->kind == OP_OPTIM) {
        add_num(m, "learning_rate", o->adam.learning_rate);
        add_num(m, "grad_norm", o->grad_norm);
    } else {
        for (int i = 0; i < o->fb_res.n_metrics; i++) add_num(m, o->fb_res.keys[i], o->fb_res.values[i]);
    }
    char *txt = m && !api_json_oom() ? cJSON_PrintUnformatted(m) : NULL;
    cJSON_Delete(m);
    return txt;
}

void svc_steps_note(svc *s, const op *o) {
    struct svc_steps *st = s->steps;
    if (!st || o->st != TWK_OK || (o->kind != OP_FB && o->kind != OP_OPTIM)) return;
    if (st->n == st->cap) {
        int ncap = st->cap ? st->cap * 2 : 64;
        twk_store_step *g = twk_host_realloc(st->rows, (size_t)st->cap * sizeof *g, (size_t)ncap * sizeof *g, "step rows");
        if (!g) return; /* out of memory: this point is lost, training goes on */
        st->rows = g;
        st->cap = ncap;
    }
    char *txt = op_metrics(o);
    twk_store_step *r = &st->rows[st->n];
    memset(r, 0, sizeof *r);
    r->metrics_json = txt ? twk_host_alloc(strlen(txt) + 1, "step metrics") : NULL;
    if (!r->metrics_json) {
        cJSON_free(txt);
        return;
    }
    memcpy(r->metrics_json, txt, strlen(txt) + 1);
    cJSON_free(txt);
    snprintf(r->run_id, sizeof r->run_id, "%s", o->run->id);
    snprintf(r->tenant, sizeof r->tenant, "%s", o->run->tenant);
    r->kind = o->kind == OP_OPTIM ? TWK_STEP_OPTIM : o->fb && o->fb->forward_only ? TWK_STEP_FORWARD
                                                                                    : TWK_STEP_FORWARD_BACKWARD;
    r->seq = o->seq;
    r->step = o->trainer_step;
    r->time = (double)time(NULL);
    st->n++;
    if (st->n >= TWK_SERVE_STEP_BATCH) svc_steps_flush(s);
}

void svc_steps_flush(svc *s) {
    struct svc_steps *st = s->steps;
    if (!st || st->n == 0) return;
    int failed = 0;
    if (twk_store_steps_add(s->store, st->rows, st->n, TWK_SERVE_STEP_POINTS, &failed) != TWK_OK)
        twk_log_info("step metrics: %d of %d rows not stored: %s", failed, st->n, twk_last_error());
    st->failed += failed;
    for (int i = 0; i < st->n; i++) twk_host_free(st->rows[i].metrics_json);
    st->n = 0;
}

static void on_flush(uv_timer_t *t) { svc_steps_flush(t->data); }

int svc_steps_start(svc *s) {
    struct svc_steps *st = twk_host_calloc(sizeof *st, "step log");
    if (!st) return -1;
    uv_timer_init(s->loop, &st->timer);
    st->timer.data = s;
    uv_timer_start(&st->timer, on_flush, TWK_SERVE_STEP_FLUSH_MS, TWK_SERVE_STEP_FLUSH_MS);
    s->steps = st;
    return 0;
}

static void on_closed(uv_handle_t *h) {
    struct svc_steps *st = (struct svc_steps *)h; /* the timer is the first member */
    twk_host_free(st->rows);
    twk_host_free(st);
}

void svc_steps_stop(svc *s) {
    struct svc_steps *st = s->steps;
    if (!st) return;
    svc_steps_flush(s);
    s->steps = NULL;
    uv_timer_stop(&st->timer);
    uv_close((uv_handle_t *)&st->timer, on_closed);
}
