/* `twinkle score`: per-token log-probabilities of JSONL examples under a
 * model (optionally with a PEFT LoRA adapter) — the engine's answer, for
 * checking a service or a checkpoint from the command line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dtype_opts.h"
#include "twinkle/twinkle.h"

static void usage(FILE *f) {
    fprintf(f, "usage: twinkle score --model DIR [--adapter DIR] --data FILE.jsonl [--device SPEC] [--dtype D]\n"
               TWK_CLI_DTYPE_HELP
               "  Prints one JSON line {\"logprobs\": [...]} per example {\"tokens\": [...]}: the log-probability\n"
               "  of each token after the first given the ones before it (len(tokens) - 1 values).\n");
}

int twk_cmd_score(int argc, char **argv) {
    const char *model = NULL, *adapter = NULL, *data = NULL, *device = "cpu";
    twk_cli_dtypes dt = TWK_CLI_DTYPES_DEFAULT;
    int dr = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "twinkle score: %s needs a value\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "--model")) model = argv[++i];
        else if (!strcmp(argv[i], "--adapter")) adapter = argv[++i];
        else if (!strcmp(argv[i], "--data")) data = argv[++i];
        else if (!strcmp(argv[i], "--device")) device = argv[++i];
        else if ((dr = twk_cli_dtype_option("score", argv[i], argv[i + 1], &dt)) < 0) return 2;
        else if (dr) i++;
        else {
            fprintf(stderr, "twinkle score: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!model || !data) {
        usage(stderr);
        return 2;
    }
    twk_device *dev = NULL;
    twk_model *m = NULL;
    twk_dataset *ds = NULL;
    twk_trainer *t = NULL;
    twk_packed one = {0};
    int rc = 1;
    if (twk_device_open(device, &dev) != TWK_OK || twk_cli_model_load(model, dev, &dt, &m) != TWK_OK ||
        twk_dataset_load_jsonl(data, twk_model_cfg(m)->vocab, &ds) != TWK_OK)
        goto fail;
    twk_lora_config lc = twk_lora_default();
    lc.rank = 1;
    if (adapter && twk_adapter_read_config(adapter, &lc) != TWK_OK) goto fail;
    /* passes of up to 2048 tokens, or the longest example; without an adapter, a
     * rank-1 adapter whose B is zero adds nothing */
    int64_t cap = twk_dataset_max_targets(ds) > 2048 ? twk_dataset_max_targets(ds) : 2048;
    if (twk_trainer_new(m, &lc, cap, &t) != TWK_OK) goto fail;
    if (adapter && twk_adapter_load(t, adapter) != TWK_OK) goto fail;
    for (int64_t cur = 0; cur < twk_dataset_count(ds);) {
        if (twk_dataset_pack(ds, cap, &cur, &one) != TWK_OK) goto fail;
        if (cur > twk_dataset_count(ds)) { /* packing wraps to the start: drop the repeats */
            int64_t extra = cur - twk_dataset_count(ds), n = one.batch.n;
            for (int64_t i = n - 1; i >= 0 && extra > 0; i--)
                if (one.batch.seg_start[i] == i) {
                    n = i;
                    extra--;
                }
            one.batch.n = n;
        }
        float *lp = malloc((size_t)one.batch.n * 4);
        if (!lp || twk_trainer_forward(t, &one.batch, lp, NULL) != TWK_OK) {
            free(lp);
            goto fail;
        }
        int64_t s = 0;
        for (int64_t i = 0; i <= one.batch.n; i++) {
            if (i == one.batch.n || (i > s && one.batch.seg_start[i] == i)) {
                printf("{\"logprobs\": [");
                for (int64_t k = s; k < i; k++) printf("%s%.9g", k > s ? ", " : "", (double)lp[k]);
                printf("]}\n");
                s = i;
            }
        }
        free(lp);
    }
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "twinkle score: %s\n", twk_last_error());
out:
    twk_packed_free(&one);
    twk_trainer_free(t);
    twk_dataset_free(ds);
    twk_model_free(m);
    twk_device_close(dev);
    return rc;
}
