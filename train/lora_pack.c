/* Packed multi-LoRA passes: the forward (or forward and backward) of several
 * LoRA trainers on one base model as one pass of a packed trainer — one base
 * GEMM over all their tokens, each run's segment through its own adapter slot
 * (lora_gather), each slot's gradients summed over its own tokens only and
 * added into its run's own accumulators.
 *
 * Every reduction a run's results depend on stays inside its own tokens
 * (GEMM rows, attention per sequence, per-slot sums in token order, the loss
 * summed on the host), so on the CPU a run's logprobs, loss and gradients
 * are bit-identical whatever else shares the pass. For the base GEMMs that
 * takes one more step: OpenBLAS computes a row the same way whatever the row
 * count only when the count is a multiple of its kernels' row blocks and the
 * row sits at a multiple of one (else tail kernels and the other half of a
 * Haswell / Zen 12-row block sum it), and the CPU backend splits products
 * between threads only there (TWK_GEMM_ROW_PERIOD, 48: twinkle/ops.h), so each
 * segment starts at a multiple of the device's gemm_row_period (12 with OpenBLAS's
 * Haswell / Zen kernels; TWK_GEMM_ROW_PERIOD where the backend names none) and is
 * padded to one
 * (weight-0 tokens of their own, scale 0: they touch no run's sums). The
 * slots' rank and the set of adapted modules are the largest any run needed
 * so far: padding is zeros at the end of each sum, which changes nothing.
 * LoRA on a mixture of experts' experts or router has no slots here: such a
 * trainer is refused by twk_pack_pass, and twk_loss_steps runs its passes on
 * its own trainer instead (twk_pack_needs_own, counted in own_passes). */
#include <math.h>
#include <string.h>

#include "loss_pack.h"
#include "trainer_internal.h"
#include "twinkle/train.h"

struct twk_pack {
    twk_model *m;
    int64_t capacity;       /* tokens of the segments */
    int64_t align;          /* each segment's start and length: a multiple of this (the device's gemm_row_period) */
    int64_t rows;           /* the packed trainer's capacity: the segments padded to align */
    int max_slots;
    twk_trainer *t;         /* the packed trainer; NULL until the first pass */
    int rank;               /* its slots' rank */
    twk_lora_config mods;   /* the modules it adapts */
    float *host;            /* staging for one stacked tensor */
    size_t host_bytes;
    int32_t *ids;           /* rows x 6: tokens, targets, positions, seg, slot, the aux loss's slot */
    float *fl;              /* rows x 2: weights, scale */
    twk_pack_stats stats;
};

twk_status twk_pack_new(twk_model *m, int64_t capacity, int max_slots, twk_pack **out) {
    if (!out) return twk_error(TWK_ERR_INVALID_ARG, "pack_new: out is NULL");
    *out = NULL;
    if (!m || capacity < 1 || max_slots < 1 || max_slots > 4096)
        return twk_error(TWK_ERR_INVALID_ARG, "pack_new: NULL model, capacity < 1 or max_slots outside 1..4096");
    twk_pack *p = twk_host_calloc(sizeof *p, "lora pack");
    if (!p) return TWK_ERR_OOM;
    p->m = m;
    p->capacity = capacity;
    p->max_slots = max_slots;
    twk_device_props dp;
    p->align = twk_device_get_props(m->dev, &dp) == TWK_OK && dp.gemm_row_period > 0 &&
                       TWK_GEMM_ROW_PERIOD % dp.gemm_row_period == 0
                   ? dp.gemm_row_period
                   : TWK_GEMM_ROW_PERIOD;
    p->rows = (capacity + (int64_t)max_slots * (p->align - 1) + p->align - 1) / p->align * p->align;
    p->ids = twk_host_alloc((size_t)p->rows * 6 * sizeof *p->ids, "pack batch");
    p->fl = twk_host_alloc((size_t)p->rows * 2 * sizeof *p->fl, "pack batch");
    if (!p->ids || !p->fl) {
        twk_pack_free(p);
        return TWK_ERR_OOM;
    }
    *out = p;
    return TWK_OK;
}

void twk_pack_free(twk_pack *p) {
    if (!p) return;
    twk_trainer_free(p->t);
    twk_host_free(p->host);
    twk_host_free(p->ids);
    twk_host_free(p->fl);
    twk_host_free(p);
}

void twk_pack_get_stats(const twk_pack *p, twk_pack_stats *out) {
    if (!out) return;
    if (p) *out = p->stats;
    else memset(out, 0, sizeof *out);
}

int64_t twk_pack_capacity(const twk_pack *p) { return p ? p->capacity : 0; }
int twk_pack_max_slots(const twk_pack *p) { return p ? p->max_slots : 0; }

int twk_pack_needs_own(const twk_trainer *t) {
    return t && t->lora && !t->sampling && !t->n_slots && t->m->cfg.n_experts > 0 && (t->lc.train_experts || t->lc.train_router);
}

void twk_pack_count_own(twk_pack *p) {
    if (p) p->stats.own_passes++;
}

/* (Re)builds the packed trainer when a segment needs a larger rank or a module it lacks. */
static twk_status ensure_trainer(twk_pack *p, const twk_pack_seg *segs, int n) {
    int rank = p->t ? p->rank : 1;
    twk_lora_config mods = p->t ? p->mods : (twk_lora_config){0};
    for (int i = 0; i < n; i++) {
        const twk_trainer *t = segs[i].t;
        if (!t || !t->lora || t->m != p->m || t->sampling || t->n_slots)
            return twk_error(TWK_ERR_INVALID_ARG, "pack: segment %d is not a LoRA trainer of the pack's model", i);
        if (twk_pack_needs_own(t))
            return twk_error(TWK_ERR_UNSUPPORTED, "pack: segment %d adapts a mixture of experts' experts or router "
                                                  "(train_experts / train_router), which the slots do not hold; its "
                                                  "passes run on its own trainer (twk_loss_steps)", i);
        if (segs[i].b.n > t->capacity)
            return twk_error(TWK_ERR_INVALID_ARG, "batch: %lld tokens outside 1..%lld", (long long)segs[i].b.n,
                             (long long)t->capacity);
        if (t->lc.rank > rank) rank = t->lc.rank;
        mods.train_attn |= t->lc.train_attn;
        mods.train_mlp |= t->lc.train_mlp;
        mods.train_unembed |= t->lc.train_unembed;
    }
    if (p->t && rank == p->rank && mods.train_attn == p->mods.train_attn && mods.train_mlp == p->mods.train_mlp &&
        mods.train_unembed == p->mods.train_unembed)
        return TWK_OK;
    twk_trainer_free(p->t);
    p->t = NULL;
    twk_status st = twk_trainer_create_packed(p->m, &mods, p->max_slots, rank, p->rows, &p->t);
    if (st != TWK_OK) return st;
    p->rank = rank;
    p->mods = mods;
    size_t need = 0;
    for (int i = 0; i < p->t->n_adapter; i++)
        if (nb_bytes(&p->t->adapter[i]) > need) need = nb_bytes(&p->t->adapter[i]);
    if (need > p->host_bytes) {
        twk_host_free(p->host);
        p->host_bytes = 0;
        if (!(p->host = twk_host_alloc(need, "pack staging"))) return TWK_ERR_OOM;
        p->host_bytes = need;
    }
    return TWK_OK;
}

/* The adapter tensor of run trainer t named like the packed trainer's j-th, or NULL. */
static named_buf *run_tensor(twk_trainer *t, const named_buf *packed) {
    for (int k = 0; k < t->n_adapter; k++)
        if (!strcmp(t->adapter[k].name, packed->name)) return &t->adapter[k];
    return NULL;
}

static int is_b(const named_buf *nb) { return strstr(nb->name, ".lora_B.") != NULL; }

/* Writes every run's adapter into its slot of the stacked tensors (zeros where a run lacks a
 * module). Only the first n slots are written: no token of this pass names a later slot, so what
 * an earlier pass left there is never read (lora_gather reads its tokens' slots only). */
static twk_status upload_slots(twk_pack *p, twk_pack_seg *segs, int n) {
    twk_trainer *pt = p->t;
    int R = p->rank;
    for (int j = 0; j < pt->n_adapter; j++) {
        named_buf *st_nb = &pt->adapter[j];
        int64_t rows = st_nb->ne[1], cols = st_nb->ne[2]; /* A: [S, R, in]; B: [S, out, R] */
        size_t used = (size_t)n * (size_t)(rows * cols) * sizeof *p->host;
        memset(p->host, 0, used);
        for (int i = 0; i < n; i++) {
            named_buf *rb = run_tensor(segs[i].t, st_nb);
            if (!rb) continue; /* this run does not adapt the module: a zero slot */
            float *slot = p->host + (int64_t)i * rows * cols;
            int r = segs[i].t->lc.rank;
            twk_status st;
            if (!is_b(st_nb)) { /* A [r, in]: the slot's first r rows */
                st = twk_buffer_download(p->m->dev, rb->buf, 0, slot, nb_bytes(rb));
            } else { /* B [out, r]: the first r columns of each row */
                float *tmp = slot + rows * cols - rb->nelem; /* the slot's tail, unused until spread */
                if (r == R) tmp = slot;
                st = twk_buffer_download(p->m->dev, rb->buf, 0, tmp, nb_bytes(rb));
                if (st == TWK_OK && r != R)
                    for (int64_t o = 0; o < rows; o++) { /* forward order: a row never overwrites unread input */
                        memmove(slot + o * R, tmp + o * r, (size_t)r * sizeof *slot);
                        memset(slot + o * R + r, 0, (size_t)(R - r) * sizeof *slot);
                    }
            }
            if (st != TWK_OK) return st;
        }
        twk_status st = twk_buffer_upload(p->m->dev, st_nb->buf, 0, p->host, used);
        if (st != TWK_OK) return st;
    }
    return TWK_OK;
}

/* Adds each backward segment's slot of the stacked gradients into its run's accumulators. */
static twk_status gather_grads(twk_pack *p, twk_pack_seg *segs, int n, int64_t tokens) {
    twk_trainer *pt = p->t;
    int R = p->rank;
    for (int j = 0; j < pt->n_tp; j++) {
        tparam *pp = &pt->tp[j];
        int64_t rows = pp->nb->ne[1], cols = pp->nb->ne[2];
        /* the first n slots only: the others belong to no run of this pass */
        twk_status st = twk_plan_read_head(pt->fwdbwd, pp->grad, tokens, p->host, (size_t)n * (size_t)(rows * cols) * sizeof *p->host);
        if (st != TWK_OK) return st;
        for (int i = 0; i < n; i++) {
            twk_trainer *t = segs[i].t;
            named_buf *rb = run_tensor(t, pp->nb);
            int k = 0;
            while (rb && k < t->n_tp && t->tp[k].nb != rb) k++;
            if (!rb || k == t->n_tp) continue;
            /* the run's accumulator lives on the device (optim_plan.c): its host copy, uploaded
             * again before the run's next backward or optim_step */
            int64_t ne = 0;
            float *acc = twk_trainer_grad_data(t, k, &ne);
            if (!acc) return twk_error(TWK_ERR_OOM, "pack: the gradients of a run: %s", twk_last_error());
            const float *g = p->host + (int64_t)i * rows * cols;
            int r = t->lc.rank;
            if (!is_b(pp->nb))
                for (int64_t e = 0; e < rb->nelem; e++) acc[e] += g[e];
            else
                for (int64_t o = 0; o < rows; o++)
                    for (int c = 0; c < r; c++) acc[o * r + c] += g[o * R + c];
        }
    }
    return TWK_OK;
}

/* The router's load-balancing loss per run: each row's slot (-1 padding / base) and, for a
 * backward pass, each slot's coefficient (0 for a free slot or a run whose pass must not add the
 * gradient again: aux_off, loss_step.c). The plan's write error. */
static twk_status write_aux(twk_pack *p, twk_plan *plan, const twk_pack_seg *segs, int n, const int32_t *aux_slot,
                            int64_t total, int backward) {
    twk_trainer *pt = p->t;
    twk_status st = twk_plan_write(plan, pt->aux_slot, total, aux_slot, (size_t)total * sizeof *aux_slot);
    if (st != TWK_OK || !backward) return st;
    size_t bytes = (size_t)pt->n_slots * sizeof(float);
    float *coef = twk_host_calloc(bytes, "pack aux coefficients");
    if (!coef) return TWK_ERR_OOM;
    for (int i = 0; i < n; i++) coef[i] = segs[i].t->aux_off ? 0.0f : (float)p->m->cfg.router_aux_coef;
    st = twk_plan_write(plan, pt->aux_coef, total, coef, bytes);
    twk_host_free(coef);
    return st;
}

/* Each run's value of the pass into its own trainer's router_aux_loss (not a base segment's). */
static twk_status read_aux(twk_pack *p, twk_plan *plan, twk_pack_seg *segs, int n, int64_t total) {
    twk_trainer *pt = p->t;
    size_t bytes = (size_t)pt->n_slots * sizeof(float);
    float *v = twk_host_alloc(bytes, "pack aux values");
    if (!v) return TWK_ERR_OOM;
    twk_status st = twk_plan_read(plan, pt->aux, total, v, bytes);
    for (int i = 0; st == TWK_OK && i < n; i++)
        if (!segs[i].base && segs[i].t->aux >= 0) segs[i].t->aux_sum += v[i], segs[i].t->aux_n++;
    twk_host_free(v);
    return st;
}

twk_status twk_pack_pass(twk_pack *p, int backward, twk_pack_seg *segs, int n) {
    if (!p || !segs || n < 1 || n > p->max_slots)
        return twk_error(TWK_ERR_INVALID_ARG, "pack_pass: NULL argument or %d segments outside 1..%d", n,
                         p ? p->max_slots : 0);
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        if (backward && segs[i].base) return twk_error(TWK_ERR_INVALID_ARG, "pack_pass: a base-model segment in a backward pass");
        for (int k = 0; k < i; k++)
            if (segs[k].t == segs[i].t) return twk_error(TWK_ERR_INVALID_ARG, "pack_pass: one trainer in two segments");
        total += segs[i].b.n;
    }
    if (total > p->capacity)
        return twk_error(TWK_ERR_INVALID_ARG, "pack_pass: %lld tokens, the pack holds %lld", (long long)total,
                         (long long)p->capacity);
    twk_status st = ensure_trainer(p, segs, n);
    if (st == TWK_OK) st = upload_slots(p, segs, n);
    if (st != TWK_OK) return st;
    twk_trainer *pt = p->t;
    int64_t C = p->rows;
    int32_t *tok = p->ids, *tgt = tok + C, *pos = tgt + C, *seg = pos + C, *slot = seg + C, *aux_slot = slot + C;
    float *w = p->fl, *scale = w + C;
    int64_t a = 0;
    for (int i = 0; i < n; i++) {
        segs[i].row = a;
        const twk_batch *b = &segs[i].b;
        if (!b->tokens || !b->targets || !b->positions || !b->seg_start || !b->weights || b->n < 1)
            return twk_error(TWK_ERR_INVALID_ARG, "batch: tokens, targets, positions, seg_start and weights are required");
        for (int64_t k = 0; k < b->n; k++) {
            if (!isfinite(b->weights[k]))
                return twk_error(TWK_ERR_INVALID_ARG, "batch: weights[%lld] is not finite", (long long)k);
            if (b->positions[k] < 0)
                return twk_error(TWK_ERR_INVALID_ARG, "batch: positions[%lld] = %d is negative", (long long)k, b->positions[k]);
            tok[a + k] = b->tokens[k];
            tgt[a + k] = b->targets[k];
            pos[a + k] = b->positions[k];
            seg[a + k] = b->seg_start[k] + (int32_t)a;
            slot[a + k] = i;
            aux_slot[a + k] = segs[i].base ? -1 : i; /* the base model's reference passes count in no run's aux loss */
            w[a + k] = b->weights[k];
            scale[a + k] = segs[i].base ? 0.0f : segs[i].t->scale;
        }
        a += b->n;
        for (; a % p->align; a++) { /* padding: a one-token sequence of weight 0 that adds nothing anywhere */
            tok[a] = tgt[a] = pos[a] = 0;
            seg[a] = (int32_t)a;
            slot[a] = i;
            aux_slot[a] = -1;
            w[a] = scale[a] = 0.0f;
        }
    }
    total = a;
    twk_plan *plan = backward ? pt->fwdbwd : pt->fwd;
    twk_batch all = {total, tok, tgt, pos, seg, w};
    st = twk_trainer_bind_batch(pt, plan, &all);
    if (st == TWK_OK) st = twk_plan_write(plan, pt->slot_in, total, slot, (size_t)total * sizeof *slot);
    if (st == TWK_OK) st = twk_plan_write(plan, pt->slot_scale, total, scale, (size_t)total * sizeof *scale);
    if (st == TWK_OK && pt->aux_slot >= 0) st = write_aux(p, plan, segs, n, aux_slot, total, backward);
    if (st == TWK_OK) st = twk_plan_run(plan, total);
    if (st == TWK_OK && pt->aux >= 0) st = read_aux(p, plan, segs, n, total);
    if (st == TWK_OK) st = twk_plan_read(plan, pt->logprobs, total, p->fl, (size_t)total * sizeof *p->fl);
    for (int i = 0; st == TWK_OK && i < n; i++) { /* logprobs, and each run's loss summed on the host in token order */
        const twk_batch *b = &segs[i].b;
        float s = 0;
        a = segs[i].row;
        for (int64_t k = 0; k < b->n; k++) s += b->weights[k] * p->fl[a + k];
        if (segs[i].lp) memcpy(segs[i].lp, p->fl + a, (size_t)b->n * sizeof *segs[i].lp);
        segs[i].loss = -s;
    }
    if (st == TWK_OK && backward) st = gather_grads(p, segs, n, total);
    if (st == TWK_OK) {
        p->stats.passes++;
        p->stats.segments += n;
        if (n > 1) p->stats.shared_passes++;
        if (n > p->stats.max_segments) p->stats.max_segments = n;
    }
    return st;
}
