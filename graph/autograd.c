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

static int differentiable_src(const twk_node *n, int i) {
    switch (n->op) {
    case TWK_OP_GET_ROWS: return i == 0;
    case TWK_OP_ROPE: return i == 0; /* pos and inv_freq are not differentiated */
    case TWK_OP_ATTN: return i < 3;
    case TWK_OP_LOGPROBS: return i == 0;
    case TWK_OP_GET_ROWS_BACK: return i == 0;
    case TWK_OP_KV_WRITE:
    case TWK_OP_ATTN_CACHE:
    case TWK_OP_LORA_GATHER: return 0;
    default: return 1;
    }
}

static void accumulate(twk_graph *g, twk_id *grads, twk_id target, twk_id contrib) {
    if (contrib < 0) return;
    grads[target] = grads[target] < 0 ? contrib : twk_add(g, grads[target], contrib);
}

/* Appends the gradient contributions of node `id` (whose gradient is gy). */
static int backward_node(twk_graph *g, twk_id id, twk_id gy, const unsigned char *need,
                         twk_id *grads) {
    twk_node n = g->nodes[id]; /* copy: pushes may move the array */
    twk_id c[TWK_MAX_SRC];
    for (int i = 0; i < TWK_MAX_SRC; i++) c[i] = -1;
    const twk_id *s = n.src;
#define NEED(i) (need[s[i]] && differentiable_src(&n, i))

    switch (n.op) {
    case TWK_OP_INPUT:
    case TWK_OP_PARAM:
    case TWK_OP_FILL:
        return 1;
    case TWK_OP_RESHAPE: {
        const twk_node *x = &g->nodes[s[0]];
        int64_t ne[TWK_MAX_DIMS];
        for (int i = 0; i < x->ndim; i++) ne[i] = (x->dyn >> i & 1) ? -x->ne[i] : x->ne[i];
        c[0] = twk_reshape(g, gy, x->ndim, ne);
        break;
    }
    case TWK_OP_PERMUTE: {
        int inv[TWK_MAX_DIMS];
        for (int i = 0; i < n.ndim; i++) inv[n.ip[i]] = i;
        c[0] = twk_permute(g, gy, inv);
        break;
    }
    case TWK_OP_SLICE:
        c[0] = twk_slice_back(g, gy, n.ip[0], n.ip[1], g->nodes[s[0]].ne[n.ip[0]]);
        break;
    case TWK_OP_SLICE_BACK:
        c[0] = twk_slice(g, gy, n.ip[0], n.ip[1], g->nodes[s[0]].ne[n.ip[0]]);
        break;
    case TWK_OP_CONCAT: {
        int64_t la = g->nodes[s[0]].ne[n.ip[0]], lb = g->nodes[s[1]].ne[n.ip[0]];
        if (NEED(0)) c[0] = twk_slice(g, gy, n.ip[0], 0, la);
        if (NEED(1)) c[1] = twk_slice(g, gy, n.ip[0], la, lb);
        break;
    }
    case TWK_OP_BROADCAST:
        if (n.ip[0]) return 0; /* the mean's gradient itself is not differentiated */
        c[0] = twk_sum_to_like(g, gy, s[0]);
        break;
    case TWK_OP_SUM_TO:
        c[0] = twk_broadcast_like(g, gy, s[0], 0);
        break;
    case TWK_OP_ADD:
        if (NEED(0)) c[0] = gy;
        if (NEED(1)) c[1] = twk_same_shape(&g->nodes[s[1]], &n) ? gy : twk_sum_to_like(g, gy, s[1]);
        break;
    case TWK_OP_MUL:
        if (NEED(0)) c[0] = twk_mul(g, gy, s[1]);
        if (NEED(1)) {
            twk_id t = twk_mul(g, gy, s[0]);
            c[1] = twk_same_shape(&g->nodes[s[1]], &n) ? t : twk_sum_to_like(g, t, s[1]);
        }
        break;
    case TWK_OP_SCALE:
        c[0] = twk_scale(g, gy, n.fp[0]);
        break;
    case TWK_OP_SILU:
        c[0] = twk_silu_back(g, s[0], gy);
        break;
    case TWK_OP_SWIGLU:
        if (NEED(0)) c[0] = twk_swiglu_back(g, s[0], s[1], gy, 0);
        if (NEED(1)) c[1] = twk_swiglu_back(g, s[0], s[1], gy, 1);
        break;
    case TWK_OP_SUM:
        c[0] = twk_broadcast_like(g, gy, s[0], 0);
        break;
    case TWK_OP_MEAN:
        c[0] = twk_broadcast_like(g, gy, s[0], 1);
        break;
    case TWK_OP_WEIGHTED_SUM:
        if (NEED(0)) c[0] = twk_mul(g, s[1], gy);
        if (NEED(1)) c[1] = twk_mul(g, s[0], gy);
        break;
    case TWK_OP_MATMUL: {
        int ta = n.ip[0], tb = n.ip[1];
        if (NEED(0))
            c[0] = ta ? twk_matmul(g, s[1], gy, tb, true) : twk_matmul(g, gy, s[1], false, !tb);
        if (NEED(1))
            c[1] = tb ? twk_matmul(g, gy, s[0], true, ta) : twk_matmul(g, s[0], gy, !ta, false);
        break;
    }
    case TWK_OP_GET_ROWS:
        if (g->nodes[s[0]].dyn) {
            twk_graph_fail(g, TWK_ERR_UNSUPPORTED, "backward: get_rows from a per-token table (node %d) has no gradient rule", id);
            return 0;
        }
        c[0] = twk_get_rows_back(g, gy, s[1], g->nodes[s[0]].ne[0]);
        break;
    case TWK_OP_RMSNORM: {
        if (NEED(0)) {
            twk_id src3[3] = {s[0], s[1], gy};
            c[0] = raw(g, TWK_OP_RMSNORM_BACK_X, s[0], 3, src3, n.ip, n.fp);
        }
        if (NEED(1)) {
            twk_id src2[2] = {s[0], gy};
            c[1] = raw(g, TWK_OP_RMSNORM_BACK_W, s[1], 2, src2, n.ip, n.fp);
        }
        break;
    }
    case TWK_OP_ROPE: {
        twk_id src3[3] = {gy, s[1], n.nsrc > 2 ? s[2] : -1};
        int32_t ip[TWK_MAX_PARAMS] = {0};
        ip[0] = !n.ip[0]; /* the inverse rotation */
        c[0] = raw(g, TWK_OP_ROPE, s[0], n.nsrc, src3, ip, n.fp);
        break;
    }
    case TWK_OP_ATTN: {
        twk_id lse_src[3] = {s[0], s[1], s[3]};
        twk_node lshape;
        memset(&lshape, 0, sizeof lshape);
        /* lse is [T, Hq]: build it from q's shape */
        const twk_node *q = &g->nodes[s[0]];
        lshape.op = TWK_OP_ATTN_LSE;
        lshape.type = TWK_F32;
        lshape.ndim = 2;
        lshape.ne[0] = q->ne[0];
        lshape.ne[1] = q->ne[1];
        lshape.dyn = q->dyn & 1;
        lshape.nsrc = 3;
        memcpy(lshape.src, lse_src, sizeof lse_src);
        lshape.fp[0] = n.fp[0];
        twk_id lse = twk_graph_push(g, &lshape);
        if (lse < 0) return 0;
        for (int w = 0; w < 3; w++) {
            if (!NEED(w)) continue;
            twk_id src7[7] = {s[0], s[1], s[2], s[3], id, gy, lse};
            int32_t ip[TWK_MAX_PARAMS] = {0};
            ip[0] = w;
            c[w] = raw(g, TWK_OP_ATTN_BACK, s[w], 7, src7, ip, n.fp);
        }
        break;
    }
    case TWK_OP_LOGPROBS: {
        /* the forward's logprobs give the log-sum-exp back without a pass over V */
        twk_id src4[4] = {s[0], s[1], gy, id};
        c[0] = raw(g, TWK_OP_LOGPROBS_BACK, s[0], 4, src4, NULL, NULL);
        break;
    }
    case TWK_OP_GET_ROWS_BACK:
        c[0] = twk_get_rows(g, gy, s[1]);
        break;
    default:
        twk_graph_fail(g, TWK_ERR_UNSUPPORTED, "backward: op %s has no gradient rule (node %d '%s')",
                       twk_op_name(n.op), id, n.name);
        return 0;
    }
    for (int i = 0; i < n.nsrc; i++)
        if (NEED(i)) accumulate(g, grads, s[i], c[i]);
#undef NEED
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
