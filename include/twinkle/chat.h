/* Chat templates: a model's `chat_template` (tokenizer_config.json) rendered as transformers'
 * apply_chat_template(..., tokenize=False) renders it, and the loss mask of a rendered conversation.
 *
 * The template language is the Jinja2 subset that the Qwen2.5, Qwen3, Llama 3.x and Mistral
 * templates use, in transformers' environment (trim_blocks, lstrip_blocks, loop controls,
 * {% generation %}, raise_exception, namespace, strftime_now, tojson as json.dumps). A construct
 * outside the subset is TWK_ERR_UNSUPPORTED naming the template line, never a different prompt.
 *
 * Thread-safety: a twk_chat_template is immutable once made; any number of threads may render
 * with it at once. */
#ifndef TWINKLE_CHAT_H
#define TWINKLE_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "twinkle/export.h"
#include "twinkle/status.h"

#ifdef __cplusplus
extern "C" {
#endif
TWK_API_BEGIN

typedef struct twk_chat_template twk_chat_template;

/* Which bytes of a rendered conversation carry loss weight. */
typedef enum twk_train_on {
    TWK_TRAIN_ON_ALL = 0,       /* every byte */
    TWK_TRAIN_ON_ASSISTANT = 1, /* every assistant turn (the default) */
    TWK_TRAIN_ON_LAST = 2       /* the last assistant turn only */
} twk_train_on;

/* "all" | "assistant" | "last"; TWK_ERR_INVALID_ARG naming the value otherwise. */
twk_status twk_train_on_parse(const char *s, twk_train_on *out);

/* Loads `chat_template` and the named special tokens (bos_token, eos_token, unk_token, sep_token,
 * pad_token, cls_token, mask_token: transformers' special_tokens_map, given to the template) from
 * DIR/tokenizer_config.json (or the file `path`). A list of named templates takes the one named
 * "default". Errors: TWK_ERR_IO,
 * TWK_ERR_NOT_FOUND (no chat_template), TWK_ERR_INVALID_ARG / TWK_ERR_UNSUPPORTED (the template,
 * naming its line), TWK_ERR_OOM. */
twk_status twk_chat_template_load(const char *path, twk_chat_template **out);

/* A template from its source; bos_token / eos_token may be NULL (then undefined in the template). */
twk_status twk_chat_template_new(const char *source, const char *bos_token, const char *eos_token,
                                 twk_chat_template **out);
void twk_chat_template_free(twk_chat_template *t);

/* Renders a request: a JSON object with "messages" (required), optional "tools", optional
 * "add_generation_prompt" (default false), and any other key passed to the template as a
 * variable (enable_thinking, date_string, ...), as apply_chat_template's keyword arguments.
 * Messages are normalized as transformers does (keys whose value is null are dropped; the
 * reasoning under reasoning_content / thinking / reasoning is given under both reasoning_content
 * and thinking). *out (free with twk_host_free) is NUL-terminated; *len (may be NULL) excludes the NUL.
 * Errors: TWK_ERR_INVALID_ARG (bad JSON naming the offset or field, raise_exception's message,
 * a runtime error naming the template line), TWK_ERR_UNSUPPORTED (naming the line), TWK_ERR_OOM. */
twk_status twk_chat_render(const twk_chat_template *t, const char *request_json, char **out, size_t *len);

/* Renders like twk_chat_render and gives a mask of *len bytes (free with twk_host_free): 1 where the byte carries
 * loss weight under `mode`. Assistant spans are the template's {% generation %} blocks when it
 * has any; otherwise, for each assistant message, the bytes its loop iteration wrote, less the
 * leading part shared with the generation prompt (the header, e.g. "<|im_start|>assistant\n";
 * short of the whole prompt, cut back to its last newline),
 * ending after the last eos_token in them (the end-of-turn token; what follows, e.g. "\n", is
 * not trained). See train/README.md. Errors as twk_chat_render. */
twk_status twk_chat_render_mask(const twk_chat_template *t, const char *request_json, twk_train_on mode, char **out,
                                size_t *len, uint8_t **mask);

TWK_API_END
#ifdef __cplusplus
}
#endif
#endif
