/* Activation recompute (per-segment checkpointing): the backward graph reads
 * copies of the forward tensors between two checkpoints, recomputed just
 * before the first backward op that needs them, so the forward originals die
 * as soon as the forward has used them. */
#include <string.h>

#include "graph_internal.h"

typedef struct rc {
    twk_graph *g;
    int n_fwd;
    int *seg;      /* per forward node: its segment, -1 when it is kept (not recomputed) */
    twk_id *clone; /* per forward node: its copy, -1 until made */
    int *done;     /* per segment: copies made */
    int n_order;
} rc;

/* Segment k holds the forward nodes strictly between checkpoints k and k+1;
 * leaves, in-place writers and outputs are kept. The number of segments. */
static int assign_segments(const twk_graph *g, int n_fwd, int *seg) {
    int k = -1, n_seg = 0;
    for (int i = 0; i < n_fwd; i++) {
        const twk_node *nd = &g->nodes[i];
        seg[i] = -1;
        if (nd->flags & TWK_NODE_CHECKPOINT) {
            k = n_seg++;
            continue;
        }
        twk_op_kind kind = twk_op_info(nd->op)->kind;
        if (k < 0 || kind == TWK_OPK_LEAF || kind == TWK_OPK_INPLACE || (nd->flags & TWK_NODE_OUTPUT)) continue;
        seg[i] = k;
    }
    /* the last checkpoint's segment (the head) runs right before its backward: keep it */
    for (int i = 0; i < n_fwd; i++)
        if (seg[i] == n_seg - 1) seg[i] = -1;
    return n_seg;
}

/* Copies every node of segment k, in id order (sources first), after the
 * launches placed so far. */
static void copy_segment(rc *r, int k) {
    twk_graph *g = r->g;
    r->done[k] = 1;
    for (int i = 0; i < r->n_fwd && g->status == TWK_OK; i++) {
        if (r->seg[i] != k) continue;
        twk_node c = g->nodes[i];
        c.flags = 0;
        for (int s = 0; s < c.nsrc; s++)
            if (r->seg[c.src[s]] == k) c.src[s] = r->clone[c.src[s]];
        twk_id id = twk_graph_push(g, &c);
        if (id < 0) return;
        r->clone[i] = id;
        g->order[r->n_order++] = id;
    }
}

twk_status twk_graph_recompute(twk_graph *g) {
    if (!g) return twk_error(TWK_ERR_INVALID_ARG, "graph_recompute: graph is NULL");
    if (g->status != TWK_OK) return twk_error(g->status, "%s", g->error);
    if (!g->grads) return twk_error(TWK_ERR_STATE, "graph_recompute: call twk_graph_backward first");
    if (g->order) return twk_error(TWK_ERR_STATE, "graph_recompute: already called on this graph");
    int n0 = g->n, n_fwd = g->n_grads;
    rc r = {.g = g, .n_fwd = n_fwd};
    r.seg = twk_host_alloc((size_t)n_fwd * sizeof *r.seg, "recompute");
    r.clone = twk_host_alloc((size_t)n_fwd * sizeof *r.clone, "recompute");
    r.done = twk_host_calloc((size_t)n_fwd * sizeof *r.done + 1, "recompute");
    /* at most every forward node is copied once: room for them all */
    int cap = g->cap > n0 + n_fwd ? g->cap : n0 + n_fwd;
    twk_node *nn = twk_host_alloc((size_t)cap * sizeof *nn, "graph nodes");
    g->order = twk_host_alloc((size_t)cap * sizeof *g->order, "graph order");
    twk_status st = r.seg && r.clone && r.done && nn && g->order ? TWK_OK : TWK_ERR_OOM;
    if (st == TWK_OK) {
        memcpy(nn, g->nodes, (size_t)n0 * sizeof *nn);
        twk_host_free(g->nodes);
        g->nodes = nn;
        g->cap = cap;
        nn = NULL;
        assign_segments(g, n_fwd, r.seg);
        for (int i = 0; i < n_fwd; i++) r.clone[i] = -1;
        for (int i = 0; i < n_fwd; i++) g->order[r.n_order++] = i;
        for (int i = n_fwd; i < n0 && g->status == TWK_OK; i++) {
            twk_node *nd = &g->nodes[i];
            for (int s = 0; s < nd->nsrc && g->status == TWK_OK; s++) {
                twk_id src = nd->src[s];
                if (src >= n_fwd || r.seg[src] < 0) continue;
                if (!r.done[r.seg[src]]) copy_segment(&r, r.seg[src]);
                nd = &g->nodes[i];
                nd->src[s] = r.clone[src];
            }
            g->order[r.n_order++] = i;
        }
        st = g->status;
    }
    twk_host_free(nn);
    twk_host_free(r.seg);
    twk_host_free(r.clone);
    twk_host_free(r.done);
    if (st != TWK_OK) {
        twk_host_free(g->order);
        g->order = NULL;
        return st == TWK_ERR_OOM ? twk_error(st, "graph_recompute: out of memory") : twk_error(st, "%s", g->error);
    }
    return TWK_OK;
}
