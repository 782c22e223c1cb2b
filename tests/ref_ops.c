/* Float64 references for the op tests: plain loops, written for clarity. */
#include "ref_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int64_t rt_nelem(const rt *t) {
    int64_t e = 1;
    for (int i = 0; i < t->ndim; i++) e *= t->ne[i];
    return e;
}

/* index of b (right-aligned broadcast) for flat index i of a */
static int64_t bcast_index(const rt *a, const rt *b, int64_t i) {
    int64_t idx[4] = {0}, rem = i;
    for (int d = a->ndim - 1; d >= 0; d--) {
        idx[d] = rem % a->ne[d];
        rem /= a->ne[d];
    }
    int64_t j = 0;
    int off = a->ndim - b->ndim;
    for (int d = 0; d < b->ndim; d++) j = j * b->ne[d] + (b->ne[d] == 1 ? 0 : idx[d + off]);
    return j;
}

void ref_add(const rt *a, const rt *b, rt *y) {
    for (int64_t i = 0; i < rt_nelem(a); i++) y->d[i] = a->d[i] + b->d[bcast_index(a, b, i)];
}

void ref_mul(const rt *a, const rt *b, rt *y) {
    for (int64_t i = 0; i < rt_nelem(a); i++) y->d[i] = a->d[i] * b->d[bcast_index(a, b, i)];
}

void ref_scale(const rt *x, double s, rt *y) {
    for (int64_t i = 0; i < rt_nelem(x); i++) y->d[i] = x->d[i] * s;
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

void ref_silu(const rt *x, rt *y) {
    for (int64_t i = 0; i < rt_nelem(x); i++) y->d[i] = x->d[i] * sigmoid(x->d[i]);
}

void ref_swiglu(const rt *g, const rt *u, rt *y) {
    for (int64_t i = 0; i < rt_nelem(g); i++) y->d[i] = g->d[i] * sigmoid(g->d[i]) * u->d[i];
}

void ref_sum(const rt *x, rt *y) {
    double s = 0;
    for (int64_t i = 0; i < rt_nelem(x); i++) s += x->d[i];
    y->d[0] = s;
}

void ref_mean(const rt *x, rt *y) {
    ref_sum(x, y);
    y->d[0] /= (double)rt_nelem(x);
}

void ref_weighted_sum(const rt *x, const rt *w, rt *y) {
    double s = 0;
    for (int64_t i = 0; i < rt_nelem(x); i++) s += x->d[i] * w->d[i];
    y->d[0] = s;
}

void ref_matmul(const rt *a, const rt *b, int ta, int tb, rt *y) {
    int r = a->ndim;
    int64_t batch = r == 3 ? a->ne[0] : 1;
    int64_t M = y->ne[r - 2], N = y->ne[r - 1], K = ta ? a->ne[r - 2] : a->ne[r - 1];
    for (int64_t bt = 0; bt < batch; bt++) {
        const double *A = a->d + bt * M * K, *B = b->d + bt * K * N;
        double *C = y->d + bt * M * N;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++)
                    s += (ta ? A[k * M + m] : A[m * K + k]) * (tb ? B[n * K + k] : B[k * N + n]);
                C[m * N + n] = s;
            }
    }
}

void ref_get_rows(const rt *table, const rt *ids, rt *y) {
    int64_t D = table->ne[1];
    for (int64_t t = 0; t < ids->ne[0]; t++)
        memcpy(y->d + t * D, table->d + (int64_t)ids->d[t] * D, (size_t)D * sizeof(double));
}

void ref_rmsnorm(const rt *x, const rt *w, double eps, rt *y) {
    int64_t D = x->ne[x->ndim - 1], R = rt_nelem(x) / D;
    for (int64_t r = 0; r < R; r++) {
        double ss = 0;
        for (int64_t i = 0; i < D; i++) ss += x->d[r * D + i] * x->d[r * D + i];
        double rs = 1.0 / sqrt(ss / (double)D + eps);
        for (int64_t i = 0; i < D; i++) y->d[r * D + i] = x->d[r * D + i] * rs * w->d[i];
    }
}

void ref_rope(const rt *x, const rt *pos, const rt *inv_freq, double theta, rt *y) {
    int64_t T = x->ne[0], H = x->ne[1], D = x->ne[2], half = D / 2;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < half; i++) {
                double f = inv_freq ? inv_freq->d[i] : pow(theta, -(double)(2 * i) / (double)D);
                double a = pos->d[t] * f, c = cos(a), s = sin(a);
                const double *xr = x->d + (t * H + h) * D;
                double *yr = y->d + (t * H + h) * D;
                yr[i] = xr[i] * c - xr[i + half] * s;
                yr[i + half] = xr[i + half] * c + xr[i] * s;
            }
}

/* a score soft-capped as transformers' Gemma: cap * tanh(s / cap) (cap 0: none) */
static double softcap(double s, double cap) { return cap > 0 ? cap * tanh(s / cap) : s; }

void ref_attention(const rt *q, const rt *k, const rt *v, const rt *seg, double scale, int window, double cap, rt *y) {
    int64_t T = q->ne[0], Hq = q->ne[1], D = q->ne[2], Hkv = k->ne[1], grp = Hq / Hkv;
    double sc[4096];
    for (int64_t i = 0; i < T; i++)
        for (int64_t h = 0; h < Hq; h++) {
            int64_t s0 = (int64_t)seg->d[i], hk = h / grp;
            if (window > 0 && i - window + 1 > s0) s0 = i - window + 1; /* transformers: kv > q - window */
            double m = -INFINITY;
            for (int64_t j = s0; j <= i; j++) {
                double s = 0;
                for (int64_t d = 0; d < D; d++) s += q->d[(i * Hq + h) * D + d] * k->d[(j * Hkv + hk) * D + d];
                sc[j - s0] = softcap(s * scale, cap);
                if (sc[j - s0] > m) m = sc[j - s0];
            }
            double z = 0;
            for (int64_t j = s0; j <= i; j++) z += (sc[j - s0] = exp(sc[j - s0] - m));
            for (int64_t d = 0; d < D; d++) {
                double o = 0;
                for (int64_t j = s0; j <= i; j++) o += sc[j - s0] / z * v->d[(j * Hkv + hk) * D + d];
                y->d[(i * Hq + h) * D + d] = o;
            }
        }
}

void ref_logprobs(const rt *logits, const rt *targets, rt *y) {
    int64_t T = logits->ne[0], V = logits->ne[1];
    for (int64_t t = 0; t < T; t++) {
        const double *x = logits->d + t * V;
        double m = -INFINITY, z = 0;
        for (int64_t i = 0; i < V; i++) m = x[i] > m ? x[i] : m;
        for (int64_t i = 0; i < V; i++) z += exp(x[i] - m);
        y->d[t] = x[(int64_t)targets->d[t]] - m - log(z);
    }
}

void ref_unembed_dir(const rt *h, const rt *w, const rt *targets, rt *y) {
    int64_t T = h->ne[0], H = h->ne[1], V = w->ne[0];
    double *z = malloc((size_t)V * sizeof *z);
    for (int64_t t = 0; t < T; t++) {
        double m = -INFINITY, s = 0, *yr = y->d + t * (H + 1);
        int64_t tgt = (int64_t)targets->d[t];
        for (int64_t v = 0; v < V; v++) {
            double d = 0;
            for (int64_t k = 0; k < H; k++) d += h->d[t * H + k] * w->d[v * H + k];
            z[v] = d;
            m = d > m ? d : m;
        }
        for (int64_t v = 0; v < V; v++) s += exp(z[v] - m);
        for (int64_t k = 0; k < H; k++) yr[k] = w->d[tgt * H + k];
        for (int64_t v = 0; v < V; v++) {
            double p = exp(z[v] - m) / s;
            for (int64_t k = 0; k < H; k++) yr[k] -= p * w->d[v * H + k];
        }
        yr[H] = z[tgt] - m - log(s);
    }
    free(z);
}

void ref_permute(const rt *x, const int *perm, rt *y) {
    int n = x->ndim;
    int64_t st[4];
    st[n - 1] = 1;
    for (int i = n - 2; i >= 0; i--) st[i] = st[i + 1] * x->ne[i + 1];
    int64_t N = rt_nelem(x);
    for (int64_t o = 0; o < N; o++) {
        int64_t rem = o, src = 0;
        for (int d = n - 1; d >= 0; d--) {
            int64_t idx = rem % y->ne[d];
            rem /= y->ne[d];
            src += idx * st[perm[d]];
        }
        y->d[o] = x->d[src];
    }
}

static void copy_block(const rt *src, rt *dst, int axis, int64_t s_start, int64_t d_start, int64_t len) {
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < axis; i++) outer *= dst->ne[i];
    for (int i = axis + 1; i < dst->ndim; i++) inner *= dst->ne[i];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t l = 0; l < len; l++)
            for (int64_t k = 0; k < inner; k++)
                dst->d[(o * dst->ne[axis] + d_start + l) * inner + k] =
                    src->d[(o * src->ne[axis] + s_start + l) * inner + k];
}

void ref_slice(const rt *x, int axis, int64_t start, rt *y) { copy_block(x, y, axis, start, 0, y->ne[axis]); }

void ref_concat(const rt *a, const rt *b, int axis, rt *y) {
    copy_block(a, y, axis, 0, 0, a->ne[axis]);
    copy_block(b, y, axis, 0, a->ne[axis], b->ne[axis]);
}

void ref_copy(const rt *x, rt *y) { memcpy(y->d, x->d, (size_t)rt_nelem(x) * sizeof(double)); }

void ref_kv_write(const rt *cache, const rt *x, const rt *rows, rt *y) {
    int64_t row = cache->ne[1] * cache->ne[2];
    memcpy(y->d, cache->d, (size_t)rt_nelem(cache) * sizeof(double));
    for (int64_t t = 0; t < x->ne[0]; t++)
        memcpy(y->d + (int64_t)rows->d[t] * row, x->d + t * row, (size_t)row * sizeof(double));
}

void ref_attn_cache(const rt *q, const rt *kc, const rt *vc, const rt *lo, const rt *hi, double scale, int window,
                    double cap, rt *y) {
    int64_t T = q->ne[0], Hq = q->ne[1], D = q->ne[2], Hkv = kc->ne[1], grp = Hq / Hkv;
    double sc[4096];
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < Hq; h++) {
            int64_t a = (int64_t)lo->d[t], b = (int64_t)hi->d[t], hk = h / grp;
            if (window > 0 && b - window > a) a = b - window;
            double m = -INFINITY, z = 0;
            for (int64_t r = a; r < b; r++) {
                double s = 0;
                for (int64_t d = 0; d < D; d++) s += q->d[(t * Hq + h) * D + d] * kc->d[(r * Hkv + hk) * D + d];
                sc[r - a] = softcap(s * scale, cap);
                if (sc[r - a] > m) m = sc[r - a];
            }
            for (int64_t r = a; r < b; r++) z += (sc[r - a] = exp(sc[r - a] - m));
            for (int64_t d = 0; d < D; d++) {
                double o = 0;
                for (int64_t r = a; r < b; r++) o += sc[r - a] / z * vc->d[(r * Hkv + hk) * D + d];
                y->d[(t * Hq + h) * D + d] = o;
            }
        }
}

void ref_lora_gather_back(const rt *x, const rt *dy, const rt *slot, rt *y) {
    int64_t T = x->ne[0], K = x->ne[1], N = dy->ne[1], S = y->ne[0];
    for (int64_t i = 0; i < S * N * K; i++) y->d[i] = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) y->d[((int64_t)slot->d[t] * N + n) * K + k] += dy->d[t * N + n] * x->d[t * K + k];
}

void ref_lora_gather(const rt *x, const rt *w, const rt *slot, rt *y) {
    int64_t T = x->ne[0], K = x->ne[1], N = w->ne[1];
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += w->d[((int64_t)slot->d[t] * N + n) * K + k] * x->d[t * K + k];
            y->d[t * N + n] = s;
        }
}

/* ---- the optimizer step ---- */

void ref_sqsum_parts(const rt *x, int64_t parts, rt *y) {
    int64_t n = rt_nelem(x), q = n / parts, r = n % parts;
    for (int64_t p = 0; p < parts; p++) {
        int64_t b = p * q + (p < r ? p : r), e = b + q + (p < r);
        double s = 0;
        for (int64_t i = b; i < e; i++) s += x->d[i] * x->d[i];
        y->d[2 * p] = s;
        y->d[2 * p + 1] = 0;
    }
}

void ref_grad_norm(const rt *parts, const rt *hyper, rt *y) {
    double s = 0;
    for (int64_t i = 0; i < rt_nelem(parts); i++) s += parts->d[i];
    double norm = sqrt(s), coef = hyper->d[0] / (norm + 1e-6); /* torch.nn.utils.clip_grad_norm_ */
    y->d[0] = norm;
    y->d[1] = hyper->d[0] > 0 && coef < 1 ? coef : 1;
}

/* torch.optim.AdamW's update of one tensor (p.mul_(1 - lr wd); exp_avg.lerp_(g, 1 - b1);
 * exp_avg_sq.mul_(b2).addcmul_(g, g, 1 - b2); p.addcdiv_(exp_avg, sqrt(exp_avg_sq) / c2_sqrt + eps,
 * -step_size)) with the hyper vector's constants, for g = grad * norm[1] */
void ref_adamw(const rt *w, const rt *grad, const rt *m, const rt *v, const rt *hyper, const rt *norm, rt *y) {
    const double *h = hyper->d;
    for (int64_t i = 0; i < rt_nelem(w); i++) {
        double g = grad->d[i] * norm->d[1];
        double mi = m->d[i] + (1 - h[1]) * (g - m->d[i]);
        double vi = v->d[i] * h[2] + (1 - h[2]) * g * g;
        y->d[i] = w->d[i] * h[6] - h[4] * mi / (sqrt(vi) / h[5] + h[3]);
    }
}

/* ---- mixture of experts ---- */

void ref_moe_topk(const rt *logits, int k, rt *ids) {
    int64_t T = logits->ne[0], E = logits->ne[1];
    for (int64_t t = 0; t < T; t++) {
        const double *row = logits->d + t * E;
        for (int j = 0; j < k; j++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                int taken = 0;
                for (int u = 0; u < j; u++) taken |= (int64_t)ids->d[t * k + u] == e;
                if (!taken && (best < 0 || row[e] > row[best])) best = e;
            }
            ids->d[t * k + j] = (double)best;
        }
    }
}

void ref_moe_gate(const rt *logits, const rt *ids, int renorm, rt *y) {
    int64_t T = logits->ne[0], E = logits->ne[1], K = ids->ne[1];
    for (int64_t t = 0; t < T; t++) {
        const double *row = logits->d + t * E;
        double mx = row[0], s = 0, sw = 0;
        for (int64_t e = 1; e < E; e++) mx = fmax(mx, row[e]);
        for (int64_t e = 0; e < E; e++) s += exp(row[e] - mx);
        for (int64_t j = 0; j < K; j++) sw += y->d[t * K + j] = exp(row[(int64_t)ids->d[t * K + j]] - mx) / s;
        for (int64_t j = 0; renorm && j < K; j++) y->d[t * K + j] /= sw;
    }
}

void ref_moe_sort(const rt *ids, int64_t E, double *order, double *inv, double *slot) {
    int64_t P = ids->ne[0] * ids->ne[1], r = 0;
    for (int64_t e = 0; e < E; e++)
        for (int64_t p = 0; p < P; p++) {
            if ((int64_t)ids->d[p] != e) continue;
            if (order) order[r] = (double)p;
            if (inv) inv[p] = (double)r;
            if (slot) slot[r] = (double)e;
            r++;
        }
}

void ref_moe_dispatch(const rt *x, const double *order, int64_t K, rt *y) {
    int64_t H = x->ne[1], R = x->ne[0] * K;
    for (int64_t r = 0; r < R; r++)
        for (int64_t h = 0; h < H; h++) y->d[r * H + h] = x->d[(int64_t)order[r] / K * H + h];
}

void ref_moe_combine(const rt *y, const double *inv, const rt *w, int64_t K, rt *out) {
    int64_t T = y->ne[0] / K, H = y->ne[1];
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            double s = 0;
            for (int64_t j = 0; j < K; j++) s += (w ? w->d[t * K + j] : 1.0) * y->d[(int64_t)inv[t * K + j] * H + h];
            out->d[t * H + h] = s;
        }
}

void ref_moe_router_stats(const rt *logits, const rt *ids, rt *y) {
    int64_t T = logits->ne[0], E = logits->ne[1], K = ids->ne[1];
    for (int64_t i = 0; i < 2 * E; i++) y->d[i] = 0;
    for (int64_t t = 0; t < T; t++) {
        const double *row = logits->d + t * E;
        double mx = row[0], s = 0;
        for (int64_t e = 1; e < E; e++) mx = fmax(mx, row[e]);
        for (int64_t e = 0; e < E; e++) s += exp(row[e] - mx);
        for (int64_t e = 0; e < E; e++) y->d[E + e] += exp(row[e] - mx) / s / (double)T;
        for (int64_t j = 0; j < K; j++) y->d[(int64_t)ids->d[t * K + j]] += 1.0 / (double)T;
    }
}

void ref_moe_router_stats_slots(const rt *logits, const rt *ids, const rt *slot, rt *y) {
    int64_t T = logits->ne[0], E = logits->ne[1], K = ids->ne[1], S = y->ne[0];
    for (int64_t s = 0; s < S; s++) {
        int64_t n = 0;
        for (int64_t t = 0; t < T; t++) n += (int64_t)slot->d[t] == s;
        for (int64_t i = 0; i < 2 * E; i++) y->d[s * 2 * E + i] = 0;
        for (int64_t t = 0; t < T; t++) {
            if ((int64_t)slot->d[t] != s) continue;
            const double *row = logits->d + t * E;
            double mx = row[0], z = 0;
            for (int64_t e = 1; e < E; e++) mx = fmax(mx, row[e]);
            for (int64_t e = 0; e < E; e++) z += exp(row[e] - mx);
            for (int64_t e = 0; e < E; e++) y->d[s * 2 * E + E + e] += exp(row[e] - mx) / z / (double)n;
            for (int64_t j = 0; j < K; j++) y->d[s * 2 * E + (int64_t)ids->d[t * K + j]] += 1.0 / (double)n;
        }
    }
}
