/* `twinkle chat`: an interactive conversation with a model (and a PEFT adapter): each line read from
 * stdin is a user turn; the reply is sampled with the KV-cache sampler from the whole conversation
 * rendered by the model's chat template, printed, and kept for the next turn. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cJSON.h>

#include "cli.h"
#include "dtype_opts.h"
#include "textgen.h"
#include "twinkle/twinkle.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: twinkle chat --model DIR [--adapter DIR] [options]\n"
            "Reads user turns from stdin, one per line, and prints each reply (on a terminal after a '> '\n"
            "prompt). '/reset' starts a new conversation; end of input ends it.\n"
            "  --system TEXT       a system message first\n"
            "  --max-tokens N      reply tokens at most (default 256)\n"
            "  --temperature T     0 = greedy (default 0.7)   --top-p P (default 1)   --seed S\n"
            "  --context N         conversation tokens at most (default: the model's max_position_embeddings,\n"
            "                      at most 8192)\n"
            "  --device SPEC       cpu (default), opencl[:N], vulkan[:N] or cuda[:N]\n"
            TWK_CLI_DTYPE_HELP
            "Needs DIR/tokenizer.json and a chat_template in DIR/tokenizer_config.json.\n");
}

static void add_message(cJSON *msgs, const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    cJSON_AddItemToArray(msgs, m);
}

/* One reply to the conversation in msgs: sampled, printed, appended. Errors from the sampler. */
static twk_status reply(twk_textgen *g, twk_sampler *s, int64_t context, const twk_sample_params *p, cJSON *msgs) {
    char *json = cJSON_PrintUnformatted(msgs), *text = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    twk_sampled_seq out = {0};
    twk_status st = json ? twk_textgen_encode_chat(g, json, &ids, &n) : twk_error(TWK_ERR_OOM, "out of memory");
    if (st == TWK_OK && n + p->max_tokens > context)
        st = twk_error(TWK_ERR_INVALID_ARG, "the conversation has %lld tokens; with --max-tokens %d it exceeds the "
                       "context %lld (type /reset)", (long long)n, p->max_tokens, (long long)context);
    if (st == TWK_OK) st = twk_sampler_generate(s, ids, n, 1, p, &out);
    int64_t unknown = 0;
    if (st == TWK_OK) st = twk_textgen_decode(g, out.tokens, out.n, &text, &unknown);
    if (st == TWK_OK) {
        char *a = text, *e = text + strlen(text); /* the reply without surrounding whitespace */
        while (*a == ' ' || *a == '\n' || *a == '\t' || *a == '\r') a++;
        while (e > a && (e[-1] == ' ' || e[-1] == '\n' || e[-1] == '\t' || e[-1] == '\r')) *--e = 0;
        memmove(text, a, (size_t)(e - a) + 1);
        if (unknown)
            fprintf(stderr, "twinkle chat: %lld generated id(s) have no token in tokenizer.json (left out)\n",
                    (long long)unknown);
        printf("%s\n", text);
        fflush(stdout);
        add_message(msgs, "assistant", text);
    }
    cJSON_free(json);
    twk_host_free(ids);
    twk_host_free(text);
    twk_sampled_seq_free(&out);
    return st;
}

int twk_cmd_chat(int argc, char **argv) {
    const char *model = NULL, *adapter = NULL, *device = "cpu", *system = NULL;
    twk_sample_params p = {.max_tokens = 256, .temperature = 0.7f, .top_k = -1, .top_p = 1};
    long context = 0;
    twk_cli_dtypes dt = TWK_CLI_DTYPES_DEFAULT;
    int dr = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "twinkle chat: %s needs a value (or is unknown)\n", argv[i]);
            return 2;
        }
        const char *o = argv[i], *v = argv[++i];
        char *end = NULL;
        if (!strcmp(o, "--model")) model = v;
        else if (!strcmp(o, "--adapter")) adapter = v;
        else if (!strcmp(o, "--device")) device = v;
        else if (!strcmp(o, "--system")) system = v;
        else if (!strcmp(o, "--context")) context = strtol(v, &end, 10);
        else if ((dr = twk_cli_dtype_option("chat", o, v, &dt)) < 0) return 2;
        else if (!dr && !twk_cli_sample_option(o, v, &p, &end)) {
            fprintf(stderr, "twinkle chat: unknown option '%s'\n", o);
            return 2;
        }
        if (end && *end) {
            fprintf(stderr, "twinkle chat: %s: '%s' is not a number\n", o, v);
            return 2;
        }
    }
    if (!model) {
        usage(stderr);
        return 2;
    }
    if (p.max_tokens < 1 || context < 0) {
        fprintf(stderr, "twinkle chat: --max-tokens and --context must be positive\n");
        return 2;
    }
    twk_device *dev = NULL;
    twk_model *m = NULL;
    twk_sampler *s = NULL;
    twk_textgen g = {0};
    cJSON *msgs = cJSON_CreateArray();
    char *line = NULL;
    size_t cap = 0;
    int rc = 1, tty = isatty(0) && isatty(1);
    twk_lora_config lc = twk_lora_default();
    if (twk_device_open(device, &dev) != TWK_OK || twk_cli_model_load(model, dev, &dt, &m) != TWK_OK ||
        twk_textgen_open(model, twk_model_cfg(m), &g) != TWK_OK)
        goto fail;
    if (!context) context = twk_model_cfg(m)->max_positions > 0 && twk_model_cfg(m)->max_positions < 8192
                                ? twk_model_cfg(m)->max_positions : 8192;
    p.stop_tokens = g.stop;
    p.n_stop_tokens = g.n_stop;
    if ((adapter && twk_adapter_read_config(adapter, &lc) != TWK_OK) ||
        twk_sampler_new(m, adapter ? &lc : NULL, 1, context + 1, &s) != TWK_OK ||
        (adapter && twk_sampler_load_adapter(s, adapter) != TWK_OK))
        goto fail;
    if (system) add_message(msgs, "system", system);
    ssize_t len;
    for (;;) {
        if (tty) {
            printf("> ");
            fflush(stdout);
        }
        if ((len = getline(&line, &cap, stdin)) < 0) break;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (!len) continue;
        if (!strcmp(line, "/reset")) {
            cJSON_Delete(msgs);
            msgs = cJSON_CreateArray();
            if (system) add_message(msgs, "system", system);
            continue;
        }
        add_message(msgs, "user", line);
        if (reply(&g, s, context, &p, msgs) != TWK_OK) { /* the turn is dropped; the conversation goes on */
            fprintf(stderr, "twinkle chat: %s\n", twk_last_error());
            cJSON_DeleteItemFromArray(msgs, cJSON_GetArraySize(msgs) - 1);
        }
    }
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "twinkle chat: %s\n", twk_last_error());
out:
    free(line);
    cJSON_Delete(msgs);
    twk_textgen_close(&g);
    twk_sampler_free(s);
    twk_model_free(m);
    twk_device_close(dev);
    return rc;
}
