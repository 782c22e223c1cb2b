/* The mixture-of-experts op cases (op_cases.h's opc_moe_cases): each builds the routing the
 * way train/model.c does (ids from moe_topk, the pairs grouped by moe_sort), so every MoE op
 * and its gradient is checked against float64 references and finite differences through
 * the chain that uses it. ip[0] = k (experts per token), ip[1] = renormalise (norm_topk_prob). */
#include <stdlib.h>

#include "op_cases.h"

/* a float64 tensor [a, b], zeroed; free its d */
static rt rt2(int64_t a, int64_t b) {
    rt t = {.ndim = 2, .ne = {a, b}};
    t.d = calloc((size_t)(a * b > 0 ? a * b : 1), sizeof(double));
    return t;
}

/* The routing of logits: ids [T, k] and the grouping (order, inv, slot, each T*k). */
typedef struct route {
    rt ids;
    double *order, *inv, *slot;
} route;

static route route_of(const rt *logits, int k) {
    route r;
    int64_t T = logits->ne[0], P = T * k;
    r.ids = rt2(T, k);
    ref_moe_topk(logits, k, &r.ids);
    r.order = calloc((size_t)P + 1, sizeof(double));
    r.inv = calloc((size_t)P + 1, sizeof(double));
    r.slot = calloc((size_t)P + 1, sizeof(double));
    ref_moe_sort(&r.ids, logits->ne[1], r.order, r.inv, r.slot);
    return r;
}

static void route_free(route *r) {
    free(r->ids.d);
    free(r->order);
    free(r->inv);
    free(r->slot);
}

/* moe_topk -> moe_gate (gradient: moe_gate_back) */
static twk_id b_gate(twk_graph *g, const twk_id *in, const op_case *c) {
    return twk_moe_gate(g, in[0], twk_moe_topk(g, in[0], c->ip[0]), c->ip[1] != 0);
}
static void r_gate(const op_case *c, rt *in, rt *y) {
    route r = route_of(&in[0], c->ip[0]);
    ref_moe_gate(&in[0], &r.ids, c->ip[1], y);
    route_free(&r);
}

/* moe_topk -> moe_sort (modes 0, 1) -> moe_dispatch of x (gradient: an unweighted moe_combine) */
static twk_id b_dispatch(twk_graph *g, const twk_id *in, const op_case *c) {
    twk_id ids = twk_moe_topk(g, in[0], c->ip[0]);
    return twk_moe_dispatch(g, in[1], twk_moe_sort(g, in[0], ids, 0), twk_moe_sort(g, in[0], ids, 1), -1);
}
static void r_dispatch(const op_case *c, rt *in, rt *y) {
    route r = route_of(&in[0], c->ip[0]);
    ref_moe_dispatch(&in[1], r.order, c->ip[0], y);
    route_free(&r);
}

/* grouped rows y [T*k, H] back to tokens weighted by moe_gate (gradients: moe_dispatch for y,
 * moe_combine_back_w then moe_gate_back for the logits) */
static twk_id b_combine(twk_graph *g, const twk_id *in, const op_case *c) {
    twk_id ids = twk_moe_topk(g, in[0], c->ip[0]);
    twk_id w = twk_moe_gate(g, in[0], ids, c->ip[1] != 0);
    return twk_moe_combine(g, in[1], twk_moe_sort(g, in[0], ids, 0), twk_moe_sort(g, in[0], ids, 1), w, c->ip[0]);
}
static void r_combine(const op_case *c, rt *in, rt *y) {
    route r = route_of(&in[0], c->ip[0]);
    rt w = rt2(in[0].ne[0], c->ip[0]);
    ref_moe_gate(&in[0], &r.ids, c->ip[1], &w);
    ref_moe_combine(&in[1], r.inv, &w, c->ip[0], y);
    free(w.d);
    route_free(&r);
}

/* a whole routed projection: x [T, H], router [E, H], experts [E, N, H]; logits = x router^T,
 * the grouped rows through each row's expert (moe_sort mode 2 as lora_gather's slot; ip[2]: as
 * the models run it, twk_lora_gather_grouped), back to tokens weighted -> [T, N] */
static twk_id b_layer(twk_graph *g, const twk_id *in, const op_case *c) {
    twk_id logits = twk_matmul(g, in[0], in[1], false, true);
    twk_id ids = twk_moe_topk(g, logits, c->ip[0]);
    twk_id w = twk_moe_gate(g, logits, ids, c->ip[1] != 0);
    twk_id order = twk_moe_sort(g, logits, ids, 0), inv = twk_moe_sort(g, logits, ids, 1);
    twk_id slot = twk_moe_sort(g, logits, ids, 2);
    twk_id xs = twk_moe_dispatch(g, in[0], order, inv, -1);
    twk_id ys = c->ip[2] ? twk_lora_gather_grouped(g, xs, in[2], slot, false) : twk_lora_gather(g, xs, in[2], slot);
    return twk_moe_combine(g, ys, order, inv, w, c->ip[0]);
}
static void r_layer(const op_case *c, rt *in, rt *y) {
    int64_t T = in[0].ne[0], E = in[1].ne[0], N = in[2].ne[1], H = in[0].ne[1], K = c->ip[0];
    rt logits = rt2(T, E);
    ref_matmul(&in[0], &in[1], 0, 1, &logits);
    route r = route_of(&logits, (int)K);
    rt w = rt2(T, K), xs = rt2(T * K, H), ys = rt2(T * K, N);
    ref_moe_gate(&logits, &r.ids, c->ip[1], &w);
    ref_moe_dispatch(&in[0], r.order, K, &xs);
    rt slot = {.ndim = 1, .ne = {T * K}, .d = r.slot};
    ref_lora_gather(&xs, &in[2], &slot, &ys);
    ref_moe_combine(&ys, r.inv, &w, K, y);
    free(w.d);
    free(xs.d);
    free(ys.d);
    free(logits.d);
    route_free(&r);
}

/* moe_topk -> moe_router_stats (gradient: moe_router_stats_back, through the mean softmax) */
static twk_id b_stats(twk_graph *g, const twk_id *in, const op_case *c) {
    return twk_moe_router_stats(g, in[0], twk_moe_topk(g, in[0], c->ip[0]));
}
static void r_stats(const op_case *c, rt *in, rt *y) {
    route r = route_of(&in[0], c->ip[0]);
    ref_moe_router_stats(&in[0], &r.ids, y);
    route_free(&r);
}

/* per slot (ip[2] slots; slot ids up to ip[2]: the last value is a row of no slot, as padding) */
static twk_id b_stats_slots(twk_graph *g, const twk_id *in, const op_case *c) {
    return twk_moe_router_stats_slots(g, in[0], twk_moe_topk(g, in[0], c->ip[0]), in[1], c->ip[2]);
}
static void r_stats_slots(const op_case *c, rt *in, rt *y) {
    route r = route_of(&in[0], c->ip[0]);
    ref_moe_router_stats_slots(&in[0], &r.ids, &in[1], y);
    route_free(&r);
}

#define IDS(lim, ...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_I32, .gen = G_IDS, .limit = lim}
#define F32(...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_F32, .diff = 1}
#define F32C(...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = TWK_F32, .diff = 0}
/* a frozen 16-bit expert stack (bf16 / f16), values rounded to the dtype */
#define W16(t, ...) {.ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .ne = {__VA_ARGS__}, .type = t, .diff = 0}
#define T_ (-1)

const op_case opc_moe_cases[] = {
    /* routing weights: 1 and 3 experts, top-1/2/4 of 8 and 16, all of them, norm_topk_prob on / off */
    {"moe_gate 1x1 top-1", 1, {F32(1, 1)}, b_gate, r_gate, 1e-6, 1e-4, .ip = {1, 0}},
    {"moe_gate Tx3 top-2 renorm", 1, {F32(T_, 3)}, b_gate, r_gate, 1e-6, 1e-4, .ip = {2, 1}, .cap = 13},
    {"moe_gate Tx8 top-1", 1, {F32(T_, 8)}, b_gate, r_gate, 1e-6, 1e-4, .ip = {1, 0}, .cap = 37},
    {"moe_gate Tx8 top-2 renorm", 1, {F32(T_, 8)}, b_gate, r_gate, 1e-6, 1e-4, .ip = {2, 1}, .cap = 37},
    {"moe_gate Tx16 top-4", 1, {F32(T_, 16)}, b_gate, r_gate, 1e-6, 1e-4, .ip = {4, 0}, .cap = 29},
    {"moe_gate Tx16 top-4 renorm", 1, {F32(T_, 16)}, b_gate, r_gate, 1e-6, 1e-4, .ip = {4, 1}, .cap = 29},
    {"moe_gate 7x8 top-8 (all) renorm", 1, {F32(7, 8)}, b_gate, r_gate, 1e-6, 1e-4, .ip = {8, 1}},
    /* the grouping and the move into it */
    {"moe_dispatch Tx8 top-2 H67", 2, {F32C(T_, 8), F32(T_, 67)}, b_dispatch, r_dispatch, 0, 1e-5, .ip = {2, 0}, .cap = 23},
    {"moe_dispatch Tx16 top-4 H5", 2, {F32C(T_, 16), F32(T_, 5)}, b_dispatch, r_dispatch, 0, 1e-5, .ip = {4, 0}, .cap = 31},
    {"moe_dispatch 1x1 top-1 H1", 2, {F32C(1, 1), F32(1, 1)}, b_dispatch, r_dispatch, 0, 1e-5, .ip = {1, 0}},
    /* back to tokens, weighted: the routing weights' gradient */
    {"moe_combine Tx8 top-1 H13", 2, {F32(T_, 8), F32(T_, 13)}, b_combine, r_combine, 1e-6, 1e-4, .ip = {1, 0}, .cap = 19},
    {"moe_combine Tx8 top-2 renorm H13", 2, {F32(T_, 8), F32(-2, 13)}, b_combine, r_combine, 1e-6, 1e-4, .ip = {2, 1}, .cap = 19},
    {"moe_combine Tx16 top-4 H3", 2, {F32(T_, 16), F32(-4, 3)}, b_combine, r_combine, 1e-6, 1e-4, .ip = {4, 0}, .cap = 17},
    {"moe_combine Tx16 top-4 renorm H33", 2, {F32(T_, 16), F32(-4, 33)}, b_combine, r_combine, 1e-6, 1e-4, .ip = {4, 1}, .cap = 17},
    /* a routed projection end to end: router, grouping (all three sort modes), expert stacks */
    {"moe layer Tx11 8 experts top-2 renorm N7", 3, {F32(T_, 11), F32(8, 11), F32(8, 7, 11)}, b_layer, r_layer, 1e-5, 1e-4, .ip = {2, 1}, .cap = 29},
    {"moe layer Tx9 16 experts top-4 N5", 3, {F32(T_, 9), F32(16, 9), F32(16, 5, 9)}, b_layer, r_layer, 1e-5, 1e-4, .ip = {4, 0}, .cap = 23},
    {"moe layer Tx6 8 experts top-1 N3", 3, {F32(T_, 6), F32(8, 6), F32(8, 3, 6)}, b_layer, r_layer, 1e-5, 1e-4, .ip = {1, 0}, .cap = 13},
    /* as a bf16 / f16 mixture of experts runs: frozen 16-bit stacks through the grouped product (dX
     * and the router's gradient through the stack read transposed) */
    {"moe layer Tx11 8 bf16 experts top-2 renorm N7 grouped", 3, {F32(T_, 11), F32(8, 11), W16(TWK_BF16, 8, 7, 11)}, b_layer, r_layer, 1e-5, 1e-4, .ip = {2, 1, 1}, .cap = 29},
    {"moe layer Tx9 16 f16 experts top-4 N5 grouped", 3, {F32(T_, 9), F32(16, 9), W16(TWK_F16, 16, 5, 9)}, b_layer, r_layer, 1e-5, 1e-4, .ip = {4, 0, 1}, .cap = 23},
    /* the load-balancing loss's statistics */
    {"moe_router_stats Tx8 top-2", 1, {F32(T_, 8)}, b_stats, r_stats, 1e-6, 1e-4, .ip = {2, 0}, .cap = 41},
    {"moe_router_stats Tx16 top-4", 1, {F32(T_, 16)}, b_stats, r_stats, 1e-6, 1e-4, .ip = {4, 0}, .cap = 23},
    {"moe_router_stats 1x3 top-1", 1, {F32(1, 3)}, b_stats, r_stats, 1e-6, 1e-4, .ip = {1, 0}},
    {"moe_router_stats Tx8 top-2 in 3 slots + padding", 2, {F32(T_, 8), IDS(4, T_)}, b_stats_slots, r_stats_slots, 1e-6, 1e-4, .ip = {2, 0, 3}, .cap = 47},
    {"moe_router_stats Tx16 top-4 in 5 slots + padding", 2, {F32(T_, 16), IDS(6, T_)}, b_stats_slots, r_stats_slots, 1e-6, 1e-4, .ip = {4, 0, 5}, .cap = 31},
    /* more rows than a device work-group's 64 (each item takes several, partials added in order) */
    {"moe_router_stats Tx8 top-2 in 2 slots + padding, 203 rows", 2, {F32(T_, 8), IDS(3, T_)}, b_stats_slots, r_stats_slots, 1e-6, 1e-4, .ip = {2, 0, 2}, .cap = 203},
    {"moe_router_stats Tx4 top-1, 157 rows", 1, {F32(T_, 4)}, b_stats, r_stats, 1e-6, 1e-4, .ip = {1, 0}, .cap = 157},
};

const int opc_n_moe_cases = (int)(sizeof opc_moe_cases / sizeof opc_moe_cases[0]);
