/* fuzz_hf_config — train/hf_config.c: the input is a config.json (and, after
 * a NUL byte if there is one, a generation_config.json); a parsed config's
 * RoPE frequencies are computed. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "hf_config.h"

static volatile float sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t n1 = nul ? (size_t)(nul - data) : size;
    char cfg_path[512];
    snprintf(cfg_path, sizeof cfg_path, "%s", twk_fuzz_file("config.json", data, n1));
    twk_model_config c;
    memset(&c, 0, sizeof c);
    if (twk_hf_config_load(cfg_path, &c) != TWK_OK) return 0;
    if (nul) {
        const char *gen = twk_fuzz_file("generation_config.json", nul + 1, size - n1 - 1);
        twk_hf_generation_eos(gen, &c);
    }
    if (c.head_dim > 0 && c.head_dim <= 4096) {
        float *f = malloc((size_t)c.head_dim / 2 * sizeof *f + sizeof *f);
        twk_rope_inv_freq(&c, 0, f);
        twk_rope_inv_freq(&c, 1, f);
        sink = c.head_dim >= 2 ? f[0] : 0;
        free(f);
    }
    return 0;
}
