/* server/wire.c — the Tinker protobuf codec (see wire.h).
 *
 * Decoding: protobuf-c unpacks the ForwardBackwardRequest (schema
 * server/tinker.proto, generated at build time) through an allocator with a
 * byte budget proportional to the input, then every value is validated and
 * copied into the plain twk_wire_* structs, which own all their memory
 * (malloc/free). Before that, a walk over the buffer with the same
 * descriptors finds the first structural fault (truncation, a wrong wire
 * type, a bad varint, an out-of-range field number) and names its field
 * path, which protobuf-c's unpack cannot do.
 *
 * Encoding: the generated structs point straight at the caller's arrays and
 * protobuf-c packs them into a twk_host_alloc buffer. Map entries written by
 * the official (Python/upb) encoder always carry key and value, even when the
 * value is 0.0, whereas protobuf-c drops proto3 defaults inside entries; so
 * the metrics map (the last field of ForwardBackwardOutput) is appended by
 * hand, keeping the bytes identical to the SDK's own serializer. */
#include "wire.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <protobuf-c/protobuf-c.h>

#include "tinker.pb-c.h"
#include "twinkle/hal.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "server/wire.c copies little-endian wire arrays directly; port it for big-endian hosts"
#endif

#define INVALID TWK_ERR_INVALID_ARG

/* ---- small helpers ------------------------------------------------------ */

/* A printable, bounded copy of untrusted text for error messages. */
static const char *shown(const char *s, char buf[72]) {
    size_t i = 0;
    if (!s) s = "";
    for (; s[i] && i < 64; i++) buf[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    if (s[i]) { memcpy(buf + i, "...", 3); i += 3; }
    buf[i] = 0;
    return buf;
}

static const char *dtype_name(int d) {
    switch (d) {
    case TINKER_PUBLIC__DTYPE__DTYPE_UNSPECIFIED: return "DTYPE_UNSPECIFIED";
    case TINKER_PUBLIC__DTYPE__DTYPE_FLOAT32: return "DTYPE_FLOAT32";
    case TINKER_PUBLIC__DTYPE__DTYPE_INT64: return "DTYPE_INT64";
    case TINKER_PUBLIC__DTYPE__DTYPE_INT32: return "DTYPE_INT32";
    case TINKER_PUBLIC__DTYPE__DTYPE_BFLOAT16: return "DTYPE_BFLOAT16";
    default: return "unknown dtype";
    }
}

static char *dup_str(const char *s) {
    size_t n = strlen(s);
    char *d = twk_host_alloc(n + 1, "wire d");
    if (d) memcpy(d, s, n + 1);
    return d;
}

static int64_t rd_i64(const uint8_t *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* ---- protobuf-c allocator with a byte budget ---------------------------- */

typedef struct budget {
    size_t used, cap;
    int exhausted;
    int oom; /* the host allocator failed */
} budget;

static void *budget_alloc(void *user, size_t n) {
    budget *b = user;
    if (n > b->cap - b->used) {
        b->exhausted = 1;
        return NULL;
    }
    void *p = twk_host_alloc(n ? n : 1, "decoded protobuf");
    if (p) b->used += n;
    else b->oom = 1;
    return p;
}

static void budget_free(void *user, void *p) {
    (void)user;
    twk_host_free(p);
}

/* ---- structural walk: the first wire-level fault, with its field path ---- */

typedef struct wpath {
    char s[320];
    size_t n;
} wpath;

static size_t wp_push(wpath *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static size_t wp_push(wpath *p, const char *fmt, ...) {
    size_t old = p->n;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(p->s + p->n, sizeof p->s - p->n, fmt, ap);
    va_end(ap);
    if (k > 0) p->n += (size_t)k < sizeof p->s - p->n ? (size_t)k : sizeof p->s - 1 - p->n;
    return old;
}

static void wp_pop(wpath *p, size_t old) {
    p->n = old;
    p->s[old] = 0;
}

static int diag_fail(const wpath *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int diag_fail(const wpath *p, const char *fmt, ...) {
    char detail[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    twk_error(INVALID, "%s: %s", p->n ? p->s : "request", detail);
    return 1;
}

/* Reads a varint of at most `max` bytes; 0 if unterminated within n/max. */
static size_t rd_varint(const uint8_t *b, size_t n, size_t max, uint64_t *v) {
    uint64_t x = 0;
    for (size_t i = 0; i < n && i < max; i++) {
        x |= (uint64_t)(b[i] & 0x7f) << (7 * i);
        if (!(b[i] & 0x80)) {
            *v = x;
            return i + 1;
        }
    }
    return 0;
}

static int wire_type_of(ProtobufCType t) {
    switch (t) {
    case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_BOOL: case PROTOBUF_C_TYPE_ENUM:
        return 0;
    case PROTOBUF_C_TYPE_FIXED64: case PROTOBUF_C_TYPE_SFIXED64: case PROTOBUF_C_TYPE_DOUBLE:
        return 1;
    case PROTOBUF_C_TYPE_FIXED32: case PROTOBUF_C_TYPE_SFIXED32: case PROTOBUF_C_TYPE_FLOAT:
        return 5;
    default:
        return 2;
    }
}

static const char *wire_type_name(unsigned wt) {
    static const char *const names[8] = {"varint", "fixed64", "length-delimited", "start-group",
                                         "end-group", "fixed32", "invalid (6)", "invalid (7)"};
    return names[wt & 7];
}

static int is_map_entry(const ProtobufCMessageDescriptor *d) {
    size_t n = strlen(d->name);
    return d->n_fields == 2 && n > 5 && !strcmp(d->name + n - 5, "Entry") && d->fields[0].id == 1 &&
           !strcmp(d->fields[0].name, "key");
}

/* The key of a serialized map entry (last occurrence), for naming the path. */
static int map_entry_key(const uint8_t *b, size_t n, char out[72]) {
    size_t pos = 0;
    int found = 0;
    while (pos < n) {
        uint64_t tag, v;
        size_t u = rd_varint(b + pos, n - pos, 5, &tag);
        if (!u) break;
        pos += u;
        unsigned wt = (unsigned)(tag & 7);
        if (wt == 0) {
            if (!(u = rd_varint(b + pos, n - pos, 10, &v))) break;
            pos += u;
        } else if (wt == 1 || wt == 5) {
            size_t w = wt == 1 ? 8 : 4;
            if (n - pos < w) break;
            pos += w;
        } else if (wt == 2) {
            if (!(u = rd_varint(b + pos, n - pos, 5, &v)) || v > n - pos - u) break;
            pos += u;
            if ((tag >> 3) == 1) {
                size_t k = v < 64 ? (size_t)v : 64, i;
                for (i = 0; i < k; i++) out[i] = (b[pos + i] >= 0x20 && b[pos + i] < 0x7f) ? (char)b[pos + i] : '?';
                if (v > 64) { memcpy(out + i, "...", 3); i += 3; }
                out[i] = 0;
                found = 1;
            }
            pos += (size_t)v;
        } else {
            break;
        }
    }
    return found;
}

/* Walks one message; 1 (with the error set) at the first fault, else 0. */
static int wire_diag(const ProtobufCMessageDescriptor *d, const uint8_t *b, size_t n, wpath *path, int depth) {
    unsigned counts[32] = {0};
    size_t pos = 0;
    int in_entry = is_map_entry(d);
    if (depth > 32) return diag_fail(path, "nested too deeply");
    while (pos < n) {
        uint64_t tag, v;
        size_t u = rd_varint(b + pos, n - pos, 5, &tag);
        if (!u) return diag_fail(path, "truncated or malformed field tag at byte %zu", pos);
        uint64_t num = tag >> 3;
        unsigned wt = (unsigned)(tag & 7);
        if (num == 0 || num > 0x1fffffff)
            return diag_fail(path, "field number %llu out of range at byte %zu", (unsigned long long)num, pos);
        pos += u;
        const ProtobufCFieldDescriptor *f =
            num <= UINT_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)num) : NULL;
        size_t mark;
        if (!f)
            mark = wp_push(path, "%s#%llu", path->n ? "." : "", (unsigned long long)num);
        else if (in_entry && f->id == 2)
            mark = path->n; /* map value: the path already says [key] */
        else
            mark = wp_push(path, "%s%s", path->n ? "." : "", f->name);

        const uint8_t *payload = b + pos;
        size_t plen = 0;
        switch (wt) {
        case 0:
            if (!(u = rd_varint(b + pos, n - pos, 10, &v)))
                return diag_fail(path, "truncated or overlong varint at byte %zu", pos);
            pos += u;
            break;
        case 1:
        case 5:
            plen = wt == 1 ? 8 : 4;
            if (n - pos < plen)
                return diag_fail(path, "truncated: %zu-byte value with %zu bytes left", plen, n - pos);
            pos += plen;
            break;
        case 2:
            if (!(u = rd_varint(b + pos, n - pos, 5, &v)))
                return diag_fail(path, "truncated or malformed length at byte %zu", pos);
            if (v > INT_MAX) return diag_fail(path, "length %llu too large", (unsigned long long)v);
            if (v > n - pos - u) {
                if (f && f->type == PROTOBUF_C_TYPE_MESSAGE && f->label == PROTOBUF_C_LABEL_REPEATED &&
                    (size_t)(f - d->fields) < 32)
                    wp_push(path, "[%u]", counts[f - d->fields]);
                return diag_fail(path, "truncated: length %llu with %zu bytes left", (unsigned long long)v,
                                 n - pos - u);
            }
            pos += u;
            payload = b + pos;
            plen = (size_t)v;
            pos += plen;
            break;
        default:
            return diag_fail(path, "wire type %u (%s) is not supported", wt, wire_type_name(wt));
        }
        if (f) {
            int want = wire_type_of(f->type);
            int packable = want != 2;
            int packed = f->label == PROTOBUF_C_LABEL_REPEATED && packable && wt == 2;
            if ((int)wt != want && !packed && f->type != PROTOBUF_C_TYPE_BOOL)
                return diag_fail(path, "wire type %u (%s), expected %d (%s)", wt, wire_type_name(wt), want,
                                 wire_type_name((unsigned)want));
            if (packed) {
                if (want == 1 || want == 5) {
                    if (plen % (want == 1 ? 8 : 4))
                        return diag_fail(path, "packed length %zu not a multiple of %d", plen, want == 1 ? 8 : 4);
                } else {
                    for (size_t q = 0; q < plen;) {
                        if (!(u = rd_varint(payload + q, plen - q, 10, &v)))
                            return diag_fail(path, "packed varint truncated or overlong at byte %zu", q);
                        q += u;
                    }
                }
            }
            if (f->type == PROTOBUF_C_TYPE_MESSAGE && wt == 2) {
                const ProtobufCMessageDescriptor *sub = f->descriptor;
                unsigned idx = (unsigned)(f - d->fields) < 32 ? counts[f - d->fields]++ : 0;
                size_t m2 = path->n;
                if (f->label == PROTOBUF_C_LABEL_REPEATED) {
                    char key[72];
                    if (is_map_entry(sub) && map_entry_key(payload, plen, key))
                        wp_push(path, "[%s]", key);
                    else
                        wp_push(path, "[%u]", idx);
                }
                if (wire_diag(sub, payload, plen, path, depth + 1)) return 1;
                wp_pop(path, m2);
            }
        }
        wp_pop(path, mark);
    }
    return 0;
}

/* ---- request conversion ------------------------------------------------- */

static twk_status conv_tensor(const TinkerPublic__Tensor *t, const char *path, twk_wire_tensor *out,
                              int64_t *sparse_left) {
    int dtype = (int)t->dtype;
    size_t item;
    if (dtype == TINKER_PUBLIC__DTYPE__DTYPE_FLOAT32) {
        out->dtype = TWK_WIRE_F32;
        item = 4;
    } else if (dtype == TINKER_PUBLIC__DTYPE__DTYPE_INT64) {
        out->dtype = TWK_WIRE_I64;
        item = 8;
    } else {
        return twk_error(INVALID, "%s.dtype: %s (%d) is not supported (want DTYPE_FLOAT32 or DTYPE_INT64)", path,
                         dtype_name(dtype), dtype);
    }
    int sparse = t->encoding_case == TINKER_PUBLIC__TENSOR__ENCODING_SPARSE_CSR;
    /* proto3 drops empty bytes, so "no encoding" is an empty dense tensor */
    size_t dense_len = t->encoding_case == TINKER_PUBLIC__TENSOR__ENCODING_DENSE ? t->dense.len : 0;

    if (t->n_shape > 2) return twk_error(INVALID, "%s.shape: %zu dims, want 1 or 2", path, t->n_shape);
    if (t->n_shape == 0) {
        if (sparse) return twk_error(INVALID, "%s.shape: required for sparse_csr", path);
        if (dense_len % item)
            return twk_error(INVALID, "%s: dense bytes %zu not a multiple of %zu", path, dense_len, item);
        out->ndim = 1; /* the SDK always sends a shape; a bare list is 1-D */
        out->shape[0] = (int64_t)(dense_len / item);
    } else {
        out->ndim = (int)t->n_shape;
        for (int i = 0; i < out->ndim; i++) {
            if (t->shape[i] < 0) return twk_error(INVALID, "%s.shape[%d]: %lld is negative", path, i, (long long)t->shape[i]);
            if (t->shape[i] > TWK_WIRE_MAX_TENSOR_ELEMS) /* also with a 0 in the other dim */
                return twk_error(INVALID, "%s.shape[%d]: %lld is more than 2^31", path, i, (long long)t->shape[i]);
            out->shape[i] = t->shape[i];
        }
    }
    int64_t nel = out->shape[0];
    if (out->ndim == 2) {
        if (out->shape[0] && out->shape[1] > TWK_WIRE_MAX_TENSOR_ELEMS / out->shape[0])
            return twk_error(INVALID, "%s.shape: [%lld, %lld] has more than 2^31 elements", path,
                             (long long)out->shape[0], (long long)out->shape[1]);
        nel = out->shape[0] * out->shape[1];
    }
    if (nel > TWK_WIRE_MAX_TENSOR_ELEMS)
        return twk_error(INVALID, "%s.shape: [%lld] has more than 2^31 elements", path, (long long)nel);
    out->n = nel;

    if (!sparse) {
        if (dense_len % item)
            return twk_error(INVALID, "%s: dense bytes %zu not a multiple of %zu", path, dense_len, item);
        if ((int64_t)(dense_len / item) != nel)
            return twk_error(INVALID, "%s: dense bytes %zu hold %zu elements, shape needs %lld", path, dense_len,
                             dense_len / item, (long long)nel);
        out->data = twk_host_alloc(dense_len ? dense_len : 1, "wire data");
        if (!out->data) return twk_error(TWK_ERR_OOM, "%s: out of memory (%zu bytes)", path, dense_len);
        if (dense_len) memcpy(out->data, t->dense.data, dense_len);
        return TWK_OK;
    }

    /* sparse CSR, densified with 0 (the SDK's default pad_value) */
    const TinkerPublic__SparseCsr *c = t->sparse_csr;
    if (out->ndim != 2) return twk_error(INVALID, "%s.shape: sparse_csr needs a 2-D shape", path);
    int64_t rows = out->shape[0], cols = out->shape[1];
    size_t crow_len = c ? c->crow_indices.len : 0, col_len = c ? c->col_indices.len : 0;
    size_t val_len = c ? c->values.len : 0;
    if (crow_len % 8) return twk_error(INVALID, "%s.sparse_csr.crow_indices: %zu bytes not a multiple of 8", path, crow_len);
    if ((int64_t)(crow_len / 8) != rows + 1)
        return twk_error(INVALID, "%s.sparse_csr.crow_indices: %zu entries, want rows + 1 = %lld", path, crow_len / 8,
                         (long long)(rows + 1));
    if (col_len % 8) return twk_error(INVALID, "%s.sparse_csr.col_indices: %zu bytes not a multiple of 8", path, col_len);
    int64_t nnz = (int64_t)(col_len / 8);
    if (val_len % item)
        return twk_error(INVALID, "%s.sparse_csr.values: %zu bytes not a multiple of %zu", path, val_len, item);
    if ((int64_t)(val_len / item) != nnz)
        return twk_error(INVALID, "%s.sparse_csr.values: %zu values for %lld column indices", path, val_len / item,
                         (long long)nnz);
    if (nnz > nel) return twk_error(INVALID, "%s.sparse_csr: %lld entries for %lld elements", path, (long long)nnz, (long long)nel);
    const uint8_t *crow = c->crow_indices.data, *col = c->col_indices.data, *val = c->values.data;
    if (rd_i64(crow) != 0)
        return twk_error(INVALID, "%s.sparse_csr.crow_indices[0]: %lld, want 0", path, (long long)rd_i64(crow));
    for (int64_t r = 0; r < rows; r++) {
        int64_t a = rd_i64(crow + 8 * r), z = rd_i64(crow + 8 * (r + 1));
        if (z < a || z > nnz)
            return twk_error(INVALID, "%s.sparse_csr.crow_indices[%lld]: %lld after %lld is not monotone within [0, %lld]",
                             path, (long long)(r + 1), (long long)z, (long long)a, (long long)nnz);
    }
    if (rd_i64(crow + 8 * rows) != nnz)
        return twk_error(INVALID, "%s.sparse_csr.crow_indices[%lld]: %lld, want nnz = %lld", path, (long long)rows,
                         (long long)rd_i64(crow + 8 * rows), (long long)nnz);
    for (int64_t r = 0; r < rows; r++) {
        int64_t a = rd_i64(crow + 8 * r), z = rd_i64(crow + 8 * (r + 1)), prev = -1;
        for (int64_t e = a; e < z; e++) {
            int64_t j = rd_i64(col + 8 * e);
            if (j < 0 || j >= cols)
                return twk_error(INVALID, "%s.sparse_csr.col_indices[%lld]: %lld out of range [0, %lld) in row %lld", path,
                                 (long long)e, (long long)j, (long long)cols, (long long)r);
            if (j <= prev)
                return twk_error(INVALID, "%s.sparse_csr.col_indices[%lld]: %lld not increasing within row %lld", path,
                                 (long long)e, (long long)j, (long long)r);
            prev = j;
        }
    }
    if (nel > *sparse_left)
        return twk_error(INVALID, "%s: densified sparse tensors exceed %lld elements per request", path,
                         (long long)TWK_WIRE_MAX_SPARSE_ELEMS);
    *sparse_left -= nel;
    out->data = twk_host_calloc((size_t)(nel ? (size_t)nel : 1) * (item), "wire data");
    if (!out->data) return twk_error(TWK_ERR_OOM, "%s: out of memory densifying %lld elements", path, (long long)nel);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t e = rd_i64(crow + 8 * r), z = rd_i64(crow + 8 * (r + 1)); e < z; e++)
            memcpy((uint8_t *)out->data + (size_t)(r * cols + rd_i64(col + 8 * e)) * item, val + (size_t)e * item, item);
    return TWK_OK;
}

/* Provenance spans of one datum field (model_input_spans: which = 0, loss_fn_input_spans: 1). */
static twk_status conv_spans(TinkerPublic__ProvenanceSpan *const *in, size_t n, int i, int which, twk_wire_datum *d) {
    static const char *const field[2] = {"model_input_spans", "loss_fn_input_spans"};
    if (n > INT_MAX) return twk_error(INVALID, "data[%d].%s: too many spans", i, field[which]);
    if (!n) return TWK_OK;
    d->spans[which] = twk_host_calloc((size_t)n * sizeof *d->spans[which], "wire spans");
    if (!d->spans[which]) return twk_error(TWK_ERR_OOM, "data[%d].%s: out of memory", i, field[which]);
    for (size_t j = 0; j < n; j++) {
        const TinkerPublic__ProvenanceSpan *sp = in[j];
        const char *id = NULL;
        int64_t off = 0, len = 0;
        int sampled = sp->span_case == TINKER_PUBLIC__PROVENANCE_SPAN__SPAN_SAMPLED_TOKENS;
        if (sampled) id = sp->sampled_tokens->sequence_id, off = sp->sampled_tokens->offset, len = sp->sampled_tokens->length;
        else if (sp->span_case == TINKER_PUBLIC__PROVENANCE_SPAN__SPAN_PROMPT_TOKENS)
            id = sp->prompt_tokens->sequence_id, off = sp->prompt_tokens->offset, len = sp->prompt_tokens->length;
        else return twk_error(INVALID, "data[%d].%s[%zu]: empty span (neither prompt_tokens nor sampled_tokens)", i, field[which], j);
        if (!id || !*id || off < 0 || len < 0)
            return twk_error(INVALID, "data[%d].%s[%zu]: needs a sequence_id, offset >= 0 and length >= 0", i,
                             field[which], j);
        twk_wire_span *o = &d->spans[which][d->n_spans[which]++];
        o->sampled = sampled;
        o->offset = off;
        o->length = len;
        o->sequence_id = dup_str(id);
        if (!o->sequence_id) return twk_error(TWK_ERR_OOM, "data[%d].%s: out of memory", i, field[which]);
    }
    return TWK_OK;
}

static twk_status conv_datum(const TinkerPublic__Datum *m, int i, twk_wire_datum *d, int64_t *sparse_left) {
    char path[160], kb[72];
    int64_t total = 0;
    for (size_t j = 0; j < m->n_model_input; j++) {
        const TinkerPublic__Chunk *c = m->model_input[j];
        switch (c->chunk_case) {
        case TINKER_PUBLIC__CHUNK__CHUNK_ENCODED_TEXT:
            if (c->encoded_text->tokens.len % 4)
                return twk_error(INVALID, "data[%d].model_input[%zu].encoded_text.tokens: %zu bytes not a multiple of 4",
                                 i, j, c->encoded_text->tokens.len);
            total += (int64_t)(c->encoded_text->tokens.len / 4);
            break;
        case TINKER_PUBLIC__CHUNK__CHUNK_IMAGE:
            return twk_error(TWK_ERR_UNSUPPORTED, "data[%d].model_input[%zu]: image chunks are not supported", i, j);
        case TINKER_PUBLIC__CHUNK__CHUNK_DMEL:
            return twk_error(TWK_ERR_UNSUPPORTED, "data[%d].model_input[%zu]: dmel (audio) chunks are not supported", i, j);
        default:
            return twk_error(INVALID, "data[%d].model_input[%zu]: empty chunk (no encoded_text)", i, j);
        }
    }
    if (total < 1) return twk_error(INVALID, "data[%d].model_input: no tokens", i);
    d->tokens = twk_host_alloc((size_t)total * sizeof(int32_t), "wire tokens");
    if (!d->tokens) return twk_error(TWK_ERR_OOM, "data[%d].model_input: out of memory (%lld tokens)", i, (long long)total);
    for (size_t j = 0; j < m->n_model_input; j++) {
        const ProtobufCBinaryData *tk = &m->model_input[j]->encoded_text->tokens;
        if (tk->len) memcpy(d->tokens + d->n_tokens, tk->data, tk->len);
        d->n_tokens += (int64_t)(tk->len / 4);
    }

    if (m->n_loss_fn_inputs > INT_MAX) return twk_error(INVALID, "data[%d].loss_fn_inputs: too many entries", i);
    d->inputs = twk_host_calloc((size_t)(m->n_loss_fn_inputs ? m->n_loss_fn_inputs : 1) * (sizeof *d->inputs), "wire inputs");
    if (!d->inputs) return twk_error(TWK_ERR_OOM, "data[%d].loss_fn_inputs: out of memory", i);
    for (size_t j = 0; j < m->n_loss_fn_inputs; j++) {
        const TinkerPublic__Datum__LossFnInputsEntry *e = m->loss_fn_inputs[j];
        const char *key = e->key ? e->key : "";
        snprintf(path, sizeof path, "data[%d].loss_fn_inputs[%s]", i, shown(key, kb));
        twk_wire_tensor t = {0};
        TinkerPublic__Tensor empty; /* a missing value is the default Tensor */
        tinker_public__tensor__init(&empty);
        twk_status s = conv_tensor(e->value ? e->value : &empty, path, &t, sparse_left);
        if (s != TWK_OK) {
            twk_host_free(t.data);
            return s;
        }
        /* duplicate keys: the last one wins, as in every protobuf map */
        int k = 0;
        while (k < d->n_inputs && strcmp(d->inputs[k].key, key)) k++;
        if (k < d->n_inputs) {
            twk_host_free(d->inputs[k].t.data);
            d->inputs[k].t = t;
            continue;
        }
        d->inputs[k].key = dup_str(key);
        if (!d->inputs[k].key) {
            twk_host_free(t.data);
            return twk_error(TWK_ERR_OOM, "%s: out of memory", path);
        }
        d->inputs[k].t = t;
        d->n_inputs++;
    }
    twk_status s = conv_spans(m->model_input_spans, m->n_model_input_spans, i, 0, d);
    return s == TWK_OK ? conv_spans(m->loss_fn_input_spans, m->n_loss_fn_input_spans, i, 1, d) : s;
}

static twk_status put_config(twk_wire_fb_request *r, const char *key, double v, const char *field) {
    char kb[72];
    for (int k = 0; k < r->n_config; k++)
        if (!strcmp(r->config[k].key, key)) {
            r->config[k].value = v;
            return TWK_OK;
        }
    r->config[r->n_config].key = dup_str(key);
    if (!r->config[r->n_config].key) return twk_error(TWK_ERR_OOM, "%s[%s]: out of memory", field, shown(key, kb));
    r->config[r->n_config++].value = v;
    return TWK_OK;
}

static twk_status conv_request(const TinkerPublic__ForwardBackwardRequest *m, twk_wire_fb_request *r) {
    char kb[72];
    if (!m->model_id || !m->model_id[0]) return twk_error(INVALID, "model_id: missing");
    if (strchr(m->model_id, '/'))
        return twk_error(INVALID, "model_id: '%s' contains '/'", shown(m->model_id, kb));
    if (!m->loss_fn || !m->loss_fn[0]) return twk_error(INVALID, "loss_fn: missing");
    if (m->n_data == 0) return twk_error(INVALID, "data: no datums");
    if (m->n_data > INT_MAX) return twk_error(INVALID, "data: too many datums (%zu)", m->n_data);
    if (!(r->model_id = dup_str(m->model_id)) || !(r->loss_fn = dup_str(m->loss_fn)))
        return twk_error(TWK_ERR_OOM, "request: out of memory");
    r->seq_id = m->seq_id;
    r->forward_only = m->forward_only ? 1 : 0;

    size_t nc = m->n_loss_fn_config + m->n_loss_fn_config_v2;
    if (nc > INT_MAX) return twk_error(INVALID, "loss_fn_config: too many entries");
    r->config = twk_host_calloc((size_t)(nc ? nc : 1) * (sizeof *r->config), "wire config");
    if (!r->config) return twk_error(TWK_ERR_OOM, "loss_fn_config: out of memory");
    for (size_t j = 0; j < m->n_loss_fn_config; j++) {
        const TinkerPublic__ForwardBackwardRequest__LossFnConfigEntry *e = m->loss_fn_config[j];
        twk_status s = put_config(r, e->key ? e->key : "", e->value, "loss_fn_config");
        if (s != TWK_OK) return s;
    }
    /* v2 mirrors the numeric entries of field 5 and wins where both are set */
    for (size_t j = 0; j < m->n_loss_fn_config_v2; j++) {
        const TinkerPublic__ForwardBackwardRequest__LossFnConfigV2Entry *e = m->loss_fn_config_v2[j];
        if (!e->value || e->value->value_case != TINKER_PUBLIC__LOSS_CONFIG_VALUE__VALUE_NUMBER) continue;
        twk_status s = put_config(r, e->key ? e->key : "", e->value->number, "loss_fn_config_v2");
        if (s != TWK_OK) return s;
    }

    r->data = twk_host_calloc((size_t)m->n_data * sizeof *r->data, "wire data");
    if (!r->data) return twk_error(TWK_ERR_OOM, "data: out of memory (%zu datums)", m->n_data);
    int64_t sparse_left = TWK_WIRE_MAX_SPARSE_ELEMS;
    for (size_t i = 0; i < m->n_data; i++) {
        r->n_data = (int)i + 1; /* so that free() sees the partly built datum */
        twk_status s = conv_datum(m->data[i], (int)i, &r->data[i], &sparse_left);
        if (s != TWK_OK) return s;
    }
    return TWK_OK;
}

static twk_status decode_fb_request(const uint8_t *buf, size_t len, twk_wire_fb_request **out) {
    if (!out) return twk_error(INVALID, "twk_wire_decode_fb_request: out is NULL");
    *out = NULL;
    if (!buf && len) return twk_error(INVALID, "twk_wire_decode_fb_request: buf is NULL");
    if (len > INT_MAX) return twk_error(INVALID, "request: %zu bytes exceeds the 2 GiB protobuf limit", len);
    static const uint8_t none[1] = {0};
    if (!buf) buf = none;

    /* protobuf-c allocates a struct per message and copies bytes/strings.
     * Measured with protobuf-c 1.4.1: ~11 bytes per input byte for a stream
     * of the smallest valid datums, up to ~69 for a stream of empty Datum
     * messages (invalid anyway); the budget refuses such floods */
    /* structural check first: names the faulty field, and keeps field
     * numbers above 2^29 - 1 away from protobuf-c 1.4/1.5, whose tag parser
     * shifts them into int overflow (UBSan) */
    wpath path = {{0}, 0};
    if (wire_diag(&tinker_public__forward_backward_request__descriptor, buf, len, &path, 0)) return INVALID;
    budget b = {0, len < (SIZE_MAX >> 7) ? 64 * len + ((size_t)1 << 20) : SIZE_MAX, 0, 0};
    ProtobufCAllocator alloc = {budget_alloc, budget_free, &b};
    TinkerPublic__ForwardBackwardRequest *m = tinker_public__forward_backward_request__unpack(&alloc, len, buf);
    if (!m) {
        if (b.oom) return twk_error(TWK_ERR_OOM, "request: out of memory decoding ForwardBackwardRequest");
        if (b.exhausted)
            return twk_error(INVALID, "request: decoding needs more than %zu bytes of memory (limit for %zu input bytes)",
                             b.cap, len);
        return twk_error(INVALID, "request: malformed protobuf ForwardBackwardRequest");
    }

    twk_wire_fb_request *r = twk_host_calloc(sizeof *r, "wire r");
    twk_status s = r ? conv_request(m, r) : twk_error(TWK_ERR_OOM, "request: out of memory");
    tinker_public__forward_backward_request__free_unpacked(m, &alloc);
    if (s != TWK_OK) {
        twk_wire_fb_request_free(r);
        return s;
    }
    *out = r;
    return TWK_OK;
}

void twk_wire_fb_request_free(twk_wire_fb_request *r) {
    if (!r) return;
    for (int i = 0; r->data && i < r->n_data; i++) {
        twk_wire_datum *d = &r->data[i];
        for (int k = 0; d->inputs && k < d->n_inputs; k++) {
            twk_host_free(d->inputs[k].key);
            twk_host_free(d->inputs[k].t.data);
        }
        for (int w = 0; w < 2; w++) {
            for (int k = 0; d->spans[w] && k < d->n_spans[w]; k++) twk_host_free(d->spans[w][k].sequence_id);
            twk_host_free(d->spans[w]);
        }
        twk_host_free(d->inputs);
        twk_host_free(d->tokens);
    }
    twk_host_free(r->data);
    for (int k = 0; r->config && k < r->n_config; k++) twk_host_free(r->config[k].key);
    twk_host_free(r->config);
    twk_host_free(r->model_id);
    twk_host_free(r->loss_fn);
    twk_host_free(r);
}

const twk_wire_tensor *twk_wire_datum_input(const twk_wire_datum *d, const char *key) {
    if (!d || !key) return NULL;
    for (int k = 0; k < d->n_inputs; k++)
        if (!strcmp(d->inputs[k].key, key)) return &d->inputs[k].t;
    return NULL;
}

/* ---- encoders ----------------------------------------------------------- */

/* protobuf-c's generated structs take non-const data; nothing is written.
 * Empty arrays get a valid pointer: protobuf-c memcpy()s even 0 bytes of a
 * present oneof member, and memcpy from NULL is undefined. */
static uint8_t *as_bytes(const void *p) {
    static uint8_t none[1];
    return p ? (uint8_t *)(uintptr_t)p : none;
}

/* Packs `m` plus `extra` hand-encoded trailing bytes into a host buffer. */
static twk_status pack_out(const ProtobufCMessage *m, const uint8_t *extra, size_t extra_len, const char *what,
                           uint8_t **out, size_t *out_len) {
    size_t n = protobuf_c_message_get_packed_size(m);
    if (n > (size_t)INT_MAX || extra_len > (size_t)INT_MAX - n)
        return twk_error(INVALID, "%s: encoded message exceeds the 2 GiB protobuf limit", what);
    uint8_t *buf = twk_host_alloc(n + extra_len ? n + extra_len : 1, what);
    if (!buf) return TWK_ERR_OOM;
    size_t w = protobuf_c_message_pack(m, buf);
    if (w != n) {
        twk_host_free(buf);
        return twk_error(TWK_ERR_STATE, "%s: protobuf-c packed %zu bytes, expected %zu", what, w, n);
    }
    if (extra_len) memcpy(buf + n, extra, extra_len);
    *out = buf;
    *out_len = n + extra_len;
    return TWK_OK;
}

static size_t put_varint(uint8_t *p, uint64_t v) {
    size_t i = 0;
    while (v >= 0x80) {
        p[i++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[i++] = (uint8_t)v;
    return i;
}

static size_t varint_len(uint64_t v) {
    size_t i = 1;
    while (v >= 0x80) { v >>= 7; i++; }
    return i;
}

static twk_status encode_fb_output(int n_datums, const twk_wire_field *fields, int n_fields,
                                   const char *const *metric_keys, const double *metric_values, int n_metrics,
                                   uint8_t **out, size_t *out_len) {
    static const char *W = "twk_wire_encode_fb_output";
    if (!out || !out_len) return twk_error(INVALID, "%s: out is NULL", W);
    *out = NULL;
    *out_len = 0;
    if (n_datums < 0 || n_fields < 0 || n_metrics < 0)
        return twk_error(INVALID, "%s: negative count (datums %d, fields %d, metrics %d)", W, n_datums, n_fields, n_metrics);
    if ((n_fields && !fields) || (n_metrics && (!metric_keys || !metric_values)))
        return twk_error(INVALID, "%s: NULL fields or metrics", W);

    /* metrics, hand-encoded: 1a len { 0a klen key  11 <double> } per entry */
    size_t mlen = 0;
    for (int i = 0; i < n_metrics; i++) {
        const char *k = metric_keys[i];
        if (!k) return twk_error(INVALID, "%s: metrics[%d] key is NULL", W, i);
        const char *c = strchr(k, ':');
        char kb[72];
        if (!c || c == k || strchr(c + 1, ':') || !c[1])
            return twk_error(INVALID, "%s: metrics[%s]: key must be name:reduction with exactly one ':'", W, shown(k, kb));
        for (int j = 0; j < i; j++)
            if (!strcmp(metric_keys[j], k)) return twk_error(INVALID, "%s: metrics[%s]: duplicate key", W, shown(k, kb));
        size_t kl = strlen(k);
        if (kl > (size_t)INT_MAX / 2) return twk_error(INVALID, "%s: metrics[%d]: key too long", W, i);
        size_t el = 1 + varint_len(kl) + kl + 9;
        mlen += 1 + varint_len(el) + el;
        if (mlen > (size_t)INT_MAX) return twk_error(INVALID, "%s: metrics exceed the 2 GiB protobuf limit", W);
    }

    if ((size_t)n_datums + 1 > SIZE_MAX / sizeof(int64_t) / ((size_t)n_fields + 1))
        return twk_error(INVALID, "%s: %d datums x %d fields is too large", W, n_datums, n_fields);
    twk_status st = TWK_OK;
    TinkerPublic__ArrayRecord rec;
    tinker_public__array_record__init(&rec);
    TinkerPublic__ArrayRecord *recs[1] = {&rec};
    TinkerPublic__ArrayRecord__FieldsEntry *ent = twk_host_calloc((size_t)((size_t)n_fields + 1) * (sizeof *ent), "wire ent");
    TinkerPublic__ArrayRecord__FieldsEntry **entp = twk_host_calloc((size_t)((size_t)n_fields + 1) * (sizeof *entp), "wire entp");
    TinkerPublic__BatchedTensor *bt = twk_host_calloc((size_t)((size_t)n_fields + 1) * (sizeof *bt), "wire bt");
    int64_t *offs = twk_host_calloc((size_t)(((size_t)n_datums + 1) * ((size_t)n_fields + 1)) * (sizeof *offs), "wire offs");
    uint8_t *mbuf = twk_host_alloc(mlen ? mlen : 1, "wire mbuf");
    if (!ent || !entp || !bt || !offs || !mbuf) {
        st = twk_error(TWK_ERR_OOM, "%s: out of memory", W);
        goto done;
    }
    for (int f = 0; f < n_fields; f++) {
        const twk_wire_field *fl = &fields[f];
        char kb[72];
        if (!fl->name || !fl->name[0]) {
            st = twk_error(INVALID, "%s: fields[%d]: empty name", W, f);
            goto done;
        }
        for (int j = 0; j < f; j++)
            if (!strcmp(fields[j].name, fl->name)) {
                st = twk_error(INVALID, "%s: fields[%s]: duplicate name", W, shown(fl->name, kb));
                goto done;
            }
        if (fl->trailing < 0 || !fl->offsets) {
            st = twk_error(INVALID, "%s: fields[%s]: %s", W, shown(fl->name, kb),
                           fl->offsets ? "negative trailing size" : "offsets is NULL");
            goto done;
        }
        int64_t o0 = fl->offsets[0];
        int64_t *bo = offs + (size_t)f * ((size_t)n_datums + 1);
        if (o0 < 0) {
            st = twk_error(INVALID, "%s: fields[%s].offsets[0]: %lld is negative", W, shown(fl->name, kb), (long long)o0);
            goto done;
        }
        for (int i = 0; i <= n_datums; i++) {
            int64_t o = fl->offsets[i];
            if (i && (o < fl->offsets[i - 1] || o - o0 > (int64_t)INT_MAX / 4)) {
                st = twk_error(INVALID, "%s: fields[%s].offsets[%d]: %lld %s", W, shown(fl->name, kb), i, (long long)o,
                               o < fl->offsets[i - 1] ? "decreases" : "exceeds the 2 GiB protobuf limit");
                goto done;
            }
            if (i && fl->trailing > 0 && (o - fl->offsets[i - 1]) % fl->trailing) {
                st = twk_error(INVALID, "%s: fields[%s]: datum %d has %lld elements, not a multiple of trailing %lld", W,
                               shown(fl->name, kb), i - 1, (long long)(o - fl->offsets[i - 1]), (long long)fl->trailing);
                goto done;
            }
            bo[i] = (o - o0) * 4; /* byte offsets on the wire */
        }
        size_t nbytes = (size_t)bo[n_datums];
        if (nbytes && !fl->data) {
            st = twk_error(INVALID, "%s: fields[%s]: data is NULL", W, shown(fl->name, kb));
            goto done;
        }
        tinker_public__batched_tensor__init(&bt[f]);
        bt[f].data.len = nbytes;
        bt[f].data.data = as_bytes(nbytes ? fl->data + o0 : NULL);
        bt[f].offsets.len = ((size_t)n_datums + 1) * 8;
        bt[f].offsets.data = (uint8_t *)bo;
        bt[f].dtype = TINKER_PUBLIC__DTYPE__DTYPE_FLOAT32;
        if (fl->trailing > 0) {
            bt[f].n_trailing_shape = 1;
            bt[f].trailing_shape = (int64_t *)(uintptr_t)&fl->trailing;
        }
        tinker_public__array_record__fields_entry__init(&ent[f]);
        ent[f].key = (char *)(uintptr_t)fl->name;
        ent[f].value = &bt[f];
        entp[f] = &ent[f];
    }
    rec.type_tag = "ArrayRecord";
    rec.n_fields = (size_t)n_fields;
    rec.fields = entp;
    rec.num_datums = n_datums;

    TinkerPublic__ForwardBackwardOutput msg;
    tinker_public__forward_backward_output__init(&msg);
    msg.loss_fn_output_type = "ArrayRecord";
    msg.n_loss_fn_outputs = 1;
    msg.loss_fn_outputs = recs;

    size_t w = 0;
    for (int i = 0; i < n_metrics; i++) {
        size_t kl = strlen(metric_keys[i]), el = 1 + varint_len(kl) + kl + 9;
        mbuf[w++] = 0x1a;
        w += put_varint(mbuf + w, el);
        mbuf[w++] = 0x0a;
        w += put_varint(mbuf + w, kl);
        memcpy(mbuf + w, metric_keys[i], kl);
        w += kl;
        mbuf[w++] = 0x11;
        memcpy(mbuf + w, &metric_values[i], 8);
        w += 8;
    }
    st = pack_out(&msg.base, mbuf, w, W, out, out_len);
done:
    twk_host_free(ent);
    twk_host_free(entp);
    twk_host_free(bt);
    twk_host_free(offs);
    twk_host_free(mbuf);
    return st;
}

static twk_status encode_sample_response(const twk_wire_seq *seqs, int n_seqs, const float *prompt_logprobs,
                                         int64_t prompt_len, const int32_t *topk_ids, const float *topk_lps,
                                         int64_t k, uint8_t **out, size_t *out_len) {
    static const char *W = "twk_wire_encode_sample_response";
    if (!out || !out_len) return twk_error(INVALID, "%s: out is NULL", W);
    *out = NULL;
    *out_len = 0;
    if (n_seqs < 0 || (n_seqs && !seqs)) return twk_error(INVALID, "%s: bad sequences (n %d)", W, n_seqs);
    if (prompt_len < 0 || prompt_len > (int64_t)UINT32_MAX)
        return twk_error(INVALID, "%s: prompt_len %lld out of range", W, (long long)prompt_len);
    if (prompt_logprobs && prompt_len > (int64_t)INT_MAX / 4)
        return twk_error(INVALID, "%s: prompt_logprobs exceed the 2 GiB protobuf limit", W);
    if (!topk_ids != !topk_lps) return twk_error(INVALID, "%s: topk_ids and topk_lps must both be given or both NULL", W);
    if (topk_ids && (k < 0 || k > (int64_t)UINT32_MAX || (k && prompt_len > (int64_t)INT_MAX / 4 / k)))
        return twk_error(INVALID, "%s: topk k %lld out of range for prompt_len %lld", W, (long long)k, (long long)prompt_len);

    TinkerPublic__SampledSequence *sq = twk_host_calloc((size_t)((size_t)n_seqs + 1) * (sizeof *sq), "wire sq");
    TinkerPublic__SampledSequence **sqp = twk_host_calloc((size_t)((size_t)n_seqs + 1) * (sizeof *sqp), "wire sqp");
    twk_status st = TWK_OK;
    if (!sq || !sqp) {
        st = twk_error(TWK_ERR_OOM, "%s: out of memory", W);
        goto done;
    }
    for (int i = 0; i < n_seqs; i++) {
        const twk_wire_seq *s = &seqs[i];
        if (s->stop_reason != 0 && s->stop_reason != 1) {
            st = twk_error(INVALID, "%s: sequences[%d].stop_reason %d (want 0 STOP or 1 LENGTH)", W, i, s->stop_reason);
            goto done;
        }
        if (s->n < 0 || s->n > (int64_t)INT_MAX / 4 || (s->n && (!s->tokens || !s->logprobs))) {
            st = twk_error(INVALID, "%s: sequences[%d]: bad length %lld or NULL tokens/logprobs", W, i, (long long)s->n);
            goto done;
        }
        tinker_public__sampled_sequence__init(&sq[i]);
        sq[i].stop_reason = s->stop_reason ? TINKER_PUBLIC__STOP_REASON__STOP_REASON_LENGTH
                                           : TINKER_PUBLIC__STOP_REASON__STOP_REASON_STOP;
        sq[i].tokens.len = (size_t)s->n * 4;
        sq[i].tokens.data = as_bytes(s->n ? s->tokens : NULL);
        sq[i]._logprobs_case = TINKER_PUBLIC__SAMPLED_SEQUENCE___LOGPROBS_LOGPROBS;
        sq[i].logprobs.len = (size_t)s->n * 4;
        sq[i].logprobs.data = as_bytes(s->n ? s->logprobs : NULL);
        sqp[i] = &sq[i];
    }
    TinkerPublic__SampleResponse msg;
    tinker_public__sample_response__init(&msg);
    msg.n_sequences = (size_t)n_seqs;
    msg.sequences = sqp;
    if (prompt_logprobs) {
        msg._prompt_logprobs_case = TINKER_PUBLIC__SAMPLE_RESPONSE___PROMPT_LOGPROBS_PROMPT_LOGPROBS;
        msg.prompt_logprobs.len = (size_t)prompt_len * 4;
        msg.prompt_logprobs.data = as_bytes(prompt_len ? prompt_logprobs : NULL);
    }
    TinkerPublic__TopkLogprobs topk;
    tinker_public__topk_logprobs__init(&topk);
    if (topk_ids) {
        size_t nb = (size_t)prompt_len * (size_t)k * 4;
        topk.token_ids.len = nb;
        topk.token_ids.data = as_bytes(nb ? topk_ids : NULL);
        topk.logprobs.len = nb;
        topk.logprobs.data = as_bytes(nb ? topk_lps : NULL);
        topk.k = (uint32_t)k;
        topk.length = (uint32_t)prompt_len;
        msg._topk_prompt_logprobs_case = TINKER_PUBLIC__SAMPLE_RESPONSE___TOPK_PROMPT_LOGPROBS_TOPK_PROMPT_LOGPROBS;
        msg.topk_prompt_logprobs = &topk;
    }
    msg.prompt_cache_hit_tokens = 0;
    st = pack_out(&msg.base, NULL, 0, W, out, out_len);
done:
    twk_host_free(sq);
    twk_host_free(sqp);
    return st;
}

/* ---- the entry points: what they allocate is counted in the host's requests pool ---- */

twk_status twk_wire_decode_fb_request(const uint8_t *buf, size_t len, twk_wire_fb_request **out) {
    twk_host_pool pool = twk_host_pool_enter(TWK_HPOOL_REQUESTS);
    twk_status st = decode_fb_request(buf, len, out);
    twk_host_pool_enter(pool);
    return st;
}

twk_status twk_wire_encode_fb_output(int n_datums, const twk_wire_field *fields, int n_fields,
                                     const char *const *metric_keys, const double *metric_values, int n_metrics,
                                     uint8_t **out, size_t *out_len) {
    twk_host_pool pool = twk_host_pool_enter(TWK_HPOOL_REQUESTS);
    twk_status st = encode_fb_output(n_datums, fields, n_fields, metric_keys, metric_values, n_metrics, out, out_len);
    twk_host_pool_enter(pool);
    return st;
}

twk_status twk_wire_encode_sample_response(const twk_wire_seq *seqs, int n_seqs, const float *prompt_logprobs,
                                           int64_t prompt_len, const int32_t *topk_ids, const float *topk_lps,
                                           int64_t k, uint8_t **out, size_t *out_len) {
    twk_host_pool pool = twk_host_pool_enter(TWK_HPOOL_REQUESTS);
    twk_status st = encode_sample_response(seqs, n_seqs, prompt_logprobs, prompt_len, topk_ids, topk_lps, k, out, out_len);
    twk_host_pool_enter(pool);
    return st;
}
