/* `twinkle demo`: the first main job. Trains a one-block transformer from
 * random initialisation to memorise random sequences and prints the loss. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "twinkle/twinkle.h"

static int parse_int(const char *s, const char *flag, long lo, long hi, long *out) {
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) {
        fprintf(stderr, "twinkle demo: %s wants an integer in %ld..%ld, got '%s'\n", flag, lo, hi, s);
        return 0;
    }
    *out = v;
    return 1;
}

int twk_cmd_demo(int argc, char **argv) {
    long steps = 150, seed = 1234;
    const char *device = "cpu";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: twinkle demo [--steps N] [--seed S] [--device cpu]\n"
                   "  Trains a tiny transformer (1 block, RoPE, GQA, SwiGLU) from random\n"
                   "  initialisation to memorise random token sequences; prints the loss.\n");
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "twinkle demo: %s needs a value\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "--steps")) {
            if (!parse_int(argv[++i], "--steps", 1, 100000, &steps)) return 2;
        } else if (!strcmp(argv[i], "--seed")) {
            if (!parse_int(argv[++i], "--seed", 0, 2147483647, &seed)) return 2;
        } else if (!strcmp(argv[i], "--device")) {
            device = argv[++i];
        } else {
            fprintf(stderr, "twinkle demo: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    twk_device *dev = NULL;
    if (twk_device_open(device, &dev) != TWK_OK) {
        fprintf(stderr, "twinkle demo: %s\n", twk_last_error());
        return 1;
    }
    twk_tiny_lm_config cfg = twk_tiny_lm_default();
    cfg.seed = (uint64_t)seed;
    twk_tiny_lm *m = NULL;
    if (twk_tiny_lm_new(&cfg, dev, &m) != TWK_OK) {
        fprintf(stderr, "twinkle demo: %s\n", twk_last_error());
        twk_device_close(dev);
        return 1;
    }
    twk_plan_stats ps;
    twk_tiny_lm_stats(m, &ps);
    printf("twinkle demo on %s: 1-block transformer, vocab %d, dim %d, %d heads (%d kv), %lld packed tokens\n",
           twk_device_spec(dev), cfg.vocab, cfg.dim, cfg.heads, cfg.kv_heads,
           (long long)twk_tiny_lm_tokens(m));
    printf("plan: %d graph nodes -> %d launches; arena %.1f KiB (all intermediates would take %.1f KiB)\n",
           ps.n_nodes_graph, ps.n_launches, ps.arena_bytes / 1024.0, ps.naive_bytes / 1024.0);
    float first = 0, loss = 0;
    double t0 = twk_now();
    int rc = 0;
    for (long s = 1; s <= steps; s++) {
        if (twk_tiny_lm_step(m, &loss) != TWK_OK) {
            fprintf(stderr, "twinkle demo: step %ld: %s\n", s, twk_last_error());
            rc = 1;
            break;
        }
        if (s == 1) first = loss;
        if (s == 1 || s % 10 == 0 || s == steps) {
            double dt = twk_now() - t0;
            printf("step %4ld  loss %8.4f  %8.0f tokens/s\n", s, loss,
                   (double)s * (double)twk_tiny_lm_tokens(m) / (dt > 0 ? dt : 1e-9));
            fflush(stdout);
        }
    }
    if (!rc) printf("loss %.4f -> %.4f (%.1fx lower)\n", first, loss, loss > 0 ? first / loss : 0.0);
    twk_tiny_lm_free(m);
    twk_device_close(dev);
    return rc;
}
