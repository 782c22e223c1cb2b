/* The sampler: one prefill pass writes the prompt's keys and values into the
 * KV cache (once, then copied to every sample's slot), then each decode pass
 * feeds one token per live sequence and reads the logits of those rows.
 * Choosing tokens (temperature, top-k, top-p, seeds) happens on the host. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf_config.h"
#include "safetensors.h"
#include "trainer_internal.h"
#include "twinkle/rng.h"

struct twk_sampler {
    twk_trainer *t; /* in sampling mode */
    int score_slot; /* the adapter slot twk_sampler_score_prompt uses */
    int max_seqs;
    int64_t max_len;
    int vocab;
    int32_t *ibuf;  /* tokens, positions, rows, lo, hi, select, slots, zeros, and the rings' rows, lo, hi
                     * (capacity each) */
    float *logits;  /* max_seqs x vocab */
};

static twk_status sampler_make(twk_model *m, const twk_lora_config *lora, int n_slots, int slot_rank, int max_seqs,
                               int64_t max_len, twk_sampler **out) {
    if (!out) return twk_error(TWK_ERR_INVALID_ARG, "sampler_new: out is NULL");
    *out = NULL;
    if (!m) return twk_error(TWK_ERR_INVALID_ARG, "sampler_new: model is NULL");
    twk_sampler *s = twk_host_calloc(sizeof *s, "sampler");
    if (!s) return TWK_ERR_OOM;
    s->max_seqs = max_seqs;
    s->max_len = max_len;
    s->vocab = twk_model_cfg(m)->vocab;
    /* a pass holds a whole prompt (prefill) or one token per sequence (decode) */
    int64_t cap = max_len > max_seqs ? max_len : max_seqs;
    twk_status st = n_slots ? twk_trainer_create_slots(m, n_slots, slot_rank, max_seqs, max_len, &s->t)
                            : twk_trainer_create(m, lora, cap, 1, max_seqs, max_len, &s->t);
    if (st == TWK_OK) {
        s->ibuf = twk_host_calloc((size_t)cap * 11 * sizeof(int32_t), "sampler inputs");
        s->logits = twk_host_alloc((size_t)max_seqs * (size_t)s->vocab * sizeof(float), "sampler logits");
        if (!s->ibuf || !s->logits) st = TWK_ERR_OOM;
    }
    if (st != TWK_OK) {
        twk_sampler_free(s);
        return st;
    }
    *out = s;
    return TWK_OK;
}

twk_status twk_sampler_new(twk_model *m, const twk_lora_config *lora, int max_seqs, int64_t max_len, twk_sampler **out) {
    return sampler_make(m, lora, 0, 0, max_seqs, max_len, out);
}

twk_status twk_sampler_new_slots(twk_model *m, int n_slots, int slot_rank, int max_seqs, int64_t max_len,
                                 twk_sampler **out) {
    return sampler_make(m, NULL, n_slots, slot_rank, max_seqs, max_len, out);
}

int twk_sampler_slots(const twk_sampler *s) { return s ? s->t->n_slots : 0; }
void twk_sampler_set_score_slot(twk_sampler *s, int slot) {
    if (s) s->score_slot = slot >= 0 && slot < (s->t->n_slots ? s->t->n_slots : 1) ? slot : 0;
}
int twk_sampler_slot_rank(const twk_sampler *s) { return s ? s->t->slot_rank : 0; }

twk_status twk_sampler_slot_set(twk_sampler *s, int slot, int rank, float alpha, twk_adapter_get_fn get, void *ctx) {
    twk_trainer *t = s->t;
    if (!t->n_slots) return twk_error(TWK_ERR_STATE, "sampler: made without adapter slots");
    if (slot < 0 || slot >= t->n_slots) return twk_error(TWK_ERR_INVALID_ARG, "sampler: slot %d outside 0..%d", slot, t->n_slots - 1);
    if (rank < 0 || rank > t->slot_rank)
        return twk_error(TWK_ERR_INVALID_ARG, "sampler: an adapter of rank %d does not fit slots of rank %d", rank, t->slot_rank);
    int R = t->slot_rank;
    float scale = rank > 0 ? alpha / (float)rank : 0;
    twk_status st = TWK_OK;
    for (int i = 0; st == TWK_OK && i + 1 < t->n_adapter; i += 2) {
        named_buf *A = &t->adapter[i], *B = &t->adapter[i + 1]; /* A [S, R, in], B [S, out, R] */
        int64_t in = A->ne[2], outd = B->ne[1];
        float *ha = twk_host_calloc((size_t)(R * in) * sizeof *ha, "slot A"), *hb = twk_host_calloc((size_t)(outd * R) * sizeof *hb, "slot B");
        float *src = twk_host_alloc((size_t)((in > outd ? in : outd) * (rank > 0 ? rank : 1)) * sizeof *src, "slot source");
        if (!ha || !hb || !src) st = TWK_ERR_OOM;
        if (st == TWK_OK && rank > 0 && get && get(ctx, A->name, src, (int64_t)rank * in)) {
            memcpy(ha, src, (size_t)(rank * in) * sizeof *ha); /* rows 0..rank-1 */
            if (get(ctx, B->name, src, outd * rank))
                for (int64_t o = 0; o < outd; o++)
                    for (int k = 0; k < rank; k++) hb[o * R + k] = src[o * rank + k] * scale;
            else
                memset(ha, 0, (size_t)(R * in) * sizeof *ha);
        }
        if (st == TWK_OK) st = twk_buffer_upload(t->m->dev, A->buf, (size_t)slot * (size_t)(R * in) * sizeof *ha, ha, (size_t)(R * in) * sizeof *ha);
        if (st == TWK_OK) st = twk_buffer_upload(t->m->dev, B->buf, (size_t)slot * (size_t)(outd * R) * sizeof *hb, hb, (size_t)(outd * R) * sizeof *hb);
        twk_host_free(ha);
        twk_host_free(hb);
        twk_host_free(src);
    }
    return st;
}

twk_status twk_sampler_slot_clear(twk_sampler *s, int slot) { return twk_sampler_slot_set(s, slot, 0, 0, NULL, NULL); }

static int get_from_st(void *ctx, const char *name, float *dst, int64_t nelem) {
    const twk_st_tensor *t = twk_st_find(ctx, name);
    return t && t->nelem == nelem && twk_st_to_f32(t, dst) == TWK_OK;
}

twk_status twk_sampler_slot_load_dir(twk_sampler *s, int slot, const char *dir) {
    twk_lora_config lc = twk_lora_default();
    twk_status st = twk_adapter_read_config(dir, &lc);
    if (st != TWK_OK) return st;
    if ((lc.train_experts || lc.train_router) && s->t->m->cfg.n_experts > 0)
        return twk_error(TWK_ERR_UNSUPPORTED, "sampler: %s adapts the experts or the router (target_parameters); adapter "
                                              "slots hold no such adapters: sample it with a sampler of its own", dir);
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    twk_safetensors *sf = NULL;
    st = twk_st_open(path, &sf);
    if (st == TWK_OK) st = twk_sampler_slot_set(s, slot, lc.rank, lc.alpha, get_from_st, sf);
    twk_st_close(sf);
    return st;
}

static int get_from_trainer(void *ctx, const char *name, float *dst, int64_t nelem) {
    twk_trainer *t = ctx;
    for (int i = 0; i < t->n_adapter; i++)
        if (!strcmp(t->adapter[i].name, name))
            return t->adapter[i].nelem == nelem &&
                   twk_buffer_download(t->m->dev, t->adapter[i].buf, 0, dst, nb_bytes(&t->adapter[i])) == TWK_OK;
    return 0;
}

twk_status twk_sampler_slot_from_trainer(twk_sampler *s, int slot, twk_trainer *from) {
    if (!from || !from->lora) return twk_error(TWK_ERR_STATE, "sampler: the trainer has no adapter");
    if ((from->lc.train_experts || from->lc.train_router) && from->m->cfg.n_experts > 0)
        return twk_error(TWK_ERR_UNSUPPORTED, "sampler: the trainer adapts the experts or the router; adapter slots hold "
                                              "no such adapters: sample it with a sampler of its own");
    return twk_sampler_slot_set(s, slot, from->lc.rank, from->lc.alpha, get_from_trainer, from);
}

void twk_sampler_free(twk_sampler *s) {
    if (!s) return;
    twk_trainer_free(s->t);
    twk_host_free(s->ibuf);
    twk_host_free(s->logits);
    twk_host_free(s);
}

void twk_sampled_seq_free(twk_sampled_seq *q) {
    if (!q) return;
    twk_host_free(q->tokens);
    twk_host_free(q->logprobs);
    memset(q, 0, sizeof *q);
}

twk_status twk_sampler_load_adapter(twk_sampler *s, const char *dir) {
    if (!s->t->lora) return twk_error(TWK_ERR_STATE, "sampler: created without an adapter");
    return twk_adapter_load(s->t, dir);
}

twk_status twk_sampler_copy_adapter(twk_sampler *s, twk_trainer *from) {
    twk_trainer *t = s->t;
    if (!t->lora || !from || !from->lora) return twk_error(TWK_ERR_STATE, "sampler: adapter copy needs LoRA on both sides");
    if (from->n_adapter != t->n_adapter || from->lc.rank != t->lc.rank)
        return twk_error(TWK_ERR_SHAPE, "sampler: the trainer's adapter (rank %d, %d tensors) differs from the sampler's "
                                        "(rank %d, %d tensors)",
                         from->lc.rank, from->n_adapter, t->lc.rank, t->n_adapter);
    for (int i = 0; i < t->n_adapter; i++) {
        twk_status st = twk_buffer_copy(t->m->dev, t->adapter[i].buf, 0, from->adapter[i].buf, 0,
                                        nb_bytes(&t->adapter[i]));
        if (st != TWK_OK) return st;
    }
    return TWK_OK;
}

/* The rows and ranges of the sliding-window layers' ring caches (twk_kv_seq_rows: W rows per
 * sequence, position p at row p mod W), from the full caches' rows (slot * max_len + position) and
 * positions. A decode token attends to the ring's min(p + 1, W) filled rows; a prefill writes only
 * its last W positions there, the earlier ones (already out of every later token's window) to the
 * shared scratch row after the rings. */
static twk_status ring_inputs(twk_sampler *s, int decode, int64_t n, const int32_t *pos, const int32_t *rows) {
    twk_trainer *t = s->t;
    const twk_model_config *c = &t->m->cfg;
    int64_t cap = s->max_len > s->max_seqs ? s->max_len : s->max_seqs, W = 0;
    for (int l = 0; l < c->layers && !W; l++)
        if (twk_kv_seq_rows(c, l, s->max_len) < s->max_len) W = twk_kv_seq_rows(c, l, s->max_len);
    int32_t *rw = s->ibuf + 8 * cap, *lw = rw + cap, *hw = lw + cap;
    for (int64_t i = 0; i < n; i++) {
        int64_t slot = rows[i] / s->max_len, p = pos[i], base = slot * W;
        rw[i] = (int32_t)(decode || p >= n - W ? base + p % W : (int64_t)s->max_seqs * W);
        lw[i] = (int32_t)base;
        hw[i] = (int32_t)(base + (p + 1 < W ? p + 1 : W));
    }
    twk_plan *pl = decode ? t->decode : t->fwd;
    size_t b = (size_t)n * sizeof *rw;
    twk_status st = twk_plan_write(pl, t->rows_w, n, rw, b);
    if (st == TWK_OK && decode) st = twk_plan_write(pl, t->lo_w, n, lw, b);
    if (st == TWK_OK && decode) st = twk_plan_write(pl, t->hi_w, n, hw, b);
    return st;
}

/* One pass: n tokens with their cache rows and attention ranges. A prefill
 * pass (a prompt from position 0 of its sequence: lo and hi are unused, the
 * training attention runs over the n tokens) yields the logits of row sel[0]
 * only, and every row's final hidden state in the plan; a decode pass
 * (decode = 1) the logits of rows sel[0..n) — so the unembedding runs on just
 * the rows that choose a token. The logits land in s->logits. */
static twk_status pass_plan(twk_sampler *s, int decode, int64_t n, const int32_t *tok, const int32_t *pos,
                            const int32_t *rows, const int32_t *lo, const int32_t *hi, const int32_t *sel) {
    twk_trainer *t = s->t;
    if (t->n_slots) { /* the per-token slots sit after sel in ibuf; a selected row has its token's slot */
        int64_t cap = s->max_len > s->max_seqs ? s->max_len : s->max_seqs;
        const int32_t *sl = s->ibuf + 6 * cap;
        twk_plan *pl = decode ? t->decode : t->fwd;
        twk_status st = twk_plan_write(pl, t->slot_in, n, sl, (size_t)n * sizeof *sl);
        int32_t first = sl[sel[0]];
        if (st == TWK_OK)
            st = decode ? twk_plan_write(pl, t->slot_sel, n, sl, (size_t)n * sizeof *sl)
                        : twk_plan_write(pl, t->slot_sel, n, &first, sizeof first);
        if (st != TWK_OK) return st;
    }
    twk_plan *p = decode ? t->decode : t->fwd;
    size_t b = (size_t)n * sizeof *tok; /* every input is int32 */
    int64_t n_out = decode ? n : 1;
    int64_t cap = s->max_len > s->max_seqs ? s->max_len : s->max_seqs;
    const int32_t *zeros = s->ibuf + 7 * cap; /* seg_start: the prompt is one segment */
    twk_status st = twk_plan_write(p, t->tokens, n, tok, b);
    if (st == TWK_OK) st = twk_plan_write(p, t->positions, n, pos, b);
    if (st == TWK_OK && t->full) st = twk_plan_write(p, t->rows, n, rows, b);
    if (st == TWK_OK && t->full && decode) st = twk_plan_write(p, t->lo, n, lo, b);
    if (st == TWK_OK && t->full && decode) st = twk_plan_write(p, t->hi, n, hi, b);
    if (st == TWK_OK && !decode) st = twk_plan_write(p, t->seg, n, zeros, b);
    if (st == TWK_OK && t->ring) st = ring_inputs(s, decode, n, pos, rows);
    if (st == TWK_OK) st = twk_plan_write(p, t->sel, n, sel, (size_t)n_out * sizeof *sel);
    if (st == TWK_OK) st = twk_plan_run(p, n);
    if (st == TWK_OK)
        st = twk_plan_read(p, decode ? t->logits : t->prefill_logits, n, s->logits,
                           (size_t)n_out * (size_t)s->vocab * sizeof *s->logits);
    return st;
}

static twk_status pass(twk_sampler *s, int64_t n, const int32_t *tok, const int32_t *pos, const int32_t *rows,
                       const int32_t *lo, const int32_t *hi, const int32_t *sel) {
    return pass_plan(s, 0, n, tok, pos, rows, lo, hi, sel);
}

static twk_status pass_decode(twk_sampler *s, int64_t n, const int32_t *tok, const int32_t *pos, const int32_t *rows,
                              const int32_t *lo, const int32_t *hi, const int32_t *sel) {
    return pass_plan(s, 1, n, tok, pos, rows, lo, hi, sel);
}

typedef struct cand {
    float logit;
    int32_t id;
} cand;

static int cmp_cand(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id - y->id;
}

/* Partially orders work[0..n) so its first k entries are the k largest
 * (any order among them): quickselect. */
static void select_top(cand *work, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        cand pivot = work[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (cmp_cand(&work[i], &pivot) < 0) i++;
            while (cmp_cand(&work[j], &pivot) > 0) j--;
            if (i <= j) {
                cand t = work[i];
                work[i++] = work[j];
                work[j--] = t;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

/* Chooses a token from one row of logits; *logprob = log_softmax(row)[token].
 * Without top-k / top-p the draw is one pass over the row; top-k selects the
 * k best first; only top-p sorts (the candidates left by top-k, if any). */
static int32_t choose(const float *row, int vocab, const twk_sample_params *p, twk_rng *rng, cand *work, float *logprob) {
    double m = -INFINITY, z = 0;
    int32_t best = 0;
    for (int i = 0; i < vocab; i++)
        if (row[i] > m) {
            m = row[i];
            best = i;
        }
    for (int i = 0; i < vocab; i++) z += exp((double)row[i] - m);
    double lse = m + log(z);
    int32_t tok = best;
    if (p->temperature > 0 && p->top_k <= 0 && p->top_p >= 1) {
        double zt = 0;
        for (int i = 0; i < vocab; i++) zt += exp(((double)row[i] - m) / p->temperature);
        double u = twk_rng_uniform(rng) * zt, acc = 0;
        tok = vocab - 1;
        for (int i = 0; i < vocab; i++) {
            acc += exp(((double)row[i] - m) / p->temperature);
            if (u < acc) {
                tok = i;
                break;
            }
        }
    } else if (p->temperature > 0) {
        int n = 0;
        for (int i = 0; i < vocab; i++) work[n++] = (cand){row[i], i};
        if (p->top_k > 0 && p->top_k < n) {
            select_top(work, n, p->top_k);
            n = p->top_k;
        }
        qsort(work, (size_t)n, sizeof *work, cmp_cand);
        double zt = 0, top = work[0].logit;
        for (int i = 0; i < n; i++) zt += exp(((double)work[i].logit - top) / p->temperature);
        if (p->top_p < 1) { /* the smallest prefix whose mass reaches top_p */
            double acc = 0;
            int keep = n;
            for (int i = 0; i < n; i++) {
                acc += exp(((double)work[i].logit - top) / p->temperature) / zt;
                if (acc >= p->top_p) {
                    keep = i + 1;
                    break;
                }
            }
            n = keep;
            zt = 0;
            for (int i = 0; i < n; i++) zt += exp(((double)work[i].logit - top) / p->temperature);
        }
        double u = twk_rng_uniform(rng) * zt, acc = 0;
        tok = work[n - 1].id;
        for (int i = 0; i < n; i++) {
            acc += exp(((double)work[i].logit - top) / p->temperature);
            if (u < acc) {
                tok = work[i].id;
                break;
            }
        }
    }
    *logprob = (float)((double)row[tok] - lse);
    return tok;
}

static int is_stop(const twk_sample_params *p, int32_t tok) {
    for (int i = 0; i < p->n_stop_tokens; i++)
        if (p->stop_tokens[i] == tok) return 1;
    return 0;
}

#define STOP_TEXT 1024 /* generated text kept per sequence for stop strings */

static twk_status check_request(const twk_sampler *s, const twk_sample_request *r) {
    const twk_sample_params *p = r->params;
    if (!r->prompt || !p || !r->out) return twk_error(TWK_ERR_INVALID_ARG, "sample: NULL argument");
    if (r->num_samples < 1 || r->num_samples > s->max_seqs)
        return twk_error(TWK_ERR_INVALID_ARG, "sample: num_samples %d outside 1..%d", r->num_samples, s->max_seqs);
    if (r->n_prompt < 1 || r->n_prompt >= s->max_len)
        return twk_error(TWK_ERR_INVALID_ARG, "sample: prompt of %lld tokens; it must be 1..%lld", (long long)r->n_prompt,
                         (long long)(s->max_len - 1));
    if (p->max_tokens < 1 || r->n_prompt + p->max_tokens > s->max_len)
        return twk_error(TWK_ERR_INVALID_ARG, "sample: max_tokens %d with a %lld-token prompt exceeds the context of %lld",
                         p->max_tokens, (long long)r->n_prompt, (long long)s->max_len);
    if (!(p->temperature >= 0) || !isfinite(p->temperature))
        return twk_error(TWK_ERR_INVALID_ARG, "sample: temperature %g must be >= 0", (double)p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return twk_error(TWK_ERR_INVALID_ARG, "sample: top_p %g must be in (0, 1]", (double)p->top_p);
    if (p->n_stop_strings && !p->tokenizer)
        return twk_error(TWK_ERR_INVALID_ARG, "sample: stop strings need the model's tokenizer (tokenizer.json)");
    for (int k = 0; k < p->n_stop_strings; k++)
        if (!p->stop_strings[k] || !*p->stop_strings[k] || strlen(p->stop_strings[k]) > STOP_TEXT / 2)
            return twk_error(TWK_ERR_INVALID_ARG, "sample: stop string %d must be 1..%d bytes", k, STOP_TEXT / 2);
    for (int64_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= s->vocab)
            return twk_error(TWK_ERR_INVALID_ARG, "sample: prompt token %lld = %d is outside the vocabulary [0, %d)",
                             (long long)i, r->prompt[i], s->vocab);
    return TWK_OK;
}

/* One live sequence of the shared decode batch. */
typedef struct seq_state {
    int req, sample, slot, live;
    twk_rng rng;
    char text[STOP_TEXT]; /* the tail of the generated text */
    int text_len;
} seq_state;

/* Appends a token's text and reports whether a stop string now ends inside it. */
static int hits_stop_string(seq_state *x, const twk_sample_params *p, int32_t tok) {
    if (!p->n_stop_strings || !p->tokenizer) return 0;
    char piece[512];
    int n = twk_tokenizer_token_bytes(p->tokenizer, tok, piece, (int)sizeof piece);
    if (n <= 0) return 0;
    if (n > (int)sizeof piece) n = (int)sizeof piece;
    if (x->text_len + n > STOP_TEXT) { /* keep the tail: stop strings are short */
        int keep = STOP_TEXT / 2;
        memmove(x->text, x->text + x->text_len - keep, (size_t)keep);
        x->text_len = keep;
    }
    memcpy(x->text + x->text_len, piece, (size_t)n);
    int before = x->text_len;
    x->text_len += n;
    for (int k = 0; k < p->n_stop_strings; k++) {
        size_t L = strlen(p->stop_strings[k]);
        if (!L || (int)L > x->text_len) continue;
        /* a match that ends within the new piece (earlier ones would have stopped already) */
        int from = before - (int)L + 1 > 0 ? before - (int)L + 1 : 0;
        for (int i = from; i + (int)L <= x->text_len; i++)
            if (!memcmp(x->text + i, p->stop_strings[k], L)) return 1;
    }
    return 0;
}

twk_status twk_sampler_generate_many(twk_sampler *s, const twk_sample_request *reqs, int n_reqs) {
    if (!s || !reqs || n_reqs < 1) return twk_error(TWK_ERR_INVALID_ARG, "sample: no requests");
    int total = 0;
    for (int r = 0; r < n_reqs; r++) {
        if (reqs[r].out && reqs[r].num_samples >= 1 && reqs[r].num_samples <= s->max_seqs)
            memset(reqs[r].out, 0, (size_t)reqs[r].num_samples * sizeof *reqs[r].out);
    }
    for (int r = 0; r < n_reqs; r++) {
        twk_status st = check_request(s, &reqs[r]);
        if (st != TWK_OK) return st;
        total += reqs[r].num_samples;
    }
    if (total > s->max_seqs)
        return twk_error(TWK_ERR_INVALID_ARG, "sample: %d sequences in one batch; the sampler holds %d", total, s->max_seqs);
    int64_t cap = s->max_len > s->max_seqs ? s->max_len : s->max_seqs;
    int32_t *tok = s->ibuf, *pos = tok + cap, *rows = pos + cap, *lo = rows + cap, *hi = lo + cap, *sel = hi + cap;
    int32_t *slots = sel + cap;
    for (int r = 0; r < n_reqs; r++)
        if (reqs[r].slot < 0 || reqs[r].slot >= (s->t->n_slots ? s->t->n_slots : 1))
            return twk_error(TWK_ERR_INVALID_ARG, "sample: request %d names slot %d; the sampler has %d", r, reqs[r].slot,
                             s->t->n_slots ? s->t->n_slots : 1);
    cand *work = twk_host_alloc((size_t)s->vocab * sizeof *work, "sampler work");
    seq_state *q = twk_host_calloc((size_t)total * sizeof *q, "sampler state");
    twk_status st = work && q ? TWK_OK : TWK_ERR_OOM;
    twk_trainer *t = s->t;
    size_t row_bytes = (size_t)t->m->cfg.kv_heads * (size_t)t->m->cfg.head_dim * twk_dtype_size(t->kv[0].dtype);
    int next = 0;
    for (int r = 0; st == TWK_OK && r < n_reqs; r++) {
        const twk_sample_request *R = &reqs[r];
        const twk_sample_params *p = R->params;
        int first_slot = next;
        for (int i = 0; st == TWK_OK && i < R->num_samples; i++, next++) {
            twk_sampled_seq *o = &R->out[i];
            o->tokens = twk_host_alloc((size_t)p->max_tokens * sizeof *o->tokens, "sampled tokens");
            o->logprobs = twk_host_alloc((size_t)p->max_tokens * sizeof *o->logprobs, "sampled logprobs");
            if (!o->tokens || !o->logprobs) st = TWK_ERR_OOM;
            uint64_t seed = p->has_seed ? p->seed : (uint64_t)(twk_now() * 1e9) ^ (uint64_t)(uintptr_t)o;
            q[next] = (seq_state){.req = r, .sample = i, .slot = next, .live = 1};
            twk_rng_seed(&q[next].rng, seed + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1));
        }
        if (st != TWK_OK) break;
        /* prefill this prompt into its first slot, then share its rows with the other samples */
        int64_t base = (int64_t)first_slot * s->max_len;
        for (int64_t i = 0; i < R->n_prompt; i++) {
            tok[i] = R->prompt[i];
            pos[i] = (int32_t)i;
            rows[i] = (int32_t)(base + i);
            lo[i] = (int32_t)base;
            hi[i] = (int32_t)(base + i + 1);
        }
        for (int i = 0; i < s->max_seqs; i++) sel[i] = (int32_t)(R->n_prompt - 1);
        for (int64_t i = 0; i < R->n_prompt; i++) slots[i] = R->slot;
        st = pass(s, R->n_prompt, tok, pos, rows, lo, hi, sel);
        for (int i = 1; st == TWK_OK && i < R->num_samples; i++)
            for (int k = 0; st == TWK_OK && k < 2 * t->m->cfg.layers; k++) {
                size_t seq = (size_t)twk_kv_seq_rows(&t->m->cfg, k / 2, s->max_len); /* a ring: its W rows */
                size_t used = (size_t)R->n_prompt < seq ? (size_t)R->n_prompt : seq;
                st = twk_buffer_copy(t->m->dev, t->kv[k].buf, (size_t)(first_slot + i) * seq * row_bytes, t->kv[k].buf,
                                     (size_t)first_slot * seq * row_bytes, used * row_bytes);
            }
        /* first tokens from the prefill's logits */
        for (int i = 0; st == TWK_OK && i < R->num_samples; i++) {
            seq_state *x = &q[first_slot + i];
            twk_sampled_seq *o = &R->out[i];
            float lp;
            int32_t tk = choose(s->logits, s->vocab, p, &x->rng, work, &lp);
            o->tokens[0] = tk;
            o->logprobs[0] = lp;
            o->n = 1;
            if (is_stop(p, tk) || hits_stop_string(x, p, tk)) {
                x->live = 0;
                o->stop_reason = 0;
            } else if (p->max_tokens == 1) {
                x->live = 0;
                o->stop_reason = 1;
            }
        }
        if (st == TWK_OK && R->on_step) R->on_step(R->step_ctx, R->out, R->num_samples);
    }
    /* decode: one token per live sequence of every request per pass */
    while (st == TWK_OK) {
        int n = 0;
        int idx[4096];
        for (int k = 0; k < total && n < 4096; k++) {
            seq_state *x = &q[k];
            if (!x->live) continue;
            const twk_sample_request *R = &reqs[x->req];
            twk_sampled_seq *o = &R->out[x->sample];
            int64_t ps = R->n_prompt + o->n - 1; /* position of the token being fed */
            tok[n] = o->tokens[o->n - 1];
            pos[n] = (int32_t)ps;
            rows[n] = (int32_t)((int64_t)x->slot * s->max_len + ps);
            lo[n] = (int32_t)((int64_t)x->slot * s->max_len);
            hi[n] = rows[n] + 1;
            sel[n] = n;
            slots[n] = R->slot;
            idx[n++] = k;
        }
        if (n == 0) break;
        st = pass_decode(s, n, tok, pos, rows, lo, hi, sel);
        for (int k = 0; st == TWK_OK && k < n; k++) {
            seq_state *x = &q[idx[k]];
            const twk_sample_request *R = &reqs[x->req];
            const twk_sample_params *p = R->params;
            twk_sampled_seq *o = &R->out[x->sample];
            float lp;
            int32_t tk = choose(s->logits + (size_t)k * (size_t)s->vocab, s->vocab, p, &x->rng, work, &lp);
            o->tokens[o->n] = tk;
            o->logprobs[o->n] = lp;
            o->n++;
            if (is_stop(p, tk) || hits_stop_string(x, p, tk)) {
                x->live = 0;
                o->stop_reason = 0;
            } else if (o->n >= p->max_tokens) {
                x->live = 0;
                o->stop_reason = 1;
            }
        }
        for (int r = 0; st == TWK_OK && r < n_reqs; r++)
            if (reqs[r].on_step) reqs[r].on_step(reqs[r].step_ctx, reqs[r].out, reqs[r].num_samples);
    }
    twk_host_free(work);
    twk_host_free(q);
    if (st != TWK_OK)
        for (int r = 0; r < n_reqs; r++)
            for (int i = 0; reqs[r].out && i < reqs[r].num_samples; i++) twk_sampled_seq_free(&reqs[r].out[i]);
    return st;
}

twk_status twk_sampler_generate(twk_sampler *s, const int32_t *prompt, int64_t n_prompt, int num_samples,
                                const twk_sample_params *p, twk_sampled_seq *out) {
    if (!s) return twk_error(TWK_ERR_INVALID_ARG, "sample: NULL sampler");
    twk_sample_request r = {prompt, n_prompt, num_samples, p, out, 0, NULL, NULL};
    return twk_sampler_generate_many(s, &r, 1);
}

int twk_sampler_max_seqs(const twk_sampler *s) { return s->max_seqs; }
int64_t twk_sampler_max_len(const twk_sampler *s) { return s->max_len; }

twk_status twk_sampler_score_prompt(twk_sampler *s, const int32_t *prompt, int64_t n_prompt, float *logprobs, int k,
                                    int32_t *topk_ids, float *topk_lps) {
    if (!s || !prompt) return twk_error(TWK_ERR_INVALID_ARG, "score_prompt: NULL argument");
    if (n_prompt < 1 || n_prompt > s->max_len)
        return twk_error(TWK_ERR_INVALID_ARG, "score_prompt: prompt of %lld tokens; it must be 1..%lld", (long long)n_prompt,
                         (long long)s->max_len);
    if (k < 0 || k > s->vocab) return twk_error(TWK_ERR_INVALID_ARG, "score_prompt: k %d outside 0..%d", k, s->vocab);
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= s->vocab)
            return twk_error(TWK_ERR_INVALID_ARG, "score_prompt: prompt token %lld = %d is outside the vocabulary [0, %d)",
                             (long long)i, prompt[i], s->vocab);
    if (logprobs) logprobs[0] = NAN;
    for (int j = 0; k > 0 && topk_ids && j < k; j++) {
        topk_ids[j] = 0;
        topk_lps[j] = -99999.0f;
    }
    if (!topk_ids || !topk_lps) k = 0; /* no top-k wanted */
    if (n_prompt < 2) return TWK_OK;
    /* one prefill of prompt[0..n) (n = n_prompt - 1: row j predicts prompt[j + 1]) leaves every
     * row's final hidden state; the head turns them into logprobs of their targets, and for
     * top-k into logits, a tile of rows at a time */
    twk_trainer *t = s->t;
    int64_t n = n_prompt - 1, cap = s->max_len > s->max_seqs ? s->max_len : s->max_seqs, D = t->m->cfg.hidden;
    int32_t *tok = s->ibuf, *pos = tok + cap, *rows = pos + cap, *lo = rows + cap, *hi = lo + cap, *sel = hi + cap;
    int32_t *slots = sel + cap;
    for (int64_t i = 0; i < n; i++) {
        tok[i] = prompt[i];
        pos[i] = (int32_t)i;
        rows[i] = (int32_t)i; /* sequence 0's cache rows */
        slots[i] = s->score_slot;
    }
    sel[0] = (int32_t)(n - 1);
    twk_score_head *hd = NULL;
    twk_status st = k == 0 ? twk_trainer_score_head(t, 0, &hd) : TWK_OK;
    if (st == TWK_OK && !hd) st = twk_trainer_score_head(t, 1, &hd);
    if (st != TWK_OK) return st;
    float *hid = twk_host_alloc((size_t)(n * D) * sizeof *hid, "score hidden");
    float *lp = twk_host_alloc((size_t)n * sizeof *lp, "score logprobs");
    float *lg = k > 0 ? twk_host_alloc((size_t)hd->rows * (size_t)s->vocab * sizeof *lg, "score logits") : NULL;
    cand *work = k > 0 ? twk_host_alloc((size_t)s->vocab * sizeof *work, "score work") : NULL;
    st = hid && lp && (k == 0 || (lg && work)) ? TWK_OK : TWK_ERR_OOM;
    if (st == TWK_OK) st = pass(s, n, tok, pos, rows, lo, hi, sel);
    if (st == TWK_OK) st = twk_plan_read(t->fwd, t->hidden, n, hid, (size_t)(n * D) * sizeof *hid);
    for (int64_t r0 = 0; st == TWK_OK && r0 < n; r0 += hd->rows) {
        int64_t c = n - r0 < hd->rows ? n - r0 : hd->rows;
        st = twk_plan_write(hd->p, hd->hidden, c, hid + r0 * D, (size_t)(c * D) * sizeof *hid);
        if (st == TWK_OK) st = twk_plan_write(hd->p, t->targets, c, prompt + 1 + r0, (size_t)c * sizeof *prompt);
        if (st == TWK_OK && t->n_slots && hd->logits >= 0)
            st = twk_plan_write(hd->p, t->slot_sel, c, slots, (size_t)c * sizeof *slots);
        if (st == TWK_OK) st = twk_plan_run(hd->p, c);
        if (st == TWK_OK) st = twk_plan_read(hd->p, hd->logprobs, c, lp + r0, (size_t)c * sizeof *lp);
        if (st == TWK_OK && k > 0)
            st = twk_plan_read(hd->p, hd->logits, c, lg, (size_t)c * (size_t)s->vocab * sizeof *lg);
        for (int64_t j = 0; st == TWK_OK && k > 0 && j < c; j++) {
            int64_t r = r0 + j + 1; /* the prompt position row r0 + j predicts */
            const float *row = lg + (size_t)j * (size_t)s->vocab;
            double m = -INFINITY, z = 0;
            for (int v = 0; v < s->vocab; v++) m = row[v] > m ? row[v] : m;
            for (int v = 0; v < s->vocab; v++) z += exp((double)row[v] - m);
            double lse = m + log(z);
            for (int v = 0; v < s->vocab; v++) work[v] = (cand){row[v], v};
            select_top(work, s->vocab, k);
            qsort(work, (size_t)k, sizeof *work, cmp_cand);
            for (int q = 0; q < k; q++) {
                topk_ids[r * k + q] = work[q].id;
                topk_lps[r * k + q] = (float)((double)work[q].logit - lse);
            }
        }
    }
    if (st == TWK_OK && logprobs) memcpy(logprobs + 1, lp, (size_t)n * sizeof *lp);
    twk_host_free(hid);
    twk_host_free(lp);
    twk_host_free(lg);
    twk_host_free(work);
    return st;
}

size_t twk_sampler_adapter_bytes(const twk_sampler *s) {
    size_t n = 0;
    for (int i = 0; s && i < s->t->n_adapter; i++) n += nb_bytes(&s->t->adapter[i]);
    return n;
}

static twk_status adapter_host(twk_sampler *s, void *host, size_t bytes, int to_host) {
    if (bytes != twk_sampler_adapter_bytes(s))
        return twk_error(TWK_ERR_INVALID_ARG, "sampler: adapter copy of %zu bytes; the adapter has %zu", bytes,
                         twk_sampler_adapter_bytes(s));
    size_t off = 0;
    for (int i = 0; i < s->t->n_adapter; i++) {
        const named_buf *nb = &s->t->adapter[i];
        size_t n = nb_bytes(nb);
        twk_status st = to_host ? twk_buffer_download(s->t->m->dev, nb->buf, 0, (char *)host + off, n)
                                : twk_buffer_upload(s->t->m->dev, nb->buf, 0, (const char *)host + off, n);
        if (st != TWK_OK) return st;
        off += n;
    }
    return TWK_OK;
}

twk_status twk_sampler_adapter_to_host(twk_sampler *s, void *dst, size_t bytes) { return adapter_host(s, dst, bytes, 1); }
twk_status twk_sampler_adapter_from_host(twk_sampler *s, const void *src, size_t bytes) {
    return adapter_host(s, (void *)(uintptr_t)src, bytes, 0);
}
