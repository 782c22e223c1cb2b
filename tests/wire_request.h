/* Hand-built Tinker wire requests for the C service tests (test_alloc_fail, test_serve_pack): the few
 * protobuf encoders a ForwardBackwardRequest needs, and a JSON string field lookup.
 * Header-only (static functions); define WIRE_TOKENS before including it to size the datum. */
#ifndef TWK_TESTS_WIRE_REQUEST_H
#define TWK_TESTS_WIRE_REQUEST_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifndef WIRE_TOKENS
#define WIRE_TOKENS 8
#endif

static size_t pb_varint(uint8_t *o, uint64_t v) {
    size_t n = 0;
    do {
        o[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    return n;
}

static size_t pb_bytes(uint8_t *o, int field, const void *p, size_t len) {
    size_t n = pb_varint(o, (uint64_t)field << 3 | 2);
    n += pb_varint(o + n, len);
    memcpy(o + n, p, len);
    return n + len;
}

/* TensorData: data (1), dtype (3: 1 float32, 2 int64), shape (4, packed) */
static size_t pb_tensor(uint8_t *o, const void *data, size_t bytes, int dtype, int64_t n) {
    uint8_t shape[16];
    size_t sl = pb_varint(shape, (uint64_t)n), k = pb_bytes(o, 1, data, bytes);
    k += pb_varint(o + k, 3 << 3);
    k += pb_varint(o + k, (uint64_t)dtype);
    return k + pb_bytes(o + k, 4, shape, sl);
}

static size_t pb_entry(uint8_t *o, const char *key, const uint8_t *tensor, size_t tlen) {
    uint8_t e[512];
    size_t k = pb_bytes(e, 1, key, strlen(key));
    k += pb_bytes(e + k, 2, tensor, tlen);
    return pb_bytes(o, 2, e, k);
}

/* ForwardBackwardRequest {model_id 1, seq_id 2, data 3 (one Datum), loss_fn 4 "cross_entropy"}:
 * tokens 1..WIRE_TOKENS, targets 2..WIRE_TOKENS+1, weights 1. Returns the bytes written to o. */
static size_t fb_request(uint8_t *o, const char *model_id, int seq) {
    int32_t tok[WIRE_TOKENS];
    int64_t tgt[WIRE_TOKENS];
    float w[WIRE_TOKENS];
    for (int i = 0; i < WIRE_TOKENS; i++) tok[i] = i + 1, tgt[i] = i + 2, w[i] = 1;
    uint8_t chunk[128], mi[128], datum[1024], t[512];
    size_t cl = pb_bytes(chunk, 1, tok, sizeof tok); /* the chunk's tokens (int32 little-endian) */
    size_t ml = pb_bytes(mi, 1, chunk, cl);          /* ModelInput.chunks */
    size_t dl = pb_bytes(datum, 1, mi, ml);          /* Datum.model_input */
    size_t tl = pb_tensor(t, tgt, sizeof tgt, 2, WIRE_TOKENS);
    dl += pb_entry(datum + dl, "target_tokens", t, tl);
    tl = pb_tensor(t, w, sizeof w, 1, WIRE_TOKENS);
    dl += pb_entry(datum + dl, "weights", t, tl);
    size_t n = pb_bytes(o, 1, model_id, strlen(model_id));
    n += pb_varint(o + n, 2 << 3);
    n += pb_varint(o + n, (uint64_t)seq);
    n += pb_bytes(o + n, 3, datum, dl);
    return n + pb_bytes(o + n, 4, "cross_entropy", 13);
}

/* The string value of "key" in a JSON body into out (empty when absent or longer than len - 1). */
static void json_str(const char *body, const char *key, char *out, size_t len) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":\"", key);
    const char *p = body ? strstr(body, pat) : NULL;
    out[0] = 0;
    if (!p) return;
    p += strlen(pat);
    const char *e = strchr(p, '"');
    if (e && (size_t)(e - p) < len) {
        memcpy(out, p, (size_t)(e - p));
        out[e - p] = 0;
    }
}

#endif
