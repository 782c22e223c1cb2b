/* Private to train/: the loaded tokenizer shared by tokenizer.c (loading, decoding) and
 * tokenizer_encode.c (normalizers, pre-tokenizers, BPE encoding, post-processing). */
#ifndef TWK_TRAIN_TOKENIZER_IMPL_H
#define TWK_TRAIN_TOKENIZER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "twinkle/tokenizer.h"

/* tokenizer_encode.c's state (pre-tokenizer, merges, post-processor, cache) and
 * tokenizer_norm.c's normalizer. */
typedef struct tok_enc tok_enc;
typedef struct tok_norm tok_norm;

enum { DEC_REPLACE, DEC_BYTE_FALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE, DEC_BYTE_LEVEL };

typedef struct {
    int kind;
    size_t a_off, a_len; /* Replace: pattern; Strip: content char; Metaspace: replacement char */
    size_t b_off, b_len; /* Replace: content */
    size_t start, stop;  /* Strip */
    int never;           /* Metaspace: prepend_scheme "never" (the first token keeps its spaces) */
} dec_step;

/* One id. The decoder sees `dec` (added token's normalized content, or its content, or
 * the model's string); `model` is the vocab's own string (for encode). */
typedef struct {
    size_t dec_off, model_off, norm_off;
    uint32_t dec_len, model_len, norm_len;
    int32_t added; /* index into added[], or -1 */
    uint8_t flags;
} tok_entry;

enum { ENT_MODEL = 1, ENT_NORM = 2, ENT_SKIP = 4 };

/* An added token as the library holds it after loading (AddedVocabulary). */
typedef struct {
    size_t off;
    uint32_t len;
    int32_t id;
    uint8_t special, normalized, single_word, lstrip, rstrip;
    uint8_t in_special_set; /* the library's special_tokens_set only ever grows */
} tok_added;

typedef struct {
    int32_t *slot; /* -1 empty, else an id (model table) or an added index */
    size_t mask;
} htab;

struct twk_tokenizer {
    char *arena; /* every string, at offsets */
    size_t arena_len, arena_cap;
    int32_t size;    /* max id + 1 */
    tok_entry *ent;  /* [size] */
    int32_t n_model; /* entries in model.vocab (the library's model.get_vocab_size()) */
    htab vocab;      /* model string -> id */
    tok_added *added;
    int32_t n_added, cap_added;
    htab added_tab;  /* added content -> index in added[] */
    int has_decoder; /* 0: tokens joined with " " */
    dec_step *dec;
    int n_dec, cap_dec;
    tok_norm *norm;             /* the normalizer (NULL: none) */
    twk_status norm_err;        /* the normalizer's parse error (norm is NULL) */
    char *norm_msg;             /* its message */
    tok_enc *enc;               /* everything else encode needs */
};


typedef struct {
    char *b;
    size_t len, cap;
} buf_t;


/* Growable bytes (always NUL-terminated); 0 when out of memory. */
int twk_tok_buf_reserve(buf_t *b, size_t extra);
int twk_tok_buf_add(buf_t *b, const void *p, size_t n);
/* Room for element n of the array *pv (a pointer to the array pointer; capacity *cap, elements
 * of `size` bytes), doubling it when full; 0 when out of memory. */
int twk_tok_grow(void *pv, size_t n, size_t *cap, size_t size);
/* A short printable, escaped form of s for messages. */
const char *twk_tok_qs(const char *s, size_t n, char *out, size_t cap);
int twk_tok_get_int(const cJSON *v, double lo, double hi, double *out);
int twk_tok_opt_bool(const cJSON *o, const char *k, int def);
const char *twk_tok_type_of(const cJSON *o);
int32_t twk_tok_model_find(const twk_tokenizer *t, const char *s, size_t n);
int32_t twk_tok_added_find(const twk_tokenizer *t, const char *s, size_t n);
int twk_tok_put_utf8(uint32_t cp, char *o);
int twk_tok_utf8_len(const unsigned char *s, size_t n, uint32_t *cp);
extern uint16_t twk_tok_byte_char[256];

/* Parses a "normalizer" (NULL or JSON null: none); errors name the file and the type. */
twk_status twk_tok_norm_parse(const char *path, const cJSON *j, tok_norm **out);
/* Runs the normalizer over b in place; on failure the message names `what`. */
twk_status twk_tok_norm_apply(const tok_norm *n, buf_t *b, const char *what);
void twk_tok_norm_free(tok_norm *n);

/* Reads the encoder's parts of the file (model merges and options, pre_tokenizer,
 * post_processor); a failure is kept in t->enc and reported by twk_tokenizer_encode. */
void twk_tok_enc_load(twk_tokenizer *t, const char *path, const cJSON *j);
void twk_tok_enc_free(tok_enc *e);
/* Marks encode unsupported with this message (the first failure is kept; decode still works). */
void twk_tok_enc_fail(twk_tokenizer *t, twk_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Whether encode works so far (no failure kept); 0 also when t->enc is NULL. */
int twk_tok_enc_usable(const twk_tokenizer *t);
/* Replaces the ids add_special puts around the sequence; 0 when out of memory (nothing changed). */
int twk_tok_enc_set_frame(twk_tokenizer *t, const int32_t *prefix, int n_prefix, const int32_t *suffix, int n_suffix);
/* Applies the folder's tokenizer_config.json to the post-processing as transformers 4.x does
 * (tokenizer_config.c); `file` is the tokenizer.json that was loaded. Failures are kept as encode's. */
void twk_tok_enc_config(twk_tokenizer *t, const char *file);

#endif
