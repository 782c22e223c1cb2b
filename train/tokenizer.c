/* Hugging Face tokenizer.json: decode token ids to UTF-8 bytes (see tokenizer.h).
 *
 * The decoder is the `tokenizers` library's (0.23) written out: TokenizerImpl::decode
 * maps each id to a string (added token first, then the model's vocab), drops special
 * ones on request, and hands the list to the decoder, whose steps (decode_chain) each
 * turn a list of strings into another; the result is their concatenation. Here the
 * strings are byte strings, so nothing is replaced by U+FFFD.
 *
 * Input is untrusted: every field is type-checked, ids are bounded, the file must be
 * UTF-8 (as the library requires), and errors name the file and the field. */
#include "twinkle/tokenizer.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cJSON.h>

#include "tokenizer_impl.h"
#include "unicode.h"
#include "twinkle/hal.h"

#define TOK_MAX_FILE (1LL << 30)   /* 1 GiB of JSON */
#define TOK_MAX_ID ((1 << 24) - 1) /* ids are below 16M (largest vocabularies: ~260k) */
#define TOK_MAX_NORM (1 << 20)     /* a normalized added token stays below 1 MiB */
#define TOK_MAX_DEPTH 32           /* nested Sequence decoders / normalizers */

/* ---- small helpers --------------------------------------------------------------------- */


int twk_tok_buf_reserve(buf_t *b, size_t extra) {
    if (extra > SIZE_MAX / 2 - b->len) return 0;
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    char *nb = twk_host_realloc(b->b, b->cap, cap, "tokenizer buffer");
    if (!nb) return 0;
    b->b = nb;
    b->cap = cap;
    return 1;
}

int twk_tok_buf_add(buf_t *b, const void *p, size_t n) {
    if (!twk_tok_buf_reserve(b, n)) return 0;
    if (n) memcpy(b->b + b->len, p, n);
    b->len += n;
    b->b[b->len] = 0;
    return 1;
}

int twk_tok_grow(void *pv, size_t n, size_t *cap, size_t size) {
    if (n < *cap) return 1;
    void *p;
    memcpy(&p, pv, sizeof p);
    size_t c = *cap ? 2 * *cap : 16;
    if (c > SIZE_MAX / size) return 0;
    void *q = twk_host_realloc(p, *cap * size, c * size, "tokenizer");
    if (!q) return 0;
    memcpy(pv, &q, sizeof q);
    *cap = c;
    return 1;
}

/* A short printable form of a token for messages: escapes, cut at 48 bytes. */
const char *twk_tok_qs(const char *s, size_t n, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n && o + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i >= 48) {
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        if (c == '\\' || c == '\'')
            o += (size_t)snprintf(out + o, cap - o, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
        else
            out[o++] = (char)c;
    }
    out[o] = 0;
    return out;
}

/* Length of the valid UTF-8 sequence at s[0..n) (1..4), or 0 when invalid. */
int twk_tok_utf8_len(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int k;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF)
        k = 2, v = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF)
        k = 3, v = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4)
        k = 4, v = c & 0x07, min = 0x10000;
    else
        return 0;
    if ((size_t)k > n) return 0;
    for (int i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return k;
}

int twk_tok_put_utf8(uint32_t cp, char *o) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xC0 | (cp >> 6)), o[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000)
        return o[0] = (char)(0xE0 | (cp >> 12)), o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)),
               o[2] = (char)(0x80 | (cp & 0x3F)), 3;
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Exactly one character (a Rust `char` field). */
static int one_char(const char *s) {
    uint32_t cp;
    size_t n = strlen(s);
    return n > 0 && (size_t)twk_tok_utf8_len((const unsigned char *)s, n, &cp) == n;
}

/* GPT-2's bytes_to_unicode and its inverse (chars U+0000..U+0143 -> byte, or -1). */
uint16_t twk_tok_byte_char[256];
static int16_t char_byte[0x144];

static void byte_tables_init(void) {
    int n = 0;
    for (int c = 0; c < 0x144; c++) char_byte[c] = -1;
    for (int b = 0; b < 256; b++) {
        int self = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        twk_tok_byte_char[b] = (uint16_t)(self ? b : 256 + n++);
        char_byte[twk_tok_byte_char[b]] = (int16_t)b;
    }
}

static pthread_once_t byte_tables_once = PTHREAD_ONCE_INIT;

/* ---- the arena and the hash tables ----------------------------------------------------- */

static int arena_add(twk_tokenizer *t, const char *s, size_t n, size_t *off) {
    buf_t b = {t->arena, t->arena_len, t->arena_cap};
    if (!twk_tok_buf_add(&b, s, n)) return 0;
    t->arena = b.b;
    t->arena_cap = b.cap;
    *off = t->arena_len;
    t->arena_len = b.len;
    return 1;
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static int htab_init(htab *h, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n + 2) cap *= 2;
    h->slot = twk_host_alloc(cap * sizeof *h->slot, "tokenizer table");
    if (!h->slot) return 0;
    memset(h->slot, 0xff, cap * sizeof *h->slot);
    h->mask = cap - 1;
    return 1;
}

static const char *key_of(const twk_tokenizer *t, int model, int32_t v, size_t *n) {
    if (model) {
        *n = t->ent[v].model_len;
        return t->arena + t->ent[v].model_off;
    }
    *n = t->added[v].len;
    return t->arena + t->added[v].off;
}

/* The slot holding key s, or the empty slot where it goes. */
static size_t htab_find(const htab *h, const twk_tokenizer *t, int model, const char *s, size_t n) {
    size_t i = (size_t)hash_bytes(s, n) & h->mask;
    for (;;) {
        int32_t v = h->slot[i];
        if (v < 0) return i;
        size_t kn;
        const char *k = key_of(t, model, v, &kn);
        if (kn == n && !memcmp(k, s, n)) return i;
        i = (i + 1) & h->mask;
    }
}

int32_t twk_tok_model_find(const twk_tokenizer *t, const char *s, size_t n) {
    if (!t->vocab.slot) return -1;
    return t->vocab.slot[htab_find(&t->vocab, t, 1, s, n)];
}

int32_t twk_tok_added_find(const twk_tokenizer *t, const char *s, size_t n) {
    if (!t->added_tab.slot) return -1;
    return t->added_tab.slot[htab_find(&t->added_tab, t, 0, s, n)];
}

/* ---- reading ----------------------------------------------------------------------------- */

static twk_status read_file(const char *path, char **data, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return twk_error(TWK_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
        fclose(f);
        return twk_error(TWK_ERR_IO, "%s: not a regular file", path);
    }
    if ((long long)st.st_size > TOK_MAX_FILE) {
        fclose(f);
        return twk_error(TWK_ERR_INVALID_ARG, "%s: %lld bytes is larger than the %lld allowed for a tokenizer.json",
                         path, (long long)st.st_size, (long long)TOK_MAX_FILE);
    }
    size_t n = (size_t)st.st_size;
    char *d = twk_host_alloc(n + 1, "tokenizer.json");
    if (!d) {
        fclose(f);
        return twk_error(TWK_ERR_OOM, "%s: out of memory reading %zu bytes", path, n);
    }
    size_t got = n ? fread(d, 1, n, f) : 0;
    int bad = ferror(f);
    fclose(f);
    if (got != n || bad) {
        twk_host_free(d);
        return twk_error(TWK_ERR_IO, "%s: read %zu of %zu bytes", path, got, n);
    }
    d[n] = 0;
    *data = d;
    *len = n;
    return TWK_OK;
}

/* The library reads the file as a UTF-8 String. cJSON would also cut a string at an
 * escaped NUL (\u0000) without telling, so those are refused here. */
static twk_status check_text(const char *path, const char *d, size_t n) {
    size_t line = 1;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)d[i];
        uint32_t cp;
        if (c == 0) return twk_error(TWK_ERR_INVALID_ARG, "%s: NUL byte at line %zu (byte %zu)", path, line, i);
        if (c == '\n') line++;
        if (c == '\\' && i + 1 < n) {
            if (d[i + 1] == 'u' && i + 6 <= n && !memcmp(d + i + 2, "0000", 4))
                return twk_error(TWK_ERR_UNSUPPORTED,
                                 "%s: line %zu: a string holds \\u0000 (NUL), which is not supported", path, line);
            i += (unsigned char)d[i + 1] < 0x80 && d[i + 1] != '\n' ? 2 : 1;
            continue;
        }
        int k = twk_tok_utf8_len((const unsigned char *)d + i, n - i, &cp);
        if (!k) return twk_error(TWK_ERR_INVALID_ARG, "%s: not valid UTF-8 at line %zu (byte %zu)", path, line, i);
        i += (size_t)k;
    }
    return TWK_OK;
}

int twk_tok_get_int(const cJSON *v, double lo, double hi, double *out) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi) ||
        v->valuedouble != floor(v->valuedouble))
        return 0;
    *out = v->valuedouble;
    return 1;
}

/* Optional bool field: 1/0, or def when absent; -1 when present with another type. */
int twk_tok_opt_bool(const cJSON *o, const char *k, int def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v || cJSON_IsNull(v)) return def;
    if (!cJSON_IsBool(v)) return -1;
    return cJSON_IsTrue(v) ? 1 : 0;
}

const char *twk_tok_type_of(const cJSON *o) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(ty) ? ty->valuestring : NULL;
}

/* ---- the model ----------------------------------------------------------------------------- */

static twk_status load_model(twk_tokenizer *t, const char *path, const cJSON *model, int32_t n_added_json) {
    if (!cJSON_IsObject(model)) return twk_error(TWK_ERR_INVALID_ARG, "%s: 'model' is missing or not an object", path);
    const char *ty = twk_tok_type_of(model);
    if (!ty)
        return twk_error(TWK_ERR_UNSUPPORTED, "%s: model has no 'type' (untyped legacy models are not supported)",
                         path);
    if (strcmp(ty, "BPE"))
        return twk_error(TWK_ERR_UNSUPPORTED, "%s: model type '%s' is not supported (only BPE)", path, ty);
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab))
        return twk_error(TWK_ERR_INVALID_ARG, "%s: model.vocab is missing or not an object", path);
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (merges && !cJSON_IsArray(merges) && !cJSON_IsNull(merges))
        return twk_error(TWK_ERR_INVALID_ARG, "%s: model.merges is not an array", path);

    char q[160];
    int64_t count = 0, max_id = -1;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        double id;
        const char *k = e->string ? e->string : "";
        if (!twk_tok_get_int(e, 0, TOK_MAX_ID, &id))
            return twk_error(TWK_ERR_INVALID_ARG, "%s: model.vocab['%s']: the id must be an integer in [0, %d]", path,
                             twk_tok_qs(k, strlen(k), q, sizeof q), TOK_MAX_ID);
        if ((int64_t)id > max_id) max_id = (int64_t)id;
        count++;
    }
    if (count > INT32_MAX / 2) return twk_error(TWK_ERR_INVALID_ARG, "%s: model.vocab has too many entries", path);
    int64_t cap = max_id + 1 > count + n_added_json ? max_id + 1 : count + n_added_json;
    /* A vocab that is mostly holes is no tokenizer; refusing it bounds the memory a small
     * file can ask for. */
    if (cap > 4 * (count + n_added_json) + 4096)
        return twk_error(TWK_ERR_INVALID_ARG, "%s: model.vocab ids reach %lld for %lld tokens (mostly holes)", path,
                         (long long)max_id, (long long)count);
    t->ent = twk_host_alloc((size_t)(cap ? cap : 1) * sizeof *t->ent, "tokenizer vocab");
    if (!t->ent || !htab_init(&t->vocab, (size_t)count)) return twk_error(TWK_ERR_OOM, "%s: out of memory", path);
    for (int64_t i = 0; i < cap; i++) t->ent[i] = (tok_entry){.added = -1};
    t->size = (int32_t)(max_id + 1);
    t->n_model = (int32_t)count;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int32_t id = (int32_t)e->valuedouble;
        const char *k = e->string ? e->string : "";
        size_t kn = strlen(k);
        if (kn > UINT32_MAX / 2) return twk_error(TWK_ERR_INVALID_ARG, "%s: model.vocab: a token is too long", path);
        tok_entry *en = &t->ent[id];
        if (en->flags & ENT_MODEL) {
            char q2[160];
            return twk_error(TWK_ERR_INVALID_ARG, "%s: model.vocab: tokens '%s' and '%s' both have id %d", path,
                             twk_tok_qs(t->arena + en->model_off, en->model_len, q, sizeof q), twk_tok_qs(k, kn, q2, sizeof q2), id);
        }
        if (!arena_add(t, k, kn, &en->model_off)) return twk_error(TWK_ERR_OOM, "%s: out of memory", path);
        en->model_len = (uint32_t)kn;
        en->flags |= ENT_MODEL;
        size_t s = htab_find(&t->vocab, t, 1, k, kn);
        if (t->vocab.slot[s] >= 0)
            return twk_error(TWK_ERR_INVALID_ARG, "%s: model.vocab: token '%s' appears twice (ids %d and %d)", path,
                             twk_tok_qs(k, kn, q, sizeof q), t->vocab.slot[s], id);
        t->vocab.slot[s] = id;
    }
    return TWK_OK;
}

/* ---- added tokens ---------------------------------------------------------------------------- */

/* AddedVocabulary::add_tokens, as the library runs it on the file's added_tokens. */
static twk_status load_added(twk_tokenizer *t, const char *path, const cJSON *list) {
    if (!list || cJSON_IsNull(list)) return TWK_OK;
    if (!cJSON_IsArray(list)) return twk_error(TWK_ERR_INVALID_ARG, "%s: 'added_tokens' is not an array", path);
    int32_t n = cJSON_GetArraySize(list);
    t->added = twk_host_alloc(((size_t)n + 1) * sizeof *t->added, "tokenizer added tokens");
    if (!t->added || !htab_init(&t->added_tab, (size_t)n)) return twk_error(TWK_ERR_OOM, "%s: out of memory", path);
    t->cap_added = n + 1;
    int64_t next_id = t->n_model; /* model.get_vocab_size(): the count, not the max id */
    int i = 0;
    char q[160];
    for (const cJSON *e = list->child; e; e = e->next, i++) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        double jid;
        if (!cJSON_IsObject(e) || !cJSON_IsString(c))
            return twk_error(TWK_ERR_INVALID_ARG, "%s: added_tokens[%d] has no 'content' string", path, i);
        size_t cn = strlen(c->valuestring);
        twk_tok_qs(c->valuestring, cn, q, sizeof q);
        if (!twk_tok_get_int(cJSON_GetObjectItemCaseSensitive(e, "id"), 0, TOK_MAX_ID, &jid))
            return twk_error(TWK_ERR_INVALID_ARG, "%s: added_tokens[%d] ('%s'): 'id' must be an integer in [0, %d]",
                             path, i, q, TOK_MAX_ID);
        int special = twk_tok_opt_bool(e, "special", 0), normalized = twk_tok_opt_bool(e, "normalized", 1);
        int sw = twk_tok_opt_bool(e, "single_word", 0), ls = twk_tok_opt_bool(e, "lstrip", 0), rs = twk_tok_opt_bool(e, "rstrip", 0);
        if (special < 0 || normalized < 0 || sw < 0 || ls < 0 || rs < 0)
            return twk_error(
                TWK_ERR_INVALID_ARG,
                "%s: added_tokens[%d] ('%s'): special/normalized/single_word/lstrip/rstrip must be booleans", path, i,
                q);
        if (!cn) continue; /* the library ignores empty added tokens */
        if (cn > UINT32_MAX / 2) return twk_error(TWK_ERR_INVALID_ARG, "%s: added_tokens[%d] is too long", path, i);
        int32_t k = twk_tok_added_find(t, c->valuestring, cn);
        int64_t id;
        if (k >= 0)
            id = t->added[k].id;
        else if ((id = twk_tok_model_find(t, c->valuestring, cn)) < 0)
            id = next_id++;
        if (id != (int64_t)jid)
            return twk_error(TWK_ERR_INVALID_ARG,
                             "%s: added_tokens[%d] ('%s') has id %lld, but the tokenizers library gives it id %lld "
                             "(its vocab id, else the next id after the %d vocab entries)",
                             path, i, q, (long long)jid, (long long)id, t->n_model);
        if (k >= 0 && t->added[k].special == special && t->added[k].normalized == normalized &&
            t->added[k].single_word == sw && t->added[k].lstrip == ls && t->added[k].rstrip == rs)
            continue; /* the same token again */
        tok_entry *en = &t->ent[id];
        if (normalized && (t->norm || t->norm_err)) {
            if (t->norm_err)
                return twk_error(t->norm_err, "%s (added token '%s' has \"normalized\": true)", t->norm_msg, q);
            buf_t b = {0};
            if (!twk_tok_buf_add(&b, c->valuestring, cn)) return twk_error(TWK_ERR_OOM, "%s: out of memory", path);
            char what[400];
            snprintf(what, sizeof what, "%s: added token '%s'", path, q);
            twk_status s = twk_tok_norm_apply(t->norm, &b, what);
            if (!s && b.len > TOK_MAX_NORM)
                s = twk_error(TWK_ERR_UNSUPPORTED, "%s: added token '%s' normalizes to more than %d bytes", path, q,
                              TOK_MAX_NORM);
            if (!s && (b.len != cn || memcmp(b.b, c->valuestring, cn))) { /* normalized_cache: kept once set */
                if (!arena_add(t, b.b, b.len, &en->norm_off)) s = twk_error(TWK_ERR_OOM, "%s: out of memory", path);
                en->norm_len = (uint32_t)b.len;
                en->flags |= ENT_NORM;
            }
            twk_host_free(b.b);
            if (s) return s;
        }
        if (k < 0) {
            k = t->n_added++;
            tok_added *a = &t->added[k];
            memset(a, 0, sizeof *a);
            if (!arena_add(t, c->valuestring, cn, &a->off)) return twk_error(TWK_ERR_OOM, "%s: out of memory", path);
            a->len = (uint32_t)cn;
            a->id = (int32_t)id;
            t->added_tab.slot[htab_find(&t->added_tab, t, 0, c->valuestring, cn)] = k;
        }
        tok_added *a = &t->added[k];
        a->special = (uint8_t)special;
        a->normalized = (uint8_t)normalized;
        a->single_word = (uint8_t)sw;
        a->lstrip = (uint8_t)ls;
        a->rstrip = (uint8_t)rs;
        a->in_special_set |= (uint8_t)special;
        en->added = k;
        if (id >= t->size) t->size = (int32_t)id + 1;
    }
    return TWK_OK;
}

/* ---- the decoder ------------------------------------------------------------------------------ */

static twk_status add_step(twk_tokenizer *t, const char *path, dec_step s) {
    if (t->n_dec == t->cap_dec) {
        int cap = t->cap_dec ? 2 * t->cap_dec : 8;
        if (cap > 4096) return twk_error(TWK_ERR_INVALID_ARG, "%s: the decoder has too many steps", path);
        dec_step *d =
            twk_host_realloc(t->dec, (size_t)t->cap_dec * sizeof *d, (size_t)cap * sizeof *d, "tokenizer decoder");
        if (!d) return twk_error(TWK_ERR_OOM, "%s: out of memory", path);
        t->dec = d;
        t->cap_dec = cap;
    }
    t->dec[t->n_dec++] = s;
    return TWK_OK;
}

static twk_status parse_decoder(twk_tokenizer *t, const char *path, const cJSON *d, int depth) {
    if (depth > TOK_MAX_DEPTH) return twk_error(TWK_ERR_INVALID_ARG, "%s: decoders nested too deeply", path);
    if (!cJSON_IsObject(d)) return twk_error(TWK_ERR_INVALID_ARG, "%s: a decoder is not an object", path);
    const char *ty = twk_tok_type_of(d);
    if (!ty)
        return twk_error(TWK_ERR_UNSUPPORTED, "%s: a decoder has no 'type' (untyped legacy decoders are not supported)",
                         path);
    dec_step s;
    memset(&s, 0, sizeof s);
    if (!strcmp(ty, "Sequence")) {
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(d, "decoders");
        if (!cJSON_IsArray(l))
            return twk_error(TWK_ERR_INVALID_ARG, "%s: decoder Sequence has no 'decoders' array", path);
        for (const cJSON *e = l->child; e; e = e->next) {
            twk_status st = parse_decoder(t, path, e, depth + 1);
            if (st) return st;
        }
        return TWK_OK;
    }
    if (!strcmp(ty, "ByteLevel")) {
        s.kind = DEC_BYTE_LEVEL;
    } else if (!strcmp(ty, "ByteFallback")) {
        s.kind = DEC_BYTE_FALLBACK;
    } else if (!strcmp(ty, "Fuse")) {
        s.kind = DEC_FUSE;
    } else if (!strcmp(ty, "Replace")) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(d, "pattern"),
                    *c = cJSON_GetObjectItemCaseSensitive(d, "content");
        if (cJSON_GetObjectItemCaseSensitive(p, "Regex"))
            return twk_error(TWK_ERR_UNSUPPORTED,
                             "%s: decoder Replace with a Regex pattern is not supported (only String)", path);
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(p, "String");
        if (!cJSON_IsString(ps) || !cJSON_IsString(c))
            return twk_error(TWK_ERR_INVALID_ARG, "%s: decoder Replace needs pattern.String and content strings", path);
        if (!ps->valuestring[0])
            return twk_error(TWK_ERR_UNSUPPORTED, "%s: decoder Replace with an empty pattern", path);
        s.kind = DEC_REPLACE;
        s.a_len = strlen(ps->valuestring);
        s.b_len = strlen(c->valuestring);
        if (!arena_add(t, ps->valuestring, s.a_len, &s.a_off) || !arena_add(t, c->valuestring, s.b_len, &s.b_off))
            return twk_error(TWK_ERR_OOM, "%s: out of memory", path);
    } else if (!strcmp(ty, "Strip")) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(d, "content");
        double a, b;
        if (!cJSON_IsString(c) || !one_char(c->valuestring) ||
            !twk_tok_get_int(cJSON_GetObjectItemCaseSensitive(d, "start"), 0, 9007199254740992.0, &a) ||
            !twk_tok_get_int(cJSON_GetObjectItemCaseSensitive(d, "stop"), 0, 9007199254740992.0, &b))
            return twk_error(TWK_ERR_INVALID_ARG,
                             "%s: decoder Strip needs a one-character 'content' and integers 'start', 'stop' >= 0",
                             path);
        s.kind = DEC_STRIP;
        s.a_len = strlen(c->valuestring);
        s.start = a > 1e9 ? (size_t)1e9 : (size_t)a;
        s.stop = b > 1e9 ? (size_t)1e9 : (size_t)b;
        if (!arena_add(t, c->valuestring, s.a_len, &s.a_off)) return twk_error(TWK_ERR_OOM, "%s: out of memory", path);
    } else if (!strcmp(ty, "Metaspace")) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(d, "replacement");
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(d, "prepend_scheme");
        int aps = twk_tok_opt_bool(d, "add_prefix_space", -2);
        if (!cJSON_IsString(r) || !one_char(r->valuestring))
            return twk_error(TWK_ERR_INVALID_ARG, "%s: decoder Metaspace needs a one-character 'replacement'", path);
        int scheme = 2; /* always (the default) */
        if (ps && !cJSON_IsNull(ps)) {
            if (!cJSON_IsString(ps))
                scheme = -1;
            else if (!strcmp(ps->valuestring, "first"))
                scheme = 1;
            else if (!strcmp(ps->valuestring, "never"))
                scheme = 0;
            else if (!strcmp(ps->valuestring, "always"))
                scheme = 2;
            else
                scheme = -1;
            if (scheme < 0)
                return twk_error(TWK_ERR_INVALID_ARG,
                                 "%s: decoder Metaspace: prepend_scheme must be first, never or always", path);
        }
        if (aps == -1)
            return twk_error(TWK_ERR_INVALID_ARG, "%s: decoder Metaspace: add_prefix_space must be a boolean", path);
        if (aps == 0 && scheme != 0) /* as the library: the default scheme is "always" */
            return twk_error(
                TWK_ERR_INVALID_ARG,
                "%s: decoder Metaspace: add_prefix_space false does not match prepend_scheme (not \"never\")", path);
        s.kind = DEC_METASPACE;
        s.never = scheme == 0;
        s.a_len = strlen(r->valuestring);
        if (!arena_add(t, r->valuestring, s.a_len, &s.a_off)) return twk_error(TWK_ERR_OOM, "%s: out of memory", path);
    } else {
        return twk_error(
            TWK_ERR_UNSUPPORTED,
            "%s: decoder type '%s' is not supported (ByteLevel, Sequence, Replace, ByteFallback, Fuse, Strip, "
            "Metaspace)",
            path, ty);
    }
    return add_step(t, path, s);
}

/* ---- loading ---------------------------------------------------------------------------------- */

static twk_status load_json(twk_tokenizer *t, const char *path, const cJSON *j) {
    if (!cJSON_IsObject(j)) return twk_error(TWK_ERR_INVALID_ARG, "%s: not a JSON object", path);
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(j, "version");
    if (ver && (!cJSON_IsString(ver) || strcmp(ver->valuestring, "1.0")))
        return twk_error(TWK_ERR_UNSUPPORTED, "%s: tokenizer.json version is not \"1.0\"", path);
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(j, "added_tokens");
    int32_t n_added = cJSON_IsArray(added) ? cJSON_GetArraySize(added) : 0;
    twk_status s = load_model(t, path, cJSON_GetObjectItemCaseSensitive(j, "model"), n_added);
    if (s) return s;
    twk_status ns = twk_tok_norm_parse(path, cJSON_GetObjectItemCaseSensitive(j, "normalizer"), &t->norm);
    if (ns) {
        t->norm_err = ns;
        if (!(t->norm_msg = twk_host_strdup(twk_last_error(), "tokenizer")))
            return twk_error(TWK_ERR_OOM, "%s: out of memory", path);
    }
    if ((s = load_added(t, path, added))) return s;
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(j, "decoder");
    if (dec && !cJSON_IsNull(dec)) {
        t->has_decoder = 1;
        if ((s = parse_decoder(t, path, dec, 0))) return s;
    }
    twk_tok_enc_load(t, path, j);
    twk_tok_enc_config(t, path);
    /* What each id decodes from, and whether skip_special drops it. */
    for (int32_t id = 0; id < t->size; id++) {
        tok_entry *en = &t->ent[id];
        if (en->flags & ENT_NORM)
            en->dec_off = en->norm_off, en->dec_len = en->norm_len;
        else if (en->added >= 0)
            en->dec_off = t->added[en->added].off, en->dec_len = t->added[en->added].len;
        else
            en->dec_off = en->model_off, en->dec_len = en->model_len;
        if (en->added >= 0 || (en->flags & ENT_MODEL)) {
            int32_t k = twk_tok_added_find(t, t->arena + en->dec_off, en->dec_len);
            if (k >= 0 && t->added[k].in_special_set) en->flags |= ENT_SKIP;
        }
    }
    return TWK_OK;
}

twk_status twk_tokenizer_load(const char *path, twk_tokenizer **out) {
    if (!path || !out) return twk_error(TWK_ERR_INVALID_ARG, "twk_tokenizer_load: NULL argument");
    *out = NULL;
    pthread_once(&byte_tables_once, byte_tables_init);
    char *file;
    struct stat st;
    size_t pl = strlen(path);
    if (!stat(path, &st) && S_ISDIR(st.st_mode)) {
        file = twk_host_alloc(pl + 17, "tokenizer path");
        if (file) snprintf(file, pl + 17, "%s/tokenizer.json", path);
    } else {
        file = twk_host_alloc(pl + 1, "tokenizer path");
        if (file) memcpy(file, path, pl + 1);
    }
    if (!file) return twk_error(TWK_ERR_OOM, "%s: out of memory", path);
    char *data = NULL;
    size_t n = 0;
    twk_status s = read_file(file, &data, &n);
    if (!s) s = check_text(file, data, n);
    cJSON *j = NULL;
    if (!s) {
        const char *end = NULL;
        j = cJSON_ParseWithLengthOpts(data, n + 1, &end, 1);
        if (!j) {
            size_t off = end && end >= data && end <= data + n ? (size_t)(end - data) : 0, line = 1, col = 1;
            for (size_t i = 0; i < off; i++) {
                if (data[i] == '\n')
                    line++, col = 1;
                else
                    col++;
            }
            s = twk_error(TWK_ERR_INVALID_ARG, "%s: invalid JSON at line %zu, column %zu", file, line, col);
        }
    }
    twk_tokenizer *t = NULL;
    if (!s && !(t = twk_host_calloc(sizeof *t, "tokenizer"))) s = twk_error(TWK_ERR_OOM, "%s: out of memory", file);
    if (!s) s = load_json(t, file, j);
    cJSON_Delete(j);
    twk_host_free(data);
    twk_host_free(file);
    if (s) {
        twk_tokenizer_free(t);
        return s;
    }
    *out = t;
    return TWK_OK;
}

void twk_tokenizer_free(twk_tokenizer *t) {
    if (!t) return;
    twk_host_free(t->arena);
    twk_host_free(t->ent);
    twk_host_free(t->vocab.slot);
    twk_host_free(t->added);
    twk_host_free(t->added_tab.slot);
    twk_host_free(t->dec);
    twk_tok_norm_free(t->norm);
    twk_host_free(t->norm_msg);
    twk_tok_enc_free(t->enc);
    twk_host_free(t);
}

int32_t twk_tokenizer_size(const twk_tokenizer *t) { return t ? t->size : 0; }

static int has_token(const twk_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->size && (t->ent[id].added >= 0 || (t->ent[id].flags & ENT_MODEL));
}

int32_t twk_tokenizer_token_id(const twk_tokenizer *t, const char *s, size_t len) {
    if (!t || (!s && len)) return -1;
    if (!s) s = "";
    int32_t k = twk_tok_added_find(t, s, len);
    if (k >= 0) return t->added[k].id;
    return twk_tok_model_find(t, s, len);
}

bool twk_tokenizer_is_special(const twk_tokenizer *t, int32_t id) {
    return has_token(t, id) && (t->ent[id].flags & ENT_SKIP);
}

/* ---- decoding ----------------------------------------------------------------------------- */

/* A list of byte strings ("pieces"): piece i is b[st[i] .. st[i+1]) (the last ends at len). */
typedef struct {
    buf_t b;
    size_t *st;
    size_t n, cap;
} plist;

static int pl_push(plist *p, const char *s, size_t n) {
    if (!twk_tok_grow(&p->st, p->n, &p->cap, sizeof *p->st)) return 0;
    p->st[p->n++] = p->b.len;
    return twk_tok_buf_add(&p->b, s, n);
}

static int pl_add(plist *p, const char *s, size_t n) { return twk_tok_buf_add(&p->b, s, n); } /* to the last piece */

static const char *pl_get(const plist *p, size_t i, size_t *n) {
    size_t e = i + 1 < p->n ? p->st[i + 1] : p->b.len;
    *n = e - p->st[i];
    return p->b.b + p->st[i];
}

static void pl_clear(plist *p) {
    p->n = 0;
    p->b.len = 0;
}

static void pl_free(plist *p) {
    twk_host_free(p->b.b);
    twk_host_free(p->st);
}

/* piece s[0..n) with every pat replaced by rep, appended to the last piece of o */
static int add_replaced(plist *o, const char *s, size_t n, const char *pat, size_t pn, const char *rep, size_t rn) {
    size_t i = 0;
    for (;;) {
        const char *m = memmem(s + i, n - i, pat, pn);
        size_t j = m ? (size_t)(m - s) : n;
        if (!pl_add(o, s + i, j - i)) return 0;
        if (!m) return 1;
        if (!pl_add(o, rep, rn)) return 0;
        i = j + pn;
    }
}

static int hexv(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* "<0xNN>" -> NN (Rust's u8::from_str_radix(.., 16), which also takes "+N"), else -1. */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    if (s[3] == '+') return hexv(s[4]);
    int h = hexv(s[3]), l = hexv(s[4]);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
}

/* ByteLevel: every char through the inverse of bytes_to_unicode; a piece with a char
 * outside the table is kept as it is. */
static int add_byte_level(plist *o, const char *s, size_t n) {
    size_t mark = o->b.len;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = twk_tok_utf8_len((const unsigned char *)s + i, n - i, &cp);
        if (!k || cp >= 0x144 || char_byte[cp] < 0) {
            o->b.len = mark;
            return pl_add(o, s, n);
        }
        char c = (char)char_byte[cp];
        if (!pl_add(o, &c, 1)) return 0;
        i += (size_t)k;
    }
    return 1;
}

/* One decode_chain step from `in` to `out`. single: `in` is one token that follows
 * others (token_bytes); *merged: that token is already part of the first piece. */
static int run_step(const twk_tokenizer *t, const dec_step *d, const plist *in, plist *out, int single, int *merged) {
    const char *a = t->arena + d->a_off;
    size_t n;
    pl_clear(out);
    switch (d->kind) {
    case DEC_REPLACE:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = pl_get(in, i, &n);
            if (!pl_push(out, NULL, 0) || !add_replaced(out, s, n, a, d->a_len, t->arena + d->b_off, d->b_len))
                return 0;
        }
        return 1;
    case DEC_BYTE_FALLBACK: {
        int run = 0;
        for (size_t i = 0; i < in->n; i++) {
            const char *s = pl_get(in, i, &n);
            int v = single && *merged ? -1 : byte_token(s, n);
            if (v >= 0) {
                char c = (char)v;
                if ((!run && !pl_push(out, NULL, 0)) || !pl_add(out, &c, 1)) return 0;
                run = 1;
            } else {
                run = 0;
                if (!pl_push(out, s, n)) return 0;
            }
        }
        return 1;
    }
    case DEC_FUSE:
    case DEC_BYTE_LEVEL:
        if (!pl_push(out, NULL, 0)) return 0;
        for (size_t i = 0; i < in->n; i++) {
            const char *s = pl_get(in, i, &n);
            if (!(d->kind == DEC_FUSE ? pl_add(out, s, n) : add_byte_level(out, s, n))) return 0;
        }
        *merged = 1;
        return 1;
    case DEC_STRIP:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = pl_get(in, i, &n);
            size_t b = 0, e = n, cl = d->a_len;
            if (!(single && *merged)) { /* inside a fused text neither end is this token's */
                for (size_t k = 0; k < d->start && b + cl <= e && !memcmp(s + b, a, cl); k++) b += cl;
                for (size_t k = 0; k < d->stop && e >= b + cl && !memcmp(s + e - cl, a, cl); k++) e -= cl;
            }
            if (!pl_push(out, s + b, e - b)) return 0;
        }
        return 1;
    case DEC_METASPACE:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = pl_get(in, i, &n);
            size_t idx = single && !*merged ? i + 1 : i; /* a token after others is not piece 0 */
            int drop = idx == 0 && !d->never;
            if (!pl_push(out, NULL, 0) || !add_replaced(out, s, n, a, d->a_len, " ", drop ? 0 : 1)) return 0;
        }
        return 1;
    }
    return 0;
}

/* Runs the decoder over `p` (tmp is scratch); the result is the concatenation of the
 * returned list's pieces. */
static const plist *run_chain(const twk_tokenizer *t, plist *p, plist *tmp, int single) {
    int merged = 0;
    plist *in = p, *out = tmp;
    for (int k = 0; k < t->n_dec; k++) {
        if (!run_step(t, &t->dec[k], in, out, single, &merged)) return NULL;
        plist *x = in;
        in = out;
        out = x;
    }
    return in;
}

twk_status twk_tokenizer_decode(const twk_tokenizer *t, const int32_t *ids, int64_t n, bool skip_special, char **out,
                                size_t *len) {
    if (!t || !out || n < 0 || (n > 0 && !ids))
        return twk_error(TWK_ERR_INVALID_ARG, "twk_tokenizer_decode: NULL tokenizer/ids/out or negative count");
    *out = NULL;
    if (len) *len = 0;
    for (int64_t i = 0; i < n; i++)
        if (!has_token(t, ids[i]))
            return twk_error(
                TWK_ERR_INVALID_ARG, "tokenizer decode: position %lld: id %d has no token (the tokenizer has %d ids%s)",
                (long long)i, ids[i], t->size, ids[i] >= 0 && ids[i] < t->size ? "; this one is a hole" : "");
    plist p = {0}, tmp = {0};
    buf_t r = {0};
    int ok = 1;
    for (int64_t i = 0; i < n && ok; i++) {
        const tok_entry *en = &t->ent[ids[i]];
        if (skip_special && (en->flags & ENT_SKIP)) continue;
        ok = pl_push(&p, t->arena + en->dec_off, en->dec_len);
    }
    if (ok) {
        if (!t->has_decoder) {
            for (size_t i = 0; i < p.n && ok; i++) {
                size_t m;
                const char *s = pl_get(&p, i, &m);
                ok = (!i || twk_tok_buf_add(&r, " ", 1)) && twk_tok_buf_add(&r, s, m);
            }
        } else {
            const plist *res = run_chain(t, &p, &tmp, 0);
            ok = res && twk_tok_buf_add(&r, res->b.b, res->b.len); /* the pieces are contiguous */
        }
    }
    if (ok && !r.b) ok = twk_tok_buf_add(&r, "", 0);
    pl_free(&p);
    pl_free(&tmp);
    if (!ok) {
        twk_host_free(r.b);
        return twk_error(TWK_ERR_OOM, "tokenizer decode: out of memory (%lld ids)", (long long)n);
    }
    *out = r.b;
    if (len) *len = r.len;
    return TWK_OK;
}

int twk_tokenizer_token_bytes(const twk_tokenizer *t, int32_t id, char *buf, int cap) {
    if (!has_token(t, id)) return -1;
    const tok_entry *en = &t->ent[id];
    plist p = {0}, tmp = {0};
    const char *s = NULL;
    size_t n = 0;
    int ok;
    if (!t->has_decoder) {
        ok = pl_push(&p, " ", 1) && pl_add(&p, t->arena + en->dec_off, en->dec_len);
        s = p.b.b;
        n = p.b.len;
    } else {
        const plist *res = NULL;
        ok = pl_push(&p, t->arena + en->dec_off, en->dec_len) && (res = run_chain(t, &p, &tmp, 1)) != NULL;
        if (ok) s = res->b.b, n = res->b.len;
    }
    int r = -1;
    if (ok && n <= INT_MAX) {
        if (cap > 0 && buf) memcpy(buf, s, n < (size_t)cap ? n : (size_t)cap);
        r = (int)n;
    }
    pl_free(&p);
    pl_free(&tmp);
    return r;
}
