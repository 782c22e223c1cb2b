/* Merging a LoRA adapter into its base model: W' = W + (alpha / r) · B·A for
 * every adapted weight, written as a Hugging Face folder in the base's dtype
 * (model.safetensors, the base's config and tokenizer files). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cJSON.h>

#include "safetensors.h"
#include "trainer_internal.h"

#define PEFT_PREFIX "base_model.model."

typedef struct merge_ctx {
    twk_safetensors *base, *ad;
    float scale;
    twk_st_entry *e;
    void **owned; /* buffers of merged tensors */
    int n, cap, used_pairs;
    int untie;    /* lm_head adapted on tied embeddings: lm_head.weight written, config untied */
} merge_ctx;

/* The adapter's lora_A / lora_B of base weight `name` ("....weight"), or NULL / NULL. Mixtral's
 * router, block_sparse_moe.gate in the checkpoint, is PEFT's mlp.gate (transformers 5's module). */
static void lora_pair(const merge_ctx *m, const char *name, const twk_st_tensor **a, const twk_st_tensor **b) {
    char k[600], mod[520];
    size_t n = strlen(name);
    *a = *b = NULL;
    if (n < 7 || strcmp(name + n - 7, ".weight") || n - 7 >= sizeof mod) return;
    snprintf(mod, sizeof mod, "%.*s", (int)(n - 7), name);
    char *bs = strstr(mod, ".block_sparse_moe.gate");
    if (bs && !strcmp(bs, ".block_sparse_moe.gate")) strcpy(bs, ".mlp.gate");
    snprintf(k, sizeof k, PEFT_PREFIX "%s.lora_A.weight", mod);
    *a = twk_st_find(m->ad, k);
    snprintf(k, sizeof k, PEFT_PREFIX "%s.lora_B.weight", mod);
    *b = twk_st_find(m->ad, k);
}

/* A mixture of experts' per-expert checkpoint matrix "<layer>.mlp.experts.<e>.<gate|up|down>_proj.weight"
 * (Mixtral "<layer>.block_sparse_moe.experts.<e>.<w1|w3|w2>.weight"): 1 with the layer prefix, the
 * expert and the projection (0 gate, 1 up, 2 down); 0 for any other tensor. */
static int expert_of(const char *name, char *layer, size_t cap, int *e, int *proj) {
    static const char *const qwen[3] = {"gate_proj", "up_proj", "down_proj"}, *const mixtral[3] = {"w1", "w3", "w2"};
    const char *p = strstr(name, ".mlp.experts."), *q = strstr(name, ".block_sparse_moe.experts.");
    const char *at = p ? p : q, *rest = p ? p + 13 : q ? q + 26 : NULL;
    if (!at || (size_t)(at - name) >= cap) return 0;
    char *end = NULL;
    long v = strtol(rest, &end, 10);
    if (end == rest || *end != '.' || v < 0 || v > 65535) return 0;
    for (int k = 0; k < 3; k++) {
        char want[32];
        snprintf(want, sizeof want, ".%s.weight", p ? qwen[k] : mixtral[k]);
        if (!strcmp(end, want)) {
            snprintf(layer, cap, "%.*s", (int)(at - name), name);
            *e = (int)v;
            *proj = k;
            return 1;
        }
    }
    return 0;
}

static twk_status push(merge_ctx *m, const char *name, twk_st_dtype dt, const twk_st_tensor *shape_of, const void *data,
                       void *owned) {
    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 64;
        twk_st_entry *e = twk_host_realloc(m->e, (size_t)m->cap * sizeof *e, (size_t)cap * sizeof *e, "merge entries");
        void **o =
            e ? twk_host_realloc(m->owned, (size_t)m->cap * sizeof *o, (size_t)cap * sizeof *o, "merge entries") : NULL;
        if (e) m->e = e;
        if (o) m->owned = o;
        if (!e || !o) {
            twk_host_free(owned);
            return twk_error(TWK_ERR_OOM, "merge: out of memory");
        }
        m->cap = cap;
    }
    twk_st_entry *x = &m->e[m->n];
    x->name = name;
    x->dtype = dt;
    x->ndim = shape_of->ndim;
    memcpy(x->shape, shape_of->shape, sizeof x->shape);
    x->data = data;
    m->owned[m->n++] = owned;
    return TWK_OK;
}

/* W (base tensor w) + scale · B·A, in w's dtype, appended as `out_name`. */
static twk_status merge_one(merge_ctx *m, const char *out_name, const twk_st_tensor *w, const twk_st_tensor *a,
                            const twk_st_tensor *b) {
    if (w->ndim != 2 || a->ndim != 2 || b->ndim != 2 || a->shape[1] != w->shape[1] || b->shape[0] != w->shape[0] ||
        a->shape[0] != b->shape[1])
        return twk_error(TWK_ERR_SHAPE, "merge: '%s' [%lld, %lld] does not fit lora_A [%lld, %lld] / lora_B [%lld, %lld]",
                         w->name, (long long)w->shape[0], (long long)w->shape[1], (long long)a->shape[0],
                         (long long)a->shape[1], (long long)b->shape[0], (long long)b->shape[1]);
    int64_t out = w->shape[0], in = w->shape[1], r = a->shape[0];
    float *W = twk_host_alloc((size_t)w->nelem * sizeof *W, "merge W"),
          *A = twk_host_alloc((size_t)a->nelem * sizeof *A, "merge A"),
          *B = twk_host_alloc((size_t)b->nelem * sizeof *B, "merge B");
    twk_status st = W && A && B ? TWK_OK : twk_error(TWK_ERR_OOM, "merge: out of memory for '%s'", w->name);
    if (st == TWK_OK) st = twk_st_to_f32(w, W);
    if (st == TWK_OK) st = twk_st_to_f32(a, A);
    if (st == TWK_OK) st = twk_st_to_f32(b, B);
    for (int64_t o = 0; st == TWK_OK && o < out; o++)
        for (int64_t i = 0; i < in; i++) {
            double d = 0;
            for (int64_t k = 0; k < r; k++) d += (double)B[o * r + k] * A[k * in + i];
            W[o * in + i] = (float)((double)W[o * in + i] + (double)m->scale * d);
        }
    twk_host_free(A);
    twk_host_free(B);
    void *buf = W;
    if (st == TWK_OK && w->dtype != TWK_ST_F32) { /* back to the base's dtype, in place (2 <= 4 bytes) */
        st = twk_st_from_f32(w->dtype, W, w->nelem, W);
    }
    if (st != TWK_OK) {
        twk_host_free(buf);
        return st;
    }
    m->used_pairs++;
    return push(m, out_name, w->dtype, w, buf, buf);
}

/* Expert e's matrix w + scale · Σ_j B[row0 + o, j E + e] A[e r + j] (PEFT's ParamWrapper on the fused
 * stack: A [r E, in], B [rows, r E]; gate_up_proj's B holds gate's rows, then up's), appended. */
static twk_status merge_expert(merge_ctx *m, const twk_st_tensor *w, const twk_st_tensor *a, const twk_st_tensor *b,
                               int64_t E, int64_t e, int64_t row0) {
    if (w->ndim != 2 || a->ndim != 2 || b->ndim != 2 || E < 1 || a->shape[0] % E || a->shape[0] != b->shape[1] ||
        a->shape[1] != w->shape[1] || b->shape[0] < row0 + w->shape[0])
        return twk_error(TWK_ERR_SHAPE, "merge: expert '%s' [%lld, %lld] does not fit lora_A [%lld, %lld] / lora_B [%lld, %lld] "
                         "of %lld experts", w->name, (long long)w->shape[0], (long long)w->shape[1], (long long)a->shape[0],
                         (long long)a->shape[1], (long long)b->shape[0], (long long)b->shape[1], (long long)E);
    int64_t out = w->shape[0], in = w->shape[1], rE = a->shape[0], r = rE / E;
    float *W = twk_host_alloc((size_t)w->nelem * sizeof *W, "merge W"),
          *A = twk_host_alloc((size_t)a->nelem * sizeof *A, "merge A"),
          *B = twk_host_alloc((size_t)b->nelem * sizeof *B, "merge B");
    twk_status st = W && A && B ? TWK_OK : twk_error(TWK_ERR_OOM, "merge: out of memory for '%s'", w->name);
    if (st == TWK_OK) st = twk_st_to_f32(w, W);
    if (st == TWK_OK) st = twk_st_to_f32(a, A);
    if (st == TWK_OK) st = twk_st_to_f32(b, B);
    for (int64_t o = 0; st == TWK_OK && o < out; o++)
        for (int64_t i = 0; i < in; i++) {
            double d = 0;
            for (int64_t j = 0; j < r; j++) d += (double)B[(row0 + o) * rE + j * E + e] * A[(e * r + j) * in + i];
            W[o * in + i] = (float)((double)W[o * in + i] + (double)m->scale * d);
        }
    twk_host_free(A);
    twk_host_free(B);
    if (st == TWK_OK && w->dtype != TWK_ST_F32) st = twk_st_from_f32(w->dtype, W, w->nelem, W);
    if (st != TWK_OK) {
        twk_host_free(W);
        return st;
    }
    return push(m, w->name, w->dtype, w, W, W);
}

/* The number of experts: one more than the largest expert index of the base's expert matrices. */
static int64_t base_experts(const merge_ctx *m) {
    int64_t n = 0;
    char layer[512];
    for (int i = 0; i < twk_st_count(m->base); i++) {
        int e, proj;
        if (expert_of(twk_st_at(m->base, i)->name, layer, sizeof layer, &e, &proj) && e + 1 > n) n = e + 1;
    }
    return n;
}

static twk_status merge_tensors(merge_ctx *m) {
    twk_status st = TWK_OK;
    int64_t E = base_experts(m);
    for (int i = 0; st == TWK_OK && i < twk_st_count(m->base); i++) {
        const twk_st_tensor *w = twk_st_at(m->base, i), *a, *b;
        char layer[512], k[600];
        int e, proj;
        if (expert_of(w->name, layer, sizeof layer, &e, &proj)) { /* the experts' fused adapters */
            const char *which = proj < 2 ? ".base_layer" : "";
            snprintf(k, sizeof k, PEFT_PREFIX "%s.mlp.experts%s.lora_A.weight", layer, which);
            a = twk_st_find(m->ad, k);
            snprintf(k, sizeof k, PEFT_PREFIX "%s.mlp.experts%s.lora_B.weight", layer, which);
            b = twk_st_find(m->ad, k);
            if (!a != !b) return twk_error(TWK_ERR_INVALID_ARG, "merge: the adapter has only one of lora_A / lora_B of '%s'", k);
            if (!a) {
                st = push(m, w->name, w->dtype, w, w->data, NULL);
                continue;
            }
            st = merge_expert(m, w, a, b, E, e, proj == 1 ? w->shape[0] : 0);
            if (st == TWK_OK && e == 0 && proj != 1) m->used_pairs++; /* each stack's pair once */
            continue;
        }
        lora_pair(m, w->name, &a, &b);
        if (!a != !b) return twk_error(TWK_ERR_INVALID_ARG, "merge: the adapter has only one of lora_A / lora_B of '%s'", w->name);
        st = a ? merge_one(m, w->name, w, a, b) : push(m, w->name, w->dtype, w, w->data, NULL);
    }
    const twk_st_tensor *a, *b, *emb = twk_st_find(m->base, "model.embed_tokens.weight");
    lora_pair(m, "lm_head.weight", &a, &b);
    if (st == TWK_OK && a && b && !twk_st_find(m->base, "lm_head.weight")) {
        if (!emb) return twk_error(TWK_ERR_INVALID_ARG, "merge: the base has neither lm_head.weight nor embed_tokens");
        m->untie = 1; /* tied embeddings: the adapted lm_head becomes its own weight */
        st = merge_one(m, "lm_head.weight", emb, a, b);
    }
    int pairs = 0;
    for (int i = 0; i < twk_st_count(m->ad); i++) {
        const char *k = twk_st_at(m->ad, i)->name;
        if (strstr(k, ".lora_A.weight")) pairs++;
        else if (!strstr(k, ".lora_B.weight") && !strstr(k, ".base_layer.weight"))
            return twk_error(TWK_ERR_UNSUPPORTED, "merge: adapter tensor '%s' is not a LoRA A/B matrix", k);
    }
    if (st == TWK_OK && pairs != m->used_pairs)
        st = twk_error(TWK_ERR_INVALID_ARG, "merge: %d of the adapter's %d LoRA pairs name no weight of the base model",
                       pairs - m->used_pairs, pairs);
    return st;
}

/* Copies the base folder's other files (config, generation config, tokenizer); config.json
 * gets tie_word_embeddings false when the merge untied lm_head. */
static twk_status copy_side_files(const char *base_dir, const char *out_dir, int untie) {
    DIR *d = opendir(base_dir);
    if (!d) return twk_error(TWK_ERR_IO, "merge: cannot read %s: %s", base_dir, strerror(errno));
    twk_status st = TWK_OK;
    struct dirent *e;
    while (st == TWK_OK && (e = readdir(d))) {
        const char *n = e->d_name, *dot = strrchr(n, '.');
        char from[4200], to[4200];
        struct stat sb;
        snprintf(from, sizeof from, "%s/%s", base_dir, n);
        if (n[0] == '.' || stat(from, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        if (dot && (!strcmp(dot, ".safetensors") || !strcmp(dot, ".bin") || !strcmp(dot, ".pt") || !strcmp(dot, ".pth") ||
                    !strcmp(dot, ".gguf") || !strcmp(n, "model.safetensors.index.json")))
            continue; /* weights: replaced by the merged model.safetensors */
        size_t len = 0;
        char *text = twk_read_file(from, &len);
        if (!text) {
            st = TWK_ERR_IO;
            break;
        }
        char *edited = NULL;
        if (untie && !strcmp(n, "config.json")) {
            cJSON *j = cJSON_Parse(text);
            if (j) {
                cJSON_DeleteItemFromObjectCaseSensitive(j, "tie_word_embeddings");
                cJSON_AddBoolToObject(j, "tie_word_embeddings", 0);
                edited = cJSON_Print(j);
                cJSON_Delete(j);
            }
            if (!edited) st = twk_error(TWK_ERR_INVALID_ARG, "merge: %s is not JSON", from);
        }
        snprintf(to, sizeof to, "%s/%s", out_dir, n);
        if (st == TWK_OK) st = twk_write_file_atomic(to, edited ? edited : text, edited ? strlen(edited) : len);
        cJSON_free(edited);
        twk_host_free(text);
    }
    closedir(d);
    return st;
}

twk_status twk_adapter_merge(const char *base_dir, const char *adapter_dir, const char *out_dir) {
    twk_lora_config lc;
    twk_status st = twk_adapter_read_config(adapter_dir, &lc);
    if (st != TWK_OK) return st;
    char path[4200];
    merge_ctx m = {0};
    m.scale = lc.alpha / (float)lc.rank;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", adapter_dir);
    st = twk_st_open(path, &m.ad);
    if (st == TWK_OK) st = twk_st_open(base_dir, &m.base);
    if (st == TWK_OK) st = merge_tensors(&m);
    if (st == TWK_OK) st = twk_mkdir_p(out_dir, 0755);
    if (st == TWK_OK) {
        snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
        const char *meta[2] = {"format", "pt"};
        st = twk_st_write(path, m.e, m.n, meta, 1);
    }
    if (st == TWK_OK) st = copy_side_files(base_dir, out_dir, m.untie);
    for (int i = 0; i < m.n; i++) twk_host_free(m.owned[i]);
    twk_host_free(m.e);
    twk_host_free(m.owned);
    if (m.base) twk_st_close(m.base);
    if (m.ad) twk_st_close(m.ad);
    return st;
}
