/* The compute worker's fair scheduler (server/scheduler.c): each flow keeps its
 * submission order; a tenant flooding costly jobs cannot delay another
 * tenant's cheap job by more than one of its own jobs (the bound the SDK
 * fairness test relies on); a tenant that starts waiting gets no credit for
 * its idle time; a tenant's flows take turns; the ready heads a packing pass
 * can take (twk_sched_heads / twk_sched_take) are flow heads only; queued
 * optim_steps go ahead of a packable op within that op's cost of fairness. */
#include <stdio.h>
#include <string.h>

#include "scheduler.h"
#include "twinkle/hal.h"
#include "worker.h"

static int fails;
#define CHECK(c, ...)                                                                                                  \
    do {                                                                                                               \
        if (!(c)) {                                                                                                    \
            fails++;                                                                                                   \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                                \
            printf(__VA_ARGS__);                                                                                       \
            printf("\n");                                                                                              \
        }                                                                                                              \
    } while (0)

#define N 400
static twk_job jobs[N];
static int order[N]; /* the job's index within its flow */

static twk_job *mk(int i, const char *tenant, const char *flow, double cost, int k) {
    memset(&jobs[i], 0, sizeof jobs[i]);
    twk_job_route(&jobs[i], tenant, flow, cost);
    order[i] = k;
    return &jobs[i];
}

static int idx(const twk_job *j) { return (int)(j - jobs); }

/* A floods 100 jobs of cost 6400 (a sampling round); B then sends 20 jobs of cost 144 (a small
 * forward_backward): each of B's jobs runs after at most one of A's once B waits. */
static void test_flood(void) {
    twk_sched *s = twk_sched_new();
    for (int i = 0; i < 100; i++) twk_sched_push(s, mk(i, "A", "A-sampler", 6400, i));
    twk_job *first = twk_sched_pop(s); /* A is alone: its first job runs */
    CHECK(first && idx(first) == 0, "A's first job first");
    for (int i = 0; i < 20; i++) twk_sched_push(s, mk(100 + i, "B", "B-run", 144, i));
    CHECK(twk_sched_depth(s, "A") == 99 && twk_sched_depth(s, "B") == 20 && twk_sched_total(s) == 119,
          "depths %d %d %d", twk_sched_depth(s, "A"), twk_sched_depth(s, "B"), twk_sched_total(s));
    int a_between = 0, worst = 0, b_done = 0, next_a = 1, next_b = 0;
    while (b_done < 20) {
        twk_job *j = twk_sched_pop(s);
        if (!j) break;
        if (!strcmp(j->tenant, "A")) {
            CHECK(order[idx(j)] == next_a, "A's order: got %d want %d", order[idx(j)], next_a);
            next_a++;
            a_between++;
        } else {
            CHECK(order[idx(j)] == next_b, "B's order: got %d want %d", order[idx(j)], next_b);
            next_b++;
            if (a_between > worst) worst = a_between;
            a_between = 0;
            b_done++;
        }
    }
    printf("flood: B's 20 jobs ran with at most %d of A's jobs before each (bound 1), %d of A's in all\n", worst,
           next_a - 1);
    CHECK(b_done == 20 && worst <= 1, "B waited behind %d of A's jobs", worst);
    while (twk_sched_pop(s)) {}
    CHECK(twk_sched_total(s) == 0 && twk_sched_depth(s, "A") == 0, "empty");
    twk_sched_free(s);
}

/* Equal costs: two tenants alternate; a third that joins late is not owed the time it was idle. */
static void test_share(void) {
    twk_sched *s = twk_sched_new();
    for (int i = 0; i < 40; i++) twk_sched_push(s, mk(i, i % 2 ? "B" : "A", i % 2 ? "b" : "a", 10, i / 2));
    int na = 0, nb = 0, max_gap = 0;
    for (int k = 0; k < 20; k++) {
        twk_job *j = twk_sched_pop(s);
        if (!strcmp(j->tenant, "A")) na++;
        else nb++;
        int gap = na > nb ? na - nb : nb - na;
        if (gap > max_gap) max_gap = gap;
    }
    CHECK(max_gap <= 1, "equal tenants drift apart by %d jobs", max_gap);
    for (int i = 0; i < 10; i++) twk_sched_push(s, mk(40 + i, "C", "c", 10, i));
    int nc = 0, others = 0;
    for (int k = 0; k < 15; k++) {
        twk_job *j = twk_sched_pop(s);
        if (!strcmp(j->tenant, "C")) nc++;
        else others++;
    }
    /* C starts at the current virtual time: one job in three, not a burst of catching up */
    printf("share: A/B drift %d; after C joined, 15 picks gave C %d, A+B %d\n", max_gap, nc, others);
    CHECK(nc >= 4 && nc <= 6, "the late tenant got %d of 15 picks (want about a third)", nc);
    while (twk_sched_pop(s)) {}
    twk_sched_free(s);
}

/* One tenant, three flows: they take turns, each in order. */
static void test_flows(void) {
    twk_sched *s = twk_sched_new();
    const char *flows[3] = {"r1", "r2", "r3"};
    int k = 0;
    for (int f = 0; f < 3; f++)
        for (int i = 0; i < 5; i++, k++) twk_sched_push(s, mk(k, "T", flows[f], 1 + f * 100, i));
    int last[3] = {-1, -1, -1}, prev_flow = -1, repeats = 0;
    for (twk_job *j; (j = twk_sched_pop(s));) {
        int f = j->flow[1] - '1';
        CHECK(order[idx(j)] == last[f] + 1, "flow %s out of order", j->flow);
        last[f] = order[idx(j)];
        if (f == prev_flow && last[0] < 4 && last[1] < 4 && last[2] < 4) repeats++;
        prev_flow = f;
    }
    CHECK(repeats == 0, "a flow ran twice in a row while others waited (%d)", repeats);
    CHECK(last[0] == 4 && last[1] == 4 && last[2] == 4, "every job ran");
    twk_sched_free(s);
}

static int only_tenant_x(const twk_job *j, void *ctx) { return !strcmp(j->tenant, (const char *)ctx); }

/* Ready heads: one per flow; taking one lets the next of its flow become a head. */
static void test_heads(void) {
    twk_sched *s = twk_sched_new();
    twk_sched_push(s, mk(0, "A", "a1", 5, 0));
    twk_sched_push(s, mk(1, "A", "a1", 5, 1));
    twk_sched_push(s, mk(2, "A", "a2", 5, 0));
    twk_sched_push(s, mk(3, "B", "b1", 5, 0));
    twk_job *out[8];
    int n = twk_sched_heads(s, NULL, NULL, out, 8);
    int seen = 0;
    for (int i = 0; i < n; i++) seen |= 1 << idx(out[i]);
    CHECK(n == 3 && seen == (1 | 4 | 8), "heads: %d, mask %x", n, seen);
    n = twk_sched_heads(s, only_tenant_x, (void *)"A", out, 8);
    CHECK(n == 2, "A's heads: %d", n);
    CHECK(twk_sched_take(s, &jobs[1]) == -1, "a job behind its flow's head cannot be taken");
    CHECK(twk_sched_take(s, &jobs[0]) == 0, "a head can be taken");
    n = twk_sched_heads(s, only_tenant_x, (void *)"A", out, 8);
    seen = 0;
    for (int i = 0; i < n; i++) seen |= 1 << idx(out[i]);
    CHECK(n == 2 && seen == (2 | 4), "after the take, job 1 heads a1: mask %x", seen);
    CHECK(twk_sched_total(s) == 3, "total %d", twk_sched_total(s));
    while (twk_sched_pop(s)) {}
    twk_sched_free(s);
}

/* Packable ops (batch_key) and optim_steps (pack_gate): B, C and D were served by a pass (cost
 * 192 each) and queue their optim_steps; A, which the pass did not serve, has the least received
 * cost and queues a forward_backward — the optim_steps go first (B, C, D can then join A's pass),
 * in order of received cost, A's op right after. And the bound: a tenant with 300 queued
 * optim_steps puts at most one packable op's cost of them (192, each of cost 1) ahead of A's op. */
static const int pack_key; /* a base model */

static twk_job *mk_fb(int i, const char *tenant, double cost) {
    twk_job *j = mk(i, tenant, tenant, cost, 0);
    j->batch_key = &pack_key;
    return j;
}

static twk_job *mk_optim(int i, const char *tenant, int k) {
    twk_job *j = mk(i, tenant, tenant, 1, k);
    j->pack_gate = 1;
    return j;
}

static void test_pack_gate(void) {
    twk_sched *s = twk_sched_new();
    const char *served[3] = {"B", "C", "D"};
    for (int i = 0; i < 3; i++) twk_sched_push(s, mk_fb(i, served[i], 192));
    for (int i = 0; i < 3; i++) twk_sched_pop(s); /* the pass */
    twk_sched_push(s, mk_fb(3, "A", 192));
    for (int i = 0; i < 3; i++) twk_sched_push(s, mk_optim(4 + i, served[i], 0));
    int got[4];
    for (int i = 0; i < 4; i++) {
        twk_job *j = twk_sched_pop(s);
        got[i] = j ? idx(j) : -1;
    }
    CHECK(got[0] >= 4 && got[1] >= 4 && got[2] >= 4 && got[3] == 3,
          "optim_steps before the packable op: got %d %d %d %d, want 4..6 in some order then 3", got[0], got[1], got[2],
          got[3]);
    CHECK(twk_sched_total(s) == 0, "all taken: %d left", twk_sched_total(s));

    /* the bound */
    twk_sched_push(s, mk_fb(10, "A", 192));
    for (int i = 0; i < 300; i++) twk_sched_push(s, mk_optim(20 + i, "E", i));
    int ahead = 0, a_done = 0, next_e = 0;
    for (twk_job *j; (j = twk_sched_pop(s));) {
        if (idx(j) == 10) {
            a_done = 1;
            continue;
        }
        CHECK(order[idx(j)] == next_e, "E's order: got %d want %d", order[idx(j)], next_e);
        next_e++;
        if (!a_done) ahead++;
    }
    CHECK(a_done && ahead <= 193, "A's packable op ran after %d of E's optim_steps (at most 193: one op's cost)", ahead);
    CHECK(ahead > 0, "E's optim_steps (its cost within A's op's) went first: %d", ahead);
    printf("pack gate: optim_steps %d %d %d then the packable op; a tenant's 300 optim_steps put %d ahead\n", got[0],
           got[1], got[2], ahead);
    twk_sched_free(s);
}

int main(void) {
    test_pack_gate();
    test_flood();
    test_share();
    test_flows();
    test_heads();
    if (fails) {
        printf("%d check(s) failed\n", fails);
        return 1;
    }
    printf("scheduler: all checks passed\n");
    return 0;
}
