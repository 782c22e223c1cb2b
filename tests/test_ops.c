/* Every op, forward against a float64 reference and backward against central
 * finite differences of that reference, on random inputs of awkward sizes
 * (1, primes, larger than a tile). Cases with token dims run at capacity and
 * at a smaller run-time count. Each case states its tolerances and prints the
 * measured errors.
 *
 * Error measures: forward  max|y - ref| / max(max|ref|, 1);
 *                 backward max|g - fd|  / max(max|fd|, 1e-2) (the floor keeps
 *                 float32 cancellation in near-zero gradients from reading as error),
 * where fd is the central difference (h = 1e-6) of sum(ref(x) * R) for the
 * random R that also weights the engine's loss. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op_cases.h"

static double loss_of(const op_case *c, rt *in, rt *out, const double *R) {
    c->ref(c, in, out);
    double s = 0;
    for (int64_t i = 0; i < rt_nelem(out); i++) s += out->d[i] * R[i];
    return s;
}

/* Runs one case at token count n; returns the number of failures. */
static int run_case(const op_case *c, twk_device *dev, int64_t n, uint64_t seed) {
    twk_rng r;
    twk_rng_seed(&r, seed);
    int64_t cap = c->cap ? c->cap : 1;
    twk_graph *g = twk_graph_new();
    twk_id ids[6];
    rt in[6];
    twk_id y = opc_build(c, g, n, &r, ids, in);
    int64_t yne[4];
    int yn = twk_node_shape(g, y, n, yne);
    rt out = {.ndim = yn > 0 ? yn : 1};
    for (int k = 0; k < out.ndim; k++) out.ne[k] = yn > 0 ? yne[k] : 1;
    int64_t ny = rt_nelem(&out);
    out.d = calloc((size_t)ny, sizeof(double));
    twk_id Rid = opc_weight_input(g, y);
    twk_id loss = twk_weighted_sum(g, y, Rid);
    int fails = 0;
    if (twk_graph_status(g) != TWK_OK) {
        printf("FAIL %-34s build: %s\n", c->name, twk_graph_error(g));
        fails = 1;
        goto done;
    }
    if (twk_graph_backward(g, loss) != TWK_OK) {
        printf("FAIL %-34s backward: %s\n", c->name, twk_last_error());
        fails = 1;
        goto done;
    }
    for (int id = 0; id < twk_graph_size(g); id++) /* a device without one of the case's ops (MoE routing) skips it */
        if (twk_op_has_kernel(twk_node_op(g, id)) && !twk_device_has_op(dev, twk_node_op(g, id))) {
            printf("skip %-34s n=%-3lld no %s kernel on this device\n", c->name, (long long)n, twk_op_name(twk_node_op(g, id)));
            goto done;
        }
    twk_graph_output(g, y);
    twk_id grads[6];
    for (int i = 0; i < c->n_in; i++) {
        grads[i] = c->in[i].diff ? twk_graph_grad(g, ids[i]) : -1;
        if (c->in[i].diff && grads[i] < 0) {
            printf("FAIL %-34s input %d got no gradient\n", c->name, i);
            fails = 1;
            goto done;
        }
        if (grads[i] >= 0) twk_graph_output(g, grads[i]);
    }
    twk_plan *p = NULL;
    if (twk_plan_compile(g, dev, cap, NULL, 0, &p) != TWK_OK) {
        printf("FAIL %-34s compile: %s\n", c->name, twk_last_error());
        fails = 1;
        goto done;
    }
    double *R = malloc((size_t)ny * sizeof(double));
    float *buf = malloc((size_t)(ny > 4096 ? ny : 4096) * 8 + 4096 * 64);
    for (int64_t i = 0; i < ny; i++) R[i] = (double)(float)twk_rng_normal(&r);
    for (int i = 0; i < c->n_in; i++) { /* f32, ids, or bf16 / f16 holding the reference's values exactly */
        size_t bytes = 0;
        void *h = opc_host_input(c, i, in, &bytes);
        if (!h || twk_plan_write(p, ids[i], n, h, bytes) != TWK_OK) {
            printf("FAIL %-34s write: %s\n", c->name, twk_last_error());
            fails++;
        }
        free(h);
    }
    float *Rf = malloc((size_t)ny * sizeof(float));
    for (int64_t i = 0; i < ny; i++) Rf[i] = (float)R[i];
    twk_plan_write(p, Rid, n, Rf, (size_t)ny * 4);
    free(Rf);
    if (twk_plan_run(p, n) != TWK_OK) {
        printf("FAIL %-34s run: %s\n", c->name, twk_last_error());
        fails++;
        goto free_plan;
    }
    /* forward */
    float *yf = malloc((size_t)ny * sizeof(float));
    twk_plan_read(p, y, n, yf, (size_t)ny * 4);
    c->ref(c, in, &out);
    double err = 0, scale = 1;
    for (int64_t i = 0; i < ny; i++) scale = fmax(scale, fabs(out.d[i]));
    for (int64_t i = 0; i < ny; i++) err = fmax(err, fabs((double)yf[i] - out.d[i]));
    if (!(err / scale <= c->fwd_tol)) fails++;
    printf("%s %-34s n=%-3lld fwd err %.2e (tol %.0e)", err / scale <= c->fwd_tol ? "ok  " : "FAIL",
           c->name, (long long)n, err / scale, c->fwd_tol);
    free(yf);
    /* backward: each differentiable input against central differences */
    for (int i = 0; i < c->n_in; i++) {
        if (grads[i] < 0) continue;
        int64_t ne = rt_nelem(&in[i]);
        float *gf = malloc((size_t)ne * sizeof(float));
        twk_plan_read(p, grads[i], n, gf, (size_t)ne * 4);
        int64_t probes = ne < 160 ? ne : 160;
        double gerr = 0, gscale = 1e-2;
        double *fd = malloc((size_t)probes * sizeof(double));
        int64_t *at = malloc((size_t)probes * sizeof(int64_t));
        for (int64_t k = 0; k < probes; k++) {
            int64_t e = probes == ne ? k : twk_rng_below(&r, ne);
            double x0 = in[i].d[e], h = 1e-6 * fmax(1.0, fabs(x0));
            in[i].d[e] = x0 + h;
            double lp = loss_of(c, in, &out, R);
            in[i].d[e] = x0 - h;
            double lm = loss_of(c, in, &out, R);
            in[i].d[e] = x0;
            fd[k] = (lp - lm) / (2 * h);
            at[k] = e;
            gscale = fmax(gscale, fabs(fd[k]));
        }
        for (int64_t k = 0; k < probes; k++) gerr = fmax(gerr, fabs((double)gf[at[k]] - fd[k]));
        int ok = gerr / gscale <= c->bwd_tol;
        if (!ok) fails++;
        printf("  d/in%d %.2e%s", i, gerr / gscale, ok ? "" : " FAIL");
        free(fd);
        free(at);
        free(gf);
    }
    int any_diff = 0;
    for (int i = 0; i < c->n_in; i++) any_diff |= c->in[i].diff;
    if (any_diff) printf("  (bwd tol %.0e)\n", c->bwd_tol);
    else printf("  (forward only: not differentiable)\n");
free_plan:
    free(R);
    free(buf);
    twk_plan_free(p);
done:
    opc_free_inputs(c, in);
    free(out.d);
    twk_graph_free(g);
    return fails;
}

int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : NULL;
    twk_device *dev = NULL;
    if (twk_device_open(getenv("TWK_TEST_DEVICE") ? getenv("TWK_TEST_DEVICE") : "cpu", &dev) != TWK_OK) {
        printf("cannot open device: %s\n", twk_last_error());
        return 1;
    }
    int fails = 0, runs = 0;
    int n_cases = opc_n_cases + opc_n_moe_cases + opc_n_dir_cases; /* then the MoE block, the two-product unembedding */
    for (int i = 0; i < n_cases; i++) {
        const op_case *c = i < opc_n_cases                     ? &opc_cases[i]
                           : i < opc_n_cases + opc_n_moe_cases ? &opc_moe_cases[i - opc_n_cases]
                                                               : &opc_dir_cases[i - opc_n_cases - opc_n_moe_cases];
        if (only && !strstr(c->name, only)) continue;
        if (c->cap) {
            /* at capacity, and at a smaller run-time count */
            fails += run_case(c, dev, c->cap, 1000 + (uint64_t)i);
            fails += run_case(c, dev, c->cap / 2 + 1, 2000 + (uint64_t)i);
            runs += 2;
        } else {
            fails += run_case(c, dev, 1, 1000 + (uint64_t)i);
            runs++;
        }
    }
    twk_device_close(dev);
    printf("%d case runs, %d failures\n", runs, fails);
    return fails ? 1 : 0;
}
