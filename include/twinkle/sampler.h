/* twinkle — sampling: prefill and decode with a KV cache, one adapter or a
 * batch mixing adapter slots, prompt scoring.
 *
 * Thread-safety: a twk_sampler belongs to one thread at a time, and samplers and
 * trainers over one model (one device) must not be used concurrently. */
#ifndef TWINKLE_SAMPLER_H
#define TWINKLE_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "twinkle/export.h"
#include "twinkle/tokenizer.h"
#include "twinkle/trainer.h"

#ifdef __cplusplus
extern "C" {
#endif
TWK_API_BEGIN

/* ---- sampling: prefill and decode with a KV cache ---- */

typedef struct twk_sample_params {
    int max_tokens;            /* new tokens at most (>= 1) */
    float temperature;         /* 0 = greedy; > 0 scales the logits */
    int top_k;                 /* <= 0: off */
    float top_p;               /* (0, 1]; 1 = off */
    uint64_t seed;             /* used when has_seed: the same seed gives the same tokens */
    bool has_seed;
    const int32_t *stop_tokens; /* generation ends after emitting one of these (it is included) */
    int n_stop_tokens;
    /* stop strings: generation ends with the token that completes one of them in the
     * generated text (that token included); needs the model's tokenizer */
    const char *const *stop_strings;
    int n_stop_strings;
    const twk_tokenizer *tokenizer;
} twk_sample_params;

/* Why a sequence ended. */
typedef enum twk_stop_reason { TWK_STOP_TOKEN = 0, TWK_STOP_LENGTH = 1 } twk_stop_reason;

typedef struct twk_sampled_seq {
    int32_t *tokens;  /* generated tokens, the stop token included when one ended it */
    float *logprobs;  /* log_softmax of the raw logits (temperature 1) at each chosen token */
    int64_t n;
    twk_stop_reason stop_reason; /* a stop token (or string), or max_tokens */
} twk_sampled_seq;

typedef struct twk_sampler twk_sampler;

/* A sampler over `m`, with an adapter of lora's shape when lora != NULL (its
 * B starts at zero: load or copy weights into it), for up to max_seqs
 * sequences decoded together, each at most max_len tokens (prompt included). */
twk_status twk_sampler_new(twk_model *m, const twk_lora_config *lora, int max_seqs, int64_t max_len, twk_sampler **out);
void twk_sampler_free(twk_sampler *s);
/* Loads a PEFT adapter folder (its r and alpha must match). */
twk_status twk_sampler_load_adapter(twk_sampler *s, const char *dir);
/* Copies a trainer's current adapter (same LoRA shape) into the sampler. */
twk_status twk_sampler_copy_adapter(twk_sampler *s, twk_trainer *from);
/* num_samples (<= max_seqs) continuations of the prompt; out[i] must be
 * freed with twk_sampled_seq_free. Errors name the bad parameter. */
twk_status twk_sampler_generate(twk_sampler *s, const int32_t *prompt, int64_t n_prompt, int num_samples,
                                const twk_sample_params *p, twk_sampled_seq *out);
void twk_sampled_seq_free(twk_sampled_seq *q);

/* One request of a shared decode batch. */
typedef struct twk_sample_request {
    const int32_t *prompt;
    int64_t n_prompt;
    int num_samples;
    const twk_sample_params *params;
    twk_sampled_seq *out; /* num_samples entries */
    int slot;             /* adapter slot (samplers made with twk_sampler_new_slots); 0 otherwise */
    /* optional: called on the decoding thread after every pass that added tokens to this request,
     * with its num_samples outputs so far (tokens [0, out[i].n) are final) */
    void (*on_step)(void *ctx, const twk_sampled_seq *out, int num_samples);
    void *step_ctx;
} twk_sample_request;

/* A sampler whose batches mix adapters: n_slots adapter slots of rank up to
 * slot_rank on every module; each request names its slot. Slots start as
 * zeros, i.e. the base model. */
twk_status twk_sampler_new_slots(twk_model *m, int n_slots, int slot_rank, int max_seqs, int64_t max_len,
                                 twk_sampler **out);
/* Fills dst (nelem floats) with the adapter tensor named `name` (PEFT names)
 * and returns 1, or returns 0 when the adapter has no such tensor. */
typedef int (*twk_adapter_get_fn)(void *ctx, const char *name, float *dst, int64_t nelem);
/* Loads an adapter of the given rank and alpha into a slot (padded to the
 * slot rank, alpha / rank folded into B); modules it lacks are zero. */
twk_status twk_sampler_slot_set(twk_sampler *s, int slot, int rank, float alpha, twk_adapter_get_fn get, void *ctx);
/* The same from a PEFT adapter folder, or a trainer's current adapter. */
twk_status twk_sampler_slot_load_dir(twk_sampler *s, int slot, const char *dir);
twk_status twk_sampler_slot_from_trainer(twk_sampler *s, int slot, twk_trainer *from);
/* Zeros a slot (the base model). */
twk_status twk_sampler_slot_clear(twk_sampler *s, int slot);
int twk_sampler_slots(const twk_sampler *s);
/* The slot twk_sampler_score_prompt uses (0 by default). */
void twk_sampler_set_score_slot(twk_sampler *s, int slot);
int twk_sampler_slot_rank(const twk_sampler *s);

/* Several requests (different prompts and parameters) decoded together: each
 * prompt is prefilled once, then every live sequence of every request takes
 * one token per pass. The samples of all requests together must fit the
 * sampler (max_seqs). Results equal separate twk_sampler_generate calls. */
twk_status twk_sampler_generate_many(twk_sampler *s, const twk_sample_request *reqs, int n_reqs);
/* Per-position scores of a prompt: logprobs[i] = log p(prompt[i] | prompt[:i])
 * (logprobs[0] = NaN), and when k > 0 the k most likely next tokens at each
 * position i (given prompt[:i]; row 0 empty: id 0, -99999), sorted by
 * logprob. Any output may be NULL. Errors name the bad argument. */
twk_status twk_sampler_score_prompt(twk_sampler *s, const int32_t *prompt, int64_t n_prompt, float *logprobs, int k,
                                    int32_t *topk_ids, float *topk_lps);
/* Bytes of the adapter (0 without one), and copies of it to / from the host,
 * so a sampler's KV cache can be dropped and the sampler remade later. */
size_t twk_sampler_adapter_bytes(const twk_sampler *s);
twk_status twk_sampler_adapter_to_host(twk_sampler *s, void *dst, size_t bytes);
twk_status twk_sampler_adapter_from_host(twk_sampler *s, const void *src, size_t bytes);
/* The sampler's sequence limit and context length. */
int twk_sampler_max_seqs(const twk_sampler *s);
int64_t twk_sampler_max_len(const twk_sampler *s);

TWK_API_END
#ifdef __cplusplus
}
#endif
#endif
