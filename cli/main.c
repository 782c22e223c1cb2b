/* twinkle — the command-line entry point: dispatches to subcommands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "twinkle/twinkle.h"
#include "twk_cpu_blas.h"

static void usage(FILE *f) {
    fprintf(f,
            "twinkle %s — LLM training engine\n"
            "\n"
            "usage: twinkle <command> [options]\n"
            "\n"
            "commands:\n"
            "  demo      train a tiny transformer from scratch on a memorisation task\n"
            "  train     train a Hugging Face model (LoRA or full) from JSONL; --loss picks the mode:\n"
            "              cross_entropy (SFT, pre-training; the default), RL on rollouts (grpo, ppo,\n"
            "              importance_sampling, cispo, dro, gspo, ...), preference (dpo, ipo) and\n"
            "              distillation from a teacher (forward_kl, reverse_kl, jsd)\n"
            "  serve     the Tinker-compatible training service (LoRA, many tenants)\n"
            "  sample    generate from a model (+ adapter) with the KV-cache sampler\n"
            "  chat      an interactive conversation with a model (+ adapter), turns read from stdin\n"
            "  score     per-token logprobs of JSONL examples under a model (+ adapter)\n"
            "  export    a checkpoint's adapter (--peft) or the base model with it merged (--merge)\n"
            "  plan      the memory a training configuration takes (weights, adapter, optimizer,\n"
            "              activations, KV cache), from config.json alone, and whether it fits a device\n"
            "  devices   list backends and devices\n"
            "  version   print the version\n"
            "  help      this text\n"
            "\n"
            "Run `twinkle <command> --help` for a command's options.\n",
            TWK_VERSION);
}

/* OpenBLAS reads its settings when it loads, before main, so the program starts itself again
 * (once) with them in the environment:
 * - OPENBLAS_CORETYPE, where OpenBLAS picked an older kernel set than the CPU runs (see
 *   backends/cpu/cpu_blas_core.c);
 * - for `serve`, OPENBLAS_THREAD_TIMEOUT=TWK_SERVE_BLAS_TIMEOUT: after each threaded product
 *   OpenBLAS's threads otherwise spin (sched_yield) for 2^28 cycles (~0.1 s) waiting for the next,
 *   and a service taking steps every few milliseconds keeps them spinning on cores its loop
 *   thread and co-located clients need (measured at 8 tenants: bench/README.md, "bench/server").
 * A variable already set is left alone; if the restart fails, the program goes on as it is. */
#define TWK_SERVE_BLAS_TIMEOUT "4" /* 2^4 cycles: the threads sleep at once and are woken per product */

static void blas_restart(int argc, char **argv) {
    int again = 0;
    const char *better = getenv("OPENBLAS_CORETYPE") ? NULL : twk_cpu_blas_better_core();
    if (better && setenv("OPENBLAS_CORETYPE", better, 1) == 0) again = 1;
    if (argc > 1 && !strcmp(argv[1], "serve") && !getenv("OPENBLAS_THREAD_TIMEOUT") &&
        setenv("OPENBLAS_THREAD_TIMEOUT", TWK_SERVE_BLAS_TIMEOUT, 1) == 0)
        again = 1;
    if (!again) return;
    execv("/proc/self/exe", argv);
    if (better) unsetenv("OPENBLAS_CORETYPE");
}

int main(int argc, char **argv) {
    blas_restart(argc, argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "demo")) return twk_cmd_demo(argc - 1, argv + 1);
    if (!strcmp(cmd, "train")) return twk_cmd_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return twk_cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "score")) return twk_cmd_score(argc - 1, argv + 1);
    if (!strcmp(cmd, "sample")) return twk_cmd_sample(argc - 1, argv + 1);
    if (!strcmp(cmd, "export")) return twk_cmd_export(argc - 1, argv + 1);
    if (!strcmp(cmd, "chat")) return twk_cmd_chat(argc - 1, argv + 1);
    if (!strcmp(cmd, "devices")) return twk_cmd_devices(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan")) return twk_cmd_plan(argc - 1, argv + 1);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("twinkle %s\n", TWK_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "twinkle: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
