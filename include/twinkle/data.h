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
/* What to do with a sequence longer than the context (max_targets). */
typedef enum twk_overflow {
    TWK_OVERFLOW_TRUNCATE = 0, /* keep its first max_targets targets */
    TWK_OVERFLOW_SPLIT = 1     /* cut it into pieces of <= max_targets targets (each piece starts
                                  with the token that ends the previous one); preference pairs
                                  are always truncated */
} twk_overflow;

/* How text lines become tokens (see twk_dataset_load). */
typedef struct twk_data_opts {
    int vocab;               /* every id must be < vocab */
    const char *model_dir;   /* its tokenizer.json (text lines) and tokenizer_config.json (messages) */
    int train_on;            /* twk_train_on of chat.h for "messages" lines (default 1: assistant) */
    int64_t max_targets;     /* the context: longest sequence in targets; 0 = no limit */
    twk_overflow overflow;
} twk_data_opts;

/* What loading did to the lines (printed by `twinkle train`: nothing is dropped silently). */
typedef struct twk_data_counts {
    int64_t lines;     /* non-blank lines read */
    int64_t truncated; /* sequences cut to max_targets */
    int64_t split;     /* sequences split into pieces (pieces made: the examples count) */
    int64_t dropped;   /* text lines without a trained token or shorter than 2 tokens */
} twk_data_counts;

/* Reads JSONL where each line is one of:
 *   {"tokens": [...], "weights": [...]}       token ids, as twk_dataset_load_jsonl;
 *   {"text": "..."}                            pre-training: encoded with add_special (the ids of
 *                                               transformers' tokenizer(text), bos / eos as the
 *                                               post-processor or tokenizer_config.json's
 *                                               add_bos_token / add_eos_token say: twk_tokenizer_load),
 *                                               every target weighted;
 *   {"prompt": "...", "completion": "..."}     each encoded without add_special, framed as
 *                                               tokenizer(prompt + completion) is: what add_special
 *                                               puts before a text goes before the prompt, what it
 *                                               puts after one (an eos) after the completion;
 *                                               weight on the completion and that suffix only;
 *   {"messages": [...], "tools": [...]?}        rendered with the model's chat template, encoded
 *                                               without add_special; a token is trained when all its
 *                                               bytes lie in twk_chat_render_mask's mask (train_on);
 *   {"chosen": X, "rejected": Y, "prompt": P?}  a preference pair (two examples, chosen first): X, Y
 *                                               strings (P a string prompt, untrained; framed as
 *                                               prompt + completion) or message
 *                                               lists (P an optional list of messages before them;
 *                                               the last assistant turn is trained).
 * No end-of-sequence token is appended beyond what add_special adds. Errors name path:line and the field; a missing
 * tokenizer.json / tokenizer_config.json is TWK_ERR_IO naming the file. Text lines that end up
 * with fewer than 2 tokens or no trained token are dropped and counted (twk_dataset_counts). */
twk_status twk_dataset_load(const char *path, const twk_data_opts *opts, twk_dataset **out);
/* The counts of the load that made d (zeros for NULL). */
twk_data_counts twk_dataset_counts(const twk_dataset *d);

/* A new dataset holding examples idx[i] of parts[part[i]] for i < n, in that order (the parts'
 * storage is copied; an example may repeat). Its counts are the parts' summed. TWK_ERR_OOM,
 * TWK_ERR_INVALID_ARG for an index out of range or n == 0. */
twk_status twk_dataset_gather(const twk_dataset *const *parts, int n_parts, const int *part, const int64_t *idx,
                              int64_t n, twk_dataset **out);

/* Mixes datasets by weight: an epoch of the result holds as many groups (of `group` examples) as the
 * parts together; part i fills weights[i] / sum(weights) of it (rounded, >= 1 when its weight is > 0),
 * its groups taken in a seeded random order, repeating when it is upsampled. Errors as gather, or
 * TWK_ERR_INVALID_ARG when a part's count is not a multiple of group. */
twk_status twk_dataset_mix(const twk_dataset *const *parts, const double *weights, int n_parts, int group,
                           uint64_t seed, twk_dataset **out);

/* Splits d into a training and an evaluation set: a seeded random fraction of its groups (of `group`
 * examples; at least one, never all) goes to *eval. TWK_ERR_INVALID_ARG when d has fewer than 2
 * groups or its count is not a multiple of group. */
twk_status twk_dataset_split(const twk_dataset *d, double fraction, int group, uint64_t seed, twk_dataset **train,
                             twk_dataset **eval);

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
    /* order: set before the first pack. shuffle: each epoch (cursor / count) visits the examples
     * (the groups) in a permutation drawn from (seed, epoch), so a run resumed by replaying
     * its packs sees the same order. */
    int shuffle;
    uint64_t seed;
    int64_t *perm, perm_epoch, perm_n;
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
