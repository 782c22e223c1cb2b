/* Stability records (see stability.h): a list under a mutex, least recently
 * used first out when full; expired records are dropped as new ones come. */
#include "stability.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "twinkle/hal.h"

typedef struct rec {
    char id[128], tenant[64], session[128];
    int32_t *prompt, *tokens;
    float *logprobs;
    int64_t n_prompt, n;
    double last_used;
    struct rec *next;
} rec;

struct twk_stab {
    pthread_mutex_t mu;
    double ttl;
    int max, count;
    rec *head;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void rec_free(rec *r) {
    if (!r) return;
    twk_host_free(r->prompt);
    twk_host_free(r->tokens);
    twk_host_free(r->logprobs);
    twk_host_free(r);
}

twk_stab *twk_stab_new(double ttl_s, int max_records) {
    twk_stab *s = twk_host_calloc(sizeof *s, "stability records");
    if (!s) return NULL;
    pthread_mutex_init(&s->mu, NULL);
    s->ttl = ttl_s;
    s->max = max_records > 0 ? max_records : 1;
    return s;
}

void twk_stab_free(twk_stab *s) {
    if (!s) return;
    for (rec *r = s->head, *n; r; r = n) {
        n = r->next;
        rec_free(r);
    }
    pthread_mutex_destroy(&s->mu);
    twk_host_free(s);
}

/* Under the lock: drops expired records, then the least recently used while full. */
static void prune(twk_stab *s, double now) {
    for (rec **pp = &s->head; *pp;) {
        if (now - (*pp)->last_used > s->ttl) {
            rec *dead = *pp;
            *pp = dead->next;
            rec_free(dead);
            s->count--;
        } else {
            pp = &(*pp)->next;
        }
    }
    while (s->count >= s->max && s->head) {
        rec **oldest = &s->head;
        for (rec **pp = &s->head; *pp; pp = &(*pp)->next)
            if ((*pp)->last_used < (*oldest)->last_used) oldest = pp;
        rec *dead = *oldest;
        *oldest = dead->next;
        rec_free(dead);
        s->count--;
    }
}

int twk_stab_record(twk_stab *s, const char *tenant, const char *session, const char *seq_id, const twk_stab_seq *q) {
    rec *r = twk_host_calloc(sizeof *r, "stability record");
    if (!r) return 0;
    snprintf(r->id, sizeof r->id, "%s", seq_id);
    snprintf(r->tenant, sizeof r->tenant, "%s", tenant);
    snprintf(r->session, sizeof r->session, "%s", session);
    r->n_prompt = q->n_prompt;
    r->n = q->n;
    r->prompt = twk_host_alloc((size_t)(q->n_prompt ? q->n_prompt : 1) * sizeof(int32_t), "stability record");
    r->tokens = twk_host_alloc((size_t)(q->n ? q->n : 1) * sizeof(int32_t), "stability record");
    r->logprobs = twk_host_alloc((size_t)(q->n ? q->n : 1) * sizeof(float), "stability record");
    if (!r->prompt || !r->tokens || !r->logprobs) {
        rec_free(r);
        return 0;
    }
    if (q->n_prompt) memcpy(r->prompt, q->prompt, (size_t)q->n_prompt * sizeof(int32_t));
    if (q->n) {
        memcpy(r->tokens, q->tokens, (size_t)q->n * sizeof(int32_t));
        memcpy(r->logprobs, q->logprobs, (size_t)q->n * sizeof(float));
    }
    pthread_mutex_lock(&s->mu);
    r->last_used = now_s();
    prune(s, r->last_used);
    r->next = s->head;
    s->head = r;
    s->count++;
    pthread_mutex_unlock(&s->mu);
    return 1;
}

twk_stab_found twk_stab_get(twk_stab *s, const char *tenant, const char *session, const char *seq_id, int sampled,
                            int64_t offset, int64_t len, int32_t *out_tokens, float *out_lp, int64_t *avail,
                            char *other, size_t other_len) {
    twk_stab_found f = TWK_STAB_UNKNOWN;
    pthread_mutex_lock(&s->mu);
    rec *r = s->head;
    while (r && (strcmp(r->id, seq_id) || strcmp(r->tenant, tenant))) r = r->next;
    double now = now_s();
    if (r && strcmp(r->session, session)) {
        f = TWK_STAB_OTHER_SESSION;
        snprintf(other, other_len, "%s", r->session);
    } else if (r && now - r->last_used > s->ttl) {
        f = TWK_STAB_EXPIRED;
    } else if (r) {
        f = TWK_STAB_OK;
        r->last_used = now;
        *avail = sampled ? r->n : r->n_prompt;
        for (int64_t i = 0; i < len && offset + i < *avail; i++) {
            out_tokens[i] = sampled ? r->tokens[offset + i] : r->prompt[offset + i];
            if (out_lp) out_lp[i] = sampled ? r->logprobs[offset + i] : 0.0f;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return f;
}
