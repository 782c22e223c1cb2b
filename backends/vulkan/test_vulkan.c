/* Checks of the Vulkan backend beyond tests/test_ops: bad ids and segments
 * name op, node and index (like the CPU); two runs give identical bits; a
 * transformer-sized block (GEMMs larger than a tile, long attention, a big
 * vocabulary) agrees with the CPU; more distinct n than the command-buffer
 * cache holds; the staging-buffer path (TWK_VULKAN_STAGING=1) equals the
 * mapped one; tensors deep inside a buffer larger than the device's storage
 * buffer range; TWK_VULKAN_GEMM (bad value, fp16). Exits 0, printing "skip",
 * when there is no Vulkan device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "twinkle/graph.h"
#include "twk_backend.h" /* the backend interface: tables, launches */

static int fails;

static void check(int ok, const char *what, const char *detail) {
    printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", what, detail && *detail ? ": " : "", detail ? detail : "");
    if (!ok) fails++;
}

static void range_errors(twk_device *dev) {
    twk_graph *g = twk_graph_new();
    int64_t t1[1] = {TWK_T}, q_ne[3] = {TWK_T, 2, 4}, tab[2] = {10, 8}, lg[2] = {TWK_T, 8};
    twk_id ids = twk_input(g, "ids", TWK_I64, 1, t1);
    twk_id seg = twk_input(g, "seg", TWK_I32, 1, t1);
    twk_id tgt = twk_input(g, "tgt", TWK_I32, 1, t1);
    twk_id e = twk_get_rows(g, twk_param(g, "emb", 2, tab, true), ids);
    twk_id q = twk_reshape(g, e, 3, q_ne);
    twk_id y = twk_attention(g, q, q, q, seg, 0.5f);
    twk_node_set_name(g, y, "self_attn");
    twk_id lp = twk_logprobs(g, twk_reshape(g, y, 2, lg), tgt);
    twk_node_set_name(g, lp, "lp");
    twk_graph_output(g, lp);
    twk_plan *p = NULL;
    if (twk_plan_compile(g, dev, 8, NULL, 0, &p) != TWK_OK) {
        check(0, "compile the error graph", twk_last_error());
        twk_graph_free(g);
        return;
    }
    int64_t good_ids[8] = {1, 2, 3, 4, 5, 6, 7, 8}, bad_ids[8] = {1, 2, 3, 99, 5, -1, 7, 8};
    int64_t huge_ids[8] = {1, 2, 3, 4, 5, 6, 7, (int64_t)1 << 40};
    int32_t good_seg[8] = {0, 0, 0, 3, 3, 5, 5, 5}, bad_seg[8] = {0, 0, 0, 3, 2, 5, 5, 5};
    int32_t good_tgt[8] = {0, 1, 2, 3, 4, 5, 6, 7}, bad_tgt[8] = {0, 1, 2, 3, 4, 5, 6, 8};
    twk_plan_write(p, seg, 8, good_seg, sizeof good_seg);
    twk_plan_write(p, tgt, 8, good_tgt, sizeof good_tgt);
    twk_plan_write(p, ids, 8, bad_ids, sizeof bad_ids);
    twk_status st = twk_plan_run(p, 8);
    check(st == TWK_ERR_RANGE && strstr(twk_last_error(), "get_rows") && strstr(twk_last_error(), "ids[3] = 99") &&
              strstr(twk_last_error(), "[0, 10)"),
          "i64 token id 99 of a 10-row table", twk_last_error());
    twk_plan_write(p, ids, 8, huge_ids, sizeof huge_ids);
    st = twk_plan_run(p, 8);
    check(st == TWK_ERR_RANGE && strstr(twk_last_error(), "ids[7] = 1099511627776"), "i64 id 2^40", twk_last_error());
    twk_plan_write(p, ids, 8, good_ids, sizeof good_ids);
    twk_plan_write(p, seg, 8, bad_seg, sizeof bad_seg);
    st = twk_plan_run(p, 8);
    check(st == TWK_ERR_RANGE && strstr(twk_last_error(), "self_attn") && strstr(twk_last_error(), "seg_start[4] = 2"),
          "seg_start that goes backwards", twk_last_error());
    twk_plan_write(p, seg, 8, good_seg, sizeof good_seg);
    twk_plan_write(p, tgt, 8, bad_tgt, sizeof bad_tgt);
    st = twk_plan_run(p, 8);
    check(st == TWK_ERR_RANGE && strstr(twk_last_error(), "logprobs 'lp'") && strstr(twk_last_error(), "targets[7] = 8"),
          "target 8 of 8 classes", twk_last_error());
    twk_plan_write(p, tgt, 8, good_tgt, sizeof good_tgt);
    st = twk_plan_run(p, 8);
    check(st == TWK_OK, "a good run right after", st == TWK_OK ? "" : twk_last_error());
    twk_plan_free(p);
    twk_graph_free(g);
}

/* Decoding ops: bad cache rows, key ranges and adapter slots. */
static void decode_errors(twk_device *dev) {
    twk_graph *g = twk_graph_new();
    int64_t cs[3] = {5, 1, 4}, xs[3] = {TWK_T, 1, 4}, t1[1] = {TWK_T}, x2[2] = {TWK_T, 4}, ws[3] = {2, 3, 4};
    twk_id cache = twk_param(g, "cache", 3, cs, false), x = twk_input(g, "x", TWK_F32, 3, xs);
    twk_id rows = twk_input(g, "rows", TWK_I32, 1, t1), lo = twk_input(g, "lo", TWK_I64, 1, t1);
    twk_id hi = twk_input(g, "hi", TWK_I32, 1, t1), slot = twk_input(g, "slot", TWK_I64, 1, t1);
    twk_id kv = twk_kv_write(g, cache, x, rows);
    twk_node_set_name(g, kv, "kv");
    twk_id a = twk_attention_cached(g, x, kv, kv, lo, hi, 0.5f);
    twk_node_set_name(g, a, "ac");
    twk_id y = twk_lora_gather(g, twk_reshape(g, a, 2, x2), twk_param(g, "w", 3, ws, false), slot);
    twk_node_set_name(g, y, "lg");
    twk_graph_output(g, y);
    twk_plan *p = NULL;
    if (twk_plan_compile(g, dev, 3, NULL, 0, &p) != TWK_OK) {
        check(0, "compile the decode graph", twk_last_error());
        twk_graph_free(g);
        return;
    }
    int32_t good_rows[3] = {0, 1, 2}, bad_rows[3] = {0, 5, 2}, good_hi[3] = {1, 2, 3}, bad_hi[3] = {1, 2, 6};
    int64_t good_lo[3] = {0, 0, 1}, good_slot[3] = {0, 1, 0}, bad_slot[3] = {0, 1, 2};
    float xv[12] = {0};
    twk_plan_write(p, x, 3, xv, sizeof xv);
    twk_plan_write(p, rows, 3, bad_rows, sizeof bad_rows);
    twk_plan_write(p, lo, 3, good_lo, sizeof good_lo);
    twk_plan_write(p, hi, 3, good_hi, sizeof good_hi);
    twk_plan_write(p, slot, 3, good_slot, sizeof good_slot);
    twk_status st = twk_plan_run(p, 3);
    check(st == TWK_ERR_RANGE && strstr(twk_last_error(), "kv_write 'kv': rows[1] = 5 is outside the cache [0, 5)"),
          "cache row 5 of 5", twk_last_error());
    twk_plan_write(p, rows, 3, good_rows, sizeof good_rows);
    twk_plan_write(p, hi, 3, bad_hi, sizeof bad_hi);
    st = twk_plan_run(p, 3);
    check(st == TWK_ERR_RANGE && strstr(twk_last_error(), "attn_cache 'ac': rows [1, 6) of query 2"),
          "key rows [1, 6) of a 5-row cache", twk_last_error());
    twk_plan_write(p, hi, 3, good_hi, sizeof good_hi);
    twk_plan_write(p, slot, 3, bad_slot, sizeof bad_slot);
    st = twk_plan_run(p, 3);
    check(st == TWK_ERR_RANGE && strstr(twk_last_error(), "lora_gather 'lg': slot[2] = 2 is outside [0, 2)"),
          "adapter slot 2 of 2", twk_last_error());
    twk_plan_write(p, slot, 3, good_slot, sizeof good_slot);
    st = twk_plan_run(p, 3);
    check(st == TWK_OK, "decoding runs again with good ids", st == TWK_OK ? "" : twk_last_error());
    twk_plan_free(p);
    twk_graph_free(g);
}

/* A block: rmsnorm -> q/k/v GEMMs -> rope -> attention -> out GEMM ->
 * logprobs over a big vocabulary, with gradients of every weight. */
typedef struct block {
    twk_graph *g;
    twk_id x, pos, seg, tgt, w[6], out[8];
    int n_out;
} block;

enum { D_MODEL = 96, HQ = 6, HKV = 2, HD = 16, VOCAB = 3001 };

static void block_build(block *b) {
    twk_graph *g = b->g = twk_graph_new();
    int64_t xs[2] = {TWK_T, D_MODEL}, t1[1] = {TWK_T}, dm[1] = {D_MODEL};
    int64_t wq[2] = {HQ * HD, D_MODEL}, wk[2] = {HKV * HD, D_MODEL}, wo[2] = {D_MODEL, HQ * HD}, wu[2] = {VOCAB, D_MODEL};
    int64_t q3[3] = {TWK_T, HQ, HD}, k3[3] = {TWK_T, HKV, HD}, o2[2] = {TWK_T, HQ * HD};
    b->x = twk_param(g, "x", 2, xs, true);
    b->pos = twk_input(g, "pos", TWK_I32, 1, t1);
    b->seg = twk_input(g, "seg", TWK_I32, 1, t1);
    b->tgt = twk_input(g, "tgt", TWK_I64, 1, t1);
    b->w[0] = twk_param(g, "norm", 1, dm, true);
    b->w[1] = twk_param(g, "wq", 2, wq, true);
    b->w[2] = twk_param(g, "wk", 2, wk, true);
    b->w[3] = twk_param(g, "wv", 2, wk, true);
    b->w[4] = twk_param(g, "wo", 2, wo, true);
    b->w[5] = twk_param(g, "unembed", 2, wu, true);
    twk_id h = twk_rmsnorm(g, b->x, b->w[0], 1e-6f);
    twk_id q = twk_rope(g, twk_reshape(g, twk_matmul(g, h, b->w[1], false, true), 3, q3), b->pos, -1, 10000.0f);
    twk_id k = twk_rope(g, twk_reshape(g, twk_matmul(g, h, b->w[2], false, true), 3, k3), b->pos, -1, 10000.0f);
    twk_id v = twk_reshape(g, twk_matmul(g, h, b->w[3], false, true), 3, k3);
    twk_id a = twk_reshape(g, twk_attention(g, q, k, v, b->seg, 0.25f), 2, o2);
    twk_id o = twk_add(g, b->x, twk_matmul(g, a, b->w[4], false, true));
    twk_id logits = twk_matmul(g, o, b->w[5], false, true);
    twk_id lp = twk_logprobs(g, logits, b->tgt);
    twk_id loss = twk_sum(g, lp);
    twk_graph_backward(g, loss);
    b->n_out = 0;
    b->out[b->n_out++] = lp;
    b->out[b->n_out++] = twk_graph_grad(g, b->x);
    for (int i = 0; i < 6; i++) b->out[b->n_out++] = twk_graph_grad(g, b->w[i]);
    for (int i = 0; i < b->n_out; i++) twk_graph_output(g, b->out[i]);
}

static int64_t nelem_of(twk_graph *g, twk_id id, int64_t n) {
    int64_t ne[4];
    int nd = twk_node_shape(g, id, n, ne), e = 1;
    for (int i = 0; i < nd; i++) e *= (int)ne[i];
    return e;
}

/* Writes deterministic inputs for n tokens. */
static void block_inputs(block *b, twk_plan *p, int64_t n) {
    unsigned s = 12345;
    twk_id params[7] = {b->x, b->w[0], b->w[1], b->w[2], b->w[3], b->w[4], b->w[5]};
    for (int i = 0; i < 7; i++) {
        int64_t ne = nelem_of(b->g, params[i], n);
        float *v = malloc((size_t)ne * sizeof *v);
        for (int64_t k = 0; k < ne; k++) {
            s = s * 1664525u + 1013904223u;
            v[k] = ((float)(s >> 8) / 16777216.0f - 0.5f) * (i == 1 ? 2.0f : 0.5f) + (i == 1 ? 1.0f : 0.0f);
        }
        twk_plan_write(p, params[i], n, v, (size_t)ne * sizeof *v);
        free(v);
    }
    int32_t *pos = malloc((size_t)n * sizeof *pos), *seg = malloc((size_t)n * sizeof *seg);
    int64_t *tgt = malloc((size_t)n * sizeof *tgt), start = 0;
    for (int64_t t = 0; t < n; t++) {
        if (t == n / 3 || t == n / 2 + 7) start = t;
        seg[t] = (int32_t)start;
        pos[t] = (int32_t)(t - start);
        tgt[t] = (t * 7919) % VOCAB;
    }
    twk_plan_write(p, b->pos, n, pos, (size_t)n * sizeof *pos);
    twk_plan_write(p, b->seg, n, seg, (size_t)n * sizeof *seg);
    twk_plan_write(p, b->tgt, n, tgt, (size_t)n * sizeof *tgt);
    free(pos);
    free(seg);
    free(tgt);
}

/* Runs the block at n and returns all outputs concatenated (caller frees). */
static float *block_run(block *b, twk_plan *p, int64_t n, int64_t *count) {
    int64_t total = 0;
    for (int i = 0; i < b->n_out; i++) total += nelem_of(b->g, b->out[i], n);
    float *all = malloc((size_t)total * sizeof *all);
    block_inputs(b, p, n);
    if (twk_plan_run(p, n) != TWK_OK) {
        check(0, "run the block", twk_last_error());
        free(all);
        return NULL;
    }
    int64_t at = 0;
    for (int i = 0; i < b->n_out; i++) {
        int64_t ne = nelem_of(b->g, b->out[i], n);
        twk_plan_read(p, b->out[i], n, all + at, (size_t)ne * sizeof *all);
        at += ne;
    }
    *count = total;
    return all;
}

static double rel_err(const float *a, const float *b, int64_t n) {
    double e = 0, s = 1e-3;
    for (int64_t i = 0; i < n; i++) {
        e = fmax(e, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    return e / s;
}

static void block_checks(twk_device *vk, twk_device *cpu, twk_device *staged) {
    block b;
    block_build(&b);
    if (twk_graph_status(b.g) != TWK_OK) {
        check(0, "build the block", twk_graph_error(b.g));
        return;
    }
    const int64_t cap = 150;
    twk_plan *pv = NULL, *pc = NULL, *ps = NULL;
    if (twk_plan_compile(b.g, vk, cap, NULL, 0, &pv) != TWK_OK ||
        twk_plan_compile(b.g, cpu, cap, NULL, 0, &pc) != TWK_OK ||
        (staged && twk_plan_compile(b.g, staged, cap, NULL, 0, &ps) != TWK_OK)) {
        check(0, "compile the block", twk_last_error());
        goto out;
    }
    int64_t nv, nc, nv2, ns;
    float *yv = block_run(&b, pv, cap, &nv), *yc = block_run(&b, pc, cap, &nc);
    float *yv2 = block_run(&b, pv, cap, &nv2);
    if (yv && yc && yv2) {
        char msg[128];
        double e = rel_err(yv, yc, nv);
        snprintf(msg, sizeof msg, "max error %.2e relative to the largest value (tol 1e-4)", e);
        check(e < 1e-4, "block (150 tokens, vocab 3001) vs cpu: logprobs and 7 gradients", msg);
        check(memcmp(yv, yv2, (size_t)nv * sizeof *yv) == 0, "two runs give identical bits", "");
    }
    if (ps && yv) {
        float *ys = block_run(&b, ps, cap, &ns);
        check(ys && memcmp(yv, ys, (size_t)nv * sizeof *yv) == 0, "staging-buffer path equals the mapped path", "");
        free(ys);
    }
    /* more distinct n than the 8 cached command buffers, then back to n = cap */
    int ok = 1;
    for (int64_t n = 1; n <= 12 && ok; n++) {
        int64_t k1, k2;
        float *a = block_run(&b, pv, n * 11, &k1), *c = block_run(&b, pc, n * 11, &k2);
        ok = a && c && rel_err(a, c, k1) < 1e-4;
        free(a);
        free(c);
    }
    float *yv3 = block_run(&b, pv, cap, &nv2);
    check(ok && yv3 && yv && memcmp(yv, yv3, (size_t)nv * sizeof *yv) == 0,
          "12 run-time counts (cache evictions) agree with cpu; n = cap again is bit-identical", "");
    free(yv);
    free(yc);
    free(yv2);
    free(yv3);
out:
    twk_plan_free(pv);
    twk_plan_free(pc);
    twk_plan_free(ps);
    twk_graph_free(b.g);
}

/* Tensors bound deep inside a buffer larger than maxStorageBufferRange (128
 * MiB on lavapipe) at an offset that is not 16-byte aligned: bound as windows. */
static void big_buffer(twk_device *vk, twk_device *cpu) {
    const size_t big = (size_t)160 << 20, at = ((size_t)150 << 20) + 4;
    twk_graph *g = twk_graph_new();
    int64_t xs[2] = {300, 257}, ws[2] = {129, 257}, t1[1] = {300};
    twk_id x = twk_param(g, "x", 2, xs, false), w = twk_param(g, "w", 2, ws, false);
    twk_id ids = twk_input(g, "ids", TWK_I32, 1, t1);
    twk_id y = twk_matmul(g, twk_rmsnorm(g, twk_get_rows(g, x, ids), twk_fill(g, 1, &xs[1], 1.5f), 1e-6f), w, false, true);
    twk_graph_output(g, y);
    twk_buffer *buf = NULL;
    twk_plan *pv = NULL, *pc = NULL;
    size_t xbytes = 300 * 257 * sizeof(float), wbytes = 129 * 257 * sizeof(float);
    if (twk_buffer_alloc(vk, big, &buf) != TWK_OK) {
        check(0, "allocate 160 MiB", twk_last_error());
        twk_graph_free(g);
        return;
    }
    twk_binding b[2] = {{x, buf, at}, {w, buf, at + xbytes + 8}};
    if (twk_plan_compile(g, vk, 1, b, 2, &pv) != TWK_OK || twk_plan_compile(g, cpu, 1, NULL, 0, &pc) != TWK_OK) {
        check(0, "compile with tensors past 128 MiB", twk_last_error());
    } else {
        float *hx = malloc(xbytes), *hw = malloc(wbytes), *yv = malloc(300 * 129 * sizeof *yv), *yc = malloc(300 * 129 * sizeof *yc);
        int32_t hi[300];
        for (int i = 0; i < 300 * 257; i++) hx[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
        for (int i = 0; i < 129 * 257; i++) hw[i] = (float)((i * 53) % 89) / 44.0f - 1.0f;
        for (int i = 0; i < 300; i++) hi[i] = (i * 7) % 300;
        twk_plan *ps[2] = {pv, pc};
        for (int k = 0; k < 2; k++) {
            twk_plan_write(ps[k], x, 1, hx, xbytes);
            twk_plan_write(ps[k], w, 1, hw, wbytes);
            twk_plan_write(ps[k], ids, 1, hi, sizeof hi);
            if (twk_plan_run(ps[k], 1) != TWK_OK) check(0, "run with tensors past 128 MiB", twk_last_error());
            twk_plan_read(ps[k], y, 1, k ? yc : yv, 300 * 129 * sizeof *yv);
        }
        char msg[96];
        double e = rel_err(yv, yc, 300 * 129);
        snprintf(msg, sizeof msg, "error %.2e vs cpu (tol 1e-5)", e);
        check(e < 1e-5, "tensors at 150 MiB + 4 bytes in a 160 MiB buffer (windowed bindings)", msg);
        free(hx);
        free(hw);
        free(yv);
        free(yc);
    }
    twk_plan_free(pv);
    twk_plan_free(pc);
    twk_buffer_free(vk, buf);
    twk_graph_free(g);
}

/* TWK_VULKAN_GEMM: a bad value fails device_open with a message; fp16 opens
 * either way, and its MATMULs (awkward sizes, every transpose, batched) agree
 * with the CPU within fp16-input rounding where the device has cooperative
 * matrices ("coopmat" in its props name), bit for bit with fp32 otherwise. */
static void gemm_modes(const twk_backend_iface *be, twk_device *vk) {
    setenv("TWK_VULKAN_GEMM", "bogus", 1);
    twk_device *d = NULL;
    twk_status st = twk_device_open("vulkan", &d);
    check(st == TWK_ERR_INVALID_ARG && strstr(twk_last_error(), "TWK_VULKAN_GEMM='bogus'"),
          "TWK_VULKAN_GEMM=bogus fails device_open", twk_last_error());
    if (st == TWK_OK) twk_device_close(d);
    setenv("TWK_VULKAN_GEMM", "fp16", 1);
    st = twk_device_open("vulkan", &d);
    unsetenv("TWK_VULKAN_GEMM");
    if (st != TWK_OK) {
        check(0, "open with TWK_VULKAN_GEMM=fp16", twk_last_error());
        return;
    }
    twk_device_props props;
    int coop = be->device_props(0, &props) == TWK_OK && strstr(props.name, "coopmat") != NULL;
    static const int64_t sz[][4] = {/* batch (0: rank 2), M, N, K */
                                    {0, 1, 5, 3}, {0, 37, 70, 130}, {0, 130, 33, 17}, {0, 64, 64, 32},
                                    {0, 200, 129, 300}, {3, 20, 50, 40}};
    double worst = 0;
    int ran = 0, bits_equal = 1;
    for (size_t c = 0; c < sizeof sz / sizeof sz[0]; c++)
        for (int t = 0; t < 4; t++) {
            int ta = t & 1, tb = t >> 1, r = sz[c][0] ? 3 : 2;
            int64_t B = sz[c][0] ? sz[c][0] : 1, M = sz[c][1], N = sz[c][2], K = sz[c][3];
            if (r == 3 && (ta || tb)) continue; /* batched products are plain */
            int64_t as[3] = {B, ta ? K : M, ta ? M : K}, bs[3] = {B, tb ? N : K, tb ? K : N};
            twk_graph *g = twk_graph_new();
            twk_id a = twk_param(g, "a", r, as + 3 - r, false), b = twk_param(g, "b", r, bs + 3 - r, false);
            twk_id y = twk_matmul(g, a, b, ta, tb);
            twk_graph_output(g, y);
            twk_device *devs[3] = {d, vk, NULL};
            float *out[3] = {NULL, NULL, NULL};
            size_t abytes = (size_t)(B * M * K) * sizeof(float), bbytes = (size_t)(B * K * N) * sizeof(float),
                   ybytes = (size_t)(B * M * N) * sizeof(float);
            float *ha = malloc(abytes), *hb = malloc(bbytes);
            for (int64_t i = 0; i < B * M * K; i++) ha[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
            for (int64_t i = 0; i < B * K * N; i++) hb[i] = (float)((i * 53) % 89) / 44.0f - 1.0f;
            twk_device *cpu = NULL;
            if (twk_device_open("cpu", &cpu) == TWK_OK) devs[2] = cpu;
            for (int k = 0; k < 3 && devs[k]; k++) {
                twk_plan *p = NULL;
                out[k] = malloc(ybytes);
                if (twk_plan_compile(g, devs[k], 1, NULL, 0, &p) != TWK_OK || twk_plan_write(p, a, 1, ha, abytes) != TWK_OK ||
                    twk_plan_write(p, b, 1, hb, bbytes) != TWK_OK || twk_plan_run(p, 1) != TWK_OK ||
                    twk_plan_read(p, y, 1, out[k], ybytes) != TWK_OK) {
                    check(0, "a matmul with TWK_VULKAN_GEMM=fp16", twk_last_error());
                    free(out[k]);
                    out[k] = NULL;
                }
                twk_plan_free(p);
            }
            if (out[0] && out[1] && out[2]) {
                ran++;
                worst = fmax(worst, rel_err(out[0], out[2], B * M * N));
                bits_equal &= memcmp(out[0], out[1], ybytes) == 0;
            }
            for (int k = 0; k < 3; k++) free(out[k]);
            free(ha);
            free(hb);
            twk_device_close(cpu);
            twk_graph_free(g);
        }
    char msg[160];
    snprintf(msg, sizeof msg, "%d products, worst error %.2e vs cpu (tol %s)%s", ran, worst, coop ? "2e-3" : "1e-5",
             coop ? "" : ", bit-identical to fp32");
    check(ran == 21 && (coop ? worst < 2e-3 : worst < 1e-5 && bits_equal),
          coop ? "TWK_VULKAN_GEMM=fp16 on cooperative matrices" : "TWK_VULKAN_GEMM=fp16 falls back to fp32 here", msg);
    twk_device_close(d);
}

int main(void) {
    const twk_backend_iface *be = twk_backend_find("vulkan");
    if (!be || be->device_count() == 0) {
        printf("skip: no Vulkan device (%s)\n", twk_last_error());
        return 0;
    }
    twk_device *vk = NULL, *cpu = NULL, *staged = NULL;
    unsetenv("TWK_VULKAN_GEMM"); /* the checks below hold the fp32 GEMM to 1e-5; gemm_modes tries fp16 */
    if (twk_device_open("vulkan", &vk) != TWK_OK || twk_device_open("cpu", &cpu) != TWK_OK) {
        printf("FAIL open: %s\n", twk_last_error());
        return 1;
    }
    setenv("TWK_VULKAN_STAGING", "1", 1);
    if (twk_device_open("vulkan", &staged) != TWK_OK) check(0, "open with staging", twk_last_error());
    unsetenv("TWK_VULKAN_STAGING");
    range_errors(vk);
    if (staged) range_errors(staged);
    decode_errors(vk);
    block_checks(vk, cpu, staged);
    big_buffer(vk, cpu);
    gemm_modes(be, vk);
    twk_device_close(staged);
    twk_device_close(vk);
    twk_device_close(cpu);
    printf("%d failures\n", fails);
    return fails ? 1 : 0;
}
