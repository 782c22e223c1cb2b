/* train/ internals: the step of one loss (loss_step.c) and the packer that
 * runs several steps' passes together (loss_steps.c). Not a public header. */
#ifndef TWK_LOSS_PACK_H
#define TWK_LOSS_PACK_H

#include "twinkle/train.h"

typedef enum pass_mode { PASS_FORWARD, PASS_BACKWARD, PASS_BASE } pass_mode;

typedef struct twk_packer twk_packer;

/* One loss step (twk_loss_step's work); with pk its passes go through the
 * packer as job `job`, else straight to the trainer. Errors as twk_loss_step. */
twk_status twk_loss_step_in(twk_packer *pk, int job, twk_trainer *t, const twk_loss_spec *spec, const twk_loss_batch *b,
                            int backward, float *logprobs, twk_loss_result *res);

/* One pass of job `job` (trainer t): blocks until the packer ran it in a
 * packed pass; lp gets b->n logprobs, *loss -sum w lp. The pass's error. */
twk_status twk_packer_pass(twk_packer *pk, int job, twk_trainer *t, pass_mode mode, const twk_batch *b, float *lp,
                           float *loss);

/* 1 when trainer t's passes cannot share a packed pass: LoRA on a mixture of experts' experts
 * or router (train_experts / train_router), which the packed trainer's slots do not hold. */
int twk_pack_needs_own(const twk_trainer *t);

/* Counts one pass a job ran on its own trainer (twk_pack_needs_own) in the packer's pack's stats. */
void twk_packer_count_own(twk_packer *pk);
void twk_pack_count_own(twk_pack *p);

#endif
