/* Graph builders of the mixture-of-experts routing ops (ops.h's MOE_* rows): top-k, the
 * routing weights, the grouping of (token, choice) pairs by expert and the moves of rows
 * into and out of that grouping. Each checks dtypes and shapes and names the op. */
#include <stdio.h>
#include <string.h>

#include "graph_internal.h"

/* The node, or NULL with the graph's error set (sticky for a -1 argument). */
static const twk_node *moe_arg(twk_graph *g, twk_id id, const char *op, const char *which) {
    if (!g) return NULL;
    if (id < 0 || id >= g->n) {
        if (g->status == TWK_OK) twk_graph_fail(g, TWK_ERR_INVALID_ARG, "%s: %s is not a tensor (id %d)", op, which, id);
        return NULL;
    }
    return &g->nodes[id];
}

static int is_index(const twk_node *n) { return n->type == TWK_I32 || n->type == TWK_I64; }

/* Fails naming op and the shapes of the (up to 4) sources; returns -1. */
static twk_id bad(twk_graph *g, const char *op, const char *want, const twk_id *src, int n) {
    char s[4][96];
    for (int i = 0; i < 4; i++) snprintf(s[i], sizeof s[i], "-");
    for (int i = 0; i < n && i < 4; i++)
        if (src[i] >= 0) twk_shape_str(&g->nodes[src[i]], s[i], sizeof s[i]);
    return twk_graph_fail(g, TWK_ERR_SHAPE, "%s: want %s; got %s, %s, %s, %s", op, want, s[0], s[1], s[2], s[3]);
}

static twk_id push(twk_graph *g, twk_op op, twk_dtype t, int ndim, const int64_t *ne, uint8_t dyn, int nsrc,
                   const twk_id *src, const int32_t *ip) {
    twk_node n;
    memset(&n, 0, sizeof n);
    n.op = op;
    n.type = t;
    n.ndim = ndim;
    n.dyn = dyn;
    for (int i = 0; i < ndim; i++) n.ne[i] = ne[i];
    n.nsrc = nsrc;
    for (int i = 0; i < nsrc; i++) n.src[i] = src[i];
    if (ip) memcpy(n.ip, ip, sizeof n.ip);
    return twk_graph_push(g, &n);
}

/* logits f32 [T, E] (E static) and ids index [T, K] with the same T; 0 with the error set. */
static int logits_ids(twk_graph *g, const char *op, twk_id logits, twk_id ids) {
    const twk_node *l = moe_arg(g, logits, op, "logits"), *i = moe_arg(g, ids, op, "ids");
    if (!l || !i) return 0;
    twk_id s[2] = {logits, ids};
    if (l->type != TWK_F32 || !is_index(i) || l->ndim != 2 || (l->dyn & 2) || i->ndim != 2 || (i->dyn & 2) ||
        i->ne[0] != l->ne[0] || (i->dyn & 1) != (l->dyn & 1) || i->ne[1] > l->ne[1]) {
        bad(g, op, "f32 logits [T, E] and i32 ids [T, K], K <= E", s, 2);
        return 0;
    }
    return 1;
}

twk_id twk_moe_topk(twk_graph *g, twk_id logits, int k) {
    const twk_node *l = moe_arg(g, logits, "moe_topk", "logits");
    if (!l) return -1;
    if (l->type != TWK_F32 || l->ndim != 2 || (l->dyn & 2) || k < 1 || k > l->ne[1]) {
        char s[96];
        return twk_graph_fail(g, TWK_ERR_SHAPE, "moe_topk: want f32 logits [T, E] and 1 <= k <= E; got %s, k %d",
                              twk_shape_str(l, s, sizeof s), k);
    }
    int64_t ne[2] = {l->ne[0], k};
    return push(g, TWK_OP_MOE_TOPK, TWK_I32, 2, ne, l->dyn & 1, 1, &logits, NULL);
}

twk_id twk_moe_gate(twk_graph *g, twk_id logits, twk_id ids, bool renormalize) {
    if (!logits_ids(g, "moe_gate", logits, ids)) return -1;
    const twk_node *i = &g->nodes[ids];
    int64_t ne[2] = {i->ne[0], i->ne[1]};
    twk_id s[2] = {logits, ids};
    int32_t ip[TWK_MAX_PARAMS] = {renormalize ? 1 : 0};
    return push(g, TWK_OP_MOE_GATE, TWK_F32, 2, ne, i->dyn & 1, 2, s, ip);
}

twk_id twk_moe_gate_back(twk_graph *g, twk_id logits, twk_id ids, twk_id dy, bool renormalize) {
    if (!logits_ids(g, "moe_gate_back", logits, ids)) return -1;
    const twk_node *d = moe_arg(g, dy, "moe_gate_back", "dy");
    if (!d) return -1;
    twk_id s[3] = {logits, ids, dy};
    if (d->type != TWK_F32 || !twk_same_shape(d, &g->nodes[ids])) return bad(g, "moe_gate_back", "dy shaped as ids", s, 3);
    const twk_node *l = &g->nodes[logits];
    int64_t ne[2] = {l->ne[0], l->ne[1]};
    int32_t ip[TWK_MAX_PARAMS] = {renormalize ? 1 : 0};
    return push(g, TWK_OP_MOE_GATE_BACK, TWK_F32, 2, ne, l->dyn & 1, 3, s, ip);
}

twk_id twk_moe_sort(twk_graph *g, twk_id logits, twk_id ids, int mode) {
    if (!logits_ids(g, "moe_sort", logits, ids)) return -1;
    if (mode < 0 || mode > 2) return twk_graph_fail(g, TWK_ERR_INVALID_ARG, "moe_sort: mode %d is not 0, 1 or 2", mode);
    const twk_node *i = &g->nodes[ids];
    int64_t ne[1] = {i->ne[0] * i->ne[1]};
    twk_id s[2] = {logits, ids};
    int32_t ip[TWK_MAX_PARAMS] = {mode};
    return push(g, TWK_OP_MOE_SORT, TWK_I32, 1, ne, i->dyn & 1, 2, s, ip);
}

/* order and inv index [T*K] of rows [T, H] (x: the token side): 0 with the error set. */
static int perms_ok(twk_graph *g, const char *op, const twk_node *tok, twk_id order, twk_id inv, twk_id w,
                    const twk_id *src, int nsrc) {
    const twk_node *o = moe_arg(g, order, op, "order"), *v = moe_arg(g, inv, op, "inv");
    if (!o || !v) return 0;
    int ok = is_index(o) && is_index(v) && o->ndim == 1 && twk_same_shape(o, v) && (o->dyn & 1) == (tok->dyn & 1) &&
             o->ne[0] % tok->ne[0] == 0 && tok->ndim == 2 && !(tok->dyn & 2);
    if (ok && w >= 0) {
        const twk_node *W = moe_arg(g, w, op, "w");
        if (!W) return 0;
        ok = W->type == TWK_F32 && W->ndim == 2 && W->ne[0] == tok->ne[0] && (W->dyn & 1) == (tok->dyn & 1) &&
             !(W->dyn & 2) && W->ne[0] * W->ne[1] == o->ne[0];
    }
    if (!ok) bad(g, op, "tokens [T, H], i32 order and inv [T*K] (moe_sort), optional w f32 [T, K]", src, nsrc);
    return ok;
}

twk_id twk_moe_dispatch(twk_graph *g, twk_id x, twk_id order, twk_id inv, twk_id w) {
    const twk_node *X = moe_arg(g, x, "moe_dispatch", "x");
    if (!X) return -1;
    twk_id s[4] = {x, order, inv, w};
    if (X->type != TWK_F32) return bad(g, "moe_dispatch", "f32 x", s, 1);
    if (!perms_ok(g, "moe_dispatch", X, order, inv, w, s, w >= 0 ? 4 : 3)) return -1;
    const twk_node *o = &g->nodes[order];
    int64_t ne[2] = {o->ne[0], X->ne[1]};
    return push(g, TWK_OP_MOE_DISPATCH, TWK_F32, 2, ne, o->dyn & 1, w >= 0 ? 4 : 3, s, NULL);
}

twk_id twk_moe_combine(twk_graph *g, twk_id y, twk_id order, twk_id inv, twk_id w, int64_t k) {
    const twk_node *Y = moe_arg(g, y, "moe_combine", "y");
    if (!Y) return -1;
    twk_id s[4] = {y, order, inv, w};
    if (Y->type != TWK_F32 || Y->ndim != 2 || (Y->dyn & 2) || k < 1 || Y->ne[0] % k)
        return bad(g, "moe_combine", "f32 y [T*K, H]", s, 1);
    twk_node tok = *Y; /* the token side: [T, H] */
    tok.ne[0] = Y->ne[0] / k;
    if (!perms_ok(g, "moe_combine", &tok, order, inv, w, s, w >= 0 ? 4 : 3)) return -1;
    if (g->nodes[order].ne[0] != Y->ne[0]) return bad(g, "moe_combine", "order with y's rows", s, 3);
    int64_t ne[2] = {tok.ne[0], Y->ne[1]};
    return push(g, TWK_OP_MOE_COMBINE, TWK_F32, 2, ne, Y->dyn & 1, w >= 0 ? 4 : 3, s, NULL);
}

twk_id twk_moe_combine_back_w(twk_graph *g, twk_id y, twk_id order, twk_id inv, twk_id dout) {
    const twk_node *Y = moe_arg(g, y, "moe_combine_back_w", "y"), *D = moe_arg(g, dout, "moe_combine_back_w", "dout");
    if (!Y || !D) return -1;
    twk_id s[4] = {y, order, inv, dout};
    if (Y->type != TWK_F32 || D->type != TWK_F32 || D->ndim != 2 || Y->ndim != 2 || D->ne[1] != Y->ne[1] ||
        Y->ne[0] % D->ne[0])
        return bad(g, "moe_combine_back_w", "y [T*K, H], dout [T, H]", s, 4);
    if (!perms_ok(g, "moe_combine_back_w", D, order, inv, -1, s, 4)) return -1;
    int64_t ne[2] = {D->ne[0], Y->ne[0] / D->ne[0]};
    return push(g, TWK_OP_MOE_COMBINE_BACK_W, TWK_F32, 2, ne, D->dyn & 1, 4, s, NULL);
}

/* slot: i32/i64 [T] beside logits [T, E], or -1 (none); 0 with the error set. */
static int slot_ok(twk_graph *g, const char *op, twk_id logits, twk_id slot) {
    if (slot < 0) return 1;
    const twk_node *l = &g->nodes[logits], *s = moe_arg(g, slot, op, "slot");
    if (!s) return 0;
    twk_id src[2] = {logits, slot};
    if (!is_index(s) || s->ndim != 1 || s->ne[0] != l->ne[0] || (s->dyn & 1) != (l->dyn & 1)) {
        bad(g, op, "slot: i32 [T] beside logits [T, E]", src, 2);
        return 0;
    }
    return 1;
}

twk_id twk_moe_router_stats(twk_graph *g, twk_id logits, twk_id ids) { return twk_moe_router_stats_slots(g, logits, ids, -1, 0); }

twk_id twk_moe_router_stats_slots(twk_graph *g, twk_id logits, twk_id ids, twk_id slot, int n_slots) {
    if (!logits_ids(g, "moe_router_stats", logits, ids) || !slot_ok(g, "moe_router_stats", logits, slot)) return -1;
    if (slot >= 0 && n_slots < 1)
        return twk_graph_fail(g, TWK_ERR_INVALID_ARG, "moe_router_stats: %d slots (want at least 1)", n_slots);
    int64_t E = g->nodes[logits].ne[1], ne2[2] = {2, E}, ne3[3] = {n_slots, 2, E};
    twk_id s[3] = {logits, ids, slot};
    return push(g, TWK_OP_MOE_ROUTER_STATS, TWK_F32, slot >= 0 ? 3 : 2, slot >= 0 ? ne3 : ne2, 0, slot >= 0 ? 3 : 2, s, NULL);
}

twk_id twk_moe_router_stats_back(twk_graph *g, twk_id logits, twk_id dy, twk_id slot) {
    const twk_node *l = moe_arg(g, logits, "moe_router_stats_back", "logits"), *d = moe_arg(g, dy, "moe_router_stats_back", "dy");
    if (!l || !d || !slot_ok(g, "moe_router_stats_back", logits, slot)) return -1;
    twk_id s[3] = {logits, dy, slot};
    int nd = slot >= 0 ? 3 : 2;
    if (l->type != TWK_F32 || l->ndim != 2 || (l->dyn & 2) || d->type != TWK_F32 || d->ndim != nd || d->dyn ||
        d->ne[nd - 2] != 2 || d->ne[nd - 1] != l->ne[1])
        return bad(g, "moe_router_stats_back", "f32 logits [T, E] and dy [2, E] (with a slot: [S, 2, E])", s, 2);
    int64_t ne[2] = {l->ne[0], l->ne[1]};
    return push(g, TWK_OP_MOE_ROUTER_STATS_BACK, TWK_F32, 2, ne, l->dyn & 1, slot >= 0 ? 3 : 2, s, NULL);
}
