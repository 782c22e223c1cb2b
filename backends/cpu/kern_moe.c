/* Mixture-of-experts routing kernels: top-k, the routing weights and their gradient, the
 * grouping of (token, choice) pairs by expert (a stable counting sort), and the moves of rows
 * into the grouped order and back to tokens (with the routing weights and their gradient).
 * Every output element is one sum in a fixed order, so results never depend on threads. */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"

/* a before b in top-k order: larger first, NaN as the largest (torch.topk), equal: keep b. */
static int larger(float a, float b) { return (isnan(a) && !isnan(b)) || a > b; }

static void topk_rows(void *arg, int64_t t0, int64_t t1) {
    const cpu_call *c = arg;
    int64_t E = c->src[0].ne[1], K = c->dst.ne[1];
    const float *l = c->src[0].data;
    int32_t *ids = c->dst.data;
    for (int64_t t = t0; t < t1; t++) {
        const float *row = l + t * E;
        int32_t *out = ids + t * K;
        for (int64_t j = 0; j < K; j++) { /* the j-th largest: the lowest index among equals */
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                int taken = 0;
                for (int64_t u = 0; u < j && !taken; u++) taken = out[u] == e;
                if (!taken && (best < 0 || larger(row[e], row[best]))) best = e;
            }
            out[j] = (int32_t)best;
        }
    }
}

twk_status cpu_moe_topk(const cpu_call *c) {
    int64_t T = c->dst.ne[0];
    cpu_parallel_for(c->ctx->pool, T, CPU_GRAIN_ELEMS / (c->src[0].ne[1] * c->dst.ne[1] + 1) + 1, topk_rows, (void *)c);
    return TWK_OK;
}

/* Row t's softmax max and 1 / sum of exp(l - max), as torch's f32 softmax. */
static void softmax_stats(const float *row, int64_t E, float *mx, float *inv) {
    float m = row[0];
    for (int64_t e = 1; e < E; e++) m = row[e] > m ? row[e] : m;
    double s = 0;
    for (int64_t e = 0; e < E; e++) s += exp((double)row[e] - m);
    *mx = m;
    *inv = (float)(1.0 / s);
}

/* The K routing weights of row t into w (renormalised when asked). */
static void gate_row(const cpu_call *c, int64_t t, float *w) {
    int64_t E = c->src[0].ne[1], K = c->src[1].ne[1];
    const float *row = (const float *)c->src[0].data + t * E;
    float mx, inv;
    softmax_stats(row, E, &mx, &inv);
    float sum = 0;
    for (int64_t j = 0; j < K; j++) {
        w[j] = (float)exp((double)row[cpu_id_at(&c->src[1], t * K + j)] - mx) * inv;
        sum += w[j];
    }
    if (c->l->ip[0])
        for (int64_t j = 0; j < K; j++) w[j] /= sum;
}

static void gate_rows(void *arg, int64_t t0, int64_t t1) {
    const cpu_call *c = arg;
    int64_t K = c->src[1].ne[1];
    for (int64_t t = t0; t < t1; t++) gate_row(c, t, (float *)c->dst.data + t * K);
}

twk_status cpu_moe_gate(const cpu_call *c) {
    cpu_parallel_for(c->ctx->pool, c->dst.ne[0], CPU_GRAIN_ELEMS / (c->src[0].ne[1] + 1) + 1, gate_rows, (void *)c);
    return TWK_OK;
}

/* d logits: without renormalisation dl_e = p_e (dy_e - sum_j dy_j w_j) (dy_e: the dy of the
 * choice of e, 0 for an unchosen e); renormalised, the weights are the softmax over the chosen
 * logits: dl_e = w_e (dy_e - sum_j dy_j w_j) for a chosen e, 0 for the others. For a chosen
 * e_j both are summed without the cancellation of dy_j - sum dy_i w_i when one weight is near 1
 * (a saturated router, where w_j rounds to 1): renormalised w_j sum_{i != j} w_i (dy_j - dy_i),
 * else p_j (dy_j sum_{e != e_j} p_e - sum_{i != j} dy_i p_i); the device kernels do the same. */
static void gate_back_rows(void *arg, int64_t t0, int64_t t1) {
    const cpu_call *c = arg;
    int64_t E = c->src[0].ne[1], K = c->src[1].ne[1];
    float w[256];
    for (int64_t t = t0; t < t1; t++) {
        const float *row = (const float *)c->src[0].data + t * E, *dy = (const float *)c->src[2].data + t * K;
        float *dl = (float *)c->dst.data + t * E;
        if (c->l->ip[0]) {
            gate_row(c, t, w);
            memset(dl, 0, (size_t)E * sizeof *dl);
            for (int64_t j = 0; j < K; j++) {
                double acc = 0;
                for (int64_t i = 0; i < K; i++)
                    if (i != j) acc += (double)w[i] * ((double)dy[j] - dy[i]);
                dl[cpu_id_at(&c->src[1], t * K + j)] = (float)(w[j] * acc);
            }
            continue;
        }
        float mx, inv;
        softmax_stats(row, E, &mx, &inv);
        double dot = 0;
        for (int64_t j = 0; j < K; j++) dot += dy[j] * exp((double)row[cpu_id_at(&c->src[1], t * K + j)] - mx) * inv;
        for (int64_t e = 0; e < E; e++) dl[e] = (float)(exp((double)row[e] - mx) * inv * -dot);
        for (int64_t j = 0; j < K; j++) {
            int64_t e = cpu_id_at(&c->src[1], t * K + j);
            double rest = 0, acc = 0;
            for (int64_t u = 0; u < E; u++)
                if (u != e) rest += exp((double)row[u] - mx) * inv;
            for (int64_t i = 0; i < K; i++)
                if (i != j) acc += dy[i] * exp((double)row[cpu_id_at(&c->src[1], t * K + i)] - mx) * inv;
            dl[e] = (float)(exp((double)row[e] - mx) * inv * (dy[j] * rest - acc));
        }
    }
}

twk_status cpu_moe_gate_back(const cpu_call *c) {
    if (c->src[1].ne[1] > 256) {
        return twk_error(TWK_ERR_UNSUPPORTED, "moe_gate_back: %lld experts per token above the cpu kernel's 256",
                         (long long)c->src[1].ne[1]);
    }
    cpu_parallel_for(c->ctx->pool, c->dst.ne[0], CPU_GRAIN_ELEMS / (c->src[0].ne[1] + 1) + 1, gate_back_rows, (void *)c);
    return TWK_OK;
}

twk_status cpu_moe_sort(const cpu_call *c) {
    int64_t E = c->src[0].ne[1], P = c->dst.ne[0];
    int64_t *next = cpu_scratch(c->ctx, (size_t)(E + 1) * sizeof *next);
    if (!next) return TWK_ERR_OOM;
    memset(next, 0, (size_t)(E + 1) * sizeof *next);
    for (int64_t p = 0; p < P; p++) next[cpu_id_at(&c->src[1], p) + 1]++; /* ids checked before the launch */
    for (int64_t e = 0; e < E; e++) next[e + 1] += next[e];
    int32_t *out = c->dst.data;
    for (int64_t p = 0; p < P; p++) {
        int64_t e = cpu_id_at(&c->src[1], p), r = next[e]++;
        if (c->l->ip[0] == 0) out[r] = (int32_t)p;
        else if (c->l->ip[0] == 1) out[p] = (int32_t)r;
        else out[r] = (int32_t)e;
    }
    return TWK_OK;
}

static void dispatch_rows(void *arg, int64_t r0, int64_t r1) {
    const cpu_call *c = arg;
    int64_t H = c->dst.ne[1], K = c->dst.ne[0] / c->src[0].ne[0];
    const float *x = c->src[0].data, *w = c->l->nsrc > 3 ? c->src[3].data : NULL;
    for (int64_t r = r0; r < r1; r++) {
        int64_t p = cpu_id_at(&c->src[1], r);
        const float *xr = x + p / K * H;
        float *y = (float *)c->dst.data + r * H;
        if (!w) {
            memcpy(y, xr, (size_t)H * sizeof *y);
            continue;
        }
        float s = w[p];
        for (int64_t h = 0; h < H; h++) y[h] = xr[h] * s;
    }
}

twk_status cpu_moe_dispatch(const cpu_call *c) {
    cpu_parallel_for(c->ctx->pool, c->dst.ne[0], CPU_GRAIN_ELEMS / c->dst.ne[1] + 1, dispatch_rows, (void *)c);
    return TWK_OK;
}

static void combine_rows(void *arg, int64_t t0, int64_t t1) {
    const cpu_call *c = arg;
    int64_t H = c->dst.ne[1], K = c->src[0].ne[0] / c->dst.ne[0];
    const float *y = c->src[0].data, *w = c->l->nsrc > 3 ? c->src[3].data : NULL;
    for (int64_t t = t0; t < t1; t++) {
        float *o = (float *)c->dst.data + t * H;
        memset(o, 0, (size_t)H * sizeof *o);
        for (int64_t j = 0; j < K; j++) {
            const float *yr = y + cpu_id_at(&c->src[2], t * K + j) * H;
            float s = w ? w[t * K + j] : 1.0f;
            for (int64_t h = 0; h < H; h++) o[h] += s * yr[h];
        }
    }
}

twk_status cpu_moe_combine(const cpu_call *c) {
    cpu_parallel_for(c->ctx->pool, c->dst.ne[0], CPU_GRAIN_ELEMS / (c->src[0].ne[1] * 2) + 1, combine_rows, (void *)c);
    return TWK_OK;
}

static void combine_back_w_rows(void *arg, int64_t t0, int64_t t1) {
    const cpu_call *c = arg;
    int64_t K = c->dst.ne[1], H = c->src[0].ne[1];
    const float *y = c->src[0].data, *d = c->src[3].data;
    for (int64_t t = t0; t < t1; t++)
        for (int64_t j = 0; j < K; j++) {
            const float *yr = y + cpu_id_at(&c->src[2], t * K + j) * H, *dr = d + t * H;
            float s = 0;
            for (int64_t h = 0; h < H; h++) s += dr[h] * yr[h];
            ((float *)c->dst.data)[t * K + j] = s;
        }
}

twk_status cpu_moe_combine_back_w(const cpu_call *c) {
    cpu_parallel_for(c->ctx->pool, c->dst.ne[0], CPU_GRAIN_ELEMS / (c->src[0].ne[1] * c->dst.ne[1] + 1) + 1,
                     combine_back_w_rows, (void *)c);
    return TWK_OK;
}

/* Row t's slot (0 without a slot source), or -1 when it lies outside 0..S-1 (counted nowhere). */
static int64_t stats_slot(const cpu_call *c, int src, int64_t t, int64_t S) {
    if (c->l->nsrc <= src) return 0;
    int64_t s = cpu_id_at(&c->src[src], t);
    return s >= 0 && s < S ? s : -1;
}

/* Per slot s (one without a slot source): row 0 the choices of each expert / the slot's rows,
 * row 1 the mean softmax over them (sums in double, rows in order: one thread, O(T E)). */
twk_status cpu_moe_router_stats(const cpu_call *c) {
    int64_t T = c->src[0].ne[0], E = c->src[0].ne[1], K = c->src[1].ne[1];
    int64_t S = c->l->nsrc > 2 ? c->dst.ne[0] : 1;
    double *acc = cpu_scratch(c->ctx, (size_t)(S * (2 * E + 1)) * sizeof *acc), *rows = acc + S * 2 * E;
    if (!acc) return TWK_ERR_OOM;
    memset(acc, 0, (size_t)(S * (2 * E + 1)) * sizeof *acc);
    const float *l = c->src[0].data;
    for (int64_t t = 0; t < T; t++) {
        int64_t s = stats_slot(c, 2, t, S);
        if (s < 0) continue;
        const float *row = l + t * E;
        double *a = acc + s * 2 * E;
        float mx, inv;
        softmax_stats(row, E, &mx, &inv);
        for (int64_t e = 0; e < E; e++) a[E + e] += (double)((float)exp((double)row[e] - mx) * inv);
        for (int64_t j = 0; j < K; j++) a[cpu_id_at(&c->src[1], t * K + j)] += 1.0; /* ids checked before the launch */
        rows[s] += 1.0;
    }
    float *out = c->dst.data;
    for (int64_t i = 0; i < S * 2 * E; i++) out[i] = rows[i / (2 * E)] > 0 ? (float)(acc[i] / rows[i / (2 * E)]) : 0.0f;
    return TWK_OK;
}

/* dl[t, e] = p_te (g_e - sum_e' p_te' g_e') / T_s with g = dy's softmax row of t's slot s and T_s
 * the slot's rows (the counts have no gradient); 0 for a row of no slot. */
typedef struct stats_back {
    const cpu_call *c;
    const double *rows;
    int64_t S;
} stats_back;

static void router_stats_back_rows(void *arg, int64_t t0, int64_t t1) {
    const stats_back *sb = arg;
    const cpu_call *c = sb->c;
    int64_t E = c->src[0].ne[1];
    for (int64_t t = t0; t < t1; t++) {
        const float *row = (const float *)c->src[0].data + t * E;
        float *dl = (float *)c->dst.data + t * E;
        int64_t s = stats_slot(c, 2, t, sb->S);
        if (s < 0) {
            memset(dl, 0, (size_t)E * sizeof *dl);
            continue;
        }
        const float *g = (const float *)c->src[1].data + s * 2 * E + E;
        float mx, inv;
        softmax_stats(row, E, &mx, &inv);
        double dot = 0;
        for (int64_t e = 0; e < E; e++) dot += exp((double)row[e] - mx) * inv * g[e];
        for (int64_t e = 0; e < E; e++) dl[e] = (float)(exp((double)row[e] - mx) * inv * (g[e] - dot) / sb->rows[s]);
    }
}

twk_status cpu_moe_router_stats_back(const cpu_call *c) {
    int64_t T = c->src[0].ne[0], S = c->l->nsrc > 2 ? c->src[1].ne[0] : 1;
    double *rows = cpu_scratch(c->ctx, (size_t)S * sizeof *rows);
    if (!rows) return TWK_ERR_OOM;
    memset(rows, 0, (size_t)S * sizeof *rows);
    for (int64_t t = 0; t < T; t++) {
        int64_t s = stats_slot(c, 2, t, S);
        if (s >= 0) rows[s] += 1.0;
    }
    stats_back sb = {c, rows, S};
    cpu_parallel_for(c->ctx->pool, c->dst.ne[0], CPU_GRAIN_ELEMS / (c->src[0].ne[1] + 1) + 1, router_stats_back_rows, &sb);
    return TWK_OK;
}
