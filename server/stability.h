/* Stability records for loss_fn="stable_reinforce": each sequence sampled with
 * record_stability_info, kept under its sequence_id with the session that
 * sampled it, its prompt, its sampled tokens and the sampler's logprobs of
 * them. A record stays usable for `ttl` seconds after its last use. Thread
 * safe (the worker records, the loop looks up). */
#ifndef TWK_SERVER_STABILITY_H
#define TWK_SERVER_STABILITY_H

#include <stddef.h>
#include <stdint.h>

typedef struct twk_stab twk_stab;

typedef struct twk_stab_seq {
    const int32_t *prompt;
    int64_t n_prompt;
    const int32_t *tokens;
    const float *logprobs;
    int64_t n;
} twk_stab_seq;

/* A store whose records expire `ttl_s` seconds after their last use; NULL on OOM. */
twk_stab *twk_stab_new(double ttl_s, int max_records);
void twk_stab_free(twk_stab *s);
/* Records one sampled sequence (copies it); the least recently used record
 * goes when the store is full. 0 on OOM. */
int twk_stab_record(twk_stab *s, const char *tenant, const char *session, const char *seq_id, const twk_stab_seq *q);

typedef enum twk_stab_found { TWK_STAB_OK, TWK_STAB_UNKNOWN, TWK_STAB_EXPIRED, TWK_STAB_OTHER_SESSION } twk_stab_found;

/* Looks up seq_id for (tenant, session) and copies what the caller needs
 * while the store is locked: out_tokens / out_lp get [offset, offset + len)
 * of the prompt (sampled = 0) or of the sampled tokens and their logprobs
 * (sampled = 1; out_lp NULL for prompts). A found record's day restarts.
 * *avail gets the length of that part. Returns why it failed: unknown (or
 * another tenant's), expired, or another session's (*other gets its session). */
twk_stab_found twk_stab_get(twk_stab *s, const char *tenant, const char *session, const char *seq_id, int sampled,
                            int64_t offset, int64_t len, int32_t *out_tokens, float *out_lp, int64_t *avail,
                            char *other, size_t other_len);

#endif
