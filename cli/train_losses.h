/* The non-SFT steps of `twinkle train`: each takes a packed batch, leaves the
 * loss's gradient accumulated in the trainer and the loss in *loss. */
#ifndef TWK_CLI_TRAIN_LOSSES_H
#define TWK_CLI_TRAIN_LOSSES_H

#include "twinkle/twinkle.h"

/* Preference pairs (consecutive sequences chosen, rejected); the reference
 * is the base model (adapter off). Error: the batch is not whole pairs. */
twk_status twk_train_dpo_step(twk_trainer *t, const twk_packed *pk, int ipo, double beta, double *loss);

/* An RL loss on rollouts: advantages per token from the data, the sampler's
 * logprobs where given (else the model's own: on-policy), weights as the token
 * mask; the reference for spec->kl_beta is the base model. */
twk_status twk_train_rl_step(twk_trainer *t, const twk_packed *pk, const twk_rl_spec *spec, double *loss,
                             twk_loss_stats *stats);

/* Distillation against a teacher's top-k next tokens at every position
 * (scored by the teacher's sampler, which must hold max_len tokens); kind
 * and beta as twk_loss_distill; weights per token. */
twk_status twk_train_distill_step(twk_trainer *t, twk_sampler *teacher, const twk_packed *pk, twk_distill_kind kind,
                                  int k, double beta, double *loss);

#endif
