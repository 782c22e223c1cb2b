/* Private to train/: the pre-tokenizer split regexes of byte-level BPE tokenizers, matched by
 * hand-written code (tokenizer_pretok.c) with the semantics of the Oniguruma regexes the
 * `tokenizers` library runs. */
#ifndef TWK_TRAIN_TOKENIZER_PRETOK_H
#define TWK_TRAIN_TOKENIZER_PRETOK_H

#include <stddef.h>

enum { TWK_RX_GPT2, TWK_RX_LLAMA3, TWK_RX_QWEN2, TWK_RX_COUNT };

/* The regex kind whose pattern is exactly `pattern`, or -1. */
int twk_rx_kind(const char *pattern);
/* End of the match of regex `kind` at s[i..n) (valid UTF-8), or i when none. */
size_t twk_rx_match(int kind, const char *s, size_t n, size_t i);

#endif
