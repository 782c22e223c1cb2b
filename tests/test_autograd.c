/* Autograd structure: only tensors on a path from a trainable parameter get
 * gradient ops (a frozen base weight gets none — the LoRA case), fan-out
 * accumulates, and dead-node removal drops what no output needs. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "twinkle/twinkle.h"

static int fails;

static void check(int cond, const char *what) {
    printf("%s %s\n", cond ? "ok  " : "FAIL", what);
    fails += !cond;
}

static int count_op(const twk_graph *g, twk_op op, int from) {
    int n = 0;
    for (int i = from; i < twk_graph_size(g); i++) n += twk_node_op(g, i) == op;
    return n;
}

/* y = x W^T + (x A^T) B^T with W frozen and A, B trainable (a LoRA layer). */
static void lora_structure(void) {
    twk_graph *g = twk_graph_new();
    int64_t xs[2] = {TWK_T, 16}, ws[2] = {12, 16}, as[2] = {4, 16}, bs[2] = {12, 4};
    twk_id x = twk_input(g, "x", TWK_F32, 2, xs);
    twk_id W = twk_param(g, "W", 2, ws, false);
    twk_id A = twk_param(g, "A", 2, as, true);
    twk_id B = twk_param(g, "B", 2, bs, true);
    twk_id base = twk_matmul(g, x, W, false, true);
    twk_id low = twk_matmul(g, twk_matmul(g, x, A, false, true), B, false, true);
    twk_id loss = twk_sum(g, twk_silu(g, twk_add(g, base, low)));
    int before = twk_graph_size(g);
    check(twk_graph_backward(g, loss) == TWK_OK, "backward of a LoRA layer");
    check(twk_graph_grad(g, W) < 0, "the frozen weight has no gradient");
    check(twk_graph_grad(g, A) >= 0 && twk_graph_grad(g, B) >= 0, "the adapter weights have gradients");
    /* backward matmuls: dB = dY^T (xA^T); d(xA^T) = dY B; dA = d(xA^T)^T x.
     * No dW, and no dx (x is an input). */
    int mm = count_op(g, TWK_OP_MATMUL, before);
    printf("     backward appended %d nodes, %d of them matmuls\n", twk_graph_size(g) - before, mm);
    check(mm == 3, "exactly 3 backward matmuls (no gradient for W or x)");
    twk_graph_free(g);
}

/* x feeds three ops: loss = sum(x*x) + sum(3x) + mean(x); dloss/dx = 2x + 3 + 1/N. */
static void fan_out(twk_device *dev) {
    twk_graph *g = twk_graph_new();
    int64_t xs[1] = {7};
    twk_id x = twk_param(g, "x", 1, xs, true);
    twk_id loss = twk_add(g, twk_add(g, twk_sum(g, twk_mul(g, x, x)), twk_sum(g, twk_scale(g, x, 3.0f))),
                          twk_mean(g, x));
    twk_graph_backward(g, loss);
    twk_id gx = twk_graph_grad(g, x);
    twk_graph_output(g, gx);
    twk_plan *p = NULL;
    if (twk_plan_compile(g, dev, 1, NULL, 0, &p) != TWK_OK) {
        printf("FAIL compile: %s\n", twk_last_error());
        fails++;
        twk_graph_free(g);
        return;
    }
    float xv[7] = {-3, -1.5f, 0, 0.25f, 1, 2, 5}, gv[7];
    twk_plan_write(p, x, 1, xv, sizeof xv);
    twk_plan_run(p, 1);
    twk_plan_read(p, gx, 1, gv, sizeof gv);
    double err = 0;
    for (int i = 0; i < 7; i++) err = fmax(err, fabs(gv[i] - (2.0 * xv[i] + 3.0 + 1.0 / 7.0)));
    printf("     max |g - (2x + 3 + 1/7)| = %.2e (tol 1e-6)\n", err);
    check(err <= 1e-6, "fan-out gradients accumulate");
    twk_plan_free(p);
    twk_graph_free(g);
}

static void dead_nodes(twk_device *dev) {
    twk_graph *g = twk_graph_new();
    int64_t xs[2] = {5, 5};
    twk_id x = twk_input(g, "x", TWK_F32, 2, xs);
    twk_id live = twk_silu(g, x);
    for (int i = 0; i < 10; i++) twk_matmul(g, x, x, false, false); /* never used */
    twk_graph_output(g, twk_scale(g, live, 2.0f));
    twk_graph_set_fusion(g, false); /* silu -> scale would be one fused launch */
    twk_plan *p = NULL;
    twk_status st = twk_plan_compile(g, dev, 1, NULL, 0, &p);
    twk_plan_stats s = {0};
    twk_plan_get_stats(p, &s);
    printf("     %d graph nodes -> %d launches\n", s.n_nodes_graph, s.n_launches);
    check(st == TWK_OK && s.n_launches == 2, "dead-node removal keeps only the 2 live ops");
    check(twk_plan_write(p, 3, 1, NULL, 0) == TWK_ERR_INVALID_ARG && strstr(twk_last_error(), "not used"),
          "a removed tensor cannot be written");
    twk_plan_free(p);
    twk_graph_free(g);
}

int main(void) {
    twk_device *dev = NULL;
    if (twk_device_open("cpu", &dev) != TWK_OK) return 1;
    lora_structure();
    fan_out(dev);
    dead_nodes(dev);
    twk_device_close(dev);
    printf("%d failures\n", fails);
    return fails ? 1 : 0;
}
