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
    int used[8] = {0};
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
        e[i] = (twk_st_entry){name, TWK_ST_F32, 2, {is_a ? lc->rank : ne / lc->rank, is_a ? ne / lc->rank : lc->rank}, data[i]};
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
        lc->train_attn = lc->train_mlp = lc->train_unembed = 0;
        for (const cJSON *e = t->child; e; e = e->next) {
            const char *m = cJSON_IsString(e) ? e->valuestring : "";
            if (strstr(m, "q_proj") || strstr(m, "k_proj") || strstr(m, "v_proj") || strstr(m, "o_proj")) lc->train_attn = 1;
            if (strstr(m, "gate_proj") || strstr(m, "up_proj") || strstr(m, "down_proj")) lc->train_mlp = 1;
            if (strstr(m, "lm_head")) lc->train_unembed = 1;
        }
        if (!lc->train_attn && !lc->train_mlp && !lc->train_unembed)
            st = twk_error(TWK_ERR_UNSUPPORTED, "%s: target_modules names no module twinkle adapts", path);
    }
    cJSON_Delete(j);
    return st;
}
