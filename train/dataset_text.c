/* Text lines of a JSONL dataset as token ids and weights: pre-training text, prompt + completion,
 * chat messages through the model's chat template (token mask from the template's byte mask), and
 * preference pairs of either kind. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dataset_text.h"
#include "twinkle/hal.h"

static const char *const text_fields[] = {"text", "prompt", "completion", "messages", "chosen", "rejected"};

int twk_text_is_line(const cJSON *j) {
    for (size_t i = 0; i < sizeof text_fields / sizeof text_fields[0]; i++)
        if (cJSON_GetObjectItemCaseSensitive(j, text_fields[i])) return 1;
    return 0;
}

void twk_text_seq_free(twk_text_seq *s) {
    if (!s) return;
    twk_host_free(s->ids);
    twk_host_free(s->w);
    memset(s, 0, sizeof *s);
}

void twk_text_ctx_free(twk_text_ctx *c) {
    if (!c) return;
    twk_tokenizer_free(c->tok);
    twk_chat_template_free(c->tmpl);
    c->tok = NULL;
    c->tmpl = NULL;
}

/* The last error, prefixed with path:line: field. */
static twk_status wrap(twk_status st, const char *path, long lineno, const char *field) {
    char why[512];
    snprintf(why, sizeof why, "%s", twk_last_error());
    return twk_error(st, "%s:%ld: field '%s': %s", path, lineno, field, why);
}

/* The model folder's file `name` for `field`, loaded once into *c. */
static twk_status need(twk_text_ctx *c, int tmpl, const char *path, long lineno, const char *field) {
    if (tmpl ? c->tmpl != NULL : c->tok != NULL) return TWK_OK;
    const char *name = tmpl ? "tokenizer_config.json" : "tokenizer.json";
    if (!c->o->model_dir)
        return twk_error(TWK_ERR_INVALID_ARG, "%s:%ld: field '%s' needs a model folder with %s", path, lineno, field, name);
    char file[4200];
    snprintf(file, sizeof file, "%s/%s", c->o->model_dir, name);
    if (access(file, R_OK) != 0)
        return twk_error(TWK_ERR_IO, "%s:%ld: field '%s' needs %s, which is missing", path, lineno, field, file);
    twk_status st = tmpl ? twk_chat_template_load(file, &c->tmpl) : twk_tokenizer_load(file, &c->tok);
    return st == TWK_OK ? st : wrap(st, path, lineno, field);
}

/* Appends ids[0..n) (weight w on each) to seq. */
static twk_status append_ids(twk_text_seq *seq, const int32_t *ids, int64_t n, float w) {
    size_t had = (size_t)seq->n, want = (size_t)(seq->n + n + 1);
    int32_t *ni = twk_host_realloc(seq->ids, had * sizeof *ni, want * sizeof *ni, "dataset tokens");
    if (ni) seq->ids = ni;
    float *nw = ni ? twk_host_realloc(seq->w, had * sizeof *nw, want * sizeof *nw, "dataset weights") : NULL;
    if (nw) seq->w = nw;
    if (!ni || !nw) return twk_error(TWK_ERR_OOM, "dataset: out of memory");
    if (n) memcpy(seq->ids + seq->n, ids, (size_t)n * sizeof *ids);
    for (int64_t i = 0; i < n; i++) seq->w[seq->n + i] = w;
    seq->n += n;
    return TWK_OK;
}

enum { FRAME_PREFIX = 1, FRAME_SUFFIX = 2, FRAME_BOTH = 3 };

/* Appends the encoding of s without special tokens (weight w on each token) to seq, after the ids
 * add_special puts before a text when `frame` has FRAME_PREFIX and followed by those it puts after
 * one when it has FRAME_SUFFIX (both weighted w): a prompt and its completion, encoded apart, get
 * the framing tokenizer(prompt + completion) would give them. */
static twk_status append_text(twk_text_ctx *c, const char *s, int frame, float w, twk_text_seq *seq) {
    const int32_t *pre = NULL, *suf = NULL;
    int np = 0, ns = 0;
    twk_status st = frame ? twk_tokenizer_special_ids(c->tok, &pre, &np, &suf, &ns) : TWK_OK;
    if (st == TWK_OK && (frame & FRAME_PREFIX)) st = append_ids(seq, pre, np, w);
    int32_t *ids = NULL;
    int64_t n = 0;
    if (st == TWK_OK) st = twk_tokenizer_encode(c->tok, s, strlen(s), false, &ids, &n);
    if (st == TWK_OK) st = append_ids(seq, ids, n, w);
    twk_host_free(ids);
    if (st == TWK_OK && (frame & FRAME_SUFFIX)) st = append_ids(seq, suf, ns, w);
    return st;
}

/* Token weights from a byte mask: token i is trained when every byte it decodes to lies in the
 * mask (a token of no bytes is not). The tokens' bytes must spell text exactly. */
static twk_status mask_tokens(const twk_tokenizer *tok, const char *text, size_t len, const uint8_t *mask,
                              twk_text_seq *seq) {
    size_t off = 0;
    char buf[512];
    for (int64_t i = 0; i < seq->n; i++) {
        char *first = NULL;
        size_t blen = 0;
        const char *bytes = buf;
        if (i == 0) { /* the first token of a decode may differ from its token_bytes (a leading space) */
            if (twk_tokenizer_decode(tok, seq->ids, 1, false, &first, &blen) != TWK_OK) return TWK_ERR_INVALID_ARG;
            bytes = first;
        } else {
            int k = twk_tokenizer_token_bytes(tok, seq->ids[i], buf, (int)sizeof buf);
            if (k < 0 || k > (int)sizeof buf)
                return twk_error(TWK_ERR_INVALID_ARG, "token %d (id %d) has no bytes to map to the mask", (int)i, seq->ids[i]);
            blen = (size_t)k;
        }
        int ok = off + blen <= len && memcmp(bytes, text + off, blen) == 0, all = blen > 0;
        for (size_t b = 0; ok && b < blen; b++) all &= mask[off + b] != 0;
        twk_host_free(first);
        if (!ok)
            return twk_error(TWK_ERR_INVALID_ARG, "the tokens do not spell the rendered text at byte %zu (token %lld)",
                             off, (long long)i);
        seq->w[i] = all ? 1.0f : 0.0f;
        off += blen;
    }
    if (off != len) return twk_error(TWK_ERR_INVALID_ARG, "the tokens spell %zu of the %zu rendered bytes", off, len);
    return TWK_OK;
}

/* messages (+ optional prompt messages before them, + tools) rendered and masked under mode. */
static twk_status chat_seq(twk_text_ctx *c, const cJSON *prompt, const cJSON *msgs, const cJSON *tools,
                           twk_train_on mode, twk_text_seq *seq) {
    cJSON *req = cJSON_CreateObject(), *all = cJSON_CreateArray();
    cJSON_AddItemToObject(req, "messages", all);
    for (int p = 0; p < 2; p++)
        for (const cJSON *m = (p ? msgs : prompt) ? (p ? msgs : prompt)->child : NULL; m; m = m->next)
            cJSON_AddItemToArray(all, cJSON_Duplicate(m, 1));
    if (tools) cJSON_AddItemToObject(req, "tools", cJSON_Duplicate(tools, 1));
    char *json = cJSON_PrintUnformatted(req), *text = NULL;
    cJSON_Delete(req);
    size_t len = 0;
    uint8_t *mask = NULL;
    twk_status st = json ? twk_chat_render_mask(c->tmpl, json, mode, &text, &len, &mask)
                         : twk_error(TWK_ERR_OOM, "dataset: out of memory");
    if (st == TWK_OK) st = append_text(c, text, 0, 0.0f, seq);
    if (st == TWK_OK) st = mask_tokens(c->tok, text, len, mask, seq);
    cJSON_free(json);
    twk_host_free(text);
    twk_host_free(mask);
    return st;
}

/* Field `name` of j: a string (want 's'), an array (want 'a'), either ('e'), or absent (NULL). */
static twk_status field(const cJSON *j, const char *name, char want, int required, const char *path, long lineno,
                        const cJSON **out) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, name);
    *out = x && !cJSON_IsNull(x) ? x : NULL;
    if (!*out)
        return required ? twk_error(TWK_ERR_INVALID_ARG, "%s:%ld: field '%s' is missing", path, lineno, name) : TWK_OK;
    int is_s = cJSON_IsString(x), is_a = cJSON_IsArray(x);
    if ((want == 's' && !is_s) || (want == 'a' && !is_a) || (want == 'e' && !is_s && !is_a))
        return twk_error(TWK_ERR_INVALID_ARG, "%s:%ld: field '%s' must be %s", path, lineno, name,
                         want == 's' ? "a string" : want == 'a' ? "an array of messages" : "a string or an array of messages");
    return TWK_OK;
}

twk_status twk_text_line(twk_text_ctx *c, const cJSON *j, const char *path, long lineno, twk_text_seq seq[2],
                         int *n_seq) {
    memset(seq, 0, 2 * sizeof *seq);
    *n_seq = 1;
    const cJSON *text, *prompt, *completion, *msgs, *tools, *chosen, *rejected;
    const char *fname = "text";
    twk_status st = field(j, "text", 's', 0, path, lineno, &text);
    if (st == TWK_OK) st = field(j, "messages", 'a', 0, path, lineno, &msgs);
    if (st == TWK_OK) st = field(j, "tools", 'a', 0, path, lineno, &tools);
    if (st == TWK_OK) st = field(j, "chosen", 'e', 0, path, lineno, &chosen);
    if (st == TWK_OK) st = field(j, "rejected", 'e', 0, path, lineno, &rejected);
    if (st != TWK_OK) return st;
    if (chosen || rejected) { /* a preference pair */
        int chat = (chosen && cJSON_IsArray(chosen)) || (rejected && cJSON_IsArray(rejected));
        char want = chat ? 'a' : 's';
        st = field(j, "chosen", want, 1, path, lineno, &chosen);
        if (st == TWK_OK) st = field(j, "rejected", want, 1, path, lineno, &rejected);
        if (st == TWK_OK) st = field(j, "prompt", chat ? 'a' : 's', 0, path, lineno, &prompt);
        if (st == TWK_OK) st = need(c, 0, path, lineno, "chosen");
        if (st == TWK_OK && chat) st = need(c, 1, path, lineno, "chosen");
        *n_seq = 2;
        for (int k = 0; k < 2 && st == TWK_OK; k++) {
            const cJSON *side = k ? rejected : chosen;
            fname = k ? "rejected" : "chosen";
            if (chat) st = chat_seq(c, prompt, side, tools, TWK_TRAIN_ON_LAST, &seq[k]);
            else {
                if (prompt) st = append_text(c, prompt->valuestring, FRAME_PREFIX, 0.0f, &seq[k]);
                if (st == TWK_OK)
                    st = append_text(c, side->valuestring, prompt ? FRAME_SUFFIX : FRAME_BOTH, 1.0f, &seq[k]);
            }
        }
    } else if (msgs) {
        fname = "messages";
        st = need(c, 0, path, lineno, fname);
        if (st == TWK_OK) st = need(c, 1, path, lineno, fname);
        if (st == TWK_OK) st = chat_seq(c, NULL, msgs, tools, (twk_train_on)c->o->train_on, &seq[0]);
    } else if (text) {
        st = need(c, 0, path, lineno, fname);
        if (st == TWK_OK) st = append_text(c, text->valuestring, FRAME_BOTH, 1.0f, &seq[0]);
    } else {
        fname = "prompt";
        st = field(j, "prompt", 's', 1, path, lineno, &prompt);
        if (st == TWK_OK) st = field(j, "completion", 's', 1, path, lineno, &completion);
        if (st == TWK_OK) st = need(c, 0, path, lineno, fname);
        if (st == TWK_OK) st = append_text(c, prompt->valuestring, FRAME_PREFIX, 0.0f, &seq[0]);
        fname = "completion";
        if (st == TWK_OK) st = append_text(c, completion->valuestring, FRAME_SUFFIX, 1.0f, &seq[0]);
    }
    if (st != TWK_OK) {
        if (!strstr(twk_last_error(), path)) st = wrap(st, path, lineno, fname);
        twk_text_seq_free(&seq[0]);
        twk_text_seq_free(&seq[1]);
    }
    return st;
}
