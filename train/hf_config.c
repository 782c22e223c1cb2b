/* config.json for the Llama / Qwen2 / Qwen3 / Mistral / Gemma 2 / Gemma 3 text
 * families and the mixture-of-experts Qwen3-MoE / Qwen2-MoE / Mixtral: every field that changes the math is read or refused by name —
 * never a silently wrong model. */
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

/* A positive number, or null / absent (0) for an optional cap or window; else names the field. */
/* torch_dtype (transformers 4) or dtype (5) as a twk_dtype; -1 when absent or another type. */
static int stored_dtype(const cJSON *j) {
    static const struct { const char *name; twk_dtype t; } names[] = {
        {"float32", TWK_F32}, {"bfloat16", TWK_BF16}, {"float16", TWK_F16}};
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "torch_dtype");
    if (!cJSON_IsString(v)) v = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    for (size_t i = 0; cJSON_IsString(v) && i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(v->valuestring, names[i].name)) return (int)names[i].t;
    return -1;
}

static int get_opt_pos(const cJSON *j, const char *k, double *out, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    *out = 0;
    if (!v || cJSON_IsNull(v)) return 1;
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || v->valuedouble > 1e9) {
        twk_error(TWK_ERR_INVALID_ARG, "%s: field '%s' must be a positive number or null", path, k);
        return 0;
    }
    *out = v->valuedouble;
    return 1;
}

/* sliding_window, layer_types / sliding_window_pattern and Gemma's scale and soft-caps. */
static twk_status parse_window(const cJSON *j, const char *path, twk_model_config *c) {
    double w = 0;
    int windowed = c->arch == TWK_ARCH_MISTRAL || c->arch == TWK_ARCH_MIXTRAL || c->gemma;
    if (windowed && !cJSON_GetObjectItemCaseSensitive(j, "sliding_window")) w = 4096; /* transformers' default */
    else if (windowed && !get_opt_pos(j, "sliding_window", &w, path)) return TWK_ERR_INVALID_ARG;
    if (w != floor(w) || w > INT_MAX)
        return twk_error(TWK_ERR_INVALID_ARG, "%s: field 'sliding_window' must be an integer", path);
    c->sliding_window = (int)w;
    /* every layer (Mistral), every other (Gemma 2: layer l local when (l + 1) % 2), or Gemma 3's pattern */
    c->local_pattern = c->arch == TWK_ARCH_GEMMA2 ? 2 : c->arch == TWK_ARCH_GEMMA3 ? 6 : 0;
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "sliding_window_pattern");
    if (c->arch == TWK_ARCH_GEMMA3 && pat && !cJSON_IsNull(pat) && !get_int(j, "sliding_window_pattern", &c->local_pattern, path))
        return TWK_ERR_INVALID_ARG;
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
    if (c->gemma && cJSON_IsArray(lt)) { /* (Mistral's attention ignores layer_types) */ /* the explicit list must be a pattern: every layer, or all but each P-th */
        int n = cJSON_GetArraySize(lt), first_full = -1, l = 0;
        for (const cJSON *e = lt->child; e; e = e->next, l++) {
            if (!cJSON_IsString(e) || (strcmp(e->valuestring, "full_attention") && strcmp(e->valuestring, "sliding_attention")))
                return twk_error(TWK_ERR_UNSUPPORTED, "%s: layer_types[%d] must be full_attention or sliding_attention", path, l);
            if (first_full < 0 && !strcmp(e->valuestring, "full_attention")) first_full = l;
        }
        c->local_pattern = first_full < 0 ? 0 : first_full + 1;
        l = 0;
        for (const cJSON *e = lt->child; e; e = e->next, l++) {
            int local = c->local_pattern == 0 || (l + 1) % c->local_pattern != 0;
            if (local != !strcmp(e->valuestring, "sliding_attention"))
                return twk_error(TWK_ERR_UNSUPPORTED,
                                 "%s: layer_types is not a supported pattern (every layer sliding, or every P-th full)", path);
        }
        if (n != c->layers)
            return twk_error(TWK_ERR_INVALID_ARG, "%s: layer_types has %d entries for %d layers", path, n, c->layers);
    }
    if (!c->gemma) return TWK_OK;
    if (get_bool(j, "use_bidirectional_attention", 0))
        return twk_error(TWK_ERR_UNSUPPORTED, "%s: use_bidirectional_attention true is not supported", path);
    double qpas = get_num(j, "query_pre_attn_scalar", 256);
    if (!(qpas > 0)) return twk_error(TWK_ERR_INVALID_ARG, "%s: query_pre_attn_scalar must be > 0", path);
    c->attn_scale = pow(qpas, -0.5);
    /* Gemma 2 defaults to caps 50 / 30 when the fields are absent; Gemma 3 to none */
    int g2 = c->arch == TWK_ARCH_GEMMA2;
    if (!cJSON_GetObjectItemCaseSensitive(j, "attn_logit_softcapping")) c->attn_softcap = g2 ? 50.0 : 0;
    else if (!get_opt_pos(j, "attn_logit_softcapping", &c->attn_softcap, path)) return TWK_ERR_INVALID_ARG;
    if (!cJSON_GetObjectItemCaseSensitive(j, "final_logit_softcapping")) c->final_softcap = g2 ? 30.0 : 0;
    else if (!get_opt_pos(j, "final_logit_softcapping", &c->final_softcap, path)) return TWK_ERR_INVALID_ARG;
    return TWK_OK;
}

/* The mixture-of-experts fields of Qwen3-MoE / Qwen2-MoE / Mixtral; refuses by name what is not
 * implemented (the router's auxiliary loss, jitter noise, a sliding window on Qwen MoE). */
static twk_status parse_moe(const cJSON *j, const char *path, twk_model_config *c) {
    int mixtral = c->arch == TWK_ARCH_MIXTRAL;
    const char *ne = cJSON_GetObjectItemCaseSensitive(j, "num_experts") ? "num_experts" : "num_local_experts";
    if (!get_int(j, ne, &c->n_experts, path) || !get_int(j, "num_experts_per_tok", &c->top_k, path)) return TWK_ERR_INVALID_ARG;
    if (c->top_k > c->n_experts || c->n_experts > 65536)
        return twk_error(TWK_ERR_INVALID_ARG, "%s: num_experts_per_tok %d must be at most %s %d (and that at most 65536)", path,
                         c->top_k, ne, c->n_experts);
    if (c->top_k > 256) return twk_error(TWK_ERR_UNSUPPORTED, "%s: num_experts_per_tok %d above 256", path, c->top_k);
    c->moe_ffn = c->ffn; /* Mixtral: intermediate_size is the experts' */
    if (!mixtral && !get_int(j, "moe_intermediate_size", &c->moe_ffn, path)) return TWK_ERR_INVALID_ARG;
    c->norm_topk = mixtral ? 1 : get_bool(j, "norm_topk_prob", 0); /* Mixtral: softmax over the top-k logits */
    c->sparse_step = 1;
    if (!mixtral && cJSON_GetObjectItemCaseSensitive(j, "decoder_sparse_step") &&
        !get_int(j, "decoder_sparse_step", &c->sparse_step, path))
        return TWK_ERR_INVALID_ARG;
    const cJSON *dl = mixtral ? NULL : cJSON_GetObjectItemCaseSensitive(j, "mlp_only_layers");
    if (dl && !cJSON_IsNull(dl) && !cJSON_IsArray(dl))
        return twk_error(TWK_ERR_INVALID_ARG, "%s: field 'mlp_only_layers' must be a list of layer indices", path);
    for (const cJSON *e = dl ? dl->child : NULL; e; e = e->next) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= 256 || e->valuedouble != floor(e->valuedouble))
            return twk_error(TWK_ERR_UNSUPPORTED, "%s: mlp_only_layers entry %g is not a layer index below 256", path,
                             cJSON_IsNumber(e) ? e->valuedouble : -1.0);
        int l = (int)e->valuedouble;
        c->dense_layers[l / 64] |= (uint64_t)1 << (l % 64);
    }
    if (c->arch == TWK_ARCH_QWEN2_MOE) {
        c->shared_ffn = 0;
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(j, "shared_expert_intermediate_size");
        if (sh && !cJSON_IsNull(sh) && !get_int(j, "shared_expert_intermediate_size", &c->shared_ffn, path))
            return TWK_ERR_INVALID_ARG;
        if (!c->shared_ffn)
            return twk_error(TWK_ERR_UNSUPPORTED, "%s: Qwen2MoeForCausalLM without shared_expert_intermediate_size", path);
    }
    c->router_aux = c->n_experts > 0 && get_bool(j, "output_router_logits", 0);
    c->router_aux_coef = get_num(j, "router_aux_loss_coef", 0.001);
    const cJSON *coef = cJSON_GetObjectItemCaseSensitive(j, "router_aux_loss_coef");
    if (c->router_aux && coef && !cJSON_IsNull(coef) && (!cJSON_IsNumber(coef) || !isfinite(coef->valuedouble)))
        return twk_error(TWK_ERR_INVALID_ARG, "%s: router_aux_loss_coef must be a finite number", path);
    double jitter = get_num(j, "router_jitter_noise", 0);
    if (jitter != 0) return twk_error(TWK_ERR_UNSUPPORTED, "%s: router_jitter_noise %g is not supported", path, jitter);
    return TWK_OK;
}

const char *twk_expert_proj(const twk_model_config *c, int k) {
    static const char *const qwen[3] = {"gate_proj", "up_proj", "down_proj"}, *const mixtral[3] = {"w1", "w3", "w2"};
    return c->arch == TWK_ARCH_MIXTRAL ? mixtral[k] : qwen[k];
}

int twk_layer_sparse(const twk_model_config *c, int l) {
    if (c->n_experts <= 0 || l < 0) return 0;
    if (l < 256 && (c->dense_layers[l / 64] >> (l % 64) & 1)) return 0;
    return c->sparse_step > 0 && (l + 1) % c->sparse_step == 0;
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
    else if (!strcmp(arch, "MistralForCausalLM")) c->arch = TWK_ARCH_MISTRAL;
    else if (!strcmp(arch, "Gemma2ForCausalLM")) c->arch = TWK_ARCH_GEMMA2;
    else if (!strcmp(arch, "Gemma3ForCausalLM")) c->arch = TWK_ARCH_GEMMA3;
    else if (!strcmp(arch, "Qwen3MoeForCausalLM")) c->arch = TWK_ARCH_QWEN3_MOE;
    else if (!strcmp(arch, "Qwen2MoeForCausalLM")) c->arch = TWK_ARCH_QWEN2_MOE;
    else if (!strcmp(arch, "MixtralForCausalLM")) c->arch = TWK_ARCH_MIXTRAL;
    else
        return twk_error(TWK_ERR_UNSUPPORTED,
                         "%s: architecture '%s' is not supported (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                         "MistralForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, Qwen3MoeForCausalLM, "
                         "Qwen2MoeForCausalLM, MixtralForCausalLM)",
                         path, arch);
    /* Gemma3ForCausalLM is the text model: the multimodal config nests it under text_config */
    if (c->arch == TWK_ARCH_GEMMA3 && cJSON_IsString(mt) && strcmp(mt->valuestring, "gemma3_text"))
        return twk_error(TWK_ERR_UNSUPPORTED, "%s: Gemma3ForCausalLM with model_type '%s' is not supported (gemma3_text)",
                         path, mt->valuestring);
    c->gemma = c->arch == TWK_ARCH_GEMMA2 || c->arch == TWK_ARCH_GEMMA3;
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
    c->tie_embeddings = get_bool(j, "tie_word_embeddings", c->gemma); /* Gemma's default: tied */
    c->stored_dtype = stored_dtype(j);
    if (!(c->rope_theta > 0) || !(c->rms_eps >= 0))
        return twk_error(TWK_ERR_INVALID_ARG, "%s: rope_theta and rms_norm_eps must be positive", path);

    /* Gemma's MLP reads hidden_activation (transformers ignores its hidden_act) */
    const char *act_key = c->gemma ? "hidden_activation" : "hidden_act", *act_want = c->gemma ? "gelu_pytorch_tanh" : "silu";
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, act_key);
    if (act && !cJSON_IsNull(act) && (!cJSON_IsString(act) || strcmp(act->valuestring, act_want)))
        return twk_error(TWK_ERR_UNSUPPORTED, "%s: %s '%s' is not supported (%s)", path, act_key,
                         cJSON_IsString(act) ? act->valuestring : "?", act_want);
    twk_status st = parse_window(j, path, c);
    if (st == TWK_OK && (c->arch == TWK_ARCH_QWEN3_MOE || c->arch == TWK_ARCH_QWEN2_MOE || c->arch == TWK_ARCH_MIXTRAL))
        st = parse_moe(j, path, c);
    if (st != TWK_OK) return st;
    if (get_bool(j, "mlp_bias", 0)) return twk_error(TWK_ERR_UNSUPPORTED, "%s: mlp_bias true is not supported", path);
    double prf = get_num(j, "partial_rotary_factor", 1.0);
    if (prf != 1.0) return twk_error(TWK_ERR_UNSUPPORTED, "%s: partial_rotary_factor %g is not supported", path, prf);
    if (get_bool(j, "use_sliding_window", 0))
        return twk_error(TWK_ERR_UNSUPPORTED, "%s: use_sliding_window true is not supported", path);
    int qwen2 = c->arch == TWK_ARCH_QWEN2 || c->arch == TWK_ARCH_QWEN2_MOE;
    c->attn_bias = c->arch == TWK_ARCH_QWEN2_MOE ? get_bool(j, "qkv_bias", 1) : qwen2 ? 1 : get_bool(j, "attention_bias", 0);
    c->o_bias = qwen2 ? 0 : c->attn_bias;
    c->qk_norm = c->arch == TWK_ARCH_QWEN3 || c->arch == TWK_ARCH_GEMMA3 || c->arch == TWK_ARCH_QWEN3_MOE;

    /* transformers >= 5 writes rope_parameters {rope_type, rope_theta, ...};
     * older configs write rope_theta and rope_scaling */
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    if (c->arch == TWK_ARCH_GEMMA3) { /* per layer type: full_attention (rope_theta, rope_scaling), sliding_attention */
        c->rope_theta = get_num(j, "rope_theta", 1000000.0);
        c->rope_local_theta = get_num(j, "rope_local_base_freq", 10000.0);
        const cJSON *loc = cJSON_IsObject(rp) ? cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention") : NULL;
        if (cJSON_IsObject(loc)) {
            const cJSON *lt = cJSON_GetObjectItemCaseSensitive(loc, "rope_type");
            if (lt && (!cJSON_IsString(lt) || strcmp(lt->valuestring, "default")))
                return twk_error(TWK_ERR_UNSUPPORTED, "%s: rope_parameters.sliding_attention.rope_type must be default", path);
            c->rope_local_theta = get_num(loc, "rope_theta", c->rope_local_theta);
        }
        if (!(c->rope_local_theta > 0))
            return twk_error(TWK_ERR_INVALID_ARG, "%s: the sliding_attention rope_theta must be > 0", path);
        if (cJSON_IsObject(rp)) rp = cJSON_GetObjectItemCaseSensitive(rp, "full_attention");
    }
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
        } else if (!strcmp(ts, "linear")) {
            c->rope_type = TWK_ROPE_LINEAR;
            c->rope_factor = get_num(rs, "factor", 0);
            if (!(c->rope_factor > 0))
                return twk_error(TWK_ERR_INVALID_ARG, "%s: rope_scaling linear needs factor > 0", path);
        } else {
            return twk_error(TWK_ERR_UNSUPPORTED, "%s: rope_scaling type '%s' is not supported (llama3, linear)", path, ts);
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

int twk_layer_window(const twk_model_config *c, int l) {
    if (c->sliding_window <= 0) return 0;
    return c->local_pattern == 0 || (l + 1) % c->local_pattern != 0 ? c->sliding_window : 0;
}

int64_t twk_kv_seq_rows(const twk_model_config *c, int l, int64_t max_len) {
    int64_t w = twk_layer_window(c, l);
    return w > 0 && w < max_len ? w : max_len;
}

int64_t twk_kv_layer_rows(const twk_model_config *c, int l, int max_seqs, int64_t max_len) {
    int64_t r = twk_kv_seq_rows(c, l, max_len);
    return (int64_t)max_seqs * r + (r < max_len);
}

int twk_rope_has_local(const twk_model_config *c) { return c->rope_local_theta > 0 && c->local_pattern != 0; }

void twk_rope_inv_freq(const twk_model_config *c, int local, float *out) {
    int half = c->head_dim / 2;
    for (int i = 0; i < half; i++) {
        /* as transformers: float32 base ** (arange(0, dim, 2) / dim) */
        float expo = (float)(2 * i) / (float)c->head_dim;
        if (local && c->rope_local_theta > 0) { /* Gemma 3's local layers: their own base, unscaled */
            out[i] = (float)(1.0 / pow(c->rope_local_theta, (double)expo));
            continue;
        }
        double f = 1.0 / pow(c->rope_theta, (double)expo);
        if (c->rope_type == TWK_ROPE_LINEAR) f /= c->rope_factor;
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
