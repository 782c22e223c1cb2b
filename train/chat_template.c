/* Chat templates (include/twinkle/chat.h): tokenizer_config.json, transformers' message
 * normalization, rendering and the assistant loss mask. The language is train/jinja_*.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cJSON.h>

#include "jinja.h"
#include "safetensors.h"
#include "twinkle/chat.h"
#include "twinkle/hal.h"

/* transformers' special_tokens_map: the named special tokens every template sees */
static const char *const SPECIAL[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                      "pad_token", "cls_token", "mask_token"};
enum { NSPECIAL = sizeof SPECIAL / sizeof SPECIAL[0] };

struct twk_chat_template {
    jj_template *tmpl;
    char *special[NSPECIAL]; /* NULL: not set; [1] is the eos token (end of turn for the mask) */
};

twk_status twk_train_on_parse(const char *s, twk_train_on *out) {
    static const char *names[] = {"all", "assistant", "last"};
    for (int i = 0; i < 3; i++)
        if (s && strcmp(s, names[i]) == 0) {
            *out = (twk_train_on)i;
            return TWK_OK;
        }
    return twk_error(TWK_ERR_INVALID_ARG, "train-on: '%s' is not one of all, assistant, last", s ? s : "(null)");
}

static char *dup_or_null(const char *s) {
    if (!s) return NULL;
    return twk_host_strdup(s, "chat template token");
}

/* A template with the special tokens tokens[0..NSPECIAL) (entries may be NULL). */
static twk_status template_new(const char *source, const char *const *tokens, twk_chat_template **out) {
    if (!source || !out) return twk_error(TWK_ERR_INVALID_ARG, "twk_chat_template_new: NULL argument");
    *out = NULL;
    twk_chat_template *t = twk_host_calloc(sizeof *t, "chat template");
    if (!t) return twk_error(TWK_ERR_OOM, "chat template: out of memory");
    for (int i = 0; i < NSPECIAL; i++)
        if (tokens[i] && !(t->special[i] = dup_or_null(tokens[i]))) {
            twk_chat_template_free(t);
            return twk_error(TWK_ERR_OOM, "chat template: out of memory");
        }
    twk_status st = jj_parse(source, strlen(source), &t->tmpl);
    if (st) {
        twk_chat_template_free(t);
        return st;
    }
    *out = t;
    return TWK_OK;
}

twk_status twk_chat_template_new(const char *source, const char *bos_token, const char *eos_token,
                                 twk_chat_template **out) {
    const char *tokens[NSPECIAL] = {bos_token, eos_token};
    return template_new(source, tokens, out);
}

void twk_chat_template_free(twk_chat_template *t) {
    if (!t) return;
    jj_template_free(t->tmpl);
    for (int i = 0; i < NSPECIAL; i++) twk_host_free(t->special[i]);
    twk_host_free(t);
}

/* A special token in tokenizer_config.json: a string or an AddedToken object's "content". */
static const char *token_str(const cJSON *j) {
    if (cJSON_IsString(j)) return j->valuestring;
    if (cJSON_IsObject(j)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

twk_status twk_chat_template_load(const char *path, twk_chat_template **out) {
    if (!path || !out) return twk_error(TWK_ERR_INVALID_ARG, "twk_chat_template_load: NULL argument");
    *out = NULL;
    char file[4096];
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) snprintf(file, sizeof file, "%s/tokenizer_config.json", path);
    else snprintf(file, sizeof file, "%s", path);
    char *text = twk_read_file(file, NULL);
    if (!text) return twk_error(TWK_ERR_IO, "%s: cannot read", file);
    cJSON *j = cJSON_Parse(text);
    twk_host_free(text);
    if (!j) return twk_error(TWK_ERR_INVALID_ARG, "%s: not valid JSON", file);
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(j, "chat_template");
    const char *src = NULL;
    if (cJSON_IsString(ct)) src = ct->valuestring;
    else if (cJSON_IsArray(ct)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, ct) {
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name"),
                        *tt = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (cJSON_IsString(n) && strcmp(n->valuestring, "default") == 0 && cJSON_IsString(tt))
                src = tt->valuestring;
        }
    }
    twk_status st;
    if (!src)
        st = twk_error(TWK_ERR_NOT_FOUND, "%s: no field 'chat_template' (a string, or a list with a \"default\" entry)",
                       file);
    else {
        const char *tokens[NSPECIAL];
        for (int i = 0; i < NSPECIAL; i++) tokens[i] = token_str(cJSON_GetObjectItemCaseSensitive(j, SPECIAL[i]));
        st = template_new(src, tokens, out);
    }
    cJSON_Delete(j);
    return st;
}

static jj_val S(jj_arena *a, const char *s) { return jj_str(a, s, strlen(s)); }

/* transformers: drop null-valued keys; alias reasoning_content / thinking / reasoning. */
static twk_status normalize_message(jj_arena *a, size_t idx, jj_val *m) {
    if (m->kind != JJ_DICT) return twk_error(TWK_ERR_INVALID_ARG, "request: messages[%zu] is not an object", idx);
    jj_dict *src = m->u.dict, *d = jj_dict_new(a);
    if (!d) return twk_error(TWK_ERR_OOM, "chat template: out of memory");
    static const char *rf[] = {"reasoning_content", "thinking", "reasoning"};
    jj_val *reasoning = NULL;
    for (int i = 0; i < 3 && !reasoning; i++) {
        jj_val *v = jj_dict_get(src, rf[i], strlen(rf[i]));
        if (v && v->kind != JJ_NONE) reasoning = v;
    }
    bool ok = true;
    if (reasoning) ok = jj_dict_set(a, d, S(a, "thinking"), *reasoning);
    for (size_t i = 0; ok && i < src->n; i++)
        if (src->v[i].kind != JJ_NONE) ok = jj_dict_set(a, d, src->k[i], src->v[i]);
    if (ok && reasoning) ok = jj_dict_set(a, d, S(a, "reasoning_content"), *reasoning);
    if (!ok) return twk_error(TWK_ERR_OOM, "chat template: out of memory");
    m->u.dict = d;
    return TWK_OK;
}

/* Parses the request and renders it; *msgs gets the (normalized) messages list. */
static twk_status render(const twk_chat_template *t, jj_arena *a, const char *req, int force_agp, jj_output *o,
                         jj_list **msgs) {
    if (!t || !req) return twk_error(TWK_ERR_INVALID_ARG, "twk_chat_render: NULL argument");
    jj_val r;
    twk_status st = jj_from_json(a, req, strlen(req), &r);
    if (st) return twk_error(st, "request: %s", twk_last_error());
    if (r.kind != JJ_DICT) return twk_error(TWK_ERR_INVALID_ARG, "request: not a JSON object");
    jj_val *m = jj_dict_get(r.u.dict, "messages", 8);
    if (!m || m->kind != JJ_LIST) return twk_error(TWK_ERR_INVALID_ARG, "request: field 'messages' must be an array");
    for (size_t i = 0; i < m->u.list->n; i++)
        if ((st = normalize_message(a, i, &m->u.list->v[i]))) return st;
    jj_dict *vars = jj_dict_new(a);
    if (!vars) return twk_error(TWK_ERR_OOM, "chat template: out of memory");
    bool ok = true;
    for (int i = 0; i < NSPECIAL; i++)
        if (t->special[i]) ok = ok && jj_dict_set(a, vars, S(a, SPECIAL[i]), S(a, t->special[i]));
    ok = ok && jj_dict_set(a, vars, S(a, "tools"), (jj_val){.kind = JJ_NONE});
    ok = ok && jj_dict_set(a, vars, S(a, "documents"), (jj_val){.kind = JJ_NONE});
    ok = ok && jj_dict_set(a, vars, S(a, "add_generation_prompt"), (jj_val){.kind = JJ_BOOL, .u.b = false});
    for (size_t i = 0; ok && i < r.u.dict->n; i++) ok = jj_dict_set(a, vars, r.u.dict->k[i], r.u.dict->v[i]);
    if (ok && force_agp >= 0)
        ok = jj_dict_set(a, vars, S(a, "add_generation_prompt"), (jj_val){.kind = JJ_BOOL, .u.b = force_agp != 0});
    if (!ok) return twk_error(TWK_ERR_OOM, "chat template: out of memory");
    *msgs = m->u.list;
    return jj_render(t->tmpl, a, vars, m->u.list, o);
}

twk_status twk_chat_render(const twk_chat_template *t, const char *request_json, char **out, size_t *len) {
    if (!out) return twk_error(TWK_ERR_INVALID_ARG, "twk_chat_render: NULL out");
    *out = NULL;
    jj_arena *a = jj_arena_new();
    if (!a) return twk_error(TWK_ERR_OOM, "chat template: out of memory");
    jj_output o;
    jj_list *msgs;
    twk_status st = render(t, a, request_json, -1, &o, &msgs);
    jj_arena_free(a);
    if (st) return st;
    *out = o.text.p;
    if (len) *len = o.text.n;
    o.text.p = NULL;
    jj_output_free(&o);
    return TWK_OK;
}

static bool is_assistant(const jj_val *m) {
    jj_val *role = jj_dict_get(m->u.dict, "role", 4);
    return role && role->kind == JJ_STR && role->u.str.n == 9 && memcmp(role->u.str.s, "assistant", 9) == 0;
}

twk_status twk_chat_render_mask(const twk_chat_template *t, const char *request_json, twk_train_on mode, char **out,
                                size_t *len, uint8_t **mask) {
    if (!out || !mask) return twk_error(TWK_ERR_INVALID_ARG, "twk_chat_render_mask: NULL out");
    if (mode > TWK_TRAIN_ON_LAST) return twk_error(TWK_ERR_INVALID_ARG, "train-on: bad mode %d", (int)mode);
    *out = NULL;
    *mask = NULL;
    jj_arena *a = jj_arena_new();
    if (!a) return twk_error(TWK_ERR_OOM, "chat template: out of memory");
    jj_output o = {0}, g0 = {0}, g1 = {0};
    jj_list *msgs;
    twk_status st = render(t, a, request_json, -1, &o, &msgs);
    /* the generation prompt: render(add_generation_prompt=true) less render(false), when a prefix */
    if (!st) st = render(t, a, request_json, 0, &g0, &msgs);
    if (!st) st = render(t, a, request_json, 1, &g1, &msgs);
    uint8_t *mk = st ? NULL : twk_host_calloc(o.text.n + 1, "chat template mask");
    if (!st && !mk) st = twk_error(TWK_ERR_OOM, "chat template: out of memory");
    if (st) goto done;
    const char *gp = "";
    size_t gn = 0;
    if (g1.text.n >= g0.text.n && memcmp(g1.text.p, g0.text.p, g0.text.n) == 0) {
        gp = g1.text.p + g0.text.n;
        gn = g1.text.n - g0.text.n;
    }
    size_t n = o.text.n;
    int64_t spans_cap = (int64_t)(msgs->n + o.nspans + 1);
    int64_t(*sp)[2] = twk_host_calloc((size_t)spans_cap * sizeof *sp, "chat template spans");
    if (!sp) {
        st = twk_error(TWK_ERR_OOM, "chat template: out of memory");
        goto done;
    }
    size_t ns = 0;
    if (jj_template_has_generation(t->tmpl)) {
        for (size_t i = 0; i < o.nspans; i++)
            if (o.spans[i][1] > o.spans[i][0]) {
                sp[ns][0] = o.spans[i][0];
                sp[ns++][1] = o.spans[i][1];
            }
    } else {
        /* first byte, last byte + 1 of each message */
        size_t *lohi = twk_host_calloc((2 * msgs->n + 1) * sizeof(size_t), "chat template spans");
        if (!lohi) {
            twk_host_free(sp);
            st = twk_error(TWK_ERR_OOM, "chat template: out of memory");
            goto done;
        }
        for (size_t k = 0; k < msgs->n; k++) lohi[2 * k] = n;
        for (size_t i = 0; i < n; i++) {
            int32_t k = o.owner[i];
            if (k < 0) continue;
            if (lohi[2 * k] == n) lohi[2 * k] = i;
            lohi[2 * k + 1] = i + 1;
        }
        for (size_t k = 0; k < msgs->n; k++) {
            if (!is_assistant(&msgs->v[k])) continue;
            size_t lo = lohi[2 * k], hi = lohi[2 * k + 1];
            if (lo >= hi) continue;
            /* the header: the longest prefix shared with the generation prompt; short of the whole
             * prompt it is cut back to its last newline (content may begin like the prompt's tail) */
            size_t h = 0;
            while (h < gn && lo + h < hi && o.text.p[lo + h] == gp[h]) h++;
            if (h < gn)
                while (h > 0 && gp[h - 1] != '\n') h--;
            size_t end = hi;
            const char *eos = t->special[1];
            if (eos && *eos) {
                size_t el = strlen(eos);
                for (size_t i = hi; i >= lo + h + el; i--)
                    if (memcmp(o.text.p + i - el, eos, el) == 0) {
                        end = i;
                        break;
                    }
            }
            if (lo + h < end) {
                sp[ns][0] = (int64_t)(lo + h);
                sp[ns++][1] = (int64_t)end;
            }
        }
        twk_host_free(lohi);
    }
    /* last: the spans written for the message of the last span (generation blocks may be several
     * per message), or the last span alone when it was written outside the messages loop */
    int32_t last_owner = ns ? o.owner[sp[ns - 1][0]] : -1;
    if (mode == TWK_TRAIN_ON_ALL) memset(mk, 1, n);
    else
        for (size_t s = 0; s < ns; s++)
            if (mode == TWK_TRAIN_ON_ASSISTANT || s == ns - 1 || (last_owner >= 0 && o.owner[sp[s][0]] == last_owner))
                memset(mk + sp[s][0], 1, (size_t)(sp[s][1] - sp[s][0]));
    twk_host_free(sp);
    *out = o.text.p;
    if (len) *len = n;
    o.text.p = NULL;
    *mask = mk;
done:
    if (st) twk_host_free(mk);
    jj_output_free(&o);
    jj_output_free(&g0);
    jj_output_free(&g1);
    jj_arena_free(a);
    return st;
}
