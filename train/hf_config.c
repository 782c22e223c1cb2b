/* config.json for the Llama / Qwen2 / Qwen3 family: every field that changes
 * the math is read or refused by name — never a silently wrong model. */
#include "hf_config.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cJSON.h>

#include "safetensors.h"
#include "twinkle/hal.h"

static int get_int(const cJSON *j, const char *k, int *out, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 1e9 || v->valuedouble != floor(v->valuedouble)) {
        twk_error(TWK_ERR_INVALID_ARG, "%s: field '%s' must be a positive integer", path, k);
        return 0;
    }
    *out = (int)v->valuedouble;
    return 1;
}

static double get_num(const cJSON *j, const char *k, double def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

static int get_bool(const cJSON *j, const char *k, int def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

static twk_status parse(const cJSON *j, const char *path, twk_model_config *c) {
    memset(c, 0, sizeof *c);
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    const char *arch = cJSON_IsString(a0) ? a0->valuestring : NULL;
    if (!arch) return twk_error(TWK_ERR_INVALID_ARG, "%s: no 'architectures' entry", path);
    snprintf(c->arch_name, sizeof c->arch_name, "%s", arch);
    if (!strcmp(arch, "LlamaForCausalLM")) c->arch = TWK_ARCH_LLAMA;
    else if (!strcmp(arch, "Qwen2ForCausalLM")) c->arch = TWK_ARCH_QWEN2;
    else if (!strcmp(arch, "Qwen3ForCausalLM")) c->arch = TWK_ARCH_QWEN3;
    else
        return twk_error(TWK_ERR_UNSUPPORTED,
                         "%s: architecture '%s' is not supported (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)",
                         path, arch);
    (void)mt;
    if (!get_int(j, "vocab_size", &c->vocab, path) || !get_int(j, "hidden_size", &c->hidden, path) ||
        !get_int(j, "num_hidden_layers", &c->layers, path) || !get_int(j, "num_attention_heads", &c->heads, path) ||
        !get_int(j, "intermediate_size", &c->ffn, path))
        return TWK_ERR_INVALID_ARG;
    c->kv_heads = c->heads;
    if (cJSON_GetObjectItemCaseSensitive(j, "num_key_value_heads") && !get_int(j, "num_key_value_heads", &c->kv_heads, path))
        return TWK_ERR_INVALID_ARG;
    if (c->heads % c->kv_heads)
        return twk_error(TWK_ERR_INVALID_ARG, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                         path, c->heads, c->kv_heads);
    c->head_dim = c->hidden / c->heads;
    const cJSON *hd = cJSON_GetObjectItemCaseSensitive(j, "head_dim");
    if (hd && !cJSON_IsNull(hd) && !get_int(j, "head_dim", &c->head_dim, path)) return TWK_ERR_INVALID_ARG;
    if (c->head_dim % 2) return twk_error(TWK_ERR_UNSUPPORTED, "%s: head_dim %d is odd", path, c->head_dim);
    c->rope_theta = get_num(j, "rope_theta", 10000.0);
    c->rms_eps = get_num(j, "rms_norm_eps", 1e-6);
    c->max_positions = 4096;
    const cJSON *mp = cJSON_GetObjectItemCaseSensitive(j, "max_position_embeddings");
    if (mp && !cJSON_IsNull(mp) && !get_int(j, "max_position_embeddings", &c->max_positions, path))
        return TWK_ERR_INVALID_ARG;
    c->tie_embeddings = get_bool(j, "tie_word_embeddings", c->arch == TWK_ARCH_LLAMA ? 0 : 0);
    if (!(c->rope_theta > 0) || !(c->rms_eps >= 0))
        return twk_error(TWK_ERR_INVALID_ARG, "%s: rope_theta and rms_norm_eps must be positive", path);

    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu")))
        return twk_error(TWK_ERR_UNSUPPORTED, "%s: hidden_act '%s' is not supported (silu)", path,
                         cJSON_IsString(act) ? act->valuestring : "?");
    if (get_bool(j, "mlp_bias", 0)) return twk_error(TWK_ERR_UNSUPPORTED, "%s: mlp_bias true is not supported", path);
    double prf = get_num(j, "partial_rotary_factor", 1.0);
    if (prf != 1.0) return twk_error(TWK_ERR_UNSUPPORTED, "%s: partial_rotary_factor %g is not supported", path, prf);
    if (get_bool(j, "use_sliding_window", 0))
        return twk_error(TWK_ERR_UNSUPPORTED, "%s: use_sliding_window true is not supported", path);
    c->attn_bias = c->arch == TWK_ARCH_QWEN2 ? 1 : get_bool(j, "attention_bias", 0);
    c->o_bias = c->arch == TWK_ARCH_QWEN2 ? 0 : c->attn_bias;
    c->qk_norm = c->arch == TWK_ARCH_QWEN3;

    /* transformers >= 5 writes rope_parameters {rope_type, rope_theta, ...};
     * older configs write rope_theta and rope_scaling */
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    if (cJSON_IsObject(rp)) {
        c->rope_theta = get_num(rp, "rope_theta", c->rope_theta);
        if (!(c->rope_theta > 0)) return twk_error(TWK_ERR_INVALID_ARG, "%s: rope_parameters.rope_theta must be > 0", path);
        if (!rs || cJSON_IsNull(rs)) rs = rp;
    }
    c->rope_type = TWK_ROPE_DEFAULT;
    if (rs && !cJSON_IsNull(rs)) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        if (!cJSON_IsString(t)) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
        const char *ts = cJSON_IsString(t) ? t->valuestring : "?";
        if (!strcmp(ts, "default")) {
            c->rope_type = TWK_ROPE_DEFAULT;
        } else if (!strcmp(ts, "llama3")) {
            c->rope_type = TWK_ROPE_LLAMA3;
            c->rope_factor = get_num(rs, "factor", 0);
            c->rope_low_freq_factor = get_num(rs, "low_freq_factor", 0);
            c->rope_high_freq_factor = get_num(rs, "high_freq_factor", 0);
            c->rope_original_max_pos = get_num(rs, "original_max_position_embeddings", 0);
            if (!(c->rope_factor > 0) || !(c->rope_low_freq_factor > 0) ||
                !(c->rope_high_freq_factor > c->rope_low_freq_factor) || !(c->rope_original_max_pos > 0))
                return twk_error(TWK_ERR_INVALID_ARG,
                                 "%s: rope_scaling llama3 needs factor, low_freq_factor < high_freq_factor and "
                                 "original_max_position_embeddings",
                                 path);
        } else {
            return twk_error(TWK_ERR_UNSUPPORTED, "%s: rope_scaling type '%s' is not supported (llama3)", path, ts);
        }
    }
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id");
    if (cJSON_IsNumber(eos)) c->eos[c->n_eos++] = eos->valueint;
    else if (cJSON_IsArray(eos))
        for (const cJSON *e = eos->child; e && c->n_eos < 8; e = e->next)
            if (cJSON_IsNumber(e)) c->eos[c->n_eos++] = e->valueint;
    return TWK_OK;
}

twk_status twk_hf_config_load(const char *path, twk_model_config *out) {
    char *text = twk_read_file(path, NULL);
    if (!text) return TWK_ERR_IO;
    cJSON *j = cJSON_Parse(text);
    twk_host_free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return twk_error(TWK_ERR_INVALID_ARG, "%s: not a JSON object", path);
    }
    twk_status st = parse(j, path, out);
    cJSON_Delete(j);
    return st;
}

void twk_rope_inv_freq(const twk_model_config *c, float *out) {
    int half = c->head_dim / 2;
    for (int i = 0; i < half; i++) {
        /* as transformers: float32 base ** (arange(0, dim, 2) / dim) */
        float expo = (float)(2 * i) / (float)c->head_dim;
        double f = 1.0 / pow(c->rope_theta, (double)expo);
        if (c->rope_type == TWK_ROPE_LLAMA3) {
            double low_wl = c->rope_original_max_pos / c->rope_low_freq_factor;
            double high_wl = c->rope_original_max_pos / c->rope_high_freq_factor;
            double wl = 2 * M_PI / f;
            if (wl > low_wl) {
                f = f / c->rope_factor;
            } else if (wl >= high_wl) {
                double s = (c->rope_original_max_pos / wl - c->rope_low_freq_factor) /
                           (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1 - s) * f / c->rope_factor + s * f;
            }
        }
        out[i] = (float)f;
    }
}

twk_status twk_hf_generation_eos(const char *path, twk_model_config *c) {
    FILE *f = fopen(path, "rb");
    if (!f) return TWK_OK; /* optional */
    fclose(f);
    char *text = twk_read_file(path, NULL);
    if (!text) return TWK_ERR_IO;
    cJSON *j = cJSON_Parse(text);
    twk_host_free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return twk_error(TWK_ERR_INVALID_ARG, "%s: not a JSON object", path);
    }
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id");
    const cJSON *one = cJSON_IsNumber(eos) ? eos : NULL;
    const cJSON *e = one ? one : cJSON_IsArray(eos) ? eos->child : NULL;
    for (; e; e = one ? NULL : e->next) {
        if (!cJSON_IsNumber(e) || !(e->valuedouble >= 0 && e->valuedouble <= INT_MAX)) continue; /* no token */
        int id = (int)e->valuedouble, dup = 0;
        for (int i = 0; i < c->n_eos; i++) dup |= c->eos[i] == id;
        if (!dup && c->n_eos < 8) c->eos[c->n_eos++] = id;
    }
    cJSON_Delete(j);
    return TWK_OK;
}
