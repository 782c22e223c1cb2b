/* `twinkle export`: a checkpoint's weights out of the service's data dir (or
 * any PEFT adapter folder) — the adapter alone (--peft) or merged into its base
 * model as a full Hugging Face folder (--merge). */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <cJSON.h>

#include "cli.h"
#include "service.h"
#include "twinkle/twinkle.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: twinkle export --checkpoint tinker://RUN/KIND/NAME --data-dir DIR (--merge | --peft) --out DIR\n"
            "       twinkle export --checkpoint ADAPTER_DIR (--merge | --peft) --out DIR\n"
            "  --checkpoint P  a checkpoint of `twinkle serve` (KIND weights, sampler_weights or external_weights;\n"
            "                  found under --data-dir), or a PEFT adapter folder\n"
            "  --data-dir DIR  the service's data dir (default ./twinkle-data)\n"
            "  --merge         write the base model with the adapter merged in (W + alpha/r * B@A), in the base's\n"
            "                  dtype: model.safetensors, config.json, generation_config.json, tokenizer files\n"
            "  --peft          write the adapter alone (adapter_config.json + adapter_model.safetensors)\n"
            "  --model DIR     the base model folder for --merge (default: the adapter's base_model_name_or_path\n"
            "                  when that is a folder, or the service's built-in model in --data-dir)\n"
            "  --out DIR       the folder to write (created; files in it are replaced)\n");
}

/* The base model folder of adapter `dir` for --merge: adapter_config.json's
 * base_model_name_or_path when it is a folder, or the built-in model. NULL with a message. */
static int find_base(const char *adapter, const char *data_dir, char *out, size_t len) {
    char path[1300];
    snprintf(path, sizeof path, "%s/adapter_config.json", adapter);
    char *text = twk_read_file(path, NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    twk_host_free(text);
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "base_model_name_or_path");
    char name[512] = "";
    if (cJSON_IsString(b)) snprintf(name, sizeof name, "%s", b->valuestring);
    cJSON_Delete(j);
    struct stat sb;
    if (name[0] && stat(name, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(out, len, "%s", name);
        return 1;
    }
    if (!strcmp(name, TWK_DEFAULT_MODEL_NAME)) {
        if (twk_serve_default_model(data_dir, out, len) == TWK_OK) return 1;
        fprintf(stderr, "twinkle export: %s\n", twk_last_error());
        return 0;
    }
    fprintf(stderr, "twinkle export: the base model '%s' of %s is not a folder here; pass --model DIR\n",
            name[0] ? name : "(unnamed)", adapter);
    return 0;
}

/* Copies the adapter's two PEFT files into out. */
static twk_status copy_peft(const char *adapter, const char *out) {
    static const char *files[2] = {"adapter_config.json", "adapter_model.safetensors"};
    twk_status st = twk_mkdir_p(out, 0755);
    for (int i = 0; st == TWK_OK && i < 2; i++) {
        char from[1300], to[1300];
        size_t len = 0;
        snprintf(from, sizeof from, "%s/%s", adapter, files[i]);
        snprintf(to, sizeof to, "%s/%s", out, files[i]);
        char *data = twk_read_file(from, &len);
        st = data ? twk_write_file_atomic(to, data, len) : TWK_ERR_IO;
        twk_host_free(data);
    }
    return st;
}

int twk_cmd_export(int argc, char **argv) {
    const char *ckpt = NULL, *data_dir = "twinkle-data", *model = NULL, *out = NULL;
    int merge = 0, peft = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--merge")) {
            merge = 1;
            continue;
        }
        if (!strcmp(argv[i], "--peft")) {
            peft = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "twinkle export: %s needs a value\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "--checkpoint")) ckpt = argv[++i];
        else if (!strcmp(argv[i], "--data-dir")) data_dir = argv[++i];
        else if (!strcmp(argv[i], "--model")) model = argv[++i];
        else if (!strcmp(argv[i], "--out")) out = argv[++i];
        else {
            fprintf(stderr, "twinkle export: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!ckpt || !out || merge + peft != 1) {
        fprintf(stderr, "twinkle export: --checkpoint, --out and one of --merge / --peft are required\n");
        usage(stderr);
        return 2;
    }
    char adapter[1200], base[1200];
    if (!strncmp(ckpt, "tinker://", 9)) {
        if (twk_serve_checkpoint_dir(data_dir, ckpt, adapter, sizeof adapter) != TWK_OK) {
            fprintf(stderr, "twinkle export: --checkpoint: %s\n", twk_last_error());
            return 2;
        }
    } else {
        snprintf(adapter, sizeof adapter, "%s", ckpt);
    }
    struct stat sb;
    char cfg[1300];
    snprintf(cfg, sizeof cfg, "%s/adapter_config.json", adapter);
    if (stat(cfg, &sb) != 0) {
        fprintf(stderr, "twinkle export: --checkpoint: no adapter at %s (is --data-dir right?)\n", adapter);
        return 1;
    }
    twk_status st;
    if (peft) {
        st = copy_peft(adapter, out);
    } else {
        if (model) snprintf(base, sizeof base, "%s", model);
        else if (!find_base(adapter, data_dir, base, sizeof base)) return 1;
        st = twk_adapter_merge(base, adapter, out);
    }
    if (st != TWK_OK) {
        fprintf(stderr, "twinkle export: %s\n", twk_last_error());
        return 1;
    }
    printf("twinkle export: wrote %s (%s of %s)\n", out, peft ? "the PEFT adapter" : "the merged model", ckpt);
    return 0;
}
