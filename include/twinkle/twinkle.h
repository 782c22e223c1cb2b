/* twinkle — the whole public API. */
#ifndef TWINKLE_H
#define TWINKLE_H
#include "twinkle/status.h"
#include "twinkle/ops.h"
#include "twinkle/hal.h"
#include "twinkle/graph.h"
#include "twinkle/train.h"
#include "twinkle/tokenizer.h"
#include "twinkle/rng.h"
#include "twinkle/fs.h"
#define TWK_VERSION "0.1.0"
#endif
