/* Chat-template Jinja subset: rendering (Python semantics for values, Jinja's for Undefined). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jinja_ast.h"
#include "twinkle/hal.h"

typedef struct cx {
    jj_arena *a;
    jj_output *o;
    const jj_list *tracked;
    int32_t owner;
    jj_dict *frames[256];
    int nf;
    int ctl; /* 1 break, 2 continue */
} cx;

#define rerr jj_error
#define TRY(x)                                                                                                         \
    do {                                                                                                               \
        twk_status st_ = (x);                                                                                          \
        if (st_) return st_;                                                                                           \
    } while (0)
#define OOM(line) rerr(TWK_ERR_OOM, line, "out of memory")

static const char *kind_name(jj_val v) {
    static const char *n[] = {"Undefined", "NoneType", "bool",      "int",    "float",   "str",
                              "list",      "dict",     "Namespace", "method", "function"};
    return n[v.kind];
}

static jj_val S(cx *c, const char *s) { return jj_str(c->a, s, strlen(s)); }

/* An undefined value carrying Jinja's message for it ("'x' is undefined", "'dict object' has no
 * attribute 'y'"), reported when the value is used. */
static jj_val undef_msg(cx *c, const char *fmt, const char *a, const char *b) {
    char m[256];
    snprintf(m, sizeof m, fmt, a, b);
    jj_val v = S(c, m);
    if (v.kind != JJ_STR) return (jj_val){.kind = JJ_UNDEF}; /* out of memory: undefined without a message */
    v.kind = JJ_UNDEF;
    return v;
}

static const char *undef_text(jj_val v) { return v.u.str.s ? v.u.str.s : "value is undefined"; }
static jj_val B(bool b) { return (jj_val){.kind = JJ_BOOL, .u.b = b}; }
static jj_val I(int64_t i) { return (jj_val){.kind = JJ_INT, .u.i = i}; }
static jj_val UNDEF = {.kind = JJ_UNDEF};

static jj_val buf_val(cx *c, jj_buf *b) {
    jj_val v = jj_str(c->a, b->p ? b->p : "", b->n);
    twk_host_free(b->p);
    return v;
}

static twk_status to_s(cx *c, int line, jj_val v, jj_val *out) {
    if (v.kind == JJ_STR) {
        *out = v;
        return TWK_OK;
    }
    jj_buf b = {0};
    jj_to_str(&b, v, 0);
    if (b.oom) {
        twk_host_free(b.p);
        return OOM(line);
    }
    *out = buf_val(c, &b);
    return TWK_OK;
}

static void emit(cx *c, const char *s, size_t n) {
    jj_output *o = c->o;
    size_t at = o->text.n;
    jj_buf_put(&o->text, s, n);
    if (o->text.oom) return;
    if (at + n > o->owner_cap) {
        size_t nc = o->owner_cap ? o->owner_cap : 256;
        while (nc < at + n) nc *= 2;
        int32_t *q =
            twk_host_realloc(o->owner, o->owner_cap * sizeof(int32_t), nc * sizeof(int32_t), "chat template output");
        if (!q) {
            o->text.oom = true;
            return;
        }
        o->owner = q;
        o->owner_cap = nc;
    }
    for (size_t i = 0; i < n; i++) o->owner[at + i] = c->owner;
}

/* ---- lookups ---- */
static bool has_method(jj_val v, const char *name) {
    static const char *str_m[] = {"startswith", "endswith",   "split",   "rsplit",  "strip", "lstrip",
                                  "rstrip",     "upper",      "lower",   "replace", "find",  "count",
                                  "title",      "capitalize", "isdigit", "isalpha", NULL};
    static const char *dict_m[] = {"items", "keys", "values", "get", NULL};
    const char **l = v.kind == JJ_STR ? str_m : v.kind == JJ_DICT ? dict_m : NULL;
    for (; l && *l; l++)
        if (strcmp(*l, name) == 0) return true;
    return false;
}

static twk_status method_val(cx *c, int line, jj_val obj, const char *name, jj_val *out) {
    jj_val *self = jj_alloc(c->a, sizeof *self);
    if (!self) return OOM(line);
    *self = obj;
    *out = (jj_val){.kind = JJ_METHOD, .u.m = {self, name}};
    return TWK_OK;
}

static twk_status getattr_(cx *c, int line, jj_val obj, const char *name, jj_val *out) {
    if (obj.kind == JJ_UNDEF)
        return rerr(TWK_ERR_INVALID_ARG, line, "%s (reading attribute '%s')", undef_text(obj), name);
    if (has_method(obj, name)) return method_val(c, line, obj, name, out);
    *out = undef_msg(c, "'%s object' has no attribute '%s'", kind_name(obj), name);
    if (obj.kind == JJ_DICT || obj.kind == JJ_NS) {
        jj_val *v = jj_dict_get(obj.u.dict, name, strlen(name));
        if (v) *out = *v;
    }
    return TWK_OK;
}

/* Byte offsets of each code point of s, plus the end. */
static size_t *cp_offsets(cx *c, jj_val s, size_t *ncp) {
    size_t n = jj_utf8_len(s.u.str.s, s.u.str.n);
    size_t *off = jj_alloc(c->a, (n + 1) * sizeof(size_t));
    if (!off) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < s.u.str.n; i++)
        if (((unsigned char)s.u.str.s[i] & 0xC0) != 0x80) off[k++] = i;
    off[n] = s.u.str.n;
    *ncp = n;
    return off;
}

static twk_status getitem(cx *c, int line, jj_val obj, jj_val key, jj_val *out) {
    if (obj.kind == JJ_UNDEF) return rerr(TWK_ERR_INVALID_ARG, line, "%s (subscripted)", undef_text(obj));
    if (key.kind == JJ_STR) *out = undef_msg(c, "'%s object' has no attribute '%s'", kind_name(obj), key.u.str.s);
    else {
        jj_buf kb = {0};
        jj_to_str(&kb, key, 1);
        *out = undef_msg(c, "'%s object' has no element %s", kind_name(obj), kb.p ? kb.p : "?");
        twk_host_free(kb.p);
    }
    if (obj.kind == JJ_DICT || obj.kind == JJ_NS) {
        for (size_t i = 0; i < obj.u.dict->n; i++)
            if (jj_equal(obj.u.dict->k[i], key)) {
                *out = obj.u.dict->v[i];
                return TWK_OK;
            }
        if (key.kind == JJ_STR && obj.kind == JJ_DICT && has_method(obj, key.u.str.s))
            return method_val(c, line, obj, key.u.str.s, out);
        return TWK_OK;
    }
    if ((obj.kind == JJ_LIST || obj.kind == JJ_STR) && (key.kind == JJ_INT || key.kind == JJ_BOOL)) {
        int64_t i = key.kind == JJ_BOOL ? key.u.b : key.u.i;
        if (obj.kind == JJ_LIST) {
            int64_t n = (int64_t)obj.u.list->n;
            if (i < 0) i += n;
            if (i >= 0 && i < n) *out = obj.u.list->v[i];
            return TWK_OK;
        }
        size_t n, *off = cp_offsets(c, obj, &n);
        if (!off) return OOM(line);
        if (i < 0) i += (int64_t)n;
        if (i >= 0 && i < (int64_t)n) *out = jj_str(c->a, obj.u.str.s + off[i], off[i + 1] - off[i]);
        return TWK_OK;
    }
    if (key.kind == JJ_STR) return getattr_(c, line, obj, key.u.str.s, out);
    return TWK_OK;
}

static jj_val lookup(cx *c, const char *name) {
    for (int i = c->nf - 1; i >= 0; i--) {
        jj_val *v = jj_dict_get(c->frames[i], name, strlen(name));
        if (v) return *v;
    }
    static const char *globals[] = {"raise_exception", "namespace", "strftime_now", "dict", "range", NULL};
    for (const char **g = globals; *g; g++)
        if (strcmp(*g, name) == 0) return (jj_val){.kind = JJ_FUNC, .u.str = {*g, strlen(*g)}};
    return undef_msg(c, "'%s' is undefined%s", name, "");
}

/* ---- evaluation ---- */
static twk_status eval(cx *c, const jj_expr *e, jj_val *out);

typedef struct args {
    jj_val v[32];
    const char *kw[32];
    int n;
} args;

static twk_status eval_args(cx *c, const jj_expr *e, args *a) {
    a->n = e->nargs;
    for (int i = 0; i < e->nargs; i++) {
        TRY(eval(c, e->args[i], &a->v[i]));
        a->kw[i] = e->kwnames ? e->kwnames[i] : NULL;
    }
    return TWK_OK;
}

/* Positional argument i or keyword `kw`; NULL when absent. */
static jj_val *arg(args *a, int i, const char *kw) {
    int pos = 0;
    for (int k = 0; k < a->n; k++) {
        if (a->kw[k]) {
            if (kw && strcmp(a->kw[k], kw) == 0) return &a->v[k];
        } else if (pos++ == i) return &a->v[k];
    }
    return NULL;
}

static twk_status need_str(int line, const char *what, jj_val *v) {
    if (!v || v->kind != JJ_STR) return rerr(TWK_ERR_INVALID_ARG, line, "%s expects a string argument", what);
    return TWK_OK;
}

/* Python str.strip / lstrip / rstrip (chars NULL: whitespace). */
static jj_val strip(cx *c, jj_val s, const jj_val *chars, bool left, bool right) {
    const char *p = s.u.str.s;
    size_t b = 0, e = s.u.str.n, cl;
    if (chars && chars->kind == JJ_STR) {
        const char *set = chars->u.str.s;
        size_t sn = chars->u.str.n;
        while (left && b < e && memchr(set, p[b], sn) && ((unsigned char)p[b] < 0x80)) b++;
        while (right && e > b && memchr(set, p[e - 1], sn) && ((unsigned char)p[e - 1] < 0x80)) e--;
    } else {
        while (left && b < e && jj_is_space(p + b, e - b, &cl)) b += cl;
        while (right && e > b) {
            size_t k = e - 1;
            while (k > b && ((unsigned char)p[k] & 0xC0) == 0x80) k--;
            if (!jj_is_space(p + k, e - k, &cl) || k + cl != e) break;
            e = k;
        }
    }
    return jj_str(c->a, p + b, e - b);
}

static twk_status split(cx *c, int line, jj_val s, jj_val *sep, jj_val *out) {
    jj_list *l = jj_list_new(c->a);
    if (!l) return OOM(line);
    const char *p = s.u.str.s;
    size_t n = s.u.str.n;
    if (!sep || sep->kind == JJ_NONE) {
        size_t i = 0, cl;
        for (;;) {
            while (i < n && jj_is_space(p + i, n - i, &cl)) i += cl;
            if (i >= n) break;
            size_t j = i;
            while (j < n && !jj_is_space(p + j, n - j, &cl)) j++;
            if (!jj_list_push(c->a, l, jj_str(c->a, p + i, j - i))) return OOM(line);
            i = j;
        }
    } else {
        TRY(need_str(line, "split", sep));
        size_t sn = sep->u.str.n;
        if (sn == 0) return rerr(TWK_ERR_INVALID_ARG, line, "split: empty separator");
        size_t i = 0;
        for (;;) {
            size_t j = i;
            while (j + sn <= n && memcmp(p + j, sep->u.str.s, sn) != 0) j++;
            if (j + sn > n) {
                if (!jj_list_push(c->a, l, jj_str(c->a, p + i, n - i))) return OOM(line);
                break;
            }
            if (!jj_list_push(c->a, l, jj_str(c->a, p + i, j - i))) return OOM(line);
            i = j + sn;
        }
    }
    *out = (jj_val){.kind = JJ_LIST, .u.list = l};
    return TWK_OK;
}

static bool contains(jj_val hay, jj_val needle) {
    if (hay.kind == JJ_STR && needle.kind == JJ_STR) {
        if (needle.u.str.n == 0) return true;
        for (size_t i = 0; i + needle.u.str.n <= hay.u.str.n; i++)
            if (memcmp(hay.u.str.s + i, needle.u.str.s, needle.u.str.n) == 0) return true;
        return false;
    }
    if (hay.kind == JJ_LIST) {
        for (size_t i = 0; i < hay.u.list->n; i++)
            if (jj_equal(hay.u.list->v[i], needle)) return true;
        return false;
    }
    if (hay.kind == JJ_DICT || hay.kind == JJ_NS) {
        for (size_t i = 0; i < hay.u.dict->n; i++)
            if (jj_equal(hay.u.dict->k[i], needle)) return true;
    }
    return false;
}

static twk_status call_method(cx *c, int line, jj_val self, const char *m, args *a, jj_val *out) {
    jj_val *a0 = arg(a, 0, NULL), *a1 = arg(a, 1, NULL);
    if (self.kind == JJ_DICT) {
        jj_dict *d = self.u.dict;
        if (strcmp(m, "get") == 0) {
            if (!a0) return rerr(TWK_ERR_INVALID_ARG, line, "get() needs a key");
            *out = a1 ? *a1 : (jj_val){.kind = JJ_NONE};
            for (size_t i = 0; i < d->n; i++)
                if (jj_equal(d->k[i], *a0)) *out = d->v[i];
            return TWK_OK;
        }
        jj_list *l = jj_list_new(c->a);
        if (!l) return OOM(line);
        for (size_t i = 0; i < d->n; i++) {
            jj_val item = m[0] == 'k' ? d->k[i] : d->v[i];
            if (m[0] == 'i') {
                jj_list *pair = jj_list_new(c->a);
                if (!pair || !jj_list_push(c->a, pair, d->k[i]) || !jj_list_push(c->a, pair, d->v[i])) return OOM(line);
                item = (jj_val){.kind = JJ_LIST, .u.list = pair};
            }
            if (!jj_list_push(c->a, l, item)) return OOM(line);
        }
        *out = (jj_val){.kind = JJ_LIST, .u.list = l};
        return TWK_OK;
    }
    /* str */
    const char *p = self.u.str.s;
    size_t n = self.u.str.n;
    if (strcmp(m, "startswith") == 0 || strcmp(m, "endswith") == 0) {
        TRY(need_str(line, m, a0));
        size_t k = a0->u.str.n;
        bool r = k <= n && memcmp(m[0] == 's' ? p : p + n - k, a0->u.str.s, k) == 0;
        *out = B(r);
        return TWK_OK;
    }
    if (strcmp(m, "split") == 0 || strcmp(m, "rsplit") == 0) {
        if (a1 || arg(a, 99, "maxsplit"))
            return rerr(TWK_ERR_UNSUPPORTED, line, "unsupported construct: %s with maxsplit", m);
        return split(c, line, self, a0 ? a0 : arg(a, 99, "sep"), out);
    }
    if (strcmp(m, "strip") == 0 || strcmp(m, "lstrip") == 0 || strcmp(m, "rstrip") == 0) {
        if (a0 && a0->kind == JJ_STR)
            for (size_t i = 0; i < a0->u.str.n; i++)
                if ((unsigned char)a0->u.str.s[i] >= 0x80)
                    return rerr(TWK_ERR_UNSUPPORTED, line, "unsupported construct: %s() of non-ASCII characters", m);
        *out = strip(c, self, a0, m[0] != 'r', m[0] != 'l');
        return TWK_OK;
    }
    bool ascii = true;
    for (size_t i = 0; i < n; i++) ascii = ascii && (unsigned char)p[i] < 0x80;
    static const char *ascii_only[] = {"upper", "lower", "capitalize", "title", "isdigit", "isalpha", NULL};
    for (const char **q = ascii_only; *q && !ascii; q++)
        if (strcmp(m, *q) == 0) /* case mapping and classes are ASCII here: refuse rather than differ */
            return rerr(TWK_ERR_UNSUPPORTED, line, "unsupported construct: %s() of non-ASCII text", m);
    if (strcmp(m, "upper") == 0 || strcmp(m, "lower") == 0 || strcmp(m, "capitalize") == 0 || strcmp(m, "title") == 0) {
        jj_val r = jj_str(c->a, p, n);
        char *q = (char *)r.u.str.s;
        bool start = true;
        for (size_t i = 0; i < n; i++) {
            char ch = q[i];
            bool up = m[0] == 'u' || (m[0] == 'c' && i == 0) || (m[0] == 't' && start);
            if (up && ch >= 'a' && ch <= 'z') q[i] = (char)(ch - 32);
            else if (!up && ch >= 'A' && ch <= 'Z') q[i] = (char)(ch + 32);
            start = !((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'));
        }
        *out = r;
        return TWK_OK;
    }
    if (strcmp(m, "replace") == 0) {
        TRY(need_str(line, "replace", a0));
        TRY(need_str(line, "replace", a1));
        if (a0->u.str.n == 0)
            return rerr(TWK_ERR_UNSUPPORTED, line, "unsupported construct: replace of an empty string");
        jj_buf b = {0};
        size_t i = 0;
        while (i < n) {
            if (i + a0->u.str.n <= n && memcmp(p + i, a0->u.str.s, a0->u.str.n) == 0) {
                jj_buf_put(&b, a1->u.str.s, a1->u.str.n);
                i += a0->u.str.n;
            } else jj_buf_put(&b, p + i++, 1);
        }
        if (b.oom) {
            twk_host_free(b.p);
            return OOM(line);
        }
        *out = buf_val(c, &b);
        return TWK_OK;
    }
    if (strcmp(m, "find") == 0 || strcmp(m, "count") == 0) {
        TRY(need_str(line, m, a0));
        int64_t found = -1, cnt = 0;
        size_t k = a0->u.str.n;
        for (size_t i = 0; i + k <= n;) {
            if (memcmp(p + i, a0->u.str.s, k) == 0) {
                if (found < 0) found = (int64_t)jj_utf8_len(p, i);
                cnt++;
                i += k ? k : 1;
            } else i++;
        }
        *out = I(m[0] == 'f' ? found : cnt);
        return TWK_OK;
    }
    if (strcmp(m, "isdigit") == 0 || strcmp(m, "isalpha") == 0) {
        bool r = n > 0;
        for (size_t i = 0; i < n; i++) {
            char ch = p[i];
            r = r && (m[2] == 'd' ? (ch >= '0' && ch <= '9') : ((ch | 32) >= 'a' && (ch | 32) <= 'z'));
        }
        *out = B(r);
        return TWK_OK;
    }
    return rerr(TWK_ERR_UNSUPPORTED, line, "unsupported construct: method '%s' of %s", m, kind_name(self));
}

static twk_status call_func(cx *c, int line, const char *f, args *a, jj_val *out) {
    if (strcmp(f, "raise_exception") == 0) {
        jj_val *m = arg(a, 0, NULL);
        jj_val s = {0};
        if (m) TRY(to_s(c, line, *m, &s));
        return rerr(TWK_ERR_INVALID_ARG, line, "raise_exception: %.*s", (int)(m ? s.u.str.n : 0), m ? s.u.str.s : "");
    }
    if (strcmp(f, "namespace") == 0 || strcmp(f, "dict") == 0) {
        jj_dict *d = jj_dict_new(c->a);
        if (!d) return OOM(line);
        for (int i = 0; i < a->n; i++) {
            if (!a->kw[i]) {
                if (a->v[i].kind != JJ_DICT)
                    return rerr(TWK_ERR_UNSUPPORTED, line, "unsupported construct: positional %s() argument", f);
                for (size_t k = 0; k < a->v[i].u.dict->n; k++)
                    if (!jj_dict_set(c->a, d, a->v[i].u.dict->k[k], a->v[i].u.dict->v[k])) return OOM(line);
            } else if (!jj_dict_set(c->a, d, S(c, a->kw[i]), a->v[i])) return OOM(line);
        }
        *out = (jj_val){.kind = f[0] == 'n' ? JJ_NS : JJ_DICT, .u.dict = d};
        return TWK_OK;
    }
    if (strcmp(f, "strftime_now") == 0) {
        jj_val *fmt = arg(a, 0, NULL);
        TRY(need_str(line, "strftime_now", fmt));
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        char buf[256];
        size_t k = strftime(buf, sizeof buf, fmt->u.str.s, &tmv);
        *out = jj_str(c->a, buf, k);
        return TWK_OK;
    }
    /* range */
    int64_t lo = 0, hi = 0, st = 1;
    jj_val *r0 = arg(a, 0, NULL), *r1 = arg(a, 1, NULL), *r2 = arg(a, 2, NULL);
    if (!r0 || r0->kind != JJ_INT || (r1 && r1->kind != JJ_INT) || (r2 && r2->kind != JJ_INT))
        return rerr(TWK_ERR_INVALID_ARG, line, "range() expects integers");
    if (r1) {
        lo = r0->u.i;
        hi = r1->u.i;
    } else hi = r0->u.i;
    if (r2) st = r2->u.i;
    if (st == 0 || (hi - lo) / st > 100000) return rerr(TWK_ERR_INVALID_ARG, line, "range() too long or step 0");
    jj_list *l = jj_list_new(c->a);
    if (!l) return OOM(line);
    for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st)
        if (!jj_list_push(c->a, l, I(i))) return OOM(line);
    *out = (jj_val){.kind = JJ_LIST, .u.list = l};
    return TWK_OK;
}

static twk_status test(cx *c, int line, const char *name, jj_val v, args *a, bool *r);

/* The items a for loop or filter iterates: list items, dict keys, string characters. */
static twk_status iter_items(cx *c, int line, jj_val v, jj_list **out) {
    if (v.kind == JJ_LIST) {
        *out = v.u.list;
        return TWK_OK;
    }
    jj_list *l = jj_list_new(c->a);
    if (!l) return OOM(line);
    if (v.kind == JJ_DICT) {
        for (size_t i = 0; i < v.u.dict->n; i++)
            if (!jj_list_push(c->a, l, v.u.dict->k[i])) return OOM(line);
    } else if (v.kind == JJ_STR) {
        size_t n, *off = cp_offsets(c, v, &n);
        if (!off) return OOM(line);
        for (size_t i = 0; i < n; i++)
            if (!jj_list_push(c->a, l, jj_str(c->a, v.u.str.s + off[i], off[i + 1] - off[i]))) return OOM(line);
    } else if (v.kind != JJ_UNDEF) return rerr(TWK_ERR_INVALID_ARG, line, "'%s' object is not iterable", kind_name(v));
    *out = l;
    return TWK_OK;
}

static twk_status filter(cx *c, const jj_expr *e, jj_val v, jj_val *out) {
    int line = e->line;
    const char *f = e->name;
    args a;
    TRY(eval_args(c, e, &a));
    jj_val *a0 = arg(&a, 0, NULL);
    if (strcmp(f, "tojson") == 0) {
        jj_val *ind = arg(&a, 0, "indent");
        for (int i = 0; i < a.n; i++)
            if (&a.v[i] != ind)
                return rerr(TWK_ERR_UNSUPPORTED, line, "unsupported construct: tojson argument other than indent");
        int indent = -1;
        if (ind && ind->kind == JJ_INT) indent = (int)ind->u.i;
        else if (ind && ind->kind != JJ_NONE)
            return rerr(TWK_ERR_UNSUPPORTED, line, "unsupported construct: tojson indent that is not an integer");
        jj_buf b = {0};
        twk_status st = jj_to_json(&b, v, indent, 0);
        if (st) {
            twk_host_free(b.p);
            return rerr(st, line, "%s", twk_last_error());
        }
        if (b.oom) {
            twk_host_free(b.p);
            return OOM(line);
        }
        *out = buf_val(c, &b);
        return TWK_OK;
    }
    if (strcmp(f, "trim") == 0 || strcmp(f, "string") == 0 || strcmp(f, "upper") == 0 || strcmp(f, "lower") == 0 ||
        strcmp(f, "capitalize") == 0 || strcmp(f, "title") == 0 || strcmp(f, "safe") == 0) {
        if (f[0] == 's' && v.kind == JJ_UNDEF) {
            *out = S(c, "");
            return TWK_OK;
        }
        jj_val s;
        TRY(to_s(c, line, v, &s));
        if (f[0] == 't' && f[1] == 'r') {
            *out = strip(c, s, a0, true, true);
            return TWK_OK;
        }
        if (f[0] == 's') {
            *out = s;
            return TWK_OK;
        }
        args none = {.n = 0};
        return call_method(c, line, s, f, &none, out);
    }
    if (strcmp(f, "length") == 0 || strcmp(f, "count") == 0) {
        if (v.kind == JJ_STR) *out = I((int64_t)jj_utf8_len(v.u.str.s, v.u.str.n));
        else if (v.kind == JJ_LIST) *out = I((int64_t)v.u.list->n);
        else if (v.kind == JJ_DICT || v.kind == JJ_NS) *out = I((int64_t)v.u.dict->n);
        else if (v.kind == JJ_UNDEF) *out = I(0);
        else return rerr(TWK_ERR_INVALID_ARG, line, "object of type '%s' has no len()", kind_name(v));
        return TWK_OK;
    }
    if (strcmp(f, "default") == 0 || strcmp(f, "d") == 0) {
        jj_val *b = arg(&a, 1, "boolean");
        bool use = v.kind == JJ_UNDEF || (b && jj_truthy(*b) && !jj_truthy(v));
        *out = use ? (a0 ? *a0 : S(c, "")) : v;
        return TWK_OK;
    }
    if (strcmp(f, "abs") == 0 || strcmp(f, "int") == 0 || strcmp(f, "float") == 0) {
        double d = 0;
        if (v.kind == JJ_INT) d = (double)v.u.i;
        else if (v.kind == JJ_FLOAT) d = v.u.f;
        else if (v.kind == JJ_BOOL) d = v.u.b;
        else if (v.kind == JJ_STR) d = strtod(v.u.str.s, NULL);
        else if (f[0] == 'a') return rerr(TWK_ERR_INVALID_ARG, line, "bad operand type for abs(): '%s'", kind_name(v));
        if (f[0] == 'a')
            *out = v.kind == JJ_FLOAT ? (jj_val){.kind = JJ_FLOAT, .u.f = d < 0 ? -d : d}
                                      : I(d < 0 ? -(int64_t)d : (int64_t)d);
        else if (f[0] == 'i') *out = I((int64_t)d);
        else if (f[0] == 'f') *out = (jj_val){.kind = JJ_FLOAT, .u.f = d};
        else *out = v; /* not reached: 'round' is refused by the parser */
        return TWK_OK;
    }
    if (strcmp(f, "replace") == 0) {
        jj_val s;
        TRY(to_s(c, line, v, &s));
        return call_method(c, line, s, "replace", &a, out);
    }
    /* filters over sequences */
    jj_list *items;
    if (strcmp(f, "items") == 0) {
        if (v.kind == JJ_UNDEF) {
            *out = (jj_val){.kind = JJ_LIST, .u.list = jj_list_new(c->a)};
            return TWK_OK;
        }
        if (v.kind != JJ_DICT)
            return rerr(TWK_ERR_INVALID_ARG, line, "items: expected a mapping, got %s", kind_name(v));
        args none = {.n = 0};
        return call_method(c, line, v, "items", &none, out);
    }
    TRY(iter_items(c, line, v, &items));
    if (strcmp(f, "first") == 0 || strcmp(f, "last") == 0) {
        *out = items->n ? items->v[f[0] == 'f' ? 0 : items->n - 1] : UNDEF;
        return TWK_OK;
    }
    if (strcmp(f, "list") == 0) {
        *out = (jj_val){.kind = JJ_LIST, .u.list = items};
        return TWK_OK;
    }
    if (strcmp(f, "join") == 0) {
        jj_buf b = {0};
        jj_val *attr = arg(&a, 1, "attribute");
        for (size_t i = 0; i < items->n; i++) {
            if (i && a0) jj_to_str(&b, *a0, 0);
            jj_val it = items->v[i];
            if (attr) {
                twk_status st = attr->kind == JJ_STR ? getattr_(c, line, it, attr->u.str.s, &it) : TWK_OK;
                if (st) {
                    twk_host_free(b.p);
                    return st;
                }
            }
            jj_to_str(&b, it, 0);
        }
        if (b.oom) {
            twk_host_free(b.p);
            return OOM(line);
        }
        *out = buf_val(c, &b);
        return TWK_OK;
    }
    bool sel = strcmp(f, "select") == 0 || strcmp(f, "selectattr") == 0;
    bool rej = strcmp(f, "reject") == 0 || strcmp(f, "rejectattr") == 0;
    if (sel || rej || strcmp(f, "map") == 0 || strcmp(f, "unique") == 0) {
        bool byattr = strchr(f, 'a') && strcmp(f, "map") != 0 && f[strlen(f) - 1] == 'r';
        jj_list *l = jj_list_new(c->a);
        if (!l) return OOM(line);
        int t0 = byattr ? 1 : 0;
        for (size_t i = 0; i < items->n; i++) {
            jj_val it = items->v[i], probe = it;
            if (strcmp(f, "map") == 0) {
                jj_val *attr = arg(&a, 99, "attribute");
                if (!attr || attr->kind != JJ_STR)
                    return rerr(TWK_ERR_UNSUPPORTED, line, "unsupported construct: map without attribute=");
                TRY(getattr_(c, line, it, attr->u.str.s, &probe));
                if (!jj_list_push(c->a, l, probe)) return OOM(line);
                continue;
            }
            if (strcmp(f, "unique") == 0) {
                if (!contains((jj_val){.kind = JJ_LIST, .u.list = l}, it) && !jj_list_push(c->a, l, it))
                    return OOM(line);
                continue;
            }
            if (byattr) {
                if (!a0 || a0->kind != JJ_STR) return rerr(TWK_ERR_INVALID_ARG, line, "%s needs an attribute name", f);
                TRY(getattr_(c, line, it, a0->u.str.s, &probe));
            }
            bool r;
            jj_val *tn = arg(&a, t0, NULL);
            if (!tn) r = jj_truthy(probe);
            else {
                if (tn->kind != JJ_STR) return rerr(TWK_ERR_INVALID_ARG, line, "%s: test name must be a string", f);
                args ta = {.n = 0};
                for (int k = t0 + 1; k < a.n; k++) {
                    jj_val *x = arg(&a, k, NULL);
                    if (x) {
                        ta.v[ta.n] = *x;
                        ta.kw[ta.n++] = NULL;
                    }
                }
                TRY(test(c, line, tn->u.str.s, probe, &ta, &r));
            }
            if (r == sel && !jj_list_push(c->a, l, it)) return OOM(line);
        }
        *out = (jj_val){.kind = JJ_LIST, .u.list = l};
        return TWK_OK;
    }
    return rerr(TWK_ERR_UNSUPPORTED, line, "unsupported construct: filter '%s'", f);
}

static twk_status test(cx *c, int line, const char *t, jj_val v, args *a, bool *r) {
    (void)c;
    jj_val *a0 = arg(a, 0, NULL);
    jj_kind k = v.kind;
    if (strcmp(t, "defined") == 0) *r = k != JJ_UNDEF;
    else if (strcmp(t, "undefined") == 0) *r = k == JJ_UNDEF;
    else if (strcmp(t, "none") == 0) *r = k == JJ_NONE;
    else if (strcmp(t, "string") == 0) *r = k == JJ_STR;
    else if (strcmp(t, "mapping") == 0) *r = k == JJ_DICT;
    else if (strcmp(t, "iterable") == 0) *r = k == JJ_STR || k == JJ_LIST || k == JJ_DICT || k == JJ_UNDEF;
    else if (strcmp(t, "sequence") == 0) *r = k == JJ_STR || k == JJ_LIST || k == JJ_DICT;
    else if (strcmp(t, "number") == 0) *r = k == JJ_INT || k == JJ_FLOAT || k == JJ_BOOL;
    else if (strcmp(t, "integer") == 0) *r = k == JJ_INT;
    else if (strcmp(t, "float") == 0) *r = k == JJ_FLOAT;
    else if (strcmp(t, "boolean") == 0) *r = k == JJ_BOOL;
    else if (strcmp(t, "true") == 0) *r = k == JJ_BOOL && v.u.b;
    else if (strcmp(t, "false") == 0) *r = k == JJ_BOOL && !v.u.b;
    else if (strcmp(t, "callable") == 0) *r = k == JJ_FUNC || k == JJ_METHOD;
    else if (strcmp(t, "lower") == 0 || strcmp(t, "upper") == 0) {
        *r = k == JJ_STR;
        for (size_t i = 0; *r && i < v.u.str.n; i++)
            *r = t[0] == 'l' ? !(v.u.str.s[i] >= 'A' && v.u.str.s[i] <= 'Z')
                             : !(v.u.str.s[i] >= 'a' && v.u.str.s[i] <= 'z');
    } else if (strcmp(t, "odd") == 0 || strcmp(t, "even") == 0 || strcmp(t, "divisibleby") == 0) {
        if (k != JJ_INT) return rerr(TWK_ERR_INVALID_ARG, line, "test '%s' expects an integer", t);
        int64_t d = t[0] == 'd' ? (a0 && a0->kind == JJ_INT ? a0->u.i : 0) : 2;
        if (d == 0) return rerr(TWK_ERR_INVALID_ARG, line, "divisibleby needs a non-zero integer");
        *r = t[0] == 'o' ? v.u.i % 2 != 0 : v.u.i % d == 0;
    } else {
        if (!a0) return rerr(TWK_ERR_INVALID_ARG, line, "test '%s' needs an argument", t);
        if (strcmp(t, "in") == 0) *r = contains(*a0, v);
        else if (strcmp(t, "sameas") == 0)
            *r = v.kind == a0->kind && (k == JJ_NONE || (k == JJ_BOOL && v.u.b == a0->u.b));
        else if (strcmp(t, "ne") == 0 || strcmp(t, "!=") == 0) *r = !jj_equal(v, *a0);
        else *r = jj_equal(v, *a0);
    }
    return TWK_OK;
}

static bool num(jj_val v, double *d, bool *isint, int64_t *i) {
    if (v.kind == JJ_INT || v.kind == JJ_BOOL) {
        *i = v.kind == JJ_BOOL ? v.u.b : v.u.i;
        *d = (double)*i;
        *isint = true;
        return true;
    }
    if (v.kind == JJ_FLOAT) {
        *d = v.u.f;
        *isint = false;
        return true;
    }
    return false;
}

static twk_status binop(cx *c, int line, const char *op, jj_val l, jj_val r, jj_val *out) {
    if (strcmp(op, "==") == 0) {
        *out = B(jj_equal(l, r));
        return TWK_OK;
    }
    if (strcmp(op, "!=") == 0) {
        *out = B(!jj_equal(l, r));
        return TWK_OK;
    }
    if (strcmp(op, "in") == 0) {
        *out = B(contains(r, l));
        return TWK_OK;
    }
    if (strcmp(op, "not in") == 0) {
        *out = B(!contains(r, l));
        return TWK_OK;
    }
    if (strcmp(op, "~") == 0) {
        jj_buf b = {0};
        jj_to_str(&b, l, 0);
        jj_to_str(&b, r, 0);
        if (b.oom) {
            twk_host_free(b.p);
            return OOM(line);
        }
        *out = buf_val(c, &b);
        return TWK_OK;
    }
    if (l.kind == JJ_UNDEF || r.kind == JJ_UNDEF) {
        jj_val u = l.kind == JJ_UNDEF ? l : r;
        return rerr(TWK_ERR_INVALID_ARG, line, "%s (operand of '%s')", undef_text(u), op);
    }
    double x = 0, y = 0;
    bool xi = false, yi = false;
    int64_t p = 0, q = 0;
    bool nums = num(l, &x, &xi, &p) && num(r, &y, &yi, &q);
    if (op[0] == '<' || op[0] == '>') {
        int cmp;
        if (nums) cmp = x < y ? -1 : x > y;
        else if (l.kind == JJ_STR && r.kind == JJ_STR) {
            size_t m = l.u.str.n < r.u.str.n ? l.u.str.n : r.u.str.n;
            cmp = memcmp(l.u.str.s, r.u.str.s, m);
            if (cmp == 0) cmp = l.u.str.n < r.u.str.n ? -1 : l.u.str.n > r.u.str.n;
        } else
            return rerr(TWK_ERR_INVALID_ARG, line, "'%s' not supported between '%s' and '%s'", op, kind_name(l),
                        kind_name(r));
        *out = B(op[1] ? (op[0] == '<' ? cmp <= 0 : cmp >= 0) : (op[0] == '<' ? cmp < 0 : cmp > 0));
        return TWK_OK;
    }
    if (op[0] == '+' && l.kind == JJ_STR && r.kind == JJ_STR) {
        char *s = jj_alloc(c->a, l.u.str.n + r.u.str.n + 1);
        if (!s) return OOM(line);
        memcpy(s, l.u.str.s, l.u.str.n);
        memcpy(s + l.u.str.n, r.u.str.s, r.u.str.n);
        *out = (jj_val){.kind = JJ_STR, .u.str = {s, l.u.str.n + r.u.str.n}};
        return TWK_OK;
    }
    if (op[0] == '+' && l.kind == JJ_LIST && r.kind == JJ_LIST) {
        jj_list *n = jj_list_new(c->a);
        if (!n) return OOM(line);
        for (size_t i = 0; i < l.u.list->n; i++)
            if (!jj_list_push(c->a, n, l.u.list->v[i])) return OOM(line);
        for (size_t i = 0; i < r.u.list->n; i++)
            if (!jj_list_push(c->a, n, r.u.list->v[i])) return OOM(line);
        *out = (jj_val){.kind = JJ_LIST, .u.list = n};
        return TWK_OK;
    }
    if (op[0] == '*' && !op[1] && ((l.kind == JJ_STR && r.kind == JJ_INT) || (l.kind == JJ_INT && r.kind == JJ_STR))) {
        jj_val s = l.kind == JJ_STR ? l : r;
        int64_t k = l.kind == JJ_INT ? l.u.i : r.u.i;
        jj_buf b = {0};
        for (int64_t i = 0; i < k && i < 1000000; i++) jj_buf_put(&b, s.u.str.s, s.u.str.n);
        if (b.oom) {
            twk_host_free(b.p);
            return OOM(line);
        }
        *out = buf_val(c, &b);
        return TWK_OK;
    }
    if (op[0] == '%' && l.kind == JJ_STR)
        return rerr(TWK_ERR_UNSUPPORTED, line, "unsupported construct: string formatting with '%%'");
    if (!nums)
        return rerr(TWK_ERR_INVALID_ARG, line, "unsupported operand types for %s: '%s' and '%s'", op, kind_name(l),
                    kind_name(r));
    bool ints = xi && yi;
    switch (op[0]) {
    case '+': *out = ints ? I(p + q) : (jj_val){.kind = JJ_FLOAT, .u.f = x + y}; return TWK_OK;
    case '-': *out = ints ? I(p - q) : (jj_val){.kind = JJ_FLOAT, .u.f = x - y}; return TWK_OK;
    case '*':
        if (op[1]) return rerr(TWK_ERR_UNSUPPORTED, line, "unsupported construct: operator '**'");
        *out = ints ? I(p * q) : (jj_val){.kind = JJ_FLOAT, .u.f = x * y};
        return TWK_OK;
    case '/':
        if (y == 0) return rerr(TWK_ERR_INVALID_ARG, line, "division by zero");
        if (op[1]) {
            if (!ints) return rerr(TWK_ERR_UNSUPPORTED, line, "unsupported construct: '//' on floats");
            int64_t d = p / q;
            if ((p % q != 0) && ((p < 0) != (q < 0))) d--;
            *out = I(d);
        } else *out = (jj_val){.kind = JJ_FLOAT, .u.f = x / y};
        return TWK_OK;
    case '%':
        if (!ints) return rerr(TWK_ERR_UNSUPPORTED, line, "unsupported construct: '%%' on floats");
        if (q == 0) return rerr(TWK_ERR_INVALID_ARG, line, "modulo by zero");
        *out = I(((p % q) + q) % q);
        return TWK_OK;
    }
    return rerr(TWK_ERR_UNSUPPORTED, line, "unsupported construct: operator '%s'", op);
}

static twk_status slice(cx *c, const jj_expr *e, jj_val v, jj_val *out) {
    int line = e->line;
    int64_t idx[3] = {0, 0, 1};
    bool has[3] = {false, false, false};
    const jj_expr *parts[3] = {e->b, e->c, e->d};
    for (int i = 0; i < 3; i++)
        if (parts[i]) {
            jj_val x;
            TRY(eval(c, parts[i], &x));
            if (x.kind == JJ_NONE) continue;
            if (x.kind != JJ_INT) return rerr(TWK_ERR_INVALID_ARG, line, "slice indices must be integers");
            idx[i] = x.u.i;
            has[i] = true;
        }
    int64_t st = idx[2];
    if (st == 0) return rerr(TWK_ERR_INVALID_ARG, line, "slice step cannot be zero");
    size_t n, *off = NULL;
    if (v.kind == JJ_STR) {
        if (!(off = cp_offsets(c, v, &n))) return OOM(line);
    } else if (v.kind == JJ_LIST) n = v.u.list->n;
    else return rerr(TWK_ERR_INVALID_ARG, line, "'%s' object is not subscriptable with a slice", kind_name(v));
    int64_t len = (int64_t)n, lo, hi;
    /* Python slice.indices */
    for (int i = 0; i < 2; i++) {
        int64_t *dst = i == 0 ? &lo : &hi;
        if (!has[i]) *dst = i == 0 ? (st > 0 ? 0 : len - 1) : (st > 0 ? len : -1);
        else {
            int64_t x = idx[i];
            if (x < 0) x += len;
            if (x < 0) x = st > 0 ? 0 : -1;
            if (x >= len) x = st > 0 ? len : len - 1;
            *dst = x;
        }
    }
    jj_list *l = v.kind == JJ_LIST ? jj_list_new(c->a) : NULL;
    jj_buf b = {0};
    if (v.kind == JJ_LIST && !l) return OOM(line);
    for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) {
        if (l) {
            if (!jj_list_push(c->a, l, v.u.list->v[i])) return OOM(line);
        } else jj_buf_put(&b, v.u.str.s + off[i], off[i + 1] - off[i]);
    }
    if (l) *out = (jj_val){.kind = JJ_LIST, .u.list = l};
    else {
        if (b.oom) {
            twk_host_free(b.p);
            return OOM(line);
        }
        *out = buf_val(c, &b);
    }
    return TWK_OK;
}

static twk_status eval(cx *c, const jj_expr *e, jj_val *out) {
    jj_val a, b;
    switch (e->k) {
    case E_LIT: *out = e->lit; return TWK_OK;
    case E_NAME: *out = lookup(c, e->name); return TWK_OK;
    case E_ATTR: TRY(eval(c, e->a, &a)); return getattr_(c, e->line, a, e->name, out);
    case E_ITEM:
        TRY(eval(c, e->a, &a));
        TRY(eval(c, e->b, &b));
        return getitem(c, e->line, a, b, out);
    case E_SLICE: TRY(eval(c, e->a, &a)); return slice(c, e, a, out);
    case E_CALL: {
        if (e->a->k == E_ATTR) {
            jj_val obj;
            TRY(eval(c, e->a->a, &obj));
            TRY(getattr_(c, e->line, obj, e->a->name, &a));
            if (a.kind == JJ_UNDEF && (obj.kind == JJ_STR || obj.kind == JJ_LIST || obj.kind == JJ_DICT))
                return rerr(TWK_ERR_UNSUPPORTED, e->line, "unsupported construct: method '%s' of %s", e->a->name,
                            kind_name(obj));
        } else TRY(eval(c, e->a, &a));
        args ar;
        TRY(eval_args(c, e, &ar));
        if (a.kind == JJ_METHOD) return call_method(c, e->line, *a.u.m.self, a.u.m.name, &ar, out);
        if (a.kind == JJ_FUNC) return call_func(c, e->line, a.u.str.s, &ar, out);
        if (a.kind == JJ_UNDEF) return rerr(TWK_ERR_INVALID_ARG, e->line, "%s (called)", undef_text(a));
        return rerr(TWK_ERR_INVALID_ARG, e->line, "'%s' object is not callable", kind_name(a));
    }
    case E_FILTER: TRY(eval(c, e->a, &a)); return filter(c, e, a, out);
    case E_TEST: {
        TRY(eval(c, e->a, &a));
        args ar;
        TRY(eval_args(c, e, &ar));
        bool r;
        TRY(test(c, e->line, e->name, a, &ar, &r));
        *out = B(r != e->negate);
        return TWK_OK;
    }
    case E_NOT:
        TRY(eval(c, e->a, &a));
        *out = B(!jj_truthy(a));
        return TWK_OK;
    case E_NEG:
        TRY(eval(c, e->a, &a));
        if (a.kind == JJ_INT) *out = I(-a.u.i);
        else if (a.kind == JJ_FLOAT) *out = (jj_val){.kind = JJ_FLOAT, .u.f = -a.u.f};
        else return rerr(TWK_ERR_INVALID_ARG, e->line, "bad operand type for unary -: '%s'", kind_name(a));
        return TWK_OK;
    case E_BIN:
        TRY(eval(c, e->a, &a));
        TRY(eval(c, e->b, &b));
        return binop(c, e->line, e->name, a, b, out);
    case E_AND:
    case E_OR:
        TRY(eval(c, e->a, &a));
        if (jj_truthy(a) == (e->k == E_OR)) {
            *out = a;
            return TWK_OK;
        }
        return eval(c, e->b, out);
    case E_COND:
        TRY(eval(c, e->a, &a));
        if (jj_truthy(a)) return eval(c, e->b, out);
        if (e->c) return eval(c, e->c, out);
        *out = UNDEF;
        return TWK_OK;
    case E_LIST:
    case E_DICT: {
        jj_list *l = e->k == E_LIST ? jj_list_new(c->a) : NULL;
        jj_dict *d = e->k == E_DICT ? jj_dict_new(c->a) : NULL;
        if (!l && !d) return OOM(e->line);
        for (int i = 0; i < e->nargs; i += l ? 1 : 2) {
            TRY(eval(c, e->args[i], &a));
            if (l) {
                if (!jj_list_push(c->a, l, a)) return OOM(e->line);
                continue;
            }
            TRY(eval(c, e->args[i + 1], &b));
            if (!jj_dict_set(c->a, d, a, b)) return OOM(e->line);
        }
        *out = l ? (jj_val){.kind = JJ_LIST, .u.list = l} : (jj_val){.kind = JJ_DICT, .u.dict = d};
        return TWK_OK;
    }
    }
    return rerr(TWK_ERR_INVALID_ARG, e->line, "bad expression");
}

/* ---- statements ---- */
static twk_status run(cx *c, const jj_body *b);

static twk_status push_frame(cx *c, int line) {
    if (c->nf == 256) return rerr(TWK_ERR_INVALID_ARG, line, "loops nested too deeply");
    if (!(c->frames[c->nf] = jj_dict_new(c->a))) return OOM(line);
    c->nf++;
    return TWK_OK;
}

static twk_status bind(cx *c, const jj_stmt *s, jj_val item) {
    jj_dict *f = c->frames[c->nf - 1];
    if (s->ntargets == 1) return jj_dict_set(c->a, f, S(c, s->targets[0]), item) ? TWK_OK : OOM(s->line);
    if (item.kind != JJ_LIST || item.u.list->n != (size_t)s->ntargets)
        return rerr(TWK_ERR_INVALID_ARG, s->line, "cannot unpack %s into %d loop variables", kind_name(item),
                    s->ntargets);
    for (int i = 0; i < s->ntargets; i++)
        if (!jj_dict_set(c->a, f, S(c, s->targets[i]), item.u.list->v[i])) return OOM(s->line);
    return TWK_OK;
}

static twk_status run_for(cx *c, const jj_stmt *s) {
    jj_val it;
    TRY(eval(c, s->e, &it));
    jj_list *all, *items;
    TRY(iter_items(c, s->line, it, &all));
    items = all;
    if (s->filter) {
        if (!(items = jj_list_new(c->a))) return OOM(s->line);
        for (size_t i = 0; i < all->n; i++) {
            TRY(push_frame(c, s->line));
            twk_status st = bind(c, s, all->v[i]);
            jj_val keep = {0};
            if (!st) st = eval(c, s->filter, &keep);
            c->nf--;
            if (st) return st;
            if (jj_truthy(keep) && !jj_list_push(c->a, items, all->v[i])) return OOM(s->line);
        }
    }
    if (items->n == 0) return run(c, &s->orelse);
    int32_t saved = c->owner;
    size_t n = items->n;
    for (size_t i = 0; i < n; i++) {
        TRY(push_frame(c, s->line));
        TRY(bind(c, s, items->v[i]));
        jj_dict *loop = jj_dict_new(c->a);
        if (!loop) return OOM(s->line);
        struct {
            const char *k;
            jj_val v;
        } lv[] = {{"index", I((int64_t)i + 1)},
                  {"index0", I((int64_t)i)},
                  {"revindex", I((int64_t)(n - i))},
                  {"revindex0", I((int64_t)(n - i - 1))},
                  {"first", B(i == 0)},
                  {"last", B(i + 1 == n)},
                  {"length", I((int64_t)n)},
                  {"previtem", i ? items->v[i - 1] : UNDEF},
                  {"nextitem", i + 1 < n ? items->v[i + 1] : UNDEF}};
        for (size_t k = 0; k < sizeof lv / sizeof lv[0]; k++)
            if (!jj_dict_set(c->a, loop, S(c, lv[k].k), lv[k].v)) return OOM(s->line);
        if (!jj_dict_set(c->a, c->frames[c->nf - 1], S(c, "loop"), (jj_val){.kind = JJ_DICT, .u.dict = loop}))
            return OOM(s->line);
        if (c->tracked && items->v[i].kind == JJ_DICT)
            for (size_t k = 0; k < c->tracked->n; k++)
                if (c->tracked->v[k].kind == JJ_DICT && c->tracked->v[k].u.dict == items->v[i].u.dict)
                    c->owner = (int32_t)k;
        twk_status st = run(c, &s->body);
        c->owner = saved;
        c->nf--;
        if (st) return st;
        if (c->ctl == 1) {
            c->ctl = 0;
            break;
        }
        c->ctl = 0;
    }
    return TWK_OK;
}

static twk_status run(cx *c, const jj_body *b) {
    for (int i = 0; i < b->n && !c->ctl; i++) {
        const jj_stmt *s = b->s[i];
        jj_val v;
        switch (s->k) {
        case S_TEXT: emit(c, s->text, s->len); break;
        case S_OUT:
            TRY(eval(c, s->e, &v));
            if (v.kind == JJ_STR) emit(c, v.u.str.s, v.u.str.n);
            else {
                jj_buf t = {0};
                jj_to_str(&t, v, 0);
                if (t.oom) {
                    twk_host_free(t.p);
                    return OOM(s->line);
                }
                emit(c, t.p ? t.p : "", t.n);
                twk_host_free(t.p);
            }
            break;
        case S_IF:
            for (int k = 0; k < s->nbranch; k++) {
                if (s->conds[k]) {
                    TRY(eval(c, s->conds[k], &v));
                    if (!jj_truthy(v)) continue;
                }
                TRY(run(c, &s->bodies[k]));
                break;
            }
            break;
        case S_FOR: TRY(run_for(c, s)); break;
        case S_SET:
            TRY(eval(c, s->e, &v));
            if (s->targets[1]) {
                jj_val ns = lookup(c, s->targets[0]);
                if (ns.kind != JJ_NS)
                    return rerr(TWK_ERR_INVALID_ARG, s->line, "cannot assign attribute on non-namespace object '%s'",
                                s->targets[0]);
                if (s->targets[1][0] == '_')
                    return rerr(TWK_ERR_INVALID_ARG, s->line, "namespace attribute '%s' starts with '_'",
                                s->targets[1]);
                if (!jj_dict_set(c->a, ns.u.dict, S(c, s->targets[1]), v)) return OOM(s->line);
            } else if (!jj_dict_set(c->a, c->frames[c->nf - 1], S(c, s->targets[0]), v)) return OOM(s->line);
            break;
        case S_BREAK:
        case S_CONTINUE: {
            c->ctl = s->k == S_BREAK ? 1 : 2;
            break;
        }
        case S_GEN: {
            int64_t start = (int64_t)c->o->text.n;
            TRY(run(c, &s->body));
            jj_output *o = c->o;
            if (o->nspans == o->spans_cap) {
                size_t nc = o->spans_cap ? o->spans_cap * 2 : 16;
                int64_t(*q)[2] =
                    twk_host_realloc(o->spans, o->spans_cap * sizeof *q, nc * sizeof *q, "chat template output");
                if (!q) return OOM(s->line);
                o->spans = q;
                o->spans_cap = nc;
            }
            o->spans[o->nspans][0] = start;
            o->spans[o->nspans][1] = (int64_t)o->text.n;
            o->nspans++;
            break;
        }
        }
        if (c->o->text.oom) return OOM(s->line);
    }
    return TWK_OK;
}

twk_status jj_render(const jj_template *t, jj_arena *a, jj_dict *vars, const jj_list *tracked, jj_output *out) {
    memset(out, 0, sizeof *out);
    cx c = {.a = a, .o = out, .tracked = tracked, .owner = -1, .nf = 1};
    c.frames[0] = vars;
    twk_status st = run(&c, &t->body);
    if (!st && c.ctl) st = twk_error(TWK_ERR_INVALID_ARG, "chat template: break or continue outside a loop");
    if (!st) emit(&c, "", 0);
    if (!st && out->text.oom) st = twk_error(TWK_ERR_OOM, "chat template: out of memory");
    if (st) jj_output_free(out);
    return st;
}
