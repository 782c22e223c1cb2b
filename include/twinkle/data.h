/* twinkle — token data: packed batches and JSONL datasets.
 *
 * Thread-safety: a loaded twk_dataset is read-only (packing takes the cursor
 * from the caller), so several threads may pack from one dataset at once; a
 * twk_packed belongs to one thread at a time. */
#ifndef TWINKLE_DATA_H
#define TWINKLE_DATA_H

#include <stdint.h>

#include "twinkle/export.h"
#include "twinkle/status.h"

#ifdef __cplusplus
extern "C" {
#endif
TWK_API_BEGIN

/* A packed batch: n tokens of several sequences laid end to end. */
typedef struct twk_batch {
    int64_t n;
    const int32_t *tokens, *targets, *positions, *seg_start;
    const float *weights; /* loss = -sum(weights * logprobs) */
} twk_batch;

/* ---- token data: JSONL, one {"tokens": [...], "weights": [...]} per line ----
 * RL rollouts add "advantages" (one number for the sequence, or one per token
 * or per target) and "logprobs" (the sampler's, per token or per target). */

typedef struct twk_dataset twk_dataset;

/* Reads a JSONL file of examples. "tokens" (>= 2 ids, each < vocab) is
 * required; "weights" is optional (default 1): either one per token (the
 * first is then unused: nothing predicts token 0) or one per target
 * (len(tokens) - 1). Errors name the line and field. */
twk_status twk_dataset_load_jsonl(const char *path, int vocab, twk_dataset **out);
void twk_dataset_free(twk_dataset *d);
int64_t twk_dataset_count(const twk_dataset *d);
/* Total target tokens (sum of len(tokens) - 1). */
int64_t twk_dataset_tokens(const twk_dataset *d);
/* TWK_OK when every line has float field `field` ("advantages", "logprobs"); else
 * TWK_ERR_INVALID_ARG naming path, the first line without it and `why` needs it. */
twk_status twk_dataset_require(const twk_dataset *d, const char *field, const char *path, const char *why);
/* Target tokens of the longest example. */
int64_t twk_dataset_max_targets(const twk_dataset *d);

/* A packed batch that owns its arrays (see twk_batch). */
typedef struct twk_packed {
    twk_batch batch;
    const float *advantages;       /* per token of the batch; NaN where the line had none */
    const float *sampler_logprobs; /* per token; NaN where the line had none */
    int n_seqs;
    int32_t *buf_i32;
    float *buf_f32;
    int64_t cap;
} twk_packed;

/* Packs whole examples from *cursor on (wrapping to the start: epochs) until
 * the next would exceed `budget` tokens; advances *cursor. An example longer
 * than the budget is TWK_ERR_INVALID_ARG naming it. */
twk_status twk_dataset_pack(const twk_dataset *d, int64_t budget, int64_t *cursor, twk_packed *out);
/* The same, packing whole groups of `group` consecutive examples (pairs for
 * DPO); *cursor stays a multiple of group. TWK_ERR_INVALID_ARG when the count
 * is not a multiple of group or a group exceeds the budget. */
twk_status twk_dataset_pack_groups(const twk_dataset *d, int64_t budget, int group, int64_t *cursor, twk_packed *out);
void twk_packed_free(twk_packed *p);

TWK_API_END
#ifdef __cplusplus
}
#endif
#endif
