/* --dtype and --kv-dtype for the commands that load a model. */
#include <stdio.h>
#include <string.h>

#include "dtype_opts.h"

int twk_cli_dtype_option(const char *cmd, const char *o, const char *v, twk_cli_dtypes *d) {
    int *dst = !strcmp(o, "--dtype") ? &d->weights : !strcmp(o, "--kv-dtype") ? &d->kv : NULL;
    if (!dst) return 0;
    if ((*dst = twk_dtype_parse_float(v)) < 0) {
        fprintf(stderr, "twinkle %s: %s '%s' is not f32, bf16 or f16\n", cmd, o, v ? v : "");
        return -1;
    }
    return 1;
}

twk_status twk_cli_model_load(const char *dir, twk_device *dev, const twk_cli_dtypes *d, twk_model **out) {
    return twk_model_load_as(dir, dev, d->weights, d->kv, out);
}
