/* twinkle — the training layer. For now: a tiny one-block transformer LM
 * trained from random initialisation on a memorisation task; the first main
 * job and the engine's end-to-end test. Models from Hugging Face folders,
 * LoRA and the real optimizers come next (train/README.md). */
#ifndef TWINKLE_TRAIN_H
#define TWINKLE_TRAIN_H

#include <stdint.h>

#include "twinkle/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct twk_tiny_lm_config {
    int vocab;      /* tokens */
    int dim;        /* model width */
    int heads;      /* query heads */
    int kv_heads;   /* key/value heads (grouped-query when < heads) */
    int head_dim;
    int ffn;        /* SwiGLU hidden width */
    int n_seqs;     /* sequences to memorise, packed into one batch */
    int seq_len;    /* average length; lengths vary by +-25% */
    float lr;       /* Adam learning rate */
    uint64_t seed;  /* data and initialisation */
} twk_tiny_lm_config;

/* A small default configuration (runs in well under a second per step). */
twk_tiny_lm_config twk_tiny_lm_default(void);

typedef struct twk_tiny_lm twk_tiny_lm;

/* Builds the model, its training graph and plan on `dev`. On failure returns
 * an error (message set) and *out is NULL. */
twk_status twk_tiny_lm_new(const twk_tiny_lm_config *cfg, twk_device *dev, twk_tiny_lm **out);
void twk_tiny_lm_free(twk_tiny_lm *m);
/* One step: forward, backward, Adam. *loss = mean next-token cross-entropy
 * before the update. */
twk_status twk_tiny_lm_step(twk_tiny_lm *m, float *loss);
/* Tokens in the packed batch. */
int64_t twk_tiny_lm_tokens(const twk_tiny_lm *m);
/* The compiled training plan (forward + backward), owned by the model. */
const twk_plan *twk_tiny_lm_plan(const twk_tiny_lm *m);
/* The compiled plan's statistics. */
void twk_tiny_lm_stats(const twk_tiny_lm *m, twk_plan_stats *out);

#ifdef __cplusplus
}
#endif
#endif
