/* Llama / Qwen2 / Qwen3 decoders from Hugging Face folders, as graphs over a
 * packed batch, with optional LoRA adapters (PEFT's names and init) and
 * gradient accumulation across forward_backward calls. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf_config.h"
#include "safetensors.h"
#include "twinkle/rng.h"
#include "twinkle/train.h"
#include "trainer_internal.h"



twk_lora_config twk_lora_default(void) {
    twk_lora_config c = {.rank = 32, .alpha = 32, .train_attn = 1, .train_mlp = 1, .train_unembed = 0, .seed = 0};
    return c;
}

const twk_model_config *twk_model_cfg(const twk_model *m) { return m ? &m->cfg : NULL; }

/* n values of dtype t at the back of dst (2 bytes each) widened to f32 over all of dst. */
static twk_status widen_in_place(twk_dtype t, float *dst, int64_t n) {
    const unsigned char *src = (const unsigned char *)dst + (size_t)n * 2;
    float block[256];
    /* each block is read whole before it is written; a write reaches bytes below 4i + 1024 <= 2n + 2(i + 256)
     * (unread source) only when i > n - 256, the last block */
    for (int64_t i = 0; i < n; i += 256) {
        int64_t k = n - i < 256 ? n - i : 256;
        twk_status st = twk_dtype_to_f32(t, src + 2 * i, block, k);
        if (st != TWK_OK) return st;
        memcpy(dst + i, block, (size_t)k * sizeof *dst);
    }
    return TWK_OK;
}

static named_buf *find_w(named_buf *w, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(w[i].name, name)) return &w[i];
    return NULL;
}

void twk_model_free(twk_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_w; i++) twk_buffer_free(m->dev, m->w[i].buf);
    twk_host_free(m->w);
    twk_host_free(m);
}

twk_status twk_model_get_weight(const twk_model *m, const char *name, float *dst, int64_t nelem) {
    if (!m || !name) return twk_error(TWK_ERR_INVALID_ARG, "model_get_weight: NULL argument");
    if (m->cfg.tie_embeddings && !strcmp(name, "lm_head.weight")) name = "model.embed_tokens.weight";
    const named_buf *w = NULL;
    for (int i = 0; i < m->n_w; i++)
        if (!strcmp(m->w[i].name, name)) w = &m->w[i];
    if (!w) return twk_error(TWK_ERR_NOT_FOUND, "model: no weight '%s'", name);
    if (w->nelem != nelem)
        return twk_error(TWK_ERR_INVALID_ARG, "model: weight '%s' has %lld elements, not %lld", name,
                         (long long)w->nelem, (long long)nelem);
    /* a 16-bit weight lands in dst's back half, then widens front to back */
    size_t off = (size_t)nelem * sizeof *dst - nb_bytes(w);
    twk_status st = twk_buffer_download(m->dev, w->buf, 0, (char *)dst + off, nb_bytes(w));
    if (st != TWK_OK || w->dtype == TWK_F32) return st;
    return widen_in_place(w->dtype, dst, nelem);
}

twk_dtype twk_model_dtype(const twk_model *m) {
    for (int i = 0; m && i < m->n_w; i++)
        if (m->w[i].ndim == 2) return m->w[i].dtype;
    return TWK_F32;
}

twk_dtype twk_model_kv_dtype(const twk_model *m) { return m && m->kv_set ? m->kv_dtype : twk_model_dtype(m); }

twk_status twk_model_set_kv_dtype(twk_model *m, twk_dtype t) {
    if (!m || (t != TWK_F32 && !twk_dtype_is_half(t)))
        return twk_error(TWK_ERR_INVALID_ARG, "model: KV cache dtype %s is not f32, bf16 or f16", twk_dtype_name(t));
    m->kv_dtype = t;
    m->kv_set = 1;
    return TWK_OK;
}

/* (Re)places weight w's buffer with n values of dtype `from` at src, stored as w->dtype. */
static twk_status upload_as(twk_device *dev, named_buf *w, twk_dtype from, const void *src) {
    twk_buffer *old = w->buf;
    w->buf = NULL;
    twk_device_pool pool = twk_device_pool_enter(TWK_DPOOL_WEIGHTS);
    twk_status st = twk_buffer_alloc(dev, nb_bytes(w), &w->buf);
    twk_device_pool_enter(pool);
    if (st == TWK_OK && from == w->dtype) {
        st = twk_buffer_upload(dev, w->buf, 0, src, nb_bytes(w));
    } else if (st == TWK_OK && from == TWK_F32) { /* narrowing: a buffer of the narrow size only */
        void *tmp = twk_host_alloc(nb_bytes(w), w->name);
        st = tmp ? twk_dtype_from_f32(w->dtype, src, tmp, w->nelem) : TWK_ERR_OOM;
        if (st == TWK_OK) st = twk_buffer_upload(dev, w->buf, 0, tmp, nb_bytes(w));
        twk_host_free(tmp);
    } else if (st == TWK_OK) {
        float *tmp = twk_host_alloc((size_t)w->nelem * sizeof *tmp, w->name);
        st = tmp ? twk_dtype_to_f32(from, src, tmp, w->nelem) : TWK_ERR_OOM;
        if (st == TWK_OK) st = twk_dtype_from_f32(w->dtype, tmp, tmp, w->nelem);
        if (st == TWK_OK) st = twk_buffer_upload(dev, w->buf, 0, tmp, nb_bytes(w));
        twk_host_free(tmp);
    }
    if (st != TWK_OK) { /* w keeps its old storage */
        twk_buffer_free(dev, w->buf);
        w->buf = old;
        return st;
    }
    twk_buffer_free(dev, old);
    return TWK_OK;
}

twk_status twk_model_convert(twk_model *m, twk_dtype t) {
    if (!m || (t != TWK_F32 && !twk_dtype_is_half(t)))
        return twk_error(TWK_ERR_INVALID_ARG, "model_convert: dtype %s is not f32, bf16 or f16", twk_dtype_name(t));
    twk_status st = TWK_OK;
    for (int i = 0; st == TWK_OK && i < m->n_w; i++) {
        named_buf *w = &m->w[i];
        if (w->ndim < 2 || w->dtype == t) continue; /* matrices (and expert stacks) only: norms and biases stay f32 */
        void *h = twk_host_alloc(nb_bytes(w), w->name);
        st = h ? twk_buffer_download(m->dev, w->buf, 0, h, nb_bytes(w)) : TWK_ERR_OOM;
        twk_dtype from = w->dtype;
        w->dtype = t;
        if (st == TWK_OK) st = upload_as(m->dev, w, from, h);
        if (st != TWK_OK) w->dtype = from;
        twk_host_free(h);
    }
    return st;
}

/* Every tensor the architecture needs, with its expected shape (an expert stack
 * "<layer>.mlp.experts.gate_proj" [E, out, in] is the checkpoint's per-expert
 * "<layer>.mlp.experts.<e>.gate_proj.weight" matrices, stacked). */
static int expected_tensors(const twk_model_config *c, named_buf *out) {
    int n = 0;
    int64_t H = c->hidden, qd = (int64_t)c->heads * c->head_dim, kd = (int64_t)c->kv_heads * c->head_dim;
#define ADD(nm, a, b)                                                                            \
    do {                                                                                         \
        if (out) {                                                                               \
            memset(&out[n], 0, sizeof out[n]);                                                   \
            snprintf(out[n].name, sizeof out[n].name, "%s", nm);                                 \
            out[n].ndim = (b) ? 2 : 1;                                                           \
            out[n].ne[0] = a;                                                                    \
            out[n].ne[1] = b;                                                                    \
            out[n].nelem = (int64_t)(a) * ((b) ? (b) : 1);                                       \
        }                                                                                        \
        n++;                                                                                     \
    } while (0)
#define ADD3(nm, e, a, b)                                                                        \
    do {                                                                                         \
        if (out) {                                                                               \
            memset(&out[n], 0, sizeof out[n]);                                                   \
            snprintf(out[n].name, sizeof out[n].name, "%s", nm);                                 \
            out[n].ndim = 3;                                                                     \
            out[n].ne[0] = e;                                                                    \
            out[n].ne[1] = a;                                                                    \
            out[n].ne[2] = b;                                                                    \
            out[n].nelem = (int64_t)(e) * (a) * (b);                                             \
        }                                                                                        \
        n++;                                                                                     \
    } while (0)
    char nm[128];
    ADD("model.embed_tokens.weight", c->vocab, H);
    for (int l = 0; l < c->layers; l++) {
#define L(s) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, s), nm)
        ADD(L("input_layernorm.weight"), H, 0);
        ADD(L("self_attn.q_proj.weight"), qd, H);
        ADD(L("self_attn.k_proj.weight"), kd, H);
        ADD(L("self_attn.v_proj.weight"), kd, H);
        ADD(L("self_attn.o_proj.weight"), H, qd);
        if (c->attn_bias) {
            ADD(L("self_attn.q_proj.bias"), qd, 0);
            ADD(L("self_attn.k_proj.bias"), kd, 0);
            ADD(L("self_attn.v_proj.bias"), kd, 0);
        }
        if (c->o_bias) ADD(L("self_attn.o_proj.bias"), H, 0);
        if (c->qk_norm) {
            ADD(L("self_attn.q_norm.weight"), c->head_dim, 0);
            ADD(L("self_attn.k_norm.weight"), c->head_dim, 0);
        }
        ADD(L("post_attention_layernorm.weight"), H, 0);
        if (c->gemma) { /* Gemma: post_attention_layernorm normalises the attention's output; these the MLP's */
            ADD(L("pre_feedforward_layernorm.weight"), H, 0);
            ADD(L("post_feedforward_layernorm.weight"), H, 0);
        }
        if (twk_layer_sparse(c, l)) { /* the router, each projection's experts stacked [E, out, in], the shared expert */
            const char *moe = c->arch == TWK_ARCH_MIXTRAL ? "block_sparse_moe" : "mlp";
            char pre[64];
            snprintf(pre, sizeof pre, "%s.gate.weight", moe);
            ADD(L(pre), c->n_experts, H);
            for (int k = 0; k < 3; k++) {
                snprintf(pre, sizeof pre, "%s.experts.%s", moe, twk_expert_proj(c, k));
                ADD3(L(pre), c->n_experts, k == 2 ? H : c->moe_ffn, k == 2 ? c->moe_ffn : H);
            }
            if (c->shared_ffn) {
                ADD(L("mlp.shared_expert.gate_proj.weight"), c->shared_ffn, H);
                ADD(L("mlp.shared_expert.up_proj.weight"), c->shared_ffn, H);
                ADD(L("mlp.shared_expert.down_proj.weight"), H, c->shared_ffn);
                ADD(L("mlp.shared_expert_gate.weight"), 1, H);
            }
            continue;
        }
        ADD(L("mlp.gate_proj.weight"), c->ffn, H);
        ADD(L("mlp.up_proj.weight"), c->ffn, H);
        ADD(L("mlp.down_proj.weight"), H, c->ffn);
#undef L
    }
    ADD("model.norm.weight", H, 0);
    if (!c->tie_embeddings) ADD("lm_head.weight", c->vocab, H);
#undef ADD
#undef ADD3
    return n;
}

twk_model *twk_model_shapes(const twk_model_config *cfg, twk_dtype dtype) {
    twk_model *m = twk_host_calloc(sizeof *m, "model shapes");
    if (!m) return NULL;
    m->cfg = *cfg;
    int n = expected_tensors(cfg, NULL);
    m->w = twk_host_calloc((size_t)n * sizeof *m->w, "model shapes");
    if (!m->w) {
        twk_host_free(m);
        return NULL;
    }
    expected_tensors(cfg, m->w);
    for (int i = 0; i < n; i++) m->w[i].dtype = m->w[i].ndim >= 2 ? dtype : TWK_F32; /* as twk_model_load_as holds them */
    m->n_w = n;
    return m;
}

twk_status twk_model_random(const twk_model_config *cfg, twk_device *dev, uint64_t seed, twk_model **out) {
    return twk_model_random_as(cfg, dev, seed, TWK_F32, out);
}

twk_status twk_model_random_as(const twk_model_config *cfg, twk_device *dev, uint64_t seed, twk_dtype dtype,
                               twk_model **out) {
    if (!out || !cfg || !dev) return twk_error(TWK_ERR_INVALID_ARG, "model_random: NULL argument");
    if (dtype != TWK_F32 && !twk_dtype_is_half(dtype))
        return twk_error(TWK_ERR_INVALID_ARG, "model_random: dtype %s is not f32, bf16 or f16", twk_dtype_name(dtype));
    *out = NULL;
    if (cfg->vocab < 1 || cfg->hidden < 1 || cfg->layers < 1 || cfg->heads < 1 || cfg->kv_heads < 1 ||
        cfg->heads % cfg->kv_heads || cfg->head_dim < 2 || cfg->head_dim % 2 || cfg->ffn < 1 || !(cfg->rope_theta > 0))
        return twk_error(TWK_ERR_INVALID_ARG, "model_random: invalid configuration");
    twk_model *m = twk_host_calloc(sizeof *m, "model");
    if (!m) return TWK_ERR_OOM;
    m->dev = dev;
    m->cfg = *cfg;
    int n = expected_tensors(cfg, NULL);
    m->w = twk_host_calloc((size_t)n * sizeof *m->w, "model weights");
    twk_status st = m->w ? TWK_OK : TWK_ERR_OOM;
    if (st == TWK_OK) expected_tensors(cfg, m->w);
    twk_rng r;
    twk_rng_seed(&r, seed);
    for (int i = 0; st == TWK_OK && i < n; i++) {
        named_buf *w = &m->w[i];
        float *h = twk_host_alloc((size_t)w->nelem * sizeof *h, w->name);
        if (!h) st = TWK_ERR_OOM;
        int is_norm = w->ndim == 1 && strstr(w->name, "norm");
        float norm1 = cfg->gemma ? 0.0f : 1.0f; /* Gemma's norms scale by (1 + w) */
        for (int64_t k = 0; h && k < w->nelem; k++) h[k] = is_norm ? norm1 : (float)(0.02 * twk_rng_normal(&r));
        w->dtype = w->ndim >= 2 ? dtype : TWK_F32;
        if (st == TWK_OK) st = upload_as(dev, w, TWK_F32, h);
        twk_host_free(h);
        m->n_w = i + 1;
    }
    if (st != TWK_OK) {
        twk_model_free(m);
        return st;
    }
    *out = m;
    return TWK_OK;
}

twk_status twk_model_load(const char *dir, twk_device *dev, twk_model **out) {
    return twk_model_load_as(dir, dev, TWK_F32, -1, out);
}

/* Whether the device's kernels read every one of op's 16-bit sources in `want`. */
static int takes_half(twk_device *dev, twk_op op, unsigned want) { return (twk_device_half_srcs(dev, op) & want) == want; }

/* Whether t is -1 (a default) or a float dtype. */
static int float_or_default(int t) { return t == -1 || t == TWK_F32 || twk_dtype_is_half((twk_dtype)t); }

/* Whether dev's kernels read 16-bit weight matrices (matmul's weight, the embedding gather) and,
 * for a mixture of experts (cfg->n_experts > 0; cfg NULL: not known yet), 16-bit expert stacks
 * (lora_gather's w, plain and transposed). */
static int reads_half_weights(twk_device *dev, const twk_model_config *cfg) {
    return takes_half(dev, TWK_OP_MATMUL, TWK_SRC(1)) && takes_half(dev, TWK_OP_GET_ROWS, TWK_SRC(0)) &&
           (!cfg || cfg->n_experts <= 0 || takes_half(dev, TWK_OP_LORA_GATHER, TWK_SRC(1)));
}

int twk_model_weights_dtype(const char *dir, twk_device *dev, int dtype) {
    if (dtype >= 0) return float_or_default(dtype) ? dtype : -1;
    if (dev && !reads_half_weights(dev, NULL)) return TWK_F32;
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir ? dir : "");
    twk_model_config cfg;
    twk_safetensors *sf = NULL;
    if (!dir || twk_hf_config_load(path, &cfg) != TWK_OK) return -1;
    if (dev && !reads_half_weights(dev, &cfg)) return TWK_F32;
    if (twk_st_open(dir, &sf) != TWK_OK) /* no weights (a config-only plan): as config.json says */
        return cfg.stored_dtype >= 0 ? cfg.stored_dtype : TWK_F32;
    int n = expected_tensors(&cfg, NULL), got = TWK_F32;
    named_buf *w = twk_host_calloc((size_t)n * sizeof *w, "model dtype");
    if (!w) {
        twk_st_close(sf);
        twk_error(TWK_ERR_OOM, "model dtype: out of memory");
        return -1;
    }
    expected_tensors(&cfg, w);
    for (int i = 0; i < n; i++) { /* the first weight matrix's stored dtype (a checkpoint holds one) */
        const twk_st_tensor *t = w[i].ndim == 2 ? twk_st_find(sf, w[i].name) : NULL;
        if (t && twk_st_hal_dtype(t->dtype) >= 0) {
            got = twk_st_hal_dtype(t->dtype);
            break;
        }
    }
    twk_host_free(w);
    twk_st_close(sf);
    return got;
}

/* Expert stack w ("<prefix>.experts.<proj>" [E, out, in]) from the checkpoint's matrices
 * "<prefix>.experts.<e>.<proj>.weight", all of one dtype, held as `dtype` (-1: as stored). */
static twk_status load_stack(const char *dir, twk_safetensors *sf, twk_device *dev, int dtype, named_buf *w) {
    const char *dot = strrchr(w->name, '.');
    int plen = (int)(dot - w->name);
    int64_t E = w->ne[0], per = w->ne[1] * w->ne[2];
    unsigned char *host = NULL;
    int from = -1;
    twk_status st = TWK_OK;
    for (int64_t e = 0; st == TWK_OK && e < E; e++) {
        char key[300];
        snprintf(key, sizeof key, "%.*s.%lld%s.weight", plen, w->name, (long long)e, dot);
        const twk_st_tensor *t = twk_st_find(sf, key);
        if (!t) {
            st = twk_error(TWK_ERR_NOT_FOUND, "%s: tensor '%s' is missing", dir, key);
            break;
        }
        if (t->ndim != 2 || t->shape[0] != w->ne[1] || t->shape[1] != w->ne[2]) {
            st = twk_error(TWK_ERR_SHAPE, "%s: tensor '%s' has shape [%lld, %lld], config.json implies [%lld, %lld]", dir, key,
                           (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)w->ne[1],
                           (long long)w->ne[2]);
            break;
        }
        int td = twk_st_hal_dtype(t->dtype);
        if (td < 0 || (from >= 0 && td != from)) {
            st = twk_error(TWK_ERR_DTYPE, "%s: tensor '%s' has dtype %s; expected F32, F16 or BF16 like expert 0", dir, key,
                           t->dtype_name);
            break;
        }
        size_t es = twk_dtype_size((twk_dtype)td);
        if (!host) host = twk_host_alloc((size_t)(E * per) * es, w->name);
        if (!host) {
            st = TWK_ERR_OOM;
            break;
        }
        from = td;
        memcpy(host + (size_t)(e * per) * es, t->data, (size_t)per * es);
    }
    if (st == TWK_OK) {
        w->dtype = dtype < 0 ? (twk_dtype)from : (twk_dtype)dtype;
        st = upload_as(dev, w, (twk_dtype)from, host);
    }
    twk_host_free(host);
    return st;
}

twk_status twk_model_load_as(const char *dir, twk_device *dev, int dtype, int kv_dtype, twk_model **out) {
    if (!out || !dir || !dev) return twk_error(TWK_ERR_INVALID_ARG, "model_load: NULL argument");
    *out = NULL;
    if (!float_or_default(dtype) || !float_or_default(kv_dtype))
        return twk_error(TWK_ERR_INVALID_ARG, "model_load: dtype %d / KV dtype %d is not f32, bf16 or f16", dtype, kv_dtype);
    /* by default as stored where the device's kernels read 16-bit weights (matmul, embedding
     * gather) and 16-bit KV caches (kv_write, attn_cache); f32 where they do not */
    if (dtype < 0 && !reads_half_weights(dev, NULL)) dtype = TWK_F32;
    if (kv_dtype < 0 && !(takes_half(dev, TWK_OP_KV_WRITE, TWK_SRC(0)) &&
                          takes_half(dev, TWK_OP_ATTN_CACHE, TWK_SRC(1) | TWK_SRC(2))))
        kv_dtype = TWK_F32;
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    twk_model *m = twk_host_calloc(sizeof *m, "model");
    if (!m) return TWK_ERR_OOM;
    m->dev = dev;
    m->kv_set = kv_dtype >= 0;
    m->kv_dtype = m->kv_set ? (twk_dtype)kv_dtype : TWK_F32;
    twk_status st = twk_hf_config_load(path, &m->cfg);
    if (st == TWK_OK) { /* sampling stops at the EOS ids of both files */
        snprintf(path, sizeof path, "%s/generation_config.json", dir);
        st = twk_hf_generation_eos(path, &m->cfg);
    }
    if (st == TWK_OK && dtype < 0 && !reads_half_weights(dev, &m->cfg)) dtype = TWK_F32; /* 16-bit experts unread */
    if (st == TWK_OK && dtype >= 0 && twk_dtype_is_half((twk_dtype)dtype) && !reads_half_weights(dev, &m->cfg))
        st = twk_error(TWK_ERR_UNSUPPORTED, "model_load: %s's kernels read no %s weight matrices%s (load it as f32)",
                       twk_device_spec(dev), twk_dtype_name((twk_dtype)dtype), m->cfg.n_experts > 0 ? " or expert stacks" : "");
    if (st != TWK_OK) {
        twk_model_free(m);
        return st;
    }
    twk_safetensors *sf = NULL;
    st = twk_st_open(dir, &sf);
    if (st != TWK_OK) {
        twk_model_free(m);
        return st;
    }
    int n = expected_tensors(&m->cfg, NULL);
    m->w = twk_host_calloc((size_t)n * sizeof *m->w, "model weights");
    if (!m->w) st = TWK_ERR_OOM;
    else expected_tensors(&m->cfg, m->w);
    for (int i = 0; st == TWK_OK && i < n; i++) {
        named_buf *w = &m->w[i];
        if (w->ndim == 3) { /* an expert stack from the per-expert matrices */
            st = load_stack(dir, sf, dev, dtype, w);
            m->n_w = i + 1;
            continue;
        }
        const twk_st_tensor *t = twk_st_find(sf, w->name);
        if (!t) {
            st = twk_error(TWK_ERR_NOT_FOUND, "%s: tensor '%s' is missing", dir, w->name);
            break;
        }
        int shape_ok = t->ndim == w->ndim && t->shape[0] == w->ne[0] && (w->ndim == 1 || t->shape[1] == w->ne[1]);
        if (!shape_ok) {
            st = twk_error(TWK_ERR_SHAPE, "%s: tensor '%s' has shape [%lld%s%lld], config.json implies [%lld%s%lld]", dir,
                           w->name, (long long)t->shape[0], t->ndim > 1 ? ", " : "", (long long)(t->ndim > 1 ? t->shape[1] : 0),
                           (long long)w->ne[0], w->ndim > 1 ? ", " : "", (long long)w->ne[1]);
            break;
        }
        int from = twk_st_hal_dtype(t->dtype);
        if (from < 0) {
            st = twk_error(TWK_ERR_DTYPE, "%s: tensor '%s' has dtype %s; expected F32, F16 or BF16", dir, w->name, t->dtype_name);
            break;
        }
        /* matrices in the requested dtype (or as stored); norms and biases f32 */
        w->dtype = w->ndim < 2 ? TWK_F32 : dtype < 0 ? (twk_dtype)from : (twk_dtype)dtype;
        st = upload_as(dev, w, (twk_dtype)from, t->data); /* a little-endian host reads the file's bytes */
        m->n_w = i + 1;
    }
    twk_st_close(sf);
    if (st != TWK_OK) {
        twk_model_free(m);
        return st;
    }
    *out = m;
    return TWK_OK;
}

/* ---- trainer ---- */



static twk_id weight_node(twk_trainer *t, const char *name) {
    for (int i = 0; i < t->m->n_w; i++)
        if (!strcmp(t->m->w[i].name, name)) return t->param_ids[i];
    return -1;
}

static twk_id adapter_node(twk_trainer *t, const char *name) {
    for (int i = 0; i < t->n_adapter; i++)
        if (!strcmp(t->adapter[i].name, name)) return t->param_ids[t->m->n_w + i];
    return -1;
}

/* The low-rank term of adapter slots: B[slot] A[slot] x per token; a packed
 * trainer (not sampling) then scales each token by its run's alpha / rank
 * (a sampler's slots hold B already scaled). */
static twk_id slot_lora(twk_trainer *t, twk_id x, twk_id A, twk_id B, twk_id slot) {
    twk_graph *g = t->g;
    twk_id low = twk_lora_gather(g, twk_lora_gather(g, x, A, slot), B, slot);
    if (t->sampling) return low;
    int64_t col[2] = {TWK_T, 1};
    return twk_mul(g, low, twk_reshape(g, t->slot_scale, 2, col));
}

/* y = x W^T (+ b) (+ scale * (x A^T) B^T when the module has an adapter), the weights named by
 * module and the adapter by peft (PEFT's module name: Mixtral's router is the checkpoint's
 * block_sparse_moe.gate, transformers 5's mlp.gate). */
static twk_id linear_peft(twk_trainer *t, twk_id x, const char *module, const char *peft, int has_bias) {
    twk_graph *g = t->g;
    char nm[200];
    snprintf(nm, sizeof nm, "%s.weight", module);
    twk_id y = twk_matmul(g, x, weight_node(t, nm), false, true);
    if (has_bias) {
        snprintf(nm, sizeof nm, "%s.bias", module);
        y = twk_add(g, y, weight_node(t, nm));
    }
    char an[220], bn[220];
    snprintf(an, sizeof an, "base_model.model.%s.lora_A.weight", peft);
    snprintf(bn, sizeof bn, "base_model.model.%s.lora_B.weight", peft);
    twk_id A = adapter_node(t, an), B = adapter_node(t, bn);
    if (A >= 0 && B >= 0 && t->n_slots) { /* each token through its own slot's adapter */
        twk_id sl = t->sampling && !strcmp(module, "lm_head") ? t->slot_sel : t->slot_in; /* lm_head sees the selected rows */
        y = twk_add(g, y, slot_lora(t, x, A, B, sl));
    } else if (A >= 0 && B >= 0) {
        twk_id low = twk_matmul(g, twk_matmul(g, x, A, false, true), B, false, true);
        y = twk_add(g, y, twk_scale(g, low, t->scale));
    }
    return y;
}

static twk_id linear(twk_trainer *t, twk_id x, const char *module, int has_bias) { return linear_peft(t, x, module, module, has_bias); }

/* PEFT's ParamWrapper adapter on an expert stack as the stacks lora_gather reads: A [rank E, in]
 * as a [E, rank, in] and B [out, rank E] (column j E + e) as b [E, out, rank]; -1 when the layer's
 * experts have no adapter (peft: "<layer>.mlp.experts" or "<layer>.mlp.experts.base_layer"). */
static int expert_lora(twk_trainer *t, const char *peft, twk_id *a, twk_id *b) {
    twk_graph *g = t->g;
    char an[260], bn[260];
    snprintf(an, sizeof an, "base_model.model.%s.lora_A.weight", peft);
    snprintf(bn, sizeof bn, "base_model.model.%s.lora_B.weight", peft);
    twk_id A = adapter_node(t, an), B = adapter_node(t, bn);
    if (A < 0 || B < 0) return 0;
    int64_t na[8] = {0}, nb[8] = {0}, E = t->m->cfg.n_experts;
    twk_node_shape(g, A, 1, na);
    twk_node_shape(g, B, 1, nb);
    int64_t a3[3] = {E, na[0] / E, na[1]}, b3[3] = {nb[0], nb[1] / E, E};
    static const int perm[3] = {2, 0, 1}; /* [out, rank, E] -> [E, out, rank] */
    *a = twk_reshape(g, A, 3, a3);
    *b = twk_permute(g, twk_reshape(g, B, 3, b3), perm);
    return 1;
}

/* One projection k (0 gate, 1 up, 2 down) of every expert over the rows grouped by expert: the
 * stack [E, out, in] as one grouped product (lora_gather with each row's expert as its slot). */
static twk_id experts_linear(twk_trainer *t, twk_id x, const char *moe, int k, twk_id slot) {
    char nm[260];
    snprintf(nm, sizeof nm, "%s.experts.%s", moe, twk_expert_proj(&t->m->cfg, k));
    return twk_lora_gather_grouped(t->g, x, weight_node(t, nm), slot, false);
}

/* A mixture-of-experts MLP over h [T, H] (moe: "model.layers.<l>.mlp" or Mixtral's
 * "block_sparse_moe"): router logits, top-k, the routing weights, the (token, choice) pairs
 * grouped by expert on the device, one grouped product per projection, back to tokens weighted;
 * Qwen2-MoE adds its shared expert times sigmoid(shared_expert_gate h). */
static twk_id moe_mlp(twk_trainer *t, twk_id h, const char *layer) {
    const twk_model_config *c = &t->m->cfg;
    twk_graph *g = t->g;
    char moe[200], mod[260];
    snprintf(moe, sizeof moe, "%s.%s", layer, c->arch == TWK_ARCH_MIXTRAL ? "block_sparse_moe" : "mlp");
    snprintf(mod, sizeof mod, "%s.gate", moe);
    char peft[260];
    snprintf(peft, sizeof peft, "%s.mlp.gate", layer);
    twk_id logits = linear_peft(t, h, mod, peft, 0);
    twk_id ids = twk_moe_topk(g, logits, c->top_k);
    twk_id w = twk_moe_gate(g, logits, ids, c->norm_topk);
    if (c->router_aux && !t->sampling) { /* the load-balancing loss's statistics (per run in a packed trainer), summed over layers */
        twk_id s = t->n_slots ? twk_moe_router_stats_slots(g, logits, ids, t->aux_slot, t->n_slots) : twk_moe_router_stats(g, logits, ids);
        t->aux_stats = t->aux_stats < 0 ? s : twk_add(g, t->aux_stats, s);
        t->n_aux++;
    }
    twk_id order = twk_moe_sort(g, logits, ids, 0), inv = twk_moe_sort(g, logits, ids, 1), slot = twk_moe_sort(g, logits, ids, 2);
    twk_id xs = twk_moe_dispatch(g, h, order, inv, -1);
    twk_id gate = experts_linear(t, xs, moe, 0, slot), up = experts_linear(t, xs, moe, 1, slot), a, b;
    snprintf(peft, sizeof peft, "%s.mlp.experts.base_layer", layer);
    if (expert_lora(t, peft, &a, &b)) { /* gate_up_proj: gate the first moe_ffn rows of B, up the rest */
        twk_id low = twk_lora_gather(g, xs, a, slot);
        gate = twk_add(g, gate, twk_scale(g, twk_lora_gather(g, low, twk_slice(g, b, 1, 0, c->moe_ffn), slot), t->scale));
        up = twk_add(g, up, twk_scale(g, twk_lora_gather(g, low, twk_slice(g, b, 1, c->moe_ffn, c->moe_ffn), slot), t->scale));
    }
    twk_id act = twk_swiglu(g, gate, up), down = experts_linear(t, act, moe, 2, slot);
    snprintf(peft, sizeof peft, "%s.mlp.experts", layer);
    if (expert_lora(t, peft, &a, &b))
        down = twk_add(g, down, twk_scale(g, twk_lora_gather(g, twk_lora_gather(g, act, a, slot), b, slot), t->scale));
    twk_id out = twk_moe_combine(g, down, order, inv, w, c->top_k);
    if (!c->shared_ffn) return out;
    snprintf(mod, sizeof mod, "%s.shared_expert.gate_proj", moe);
    twk_id sg = linear(t, h, mod, 0);
    snprintf(mod, sizeof mod, "%s.shared_expert.up_proj", moe);
    twk_id sh = twk_swiglu(g, sg, linear(t, h, mod, 0));
    snprintf(mod, sizeof mod, "%s.shared_expert.down_proj", moe);
    sh = linear(t, sh, mod, 0);
    snprintf(mod, sizeof mod, "%s.shared_expert_gate", moe);
    /* sigmoid(z) = (1 + tanh(z / 2)) / 2 */
    int64_t one = 1;
    twk_id z = twk_map(g, TWK_OP_TANH, twk_scale(g, linear(t, h, mod, 0), 0.5f));
    twk_id sgate = twk_scale(g, twk_add(g, z, twk_fill(g, 1, &one, 1.0f)), 0.5f);
    return twk_add(g, out, twk_mul(g, sh, sgate));
}

/* A norm weight as the model's RMSNorm uses it: Gemma's 1 + w (ones[0] over hidden, ones[1]
 * over head_dim, made once), else w. */
static twk_id norm_w(twk_trainer *t, twk_id w, twk_id ones[2]) {
    const twk_model_config *c = &t->m->cfg;
    if (!c->gemma || w < 0) return w;
    int64_t ne[8] = {0}, n;
    if (twk_node_shape(t->g, w, 1, ne) != 1) return -1;
    n = ne[0];
    int which = n == c->hidden ? 0 : 1;
    if (ones[which] < 0) ones[which] = twk_fill(t->g, 1, &n, 1.0f);
    return twk_add(t->g, w, ones[which]);
}

/* Gemma's embedding scale, sqrt(hidden), rounded to the embedding's dtype as transformers does. */
static float embed_scale(const twk_model *m) {
    float s = sqrtf((float)m->cfg.hidden);
    twk_dtype t = twk_model_dtype(m);
    if (!twk_dtype_is_half(t)) return s;
    uint16_t hbits;
    twk_dtype_from_f32(t, &s, &hbits, 1);
    twk_dtype_to_f32(t, &hbits, &s, 1);
    return s;
}

static int lora_targets(const twk_lora_config *lc, const char *module) {
    if (strstr(module, "self_attn.")) return lc->train_attn;
    if (strstr(module, "mlp.")) return lc->train_mlp;
    if (!strcmp(module, "lm_head")) return lc->train_unembed;
    return 0;
}

/* One LoRA pair base_model.model.<module>.lora_A.weight [rank, in] / lora_B.weight [out, rank]
 * (nothing allocated in a dry trainer; zeros stacked per slot with slots; else PEFT's init:
 * A ~ kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)), B = 0). An error status on failure. */
static twk_status add_pair(twk_trainer *t, twk_rng *r, const char *module, int64_t out, int64_t in, int64_t rank) {
    for (int ab = 0; ab < 2; ab++) {
        named_buf *nb = &t->adapter[t->n_adapter++];
        snprintf(nb->name, sizeof nb->name, "base_model.model.%s.lora_%c.weight", module, ab ? 'B' : 'A');
        if (t->dry) { /* shapes only */
            nb->ndim = 2;
            nb->ne[0] = ab ? out : rank;
            nb->ne[1] = ab ? rank : in;
            nb->nelem = nb->ne[0] * nb->ne[1];
            continue;
        }
        if (t->n_slots) { /* stacked per slot, zeros */
            nb->ndim = 3;
            nb->ne[0] = t->n_slots;
            nb->ne[1] = ab ? out : t->slot_rank;
            nb->ne[2] = ab ? t->slot_rank : in;
            nb->nelem = nb->ne[0] * nb->ne[1] * nb->ne[2];
            twk_status st = twk_buffer_alloc(t->m->dev, nb_bytes(nb), &nb->buf);
            if (st == TWK_OK) st = twk_buffer_zero(t->m->dev, nb->buf, 0, nb_bytes(nb));
            if (st != TWK_OK) return st;
            continue;
        }
        nb->ndim = 2;
        nb->ne[0] = ab ? out : rank;
        nb->ne[1] = ab ? rank : in;
        nb->nelem = nb->ne[0] * nb->ne[1];
        float *h = twk_host_calloc(nb_bytes(nb), "lora init");
        if (!h) return TWK_ERR_OOM;
        double bound = 1.0 / sqrt((double)in);
        for (int64_t i = 0; !ab && i < nb->nelem; i++) h[i] = (float)((2 * twk_rng_uniform(r) - 1) * bound);
        twk_status st = twk_buffer_alloc(t->m->dev, nb_bytes(nb), &nb->buf);
        if (st == TWK_OK) st = twk_buffer_upload(t->m->dev, nb->buf, 0, h, nb_bytes(nb));
        twk_host_free(h);
        if (st != TWK_OK) return st;
    }
    return TWK_OK;
}

/* The adapters of sparse layer l's mixture of experts, in PEFT 0.21.2's layout and names
 * (transformers 5's module names: "mlp" for Mixtral too): the router as a plain pair on
 * mlp.gate (train_router); the experts (train_experts) as PEFT's ParamWrapper on the fused
 * stacks, gate_up_proj ([E, 2 moe_ffn, H]: rank 2r, alpha 2 alpha, the scale unchanged) wrapped
 * first, so its tensors are mlp.experts.base_layer.lora_A / _B, then down_proj
 * (mlp.experts.lora_A / _B): A [rank E, in], B [out, rank E]; expert e's delta is
 * B[:, j E + e] A[e rank + j] summed over j. No slots (refused in trainer_create). */
static twk_status moe_adapters(twk_trainer *t, twk_rng *r, int l) {
    const twk_model_config *c = &t->m->cfg;
    char module[160];
    int64_t rk = t->lc.rank, E = c->n_experts, H = c->hidden, I = c->moe_ffn;
    twk_status st = TWK_OK;
    if (t->lc.train_router) {
        snprintf(module, sizeof module, "model.layers.%d.mlp.gate", l);
        st = add_pair(t, r, module, E, H, rk);
    }
    if (st == TWK_OK && t->lc.train_experts) {
        snprintf(module, sizeof module, "model.layers.%d.mlp.experts.base_layer", l);
        st = add_pair(t, r, module, 2 * I, H, 2 * rk * E);
        snprintf(module, sizeof module, "model.layers.%d.mlp.experts", l);
        if (st == TWK_OK) st = add_pair(t, r, module, H, I, rk * E);
    }
    return st;
}

static twk_status make_adapter(twk_trainer *t) {
    const twk_model_config *c = &t->m->cfg;
    static const char *const attn[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    static const char *const mlp[] = {"gate_proj", "up_proj", "down_proj"};
    int max = 2; /* tensors: 7 pairs per dense layer, 10 per sparse one (+ router, 2 expert stacks), lm_head */
    for (int l = 0; l < c->layers; l++) max += twk_layer_sparse(c, l) ? 20 : 14;
    t->adapter = twk_host_calloc((size_t)max * sizeof *t->adapter, "lora adapter");
    if (!t->adapter) return TWK_ERR_OOM;
    twk_rng r;
    twk_rng_seed(&r, t->lc.seed);
    char module[160];
    for (int l = 0; l <= c->layers; l++) {
        int sparse = l < c->layers && twk_layer_sparse(c, l);
        for (int k = 0; k < 8; k++) {
            if (l == c->layers) {
                if (k > 0) break;
                snprintf(module, sizeof module, "lm_head");
            } else if (k < 4) {
                snprintf(module, sizeof module, "model.layers.%d.self_attn.%s", l, attn[k]);
            } else if (k < 7) {
                if (sparse && !c->shared_ffn) continue; /* experts: no dense MLP */
                snprintf(module, sizeof module, "model.layers.%d.mlp.%s%s", l, sparse ? "shared_expert." : "", mlp[k - 4]);
            } else {
                if (sparse && !t->n_slots) { /* the router and the experts */
                    twk_status st = moe_adapters(t, &r, l);
                    if (st != TWK_OK) return st;
                }
                break;
            }
            if (!(t->n_slots && t->sampling) && !lora_targets(&t->lc, module)) continue; /* a sampler's slots: every module */
            char wn[200];
            snprintf(wn, sizeof wn, "%s.weight", module);
            named_buf *base = find_w(t->m->w, t->m->n_w, !strcmp(module, "lm_head") && c->tie_embeddings
                                                              ? "model.embed_tokens.weight" : wn);
            if (!base) return twk_error(TWK_ERR_NOT_FOUND, "lora: no base weight for %s", module);
            twk_status st = add_pair(t, &r, module, base->ne[0], base->ne[1], t->lc.rank);
            if (st != TWK_OK) return st;
        }
    }
    return TWK_OK;
}

/* loss = -sum(weights * logprobs), both named, and the objective the backward differentiates:
 * the loss, plus router_aux_coef times transformers' load_balancing_loss_func over the sparse
 * layers when the config asks (output_router_logits): E * sum_e f_e P_e, f_e the share of the
 * T * K choices (all layers pooled) that went to expert e per row, P_e the mean router softmax
 * (f has no gradient, as torch's histc). The graph's first error. */
static twk_status finish_loss(twk_trainer *t) {
    twk_graph *g = t->g;
    t->loss = twk_scale(g, twk_weighted_sum(g, t->logprobs, t->weights), -1.0f);
    twk_node_set_name(g, t->logprobs, "logprobs");
    twk_node_set_name(g, t->loss, "loss");
    t->objective = t->loss;
    if (t->aux_stats >= 0 && !t->n_slots) {
        double L = t->n_aux, E = t->m->cfg.n_experts;
        twk_id f = twk_slice(g, t->aux_stats, 0, 0, 1), p = twk_slice(g, t->aux_stats, 0, 1, 1);
        t->aux = twk_scale(g, twk_weighted_sum(g, f, p), (float)(E / (L * L)));
        int64_t one[1] = {1};
        t->aux_coef = twk_input(g, "router_aux_coef", TWK_F32, 1, one);
        t->objective = twk_add(g, t->loss, twk_mul(g, t->aux, t->aux_coef));
        twk_node_set_name(g, t->aux, "router_aux_loss");
    } else if (t->aux_stats >= 0) { /* a packed trainer: one value per slot (run), [S, 1], and a coefficient each */
        double L = t->n_aux, E = t->m->cfg.n_experts;
        int64_t S = t->n_slots, se[2] = {S, (int64_t)E}, e1[2] = {(int64_t)E, 1}, s1[2] = {S, 1};
        twk_id f = twk_slice(g, t->aux_stats, 1, 0, 1), p = twk_slice(g, t->aux_stats, 1, 1, 1);
        twk_id fp = twk_reshape(g, twk_mul(g, f, p), 2, se);
        t->aux = twk_scale(g, twk_matmul(g, fp, twk_fill(g, 2, e1, 1.0f), false, false), (float)(E / (L * L)));
        t->aux_coef = twk_input(g, "router_aux_coef", TWK_F32, 2, s1);
        t->objective = twk_add(g, t->loss, twk_weighted_sum(g, t->aux, t->aux_coef));
        twk_node_set_name(g, t->aux, "router_aux_loss");
    }
    if (twk_graph_status(g) != TWK_OK) return twk_error(twk_graph_status(g), "%s", twk_graph_error(g));
    return TWK_OK;
}

static twk_status build(twk_trainer *t) {
    const twk_model_config *c = &t->m->cfg;
    twk_graph *g = t->g;
    int64_t T1[1] = {TWK_T};
    t->aux_stats = t->aux = t->aux_coef = t->objective = t->aux_slot = -1;
    t->n_aux = 0;
    t->tokens = twk_input(g, "tokens", TWK_I32, 1, T1);
    t->targets = twk_input(g, "targets", TWK_I32, 1, T1);
    t->positions = twk_input(g, "positions", TWK_I32, 1, T1);
    t->seg = twk_input(g, "seg_start", TWK_I32, 1, T1);
    t->weights = twk_input(g, "weights", TWK_F32, 1, T1);
    if (t->n_slots && !t->sampling) { /* a packed trainer: each token's slot and its run's LoRA scale */
        t->slot_in = twk_input(g, "lora_slot", TWK_I32, 1, T1);
        t->slot_scale = twk_input(g, "lora_scale", TWK_F32, 1, T1);
        if (c->router_aux) t->aux_slot = twk_input(g, "router_aux_slot", TWK_I32, 1, T1); /* a run's slot; -1: padding, base */
    }
    int n_all = t->m->n_w + t->n_adapter, n_kv = t->sampling ? 2 * c->layers : 0;
    if (!t->param_ids) t->param_ids = twk_host_calloc((size_t)(n_all + n_kv) * sizeof *t->param_ids, "trainer params");
    if (!t->param_ids) return TWK_ERR_OOM;
    for (int i = 0; i < n_all; i++) {
        named_buf *nb = i < t->m->n_w ? &t->m->w[i] : &t->adapter[i - t->m->n_w];
        int trainable = t->sampling ? 0 : i < t->m->n_w ? !t->lora : 1;
        t->param_ids[i] = twk_param_dtype(g, nb->name, nb->dtype, nb->ndim, nb->ne, trainable);
    }
    for (int i = 0; i < n_kv; i++) {
        int64_t ne[3] = {twk_kv_layer_rows(c, i / 2, t->max_seqs, t->max_len), c->kv_heads, c->head_dim};
        t->param_ids[n_all + i] = twk_param_dtype(g, t->kv[i].name, t->kv[i].dtype, 3, ne, false);
    }
    if (t->sampling) {
        t->rows = twk_input(g, "kv_rows", TWK_I32, 1, T1);
        t->lo = twk_input(g, "kv_lo", TWK_I32, 1, T1);
        t->hi = twk_input(g, "kv_hi", TWK_I32, 1, T1);
        t->ring = t->full = 0; /* the sliding-window layers' caches are rings when their window is shorter */
        for (int l = 0; l < c->layers; l++) {
            int r = twk_kv_seq_rows(c, l, t->max_len) < t->max_len;
            t->ring |= r;
            t->full |= !r;
        }
        if (t->ring) {
            t->rows_w = twk_input(g, "kv_rows_window", TWK_I32, 1, T1);
            t->lo_w = twk_input(g, "kv_lo_window", TWK_I32, 1, T1);
            t->hi_w = twk_input(g, "kv_hi_window", TWK_I32, 1, T1);
        }
        if (t->n_slots) t->slot_in = twk_input(g, "lora_slot", TWK_I32, 1, T1);
        int64_t m1[1] = {1};
        int dyn = t->pass != TWK_PASS_PREFILL; /* the prefill selects 1 row, decode and heads every row */
        t->sel = twk_input(g, "select", TWK_I32, 1, dyn ? T1 : m1);
        if (t->n_slots) t->slot_sel = twk_input(g, "lora_slot_select", TWK_I32, 1, dyn ? T1 : m1);
    }
    int64_t hf[1] = {c->head_dim / 2};
    t->inv_freq_id = twk_param(g, "rope.inv_freq", 1, hf, false);
    t->inv_freq_local_id = t->inv_freq_local.nelem ? twk_param(g, "rope.inv_freq_local", 1, hf, false) : -1;
    int head = t->sampling && t->pass == TWK_PASS_HEAD;
    if (head) {
        int64_t hs[2] = {TWK_T, c->hidden};
        t->hidden = twk_input(g, "hidden", TWK_F32, 2, hs);
    }

    float eps = (float)c->rms_eps, scale = c->attn_scale > 0 ? (float)c->attn_scale : 1.0f / sqrtf((float)c->head_dim);
    twk_id x = twk_get_rows(g, weight_node(t, "model.embed_tokens.weight"), t->tokens);
    if (c->gemma) x = twk_scale(g, x, embed_scale(t->m)); /* as transformers: sqrt(hidden) in the embedding's dtype */
    twk_id ones[2] = {-1, -1}; /* Gemma's norms: w + 1 over hidden, over head_dim */
    int64_t qs[3] = {TWK_T, c->heads, c->head_dim}, ks[3] = {TWK_T, c->kv_heads, c->head_dim};
    int64_t flat[2] = {TWK_T, (int64_t)c->heads * c->head_dim};
    char nm[160], mod[160];
    for (int l = 0; !head && l < c->layers; l++) {
        if (t->recompute) twk_graph_checkpoint(g, x); /* each layer's input */
#define W(s) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, s), norm_w(t, weight_node(t, nm), ones))
#define M(s) (snprintf(mod, sizeof mod, "model.layers.%d.%s", l, s), mod)
        twk_id h = twk_rmsnorm(g, x, W("input_layernorm.weight"), eps);
        twk_id q = twk_reshape(g, linear(t, h, M("self_attn.q_proj"), c->attn_bias), 3, qs);
        twk_id k = twk_reshape(g, linear(t, h, M("self_attn.k_proj"), c->attn_bias), 3, ks);
        twk_id v = twk_reshape(g, linear(t, h, M("self_attn.v_proj"), c->attn_bias), 3, ks);
        if (c->qk_norm) {
            q = twk_rmsnorm(g, q, W("self_attn.q_norm.weight"), eps);
            k = twk_rmsnorm(g, k, W("self_attn.k_norm.weight"), eps);
        }
        int window = twk_layer_window(c, l);
        twk_id freq = window && t->inv_freq_local_id >= 0 ? t->inv_freq_local_id : t->inv_freq_id;
        q = twk_rope(g, q, t->positions, freq, 0);
        k = twk_rope(g, k, t->positions, freq, 0);
        twk_id att;
        if (t->sampling) { /* keys and values go to the cache (a ring's rows for a windowed layer) */
            int ring = twk_kv_seq_rows(c, l, t->max_len) < t->max_len;
            twk_id rows = ring ? t->rows_w : t->rows, lo = ring ? t->lo_w : t->lo, hi = ring ? t->hi_w : t->hi;
            twk_id kc = twk_kv_write(g, t->param_ids[t->m->n_w + t->n_adapter + 2 * l], k, rows);
            twk_id vc = twk_kv_write(g, t->param_ids[t->m->n_w + t->n_adapter + 2 * l + 1], v, rows);
            if (t->pass == TWK_PASS_DECODE) { /* queries read their sequence's cache rows */
                att = twk_attention_cached(g, q, kc, vc, lo, hi, scale);
            } else { /* a prompt from position 0: the training attention (GEMM blocks), the writes outputs */
                att = twk_attention(g, q, k, v, t->seg, scale);
                twk_graph_output(g, kc);
                twk_graph_output(g, vc);
            }
        } else {
            att = twk_attention(g, q, k, v, t->seg, scale);
        }
        if (window || c->attn_softcap > 0) att = twk_attention_limit(g, att, window, (float)c->attn_softcap);
        twk_id a = twk_reshape(g, att, 2, flat);
        if (c->gemma) { /* norms before and after attention and MLP; GELU-tanh MLP */
            x = twk_add(g, x, twk_rmsnorm(g, linear(t, a, M("self_attn.o_proj"), c->o_bias), W("post_attention_layernorm.weight"), eps));
            h = twk_rmsnorm(g, x, W("pre_feedforward_layernorm.weight"), eps);
            twk_id ff = twk_mul(g, twk_map(g, TWK_OP_GELU, linear(t, h, M("mlp.gate_proj"), 0)), linear(t, h, M("mlp.up_proj"), 0));
            x = twk_add(g, x, twk_rmsnorm(g, linear(t, ff, M("mlp.down_proj"), 0), W("post_feedforward_layernorm.weight"), eps));
        } else {
            x = twk_add(g, x, linear(t, a, M("self_attn.o_proj"), c->o_bias));
            h = twk_rmsnorm(g, x, W("post_attention_layernorm.weight"), eps);
            if (twk_layer_sparse(c, l)) {
                snprintf(mod, sizeof mod, "model.layers.%d", l);
                x = twk_add(g, x, moe_mlp(t, h, mod));
            } else {
                twk_id ff = twk_swiglu(g, linear(t, h, M("mlp.gate_proj"), 0), linear(t, h, M("mlp.up_proj"), 0));
                x = twk_add(g, x, linear(t, ff, M("mlp.down_proj"), 0));
            }
        }
#undef W
#undef M
    }
    if (t->recompute) twk_graph_checkpoint(g, x); /* the head after it is kept */
    twk_id h = head ? t->hidden : twk_rmsnorm(g, x, norm_w(t, weight_node(t, "model.norm.weight"), ones), eps);
    if (t->sampling && t->pass == TWK_PASS_PREFILL) { /* every row's final state: prompt scoring reads it */
        t->hidden = h;
        twk_graph_output(g, h);
    }
    if (t->sampling && !head) h = twk_get_rows(g, h, t->sel); /* only the rows that sample next */
    if (t->fused) { /* logprobs without the [T, V] logits */
        twk_id w = weight_node(t, c->tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
        if (t->dir && !t->forward_only) { /* training: two products, the backward none */
            t->logprobs = twk_unembed_dir_logprobs(g, twk_unembed_logprobs_dir(g, h, w, t->targets, 0, 0));
        } else if (t->dir) { /* the forward plan: one product, viewed twice so the ids stay the training
                                graph's (unembed_logprobs_dir, slice, reshape) */
            int64_t col[2] = {TWK_T, 1}, row[1] = {TWK_T};
            t->logprobs = twk_reshape(g, twk_reshape(g, twk_unembed_logprobs(g, h, w, t->targets), 2, col), 1, row);
        } else {
            t->logprobs = twk_unembed_logprobs(g, h, w, t->targets);
        }
        return finish_loss(t);
    }
    twk_id logits;
    if (c->tie_embeddings) {
        logits = twk_matmul(g, h, weight_node(t, "model.embed_tokens.weight"), false, true);
        twk_id A = adapter_node(t, "base_model.model.lm_head.lora_A.weight");
        twk_id B = adapter_node(t, "base_model.model.lm_head.lora_B.weight");
        if (A >= 0 && B >= 0 && t->n_slots)
            logits = twk_add(g, logits, slot_lora(t, h, A, B, t->sampling ? t->slot_sel : t->slot_in));
        else if (A >= 0 && B >= 0)
            logits = twk_add(g, logits, twk_scale(g, twk_matmul(g, twk_matmul(g, h, A, false, true), B, false, true), t->scale));
    } else {
        logits = linear(t, h, "lm_head", 0);
    }
    if (c->final_softcap > 0) /* Gemma 2: cap * tanh(logits / cap) */
        logits = twk_scale(g, twk_map(g, TWK_OP_TANH, twk_scale(g, logits, (float)(1.0 / c->final_softcap))),
                           (float)c->final_softcap);
    if (head) t->logprobs = twk_logprobs(g, logits, t->targets);
    if (t->sampling) {
        t->logits = logits;
        twk_node_set_name(g, logits, "logits");
        if (twk_graph_status(g) != TWK_OK) return twk_error(twk_graph_status(g), "%s", twk_graph_error(g));
        return TWK_OK;
    }
    t->logprobs = twk_logprobs(g, logits, t->targets);
    return finish_loss(t);
}

void twk_trainer_free(twk_trainer *t) {
    if (!t) return;
    twk_plan_free(t->fwd);
    twk_plan_free(t->fwdbwd);
    twk_plan_free(t->decode);
    for (int i = 0; i < 2; i++) {
        twk_plan_free(t->head[i].p);
        twk_graph_free(t->head[i].g);
    }
    twk_buffer_free(t->m->dev, t->arena);
    twk_graph_free(t->g);
    twk_graph_free(t->g_decode);
    for (int i = 0; i < t->n_adapter; i++) twk_buffer_free(t->m->dev, t->adapter[i].buf);
    twk_buffer_free(t->m->dev, t->inv_freq.buf);
    twk_buffer_free(t->m->dev, t->inv_freq_local.buf);
    for (int i = 0; t->kv && i < 2 * t->m->cfg.layers; i++) twk_buffer_free(t->m->dev, t->kv[i].buf);
    twk_host_free(t->kv);
    twk_host_free(t->adapter);
    twk_trainer_grads_free(t);
    twk_host_free(t->tp);
    twk_host_free(t->param_ids);
    twk_host_free(t);
}

/* The plan of t->g's outputs: compiled into *out (in `arena` when it holds the peak), or,
 * with out NULL, estimated into *est; the same bindings either way. */
/* The plan of t->g (out) or its estimate (est, out NULL); with_grads binds the gradient accumulators. */
static twk_status plan_of(twk_trainer *t, twk_plan **out, twk_plan_stats *est, twk_buffer *arena, int with_grads) {
    int n_all = t->m->n_w + t->n_adapter;
    twk_binding *b = twk_host_alloc((size_t)(n_all + 2 + 2 * t->m->cfg.layers + t->n_tp) * sizeof *b, "trainer bindings");
    twk_id *ids = twk_host_alloc((size_t)(n_all + 2 + 2 * t->m->cfg.layers + t->n_tp) * sizeof *ids, "trainer bindings");
    twk_status st = b && ids ? TWK_OK : TWK_ERR_OOM;
    for (int i = 0; st == TWK_OK && i < n_all; i++) {
        named_buf *nb = i < t->m->n_w ? &t->m->w[i] : &t->adapter[i - t->m->n_w];
        b[i] = (twk_binding){t->param_ids[i], nb->buf, 0};
    }
    int nb = n_all + 1;
    if (st == TWK_OK) b[n_all] = (twk_binding){t->inv_freq_id, t->inv_freq.buf, 0};
    if (st == TWK_OK && t->inv_freq_local.nelem) b[nb++] = (twk_binding){t->inv_freq_local_id, t->inv_freq_local.buf, 0};
    for (int i = 0; st == TWK_OK && t->sampling && i < 2 * t->m->cfg.layers; i++)
        b[nb++] = (twk_binding){t->param_ids[n_all + i], t->kv[i].buf, 0};
    if (st == TWK_OK && with_grads) nb += twk_trainer_grad_bindings(t, b + nb); /* the accumulators */
    for (int i = 0; st == TWK_OK && i < nb; i++) ids[i] = b[i].id;
    if (st == TWK_OK)
        st = out ? twk_plan_compile_in(t->g, t->m->dev, t->capacity, b, nb, arena, out)
                 : twk_plan_estimate(t->g, t->capacity, ids, nb, est);
    twk_host_free(b);
    twk_host_free(ids);
    return st;
}

static twk_status compile(twk_trainer *t, twk_plan **out, int with_grads) {
    return plan_of(t, out, NULL, NULL, with_grads);
}

/* A trainer's two plans in one arena (they never run at the same time): the caller's
 * `shared` buffer when it holds both peaks, else the trainer's own of the larger one. The
 * forward plan is compiled from the graph built again without backward (the same ids). */
static twk_status compile_train(twk_trainer *t, twk_buffer *shared) {
    size_t need = t->est_fwd.arena_bytes > t->est_fwdbwd.arena_bytes ? t->est_fwd.arena_bytes : t->est_fwdbwd.arena_bytes;
    twk_buffer *arena = shared;
    twk_status st = TWK_OK;
    if (need && (!arena || twk_buffer_size(arena) < need)) {
        twk_device_pool pool = twk_device_pool_enter(TWK_DPOOL_ACTIVATIONS);
        st = twk_buffer_alloc(t->m->dev, need, &t->arena);
        twk_device_pool_enter(pool);
        arena = t->arena;
    }
    if (st == TWK_OK) st = plan_of(t, &t->fwdbwd, NULL, arena, 1);
    if (st != TWK_OK) return st;
    twk_graph *train = t->g;
    twk_id lp = t->logprobs, loss = t->loss, aux = t->aux, objective = t->objective, coef = t->aux_coef;
    t->g = twk_graph_new();
    t->forward_only = 1;
    st = t->g ? build(t) : TWK_ERR_OOM;
    t->forward_only = 0;
    if (st == TWK_OK && (t->logprobs != lp || t->loss != loss || t->aux != aux))
        st = twk_error(TWK_ERR_STATE, "trainer: the forward graph was built differently the second time");
    if (st == TWK_OK) {
        twk_graph_output(t->g, t->logprobs);
        twk_graph_output(t->g, t->loss);
        if (t->aux >= 0) twk_graph_output(t->g, t->aux);
        st = plan_of(t, &t->fwd, NULL, arena, 0);
    }
    twk_graph_free(t->g);
    t->g = train;
    t->objective = objective;
    t->aux_coef = coef;
    return st;
}

static twk_status trainer_create(twk_model *m, const twk_lora_config *lora, int64_t capacity, int sampling,
                                 int max_seqs, int64_t max_len, int n_slots, int slot_rank, const twk_trainer_opts *o,
                                 int dry, twk_trainer **out);

twk_status twk_trainer_score_head(twk_trainer *t, int which, twk_score_head **out) {
    twk_score_head *hd = &t->head[which];
    *out = hd->p ? hd : NULL;
    if (hd->p) return TWK_OK;
    const twk_model_config *c = &t->m->cfg;
    int adapter = adapter_node(t, "base_model.model.lm_head.lora_A.weight") >= 0;
    if (which == 0 && (adapter || c->final_softcap > 0 || !twk_mem_fused_unembed(t->m->dev, twk_dtype_name(twk_model_dtype(t->m)))))
        return TWK_OK;
    /* build() in head mode on a graph of its own; the decode graph's ids stay in t */
    twk_graph *keep = t->g;
    twk_id logits = t->logits, logprobs = t->logprobs, loss = t->loss, hidden = t->hidden;
    int64_t cap = t->capacity;
    int fused = t->fused;
    t->pass = TWK_PASS_HEAD;
    t->fused = which == 0;
    /* the fused kernel tiles the rows itself; logits are held for a tile of rows at a time */
    t->capacity = which == 0 ? t->max_len : TWK_UNEMBED_TILE_ROWS((int64_t)c->vocab, t->max_len);
    t->g = twk_graph_new();
    twk_status st = t->g ? build(t) : TWK_ERR_OOM;
    if (st == TWK_OK) {
        twk_graph_output(t->g, t->logprobs);
        if (which == 1) twk_graph_output(t->g, t->logits);
        st = compile(t, &hd->p, 0);
    }
    hd->g = t->g;
    hd->hidden = t->hidden;
    hd->logits = which == 1 ? t->logits : -1;
    hd->logprobs = t->logprobs;
    hd->rows = t->capacity;
    t->g = keep;
    t->logits = logits;
    t->logprobs = logprobs;
    t->loss = loss;
    t->hidden = hidden;
    t->capacity = cap;
    t->fused = fused;
    t->pass = TWK_PASS_DECODE;
    if (st != TWK_OK) {
        twk_plan_free(hd->p);
        twk_graph_free(hd->g);
        memset(hd, 0, sizeof *hd);
        return st;
    }
    *out = hd;
    return TWK_OK;
}

twk_status twk_trainer_new(twk_model *m, const twk_lora_config *lora, int64_t capacity, twk_trainer **out) {
    return twk_trainer_create(m, lora, capacity, 0, 0, 0, out);
}

twk_status twk_trainer_new_opts(twk_model *m, const twk_lora_config *lora, int64_t capacity,
                                const twk_trainer_opts *o, twk_trainer **out) {
    return trainer_create(m, lora, capacity, 0, 0, 0, 0, 0, o, 0, out);
}

twk_status twk_trainer_create_dry(twk_model *m, const twk_lora_config *lora, int64_t capacity,
                                  const twk_trainer_opts *o, twk_trainer **out) {
    return trainer_create(m, lora, capacity, 0, 0, 0, 0, 0, o, 1, out);
}

static twk_status make_kv(twk_trainer *t) {
    const twk_model_config *c = &t->m->cfg;
    t->kv = twk_host_calloc((size_t)(2 * c->layers) * sizeof *t->kv, "kv caches");
    if (!t->kv) return TWK_ERR_OOM;
    for (int i = 0; i < 2 * c->layers; i++) {
        named_buf *nb = &t->kv[i];
        snprintf(nb->name, sizeof nb->name, "kv_cache.%d.%c", i / 2, i % 2 ? 'v' : 'k');
        nb->ndim = 3;
        nb->nelem = twk_kv_layer_rows(c, i / 2, t->max_seqs, t->max_len) * c->kv_heads * c->head_dim;
        nb->dtype = twk_model_kv_dtype(t->m);
        twk_status st = twk_buffer_alloc(t->m->dev, nb_bytes(nb), &nb->buf);
        if (st != TWK_OK) return st;
    }
    return TWK_OK;
}

twk_status twk_trainer_create(twk_model *m, const twk_lora_config *lora, int64_t capacity, int sampling, int max_seqs,
                              int64_t max_len, twk_trainer **out) {
    return trainer_create(m, lora, capacity, sampling, max_seqs, max_len, 0, 0, NULL, 0, out);
}

twk_status twk_trainer_create_slots(twk_model *m, int n_slots, int slot_rank, int max_seqs, int64_t max_len,
                                    twk_trainer **out) {
    if (n_slots < 1 || n_slots > 64 || slot_rank < 1 || slot_rank > 4096)
        return twk_error(TWK_ERR_INVALID_ARG, "sampler: %d adapter slots of rank %d are out of range", n_slots, slot_rank);
    twk_lora_config lc = twk_lora_default();
    lc.rank = slot_rank;
    lc.alpha = (float)slot_rank; /* the scale is folded into each slot's B */
    lc.train_attn = lc.train_mlp = lc.train_unembed = 1;
    int64_t cap = max_len > max_seqs ? max_len : max_seqs;
    return trainer_create(m, &lc, cap, 1, max_seqs, max_len, n_slots, slot_rank, NULL, 0, out);
}

twk_status twk_trainer_create_packed(twk_model *m, const twk_lora_config *modules, int n_slots, int slot_rank,
                                     int64_t capacity, twk_trainer **out) {
    if (!modules || n_slots < 1 || n_slots > 4096 || slot_rank < 1 || slot_rank > 4096)
        return twk_error(TWK_ERR_INVALID_ARG, "packed trainer: %d adapter slots of rank %d are out of range", n_slots, slot_rank);
    twk_lora_config lc = *modules;
    lc.rank = slot_rank;
    lc.alpha = (float)slot_rank; /* unused: each token carries its run's scale */
    return trainer_create(m, &lc, capacity, 0, 0, 0, n_slots, slot_rank, NULL, 0, out);
}

static twk_status trainer_create(twk_model *m, const twk_lora_config *lora, int64_t capacity, int sampling,
                                 int max_seqs, int64_t max_len, int n_slots, int slot_rank, const twk_trainer_opts *o,
                                 int dry, twk_trainer **out) {
    if (!out) return twk_error(TWK_ERR_INVALID_ARG, "trainer_new: out is NULL");
    *out = NULL;
    if (!m || capacity < 1) return twk_error(TWK_ERR_INVALID_ARG, "trainer_new: NULL model or capacity < 1");
    if (lora && (lora->rank < 1 || lora->rank > 4096 || !(lora->alpha > 0)))
        return twk_error(TWK_ERR_INVALID_ARG, "trainer_new: lora rank %d must be in 1..4096 and alpha > 0", lora->rank);
    if (lora && !lora->train_attn && !lora->train_mlp && !lora->train_unembed && !lora->train_experts && !lora->train_router)
        return twk_error(TWK_ERR_INVALID_ARG, "trainer_new: lora targets nothing (train_attn, train_mlp, train_unembed, "
                                              "train_experts, train_router all off)");
    if (lora && n_slots && !sampling && m->cfg.n_experts > 0 && (lora->train_experts || lora->train_router))
        return twk_error(TWK_ERR_UNSUPPORTED, "packed trainer: LoRA on the experts or the router (train_experts, "
                                              "train_router) has no adapter slots; train such a run on its own trainer");
    if (sampling && (max_seqs < 1 || max_len < 2 || (double)max_seqs * (double)max_len > 1e8))
        return twk_error(TWK_ERR_INVALID_ARG, "sampler: max_seqs %d x max_len %lld is out of range", max_seqs,
                         (long long)max_len);
    if (!lora && !sampling && twk_model_dtype(m) != TWK_F32)
        return twk_error(TWK_ERR_UNSUPPORTED, "trainer_new: full-parameter training needs f32 weights; this model's are %s "
                         "(load it with --dtype f32)", twk_dtype_name(twk_model_dtype(m)));
    twk_trainer *t = twk_host_calloc(sizeof *t, "trainer");
    if (!t) return TWK_ERR_OOM;
    t->m = m;
    t->capacity = capacity;
    t->sampling = sampling;
    t->max_seqs = max_seqs;
    t->max_len = max_len;
    t->n_slots = n_slots;
    t->slot_rank = slot_rank;
    t->lora = lora != NULL;
    t->dry = dry;
    t->recompute = o && o->recompute && !sampling;
    t->early_grads = o && o->early_grads && !sampling;
    /* the fused unembedding where the lm_head is frozen and the backend has it */
    t->fused = !sampling && lora && !lora->train_unembed && !(o && o->logits) && !(m->cfg.final_softcap > 0) &&
               (dry || twk_mem_fused_unembed(m->dev, twk_dtype_name(twk_model_dtype(m))));
    t->dir = t->fused && !(o && o->unembed_recompute) && (dry || twk_mem_dir_unembed(m->dev, twk_dtype_name(twk_model_dtype(m))));
    if (lora) {
        t->lc = *lora;
        t->scale = lora->alpha / (float)lora->rank;
    }
    twk_status st = TWK_OK;
    /* the pools of the adapter and its gradients: a sampler's, a packed pass's slots, or a run's */
    twk_device_pool own = sampling ? TWK_DPOOL_SAMPLER_ADAPTERS : n_slots ? TWK_DPOOL_PACK_SLOTS : TWK_DPOOL_ADAPTERS;
    if (t->lora) {
        twk_device_pool pool = twk_device_pool_enter(own);
        st = make_adapter(t);
        twk_device_pool_enter(pool);
        if (st == TWK_OK && !t->n_adapter) /* e.g. only train_router / train_experts on a dense model */
            st = twk_error(TWK_ERR_INVALID_ARG, "trainer_new: lora targets no module of this model (train_experts and "
                                                "train_router need a mixture of experts)");
    }
    int half = m->cfg.head_dim / 2;
    float f[4096];
    if (st == TWK_OK && half > 4096) st = twk_error(TWK_ERR_UNSUPPORTED, "trainer_new: head_dim %d too large", m->cfg.head_dim);
    for (int local = 0; local < 1 + twk_rope_has_local(&m->cfg) && st == TWK_OK; local++) {
        named_buf *fb = local ? &t->inv_freq_local : &t->inv_freq;
        fb->nelem = half;
        if (dry) continue;
        twk_rope_inv_freq(&m->cfg, local, f);
        st = twk_buffer_alloc(m->dev, nb_bytes(fb), &fb->buf);
        if (st == TWK_OK) st = twk_buffer_upload(m->dev, fb->buf, 0, f, nb_bytes(fb));
    }
    if (st == TWK_OK && sampling) {
        twk_device_pool pool = twk_device_pool_enter(TWK_DPOOL_KV_CACHE);
        st = make_kv(t);
        twk_device_pool_enter(pool);
    }
    if (st == TWK_OK && !(t->g = twk_graph_new())) st = TWK_ERR_OOM;
    if (st == TWK_OK) st = build(t);
    if (st == TWK_OK && sampling) { /* the prefill plan, then the decode plan (same node ids) */
        twk_graph_output(t->g, t->logits);
        st = compile(t, &t->fwd, 0);
        t->prefill_logits = t->logits;
        twk_graph *prefill = t->g;
        t->pass = TWK_PASS_DECODE;
        t->g = twk_graph_new();
        if (st == TWK_OK && !t->g) st = TWK_ERR_OOM;
        if (st == TWK_OK) st = build(t);
        if (st == TWK_OK) {
            twk_graph_output(t->g, t->logits);
            st = compile(t, &t->decode, 0);
        }
        t->g_decode = t->g;
        t->g = prefill;
        /* the adapter's tensors are settable by name (no gradients) */
        if (st == TWK_OK && t->n_adapter) {
            t->tp = twk_host_calloc((size_t)t->n_adapter * sizeof *t->tp, "sampler adapter");
            if (!t->tp) st = TWK_ERR_OOM;
            for (int i = 0; st == TWK_OK && i < t->n_adapter; i++) {
                t->tp[i].nb = &t->adapter[i];
                t->tp[i].id = t->param_ids[m->n_w + i];
                t->tp[i].grad = -1;
            }
            if (st == TWK_OK) t->n_tp = t->n_adapter;
        }
        if (st != TWK_OK) {
            twk_trainer_free(t);
            return st;
        }
        *out = t;
        return TWK_OK;
    }
    if (st == TWK_OK) {
        twk_graph_output(t->g, t->logprobs);
        twk_graph_output(t->g, t->loss);
        if (t->aux >= 0) twk_graph_output(t->g, t->aux);
        st = plan_of(t, NULL, &t->est_fwd, NULL, 0);
    }
    if (st == TWK_OK) st = twk_graph_backward(t->g, t->objective);
    if (st == TWK_OK) {
        int n_all = m->n_w + t->n_adapter;
        t->tp = twk_host_calloc((size_t)n_all * sizeof *t->tp, "trainer params");
        if (!t->tp) st = TWK_ERR_OOM;
        for (int i = 0; st == TWK_OK && i < n_all; i++) {
            twk_id g = twk_graph_grad(t->g, t->param_ids[i]);
            if (g < 0) continue;
            tparam *p = &t->tp[t->n_tp++];
            p->nb = i < m->n_w ? &m->w[i] : &t->adapter[i - m->n_w];
            p->id = t->param_ids[i];
            p->grad = g;
        }
    }
    if (st == TWK_OK) {
        twk_device_pool pool = twk_device_pool_enter(own);
        st = twk_trainer_grads_init(t);
        twk_device_pool_enter(pool);
    }
    if (st == TWK_OK && t->recompute) st = twk_graph_recompute(t->g);
    /* early_grads: each gradient's accumulation right after the gradient, so a step's last pass can
     * hand groups of final gradients out while the rest of its backward runs (grad_hook.c). Never
     * in a packed trainer (n_slots), whose pass reads the gradients themselves after it ends
     * (lora_pack.c): there the accumulation at the end keeps them live */
    for (int i = 0; st == TWK_OK && t->early_grads && !t->n_slots && i < t->n_tp; i++) {
        st = twk_graph_hoist(t->g, t->tp[i].acc); /* the accumulator leaf (made after the backward) first */
        if (st == TWK_OK) st = twk_graph_hoist(t->g, t->tp[i].acc_op);
    }
    if (st == TWK_OK) st = plan_of(t, NULL, &t->est_fwdbwd, NULL, 1);
    if (st == TWK_OK && !dry) st = compile_train(t, o ? o->arena : NULL);
    if (st == TWK_OK && !dry) st = twk_trainer_optim_plan(t);
    if (st != TWK_OK) {
        twk_trainer_free(t);
        return st;
    }
    *out = t;
    return TWK_OK;
}

twk_status twk_trainer_bind_batch(twk_trainer *t, twk_plan *p, const twk_batch *b) {
    if (!b || b->n < 1 || b->n > t->capacity)
        return twk_error(TWK_ERR_INVALID_ARG, "batch: %lld tokens outside 1..%lld", b ? (long long)b->n : 0LL,
                         (long long)t->capacity);
    if (!b->tokens || !b->targets || !b->positions || !b->seg_start || !b->weights)
        return twk_error(TWK_ERR_INVALID_ARG, "batch: tokens, targets, positions, seg_start and weights are required");
    for (int64_t i = 0; i < b->n; i++) {
        if (!isfinite(b->weights[i]))
            return twk_error(TWK_ERR_INVALID_ARG, "batch: weights[%lld] is not finite", (long long)i);
        if (b->positions[i] < 0)
            return twk_error(TWK_ERR_INVALID_ARG, "batch: positions[%lld] = %d is negative", (long long)i, b->positions[i]);
    }
    size_t n = (size_t)b->n;
    twk_status st = twk_plan_write(p, t->tokens, b->n, b->tokens, n * sizeof *b->tokens);
    if (st == TWK_OK) st = twk_plan_write(p, t->targets, b->n, b->targets, n * sizeof *b->targets);
    if (st == TWK_OK) st = twk_plan_write(p, t->positions, b->n, b->positions, n * sizeof *b->positions);
    if (st == TWK_OK) st = twk_plan_write(p, t->seg, b->n, b->seg_start, n * sizeof *b->seg_start);
    if (st == TWK_OK) st = twk_plan_write(p, t->weights, b->n, b->weights, n * sizeof *b->weights);
    if (st == TWK_OK && p == t->fwdbwd && t->aux_coef >= 0 && !t->n_slots) { /* the load-balancing loss's weight (lora_pack.c: per run) */
        float coef = t->aux_off ? 0.0f : (float)t->m->cfg.router_aux_coef;
        st = twk_plan_write(p, t->aux_coef, 1, &coef, sizeof coef);
    }
    return st;
}

twk_status twk_trainer_note_aux(twk_trainer *t, twk_plan *p, int64_t n) {
    if (t->aux < 0) return TWK_OK;
    float v = 0;
    twk_status st = twk_plan_read(p, t->aux, n, &v, sizeof v);
    if (st == TWK_OK) t->aux_sum += v, t->aux_n++;
    return st;
}

double twk_trainer_router_aux_loss(twk_trainer *t, bool reset) {
    if (!t || t->aux < 0 || !t->aux_n) return NAN;
    double v = t->aux_sum / (double)t->aux_n;
    if (reset) t->aux_sum = 0, t->aux_n = 0;
    return v;
}

/* note_aux: the pass counts in router_aux_loss (not the base model's reference passes) */
static twk_status run(twk_trainer *t, twk_plan *p, const twk_batch *b, float *logprobs, float *loss, int note_aux) {
    twk_status st = twk_trainer_bind_batch(t, p, b);
    if (st == TWK_OK) st = twk_plan_run(p, b->n);
    if (st == TWK_OK && logprobs) st = twk_plan_read(p, t->logprobs, b->n, logprobs, (size_t)b->n * sizeof *logprobs);
    if (st == TWK_OK && loss) st = twk_plan_read(p, t->loss, b->n, loss, sizeof *loss);
    if (st == TWK_OK && note_aux) st = twk_trainer_note_aux(t, p, b->n);
    return st;
}

twk_status twk_trainer_forward(twk_trainer *t, const twk_batch *b, float *logprobs, float *loss) {
    if (!t) return twk_error(TWK_ERR_INVALID_ARG, "trainer_forward: NULL trainer");
    return run(t, t->fwd, b, logprobs, loss, 1);
}

twk_status twk_trainer_forward_base(twk_trainer *t, const twk_batch *b, float *logprobs, float *loss) {
    if (!t) return twk_error(TWK_ERR_INVALID_ARG, "trainer_forward_base: NULL trainer");
    if (!twk_trainer_lora(t))
        return twk_error(TWK_ERR_INVALID_ARG, "trainer_forward_base: full-parameter training has no adapter to turn off");
    /* the adapter's delta is scale * B A: every B is copied aside on the device, zeroed, run, put back */
    twk_device *dev = t->m->dev;
    twk_buffer **keep = twk_host_calloc((size_t)t->n_adapter * sizeof *keep, "adapter B copies");
    twk_status st = keep ? TWK_OK : twk_error(TWK_ERR_OOM, "trainer_forward_base: out of memory");
    int saved = 0;
    for (int i = 0; st == TWK_OK && i < t->n_adapter; i++, saved = i) {
        named_buf *nb = &t->adapter[i];
        if (!strstr(nb->name, ".lora_B.")) continue;
        twk_buffer *copy = NULL;
        st = twk_buffer_alloc(dev, nb_bytes(nb), &copy);
        if (st == TWK_OK) st = twk_buffer_copy(dev, copy, 0, nb->buf, 0, nb_bytes(nb));
        if (st == TWK_OK) keep[i] = copy, copy = NULL; /* restored below even if zeroing fails */
        twk_buffer_free(dev, copy);
        if (st == TWK_OK) st = twk_buffer_zero(dev, nb->buf, 0, nb_bytes(nb));
    }
    if (st == TWK_OK) saved = t->n_adapter, st = run(t, t->fwd, b, logprobs, loss, 0);
    for (int i = 0; keep && i < saved; i++) {
        if (!keep[i]) continue;
        named_buf *nb = &t->adapter[i];
        twk_status rs = twk_buffer_copy(dev, nb->buf, 0, keep[i], 0, nb_bytes(nb));
        if (st == TWK_OK) st = rs;
        twk_buffer_free(dev, keep[i]);
    }
    twk_host_free(keep);
    return st;
}

twk_status twk_trainer_forward_backward(twk_trainer *t, const twk_batch *b, float *logprobs, float *loss) {
    if (!t) return twk_error(TWK_ERR_INVALID_ARG, "trainer_forward_backward: NULL trainer");
    twk_status st = twk_trainer_grads_to_device(t);
    return st == TWK_OK ? run(t, t->fwdbwd, b, logprobs, loss, 1) : st; /* the plan adds to the accumulators */
}

int twk_trainer_param_count(const twk_trainer *t) { return t ? t->n_tp : 0; }

const char *twk_trainer_param_name(const twk_trainer *t, int i, int64_t *nelem) {
    if (!t || i < 0 || i >= t->n_tp) return NULL;
    if (nelem) *nelem = t->tp[i].nb->nelem;
    return t->tp[i].nb->name;
}

static tparam *find_tp(twk_trainer *t, const char *name, int64_t nelem, twk_status *st) {
    for (int i = 0; t && name && i < t->n_tp; i++) {
        if (strcmp(t->tp[i].nb->name, name)) continue;
        if (t->tp[i].nb->nelem != nelem) {
            *st = twk_error(TWK_ERR_INVALID_ARG, "trainer: '%s' has %lld elements, not %lld", name,
                            (long long)t->tp[i].nb->nelem, (long long)nelem);
            return NULL;
        }
        return &t->tp[i];
    }
    *st = twk_error(TWK_ERR_NOT_FOUND, "trainer: no trainable tensor '%s'", name ? name : "(null)");
    return NULL;
}

twk_status twk_trainer_get(twk_trainer *t, const char *name, float *dst, int64_t nelem) {
    twk_status st = TWK_OK;
    tparam *p = find_tp(t, name, nelem, &st);
    return p ? twk_buffer_download(t->m->dev, p->nb->buf, 0, dst, nb_bytes(p->nb)) : st;
}

twk_status twk_trainer_set(twk_trainer *t, const char *name, const float *src, int64_t nelem) {
    twk_status st = TWK_OK;
    tparam *p = find_tp(t, name, nelem, &st);
    return p ? twk_buffer_upload(t->m->dev, p->nb->buf, 0, src, nb_bytes(p->nb)) : st;
}

const twk_lora_config *twk_trainer_lora(const twk_trainer *t) { return t && t->lora ? &t->lc : NULL; }
const twk_model *twk_trainer_model(const twk_trainer *t) { return t ? t->m : NULL; }
