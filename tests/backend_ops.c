/* backend_ops: every op case of test_ops (tests/op_cases.c) on every
 * available non-CPU device against the CPU backend, forward and backward, on
 * the same random inputs. Each case's graph gets a random-weighted scalar loss
 * sum(y * R) and twk_graph_backward (a case whose output is indices, moe_topk or
 * moe_sort, gets none: its words must be identical); the same graph is compiled for the CPU
 * and for the device, and the output and every parameter gradient are
 * compared by the normalized mean squared error (as ggml's test-backend-ops)
 *
 *     NMSE = sum (x - ref)^2 / sum ref^2      (ref: the CPU's result)
 *
 * against the tolerance of the op's class (the op table's TOL column). Cases with token dims run at capacity
 * and at a smaller run-time count. One line per (case, device) with the
 * measured NMSEs; a skip line for each backend that is not built or has no
 * device. When no device other than the CPU is present, the CPU is compared
 * with itself (two separately compiled plans must agree bit for bit: the
 * determinism rule), so the harness itself stays tested.
 *
 * usage: backend_ops [FILTER]     run cases whose name contains FILTER
 *        TWK_TEST_DEVICE=spec     compare only this device ("opencl", "cuda:1", ...)
 *        backend_ops --noise EPS [FILTER]
 *                                 compare only "cpu_noise", the CPU backend whose
 *                                 downloads multiply each float by (1 + EPS u), u
 *                                 uniform in [-1, 1]: the harness's own test (EPS
 *                                 1e-3 must fail every case, 1e-7 must pass) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op_cases.h"
#include "twk_backend.h" /* the backend interface: tables, launches */

/* NMSE tolerances by the tolerance class of the case's op (the op table's
 * TOL column; the case's op is its output node's). Float32 rounding in
 * another summation order gives ~1e-14 on short sums and ~1e-12 on long ones;
 * a wrong element or a TF32 GEMM gives 1e-7 and more. */
static const double tol_nmse[] = {
    [TWK_TOL_EXACT] = 1e-12,          /* copies and single roundings: equal up to summation order in backward */
    [TWK_TOL_TRANSCENDENTAL] = 1e-10, /* exp / tanh in another library */
    [TWK_TOL_ACCUM] = 1e-9,           /* reductions and accumulations */
};

static void tolerances(twk_op op, double *fwd, double *bwd) { *fwd = *bwd = tol_nmse[twk_op_info(op)->tol]; }

/* sum (x - ref)^2 / sum ref^2; when ref is all zeros, sum x^2 (0 if both are). NaN/Inf in x give NaN. */
static double nmse(const float *x, const float *ref, int64_t n) {
    double err = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)x[i] - (double)ref[i];
        if (!isfinite((double)x[i]) && isfinite((double)ref[i])) return NAN;
        err += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? err / den : err;
}

/* Kernel ops each device launched over all cases (coverage report). */
typedef struct coverage {
    int launched[TWK_OP_COUNT];
} coverage;

static void note_launches(const twk_plan *p, coverage *cov) {
    const twk_hal_plan *h = twk_plan_hal(p);
    for (int i = 0; i < h->n_launches; i++)
        if ((int)h->launches[i].op >= 0 && h->launches[i].op < TWK_OP_COUNT) cov->launched[h->launches[i].op]++;
}

/* Writes the inputs and R, runs, reads y and the gradients into out (ny + the
 * gradients' sizes, in order). Returns 0 and prints the failure otherwise. */
static int run_on(twk_plan *p, const op_case *c, int64_t n, const twk_id *ids, const rt *in, twk_id Rid,
                  const float *R, int64_t ny, twk_id y, const twk_id *grads, float *out, const char *who) {
    for (int i = 0; i < c->n_in; i++) {
        size_t bytes = 0;
        void *h = opc_host_input(c, i, in, &bytes);
        twk_status s = h ? twk_plan_write(p, ids[i], n, h, bytes) : TWK_ERR_OOM;
        free(h);
        if (s != TWK_OK) {
            printf("FAIL %-12s %-34s n=%-3lld write in%d: %s\n", who, c->name, (long long)n, i, twk_last_error());
            return 0;
        }
    }
    int any_grad = 0;
    for (int i = 0; i < c->n_in; i++) any_grad |= grads[i] >= 0;
    /* without a gradient the loss, and R with it, is dead code */
    if ((any_grad && twk_plan_write(p, Rid, n, R, (size_t)ny * 4) != TWK_OK) || twk_plan_run(p, n) != TWK_OK ||
        twk_plan_read(p, y, n, out, (size_t)ny * 4) != TWK_OK) {
        printf("FAIL %-12s %-34s n=%-3lld run: %s\n", who, c->name, (long long)n, twk_last_error());
        return 0;
    }
    out += ny;
    for (int i = 0; i < c->n_in; i++) {
        if (grads[i] < 0) continue;
        int64_t ne = rt_nelem(&in[i]);
        if (twk_plan_read(p, grads[i], n, out, (size_t)ne * 4) != TWK_OK) {
            printf("FAIL %-12s %-34s n=%-3lld read d/in%d: %s\n", who, c->name, (long long)n, i, twk_last_error());
            return 0;
        }
        out += ne;
    }
    return 1;
}

/* One case at token count n on `dev` against `cpu`; returns the number of failures. */
static int compare_case(const op_case *c, twk_device *cpu, twk_device *dev, int64_t n, uint64_t seed, int exact,
                        coverage *cov, int skip_missing) {
    const char *who = twk_device_spec(dev);
    twk_rng r;
    twk_rng_seed(&r, seed);
    int64_t cap = c->cap ? c->cap : 1;
    twk_graph *g = twk_graph_new();
    twk_id ids[6], grads[6];
    rt in[6];
    twk_plan *pc = NULL, *pd = NULL;
    float *R = NULL, *oc = NULL, *od = NULL;
    int fails = 1;
    if (!g) {
        printf("FAIL %-12s %-34s graph_new: %s\n", who, c->name, twk_last_error());
        return 1;
    }
    twk_id y = opc_build(c, g, n, &r, ids, in);
    /* an index output (moe_topk, moe_sort): no loss, compared word for word */
    twk_dtype yt = y >= 0 ? twk_node_dtype(g, y) : TWK_F32;
    int index_out = yt == TWK_I32 || yt == TWK_I64;
    twk_id Rid = index_out ? -1 : opc_weight_input(g, y);
    twk_id loss = index_out ? -1 : twk_weighted_sum(g, y, Rid);
    if (twk_graph_status(g) != TWK_OK) {
        printf("FAIL %-12s %-34s build: %s\n", who, c->name, twk_graph_error(g));
        goto done;
    }
    if (!index_out && twk_graph_backward(g, loss) != TWK_OK) {
        printf("FAIL %-12s %-34s backward: %s\n", who, c->name, twk_last_error());
        goto done;
    }
    if (skip_missing) /* the MoE block, the two-product unembedding: a device without one of the case's ops skips it */
        for (int id = 0; id < twk_graph_size(g); id++)
            if (twk_op_has_kernel(twk_node_op(g, id)) && !twk_device_has_op(dev, twk_node_op(g, id))) {
                printf("skip %-12s %-34s n=%-3lld no %s kernel\n", who, c->name, (long long)n, twk_op_name(twk_node_op(g, id)));
                fails = 0;
                goto done;
            }
    twk_graph_output(g, y);
    int64_t total = 0, yne[4];
    int yn = twk_node_shape(g, y, n, yne);
    int64_t ny = 1;
    for (int k = 0; k < yn; k++) ny *= yne[k];
    total = ny;
    for (int i = 0; i < c->n_in; i++) {
        grads[i] = c->in[i].diff ? twk_graph_grad(g, ids[i]) : -1;
        if (c->in[i].diff && grads[i] < 0) {
            printf("FAIL %-12s %-34s input %d got no gradient\n", who, c->name, i);
            goto done;
        }
        if (grads[i] >= 0) {
            twk_graph_output(g, grads[i]);
            total += rt_nelem(&in[i]);
        }
    }
    if (twk_plan_compile(g, cpu, cap, NULL, 0, &pc) != TWK_OK) {
        printf("FAIL %-12s %-34s compile on cpu: %s\n", who, c->name, twk_last_error());
        goto done;
    }
    if (twk_plan_compile(g, dev, cap, NULL, 0, &pd) != TWK_OK) {
        printf("FAIL %-12s %-34s n=%-3lld compile: %s\n", who, c->name, (long long)n, twk_last_error());
        goto done;
    }
    note_launches(pd, cov);
    R = malloc((size_t)ny * sizeof(float));
    oc = malloc((size_t)total * sizeof(float));
    od = malloc((size_t)total * sizeof(float));
    if (!R || !oc || !od) {
        printf("FAIL %-12s %-34s out of host memory\n", who, c->name);
        goto done;
    }
    for (int64_t i = 0; i < ny; i++) R[i] = (float)twk_rng_normal(&r);
    if (!run_on(pc, c, n, ids, in, Rid, R, ny, y, grads, oc, "cpu") ||
        !run_on(pd, c, n, ids, in, Rid, R, ny, y, grads, od, who))
        goto done;
    if (index_out) {
        int64_t differ = 0;
        for (int64_t i = 0; i < ny; i++) differ += memcmp(&od[i], &oc[i], 4) != 0;
        fails = differ != 0;
        printf("%s %-12s %-34s n=%-3lld %lld of %lld ids differ  (identical required)\n", fails ? "FAIL" : "ok  ", who,
               c->name, (long long)n, (long long)differ, (long long)ny);
        goto done;
    }
    double ftol, btol;
    tolerances(twk_node_op(g, y), &ftol, &btol);
    if (exact) ftol = btol = 0;
    fails = 0;
    char line[512];
    int len = 0;
    double e = nmse(od, oc, ny);
    int ok = e <= ftol;
    fails += !ok;
    len += snprintf(line + len, sizeof line - (size_t)len, "fwd %.1e%s", e, ok ? "" : " FAIL");
    int64_t off = ny, any_diff = 0;
    for (int i = 0; i < c->n_in; i++) {
        if (grads[i] < 0) continue;
        int64_t ne = rt_nelem(&in[i]);
        e = nmse(od + off, oc + off, ne);
        ok = e <= btol;
        fails += !ok;
        any_diff = 1;
        if (len < (int)sizeof line - 40)
            len += snprintf(line + len, sizeof line - (size_t)len, "  d/in%d %.1e%s", i, e, ok ? "" : " FAIL");
        off += ne;
    }
    if (any_diff) printf("%s %-12s %-34s n=%-3lld %s  (nmse tol %.0e / %.0e)\n", fails ? "FAIL" : "ok  ", who,
                         c->name, (long long)n, line, ftol, btol);
    else printf("%s %-12s %-34s n=%-3lld %s  (nmse tol %.0e; forward only)\n", fails ? "FAIL" : "ok  ", who,
                c->name, (long long)n, line, ftol);
done:
    free(R);
    free(oc);
    free(od);
    twk_plan_free(pc);
    twk_plan_free(pd);
    opc_free_inputs(c, in);
    twk_graph_free(g);
    return fails;
}

/* Every case (and the extra token-dim cases) on one device; returns failures. */
static int run_device(twk_device *cpu, twk_device *dev, const char *only, int exact, int *runs) {
    coverage cov;
    memset(&cov, 0, sizeof cov);
    int fails = 0;
    double t0 = twk_now();
    for (int table = 0; table < 4; table++) {
        const op_case *cases = table == 3 ? opc_dir_cases : table == 2 ? opc_moe_cases : table ? opc_extra_cases : opc_cases;
        int count = table == 3 ? opc_n_dir_cases : table == 2 ? opc_n_moe_cases : table ? opc_n_extra_cases : opc_n_cases;
        for (int i = 0; i < count; i++) {
            const op_case *c = &cases[i];
            if (only && !strstr(c->name, only)) continue;
            uint64_t seed = (uint64_t)(table * 500 + i);
            if (c->cap) {
                /* at capacity, and at a smaller run-time count */
                fails += compare_case(c, cpu, dev, c->cap, 3000 + seed, exact, &cov, table >= 2);
                fails += compare_case(c, cpu, dev, c->cap / 2 + 1, 4000 + seed, exact, &cov, table >= 2);
                *runs += 2;
            } else {
                fails += compare_case(c, cpu, dev, 1, 3000 + seed, exact, &cov, table >= 2);
                (*runs)++;
            }
        }
    }
    if (!only) {
        char missing[512] = "";
        int len = 0, kinds = 0;
        for (int op = 0; op < TWK_OP_COUNT; op++) {
            if (!twk_op_has_kernel((twk_op)op)) continue; /* no launch */
            if (cov.launched[op]) kinds++;
            else if (len < (int)sizeof missing - 32)
                len += snprintf(missing + len, sizeof missing - (size_t)len, " %s", twk_op_name((twk_op)op));
        }
        printf("     %s launched %d kinds of op over the cases%s%s (%.1f s)\n", twk_device_spec(dev), kinds,
               len ? "; never launched:" : "", missing, twk_now() - t0);
    }
    return fails;
}

/* Opens `spec` and compares it with the CPU; 1 when it has no device (skip line printed). */
static int device_pass(twk_device *cpu, const char *spec, const char *only, int exact, int *fails, int *runs) {
    twk_device *dev = NULL;
    if (twk_device_open(spec, &dev) != TWK_OK) {
        printf("FAIL %s: cannot open: %s\n", spec, twk_last_error());
        (*fails)++;
        return 0;
    }
    twk_device_props props;
    if (twk_device_backend(dev)->device_props(0, &props) == TWK_OK)
        printf("---- %s (%s)%s\n", twk_device_spec(dev), props.name,
               exact ? ": the CPU against itself, two plans, bit-identical (no other device)" : " against cpu");
    *fails += run_device(cpu, dev, only, exact, runs);
    twk_device_close(dev);
    return 0;
}

/* ---- "cpu_noise": the CPU backend with perturbed downloads ---- */

static double noise_eps;
static twk_backend_iface noise_iface;

static twk_status noise_download(void *ctx, const twk_buffer *src, size_t off, void *dst, size_t bytes) {
    twk_status s = twk_cpu_backend()->download(ctx, src, off, dst, bytes);
    static twk_rng r;
    static int seeded;
    if (!seeded) twk_rng_seed(&r, 99), seeded = 1;
    float *f = dst;
    for (size_t i = 0; s == TWK_OK && i < bytes / 4; i++) f[i] *= (float)(1.0 + noise_eps * (2 * twk_rng_uniform(&r) - 1));
    return s;
}

static void register_noise(double eps) {
    noise_eps = eps;
    noise_iface = *twk_cpu_backend();
    noise_iface.name = "cpu_noise";
    noise_iface.download = noise_download;
    twk_backend_register(&noise_iface);
}

int main(int argc, char **argv) {
    const char *want = getenv("TWK_TEST_DEVICE");
    if (want && !*want) want = NULL;
    int arg = 1;
    if (argc > 2 && !strcmp(argv[1], "--noise")) {
        register_noise(atof(argv[2]));
        want = "cpu_noise";
        arg = 3;
    }
    const char *only = argc > arg ? argv[arg] : NULL;
    twk_device *cpu = NULL;
    if (twk_device_open("cpu", &cpu) != TWK_OK) {
        printf("FAIL cannot open the CPU: %s\n", twk_last_error());
        return 1;
    }
    int fails = 0, runs = 0, devices = 0;
    char name[32] = "";
    if (want) snprintf(name, sizeof name, "%.*s", (int)strcspn(want, ":"), want);
    if (want && strcmp(name, "cpu") != 0) {
        const twk_backend_iface *b = twk_backend_find(name);
        if (!b || b->device_count() == 0) {
            printf("skip %s: %s\n", want, b ? "the backend has no device here" : "not built into this binary");
        } else {
            device_pass(cpu, want, only, 0, &fails, &runs);
            devices++;
        }
    } else if (!want) {
        static const char *known[] = {"opencl", "vulkan", "cuda"};
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
            if (!twk_backend_find(known[k]))
                printf("skip %s: not built into this binary (-DTWK_%s=ON)\n", known[k],
                       k == 0 ? "OPENCL" : k == 1 ? "VULKAN" : "CUDA");
        for (int i = 0; i < twk_backend_count(); i++) {
            const twk_backend_iface *b = twk_backend_get(i);
            if (!strcmp(b->name, "cpu")) continue;
            int nd = b->device_count();
            if (nd == 0) {
                printf("skip %s: registered, but no device (device_count 0)\n", b->name);
                continue;
            }
            for (int d = 0; d < nd; d++) {
                char spec[48];
                snprintf(spec, sizeof spec, "%s:%d", b->name, d);
                device_pass(cpu, spec, only, 0, &fails, &runs);
                devices++;
            }
        }
    }
    if (devices == 0) device_pass(cpu, "cpu", only, 1, &fails, &runs);
    twk_device_close(cpu);
    printf("%d case runs on %d device(s) other than the CPU%s, %d failures\n", runs, devices,
           devices ? "" : " (CPU self-check only)", fails);
    return fails ? 1 : 0;
}
