/* A one-block transformer LM (RMSNorm, RoPE, grouped-query attention, SwiGLU,
 * tied embeddings) trained with Adam to memorise a few random sequences.
 * The engine's first end-to-end job: every forward and backward op of a
 * decoder block runs in one compiled plan. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "twinkle/rng.h"
#include "twinkle/model.h"

enum { P_EMB, P_N1, P_WQ, P_WK, P_WV, P_WO, P_N2, P_WG, P_WU, P_WD, P_NF, P_COUNT };

struct twk_tiny_lm {
    twk_tiny_lm_config cfg;
    twk_graph *g;
    twk_plan *plan;
    twk_id param[P_COUNT], grad[P_COUNT], loss;
    twk_id tokens, targets, weights, pos, seg;
    int64_t size[P_COUNT], in_dim[P_COUNT];
    float *w[P_COUNT], *m[P_COUNT], *v[P_COUNT], *gbuf[P_COUNT];
    int64_t n_tok;
    int step;
};

twk_tiny_lm_config twk_tiny_lm_default(void) {
    twk_tiny_lm_config c = {.vocab = 64, .dim = 64, .heads = 4, .kv_heads = 2, .head_dim = 16,
                            .ffn = 128, .n_seqs = 4, .seq_len = 24, .lr = 1e-2f, .seed = 1234};
    return c;
}

static twk_id param2(twk_tiny_lm *m, int idx, const char *name, int64_t a, int64_t b) {
    int64_t ne[2] = {a, b};
    m->size[idx] = a * b;
    m->in_dim[idx] = b;
    return m->param[idx] = twk_param(m->g, name, b ? 2 : 1, ne, true);
}

static twk_id linear(twk_graph *g, twk_id x, twk_id w) { return twk_matmul(g, x, w, false, true); }

static twk_status build(twk_tiny_lm *m) {
    const twk_tiny_lm_config *c = &m->cfg;
    twk_graph *g = m->g;
    int64_t T1[1] = {TWK_T};
    m->tokens = twk_input(g, "tokens", TWK_I32, 1, T1);
    m->targets = twk_input(g, "targets", TWK_I32, 1, T1);
    m->weights = twk_input(g, "weights", TWK_F32, 1, T1);
    m->pos = twk_input(g, "pos", TWK_I32, 1, T1);
    m->seg = twk_input(g, "seg_start", TWK_I32, 1, T1);
    int64_t qd = (int64_t)c->heads * c->head_dim, kd = (int64_t)c->kv_heads * c->head_dim;
    param2(m, P_EMB, "embed", c->vocab, c->dim);
    int64_t d1[1] = {c->dim};
    m->param[P_N1] = twk_param(g, "norm1", 1, d1, true);
    m->size[P_N1] = c->dim;
    param2(m, P_WQ, "wq", qd, c->dim);
    param2(m, P_WK, "wk", kd, c->dim);
    param2(m, P_WV, "wv", kd, c->dim);
    param2(m, P_WO, "wo", c->dim, qd);
    m->param[P_N2] = twk_param(g, "norm2", 1, d1, true);
    m->size[P_N2] = c->dim;
    param2(m, P_WG, "w_gate", c->ffn, c->dim);
    param2(m, P_WU, "w_up", c->ffn, c->dim);
    param2(m, P_WD, "w_down", c->dim, c->ffn);
    m->param[P_NF] = twk_param(g, "norm_f", 1, d1, true);
    m->size[P_NF] = c->dim;

    const float eps = 1e-6f, theta = 10000.0f;
    twk_id x = twk_get_rows(g, m->param[P_EMB], m->tokens);
    twk_id h = twk_rmsnorm(g, x, m->param[P_N1], eps);
    int64_t qs[3] = {TWK_T, c->heads, c->head_dim}, ks[3] = {TWK_T, c->kv_heads, c->head_dim};
    twk_id q = twk_reshape(g, linear(g, h, m->param[P_WQ]), 3, qs);
    twk_id k = twk_reshape(g, linear(g, h, m->param[P_WK]), 3, ks);
    twk_id v = twk_reshape(g, linear(g, h, m->param[P_WV]), 3, ks);
    q = twk_rope(g, q, m->pos, -1, theta);
    k = twk_rope(g, k, m->pos, -1, theta);
    twk_id a = twk_attention(g, q, k, v, m->seg, 1.0f / sqrtf((float)c->head_dim));
    int64_t flat[2] = {TWK_T, qd};
    a = twk_reshape(g, a, 2, flat);
    x = twk_add(g, x, linear(g, a, m->param[P_WO]));
    h = twk_rmsnorm(g, x, m->param[P_N2], eps);
    twk_id ff = twk_swiglu(g, linear(g, h, m->param[P_WG]), linear(g, h, m->param[P_WU]));
    x = twk_add(g, x, linear(g, ff, m->param[P_WD]));
    h = twk_rmsnorm(g, x, m->param[P_NF], eps);
    twk_id logits = linear(g, h, m->param[P_EMB]); /* tied unembedding */
    twk_id lp = twk_logprobs(g, logits, m->targets);
    m->loss = twk_weighted_sum(g, lp, m->weights);
    twk_node_set_name(g, m->loss, "loss");
    if (twk_graph_status(g) != TWK_OK) return twk_error(twk_graph_status(g), "%s", twk_graph_error(g));
    twk_status st = twk_graph_backward(g, m->loss);
    if (st != TWK_OK) return st;
    twk_graph_output(g, m->loss);
    for (int i = 0; i < P_COUNT; i++) {
        m->grad[i] = twk_graph_grad(g, m->param[i]);
        if (m->grad[i] < 0)
            return twk_error(TWK_ERR_STATE, "tiny_lm: parameter %s got no gradient", twk_node_name(g, m->param[i]));
        twk_graph_output(g, m->grad[i]);
    }
    return TWK_OK;
}

/* Packs n_seqs random sequences (lengths seq_len +- 25%) and uploads them. */
static twk_status make_data(twk_tiny_lm *m, twk_rng *r) {
    const twk_tiny_lm_config *c = &m->cfg;
    int64_t lens[256], total = 0;
    for (int s = 0; s < c->n_seqs; s++) {
        int64_t spread = c->seq_len / 4;
        lens[s] = c->seq_len - spread + (spread ? twk_rng_below(r, 2 * spread + 1) : 0);
        if (lens[s] < 2) lens[s] = 2;
        total += lens[s] - 1; /* tokens that have a next-token target */
    }
    m->n_tok = total;
    int32_t *tok = twk_host_alloc((size_t)total * 4 * sizeof(int32_t), "tiny_lm data");
    float *w = twk_host_alloc((size_t)total * sizeof(float), "tiny_lm data");
    if (!tok || !w) {
        twk_host_free(tok);
        twk_host_free(w);
        return TWK_ERR_OOM;
    }
    int32_t *tgt = tok + total, *pos = tgt + total, *seg = pos + total;
    int64_t t = 0;
    for (int s = 0; s < c->n_seqs; s++) {
        int32_t seq[4096];
        for (int64_t i = 0; i < lens[s] && i < 4096; i++) seq[i] = (int32_t)twk_rng_below(r, c->vocab);
        int64_t start = t;
        for (int64_t i = 0; i + 1 < lens[s]; i++, t++) {
            tok[t] = seq[i];
            tgt[t] = seq[i + 1];
            pos[t] = (int32_t)i;
            seg[t] = (int32_t)start;
            w[t] = -1.0f / (float)total; /* loss = mean cross-entropy */
        }
    }
    twk_status st = twk_plan_write(m->plan, m->tokens, total, tok, (size_t)total * sizeof *tok);
    if (st == TWK_OK) st = twk_plan_write(m->plan, m->targets, total, tgt, (size_t)total * sizeof *tgt);
    if (st == TWK_OK) st = twk_plan_write(m->plan, m->pos, total, pos, (size_t)total * sizeof *pos);
    if (st == TWK_OK) st = twk_plan_write(m->plan, m->seg, total, seg, (size_t)total * sizeof *seg);
    if (st == TWK_OK) st = twk_plan_write(m->plan, m->weights, total, w, (size_t)total * sizeof *w);
    twk_host_free(tok);
    twk_host_free(w);
    return st;
}

twk_status twk_tiny_lm_new(const twk_tiny_lm_config *cfg, twk_device *dev, twk_tiny_lm **out) {
    if (!out) return twk_error(TWK_ERR_INVALID_ARG, "tiny_lm_new: out is NULL");
    *out = NULL;
    if (!cfg || !dev) return twk_error(TWK_ERR_INVALID_ARG, "tiny_lm_new: NULL config or device");
    if (cfg->vocab < 2 || cfg->dim < 1 || cfg->heads < 1 || cfg->kv_heads < 1 ||
        cfg->heads % cfg->kv_heads || cfg->head_dim < 2 || cfg->head_dim % 2 || cfg->ffn < 1 ||
        cfg->n_seqs < 1 || cfg->n_seqs > 256 || cfg->seq_len < 2 || cfg->seq_len > 3000 || !(cfg->lr > 0))
        return twk_error(TWK_ERR_INVALID_ARG, "tiny_lm_new: invalid configuration");
    twk_tiny_lm *m = twk_host_calloc(sizeof *m, "tiny_lm");
    if (!m) return TWK_ERR_OOM;
    m->cfg = *cfg;
    twk_status st = TWK_ERR_OOM;
    m->g = twk_graph_new();
    if (!m->g) goto fail;
    st = build(m);
    if (st != TWK_OK) goto fail;
    int64_t cap = (int64_t)cfg->n_seqs * (cfg->seq_len + cfg->seq_len / 4);
    st = twk_plan_compile(m->g, dev, cap, NULL, 0, &m->plan);
    if (st != TWK_OK) goto fail;

    twk_rng r;
    twk_rng_seed(&r, cfg->seed);
    for (int i = 0; i < P_COUNT; i++) {
        size_t bytes = (size_t)m->size[i] * sizeof(float);
        m->w[i] = twk_host_calloc(bytes, "tiny_lm weights");
        m->m[i] = twk_host_calloc(bytes, "tiny_lm adam m");
        m->v[i] = twk_host_calloc(bytes, "tiny_lm adam v");
        m->gbuf[i] = twk_host_calloc(bytes, "tiny_lm grads");
        if (!m->w[i] || !m->m[i] || !m->v[i] || !m->gbuf[i]) {
            st = TWK_ERR_OOM;
            goto fail;
        }
        int is_norm = i == P_N1 || i == P_N2 || i == P_NF;
        /* weights are [out, in]: scale by 1/sqrt(in); the embedding by 1/sqrt(dim) */
        int64_t fan_in = is_norm ? 1 : (i == P_EMB ? cfg->dim : m->in_dim[i]);
        double std = is_norm ? 0 : 1.0 / sqrt((double)fan_in);
        for (int64_t k = 0; k < m->size[i]; k++)
            m->w[i][k] = is_norm ? 1.0f : (float)(std * twk_rng_normal(&r));
        st = twk_plan_write(m->plan, m->param[i], 1, m->w[i], bytes);
        if (st != TWK_OK) goto fail;
    }
    st = make_data(m, &r);
    if (st != TWK_OK) goto fail;
    *out = m;
    return TWK_OK;
fail:
    twk_tiny_lm_free(m);
    return st;
}

void twk_tiny_lm_free(twk_tiny_lm *m) {
    if (!m) return;
    twk_plan_free(m->plan);
    twk_graph_free(m->g);
    for (int i = 0; i < P_COUNT; i++) {
        twk_host_free(m->w[i]);
        twk_host_free(m->m[i]);
        twk_host_free(m->v[i]);
        twk_host_free(m->gbuf[i]);
    }
    twk_host_free(m);
}

twk_status twk_tiny_lm_step(twk_tiny_lm *m, float *loss) {
    twk_status st = twk_plan_run(m->plan, m->n_tok);
    if (st != TWK_OK) return st;
    float l = 0;
    st = twk_plan_read(m->plan, m->loss, m->n_tok, &l, sizeof l);
    if (st != TWK_OK) return st;
    if (loss) *loss = l; /* weights are -1/N: the sum is the mean cross-entropy */
    m->step++;
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    double c1 = 1.0 - pow(b1, m->step), c2 = 1.0 - pow(b2, m->step);
    for (int i = 0; i < P_COUNT; i++) {
        size_t bytes = (size_t)m->size[i] * sizeof(float);
        st = twk_plan_read(m->plan, m->grad[i], m->n_tok, m->gbuf[i], bytes);
        if (st != TWK_OK) return st;
        for (int64_t k = 0; k < m->size[i]; k++) {
            float gk = m->gbuf[i][k];
            m->m[i][k] = (float)(b1 * m->m[i][k] + (1 - b1) * gk);
            m->v[i][k] = (float)(b2 * m->v[i][k] + (1 - b2) * gk * gk);
            double mh = m->m[i][k] / c1, vh = m->v[i][k] / c2;
            m->w[i][k] -= (float)(m->cfg.lr * mh / (sqrt(vh) + eps));
        }
        st = twk_plan_write(m->plan, m->param[i], 1, m->w[i], bytes);
        if (st != TWK_OK) return st;
    }
    return TWK_OK;
}

int64_t twk_tiny_lm_tokens(const twk_tiny_lm *m) { return m ? m->n_tok : 0; }

void twk_tiny_lm_stats(const twk_tiny_lm *m, twk_plan_stats *out) {
    if (m) twk_plan_get_stats(m->plan, out);
}

const twk_plan *twk_tiny_lm_plan(const twk_tiny_lm *m) { return m ? m->plan : NULL; }
