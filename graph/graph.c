/* The tensor IR: node storage, sticky errors, names and inspection. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "graph_internal.h"

twk_graph *twk_graph_new(void) {
    twk_graph *g = twk_host_calloc(sizeof *g, "graph");
    return g;
}

void twk_graph_free(twk_graph *g) {
    if (!g) return;
    twk_host_free(g->nodes);
    twk_host_free(g->grads);
    twk_host_free(g->order);
    twk_host_free(g);
}

twk_status twk_graph_set_fusion(twk_graph *g, bool on) {
    if (!g) return twk_error(TWK_ERR_INVALID_ARG, "graph_set_fusion: graph is NULL");
    g->no_fusion = !on;
    return TWK_OK;
}

twk_status twk_graph_status(const twk_graph *g) { return g ? g->status : TWK_ERR_INVALID_ARG; }
const char *twk_graph_error(const twk_graph *g) { return g ? g->error : "graph is NULL"; }

twk_id twk_graph_fail(twk_graph *g, twk_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (g && g->status == TWK_OK) {
        vsnprintf(g->error, sizeof g->error, fmt, ap);
        g->status = code;
        twk_error(code, "%s", g->error);
    }
    va_end(ap);
    return -1;
}

twk_id twk_graph_push(twk_graph *g, const twk_node *n) {
    if (g->n == g->cap) {
        int cap = g->cap ? g->cap * 2 : 256;
        twk_node *nn = twk_host_alloc((size_t)cap * sizeof *nn, "graph nodes");
        if (!nn) return twk_graph_fail(g, TWK_ERR_OOM, "out of memory growing the graph to %d nodes", cap);
        if (g->n) memcpy(nn, g->nodes, (size_t)g->n * sizeof *nn);
        twk_id *no = g->order ? twk_host_realloc(g->order, (size_t)g->n * sizeof *no, (size_t)cap * sizeof *no, "graph order") : NULL;
        if (g->order && !no) {
            twk_host_free(nn);
            return twk_graph_fail(g, TWK_ERR_OOM, "out of memory growing the graph to %d nodes", cap);
        }
        if (no) g->order = no;
        twk_host_free(g->nodes);
        g->nodes = nn;
        g->cap = cap;
    }
    g->nodes[g->n] = *n;
    if (g->order) g->order[g->n] = g->n; /* a node added after a reordering runs last */
    return g->n++;
}

twk_status twk_graph_hoist(twk_graph *g, twk_id id) {
    if (!g || id < 0 || id >= g->n) return twk_error(TWK_ERR_INVALID_ARG, "graph_hoist: no node %d", id);
    if (!g->order) { /* id order made explicit */
        g->order = twk_host_alloc((size_t)g->cap * sizeof *g->order, "graph order");
        if (!g->order) return twk_error(TWK_ERR_OOM, "graph_hoist: out of memory for the order of %d nodes", g->n);
        for (int i = 0; i < g->n; i++) g->order[i] = i;
    }
    int at = -1, after = -1;
    for (int k = 0; k < g->n; k++) {
        twk_id x = g->order[k];
        if (x == id) at = k;
        for (int j = 0; j < g->nodes[id].nsrc; j++)
            if (g->nodes[id].src[j] == x) after = k > after ? k : after;
    }
    if (at < 0 || after >= at) return TWK_OK; /* already right after its sources */
    memmove(g->order + after + 2, g->order + after + 1, (size_t)(at - after - 1) * sizeof *g->order);
    g->order[after + 1] = id;
    return TWK_OK;
}

const char *twk_shape_str(const twk_node *n, char *buf, size_t len) {
    size_t used = 0;
    used += (size_t)snprintf(buf + used, len - used, "[");
    for (int i = 0; i < n->ndim && used < len; i++) {
        const char *sep = i ? ", " : "";
        if (n->dyn >> i & 1) {
            if (n->ne[i] == 1)
                used += (size_t)snprintf(buf + used, len - used, "%sT", sep);
            else
                used += (size_t)snprintf(buf + used, len - used, "%sT*%lld", sep, (long long)n->ne[i]);
        } else {
            used += (size_t)snprintf(buf + used, len - used, "%s%lld", sep, (long long)n->ne[i]);
        }
    }
    if (used < len) snprintf(buf + used, len - used, "] %s", twk_dtype_name(n->type));
    return buf;
}

int twk_same_shape(const twk_node *a, const twk_node *b) {
    if (a->ndim != b->ndim || a->dyn != b->dyn) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->ne[i] != b->ne[i]) return 0;
    return 1;
}

static const twk_node *node_at(const twk_graph *g, twk_id id) {
    return (g && id >= 0 && id < g->n) ? &g->nodes[id] : NULL;
}

int twk_graph_size(const twk_graph *g) { return g ? g->n : 0; }

size_t twk_graph_host_bytes(const twk_graph *g) {
    if (!g) return 0;
    size_t b = sizeof *g + (size_t)g->cap * sizeof *g->nodes;
    if (g->grads) b += (size_t)g->n_grads * sizeof *g->grads;
    if (g->order) b += (size_t)g->cap * sizeof *g->order;
    return b;
}

twk_op twk_node_op(const twk_graph *g, twk_id id) {
    const twk_node *n = node_at(g, id);
    return n ? n->op : TWK_OP_COUNT;
}

twk_dtype twk_node_dtype(const twk_graph *g, twk_id id) {
    const twk_node *n = node_at(g, id);
    return n ? n->type : TWK_DTYPE_COUNT;
}

int twk_node_shape(const twk_graph *g, twk_id id, int64_t n_tok, int64_t *ne) {
    const twk_node *n = node_at(g, id);
    if (!n) return -1;
    for (int i = 0; i < n->ndim; i++) ne[i] = (n->dyn >> i & 1) ? n->ne[i] * n_tok : n->ne[i];
    return n->ndim;
}

const char *twk_node_name(const twk_graph *g, twk_id id) {
    const twk_node *n = node_at(g, id);
    return n ? n->name : "";
}

void twk_node_set_name(twk_graph *g, twk_id id, const char *name) {
    if (id < 0 || id >= g->n || !name) return;
    snprintf(g->nodes[id].name, sizeof g->nodes[id].name, "%s", name);
}

twk_id twk_graph_find(const twk_graph *g, const char *name) {
    for (int i = 0; g && name && i < g->n; i++)
        if (strcmp(g->nodes[i].name, name) == 0) return i;
    return -1;
}

const char *twk_node_shape_str(const twk_graph *g, twk_id id, char *buf, size_t len) {
    const twk_node *n = node_at(g, id);
    if (!n) {
        snprintf(buf, len, "(no tensor %d)", id);
        return buf;
    }
    return twk_shape_str(n, buf, len);
}

twk_status twk_graph_output(twk_graph *g, twk_id id) {
    if (!g) return twk_error(TWK_ERR_INVALID_ARG, "graph_output: graph is NULL");
    if (id < 0 || id >= g->n)
        return twk_error(TWK_ERR_INVALID_ARG, "graph_output: no tensor %d in a graph of %d", id, g->n);
    g->nodes[id].flags |= TWK_NODE_OUTPUT;
    return TWK_OK;
}

twk_status twk_graph_checkpoint(twk_graph *g, twk_id id) {
    if (!g) return twk_error(TWK_ERR_INVALID_ARG, "graph_checkpoint: graph is NULL");
    if (id < 0 || id >= g->n)
        return twk_error(TWK_ERR_INVALID_ARG, "graph_checkpoint: no tensor %d in a graph of %d", id, g->n);
    if (g->grads) return twk_error(TWK_ERR_STATE, "graph_checkpoint: mark checkpoints before twk_graph_backward");
    g->nodes[id].flags |= TWK_NODE_CHECKPOINT;
    return TWK_OK;
}
