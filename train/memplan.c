/* Memory plans: a dry trainer (shapes only) of the requested configuration, its
 * plans estimated by the same planner a real compile runs, and the bytes of
 * weights, adapter, gradients, moments and KV cache from the same tensor lists. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf_config.h"
#include "twinkle/memplan.h"
#include "trainer_internal.h"

size_t twk_mem_dtype_bytes(const char *dtype) {
    if (!dtype || !strcmp(dtype, "f32")) return 4;
    return !strcmp(dtype, "bf16") || !strcmp(dtype, "f16") ? 2 : 0;
}

static twk_status check_request(const twk_mem_request *rq) {
    if (!rq) return twk_error(TWK_ERR_INVALID_ARG, "memory plan: request is NULL");
    if (rq->tokens < 1) return twk_error(TWK_ERR_INVALID_ARG, "memory plan: tokens %lld must be >= 1", (long long)rq->tokens);
    if (rq->rank < 0 || rq->rank > 4096)
        return twk_error(TWK_ERR_INVALID_ARG, "memory plan: rank %d must be in 0..4096 (0: full training)", rq->rank);
    if (!twk_mem_dtype_bytes(rq->dtype))
        return twk_error(TWK_ERR_INVALID_ARG, "memory plan: dtype '%s' is not f32, bf16 or f16", rq->dtype);
    if (rq->kv_seqs < 0 || rq->kv_len < 0)
        return twk_error(TWK_ERR_INVALID_ARG, "memory plan: kv_seqs %d and kv_len %lld must be >= 0", rq->kv_seqs,
                         (long long)rq->kv_len);
    return TWK_OK;
}

/* The CPU backend's f32 panel of a 16-bit weight in matmul (TWK_HALF_PANEL_ROWS rows of its
 * contiguous dimension), the largest over the model's 16-bit matrices a matmul reads. */
static uint64_t widen_panel(const twk_model *m) {
    uint64_t most = 0;
    for (int i = 0; i < m->n_w; i++) {
        const named_buf *w = &m->w[i];
        if (w->ndim != 2 || !twk_dtype_is_half(w->dtype)) continue;
        if (!m->cfg.tie_embeddings && !strcmp(w->name, "model.embed_tokens.weight")) continue; /* gathered, not multiplied */
        uint64_t b = (uint64_t)TWK_HALF_PANEL_ROWS(w->ne[1], w->ne[0]) * (uint64_t)w->ne[1] * sizeof(float);
        if (b > most) most = b;
    }
    return most;
}

twk_status twk_mem_plan_config(const twk_model_config *cfg, const twk_mem_request *rq, twk_mem_plan *out) {
    if (!cfg || !out) return twk_error(TWK_ERR_INVALID_ARG, "memory plan: NULL argument");
    memset(out, 0, sizeof *out);
    twk_status st = check_request(rq);
    if (st != TWK_OK) return st;
    size_t wb = twk_mem_dtype_bytes(rq->dtype);
    /* the model in the requested dtype: the trainer picks its unembedding path by it */
    twk_model *m = twk_model_shapes(cfg, rq->dtype ? (twk_dtype)twk_dtype_parse_float(rq->dtype) : TWK_F32);
    if (!m) return twk_error(TWK_ERR_OOM, "memory plan: out of memory");
    twk_lora_config lc = twk_lora_default();
    lc.rank = rq->rank;
    lc.alpha = (float)(rq->rank ? rq->rank : 1);
    lc.train_unembed = rq->train_unembed;
    lc.train_experts = rq->train_experts;
    lc.train_router = rq->train_router;
    twk_trainer_opts o = {.recompute = rq->recompute, .logits = rq->logits, .unembed_recompute = rq->unembed_recompute};
    twk_trainer *t = NULL;
    st = twk_trainer_create_dry(m, rq->rank ? &lc : NULL, rq->tokens, &o, &t);
    if (st == TWK_OK) {
        for (int i = 0; i < m->n_w; i++) out->weights += nb_bytes(&m->w[i]); /* matrices in dtype, norms f32 */
        out->weights += nb_bytes(&t->inv_freq) + nb_bytes(&t->inv_freq_local);
        for (int i = 0; i < t->n_adapter; i++) out->adapter += nb_bytes(&t->adapter[i]);
        out->grads = t->n_tp ? (uint64_t)t->flat_n * sizeof(float) : 0; /* the flat accumulator (optim_plan.c) */
        out->moments = 2 * out->grads;
        const twk_plan_stats *f = &t->est_fwd, *b = &t->est_fwdbwd;
        out->act_forward = f->arena_bytes + f->leaf_bytes;
        out->act_train = b->arena_bytes + b->leaf_bytes;
        out->arena = f->arena_bytes > b->arena_bytes ? f->arena_bytes : b->arena_bytes;
        out->activations = out->arena + f->leaf_bytes + b->leaf_bytes;
        out->n_launches = b->n_launches;
        out->kv_cache = 0; /* K and V of every layer; a sliding-window layer's a ring of its window */
        for (int l = 0; rq->kv_seqs && rq->kv_len && l < cfg->layers; l++)
            out->kv_cache += (uint64_t)2 * (uint64_t)twk_kv_layer_rows(cfg, l, rq->kv_seqs, rq->kv_len) *
                             (uint64_t)cfg->kv_heads * (uint64_t)cfg->head_dim * wb;
        /* host structures: the train graph, both plans, the trainer's and model's tables */
        out->bookkeeping = twk_graph_host_bytes(t->g) + f->host_bytes + b->host_bytes + sizeof *t +
                           (size_t)(cfg->layers * 14 + 2) * sizeof *t->adapter +
                           (size_t)(m->n_w + t->n_adapter) * (sizeof *t->tp + sizeof *t->param_ids) + sizeof *m +
                           (size_t)m->n_w * sizeof *m->w;
        out->widen = widen_panel(m);
        if (t->fused) /* the one-product op's token tile of logits (with the two-product op: the forward plan's) */
            out->scratch = (uint64_t)TWK_UNEMBED_TILE_ROWS((int64_t)cfg->vocab, rq->tokens) * (uint64_t)cfg->vocab * 4;
        if (t->dir) { /* the training graph's chunks: a [rows, C] tile, a 16-bit chunk widened, 3 floats a token (one scratch: the larger) */
            int64_t C = TWK_UNEMBED_CHUNK((int64_t)cfg->vocab), rows = TWK_UNEMBED_DIR_ROWS(C, rq->tokens);
            uint64_t d = (uint64_t)TWK_UNEMBED_DIR_SCRATCH(C, rows, (int64_t)cfg->hidden, rq->tokens, wb == 2) * 4;
            if (d > out->scratch) out->scratch = d;
        }
        out->per_run = out->adapter + out->grads + out->moments;
        out->device = out->weights + out->adapter + out->grads + out->moments + out->activations + out->scratch + out->widen +
                      out->kv_cache;
        out->host = out->bookkeeping;
        out->total = out->device + out->host;
    }
    twk_trainer_free(t);
    twk_model_free(m);
    return st;
}

twk_status twk_mem_plan_dir(const char *dir, const twk_mem_request *rq, twk_mem_plan *out) {
    if (!dir || !out) return twk_error(TWK_ERR_INVALID_ARG, "memory plan: NULL argument");
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    twk_model_config cfg;
    twk_status st = twk_hf_config_load(path, &cfg);
    return st == TWK_OK ? twk_mem_plan_config(&cfg, rq, out) : st;
}

const char *twk_mem_bytes_str(uint64_t bytes, char *buf, size_t len) {
    static const char *const unit[] = {"KiB", "MiB", "GiB", "TiB"};
    if (bytes < 1024) {
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
        return buf;
    }
    double v = (double)bytes / 1024;
    int u = 0;
    while (v >= 1024 && u < 3) v /= 1024, u++;
    snprintf(buf, len, "%.1f %s", v, unit[u]);
    return buf;
}

const char *twk_mem_plan_table(const twk_mem_plan *p, const twk_mem_request *rq, char *buf, size_t len) {
    char a[32], w[48], l[64], kv[64];
    size_t n = 0;
    snprintf(w, sizeof w, "weights (%s)", rq->dtype ? rq->dtype : "f32");
    if (rq->rank) snprintf(l, sizeof l, "LoRA adapter (rank %d, f32)", rq->rank);
    else snprintf(l, sizeof l, "trainable: the weights (full)");
    if (rq->kv_seqs && rq->kv_len) snprintf(kv, sizeof kv, "KV cache (%d x %lld tokens)", rq->kv_seqs, (long long)rq->kv_len);
    else snprintf(kv, sizeof kv, "KV cache (none)");
    const struct { const char *what; uint64_t bytes; const char *where; } row[] = {
        {w, p->weights, "device"},
        {l, p->adapter, "device"},
        {"gradients (f32)", p->grads, "device"},
        {"AdamW moments (f32)", p->moments, "device"},
        {rq->recompute ? "activations (arena peak, recompute)" : "activations (arena peak)", p->activations, "device"},
        {p->scratch ? "logits tile (unembedding)" : "logits tile (none: [T, V] in the arena)", p->scratch, "device"},
        {p->widen ? "16-bit weight panel (f32, matmul)" : "16-bit weight panel (none: f32)", p->widen, "device"},
        {kv, p->kv_cache, "device"},
        {"graph and plans (bookkeeping)", p->bookkeeping, "host"},
        {"total", p->total, ""},
    };
    for (size_t i = 0; i < sizeof row / sizeof row[0] && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "  %-38s %12s  %s\n", row[i].what, twk_mem_bytes_str(row[i].bytes, a, sizeof a),
                              row[i].where);
    if (n < len)
        snprintf(buf + n, len - n, "  (forward plan %s, forward+backward plan %s, one arena; device %s, host %s)\n",
                 twk_mem_bytes_str(p->act_forward, a, sizeof a), twk_mem_bytes_str(p->act_train, w, sizeof w),
                 twk_mem_bytes_str(p->device, l, sizeof l), twk_mem_bytes_str(p->host, kv, sizeof kv));
    return buf;
}

static uint64_t memory_of(const twk_backend_iface *b, int index) {
    twk_device_props pr;
    return b && twk_backend_device_props(b, index, &pr) == TWK_OK ? pr.memory_bytes : 0;
}

/* TWK_MEM_BUDGET's bytes into *out (0 when unset); TWK_ERR_INVALID_ARG when it is not a size. */
static twk_status mem_budget(uint64_t *out) {
    *out = 0;
    const char *s = getenv("TWK_MEM_BUDGET");
    if (!s || !*s) return TWK_OK;
    char *end = NULL;
    double v = strtod(s, &end), scale = 1;
    const char *units = "KMGT";
    int c = toupper((unsigned char)*end);
    const char *u = c ? strchr(units, c) : NULL;
    if (u) {
        for (const char *q = units; q <= u; q++) scale *= 1024;
        end++;
        if (*end == 'i' || *end == 'I') end++;
        if (*end == 'b' || *end == 'B') end++;
    }
    if (end == s || *end || !(v * scale >= 1) || v * scale > 1e19)
        return twk_error(TWK_ERR_INVALID_ARG, "TWK_MEM_BUDGET='%s' is not a size (bytes, or with K, M, G, T: '512M', '1.5GiB')", s);
    *out = (uint64_t)(v * scale);
    return TWK_OK;
}

twk_status twk_mem_capacity(twk_device *dev, uint64_t *bytes, bool *budgeted) {
    if (!dev || !bytes) return twk_error(TWK_ERR_INVALID_ARG, "memory capacity: NULL argument");
    twk_device_props pr;
    uint64_t budget = 0;
    twk_status st = twk_device_get_props(dev, &pr);
    if (st == TWK_OK) st = mem_budget(&budget);
    if (st != TWK_OK) return st;
    bool b = budget && (!pr.memory_bytes || budget < pr.memory_bytes);
    *bytes = b ? budget : pr.memory_bytes;
    if (budgeted) *budgeted = b;
    return TWK_OK;
}

twk_status twk_mem_plan_fits(const twk_mem_plan *p, twk_device *dev) {
    if (!p || !dev) return twk_error(TWK_ERR_INVALID_ARG, "memory plan: NULL argument");
    twk_device_props pr;
    uint64_t cap = 0;
    bool budgeted = false;
    twk_status st = twk_device_get_props(dev, &pr);
    if (st == TWK_OK) st = twk_mem_capacity(dev, &cap, &budgeted);
    if (st != TWK_OK) return st;
    uint64_t ram = memory_of(twk_backend_find("cpu"), 0);
    char a[32], b[32];
    int on_host = !strcmp(pr.kind, "cpu");
    uint64_t need = on_host ? p->total : p->device;
    if (cap && need > cap)
        return twk_error(TWK_ERR_OOM, "%s needs %s but has %s%s", twk_device_spec(dev), twk_mem_bytes_str(need, a, sizeof a),
                         twk_mem_bytes_str(cap, b, sizeof b), budgeted ? " (TWK_MEM_BUDGET)" : "");
    if (!on_host && ram && p->host > ram)
        return twk_error(TWK_ERR_OOM, "the host needs %s (graphs, plans, tables) but has %s", twk_mem_bytes_str(p->host, a, sizeof a),
                         twk_mem_bytes_str(ram, b, sizeof b));
    return TWK_OK;
}

bool twk_mem_fused_unembed(const twk_device *dev, const char *dtype) {
    if (!twk_mem_dtype_bytes(dtype) || !twk_device_has_op(dev, TWK_OP_UNEMBED_LOGPROBS)) return false;
    twk_dtype d = dtype ? (twk_dtype)twk_dtype_parse_float(dtype) : TWK_F32;
    unsigned need = twk_dtype_is_half(d) ? TWK_SRC(1) : 0;
    return (twk_device_half_srcs(dev, TWK_OP_UNEMBED_LOGPROBS) & need) == need &&
           (twk_device_half_srcs(dev, TWK_OP_UNEMBED_LOGPROBS_BACK) & need) == need;
}

bool twk_mem_dir_unembed(const twk_device *dev, const char *dtype) {
    if (!twk_mem_dtype_bytes(dtype) || !twk_device_has_op(dev, TWK_OP_UNEMBED_LOGPROBS_DIR)) return false;
    twk_dtype d = dtype ? (twk_dtype)twk_dtype_parse_float(dtype) : TWK_F32;
    unsigned need = twk_dtype_is_half(d) ? TWK_SRC(1) : 0;
    return (twk_device_half_srcs(dev, TWK_OP_UNEMBED_LOGPROBS_DIR) & need) == need;
}

twk_status twk_mem_plan_choose(const char *dir, twk_mem_request *rq, bool auto_recompute, twk_device *dev,
                               twk_mem_plan *out) {
    if (dev && !twk_mem_fused_unembed(dev, rq->dtype)) rq->logits = true;
    if (dev && !twk_mem_dir_unembed(dev, rq->dtype)) rq->unembed_recompute = true;
    twk_status st = twk_mem_plan_dir(dir, rq, out);
    if (st == TWK_OK) st = twk_mem_plan_fits(out, dev);
    if (st != TWK_ERR_OOM || rq->recompute || !auto_recompute) return st;
    char why[512];
    snprintf(why, sizeof why, "%s", twk_last_error());
    twk_mem_request r2 = *rq;
    r2.recompute = true;
    twk_mem_plan p2;
    if (twk_mem_plan_dir(dir, &r2, &p2) != TWK_OK) return twk_error(TWK_ERR_OOM, "%s", why);
    st = twk_mem_plan_fits(&p2, dev);
    *out = p2;
    *rq = r2;
    return st;
}
