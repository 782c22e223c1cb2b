/* One step of `twinkle train`: a packed batch of the data as a loss batch
 * (train/'s twk_loss_step runs the loss), with the teacher's top-k targets
 * added for the distillation losses. */
#ifndef TWK_CLI_TRAIN_STEP_H
#define TWK_CLI_TRAIN_STEP_H

#include "twinkle/twinkle.h"

/* The share of packed batch pk that rank `rank` of `size` trains on:
 * sequences [*s0, *s1), whole groups of `group` (pairs for DPO), contiguous,
 * the boundaries at the group starts nearest each rank's even share of the
 * tokens. May be empty (*s0 == *s1) when there are fewer groups than ranks;
 * on OOM every rank's share is empty. */
void twk_train_shard(const twk_packed *pk, int group, int rank, int size, int *s0, int *s1);

/* Runs loss `spec` on sequences [s0, s1) of packed batch pk (s0 < s1): with backward the gradient
 * accumulates in the trainer (without: forward only, for evaluation), res gets the loss and its metrics. teacher (distillation only):
 * a sampler holding max_len tokens that scores the top-k next tokens at
 * every position. Errors from the loss step or the teacher. */
twk_status twk_train_step(twk_trainer *t, const twk_loss_spec *spec, const twk_packed *pk, int s0, int s1,
                          twk_sampler *teacher, int k, int backward, twk_loss_result *res);

#endif
