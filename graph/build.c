/* Graph builders: one function per op, each checking dtypes and shapes and
 * naming the op and the shapes when they do not agree. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "graph_internal.h"

#define SHAPE(g, id, buf) twk_shape_str(&(g)->nodes[id], buf, sizeof buf)

/* Returns the node or NULL (sticky: a -1 argument propagates silently). */
static const twk_node *arg(twk_graph *g, twk_id id, const char *op, const char *which) {
    if (!g) return NULL;
    if (id < 0) {
        if (g->status == TWK_OK)
            twk_graph_fail(g, TWK_ERR_INVALID_ARG, "%s: %s is not a tensor (id %d)", op, which, id);
        return NULL;
    }
    if (id >= g->n) {
        twk_graph_fail(g, TWK_ERR_INVALID_ARG, "%s: %s id %d is not in this graph (%d nodes)", op,
                       which, id, g->n);
        return NULL;
    }
    return &g->nodes[id];
}

static int want_dtype(twk_graph *g, const twk_node *n, twk_id id, const char *op,
                      const char *which, int ok_f32, int ok_int) {
    int ok = (n->type == TWK_F32 && ok_f32) || ((n->type == TWK_I32 || n->type == TWK_I64) && ok_int);
    if (!ok) {
        char b[96];
        twk_graph_fail(g, TWK_ERR_DTYPE, "%s: %s %s has dtype %s; expected %s", op, which,
                       SHAPE(g, id, b), twk_dtype_name(n->type), ok_f32 ? "f32" : "i32 or i64");
    }
    return ok;
}

/* want_dtype for a source that may also hold bf16 / f16 (a frozen weight, a KV cache). */
static int want_float(twk_graph *g, const twk_node *n, twk_id id, const char *op, const char *which) {
    return twk_dtype_is_half(n->type) || want_dtype(g, n, id, op, which, 1, 0);
}

static int shape_from_spec(twk_graph *g, const char *op, int ndim, const int64_t *ne,
                           twk_node *out) {
    if (ndim < 1 || ndim > TWK_MAX_DIMS || !ne) {
        twk_graph_fail(g, TWK_ERR_SHAPE, "%s: rank %d is not in 1..%d", op, ndim, TWK_MAX_DIMS);
        return 0;
    }
    out->ndim = ndim;
    out->dyn = 0;
    for (int i = 0; i < ndim; i++) {
        if (ne[i] == 0) {
            twk_graph_fail(g, TWK_ERR_SHAPE, "%s: dim %d is 0", op, i);
            return 0;
        }
        if (ne[i] < 0) {
            out->ne[i] = -ne[i];
            out->dyn |= (uint8_t)(1u << i);
        } else {
            out->ne[i] = ne[i];
        }
    }
    return 1;
}

static void init_node(twk_node *n, twk_op op, twk_dtype t) {
    memset(n, 0, sizeof *n);
    n->op = op;
    n->type = t;
}

static void copy_shape(twk_node *dst, const twk_node *src) {
    dst->ndim = src->ndim;
    dst->dyn = src->dyn;
    memcpy(dst->ne, src->ne, sizeof dst->ne);
}

/* ---- leaves ---- */

static twk_id leaf(twk_graph *g, twk_op op, const char *opname, const char *name, twk_dtype t,
                   int ndim, const int64_t *ne) {
    if (!g || g->status != TWK_OK) return -1;
    if (twk_dtype_size(t) == 0)
        return twk_graph_fail(g, TWK_ERR_DTYPE, "%s '%s': unknown dtype %d", opname,
                              name ? name : "", (int)t);
    twk_node n;
    init_node(&n, op, t);
    if (!shape_from_spec(g, opname, ndim, ne, &n)) return -1;
    if (name) snprintf(n.name, sizeof n.name, "%s", name);
    return twk_graph_push(g, &n);
}

twk_id twk_input(twk_graph *g, const char *name, twk_dtype t, int ndim, const int64_t *ne) {
    return leaf(g, TWK_OP_INPUT, "input", name, t, ndim, ne);
}

twk_id twk_param(twk_graph *g, const char *name, int ndim, const int64_t *ne, bool trainable) {
    return twk_param_dtype(g, name, TWK_F32, ndim, ne, trainable);
}

twk_id twk_param_dtype(twk_graph *g, const char *name, twk_dtype t, int ndim, const int64_t *ne, bool trainable) {
    if (trainable && t != TWK_F32)
        return twk_graph_fail(g, TWK_ERR_DTYPE, "param '%s': a trainable parameter is f32, not %s", name ? name : "",
                              twk_dtype_name(t));
    twk_id id = leaf(g, TWK_OP_PARAM, "param", name, t, ndim, ne);
    if (id >= 0 && trainable) g->nodes[id].flags |= TWK_NODE_TRAINABLE;
    return id;
}

twk_id twk_fill(twk_graph *g, int ndim, const int64_t *ne, float value) {
    twk_id id = leaf(g, TWK_OP_FILL, "fill", NULL, TWK_F32, ndim, ne);
    if (id >= 0) g->nodes[id].fp[0] = value;
    return id;
}

/* ---- layout ---- */

twk_id twk_reshape(twk_graph *g, twk_id x, int ndim, const int64_t *ne) {
    const twk_node *a = arg(g, x, "reshape", "x");
    if (!a) return -1;
    twk_node n;
    init_node(&n, TWK_OP_RESHAPE, a->type);
    if (!shape_from_spec(g, "reshape", ndim, ne, &n)) return -1;
    int64_t ca = 1, cn = 1;
    int da = 0, dn = 0;
    for (int i = 0; i < a->ndim; i++) { ca *= a->ne[i]; da += a->dyn >> i & 1; }
    for (int i = 0; i < n.ndim; i++) { cn *= n.ne[i]; dn += n.dyn >> i & 1; }
    if (ca != cn || da != dn) {
        char b1[96], b2[96];
        return twk_graph_fail(g, TWK_ERR_SHAPE, "reshape: %s cannot become %s (element counts differ)",
                              SHAPE(g, x, b1), twk_shape_str(&n, b2, sizeof b2));
    }
    n.nsrc = 1;
    n.src[0] = x;
    return twk_graph_push(g, &n);
}

twk_id twk_permute(twk_graph *g, twk_id x, const int *perm) {
    const twk_node *a = arg(g, x, "permute", "x");
    if (!a) return -1;
    twk_node n;
    init_node(&n, TWK_OP_PERMUTE, a->type);
    n.ndim = a->ndim;
    int seen = 0;
    for (int i = 0; i < a->ndim; i++) {
        if (!perm || perm[i] < 0 || perm[i] >= a->ndim || (seen >> perm[i] & 1)) {
            char b[96];
            return twk_graph_fail(g, TWK_ERR_SHAPE, "permute: axis order is not a permutation of %d dims for %s",
                                  a->ndim, SHAPE(g, x, b));
        }
        seen |= 1 << perm[i];
        n.ne[i] = a->ne[perm[i]];
        if (a->dyn >> perm[i] & 1) n.dyn |= (uint8_t)(1u << i);
        n.ip[i] = perm[i];
    }
    n.nsrc = 1;
    n.src[0] = x;
    return twk_graph_push(g, &n);
}

twk_id twk_transpose(twk_graph *g, twk_id x) {
    const twk_node *a = arg(g, x, "transpose", "x");
    if (!a) return -1;
    if (a->ndim < 2) {
        char b[96];
        return twk_graph_fail(g, TWK_ERR_SHAPE, "transpose: %s has fewer than 2 dims", SHAPE(g, x, b));
    }
    int perm[TWK_MAX_DIMS];
    for (int i = 0; i < a->ndim; i++) perm[i] = i;
    perm[a->ndim - 2] = a->ndim - 1;
    perm[a->ndim - 1] = a->ndim - 2;
    return twk_permute(g, x, perm);
}

static twk_id slice_like(twk_graph *g, twk_op op, twk_id x, int axis, int64_t start, int64_t len,
                         int64_t full) {
    const char *opname = twk_op_name(op);
    const twk_node *a = arg(g, x, opname, "x");
    if (!a) return -1;
    char b[96];
    if (axis < 0 || axis >= a->ndim)
        return twk_graph_fail(g, TWK_ERR_SHAPE, "%s: axis %d out of range for %s", opname, axis,
                              SHAPE(g, x, b));
    if (a->dyn >> axis & 1)
        return twk_graph_fail(g, TWK_ERR_SHAPE, "%s: axis %d of %s is a token dim; only static dims slice",
                              opname, axis, SHAPE(g, x, b));
    twk_node n;
    init_node(&n, op, a->type);
    copy_shape(&n, a);
    if (op == TWK_OP_SLICE) {
        if (start < 0 || len < 1 || start + len > a->ne[axis])
            return twk_graph_fail(g, TWK_ERR_SHAPE, "slice: [%lld, %lld) out of range for axis %d of %s",
                                  (long long)start, (long long)(start + len), axis, SHAPE(g, x, b));
        n.ne[axis] = len;
    } else {
        if (start < 0 || start + a->ne[axis] > full)
            return twk_graph_fail(g, TWK_ERR_SHAPE, "slice_back: %s at %lld exceeds %lld on axis %d",
                                  SHAPE(g, x, b), (long long)start, (long long)full, axis);
        n.ne[axis] = full;
    }
    n.ip[0] = axis;
    n.ip[1] = (int32_t)start;
    n.nsrc = 1;
    n.src[0] = x;
    return twk_graph_push(g, &n);
}

twk_id twk_slice(twk_graph *g, twk_id x, int axis, int64_t start, int64_t len) {
    return slice_like(g, TWK_OP_SLICE, x, axis, start, len, 0);
}

/* Zeros of x's shape with `full` on `axis`, holding x at `start` (slice's gradient). */
twk_id twk_slice_back(twk_graph *g, twk_id x, int axis, int64_t start, int64_t full) {
    return slice_like(g, TWK_OP_SLICE_BACK, x, axis, start, 0, full);
}

twk_id twk_concat(twk_graph *g, twk_id a_id, twk_id b_id, int axis) {
    const twk_node *a = arg(g, a_id, "concat", "a");
    const twk_node *b = arg(g, b_id, "concat", "b");
    if (!a || !b) return -1;
    char s1[96], s2[96];
    int ok = a->ndim == b->ndim && a->type == b->type && axis >= 0 && axis < a->ndim &&
             a->dyn == b->dyn && !(a->dyn >> axis & 1);
    for (int i = 0; ok && i < a->ndim; i++)
        if (i != axis && a->ne[i] != b->ne[i]) ok = 0;
    if (!ok)
        return twk_graph_fail(g, a->type != b->type ? TWK_ERR_DTYPE : TWK_ERR_SHAPE,
                              "concat: %s and %s do not join on axis %d", SHAPE(g, a_id, s1),
                              SHAPE(g, b_id, s2), axis);
    twk_node n;
    init_node(&n, TWK_OP_CONCAT, a->type);
    copy_shape(&n, a);
    n.ne[axis] = a->ne[axis] + b->ne[axis];
    n.ip[0] = axis;
    n.nsrc = 2;
    n.src[0] = a_id;
    n.src[1] = b_id;
    return twk_graph_push(g, &n);
}

/* true if b broadcasts to a: right-aligned dims equal (incl. token dim) or a static 1. */
static int broadcasts(const twk_node *a, const twk_node *b) {
    if (b->ndim > a->ndim) return 0;
    for (int i = 0; i < b->ndim; i++) {
        int ia = a->ndim - b->ndim + i;
        int bd = b->dyn >> i & 1, ad = a->dyn >> ia & 1;
        if (!bd && b->ne[i] == 1) continue;
        if (bd != ad || b->ne[i] != a->ne[ia]) return 0;
    }
    return 1;
}

/* Shape-changing broadcast and its adjoint, used by autograd. */
static twk_id to_shape(twk_graph *g, twk_op op, twk_id x, const twk_node *like, int mean_scale) {
    const char *opname = twk_op_name(op);
    const twk_node *a = arg(g, x, opname, "x");
    if (!a) return -1;
    const twk_node *big = op == TWK_OP_BROADCAST ? like : a;
    const twk_node *small = op == TWK_OP_BROADCAST ? a : like;
    if (!broadcasts(big, small)) {
        char s1[96], s2[96];
        return twk_graph_fail(g, TWK_ERR_SHAPE, "%s: %s does not broadcast to %s", opname,
                              twk_shape_str(small, s1, sizeof s1), twk_shape_str(big, s2, sizeof s2));
    }
    twk_node n;
    init_node(&n, op, a->type);
    copy_shape(&n, like);
    n.ip[0] = mean_scale;
    n.nsrc = 1;
    n.src[0] = x;
    return twk_graph_push(g, &n);
}

twk_id twk_broadcast_like(twk_graph *g, twk_id x, twk_id like, int mean_scale) {
    const twk_node *l = arg(g, like, "broadcast", "like");
    if (!l) return -1;
    twk_node copy = *l;
    return to_shape(g, TWK_OP_BROADCAST, x, &copy, mean_scale);
}

twk_id twk_sum_to_like(twk_graph *g, twk_id x, twk_id like) {
    const twk_node *l = arg(g, like, "sum_to", "like");
    if (!l) return -1;
    twk_node copy = *l;
    return to_shape(g, TWK_OP_SUM_TO, x, &copy, 0);
}

/* ---- elementwise ---- */

static twk_id binary(twk_graph *g, twk_op op, twk_id a_id, twk_id b_id) {
    const char *opname = twk_op_name(op);
    const twk_node *a = arg(g, a_id, opname, "a");
    const twk_node *b = arg(g, b_id, opname, "b");
    if (!a || !b) return -1;
    if (!want_dtype(g, a, a_id, opname, "a", 1, 0) || !want_dtype(g, b, b_id, opname, "b", 1, 0))
        return -1;
    if (!broadcasts(a, b)) {
        char s1[96], s2[96];
        return twk_graph_fail(g, TWK_ERR_SHAPE, "%s: b %s does not broadcast to a %s", opname,
                              SHAPE(g, b_id, s2), SHAPE(g, a_id, s1));
    }
    twk_node n;
    init_node(&n, op, TWK_F32);
    copy_shape(&n, a);
    n.nsrc = 2;
    n.src[0] = a_id;
    n.src[1] = b_id;
    return twk_graph_push(g, &n);
}

twk_id twk_add(twk_graph *g, twk_id a, twk_id b) { return binary(g, TWK_OP_ADD, a, b); }
twk_id twk_mul(twk_graph *g, twk_id a, twk_id b) { return binary(g, TWK_OP_MUL, a, b); }

static twk_id unary(twk_graph *g, twk_op op, twk_id x, float f0) {
    const char *opname = twk_op_name(op);
    const twk_node *a = arg(g, x, opname, "x");
    if (!a || !want_dtype(g, a, x, opname, "x", 1, 0)) return -1;
    twk_node n;
    init_node(&n, op, TWK_F32);
    copy_shape(&n, a);
    n.fp[0] = f0;
    n.nsrc = 1;
    n.src[0] = x;
    return twk_graph_push(g, &n);
}

twk_id twk_scale(twk_graph *g, twk_id x, float s) { return unary(g, TWK_OP_SCALE, x, s); }
twk_id twk_silu(twk_graph *g, twk_id x) { return twk_map(g, TWK_OP_SILU, x); }

twk_id twk_map(twk_graph *g, twk_op op, twk_id x) {
    if (g && twk_op_info(op)->kind != TWK_OPK_MAP)
        return twk_graph_fail(g, TWK_ERR_INVALID_ARG, "map: op %s is not an elementwise map", twk_op_name(op));
    return unary(g, op, x, 0);
}

/* An op over several same-shape f32 tensors, output of the first's shape. */
static twk_id same_shape_op(twk_graph *g, twk_op op, int nsrc, const twk_id *src, int32_t ip0) {
    const char *opname = twk_op_name(op);
    static const char *const which[] = {"src0", "src1", "src2"};
    const twk_node *first = NULL;
    for (int i = 0; i < nsrc; i++) {
        const twk_node *s = arg(g, src[i], opname, which[i]);
        if (!s || !want_dtype(g, s, src[i], opname, which[i], 1, 0)) return -1;
        if (!first) first = s;
        if (!twk_same_shape(first, s)) {
            char s1[96], s2[96];
            return twk_graph_fail(g, TWK_ERR_SHAPE, "%s: shapes %s and %s differ", opname,
                                  SHAPE(g, src[0], s1), SHAPE(g, src[i], s2));
        }
    }
    twk_node n;
    init_node(&n, op, TWK_F32);
    copy_shape(&n, first);
    n.nsrc = nsrc;
    for (int i = 0; i < nsrc; i++) n.src[i] = src[i];
    n.ip[0] = ip0;
    return twk_graph_push(g, &n);
}

twk_id twk_swiglu(twk_graph *g, twk_id gate, twk_id up) {
    twk_id s[2] = {gate, up};
    return same_shape_op(g, TWK_OP_SWIGLU, 2, s, 0);
}

twk_id twk_map_back(twk_graph *g, twk_op map, twk_id x, twk_id dy) {
    twk_id s[2] = {x, dy};
    return same_shape_op(g, twk_op_info(map)->back, 2, s, 0);
}

twk_id twk_swiglu_back(twk_graph *g, twk_id gate, twk_id up, twk_id dy, int which) {
    twk_id s[3] = {gate, up, dy};
    return same_shape_op(g, TWK_OP_SWIGLU_BACK, 3, s, which);
}

/* ---- reductions ---- */

static twk_id reduce(twk_graph *g, twk_op op, int nsrc, const twk_id *src) {
    twk_id id;
    if (nsrc == 2) {
        twk_id s[2] = {src[0], src[1]};
        id = same_shape_op(g, op, 2, s, 0);
    } else {
        id = unary(g, op, src[0], 0);
    }
    if (id < 0) return -1;
    twk_node *n = &g->nodes[id];
    n->ndim = 1;
    n->dyn = 0;
    n->ne[0] = 1;
    n->ne[1] = n->ne[2] = n->ne[3] = 0;
    return id;
}

twk_id twk_sum(twk_graph *g, twk_id x) { return reduce(g, TWK_OP_SUM, 1, &x); }
twk_id twk_mean(twk_graph *g, twk_id x) { return reduce(g, TWK_OP_MEAN, 1, &x); }
twk_id twk_weighted_sum(twk_graph *g, twk_id x, twk_id w) {
    twk_id s[2] = {x, w};
    return reduce(g, TWK_OP_WEIGHTED_SUM, 2, s);
}

/* ---- matmul ---- */

twk_id twk_matmul(twk_graph *g, twk_id a_id, twk_id b_id, bool ta, bool tb) {
    const twk_node *a = arg(g, a_id, "matmul", "a");
    const twk_node *b = arg(g, b_id, "matmul", "b");
    if (!a || !b) return -1;
    if (!want_dtype(g, a, a_id, "matmul", "a", 1, 0) || !want_float(g, b, b_id, "matmul", "b"))
        return -1;
    char s1[96], s2[96];
    int r = a->ndim;
    if ((r != 2 && r != 3) || b->ndim != r)
        return twk_graph_fail(g, TWK_ERR_SHAPE, "matmul: ranks of a %s and b %s must both be 2 or 3",
                              SHAPE(g, a_id, s1), SHAPE(g, b_id, s2));
    if (r == 3 && (a->ne[0] != b->ne[0] || (a->dyn & 1) != (b->dyn & 1)))
        return twk_graph_fail(g, TWK_ERR_SHAPE, "matmul: batch dims of a %s and b %s differ",
                              SHAPE(g, a_id, s1), SHAPE(g, b_id, s2));
    int am = r - 2 + (ta ? 1 : 0), ak = r - 2 + (ta ? 0 : 1);
    int bk = r - 2 + (tb ? 1 : 0), bn = r - 2 + (tb ? 0 : 1);
    if (a->ne[ak] != b->ne[bk] || (a->dyn >> ak & 1) != (b->dyn >> bk & 1))
        return twk_graph_fail(g, TWK_ERR_SHAPE,
                              "matmul: inner dims differ: a %s%s and b %s%s", SHAPE(g, a_id, s1),
                              ta ? " (transposed)" : "", SHAPE(g, b_id, s2), tb ? " (transposed)" : "");
    twk_node n;
    init_node(&n, TWK_OP_MATMUL, TWK_F32);
    n.ndim = r;
    if (r == 3) {
        n.ne[0] = a->ne[0];
        n.dyn = a->dyn & 1;
    }
    n.ne[r - 2] = a->ne[am];
    n.ne[r - 1] = b->ne[bn];
    if (a->dyn >> am & 1) n.dyn |= (uint8_t)(1u << (r - 2));
    if (b->dyn >> bn & 1) n.dyn |= (uint8_t)(1u << (r - 1));
    n.ip[0] = ta;
    n.ip[1] = tb;
    n.nsrc = 2;
    n.src[0] = a_id;
    n.src[1] = b_id;
    return twk_graph_push(g, &n);
}

/* ---- transformer ops ---- */

static int is_vector_of(const twk_node *x, const twk_node *rows) {
    return x->ndim == 1 && x->ne[0] == rows->ne[0] && (x->dyn & 1) == (rows->dyn & 1);
}

twk_id twk_get_rows(twk_graph *g, twk_id table, twk_id ids) {
    const twk_node *t = arg(g, table, "get_rows", "table");
    const twk_node *i = arg(g, ids, "get_rows", "ids");
    if (!t || !i) return -1;
    if (!want_float(g, t, table, "get_rows", "table") ||
        !want_dtype(g, i, ids, "get_rows", "ids", 0, 1))
        return -1;
    char s1[96], s2[96];
    if (t->ndim != 2 || (t->dyn & 2) || i->ndim != 1)
        return twk_graph_fail(g, TWK_ERR_SHAPE, "get_rows: want table [V, D] and ids [T]; got %s and %s",
                              SHAPE(g, table, s1), SHAPE(g, ids, s2));
    twk_node n;
    init_node(&n, TWK_OP_GET_ROWS, TWK_F32);
    n.ndim = 2;
    n.ne[0] = i->ne[0];
    n.dyn = i->dyn & 1;
    n.ne[1] = t->ne[1];
    n.nsrc = 2;
    n.src[0] = table;
    n.src[1] = ids;
    return twk_graph_push(g, &n);
}

twk_id twk_get_rows_back(twk_graph *g, twk_id dy, twk_id ids, int64_t vocab) {
    const twk_node *d = arg(g, dy, "get_rows_back", "dy");
    const twk_node *i = arg(g, ids, "get_rows_back", "ids");
    if (!d || !i) return -1;
    twk_node n;
    init_node(&n, TWK_OP_GET_ROWS_BACK, TWK_F32);
    n.ndim = 2;
    n.ne[0] = vocab;
    n.ne[1] = d->ne[1];
    n.nsrc = 2;
    n.src[0] = dy;
    n.src[1] = ids;
    return twk_graph_push(g, &n);
}

twk_id twk_rmsnorm(twk_graph *g, twk_id x, twk_id w, float eps) {
    const twk_node *a = arg(g, x, "rmsnorm", "x");
    const twk_node *b = arg(g, w, "rmsnorm", "w");
    if (!a || !b) return -1;
    if (!want_dtype(g, a, x, "rmsnorm", "x", 1, 0) || !want_dtype(g, b, w, "rmsnorm", "w", 1, 0))
        return -1;
    char s1[96], s2[96];
    if (b->ndim != 1 || b->dyn || (a->dyn >> (a->ndim - 1) & 1) || b->ne[0] != a->ne[a->ndim - 1])
        return twk_graph_fail(g, TWK_ERR_SHAPE, "rmsnorm: weight %s does not match the last dim of x %s",
                              SHAPE(g, w, s2), SHAPE(g, x, s1));
    if (!(eps >= 0))
        return twk_graph_fail(g, TWK_ERR_INVALID_ARG, "rmsnorm: eps %g must be >= 0", (double)eps);
    twk_node n;
    init_node(&n, TWK_OP_RMSNORM, TWK_F32);
    copy_shape(&n, a);
    n.fp[0] = eps;
    n.nsrc = 2;
    n.src[0] = x;
    n.src[1] = w;
    return twk_graph_push(g, &n);
}

twk_id twk_rope(twk_graph *g, twk_id x, twk_id pos, twk_id inv_freq, float theta) {
    const twk_node *a = arg(g, x, "rope", "x");
    const twk_node *p = arg(g, pos, "rope", "pos");
    if (!a || !p) return -1;
    if (!want_dtype(g, a, x, "rope", "x", 1, 0) || !want_dtype(g, p, pos, "rope", "pos", 0, 1))
        return -1;
    char s1[96], s2[96];
    if (a->ndim != 3 || (a->dyn & ~1u) || a->ne[2] % 2 != 0 || !is_vector_of(p, a))
        return twk_graph_fail(g, TWK_ERR_SHAPE,
                              "rope: want x [T, H, D] with even D and pos [T]; got %s and %s",
                              SHAPE(g, x, s1), SHAPE(g, pos, s2));
    twk_node n;
    init_node(&n, TWK_OP_ROPE, TWK_F32);
    copy_shape(&n, a);
    n.nsrc = 2;
    n.src[0] = x;
    n.src[1] = pos;
    if (inv_freq >= 0) {
        const twk_node *f = arg(g, inv_freq, "rope", "inv_freq");
        if (!f || !want_dtype(g, f, inv_freq, "rope", "inv_freq", 1, 0)) return -1;
        if (f->ndim != 1 || f->dyn || f->ne[0] != a->ne[2] / 2)
            return twk_graph_fail(g, TWK_ERR_SHAPE, "rope: inv_freq %s must be [D/2] = [%lld]",
                                  SHAPE(g, inv_freq, s1), (long long)(a->ne[2] / 2));
        n.nsrc = 3;
        n.src[2] = inv_freq;
    } else if (!(theta > 0)) {
        return twk_graph_fail(g, TWK_ERR_INVALID_ARG, "rope: theta %g must be > 0", (double)theta);
    }
    n.fp[0] = theta;
    return twk_graph_push(g, &n);
}

twk_id twk_attention(twk_graph *g, twk_id q, twk_id k, twk_id v, twk_id seg, float scale) {
    const twk_node *Q = arg(g, q, "attn", "q");
    const twk_node *K = arg(g, k, "attn", "k");
    const twk_node *V = arg(g, v, "attn", "v");
    const twk_node *S = arg(g, seg, "attn", "seg_start");
    if (!Q || !K || !V || !S) return -1;
    if (!want_float(g, Q, q, "attn", "q") || !want_float(g, K, k, "attn", "k") || !want_float(g, V, v, "attn", "v") ||
        !want_dtype(g, S, seg, "attn", "seg_start", 0, 1))
        return -1;
    char s1[96], s2[96], s3[96], s4[96];
    int ok = Q->ndim == 3 && twk_same_shape(K, V) && K->ndim == 3 && K->ne[0] == Q->ne[0] &&
             K->dyn == Q->dyn && (Q->dyn & ~1u) == 0 && K->ne[2] == Q->ne[2] && K->ne[1] > 0 &&
             Q->ne[1] % K->ne[1] == 0 && is_vector_of(S, Q);
    if (!ok)
        return twk_graph_fail(g, TWK_ERR_SHAPE,
                              "attn: want q [T, Hq, D], k and v [T, Hkv, D] with Hq %% Hkv == 0, "
                              "seg_start [T]; got q %s, k %s, v %s, seg_start %s",
                              SHAPE(g, q, s1), SHAPE(g, k, s2), SHAPE(g, v, s3), SHAPE(g, seg, s4));
    twk_node n;
    init_node(&n, TWK_OP_ATTN, TWK_F32);
    copy_shape(&n, Q);
    n.fp[0] = scale;
    n.nsrc = 4;
    n.src[0] = q;
    n.src[1] = k;
    n.src[2] = v;
    n.src[3] = seg;
    return twk_graph_push(g, &n);
}

twk_id twk_logprobs(twk_graph *g, twk_id logits, twk_id targets) {
    const twk_node *l = arg(g, logits, "logprobs", "logits");
    const twk_node *t = arg(g, targets, "logprobs", "targets");
    if (!l || !t) return -1;
    if (!want_dtype(g, l, logits, "logprobs", "logits", 1, 0) ||
        !want_dtype(g, t, targets, "logprobs", "targets", 0, 1))
        return -1;
    char s1[96], s2[96];
    if (l->ndim != 2 || (l->dyn & 2) || !is_vector_of(t, l))
        return twk_graph_fail(g, TWK_ERR_SHAPE, "logprobs: want logits [T, V] and targets [T]; got %s and %s",
                              SHAPE(g, logits, s1), SHAPE(g, targets, s2));
    twk_node n;
    init_node(&n, TWK_OP_LOGPROBS, TWK_F32);
    n.ndim = 1;
    n.ne[0] = l->ne[0];
    n.dyn = l->dyn & 1;
    n.nsrc = 2;
    n.src[0] = logits;
    n.src[1] = targets;
    return twk_graph_push(g, &n);
}

/* The checks both fused unembeddings make of (h [T, H], w [V, H] frozen, targets [T]); h's node, or
 * NULL with the graph failed naming op. */
static const twk_node *unembed_args(twk_graph *g, const char *op, twk_id h, twk_id w, twk_id targets) {
    const twk_node *H = arg(g, h, op, "h");
    const twk_node *W = arg(g, w, op, "w");
    const twk_node *t = arg(g, targets, op, "targets");
    if (!H || !W || !t) return NULL;
    if (!want_dtype(g, H, h, op, "h", 1, 0) || !want_float(g, W, w, op, "w") || !want_dtype(g, t, targets, op, "targets", 0, 1))
        return NULL;
    char s1[96], s2[96], s3[96];
    if (H->ndim != 2 || (H->dyn & 2) || W->ndim != 2 || W->dyn || W->ne[1] != H->ne[1] || !is_vector_of(t, H)) {
        twk_graph_fail(g, TWK_ERR_SHAPE, "%s: want h [T, H], w [V, H] and targets [T]; got %s, %s and %s", op,
                       SHAPE(g, h, s1), SHAPE(g, w, s2), SHAPE(g, targets, s3));
        return NULL;
    }
    if (W->flags & TWK_NODE_TRAINABLE) {
        twk_graph_fail(g, TWK_ERR_INVALID_ARG, "%s: w (node %d) is trainable; it must be frozen", op, w);
        return NULL;
    }
    return H;
}

twk_id twk_unembed_logprobs(twk_graph *g, twk_id h, twk_id w, twk_id targets) {
    const twk_node *H = unembed_args(g, "unembed_logprobs", h, w, targets);
    if (!H) return -1;
    twk_node n;
    init_node(&n, TWK_OP_UNEMBED_LOGPROBS, TWK_F32);
    n.ndim = 1;
    n.ne[0] = H->ne[0];
    n.dyn = H->dyn & 1;
    n.nsrc = 3;
    n.src[0] = h;
    n.src[1] = w;
    n.src[2] = targets;
    return twk_graph_push(g, &n);
}

twk_id twk_unembed_logprobs_dir(twk_graph *g, twk_id h, twk_id w, twk_id targets, int chunk, int rows) {
    const twk_node *H = unembed_args(g, "unembed_logprobs_dir", h, w, targets);
    if (!H) return -1;
    if (chunk < 0 || rows < 0)
        return twk_graph_fail(g, TWK_ERR_INVALID_ARG, "unembed_logprobs_dir: chunk %d and rows %d must be >= 0", chunk, rows);
    twk_node n;
    init_node(&n, TWK_OP_UNEMBED_LOGPROBS_DIR, TWK_F32);
    n.ndim = 2;
    n.ne[0] = H->ne[0];
    n.ne[1] = H->ne[1] + 1;
    n.dyn = H->dyn & 1;
    n.nsrc = 3;
    n.src[0] = h;
    n.src[1] = w;
    n.src[2] = targets;
    n.ip[0] = chunk;
    n.ip[1] = rows;
    return twk_graph_push(g, &n);
}

twk_id twk_unembed_dir_logprobs(twk_graph *g, twk_id packed) {
    const twk_node *P = arg(g, packed, "unembed_dir_logprobs", "packed");
    if (!P) return -1;
    if (P->op != TWK_OP_UNEMBED_LOGPROBS_DIR)
        return twk_graph_fail(g, TWK_ERR_INVALID_ARG, "unembed_dir_logprobs: node %d is %s, not unembed_logprobs_dir", packed,
                              twk_op_name(P->op));
    int64_t ne[1] = {(P->dyn & 1) ? -P->ne[0] : P->ne[0]};
    return twk_reshape(g, twk_slice(g, packed, 1, P->ne[1] - 1, 1), 1, ne);
}

/* ---- decoding with a KV cache ---- */

twk_id twk_kv_write(twk_graph *g, twk_id cache, twk_id x, twk_id rows) {
    const twk_node *C = arg(g, cache, "kv_write", "cache");
    const twk_node *X = arg(g, x, "kv_write", "x");
    const twk_node *R = arg(g, rows, "kv_write", "rows");
    if (!C || !X || !R) return -1;
    if (!want_float(g, C, cache, "kv_write", "cache") || !want_dtype(g, X, x, "kv_write", "x", 1, 0) ||
        !want_dtype(g, R, rows, "kv_write", "rows", 0, 1))
        return -1;
    char s1[96], s2[96], s3[96];
    if (C->ndim != 3 || C->dyn || X->ndim != 3 || (X->dyn & ~1u) || X->ne[1] != C->ne[1] || X->ne[2] != C->ne[2] ||
        !is_vector_of(R, X))
        return twk_graph_fail(g, TWK_ERR_SHAPE, "kv_write: want cache [R, H, D], x [T, H, D], rows [T]; got %s, %s, %s",
                              SHAPE(g, cache, s1), SHAPE(g, x, s2), SHAPE(g, rows, s3));
    twk_node n;
    init_node(&n, TWK_OP_KV_WRITE, C->type);
    copy_shape(&n, C);
    n.nsrc = 3;
    n.src[0] = cache;
    n.src[1] = x;
    n.src[2] = rows;
    return twk_graph_push(g, &n);
}

twk_id twk_attention_cached(twk_graph *g, twk_id q, twk_id kc, twk_id vc, twk_id lo, twk_id hi, float scale) {
    const twk_node *Q = arg(g, q, "attn_cache", "q");
    const twk_node *K = arg(g, kc, "attn_cache", "kc");
    const twk_node *V = arg(g, vc, "attn_cache", "vc");
    const twk_node *L = arg(g, lo, "attn_cache", "lo");
    const twk_node *H = arg(g, hi, "attn_cache", "hi");
    if (!Q || !K || !V || !L || !H) return -1;
    if (!want_dtype(g, Q, q, "attn_cache", "q", 1, 0) || !want_float(g, K, kc, "attn_cache", "kc") ||
        !want_float(g, V, vc, "attn_cache", "vc") || !want_dtype(g, L, lo, "attn_cache", "lo", 0, 1) ||
        !want_dtype(g, H, hi, "attn_cache", "hi", 0, 1))
        return -1;
    char s1[96], s2[96], s3[96];
    int ok = Q->ndim == 3 && (Q->dyn & ~1u) == 0 && K->ndim == 3 && !K->dyn && twk_same_shape(K, V) &&
             K->ne[2] == Q->ne[2] && K->ne[1] > 0 && Q->ne[1] % K->ne[1] == 0 && is_vector_of(L, Q) && is_vector_of(H, Q);
    if (!ok)
        return twk_graph_fail(g, TWK_ERR_SHAPE,
                              "attn_cache: want q [T, Hq, D], kc and vc [R, Hkv, D] with Hq %% Hkv == 0, lo and hi [T]; "
                              "got q %s, kc %s, vc %s",
                              SHAPE(g, q, s1), SHAPE(g, kc, s2), SHAPE(g, vc, s3));
    twk_node n;
    init_node(&n, TWK_OP_ATTN_CACHE, TWK_F32);
    copy_shape(&n, Q);
    n.fp[0] = scale;
    n.nsrc = 5;
    n.src[0] = q;
    n.src[1] = kc;
    n.src[2] = vc;
    n.src[3] = lo;
    n.src[4] = hi;
    return twk_graph_push(g, &n);
}

twk_id twk_attention_limit(twk_graph *g, twk_id attn, int window, float softcap) {
    const twk_node *a = arg(g, attn, "attention_limit", "attn");
    if (!a) return -1;
    if (a->op != TWK_OP_ATTN && a->op != TWK_OP_ATTN_CACHE)
        return twk_graph_fail(g, TWK_ERR_INVALID_ARG, "attention_limit: node %d is %s, not attn or attn_cache", attn,
                              twk_op_name(a->op));
    if (window < 0 || !(softcap >= 0) || isinf(softcap))
        return twk_graph_fail(g, TWK_ERR_INVALID_ARG, "attention_limit: window %d and softcap %g must be >= 0 and finite",
                              window, (double)softcap);
    g->nodes[attn].ip[1] = window;
    g->nodes[attn].fp[1] = softcap;
    return attn;
}

static twk_id lora_gather(twk_graph *g, twk_id x, twk_id w, twk_id slot, int trans, int grouped) {
    const twk_node *X = arg(g, x, "lora_gather", "x");
    const twk_node *W = arg(g, w, "lora_gather", "w");
    const twk_node *S = arg(g, slot, "lora_gather", "slot");
    if (!X || !W || !S) return -1;
    if (!want_dtype(g, X, x, "lora_gather", "x", 1, 0) || !want_float(g, W, w, "lora_gather", "w") ||
        !want_dtype(g, S, slot, "lora_gather", "slot", 0, 1))
        return -1;
    char s1[96], s2[96], s3[96];
    if (X->ndim != 2 || (X->dyn & 2) || W->ndim != 3 || W->dyn || W->ne[trans ? 1 : 2] != X->ne[1] || !is_vector_of(S, X))
        return twk_graph_fail(g, TWK_ERR_SHAPE, "lora_gather: want x [T, K], w [S, N, K]%s, slot [T]; got %s, %s, %s", trans ? " (transposed: [S, K, N])" : "",
                              SHAPE(g, x, s1), SHAPE(g, w, s2), SHAPE(g, slot, s3));
    twk_node n;
    init_node(&n, TWK_OP_LORA_GATHER, TWK_F32);
    n.ndim = 2;
    n.ne[0] = X->ne[0];
    n.dyn = X->dyn & 1;
    n.ne[1] = W->ne[trans ? 2 : 1];
    n.ip[0] = trans;
    n.ip[1] = grouped;
    n.nsrc = 3;
    n.src[0] = x;
    n.src[1] = w;
    n.src[2] = slot;
    return twk_graph_push(g, &n);
}

twk_id twk_lora_gather(twk_graph *g, twk_id x, twk_id w, twk_id slot) { return lora_gather(g, x, w, slot, 0, 0); }

twk_id twk_lora_gather_t(twk_graph *g, twk_id x, twk_id w, twk_id slot) { return lora_gather(g, x, w, slot, 1, 0); }

twk_id twk_lora_gather_grouped(twk_graph *g, twk_id x, twk_id w, twk_id slot, bool trans) {
    return lora_gather(g, x, w, slot, trans, 1);
}

/* ---- the optimizer step ---- */

/* A static f32 tensor of n elements (n < 0: any count); 0 with the error set otherwise. */
static int want_static(twk_graph *g, twk_id id, const char *op, const char *which, int64_t n) {
    const twk_node *x = arg(g, id, op, which);
    if (!x || !want_dtype(g, x, id, op, which, 1, 0)) return 0;
    int64_t e = 1;
    for (int i = 0; i < x->ndim; i++) e *= x->ne[i];
    if (x->dyn || (n >= 0 && e != n)) {
        char b[96];
        twk_graph_fail(g, TWK_ERR_SHAPE, "%s: %s %s must be a static tensor%s", op, which, SHAPE(g, id, b),
                       n == 2 ? " of 2 elements" : n == TWK_HYPER_N ? " of 8 elements (hyper)" : "");
        return 0;
    }
    return 1;
}

static twk_id push_optim(twk_graph *g, twk_op op, const twk_node *shape, int nsrc, const twk_id *src) {
    twk_node n;
    init_node(&n, op, TWK_F32);
    copy_shape(&n, shape);
    n.nsrc = nsrc;
    for (int i = 0; i < nsrc; i++) n.src[i] = src[i];
    return twk_graph_push(g, &n);
}

twk_id twk_grad_acc(twk_graph *g, twk_id acc, twk_id grad) {
    if (!want_static(g, acc, "grad_acc", "acc", -1) || !want_static(g, grad, "grad_acc", "grad", -1)) return -1;
    if (!twk_same_shape(&g->nodes[acc], &g->nodes[grad])) {
        char s1[96], s2[96];
        return twk_graph_fail(g, TWK_ERR_SHAPE, "grad_acc: acc %s and grad %s differ", SHAPE(g, acc, s1),
                              SHAPE(g, grad, s2));
    }
    twk_id s[2] = {acc, grad};
    return push_optim(g, TWK_OP_GRAD_ACC, &g->nodes[acc], 2, s);
}

twk_id twk_sqsum_parts(twk_graph *g, twk_id x, int parts) {
    if (!want_static(g, x, "sqsum_parts", "x", -1)) return -1;
    if (parts < 1 || parts > 65536)
        return twk_graph_fail(g, TWK_ERR_SHAPE, "sqsum_parts: %d parts outside 1..65536", parts);
    twk_node shape = {.ndim = 2, .ne = {parts, 2}};
    return push_optim(g, TWK_OP_SQSUM_PARTS, &shape, 1, &x);
}

twk_id twk_grad_norm(twk_graph *g, twk_id parts, twk_id hyper) {
    if (!want_static(g, parts, "grad_norm", "parts", -1) || !want_static(g, hyper, "grad_norm", "hyper", TWK_HYPER_N))
        return -1;
    const twk_node *p = &g->nodes[parts];
    if (p->ndim != 2 || p->ne[1] != 2) {
        char b[96];
        return twk_graph_fail(g, TWK_ERR_SHAPE, "grad_norm: parts %s must be [P, 2]", SHAPE(g, parts, b));
    }
    twk_node shape = {.ndim = 1, .ne = {2}};
    twk_id s[2] = {parts, hyper};
    return push_optim(g, TWK_OP_GRAD_NORM, &shape, 2, s);
}

twk_id twk_adamw(twk_graph *g, twk_id w, twk_id grad, twk_id m, twk_id v, twk_id hyper, twk_id norm) {
    static const char *const which[] = {"w", "grad", "m", "v"};
    twk_id s[6] = {w, grad, m, v, hyper, norm};
    for (int i = 0; i < 4; i++) {
        if (!want_static(g, s[i], "adamw", which[i], -1)) return -1;
        if (!twk_same_shape(&g->nodes[w], &g->nodes[s[i]])) {
            char s1[96], s2[96];
            return twk_graph_fail(g, TWK_ERR_SHAPE, "adamw: w %s and %s %s differ", SHAPE(g, w, s1), which[i],
                                  SHAPE(g, s[i], s2));
        }
    }
    if (!want_static(g, hyper, "adamw", "hyper", TWK_HYPER_N) || !want_static(g, norm, "adamw", "norm", 2)) return -1;
    return push_optim(g, TWK_OP_ADAMW, &g->nodes[w], 6, s);
}
twk_id twk_lora_gather_back(twk_graph *g, twk_id x, twk_id dy, twk_id slot, int64_t n_slots) {
    const twk_node *X = arg(g, x, "lora_gather_back", "x");
    const twk_node *D = arg(g, dy, "lora_gather_back", "dy");
    const twk_node *S = arg(g, slot, "lora_gather_back", "slot");
    if (!X || !D || !S) return -1;
    if (!want_dtype(g, X, x, "lora_gather_back", "x", 1, 0) || !want_dtype(g, D, dy, "lora_gather_back", "dy", 1, 0) ||
        !want_dtype(g, S, slot, "lora_gather_back", "slot", 0, 1))
        return -1;
    char s1[96], s2[96], s3[96];
    if (X->ndim != 2 || (X->dyn & 2) || D->ndim != 2 || (D->dyn & 2) || D->ne[0] != X->ne[0] ||
        (D->dyn & 1) != (X->dyn & 1) || !is_vector_of(S, X) || n_slots < 1)
        return twk_graph_fail(g, TWK_ERR_SHAPE,
                              "lora_gather_back: want x [T, K], dy [T, N], slot [T], n_slots >= 1; got %s, %s, %s, %lld",
                              SHAPE(g, x, s1), SHAPE(g, dy, s2), SHAPE(g, slot, s3), (long long)n_slots);
    twk_node n;
    init_node(&n, TWK_OP_LORA_GATHER_BACK, TWK_F32);
    n.ndim = 3;
    n.ne[0] = n_slots;
    n.ne[1] = D->ne[1];
    n.ne[2] = X->ne[1];
    n.nsrc = 3;
    n.src[0] = x;
    n.src[1] = dy;
    n.src[2] = slot;
    return twk_graph_push(g, &n);
}
