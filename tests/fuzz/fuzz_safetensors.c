/* fuzz_safetensors — train/safetensors.c: the input is a .safetensors file
 * (8-byte header length, JSON header, data); an opened file's tensors are
 * listed, found by name and converted to f32 where the dtype allows. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "safetensors.h"
#include "twinkle/hal.h"

static volatile float sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = twk_fuzz_file("in.safetensors", data, size);
    twk_safetensors *st = NULL;
    if (twk_st_open(path, &st) != TWK_OK) {
        if (st) abort();
        return 0;
    }
    for (int i = 0; i < twk_st_count(st); i++) {
        const twk_st_tensor *t = twk_st_at(st, i);
        if (twk_st_find(st, t->name) == NULL) abort();
        if (t->nelem > 0 && t->nelem <= (1 << 20)) {
            float *f = malloc((size_t)t->nelem * sizeof *f);
            if (f && twk_st_to_f32(t, f) == TWK_OK) sink = f[0] + f[t->nelem - 1];
            free(f);
        }
        if (t->bytes) sink = (float)(t->data[0] + t->data[t->bytes - 1]);
    }
    twk_st_close(st);
    return 0;
}
