/* `twinkle sample`: generate from a model (optionally with a PEFT adapter)
 * with the KV-cache sampler; prints one JSON line per sample. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dtype_opts.h"
#include "textgen.h"
#include "twinkle/twinkle.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: twinkle sample --model DIR [--adapter DIR] (--prompt TEXT | --messages FILE | --prompt-tokens 1,2,3)\n"
            "  --prompt TEXT       text, encoded with DIR/tokenizer.json as transformers' tokenizer(text): bos / eos\n"
            "                      where its post-processor or DIR/tokenizer_config.json's add_bos_token /\n"
            "                      add_eos_token add them\n"
            "  --messages FILE     a JSON conversation (a list of messages, or {\"messages\": [...], ...}), rendered\n"
            "                      with DIR/tokenizer_config.json's chat template and the generation prompt\n"
            "  --ids               with --prompt / --messages: also print each sample's JSON line (ids, logprobs)\n"
            "  --max-tokens N      new tokens at most (default 32)\n"
            "  --num-samples N     independent samples (default 1, at most 64)\n"
            "  --temperature T     0 = greedy (default 1)\n"
            "  --top-k K           -1 = off (default)      --top-p P   (0, 1], 1 = off (default)\n"
            "  --seed S            repeatable sampling\n"
            "  --stop 2,7          stop token ids (default: the model's eos_token_id; 'none' = never)\n"
            "  --device SPEC       cpu (default), opencl[:N], vulkan[:N] or cuda[:N]: see twinkle devices\n"
            TWK_CLI_DTYPE_HELP
            "  --stop 2,7 also takes tokenizer_config.json's eos_token by default with a text prompt.\n"
            "Text prompts print each sample's text (special tokens skipped) on its own line(s).\n"
            "--prompt-tokens prints {\"tokens\": [...], \"logprobs\": [...], \"stop_reason\": \"stop\"|\"length\"} per sample;\n"
            "logprobs are log_softmax of the raw logits (temperature 1) at each chosen token.\n");
}

/* Parses "1,2,3" into ids; returns the count or -1. */
static int parse_ids(const char *s, int32_t *out, int max) {
    int n = 0;
    while (*s) {
        char *end = NULL;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 2147483647L || n == max) return -1;
        out[n++] = (int32_t)v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

/* The prompt of --prompt / --messages as ids into prompt[cap]; the count, or -1 with the error set. */
static int text_prompt(twk_textgen *g, const char *text, const char *messages, int32_t *prompt, int cap) {
    int32_t *ids = NULL;
    int64_t n = 0;
    char *json = messages ? twk_read_text_file(messages) : NULL;
    twk_status st = messages && !json ? TWK_ERR_IO
                    : messages        ? twk_textgen_encode_chat(g, json, &ids, &n)
                                      : twk_textgen_encode_text(g, text, &ids, &n);
    free(json);
    if (st == TWK_OK && (n < 1 || n > cap))
        st = twk_error(TWK_ERR_INVALID_ARG, "the prompt has %lld tokens (1..%d allowed)", (long long)n, cap);
    if (st == TWK_OK) memcpy(prompt, ids, (size_t)n * sizeof *ids);
    twk_host_free(ids);
    return st == TWK_OK ? (int)n : -1;
}

int twk_cmd_sample(int argc, char **argv) {
    const char *model = NULL, *adapter = NULL, *device = "cpu", *stop_arg = NULL, *text = NULL, *messages = NULL;
    static int32_t prompt[65536];
    int n_prompt = 0, num = 1, stop_n = 0, print_ids = 0;
    twk_textgen g = {0};
    int32_t stop[64];
    twk_sample_params p = {.max_tokens = 32, .temperature = 1, .top_k = -1, .top_p = 1};
    twk_cli_dtypes dt = TWK_CLI_DTYPES_DEFAULT;
    int dr = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--ids")) {
            print_ids = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "twinkle sample: %s needs a value\n", argv[i]);
            return 2;
        }
        const char *o = argv[i], *v = argv[++i];
        char *end = NULL;
        if (!strcmp(o, "--model")) model = v;
        else if (!strcmp(o, "--adapter")) adapter = v;
        else if (!strcmp(o, "--device")) device = v;
        else if (!strcmp(o, "--prompt")) text = v;
        else if (!strcmp(o, "--messages")) messages = v;
        else if (!strcmp(o, "--prompt-tokens")) {
            if ((n_prompt = parse_ids(v, prompt, 65536)) < 1) {
                fprintf(stderr, "twinkle sample: --prompt-tokens wants ids like 1,2,3\n");
                return 2;
            }
        } else if (!strcmp(o, "--stop")) stop_arg = v;
        else if (!strcmp(o, "--num-samples")) num = (int)strtol(v, &end, 10);
        else if ((dr = twk_cli_dtype_option("sample", o, v, &dt)) < 0) return 2;
        else if (!dr && !twk_cli_sample_option(o, v, &p, &end)) {
            fprintf(stderr, "twinkle sample: unknown option '%s'\n", o);
            return 2;
        }
        if (end && *end) {
            fprintf(stderr, "twinkle sample: %s: '%s' is not a number\n", o, v);
            return 2;
        }
    }
    if (!model || (n_prompt > 0) + (text != NULL) + (messages != NULL) != 1) {
        usage(stderr);
        return 2;
    }
    if (num < 1 || num > 64) {
        fprintf(stderr, "twinkle sample: --num-samples must be 1..64\n");
        return 2;
    }
    twk_device *dev = NULL;
    twk_model *m = NULL;
    twk_sampler *s = NULL;
    twk_sampled_seq *out = NULL;
    int rc = 1;
    if (twk_device_open(device, &dev) != TWK_OK || twk_cli_model_load(model, dev, &dt, &m) != TWK_OK) goto fail;
    if ((text || messages) && (twk_textgen_open(model, twk_model_cfg(m), &g) != TWK_OK ||
                               (n_prompt = text_prompt(&g, text, messages, prompt, 65536)) < 0))
        goto fail;
    if (stop_arg && strcmp(stop_arg, "none") && (stop_n = parse_ids(stop_arg, stop, 64)) < 0) {
        fprintf(stderr, "twinkle sample: --stop wants ids like 2,7 or 'none'\n");
        goto out;
    }
    if (!stop_arg && g.tok) {
        memcpy(stop, g.stop, (size_t)g.n_stop * sizeof *stop);
        stop_n = g.n_stop;
    } else if (!stop_arg) {
        const twk_model_config *c = twk_model_cfg(m);
        for (int i = 0; i < c->n_eos; i++) stop[stop_n++] = c->eos[i];
    }
    p.stop_tokens = stop;
    p.n_stop_tokens = stop_n;
    twk_lora_config lc = twk_lora_default();
    if (adapter && twk_adapter_read_config(adapter, &lc) != TWK_OK) goto fail;
    if (twk_sampler_new(m, adapter ? &lc : NULL, num, n_prompt + (p.max_tokens > 0 ? p.max_tokens : 1) + 1, &s) != TWK_OK)
        goto fail;
    if (adapter && twk_sampler_load_adapter(s, adapter) != TWK_OK) goto fail;
    out = calloc((size_t)num, sizeof *out);
    if (!out || twk_sampler_generate(s, prompt, n_prompt, num, &p, out) != TWK_OK) goto fail;
    for (int k = 0; k < num; k++) {
        char *reply = NULL;
        if (g.tok) {
            int64_t unknown = 0;
            if (twk_textgen_decode(&g, out[k].tokens, out[k].n, &reply, &unknown) != TWK_OK) goto fail;
            printf("%s\n", reply);
            if (unknown)
                fprintf(stderr, "twinkle sample: %lld generated id(s) have no token in tokenizer.json (left out)\n",
                        (long long)unknown);
            twk_host_free(reply);
            if (!print_ids) {
                twk_sampled_seq_free(&out[k]);
                continue;
            }
        }
        printf("{\"tokens\": [");
        for (int64_t i = 0; i < out[k].n; i++) printf("%s%d", i ? ", " : "", out[k].tokens[i]);
        printf("], \"logprobs\": [");
        for (int64_t i = 0; i < out[k].n; i++) printf("%s%.7g", i ? ", " : "", (double)out[k].logprobs[i]);
        printf("], \"stop_reason\": \"%s\"}\n", out[k].stop_reason ? "length" : "stop");
        twk_sampled_seq_free(&out[k]);
    }
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "twinkle sample: %s\n", twk_last_error());
out:
    for (int k = 0; out && k < num; k++) twk_sampled_seq_free(&out[k]);
    twk_textgen_close(&g);
    free(out);
    twk_sampler_free(s);
    twk_model_free(m);
    twk_device_close(dev);
    return rc;
}
