/* Mixture-of-experts routing, as backends/cpu/kern_moe.c: top-k of the router logits, the
 * routing weights and their gradient, the grouping of (token, choice) pairs by expert (a
 * stable counting sort on the device) and the moves of rows into the grouped order and back.
 * Every output element is one chain of operations in a fixed order (no atomics). Bad expert
 * ids store KD_ERR_ID_RANGE and give zeros; order / inv (positions moe_sort wrote) are only
 * kept in bounds. */

/* a before b in top-k order: larger first, NaN as the largest (torch.topk) */
TWK_FN int kd_moe_larger(float a, float b) { return (a != a && b == b) || a > b; }

/* ids[t, j] = the j-th largest of logits[t, :], the lowest index among equals; one item per token */
TWK_KERNEL moe_topk_f32(TWK_GLOBAL int *ids, long ids_off, TWK_GLOBAL const float *lg, long lg_off, long T, long E,
                        long K) {
    long t = TWK_GID(0);
    if (t >= T) return;
    const TWK_GLOBAL float *row = lg + lg_off + t * E;
    TWK_GLOBAL int *out = ids + ids_off + t * K;
    for (long j = 0; j < K; j++) {
        long best = -1;
        for (long e = 0; e < E; e++) {
            int taken = 0;
            for (long u = 0; u < j && !taken; u++) taken = out[u] == (int)e;
            if (!taken && (best < 0 || kd_moe_larger(row[e], row[best]))) best = e;
        }
        out[j] = (int)best;
    }
}

/* a row's softmax max and 1 / sum exp(l - max) (Kahan-summed in index order) */
TWK_FN void kd_moe_stats(const TWK_GLOBAL float *row, long E, float *mx, float *inv) {
    float m = row[0];
    for (long e = 1; e < E; e++) m = row[e] > m ? row[e] : m;
    float s = 0.0f, c = 0.0f;
    for (long e = 0; e < E; e++) kd_kahan(&s, &c, exp(row[e] - m));
    *mx = m;
    *inv = 1.0f / s;
}

/* 1 when every id of token t is in [0, E); else stores the error */
TWK_FN int kd_moe_ids_ok(const TWK_GLOBAL int *ids, long t, long E, long K, int is64, TWK_GLOBAL int *err) {
    for (long j = 0; j < K; j++) {
        long e = kd_id(ids, t * K + j, is64);
        if (e < 0 || e >= E) {
            *err = KD_ERR_ID_RANGE;
            return 0;
        }
    }
    return 1;
}

/* w[t, j] = softmax(logits[t])[ids[t, j]], renormalised over the K when renorm; one item per token */
TWK_KERNEL moe_gate_f32(TWK_GLOBAL float *w, long w_off, TWK_GLOBAL const float *lg, long lg_off,
                        TWK_GLOBAL const int *ids, long ids_off, TWK_GLOBAL int *err, long err_off, long T, long E,
                        long K, int renorm, int is64) {
    long t = TWK_GID(0);
    if (t >= T) return;
    const TWK_GLOBAL float *row = lg + lg_off + t * E;
    const TWK_GLOBAL int *id = ids + ids_off;
    TWK_GLOBAL float *out = w + w_off + t * K;
    if (!kd_moe_ids_ok(id, t, E, K, is64, err + err_off)) {
        for (long j = 0; j < K; j++) out[j] = 0.0f;
        return;
    }
    float mx, inv, sum = 0.0f;
    kd_moe_stats(row, E, &mx, &inv);
    for (long j = 0; j < K; j++) {
        out[j] = exp(row[kd_id(id, t * K + j, is64)] - mx) * inv;
        sum += out[j];
    }
    if (renorm)
        for (long j = 0; j < K; j++) out[j] /= sum;
}

/* dl[t, :] from dy[t, :]: backends/cpu/kern_moe.c's formulas (in double there) rewritten without
 * the cancellation of dy_j - sum_i dy_i w_i when one weight is near 1 (a saturated router):
 * renormalised, dl_{e_j} = w_j sum_{i != j} w_i (dy_j - dy_i); else dl_{e_j} = p_j (dy_j
 * sum_{e != e_j} p_e - sum_{i != j} dy_i p_i) and dl_e = -p_e sum_i dy_i p_i for the others.
 * One item per token. */
TWK_KERNEL moe_gate_back_f32(TWK_GLOBAL float *dl, long dl_off, TWK_GLOBAL const float *lg, long lg_off,
                             TWK_GLOBAL const int *ids, long ids_off, TWK_GLOBAL const float *dy, long dy_off,
                             TWK_GLOBAL int *err, long err_off, long T, long E, long K, int renorm, int is64) {
    long t = TWK_GID(0);
    if (t >= T) return;
    const TWK_GLOBAL float *row = lg + lg_off + t * E, *d = dy + dy_off + t * K;
    const TWK_GLOBAL int *id = ids + ids_off + t * K;
    TWK_GLOBAL float *out = dl + dl_off + t * E;
    if (!kd_moe_ids_ok(ids + ids_off, t, E, K, is64, err + err_off)) {
        for (long e = 0; e < E; e++) out[e] = 0.0f;
        return;
    }
    float mx, inv, sum = 0.0f, dot = 0.0f;
    kd_moe_stats(row, E, &mx, &inv);
    for (long j = 0; j < K; j++) {
        float p = exp(row[kd_id(id, j, is64)] - mx) * inv;
        sum += p;
        dot += d[j] * p;
    }
    for (long e = 0; e < E; e++) out[e] = renorm ? 0.0f : exp(row[e] - mx) * inv * -dot;
    for (long j = 0; j < K; j++) {
        long e = kd_id(id, j, is64);
        float p = exp(row[e] - mx) * inv, acc = 0.0f;
        if (renorm) {
            for (long i = 0; i < K; i++)
                if (i != j) acc += exp(row[kd_id(id, i, is64)] - mx) * inv / sum * (d[j] - d[i]);
            out[e] = p / sum * acc;
        } else {
            float rest = 0.0f;
            for (long u = 0; u < E; u++)
                if (u != e) rest += exp(row[u] - mx) * inv;
            for (long i = 0; i < K; i++)
                if (i != j) acc += d[i] * exp(row[kd_id(id, i, is64)] - mx) * inv;
            out[e] = p * (d[j] * rest - acc);
        }
    }
}

/* The stable counting sort of the P = T K pairs by expert, one work-group of KD_MOE_SORT_L items
 * per expert e: item i takes the i-th contiguous chunk of the pairs and counts the pairs of lower
 * experts and of e there; item 0 sums the first and scans the second (in item order), so each
 * item knows the first row of its chunk's e-pairs, then writes them in pair order. mode 0:
 * out[row] = pair, 1: out[pair] = row, 2: out[row] = expert. (out is zeroed first: the rows of
 * bad ids stay 0.) */
#define KD_MOE_SORT_L 64
TWK_KERNEL moe_sort_i32(TWK_GLOBAL int *out, long out_off, TWK_GLOBAL const int *ids, long ids_off,
                        TWK_GLOBAL int *err, long err_off, long P, long E, int mode, int is64) {
    TWK_LOCAL(long, below, KD_MOE_SORT_L);
    TWK_LOCAL(long, first, KD_MOE_SORT_L);
    long e = TWK_GROUP(0);
    int lid = TWK_LID(0);
    const TWK_GLOBAL int *id = ids + ids_off;
    long chunk = (P + KD_MOE_SORT_L - 1) / KD_MOE_SORT_L, p0 = lid * chunk, p1 = p0 + chunk, nb = 0, nm = 0;
    if (p0 > P) p0 = P;
    if (p1 > P) p1 = P;
    for (long p = p0; p < p1; p++) {
        long v = kd_id(id, p, is64);
        if (v < 0 || v >= E) err[err_off] = KD_ERR_ID_RANGE;
        else if (v < e) nb++;
        else if (v == e) nm++;
    }
    below[lid] = nb;
    first[lid] = nm;
    TWK_BARRIER();
    if (lid == 0) {
        long base = 0, run = 0;
        for (int i = 0; i < KD_MOE_SORT_L; i++) base += below[i];
        for (int i = 0; i < KD_MOE_SORT_L; i++) {
            long c = first[i];
            first[i] = base + run;
            run += c;
        }
    }
    TWK_BARRIER();
    long r = first[lid];
    for (long p = p0; p < p1; p++) {
        if (kd_id(id, p, is64) != e) continue;
        if (mode == 0) out[out_off + r] = (int)p;
        else if (mode == 1) out[out_off + p] = (int)r;
        else out[out_off + r] = (int)e;
        r++;
    }
}

/* y[r, h] = x[order[r] / K, h] (* w[order[r]] when has_w) for R = T K rows; one item per element */
TWK_KERNEL moe_dispatch_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *x, long x_off,
                            TWK_GLOBAL const int *order, long order_off, TWK_GLOBAL const float *w, long w_off, long R,
                            long H, long K, int has_w, int is64) {
    long i = TWK_GID(0);
    if (i >= R * H) return;
    long r = i / H, h = i % H, p = kd_id(order + order_off, r, is64);
    if (p < 0 || p >= R) {
        y[y_off + i] = 0.0f;
        return;
    }
    float v = x[x_off + p / K * H + h];
    y[y_off + i] = has_w ? v * w[w_off + p] : v;
}

/* o[t, h] = sum over j in order of (w[t, j] *) y[inv[t K + j], h]; one item per element */
TWK_KERNEL moe_combine_f32(TWK_GLOBAL float *o, long o_off, TWK_GLOBAL const float *y, long y_off,
                           TWK_GLOBAL const int *inv, long inv_off, TWK_GLOBAL const float *w, long w_off, long T,
                           long H, long K, int has_w, int is64) {
    long i = TWK_GID(0);
    if (i >= T * H) return;
    long t = i / H, h = i % H;
    float acc = 0.0f;
    for (long j = 0; j < K; j++) {
        long r = kd_id(inv + inv_off, t * K + j, is64);
        if (r < 0 || r >= T * K) continue;
        float s = has_w ? w[w_off + t * K + j] : 1.0f;
        acc += s * y[y_off + r * H + h];
    }
    o[o_off + i] = acc;
}

/* dw[t, j] = dot(dout[t, :], y[inv[t K + j], :]) in column order; one item per (t, j) */
TWK_KERNEL moe_combine_back_w_f32(TWK_GLOBAL float *dw, long dw_off, TWK_GLOBAL const float *y, long y_off,
                                  TWK_GLOBAL const int *inv, long inv_off, TWK_GLOBAL const float *dout, long dout_off,
                                  long T, long H, long K, int is64) {
    long i = TWK_GID(0);
    if (i >= T * K) return;
    long t = i / K, r = kd_id(inv + inv_off, i, is64);
    float s = 0.0f;
    if (r >= 0 && r < T * K)
        for (long h = 0; h < H; h++) s += dout[dout_off + t * H + h] * y[y_off + r * H + h];
    dw[dw_off + i] = s;
}

/* Row t's slot: 0 without a slot source (has_slot 0), else slot[t], -1 when outside 0..S-1 */
TWK_FN long kd_moe_slot(const TWK_GLOBAL int *slot, long t, long S, int has_slot, int is64) {
    if (!has_slot) return 0;
    long s = kd_id(slot, t, is64);
    return s >= 0 && s < S ? s : -1;
}

/* moe_router_stats: y[s, 0, e] = the choices of expert e over slot s's rows / those rows,
 * y[s, 1, e] = their mean softmax at e (S = 1 without a slot source; rows of no slot skipped).
 * One group of KD_MOE_STATS_L items per (s, e): item i takes rows i, i + L, ... (counts in
 * integers, its softmax sum Kahan-compensated), item 0 adds the L partials in item order — a
 * fixed order, no atomics: the same bits every run. A bad id in any row (of a slot or not)
 * stores KD_ERR_ID_RANGE. */
#define KD_MOE_STATS_L 64
TWK_KERNEL moe_router_stats_f32(TWK_GLOBAL float *y, long y_off, TWK_GLOBAL const float *lg, long lg_off,
                                TWK_GLOBAL const int *ids, long ids_off, TWK_GLOBAL const int *slot, long slot_off,
                                TWK_GLOBAL int *err, long err_off, long T, long E, long K, long S, int has_slot,
                                int ids64, int slot64) {
    TWK_LOCAL(float, part, KD_MOE_STATS_L);
    TWK_LOCAL(float, comp, KD_MOE_STATS_L);
    TWK_LOCAL(long, hit, KD_MOE_STATS_L);
    TWK_LOCAL(long, nrow, KD_MOE_STATS_L);
    long i = TWK_GROUP(0), s = i / E, e = i % E, rows = 0, hits = 0;
    int lid = TWK_LID(0);
    const TWK_GLOBAL int *id = ids + ids_off;
    float ps = 0.0f, pc = 0.0f;
    for (long t = lid; t < T; t += KD_MOE_STATS_L) {
        int mine = kd_moe_slot(slot + slot_off, t, S, has_slot, slot64) == s;
        for (long j = 0; j < K; j++) { /* every row's ids checked, as on the cpu */
            long v = kd_id(id, t * K + j, ids64);
            if (v < 0 || v >= E) err[err_off] = KD_ERR_ID_RANGE;
            hits += mine && v == e;
        }
        if (!mine) continue;
        const TWK_GLOBAL float *row = lg + lg_off + t * E;
        float mx, inv;
        kd_moe_stats(row, E, &mx, &inv);
        kd_kahan(&ps, &pc, exp(row[e] - mx) * inv);
        rows++;
    }
    part[lid] = ps;
    comp[lid] = pc;
    hit[lid] = hits;
    nrow[lid] = rows;
    TWK_BARRIER();
    if (lid != 0) return;
    float sum = 0.0f, c = 0.0f;
    for (int u = 0; u < KD_MOE_STATS_L; u++) {
        kd_kahan(&sum, &c, part[u]);
        kd_kahan(&sum, &c, -comp[u]);
    }
    hits = rows = 0;
    for (int u = 0; u < KD_MOE_STATS_L; u++) {
        hits += hit[u];
        rows += nrow[u];
    }
    TWK_GLOBAL float *out = y + y_off + s * 2 * E;
    out[e] = rows ? (float)hits / (float)rows : 0.0f;
    out[E + e] = rows ? sum / (float)rows : 0.0f;
}

/* moe_router_stats_back: dl[t, e] = p_te (g_e - sum_e' p_te' g_e') / T_s with g = dy[s, 1, :] of
 * row t's slot s and T_s that slot's rows (counted by the item, in order); 0 for a row of no
 * slot. One item per row. */
TWK_KERNEL moe_router_stats_back_f32(TWK_GLOBAL float *dl, long dl_off, TWK_GLOBAL const float *lg, long lg_off,
                                     TWK_GLOBAL const float *dy, long dy_off, TWK_GLOBAL const int *slot,
                                     long slot_off, long T, long E, long S, int has_slot, int slot64) {
    long t = TWK_GID(0);
    if (t >= T) return;
    TWK_GLOBAL float *out = dl + dl_off + t * E;
    long s = kd_moe_slot(slot + slot_off, t, S, has_slot, slot64), rows = 0;
    if (s < 0) {
        for (long e = 0; e < E; e++) out[e] = 0.0f;
        return;
    }
    if (has_slot) {
        for (long u = 0; u < T; u++) rows += kd_moe_slot(slot + slot_off, u, S, 1, slot64) == s;
    } else {
        rows = T;
    }
    const TWK_GLOBAL float *row = lg + lg_off + t * E, *g = dy + dy_off + s * 2 * E + E;
    float mx, inv, ds = 0.0f, dc = 0.0f;
    kd_moe_stats(row, E, &mx, &inv);
    for (long e = 0; e < E; e++) kd_kahan(&ds, &dc, exp(row[e] - mx) * inv * g[e]);
    for (long e = 0; e < E; e++) out[e] = exp(row[e] - mx) * inv * (g[e] - ds) / (float)rows;
}
