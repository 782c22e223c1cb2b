/* --dtype and --kv-dtype, shared by train, sample, chat, score (serve parses its own config). */
#ifndef TWK_CLI_DTYPE_OPTS_H
#define TWK_CLI_DTYPE_OPTS_H

#include "twinkle/model.h"

#define TWK_CLI_DTYPE_HELP                                                                      \
    "  --dtype D           the base weights: f32, bf16 or f16 (default: as the checkpoint)\n"   \
    "  --kv-dtype D        the KV cache: f32, bf16 or f16 (default: the weights' dtype)\n"

/* The chosen dtypes; -1 for a default. */
typedef struct twk_cli_dtypes {
    int weights, kv;
} twk_cli_dtypes;

#define TWK_CLI_DTYPES_DEFAULT {-1, -1}

/* 1 when option o (value v) is --dtype or --kv-dtype and is stored in d; 0 for another
 * option; -1 (a message naming cmd printed) for a value that is not f32, bf16 or f16. */
int twk_cli_dtype_option(const char *cmd, const char *o, const char *v, twk_cli_dtypes *d);
/* twk_model_load_as with d's dtypes. */
twk_status twk_cli_model_load(const char *dir, twk_device *dev, const twk_cli_dtypes *d, twk_model **out);

#endif
