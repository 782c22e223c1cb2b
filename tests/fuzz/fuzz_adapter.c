/* fuzz_adapter — train/adapter_io.c: the input is a PEFT adapter folder,
 * adapter_config.json then (after the first NUL byte) adapter_model.safetensors,
 * loaded into a LoRA trainer (rank 4, alpha 32, attention + MLP) of a tiny
 * random Qwen3-architecture model made once. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_util.h"
#include "twinkle/twinkle.h"

static twk_trainer *trainer;

static void setup(void) {
    twk_device *dev = NULL;
    twk_model *m = NULL;
    twk_model_config c = {.arch = TWK_ARCH_QWEN3, .vocab = 64, .hidden = 32, .layers = 1, .heads = 2, .kv_heads = 1,
                          .head_dim = 16, .ffn = 64, .rope_theta = 10000, .rms_eps = 1e-6, .tie_embeddings = 1,
                          .qk_norm = 1, .max_positions = 64, .eos = {1}, .n_eos = 1};
    snprintf(c.arch_name, sizeof c.arch_name, "Qwen3ForCausalLM");
    twk_lora_config lora = twk_lora_default();
    lora.rank = 4;
    if (twk_device_open("cpu", &dev) != TWK_OK || twk_model_random(&c, dev, 7, &m) != TWK_OK ||
        twk_trainer_new(m, &lora, 16, &trainer) != TWK_OK) {
        fprintf(stderr, "fuzz_adapter: setup: %s\n", twk_last_error());
        abort();
    }
    char dir[512];
    snprintf(dir, sizeof dir, "%s/adapter", twk_fuzz_tmpdir());
    mkdir(dir, 0700);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!trainer) setup();
    const uint8_t *nul = memchr(data, 0, size);
    size_t n1 = nul ? (size_t)(nul - data) : size;
    twk_fuzz_file("adapter/adapter_config.json", data, n1);
    twk_fuzz_file("adapter/adapter_model.safetensors", nul ? nul + 1 : data, nul ? size - n1 - 1 : 0);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/adapter", twk_fuzz_tmpdir());
    twk_lora_config lc;
    memset(&lc, 0, sizeof lc);
    twk_adapter_read_config(dir, &lc);
    twk_adapter_load(trainer, dir);
    return 0;
}
