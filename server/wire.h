/* server/ — the Tinker protobuf wire format (schema: server/tinker.proto,
 * compiled by protoc-c at build time): decoding ForwardBackwardRequest,
 * encoding ForwardBackwardOutput and SampleResponse. Untrusted input: every
 * length, dtype, shape and offset is checked; errors name the field. */
#ifndef TWK_SERVER_WIRE_H
#define TWK_SERVER_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "twinkle/status.h"

typedef enum twk_wire_dtype { TWK_WIRE_F32 = 1, TWK_WIRE_I64 = 2 } twk_wire_dtype;

/* A dense tensor from loss_fn_inputs (sparse CSR is densified). */
typedef struct twk_wire_tensor {
    twk_wire_dtype dtype;
    int ndim;              /* 1 or 2 */
    int64_t shape[2];
    int64_t n;             /* elements = product of shape */
    void *data;            /* float[n] or int64_t[n], owned */
} twk_wire_tensor;

typedef struct twk_wire_input {
    char *key;             /* "target_tokens", "weights", ... */
    twk_wire_tensor t;
} twk_wire_input;

/* A provenance span: positions [offset, offset + length) of a sampled
 * sequence's prompt (sampled = 0) or of its sampled tokens (sampled = 1). */
typedef struct twk_wire_span {
    int sampled;
    char *sequence_id;
    int64_t offset, length;
} twk_wire_span;

typedef struct twk_wire_datum {
    int32_t *tokens;       /* model_input: all encoded_text chunks concatenated */
    int64_t n_tokens;
    twk_wire_input *inputs;
    int n_inputs;
    twk_wire_span *spans[2]; /* provenance of model_input (0) and of loss_fn_inputs (1), tiling them in order */
    int n_spans[2];
} twk_wire_datum;

typedef struct twk_wire_config {
    char *key;
    double value;
} twk_wire_config;

typedef struct twk_wire_fb_request {
    char *model_id;
    int32_t seq_id;
    char *loss_fn;
    int forward_only;
    twk_wire_config *config;  /* loss_fn_config (field 5); numeric entries of field 7 merged in */
    int n_config;
    twk_wire_datum *data;
    int n_data;
} twk_wire_fb_request;

/* Decoder limits: elements of one tensor (product of its shape), and the
 * total elements of all sparse tensors densified for one request (a tiny
 * CSR message must not make the server allocate gigabytes). */
#define TWK_WIRE_MAX_TENSOR_ELEMS (INT64_C(1) << 31)
#define TWK_WIRE_MAX_SPARSE_ELEMS (INT64_C(1) << 26)

/* Decodes a ForwardBackwardRequest. On failure returns TWK_ERR_INVALID_ARG
 * (or TWK_ERR_UNSUPPORTED for image/dmel chunks) with a message naming the
 * field, e.g. "data[3].loss_fn_inputs[weights]: dense bytes 10 not a multiple
 * of 4"; *out is NULL then. Unknown fields are skipped.
 * Accepted: model_id non-empty without '/', loss_fn non-empty, >= 1 datum,
 * each with >= 1 token (encoded_text chunks only); tensors DTYPE_FLOAT32 or
 * DTYPE_INT64, 1-D or 2-D (no shape with dense data = 1-D), sparse CSR only
 * 2-D, densified with 0 (the SDK's default pad), column indices strictly
 * increasing within a row. Duplicate map keys: the last wins; a numeric
 * loss_fn_config_v2 entry overrides the same key of loss_fn_config. */
twk_status twk_wire_decode_fb_request(const uint8_t *buf, size_t len, twk_wire_fb_request **out);
void twk_wire_fb_request_free(twk_wire_fb_request *r);
/* The input named key in a datum, or NULL. */
const twk_wire_tensor *twk_wire_datum_input(const twk_wire_datum *d, const char *key);

/* One output field for ForwardBackwardOutput: float32 values of every datum
 * concatenated, datum i being data[offsets[i] .. offsets[i+1]) (elements);
 * `trailing` = 0 for per-token vectors, K for (N, K) rows. */
typedef struct twk_wire_field {
    const char *name;
    int64_t trailing;
    const float *data;
    const int64_t *offsets; /* n_datums + 1 element offsets */
} twk_wire_field;

/* Encodes ForwardBackwardOutput with one ArrayRecord (type "ArrayRecord",
 * num_datums set) and the metrics map. *out is a host buffer (twk_host_free).
 * Field names must be non-empty and distinct; metric keys must be distinct and
 * "name:reduction" with exactly one ':' (the SDK fails on any other key). */
twk_status twk_wire_encode_fb_output(int n_datums, const twk_wire_field *fields, int n_fields,
                                     const char *const *metric_keys, const double *metric_values, int n_metrics,
                                     uint8_t **out, size_t *out_len);

/* One sampled sequence. stop_reason: 0 STOP, 1 LENGTH. */
typedef struct twk_wire_seq {
    int stop_reason;
    const int32_t *tokens;
    const float *logprobs; /* same length as tokens; always sent */
    int64_t n;
} twk_wire_seq;

/* Encodes SampleResponse. prompt_logprobs (NULL = absent) has prompt_len
 * floats (NaN allowed). topk_ids/topk_lps (NULL = absent) are prompt_len x k. */
twk_status twk_wire_encode_sample_response(const twk_wire_seq *seqs, int n_seqs, const float *prompt_logprobs,
                                           int64_t prompt_len, const int32_t *topk_ids, const float *topk_lps,
                                           int64_t k, uint8_t **out, size_t *out_len);

#endif
