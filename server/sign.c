/* SHA-256 / HMAC-SHA256 for signed download URLs, and the signing key's file. */
#include "sign.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "futures.h"

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

typedef struct sha256_ctx {
    uint32_t h[8];
    unsigned char buf[64];
    size_t fill;
    uint64_t total;
} sha256_ctx;

static uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void block(sha256_ctx *c, const unsigned char *p) {
    uint32_t w[64], v[8];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(v, c->h, sizeof v);
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = v[7] + (ror(v[4], 6) ^ ror(v[4], 11) ^ ror(v[4], 25)) + ((v[4] & v[5]) ^ (~v[4] & v[6])) + K256[i] + w[i];
        uint32_t t2 = (ror(v[0], 2) ^ ror(v[0], 13) ^ ror(v[0], 22)) + ((v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]));
        memmove(v + 1, v, 7 * sizeof v[0]);
        v[4] += t1;
        v[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++) c->h[i] += v[i];
}

static void sha_init(sha256_ctx *c) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, h0, sizeof h0);
    c->fill = 0;
    c->total = 0;
}

static void sha_update(sha256_ctx *c, const void *msg, size_t n) {
    const unsigned char *p = msg;
    c->total += n;
    while (n) {
        size_t k = 64 - c->fill < n ? 64 - c->fill : n;
        memcpy(c->buf + c->fill, p, k);
        c->fill += k;
        p += k;
        n -= k;
        if (c->fill == 64) {
            block(c, c->buf);
            c->fill = 0;
        }
    }
}

static void sha_final(sha256_ctx *c, unsigned char out[32]) {
    uint64_t bits = c->total * 8;
    unsigned char pad = 0x80, zero = 0, len[8];
    sha_update(c, &pad, 1);
    while (c->fill != 56) sha_update(c, &zero, 1);
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(bits >> (56 - 8 * i));
    sha_update(c, len, 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(c->h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(c->h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(c->h[i] >> 8);
        out[4 * i + 3] = (unsigned char)c->h[i];
    }
}

void twk_sha256(const void *msg, size_t n, unsigned char out[32]) {
    sha256_ctx c;
    sha_init(&c);
    sha_update(&c, msg, n);
    sha_final(&c, out);
}

void twk_hmac_sha256(const unsigned char *key, size_t key_len, const void *msg, size_t n, unsigned char out[32]) {
    unsigned char k[64] = {0}, pad[64], inner[32];
    if (key_len > 64) twk_sha256(key, key_len, k);
    else memcpy(k, key, key_len);
    sha256_ctx c;
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
    sha_init(&c);
    sha_update(&c, pad, 64);
    sha_update(&c, msg, n);
    sha_final(&c, inner);
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
    sha_init(&c);
    sha_update(&c, pad, 64);
    sha_update(&c, inner, 32);
    sha_final(&c, out);
}

void twk_hmac_hex(const unsigned char *key, const char *msg, char out[65]) {
    unsigned char mac[32];
    twk_hmac_sha256(key, TWK_SIGN_KEY_BYTES, msg, strlen(msg), mac);
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", mac[i]);
}

int twk_const_eq(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned diff = (unsigned)(la != lb);
    for (size_t i = 0; i < la && i < lb; i++) diff |= (unsigned)(a[i] ^ b[i]);
    return diff == 0;
}

static int parse_hex_key(const char *txt, unsigned char key[TWK_SIGN_KEY_BYTES]) {
    for (int i = 0; i < TWK_SIGN_KEY_BYTES; i++) {
        unsigned v;
        if (sscanf(txt + 2 * i, "%2x", &v) != 1) return 0;
        key[i] = (unsigned char)v;
    }
    return 1;
}

int twk_sign_key_load(const char *data_dir, unsigned char key[TWK_SIGN_KEY_BYTES], char *err, size_t err_len) {
    char path[1100], tmp[1120], txt[2 * TWK_SIGN_KEY_BYTES + 2] = "";
    snprintf(path, sizeof path, "%s/url_signing.key", data_dir);
    FILE *f = fopen(path, "r");
    if (f) {
        size_t n = fread(txt, 1, sizeof txt - 1, f);
        fclose(f);
        txt[n] = 0;
        if (n < 2 * TWK_SIGN_KEY_BYTES || !parse_hex_key(txt, key)) {
            snprintf(err, err_len, "%s is not 64 hex digits (delete it to make a new key)", path);
            return -1;
        }
        return 0;
    }
    if (errno != ENOENT) {
        snprintf(err, err_len, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    if (twk_random_hex(txt, TWK_SIGN_KEY_BYTES) != 0) {
        snprintf(err, err_len, "no random bytes for the URL signing key");
        return -1;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ssize_t w = fd >= 0 ? write(fd, txt, 2 * TWK_SIGN_KEY_BYTES) : -1;
    int ok = w == 2 * TWK_SIGN_KEY_BYTES && fsync(fd) == 0;
    if (fd >= 0) close(fd);
    if (!ok || rename(tmp, path) != 0) {
        snprintf(err, err_len, "cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return parse_hex_key(txt, key) ? 0 : -1;
}
