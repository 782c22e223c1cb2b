/* fuzz_wire — server/wire.c's protobuf decoder (ForwardBackwardRequest): every
 * input is decoded; a decoded request's strings, tokens and tensors are read
 * in full (ASan checks each length the decoder reports). */
#include <stdlib.h>
#include <string.h>

#include "wire.h"

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    twk_wire_fb_request *r = NULL;
    if (twk_wire_decode_fb_request(data, size, &r) != TWK_OK) {
        if (r) abort(); /* a failed decode leaves *out NULL */
        return 0;
    }
    uint64_t h = strlen(r->model_id) + strlen(r->loss_fn) + (uint64_t)r->seq_id;
    for (int i = 0; i < r->n_config; i++) h += strlen(r->config[i].key) + (uint64_t)(r->config[i].value != 0);
    for (int d = 0; d < r->n_data; d++) {
        const twk_wire_datum *dt = &r->data[d];
        if (dt->n_tokens < 1) abort(); /* documented: >= 1 token */
        for (int64_t t = 0; t < dt->n_tokens; t++) h += (uint64_t)dt->tokens[t];
        for (int k = 0; k < dt->n_inputs; k++) {
            const twk_wire_tensor *tn = &dt->inputs[k].t;
            h += strlen(dt->inputs[k].key);
            int64_t n = tn->ndim == 1 ? tn->shape[0] : tn->shape[0] * tn->shape[1];
            if (tn->ndim < 1 || tn->ndim > 2 || n != tn->n) abort(); /* shape and count agree */
            const unsigned char *p = tn->data;
            size_t bytes = (size_t)tn->n * (tn->dtype == TWK_WIRE_F32 ? 4 : 8);
            if (bytes) h += p[0] + p[bytes - 1];
            if (twk_wire_datum_input(dt, dt->inputs[k].key) == NULL) abort();
        }
    }
    sink = h;
    twk_wire_fb_request_free(r);
    return 0;
}
