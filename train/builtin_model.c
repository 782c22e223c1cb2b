/* The built-in model twinkle/tiny-qwen3: its config and its random weights. */
#include <stdio.h>

#include "twinkle/model.h"

#define TWK_BUILTIN_MODEL_SEED 20261129

void twk_model_builtin_config(twk_model_config *out) {
    *out = (twk_model_config){.arch = TWK_ARCH_QWEN3, .vocab = 512, .hidden = 128, .layers = 2, .heads = 4,
                              .kv_heads = 2, .head_dim = 32, .ffn = 384, .rope_theta = 10000, .rms_eps = 1e-6,
                              .tie_embeddings = true, .qk_norm = true, .max_positions = 4096, .eos = {1}, .n_eos = 1};
    snprintf(out->arch_name, sizeof out->arch_name, "Qwen3ForCausalLM");
}

twk_status twk_model_builtin(twk_device *dev, twk_model **out) {
    twk_model_config c;
    twk_model_builtin_config(&c);
    return twk_model_random(&c, dev, TWK_BUILTIN_MODEL_SEED, out);
}
