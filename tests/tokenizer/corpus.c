/* See corpus.h. */
#include "corpus.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static unsigned char *gunzip(const char *path, size_t *n) {
    gzFile f = gzopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open\n", path);
        return NULL;
    }
    size_t cap = 1 << 20, len = 0;
    unsigned char *b = malloc(cap);
    for (int r; b;) {
        if (len == cap) {
            unsigned char *nb = realloc(b, cap *= 2);
            if (!nb) break;
            b = nb;
        }
        r = gzread(f, b + len, (unsigned)(cap - len));
        if (r <= 0) {
            if (r < 0) fprintf(stderr, "%s: not gzip\n", path), free(b), b = NULL;
            break;
        }
        len += (size_t)r;
    }
    gzclose(f);
    *n = len;
    return b;
}

static uint32_t u32(const unsigned char *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }

int tk_corpus_read(const char *path, tk_corpus *c) {
    memset(c, 0, sizeof *c);
    size_t n, at = 12;
    unsigned char *b = gunzip(path, &n);
    if (!b) return -1;
    if (n < 12 || memcmp(b, "TWKCORP1", 8)) goto bad;
    c->n = u32(b + 8);
    c->off = malloc(((size_t)c->n + 1) * sizeof *c->off);
    c->data = malloc(n);
    if (!c->off || !c->data) goto bad;
    for (int64_t i = 0; i < c->n; i++) {
        if (at + 4 > n || u32(b + at) > n - at - 4) goto bad;
        size_t l = u32(b + at);
        c->off[i] = c->bytes;
        memcpy(c->data + c->bytes, b + at + 4, l);
        c->bytes += l;
        at += 4 + l;
    }
    c->off[c->n] = c->bytes;
    free(b);
    return 0;
bad:
    fprintf(stderr, "%s: malformed corpus\n", path);
    free(b);
    tk_corpus_free(c);
    return -1;
}

static int leb(const unsigned char *b, size_t n, size_t *at, uint64_t *v) {
    *v = 0;
    for (int s = 0; s < 64 && *at < n; s += 7) {
        unsigned char x = b[(*at)++];
        *v |= (uint64_t)(x & 0x7F) << s;
        if (!(x & 0x80)) return 1;
    }
    return 0;
}

int tk_expected_read(const char *path, tk_corpus *c) {
    size_t n, at = 12;
    unsigned char *b = gunzip(path, &n);
    if (!b) return -1;
    if (n < 12 || memcmp(b, "TWKIDS01", 8) || u32(b + 8) != c->n) goto bad;
    c->ids = calloc((size_t)c->n, sizeof *c->ids);
    c->n_ids = calloc((size_t)c->n, sizeof *c->n_ids);
    c->flags = calloc((size_t)c->n, 1);
    if (!c->ids || !c->n_ids || !c->flags) goto bad;
    for (int64_t i = 0; i < c->n; i++) {
        uint64_t k, v;
        if (at >= n) goto bad;
        c->flags[i] = b[at++];
        if (!leb(b, n, &at, &k) || k > n) goto bad;
        c->ids[i] = malloc((k ? k : 1) * sizeof **c->ids);
        if (!c->ids[i]) goto bad;
        c->n_ids[i] = (int64_t)k;
        for (uint64_t j = 0; j < k; j++) {
            if (!leb(b, n, &at, &v) || v > INT32_MAX) goto bad;
            c->ids[i][j] = (int32_t)v;
        }
    }
    free(b);
    return 0;
bad:
    fprintf(stderr, "%s: malformed expected ids\n", path);
    free(b);
    return -1;
}

void tk_corpus_free(tk_corpus *c) {
    for (int64_t i = 0; c->ids && i < c->n; i++) free(c->ids[i]);
    free(c->ids);
    free(c->n_ids);
    free(c->flags);
    free(c->data);
    free(c->off);
    memset(c, 0, sizeof *c);
}
