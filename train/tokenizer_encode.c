/* tokenizer.json encoding (see tokenizer.h): the `tokenizers` library's (0.23)
 * TokenizerImpl::encode written out for the BPE families:
 *   1. added tokens that are not "normalized" are found in the raw text (leftmost-longest,
 *      then single_word / lstrip / rstrip as AddedVocabulary::find_matches);
 *   2. each remaining piece is normalized, and the "normalized" added tokens are found in it;
 *   3. each remaining piece is pre-tokenized (Split with a known regex, ByteLevel, Metaspace,
 *      Sequence) into words, and empty pieces are dropped at every stage;
 *   4. each word goes through BPE: its characters (or their <0xNN> bytes with byte_fallback,
 *      or unk, fused with fuse_unk), merged by rank with a heap as Word::merge_all;
 *   5. with add_special, the post-processor's template (TemplateProcessing, Bert/Roberta)
 *      wraps the ids, or the bos / eos that tokenizer_config.json asks for (tokenizer_config.c).
 * Words are cached (a table guarded by a mutex; a thread that finds it busy skips it). */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"
#include "tokenizer_pretok.h"
#include "unicode.h"
#include "twinkle/hal.h"

#define ENC_MAX_PRE 16
#define TOK_MAX_TEXT (1 << 30) /* bytes per call: symbol positions are int32 */
#define CACHE_SLOTS (1 << 16)
#define CACHE_MAX_WORD 256
#define CACHE_MAX_BYTES (64u << 20)

enum { PRE_SPLIT, PRE_BYTE_LEVEL, PRE_METASPACE };

typedef struct {
    int kind, rx;        /* Split: regex kind; ByteLevel: use_regex -> TWK_RX_GPT2 else -1 */
    int prefix_space;    /* ByteLevel add_prefix_space */
    int scheme, split;   /* Metaspace: 0 never, 1 first, 2 always; split */
    char rep[8];         /* Metaspace replacement (UTF-8) */
    size_t rep_len;
} pre_step;

typedef struct {
    uint64_t key; /* a << 32 | b, or ~0 empty */
    uint32_t rank;
    int32_t id;
} merge_slot;

typedef struct { /* one added-token pattern */
    const char *s;
    size_t n;
    int32_t added;
} apat;

typedef struct {
    apat *p;       /* sorted by first byte, then longest first */
    int start[257]; /* patterns of first byte c: p[start[c] .. start[c+1]) */
} amatcher;

typedef struct {
    uint64_t h;
    uint32_t key_off, key_len, val_off, val_n; /* key_len 0: empty */
} cache_slot;

struct tok_enc {
    char *err; /* why encode is unsupported (NULL: it is supported) */
    twk_status err_code;
    pre_step pre[ENC_MAX_PRE];
    int n_pre;
    merge_slot *merges;
    size_t merge_mask;
    int byte_fallback, fuse_unk, ignore_merges;
    int32_t unk; /* -1: none */
    char *unk_name;
    int32_t byte_id[256];
    int32_t small_id[0x180]; /* single-character tokens below U+0180 */
    amatcher raw, norm;
    int32_t *prefix, *suffix; /* post-processor ids around the sequence */
    int n_prefix, n_suffix;
    pthread_mutex_t lock;
    cache_slot *cache;
    buf_t cache_keys;
    int32_t *cache_vals;
    size_t cache_nvals, cache_capvals, cache_used;
};

/* ---- growable arrays ---------------------------------------------------------------------------- */

typedef struct {
    int32_t *v;
    size_t n, cap;
} ids_t;

static int ids_push(ids_t *a, int32_t x) {
    if (!twk_tok_grow(&a->v, a->n, &a->cap, sizeof *a->v)) return 0;
    a->v[a->n++] = x;
    return 1;
}

static int ids_add(ids_t *a, const int32_t *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!ids_push(a, x[i])) return 0;
    return 1;
}

/* Pieces of text: piece i is b[p[i].off .. +len); `first`: it starts at offset 0 of the input. */
typedef struct {
    size_t off, len;
    int first;
} piece;

typedef struct {
    buf_t b;
    piece *p;
    size_t n, cap;
} pieces;

static int pc_push(pieces *l, const char *s, size_t n, int first) {
    if (!n) return 1; /* the library drops empty splits */
    if (!twk_tok_grow(&l->p, l->n, &l->cap, sizeof *l->p)) return 0;
    l->p[l->n++] = (piece){l->b.len, n, first};
    return twk_tok_buf_add(&l->b, s, n);
}

static void pc_clear(pieces *l) {
    l->n = 0;
    l->b.len = 0;
}

/* ---- loading ------------------------------------------------------------------------------------- */

static void enc_vfail(tok_enc *e, twk_status code, const char *fmt, va_list ap) {
    if (e->err) return;
    char m[600];
    vsnprintf(m, sizeof m, fmt, ap);
    e->err = twk_host_strdup(m, "tokenizer error");
    e->err_code = code;
}

static void enc_fail(tok_enc *e, twk_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void enc_fail(tok_enc *e, twk_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    enc_vfail(e, code, fmt, ap);
    va_end(ap);
}

void twk_tok_enc_fail(twk_tokenizer *t, twk_status code, const char *fmt, ...) {
    if (!t->enc) return;
    va_list ap;
    va_start(ap, fmt);
    enc_vfail(t->enc, code, fmt, ap);
    va_end(ap);
}

int twk_tok_enc_usable(const twk_tokenizer *t) { return t->enc && !t->enc->err; }

int twk_tok_enc_set_frame(twk_tokenizer *t, const int32_t *prefix, int n_prefix, const int32_t *suffix, int n_suffix) {
    tok_enc *e = t->enc;
    ids_t np = {0}, ns = {0};
    if (!ids_add(&np, prefix, (size_t)n_prefix) || !ids_add(&ns, suffix, (size_t)n_suffix)) {
        twk_host_free(np.v);
        twk_host_free(ns.v);
        return 0;
    }
    twk_host_free(e->prefix);
    twk_host_free(e->suffix);
    e->prefix = np.v, e->n_prefix = n_prefix, e->suffix = ns.v, e->n_suffix = n_suffix;
    return 1;
}

static int parse_pre(tok_enc *e, const char *path, const cJSON *j, int depth) {
    const char *ty = cJSON_IsObject(j) ? twk_tok_type_of(j) : NULL;
    if (!ty || depth > 8) return enc_fail(e, TWK_ERR_INVALID_ARG, "%s: a pre_tokenizer has no 'type'", path), 0;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "pretokenizers");
        if (!cJSON_IsArray(l))
            return enc_fail(e, TWK_ERR_INVALID_ARG, "%s: pre_tokenizer Sequence has no 'pretokenizers'", path), 0;
        for (const cJSON *x = l->child; x; x = x->next)
            if (!parse_pre(e, path, x, depth + 1)) return 0;
        return 1;
    }
    if (e->n_pre == ENC_MAX_PRE) return enc_fail(e, TWK_ERR_UNSUPPORTED, "%s: too many pre_tokenizers", path), 0;
    pre_step *s = &e->pre[e->n_pre];
    memset(s, 0, sizeof *s);
    if (!strcmp(ty, "Split")) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "pattern");
        const cJSON *rx = cJSON_GetObjectItemCaseSensitive(p, "Regex");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(j, "behavior");
        int inv = twk_tok_opt_bool(j, "invert", 0);
        if (!cJSON_IsString(rx) || (s->rx = twk_rx_kind(rx->valuestring)) < 0)
            return enc_fail(e, TWK_ERR_UNSUPPORTED,
                            "%s: pre_tokenizer Split: only the regexes of GPT-2, Llama 3 and Qwen2 are supported",
                            path),
                   0;
        if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") || inv != 0)
            return enc_fail(e, TWK_ERR_UNSUPPORTED,
                            "%s: pre_tokenizer Split: only behavior \"Isolated\" without invert is supported", path),
                   0;
        s->kind = PRE_SPLIT;
    } else if (!strcmp(ty, "ByteLevel")) {
        int aps = twk_tok_opt_bool(j, "add_prefix_space", 1), ur = twk_tok_opt_bool(j, "use_regex", 1);
        if (aps < 0 || ur < 0)
            return enc_fail(e, TWK_ERR_INVALID_ARG, "%s: pre_tokenizer ByteLevel: flags must be booleans", path), 0;
        s->kind = PRE_BYTE_LEVEL;
        s->prefix_space = aps;
        s->rx = ur ? TWK_RX_GPT2 : -1;
    } else if (!strcmp(ty, "Metaspace")) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "replacement");
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(j, "prepend_scheme");
        int sp = twk_tok_opt_bool(j, "split", 1);
        uint32_t cp;
        if (!cJSON_IsString(r) || strlen(r->valuestring) > 4 ||
            twk_tok_utf8_len((const unsigned char *)r->valuestring, strlen(r->valuestring), &cp) !=
                (int)strlen(r->valuestring) ||
            sp < 0)
            return enc_fail(e, TWK_ERR_INVALID_ARG,
                            "%s: pre_tokenizer Metaspace needs a one-character 'replacement' and a boolean 'split'",
                            path),
                   0;
        s->scheme = 2;
        if (cJSON_IsString(ps))
            s->scheme = !strcmp(ps->valuestring, "never") ? 0 : !strcmp(ps->valuestring, "first") ? 1 : 2;
        else if (twk_tok_opt_bool(j, "add_prefix_space", 1) == 0)
            s->scheme = 0;
        s->kind = PRE_METASPACE;
        s->split = sp;
        s->rep_len = strlen(r->valuestring);
        memcpy(s->rep, r->valuestring, s->rep_len);
    } else {
        return enc_fail(e, TWK_ERR_UNSUPPORTED,
                        "%s: pre_tokenizer '%s' is not supported for encoding (Split, ByteLevel, Metaspace, Sequence)",
                        path, ty),
               0;
    }
    e->n_pre++;
    return 1;
}

static size_t merge_find(const tok_enc *e, uint64_t key) {
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & e->merge_mask;
    while (e->merges[i].key != ~0ull && e->merges[i].key != key) i = (i + 1) & e->merge_mask;
    return i;
}

static int parse_merges(twk_tokenizer *t, tok_enc *e, const char *path, const cJSON *m) {
    int n = cJSON_IsArray(m) ? cJSON_GetArraySize(m) : 0;
    size_t cap = 16;
    while (cap < 2 * (size_t)n + 2) cap *= 2;
    e->merges = twk_host_alloc(cap * sizeof *e->merges, "tokenizer merges");
    if (!e->merges) return enc_fail(e, TWK_ERR_OOM, "%s: out of memory", path), 0;
    for (size_t i = 0; i < cap; i++) e->merges[i].key = ~0ull;
    e->merge_mask = cap - 1;
    int rank = 0;
    buf_t w = {0};
    for (const cJSON *x = n ? m->child : NULL; x; x = x->next, rank++) {
        const char *a, *b;
        size_t an, bn;
        if (cJSON_IsString(x)) {
            const char *sp = strchr(x->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                twk_host_free(w.b);
                return enc_fail(e, TWK_ERR_INVALID_ARG, "%s: model.merges[%d] is not two tokens", path, rank), 0;
            }
            a = x->valuestring, an = (size_t)(sp - a), b = sp + 1, bn = strlen(b);
        } else if (cJSON_IsArray(x) && cJSON_GetArraySize(x) == 2 && cJSON_IsString(x->child) &&
                   cJSON_IsString(x->child->next)) {
            a = x->child->valuestring, an = strlen(a), b = x->child->next->valuestring, bn = strlen(b);
        } else {
            twk_host_free(w.b);
            return enc_fail(e, TWK_ERR_INVALID_ARG, "%s: model.merges[%d] is not two tokens", path, rank), 0;
        }
        w.len = 0;
        int32_t ia = twk_tok_model_find(t, a, an), ib = twk_tok_model_find(t, b, bn), ic = -1;
        if (twk_tok_buf_add(&w, a, an) && twk_tok_buf_add(&w, b, bn)) ic = twk_tok_model_find(t, w.b, w.len);
        if (ia < 0 || ib < 0 || ic < 0) {
            twk_host_free(w.b);
            return enc_fail(e, TWK_ERR_INVALID_ARG, "%s: model.merges[%d]: a token or its merge is not in the vocab",
                            path, rank),
                   0;
        }
        uint64_t key = (uint64_t)ia << 32 | (uint32_t)ib;
        merge_slot *s = &e->merges[merge_find(e, key)];
        s->key = key; /* a repeated pair takes its last rank, as the library's map */
        s->rank = (uint32_t)rank;
        s->id = ic;
    }
    twk_host_free(w.b);
    return 1;
}

static int cmp_apat(const void *x, const void *y) {
    const apat *a = x, *b = y;
    unsigned ca = (unsigned char)a->s[0], cb = (unsigned char)b->s[0];
    if (ca != cb) return ca < cb ? -1 : 1;
    if (a->n != b->n) return a->n > b->n ? -1 : 1;
    return a->added - b->added;
}

static int build_matcher(const twk_tokenizer *t, amatcher *m, int normalized) {
    int n = 0;
    m->p = twk_host_alloc(((size_t)t->n_added + 1) * sizeof *m->p, "tokenizer added tokens");
    if (!m->p) return 0;
    for (int32_t k = 0; k < t->n_added; k++) {
        const tok_added *a = &t->added[k];
        if (a->normalized != normalized) continue;
        const tok_entry *en = &t->ent[a->id];
        apat p = {t->arena + a->off, a->len, k};
        if (normalized && (en->flags & ENT_NORM)) p.s = t->arena + en->norm_off, p.n = en->norm_len;
        if (p.n) m->p[n++] = p;
    }
    qsort(m->p, (size_t)n, sizeof *m->p, cmp_apat);
    int j = 0;
    for (int c = 0; c <= 256; c++) {
        while (j < n && (unsigned char)m->p[j].s[0] < c) j++;
        m->start[c] = j;
    }
    m->start[256] = n;
    return 1;
}

/* The ids of a post-processor's "single" template around the sequence. */
static int parse_template(twk_tokenizer *t, tok_enc *e, const char *path, const cJSON *pp) {
    const char *ty = twk_tok_type_of(pp);
    ids_t pre = {0}, suf = {0};
    int ok = 1;
    if (ty && !strcmp(ty, "TemplateProcessing")) {
        const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(pp, "special_tokens");
        int seen = 0;
        if (!cJSON_IsArray(single))
            return enc_fail(e, TWK_ERR_INVALID_ARG, "%s: TemplateProcessing has no 'single' array", path), 0;
        for (const cJSON *x = single->child; x && ok; x = x->next) {
            const cJSON *st = cJSON_GetObjectItemCaseSensitive(x, "SpecialToken");
            const cJSON *sq = cJSON_GetObjectItemCaseSensitive(x, "Sequence");
            if (sq) {
                const cJSON *id = cJSON_GetObjectItemCaseSensitive(sq, "id");
                if (seen || !cJSON_IsString(id) || strcmp(id->valuestring, "A")) {
                    enc_fail(e, TWK_ERR_UNSUPPORTED, "%s: TemplateProcessing 'single' must hold sequence A once",
                             path);
                    ok = 0;
                }
                seen = 1;
                continue;
            }
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(st, "id");
            const cJSON *spec = cJSON_IsString(id) ? cJSON_GetObjectItemCaseSensitive(sp, id->valuestring) : NULL;
            const cJSON *l = cJSON_GetObjectItemCaseSensitive(spec, "ids");
            if (!cJSON_IsArray(l)) {
                enc_fail(e, TWK_ERR_INVALID_ARG, "%s: TemplateProcessing: a special token without 'ids'", path);
                ok = 0;
                break;
            }
            for (const cJSON *v = l->child; v && ok; v = v->next) {
                double d;
                if (!twk_tok_get_int(v, 0, t->size - 1, &d)) {
                    enc_fail(e, TWK_ERR_INVALID_ARG, "%s: TemplateProcessing: special token id out of range", path);
                    ok = 0;
                } else if (!ids_push(seen ? &suf : &pre, (int32_t)d)) {
                    enc_fail(e, TWK_ERR_OOM, "%s: out of memory", path);
                    ok = 0;
                }
            }
        }
    } else if (ty && (!strcmp(ty, "BertProcessing") || !strcmp(ty, "RobertaProcessing"))) {
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(pp, "cls"), *sep = cJSON_GetObjectItemCaseSensitive(pp, "sep");
        double a, b;
        if (!cJSON_IsArray(cls) || !cJSON_IsArray(sep) || cJSON_GetArraySize(cls) != 2 || cJSON_GetArraySize(sep) != 2 ||
            !twk_tok_get_int(cls->child->next, 0, t->size - 1, &a) ||
            !twk_tok_get_int(sep->child->next, 0, t->size - 1, &b))
            return enc_fail(e, TWK_ERR_INVALID_ARG, "%s: post_processor %s needs cls and sep [token, id]", path, ty),
                   0;
        ok = ids_push(&pre, (int32_t)a) && ids_push(&suf, (int32_t)b);
        if (!ok) enc_fail(e, TWK_ERR_OOM, "%s: out of memory", path);
    } else if (!ty || strcmp(ty, "ByteLevel")) {
        return enc_fail(e, TWK_ERR_UNSUPPORTED,
                        "%s: post_processor '%s' is not supported (TemplateProcessing, ByteLevel, Bert/RobertaProcessing, "
                        "Sequence)",
                        path, ty ? ty : "?"),
               0;
    }
    if (ok) { /* wrap what earlier processors made: prefix before theirs, suffix after */
        ids_t np = {0}, ns = {0};
        ok = ids_add(&np, pre.v, pre.n) && ids_add(&np, e->prefix, (size_t)e->n_prefix) &&
             ids_add(&ns, e->suffix, (size_t)e->n_suffix) && ids_add(&ns, suf.v, suf.n);
        twk_host_free(e->prefix);
        twk_host_free(e->suffix);
        e->prefix = np.v, e->n_prefix = (int)np.n, e->suffix = ns.v, e->n_suffix = (int)ns.n;
        if (!ok) enc_fail(e, TWK_ERR_OOM, "%s: out of memory", path);
    }
    twk_host_free(pre.v);
    twk_host_free(suf.v);
    return ok;
}

static void load(twk_tokenizer *t, tok_enc *e, const char *path, const cJSON *j) {
    if (t->norm_err) return enc_fail(e, t->norm_err, "%s", t->norm_msg);
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(j, "truncation"),
                *pad = cJSON_GetObjectItemCaseSensitive(j, "padding");
    if ((tr && !cJSON_IsNull(tr)) || (pad && !cJSON_IsNull(pad)))
        return enc_fail(e, TWK_ERR_UNSUPPORTED, "%s: 'truncation' and 'padding' are not supported for encoding", path);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "model");
    const cJSON *dr = cJSON_GetObjectItemCaseSensitive(m, "dropout");
    if (dr && !cJSON_IsNull(dr) && !(cJSON_IsNumber(dr) && dr->valuedouble == 0))
        return enc_fail(e, TWK_ERR_UNSUPPORTED, "%s: BPE dropout is not supported for encoding", path);
    const char *opt[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, opt[i]);
        if (v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && !v->valuestring[0]))
            return enc_fail(e, TWK_ERR_UNSUPPORTED, "%s: BPE %s is not supported for encoding", path, opt[i]);
    }
    e->byte_fallback = twk_tok_opt_bool(m, "byte_fallback", 0);
    e->fuse_unk = twk_tok_opt_bool(m, "fuse_unk", 0);
    e->ignore_merges = twk_tok_opt_bool(m, "ignore_merges", 0);
    if (e->byte_fallback < 0 || e->fuse_unk < 0 || e->ignore_merges < 0)
        return enc_fail(e, TWK_ERR_INVALID_ARG, "%s: model byte_fallback/fuse_unk/ignore_merges must be booleans", path);
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(m, "unk_token");
    e->unk = -1;
    if (cJSON_IsString(unk)) {
        e->unk = twk_tok_model_find(t, unk->valuestring, strlen(unk->valuestring));
        if (e->unk < 0) e->unk = -2, e->unk_name = twk_host_strdup(unk->valuestring, "tokenizer unk");
    }
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        e->byte_id[b] = twk_tok_model_find(t, s, 6);
    }
    for (uint32_t c = 0; c < 0x180; c++) {
        char s[4];
        e->small_id[c] = twk_tok_model_find(t, s, (size_t)twk_tok_put_utf8(c, s));
    }
    if (!parse_merges(t, e, path, cJSON_GetObjectItemCaseSensitive(m, "merges"))) return;
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(j, "pre_tokenizer");
    if (pre && !cJSON_IsNull(pre) && !parse_pre(e, path, pre, 0)) return;
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(j, "post_processor");
    if (pp && !cJSON_IsNull(pp)) {
        const char *ty = twk_tok_type_of(pp);
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(pp, "processors");
        if (ty && !strcmp(ty, "Sequence") && cJSON_IsArray(l)) {
            for (const cJSON *x = l->child; x; x = x->next)
                if (!parse_template(t, e, path, x)) return;
        } else if (!parse_template(t, e, path, pp)) {
            return;
        }
    }
    if (!build_matcher(t, &e->raw, 0) || !build_matcher(t, &e->norm, 1))
        return enc_fail(e, TWK_ERR_OOM, "%s: out of memory", path);
    e->cache = twk_host_calloc(CACHE_SLOTS * sizeof *e->cache, "tokenizer cache");
    if (!e->cache) return enc_fail(e, TWK_ERR_OOM, "%s: out of memory", path);
}

void twk_tok_enc_load(twk_tokenizer *t, const char *path, const cJSON *j) {
    tok_enc *e = twk_host_calloc(sizeof *e, "tokenizer");
    t->enc = e;
    if (!e) return;
    pthread_mutex_init(&e->lock, NULL);
    load(t, e, path, j);
}

void twk_tok_enc_free(tok_enc *e) {
    if (!e) return;
    pthread_mutex_destroy(&e->lock);
    twk_host_free(e->err);
    twk_host_free(e->merges);
    twk_host_free(e->unk_name);
    twk_host_free(e->raw.p);
    twk_host_free(e->norm.p);
    twk_host_free(e->prefix);
    twk_host_free(e->suffix);
    twk_host_free(e->cache);
    twk_host_free(e->cache_keys.b);
    twk_host_free(e->cache_vals);
    twk_host_free(e);
}

/* ---- encoding ------------------------------------------------------------------------------------ */

typedef struct {
    uint32_t rank, pos;
    int32_t id;
} heap_ent;

typedef struct {
    const twk_tokenizer *t;
    tok_enc *e;
    ids_t out;
    pieces pa, pb;
    buf_t nb, tmp;
    int32_t *sym, *prev, *next; /* BPE symbols of one word */
    size_t sym_cap;
    heap_ent *heap;
    size_t heap_n, heap_cap;
    twk_status st;
} ctx;

static int ctx_oom(ctx *c) {
    c->st = twk_error(TWK_ERR_OOM, "tokenizer encode: out of memory");
    return 0;
}

static uint64_t word_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 31);
}

/* Called with e->lock held: the cached ids of word s, appended to out; 0 when absent. */
static int cache_get(tok_enc *e, uint64_t h, const char *s, size_t n, ids_t *out, int *oom) {
    for (size_t i = h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
        const cache_slot *c = &e->cache[i];
        if (!c->key_len) return 0;
        if (c->h == h && c->key_len == n && !memcmp(e->cache_keys.b + c->key_off, s, n)) {
            if (!ids_add(out, e->cache_vals + c->val_off, c->val_n)) *oom = 1;
            return 1;
        }
    }
}

static void cache_put(tok_enc *e, uint64_t h, const char *s, size_t n, const int32_t *v, size_t nv) {
    if (e->cache_used >= CACHE_SLOTS / 2 || e->cache_keys.len + n > CACHE_MAX_BYTES) {
        memset(e->cache, 0, CACHE_SLOTS * sizeof *e->cache);
        e->cache_used = 0;
        e->cache_keys.len = 0;
        e->cache_nvals = 0;
    }
    if (!e->cache_vals || e->cache_nvals + nv > e->cache_capvals) {
        size_t cap = e->cache_capvals ? 2 * e->cache_capvals : 1 << 16;
        while (cap < e->cache_nvals + nv) cap *= 2;
        int32_t *nvp =
            twk_host_realloc(e->cache_vals, e->cache_nvals * sizeof *nvp, cap * sizeof *nvp, "tokenizer cache");
        if (!nvp) return;
        e->cache_vals = nvp;
        e->cache_capvals = cap;
    }
    size_t koff = e->cache_keys.len;
    if (!twk_tok_buf_add(&e->cache_keys, s, n)) return;
    size_t i = h & (CACHE_SLOTS - 1);
    while (e->cache[i].key_len) i = (i + 1) & (CACHE_SLOTS - 1);
    if (nv) memcpy(e->cache_vals + e->cache_nvals, v, nv * sizeof *v);
    e->cache[i] = (cache_slot){h, (uint32_t)koff, (uint32_t)n, (uint32_t)e->cache_nvals, (uint32_t)nv};
    e->cache_nvals += nv;
    e->cache_used++;
}

static int heap_less(const heap_ent *a, const heap_ent *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static int heap_push(ctx *c, uint32_t rank, uint32_t pos, int32_t id) {
    if (!twk_tok_grow(&c->heap, c->heap_n, &c->heap_cap, sizeof *c->heap)) return 0;
    size_t i = c->heap_n++;
    heap_ent x = {rank, pos, id};
    while (i > 0 && heap_less(&x, &c->heap[(i - 1) / 2])) {
        c->heap[i] = c->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    c->heap[i] = x;
    return 1;
}

static heap_ent heap_pop(ctx *c) {
    heap_ent top = c->heap[0], x = c->heap[--c->heap_n];
    size_t i = 0, n = c->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        const heap_ent *best = &x;
        if (l < n && heap_less(&c->heap[l], best)) m = l, best = &c->heap[l];
        if (l + 1 < n && heap_less(&c->heap[l + 1], best)) m = l + 1;
        if (m == i) break;
        c->heap[i] = c->heap[m];
        i = m;
    }
    if (n) c->heap[i] = x;
    return top;
}

/* Pushes the merge of symbols (a, next[a]) when there is one. */
static int push_pair(ctx *c, int32_t a) {
    int32_t b = c->next[a];
    if (b < 0) return 1;
    const tok_enc *e = c->e;
    const merge_slot *m = &e->merges[merge_find(e, (uint64_t)c->sym[a] << 32 | (uint32_t)c->sym[b])];
    return m->key == ~0ull || heap_push(c, m->rank, (uint32_t)a, m->id);
}

static int sym_add(ctx *c, size_t *n, int32_t id) {
    if (*n == c->sym_cap) { /* three arrays of one capacity */
        size_t cap = c->sym_cap, c2 = cap, c3 = cap;
        if (!twk_tok_grow(&c->sym, *n, &cap, sizeof *c->sym) || !twk_tok_grow(&c->prev, *n, &c2, sizeof *c->prev) ||
            !twk_tok_grow(&c->next, *n, &c3, sizeof *c->next))
            return 0;
        c->sym_cap = cap;
    }
    c->sym[*n] = id;
    (*n)++;
    return 1;
}

/* BPE::merge_word then Word::merge_all: the ids of one word, appended to c->out. */
static int bpe_word(ctx *c, const char *s, size_t len) {
    const tok_enc *e = c->e;
    size_t n = 0;
    int32_t unk = -1; /* pending unk */
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = (size_t)twk_tok_utf8_len((const unsigned char *)s + i, len - i, &cp);
        if (!k) k = 1, cp = 0x110000; /* not reached: the text is valid UTF-8 */
        int32_t id = cp < 0x180 ? e->small_id[cp] : twk_tok_model_find(c->t, s + i, k);
        if (id >= 0) {
            if (unk >= 0 && !sym_add(c, &n, unk)) return ctx_oom(c);
            unk = -1;
            if (!sym_add(c, &n, id)) return ctx_oom(c);
            i += k;
            continue;
        }
        if (e->byte_fallback) {
            size_t b = 0;
            while (b < k && e->byte_id[(unsigned char)s[i + b]] >= 0) b++;
            if (b == k) {
                for (b = 0; b < k; b++)
                    if (!sym_add(c, &n, e->byte_id[(unsigned char)s[i + b]])) return ctx_oom(c);
                i += k;
                continue;
            }
        }
        if (e->unk == -2) {
            char q[160];
            c->st = twk_error(TWK_ERR_INVALID_ARG, "tokenizer encode: the unk_token '%s' is not in the vocab",
                              twk_tok_qs(e->unk_name, strlen(e->unk_name), q, sizeof q));
            return 0;
        }
        if (e->unk >= 0) {
            if (unk >= 0 && !e->fuse_unk && !sym_add(c, &n, unk)) return ctx_oom(c);
            unk = e->unk;
        }
        i += k;
    }
    if (unk >= 0 && !sym_add(c, &n, unk)) return ctx_oom(c);
    for (size_t i = 0; i < n; i++) {
        c->prev[i] = (int32_t)i - 1;
        c->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    c->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++)
        if (!push_pair(c, (int32_t)i)) return ctx_oom(c);
    while (c->heap_n) {
        heap_ent top = heap_pop(c);
        int32_t a = (int32_t)top.pos, b = c->next[a];
        if (c->sym[a] < 0 || b < 0) continue; /* removed, or the last symbol */
        const merge_slot *m = &e->merges[merge_find(e, (uint64_t)c->sym[a] << 32 | (uint32_t)c->sym[b])];
        if (m->key == ~0ull || m->id != top.id) continue; /* an expired entry */
        c->sym[a] = top.id;
        c->sym[b] = -1;
        c->next[a] = c->next[b];
        if (c->next[b] >= 0) c->prev[c->next[b]] = a;
        if ((c->prev[a] >= 0 && !push_pair(c, c->prev[a])) || !push_pair(c, a)) return ctx_oom(c);
    }
    for (size_t i = 0; i < n; i++)
        if (c->sym[i] >= 0 && !ids_push(&c->out, c->sym[i])) return ctx_oom(c);
    return 1;
}

/* BPE::tokenize of one word (ignore_merges, the cache, merge_word). */
static int model_word(ctx *c, const char *s, size_t n) {
    tok_enc *e = c->e;
    if (!n) return 1;
    if (e->ignore_merges) {
        int32_t id = twk_tok_model_find(c->t, s, n);
        if (id >= 0) return ids_push(&c->out, id) ? 1 : ctx_oom(c);
    }
    uint64_t h = 0;
    int cacheable = n < CACHE_MAX_WORD;
    if (cacheable) {
        h = word_hash(s, n);
        if (!pthread_mutex_trylock(&e->lock)) {
            int oom = 0, hit = cache_get(e, h, s, n, &c->out, &oom);
            pthread_mutex_unlock(&e->lock);
            if (oom) return ctx_oom(c);
            if (hit) return 1;
        }
    }
    size_t before = c->out.n;
    if (!bpe_word(c, s, n)) return 0;
    if (cacheable && !pthread_mutex_trylock(&e->lock)) {
        cache_put(e, h, s, n, c->out.v + before, c->out.n - before);
        pthread_mutex_unlock(&e->lock);
    }
    return 1;
}

/* One pre-tokenizer step over every piece of `in`, into `out`. */
static int pre_step_run(ctx *c, const pre_step *p, const pieces *in, pieces *out) {
    pc_clear(out);
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->b.b + in->p[i].off;
        size_t n = in->p[i].len;
        int first = in->p[i].first;
        if (p->kind == PRE_METASPACE) {
            buf_t *t = &c->tmp;
            t->len = 0;
            for (size_t j = 0; j < n; j++)
                if (!(s[j] == ' ' ? twk_tok_buf_add(t, p->rep, p->rep_len) : twk_tok_buf_add(t, s + j, 1))) return 0;
            int starts = t->len >= p->rep_len && !memcmp(t->b, p->rep, p->rep_len);
            if (!starts && (p->scheme == 2 || (p->scheme == 1 && first))) {
                if (!twk_tok_buf_reserve(t, p->rep_len)) return 0;
                memmove(t->b + p->rep_len, t->b, t->len + 1);
                memcpy(t->b, p->rep, p->rep_len);
                t->len += p->rep_len;
            }
            size_t st = 0;
            if (p->split)
                for (size_t j = 1; j + p->rep_len <= t->len; j++)
                    if (!memcmp(t->b + j, p->rep, p->rep_len)) {
                        if (!pc_push(out, t->b + st, j - st, first && !st)) return 0;
                        st = j;
                    }
            if (!pc_push(out, t->b + st, t->len - st, first && !st)) return 0;
            continue;
        }
        if (p->kind == PRE_BYTE_LEVEL && p->prefix_space && s[0] != ' ') {
            buf_t *t = &c->tmp;
            t->len = 0;
            if (!twk_tok_buf_add(t, " ", 1) || !twk_tok_buf_add(t, s, n)) return 0;
            s = t->b, n = t->len;
        }
        size_t at = 0, gap = 0;
        while (at < n) {
            size_t end = p->rx >= 0 ? twk_rx_match(p->rx, s, n, at) : n;
            if (end == at) { /* no match here: part of a gap piece */
                at++;
                while (at < n && ((unsigned char)s[at] & 0xC0) == 0x80) at++;
                continue;
            }
            if (gap < at && !pc_push(out, s + gap, at - gap, first && !gap)) return 0;
            if (p->kind == PRE_SPLIT) {
                if (!pc_push(out, s + at, end - at, first && !at)) return 0;
            } else { /* ByteLevel: each byte to its character */
                size_t o = out->b.len;
                if (!pc_push(out, s + at, end - at, first && !at) || !twk_tok_buf_reserve(&out->b, end - at)) return 0;
                out->b.len = o;
                for (size_t j = at; j < end; j++)
                    out->b.len += (size_t)twk_tok_put_utf8(twk_tok_byte_char[(unsigned char)s[j]], out->b.b + out->b.len);
                out->b.b[out->b.len] = 0;
                out->p[out->n - 1].len = out->b.len - o;
            }
            at = gap = end;
        }
        if (gap < n && !pc_push(out, s + gap, n - gap, first && !gap)) return 0;
    }
    return 1;
}

/* A piece of normalized text: pre-tokenized, each word through the model. */
static int text_normalized(ctx *c, const char *s, size_t n, int first) {
    if (!n) return 1;
    if (!c->e->n_pre) return model_word(c, s, n);
    pieces *cur = &c->pa, *nx = &c->pb;
    pc_clear(cur);
    if (!pc_push(cur, s, n, first)) return ctx_oom(c);
    for (int k = 0; k < c->e->n_pre; k++) {
        if (!pre_step_run(c, &c->e->pre[k], cur, nx)) return ctx_oom(c);
        pieces *x = cur;
        cur = nx;
        nx = x;
    }
    for (size_t i = 0; i < cur->n; i++)
        if (!model_word(c, cur->b.b + cur->p[i].off, cur->p[i].len)) return 0;
    return 1;
}

typedef int (*text_fn)(ctx *c, const char *s, size_t n, int first);

static int char_before_is_word(const char *s, size_t i) {
    size_t j = i - 1;
    while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
    uint32_t cp;
    return twk_tok_utf8_len((const unsigned char *)s + j, i - j, &cp) && twk_uc_is_word(cp);
}

/* AddedVocabulary::find_matches over s[0..n): text between added tokens goes to fn. */
static int split_added(ctx *c, const amatcher *m, const char *s, size_t n, int first, text_fn fn) {
    if (!m->start[256]) return fn(c, s, n, first);
    size_t start_offset = 0, i = 0;
    while (i < n) {
        size_t ms = 0, me = 0;
        int32_t k = -1;
        for (size_t p = i; p < n && k < 0; p++) {
            unsigned ch = (unsigned char)s[p];
            for (int q = m->start[ch]; q < m->start[ch + 1]; q++) {
                const apat *a = &m->p[q];
                if (a->n <= n - p && !memcmp(s + p, a->s, a->n)) {
                    k = a->added, ms = p, me = p + a->n;
                    break;
                }
            }
        }
        if (k < 0) break;
        i = me;
        const tok_added *a = &c->t->added[k];
        size_t start = ms, stop = me;
        uint32_t cp;
        if (a->single_word) {
            int start_space = ms == 0 || !char_before_is_word(s, ms);
            int stop_space = me == n || !(twk_tok_utf8_len((const unsigned char *)s + me, n - me, &cp) &&
                                          twk_uc_is_word(cp));
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = ms;
            while (ns > 0) {
                size_t j = ns - 1;
                while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
                if (!twk_tok_utf8_len((const unsigned char *)s + j, ns - j, &cp) || !twk_uc_is_space(cp)) break;
                ns = j;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            int l;
            while (stop < n && (l = twk_tok_utf8_len((const unsigned char *)s + stop, n - stop, &cp)) > 0 &&
                   twk_uc_is_space(cp))
                stop += (size_t)l;
        }
        if (start_offset < start && !fn(c, s + start_offset, start - start_offset, first && !start_offset)) return 0;
        if (!ids_push(&c->out, a->id)) return ctx_oom(c);
        start_offset = stop;
    }
    if (start_offset < n) return fn(c, s + start_offset, n - start_offset, first && !start_offset);
    return 1;
}

/* A piece of raw text between non-normalized added tokens: normalized, then split on the
 * normalized added tokens. */
static int text_raw(ctx *c, const char *s, size_t n, int first) {
    if (!n) return 1;
    if (!c->t->norm) return split_added(c, &c->e->norm, s, n, first, text_normalized);
    c->nb.len = 0;
    if (!twk_tok_buf_add(&c->nb, s, n)) return ctx_oom(c);
    if ((c->st = twk_tok_norm_apply(c->t->norm, &c->nb, "tokenizer encode"))) return 0;
    return split_added(c, &c->e->norm, c->nb.b, c->nb.len, first, text_normalized);
}

/* text with every ill-formed UTF-8 sequence replaced by U+FFFD (maximal subparts), or NULL
 * when it is valid (and nothing was allocated). *fail on OOM. */
static char *sanitize(const char *s, size_t n, size_t *on, int *fail) {
    size_t i = 0;
    uint32_t cp;
    while (i < n) {
        if ((unsigned char)s[i] < 0x80) {
            i++;
            continue;
        }
        int k = twk_uc_utf8_next((const unsigned char *)s + i, n - i, &cp);
        if (k < 0) break;
        i += (size_t)k;
    }
    if (i == n) return NULL;
    buf_t b = {0};
    if (!twk_tok_buf_add(&b, s, i)) goto oom;
    while (i < n) {
        int k = twk_uc_utf8_next((const unsigned char *)s + i, n - i, &cp);
        if (k > 0) {
            if (!twk_tok_buf_add(&b, s + i, (size_t)k)) goto oom;
            i += (size_t)k;
        } else {
            if (!twk_tok_buf_add(&b, "\xEF\xBF\xBD", 3)) goto oom;
            i += (size_t)-k;
        }
    }
    *on = b.len;
    return b.b;
oom:
    twk_host_free(b.b);
    *fail = 1;
    return NULL;
}

twk_status twk_tokenizer_special_ids(const twk_tokenizer *t, const int32_t **prefix, int *n_prefix,
                                     const int32_t **suffix, int *n_suffix) {
    if (!t || !prefix || !n_prefix || !suffix || !n_suffix)
        return twk_error(TWK_ERR_INVALID_ARG, "twk_tokenizer_special_ids: NULL argument");
    *prefix = *suffix = NULL;
    *n_prefix = *n_suffix = 0;
    tok_enc *e = t->enc;
    if (!e) return twk_error(TWK_ERR_OOM, "tokenizer encode: out of memory");
    if (e->err) return twk_error(e->err_code, "tokenizer encode: %s", e->err);
    *prefix = e->n_prefix ? e->prefix : NULL, *n_prefix = e->n_prefix;
    *suffix = e->n_suffix ? e->suffix : NULL, *n_suffix = e->n_suffix;
    return TWK_OK;
}

twk_status twk_tokenizer_encode(const twk_tokenizer *t, const char *text, size_t len, bool add_special,
                                int32_t **ids, int64_t *n) {
    if (!t || !ids || !n || (!text && len))
        return twk_error(TWK_ERR_INVALID_ARG, "twk_tokenizer_encode: NULL tokenizer/text/ids/n");
    *ids = NULL;
    *n = 0;
    if (len > TOK_MAX_TEXT)
        return twk_error(TWK_ERR_INVALID_ARG, "tokenizer encode: %zu bytes of text; at most %d at once", len,
                         TOK_MAX_TEXT);
    tok_enc *e = t->enc;
    if (!e) return twk_error(TWK_ERR_OOM, "tokenizer encode: out of memory");
    if (e->err) return twk_error(e->err_code, "tokenizer encode: %s", e->err);
    int fail = 0;
    size_t sn = len;
    char *clean = len ? sanitize(text, len, &sn, &fail) : NULL;
    if (fail) return twk_error(TWK_ERR_OOM, "tokenizer encode: out of memory");
    ctx c = {.t = t, .e = e};
    int ok = !add_special || ids_add(&c.out, e->prefix, (size_t)e->n_prefix);
    if (!ok) ctx_oom(&c);
    ok = ok && split_added(&c, &e->raw, clean ? clean : text ? text : "", sn, 1, text_raw);
    if (ok && add_special && !ids_add(&c.out, e->suffix, (size_t)e->n_suffix)) ok = ctx_oom(&c);
    if (ok && !c.out.v && !(c.out.v = twk_host_alloc(sizeof *c.out.v, "token ids"))) ok = ctx_oom(&c);
    twk_host_free(clean);
    twk_host_free(c.pa.b.b), twk_host_free(c.pa.p), twk_host_free(c.pb.b.b), twk_host_free(c.pb.p);
    twk_host_free(c.nb.b), twk_host_free(c.tmp.b);
    twk_host_free(c.sym), twk_host_free(c.prev), twk_host_free(c.next), twk_host_free(c.heap);
    if (!ok) {
        twk_host_free(c.out.v);
        return c.st ? c.st : twk_error(TWK_ERR_OOM, "tokenizer encode: out of memory");
    }
    *ids = c.out.v;
    *n = (int64_t)c.out.n;
    return TWK_OK;
}

