/* Memory planner: a validator proves that no two arena tensors that are live
 * at the same time overlap, on a transformer block's training plan and on
 * random graphs; the planned peak of the block is printed beside the sum of
 * all its intermediates and must be smaller. Plans must also compute the same
 * values as the float64-free re-run at another capacity (planning must not
 * change results). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "twinkle/twinkle.h"

static int check(int cond, const char *what) {
    printf("%s %s\n", cond ? "ok  " : "FAIL", what);
    return cond ? 0 : 1;
}

static int block_plan(twk_device *dev) {
    int fails = 0;
    twk_tiny_lm_config cfg = twk_tiny_lm_default();
    cfg.dim = 96;
    cfg.ffn = 256;
    cfg.n_seqs = 6;
    cfg.seq_len = 40;
    twk_tiny_lm *m = NULL;
    if (twk_tiny_lm_new(&cfg, dev, &m) != TWK_OK) {
        printf("FAIL tiny_lm_new: %s\n", twk_last_error());
        return 1;
    }
    twk_plan_stats s;
    twk_tiny_lm_stats(m, &s);
    twk_status st = twk_plan_validate_memory(twk_tiny_lm_plan(m));
    if (st != TWK_OK) printf("  %s\n", twk_last_error());
    fails += check(st == TWK_OK, "transformer block training plan: no live tensors overlap");
    printf("     block: %d nodes, %d launches, planned peak %zu bytes vs %zu bytes for all intermediates (%.1f%%)\n",
           s.n_nodes_graph, s.n_launches, s.arena_bytes, s.naive_bytes, 100.0 * (double)s.arena_bytes / (double)s.naive_bytes);
    fails += check(s.arena_bytes < s.naive_bytes, "planned peak is smaller than the sum of intermediates");
    /* it still trains: the plan's reuse of memory must not corrupt values */
    float l0 = 0, l = 0;
    for (int i = 0; i < 30; i++) twk_tiny_lm_step(m, i == 0 ? &l0 : &l);
    printf("     loss %.4f -> %.4f over 30 steps\n", l0, l);
    fails += check(l < l0 * 0.5f, "the planned block trains (loss halves in 30 steps)");
    twk_tiny_lm_free(m);
    return fails;
}

/* Random DAGs of elementwise ops with random fan-out; the planner must keep
 * them valid and the values must equal a direct host evaluation. */
static int random_graphs(twk_device *dev) {
    int fails = 0;
    twk_rng r;
    twk_rng_seed(&r, 99);
    for (int trial = 0; trial < 40; trial++) {
        twk_graph *g = twk_graph_new();
        int n = 8 + (int)twk_rng_below(&r, 60);
        int64_t len = 1 + twk_rng_below(&r, 300);
        twk_id ids[80];
        double *vals[80];
        int64_t ne[1] = {len};
        int n_leaves = 3;
        for (int i = 0; i < n_leaves; i++) {
            ids[i] = twk_input(g, "x", TWK_F32, 1, ne);
            vals[i] = malloc((size_t)len * sizeof(double));
            for (int64_t k = 0; k < len; k++) vals[i][k] = (double)(float)(twk_rng_uniform(&r) - 0.5);
        }
        for (int i = n_leaves; i < n; i++) {
            int a = (int)twk_rng_below(&r, i), b = (int)twk_rng_below(&r, i), kind = (int)twk_rng_below(&r, 3);
            vals[i] = malloc((size_t)len * sizeof(double));
            if (kind == 0) ids[i] = twk_add(g, ids[a], ids[b]);
            else if (kind == 1) ids[i] = twk_mul(g, ids[a], ids[b]);
            else ids[i] = twk_scale(g, ids[a], 0.5f);
            for (int64_t k = 0; k < len; k++) {
                float va = (float)vals[a][k], vb = (float)vals[b][k];
                vals[i][k] = kind == 0 ? (double)(va + vb) : kind == 1 ? (double)(va * vb) : (double)(va * 0.5f);
            }
        }
        /* a few outputs in the middle and the last node */
        int outs[3] = {n - 1, n_leaves + (int)twk_rng_below(&r, n - n_leaves), n_leaves + (int)twk_rng_below(&r, n - n_leaves)};
        for (int o = 0; o < 3; o++) twk_graph_output(g, ids[outs[o]]);
        twk_plan *p = NULL;
        if (twk_plan_compile(g, dev, 1, NULL, 0, &p) != TWK_OK) {
            printf("FAIL random graph %d: %s\n", trial, twk_last_error());
            fails++;
            twk_graph_free(g);
            continue;
        }
        if (twk_plan_validate_memory(p) != TWK_OK) {
            printf("FAIL random graph %d: %s\n", trial, twk_last_error());
            fails++;
        }
        float *buf = malloc((size_t)len * sizeof(float));
        for (int i = 0; i < n_leaves; i++) {
            for (int64_t k = 0; k < len; k++) buf[k] = (float)vals[i][k];
            twk_plan_write(p, ids[i], 1, buf, (size_t)len * 4);
        }
        twk_plan_run(p, 1);
        for (int o = 0; o < 3; o++) {
            twk_plan_read(p, ids[outs[o]], 1, buf, (size_t)len * 4);
            for (int64_t k = 0; k < len; k++)
                if (buf[k] != (float)vals[outs[o]][k]) {
                    printf("FAIL random graph %d: output %d element %lld = %g, want %g\n", trial, outs[o],
                           (long long)k, buf[k], vals[outs[o]][k]);
                    fails++;
                    break;
                }
        }
        free(buf);
        for (int i = 0; i < n; i++) free(vals[i]);
        twk_plan_free(p);
        twk_graph_free(g);
    }
    fails += check(fails == 0, "40 random graphs: valid plans, exact values");
    return fails;
}

int main(void) {
    twk_device *dev = NULL;
    if (twk_device_open("cpu", &dev) != TWK_OK) {
        printf("%s\n", twk_last_error());
        return 1;
    }
    int fails = block_plan(dev) + random_graphs(dev);
    twk_device_close(dev);
    printf("%d failures\n", fails);
    return fails ? 1 : 0;
}
