/* Text in, text out for `twinkle sample` and `twinkle chat`: a model folder's tokenizer.json and chat
 * template, prompts from text or a conversation, and the stop tokens of a turn. */
#ifndef TWK_CLI_TEXTGEN_H
#define TWK_CLI_TEXTGEN_H

#include "twinkle/twinkle.h"

typedef struct twk_textgen {
    twk_tokenizer *tok;
    twk_chat_template *tmpl; /* NULL until a conversation needs it */
    const char *model_dir;
    int32_t stop[72];
    int n_stop;
} twk_textgen;

/* The whole file (malloc'd, NUL-terminated), or NULL with TWK_ERR_IO naming it. */
char *twk_read_text_file(const char *path);

/* Loads DIR/tokenizer.json; the stop ids are the model's eos_token_id and tokenizer_config.json's
 * eos_token (as a token). Errors name the missing file. */
twk_status twk_textgen_open(const char *model_dir, const twk_model_config *c, twk_textgen *g);
void twk_textgen_close(twk_textgen *g);

/* The ids of `text` with add_special (the post-processor's or tokenizer_config.json's bos / eos, as
 * transformers' tokenizer(text)). *ids: free with twk_host_free; fails as twk_tokenizer_encode. */
twk_status twk_textgen_encode_text(twk_textgen *g, const char *text, int32_t **ids, int64_t *n);

/* The ids of a conversation (a JSON array of messages, or an object with "messages" and other
 * template variables) rendered with add_generation_prompt. Errors name the field or template line. */
twk_status twk_textgen_encode_chat(twk_textgen *g, const char *json, int32_t **ids, int64_t *n);

/* The text of generated ids, special tokens skipped (free with twk_host_free). Ids the tokenizer has no token for
 * (a model vocabulary larger than the tokenizer's) are left out and counted in *unknown. */
twk_status twk_textgen_decode(twk_textgen *g, const int32_t *ids, int64_t n, char **out, int64_t *unknown);

/* One sampling option of `twinkle sample` / `twinkle chat` (--max-tokens, --temperature, --top-k,
 * --top-p, --seed) parsed into p: 1 when o is one of them (*end as strtol / strtof leave it, so the
 * caller can refuse a value that is not a number), 0 when o is not a sampling option. */
int twk_cli_sample_option(const char *o, const char *v, twk_sample_params *p, char **end);

#endif
