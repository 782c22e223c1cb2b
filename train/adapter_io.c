/* LoRA adapters in PEFT's on-disk layout: adapter_config.json and
 * adapter_model.safetensors with PEFT's tensor names
 * (base_model.model.<module>.lora_A.weight / lora_B.weight). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cJSON.h>

#include "safetensors.h"
#include "twinkle/trainer.h"
#include "json_push.h"

static const char *const module_names[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                           "up_proj", "down_proj", "lm_head"};

/* The short module name in a PEFT tensor name ("q_proj"), or NULL. */
static const char *module_of(const char *name) {
    for (size_t i = 0; i < sizeof module_names / sizeof module_names[0]; i++) {
        char pat[32];
        snprintf(pat, sizeof pat, "%s.lora_", module_names[i]);
        const char *p = strstr(name, pat);
        if (p && (p == name || p[-1] == '.')) return module_names[i];
    }
    return NULL;
}

/* The key of the rank / alpha pattern PEFT 0.21.2 writes when it fuses gate_proj and up_proj into
 * the experts' gate_up_proj (twice the rank and alpha: the scale alpha / r unchanged). */
#define GATE_UP_PATTERN ".*\\.gate_up_proj"

/* target_parameters of a mixture of experts' adapter (the stacks, the router) and the gate_up_proj
 * rank / alpha patterns, as PEFT writes them; 0 when out of memory. */
static int moe_config(cJSON *cfg, const twk_lora_config *lc, int experts, int router) {
    cJSON *tp = cJSON_AddArrayToObject(cfg, "target_parameters");
    int ok = tp != NULL;
    if (ok && experts)
        ok = twk_json_push(tp, cJSON_CreateString("mlp.experts.gate_up_proj")) &&
             twk_json_push(tp, cJSON_CreateString("mlp.experts.down_proj"));
    if (ok && router) ok = twk_json_push(tp, cJSON_CreateString("mlp.gate.weight"));
    if (ok && experts) {
        cJSON *rp = cJSON_AddObjectToObject(cfg, "rank_pattern"), *ap = cJSON_AddObjectToObject(cfg, "alpha_pattern");
        ok = rp && ap && cJSON_AddNumberToObject(rp, GATE_UP_PATTERN, 2 * lc->rank) &&
             cJSON_AddNumberToObject(ap, GATE_UP_PATTERN, 2 * (double)lc->alpha);
    }
    return ok;
}

twk_status twk_adapter_save(twk_trainer *t, const char *dir, const char *base_model) {
    const twk_lora_config *lc = twk_trainer_lora(t);
    if (!lc) return twk_error(TWK_ERR_STATE, "adapter_save: this trainer trains all parameters, not an adapter");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return twk_error(TWK_ERR_IO, "adapter_save: cannot create %s: %s", dir, strerror(errno));
    int n = twk_trainer_param_count(t);
    twk_st_entry *e = twk_host_calloc((size_t)n * sizeof *e, "adapter entries");
    float **data = twk_host_calloc((size_t)n * sizeof *data, "adapter data");
    cJSON *cfg = cJSON_CreateObject(), *targets = cJSON_CreateArray();
    twk_status st = (e && data && cfg && targets) ? TWK_OK : twk_error(TWK_ERR_OOM, "adapter_save: out of memory");
    int used[8] = {0}, experts = 0, router = 0;
    const twk_model_config *mc = twk_model_cfg(twk_trainer_model(t));
    int n_experts = mc && mc->n_experts > 0 ? mc->n_experts : 1;
    for (int i = 0; st == TWK_OK && i < n; i++) {
        int64_t ne = 0;
        const char *name = twk_trainer_param_name(t, i, &ne);
        data[i] = twk_host_alloc((size_t)ne * sizeof **data, "adapter tensor");
        if (!data[i]) {
            st = twk_error(TWK_ERR_OOM, "adapter_save: out of memory");
            break;
        }
        st = twk_trainer_get(t, name, data[i], ne);
        int is_a = strstr(name, ".lora_A.") != NULL;
        int64_t rk = lc->rank; /* an expert stack's ParamWrapper: rank x experts (gate_up_proj: twice the rank) */
        if (strstr(name, ".mlp.experts.")) rk *= (strstr(name, ".mlp.experts.base_layer.") ? 2 : 1) * (int64_t)n_experts;
        experts |= strstr(name, ".mlp.experts.") != NULL;
        router |= strstr(name, ".mlp.gate.lora_") != NULL;
        e[i] = (twk_st_entry){name, TWK_ST_F32, 2, {is_a ? rk : ne / rk, is_a ? ne / rk : rk}, data[i]};
        const char *mod = module_of(name);
        for (size_t k = 0; mod && k < 8; k++)
            if (!strcmp(mod, module_names[k]) && !used[k]) {
                used[k] = 1;
                if (!twk_json_push(targets, cJSON_CreateString(mod)))
                    st = twk_error(TWK_ERR_OOM, "adapter_save: out of memory");
            }
    }
    char path[4200];
    if (st == TWK_OK) {
        const char *meta[2] = {"format", "pt"};
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
        st = twk_st_write(path, e, n, meta, 1);
    }
    if (st == TWK_OK) {
        /* every field, or out of memory: an adapter_config.json with a field missing would not load */
        int ok = cJSON_AddStringToObject(cfg, "peft_type", "LORA") &&
                 cJSON_AddStringToObject(cfg, "task_type", "CAUSAL_LM") && cJSON_AddNumberToObject(cfg, "r", lc->rank) && cJSON_AddNumberToObject(cfg, "lora_alpha", lc->alpha) &&
                 cJSON_AddNumberToObject(cfg, "lora_dropout", 0.0) && cJSON_AddItemToObject(cfg, "target_modules", targets);
        if (ok) targets = NULL; /* owned by cfg now */
        if (ok && (experts || router)) ok = moe_config(cfg, lc, experts, router);
        ok = ok && cJSON_AddStringToObject(cfg, "bias", "none") && cJSON_AddBoolToObject(cfg, "fan_in_fan_out", 0) &&
             cJSON_AddBoolToObject(cfg, "inference_mode", 1) && cJSON_AddBoolToObject(cfg, "init_lora_weights", 1) &&
             cJSON_AddBoolToObject(cfg, "use_rslora", 0) && cJSON_AddBoolToObject(cfg, "use_dora", 0) &&
             cJSON_AddNullToObject(cfg, "modules_to_save") &&
             (base_model ? cJSON_AddStringToObject(cfg, "base_model_name_or_path", base_model) != NULL
                         : cJSON_AddNullToObject(cfg, "base_model_name_or_path") != NULL);
        char *text = ok ? cJSON_Print(cfg) : NULL;
        snprintf(path, sizeof path, "%s/adapter_config.json", dir);
        st = text ? twk_write_file_atomic(path, text, strlen(text)) : twk_error(TWK_ERR_OOM, "adapter_save: out of memory");
        cJSON_free(text);
    }
    for (int i = 0; data && i < n; i++) twk_host_free(data[i]);
    twk_host_free(data);
    twk_host_free(e);
    cJSON_Delete(targets);
    cJSON_Delete(cfg);
    return st;
}

/* PEFT saves a copy of a targeted lm_head / embedding as
 * base_model.model.<module>.base_layer.weight. Accept it only when it equals
 * our base weight: an adapter that replaces base weights is refused. */
static twk_status check_base_copy(twk_trainer *t, const char *path, const twk_st_tensor *ten) {
    const char *prefix = "base_model.model.";
    if (strncmp(ten->name, prefix, strlen(prefix)))
        return twk_error(TWK_ERR_INVALID_ARG, "%s: unexpected tensor '%s'", path, ten->name);
    char base[256];
    snprintf(base, sizeof base, "%s", ten->name + strlen(prefix));
    char *bl = strstr(base, ".base_layer.weight");
    if (!bl) return twk_error(TWK_ERR_INVALID_ARG, "%s: unexpected tensor '%s'", path, ten->name);
    strcpy(bl, ".weight");
    size_t bytes = (size_t)ten->nelem * sizeof(float); /* both as float32 */
    float *ours = twk_host_alloc(bytes, "base weight"), *theirs = twk_host_alloc(bytes, "adapter base copy");
    twk_status st = ours && theirs ? TWK_OK : TWK_ERR_OOM;
    if (st == TWK_OK) st = twk_model_get_weight(twk_trainer_model(t), base, ours, ten->nelem);
    if (st == TWK_OK) st = twk_st_to_f32(ten, theirs);
    /* a base held in bf16 / f16: the copy as that dtype holds it */
    if (st == TWK_OK) st = twk_dtype_round(twk_model_dtype(twk_trainer_model(t)), theirs, ten->nelem);
    if (st == TWK_OK && memcmp(ours, theirs, bytes))
        st = twk_error(TWK_ERR_UNSUPPORTED, "%s: tensor '%s' replaces the base weight '%s'; only LoRA deltas are supported",
                       path, ten->name, base);
    twk_host_free(ours);
    twk_host_free(theirs);
    return st;
}

/* TWK_OK when cfg (adapter_config.json at path) is a plain LoRA: an object, peft_type LORA, no
 * DoRA or rsLoRA; otherwise an error naming the file and field. */
static twk_status peft_kind_check(const cJSON *cfg, const char *path) {
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(cfg, "peft_type");
    const cJSON *dora = cJSON_GetObjectItemCaseSensitive(cfg, "use_dora"), *rs = cJSON_GetObjectItemCaseSensitive(cfg, "use_rslora");
    if (!cJSON_IsObject(cfg)) return twk_error(TWK_ERR_INVALID_ARG, "%s: not a JSON object", path);
    if (cJSON_IsString(pt) && strcmp(pt->valuestring, "LORA"))
        return twk_error(TWK_ERR_UNSUPPORTED, "%s: peft_type '%s' is not LORA", path, pt->valuestring);
    if (cJSON_IsTrue(dora) || cJSON_IsTrue(rs))
        return twk_error(TWK_ERR_UNSUPPORTED, "%s: use_dora / use_rslora are not supported", path);
    return TWK_OK;
}

twk_status twk_adapter_load(twk_trainer *t, const char *dir) {
    const twk_lora_config *lc = twk_trainer_lora(t);
    if (!lc) return twk_error(TWK_ERR_STATE, "adapter_load: this trainer trains all parameters, not an adapter");
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *text = twk_read_file(path, NULL);
    if (!text) return TWK_ERR_IO;
    cJSON *cfg = cJSON_Parse(text);
    twk_host_free(text);
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(cfg, "r"), *alpha = cJSON_GetObjectItemCaseSensitive(cfg, "lora_alpha");
    twk_status st = peft_kind_check(cfg, path);
    if (st != TWK_OK) {
    } else if (!cJSON_IsNumber(r) || r->valueint != lc->rank)
        st = twk_error(TWK_ERR_INVALID_ARG, "%s: field 'r' is %d; this trainer's rank is %d", path,
                       cJSON_IsNumber(r) ? r->valueint : -1, lc->rank);
    else if (!cJSON_IsNumber(alpha) || fabs(alpha->valuedouble - lc->alpha) > 1e-6)
        st = twk_error(TWK_ERR_INVALID_ARG, "%s: field 'lora_alpha' is %g; this trainer's alpha is %g", path,
                       cJSON_IsNumber(alpha) ? alpha->valuedouble : -1.0, (double)lc->alpha);
    cJSON_Delete(cfg);
    if (st != TWK_OK) return st;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    twk_safetensors *sf = NULL;
    st = twk_st_open(path, &sf);
    if (st != TWK_OK) return st;
    int n_lora = 0;
    for (int i = 0; st == TWK_OK && i < twk_st_count(sf); i++) {
        const twk_st_tensor *ten = twk_st_at(sf, i);
        if (strstr(ten->name, ".base_layer.weight")) {
            st = check_base_copy(t, path, ten);
            continue;
        }
        n_lora++;
        int64_t want = -1;
        for (int k = 0; k < twk_trainer_param_count(t); k++) {
            int64_t ne;
            if (!strcmp(twk_trainer_param_name(t, k, &ne), ten->name)) want = ne;
        }
        if (want < 0) {
            st = twk_error(TWK_ERR_INVALID_ARG, "%s: tensor '%s' is not a module this trainer adapts", path, ten->name);
            break;
        }
        if (ten->nelem != want) {
            st = twk_error(TWK_ERR_SHAPE, "%s: tensor '%s' has %lld elements; expected %lld", path, ten->name,
                           (long long)ten->nelem, (long long)want);
            break;
        }
        float *d = twk_host_alloc((size_t)want * sizeof *d, "adapter tensor");
        st = d ? twk_st_to_f32(ten, d) : TWK_ERR_OOM;
        if (st == TWK_OK) st = twk_trainer_set(t, ten->name, d, want);
        twk_host_free(d);
    }
    if (st == TWK_OK && n_lora != twk_trainer_param_count(t))
        st = twk_error(TWK_ERR_INVALID_ARG, "%s: has %d LoRA tensors; this trainer's adapter has %d", path, n_lora,
                       twk_trainer_param_count(t));
    twk_st_close(sf);
    return st;
}

/* target_parameters (the experts' gate_up_proj / down_proj, both or neither; the router's
 * gate.weight) and the rank / alpha patterns: only gate_up_proj at twice r and lora_alpha, which
 * is how twinkle holds that stack. An error naming the field otherwise. */
static twk_status moe_targets(const cJSON *j, const char *path, twk_lora_config *lc) {
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(j, "target_parameters");
    int gate_up = 0, down = 0;
    if (tp && !cJSON_IsNull(tp) && !cJSON_IsArray(tp)) return twk_error(TWK_ERR_INVALID_ARG, "%s: target_parameters is not a list", path);
    for (const cJSON *e = tp ? tp->child : NULL; e; e = e->next) {
        const char *m = cJSON_IsString(e) ? e->valuestring : "";
        size_t n = strlen(m);
        if (n >= 12 && !strcmp(m + n - 12, "gate_up_proj")) gate_up = 1;
        else if (n >= 9 && !strcmp(m + n - 9, "down_proj")) down = 1;
        else if (!strcmp(m, "gate.weight") || (n > 12 && !strcmp(m + n - 12, ".gate.weight"))) lc->train_router = 1;
        else return twk_error(TWK_ERR_UNSUPPORTED, "%s: target_parameters entry '%s' is not a parameter twinkle adapts "
                                                   "(the experts' gate_up_proj and down_proj, the router's gate.weight)", path, m);
    }
    if (gate_up != down)
        return twk_error(TWK_ERR_UNSUPPORTED, "%s: target_parameters names only one of the experts' gate_up_proj / down_proj; "
                                              "twinkle adapts both or neither", path);
    lc->train_experts |= gate_up;
    static const char *const pats[2] = {"rank_pattern", "alpha_pattern"};
    for (int k = 0; k < 2; k++) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, pats[k]);
        double want = k ? 2.0 * lc->alpha : 2.0 * lc->rank;
        int found = 0;
        for (const cJSON *e = cJSON_IsObject(p) ? p->child : NULL; e; e = e->next) {
            if (strcmp(e->string, GATE_UP_PATTERN) || !cJSON_IsNumber(e) || fabs(e->valuedouble - want) > 1e-6)
                return twk_error(TWK_ERR_UNSUPPORTED, "%s: %s entry '%s' is not supported (only \"%s\": %g, twice %s)", path,
                                 pats[k], e->string, GATE_UP_PATTERN, want, k ? "lora_alpha" : "r");
            found = 1;
        }
        if (lc->train_experts && !found)
            return twk_error(TWK_ERR_UNSUPPORTED, "%s: the experts' gate_up_proj needs %s {\"%s\": %g} (twice %s, as PEFT "
                                                  "writes when it fuses gate_proj and up_proj)", path, pats[k], GATE_UP_PATTERN,
                             want, k ? "lora_alpha" : "r");
    }
    return TWK_OK;
}

twk_status twk_adapter_read_config(const char *dir, twk_lora_config *lc) {
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *text = twk_read_file(path, NULL);
    if (!text) return TWK_ERR_IO;
    cJSON *j = cJSON_Parse(text);
    twk_host_free(text);
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "r"), *a = cJSON_GetObjectItemCaseSensitive(j, "lora_alpha");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "target_modules");
    twk_status st = peft_kind_check(j, path);
    if (st != TWK_OK) {
    } else if (!cJSON_IsNumber(r) || r->valueint < 1 || !cJSON_IsNumber(a) || !(a->valuedouble > 0) || !cJSON_IsArray(t)) {
        st = twk_error(TWK_ERR_INVALID_ARG, "%s: needs r >= 1, lora_alpha > 0 and a target_modules list", path);
    } else {
        lc->rank = r->valueint;
        lc->alpha = (float)a->valuedouble;
        lc->train_attn = lc->train_mlp = lc->train_unembed = lc->train_experts = lc->train_router = 0;
        for (const cJSON *e = t->child; e; e = e->next) {
            const char *m = cJSON_IsString(e) ? e->valuestring : "";
            if (strstr(m, "q_proj") || strstr(m, "k_proj") || strstr(m, "v_proj") || strstr(m, "o_proj")) lc->train_attn = 1;
            if (strstr(m, "gate_proj") || strstr(m, "up_proj") || strstr(m, "down_proj")) lc->train_mlp = 1;
            if (strstr(m, "lm_head")) lc->train_unembed = 1;
            /* Mixtral's v4 names, which PEFT turns into the experts' target_parameters */
            if (!strcmp(m, "w1") || !strcmp(m, "w2") || !strcmp(m, "w3")) lc->train_experts = 1;
            if (!strcmp(m, "gate")) lc->train_router = 1;
        }
        st = moe_targets(j, path, lc);
        if (st == TWK_OK && !lc->train_attn && !lc->train_mlp && !lc->train_unembed && !lc->train_experts && !lc->train_router)
            st = twk_error(TWK_ERR_UNSUPPORTED, "%s: target_modules names no module twinkle adapts", path);
    }
    cJSON_Delete(j);
    return st;
}
