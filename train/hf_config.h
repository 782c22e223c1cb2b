/* Hugging Face config.json for the Llama / Qwen2 / Qwen3 / Mistral / Gemma 2 / Gemma 3 families. */
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

/* RoPE inverse frequencies (head_dim/2 floats) with the config's scaling; local: those of the
 * sliding-window layers (Gemma 3's rope_local_base_freq, unscaled) where the config has them. */
void twk_rope_inv_freq(const twk_model_config *c, int local, float *out);
/* Whether the local layers have RoPE frequencies of their own (Gemma 3). */
int twk_rope_has_local(const twk_model_config *c);
/* The sliding window of layer l (0: the layer attends to the whole sequence). */
int twk_layer_window(const twk_model_config *c, int l);
/* The rows each sequence has in layer l's KV cache in a sampler of max_len tokens: a sliding-window
 * layer whose window is shorter than max_len keeps a ring of `window` rows (position p at row
 * p mod window), every other layer max_len rows. */
int64_t twk_kv_seq_rows(const twk_model_config *c, int l, int64_t max_len);
/* Rows of layer l's cache for max_seqs sequences: a ring layer has one more, shared, where a
 * prompt's positions that have left the window are written (and never read). */
int64_t twk_kv_layer_rows(const twk_model_config *c, int l, int max_seqs, int64_t max_len);
/* Whether layer l's MLP is a mixture of experts (n_experts > 0, (l + 1) % sparse_step == 0, l not
 * in mlp_only_layers), as transformers' Qwen-MoE decoder layers choose; Mixtral: every layer. */
int twk_layer_sparse(const twk_model_config *c, int l);
/* The checkpoint's name of an expert's projection k (0 gate, 1 up, 2 down): gate_proj / up_proj /
 * down_proj, Mixtral's w1 / w3 / w2. */
const char *twk_expert_proj(const twk_model_config *c, int k);

#endif
