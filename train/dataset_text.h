/* Private to train/dataset*.c: text lines of a JSONL dataset (text, prompt + completion, messages,
 * chosen / rejected) turned into token ids and per-token weights; the seeded permutation. */
#ifndef TWK_DATASET_TEXT_H
#define TWK_DATASET_TEXT_H

#include <cJSON.h>

#include "twinkle/chat.h"
#include "twinkle/data.h"
#include "twinkle/tokenizer.h"

typedef struct twk_text_ctx {
    const twk_data_opts *o;
    twk_tokenizer *tok;      /* loaded at the first text line */
    twk_chat_template *tmpl; /* loaded at the first messages line */
} twk_text_ctx;

/* One sequence: ids and weights (per token; w[0] unused), freed with twk_host_free. */
typedef struct twk_text_seq {
    int32_t *ids;
    float *w;
    int64_t n;
} twk_text_seq;

/* Whether line j has a text field (text, prompt, completion, messages, chosen, rejected). */
int twk_text_is_line(const cJSON *j);

/* Line j as one sequence (*n_seq = 1) or a preference pair (2: chosen, rejected). Errors name
 * path:line and the field; TWK_ERR_IO names a missing tokenizer.json / tokenizer_config.json.
 * On failure nothing stays allocated. */
twk_status twk_text_line(twk_text_ctx *c, const cJSON *j, const char *path, long lineno, twk_text_seq seq[2],
                         int *n_seq);

void twk_text_seq_free(twk_text_seq *s);

/* p[0..n) = a permutation of 0..n-1 drawn from seed (Fisher-Yates; dataset_mix.c). Shuffling,
 * mixing and the eval split all draw their orders here. */
void twk_data_permute(int64_t *p, int64_t n, uint64_t seed);
void twk_text_ctx_free(twk_text_ctx *c);

#endif
