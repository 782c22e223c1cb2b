/* The compute worker's fair scheduler (scheduler.h): tenants by least received
 * cost, each tenant's flows in turn, each flow FIFO. */
#include <string.h>

#include "twinkle/hal.h"
#include "scheduler.h"
#include "worker.h"

typedef struct flow {
    char key[TWK_JOB_FLOW_LEN];
    twk_job *head, *tail;
    struct flow *next; /* the tenant's waiting flows, in turn order */
} flow;

typedef struct tenant {
    char name[TWK_JOB_TENANT_LEN];
    double vt;         /* cost received, in the scheduler's virtual time */
    int waiting;
    flow *flows, *last;
    struct tenant *next;
} tenant;

struct twk_sched {
    tenant *tenants;   /* only tenants with waiting jobs */
    double vnow;       /* the virtual time of the last pick: a tenant that starts waiting begins here */
    int total;
};

twk_sched *twk_sched_new(void) { return twk_host_calloc(sizeof(twk_sched), "scheduler"); }

void twk_sched_free(twk_sched *s) {
    if (!s) return;
    for (tenant *t = s->tenants, *tn; t; t = tn) {
        tn = t->next;
        for (flow *f = t->flows, *fn; f; f = fn) {
            fn = f->next;
            twk_host_free(f);
        }
        twk_host_free(t);
    }
    twk_host_free(s);
}

static tenant *find_tenant(const twk_sched *s, const char *name) {
    for (tenant *t = s->tenants; t; t = t->next)
        if (!strcmp(t->name, name)) return t;
    return NULL;
}

int twk_sched_push(twk_sched *s, twk_job *j) {
    tenant *t = find_tenant(s, j->tenant);
    int new_tenant = !t;
    if (new_tenant) {
        if (!(t = twk_host_calloc(sizeof *t, "scheduler tenant"))) return -1;
        memcpy(t->name, j->tenant, sizeof t->name);
        t->vt = s->vnow; /* no credit for having been idle */
    }
    flow *f = t->flows;
    while (f && strcmp(f->key, j->flow)) f = f->next;
    if (!f) {
        if (!(f = twk_host_calloc(sizeof *f, "scheduler flow"))) {
            if (new_tenant) twk_host_free(t);
            return -1;
        }
        memcpy(f->key, j->flow, sizeof f->key);
        if (t->last) t->last->next = f;
        else t->flows = f;
        t->last = f;
    }
    j->next = NULL;
    if (f->tail) f->tail->next = j;
    else f->head = j;
    f->tail = j;
    t->waiting++;
    s->total++;
    if (new_tenant) {
        t->next = s->tenants;
        s->tenants = t;
    }
    return 0;
}

/* Takes f's head (f is t's first flow or found by the caller at *fp), charges t, and
 * rotates / frees the flow and tenant as they empty. */
static twk_job *take_head(twk_sched *s, tenant *t, flow **fp) {
    flow *f = *fp;
    twk_job *j = f->head;
    f->head = j->next;
    if (!f->head) f->tail = NULL;
    j->next = NULL;
    if (t->vt > s->vnow) s->vnow = t->vt;
    t->vt += j->cost > 0 ? j->cost : 1;
    t->waiting--;
    s->total--;
    /* the flow leaves its place: to the back when it has more, else freed */
    *fp = f->next;
    if (t->last == f) {
        t->last = NULL;
        for (flow *x = t->flows; x; x = x->next) t->last = x;
    }
    f->next = NULL;
    if (f->head) {
        if (t->last) t->last->next = f;
        else t->flows = f;
        t->last = f;
    } else {
        twk_host_free(f);
    }
    if (!t->waiting) {
        tenant **tp = &s->tenants;
        while (*tp != t) tp = &(*tp)->next;
        *tp = t->next;
        twk_host_free(t);
    }
    return j;
}

/* A packable op (batch_key) runs with whatever ops of other runs are ready at its turn, and a run
 * whose optim_step is still queued cannot be among them: its next forward_backward comes after.
 * So before a packable op, a queued optim_step (pack_gate) of a tenant whose received cost is
 * within that op's cost of the least goes first — the runs the last pass served step their
 * optimizers and come back in time to share the next pass, instead of the tenants splitting into
 * groups that take turns with passes of a few runs each (8 tenants of bench/server/run.sh: 1.85
 * runs a pass before, 4.8 with it). A tenant waits at most its fair share plus one packable op. */
twk_job *twk_sched_pop(twk_sched *s) {
    tenant *best = NULL;
    for (tenant *t = s->tenants; t; t = t->next)
        if (!best || t->vt < best->vt) best = t;
    if (!best) return NULL;
    const twk_job *h = best->flows->head;
    if (h->batch_key) {
        double limit = best->vt + (h->cost > 0 ? h->cost : 1);
        tenant *ct = NULL;
        flow **cfp = NULL;
        for (tenant *t = s->tenants; t; t = t->next) {
            if (t->vt > limit || (ct && t->vt >= ct->vt)) continue;
            for (flow **fp = &t->flows; *fp; fp = &(*fp)->next)
                if ((*fp)->head->pack_gate) {
                    ct = t;
                    cfp = fp;
                    break;
                }
        }
        if (ct) return take_head(s, ct, cfp);
    }
    return take_head(s, best, &best->flows);
}

int twk_sched_depth(const twk_sched *s, const char *tenant_name) {
    const tenant *t = find_tenant(s, tenant_name);
    return t ? t->waiting : 0;
}

int twk_sched_total(const twk_sched *s) { return s->total; }

int twk_sched_heads(const twk_sched *s, int (*keep)(const twk_job *j, void *ctx), void *ctx, twk_job **out, int max) {
    int n = 0;
    for (const tenant *t = s->tenants; t && n < max; t = t->next)
        for (const flow *f = t->flows; f && n < max; f = f->next)
            if (!keep || keep(f->head, ctx)) out[n++] = f->head;
    return n;
}

int twk_sched_take(twk_sched *s, twk_job *j) {
    for (tenant *t = s->tenants; t; t = t->next)
        for (flow **fp = &t->flows; *fp; fp = &(*fp)->next)
            if ((*fp)->head == j) {
                take_head(s, t, fp);
                return 0;
            }
    return -1;
}
