/* Reading tests/tokenizer/corpus.bin.gz and <fixture>/expected_ids.bin.gz (formats in
 * make_encode_fixtures.py), shared by tests/test_tokenizer.c and bench/tokenize.c. */
#ifndef TWK_TESTS_TOKENIZER_CORPUS_H
#define TWK_TESTS_TOKENIZER_CORPUS_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *data;      /* every record, one after another */
    size_t *off;     /* record i is data[off[i] .. off[i + 1]) */
    uint8_t *flags;  /* expected ids: bit 0 = the library round-trips the record */
    int32_t **ids;   /* expected ids: per record */
    int64_t *n_ids;
    int64_t n;       /* records */
    size_t bytes;    /* corpus: total size */
} tk_corpus;

/* Reads the corpus (0 on success; -1 with a message on stderr). */
int tk_corpus_read(const char *path, tk_corpus *c);
/* Reads expected ids for the corpus c (ids, n_ids, flags); 0 on success. */
int tk_expected_read(const char *path, tk_corpus *c);
void tk_corpus_free(tk_corpus *c);

#endif
