/* Static reverse-mode autograd: appends one gradient rule per op to the graph
 * in reverse topological order. Only tensors on a path from a trainable param
 * to the loss get gradients; where a tensor feeds several ops the
 * contributions are summed with ADD. */
#include <stdio.h>
#include <string.h>

#include "graph_internal.h"

/* A node with the shape of `like` (copied before the push may move it). */
static twk_id raw(twk_graph *g, twk_op op, twk_id like, int nsrc, const twk_id *src,
                  const int32_t *ip, const float *fp) {
    twk_node n;
    memset(&n, 0, sizeof n);
    const twk_node *l = &g->nodes[like];
    n.op = op;
    n.type = TWK_F32;
    n.ndim = l->ndim;
    n.dyn = l->dyn;
    memcpy(n.ne, l->ne, sizeof n.ne);
    n.nsrc = nsrc;
    for (int i = 0; i < nsrc; i++) {
        if (src[i] < 0) return -1;
        n.src[i] = src[i];
    }
    if (ip) memcpy(n.ip, ip, sizeof n.ip);
    if (fp) memcpy(n.fp, fp, sizeof n.fp);
    return twk_graph_push(g, &n);
}

static int differentiable_src(const twk_node *n, int i) { return twk_op_info(n->op)->diff >> i & 1; }

static void accumulate(twk_graph *g, twk_id *grads, twk_id target, twk_id contrib) {
    if (contrib < 0) return;
    grads[target] = grads[target] < 0 ? contrib : twk_add(g, grads[target], contrib);
}

/* One node's backward step: the node (a copy: pushes may move the array), its
 * gradient gy, and the contributions c[i] a rule appends for its sources. */
typedef struct grad_step {
    twk_graph *g;
    twk_id id;
    twk_node n;
    twk_id gy;
    const unsigned char *need;
    twk_id c[TWK_MAX_SRC];
} grad_step;

/* Whether source i wants a gradient (a trainable param reaches it and the op differentiates it). */
static int wants(const grad_step *st, int i) { return st->need[st->n.src[i]] && differentiable_src(&st->n, i); }

/* A gradient rule: fills st->c; 0 when it failed (graph error set). */
typedef int (*grad_rule)(grad_step *st);

/* ---- layout: the inverse move ---- */

static int grad_reshape(grad_step *st) {
    const twk_node *x = &st->g->nodes[st->n.src[0]];
    int64_t ne[TWK_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) ne[i] = (x->dyn >> i & 1) ? -x->ne[i] : x->ne[i];
    st->c[0] = twk_reshape(st->g, st->gy, x->ndim, ne);
    return 1;
}

static int grad_permute(grad_step *st) {
    int inv[TWK_MAX_DIMS];
    for (int i = 0; i < st->n.ndim; i++) inv[st->n.ip[i]] = i;
    st->c[0] = twk_permute(st->g, st->gy, inv);
    return 1;
}

static int grad_slice(grad_step *st) {
    const twk_node *n = &st->n;
    int64_t full = st->g->nodes[n->src[0]].ne[n->ip[0]];
    st->c[0] = n->op == TWK_OP_SLICE ? twk_slice_back(st->g, st->gy, n->ip[0], n->ip[1], full)
                                     : twk_slice(st->g, st->gy, n->ip[0], n->ip[1], full);
    return 1;
}

static int grad_concat(grad_step *st) {
    const twk_node *n = &st->n;
    int64_t la = st->g->nodes[n->src[0]].ne[n->ip[0]], lb = st->g->nodes[n->src[1]].ne[n->ip[0]];
    if (wants(st, 0)) st->c[0] = twk_slice(st->g, st->gy, n->ip[0], 0, la);
    if (wants(st, 1)) st->c[1] = twk_slice(st->g, st->gy, n->ip[0], la, lb);
    return 1;
}

/* ---- broadcasts and reductions: each other's adjoint ---- */

static int grad_broadcast(grad_step *st) {
    if (st->n.ip[0]) return 0; /* the mean's gradient itself is not differentiated */
    st->c[0] = twk_sum_to_like(st->g, st->gy, st->n.src[0]);
    return 1;
}

static int grad_sum_to(grad_step *st) {
    st->c[0] = twk_broadcast_like(st->g, st->gy, st->n.src[0], 0);
    return 1;
}

static int grad_sum(grad_step *st) {
    st->c[0] = twk_broadcast_like(st->g, st->gy, st->n.src[0], st->n.op == TWK_OP_MEAN);
    return 1;
}

static int grad_weighted_sum(grad_step *st) {
    const twk_id *s = st->n.src;
    if (wants(st, 0)) st->c[0] = twk_mul(st->g, s[1], st->gy);
    if (wants(st, 1)) st->c[1] = twk_mul(st->g, s[0], st->gy);
    return 1;
}

/* ---- elementwise ---- */

/* b's gradient summed down to b's shape where it was broadcast. */
static twk_id to_b_shape(grad_step *st, twk_id t) {
    const twk_id b = st->n.src[1];
    return twk_same_shape(&st->g->nodes[b], &st->n) ? t : twk_sum_to_like(st->g, t, b);
}

static int grad_add(grad_step *st) {
    if (wants(st, 0)) st->c[0] = st->gy;
    if (wants(st, 1)) st->c[1] = to_b_shape(st, st->gy);
    return 1;
}

static int grad_mul(grad_step *st) {
    const twk_id *s = st->n.src;
    if (wants(st, 0)) st->c[0] = twk_mul(st->g, st->gy, s[1]);
    if (wants(st, 1)) st->c[1] = to_b_shape(st, twk_mul(st->g, st->gy, s[0]));
    return 1;
}

static int grad_scale(grad_step *st) {
    st->c[0] = twk_scale(st->g, st->gy, st->n.fp[0]);
    return 1;
}

static int grad_swiglu(grad_step *st) {
    const twk_id *s = st->n.src;
    for (int w = 0; w < 2; w++)
        if (wants(st, w)) st->c[w] = twk_swiglu_back(st->g, s[0], s[1], st->gy, w);
    return 1;
}

/* ---- linear algebra ---- */

static int grad_matmul(grad_step *st) {
    twk_graph *g = st->g;
    const twk_id *s = st->n.src;
    twk_id gy = st->gy;
    int ta = st->n.ip[0], tb = st->n.ip[1];
    if (wants(st, 0)) st->c[0] = ta ? twk_matmul(g, s[1], gy, tb, true) : twk_matmul(g, gy, s[1], false, !tb);
    if (wants(st, 1)) st->c[1] = tb ? twk_matmul(g, gy, s[0], true, ta) : twk_matmul(g, s[0], gy, !ta, false);
    return 1;
}

/* ---- transformer ---- */

static int grad_get_rows(grad_step *st) {
    const twk_node *table = &st->g->nodes[st->n.src[0]];
    if (table->dyn) {
        twk_graph_fail(st->g, TWK_ERR_UNSUPPORTED, "backward: get_rows from a per-token table (node %d) has no gradient rule",
                       st->id);
        return 0;
    }
    st->c[0] = twk_get_rows_back(st->g, st->gy, st->n.src[1], table->ne[0]);
    return 1;
}

static int grad_get_rows_back(grad_step *st) {
    st->c[0] = twk_get_rows(st->g, st->gy, st->n.src[1]);
    return 1;
}

static int grad_rmsnorm(grad_step *st) {
    const twk_node *n = &st->n;
    const twk_id *s = n->src;
    if (wants(st, 0)) {
        twk_id src3[3] = {s[0], s[1], st->gy};
        st->c[0] = raw(st->g, TWK_OP_RMSNORM_BACK_X, s[0], 3, src3, n->ip, n->fp);
    }
    if (wants(st, 1)) {
        twk_id src2[2] = {s[0], st->gy};
        st->c[1] = raw(st->g, TWK_OP_RMSNORM_BACK_W, s[1], 2, src2, n->ip, n->fp);
    }
    return 1;
}

static int grad_rope(grad_step *st) {
    const twk_node *n = &st->n;
    twk_id src3[3] = {st->gy, n->src[1], n->nsrc > 2 ? n->src[2] : -1};
    int32_t ip[TWK_MAX_PARAMS] = {0};
    ip[0] = !n->ip[0]; /* the inverse rotation */
    st->c[0] = raw(st->g, TWK_OP_ROPE, n->src[0], n->nsrc, src3, ip, n->fp);
    return 1;
}

/* attention's log-sum-exp per (token, query head): [T, Hq], from q's shape */
static twk_id attn_lse(grad_step *st) {
    const twk_id *s = st->n.src;
    const twk_node *q = &st->g->nodes[s[0]];
    twk_node lshape;
    memset(&lshape, 0, sizeof lshape);
    lshape.op = TWK_OP_ATTN_LSE;
    lshape.type = TWK_F32;
    lshape.ndim = 2;
    lshape.ne[0] = q->ne[0];
    lshape.ne[1] = q->ne[1];
    lshape.dyn = q->dyn & 1;
    lshape.nsrc = 3;
    lshape.src[0] = s[0];
    lshape.src[1] = s[1];
    lshape.src[2] = s[3];
    lshape.fp[0] = st->n.fp[0];
    lshape.fp[1] = st->n.fp[1]; /* softcap */
    lshape.ip[1] = st->n.ip[1]; /* window */
    return twk_graph_push(st->g, &lshape);
}

static int grad_attn(grad_step *st) {
    const twk_id *s = st->n.src;
    twk_id lse = attn_lse(st);
    if (lse < 0) return 0;
    for (int w = 0; w < 3; w++) {
        if (!wants(st, w)) continue;
        twk_id src7[7] = {s[0], s[1], s[2], s[3], st->id, st->gy, lse};
        int32_t ip[TWK_MAX_PARAMS] = {0};
        ip[0] = w;
        ip[1] = st->n.ip[1]; /* window */
        st->c[w] = raw(st->g, TWK_OP_ATTN_BACK, s[w], 7, src7, ip, st->n.fp);
    }
    return 1;
}

static int grad_logprobs(grad_step *st) {
    /* the forward's logprobs give the log-sum-exp back without a pass over V */
    const twk_id *s = st->n.src;
    twk_id src4[4] = {s[0], s[1], st->gy, st->id};
    st->c[0] = raw(st->g, TWK_OP_LOGPROBS_BACK, s[0], 4, src4, NULL, NULL);
    return 1;
}

/* y = w[slot] x: dx = w[slot]^T dy (the transposed slots gathered), dw per slot (lora_gather_back) */
static int grad_lora_gather(grad_step *st) {
    twk_graph *g = st->g;
    const twk_id *s = st->n.src;
    int trans = st->n.ip[0], grouped = st->n.ip[1];
    if (trans && (wants(st, 1) || (wants(st, 0) && !grouped))) {
        twk_graph_fail(g, TWK_ERR_UNSUPPORTED, "backward: a transposed lora_gather (node %d) has no gradient rule", st->id);
        return 0;
    }
    if (wants(st, 0) && grouped && (trans || twk_dtype_is_half(g->nodes[s[1]].type))) {
        /* 16-bit experts read in the other orientation (no widened copy); a transposed product's dX reads w as is */
        st->c[0] = twk_lora_gather_grouped(g, st->gy, s[1], s[2], !trans);
    } else if (wants(st, 0) && grouped) { /* f32 experts: the stack permuted, then one plain product per run */
        int axes[3] = {0, 2, 1};
        st->c[0] = twk_lora_gather_grouped(g, st->gy, twk_permute(g, s[1], axes), s[2], false);
    } else if (wants(st, 0)) { /* the stack read transposed: no permuted copy of every slot */
        st->c[0] = twk_lora_gather_t(g, st->gy, s[1], s[2]);
    }
    if (wants(st, 1)) st->c[1] = twk_lora_gather_back(g, s[0], st->gy, s[2], g->nodes[s[1]].ne[0]);
    return 1;
}

static int grad_unembed_logprobs(grad_step *st) {
    /* dh, the logits recomputed tile by tile from h and w */
    const twk_id *s = st->n.src;
    twk_id src5[5] = {s[0], s[1], s[2], st->gy, st->id};
    st->c[0] = raw(st->g, TWK_OP_UNEMBED_LOGPROBS_BACK, s[0], 5, src5, NULL, NULL);
    return 1;
}

/* dh = d[:, H] * g: the logprob column's gradient (a [T, 1] read straight from the slice whose
 * gradient built gy, or sliced out of gy) times the direction the forward saved; no product over
 * the vocabulary. The direction columns' own gradient is not propagated (twk_unembed_logprobs_dir). */
static int grad_unembed_logprobs_dir(grad_step *st) {
    twk_graph *g = st->g;
    int64_t H = st->n.ne[1] - 1;
    const twk_node *dy = &g->nodes[st->gy];
    twk_id col = dy->op == TWK_OP_SLICE_BACK && dy->ip[0] == 1 && dy->ip[1] == H && g->nodes[dy->src[0]].ne[1] == 1
                     ? dy->src[0] /* the slice_back is left dead: the compiler drops it */
                     : twk_slice(g, st->gy, 1, H, 1);
    st->c[0] = twk_mul(g, twk_slice(g, st->id, 1, 0, H), col);
    return 1;
}

/* ---- mixture of experts: the routing weights' gradient reaches the logits; ids have none ---- */

static int grad_moe_gate(grad_step *st) {
    st->c[0] = twk_moe_gate_back(st->g, st->n.src[0], st->n.src[1], st->gy, st->n.ip[0] != 0);
    return 1;
}

static int grad_moe_dispatch(grad_step *st) {
    if (st->n.nsrc > 3) {
        twk_graph_fail(st->g, TWK_ERR_UNSUPPORTED, "backward: a weighted moe_dispatch (node %d) has no gradient rule", st->id);
        return 0;
    }
    const twk_id *s = st->n.src;
    int64_t k = st->n.ne[0] / st->g->nodes[s[0]].ne[0];
    st->c[0] = twk_moe_combine(st->g, st->gy, s[1], s[2], -1, k);
    return 1;
}

static int grad_moe_combine(grad_step *st) {
    const twk_id *s = st->n.src;
    twk_id w = st->n.nsrc > 3 ? s[3] : -1;
    if (wants(st, 0)) st->c[0] = twk_moe_dispatch(st->g, st->gy, s[1], s[2], w);
    if (w >= 0 && wants(st, 3)) st->c[3] = twk_moe_combine_back_w(st->g, s[0], s[1], s[2], st->gy);
    return 1;
}

static int grad_moe_router_stats(grad_step *st) {
    st->c[0] = twk_moe_router_stats_back(st->g, st->n.src[0], st->gy, st->n.nsrc > 2 ? st->n.src[2] : -1);
    return 1;
}

/* The rules of the ops that are not MAPs (a MAP's rule is its BACK op). */
static const grad_rule rules[TWK_OP_COUNT] = {
    [TWK_OP_RESHAPE] = grad_reshape,
    [TWK_OP_PERMUTE] = grad_permute,
    [TWK_OP_SLICE] = grad_slice,
    [TWK_OP_SLICE_BACK] = grad_slice,
    [TWK_OP_CONCAT] = grad_concat,
    [TWK_OP_BROADCAST] = grad_broadcast,
    [TWK_OP_SUM_TO] = grad_sum_to,
    [TWK_OP_ADD] = grad_add,
    [TWK_OP_MUL] = grad_mul,
    [TWK_OP_SCALE] = grad_scale,
    [TWK_OP_SWIGLU] = grad_swiglu,
    [TWK_OP_SUM] = grad_sum,
    [TWK_OP_MEAN] = grad_sum,
    [TWK_OP_WEIGHTED_SUM] = grad_weighted_sum,
    [TWK_OP_MATMUL] = grad_matmul,
    [TWK_OP_GET_ROWS] = grad_get_rows,
    [TWK_OP_GET_ROWS_BACK] = grad_get_rows_back,
    [TWK_OP_RMSNORM] = grad_rmsnorm,
    [TWK_OP_ROPE] = grad_rope,
    [TWK_OP_ATTN] = grad_attn,
    [TWK_OP_LOGPROBS] = grad_logprobs,
    [TWK_OP_LORA_GATHER] = grad_lora_gather,
    [TWK_OP_UNEMBED_LOGPROBS] = grad_unembed_logprobs,
    [TWK_OP_UNEMBED_LOGPROBS_DIR] = grad_unembed_logprobs_dir,
    [TWK_OP_MOE_GATE] = grad_moe_gate,
    [TWK_OP_MOE_DISPATCH] = grad_moe_dispatch,
    [TWK_OP_MOE_COMBINE] = grad_moe_combine,
    [TWK_OP_MOE_ROUTER_STATS] = grad_moe_router_stats,
};
_Static_assert(sizeof rules / sizeof rules[0] == TWK_OP_COUNT, "one entry per op");

static int grad_map(grad_step *st) {
    st->c[0] = twk_map_back(st->g, st->n.op, st->n.src[0], st->gy);
    return 1;
}

/* Appends the gradient contributions of node `id` (whose gradient is gy). */
static int backward_node(twk_graph *g, twk_id id, twk_id gy, const unsigned char *need, twk_id *grads) {
    grad_step st = {.g = g, .id = id, .n = g->nodes[id], .gy = gy, .need = need};
    for (int i = 0; i < TWK_MAX_SRC; i++) st.c[i] = -1;
    if (st.n.nsrc == 0) return 1; /* a leaf or a fill */
    grad_rule rule = twk_op_info(st.n.op)->kind == TWK_OPK_MAP ? grad_map : rules[st.n.op];
    if (!rule) {
        twk_graph_fail(g, TWK_ERR_UNSUPPORTED, "backward: op %s has no gradient rule (node %d '%s')",
                       twk_op_name(st.n.op), id, st.n.name);
        return 0;
    }
    if (!rule(&st)) return 0;
    for (int i = 0; i < st.n.nsrc; i++)
        if (wants(&st, i)) accumulate(g, grads, st.n.src[i], st.c[i]);
    return g->status == TWK_OK;
}

twk_status twk_graph_backward(twk_graph *g, twk_id loss) {
    if (!g) return twk_error(TWK_ERR_INVALID_ARG, "graph_backward: graph is NULL");
    if (g->status != TWK_OK) return twk_error(g->status, "%s", g->error);
    if (g->grads) return twk_error(TWK_ERR_STATE, "graph_backward: already called on this graph");
    if (loss < 0 || loss >= g->n)
        return twk_error(TWK_ERR_INVALID_ARG, "graph_backward: no tensor %d", loss);
    const twk_node *l = &g->nodes[loss];
    if (l->type != TWK_F32 || l->ndim != 1 || l->ne[0] != 1 || l->dyn) {
        char b[96];
        return twk_error(TWK_ERR_SHAPE, "graph_backward: loss must be a [1] f32 tensor; got %s",
                         twk_shape_str(l, b, sizeof b));
    }
    int n0 = g->n;
    unsigned char *need = twk_host_calloc((size_t)n0, "autograd flags");
    twk_id *grads = NULL;
    if (!need) return TWK_ERR_OOM;
    /* need[i]: a trainable param reaches node i through differentiable edges */
    for (int i = 0; i < n0; i++) {
        const twk_node *n = &g->nodes[i];
        if (n->op == TWK_OP_PARAM) {
            need[i] = (n->flags & TWK_NODE_TRAINABLE) != 0;
            continue;
        }
        for (int k = 0; k < n->nsrc; k++)
            if (need[n->src[k]] && differentiable_src(n, k)) need[i] = 1;
    }
    /* grads must cover nodes appended during backward, so size it generously and grow */
    grads = twk_host_alloc((size_t)n0 * sizeof *grads, "autograd grads");
    if (!grads) {
        twk_host_free(need);
        return TWK_ERR_OOM;
    }
    for (int i = 0; i < n0; i++) grads[i] = -1;
    if (need[loss]) {
        int64_t one = 1;
        grads[loss] = twk_fill(g, 1, &one, 1.0f);
        if (grads[loss] >= 0) twk_node_set_name(g, grads[loss], "d_loss");
        for (int i = loss; i >= 0 && g->status == TWK_OK; i--) {
            if (grads[i] < 0 || !need[i]) continue;
            if (!backward_node(g, i, grads[i], need, grads)) break;
        }
    }
    twk_host_free(need);
    if (g->status != TWK_OK) {
        twk_host_free(grads);
        return twk_error(g->status, "%s", g->error);
    }
    g->grads = grads;
    g->n_grads = n0;
    /* name the parameter gradients for messages and lookup */
    for (int i = 0; i < n0; i++) {
        if (g->nodes[i].op == TWK_OP_PARAM && grads[i] >= 0 && grads[i] >= n0) {
            char name[64];
            snprintf(name, sizeof name, "d_%.60s", g->nodes[i].name);
            if (!g->nodes[grads[i]].name[0]) twk_node_set_name(g, grads[i], name);
        }
    }
    return TWK_OK;
}

twk_id twk_graph_grad(const twk_graph *g, twk_id param) {
    if (!g || !g->grads || param < 0 || param >= g->n_grads) return -1;
    return g->grads[param];
}
