/* Plan compilation: dead-node removal, backend support checks, liveness-based
 * memory planning into one arena, and running the result. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"

#define ARENA_ALIGN 64

enum slot_kind { SLOT_DEAD = 0, SLOT_ARENA, SLOT_LEAF, SLOT_BOUND, SLOT_VIEW, SLOT_FUSED /* inside a fused launch: no storage */ };

typedef struct slot {
    int kind;
    twk_id root;    /* storage owner (itself unless a view) */
    twk_buffer *buf;
    size_t offset;
    size_t bytes;   /* at capacity */
    int first, last; /* launch range during which an arena tensor is live */
    twk_dtype type;
    int ndim;
    int64_t ne[TWK_MAX_DIMS];
    uint8_t dyn;
} slot;

struct twk_plan {
    twk_device *dev;
    int64_t capacity;
    int n_nodes;
    slot *slots;
    twk_launch *launches;
    twk_id *launch_node;
    char (*names)[64];
    twk_hal_plan hal;
    int n_groups;               /* fused launches (fuse.c) */
    twk_fuse_group *groups;
    int *fused_into;            /* per node: its group, -1 none (NULL: nothing fused) */
    twk_buffer *arena;
    int arena_shared; /* the caller's buffer: not freed here */
    twk_buffer *leaves;
    void *prepared;
    twk_plan_stats stats;
    /* twk_plan_run_cut: the launch list cut at `cuts`, each segment prepared as a plan of its own */
    int n_cuts;
    int *cuts;
    twk_hal_plan *seg_hal;
    void **seg_prepared;
};

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static size_t bytes_at(const twk_node *n, int64_t cap) {
    size_t e = 1;
    for (int i = 0; i < n->ndim; i++) e *= (size_t)((n->dyn >> i & 1) ? n->ne[i] * cap : n->ne[i]);
    return e * twk_dtype_size(n->type);
}

static void free_segments(twk_plan *p) {
    for (int i = 0; p->seg_prepared && i <= p->n_cuts; i++)
        if (p->seg_prepared[i]) twk_device_backend(p->dev)->release(twk_device_ctx(p->dev), p->seg_prepared[i]);
    twk_host_free(p->cuts);
    twk_host_free(p->seg_hal);
    twk_host_free(p->seg_prepared);
    p->cuts = NULL;
    p->seg_hal = NULL;
    p->seg_prepared = NULL;
    p->n_cuts = 0;
}

void twk_plan_free(twk_plan *p) {
    if (!p) return;
    free_segments(p);
    if (p->prepared) twk_device_backend(p->dev)->release(twk_device_ctx(p->dev), p->prepared);
    if (!p->arena_shared) twk_buffer_free(p->dev, p->arena);
    twk_buffer_free(p->dev, p->leaves);
    twk_host_free(p->slots);
    twk_host_free(p->launches);
    twk_host_free(p->launch_node);
    twk_host_free(p->names);
    twk_host_free(p->groups);
    twk_host_free(p->fused_into);
    twk_host_free(p);
}

static void fill_desc(const twk_plan *p, twk_id id, twk_tensor_desc *d) {
    const slot *s = &p->slots[id];
    const slot *r = &p->slots[s->root];
    d->type = s->type;
    d->ndim = s->ndim;
    memcpy(d->ne, s->ne, sizeof d->ne);
    d->dyn = s->dyn;
    d->buf = r->buf;
    d->offset = r->offset;
}

/* Greedy by size: biggest tensors first, each at the lowest offset that no
 * placed tensor with an overlapping lifetime occupies. */
typedef struct { size_t off, end; } range;

typedef struct { size_t bytes; twk_id id; } sized_id;

static int cmp_sized(const void *a, const void *b) {
    const sized_id *x = a, *y = b;
    if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
    return x->id - y->id;
}
static int cmp_range(const void *a, const void *b) {
    const range *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

static twk_status plan_memory(twk_plan *p, size_t *peak_out) {
    int n = p->n_nodes, count = 0;
    for (int i = 0; i < n; i++) count += p->slots[i].kind == SLOT_ARENA;
    *peak_out = 0;
    if (!count) return TWK_OK;
    sized_id *order = twk_host_alloc((size_t)count * sizeof *order, "memory planner");
    twk_id *placed = twk_host_alloc((size_t)count * sizeof *placed, "memory planner");
    range *busy = twk_host_alloc((size_t)count * sizeof *busy, "memory planner");
    if (!order || !placed || !busy) {
        twk_host_free(order);
        twk_host_free(placed);
        twk_host_free(busy);
        return TWK_ERR_OOM;
    }
    count = 0;
    for (int i = 0; i < n; i++)
        if (p->slots[i].kind == SLOT_ARENA) order[count++] = (sized_id){p->slots[i].bytes, i};
    qsort(order, (size_t)count, sizeof *order, cmp_sized);
    size_t peak = 0;
    int n_placed = 0;
    for (int k = 0; k < count; k++) {
        slot *s = &p->slots[order[k].id];
        int nb = 0;
        for (int j = 0; j < n_placed; j++) {
            const slot *o = &p->slots[placed[j]];
            if (o->first <= s->last && s->first <= o->last)
                busy[nb++] = (range){o->offset, o->offset + align_up(o->bytes, ARENA_ALIGN)};
        }
        qsort(busy, (size_t)nb, sizeof *busy, cmp_range);
        size_t need = align_up(s->bytes, ARENA_ALIGN), off = 0;
        for (int j = 0; j < nb; j++) {
            if (busy[j].off >= off + need) break;
            if (busy[j].end > off) off = busy[j].end;
        }
        s->offset = off;
        if (off + need > peak) peak = off + need;
        placed[n_placed++] = order[k].id;
    }
    twk_host_free(order);
    twk_host_free(placed);
    twk_host_free(busy);
    *peak_out = peak;
    return TWK_OK;
}

static twk_op_kind kind_of(const twk_node *nd) { return twk_op_info(nd->op)->kind; }

static twk_status compile_fail(twk_plan *p, twk_status st) {
    twk_plan_free(p);
    return st;
}

/* Dead-node removal: marks SLOT_ARENA every node an output needs (the rest
 * stay SLOT_DEAD); the number of outputs. */
static int mark_live(const twk_graph *g, twk_plan *p) {
    int n_out = 0;
    for (int pos = g->n - 1; pos >= 0; pos--) {
        twk_id i = twk_graph_at(g, pos);
        const twk_node *nd = &g->nodes[i];
        if (nd->flags & TWK_NODE_OUTPUT) {
            p->slots[i].kind = SLOT_ARENA;
            n_out++;
        }
        if (p->slots[i].kind == SLOT_DEAD) continue;
        for (int k = 0; k < nd->nsrc; k++) p->slots[nd->src[k]].kind = SLOT_ARENA;
    }
    return n_out;
}

/* Storage classes and shapes from the op kinds: leaves, views (reshape, and
 * in-place writers, which share their target's storage), arena tensors. */
static void classify_slots(const twk_graph *g, twk_plan *p) {
    for (int i = 0; i < g->n; i++) {
        slot *s = &p->slots[i];
        const twk_node *nd = &g->nodes[i];
        s->root = i;
        s->type = nd->type;
        s->ndim = nd->ndim;
        s->dyn = nd->dyn;
        memcpy(s->ne, nd->ne, sizeof s->ne);
        s->bytes = bytes_at(nd, p->capacity);
        s->first = s->last = -1;
        if (s->kind == SLOT_DEAD) continue;
        twk_op_kind k = kind_of(nd);
        if (k == TWK_OPK_LEAF) s->kind = SLOT_LEAF;
        else if (k == TWK_OPK_VIEW || k == TWK_OPK_INPLACE) {
            s->kind = SLOT_VIEW;
            s->root = p->slots[nd->src[0]].root;
        }
    }
}

/* Caller-owned storage for bound tensors; an error names a bad binding. */
static twk_status bind_tensors(const twk_graph *g, twk_plan *p, const twk_binding *binds, int n_binds, int dry) {
    for (int b = 0; b < n_binds; b++) {
        twk_id id = binds[b].id;
        if (id < 0 || id >= g->n)
            return twk_error(TWK_ERR_INVALID_ARG, "plan_compile: binding %d names no tensor (%d)", b, id);
        slot *s = &p->slots[id];
        if (s->kind == SLOT_DEAD) continue; /* bound but unused: fine */
        if (s->kind == SLOT_VIEW)
            return twk_error(TWK_ERR_INVALID_ARG, "plan_compile: cannot bind reshape view '%s' (%d); bind its source",
                             g->nodes[id].name, id);
        if (dry) {
            s->kind = SLOT_BOUND;
            continue;
        }
        if (!binds[b].buf || binds[b].offset > twk_buffer_size(binds[b].buf) ||
            s->bytes > twk_buffer_size(binds[b].buf) - binds[b].offset)
            return twk_error(TWK_ERR_INVALID_ARG,
                             "plan_compile: binding for '%s' (%d) needs %zu bytes at offset %zu; buffer has %zu",
                             g->nodes[id].name, id, s->bytes, binds[b].offset, twk_buffer_size(binds[b].buf));
        s->kind = SLOT_BOUND;
        s->buf = binds[b].buf;
        s->offset = binds[b].offset;
    }
    return TWK_OK;
}

/* The launches in graph order (every live node whose op has a kernel), with
 * each arena tensor's live range [first, last]; their count, -1 when out of memory. */
/* The group of node id, NULL when it is in none. */
static const twk_fuse_group *group_of(const twk_plan *p, twk_id id) {
    return p->fused_into && p->fused_into[id] >= 0 ? &p->groups[p->fused_into[id]] : NULL;
}

/* The sources of node id's launch: its own, or its fused group's. */
static const twk_id *launch_srcs(const twk_graph *g, const twk_plan *p, twk_id id, int *nsrc) {
    const twk_fuse_group *grp = group_of(p, id);
    *nsrc = grp ? grp->n_ext : g->nodes[id].nsrc;
    return grp ? grp->ext : g->nodes[id].src;
}

static int order_launches(const twk_graph *g, twk_plan *p) {
    int n_launch = 0;
    for (int i = 0; i < g->n; i++) {
        slot *s = &p->slots[i];
        if (s->kind == SLOT_ARENA) s->first = s->last = -1;
        n_launch += s->kind != SLOT_DEAD && s->kind != SLOT_FUSED && twk_op_has_kernel(g->nodes[i].op);
    }
    twk_host_free(p->launches);
    twk_host_free(p->launch_node);
    twk_host_free(p->names);
    size_t cap = (size_t)(n_launch ? n_launch : 1);
    p->launches = twk_host_calloc(cap * sizeof *p->launches, "plan launches");
    p->launch_node = twk_host_calloc(cap * sizeof *p->launch_node, "plan launches");
    p->names = twk_host_calloc(cap * sizeof *p->names, "plan names");
    if (!p->launches || !p->launch_node || !p->names) return -1;
    int li = 0;
    for (int pos = 0; pos < g->n; pos++) {
        twk_id i = twk_graph_at(g, pos);
        slot *s = &p->slots[i];
        const twk_node *nd = &g->nodes[i];
        if (s->kind == SLOT_DEAD || s->kind == SLOT_FUSED || !twk_op_has_kernel(nd->op)) continue;
        p->launch_node[li] = i;
        if (s->kind == SLOT_ARENA) s->first = li;
        int nsrc;
        const twk_id *src = launch_srcs(g, p, i, &nsrc);
        for (int k = 0; k < nsrc; k++) {
            slot *r = &p->slots[p->slots[src[k]].root];
            if (r->kind == SLOT_ARENA && li > r->last) r->last = li;
        }
        li++;
    }
    for (int i = 0; i < g->n; i++) { /* outputs live to the end */
        slot *s = &p->slots[i];
        if (s->kind == SLOT_DEAD) continue;
        slot *r = &p->slots[s->root];
        if ((g->nodes[i].flags & TWK_NODE_OUTPUT) && r->kind == SLOT_ARENA) r->last = li;
        if (s->kind == SLOT_ARENA && s->last < s->first) s->last = s->first;
    }
    return li;
}

/* An in-place writer must write into storage that outlives the run. */
static twk_status check_in_place(const twk_graph *g, const twk_plan *p) {
    for (int i = 0; i < g->n; i++)
        if (p->slots[i].kind != SLOT_DEAD && kind_of(&g->nodes[i]) == TWK_OPK_INPLACE) {
            const slot *r = &p->slots[p->slots[i].root];
            if (r->kind != SLOT_LEAF && r->kind != SLOT_BOUND)
                return twk_error(TWK_ERR_INVALID_ARG,
                                 "plan_compile: %s node %d must write into a parameter or bound tensor",
                                 twk_op_name(g->nodes[i].op), i);
        }
    return TWK_OK;
}

/* Offsets of the unbound leaves in one buffer; the naive (unshared) arena size. */
static void place_leaves(twk_plan *p, size_t *leaf_bytes, size_t *naive) {
    *leaf_bytes = *naive = 0;
    for (int i = 0; i < p->n_nodes; i++) {
        slot *s = &p->slots[i];
        if (s->kind == SLOT_ARENA) *naive += align_up(s->bytes, ARENA_ALIGN);
        if (s->kind == SLOT_LEAF) {
            s->offset = *leaf_bytes;
            *leaf_bytes += align_up(s->bytes, ARENA_ALIGN);
        }
    }
}

/* The backend's refusal of launch l, naming op, node and shapes. */
static twk_status unsupported(const twk_graph *g, const twk_plan *p, const twk_backend_iface *be, int l,
                              const char *why) {
    const twk_node *nd = &g->nodes[p->launch_node[l]];
    char shapes[512], b[96];
    size_t used = (size_t)snprintf(shapes, sizeof shapes, "dst %s", twk_shape_str(nd, b, sizeof b));
    for (int k = 0; k < nd->nsrc && used < sizeof shapes; k++)
        used += (size_t)snprintf(shapes + used, sizeof shapes - used, ", src%d %s", k,
                                 twk_shape_str(&g->nodes[nd->src[k]], b, sizeof b));
    return twk_error(TWK_ERR_UNSUPPORTED, "plan_compile: backend '%s' does not support op %s ('%s'; %s)%s%s",
                     be->name, twk_op_name(nd->op), p->names[l], shapes, why[0] ? ": " : "", why);
}

/* The tensor descriptions of every launch (buffers as far as known). */
static void describe_buffers(const twk_graph *g, twk_plan *p, int n_launch) {
    for (int l = 0; l < n_launch; l++) {
        twk_id id = p->launch_node[l];
        int nsrc;
        const twk_id *src = launch_srcs(g, p, id, &nsrc);
        fill_desc(p, id, &p->launches[l].dst);
        for (int k = 0; k < nsrc; k++) fill_desc(p, src[k], &p->launches[l].src[k]);
    }
}

/* Launches as the backend sees them; each checked with supports_op before anything is allocated. */
static twk_status describe_launches(const twk_graph *g, twk_plan *p, int n_launch) {
    const twk_backend_iface *be = twk_device_backend(p->dev);
    describe_buffers(g, p, n_launch);
    for (int l = 0; l < n_launch; l++) {
        twk_id id = p->launch_node[l];
        const twk_node *nd = &g->nodes[id];
        twk_launch *L = &p->launches[l];
        L->op = nd->op;
        if (nd->name[0]) snprintf(p->names[l], sizeof p->names[l], "%s", nd->name);
        else snprintf(p->names[l], sizeof p->names[l], "node %d", id);
        L->name = p->names[l];
        const twk_fuse_group *grp = group_of(p, id);
        L->nsrc = grp ? grp->n_ext : nd->nsrc;
        memcpy(L->ip, grp ? grp->ip : nd->ip, sizeof L->ip);
        memcpy(L->fp, grp ? grp->fp : nd->fp, sizeof L->fp);
        if (grp) L->op = grp->op;
        char why[256] = "";
        if (!be->supports_op(twk_device_ctx(p->dev), L, why, sizeof why)) return unsupported(g, p, be, l, why);
    }
    return TWK_OK;
}

/* The arena and the leaves' buffer (zeroed), then every slot's buffer. */
static twk_status allocate(twk_plan *p, size_t peak, size_t leaf_bytes, twk_buffer *shared) {
    twk_status st = TWK_OK;
    twk_device_pool pool = twk_device_pool_enter(TWK_DPOOL_ACTIVATIONS);
    if (peak && shared && twk_buffer_size(shared) >= peak) {
        p->arena = shared;
        p->arena_shared = 1;
    } else if (peak) {
        st = twk_buffer_alloc(p->dev, peak, &p->arena);
    }
    if (st == TWK_OK && leaf_bytes) st = twk_buffer_alloc(p->dev, leaf_bytes, &p->leaves);
    twk_device_pool_enter(pool);
    if (st == TWK_OK && leaf_bytes) st = twk_buffer_zero(p->dev, p->leaves, 0, leaf_bytes);
    if (st != TWK_OK) return st;
    for (int i = 0; i < p->n_nodes; i++) {
        slot *s = &p->slots[i];
        if (s->kind == SLOT_ARENA) s->buf = p->arena;
        if (s->kind == SLOT_LEAF) s->buf = p->leaves;
    }
    return TWK_OK;
}

static twk_status check_compile_args(const twk_graph *g, twk_device *dev, int64_t capacity, const twk_binding *binds,
                                     int n_binds, twk_plan **out) {
    if (!out) return twk_error(TWK_ERR_INVALID_ARG, "plan_compile: out is NULL");
    *out = NULL;
    if (!g || !dev) return twk_error(TWK_ERR_INVALID_ARG, "plan_compile: graph or device is NULL");
    if (g->status != TWK_OK) return twk_error(g->status, "plan_compile: graph has an error: %s", g->error);
    if (capacity < 1) return twk_error(TWK_ERR_INVALID_ARG, "plan_compile: capacity %lld < 1", (long long)capacity);
    if (n_binds < 0 || (n_binds && !binds))
        return twk_error(TWK_ERR_INVALID_ARG, "plan_compile: bad bindings (%d)", n_binds);
    return TWK_OK;
}

/* Whether the device runs group grp as one launch (asked with the launch it would be). */
static bool device_fuses(const twk_graph *g, const twk_plan *p, const twk_fuse_group *grp) {
    const twk_backend_iface *be = twk_device_backend(p->dev);
    twk_launch L;
    memset(&L, 0, sizeof L);
    L.op = grp->op;
    L.name = g->nodes[grp->tail].name;
    L.nsrc = grp->n_ext;
    fill_desc(p, grp->tail, &L.dst);
    for (int k = 0; k < grp->n_ext; k++) fill_desc(p, grp->ext[k], &L.src[k]);
    memcpy(L.ip, grp->ip, sizeof L.ip);
    memcpy(L.fp, grp->fp, sizeof L.fp);
    return be->supports_op(twk_device_ctx(p->dev), &L, NULL, 0);
}

/* Drops the fusion pass's groups. */
static void unfuse(twk_plan *p) {
    twk_host_free(p->groups);
    twk_host_free(p->fused_into);
    p->groups = NULL;
    p->fused_into = NULL;
    p->n_groups = 0;
}

/* Marks the groups on[k] flags fused and the rest unfused (their steps arena tensors again). */
static void mark_groups(twk_plan *p, const unsigned char *on) {
    for (int k = 0; k < p->n_groups; k++) {
        const twk_fuse_group *grp = &p->groups[k];
        for (int s = 0; s < grp->n_steps; s++) {
            p->fused_into[grp->steps[s]] = on[k] ? k : -1;
            if (s < grp->n_steps - 1) p->slots[grp->steps[s]].kind = on[k] ? SLOT_FUSED : SLOT_ARENA;
        }
    }
}

/* Keeps the groups in [lo, hi) that fit, besides those on[] already keeps: the whole range when
 * the arena's peak stays within limit with it fused, else each half in turn (the greedy placement
 * is not monotone, so a few groups may cost arena where the rest do not). 0; -1 when out of memory. */
static int keep_fitting(const twk_graph *g, twk_plan *p, unsigned char *on, int lo, int hi, size_t limit) {
    size_t peak = 0;
    memset(on + lo, 1, (size_t)(hi - lo));
    mark_groups(p, on);
    if (order_launches(g, p) < 0 || plan_memory(p, &peak) != TWK_OK) return -1;
    if (peak <= limit) return 0;
    memset(on + lo, 0, (size_t)(hi - lo));
    if (hi - lo < 2) return 0;
    int mid = lo + (hi - lo) / 2;
    if (keep_fitting(g, p, on, lo, mid, limit) < 0) return -1;
    return keep_fitting(g, p, on, mid, hi, limit);
}

/* Elementwise fusion (fuse.c) of the n_launch unfused launches, where the device runs fused
 * launches: the steps inside a group lose their storage (SLOT_FUSED) and the launch order and
 * live ranges are redone with each group as one launch reading its sources. A fused plan never
 * needs more arena than the unfused one (twk_plan_estimate's figure, which callers size shared
 * arenas by): when all groups together would, the groups that fit are kept (keep_fitting). The
 * launch count, -1 when out of memory. */
static int fuse(const twk_graph *g, twk_plan *p, int n_launch) {
    const twk_backend_iface *be = twk_device_backend(p->dev);
    const char *why = NULL;
    int ew = be->op_kernel(TWK_OP_FUSED_EW, &why), norm_rope = be->op_kernel(TWK_OP_RMSNORM_ROPE, &why);
    if (!twk_fusion_enabled(g) || n_launch < 2 || (!ew && !norm_rope)) return n_launch;
    unsigned char *live = twk_host_calloc((size_t)g->n * 2 + 1, "fusion pass"), *keep = live + g->n;
    p->groups = twk_host_calloc((size_t)(n_launch / 2 + 1) * sizeof *p->groups, "fusion pass");
    p->fused_into = twk_host_alloc((size_t)g->n * sizeof *p->fused_into + 1, "fusion pass");
    if (!live || !p->groups || !p->fused_into) {
        twk_host_free(live);
        return -1;
    }
    for (int i = 0; i < g->n; i++) {
        const slot *s = &p->slots[i];
        live[i] = s->kind != SLOT_DEAD;
        keep[i] = s->kind != SLOT_ARENA || s->root != i || (g->nodes[i].flags & TWK_NODE_OUTPUT);
    }
    int ng = twk_fuse_pass(g, p->launch_node, n_launch, live, keep, norm_rope, p->groups, p->fused_into);
    size_t peak_unfused = 0;
    if (ng && plan_memory(p, &peak_unfused) != TWK_OK) ng = -1;
    int kept = 0; /* the groups the device runs fused, renumbered */
    for (int k = 0; k < ng; k++) {
        const twk_fuse_group *grp = &p->groups[k];
        if (!device_fuses(g, p, grp)) continue;
        if (kept != k) p->groups[kept] = *grp;
        kept++;
    }
    p->n_groups = kept;
    for (int i = 0; i < g->n; i++) p->fused_into[i] = -1;
    unsigned char *on = live; /* reused: a flag per group (kept <= n_launch / 2 < g->n) */
    if (ng < 0 || (kept && keep_fitting(g, p, on, 0, kept, peak_unfused) < 0)) {
        twk_host_free(live);
        return -1;
    }
    mark_groups(p, on); /* the groups dropped last unfused */
    int n = 0;          /* the groups kept, renumbered */
    for (int k = 0; k < kept; k++) {
        if (!on[k]) continue;
        if (n != k) p->groups[n] = p->groups[k];
        n++;
    }
    p->n_groups = n;
    memset(on, 1, (size_t)n);
    mark_groups(p, on);
    twk_host_free(live);
    if (!n) unfuse(p);
    return order_launches(g, p);
}

/* The device-free steps of a compile: dead nodes, storage classes, bindings (dry: ids
 * only), launch order and live ranges, leaves and the arena's placement. The launch count
 * (-1 with *st set on failure). */
static int lay_out(const twk_graph *g, twk_plan *p, const twk_binding *binds, int n_binds, int dry, size_t *peak,
                   twk_status *st) {
    p->n_nodes = g->n;
    p->slots = twk_host_calloc((size_t)g->n * sizeof *p->slots + 1, "plan slots");
    if (!p->slots) return *st = TWK_ERR_OOM, -1;
    if (!mark_live(g, p))
        return *st = twk_error(TWK_ERR_INVALID_ARG, "plan_compile: the graph has no outputs (twk_graph_output)"), -1;
    classify_slots(g, p);
    if ((*st = bind_tensors(g, p, binds, n_binds, dry)) != TWK_OK) return -1;
    int n_launch = order_launches(g, p);
    if (n_launch < 0) return *st = TWK_ERR_OOM, -1;
    p->stats.n_launches_unfused = n_launch;
    if (!dry && (n_launch = fuse(g, p, n_launch)) < 0) return *st = TWK_ERR_OOM, -1;
    if ((*st = check_in_place(g, p)) != TWK_OK) return -1;
    size_t naive, leaf_bytes;
    place_leaves(p, &leaf_bytes, &naive);
    if ((*st = plan_memory(p, peak)) != TWK_OK) return -1;
    p->stats.n_nodes_graph = g->n;
    p->stats.n_launches = n_launch;
    p->stats.arena_bytes = *peak;
    p->stats.naive_bytes = naive;
    p->stats.leaf_bytes = leaf_bytes;
    size_t per_launch = sizeof *p->launches + sizeof *p->launch_node + sizeof *p->names;
    p->stats.host_bytes = sizeof *p + (size_t)g->n * sizeof *p->slots + (size_t)(n_launch ? n_launch : 1) * per_launch;
    if (p->fused_into)
        p->stats.host_bytes += (size_t)g->n * sizeof *p->fused_into + (size_t)p->n_groups * sizeof *p->groups;
    p->stats.n_fused_groups = p->n_groups;
    return n_launch;
}

twk_status twk_plan_estimate(const twk_graph *g, int64_t capacity, const twk_id *bound, int n_bound,
                             twk_plan_stats *out) {
    if (!out) return twk_error(TWK_ERR_INVALID_ARG, "plan_estimate: out is NULL");
    memset(out, 0, sizeof *out);
    if (!g) return twk_error(TWK_ERR_INVALID_ARG, "plan_estimate: graph is NULL");
    if (g->status != TWK_OK) return twk_error(g->status, "plan_estimate: graph has an error: %s", g->error);
    if (capacity < 1) return twk_error(TWK_ERR_INVALID_ARG, "plan_estimate: capacity %lld < 1", (long long)capacity);
    if (n_bound < 0 || (n_bound && !bound)) return twk_error(TWK_ERR_INVALID_ARG, "plan_estimate: bad bindings (%d)", n_bound);
    twk_plan *p = twk_host_calloc(sizeof *p, "plan");
    twk_binding *b = twk_host_calloc((size_t)n_bound * sizeof *b + 1, "plan bindings");
    twk_status st = p && b ? TWK_OK : TWK_ERR_OOM;
    for (int i = 0; st == TWK_OK && i < n_bound; i++) b[i].id = bound[i];
    size_t peak = 0;
    if (st == TWK_OK) {
        p->capacity = capacity;
        if (lay_out(g, p, b, n_bound, 1, &peak, &st) >= 0) *out = p->stats;
    }
    twk_host_free(b);
    twk_plan_free(p);
    return st;
}

twk_status twk_plan_compile(const twk_graph *g, twk_device *dev, int64_t capacity,
                            const twk_binding *binds, int n_binds, twk_plan **out) {
    return twk_plan_compile_in(g, dev, capacity, binds, n_binds, NULL, out);
}

twk_status twk_plan_compile_in(const twk_graph *g, twk_device *dev, int64_t capacity, const twk_binding *binds,
                               int n_binds, twk_buffer *arena, twk_plan **out) {
    twk_status st = check_compile_args(g, dev, capacity, binds, n_binds, out);
    if (st != TWK_OK) return st;
    twk_plan *p = twk_host_calloc(sizeof *p, "plan");
    if (!p) return TWK_ERR_OOM;
    p->dev = dev;
    p->capacity = capacity;
    size_t peak = 0;
    int n_launch = lay_out(g, p, binds, n_binds, 0, &peak, &st);
    if (n_launch < 0) return compile_fail(p, st);
    if ((st = describe_launches(g, p, n_launch)) != TWK_OK) return compile_fail(p, st);
    if ((st = allocate(p, peak, p->stats.leaf_bytes, arena)) != TWK_OK) return compile_fail(p, st);
    p->stats.arena_shared = p->arena_shared;
    describe_buffers(g, p, n_launch); /* buffers are known now */

    const twk_backend_iface *be = twk_device_backend(dev);
    p->hal.n_launches = n_launch;
    p->hal.launches = p->launches;
    p->hal.capacity = capacity;
    if ((st = be->prepare(twk_device_ctx(dev), &p->hal, &p->prepared)) != TWK_OK) return compile_fail(p, st);

    *out = p;
    return TWK_OK;
}

/* head: bytes may be any size from 1 up to the tensor's (twk_plan_read_head), else exactly it */
static twk_status io_check(twk_plan *p, twk_id id, int64_t n, size_t bytes, int head, const char *what,
                           const slot **out) {
    if (!p) return twk_error(TWK_ERR_INVALID_ARG, "%s: plan is NULL", what);
    if (id < 0 || id >= p->n_nodes)
        return twk_error(TWK_ERR_INVALID_ARG, "%s: no tensor %d in this plan", what, id);
    const slot *s = &p->slots[id];
    if (s->kind == SLOT_DEAD)
        return twk_error(TWK_ERR_INVALID_ARG, "%s: tensor %d is not used by this plan's outputs", what, id);
    if (s->kind == SLOT_FUSED)
        return twk_error(TWK_ERR_INVALID_ARG,
                         "%s: tensor %d is an intermediate of a fused elementwise launch and is not kept "
                         "(make it an output, or compile with twk_graph_set_fusion(g, false) or TWK_FUSION=0)",
                         what, id);
    if (n < 1 || n > p->capacity)
        return twk_error(TWK_ERR_INVALID_ARG, "%s: token count %lld outside 1..%lld", what,
                         (long long)n, (long long)p->capacity);
    twk_tensor_desc d;
    fill_desc(p, id, &d);
    size_t want = (size_t)twk_desc_nelem(&d, n) * twk_dtype_size(d.type);
    if (head ? bytes < 1 || bytes > want : bytes != want)
        return twk_error(TWK_ERR_INVALID_ARG, "%s: tensor %d holds %zu bytes for %lld tokens; got %zu",
                         what, id, want, (long long)n, bytes);
    *out = &p->slots[s->root];
    return TWK_OK;
}

twk_status twk_plan_write(twk_plan *p, twk_id id, int64_t n, const void *src, size_t bytes) {
    const slot *r = NULL;
    twk_status st = io_check(p, id, n, bytes, 0, "plan_write", &r);
    if (st != TWK_OK) return st;
    return twk_buffer_upload(p->dev, r->buf, r->offset, src, bytes);
}

twk_status twk_plan_read(twk_plan *p, twk_id id, int64_t n, void *dst, size_t bytes) {
    const slot *r = NULL;
    twk_status st = io_check(p, id, n, bytes, 0, "plan_read", &r);
    if (st != TWK_OK) return st;
    return twk_buffer_download(p->dev, r->buf, r->offset, dst, bytes);
}

twk_status twk_plan_read_head(twk_plan *p, twk_id id, int64_t n, void *dst, size_t bytes) {
    const slot *r = NULL;
    twk_status st = io_check(p, id, n, bytes, 1, "plan_read_head", &r);
    if (st != TWK_OK) return st;
    return twk_buffer_download(p->dev, r->buf, r->offset, dst, bytes);
}

static _Atomic uint64_t launches_run; /* twk_plan_launches_run */

twk_status twk_plan_run(twk_plan *p, int64_t n) {
    if (!p) return twk_error(TWK_ERR_INVALID_ARG, "plan_run: plan is NULL");
    if (n < 1 || n > p->capacity)
        return twk_error(TWK_ERR_INVALID_ARG, "plan_run: token count %lld outside 1..%lld",
                         (long long)n, (long long)p->capacity);
    const twk_backend_iface *be = twk_device_backend(p->dev);
    twk_status st = be->run(twk_device_ctx(p->dev), p->prepared, &p->hal, n);
    if (st != TWK_OK) return st;
    atomic_fetch_add(&launches_run, (uint64_t)p->hal.n_launches);
    return be->synchronize(twk_device_ctx(p->dev));
}

uint64_t twk_plan_launches_run(void) { return atomic_load(&launches_run); }

int twk_plan_launch_of(const twk_plan *p, twk_id id) {
    if (p && id >= 0 && id < p->n_nodes && group_of(p, id)) id = group_of(p, id)->tail; /* fused: its group's launch */
    for (int l = 0; p && l < p->hal.n_launches; l++)
        if (p->launch_node[l] == id) return l;
    return -1;
}

/* The segments of the launch list cut at cuts[0..n) (ascending, inside 1..n_launches-1), each
 * prepared by the backend as a plan of its own: the same launches, so running them in order is
 * running the plan. Kept until other cuts are asked for. */
static twk_status prepare_segments(twk_plan *p, const int *cuts, int n) {
    if (p->seg_prepared && p->n_cuts == n && !memcmp(p->cuts, cuts, (size_t)n * sizeof *cuts)) return TWK_OK;
    free_segments(p);
    for (int i = 0; i < n; i++)
        if (cuts[i] < 1 || cuts[i] >= p->hal.n_launches || (i && cuts[i] <= cuts[i - 1]))
            return twk_error(TWK_ERR_INVALID_ARG, "plan_run_cut: cut %d at launch %d (of %d, ascending, inside)", i, cuts[i],
                             p->hal.n_launches);
    p->cuts = twk_host_alloc((size_t)(n ? n : 1) * sizeof *p->cuts, "plan cuts");
    p->seg_hal = twk_host_calloc((size_t)(n + 1) * sizeof *p->seg_hal, "plan segments");
    p->seg_prepared = twk_host_calloc((size_t)(n + 1) * sizeof *p->seg_prepared, "plan segments");
    if (!p->cuts || !p->seg_hal || !p->seg_prepared) {
        free_segments(p);
        return twk_error(TWK_ERR_OOM, "plan_run_cut: out of memory for %d segments", n + 1);
    }
    p->n_cuts = n;
    memcpy(p->cuts, cuts, (size_t)n * sizeof *cuts);
    const twk_backend_iface *be = twk_device_backend(p->dev);
    for (int i = 0; i <= n; i++) {
        int a = i ? cuts[i - 1] : 0, b = i < n ? cuts[i] : p->hal.n_launches;
        p->seg_hal[i] = (twk_hal_plan){b - a, p->hal.launches + a, p->hal.capacity};
        twk_status st = be->prepare(twk_device_ctx(p->dev), &p->seg_hal[i], &p->seg_prepared[i]);
        if (st != TWK_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", twk_last_error());
            free_segments(p);
            return twk_error(st, "plan_run_cut: preparing launches %d..%d: %s", a, b - 1, msg);
        }
    }
    return TWK_OK;
}

twk_status twk_plan_run_cut(twk_plan *p, int64_t n, const int *cuts, int n_cuts, twk_plan_cut_fn at, void *ctx) {
    if (!p || n_cuts < 0 || (n_cuts && !cuts)) return twk_error(TWK_ERR_INVALID_ARG, "plan_run_cut: NULL plan or cuts");
    if (!n_cuts) return twk_plan_run(p, n);
    if (n < 1 || n > p->capacity)
        return twk_error(TWK_ERR_INVALID_ARG, "plan_run_cut: token count %lld outside 1..%lld", (long long)n,
                         (long long)p->capacity);
    twk_status st = prepare_segments(p, cuts, n_cuts);
    const twk_backend_iface *be = twk_device_backend(p->dev);
    for (int i = 0; st == TWK_OK && i <= n_cuts; i++) {
        st = be->run(twk_device_ctx(p->dev), p->seg_prepared[i], &p->seg_hal[i], n);
        if (st == TWK_OK) atomic_fetch_add(&launches_run, (uint64_t)p->seg_hal[i].n_launches);
        if (st == TWK_OK) st = be->synchronize(twk_device_ctx(p->dev));
        if (st == TWK_OK && i < n_cuts && at) st = at(ctx, i);
    }
    return st;
}

void twk_plan_get_stats(const twk_plan *p, twk_plan_stats *out) {
    if (p && out) *out = p->stats;
}

const twk_hal_plan *twk_plan_hal(const twk_plan *p) { return p ? &p->hal : NULL; }

bool twk_plan_placement(const twk_plan *p, twk_id id, size_t *offset, size_t *bytes, int *first,
                        int *last) {
    if (!p || id < 0 || id >= p->n_nodes || p->slots[id].kind != SLOT_ARENA) return false;
    const slot *s = &p->slots[id];
    if (offset) *offset = s->offset;
    if (bytes) *bytes = s->bytes;
    if (first) *first = s->first;
    if (last) *last = s->last;
    return true;
}

twk_status twk_plan_validate_memory(const twk_plan *p) {
    if (!p) return twk_error(TWK_ERR_INVALID_ARG, "plan_validate_memory: plan is NULL");
    for (int i = 0; i < p->n_nodes; i++) {
        const slot *a = &p->slots[i];
        if (a->kind != SLOT_ARENA) continue;
        if (a->offset + a->bytes > p->stats.arena_bytes)
            return twk_error(TWK_ERR_STATE, "memory plan: tensor %d [%zu, %zu) exceeds the arena (%zu)", i,
                             a->offset, a->offset + a->bytes, p->stats.arena_bytes);
        for (int j = i + 1; j < p->n_nodes; j++) {
            const slot *b = &p->slots[j];
            if (b->kind != SLOT_ARENA) continue;
            int live_together = a->first <= b->last && b->first <= a->last;
            int overlap = a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes;
            if (live_together && overlap && a->bytes && b->bytes)
                return twk_error(TWK_ERR_STATE,
                                 "memory plan: tensors %d [%zu, %zu) live %d..%d and %d [%zu, %zu) live %d..%d overlap",
                                 i, a->offset, a->offset + a->bytes, a->first, a->last, j, b->offset,
                                 b->offset + b->bytes, b->first, b->last);
        }
    }
    return TWK_OK;
}
