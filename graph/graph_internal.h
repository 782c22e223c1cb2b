/* graph/ internals shared by the builder, autograd and the plan compiler. */
#ifndef TWK_GRAPH_INTERNAL_H
#define TWK_GRAPH_INTERNAL_H

#include "twinkle/graph.h"
#include "twk_backend.h" /* graph lowers to launches: the backend interface */

#define TWK_NODE_TRAINABLE 1u
#define TWK_NODE_OUTPUT 2u
#define TWK_NODE_CHECKPOINT 4u

typedef struct twk_node {
    twk_op op;
    twk_dtype type;
    int ndim;
    int64_t ne[TWK_MAX_DIMS];
    uint8_t dyn;
    uint8_t flags;
    int nsrc;
    twk_id src[TWK_MAX_SRC];
    int32_t ip[TWK_MAX_PARAMS];
    float fp[TWK_MAX_PARAMS];
    char name[64];
} twk_node;

struct twk_graph {
    twk_node *nodes;
    int n, cap;
    twk_status status;
    char error[512];
    twk_id *grads;     /* per node after backward, else NULL */
    int n_grads;       /* nodes that existed when backward ran */
    twk_id *order;     /* launch order after twk_graph_recompute (every node once); NULL: id order */
    int no_fusion;     /* twk_graph_set_fusion(g, false) */
};

/* A fused group (fuse.c): same-shape elementwise nodes launched consecutively, the last
 * (tail) the only one read outside the group, one FUSED_EW launch; or an RMSNORM and the ROPE
 * that alone reads it, one RMSNORM_ROPE launch at the rope's place (and the backward's ROPE and
 * the RMSNORM_BACK_X that alone reads it, one ROPE_RMSNORM_BACK_X launch). */
typedef struct twk_fuse_group {
    twk_op op; /* the launch's: TWK_OP_FUSED_EW, TWK_OP_RMSNORM_ROPE or TWK_OP_ROPE_RMSNORM_BACK_X */
    twk_id tail;
    int n_steps, n_ext;
    twk_id steps[TWK_MAX_PARAMS]; /* in launch order; steps[n_steps - 1] == tail */
    twk_id ext[TWK_MAX_SRC];      /* the launch's sources: the nodes outside the group the steps read */
    int32_t ip[TWK_MAX_PARAMS];   /* the steps as TWK_FUSE_STEP */
    float fp[TWK_MAX_PARAMS];
} twk_fuse_group;

/* The fusion pass over a plan's launch list (launch_node[0..n_launch), unfused): groups of at
 * least two launches into groups[] (room for n_launch / 2; elementwise runs, then norm + rope
 * pairs, forward and backward, where norm_rope is set), fused_into[id] = the group index of
 * every node in one (-1 elsewhere; fused_into has g->n entries). live[id]: the node is needed;
 * keep[id]: its value must stay in memory (an output, bound, viewed or not plan storage). The
 * number of groups; nothing fused when the graph or TWK_FUSION=0 turned fusion off. */
int twk_fuse_pass(const twk_graph *g, const twk_id *launch_node, int n_launch, const unsigned char *live,
                  const unsigned char *keep, int norm_rope, twk_fuse_group *groups, int *fused_into);
/* Whether fusion is on for g (its flag and TWK_FUSION). */
bool twk_fusion_enabled(const twk_graph *g);

/* The k-th node in launch order (id order unless twk_graph_recompute set an order). */
static inline twk_id twk_graph_at(const twk_graph *g, int k) { return g->order ? g->order[k] : k; }

/* Appends a node (copied); returns its id or -1 with the graph error set. */
twk_id twk_graph_push(twk_graph *g, const twk_node *n);
/* Sets the graph's sticky error (first one wins) and returns -1. */
twk_id twk_graph_fail(twk_graph *g, twk_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Writes "[T*16, 64] f32" for a node into buf. */
const char *twk_shape_str(const twk_node *n, char *buf, size_t len);
/* true when two nodes have the same dtype-less shape (dims and token dims). */
int twk_same_shape(const twk_node *a, const twk_node *b);



/* Builders used by autograd (not public: they exist to express gradients). */
twk_id twk_slice_back(twk_graph *g, twk_id x, int axis, int64_t start, int64_t full);
twk_id twk_broadcast_like(twk_graph *g, twk_id x, twk_id like, int mean_scale);
twk_id twk_sum_to_like(twk_graph *g, twk_id x, twk_id like);
/* dx of a MAP op: its table's BACK op applied to (x, dy). */
twk_id twk_map_back(twk_graph *g, twk_op map, twk_id x, twk_id dy);
twk_id twk_swiglu_back(twk_graph *g, twk_id gate, twk_id up, twk_id dy, int which);
twk_id twk_get_rows_back(twk_graph *g, twk_id dy, twk_id ids, int64_t vocab);
/* twk_lora_gather with each w[slot] transposed: w [S, K, N], y[t] = w[slot[t]]^T x[t] (iparam 0). */
twk_id twk_lora_gather_t(twk_graph *g, twk_id x, twk_id w, twk_id slot);
/* d logits [T, E] of twk_moe_gate from dy [T, K]. */
twk_id twk_moe_gate_back(twk_graph *g, twk_id logits, twk_id ids, twk_id dy, bool renormalize);
/* d w [T, K] of twk_moe_combine: dot(dout[t], y[inv[t*K + j]]). */
twk_id twk_moe_combine_back_w(twk_graph *g, twk_id y, twk_id order, twk_id inv, twk_id dout);
/* d logits [T, E] of twk_moe_router_stats(_slots) from dy [2, E] or [S, 2, E] (the mean softmax's rows;
 * the counts have none); slot -1: none. -1 with the graph's error set. */
twk_id twk_moe_router_stats_back(twk_graph *g, twk_id logits, twk_id dy, twk_id slot);
#endif
