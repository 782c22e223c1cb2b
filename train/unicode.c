/* Unicode categories and normalization forms (see unicode.h): UAX #15's algorithm over the
 * tables of unicode_data.c, Hangul by arithmetic. */
#include "unicode.h"
#include "twinkle/hal.h"

#include <stdlib.h>
#include <string.h>

static int range_find(const twk_uc_range *r, int n, uint32_t cp) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (r[mid].start <= cp)
            lo = mid;
        else
            hi = mid - 1;
    }
    return r[lo].v;
}

int twk_uc_category(uint32_t cp) {
    if (cp > 0x10FFFF) return TWK_UC_CN;
    return twk_uc_props(cp) & 31;
}

int twk_uc_is_letter(uint32_t cp) {
    if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    int c = twk_uc_category(cp);
    return c >= TWK_UC_LU && c <= TWK_UC_LO;
}

int twk_uc_is_number(uint32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    int c = twk_uc_category(cp);
    return c >= TWK_UC_ND && c <= TWK_UC_NO;
}

int twk_uc_is_space(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

int twk_uc_is_word(uint32_t cp) {
    if (cp == 0x200C || cp == 0x200D) return 1;
    int c = twk_uc_category(cp);
    return (c >= TWK_UC_LU && c <= TWK_UC_ND) || c == TWK_UC_NL || c == TWK_UC_PC;
}

int twk_uc_utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int k;
    unsigned lo = 0x80, hi = 0xBF;
    uint32_t v;
    if (c >= 0xC2 && c <= 0xDF)
        k = 2, v = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF)
        k = 3, v = c & 0x0F, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
        k = 4, v = c & 0x07, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else
        return -1;
    for (int i = 1; i < k; i++) {
        if ((size_t)i >= n) return -i;
        unsigned b = s[i];
        if (b < lo || b > hi) return -i;
        lo = 0x80, hi = 0xBF;
        v = (v << 6) | (b & 0x3F);
    }
    *cp = v;
    return k;
}

/* ---- normalization ---------------------------------------------------------------------------- */

enum { SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7, LCOUNT = 19, VCOUNT = 21, TCOUNT = 28 };
enum { NCOUNT = VCOUNT * TCOUNT, SCOUNT = LCOUNT * NCOUNT };

typedef struct {
    uint32_t *v;
    size_t n, cap;
} cps;

static int cps_push(cps *c, uint32_t x) {
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 64;
        uint32_t *v = twk_host_realloc(c->v, c->n * sizeof *v, cap * sizeof *v, "unicode normalization");
        if (!v) return 0;
        c->v = v;
        c->cap = cap;
    }
    c->v[c->n++] = x;
    return 1;
}

static int ccc_of(uint32_t cp) { return cp < 0x300 ? 0 : range_find(twk_uc_ccc, twk_uc_n_ccc, cp); }

static const twk_uc_decomp *decomp_find(const twk_uc_decomp *t, int n, uint32_t cp) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (t[mid].cp == cp) return &t[mid];
        if (t[mid].cp < cp)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

static int decompose(uint32_t cp, int compat, cps *o) {
    if (cp >= SBASE && cp < SBASE + SCOUNT) {
        uint32_t s = cp - SBASE;
        if (!cps_push(o, LBASE + s / NCOUNT) || !cps_push(o, VBASE + (s % NCOUNT) / TCOUNT)) return 0;
        return s % TCOUNT ? cps_push(o, TBASE + s % TCOUNT) : 1;
    }
    const twk_uc_decomp *d = cp < 0xA0 ? NULL
                             : compat  ? decomp_find(twk_uc_compat, twk_uc_n_compat, cp)
                                       : decomp_find(twk_uc_canon, twk_uc_n_canon, cp);
    if (!d) return cps_push(o, cp);
    for (uint32_t i = 0; i < (d->ref & 0xFF); i++)
        if (!cps_push(o, twk_uc_pool[(d->ref >> 8) + i])) return 0;
    return 1;
}

static uint32_t compose_pair(uint32_t a, uint32_t b) {
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE && b < TBASE + TCOUNT)
        return a + (b - TBASE);
    uint64_t key = (uint64_t)a << 21 | b;
    int lo = 0, hi = twk_uc_n_comp - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (twk_uc_comp[mid].key == key) return twk_uc_comp[mid].c;
        if (twk_uc_comp[mid].key < key)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return 0;
}

int twk_uc_normalize(const char *s, size_t n, int form, char **out, size_t *out_len) {
    cps c = {0};
    int compat = form == TWK_NFKC || form == TWK_NFKD, comp = form == TWK_NFC || form == TWK_NFKC;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = twk_uc_utf8_next((const unsigned char *)s + i, n - i, &cp);
        if (k <= 0) cp = 0xFFFD, k = k ? -k : 1;
        i += (size_t)k;
        if (!decompose(cp, compat, &c)) goto oom;
    }
    /* canonical ordering: a stable insertion sort of each run of non-starters */
    for (size_t i = 1; i < c.n; i++) {
        int cc = ccc_of(c.v[i]);
        if (!cc) continue;
        size_t j = i;
        uint32_t x = c.v[i];
        while (j > 0 && ccc_of(c.v[j - 1]) > cc) {
            c.v[j] = c.v[j - 1];
            j--;
        }
        c.v[j] = x;
    }
    if (comp && c.n) {
        size_t starter = 0, w = 1;
        int starter_ok = ccc_of(c.v[0]) == 0, last_cc = starter_ok ? 0 : 256;
        for (size_t i = 1; i < c.n; i++) {
            uint32_t x = c.v[i];
            int cc = ccc_of(x);
            uint32_t p = starter_ok && (last_cc < cc || last_cc == 0) ? compose_pair(c.v[starter], x) : 0;
            if (p && (last_cc < cc || (last_cc == 0 && w == starter + 1))) {
                c.v[starter] = p;
                continue;
            }
            if (cc == 0) {
                starter = w;
                starter_ok = 1;
            }
            last_cc = cc;
            c.v[w++] = x;
        }
        c.n = w;
    }
    char *o = twk_host_alloc(4 * c.n + 1, "unicode normalization");
    if (!o) goto oom;
    size_t m = 0;
    for (size_t i = 0; i < c.n; i++) {
        uint32_t cp = c.v[i];
        if (cp < 0x80)
            o[m++] = (char)cp;
        else if (cp < 0x800)
            o[m++] = (char)(0xC0 | (cp >> 6)), o[m++] = (char)(0x80 | (cp & 0x3F));
        else if (cp < 0x10000)
            o[m++] = (char)(0xE0 | (cp >> 12)), o[m++] = (char)(0x80 | ((cp >> 6) & 0x3F)),
            o[m++] = (char)(0x80 | (cp & 0x3F));
        else
            o[m++] = (char)(0xF0 | (cp >> 18)), o[m++] = (char)(0x80 | ((cp >> 12) & 0x3F)),
            o[m++] = (char)(0x80 | ((cp >> 6) & 0x3F)), o[m++] = (char)(0x80 | (cp & 0x3F));
    }
    o[m] = 0;
    twk_host_free(c.v);
    *out = o;
    *out_len = m;
    return 0;
oom:
    twk_host_free(c.v);
    return -1;
}
