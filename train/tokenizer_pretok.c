/* The split regexes of GPT-2, Llama 3 and Qwen2 (see tokenizer_pretok.h), alternative by
 * alternative in the regex's order, each with its greedy quantifiers and the backtracking
 * that changes the result:
 *   GPT-2  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   Llama3 (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
 *          | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   Qwen2  the same with \p{N} for \p{N}{1,3}.
 * \s is White_Space and \p{L} / \p{N} the general categories (unicode.c, Unicode 16.0 as the
 * library's Oniguruma). Under (?i), 's' also matches U+017F (long s), its one non-ASCII fold. */
#include "tokenizer_pretok.h"

#include <stdint.h>
#include <string.h>

#include "unicode.h"

static const char *const patterns[TWK_RX_COUNT] = {
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+",
};

int twk_rx_kind(const char *pattern) {
    for (int k = 0; k < TWK_RX_COUNT; k++)
        if (!strcmp(pattern, patterns[k])) return k;
    return -1;
}

enum { C_L = 1, C_N = 2, C_S = 4 };

/* The character at s[i] (valid UTF-8): its class bits, code point and length. */
static int cls_at(const char *s, size_t n, size_t i, uint32_t *cp, size_t *len) {
    const unsigned char *p = (const unsigned char *)s + i;
    uint32_t c = p[0];
    if (c < 0x80) {
        *cp = c;
        *len = 1;
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return C_L;
        if (c >= '0' && c <= '9') return C_N;
        return (c >= 9 && c <= 13) || c == ' ' ? C_S : 0;
    }
    size_t k = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    if (i + k > n) k = n - i;
    c &= k == 2 ? 0x1F : k == 3 ? 0x0F : 0x07;
    for (size_t j = 1; j < k; j++) c = (c << 6) | (p[j] & 0x3F);
    *cp = c;
    *len = k;
    return twk_uc_is_letter(c) ? C_L : twk_uc_is_number(c) ? C_N : twk_uc_is_space(c) ? C_S : 0;
}

static size_t run_of(const char *s, size_t n, size_t i, int want) {
    uint32_t cp;
    size_t l;
    while (i < n && (cls_at(s, n, i, &cp, &l) & want)) i += l;
    return i;
}

static size_t run_other(const char *s, size_t n, size_t i) { /* [^\s\p{L}\p{N}]+ */
    uint32_t cp;
    size_t l;
    while (i < n && !cls_at(s, n, i, &cp, &l)) i += l;
    return i;
}

/* 's|'t|'re|'ve|'m|'ll|'d at s[i] == '\'': the match end, or i. */
static size_t contraction(const char *s, size_t n, size_t i, int icase) {
    static const char *const tails[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    for (int t = 0; t < 7; t++) {
        size_t j = i + 1;
        const char *p = tails[t];
        for (; *p; p++) {
            if (j >= n) break;
            char c = s[j];
            if (c == *p || (icase && c == *p - 32)) {
                j++;
                continue;
            }
            if (icase && *p == 's' && j + 1 < n && (unsigned char)c == 0xC5 && (unsigned char)s[j + 1] == 0xBF) {
                j += 2; /* U+017F */
                continue;
            }
            break;
        }
        if (!*p) return j;
    }
    return i;
}

size_t twk_rx_match(int kind, const char *s, size_t n, size_t i) {
    uint32_t cp, cp2;
    size_t l, l2;
    int c = cls_at(s, n, i, &cp, &l), gpt2 = kind == TWK_RX_GPT2;
    if (cp == '\'') {
        size_t e = contraction(s, n, i, !gpt2);
        if (e > i) return e;
    }
    if (gpt2) {
        size_t j = cp == ' ' && i + 1 < n ? i + 1 : i;
        int d = j > i ? cls_at(s, n, j, &cp2, &l2) : c;
        if (d == C_L) return run_of(s, n, j, C_L);
        if (d == C_N) return run_of(s, n, j, C_N);
        if (!d) return run_other(s, n, j);
    } else {
        if (!c && cp != '\r' && cp != '\n' && i + l < n && cls_at(s, n, i + l, &cp2, &l2) == C_L)
            return run_of(s, n, i + l, C_L);
        if (c == C_S && cp != '\r' && cp != '\n' && i + l < n && cls_at(s, n, i + l, &cp2, &l2) == C_L)
            return run_of(s, n, i + l, C_L);
        if (c == C_L) return run_of(s, n, i, C_L);
        if (c == C_N) {
            if (kind == TWK_RX_QWEN2) return i + l;
            size_t e = i + l;
            for (int k = 1; k < 3 && e < n && cls_at(s, n, e, &cp2, &l2) == C_N; k++) e += l2;
            return e;
        }
        size_t j = cp == ' ' && i + 1 < n ? i + 1 : i;
        if ((j > i ? cls_at(s, n, j, &cp2, &l2) : c) == 0) {
            size_t e = run_other(s, n, j);
            while (e < n && (s[e] == '\r' || s[e] == '\n')) e++;
            return e;
        }
    }
    if (c != C_S) return i; /* not reached: every character is L, N, \s or other */
    /* a whitespace run [i, e) */
    size_t e = i, last = i, k = 0, last_nl = (size_t)-1;
    while (e < n && cls_at(s, n, e, &cp2, &l2) == C_S) {
        if (cp2 == '\r' || cp2 == '\n') last_nl = e;
        last = e;
        e += l2;
        k++;
    }
    if (!gpt2 && last_nl != (size_t)-1) return last_nl + 1; /* \s*[\r\n]+ */
    if (e == n || k < 2) return e;                          /* \s+(?!\S) to the end, or \s+ */
    return last;                                            /* \s+(?!\S) leaves one space */
}
