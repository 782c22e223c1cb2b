/* Hugging Face config.json for the Llama / Qwen2 / Qwen3 family. */
#ifndef TWK_HF_CONFIG_H
#define TWK_HF_CONFIG_H

#include "twinkle/model.h"

/* Parses `path` (a config.json). Any architecture outside the family, or a
 * field whose value would change the math and is not implemented, is
 * TWK_ERR_UNSUPPORTED naming the field; missing required fields are
 * TWK_ERR_INVALID_ARG naming them. */
twk_status twk_hf_config_load(const char *path, twk_model_config *out);

/* Adds the eos_token_id(s) of a generation_config.json (if the file exists)
 * to c's EOS list, without duplicates. Errors only for a malformed file. */
twk_status twk_hf_generation_eos(const char *path, twk_model_config *c);

/* RoPE inverse frequencies (head_dim/2 floats) with the config's scaling. */
void twk_rope_inv_freq(const twk_model_config *c, float *out);

#endif
