/* Values of the chat-template Jinja subset: arena, Python str/repr, json.dumps / json.loads; the
 * error helper of the parser and the evaluator. */
#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja.h"
#include "twinkle/hal.h"

typedef struct jj_block {
    struct jj_block *next;
    size_t used, cap;
    max_align_t data[];
} jj_block;
struct jj_arena {
    jj_block *head;
};

jj_arena *jj_arena_new(void) { return twk_host_calloc(sizeof(jj_arena), "chat template arena"); }

void jj_arena_free(jj_arena *a) {
    if (!a) return;
    for (jj_block *b = a->head, *nx; b; b = nx) {
        nx = b->next;
        twk_host_free(b);
    }
    twk_host_free(a);
}

void *jj_alloc(jj_arena *a, size_t n) {
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (n == 0) n = sizeof(max_align_t);
    jj_block *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        b = twk_host_alloc(sizeof(jj_block) + cap, "chat template arena");
        if (!b) return NULL;
        b->used = 0;
        b->cap = cap;
        b->next = a->head;
        a->head = b;
    }
    void *p = (char *)b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

jj_val jj_str(jj_arena *a, const char *s, size_t n) {
    jj_val v = {.kind = JJ_STR};
    char *p = jj_alloc(a, n + 1);
    if (!p) return (jj_val){.kind = JJ_NONE};
    if (n) memcpy(p, s, n);
    v.u.str.s = p;
    v.u.str.n = n;
    return v;
}

jj_list *jj_list_new(jj_arena *a) { return jj_alloc(a, sizeof(jj_list)); }
jj_dict *jj_dict_new(jj_arena *a) { return jj_alloc(a, sizeof(jj_dict)); }

static bool grow(jj_arena *a, jj_val **arr, size_t n, size_t *cap) {
    if (n < *cap) return true;
    size_t nc = *cap ? *cap * 2 : 8;
    jj_val *p = jj_alloc(a, nc * sizeof(jj_val));
    if (!p) return false;
    if (n) memcpy(p, *arr, n * sizeof(jj_val));
    *arr = p;
    *cap = nc;
    return true;
}

bool jj_list_push(jj_arena *a, jj_list *l, jj_val v) {
    if (!grow(a, &l->v, l->n, &l->cap)) return false;
    l->v[l->n++] = v;
    return true;
}

bool jj_dict_set(jj_arena *a, jj_dict *d, jj_val k, jj_val v) {
    for (size_t i = 0; i < d->n; i++)
        if (jj_equal(d->k[i], k)) {
            d->v[i] = v;
            return true;
        }
    size_t kc = d->cap;
    if (!grow(a, &d->k, d->n, &kc)) return false;
    if (!grow(a, &d->v, d->n, &d->cap)) return false;
    d->k[d->n] = k;
    d->v[d->n++] = v;
    return true;
}

jj_val *jj_dict_get(const jj_dict *d, const char *key, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].kind == JJ_STR && d->k[i].u.str.n == n && memcmp(d->k[i].u.str.s, key, n) == 0) return &d->v[i];
    return NULL;
}

bool jj_truthy(jj_val v) {
    switch (v.kind) {
    case JJ_UNDEF:
    case JJ_NONE: return false;
    case JJ_BOOL: return v.u.b;
    case JJ_INT: return v.u.i != 0;
    case JJ_FLOAT: return v.u.f != 0.0;
    case JJ_STR: return v.u.str.n != 0;
    case JJ_LIST: return v.u.list->n != 0;
    case JJ_DICT: return v.u.dict->n != 0;
    default: return true;
    }
}

static bool numeric(jj_val v, double *d) {
    if (v.kind == JJ_INT) *d = (double)v.u.i;
    else if (v.kind == JJ_FLOAT) *d = v.u.f;
    else if (v.kind == JJ_BOOL) *d = v.u.b;
    else return false;
    return true;
}

bool jj_equal(jj_val a, jj_val b) {
    double x, y;
    if (numeric(a, &x) && numeric(b, &y)) {
        if (a.kind != JJ_FLOAT && b.kind != JJ_FLOAT) {
            int64_t p = a.kind == JJ_BOOL ? a.u.b : a.u.i, q = b.kind == JJ_BOOL ? b.u.b : b.u.i;
            return p == q;
        }
        return x == y;
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case JJ_UNDEF:
    case JJ_NONE: return true;
    case JJ_STR: return a.u.str.n == b.u.str.n && memcmp(a.u.str.s, b.u.str.s, a.u.str.n) == 0;
    case JJ_LIST:
        if (a.u.list->n != b.u.list->n) return false;
        for (size_t i = 0; i < a.u.list->n; i++)
            if (!jj_equal(a.u.list->v[i], b.u.list->v[i])) return false;
        return true;
    case JJ_DICT:
        if (a.u.dict->n != b.u.dict->n) return false;
        for (size_t i = 0; i < a.u.dict->n; i++) {
            size_t j = 0;
            while (j < b.u.dict->n && !jj_equal(a.u.dict->k[i], b.u.dict->k[j])) j++;
            if (j == b.u.dict->n || !jj_equal(a.u.dict->v[i], b.u.dict->v[j])) return false;
        }
        return true;
    case JJ_NS: return a.u.dict == b.u.dict;
    case JJ_FUNC: return a.u.str.s == b.u.str.s;
    default: return false;
    }
}

void jj_buf_put(jj_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *p = twk_host_realloc(b->p, b->cap, nc, "chat template text");
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void jj_buf_puts(jj_buf *b, const char *s) { jj_buf_put(b, s, strlen(s)); }

/* Python's float repr: the shortest digits that round-trip, fixed notation for 1e-4 <= |x| < 1e16. */
static void put_float(jj_buf *b, double f, bool json) {
    char t[64];
    if (isnan(f)) {
        jj_buf_puts(b, json ? "NaN" : "nan");
        return;
    }
    if (isinf(f)) {
        jj_buf_puts(b, f < 0 ? (json ? "-Infinity" : "-inf") : (json ? "Infinity" : "inf"));
        return;
    }
    int p = 1;
    for (; p < 17; p++) {
        snprintf(t, sizeof t, "%.*e", p - 1, f);
        if (strtod(t, NULL) == f) break;
    }
    snprintf(t, sizeof t, "%.*e", p - 1, f);
    char *e = strchr(t, 'e');
    int exp = atoi(e + 1);
    char digits[32];
    size_t nd = 0;
    bool neg = t[0] == '-';
    for (char *c = t + neg; c < e; c++)
        if (*c != '.') digits[nd++] = *c;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char out[96];
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = -1; i > exp; i--) out[o++] = '0';
            for (size_t i = 0; i < nd; i++) out[o++] = digits[i];
        } else {
            for (int i = 0; i <= exp; i++) out[o++] = (size_t)i < nd ? digits[i] : '0';
            out[o++] = '.';
            if ((size_t)exp + 1 < nd)
                for (size_t i = (size_t)exp + 1; i < nd; i++) out[o++] = digits[i];
            else out[o++] = '0';
        }
        out[o] = 0;
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (size_t i = 1; i < nd; i++) out[o++] = digits[i];
        }
        snprintf(out + o, sizeof out - o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    jj_buf_puts(b, out);
}

static uint32_t dec(const char *s, size_t n, size_t *len);

/* Code points Python's str.isprintable() rejects, beyond ASCII: C1 controls, the Zs / Zl / Zp
 * separators other than the space, common format characters (Cf) and private use (Co). */
static bool unprintable(uint32_t c) {
    return (c >= 0x80 && c <= 0xA0) || c == 0xAD || c == 0x1680 || (c >= 0x2000 && c <= 0x200F) ||
           (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x2064) || (c >= 0x2066 && c <= 0x206F) ||
           c == 0x3000 || c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFB) || (c >= 0xE000 && c <= 0xF8FF) || c >= 0xF0000 ||
           c == 0x061C || c == 0x180E;
}

static void put_repr_str(jj_buf *b, const char *s, size_t n) {
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    jj_buf_put(b, &q, 1);
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        char t[16];
        size_t l = 1;
        if (c == '\\' || c == (unsigned char)q) {
            t[0] = '\\';
            t[1] = (char)c;
            jj_buf_put(b, t, 2);
        } else if (c == '\n') jj_buf_puts(b, "\\n");
        else if (c == '\r') jj_buf_puts(b, "\\r");
        else if (c == '\t') jj_buf_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7f) {
            snprintf(t, sizeof t, "\\x%02x", c);
            jj_buf_puts(b, t);
        } else if (c < 0x80) jj_buf_put(b, (const char *)&c, 1);
        else {
            uint32_t cp = dec(s + i, n - i, &l);
            if (!unprintable(cp)) jj_buf_put(b, s + i, l);
            else {
                if (cp <= 0xFF) snprintf(t, sizeof t, "\\x%02x", cp);
                else if (cp <= 0xFFFF) snprintf(t, sizeof t, "\\u%04x", cp);
                else snprintf(t, sizeof t, "\\U%08x", cp);
                jj_buf_puts(b, t);
            }
        }
        i += l;
    }
    jj_buf_put(b, &q, 1);
}

void jj_to_str(jj_buf *b, jj_val v, int mode) {
    char t[32];
    switch (v.kind) {
    case JJ_UNDEF: break;
    case JJ_NONE: jj_buf_puts(b, "None"); break;
    case JJ_BOOL: jj_buf_puts(b, v.u.b ? "True" : "False"); break;
    case JJ_INT:
        snprintf(t, sizeof t, "%lld", (long long)v.u.i);
        jj_buf_puts(b, t);
        break;
    case JJ_FLOAT: put_float(b, v.u.f, false); break;
    case JJ_STR:
        if (mode) put_repr_str(b, v.u.str.s, v.u.str.n);
        else jj_buf_put(b, v.u.str.s, v.u.str.n);
        break;
    case JJ_LIST:
        jj_buf_puts(b, "[");
        for (size_t i = 0; i < v.u.list->n; i++) {
            if (i) jj_buf_puts(b, ", ");
            jj_to_str(b, v.u.list->v[i], 1);
        }
        jj_buf_puts(b, "]");
        break;
    case JJ_DICT:
    case JJ_NS:
        jj_buf_puts(b, v.kind == JJ_NS ? "<Namespace {" : "{");
        for (size_t i = 0; i < v.u.dict->n; i++) {
            if (i) jj_buf_puts(b, ", ");
            jj_to_str(b, v.u.dict->k[i], 1);
            jj_buf_puts(b, ": ");
            jj_to_str(b, v.u.dict->v[i], 1);
        }
        jj_buf_puts(b, v.kind == JJ_NS ? "}>" : "}");
        break;
    case JJ_METHOD:
        jj_buf_puts(b, "<built-in method ");
        jj_buf_puts(b, v.u.m.name);
        jj_buf_puts(b, ">");
        break;
    case JJ_FUNC:
        jj_buf_puts(b, "<function ");
        jj_buf_put(b, v.u.str.s, v.u.str.n);
        jj_buf_puts(b, ">");
        break;
    }
}

static void put_json_str(jj_buf *b, const char *s, size_t n) {
    jj_buf_put(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char t[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(t, sizeof t, "\\u%04x", c);
                esc = t;
            }
        }
        if (esc) {
            jj_buf_put(b, s + run, i - run);
            jj_buf_puts(b, esc);
            run = i + 1;
        }
    }
    jj_buf_put(b, s + run, n - run);
    jj_buf_put(b, "\"", 1);
}

static void newline_indent(jj_buf *b, int indent, int depth) {
    jj_buf_put(b, "\n", 1);
    for (int i = 0; i < indent * depth; i++) jj_buf_put(b, " ", 1);
}

twk_status jj_to_json(jj_buf *b, jj_val v, int indent, int depth) {
    char t[32];
    switch (v.kind) {
    case JJ_NONE: jj_buf_puts(b, "null"); return TWK_OK;
    case JJ_BOOL: jj_buf_puts(b, v.u.b ? "true" : "false"); return TWK_OK;
    case JJ_INT:
        snprintf(t, sizeof t, "%lld", (long long)v.u.i);
        jj_buf_puts(b, t);
        return TWK_OK;
    case JJ_FLOAT: put_float(b, v.u.f, true); return TWK_OK;
    case JJ_STR: put_json_str(b, v.u.str.s, v.u.str.n); return TWK_OK;
    case JJ_LIST:
    case JJ_DICT: {
        bool list = v.kind == JJ_LIST;
        size_t n = list ? v.u.list->n : v.u.dict->n;
        jj_buf_puts(b, list ? "[" : "{");
        if (n == 0) {
            jj_buf_puts(b, list ? "]" : "}");
            return TWK_OK;
        }
        for (size_t i = 0; i < n; i++) {
            if (i) jj_buf_puts(b, indent >= 0 ? "," : ", ");
            if (indent >= 0) newline_indent(b, indent, depth + 1);
            if (!list) {
                jj_val k = v.u.dict->k[i];
                if (k.kind == JJ_STR) put_json_str(b, k.u.str.s, k.u.str.n);
                else {
                    jj_buf tmp = {0};
                    twk_status st = jj_to_json(&tmp, k, -1, 0);
                    if (st) {
                        twk_host_free(tmp.p);
                        return st;
                    }
                    put_json_str(b, tmp.p, tmp.n);
                    twk_host_free(tmp.p);
                }
                jj_buf_puts(b, ": ");
            }
            twk_status st = jj_to_json(b, list ? v.u.list->v[i] : v.u.dict->v[i], indent, depth + 1);
            if (st) return st;
        }
        if (indent >= 0) newline_indent(b, indent, depth);
        jj_buf_puts(b, list ? "]" : "}");
        return TWK_OK;
    }
    case JJ_UNDEF: return twk_error(TWK_ERR_INVALID_ARG, "tojson: Object of type Undefined is not JSON serializable");
    case JJ_NS: return twk_error(TWK_ERR_INVALID_ARG, "tojson: Object of type Namespace is not JSON serializable");
    default: return twk_error(TWK_ERR_INVALID_ARG, "tojson: a function is not JSON serializable");
    }
}

/* ---- json.loads ---- */
typedef struct jp {
    jj_arena *a;
    const char *s;
    size_t n, i;
} jp;

static void jp_ws(jp *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) p->i++;
}

static twk_status jp_err(jp *p, const char *what) {
    return twk_error(TWK_ERR_INVALID_ARG, "JSON: %s at offset %zu", what, p->i);
}

static int hex4(const char *s) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return -1;
    }
    return v;
}

static void put_utf8(jj_buf *b, uint32_t c) {
    char t[4];
    size_t n;
    if (c < 0x80) {
        t[0] = (char)c;
        n = 1;
    } else if (c < 0x800) {
        t[0] = (char)(0xC0 | c >> 6);
        t[1] = (char)(0x80 | (c & 63));
        n = 2;
    } else if (c < 0x10000) {
        t[0] = (char)(0xE0 | c >> 12);
        t[1] = (char)(0x80 | (c >> 6 & 63));
        t[2] = (char)(0x80 | (c & 63));
        n = 3;
    } else {
        t[0] = (char)(0xF0 | c >> 18);
        t[1] = (char)(0x80 | (c >> 12 & 63));
        t[2] = (char)(0x80 | (c >> 6 & 63));
        t[3] = (char)(0x80 | (c & 63));
        n = 4;
    }
    jj_buf_put(b, t, n);
}

static twk_status jp_string(jp *p, jj_val *out) {
    jj_buf b = {0};
    p->i++;
    for (;;) {
        if (p->i >= p->n) {
            twk_host_free(b.p);
            return jp_err(p, "unterminated string");
        }
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') break;
        if (c < 0x20) {
            twk_host_free(b.p);
            return jp_err(p, "control character in string");
        }
        if (c != '\\') {
            size_t j = p->i;
            while (j < p->n && p->s[j] != '"' && p->s[j] != '\\' && (unsigned char)p->s[j] >= 0x20) j++;
            jj_buf_put(&b, p->s + p->i, j - p->i);
            p->i = j;
            continue;
        }
        if (p->i + 1 >= p->n) {
            twk_host_free(b.p);
            return jp_err(p, "bad escape");
        }
        char e = p->s[p->i + 1];
        p->i += 2;
        const char *map = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
        const char *m = strchr(map, e);
        if (e && m) {
            jj_buf_put(&b, to + (m - map), 1);
            continue;
        }
        if (e != 'u' || p->i + 4 > p->n || hex4(p->s + p->i) < 0) {
            twk_host_free(b.p);
            return jp_err(p, "bad escape");
        }
        uint32_t cp = (uint32_t)hex4(p->s + p->i);
        p->i += 4;
        if (cp >= 0xD800 && cp < 0xDC00 && p->i + 6 <= p->n && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
            int lo = hex4(p->s + p->i + 2);
            if (lo >= 0xDC00 && lo < 0xE000) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
                p->i += 6;
            }
        }
        put_utf8(&b, cp);
    }
    p->i++;
    if (b.oom) {
        twk_host_free(b.p);
        return twk_error(TWK_ERR_OOM, "JSON: out of memory");
    }
    *out = jj_str(p->a, b.p ? b.p : "", b.n);
    twk_host_free(b.p);
    return TWK_OK;
}

static twk_status jp_value(jp *p, jj_val *out, int depth) {
    if (depth > 200) return jp_err(p, "nesting too deep");
    jp_ws(p);
    if (p->i >= p->n) return jp_err(p, "unexpected end");
    char c = p->s[p->i];
    twk_status st;
    if (c == '"') return jp_string(p, out);
    if (c == '{' || c == '[') {
        bool obj = c == '{';
        jj_list *l = obj ? NULL : jj_list_new(p->a);
        jj_dict *d = obj ? jj_dict_new(p->a) : NULL;
        if (!l && !d) return twk_error(TWK_ERR_OOM, "JSON: out of memory");
        p->i++;
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == (obj ? '}' : ']')) p->i++;
        else
            for (;;) {
                jj_val k = {0}, v;
                if (obj) {
                    jp_ws(p);
                    if (p->i >= p->n || p->s[p->i] != '"') return jp_err(p, "expected a key");
                    if ((st = jp_string(p, &k))) return st;
                    jp_ws(p);
                    if (p->i >= p->n || p->s[p->i] != ':') return jp_err(p, "expected ':'");
                    p->i++;
                }
                if ((st = jp_value(p, &v, depth + 1))) return st;
                if (!(obj ? jj_dict_set(p->a, d, k, v) : jj_list_push(p->a, l, v)))
                    return twk_error(TWK_ERR_OOM, "JSON: out of memory");
                jp_ws(p);
                if (p->i < p->n && p->s[p->i] == ',') {
                    p->i++;
                    continue;
                }
                if (p->i < p->n && p->s[p->i] == (obj ? '}' : ']')) {
                    p->i++;
                    break;
                }
                return jp_err(p, obj ? "expected ',' or '}'" : "expected ',' or ']'");
            }
        *out = obj ? (jj_val){.kind = JJ_DICT, .u.dict = d} : (jj_val){.kind = JJ_LIST, .u.list = l};
        return TWK_OK;
    }
    static const struct {
        const char *w;
        jj_val v;
    } words[] = {{"true", {.kind = JJ_BOOL, .u.b = true}},
                 {"false", {.kind = JJ_BOOL, .u.b = false}},
                 {"null", {.kind = JJ_NONE}}};
    for (size_t w = 0; w < 3; w++) {
        size_t wl = strlen(words[w].w);
        if (p->n - p->i >= wl && memcmp(p->s + p->i, words[w].w, wl) == 0) {
            p->i += wl;
            *out = words[w].v;
            return TWK_OK;
        }
    }
    size_t j = p->i;
    bool isf = false;
    if (j < p->n && p->s[j] == '-') j++;
    size_t ds = j;
    while (j < p->n && ((p->s[j] >= '0' && p->s[j] <= '9') || strchr(".eE+-", p->s[j]))) {
        if (strchr(".eE", p->s[j])) isf = true;
        j++;
    }
    if (j == ds) return jp_err(p, "unexpected character");
    char t[64];
    if (j - p->i >= sizeof t) return jp_err(p, "number too long");
    memcpy(t, p->s + p->i, j - p->i);
    t[j - p->i] = 0;
    char *end;
    errno = 0;
    if (isf) {
        out->kind = JJ_FLOAT;
        out->u.f = strtod(t, &end);
    } else {
        out->kind = JJ_INT;
        out->u.i = strtoll(t, &end, 10);
    }
    if (*end) return jp_err(p, "bad number");
    if (!isf && errno == ERANGE) return jp_err(p, "integer out of the 64-bit range");
    p->i = j;
    return TWK_OK;
}

twk_status jj_from_json(jj_arena *a, const char *s, size_t n, jj_val *out) {
    jp p = {a, s, n, 0};
    twk_status st = jp_value(&p, out, 0);
    if (st) return st;
    jp_ws(&p);
    if (p.i != n) return jp_err(&p, "extra data");
    return TWK_OK;
}

/* ---- UTF-8 ---- */
static uint32_t dec(const char *s, size_t n, size_t *len) {
    unsigned char c = (unsigned char)s[0];
    size_t l = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (l > n) l = 1;
    uint32_t cp = l == 1 ? c : c & (0x7F >> l);
    for (size_t i = 1; i < l; i++) cp = cp << 6 | ((unsigned char)s[i] & 63);
    *len = l;
    return cp;
}

bool jj_is_space(const char *s, size_t n, size_t *clen) {
    uint32_t c = dec(s, n, clen);
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

size_t jj_utf8_len(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) k++;
    return k;
}

size_t jj_utf8_offset(const char *s, size_t n, int64_t cp) {
    size_t i = 0;
    for (int64_t k = 0; i < n && k < cp; k++) {
        size_t l;
        dec(s + i, n - i, &l);
        i += l;
    }
    return i;
}

void jj_output_free(jj_output *o) {
    twk_host_free(o->text.p);
    twk_host_free(o->owner);
    twk_host_free(o->spans);
    memset(o, 0, sizeof *o);
}

twk_status jj_error(twk_status code, int line, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return twk_error(code, "chat template line %d: %s", line, msg);
}
