/* server/ — the multi-rank service (`mpirun -np N twinkle serve`): rank 0
 * runs the HTTP server, the store and every run's seq order; the other ranks
 * (dist_follower.c) hold the same base models and a replica of every run's
 * trainer, and execute what rank 0's compute worker sends them. With one rank
 * every function here is the plain single-process call.
 *
 * The protocol (tags below): rank 0 sends a command (a dsv_cmd header, then
 * its arrays) to a follower, which answers with a dsv_reply (then its
 * arrays). forward_backward shards additionally wait for rank 0's verdict
 * (commit, or roll the gradients back) before the follower takes its next
 * command. Only rank 0's compute worker talks to the followers, one command
 * at a time, so they see the commands in one order. */
#ifndef TWK_SERVER_DIST_SERVE_H
#define TWK_SERVER_DIST_SERVE_H

#include <stdint.h>

#include "svc.h"

enum { DSV_TAG_CMD = 71, DSV_TAG_REPLY = 72, DSV_TAG_VERDICT = 73 };
/* a decode batch's sequences come back under their own tag (any order): DSV_TAG_SAMPLE + 0..DSV_SAMPLE_TAGS-1 */
enum { DSV_TAG_SAMPLE = 1000, DSV_SAMPLE_TAGS = 30000 };

/* the gradient allreduce's bucket (as `twinkle train --bucket-mb`'s default) */
#define DSV_BUCKET_BYTES ((size_t)16 << 20)

typedef enum dsv_kind {
    DSV_START,  /* the base models are in place (rank 0 made the built-in one): load them */
    DSV_CREATE, /* a run's trainer: model index, LoRA config, capacity */
    DSV_FB,     /* a forward / forward_backward shard: loss, then the arrays */
    DSV_OPTIM,  /* sum the run's gradients over every rank (a collective), then AdamW */
    DSV_LOAD,   /* load a checkpoint folder into the run */
    DSV_UNLOAD, /* free the run's trainer */
    DSV_SAMPLE, /* a decode batch on the model's sampler replica (answered under its tag, asynchronously) */
    DSV_STOP    /* shut down */
} dsv_kind;

typedef struct dsv_cmd {
    int32_t kind, model;
    int32_t backward, k, n_seqs, load_optimizer;
    int32_t tag;               /* DSV_SAMPLE: the answer's tag */
    int64_t capacity, n_tokens;
    uint32_t in_mask;          /* DSV_FB: the inputs that follow, by twk_loss_input_id */
    char run[128];
    char path[1024];
    char loss[64];
    double config[TWK_CFG_COUNT];
    twk_lora_config lora;
    twk_adam_params adam;
} dsv_cmd;

typedef struct dsv_reply {
    int32_t st, user_error, n_metrics;
    char err[768];
    double loss;
    double values[TWK_LOSS_MAX_METRICS];
    int64_t n_logprobs;        /* DSV_FB: floats that follow */
} dsv_reply;

/* Floats per token of loss input `def` for a batch whose targets have k columns. */
int64_t dsv_input_width(const twk_loss_input_def *def, int k);

/* A growing byte buffer (host allocator); oom set when a put failed. */
typedef struct dsv_buf {
    unsigned char *p;
    int64_t n, cap;
    int oom;
} dsv_buf;
void dsv_put(dsv_buf *b, const void *src, int64_t n);
/* Reading a message: n bytes at *at (advanced), or NULL past the end. */
const void *dsv_take(const unsigned char *msg, int64_t len, int64_t *at, int64_t n);

/* A copy of the trainer's accumulated gradients (NULL without memory), and putting it back. */
float *dsv_grads_save(twk_trainer *t);
void dsv_grads_restore(twk_trainer *t, const float *g);

/* ---- rank 0 (dist_serve.c) ---- */

/* 1 when this service spans several ranks. */
int svc_dist_active(void);
/* Multi-rank: /healthz's body — {"status":"ok","ranks":N,"decode_batches_sent":[to rank 1, ...]}
 * — written into body, returning 1; 0 with one rank (the plain answer). Any thread. */
int svc_dist_health(char *body, size_t len);
/* Start-up, before the worker starts: tells the followers the models are in place and waits until
 * each has loaded them. -1 with a message naming the failing rank in err. */
int svc_dist_start(char *err, size_t err_len);
/* Shutdown, after the worker stopped: the followers leave their loops. */
void svc_dist_stop(void);
/* Worker: the run's trainer on this rank and on every follower. Errors as twk_trainer_new, naming
 * the rank that failed (nothing is left on any rank then). */
twk_status svc_dist_trainer_new(svc *s, run_state *r);
/* Worker: twk_loss_step over the ranks: the sequences split by tokens (whole groups), every
 * rank's share through its base model's pack as a pack of one (svc_pack_step: rank 0's through
 * `pack`), so each datum's logprobs are computed as the one-process service computes them;
 * logprobs and metrics combined as one process reports them. A failure on any rank rolls every
 * rank's gradients back and reruns the whole batch on rank 0, so the request fails with the
 * single process's message. */
twk_status svc_dist_loss_step(run_state *r, twk_pack *pack, const twk_loss_spec *spec, const twk_loss_batch *b,
                              int backward, float *logprobs, twk_loss_result *res);
/* Worker: the gradients summed over every rank, then twk_trainer_optim_step on each. */
twk_status svc_dist_optim_step(run_state *r, const twk_adam_params *p, float *grad_norm);
/* Worker: twk_trainer_load_state on every rank (the folder must be readable by each). */
twk_status svc_dist_load_state(run_state *r, const char *dir, int load_optimizer);
/* Worker: frees the run's trainer on every rank. */
void svc_dist_trainer_free(run_state *r);

/* Worker: the rank the next decode batch of a shared (slotted) sampler goes to, round robin over
 * every rank; 0 = this one. */
int svc_dist_sample_rank(void);
/* Worker: sends a decode batch of n requests on base model `model` to `rank` (each with its
 * session's adapter: the base model, a checkpoint folder, or a snapshot's host copy); *tag names
 * the answer for svc_dist_sample_recv. The rank decodes it on its own sampler replica while this
 * one goes on. */
twk_status svc_dist_sample_send(int rank, int model, const twk_sample_request *reqs, sampler_session *const *sessions,
                                int n, int *tag);
/* Worker: waits for that batch: res gets its n_seqs sequences in request order (free each with
 * twk_sampled_seq_free); the rank's error otherwise. */
twk_status svc_dist_sample_recv(int rank, int tag, twk_sampled_seq *res, int n_seqs);

/* serve.c: loads cfg's base models (the built-in one, made in cfg->data_dir when absent, without
 * --model) onto dev into models[*n_models...]; errors name the model. */
twk_status svc_load_models(const twk_serve_config *cfg, twk_device *dev, base_model *models, int *n_models);

/* ---- the other ranks (dist_follower.c) ---- */

/* Rank > 0 of `mpirun -np N twinkle serve`: opens the device, waits for rank 0's start, loads the
 * same base models and executes commands until DSV_STOP. The process's exit status. */
int twk_serve_follower(const twk_serve_config *cfg);

#endif
