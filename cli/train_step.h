/* One step of `twinkle train`: a packed batch of the data as a loss batch
 * (train/'s twk_loss_step runs the loss), with the teacher's top-k targets
 * added for the distillation losses. */
#ifndef TWK_CLI_TRAIN_STEP_H
#define TWK_CLI_TRAIN_STEP_H

#include "twinkle/twinkle.h"

/* Runs loss `spec` on packed batch pk: the gradient accumulates in the
 * trainer, res gets the loss and its metrics. teacher (distillation only):
 * a sampler holding max_len tokens that scores the top-k next tokens at
 * every position. Errors from the loss step or the teacher. */
twk_status twk_train_step(twk_trainer *t, const twk_loss_spec *spec, const twk_packed *pk, twk_sampler *teacher, int k,
                          twk_loss_result *res);

#endif
