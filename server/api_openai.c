/* OpenAI-compatible endpoints: GET /v1/models, POST /v1/completions and
 * POST /v1/chat/completions (stream: true as server-sent events). Text is
 * encoded with the model folder's tokenizer.json, chats rendered with its
 * chat_template, and the tokens decoded by the same shared decode batches as
 * Tinker's asample (svc_generate). Errors in OpenAI's shape:
 * {"error": {"message", "type", "param", "code"}}. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "api_util.h"
#include "svc.h"

#define OAI_MAX_N 64        /* choices per request */
#define OAI_MAX_STOP 4      /* stop strings (OpenAI's limit) */
#define OAI_MAX_STOP_LEN 256
#define OAI_MAX_TOP 20      /* top_logprobs */
#define OAI_COMPLETION_DEFAULT_MAX 16 /* OpenAI's default max_tokens for /v1/completions */

/* OpenAI's error object {"error": {...}}; param and code may be NULL (JSON null). */
static cJSON *error_json(int status, const char *param, const char *code, const char *msg) {
    const char *type = status == 401   ? "authentication_error"
                       : status == 404 ? "not_found_error"
                       : status == 429 ? "rate_limit_error"
                       : status >= 500 ? "server_error"
                                       : "invalid_request_error";
    cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", type);
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNullToObject(e, "code");
    return j;
}

/* The message of an error answered with status (formatted and logged by api_failure_message). */
static void error_message(char *msg, size_t cap, int status, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void error_message(char *msg, size_t cap, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    api_failure_message(msg, cap, status, fmt, ap);
    va_end(ap);
}

/* Answers an OpenAI-shaped error; param and code may be NULL (JSON null). */
static void oai_error(twk_http_conn *c, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void oai_error(twk_http_conn *c, int status, const char *param, const char *code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    api_failure_message(msg, sizeof msg, status, fmt, ap);
    va_end(ap);
    cJSON *j = error_json(status, param, code, msg);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    twk_http_respond_json(c, status, s ? s : "{\"error\":{\"message\":\"out of memory\"}}");
    cJSON_free(s);
}

/* ---- text: UTF-8 cleaning and per-token chunks ---- */

/* Appends s[0..n) to out with each maximal ill-formed UTF-8 subpart replaced by U+FFFD (as Python's
 * decode("utf-8", "replace")), and a NUL byte too (JSON strings here are C strings: a NUL would cut
 * the text); out has room for 3n bytes. Returns the bytes written. */
static size_t utf8_clean(const unsigned char *p, size_t n, char *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        unsigned c = p[i], lo = 0x80, hi = 0xBF;
        size_t need;
        if (c < 0x80 && c) {
            out[o++] = (char)c;
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c == 0xE0) need = 2, lo = 0xA0;
        else if (c == 0xED) need = 2, hi = 0x9F;
        else if (c >= 0xE1 && c <= 0xEF) need = 2;
        else if (c == 0xF0) need = 3, lo = 0x90;
        else if (c == 0xF4) need = 3, hi = 0x8F;
        else if (c >= 0xF1 && c <= 0xF3) need = 3;
        else need = 0;
        size_t j = 1;
        while (need && j <= need && i + j < n && p[i + j] >= (j == 1 ? lo : 0x80) && p[i + j] <= (j == 1 ? hi : 0xBF))
            j++;
        if (need && j == need + 1) {
            memcpy(out + o, p + i, j);
            o += j;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
        }
        i += j;
    }
    return o;
}

/* One sequence's text: the decode of its tokens (special tokens skipped) cut before the first stop
 * string, and where each token's part of it ends (chunk i = text[end[i-1] .. end[i])), cut at
 * character boundaries so streamed chunks are valid UTF-8 and concatenate to the text. */
typedef struct seq_text {
    char *text;   /* NUL-terminated, valid UTF-8 */
    size_t *end;  /* n entries */
    int stopped;  /* a stop string cut it */
    int64_t n_done; /* partial (streamed while decoding): the tokens whose parts are in text */
    size_t raw_done; /* and the bytes of the raw decode they end at */
} seq_text;

static void seq_text_free(seq_text *t) {
    twk_host_free(t->text);
    twk_host_free(t->end);
}

/* The whole text (partial 0), or while decoding (partial 1) only the parts of tokens [from, ...) that
 * no later token can change, from byte raw_from of the raw decode on: a part whose raw end is not
 * at least `hold` (the longest stop string) bytes before the decode's end (or its stop cut) waits. */
static int seq_text_part(const twk_tokenizer *tok, const twk_sampled_seq *q, char (*stops)[OAI_MAX_STOP_LEN + 1],
                         int n_stops, int partial, int64_t from, size_t raw_from, size_t hold, seq_text *t) {
    memset(t, 0, sizeof *t);
    /* ids the tokenizer has no token for (a model vocab larger than the tokenizer's) decode to nothing */
    int32_t *ids = twk_host_alloc((size_t)q->n * 4 + 4, "completion ids");
    int64_t *upto = twk_host_alloc((size_t)q->n * 8 + 8, "completion ids"), nv = 0;
    char *raw = NULL;
    size_t rlen = 0;
    for (int64_t i = 0; ids && upto && i < q->n; i++) {
        if (twk_tokenizer_token_bytes(tok, q->tokens[i], NULL, 0) >= 0) ids[nv++] = q->tokens[i];
        upto[i] = nv;
    }
    if (!ids || !upto || twk_tokenizer_decode(tok, ids, nv, true, &raw, &rlen) != TWK_OK) {
        twk_host_free(ids);
        twk_host_free(upto);
        return 0;
    }
    size_t cut = rlen;
    for (int i = 0; i < n_stops; i++) {
        char *f = memmem(raw, rlen, stops[i], strlen(stops[i]));
        if (f && (size_t)(f - raw) < cut) cut = (size_t)(f - raw), t->stopped = 1;
    }
    t->end = twk_host_calloc(((size_t)q->n + 1) * sizeof *t->end, "completion text");
    t->text = twk_host_alloc(3 * cut + 1, "completion text");
    size_t prev = raw_from < cut ? raw_from : cut, o = 0;
    t->n_done = from;
    for (int64_t i = from; t->end && t->text && i < q->n; i++) {
        size_t b = cut;
        if (partial && i + 1 >= q->n) break;
        if (i + 1 < q->n) { /* the raw length of the first i+1 tokens' decode (a prefix of the whole) */
            char *part = NULL;
            size_t plen = 0;
            if (twk_tokenizer_decode(tok, ids, upto[i], true, &part, &plen) == TWK_OK) b = plen < cut ? plen : cut;
            twk_host_free(part);
            if (partial && b + hold >= cut) break; /* later tokens may still change it */
            while (b > prev && b < rlen && ((unsigned char)raw[b] & 0xC0) == 0x80) b--; /* not inside a character */
        }
        if (b < prev) b = prev;
        o += utf8_clean((const unsigned char *)raw + prev, b - prev, t->text + o);
        t->end[i] = o;
        prev = b;
        t->n_done = i + 1;
    }
    t->raw_done = prev;
    twk_host_free(raw);
    twk_host_free(ids);
    twk_host_free(upto);
    if (!t->end || !t->text) {
        seq_text_free(t);
        return 0;
    }
    t->text[o] = 0;
    return 1;
}

static int seq_text_make(const twk_tokenizer *tok, const twk_sampled_seq *q, char (*stops)[OAI_MAX_STOP_LEN + 1],
                         int n_stops, seq_text *t) {
    return seq_text_part(tok, q, stops, n_stops, 0, 0, 0, 0, t);
}

/* ---- the request's state while it decodes ---- */

typedef struct oai_job {
    svc *s;
    twk_http_conn *c; /* NULL once the client went away */
    int chat, stream, include_usage;
    int logprobs, top_k; /* per-token logprobs wanted; top alternatives per token */
    char model[600];
    char id[96];
    long long created;
    const twk_tokenizer *tok;
    int64_t n_prompt;
    twk_sample_params p;
    int32_t stop_ids[8];
    char stop_str[OAI_MAX_STOP][OAI_MAX_STOP_LEN + 1];
    const char *stop_ptr[OAI_MAX_STOP];
    int n_stop_str;
    /* a stream: its head is sent; per choice, the bytes of its text sent while decoding */
    int began, n_choices;
    size_t sent[OAI_MAX_N];
    int64_t n_done[OAI_MAX_N]; /* per choice: the tokens whose text was sent, and their raw decode's end */
    size_t raw_done[OAI_MAX_N];
} oai_job;

static void job_abandoned(twk_http_conn *c, void *user) {
    (void)c;
    ((oai_job *)user)->c = NULL;
}

/* A token as text (its bytes, cleaned) and its raw bytes as a JSON array. */
static void add_token(cJSON *o, const char *key, const twk_tokenizer *tok, int32_t id, cJSON **bytes_out) {
    char buf[256], clean[3 * 256 + 1];
    int n = twk_tokenizer_token_bytes(tok, id, buf, sizeof buf);
    if (n < 0) n = 0;
    if (n > (int)sizeof buf) n = (int)sizeof buf;
    clean[utf8_clean((const unsigned char *)buf, (size_t)n, clean)] = 0;
    cJSON_AddStringToObject(o, key, clean);
    if (bytes_out) {
        *bytes_out = cJSON_CreateArray();
        for (int i = 0; i < n; i++) cJSON_AddItemToArray(*bytes_out, cJSON_CreateNumber((unsigned char)buf[i]));
    }
}

/* The logprobs of tokens [from, to) of sequence i: chat's {"content": [...]} entries, or the
 * completions' {tokens, token_logprobs, top_logprobs, text_offset}. */
static cJSON *logprobs_json(const oai_job *jb, const svc_gen_result *r, int i, int64_t from, int64_t to,
                            const seq_text *t) {
    const twk_sampled_seq *q = &r->seqs[i];
    cJSON *lp = cJSON_CreateObject();
    if (jb->chat) {
        cJSON *content = cJSON_AddArrayToObject(lp, "content");
        for (int64_t k = from; k < to; k++) {
            cJSON *e = cJSON_CreateObject(), *bytes;
            add_token(e, "token", jb->tok, q->tokens[k], &bytes);
            cJSON_AddNumberToObject(e, "logprob", q->logprobs[k]);
            cJSON_AddItemToObject(e, "bytes", bytes);
            cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
            for (int a = 0; a < jb->top_k; a++) {
                cJSON *te = cJSON_CreateObject(), *tb;
                add_token(te, "token", jb->tok, r->top_ids[i][k * jb->top_k + a], &tb);
                cJSON_AddNumberToObject(te, "logprob", r->top_lps[i][k * jb->top_k + a]);
                cJSON_AddItemToObject(te, "bytes", tb);
                cJSON_AddItemToArray(tops, te);
            }
            cJSON_AddItemToArray(content, e);
        }
        return lp;
    }
    cJSON *toks = cJSON_AddArrayToObject(lp, "tokens"), *tlp = cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON *tops = jb->top_k > 0 ? cJSON_AddArrayToObject(lp, "top_logprobs") : NULL;
    if (!tops) cJSON_AddNullToObject(lp, "top_logprobs");
    cJSON *off = cJSON_AddArrayToObject(lp, "text_offset");
    for (int64_t k = from; k < to; k++) {
        cJSON *holder = cJSON_CreateObject();
        add_token(holder, "t", jb->tok, q->tokens[k], NULL);
        cJSON_AddItemToArray(toks, cJSON_CreateString(cJSON_GetObjectItem(holder, "t")->valuestring));
        cJSON_Delete(holder);
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber(q->logprobs[k]));
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(k ? t->end[k - 1] : 0)));
        if (tops) {
            cJSON *m = cJSON_CreateObject();
            for (int a = 0; a < jb->top_k; a++) {
                cJSON *h = cJSON_CreateObject();
                add_token(h, "t", jb->tok, r->top_ids[i][k * jb->top_k + a], NULL);
                const char *key = cJSON_GetObjectItem(h, "t")->valuestring;
                if (!cJSON_GetObjectItemCaseSensitive(m, key))
                    cJSON_AddNumberToObject(m, key, r->top_lps[i][k * jb->top_k + a]);
                cJSON_Delete(h);
            }
            cJSON_AddItemToArray(tops, m);
        }
    }
    return lp;
}

static const char *finish_reason(const twk_sampled_seq *q, const seq_text *t) {
    return t->stopped || q->stop_reason == TWK_STOP_TOKEN ? "stop" : "length";
}

static cJSON *envelope(const oai_job *jb, const char *object) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", jb->id);
    cJSON_AddStringToObject(j, "object", object);
    cJSON_AddNumberToObject(j, "created", (double)jb->created);
    cJSON_AddStringToObject(j, "model", jb->model);
    return j;
}

static cJSON *usage_json(const oai_job *jb, const svc_gen_result *r) {
    long long gen = 0;
    for (int i = 0; i < r->n; i++) gen += r->seqs[i].n;
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)jb->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)gen);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(jb->n_prompt + gen));
    return u;
}

/* Sends one server-sent event (and frees it); 0 when the client is gone or out of memory. */
static int sse_send(oai_job *jb, cJSON *event) {
    char *s = event ? cJSON_PrintUnformatted(event) : NULL;
    cJSON_Delete(event);
    size_t len = s ? strlen(s) : 0;
    char *line = s ? twk_host_alloc(len + 9, "stream event") : NULL;
    int ok = 0;
    if (line && jb->c) {
        memcpy(line, "data: ", 6);
        memcpy(line + 6, s, len);
        memcpy(line + 6 + len, "\n\n", 2);
        ok = twk_http_stream_write(jb->c, line, len + 8) == 0;
    }
    twk_host_free(line);
    cJSON_free(s);
    return ok;
}

/* One stream event of choice i: a text part, its tokens' logprobs, a finish reason. */
static cJSON *chunk_event(const oai_job *jb, int i, const char *text, int first, cJSON *lp, const char *finish) {
    cJSON *ev = envelope(jb, jb->chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(ev, "choices"), *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", i);
    if (jb->chat) {
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        if (first) cJSON_AddStringToObject(d, "role", "assistant");
        if (text) cJSON_AddStringToObject(d, "content", text);
    } else {
        cJSON_AddStringToObject(ch, "text", text ? text : "");
    }
    if (lp) cJSON_AddItemToObject(ch, "logprobs", lp);
    else cJSON_AddNullToObject(ch, "logprobs");
    if (finish) cJSON_AddStringToObject(ch, "finish_reason", finish);
    else cJSON_AddNullToObject(ch, "finish_reason");
    cJSON_AddItemToArray(choices, ch);
    return ev;
}

/* Sends the stream's head (and, for chat, each choice's role) once; 0 when the client is gone. */
static int stream_begin(oai_job *jb) {
    if (jb->began) return jb->c != NULL;
    if (!jb->c || twk_http_stream_begin(jb->c, 200, "text/event-stream", "Cache-Control: no-cache\r\n") != 0)
        return 0;
    jb->began = 1;
    for (int i = 0; jb->chat && i < jb->n_choices; i++)
        if (!sse_send(jb, chunk_event(jb, i, "", 1, NULL, NULL))) return 0;
    return 1;
}

/* Loop thread, while decoding: choice i's parts that no later token can change (as the final text
 * has them: seq_text_part) as one event. */
static void job_step(void *ctx, int i, const int32_t *tokens, int64_t n) {
    oai_job *jb = ctx;
    if (!stream_begin(jb)) return;
    size_t hold = 0;
    for (int k = 0; k < jb->n_stop_str; k++) hold = strlen(jb->stop_str[k]) > hold ? strlen(jb->stop_str[k]) : hold;
    twk_sampled_seq q = {.tokens = (int32_t *)tokens, .n = n};
    seq_text t;
    if (!seq_text_part(jb->tok, &q, jb->stop_str, jb->n_stop_str, 1, jb->n_done[i], jb->raw_done[i], hold, &t)) return;
    size_t len = strlen(t.text);
    if (t.n_done > jb->n_done[i] && (!len || sse_send(jb, chunk_event(jb, i, t.text, 0, NULL, NULL)))) {
        jb->n_done[i] = t.n_done;
        jb->raw_done[i] = t.raw_done;
        jb->sent[i] += len;
    }
    seq_text_free(&t);
}

/* The rest of the stream once decoding finished: what was not sent of each choice's text (token by
 * token with its logprobs when asked; those streams start here), the finish reasons, usage, [DONE]. */
static void respond_stream(oai_job *jb, const svc_gen_result *r, seq_text *texts) {
    if (!stream_begin(jb)) return;
    int ok = 1;
    for (int i = 0; ok && i < r->n; i++) {
        const twk_sampled_seq *q = &r->seqs[i];
        size_t prev = jb->sent[i], len = strlen(texts[i].text);
        if (prev > len) prev = len;
        for (int64_t k = 0; ok && jb->logprobs && k < q->n; k++) {
            size_t e = texts[i].end[k];
            char save = texts[i].text[e];
            texts[i].text[e] = 0;
            ok = sse_send(jb, chunk_event(jb, i, texts[i].text + prev, 0, logprobs_json(jb, r, i, k, k + 1, &texts[i]), NULL));
            texts[i].text[e] = save;
            prev = e;
        }
        if (ok && !jb->logprobs && len > prev) ok = sse_send(jb, chunk_event(jb, i, texts[i].text + prev, 0, NULL, NULL));
        if (ok) ok = sse_send(jb, chunk_event(jb, i, jb->chat ? NULL : "", 0, NULL, finish_reason(q, &texts[i])));
    }
    if (ok && jb->include_usage) {
        cJSON *ev = envelope(jb, jb->chat ? "chat.completion.chunk" : "text_completion");
        cJSON_AddArrayToObject(ev, "choices");
        cJSON_AddItemToObject(ev, "usage", usage_json(jb, r));
        ok = sse_send(jb, ev);
    }
    static const char done[] = "data: [DONE]\n\n";
    if (ok) twk_http_stream_write(jb->c, done, sizeof done - 1);
    if (jb->c) twk_http_stream_end(jb->c);
}

static void respond_whole(oai_job *jb, const svc_gen_result *r, seq_text *texts) {
    cJSON *j = envelope(jb, jb->chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(j, "choices");
    for (int i = 0; i < r->n; i++) {
        const twk_sampled_seq *q = &r->seqs[i];
        cJSON *ch = cJSON_CreateObject();
        cJSON_AddNumberToObject(ch, "index", i);
        if (jb->chat) {
            cJSON *m = cJSON_AddObjectToObject(ch, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddStringToObject(m, "content", texts[i].text);
        } else {
            cJSON_AddStringToObject(ch, "text", texts[i].text);
        }
        if (jb->logprobs) cJSON_AddItemToObject(ch, "logprobs", logprobs_json(jb, r, i, 0, q->n, &texts[i]));
        else cJSON_AddNullToObject(ch, "logprobs");
        cJSON_AddStringToObject(ch, "finish_reason", finish_reason(q, &texts[i]));
        cJSON_AddItemToObject(ch, "token_ids", cJSON_CreateIntArray(q->tokens, (int)q->n)); /* twinkle's extension */
        cJSON_AddItemToArray(choices, ch);
    }
    cJSON_AddItemToObject(j, "usage", usage_json(jb, r));
    api_ok(jb->c, j);
}

/* A failure after decoding: an error response, or in a stream already begun an error event and
 * the stream's end. */
static void job_fail(oai_job *jb, int status, const char *what, const char *detail) {
    if (!jb->began) {
        oai_error(jb->c, status, NULL, NULL, "%s%s", what, detail);
        return;
    }
    char msg[1024];
    error_message(msg, sizeof msg, status, "%s%s", what, detail);
    sse_send(jb, error_json(status, NULL, NULL, msg));
    if (jb->c) twk_http_stream_end(jb->c);
}

/* Loop thread: the decoded sequences, answered as JSON or a stream. */
static void job_done(void *ctx, const svc_gen_result *r) {
    oai_job *jb = ctx;
    if (jb->c) {
        if (!jb->began) twk_http_set_abandon(jb->c, NULL, NULL); /* a stream keeps it until its end */
        twk_log_context(NULL, jb->chat ? "v1/chat/completions" : "v1/completions");
        if (!r->ok) {
            job_fail(jb, r->user_error ? 400 : 500, "", r->err);
        } else {
            seq_text *texts = twk_host_calloc((size_t)r->n * sizeof *texts, "completion text");
            int ok = texts != NULL;
            for (int i = 0; ok && i < r->n; i++)
                ok = seq_text_make(jb->tok, &r->seqs[i], jb->stop_str, jb->n_stop_str, &texts[i]);
            if (!ok) job_fail(jb, 500, "decoding the sampled tokens failed: ", twk_last_error());
            else if (jb->stream) respond_stream(jb, r, texts);
            else respond_whole(jb, r, texts);
            for (int i = 0; texts && i < r->n; i++) seq_text_free(&texts[i]);
            twk_host_free(texts);
        }
    }
    twk_host_free(jb);
}

/* ---- requests ---- */

/* The model's chat template, loaded on first use; NULL with a 400 answered naming what is missing. */
static const twk_chat_template *chat_template(twk_http_conn *c, base_model *bm) {
    if (!bm->chat_tried) {
        bm->chat_tried = 1;
        twk_status st = twk_chat_template_load(bm->dir, &bm->chat);
        if (st == TWK_ERR_NOT_FOUND)
            snprintf(bm->chat_err, sizeof bm->chat_err,
                     "model '%s' has no chat template: %s/tokenizer_config.json has no 'chat_template' "
                     "(/v1/completions takes plain text)",
                     bm->name, bm->dir);
        else if (st != TWK_OK)
            snprintf(bm->chat_err, sizeof bm->chat_err, "model '%s': its chat template cannot be used: %s", bm->name,
                     twk_last_error());
    }
    if (!bm->chat) oai_error(c, 400, "model", "model_not_supported", "%s", bm->chat_err);
    return bm->chat;
}

/* The chat's messages as the template takes them: content given as a list of text parts joined. */
static cJSON *chat_request(const cJSON *b, const char **bad) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(b, "messages");
    if (!cJSON_IsArray(msgs) || !cJSON_GetArraySize(msgs)) {
        *bad = "'messages' must be a non-empty list of messages";
        return NULL;
    }
    cJSON *req = cJSON_CreateObject(), *out = cJSON_AddArrayToObject(req, "messages");
    for (const cJSON *m = msgs->child; m; m = m->next) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            *bad = "each message must be an object with a string 'role'";
            cJSON_Delete(req);
            return NULL;
        }
        cJSON *copy = cJSON_Duplicate(m, 1);
        cJSON *content = cJSON_GetObjectItemCaseSensitive(copy, "content");
        if (cJSON_IsArray(content)) {
            size_t len = 1;
            for (const cJSON *part = content->child; part; part = part->next) {
                const cJSON *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
                const cJSON *ty = cJSON_GetObjectItemCaseSensitive(part, "type");
                if (!cJSON_IsString(tx) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "text")) {
                    *bad = "message content parts must be {\"type\": \"text\", \"text\": ...} (no images or audio)";
                    cJSON_Delete(copy);
                    cJSON_Delete(req);
                    return NULL;
                }
                len += strlen(tx->valuestring);
            }
            char *joined = twk_host_calloc(len, "message content");
            for (const cJSON *part = content->child; joined && part; part = part->next)
                strcat(joined, cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring);
            cJSON_ReplaceItemInObjectCaseSensitive(copy, "content", cJSON_CreateString(joined ? joined : ""));
            twk_host_free(joined);
        }
        cJSON_AddItemToArray(out, copy);
    }
    cJSON_AddBoolToObject(req, "add_generation_prompt", 1);
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(b, "tools");
    if (cJSON_IsArray(tools)) cJSON_AddItemToObject(req, "tools", cJSON_Duplicate(tools, 1));
    return req;
}

/* The prompt's token ids (free with twk_host_free); NULL with an error answered. */
static int32_t *prompt_ids(twk_http_conn *c, const cJSON *b, int chat, base_model *bm, int64_t *n) {
    int vocab = twk_model_cfg(bm->m)->vocab;
    int32_t *ids = NULL;
    if (chat) {
        const twk_chat_template *t = chat_template(c, bm);
        if (!t) return NULL;
        const char *bad = NULL;
        cJSON *req = chat_request(b, &bad);
        if (!req) {
            oai_error(c, 400, "messages", NULL, "%s", bad);
            return NULL;
        }
        char *rj = cJSON_PrintUnformatted(req), *text = NULL;
        size_t len = 0;
        cJSON_Delete(req);
        twk_status st = rj ? twk_chat_render(t, rj, &text, &len) : TWK_ERR_OOM;
        cJSON_free(rj);
        if (st != TWK_OK) {
            oai_error(c, 400, "messages", NULL, "rendering the chat template failed: %s", twk_last_error());
            return NULL;
        }
        st = twk_tokenizer_encode(bm->tok, text, len, false, &ids, n);
        twk_host_free(text);
        if (st != TWK_OK) {
            oai_error(c, 400, "messages", NULL, "encoding the rendered chat failed: %s", twk_last_error());
            return NULL;
        }
    } else {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(b, "prompt");
        if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
            p = p->child; /* a list of one prompt */
        if (cJSON_IsString(p)) {
            if (twk_tokenizer_encode(bm->tok, p->valuestring, strlen(p->valuestring), true, &ids, n) != TWK_OK) {
                oai_error(c, 400, "prompt", NULL, "encoding the prompt failed: %s", twk_last_error());
                return NULL;
            }
        } else if (cJSON_IsArray(p) && cJSON_IsNumber(p->child)) {
            *n = cJSON_GetArraySize(p);
            ids = twk_host_alloc((size_t)*n * 4, "prompt ids");
            int64_t k = 0;
            for (const cJSON *t = p->child; ids && t; t = t->next, k++) {
                if (!cJSON_IsNumber(t) || t->valuedouble != (double)(int32_t)t->valuedouble || t->valuedouble < 0 ||
                    t->valuedouble >= vocab) {
                    oai_error(c, 400, "prompt", NULL, "prompt token %lld is not a token id in [0, %d)", (long long)k, vocab);
                    twk_host_free(ids);
                    return NULL;
                }
                ids[k] = (int32_t)t->valuedouble;
            }
        } else {
            oai_error(c, 400, "prompt", NULL,
                      "'prompt' must be a string or a list of token ids (one prompt per request on this server)");
            return NULL;
        }
    }
    if (!ids) oai_error(c, 503, NULL, NULL, "out of memory");
    return ids;
}

/* Refuses what this server does not do, naming the parameter; 1 if the request is clear of it. */
static int unsupported(twk_http_conn *c, const cJSON *b, int chat) {
    static const char *zero_nums[] = {"presence_penalty", "frequency_penalty"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, zero_nums[i]);
        if (v && !cJSON_IsNull(v) && !(cJSON_IsNumber(v) && v->valuedouble == 0)) {
            oai_error(c, 400, zero_nums[i], "unsupported_parameter", "'%s' is not supported by this server (0 or absent)",
                      zero_nums[i]);
            return 0;
        }
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, "logit_bias");
    if (v && !cJSON_IsNull(v) && !(cJSON_IsObject(v) && !v->child)) {
        oai_error(c, 400, "logit_bias", "unsupported_parameter", "'logit_bias' is not supported by this server");
        return 0;
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "echo"))) {
        oai_error(c, 400, "echo", "unsupported_parameter", "'echo' is not supported by this server");
        return 0;
    }
    v = cJSON_GetObjectItemCaseSensitive(b, "best_of");
    if (!chat && v && !cJSON_IsNull(v) && !(cJSON_IsNumber(v) && v->valuedouble == 1)) {
        oai_error(c, 400, "best_of", "unsupported_parameter", "'best_of' other than 1 is not supported by this server");
        return 0;
    }
    v = cJSON_GetObjectItemCaseSensitive(b, "suffix");
    if (!chat && v && !cJSON_IsNull(v)) {
        oai_error(c, 400, "suffix", "unsupported_parameter", "'suffix' is not supported by this server");
        return 0;
    }
    return 1;
}

/* Fills jb's sampling parameters; 0 with a 400 naming the parameter. */
static int parse_params(twk_http_conn *c, const cJSON *b, oai_job *jb, base_model *bm, int64_t room, int *n_out) {
    char err[300];
    long long max_tokens, n, seed = 0, top_k, top_lp = 0, lp_n = 0;
    double temp, top_p;
    const char *mt_key = jb->chat && cJSON_GetObjectItemCaseSensitive(b, "max_completion_tokens") ? "max_completion_tokens"
                                                                                                 : "max_tokens";
    long long def_max = jb->chat ? room : (room < OAI_COMPLETION_DEFAULT_MAX ? room : OAI_COMPLETION_DEFAULT_MAX);
#define CHECK(ok, key)                                                                                                \
    if (!(ok)) {                                                                                                      \
        oai_error(c, 400, key, "invalid_value", "%s", err);                                                           \
        return 0;                                                                                                     \
    }
    CHECK(api_int(b, mt_key, 0, 1, 1 << 30, def_max, &max_tokens, err, sizeof err), mt_key);
    CHECK(api_int(b, "n", 0, 1, OAI_MAX_N, 1, &n, err, sizeof err), "n");
    CHECK(api_num(b, "temperature", 0, 1.0, &temp, err, sizeof err), "temperature");
    CHECK(api_num(b, "top_p", 0, 1.0, &top_p, err, sizeof err), "top_p");
    CHECK(api_int(b, "top_k", 0, -1, 1 << 30, -1, &top_k, err, sizeof err), "top_k");
    CHECK(api_int(b, "seed", 0, -(1ll << 62), 1ll << 62, 0, &seed, err, sizeof err), "seed");
    CHECK(api_bool(b, "stream", 0, &jb->stream, err, sizeof err), "stream");
    if (jb->chat) {
        CHECK(api_bool(b, "logprobs", 0, &jb->logprobs, err, sizeof err), "logprobs");
        CHECK(api_int(b, "top_logprobs", 0, 0, OAI_MAX_TOP, 0, &top_lp, err, sizeof err), "top_logprobs");
        if (top_lp > 0 && !jb->logprobs) {
            oai_error(c, 400, "top_logprobs", "invalid_value", "'top_logprobs' needs 'logprobs': true");
            return 0;
        }
    } else {
        const cJSON *lp = cJSON_GetObjectItemCaseSensitive(b, "logprobs");
        CHECK(api_int(b, "logprobs", 0, 0, 5, 0, &lp_n, err, sizeof err), "logprobs");
        jb->logprobs = lp && !cJSON_IsNull(lp);
        top_lp = lp_n;
    }
#undef CHECK
    if (max_tokens > room) {
        oai_error(c, 400, mt_key, "context_length_exceeded",
                  "'%s' %lld with a %lld-token prompt exceeds the context length %lld", mt_key, max_tokens,
                  (long long)jb->n_prompt, (long long)(room + jb->n_prompt));
        return 0;
    }
    if (temp < 0 || temp > 2) {
        oai_error(c, 400, "temperature", "invalid_value", "'temperature' %g must be in [0, 2]", temp);
        return 0;
    }
    if (!(top_p > 0 && top_p <= 1)) {
        oai_error(c, 400, "top_p", "invalid_value", "'top_p' %g must be in (0, 1]", top_p);
        return 0;
    }
    if (top_k == 0) {
        oai_error(c, 400, "top_k", "invalid_value", "'top_k' 0 is not allowed (-1 turns it off)");
        return 0;
    }
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(b, "stream_options");
    jb->include_usage = jb->stream && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(so, "include_usage"));
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(b, "stop");
    if (stop && !cJSON_IsNull(stop)) {
        int bad = !cJSON_IsString(stop) && !cJSON_IsArray(stop);
        const cJSON *e = cJSON_IsString(stop) ? stop : stop->child;
        for (; !bad && e; e = cJSON_IsString(stop) ? NULL : e->next) {
            if (!cJSON_IsString(e) || !e->valuestring[0] || strlen(e->valuestring) > OAI_MAX_STOP_LEN ||
                jb->n_stop_str == OAI_MAX_STOP) {
                bad = 1;
                break;
            }
            snprintf(jb->stop_str[jb->n_stop_str], sizeof jb->stop_str[0], "%s", e->valuestring);
            jb->stop_ptr[jb->n_stop_str] = jb->stop_str[jb->n_stop_str];
            jb->n_stop_str++;
        }
        if (bad) {
            oai_error(c, 400, "stop", "invalid_value", "'stop' must be a string or a list of at most %d non-empty strings "
                      "of at most %d bytes", OAI_MAX_STOP, OAI_MAX_STOP_LEN);
            return 0;
        }
    }
    const twk_model_config *mc = twk_model_cfg(bm->m);
    int n_eos = mc->n_eos < 8 ? mc->n_eos : 8;
    for (int i = 0; i < n_eos; i++) jb->stop_ids[i] = mc->eos[i];
    const cJSON *sv = cJSON_GetObjectItemCaseSensitive(b, "seed");
    jb->p = (twk_sample_params){.max_tokens = (int)max_tokens, .temperature = (float)temp, .top_k = (int)top_k,
                                .top_p = (float)top_p, .seed = (uint64_t)seed, .has_seed = sv && !cJSON_IsNull(sv),
                                .stop_tokens = jb->stop_ids, .n_stop_tokens = n_eos, .stop_strings = jb->stop_ptr,
                                .n_stop_strings = jb->n_stop_str, .tokenizer = bm->tok};
    jb->top_k = (int)top_lp;
    *n_out = (int)n;
    return 1;
}

static void h_generate(svc *s, twk_http_conn *c, const twk_http_req *req, const char *tenant, int chat) {
    const char *model;
    char err[600];
    if (!api_json_check(req->body, req->body_len, err, sizeof err)) {
        oai_error(c, 400, NULL, "invalid_json", "%s", err);
        return;
    }
    cJSON *b = cJSON_ParseWithLength((const char *)req->body, req->body_len);
    if (!b) {
        oai_error(c, 400, NULL, "invalid_json", "the request body is not a JSON object");
        return;
    }
    oai_job *jb = NULL;
    int32_t *ids = NULL;
    if (!api_str(b, "model", 1, &model, err, sizeof err)) {
        oai_error(c, 400, "model", NULL, "%s", err);
        goto out;
    }
    if (!unsupported(c, b, chat)) goto out;
    int is_path = !strncmp(model, "tinker://", 9);
    if (!is_path && !svc_find_model(s, model)) {
        oai_error(c, 404, "model", "model_not_found", "The model '%s' does not exist (GET /v1/models lists them)", model);
        goto out;
    }
    char id[160];
    if (strlen(model) + strlen(tenant) + 6 >= sizeof id) {
        oai_error(c, 400, "model", NULL, "'model' is too long");
        goto out;
    }
    snprintf(id, sizeof id, "oai:%s:%s", tenant, model);
    int status;
    sampler_session *ss =
        svc_session_for(s, tenant, id, is_path ? NULL : model, is_path ? model : NULL, "model", "model", &status, err, sizeof err);
    if (!ss) {
        oai_error(c, status, "model", status == 404 ? "model_not_found" : NULL, "%s", err);
        goto out;
    }
    base_model *bm = ss->base;
    if (!bm->tok) {
        oai_error(c, 400, "model", "model_not_supported",
                  "model '%s' has no usable tokenizer: %s/tokenizer.json is %s; the /v1 endpoints need it to encode "
                  "and decode text (Tinker's asample takes token ids)",
                  model, bm->dir, bm->has_tokenizer ? "not loadable" : "missing");
        goto out;
    }
    jb = twk_host_calloc(sizeof *jb, "completion job");
    if (!jb) {
        oai_error(c, 503, NULL, NULL, "out of memory");
        goto out;
    }
    *jb = (oai_job){.s = s, .c = c, .chat = chat, .created = (long long)time(NULL), .tok = bm->tok};
    snprintf(jb->model, sizeof jb->model, "%s", model);
    svc_new_id(s, chat ? "chatcmpl" : "cmpl", jb->id, sizeof jb->id);
    ids = prompt_ids(c, b, chat, bm, &jb->n_prompt);
    if (!ids) goto out;
    if (jb->n_prompt < 1 || jb->n_prompt >= s->cfg.max_context) {
        oai_error(c, 400, chat ? "messages" : "prompt", "context_length_exceeded",
                  "the prompt has %lld tokens; it must be 1..%lld", (long long)jb->n_prompt,
                  (long long)s->cfg.max_context - 1);
        goto out;
    }
    int n;
    if (!parse_params(c, b, jb, bm, s->cfg.max_context - jb->n_prompt, &n)) goto out;
    jb->n_choices = n;
    /* streamed while decoding, except with logprobs (their top alternatives are scored at the end) */
    status = svc_generate(s, ss, ids, jb->n_prompt, n, &jb->p, jb->top_k, job_done,
                          jb->stream && !jb->logprobs ? job_step : NULL, jb, err, sizeof err);
    ids = NULL; /* taken */
    if (status) {
        oai_error(c, status, NULL, NULL, "%s", err);
        goto out;
    }
    twk_http_set_abandon(c, job_abandoned, jb);
    jb = NULL; /* job_done frees it */
out:
    twk_host_free(ids);
    twk_host_free(jb);
    cJSON_Delete(b);
}

static void h_models(svc *s, twk_http_conn *c, const char *tenant) {
    cJSON *j = cJSON_CreateObject(), *data;
    cJSON_AddStringToObject(j, "object", "list");
    data = cJSON_AddArrayToObject(j, "data");
    for (int i = 0; i < s->n_models; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "id", s->models[i].name);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", 0);
        cJSON_AddStringToObject(m, "owned_by", "twinkle");
        cJSON_AddItemToArray(data, m);
    }
    for (int offset = 0;;) { /* the tenant's sampler checkpoints, newest first */
        twk_store_ckpt *ck = NULL;
        int got = 0, total = 0;
        if (twk_store_ckpt_list(s->store, tenant, NULL, 1000, offset, &ck, &got, &total) != TWK_OK) {
            cJSON_Delete(j);
            oai_error(c, 500, NULL, NULL, "listing checkpoints failed: %s", twk_last_error());
            return;
        }
        for (int i = 0; i < got; i++) {
            if (strncmp(ck[i].checkpoint_id, "sampler_weights/", 16)) continue;
            char path[400];
            snprintf(path, sizeof path, "tinker://%s/%s", ck[i].run_id, ck[i].checkpoint_id);
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "id", path);
            cJSON_AddStringToObject(m, "object", "model");
            cJSON_AddNumberToObject(m, "created", (double)(long long)ck[i].created);
            cJSON_AddStringToObject(m, "owned_by", tenant);
            cJSON_AddItemToArray(data, m);
        }
        twk_host_free(ck);
        offset += got;
        if (got == 0 || offset >= total) break;
    }
    api_ok(c, j);
}

void api_openai(svc *s, twk_http_conn *c, const twk_http_req *req) {
    const char *route = req->path + 1; /* "v1/..." */
    twk_log_context(NULL, route);
    const char *auth = twk_http_header_get(req, "Authorization");
    const char *key = twk_http_header_get(req, "X-API-Key");
    if (auth && !strncasecmp(auth, "Bearer ", 7)) key = auth + 7;
    char tenant[64];
    if (!twk_auth_tenant(s->auth, key, tenant)) {
        oai_error(c, 401, NULL, "invalid_api_key", "invalid or missing API key (send Authorization: Bearer tml-...)");
        return;
    }
    twk_log_context(tenant, route);
    int get = !strcmp(req->method, "GET"), post = !strcmp(req->method, "POST");
    if (!strcmp(route, "v1/models") && get) h_models(s, c, tenant);
    else if (!strcmp(route, "v1/completions") && post) h_generate(s, c, req, tenant, 0);
    else if (!strcmp(route, "v1/chat/completions") && post) h_generate(s, c, req, tenant, 1);
    else if (!strcmp(route, "v1/models") || !strcmp(route, "v1/completions") || !strcmp(route, "v1/chat/completions"))
        oai_error(c, 405, NULL, NULL, "method %s not allowed on %s", req->method, req->path);
    else oai_error(c, 404, NULL, "unknown_url", "no such endpoint: %s %s", req->method, req->path);
}
