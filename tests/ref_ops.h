/* Float64 reference implementations of every forward op, for the op tests.
 * Tensors are dense row-major doubles; ids are stored as doubles. */
#ifndef TWK_REF_OPS_H
#define TWK_REF_OPS_H

#include <stdint.h>

typedef struct rt {
    int ndim;
    int64_t ne[4];
    double *d;
} rt;

int64_t rt_nelem(const rt *t);

void ref_add(const rt *a, const rt *b, rt *y);
void ref_mul(const rt *a, const rt *b, rt *y);
void ref_scale(const rt *x, double s, rt *y);
void ref_silu(const rt *x, rt *y);
void ref_swiglu(const rt *g, const rt *u, rt *y);
void ref_sum(const rt *x, rt *y);
void ref_mean(const rt *x, rt *y);
void ref_weighted_sum(const rt *x, const rt *w, rt *y);
void ref_matmul(const rt *a, const rt *b, int ta, int tb, rt *y);
void ref_get_rows(const rt *table, const rt *ids, rt *y);
void ref_rmsnorm(const rt *x, const rt *w, double eps, rt *y);
/* inv_freq may be NULL: theta^(-2i/D). */
void ref_rope(const rt *x, const rt *pos, const rt *inv_freq, double theta, rt *y);
/* window > 0: query i sees keys i - window < j <= i; cap > 0: scores cap * tanh(s / cap) */
void ref_attention(const rt *q, const rt *k, const rt *v, const rt *seg, double scale, int window, double cap, rt *y);
void ref_logprobs(const rt *logits, const rt *targets, rt *y);
/* unembed_logprobs_dir: h [T, H], w [V, H], targets [T] -> y [T, H + 1]: per token
 * w[target] - softmax(h w^T) w, then log_softmax(h w^T)[target] */
void ref_unembed_dir(const rt *h, const rt *w, const rt *targets, rt *y);
void ref_permute(const rt *x, const int *perm, rt *y);
void ref_slice(const rt *x, int axis, int64_t start, rt *y);
void ref_concat(const rt *a, const rt *b, int axis, rt *y);
void ref_copy(const rt *x, rt *y); /* reshape */
void ref_kv_write(const rt *cache, const rt *x, const rt *rows, rt *y);
void ref_lora_gather(const rt *x, const rt *w, const rt *slot, rt *y);
/* lora_gather's weight gradient: y [S, N, K] (S from y) summed per slot over tokens */
void ref_lora_gather_back(const rt *x, const rt *dy, const rt *slot, rt *y);
/* window > 0: the last `window` rows of [lo, hi); cap as ref_attention */
void ref_attn_cache(const rt *q, const rt *kc, const rt *vc, const rt *lo, const rt *hi, double scale, int window,
                    double cap, rt *y);
/* The optimizer step (ops.h's twk_hyper vector): slices' sums of squares as (sum, 0) pairs,
 * (norm, clip coefficient), and the AdamW update of w. */
void ref_sqsum_parts(const rt *x, int64_t parts, rt *y);
void ref_grad_norm(const rt *parts, const rt *hyper, rt *y);
void ref_adamw(const rt *w, const rt *grad, const rt *m, const rt *v, const rt *hyper, const rt *norm, rt *y);

/* ---- mixture of experts (logits [T, E], ids [T, K] as doubles) ---- */
/* ids: each row's k largest logits, largest first, ties to the lower index. */
void ref_moe_topk(const rt *logits, int k, rt *ids);
/* softmax(logits)[t, ids[t, j]] (renormalised over j when renorm) -> [T, K]. */
void ref_moe_gate(const rt *logits, const rt *ids, int renorm, rt *y);
/* The T*K pairs grouped by expert (stable): order[r] = pair of grouped row r, inv[p] = row of
 * pair p, slot[r] = expert of row r (any may be NULL); E experts. */
void ref_moe_sort(const rt *ids, int64_t E, double *order, double *inv, double *slot);
/* Row r = x[order[r] / K] -> [T*K, H]. */
void ref_moe_dispatch(const rt *x, const double *order, int64_t K, rt *y);
/* out[t] = sum_j w[t, j] y[inv[t*K + j]] (w NULL: 1) -> [T, H]. */
void ref_moe_combine(const rt *y, const double *inv, const rt *w, int64_t K, rt *out);
/* [2, E]: choices of each expert / T, mean softmax over the rows. */
void ref_moe_router_stats(const rt *logits, const rt *ids, rt *y);
/* The same per slot, [S, 2, E] (S from y): rows whose slot is outside 0..S-1 count nowhere. */
void ref_moe_router_stats_slots(const rt *logits, const rt *ids, const rt *slot, rt *y);

#endif
