/* server/ — the compute worker's fair scheduler: jobs wait in flows (one per
 * run or sampling session, FIFO, so a run's ops keep their seq_id order),
 * flows belong to tenants, and the next job comes from the tenant that has
 * received the least estimated cost so far (start-time fair queuing, DRR with
 * an infinitesimal quantum); a tenant's flows take turns. Not thread-safe:
 * the worker calls it under its lock. */
#ifndef TWK_SERVER_SCHEDULER_H
#define TWK_SERVER_SCHEDULER_H

#include <stddef.h>

struct twk_job;
typedef struct twk_sched twk_sched;

/* NULL without memory. */
twk_sched *twk_sched_new(void);
void twk_sched_free(twk_sched *s);
/* Appends j to its flow (j->tenant, j->flow); 0, or -1 without memory (nothing queued). */
int twk_sched_push(twk_sched *s, struct twk_job *j);
/* Takes the next job by fairness and charges its cost to its tenant; NULL when empty. */
struct twk_job *twk_sched_pop(twk_sched *s);
/* Jobs of `tenant` waiting (not running). */
int twk_sched_depth(const twk_sched *s, const char *tenant);
/* Jobs waiting in all. */
int twk_sched_total(const twk_sched *s);
/* The heads of the waiting flows for which keep(j, ctx) is nonzero (at most max, in no
 * particular order) — the jobs that are ready now, without reordering any flow; for packing
 * several runs' ops into one pass. Returns how many were written to out. */
int twk_sched_heads(const twk_sched *s, int (*keep)(const struct twk_job *j, void *ctx), void *ctx,
                    struct twk_job **out, int max);
/* Takes a job that is the head of its flow out of the scheduler, charging its tenant as
 * twk_sched_pop would; -1 when j is not a waiting flow head. */
int twk_sched_take(twk_sched *s, struct twk_job *j);

#endif
