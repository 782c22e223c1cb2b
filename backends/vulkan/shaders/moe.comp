#version 450
// Mixture-of-experts routing, as backends/cpu/kern_moe.c (and backends/kernels/moe.cl): every
// output element is one chain of operations in a fixed order, no atomics. Ids at binding 2
// are i64 when p[7] != 0; bad expert ids were flagged by check.comp and give zeros here.
// MODE 0 moe_topk:      yi[t, j] = the j-th largest of x[t, :] (ties to the lower index, NaN
//                       the largest); one invocation per token; p: 0 T, 1 E, 2 K.
// MODE 1 moe_gate:      y[t, j] = softmax(x[t])[ids[t, j]] (/ their sum when p[3]); per token.
// MODE 2 moe_gate_back: y[t, :] = d logits from dy (binding 3); per token; p as MODE 1.
// MODE 3 moe_sort:      the stable counting sort of the p[0] pairs by expert, a work-group
//                       per expert (sort_pairs); p: 1 E, 2 the
//                       op's mode (0 row -> pair, 1 pair -> row, 2 row -> expert); yi zeroed
//                       by copy.comp first.
// MODE 4 moe_dispatch:  y[r, h] = x[order[r] / K, h] (* w[order[r]] when p[3]); p: 0 R, 1 H, 2 K.
// MODE 5 moe_combine:   y[t, h] = sum over j of (w[t K + j] *) x[inv[t K + j], h]; p: 0 T, 1 H, 2 K.
// MODE 6 moe_combine_back_w: y[t, j] = dot(dout[t, :] (binding 3), x[inv[t K + j], :]); p as 5.
// MODE 7 moe_router_stats: y[s, 0, e] = the choices of e over slot s's rows / those rows, y[s, 1, e]
//                       their mean softmax at e; a work-group per (s, e), its partials added in
//                       a fixed order (counts in integers, the softmax Kahan-summed); p: 0 T, 1 E, 2 K, 3 S,
//                       4 has a slot (binding 4; p[6] i64), rows of a slot outside 0..S-1 skipped.
// MODE 8 moe_router_stats_back: y[t, e] = p_te (g_e - sum p_te' g_e') / T_s, g = dy[s, 1, :]
//                       (binding 3), T_s the rows of t's slot (counted in order); per row; p as 7.
#include "common.glsl"
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 0) buffer YI { int yi[]; };
layout(std430, binding = 1) buffer X { float x[]; };
layout(std430, binding = 2) buffer I { uint ids[]; };
layout(std430, binding = 3) buffer W { float w[]; };
layout(std430, binding = 4) buffer SL { uint sl[]; };

bool larger(float a, float b) { return (isnan(a) && !isnan(b)) || a > b; }

int id_at(uint i) { return ID_AT(ids, pc.off[2], i, pc.p[7]); }

void topk(uint T, uint E, uint K) {
    for (uint t = gl_GlobalInvocationID.x; t < T; t += GSTRIDE) {
        uint row = pc.off[1] + t * E, ob = pc.off[0] + t * K;
        for (uint j = 0u; j < K; j++) {
            int best = -1;
            for (uint e = 0u; e < E; e++) {
                bool taken = false;
                for (uint u = 0u; u < j && !taken; u++) taken = yi[ob + u] == int(e);
                if (!taken && (best < 0 || larger(x[row + e], x[row + uint(best)]))) best = int(e);
            }
            yi[ob + j] = best;
        }
    }
}

// MODE 1 and 2: per token, the softmax stats (a Kahan sum in index order), then the outputs
void gate(uint T, uint E, uint K, bool renorm) {
    for (uint t = gl_GlobalInvocationID.x; t < T; t += GSTRIDE) {
        uint row = pc.off[1] + t * E, ob = pc.off[0] + t * (MODE == 1 ? K : E), d = pc.off[3] + t * K;
        bool ok = true;
        for (uint j = 0u; j < K; j++) {
            int e = id_at(t * K + j);
            ok = ok && e >= 0 && e < int(E);
        }
        if (!ok) {
            for (uint j = 0u; j < (MODE == 1 ? K : E); j++) y[ob + j] = 0.0;
            continue;
        }
        float mx = x[row];
        for (uint e = 1u; e < E; e++) mx = x[row + e] > mx ? x[row + e] : mx;
        precise float s = 0.0, c = 0.0;
        for (uint e = 0u; e < E; e++) {
            precise float v = exp(x[row + e] - mx) - c;
            precise float tt = s + v;
            c = (tt - s) - v;
            s = tt;
        }
        float inv = 1.0 / s, sum = 0.0;
        if (MODE == 1) {
            for (uint j = 0u; j < K; j++) {
                float p = exp(x[row + uint(id_at(t * K + j))] - mx) * inv;
                y[ob + j] = p;
                sum += p;
            }
            if (renorm)
                for (uint j = 0u; j < K; j++) y[ob + j] /= sum;
            continue;
        }
        // the gradient without dy_j - sum_i dy_i w_i's cancellation (backends/kernels/moe.cl)
        float dot = 0.0;
        for (uint j = 0u; j < K; j++) {
            float p = exp(x[row + uint(id_at(t * K + j))] - mx) * inv;
            sum += p;
            dot += w[d + j] * p;
        }
        for (uint e = 0u; e < E; e++) y[ob + e] = renorm ? 0.0 : exp(x[row + e] - mx) * inv * -dot;
        for (uint j = 0u; j < K; j++) {
            uint e = uint(id_at(t * K + j));
            float p = exp(x[row + e] - mx) * inv, acc = 0.0;
            if (renorm) {
                for (uint i = 0u; i < K; i++)
                    if (i != j) acc += exp(x[row + uint(id_at(t * K + i))] - mx) * inv / sum * (w[d + j] - w[d + i]);
                y[ob + e] = p / sum * acc;
            } else {
                float rest = 0.0;
                for (uint u = 0u; u < E; u++)
                    if (u != e) rest += exp(x[row + u] - mx) * inv;
                for (uint i = 0u; i < K; i++)
                    if (i != j) acc += w[d + i] * exp(x[row + uint(id_at(t * K + i))] - mx) * inv;
                y[ob + e] = p * (w[d + j] * rest - acc);
            }
        }
    }
}

// MODE 3: a work-group per expert (WG invocations, at most 64): invocation i counts the pairs of
// lower experts and of e in the i-th contiguous chunk; invocation 0 sums the first and scans the
// second in invocation order, then each writes its chunk's e-pairs in pair order.
shared uint s_below[64];
shared uint s_first[64];

void sort_pairs(uint P, uint E, int mode) {
    uint lid = gl_LocalInvocationID.x, chunk = (P + WG - 1u) / WG;
    uint p0 = min(lid * chunk, P), p1 = min(p0 + chunk, P);
    for (uint e = gl_WorkGroupID.x; e < E; e += gl_NumWorkGroups.x) {
        uint nb = 0u, nm = 0u;
        for (uint p = p0; p < p1; p++) {
            int v = id_at(p);
            if (v >= 0 && v < int(e)) nb++;
            else if (v == int(e)) nm++;
        }
        s_below[lid] = nb;
        s_first[lid] = nm;
        barrier();
        if (lid == 0u) {
            uint base = 0u, run = 0u;
            for (uint i = 0u; i < WG; i++) base += s_below[i];
            for (uint i = 0u; i < WG; i++) {
                uint c = s_first[i];
                s_first[i] = base + run;
                run += c;
            }
        }
        barrier();
        uint r = s_first[lid];
        barrier(); // every invocation has read its start before the next expert's counts
        for (uint p = p0; p < p1; p++) {
            if (id_at(p) != int(e)) continue;
            if (mode == 0) yi[pc.off[0] + r] = int(p);
            else if (mode == 1) yi[pc.off[0] + p] = int(r);
            else yi[pc.off[0] + r] = int(e);
            r++;
        }
    }
}

// MODE 7 and 8: row t's slot (0 without one), -1 outside 0..S-1
int slot_of(uint t, uint S) {
    if (pc.p[4] == 0) return 0;
    int s = ID_AT(sl, pc.off[4], t, pc.p[6]);
    return s >= 0 && s < int(S) ? s : -1;
}

// the softmax max and 1 / sum of row t (as gate(): a Kahan sum in index order)
void row_stats(uint row, uint E, out float mx, out float inv) {
    mx = x[row];
    for (uint e = 1u; e < E; e++) mx = x[row + e] > mx ? x[row + e] : mx;
    precise float s = 0.0, c = 0.0;
    for (uint e = 0u; e < E; e++) {
        precise float v = exp(x[row + e] - mx) - c;
        precise float tt = s + v;
        c = (tt - s) - v;
        s = tt;
    }
    inv = 1.0 / s;
}

// a work-group per (s, e) (WG invocations, at most 64): invocation i takes rows i, i + WG, ...,
// invocation 0 adds the partials in invocation order (a fixed order: the same bits every run)
shared float s_part[64];
shared float s_comp[64];

void router_stats(uint T, uint E, uint K, uint S) {
    uint lid = gl_LocalInvocationID.x;
    for (uint i = gl_WorkGroupID.x; i < S * E; i += gl_NumWorkGroups.x) {
        uint s = i / E, e = i % E, rows = 0u, hits = 0u;
        precise float ps = 0.0, c = 0.0;
        for (uint t = lid; t < T; t += WG) {
            if (slot_of(t, S) != int(s)) continue;
            uint row = pc.off[1] + t * E;
            float mx, inv;
            row_stats(row, E, mx, inv);
            precise float v = exp(x[row + e] - mx) * inv - c;
            precise float tt = ps + v;
            c = (tt - ps) - v;
            ps = tt;
            for (uint j = 0u; j < K; j++)
                if (id_at(t * K + j) == int(e)) hits++;
            rows++;
        }
        s_part[lid] = ps;
        s_comp[lid] = c;
        s_below[lid] = hits;
        s_first[lid] = rows;
        barrier();
        if (lid == 0u) {
            precise float sum = 0.0, sc = 0.0;
            hits = rows = 0u;
            for (uint u = 0u; u < WG; u++) {
                for (int k = 0; k < 2; k++) {
                    precise float v = (k == 0 ? s_part[u] : -s_comp[u]) - sc;
                    precise float tt = sum + v;
                    sc = (tt - sum) - v;
                    sum = tt;
                }
                hits += s_below[u];
                rows += s_first[u];
            }
            uint ob = pc.off[0] + s * 2u * E;
            y[ob + e] = rows > 0u ? float(hits) / float(rows) : 0.0;
            y[ob + E + e] = rows > 0u ? sum / float(rows) : 0.0;
        }
        barrier(); // the partials read before the next (s, e) writes them
    }
}

void router_stats_back(uint T, uint E, uint S) {
    for (uint t = gl_GlobalInvocationID.x; t < T; t += GSTRIDE) {
        uint ob = pc.off[0] + t * E;
        int s = slot_of(t, S);
        if (s < 0) {
            for (uint e = 0u; e < E; e++) y[ob + e] = 0.0;
            continue;
        }
        uint rows = T;
        if (pc.p[4] != 0) {
            rows = 0u;
            for (uint u = 0u; u < T; u++)
                if (slot_of(u, S) == s) rows++;
        }
        uint row = pc.off[1] + t * E, g = pc.off[3] + uint(s) * 2u * E + E;
        float mx, inv;
        row_stats(row, E, mx, inv);
        precise float ds = 0.0, c = 0.0;
        for (uint e = 0u; e < E; e++) {
            precise float v = exp(x[row + e] - mx) * inv * w[g + e] - c;
            precise float tt = ds + v;
            c = (tt - ds) - v;
            ds = tt;
        }
        for (uint e = 0u; e < E; e++) y[ob + e] = exp(x[row + e] - mx) * inv * (w[g + e] - ds) / float(rows);
    }
}

void main() {
    uint n0 = uint(pc.p[0]), n1 = uint(pc.p[1]), n2 = uint(pc.p[2]);
    if (MODE == 0) {
        topk(n0, n1, n2);
    } else if (MODE == 1 || MODE == 2) {
        gate(n0, n1, n2, pc.p[3] != 0);
    } else if (MODE == 7) {
        router_stats(n0, n1, n2, uint(pc.p[3]));
    } else if (MODE == 8) {
        router_stats_back(n0, n1, uint(pc.p[3]));
    } else if (MODE == 3) {
        sort_pairs(n0, n1, pc.p[2]);
    } else if (MODE == 4) { // R rows of H
        uint R = n0, H = n1, K = n2;
        for (uint i = gl_GlobalInvocationID.x; i < R * H; i += GSTRIDE) {
            uint r = i / H, h = i % H;
            int p = id_at(r);
            if (p < 0 || p >= int(R)) {
                y[pc.off[0] + i] = 0.0;
                continue;
            }
            float v = x[pc.off[1] + uint(p) / K * H + h];
            y[pc.off[0] + i] = pc.p[3] != 0 ? v * w[pc.off[3] + uint(p)] : v;
        }
    } else if (MODE == 5) {
        uint T = n0, H = n1, K = n2;
        for (uint i = gl_GlobalInvocationID.x; i < T * H; i += GSTRIDE) {
            uint t = i / H, h = i % H;
            float acc = 0.0;
            for (uint j = 0u; j < K; j++) {
                int r = id_at(t * K + j);
                if (r < 0 || r >= int(T * K)) continue;
                float s = pc.p[3] != 0 ? w[pc.off[3] + t * K + j] : 1.0;
                acc += s * x[pc.off[1] + uint(r) * H + h];
            }
            y[pc.off[0] + i] = acc;
        }
    } else {
        uint T = n0, H = n1, K = n2;
        for (uint i = gl_GlobalInvocationID.x; i < T * K; i += GSTRIDE) {
            uint t = i / K;
            int r = id_at(i);
            float s = 0.0;
            if (r >= 0 && r < int(T * K))
                for (uint h = 0u; h < H; h++) s += w[pc.off[3] + t * H + h] * x[pc.off[1] + uint(r) * H + h];
            y[pc.off[0] + i] = s;
        }
    }
}
