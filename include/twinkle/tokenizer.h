/* Hugging Face tokenizer.json: text -> token ids (encode) and token ids -> UTF-8 bytes (decode,
 * also for matching stop strings).
 *
 * Supported: model "BPE" (its vocab), `added_tokens`, and the decoders
 * ByteLevel (Llama 3, Qwen2, Qwen3, GPT-2), Sequence, Replace (String patterns),
 * ByteFallback, Fuse, Strip (Llama 2, Mistral), Metaspace, or no decoder.
 * Anything else (WordPiece, Unigram, WordLevel, BPEDecoder, CTC, regex patterns, ...)
 * is TWK_ERR_UNSUPPORTED naming the type. Decoding follows the `tokenizers` library
 * (0.23), TokenizerImpl::decode, step for step:
 *   - the id of an added token decodes to its content; an added token with
 *     "normalized": true and a normalizer decodes to its normalized content, and it
 *     goes through the decoder like any other token (so under ByteLevel its
 *     characters are mapped to bytes: ASCII content comes out unchanged);
 *   - the added tokens' ids are the ones the library assigns (their vocab id when
 *     the content is in the model's vocab, else the next id from the vocab's size); a
 *     file whose "id" disagrees is refused, so twinkle never decodes an id the way the
 *     library would not;
 *   - skip_special drops the tokens whose decoded string is the content of an added
 *     token marked "special".
 * One difference, on purpose: the library turns bytes that are not valid UTF-8 into
 * U+FFFD (ByteLevel: per maximal invalid subpart of the decoded text; ByteFallback: one
 * per byte of a <0xNN> run that is not valid UTF-8). twinkle returns the raw bytes, so
 * a stop string can be found across tokens that each hold part of a character, and
 * the caller decides what to do with a partial character. Where the library's output
 * is valid UTF-8, twinkle's bytes are identical to it.
 *
 * Thread-safety: a loaded twk_tokenizer does not change (encode's word cache is guarded
 * by a lock); any number of threads may use it at once. */
#ifndef TWK_TOKENIZER_H
#define TWK_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "twinkle/export.h"
#include "twinkle/status.h"

#ifdef __cplusplus
extern "C" {
#endif
TWK_API_BEGIN

typedef struct twk_tokenizer twk_tokenizer;

/* Loads DIR/tokenizer.json when `path` is a directory, else the file `path`; the folder's
 * tokenizer_config.json (with special_tokens_map.json and config.json) then sets the ids
 * add_special adds, as transformers 4.x's AutoTokenizer.from_pretrained(folder): for the
 * Llama family of tokenizer classes (Llama, CodeLlama, Gemma, Cohere, GPT-NeoX) add_bos_token /
 * add_eos_token replace the post-processor with "[bos] $A [eos]"; other classes keep the
 * post-processor (train/tokenizer_config.c has the details). A bad field there is an encode
 * error naming the file and the field; loading and decode still work. Errors name
 * the file and what is wrong or unsupported: TWK_ERR_IO (unreadable), TWK_ERR_INVALID_ARG
 * (bad JSON, not UTF-8, wrong field types, ids out of range or duplicated, an added
 * token's "id" not the one the library assigns), TWK_ERR_UNSUPPORTED (model or decoder
 * type, regex patterns, a normalized added token under a normalizer not implemented
 * here, a NUL character in a string), TWK_ERR_OOM. */
twk_status twk_tokenizer_load(const char *path, twk_tokenizer **out);
void twk_tokenizer_free(twk_tokenizer *t);

/* Number of ids the tokenizer knows (model vocab + added tokens; the max id + 1). */
int32_t twk_tokenizer_size(const twk_tokenizer *t);

/* The id of the token whose string is exactly s[0..len) (an added token's content first,
 * then the model vocab's raw string, e.g. "Ġthe" or "▁the"), or -1. */
int32_t twk_tokenizer_token_id(const twk_tokenizer *t, const char *s, size_t len);

/* Whether `id` is dropped by decode with skip_special (see above). */
bool twk_tokenizer_is_special(const twk_tokenizer *t, int32_t id);

/* UTF-8 bytes of the decoded ids (free with twk_host_free; NUL-terminated; *len without the NUL; the
 * bytes may contain NUL and, for ids that split a character, invalid UTF-8). Ids without
 * a token (holes, negative, or >= size) are TWK_ERR_INVALID_ARG naming the position.
 * skip_special: drop added tokens marked special. `len` may be NULL. */
twk_status twk_tokenizer_decode(const twk_tokenizer *t, const int32_t *ids, int64_t n, bool skip_special, char **out,
                                size_t *len);

/* Encodes text[0..len) to ids as the `tokenizers` library's (0.23)
 * Tokenizer.encode(text, add_special_tokens=add_special).ids. The text is bytes: every
 * ill-formed UTF-8 sequence is first replaced by U+FFFD, one per maximal subpart (as Python's
 * bytes.decode("utf-8", "replace")). Supported: model BPE (byte_fallback, unk_token, fuse_unk,
 * ignore_merges); normalizers NFC, NFD, NFKC, NFKD, Prepend, Replace (String), Strip,
 * ByteLevel, Sequence (Lowercase, StripAccents on ASCII text); pre-tokenizers Split with the
 * GPT-2, Llama 3 or Qwen2 regex (behavior Isolated), ByteLevel, Metaspace, Sequence; added
 * tokens with their special / normalized / single_word / lstrip / rstrip flags; post-processors
 * TemplateProcessing (the "single" template), BertProcessing, RobertaProcessing, ByteLevel,
 * Sequence, or the template tokenizer_config.json makes (see twk_tokenizer_load; applied when
 * add_special). *ids (free with twk_host_free; never NULL on success), *n its
 * count. Errors: TWK_ERR_UNSUPPORTED naming the part of the file the encoder lacks (decode
 * still works for such files), TWK_ERR_INVALID_ARG (NULL arguments, an unk_token missing from
 * the vocab, text longer than 1 GiB), TWK_ERR_OOM. */
twk_status twk_tokenizer_encode(const twk_tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ids,
                                int64_t *n);

/* The ids add_special puts before (*prefix, *n_prefix) and after (*suffix, *n_suffix) the text:
 * encode(x, true) == prefix + encode(x, false) + suffix. The arrays belong to t (NULL when the
 * count is 0). Fails as twk_tokenizer_encode does when t cannot encode (the same error), and
 * with TWK_ERR_INVALID_ARG for a NULL argument. */
twk_status twk_tokenizer_special_ids(const twk_tokenizer *t, const int32_t **prefix, int *n_prefix,
                                     const int32_t **suffix, int *n_suffix);

/* The bytes token `id` contributes when decoded after other tokens, for incremental
 * stop-string matching: writes min(cap, count) bytes to buf (no NUL) and returns count,
 * the token's full length (like snprintf: a count > cap means buf holds a prefix;
 * buf may be NULL when cap is 0), or -1 for an id without a token.
 *
 * decode(ids) == decode(ids[0..1)) + token_bytes(ids[1]) + ... + token_bytes(ids[n-1])
 * (with the special ids that skip_special drops removed first) holds for every decoder
 * here, so only the first token of a decode is special, and that is the caller's concern:
 *   - ByteLevel (Llama 3, Qwen2/3, GPT-2): nothing special; the decode is the sum of
 *     every token_bytes, ids[0] included.
 *   - Llama 2 / Mistral (Replace "▁"->" ", ByteFallback, Fuse, Strip(" ", 1, 0)): the
 *     decode drops one leading space of the whole text, so the first token "▁Hello"
 *     decodes to "Hello" where token_bytes gives " Hello" (were the first token empty,
 *     the space would come off the next one: a vocab holds no empty token in practice).
 *   - Metaspace decoder (prepend_scheme "always"/"first"): the first token loses every
 *     "▁" instead of having them turned into spaces.
 *   - no decoder: the library joins tokens with " "; token_bytes starts with that " ".
 * A Strip with stop > 0 after Fuse (no known tokenizer has one) also cuts the end of
 * the last token, which token_bytes cannot know about and does not do. */
int twk_tokenizer_token_bytes(const twk_tokenizer *t, int32_t id, char *buf, int cap);

TWK_API_END
#ifdef __cplusplus
}
#endif
#endif
