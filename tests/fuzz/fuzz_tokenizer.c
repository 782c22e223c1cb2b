/* fuzz_tokenizer — train/tokenizer.c: the input is a tokenizer.json; a loaded
 * tokenizer decodes every id below 256 one by one and all together, gives
 * each one's bytes for stop matching, and looks its string up again. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "twinkle/hal.h"
#include "twinkle/tokenizer.h"

static volatile size_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = twk_fuzz_file("tokenizer.json", data, size);
    twk_tokenizer *t = NULL;
    if (twk_tokenizer_load(path, &t) != TWK_OK) {
        if (t) abort();
        return 0;
    }
    int32_t n = twk_tokenizer_size(t);
    int32_t ids[256];
    int m = 0;
    char buf[64];
    for (int32_t id = -1; id < n && id < 256; id++) {
        int k = twk_tokenizer_token_bytes(t, id, buf, (int)sizeof buf);
        if (k < 0) continue;
        ids[m++] = id;
        char *s = NULL;
        size_t len = 0;
        if (twk_tokenizer_decode(t, &id, 1, id & 1, &s, &len) == TWK_OK) {
            sink += len + (size_t)twk_tokenizer_token_id(t, s, len) + (size_t)twk_tokenizer_is_special(t, id);
            twk_host_free(s);
        }
        if (k > 0 && k <= (int)sizeof buf) sink += (size_t)twk_tokenizer_token_id(t, buf, (size_t)k);
    }
    char *all = NULL;
    size_t len = 0;
    if (twk_tokenizer_decode(t, ids, m, 0, &all, &len) == TWK_OK) {
        sink += len;
        twk_host_free(all);
    }
    twk_tokenizer_free(t);
    return 0;
}
