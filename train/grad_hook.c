/* Gradients handed to the host as they become final during the backward pass
 * that ends a step (twk_trainer_grad_hook_arm, trainer.h): the forward +
 * backward plan runs cut after the launch that completes each group of
 * tensors (their grad_acc ops), and between the segments the group's
 * tensors come to the host copy and its ready callback runs — so dist/ can
 * reduce one bucket while the rest of the backward runs. */
#include <stdio.h>
#include <string.h>

#include "trainer_internal.h"

typedef struct twk_grad_hook_state {
    twk_grad_hook h;
    int *order;      /* the groups in the order they become final */
    int *cut_of;     /* per group: the segment after which it is final (n_cuts: the pass's end) */
    int *cuts;       /* ascending launch indices */
    int n_cuts;
    int n_ready;     /* groups handed to ready so far (a prefix of order) */
    int fired;       /* the last pass ran (or began) */
    twk_status err;  /* the pass's first download / ready failure */
    unsigned char *fetched; /* per tensor: its gradient is in grad_host */
} twk_grad_hook_state;

void twk_trainer_grad_hook_free(twk_trainer *t) {
    twk_grad_hook_state *s = t ? t->hook : NULL;
    if (!s) return;
    twk_host_free(s->order);
    twk_host_free(s->cut_of);
    twk_host_free(s->cuts);
    twk_host_free(s->fetched);
    twk_host_free(s);
    t->hook = NULL;
}

/* Tensor i's gradient from the device into the host copy, once. */
static twk_status fetch(twk_trainer *t, int i) {
    twk_grad_hook_state *s = t->hook;
    if (s->fetched[i]) return TWK_OK;
    size_t off = (size_t)t->tp[i].off * sizeof(float), bytes = (size_t)t->tp[i].nb->nelem * sizeof(float);
    twk_status st = twk_buffer_download(t->m->dev, t->grad_acc, off, t->grad_host + t->tp[i].off, bytes);
    if (st == TWK_OK) s->fetched[i] = 1;
    return st;
}

/* The groups final after segment `seg` (n_cuts: at the pass's end): their tensors to the host, then ready. */
static twk_status hand_over(twk_trainer *t, int seg) {
    twk_grad_hook_state *s = t->hook;
    while (s->n_ready < s->h.n_groups && s->cut_of[s->order[s->n_ready]] == seg) {
        int g = s->order[s->n_ready];
        for (int i = s->h.first[g]; i <= s->h.last[g]; i++) {
            twk_status st = fetch(t, i);
            if (st != TWK_OK) return st;
        }
        s->n_ready++;
        twk_status st = s->h.ready(s->h.ctx, g);
        if (st != TWK_OK) return st;
    }
    return TWK_OK;
}

static twk_status at_cut(void *ctx, int seg) { return hand_over(ctx, seg); }

twk_status twk_trainer_grad_hook_arm(twk_trainer *t, const twk_grad_hook *h, int *order) {
    if (!t || !h || !h->ready || h->n_groups < 1 || !h->first || !h->last)
        return twk_error(TWK_ERR_INVALID_ARG, "grad_hook: NULL trainer, hook, callback or groups");
    if (!t->grad_acc || !t->fwdbwd) return twk_error(TWK_ERR_STATE, "grad_hook: the trainer has no gradients");
    if (t->hook) return twk_error(TWK_ERR_STATE, "grad_hook: a hook is armed already");
    for (int g = 0; g < h->n_groups; g++)
        if (h->first[g] < 0 || h->last[g] < h->first[g] || h->last[g] >= t->n_tp)
            return twk_error(TWK_ERR_INVALID_ARG, "grad_hook: group %d = tensors %d..%d of %d", g, h->first[g], h->last[g], t->n_tp);
    twk_grad_hook_state *s = twk_host_calloc(sizeof *s, "gradient hook");
    twk_plan_stats ps;
    twk_plan_get_stats(t->fwdbwd, &ps);
    int n = h->n_groups, nl = ps.n_launches;
    if (s) {
        t->hook = s;
        s->h = *h;
        s->order = twk_host_alloc((size_t)n * sizeof(int), "gradient hook");
        s->cut_of = twk_host_alloc((size_t)n * sizeof(int), "gradient hook");
        s->cuts = twk_host_alloc((size_t)n * sizeof(int), "gradient hook");
        s->fetched = twk_host_calloc((size_t)t->n_tp, "gradient hook");
    }
    if (!t->grad_host) t->grad_host = twk_host_alloc((size_t)t->flat_n * sizeof(float), "gradient host copy");
    if (!s || !s->order || !s->cut_of || !s->cuts || !s->fetched || !t->grad_host) {
        twk_trainer_grad_hook_free(t);
        return twk_error(TWK_ERR_OOM, "grad_hook: out of memory for %d groups", n);
    }
    /* each group is final after the last of its tensors' grad_acc launches (one the plan does not
     * launch counts as the pass's end); a cut after launch L is at L + 1 */
    int *at = s->cut_of; /* first the launch index each group waits for */
    for (int g = 0; g < n; g++) {
        at[g] = 0;
        for (int i = h->first[g]; i <= h->last[g]; i++) {
            int l = twk_plan_launch_of(t->fwdbwd, t->tp[i].acc_op);
            int c = l < 0 ? nl : l + 1;
            at[g] = c > at[g] ? c : at[g];
        }
        s->order[g] = g;
    }
    for (int a = 1; a < n; a++) /* by the launch they wait for, then by index: insertion sort */
        for (int b = a; b > 0 && (at[s->order[b]] < at[s->order[b - 1]] ||
                                  (at[s->order[b]] == at[s->order[b - 1]] && s->order[b] < s->order[b - 1])); b--) {
            int x = s->order[b];
            s->order[b] = s->order[b - 1];
            s->order[b - 1] = x;
        }
    for (int k = 0; k < n; k++) { /* distinct cut points inside the plan; groups at the end wait for it */
        int c = at[s->order[k]];
        if (c < nl && (s->n_cuts == 0 || s->cuts[s->n_cuts - 1] != c)) s->cuts[s->n_cuts++] = c;
    }
    for (int g = 0; g < n; g++) {
        int seg = s->n_cuts;
        for (int k = 0; k < s->n_cuts; k++)
            if (s->cuts[k] == at[g]) seg = k;
        at[g] = seg;
    }
    if (order) memcpy(order, s->order, (size_t)n * sizeof(int));
    return TWK_OK;
}

twk_status twk_trainer_forward_backward_last(twk_trainer *t, const twk_batch *b, float *logprobs, float *loss) {
    twk_grad_hook_state *s = t ? t->hook : NULL;
    if (!s || s->fired) return twk_trainer_forward_backward(t, b, logprobs, loss);
    s->fired = 1;
    twk_status st = twk_trainer_grads_to_device(t);
    if (st == TWK_OK) st = twk_trainer_bind_batch(t, t->fwdbwd, b);
    if (st == TWK_OK) st = twk_plan_run_cut(t->fwdbwd, b->n, s->cuts, s->n_cuts, at_cut, t);
    if (st == TWK_OK) st = hand_over(t, s->n_cuts); /* the groups final at the pass's end */
    if (st == TWK_OK && logprobs) st = twk_plan_read(t->fwdbwd, t->logprobs, b->n, logprobs, (size_t)b->n * sizeof *logprobs);
    if (st == TWK_OK && loss) st = twk_plan_read(t->fwdbwd, t->loss, b->n, loss, sizeof *loss);
    if (st == TWK_OK) st = twk_trainer_note_aux(t, t->fwdbwd, b->n);
    return st;
}

twk_status twk_trainer_grad_hook_finish(twk_trainer *t, int *n_ready) {
    twk_grad_hook_state *s = t ? t->hook : NULL;
    if (n_ready) *n_ready = s ? s->n_ready : 0;
    if (!s) return twk_error(TWK_ERR_STATE, "grad_hook: no hook is armed");
    twk_status st = TWK_OK;
    /* the device holds the step's gradient unless the host copy already was it (no pass uploaded it) */
    for (int i = 0; !t->grads_on_host && i < t->n_tp && st == TWK_OK; i++) st = fetch(t, i);
    if (st == TWK_OK) t->grads_on_host = 1; /* the host copy is the step's gradient (the optimizer uploads it) */
    twk_trainer_grad_hook_free(t);
    return st;
}
