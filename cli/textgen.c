/* Text prompts and replies for `twinkle sample` and `twinkle chat` (textgen.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cJSON.h>

#include "textgen.h"
#include "twinkle/hal.h"

char *twk_read_text_file(const char *path) {
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n = f && fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n)
        buf[n] = 0;
    else {
        free(buf);
        buf = NULL;
        twk_error(TWK_ERR_IO, "cannot read %s", path);
    }
    if (f) fclose(f);
    return buf;
}

/* tokenizer_config.json's eos_token (a string or {"content": ...}) as an id, or -1. */
static int32_t config_eos(const twk_textgen *g) {
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", g->model_dir);
    char *buf = access(path, R_OK) == 0 ? twk_read_text_file(path) : NULL;
    cJSON *j = buf ? cJSON_Parse(buf) : NULL;
    free(buf);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "eos_token");
    if (cJSON_IsObject(e)) e = cJSON_GetObjectItemCaseSensitive(e, "content");
    int32_t id = cJSON_IsString(e) ? twk_tokenizer_token_id(g->tok, e->valuestring, strlen(e->valuestring)) : -1;
    cJSON_Delete(j);
    return id;
}

twk_status twk_textgen_open(const char *model_dir, const twk_model_config *c, twk_textgen *g) {
    memset(g, 0, sizeof *g);
    g->model_dir = model_dir;
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", model_dir);
    if (access(path, R_OK) != 0) return twk_error(TWK_ERR_IO, "text prompts need %s, which is missing", path);
    twk_status st = twk_tokenizer_load(path, &g->tok);
    if (st != TWK_OK) return st;
    for (int i = 0; i < c->n_eos; i++) g->stop[g->n_stop++] = c->eos[i];
    int32_t eos = config_eos(g);
    int dup = 0;
    for (int i = 0; i < g->n_stop; i++) dup |= g->stop[i] == eos;
    if (eos >= 0 && !dup) g->stop[g->n_stop++] = eos;
    return TWK_OK;
}

void twk_textgen_close(twk_textgen *g) {
    twk_tokenizer_free(g->tok);
    twk_chat_template_free(g->tmpl);
    memset(g, 0, sizeof *g);
}

twk_status twk_textgen_encode_text(twk_textgen *g, const char *text, int32_t **ids, int64_t *n) {
    return twk_tokenizer_encode(g->tok, text, strlen(text), true, ids, n);
}

twk_status twk_textgen_encode_chat(twk_textgen *g, const char *json, int32_t **ids, int64_t *n) {
    if (!g->tmpl) {
        char path[4200];
        snprintf(path, sizeof path, "%s/tokenizer_config.json", g->model_dir);
        if (access(path, R_OK) != 0) return twk_error(TWK_ERR_IO, "conversations need %s, which is missing", path);
        twk_status st = twk_chat_template_load(path, &g->tmpl);
        if (st != TWK_OK) return st;
    }
    cJSON *j = cJSON_Parse(json);
    if (!j) return twk_error(TWK_ERR_INVALID_ARG, "the conversation is not JSON");
    if (cJSON_IsArray(j)) { /* a bare list of messages */
        cJSON *req = cJSON_CreateObject();
        cJSON_AddItemToObject(req, "messages", j);
        j = req;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(j, "add_generation_prompt");
    cJSON_AddTrueToObject(j, "add_generation_prompt");
    char *req = cJSON_PrintUnformatted(j), *text = NULL;
    cJSON_Delete(j);
    size_t len = 0;
    twk_status st = req ? twk_chat_render(g->tmpl, req, &text, &len) : twk_error(TWK_ERR_OOM, "out of memory");
    if (st == TWK_OK) st = twk_tokenizer_encode(g->tok, text, len, false, ids, n);
    cJSON_free(req);
    twk_host_free(text);
    return st;
}

twk_status twk_textgen_decode(twk_textgen *g, const int32_t *ids, int64_t n, char **out, int64_t *unknown) {
    int32_t *keep = malloc((size_t)(n ? n : 1) * sizeof *keep);
    if (!keep) return twk_error(TWK_ERR_OOM, "out of memory");
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        if (twk_tokenizer_token_bytes(g->tok, ids[i], NULL, 0) >= 0) keep[k++] = ids[i];
    *unknown = n - k;
    twk_status st = twk_tokenizer_decode(g->tok, keep, k, true, out, NULL);
    free(keep);
    return st;
}

int twk_cli_sample_option(const char *o, const char *v, twk_sample_params *p, char **end) {
    if (!strcmp(o, "--max-tokens")) p->max_tokens = (int)strtol(v, end, 10);
    else if (!strcmp(o, "--temperature")) p->temperature = strtof(v, end);
    else if (!strcmp(o, "--top-k")) p->top_k = (int)strtol(v, end, 10);
    else if (!strcmp(o, "--top-p")) p->top_p = strtof(v, end);
    else if (!strcmp(o, "--seed")) {
        p->seed = strtoull(v, end, 10);
        p->has_seed = 1;
    } else
        return 0;
    return 1;
}
