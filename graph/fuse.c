/* Elementwise fusion, a plan-compile pass: maximal runs of consecutive launches of same-shape
 * f32 elementwise ops (add, mul, scale, silu, gelu, tanh, swiglu and their gradients) whose
 * intermediates only the next steps of the run read become one FUSED_EW launch. Consecutive
 * only: nothing runs between a group's steps, so moving them into one launch reorders nothing
 * (no in-place writer can slip between a step and its sources), and the memory planner sees the
 * sources live until the group's launch and the intermediates gone.
 *
 * Also Qwen3's per-head norm of q or k and its rotation: an RMSNORM whose output only a ROPE
 * reads becomes one RMSNORM_ROPE launch at the rope's place. The model launches both norms before
 * both rotations, so the pair need not be consecutive: the norm moves past the launches between
 * (nothing reads its output; none of them may write in place, so its sources are unchanged), and
 * the memory planner sees its sources live until the pair's launch. Likewise the backward's
 * pair: the inverse rotation of the gradient and the RMSNORM_BACK_X that alone reads it (the
 * norm's weight frozen: a trainable one's RMSNORM_BACK_W reads the rotation too, which then
 * stays a launch of its own) become one ROPE_RMSNORM_BACK_X launch. */
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"

bool twk_fusion_enabled(const twk_graph *g) {
    const char *env = getenv("TWK_FUSION");
    if (env && !strcmp(env, "0")) return false;
    return g && !g->no_fusion;
}

static bool fusable_op(twk_op op) {
    switch (op) {
    case TWK_OP_ADD: case TWK_OP_MUL: case TWK_OP_SCALE: case TWK_OP_SILU: case TWK_OP_SILU_BACK:
    case TWK_OP_SWIGLU: case TWK_OP_SWIGLU_BACK: case TWK_OP_GELU: case TWK_OP_GELU_BACK:
    case TWK_OP_TANH: case TWK_OP_TANH_BACK:
        return true;
    default:
        return false;
    }
}

/* A node a group may hold: a fusable op on f32, every source f32 of its shape (no broadcast). */
static bool fusable(const twk_graph *g, twk_id id) {
    const twk_node *nd = &g->nodes[id];
    if (!fusable_op(nd->op) || nd->type != TWK_F32 || nd->nsrc < 1 || nd->nsrc > 3) return false;
    for (int k = 0; k < nd->nsrc; k++) {
        const twk_node *s = &g->nodes[nd->src[k]];
        if (s->type != TWK_F32 || !twk_same_shape(s, nd)) return false;
    }
    return true;
}

/* A group while the pass runs: launches [start, end], alive until merged into a later one. */
typedef struct work {
    int start, end, alive;
    twk_fuse_group grp;
} work;

static int step_index(const twk_fuse_group *grp, twk_id id) {
    for (int k = 0; k < grp->n_steps; k++)
        if (grp->steps[k] == id) return k;
    return -1;
}

/* The sources the steps read from outside the group, each once; -1 past TWK_MAX_SRC. */
static int collect_ext(const twk_graph *g, twk_fuse_group *grp) {
    grp->n_ext = 0;
    for (int k = 0; k < grp->n_steps; k++) {
        const twk_node *nd = &g->nodes[grp->steps[k]];
        for (int j = 0; j < nd->nsrc; j++) {
            twk_id s = nd->src[j];
            if (step_index(grp, s) >= 0) continue;
            int e = 0;
            while (e < grp->n_ext && grp->ext[e] != s) e++;
            if (e < grp->n_ext) continue;
            if (grp->n_ext == TWK_MAX_SRC) return -1;
            grp->ext[grp->n_ext++] = s;
        }
    }
    return grp->n_ext;
}

/* The steps as TWK_FUSE_STEP words (operands: sources or earlier steps). */
static void encode(const twk_graph *g, twk_fuse_group *grp) {
    memset(grp->ip, 0, sizeof grp->ip);
    memset(grp->fp, 0, sizeof grp->fp);
    for (int k = 0; k < grp->n_steps; k++) {
        const twk_node *nd = &g->nodes[grp->steps[k]];
        int arg[3] = {0, 0, 0};
        for (int j = 0; j < nd->nsrc; j++) {
            int m = step_index(grp, nd->src[j]);
            if (m >= 0) {
                arg[j] = TWK_FUSE_RESULT(m);
            } else {
                int e = 0;
                while (grp->ext[e] != nd->src[j]) e++;
                arg[j] = e;
            }
        }
        grp->ip[k] = TWK_FUSE_STEP(nd->op, arg[0], arg[1], arg[2], nd->op == TWK_OP_SWIGLU_BACK ? nd->ip[0] & 1 : 0);
        grp->fp[k] = nd->op == TWK_OP_SCALE ? nd->fp[0] : 0.0f;
    }
}

/* Merges the group of w's source x (ending right before w's run) into w when the result still
 * fits a launch; false (w unchanged) otherwise. */
static bool absorb(const twk_graph *g, work *w, work *x) {
    if (x->grp.n_steps + w->grp.n_steps > TWK_MAX_PARAMS) return false;
    twk_fuse_group t = x->grp;
    memcpy(t.steps + t.n_steps, w->grp.steps, (size_t)w->grp.n_steps * sizeof *t.steps);
    t.n_steps += w->grp.n_steps;
    t.tail = w->grp.tail;
    if (collect_ext(g, &t) < 0) return false;
    w->grp = t;
    w->start = x->start;
    x->alive = 0;
    return true;
}

/* A pair's two ops: `first`'s output read only by `second`, as its source `at`, fused into `op`. */
typedef struct pair_kind {
    twk_op first, second;
    int at;
    twk_op op;
} pair_kind;

static const pair_kind pair_kinds[] = {
    {TWK_OP_RMSNORM, TWK_OP_ROPE, 0, TWK_OP_RMSNORM_ROPE},
    {TWK_OP_ROPE, TWK_OP_RMSNORM_BACK_X, 2, TWK_OP_ROPE_RMSNORM_BACK_X},
};

/* The node launched earlier that only the launch li reads and fuses with it (pair_kinds; with no
 * in-place writer between; launch_of: each node's launch index, -1 none); -1 when there is none. */
static twk_id pair_first(const twk_graph *g, const twk_id *launch_node, int li, const int *launch_of,
                         const int *uses, const unsigned char *keep, const pair_kind **kind) {
    const twk_node *y = &g->nodes[launch_node[li]];
    *kind = NULL;
    for (size_t k = 0; k < sizeof pair_kinds / sizeof pair_kinds[0]; k++)
        if (y->op == pair_kinds[k].second) *kind = &pair_kinds[k];
    if (!*kind || y->type != TWK_F32 || y->nsrc <= (*kind)->at) return -1;
    twk_id r = y->src[(*kind)->at];
    const twk_node *n = &g->nodes[r];
    if (n->op != (*kind)->first || n->type != TWK_F32 || uses[r] != 1 || keep[r] || launch_of[r] < 0 ||
        launch_of[r] >= li || n->ndim != 3 || !twk_same_shape(n, y))
        return -1;
    for (int k = launch_of[r] + 1; k < li; k++)
        if (twk_op_info(g->nodes[launch_node[k]].op)->kind == TWK_OPK_INPLACE) return -1;
    return r;
}

/* Appends the pairs (pair_first) to groups[0..ng); the new count. Sources: the norm's x and w,
 * then (backward) the rotation's dy, then the rotation's pos [, inv_freq]. */
static int pair_up(const twk_graph *g, const twk_id *launch_node, int n_launch, const int *uses,
                   const unsigned char *keep, int *launch_of, twk_fuse_group *groups, int ng, int *fused_into) {
    for (int i = 0; i < g->n; i++) launch_of[i] = -1;
    for (int li = 0; li < n_launch; li++) launch_of[launch_node[li]] = li;
    for (int li = 0; li < n_launch; li++) {
        const pair_kind *kind = NULL;
        twk_id r = pair_first(g, launch_node, li, launch_of, uses, keep, &kind), y = launch_node[li];
        if (r < 0 || fused_into[r] >= 0 || fused_into[y] >= 0) continue;
        int fwd = kind->op == TWK_OP_RMSNORM_ROPE;
        const twk_node *norm = &g->nodes[fwd ? r : y], *rope = &g->nodes[fwd ? y : r];
        twk_fuse_group *grp = &groups[ng];
        memset(grp, 0, sizeof *grp);
        grp->op = kind->op;
        grp->tail = y;
        grp->n_steps = 2;
        grp->steps[0] = r;
        grp->steps[1] = y;
        grp->ext[grp->n_ext++] = norm->src[0];
        grp->ext[grp->n_ext++] = norm->src[1];
        if (!fwd) grp->ext[grp->n_ext++] = rope->src[0];
        for (int k = 1; k < rope->nsrc; k++) grp->ext[grp->n_ext++] = rope->src[k];
        grp->ip[0] = rope->ip[0];
        grp->fp[0] = norm->fp[0];
        grp->fp[1] = rope->fp[0];
        fused_into[r] = fused_into[y] = ng++;
    }
    return ng;
}

int twk_fuse_pass(const twk_graph *g, const twk_id *launch_node, int n_launch, const unsigned char *live,
                  const unsigned char *keep, int norm_rope, twk_fuse_group *groups, int *fused_into) {
    for (int i = 0; i < g->n; i++) fused_into[i] = -1;
    if (!twk_fusion_enabled(g) || n_launch < 2) return 0;
    int *uses = twk_host_calloc((size_t)g->n * sizeof *uses, "fusion pass");
    int *work_of = twk_host_alloc((size_t)g->n * sizeof *work_of, "fusion pass");
    work *ws = twk_host_calloc((size_t)n_launch * sizeof *ws, "fusion pass");
    if (!uses || !work_of || !ws) {
        twk_host_free(uses);
        twk_host_free(work_of);
        twk_host_free(ws);
        return 0; /* out of memory: the plan stays unfused, which is correct */
    }
    for (int i = 0; i < g->n; i++) {
        work_of[i] = -1;
        if (!live[i]) continue;
        for (int k = 0; k < g->nodes[i].nsrc; k++) uses[g->nodes[i].src[k]]++;
    }
    int nw = 0;
    for (int li = 0; li < n_launch; li++) {
        twk_id y = launch_node[li];
        if (!fusable(g, y)) continue;
        work *w = &ws[nw];
        *w = (work){.start = li, .end = li, .alive = 1};
        w->grp.op = TWK_OP_FUSED_EW;
        w->grp.tail = y;
        w->grp.steps[0] = y;
        w->grp.n_steps = 1;
        collect_ext(g, &w->grp);
        work_of[y] = nw++;
        /* a run ending right before this one whose tail only a step of this one reads: merge; repeat */
        for (;;) {
            int best = -1;
            for (int s = 0; best < 0 && s < w->grp.n_steps; s++) {
                const twk_node *sn = &g->nodes[w->grp.steps[s]];
                for (int k = 0; k < sn->nsrc && best < 0; k++) {
                    twk_id x = sn->src[k];
                    int xw = work_of[x];
                    if (xw < 0 || !ws[xw].alive || ws[xw].grp.tail != x || ws[xw].end != w->start - 1) continue;
                    if (uses[x] != 1 || keep[x]) continue;
                    best = xw;
                }
            }
            if (best < 0 || !absorb(g, w, &ws[best])) break;
        }
    }
    int ng = 0;
    for (int k = 0; k < nw; k++) {
        if (!ws[k].alive || ws[k].grp.n_steps < 2) continue;
        twk_fuse_group *grp = &groups[ng];
        *grp = ws[k].grp;
        encode(g, grp);
        for (int s = 0; s < grp->n_steps; s++) fused_into[grp->steps[s]] = ng;
        ng++;
    }
    if (norm_rope) ng = pair_up(g, launch_node, n_launch, uses, keep, work_of, groups, ng, fused_into);
    twk_host_free(uses);
    twk_host_free(work_of);
    twk_host_free(ws);
    return ng;
}
