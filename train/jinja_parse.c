/* Chat-template Jinja subset: lexer (trim_blocks, lstrip_blocks, whitespace control) and parser. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_ast.h"
#include "twinkle/hal.h"

typedef enum { T_TEXT, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP, T_EOF } tk_kind;
typedef struct tok {
    tk_kind k;
    int line;
    const char *s;
    size_t n;
    jj_val v;
} tok;
typedef struct lx {
    jj_arena *a;
    tok *t;
    size_t n, cap;
} lx;
typedef struct ps {
    jj_arena *a;
    tok *t;
    size_t i, n;
    bool has_generation;
    int depth;
} ps;

#define perr jj_error

static bool push(lx *l, tok t) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 256;
        tok *p = twk_host_realloc(l->t, l->cap * sizeof(tok), nc * sizeof(tok), "chat template tokens");
        if (!p) return false;
        l->t = p;
        l->cap = nc;
    }
    l->t[l->n++] = t;
    return true;
}

static int count_nl(const char *s, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static bool is_id(char c, bool first) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && c >= '0' && c <= '9');
}

/* Python string-literal unescaping as Jinja does it. */
static twk_status unescape(jj_arena *a, const char *s, size_t n, int line, jj_val *out) {
    char *o = jj_alloc(a, n + 1);
    if (!o) return twk_error(TWK_ERR_OOM, "chat template: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 == n) {
            o[k++] = s[i];
            continue;
        }
        char e = s[++i];
        switch (e) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case '\n': break;
        default:
            if (strchr("xuUN01234567abfv", e))
                return perr(TWK_ERR_UNSUPPORTED, line, "unsupported construct: string escape '\\%c'", e);
            o[k++] = '\\';
            o[k++] = e;
        }
    }
    *out = (jj_val){.kind = JJ_STR, .u.str = {o, k}};
    return TWK_OK;
}

static twk_status lex(jj_arena *a, const char *src, size_t n, lx *l) {
    if (n && src[n - 1] == '\n') n--; /* keep_trailing_newline=False */
    size_t pos = 0;
    int line = 1;
    bool line_starting = true;
    while (pos <= n) {
        size_t start = pos;
        while (start + 1 < n &&
               !(src[start] == '{' && (src[start + 1] == '{' || src[start + 1] == '%' || src[start + 1] == '#')))
            start++;
        if (start + 1 >= n) start = n;
        size_t tlen = start - pos;
        char kind = start < n ? src[start + 1] : 0;
        char sign = start + 2 < n && (src[start + 2] == '-' || src[start + 2] == '+') ? src[start + 2] : 0;
        if (start < n) {
            if (sign == '-') {
                while (tlen && is_ws(src[pos + tlen - 1])) tlen--;
            } else if (kind != '{' && sign != '+') {
                size_t lp = tlen;
                while (lp && src[pos + lp - 1] != '\n') lp--;
                if (lp > 0 || line_starting) {
                    size_t j = lp;
                    while (j < tlen && is_ws(src[pos + j])) j++;
                    if (j == tlen) tlen = lp;
                }
            }
        }
        if (tlen && !push(l, (tok){T_TEXT, line, src + pos, tlen, {0}})) return twk_error(TWK_ERR_OOM, "out of memory");
        line += count_nl(src + pos, start - pos);
        if (start >= n) break;
        size_t p = start + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            const char *e = NULL;
            for (size_t j = p; j + 1 < n; j++)
                if (src[j] == '#' && src[j + 1] == '}') {
                    e = src + j;
                    break;
                }
            if (!e) return perr(TWK_ERR_INVALID_ARG, line, "unterminated comment");
            size_t after = (size_t)(e - src) + 2;
            if (e > src + p && e[-1] == '-')
                while (after < n && is_ws(src[after])) after++;
            else if (after < n && src[after] == '\n') after++;
            line += count_nl(src + start, after - start);
            line_starting = src[after - 1] == '\n';
            pos = after;
            continue;
        }
        bool block = kind == '%';
        char close0 = block ? '%' : '}';
        if (!push(l, (tok){block ? T_BBEGIN : T_VBEGIN, line, NULL, 0, {0}}))
            return twk_error(TWK_ERR_OOM, "out of memory");
        for (;;) {
            while (p < n && is_ws(src[p])) line += src[p++] == '\n';
            if (p >= n) return perr(TWK_ERR_INVALID_ARG, line, "unexpected end of template inside a tag");
            bool strip = src[p] == '-' && p + 2 < n && src[p + 1] == close0 && src[p + 2] == '}';
            if (strip || (src[p] == close0 && p + 1 < n && src[p + 1] == '}')) {
                p += strip ? 3 : 2;
                if (!push(l, (tok){block ? T_BEND : T_VEND, line, NULL, 0, {0}}))
                    return twk_error(TWK_ERR_OOM, "out of memory");
                if (strip)
                    while (p < n && is_ws(src[p])) line += src[p++] == '\n';
                else if (block && p < n && src[p] == '\n') {
                    p++;
                    line++;
                }
                break;
            }
            if (src[p] == '+' && block && p + 2 < n && src[p + 1] == '%' && src[p + 2] == '}')
                return perr(TWK_ERR_UNSUPPORTED, line, "unsupported construct: '+%%}'");
            char c = src[p];
            tok t = {T_OP, line, src + p, 1, {0}};
            if (c == '\'' || c == '"') {
                size_t j = p + 1;
                while (j < n && src[j] != c) j += src[j] == '\\' ? 2 : 1;
                if (j >= n) return perr(TWK_ERR_INVALID_ARG, line, "unterminated string");
                t.k = T_STR;
                twk_status st = unescape(a, src + p + 1, j - p - 1, line, &t.v);
                if (st) return st;
                line += count_nl(src + p, j - p);
                p = j + 1;
            } else if (c >= '0' && c <= '9') {
                size_t j = p;
                bool f = false;
                while (j < n && ((src[j] >= '0' && src[j] <= '9') || src[j] == '_' ||
                                 (src[j] == '.' && !f && j + 1 < n && src[j + 1] >= '0' && src[j + 1] <= '9'))) {
                    if (src[j] == '.') f = true;
                    j++;
                }
                if (j < n && (src[j] == 'e' || src[j] == 'E')) { /* exponent */
                    size_t q = j + 1;
                    if (q < n && (src[q] == '+' || src[q] == '-')) q++;
                    if (q < n && src[q] >= '0' && src[q] <= '9') {
                        while (q < n && ((src[q] >= '0' && src[q] <= '9') || src[q] == '_')) q++;
                        j = q;
                        f = true;
                    }
                }
                char buf[64];
                size_t k = 0;
                for (size_t q = p; q < j && k + 1 < sizeof buf; q++)
                    if (src[q] != '_') buf[k++] = src[q];
                buf[k] = 0;
                t.k = f ? T_FLOAT : T_INT;
                t.v = f ? (jj_val){.kind = JJ_FLOAT, .u.f = strtod(buf, NULL)}
                        : (jj_val){.kind = JJ_INT, .u.i = strtoll(buf, NULL, 10)};
                p = j;
            } else if (is_id(c, true)) {
                size_t j = p;
                while (j < n && is_id(src[j], false)) j++;
                t.k = T_NAME;
                t.n = j - p;
                p = j;
            } else {
                static const char *two[] = {"//", "**", "==", "!=", "<=", ">="};
                for (size_t q = 0; q < 6; q++)
                    if (p + 1 < n && src[p] == two[q][0] && src[p + 1] == two[q][1]) t.n = 2;
                if (t.n == 1 && !strchr("+-*/%~<>()[]{},.:|=", c))
                    return perr(TWK_ERR_INVALID_ARG, line, "unexpected character '%c'", c);
                p += t.n;
            }
            if (!push(l, t)) return twk_error(TWK_ERR_OOM, "out of memory");
        }
        line_starting = src[p - 1] == '\n';
        pos = p;
    }
    if (!push(l, (tok){T_EOF, line, NULL, 0, {0}})) return twk_error(TWK_ERR_OOM, "out of memory");
    return TWK_OK;
}

/* ---- parser ---- */
static tok *cur(ps *p) { return &p->t[p->i]; }
static bool is_name(tok *t, const char *w) { return t->k == T_NAME && t->n == strlen(w) && memcmp(t->s, w, t->n) == 0; }
static bool is_op(tok *t, const char *o) { return t->k == T_OP && t->n == strlen(o) && memcmp(t->s, o, t->n) == 0; }
static const char *tokname(ps *p, tok *t) {
    if (t->k == T_NAME || t->k == T_OP) {
        char *s = jj_alloc(p->a, t->n + 1);
        if (s) memcpy(s, t->s, t->n);
        return s ? s : "?";
    }
    static const char *names[] = {"text",   "'{{'",    "'}}'",  "'{%'",     "'%}'",           "name",
                                  "string", "integer", "float", "operator", "end of template"};
    return names[t->k];
}
static twk_status expect_op(ps *p, const char *o) {
    if (!is_op(cur(p), o))
        return perr(TWK_ERR_INVALID_ARG, cur(p)->line, "expected '%s', got %s", o, tokname(p, cur(p)));
    p->i++;
    return TWK_OK;
}

static jj_expr *mk(ps *p, jj_ek k, int line) {
    jj_expr *e = jj_alloc(p->a, sizeof *e);
    if (e) {
        e->k = k;
        e->line = line;
    }
    return e;
}

#define OOM_IF(x)                                                                                                      \
    do {                                                                                                               \
        if (!(x)) return twk_error(TWK_ERR_OOM, "chat template: out of memory");                                       \
    } while (0)
#define TRY(x)                                                                                                         \
    do {                                                                                                               \
        twk_status st_ = (x);                                                                                          \
        if (st_) return st_;                                                                                           \
    } while (0)

static twk_status parse_expr(ps *p, jj_expr **out, bool condexpr);
static twk_status parse_unary(ps *p, jj_expr **out, bool with_filter);

static const char *FILTERS[] = {"tojson",     "trim",    "length",     "count",      "string", "first",  "last",
                                "list",       "join",    "selectattr", "rejectattr", "select", "reject", "items",
                                "upper",      "lower",   "default",    "d",          "int",    "float",  "abs",
                                "capitalize", "replace", "map",        "unique",     "title",  "safe",   NULL};
static const char *TESTS[] = {"defined", "undefined", "none",  "string",   "mapping",     "iterable", "sequence",
                              "number",  "integer",   "float", "boolean",  "true",        "false",    "equalto",
                              "eq",      "==",        "ne",    "!=",       "odd",         "even",     "in",
                              "sameas",  "lower",     "upper", "callable", "divisibleby", NULL};

static bool known(const char **list, const char *s) {
    for (; *list; list++)
        if (strcmp(*list, s) == 0) return true;
    return false;
}

static twk_status parse_args(ps *p, jj_expr *e) {
    /* at '(' */
    p->i++;
    jj_expr *args[32];
    const char *kw[32];
    int n = 0;
    while (!is_op(cur(p), ")")) {
        if (n == 32) return perr(TWK_ERR_UNSUPPORTED, cur(p)->line, "unsupported construct: more than 32 arguments");
        kw[n] = NULL;
        if (cur(p)->k == T_NAME && is_op(&p->t[p->i + 1], "=")) {
            kw[n] = tokname(p, cur(p));
            p->i += 2;
        }
        TRY(parse_expr(p, &args[n], true));
        n++;
        if (is_op(cur(p), ",")) p->i++;
        else if (!is_op(cur(p), ")"))
            return perr(TWK_ERR_INVALID_ARG, cur(p)->line, "expected ',' or ')', got %s", tokname(p, cur(p)));
    }
    p->i++;
    e->nargs = n;
    OOM_IF(e->args = jj_alloc(p->a, sizeof(jj_expr *) * (size_t)(n + 1)));
    OOM_IF(e->kwnames = jj_alloc(p->a, sizeof(char *) * (size_t)(n + 1)));
    memcpy(e->args, args, sizeof(jj_expr *) * (size_t)n);
    memcpy(e->kwnames, kw, sizeof(char *) * (size_t)n);
    return TWK_OK;
}

static twk_status parse_primary(ps *p, jj_expr **out) {
    tok *t = cur(p);
    jj_expr *e = NULL;
    if (t->k == T_NAME) {
        p->i++;
        if (is_name(t, "true") || is_name(t, "True") || is_name(t, "false") || is_name(t, "False")) {
            OOM_IF(e = mk(p, E_LIT, t->line));
            e->lit = (jj_val){.kind = JJ_BOOL, .u.b = t->s[0] == 't' || t->s[0] == 'T'};
        } else if (is_name(t, "none") || is_name(t, "None")) {
            OOM_IF(e = mk(p, E_LIT, t->line));
            e->lit.kind = JJ_NONE;
        } else {
            OOM_IF(e = mk(p, E_NAME, t->line));
            e->name = tokname(p, t);
        }
    } else if (t->k == T_STR) {
        OOM_IF(e = mk(p, E_LIT, t->line));
        e->lit = t->v;
        p->i++;
        while (cur(p)->k == T_STR) { /* adjacent literals concatenate */
            jj_val a = e->lit, b = cur(p)->v;
            char *s = jj_alloc(p->a, a.u.str.n + b.u.str.n + 1);
            OOM_IF(s);
            memcpy(s, a.u.str.s, a.u.str.n);
            memcpy(s + a.u.str.n, b.u.str.s, b.u.str.n);
            e->lit.u.str.s = s;
            e->lit.u.str.n = a.u.str.n + b.u.str.n;
            p->i++;
        }
    } else if (t->k == T_INT || t->k == T_FLOAT) {
        OOM_IF(e = mk(p, E_LIT, t->line));
        e->lit = t->v;
        p->i++;
    } else if (is_op(t, "(")) {
        p->i++;
        TRY(parse_expr(p, &e, true));
        if (is_op(cur(p), ",")) return perr(TWK_ERR_UNSUPPORTED, cur(p)->line, "unsupported construct: tuple literal");
        TRY(expect_op(p, ")"));
    } else if (is_op(t, "[") || is_op(t, "{")) {
        bool dict = is_op(t, "{");
        const char *close = dict ? "}" : "]";
        OOM_IF(e = mk(p, dict ? E_DICT : E_LIST, t->line));
        p->i++;
        jj_expr *items[128];
        int n = 0;
        while (!is_op(cur(p), close)) {
            if (n >= 126)
                return perr(TWK_ERR_UNSUPPORTED, t->line, "unsupported construct: literal with more than 63 items");
            TRY(parse_expr(p, &items[n++], true));
            if (dict) {
                TRY(expect_op(p, ":"));
                TRY(parse_expr(p, &items[n++], true));
            }
            if (is_op(cur(p), ",")) p->i++;
            else if (!is_op(cur(p), close))
                return perr(TWK_ERR_INVALID_ARG, cur(p)->line, "expected ',' or '%s'", close);
        }
        p->i++;
        e->nargs = n;
        OOM_IF(e->args = jj_alloc(p->a, sizeof(jj_expr *) * (size_t)(n + 1)));
        memcpy(e->args, items, sizeof(jj_expr *) * (size_t)n);
    } else {
        return perr(TWK_ERR_INVALID_ARG, t->line, "unexpected %s", tokname(p, t));
    }
    *out = e;
    return TWK_OK;
}

static twk_status parse_postfix(ps *p, jj_expr **io) {
    for (;;) {
        tok *t = cur(p);
        if (is_op(t, ".")) {
            p->i++;
            tok *nt = cur(p);
            jj_expr *e;
            if (nt->k == T_NAME) {
                OOM_IF(e = mk(p, E_ATTR, t->line));
                e->name = tokname(p, nt);
            } else if (nt->k == T_INT) {
                OOM_IF(e = mk(p, E_ITEM, t->line));
                OOM_IF(e->b = mk(p, E_LIT, t->line));
                e->b->lit = nt->v;
            } else return perr(TWK_ERR_INVALID_ARG, t->line, "expected a name after '.'");
            p->i++;
            e->a = *io;
            *io = e;
        } else if (is_op(t, "[")) {
            p->i++;
            jj_expr *parts[3] = {0};
            int np = 0;
            bool slice = false;
            for (;;) {
                if (is_op(cur(p), ":")) {
                    slice = true;
                    if (++np > 2) return perr(TWK_ERR_INVALID_ARG, t->line, "bad slice");
                    p->i++;
                    continue;
                }
                if (is_op(cur(p), "]")) break;
                if (parts[np]) return perr(TWK_ERR_INVALID_ARG, t->line, "expected ']'");
                TRY(parse_expr(p, &parts[np], true));
            }
            p->i++;
            jj_expr *e;
            if (slice) {
                OOM_IF(e = mk(p, E_SLICE, t->line));
                e->b = parts[0];
                e->c = parts[1];
                e->d = parts[2];
            } else {
                if (!parts[0]) return perr(TWK_ERR_INVALID_ARG, t->line, "empty subscript");
                OOM_IF(e = mk(p, E_ITEM, t->line));
                e->b = parts[0];
            }
            e->a = *io;
            *io = e;
        } else if (is_op(t, "(")) {
            jj_expr *e;
            OOM_IF(e = mk(p, E_CALL, t->line));
            e->a = *io;
            TRY(parse_args(p, e));
            *io = e;
        } else return TWK_OK;
    }
}

static bool starts_operand(tok *t) {
    if (t->k == T_STR || t->k == T_INT || t->k == T_FLOAT) return true;
    if (t->k != T_NAME) return false;
    static const char *kw[] = {"and", "or", "else", "if", "in", "not", "is", NULL};
    for (const char **k = kw; *k; k++)
        if (is_name(t, *k)) return false;
    return true;
}

static twk_status parse_filter_expr(ps *p, jj_expr **io) {
    for (;;) {
        tok *t = cur(p);
        if (is_op(t, "|")) {
            p->i++;
            tok *nt = cur(p);
            if (nt->k != T_NAME) return perr(TWK_ERR_INVALID_ARG, t->line, "expected a filter name after '|'");
            jj_expr *e;
            OOM_IF(e = mk(p, E_FILTER, t->line));
            e->name = tokname(p, nt);
            if (!known(FILTERS, e->name))
                return perr(TWK_ERR_UNSUPPORTED, t->line, "unsupported construct: filter '%s'", e->name);
            p->i++;
            e->a = *io;
            if (is_op(cur(p), "(")) TRY(parse_args(p, e));
            *io = e;
        } else if (is_name(t, "is")) {
            p->i++;
            jj_expr *e;
            OOM_IF(e = mk(p, E_TEST, t->line));
            if (is_name(cur(p), "not")) {
                e->negate = true;
                p->i++;
            }
            tok *nt = cur(p);
            if (nt->k != T_NAME && !is_op(nt, "==") && !is_op(nt, "!="))
                return perr(TWK_ERR_INVALID_ARG, t->line, "expected a test name after 'is'");
            e->name = tokname(p, nt);
            if (!known(TESTS, e->name))
                return perr(TWK_ERR_UNSUPPORTED, t->line, "unsupported construct: test '%s'", e->name);
            p->i++;
            e->a = *io;
            if (is_op(cur(p), "(")) TRY(parse_args(p, e));
            else if (starts_operand(cur(p))) {
                OOM_IF(e->args = jj_alloc(p->a, sizeof(jj_expr *)));
                OOM_IF(e->kwnames = jj_alloc(p->a, sizeof(char *)));
                TRY(parse_unary(p, &e->args[0], false));
                e->nargs = 1;
            }
            *io = e;
        } else if (is_op(t, "(")) {
            jj_expr *e;
            OOM_IF(e = mk(p, E_CALL, t->line));
            e->a = *io;
            TRY(parse_args(p, e));
            *io = e;
        } else return TWK_OK;
    }
}

static twk_status parse_unary(ps *p, jj_expr **out, bool with_filter) {
    tok *t = cur(p);
    jj_expr *e;
    if (is_op(t, "-") || is_op(t, "+")) {
        p->i++;
        jj_expr *x;
        TRY(parse_unary(p, &x, false));
        if (t->s[0] == '-') {
            OOM_IF(e = mk(p, E_NEG, t->line));
            e->a = x;
        } else e = x;
    } else TRY(parse_primary(p, &e));
    TRY(parse_postfix(p, &e));
    if (with_filter) TRY(parse_filter_expr(p, &e));
    *out = e;
    return TWK_OK;
}

static twk_status bin(ps *p, jj_expr **io, const char *op, int line, twk_status (*next)(ps *, jj_expr **)) {
    jj_expr *e, *r = NULL;
    TRY(next(p, &r));
    OOM_IF(e = mk(p, E_BIN, line));
    e->name = op;
    e->a = *io;
    e->b = r;
    *io = e;
    return TWK_OK;
}

static twk_status parse_pow(ps *p, jj_expr **out) {
    TRY(parse_unary(p, out, true));
    while (is_op(cur(p), "**")) {
        int line = cur(p)->line;
        p->i++;
        jj_expr *e, *r = NULL;
        TRY(parse_unary(p, &r, true));
        OOM_IF(e = mk(p, E_BIN, line));
        e->name = "**";
        e->a = *out;
        e->b = r;
        *out = e;
    }
    return TWK_OK;
}

static twk_status parse_math2(ps *p, jj_expr **out) {
    TRY(parse_pow(p, out));
    for (;;) {
        tok *t = cur(p);
        const char *op = is_op(t, "*") ? "*" : is_op(t, "/") ? "/" : is_op(t, "//") ? "//" : is_op(t, "%") ? "%" : NULL;
        if (!op) return TWK_OK;
        p->i++;
        TRY(bin(p, out, op, t->line, parse_pow));
    }
}

static twk_status parse_concat(ps *p, jj_expr **out) {
    TRY(parse_math2(p, out));
    while (is_op(cur(p), "~")) {
        int line = cur(p)->line;
        p->i++;
        TRY(bin(p, out, "~", line, parse_math2));
    }
    return TWK_OK;
}

static twk_status parse_math1(ps *p, jj_expr **out) {
    TRY(parse_concat(p, out));
    for (;;) {
        tok *t = cur(p);
        const char *op = is_op(t, "+") ? "+" : is_op(t, "-") ? "-" : NULL;
        if (!op) return TWK_OK;
        p->i++;
        TRY(bin(p, out, op, t->line, parse_concat));
    }
}

static twk_status parse_compare(ps *p, jj_expr **out) {
    TRY(parse_math1(p, out));
    for (;;) {
        tok *t = cur(p);
        const char *op = NULL;
        static const char *ops[] = {"==", "!=", "<=", ">=", "<", ">"};
        for (size_t i = 0; i < 6 && !op; i++)
            if (is_op(t, ops[i])) op = ops[i];
        if (!op && is_name(t, "in")) op = "in";
        if (!op && is_name(t, "not") && is_name(&p->t[p->i + 1], "in")) {
            op = "not in";
            p->i++;
        }
        if (!op) return TWK_OK;
        p->i++;
        TRY(bin(p, out, op, t->line, parse_math1));
    }
}

static twk_status parse_not(ps *p, jj_expr **out) {
    if (is_name(cur(p), "not")) {
        int line = cur(p)->line;
        p->i++;
        jj_expr *e;
        OOM_IF(e = mk(p, E_NOT, line));
        TRY(parse_not(p, &e->a));
        *out = e;
        return TWK_OK;
    }
    return parse_compare(p, out);
}

static twk_status parse_andor(ps *p, jj_expr **out, bool is_or) {
    TRY(is_or ? parse_andor(p, out, false) : parse_not(p, out));
    while (is_name(cur(p), is_or ? "or" : "and")) {
        int line = cur(p)->line;
        p->i++;
        jj_expr *e;
        OOM_IF(e = mk(p, is_or ? E_OR : E_AND, line));
        e->a = *out;
        TRY(is_or ? parse_andor(p, &e->b, false) : parse_not(p, &e->b));
        *out = e;
    }
    return TWK_OK;
}

static twk_status parse_expr(ps *p, jj_expr **out, bool condexpr) {
    if (p->depth >= 100)
        return perr(TWK_ERR_UNSUPPORTED, cur(p)->line, "unsupported construct: expressions nested more than 100 deep");
    p->depth++;
    twk_status st = parse_andor(p, out, true);
    p->depth--;
    if (st) return st;
    while (condexpr && is_name(cur(p), "if")) {
        int line = cur(p)->line;
        p->i++;
        jj_expr *e;
        OOM_IF(e = mk(p, E_COND, line));
        e->b = *out;
        TRY(parse_andor(p, &e->a, true));
        if (is_name(cur(p), "else")) {
            p->i++;
            TRY(parse_expr(p, &e->c, true));
        }
        *out = e;
    }
    return TWK_OK;
}

static twk_status add_stmt(ps *p, jj_body *b, jj_stmt *s) {
    if (b->n == b->cap) {
        int nc = b->cap ? b->cap * 2 : 8;
        jj_stmt **q = jj_alloc(p->a, sizeof(jj_stmt *) * (size_t)nc);
        OOM_IF(q);
        if (b->n) memcpy(q, b->s, sizeof(jj_stmt *) * (size_t)b->n);
        b->s = q;
        b->cap = nc;
    }
    b->s[b->n++] = s;
    return TWK_OK;
}

static twk_status expect_bend(ps *p) {
    if (cur(p)->k != T_BEND)
        return perr(TWK_ERR_INVALID_ARG, cur(p)->line, "expected '%%}', got %s", tokname(p, cur(p)));
    p->i++;
    return TWK_OK;
}

/* Parses statements until a block tag whose name is in `ends` (left unconsumed: p->i at its name) or EOF. */
static twk_status parse_body(ps *p, jj_body *b, const char *const *ends, const char *opener, int open_line) {
    for (;;) {
        tok *t = cur(p);
        jj_stmt *s;
        if (t->k == T_EOF) {
            if (ends) return perr(TWK_ERR_INVALID_ARG, open_line, "'{%% %s %%}' is never closed", opener);
            return TWK_OK;
        }
        if (t->k == T_TEXT) {
            OOM_IF(s = jj_alloc(p->a, sizeof *s));
            s->k = S_TEXT;
            s->line = t->line;
            s->text = t->s;
            s->len = t->n;
            TRY(add_stmt(p, b, s));
            p->i++;
            continue;
        }
        if (t->k == T_VBEGIN) {
            p->i++;
            OOM_IF(s = jj_alloc(p->a, sizeof *s));
            s->k = S_OUT;
            s->line = t->line;
            TRY(parse_expr(p, &s->e, true));
            if (cur(p)->k != T_VEND)
                return perr(TWK_ERR_INVALID_ARG, cur(p)->line, "expected '}}', got %s", tokname(p, cur(p)));
            p->i++;
            TRY(add_stmt(p, b, s));
            continue;
        }
        if (t->k != T_BBEGIN) return perr(TWK_ERR_INVALID_ARG, t->line, "unexpected %s", tokname(p, t));
        tok *nt = &p->t[p->i + 1];
        if (nt->k != T_NAME) return perr(TWK_ERR_INVALID_ARG, t->line, "expected a statement name after '{%%'");
        const char *name = tokname(p, nt);
        for (const char *const *e = ends; e && *e; e++)
            if (strcmp(*e, name) == 0) {
                p->i++;
                return TWK_OK;
            }
        p->i += 2;
        OOM_IF(s = jj_alloc(p->a, sizeof *s));
        s->line = t->line;
        if (strcmp(name, "if") == 0) {
            s->k = S_IF;
            jj_expr *conds[64];
            jj_body bodies[64];
            int nb = 0;
            jj_expr *c;
            TRY(parse_expr(p, &c, true));
            TRY(expect_bend(p));
            for (;;) {
                if (nb == 64) return perr(TWK_ERR_UNSUPPORTED, t->line, "unsupported construct: more than 64 elif");
                conds[nb] = c;
                memset(&bodies[nb], 0, sizeof(jj_body));
                static const char *const E[] = {"elif", "else", "endif", NULL};
                TRY(parse_body(p, &bodies[nb], E, "if", t->line));
                nb++;
                tok *kw = cur(p);
                p->i++;
                if (is_name(kw, "endif")) {
                    TRY(expect_bend(p));
                    break;
                }
                if (is_name(kw, "elif")) {
                    TRY(parse_expr(p, &c, true));
                    TRY(expect_bend(p));
                    continue;
                }
                TRY(expect_bend(p));
                conds[nb] = NULL;
                memset(&bodies[nb], 0, sizeof(jj_body));
                static const char *const E2[] = {"endif", NULL};
                TRY(parse_body(p, &bodies[nb], E2, "if", t->line));
                nb++;
                p->i++;
                TRY(expect_bend(p));
                break;
            }
            s->nbranch = nb;
            OOM_IF(s->conds = jj_alloc(p->a, sizeof(jj_expr *) * (size_t)nb));
            OOM_IF(s->bodies = jj_alloc(p->a, sizeof(jj_body) * (size_t)nb));
            memcpy(s->conds, conds, sizeof(jj_expr *) * (size_t)nb);
            memcpy(s->bodies, bodies, sizeof(jj_body) * (size_t)nb);
        } else if (strcmp(name, "for") == 0) {
            s->k = S_FOR;
            for (;;) {
                if (cur(p)->k != T_NAME || s->ntargets == 4)
                    return perr(TWK_ERR_INVALID_ARG, t->line, "bad for-loop target");
                s->targets[s->ntargets++] = tokname(p, cur(p));
                p->i++;
                if (!is_op(cur(p), ",")) break;
                p->i++;
            }
            if (!is_name(cur(p), "in")) return perr(TWK_ERR_INVALID_ARG, t->line, "expected 'in' in for loop");
            p->i++;
            TRY(parse_expr(p, &s->e, false));
            if (is_name(cur(p), "if")) {
                p->i++;
                TRY(parse_expr(p, &s->filter, false));
            }
            if (is_name(cur(p), "recursive"))
                return perr(TWK_ERR_UNSUPPORTED, t->line, "unsupported construct: recursive for loop");
            TRY(expect_bend(p));
            static const char *const E[] = {"else", "endfor", NULL};
            TRY(parse_body(p, &s->body, E, "for", t->line));
            if (is_name(cur(p), "else")) {
                p->i++;
                TRY(expect_bend(p));
                static const char *const E2[] = {"endfor", NULL};
                TRY(parse_body(p, &s->orelse, E2, "for", t->line));
            }
            p->i++;
            TRY(expect_bend(p));
        } else if (strcmp(name, "set") == 0) {
            s->k = S_SET;
            if (cur(p)->k != T_NAME) return perr(TWK_ERR_INVALID_ARG, t->line, "expected a name after 'set'");
            s->targets[0] = tokname(p, cur(p));
            p->i++;
            if (is_op(cur(p), ".")) {
                p->i++;
                if (cur(p)->k != T_NAME) return perr(TWK_ERR_INVALID_ARG, t->line, "expected an attribute name");
                s->targets[1] = tokname(p, cur(p));
                p->i++;
            }
            if (is_op(cur(p), ","))
                return perr(TWK_ERR_UNSUPPORTED, t->line, "unsupported construct: tuple assignment in set");
            if (!is_op(cur(p), "="))
                return perr(TWK_ERR_UNSUPPORTED, t->line, "unsupported construct: block set '{%% set %s %%}'",
                            s->targets[0]);
            p->i++;
            TRY(parse_expr(p, &s->e, true));
            TRY(expect_bend(p));
        } else if (strcmp(name, "break") == 0 || strcmp(name, "continue") == 0) {
            s->k = name[0] == 'b' ? S_BREAK : S_CONTINUE;
            TRY(expect_bend(p));
        } else if (strcmp(name, "generation") == 0) {
            s->k = S_GEN;
            p->has_generation = true;
            TRY(expect_bend(p));
            static const char *const E[] = {"endgeneration", NULL};
            TRY(parse_body(p, &s->body, E, "generation", t->line));
            p->i++;
            TRY(expect_bend(p));
        } else {
            static const char *const closers[] = {"endif", "endfor", "elif", "else", "endgeneration", "endset", NULL};
            for (const char *const *c = closers; *c; c++)
                if (strcmp(*c, name) == 0) return perr(TWK_ERR_INVALID_ARG, t->line, "unexpected '{%% %s %%}'", name);
            return perr(TWK_ERR_UNSUPPORTED, t->line, "unsupported construct '{%% %s %%}'", name);
        }
        TRY(add_stmt(p, b, s));
    }
}

twk_status jj_parse(const char *src, size_t n, jj_template **out) {
    *out = NULL;
    jj_template *t = twk_host_calloc(sizeof *t, "chat template");
    if (!t || !(t->arena = jj_arena_new())) {
        twk_host_free(t);
        return twk_error(TWK_ERR_OOM, "chat template: out of memory");
    }
    /* the source is referenced by text statements: keep a copy in the arena */
    char *copy = jj_alloc(t->arena, n + 1);
    lx l = {t->arena, NULL, 0, 0};
    twk_status st = copy ? TWK_OK : twk_error(TWK_ERR_OOM, "chat template: out of memory");
    if (!st) {
        size_t k = 0; /* Jinja's newline normalization: \r\n and \r become \n */
        for (size_t i = 0; i < n; i++) {
            if (src[i] == '\r') {
                copy[k++] = '\n';
                if (i + 1 < n && src[i + 1] == '\n') i++;
            } else copy[k++] = src[i];
        }
        st = lex(t->arena, copy, k, &l);
    }
    if (!st) {
        ps p = {t->arena, l.t, 0, l.n, false, 0};
        st = parse_body(&p, &t->body, NULL, NULL, 0);
        t->has_generation = p.has_generation;
    }
    twk_host_free(l.t);
    if (st) {
        jj_template_free(t);
        return st;
    }
    *out = t;
    return TWK_OK;
}

bool jj_template_has_generation(const jj_template *t) { return t->has_generation; }

void jj_template_free(jj_template *t) {
    if (!t) return;
    jj_arena_free(t->arena);
    twk_host_free(t);
}
