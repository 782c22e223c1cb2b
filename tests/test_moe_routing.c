/* Routing edge cases of a whole mixture-of-experts MLP (the graph train/model.c's moe_mlp builds:
 * router, moe_topk, moe_gate, moe_sort x3, moe_dispatch, the experts' gate / up / down stacks
 * through lora_gather, SwiGLU, moe_combine), forward and backward against a float64 reference:
 *
 *   - an expert that receives no token (its weights' gradients exactly 0),
 *   - every token to one expert, at the plan's capacity: that expert's group is the whole batch
 *     and no token is dropped (there is no capacity factor: a group holds up to T*K rows),
 *   - ties in the router logits, at the k-th / (k+1)-th boundary and inside the chosen set.
 *
 * Ties: twinkle takes the lower expert index (include/twinkle/graph.h, twk_moe_topk).
 * transformers 5.24 takes torch.topk of the softmax on the CPU, whose choice among exact ties is
 * not a function of the indices: it depends on the other values of the row. Measured with torch
 * 2.15: two selection paths, split at k * 64 <= E (a heap selection: E equal logits give experts
 * 0..k-1, in heap order from k = 4: E = 256, k = 4 -> 1, 3, 0, 2) and k * 64 > E (a quickselect:
 * 8 equal logits, k = 2 -> 6, 5; 63 equal, k = 1 -> 41); with a 2..4-way tie at the k-th place
 * among random logits the lower-index rule agreed on 91 of 300 rows for E = 8, k = 2, 156 of 300
 * for E = 128, k = 2 (tests/README.md). No index rule reproduces it, so this test holds twinkle to
 * its documented rule; the transformers fixtures keep every k-th / (k+1)-th gap above 1e-4.
 *
 * The logits are exact: x and the router weights are small multiples of 1/4 and 1/8, so every
 * product and sum is exact in float32 whatever the GEMM's order, and the ties are exact ties.
 * Gradients are checked against central differences of the float64 reference with the routing
 * held at the unperturbed choice (the gradient of the branch taken, which is what autograd gives).
 * Errors as test_ops: forward max|y - ref| / max(max|ref|, 1), backward max|g - fd| / max(max|fd|, 1e-2). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "twinkle/twinkle.h"

#define E 8
#define H 16
#define F 8
#define CAP 24
#define FWD_TOL 1e-5
#define BWD_TOL 1e-4

static int fails;

typedef struct layer {
    int k, renorm;
    int64_t n;
    double x[CAP * H], wr[E * H], wg[E * F * H], wu[E * F * H], wd[E * H * F];
} layer;

/* float64: logits, the top-k (lower index on ties; frozen = keep ids), the routed SwiGLU experts */
static void reference(const layer *L, int *ids, int frozen, double *out) {
    for (int64_t t = 0; t < L->n; t++) {
        const double *x = L->x + t * H;
        double lg[E], mx = -INFINITY, s = 0, p[E];
        for (int e = 0; e < E; e++) {
            lg[e] = 0;
            for (int h = 0; h < H; h++) lg[e] += x[h] * L->wr[e * H + h];
            mx = fmax(mx, lg[e]);
        }
        for (int e = 0; e < E; e++) s += exp(lg[e] - mx);
        for (int e = 0; e < E; e++) p[e] = exp(lg[e] - mx) / s;
        int *id = ids + t * L->k;
        for (int j = 0; !frozen && j < L->k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int u = 0; u < j; u++) taken |= id[u] == e;
                if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
            }
            id[j] = best;
        }
        double wsum = 0, w[E];
        for (int j = 0; j < L->k; j++) wsum += w[j] = p[id[j]];
        for (int j = 0; L->renorm && j < L->k; j++) w[j] /= wsum;
        for (int h = 0; h < H; h++) out[t * H + h] = 0;
        for (int j = 0; j < L->k; j++) {
            int e = id[j];
            double a[F];
            for (int f = 0; f < F; f++) {
                double g = 0, u = 0;
                for (int h = 0; h < H; h++) {
                    g += L->wg[(e * F + f) * H + h] * x[h];
                    u += L->wu[(e * F + f) * H + h] * x[h];
                }
                a[f] = g / (1 + exp(-g)) * u;
            }
            for (int h = 0; h < H; h++) {
                double d = 0;
                for (int f = 0; f < F; f++) d += L->wd[(e * H + h) * F + f] * a[f];
                out[t * H + h] += w[j] * d;
            }
        }
    }
}

static double weighted(const layer *L, int *ids, const double *R, double *out) {
    reference(L, ids, 1, out);
    double s = 0;
    for (int64_t i = 0; i < L->n * H; i++) s += out[i] * R[i];
    return s;
}

/* x and the router as exact small multiples; `bias` adds to column 0 (x[:, 0] = 1) of expert e's router row */
static void fill(layer *L, twk_rng *r, const double bias[E], const int same_as[E]) {
    for (int64_t t = 0; t < L->n; t++)
        for (int h = 0; h < H; h++) L->x[t * H + h] = h == 0 ? 1.0 : 0.25 * ((double)twk_rng_below(r, 5) - 2);
    for (int e = 0; e < E; e++)
        for (int h = 0; h < H; h++) L->wr[e * H + h] = h == 0 ? bias[e] : 0.125 * ((double)twk_rng_below(r, 5) - 2);
    for (int e = 0; e < E; e++) /* a router row copied from another: its logits tie with it on every token */
        if (same_as[e] >= 0)
            for (int h = 0; h < H; h++) L->wr[e * H + h] = L->wr[same_as[e] * H + h];
    for (int i = 0; i < E * F * H; i++) {
        L->wg[i] = 0.4 * (float)twk_rng_normal(r);
        L->wu[i] = 0.4 * (float)twk_rng_normal(r);
        L->wd[i] = 0.4 * (float)twk_rng_normal(r);
    }
}

typedef struct gspec {
    const char *name;
    double *v;
    int64_t ne[3];
    int nd;
} gspec;

/* Runs layer L on the CPU (compiled for CAP tokens, run at L->n) against the reference. Checks:
 * the chosen experts, the output, every gradient; want_ids (n*k, or NULL) the expected choice;
 * unused >= 0: an expert that must get no token (its gradients exactly 0). */
static void run(const char *what, layer *L, twk_device *dev, const int *want_ids, int unused, twk_rng *r) {
    twk_graph *g = twk_graph_new();
    int64_t xs[2] = {TWK_T, H}, rs[2] = {E, H}, gs[3] = {E, F, H}, ds[3] = {E, H, F}, ys[2] = {TWK_T, H};
    twk_id x = twk_param(g, "x", 2, xs, true), wr = twk_param(g, "router", 2, rs, true);
    twk_id wg = twk_param(g, "gate_proj", 3, gs, true), wu = twk_param(g, "up_proj", 3, gs, true);
    twk_id wd = twk_param(g, "down_proj", 3, ds, true);
    twk_id logits = twk_matmul(g, x, wr, false, true);
    twk_id ids = twk_moe_topk(g, logits, L->k);
    twk_id w = twk_moe_gate(g, logits, ids, L->renorm != 0);
    twk_id order = twk_moe_sort(g, logits, ids, 0), inv = twk_moe_sort(g, logits, ids, 1), slot = twk_moe_sort(g, logits, ids, 2);
    twk_id xr = twk_moe_dispatch(g, x, order, inv, -1);
    twk_id act = twk_swiglu(g, twk_lora_gather(g, xr, wg, slot), twk_lora_gather(g, xr, wu, slot));
    twk_id y = twk_moe_combine(g, twk_lora_gather(g, act, wd, slot), order, inv, w, L->k);
    twk_id R = twk_input(g, "R", TWK_F32, 2, ys);
    twk_id loss = twk_weighted_sum(g, y, R);
    twk_id leaf[5] = {x, wr, wg, wu, wd}, grad[5];
    twk_plan *p = NULL;
    if (twk_graph_status(g) != TWK_OK || twk_graph_backward(g, loss) != TWK_OK) {
        printf("FAIL %s: build: %s\n", what, twk_last_error());
        fails++;
        twk_graph_free(g);
        return;
    }
    twk_graph_output(g, y);
    twk_graph_output(g, ids);
    for (int i = 0; i < 5; i++) twk_graph_output(g, grad[i] = twk_graph_grad(g, leaf[i]));
    if (twk_plan_compile(g, dev, CAP, NULL, 0, &p) != TWK_OK) {
        printf("FAIL %s: compile: %s\n", what, twk_last_error());
        fails++;
        twk_graph_free(g);
        return;
    }
    int64_t n = L->n;
    gspec spec[5] = {{"x", L->x, {n, H}, 2}, {"router", L->wr, {E, H}, 2}, {"gate_proj", L->wg, {E, F, H}, 3},
                     {"up_proj", L->wu, {E, F, H}, 3}, {"down_proj", L->wd, {E, H, F}, 3}};
    float buf[E * F * H];
    double Rd[CAP * H], ref[CAP * H];
    float Rf[CAP * H], yf[CAP * H];
    int ids_ref[CAP * E];
    int32_t ids_got[CAP * E];
    for (int i = 0; i < 5; i++) {
        int64_t cnt = spec[i].ne[0] * spec[i].ne[1] * (spec[i].nd == 3 ? spec[i].ne[2] : 1);
        for (int64_t k = 0; k < cnt; k++) buf[k] = (float)spec[i].v[k];
        twk_plan_write(p, leaf[i], n, buf, (size_t)cnt * 4);
    }
    for (int64_t i = 0; i < n * H; i++) Rf[i] = (float)(Rd[i] = (double)(float)twk_rng_normal(r));
    twk_plan_write(p, R, n, Rf, (size_t)(n * H) * 4);
    if (twk_plan_run(p, n) != TWK_OK || twk_plan_read(p, y, n, yf, (size_t)(n * H) * 4) != TWK_OK ||
        twk_plan_read(p, ids, n, ids_got, (size_t)(n * L->k) * 4) != TWK_OK) {
        printf("FAIL %s: run: %s\n", what, twk_last_error());
        fails++;
        goto out;
    }
    reference(L, ids_ref, 0, ref);
    int same = 1, uses_unused = 0, per[E] = {0};
    for (int64_t i = 0; i < n * L->k; i++) {
        same &= ids_got[i] == ids_ref[i] && (!want_ids || ids_got[i] == want_ids[i]);
        uses_unused |= ids_got[i] == unused;
        per[ids_got[i]]++;
    }
    double err = 0, scale = 1;
    int dropped = 0;
    for (int64_t i = 0; i < n * H; i++) scale = fmax(scale, fabs(ref[i]));
    for (int64_t i = 0; i < n * H; i++) err = fmax(err, fabs(yf[i] - ref[i]));
    for (int64_t t = 0; t < n; t++) { /* a dropped token would come out as zeros */
        double a = 0;
        for (int h = 0; h < H; h++) a += fabs(yf[t * H + h]);
        dropped += a == 0;
    }
    int ok = same && !uses_unused && !dropped && err / scale <= FWD_TOL;
    printf("%s %-44s n=%-2lld k=%d%s tokens per expert", ok ? "ok  " : "FAIL", what, (long long)n, L->k, L->renorm ? " renorm" : "       ");
    for (int e = 0; e < E; e++) printf(" %d", per[e]);
    printf("; ids %s, %d dropped, fwd err %.2e (tol %.0e)\n", same ? "as the rule" : "DIFFER", dropped, err / scale, FWD_TOL);
    fails += !ok;
    for (int i = 0; i < 5; i++) { /* every element against central differences, routing held */
        int64_t cnt = spec[i].ne[0] * spec[i].ne[1] * (spec[i].nd == 3 ? spec[i].ne[2] : 1);
        twk_plan_read(p, grad[i], n, buf, (size_t)cnt * 4);
        double gerr = 0, gscale = 1e-2, zero_ok = 1;
        double out[CAP * H];
        for (int64_t k = 0; k < cnt; k++) {
            double x0 = spec[i].v[k], hh = 1e-6 * fmax(1.0, fabs(x0));
            spec[i].v[k] = x0 + hh;
            double lp = weighted(L, ids_ref, Rd, out);
            spec[i].v[k] = x0 - hh;
            double lm = weighted(L, ids_ref, Rd, out);
            spec[i].v[k] = x0;
            double fd = (lp - lm) / (2 * hh);
            gscale = fmax(gscale, fabs(fd));
            gerr = fmax(gerr, fabs(buf[k] - fd));
        }
        if (unused >= 0 && i >= 2) { /* the unused expert's slice of each stack: exactly zero */
            int64_t per_e = cnt / E;
            for (int64_t k = unused * per_e; k < (unused + 1) * per_e; k++) zero_ok = zero_ok && buf[k] == 0.0f;
        }
        int gok = gerr / gscale <= BWD_TOL && zero_ok;
        fails += !gok;
        printf("     d/%-10s %.2e (tol %.0e)%s%s\n", spec[i].name, gerr / gscale, BWD_TOL,
               unused >= 0 && i >= 2 ? (zero_ok ? ", unused expert's rows exactly 0" : ", unused expert's rows NOT 0") : "",
               gok ? "" : " FAIL");
    }
out:
    twk_plan_free(p);
    twk_graph_free(g);
}

int main(void) {
    twk_device *dev = NULL;
    if (twk_device_open("cpu", &dev) != TWK_OK) {
        printf("cannot open the cpu: %s\n", twk_last_error());
        return 1;
    }
    static layer L;
    twk_rng r;
    twk_rng_seed(&r, 2026);
    const int none[E] = {-1, -1, -1, -1, -1, -1, -1, -1};
    for (int pass = 0; pass < 2; pass++) { /* at the capacity, and below it */
        int64_t n = pass ? 13 : CAP;
        /* expert 5 never chosen: its router logit 8 below the others' */
        double b5[E] = {0, 0, 0, 0, 0, -8, 0, 0};
        L.n = n, L.k = 2, L.renorm = 1;
        fill(&L, &r, b5, none);
        run("an expert that receives no token (5)", &L, dev, NULL, 5, &r);
        L.k = 4, L.renorm = 0;
        run("an expert that receives no token (5), top-4", &L, dev, NULL, 5, &r);
        /* every token to expert 3 (top-1): its group is the whole batch */
        double b3[E] = {0, 0, 0, 8, 0, 0, 0, 0};
        int all3[CAP];
        for (int t = 0; t < CAP; t++) all3[t] = 3;
        L.k = 1, L.renorm = 0;
        fill(&L, &r, b3, none);
        run("every token to expert 3", &L, dev, all3, -1, &r);
        L.k = 2, L.renorm = 1;
        run("every token's first choice expert 3", &L, dev, NULL, -1, &r);
        /* ties: experts 1 and 6 share a router row, 4 above them. k = 1 with 1 = 6 on top: the lower (1);
         * k = 2 with 4 on top: the tie at the boundary, 1 again; k = 3: both, in index order */
        double bt[E] = {0, 6, 0, 0, 0, 0, 6, 0};
        int same16[E] = {-1, -1, -1, -1, -1, -1, 1, -1}, want[CAP * 3];
        fill(&L, &r, bt, same16);
        for (int t = 0; t < CAP; t++) want[t] = 1;
        L.k = 1, L.renorm = 0;
        run("tie on top (experts 1 = 6): the lower index", &L, dev, want, -1, &r);
        for (int t = 0; t < CAP; t++) want[2 * t] = 1, want[2 * t + 1] = 6;
        L.k = 2, L.renorm = 1;
        run("tie inside the chosen pair: both, 1 then 6", &L, dev, want, -1, &r);
        for (int h = 0; h < H; h++) L.wr[4 * H + h] = L.wr[1 * H + h] + (h == 0 ? 2.0 : 0.0); /* 4 = 1 + 2 on every token */
        for (int t = 0; t < CAP; t++) want[2 * t] = 4, want[2 * t + 1] = 1;
        run("tie at the k-th place (1 = 6 under 4): 4, 1", &L, dev, want, -1, &r);
        L.renorm = 0;
        run("tie at the k-th place, no renorm", &L, dev, want, -1, &r);
        /* every logit equal: the first k experts */
        for (int e = 0; e < E; e++)
            for (int h = 0; h < H; h++) L.wr[e * H + h] = L.wr[h];
        for (int t = 0; t < CAP; t++) want[2 * t] = 0, want[2 * t + 1] = 1;
        L.k = 2, L.renorm = 1;
        run("all 8 logits equal: experts 0, 1", &L, dev, want, -1, &r);
    }
    twk_device_close(dev);
    printf("%s\n", fails ? "FAILED" : "all passed");
    return fails ? 1 : 0;
}
