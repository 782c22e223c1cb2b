/* twinkle — the whole public API (a program embedding the engine includes this).
 * Link with `pkg-config --cflags --libs twinkle`. */
#ifndef TWINKLE_H
#define TWINKLE_H
#include "twinkle/export.h"
#include "twinkle/version.h"
#include "twinkle/status.h"
#include "twinkle/log.h"
#include "twinkle/ops.h"
#include "twinkle/hal.h"
#include "twinkle/graph.h"
#include "twinkle/model.h"
#include "twinkle/data.h"
#include "twinkle/trainer.h"
#include "twinkle/memplan.h"
#include "twinkle/losses.h"
#include "twinkle/sampler.h"
#include "twinkle/tokenizer.h"
#include "twinkle/chat.h"
#include "twinkle/rng.h"
#include "twinkle/fs.h"
#endif
