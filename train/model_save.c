/* Writing a model as a Hugging Face folder: config.json in the classic
 * (rope_theta / rope_scaling) form and one f32 model.safetensors (the dense
 * families: the built-in default model is a Qwen3). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cJSON.h>

#include "safetensors.h"
#include "trainer_internal.h"
#include "json_push.h"

static const char *model_type(twk_arch a) {
    return a == TWK_ARCH_LLAMA ? "llama" : a == TWK_ARCH_QWEN2 ? "qwen2" : "qwen3";
}

static char *config_json(const twk_model_config *c) {
    cJSON *j = cJSON_CreateObject();
    cJSON *archs = cJSON_AddArrayToObject(j, "architectures");
    const char *arch = c->arch == TWK_ARCH_LLAMA ? "LlamaForCausalLM" : c->arch == TWK_ARCH_QWEN2 ? "Qwen2ForCausalLM"
                                                                                                  : "Qwen3ForCausalLM";
    twk_json_push(archs, cJSON_CreateString(arch));
    cJSON_AddStringToObject(j, "model_type", model_type(c->arch));
    cJSON_AddNumberToObject(j, "vocab_size", c->vocab);
    cJSON_AddNumberToObject(j, "hidden_size", c->hidden);
    cJSON_AddNumberToObject(j, "intermediate_size", c->ffn);
    cJSON_AddNumberToObject(j, "num_hidden_layers", c->layers);
    cJSON_AddNumberToObject(j, "num_attention_heads", c->heads);
    cJSON_AddNumberToObject(j, "num_key_value_heads", c->kv_heads);
    cJSON_AddNumberToObject(j, "head_dim", c->head_dim);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddNumberToObject(j, "max_position_embeddings", c->max_positions);
    cJSON_AddNumberToObject(j, "rms_norm_eps", c->rms_eps);
    cJSON_AddNumberToObject(j, "rope_theta", c->rope_theta);
    if (c->rope_type == TWK_ROPE_LLAMA3) {
        cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
        cJSON_AddNumberToObject(rs, "factor", c->rope_factor);
        cJSON_AddNumberToObject(rs, "low_freq_factor", c->rope_low_freq_factor);
        cJSON_AddNumberToObject(rs, "high_freq_factor", c->rope_high_freq_factor);
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", c->rope_original_max_pos);
    } else {
        cJSON_AddNullToObject(j, "rope_scaling");
    }
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tie_embeddings);
    if (c->arch == TWK_ARCH_LLAMA) cJSON_AddBoolToObject(j, "attention_bias", c->attn_bias);
    if (c->arch == TWK_ARCH_QWEN3) cJSON_AddBoolToObject(j, "attention_bias", 0);
    if (c->n_eos == 1) cJSON_AddNumberToObject(j, "eos_token_id", c->eos[0]);
    else if (c->n_eos > 1) {
        cJSON *e = cJSON_AddArrayToObject(j, "eos_token_id");
        for (int i = 0; i < c->n_eos; i++) twk_json_push(e, cJSON_CreateNumber(c->eos[i]));
    }
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    return s;
}

twk_status twk_model_save(const twk_model *m, const char *dir) {
    if (!m || !dir) return twk_error(TWK_ERR_INVALID_ARG, "model_save: NULL argument");
    if (m->cfg.arch != TWK_ARCH_LLAMA && m->cfg.arch != TWK_ARCH_QWEN2 && m->cfg.arch != TWK_ARCH_QWEN3)
        return twk_error(TWK_ERR_UNSUPPORTED, "model_save: writes Llama / Qwen2 / Qwen3 configs only, not %s",
                         m->cfg.arch_name);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return twk_error(TWK_ERR_IO, "model_save: cannot create %s: %s", dir, strerror(errno));
    twk_st_entry *e = twk_host_calloc((size_t)m->n_w * sizeof *e, "model entries");
    void **d = twk_host_calloc((size_t)m->n_w * sizeof *d, "model data");
    twk_status st = e && d ? TWK_OK : twk_error(TWK_ERR_OOM, "model_save: out of memory");
    for (int i = 0; st == TWK_OK && i < m->n_w; i++) {
        const named_buf *w = &m->w[i];
        d[i] = twk_host_alloc(nb_bytes(w), w->name);
        if (!d[i]) st = twk_error(TWK_ERR_OOM, "model_save: out of memory");
        else st = twk_buffer_download(m->dev, w->buf, 0, d[i], nb_bytes(w));
        twk_st_dtype sd = w->dtype == TWK_BF16 ? TWK_ST_BF16 : w->dtype == TWK_F16 ? TWK_ST_F16 : TWK_ST_F32;
        e[i] = (twk_st_entry){w->name, sd, w->ndim, {w->ne[0], w->ne[1]}, d[i]}; /* as held */
    }
    char path[4200];
    if (st == TWK_OK) {
        const char *meta[2] = {"format", "pt"};
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        st = twk_st_write(path, e, m->n_w, meta, 1);
    }
    if (st == TWK_OK) {
        char *cfg = config_json(&m->cfg);
        snprintf(path, sizeof path, "%s/config.json", dir);
        st = cfg ? twk_write_file_atomic(path, cfg, strlen(cfg)) : twk_error(TWK_ERR_OOM, "model_save: out of memory");
        cJSON_free(cfg);
    }
    for (int i = 0; d && i < m->n_w; i++) twk_host_free(d[i]);
    twk_host_free(d);
    twk_host_free(e);
    return st;
}
