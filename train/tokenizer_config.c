/* tokenizer_config.json's add_bos_token / add_eos_token, applied as transformers 4.x
 * (checked against 4.57) applies them when AutoTokenizer.from_pretrained loads the folder:
 *   - the tokenizer class is tokenizer_config.json's "tokenizer_class" (a trailing "Fast"
 *     dropped), else config.json's "tokenizer_class", else the class transformers maps
 *     config.json's "model_type" to;
 *   - the Llama family of classes (LlamaTokenizer, CodeLlamaTokenizer, GemmaTokenizer,
 *     CohereTokenizer, GPTNeoXTokenizer) throws tokenizer.json's post-processor away and builds
 *     the template "[bos] $A [eos]" from add_bos_token / add_eos_token (each its class's default
 *     when absent: true / false, GPT-NeoX false / false; null counts as false) and the bos_token /
 *     eos_token strings (special_tokens_map.json's over tokenizer_config.json's over the class's
 *     default; a string or an AddedToken object's "content");
 *   - every other class (PreTrainedTokenizerFast, Qwen2Tokenizer, ...) ignores the two flags, and
 *     tokenizer.json's post-processor decides.
 * transformers 5 differs: it keeps tokenizer.json's post-processor for every class. A bad field is
 * an encode failure naming the file and the field (decode still works). */
#include <stdio.h>
#include <string.h>

#include "tokenizer_impl.h"
#include "twinkle/fs.h"
#include "twinkle/hal.h"

typedef struct {
    const char *name; /* without "Fast" */
    int add_bos, add_eos;
    const char *bos, *eos;
} tok_class;

static const tok_class CLASSES[] = {
    {"LlamaTokenizer", 1, 0, "<s>", "</s>"},
    {"CodeLlamaTokenizer", 1, 0, "<s>", "</s>"},
    {"GemmaTokenizer", 1, 0, "<bos>", "<eos>"},
    {"CohereTokenizer", 1, 0, "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"},
    {"GPTNeoXTokenizer", 0, 0, "<|endoftext|>", "<|endoftext|>"},
};

/* transformers 4.57's TOKENIZER_MAPPING: the model types whose fast tokenizer is one of CLASSES. */
static const struct {
    const char *type, *cls;
} MODEL_TYPES[] = {
    {"arcee", "LlamaTokenizer"}, {"aria", "LlamaTokenizer"}, {"chameleon", "LlamaTokenizer"},
    {"colpali", "LlamaTokenizer"}, {"deepseek_v2", "LlamaTokenizer"}, {"deepseek_v3", "LlamaTokenizer"},
    {"deepseek_vl", "LlamaTokenizer"}, {"deepseek_vl_hybrid", "LlamaTokenizer"}, {"diffllama", "LlamaTokenizer"},
    {"ernie4_5", "LlamaTokenizer"}, {"ernie4_5_moe", "LlamaTokenizer"}, {"idefics", "LlamaTokenizer"},
    {"idefics2", "LlamaTokenizer"}, {"idefics3", "LlamaTokenizer"}, {"jamba", "LlamaTokenizer"},
    {"janus", "LlamaTokenizer"}, {"jetmoe", "LlamaTokenizer"}, {"llama", "LlamaTokenizer"},
    {"llama4", "LlamaTokenizer"}, {"llama4_text", "LlamaTokenizer"}, {"llava", "LlamaTokenizer"},
    {"llava_next", "LlamaTokenizer"}, {"llava_next_video", "LlamaTokenizer"}, {"llava_onevision", "LlamaTokenizer"},
    {"ministral", "LlamaTokenizer"}, {"mistral", "LlamaTokenizer"}, {"mistral3", "LlamaTokenizer"},
    {"mixtral", "LlamaTokenizer"}, {"mllama", "LlamaTokenizer"}, {"paligemma", "LlamaTokenizer"},
    {"persimmon", "LlamaTokenizer"}, {"phi3", "LlamaTokenizer"}, {"phimoe", "LlamaTokenizer"},
    {"video_llava", "LlamaTokenizer"}, {"vipllava", "LlamaTokenizer"}, {"zamba", "LlamaTokenizer"},
    {"zamba2", "LlamaTokenizer"}, {"aya_vision", "CohereTokenizer"}, {"cohere", "CohereTokenizer"},
    {"cohere2", "CohereTokenizer"}, {"code_llama", "CodeLlamaTokenizer"}, {"falcon_mamba", "GPTNeoXTokenizer"},
    {"gpt_neox", "GPTNeoXTokenizer"}, {"mamba", "GPTNeoXTokenizer"}, {"mamba2", "GPTNeoXTokenizer"},
    {"mpt", "GPTNeoXTokenizer"}, {"olmo", "GPTNeoXTokenizer"}, {"olmo2", "GPTNeoXTokenizer"},
    {"olmoe", "GPTNeoXTokenizer"}, {"rwkv", "GPTNeoXTokenizer"}, {"stablelm", "GPTNeoXTokenizer"},
    {"xlstm", "GPTNeoXTokenizer"}, {"gemma", "GemmaTokenizer"}, {"gemma2", "GemmaTokenizer"},
    {"gemma3", "GemmaTokenizer"}, {"gemma3_text", "GemmaTokenizer"}, {"gemma3n", "GemmaTokenizer"},
    {"gemma3n_text", "GemmaTokenizer"}, {"recurrent_gemma", "GemmaTokenizer"}, {"shieldgemma2", "GemmaTokenizer"},
    {"siglip2", "GemmaTokenizer"}, {"t5gemma", "GemmaTokenizer"},
};

/* A JSON file of the folder: 0 absent (NULL), 1 read (*out), -1 failed (kept as encode's error). */
static int read_json(twk_tokenizer *t, const char *dir, const char *name, cJSON **out) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fclose(f);
    char *text = twk_read_file(path, NULL);
    if (!text) return twk_tok_enc_fail(t, TWK_ERR_IO, "%s: cannot read", path), -1;
    *out = cJSON_Parse(text);
    twk_host_free(text);
    if (!*out || !cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        return twk_tok_enc_fail(t, TWK_ERR_INVALID_ARG, "%s: not a JSON object", path), -1;
    }
    return 1;
}

/* The class CLASSES entry for tokenizer_class `s` ("Fast" dropped), or NULL. */
static const tok_class *find_class(const char *s) {
    size_t n = strlen(s);
    if (n > 4 && !strcmp(s + n - 4, "Fast")) n -= 4;
    for (size_t i = 0; i < sizeof CLASSES / sizeof *CLASSES; i++)
        if (strlen(CLASSES[i].name) == n && !memcmp(CLASSES[i].name, s, n)) return &CLASSES[i];
    return NULL;
}

/* Field k of o as a flag: 1 true, 0 false or null, def absent, -1 another type. */
static int flag(const cJSON *o, const char *k, int def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v) return def;
    if (cJSON_IsNull(v)) return 0;
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : -1;
}

/* Special token `k` (bos_token / eos_token): 1 found (*s NULL when it is null), 0 absent, -1 bad type. */
static int token_field(const cJSON *o, const char *k, const char **s) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    *s = NULL;
    if (!v) return 0;
    if (cJSON_IsNull(v)) return 1;
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v)) return -1;
    *s = v->valuestring;
    return 1;
}

/* Fills *id with the id of bos_token / eos_token (`which`) when `on`; 0 after keeping a failure. */
static int special_id(twk_tokenizer *t, const char *dir, const cJSON *cfg, const cJSON *stm, const tok_class *c,
                      const char *which, int on, int32_t *id) {
    const char *s = !strcmp(which, "bos_token") ? c->bos : c->eos, *v;
    const char *from = NULL;
    int r = token_field(stm, which, &v);
    if (r < 0) return twk_tok_enc_fail(t, TWK_ERR_INVALID_ARG, "%s/special_tokens_map.json: field '%s' must be a string "
                                       "or an object with a string 'content'", dir, which), 0;
    if (r > 0) s = v, from = "special_tokens_map.json";
    else if ((r = token_field(cfg, which, &v)) < 0)
        return twk_tok_enc_fail(t, TWK_ERR_INVALID_ARG, "%s/tokenizer_config.json: field '%s' must be a string or an "
                                "object with a string 'content'", dir, which), 0;
    else if (r > 0) s = v, from = "tokenizer_config.json";
    *id = -1;
    if (!on) return 1;
    if (!s)
        return twk_tok_enc_fail(t, TWK_ERR_INVALID_ARG, "%s/tokenizer_config.json: add_%s is true (given, or %s's "
                                "default) but %s is null", dir, which, c->name, which), 0;
    *id = twk_tokenizer_token_id(t, s, strlen(s));
    if (*id < 0) {
        char q[80];
        twk_tok_qs(s, strlen(s), q, sizeof q);
        if (from)
            return twk_tok_enc_fail(t, TWK_ERR_INVALID_ARG, "%s/%s: field '%s' (\"%s\") is not a token of tokenizer.json",
                                    dir, from, which, q), 0;
        return twk_tok_enc_fail(t, TWK_ERR_INVALID_ARG, "%s: %s is %s's default \"%s\", which is not a token of "
                                "tokenizer.json (set it in tokenizer_config.json)", dir, which, c->name, q), 0;
    }
    return 1;
}

void twk_tok_enc_config(twk_tokenizer *t, const char *file) {
    if (!twk_tok_enc_usable(t)) return;
    char dir[4096];
    const char *slash = strrchr(file, '/');
    if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash == file ? 1 : slash - file), file);
    else snprintf(dir, sizeof dir, ".");
    cJSON *cfg = NULL, *model = NULL, *stm = NULL;
    const tok_class *c = NULL;
    if (read_json(t, dir, "tokenizer_config.json", &cfg) < 0) goto done;
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(cfg, "tokenizer_class");
    if (cls && !cJSON_IsNull(cls) && !cJSON_IsString(cls)) {
        twk_tok_enc_fail(t, TWK_ERR_INVALID_ARG, "%s/tokenizer_config.json: field 'tokenizer_class' must be a string",
                         dir);
        goto done;
    }
    if (cJSON_IsString(cls)) {
        c = find_class(cls->valuestring);
    } else { /* no class named: config.json's, or its model type's */
        if (read_json(t, dir, "config.json", &model) < 0) goto done;
        const cJSON *mc = cJSON_GetObjectItemCaseSensitive(model, "tokenizer_class");
        const cJSON *mt = cJSON_GetObjectItemCaseSensitive(model, "model_type");
        if (cJSON_IsString(mc)) c = find_class(mc->valuestring);
        else if (cJSON_IsString(mt))
            for (size_t i = 0; i < sizeof MODEL_TYPES / sizeof *MODEL_TYPES && !c; i++)
                if (!strcmp(MODEL_TYPES[i].type, mt->valuestring)) c = find_class(MODEL_TYPES[i].cls);
    }
    if (!c) goto done; /* tokenizer.json's post-processor decides */
    int add_bos = flag(cfg, "add_bos_token", c->add_bos), add_eos = flag(cfg, "add_eos_token", c->add_eos);
    if (add_bos < 0 || add_eos < 0) {
        twk_tok_enc_fail(t, TWK_ERR_INVALID_ARG, "%s/tokenizer_config.json: field '%s' must be true, false or null", dir,
                         add_bos < 0 ? "add_bos_token" : "add_eos_token");
        goto done;
    }
    if (read_json(t, dir, "special_tokens_map.json", &stm) < 0) goto done;
    int32_t bos, eos;
    if (!special_id(t, dir, cfg, stm, c, "bos_token", add_bos, &bos) ||
        !special_id(t, dir, cfg, stm, c, "eos_token", add_eos, &eos))
        goto done;
    if (!twk_tok_enc_set_frame(t, &bos, add_bos, &eos, add_eos))
        twk_tok_enc_fail(t, TWK_ERR_OOM, "%s: out of memory", file);
done:
    cJSON_Delete(cfg);
    cJSON_Delete(model);
    cJSON_Delete(stm);
}
