/* bench_overhead: the executor's cost per node, from a compiled CPU plan of a long
 * chain of tiny ops (scale, add, alternating) run many times; prints µs/node and µs/run. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "twinkle/twinkle.h"
#include "twk_backend.h" /* the backend interface: tables, launches */

#define SCALE_BY 0.5f

/* Compiles a chain x -> scale -> add(p) -> scale -> ... of `nodes` ops on an
 * [elems] tensor, runs it `runs` times per batch, keeps the best batch, and
 * checks the output against the same arithmetic on the host. Returns 0 on an
 * error (message printed). */
static int bench_chain(twk_device *dev, int64_t elems, int nodes, int runs, int batches) {
    int ok = 0;
    twk_plan *p = NULL;
    float *x = malloc((size_t)elems * sizeof(float)), *w = malloc((size_t)elems * sizeof(float));
    float *y = malloc((size_t)elems * sizeof(float));
    twk_graph *g = twk_graph_new();
    if (!x || !w || !y || !g) {
        fprintf(stderr, "bench_overhead: out of memory: %s\n", twk_last_error());
        goto done;
    }
    int64_t ne[1] = {elems};
    twk_id xin = twk_input(g, "x", TWK_F32, 1, ne);
    twk_id pw = twk_param(g, "p", 1, ne, false);
    twk_id h = xin;
    for (int i = 0; i < nodes; i++) h = (i % 2 == 0) ? twk_scale(g, h, SCALE_BY) : twk_add(g, h, pw);
    if (twk_graph_status(g) != TWK_OK) {
        fprintf(stderr, "bench_overhead: building the chain: %s\n", twk_graph_error(g));
        goto done;
    }
    double tc = twk_now();
    if (twk_graph_output(g, h) != TWK_OK || twk_plan_compile(g, dev, 1, NULL, 0, &p) != TWK_OK) {
        fprintf(stderr, "bench_overhead: compiling: %s\n", twk_last_error());
        goto done;
    }
    tc = twk_now() - tc;
    twk_plan_stats st;
    twk_plan_get_stats(p, &st);

    twk_rng rng;
    twk_rng_seed(&rng, 7);
    for (int64_t i = 0; i < elems; i++) {
        x[i] = (float)(2.0 * twk_rng_uniform(&rng) - 1.0);
        w[i] = (float)(twk_rng_uniform(&rng) * 0.01);
    }
    size_t bytes = (size_t)elems * sizeof(float);
    /* with a single node the param is unused, removed as dead, and has no storage */
    if (twk_plan_write(p, xin, 1, x, bytes) != TWK_OK ||
        (nodes > 1 && twk_plan_write(p, pw, 1, w, bytes) != TWK_OK)) {
        fprintf(stderr, "bench_overhead: plan_write: %s\n", twk_last_error());
        goto done;
    }
    for (int i = 0; i < 10; i++) /* warm-up */
        if (twk_plan_run(p, 1) != TWK_OK) {
            fprintf(stderr, "bench_overhead: plan_run: %s\n", twk_last_error());
            goto done;
        }
    double best = INFINITY;
    for (int b = 0; b < batches; b++) {
        double t0 = twk_now();
        for (int r = 0; r < runs; r++)
            if (twk_plan_run(p, 1) != TWK_OK) {
                fprintf(stderr, "bench_overhead: plan_run: %s\n", twk_last_error());
                goto done;
            }
        double t = twk_now() - t0;
        if (t < best) best = t;
    }
    if (twk_plan_read(p, h, 1, y, bytes) != TWK_OK) {
        fprintf(stderr, "bench_overhead: plan_read: %s\n", twk_last_error());
        goto done;
    }
    double worst = 0;
    for (int64_t e = 0; e < elems; e++) {
        float v = x[e];
        for (int i = 0; i < nodes; i++) v = (i % 2 == 0) ? v * SCALE_BY : v + w[e];
        double d = fabs((double)v - (double)y[e]);
        if (isnan(d) || d > worst) worst = isnan(d) ? INFINITY : d;
    }
    double us_run = best / runs * 1e6;
    int launches = st.n_launches > 0 ? st.n_launches : 1;
    printf("%-8lld %7d %9d %6d x %-5d %10.2f %10.3f %9.1f %10.2e%s\n", (long long)elems, st.n_nodes_graph,
           st.n_launches, batches, runs, us_run, us_run / launches, tc * 1e3, worst,
           worst > 1e-5 ? "  MISMATCH" : "");
    fflush(stdout);
    ok = worst <= 1e-5;
    if (!ok) fprintf(stderr, "bench_overhead: the chain's output differs from the host's (%.3g)\n", worst);
done:
    twk_plan_free(p);
    twk_graph_free(g);
    free(x), free(w), free(y);
    return ok;
}

int main(int argc, char **argv) {
    long nodes = 1000, runs = 2000, batches = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: bench_overhead [--nodes N] [--runs R] [--batches B]\n"
                   "  Executor overhead: a chain of N (default 1000) alternating scale/add ops on a\n"
                   "  [4] tensor, compiled once and run R times (default 2000) per batch, best of B\n"
                   "  batches (default 5); then the same chain on [4096] elements (R/10 runs) for\n"
                   "  context, where the kernels' own work shows.\n");
            return 0;
        }
        if (strcmp(argv[i], "--nodes") && strcmp(argv[i], "--runs") && strcmp(argv[i], "--batches")) {
            fprintf(stderr, "bench_overhead: unknown option '%s' (see --help)\n", argv[i]);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_overhead: %s needs a value (see --help)\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "--nodes")) {
            if (!bench_parse_long("bench_overhead", argv[++i], "--nodes", 1, 1000000, &nodes)) return 2;
        } else if (!strcmp(argv[i], "--runs")) {
            if (!bench_parse_long("bench_overhead", argv[++i], "--runs", 1, 10000000, &runs)) return 2;
        } else { /* --batches */
            if (!bench_parse_long("bench_overhead", argv[++i], "--batches", 1, 1000, &batches)) return 2;
        }
    }
    twk_device *dev = NULL;
    if (twk_device_open("cpu", &dev) != TWK_OK) {
        fprintf(stderr, "bench_overhead: %s\n", twk_last_error());
        return 1;
    }
    twk_device_props props;
    if (twk_device_backend(dev)->device_props(0, &props) != TWK_OK) {
        fprintf(stderr, "bench_overhead: device_props: %s\n", twk_last_error());
        twk_device_close(dev);
        return 1;
    }
    printf("bench_overhead: %s on %s, %d threads; chain of %ld ops (scale x%g, add p), best batch\n\n",
           twk_device_spec(dev), props.name, props.max_threads, nodes, (double)SCALE_BY);
    printf("%-8s %7s %9s %14s %10s %10s %9s %10s\n", "elems", "nodes", "launches", "batches x runs",
           "us/run", "us/node", "compile", "max|diff|");
    printf("%-8s %7s %9s %14s %10s %10s %9s %10s\n", "", "(graph)", "", "", "", "", "ms", "");
    int rc = 0;
    if (!bench_chain(dev, 4, (int)nodes, (int)runs, (int)batches)) rc = 1;
    long mid_runs = runs / 10 > 0 ? runs / 10 : 1;
    if (!rc && !bench_chain(dev, 4096, (int)nodes, (int)mid_runs, (int)batches)) rc = 1;
    twk_device_close(dev);
    return rc;
}
