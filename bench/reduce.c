/* bench_reduce: the wide (two-stage, device-sized) reductions against the older single-group ones
 * (TWK_REDUCE_NARROW=1) on one device, in one run: the program runs itself twice, once per mode,
 * and prints each op's best time of --reps and the ratio old / new.
 *
 *   bench_reduce [--device SPEC] [--reps N] [--n N] [--rows R --cols D]
 *
 * Ops: sum and weighted_sum of n floats, the global gradient norm of n floats (sqsum_parts in 256
 * slices + grad_norm, as the optimizer plan builds it), and rmsnorm's weight gradient over R x D
 * (the plan also holds the map that forms dy, the same in both modes). */
#define _POSIX_C_SOURCE 200809L /* popen, setenv */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "twinkle/twinkle.h"

typedef struct opts {
    const char *device;
    long reps, n, rows, cols;
} opts;

#define N_OPS 4
static const char *op_names[N_OPS] = {"sum", "weighted_sum", "grad_norm", "rmsnorm_back_w"};

/* Best seconds of reps runs of p after a warm-up run; negative on failure. */
static double best_run(twk_plan *p, long reps) {
    if (twk_plan_run(p, 1) != TWK_OK) return -1;
    double best = 1e30;
    for (long r = 0; r < reps; r++) {
        double t0 = twk_now();
        if (twk_plan_run(p, 1) != TWK_OK) return -1;
        double dt = twk_now() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

static void fill(float *x, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(seed >> 11) / 9007199254740992.0 * 2 - 1);
    }
}

/* Builds op k's graph, compiles it on dev, writes random inputs and times it. */
static double time_op(twk_device *dev, int k, const opts *o) {
    twk_graph *g = twk_graph_new();
    int64_t ne[1] = {o->n}, xne[2] = {o->rows, o->cols}, wne[1] = {o->cols}, hn[1] = {TWK_HYPER_N};
    twk_id ins[2] = {-1, -1}, out = -1;
    size_t in_n[2] = {0, 0};
    if (k < 3) {
        twk_id x = twk_input(g, "x", TWK_F32, 1, ne);
        ins[0] = x, in_n[0] = (size_t)o->n;
        if (k == 0) out = twk_sum(g, x);
        if (k == 1) {
            twk_id w = twk_input(g, "w", TWK_F32, 1, ne);
            ins[1] = w, in_n[1] = (size_t)o->n;
            out = twk_weighted_sum(g, x, w);
        }
        if (k == 2) {
            twk_id hy = twk_input(g, "hyper", TWK_F32, 1, hn);
            out = twk_grad_norm(g, twk_sqsum_parts(g, x, o->n < 256 ? (int)o->n : 256), hy);
        }
    } else {
        twk_id x = twk_param(g, "x", 2, xne, false), w = twk_param(g, "w", 1, wne, true);
        twk_id r = twk_input(g, "r", TWK_F32, 2, xne);
        ins[0] = x, ins[1] = r, in_n[0] = in_n[1] = (size_t)(o->rows * o->cols);
        if (twk_graph_backward(g, twk_weighted_sum(g, twk_rmsnorm(g, x, w, 1e-6f), r)) == TWK_OK) out = twk_graph_grad(g, w);
    }
    twk_plan *p = NULL;
    double t = -1;
    if (out >= 0 && twk_graph_output(g, out) == TWK_OK && twk_plan_compile(g, dev, 1, NULL, 0, &p) == TWK_OK) {
        int ok = 1;
        for (int i = 0; i < 2 && ok; i++) {
            if (ins[i] < 0) continue;
            float *buf = malloc(in_n[i] * sizeof(float));
            ok = buf != NULL;
            if (ok) fill(buf, in_n[i], 7 + (uint64_t)i);
            ok = ok && twk_plan_write(p, ins[i], 1, buf, in_n[i] * sizeof(float)) == TWK_OK;
            free(buf);
        }
        if (ok) t = best_run(p, o->reps);
    }
    if (t < 0) fprintf(stderr, "bench_reduce: %s: %s\n", op_names[k], twk_last_error());
    twk_plan_free(p);
    twk_graph_free(g);
    return t;
}

/* The child: one line "op seconds" per op in the mode its environment says. */
static int child(const opts *o) {
    twk_device *dev = NULL;
    if (twk_device_open(o->device, &dev) != TWK_OK) {
        fprintf(stderr, "bench_reduce: %s: %s\n", o->device, twk_last_error());
        return 1;
    }
    for (int k = 0; k < N_OPS; k++) printf("%s %.9f\n", op_names[k], time_op(dev, k, o));
    twk_device_close(dev);
    return 0;
}

/* Runs this program as a child with TWK_REDUCE_NARROW=narrow; fills t[N_OPS]. */
static int run_mode(const char *self, const opts *o, int narrow, double *t) {
    char cmd[1024];
    setenv("TWK_REDUCE_NARROW", narrow ? "1" : "0", 1);
    snprintf(cmd, sizeof cmd, "'%s' --child --device '%s' --reps %ld --n %ld --rows %ld --cols %ld", self, o->device,
             o->reps, o->n, o->rows, o->cols);
    FILE *f = popen(cmd, "r");
    if (!f) return 0;
    char name[64];
    double s;
    int got = 0;
    while (got < N_OPS && fscanf(f, "%63s %lf", name, &s) == 2)
        for (int k = 0; k < N_OPS; k++)
            if (!strcmp(name, op_names[k])) t[k] = s, got++;
    return pclose(f) == 0 && got == N_OPS;
}

int main(int argc, char **argv) {
    opts o = {"opencl", 5, 4 << 20, 1024, 1024};
    int is_child = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--child")) is_child = 1;
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) o.device = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            if (!bench_parse_long(argv[0], argv[++i], "--reps", 1, 1000, &o.reps)) return 2;
        } else if (!strcmp(argv[i], "--n") && i + 1 < argc) {
            if (!bench_parse_long(argv[0], argv[++i], "--n", 1, 1L << 31, &o.n)) return 2;
        } else if (!strcmp(argv[i], "--rows") && i + 1 < argc) {
            if (!bench_parse_long(argv[0], argv[++i], "--rows", 1, 1L << 24, &o.rows)) return 2;
        } else if (!strcmp(argv[i], "--cols") && i + 1 < argc) {
            if (!bench_parse_long(argv[0], argv[++i], "--cols", 1, 1L << 20, &o.cols)) return 2;
        } else {
            fprintf(stderr, "usage: %s [--device SPEC] [--reps N] [--n N] [--rows R --cols D]\n", argv[0]);
            return 2;
        }
    }
    if (is_child) return child(&o);
    double old_t[N_OPS], new_t[N_OPS];
    if (!run_mode(argv[0], &o, 1, old_t) || !run_mode(argv[0], &o, 0, new_t)) {
        fprintf(stderr, "bench_reduce: a run failed\n");
        return 1;
    }
    printf("device %s, best of %ld; sums over n = %ld, rmsnorm_back_w over %ld x %ld\n", o.device, o.reps, o.n, o.rows,
           o.cols);
    printf("%-16s %12s %12s %10s\n", "op", "narrow s", "wide s", "old/new");
    for (int k = 0; k < N_OPS; k++)
        printf("%-16s %12.6f %12.6f %9.2fx\n", op_names[k], old_t[k], new_t[k], old_t[k] / new_t[k]);
    return 0;
}
