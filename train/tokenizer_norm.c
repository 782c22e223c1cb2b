/* tokenizer.json normalizers (see tokenizer.h): NFC, NFD, NFKC, NFKD (unicode.c), Prepend,
 * Replace (String patterns), Strip, ByteLevel, Sequence; Lowercase and StripAccents only on
 * ASCII text. Each behaves as the `tokenizers` library's (0.23) on the whole string. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"
#include "unicode.h"
#include "twinkle/hal.h"

#define NORM_MAX_DEPTH 32
#define NORM_MAX_STEPS 256

enum { N_FORM, N_PREPEND, N_REPLACE, N_STRIP, N_BYTE_LEVEL, N_LOWER, N_STRIP_ACCENTS };

typedef struct {
    int kind, form, left, right;
    char *a, *b; /* Prepend: a; Replace: a -> b */
    size_t an, bn;
} norm_step;

struct tok_norm {
    norm_step s[NORM_MAX_STEPS];
    int n;
};

static char *dup(const char *s, size_t *n) {
    *n = strlen(s);
    char *d = twk_host_alloc(*n + 1, "tokenizer normalizer");
    if (d) memcpy(d, s, *n + 1);
    return d;
}

static twk_status parse(const char *path, const cJSON *j, tok_norm *t, int depth) {
    if (depth > NORM_MAX_DEPTH) return twk_error(TWK_ERR_INVALID_ARG, "%s: normalizers nested too deeply", path);
    const char *ty = cJSON_IsObject(j) ? twk_tok_type_of(j) : NULL;
    if (!ty) return twk_error(TWK_ERR_INVALID_ARG, "%s: a normalizer has no 'type'", path);
    if (!strcmp(ty, "Sequence")) {
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "normalizers");
        if (!cJSON_IsArray(l))
            return twk_error(TWK_ERR_INVALID_ARG, "%s: normalizer Sequence has no 'normalizers' array", path);
        for (const cJSON *e = l->child; e; e = e->next) {
            twk_status s = parse(path, e, t, depth + 1);
            if (s) return s;
        }
        return TWK_OK;
    }
    if (t->n == NORM_MAX_STEPS) return twk_error(TWK_ERR_INVALID_ARG, "%s: too many normalizers", path);
    norm_step *s = &t->s[t->n];
    memset(s, 0, sizeof *s);
    static const char *forms[] = {"NFC", "NFD", "NFKC", "NFKD"};
    for (int f = 0; f < 4; f++)
        if (!strcmp(ty, forms[f])) {
            s->kind = N_FORM;
            s->form = f; /* TWK_NFC, TWK_NFD, TWK_NFKC, TWK_NFKD */
            t->n++;
            return TWK_OK;
        }
    if (!strcmp(ty, "Prepend")) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prepend");
        if (!cJSON_IsString(p))
            return twk_error(TWK_ERR_INVALID_ARG, "%s: normalizer Prepend has no 'prepend' string", path);
        s->kind = N_PREPEND;
        if (!(s->a = dup(p->valuestring, &s->an))) return twk_error(TWK_ERR_OOM, "%s: out of memory", path);
    } else if (!strcmp(ty, "Replace")) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "pattern"),
                    *c = cJSON_GetObjectItemCaseSensitive(j, "content");
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(p, "String");
        if (cJSON_GetObjectItemCaseSensitive(p, "Regex"))
            return twk_error(TWK_ERR_UNSUPPORTED, "%s: normalizer Replace with a Regex pattern is not supported", path);
        if (!cJSON_IsString(ps) || !ps->valuestring[0] || !cJSON_IsString(c))
            return twk_error(TWK_ERR_INVALID_ARG,
                             "%s: normalizer Replace needs a non-empty pattern.String and a content", path);
        s->kind = N_REPLACE;
        if (!(s->a = dup(ps->valuestring, &s->an)) || !(s->b = dup(c->valuestring, &s->bn)))
            return twk_error(TWK_ERR_OOM, "%s: out of memory", path);
    } else if (!strcmp(ty, "Strip")) {
        s->left = twk_tok_opt_bool(j, "strip_left", 0);
        s->right = twk_tok_opt_bool(j, "strip_right", 0);
        if (s->left < 0 || s->right < 0)
            return twk_error(TWK_ERR_INVALID_ARG, "%s: normalizer Strip: strip_left/right must be booleans", path);
        s->kind = N_STRIP;
    } else if (!strcmp(ty, "ByteLevel")) {
        s->kind = N_BYTE_LEVEL;
    } else if (!strcmp(ty, "Lowercase")) {
        s->kind = N_LOWER;
    } else if (!strcmp(ty, "StripAccents")) {
        s->kind = N_STRIP_ACCENTS;
    } else {
        return twk_error(TWK_ERR_UNSUPPORTED,
                         "%s: normalizer '%s' is not supported (supported: Sequence, NFC, NFD, NFKC, NFKD, Prepend, "
                         "Replace, Strip, ByteLevel; Lowercase and StripAccents for ASCII text)",
                         path, ty);
    }
    t->n++;
    return TWK_OK;
}

twk_status twk_tok_norm_parse(const char *path, const cJSON *j, tok_norm **out) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return TWK_OK;
    tok_norm *t = twk_host_calloc(sizeof *t, "tokenizer normalizer");
    if (!t) return twk_error(TWK_ERR_OOM, "%s: out of memory", path);
    twk_status s = parse(path, j, t, 0);
    if (s) {
        twk_tok_norm_free(t);
        return s;
    }
    *out = t;
    return TWK_OK;
}

void twk_tok_norm_free(tok_norm *t) {
    if (!t) return;
    for (int i = 0; i < t->n; i++) {
        twk_host_free(t->s[i].a);
        twk_host_free(t->s[i].b);
    }
    twk_host_free(t);
}

static int is_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return 0;
    return 1;
}

/* Replace every non-overlapping pat (leftmost first) in b by rep. */
static int replace_all(buf_t *b, const char *pat, size_t pn, const char *rep, size_t rn) {
    if (!memmem(b->b, b->len, pat, pn)) return 1;
    buf_t o = {0};
    size_t i = 0;
    for (;;) {
        const char *m = memmem(b->b + i, b->len - i, pat, pn);
        size_t j = m ? (size_t)(m - b->b) : b->len;
        if (!twk_tok_buf_add(&o, b->b + i, j - i)) goto oom;
        if (!m) break;
        if (!twk_tok_buf_add(&o, rep, rn)) goto oom;
        i = j + pn;
    }
    twk_host_free(b->b);
    *b = o;
    return 1;
oom:
    twk_host_free(o.b);
    return 0;
}

/* Whether the form leaves s unchanged for certain: NFC / NFKC when no character carries the
 * table's "unstable" flag for it (see unicode_gen.py), NFD / NFKD for ASCII. */
static int form_identity(int form, const char *s, size_t n) {
    if (form == TWK_NFD || form == TWK_NFKD) return is_ascii(s, n);
    uint8_t flag = form == TWK_NFC ? TWK_UC_NFC_UNSTABLE : TWK_UC_NFKC_UNSTABLE;
    for (size_t i = 0; i < n;) {
        if ((unsigned char)s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int k = twk_uc_utf8_next((const unsigned char *)s + i, n - i, &cp);
        if (k <= 0 || (twk_uc_props(cp) & flag)) return 0;
        i += (size_t)k;
    }
    return 1;
}

static int step(const norm_step *s, buf_t *b) {
    switch (s->kind) {
    case N_FORM: {
        if (form_identity(s->form, b->b, b->len)) return 1;
        char *o;
        size_t on;
        if (twk_uc_normalize(b->b, b->len, s->form, &o, &on)) return 0;
        twk_host_free(b->b);
        b->b = o, b->len = on, b->cap = on + 1;
        return 1;
    }
    case N_PREPEND: {
        if (!b->len) return 1;
        if (!twk_tok_buf_reserve(b, s->an)) return 0;
        memmove(b->b + s->an, b->b, b->len + 1);
        memcpy(b->b, s->a, s->an);
        b->len += s->an;
        return 1;
    }
    case N_REPLACE:
        return replace_all(b, s->a, s->an, s->b, s->bn);
    case N_STRIP: {
        size_t st = 0, e = b->len;
        uint32_t cp;
        while (s->left && st < e) {
            int k = twk_tok_utf8_len((const unsigned char *)b->b + st, e - st, &cp);
            if (!k || !twk_uc_is_space(cp)) break;
            st += (size_t)k;
        }
        while (s->right && e > st) {
            size_t j = e - 1;
            while (j > st && ((unsigned char)b->b[j] & 0xC0) == 0x80) j--;
            if (!twk_tok_utf8_len((const unsigned char *)b->b + j, e - j, &cp) || !twk_uc_is_space(cp)) break;
            e = j;
        }
        memmove(b->b, b->b + st, e - st);
        b->len = e - st;
        b->b[b->len] = 0;
        return 1;
    }
    case N_BYTE_LEVEL: {
        buf_t o = {0};
        if (!twk_tok_buf_reserve(&o, 2 * b->len)) return 0;
        for (size_t i = 0; i < b->len; i++)
            o.len += (size_t)twk_tok_put_utf8(twk_tok_byte_char[(unsigned char)b->b[i]], o.b + o.len);
        o.b[o.len] = 0;
        twk_host_free(b->b);
        *b = o;
        return 1;
    }
    case N_LOWER:
        for (size_t i = 0; i < b->len; i++)
            if (b->b[i] >= 'A' && b->b[i] <= 'Z') b->b[i] = (char)(b->b[i] - 'A' + 'a');
        return 1;
    }
    return 1; /* StripAccents: ASCII has no accents */
}

twk_status twk_tok_norm_apply(const tok_norm *t, buf_t *b, const char *what) {
    if (!b->b && !twk_tok_buf_add(b, "", 0)) return twk_error(TWK_ERR_OOM, "%s: out of memory", what);
    for (int i = 0; t && i < t->n; i++) {
        const norm_step *s = &t->s[i];
        if ((s->kind == N_LOWER || s->kind == N_STRIP_ACCENTS) && !is_ascii(b->b, b->len))
            return twk_error(TWK_ERR_UNSUPPORTED, "%s: normalizer %s of non-ASCII text is not supported", what,
                             s->kind == N_LOWER ? "Lowercase" : "StripAccents");
        if (!step(s, b)) return twk_error(TWK_ERR_OOM, "%s: out of memory", what);
    }
    return TWK_OK;
}
