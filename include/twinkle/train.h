/* twinkle — the training layer, all of it: models, trainers, losses, the
 * sampler and token data (each header states its objects' thread-safety). */
#ifndef TWINKLE_TRAIN_H
#define TWINKLE_TRAIN_H

#include "twinkle/data.h"
#include "twinkle/losses.h"
#include "twinkle/memplan.h"
#include "twinkle/model.h"
#include "twinkle/sampler.h"
#include "twinkle/trainer.h"

#endif
