/* Bad input gets an error code and a message that names the op and the
 * shapes — never a crash: shape mismatches, unsupported dtypes, an op the
 * backend lacks, out-of-range ids and segments at run time, wrong sizes,
 * bad device specs, and injected allocation failures at every point.
 * TWK_TEST_DEVICE=spec runs the run-time checks and the allocation failures on
 * that device (the graph and backend-table checks are device-independent). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "twinkle/twinkle.h"
#include "twk_backend.h" /* the backend interface: tables, launches */

static int fails;

static const char *test_device(void) {
    const char *d = getenv("TWK_TEST_DEVICE");
    return d && *d ? d : "cpu";
}

static void expect(const char *what, twk_status got, twk_status want, const char *msg, const char *const *needles) {
    int ok = got == want;
    for (int i = 0; ok && needles && needles[i]; i++)
        if (!strstr(msg, needles[i])) ok = 0;
    printf("%s %-44s -> %s: %s\n", ok ? "ok  " : "FAIL", what, twk_status_name(got), msg);
    if (!ok) {
        printf("     want %s", twk_status_name(want));
        for (int i = 0; needles && needles[i]; i++) printf(" '%s'", needles[i]);
        printf("\n");
        fails++;
    }
}

#define NEEDLES(...) ((const char *const[]){__VA_ARGS__, NULL})

static void graph_errors(void) {
    int64_t a_ne[2] = {7, 13}, b_ne[2] = {5, 11}, v_ne[1] = {7};
    twk_graph *g = twk_graph_new();
    twk_id a = twk_param(g, "a", 2, a_ne, true), b = twk_param(g, "b", 2, b_ne, true);
    twk_id y = twk_matmul(g, a, b, false, false);
    expect("matmul [7,13] @ [5,11]", twk_graph_status(g), TWK_ERR_SHAPE, twk_graph_error(g),
           NEEDLES("matmul", "[7, 13]", "[5, 11]"));
    /* sticky: the next builder with a bad id does not replace the message */
    twk_id z = twk_silu(g, y);
    expect("a builder given -1 keeps the first error", twk_graph_status(g), TWK_ERR_SHAPE, twk_graph_error(g),
           NEEDLES("matmul"));
    if (z != -1) { printf("FAIL builder on -1 returned %d\n", z); fails++; }
    twk_graph_free(g);

    g = twk_graph_new();
    twk_id ids = twk_input(g, "ids", TWK_I32, 1, v_ne);
    twk_id w = twk_param(g, "w", 1, v_ne, true);
    twk_rmsnorm(g, ids, w, 1e-6f);
    expect("rmsnorm on i32 input", twk_graph_status(g), TWK_ERR_DTYPE, twk_graph_error(g),
           NEEDLES("rmsnorm", "i32", "[7] i32"));
    twk_graph_free(g);

    g = twk_graph_new();
    int64_t x_ne[2] = {TWK_T, 12}, bad[2] = {TWK_T, 13};
    twk_id x = twk_param(g, "x", 2, x_ne, true);
    twk_reshape(g, x, 2, bad);
    expect("reshape [T,12] -> [T,13]", twk_graph_status(g), TWK_ERR_SHAPE, twk_graph_error(g),
           NEEDLES("reshape", "[T, 12]", "[T, 13]"));
    twk_graph_free(g);

    g = twk_graph_new();
    int64_t q_ne[3] = {TWK_T, 3, 8}, k_ne[3] = {TWK_T, 2, 8}, t1[1] = {TWK_T};
    twk_id q = twk_param(g, "q", 3, q_ne, true), k = twk_param(g, "k", 3, k_ne, true);
    twk_id seg = twk_input(g, "seg", TWK_I32, 1, t1);
    twk_attention(g, q, k, k, seg, 1.0f);
    expect("attention with 3 q heads over 2 kv heads", twk_graph_status(g), TWK_ERR_SHAPE, twk_graph_error(g),
           NEEDLES("attn", "[T, 3, 8]", "[T, 2, 8]"));
    twk_graph_free(g);

    g = twk_graph_new();
    int64_t r_ne[3] = {TWK_T, 2, 7};
    twk_id rx = twk_param(g, "x", 3, r_ne, true), pos = twk_input(g, "pos", TWK_I32, 1, t1);
    twk_rope(g, rx, pos, -1, 10000.0f);
    expect("rope with odd head_dim 7", twk_graph_status(g), TWK_ERR_SHAPE, twk_graph_error(g),
           NEEDLES("rope", "[T, 2, 7]"));
    twk_graph_free(g);

    g = twk_graph_new();
    int64_t c1[2] = {3, 4}, c2[2] = {3, 5};
    twk_concat(g, twk_param(g, "a", 2, c1, true), twk_param(g, "b", 2, c2, true), 0);
    expect("concat [3,4] + [3,5] on axis 0", twk_graph_status(g), TWK_ERR_SHAPE, twk_graph_error(g),
           NEEDLES("concat", "[3, 4]", "[3, 5]"));
    twk_graph_free(g);

    g = twk_graph_new();
    twk_id p = twk_param(g, "p", 2, c1, true);
    twk_id s = twk_silu(g, p);
    twk_status st = twk_graph_backward(g, s);
    expect("backward of a non-scalar loss", st, TWK_ERR_SHAPE, twk_last_error(), NEEDLES("loss", "[3, 4]"));
    twk_graph_free(g);

    g = twk_graph_new();
    twk_add(g, twk_param(g, "a", 2, c1, true), twk_param(g, "b", 2, c2, true));
    expect("add [3,4] + [3,5]", twk_graph_status(g), TWK_ERR_SHAPE, twk_graph_error(g), NEEDLES("add", "[3, 5]", "[3, 4]"));
    twk_graph_free(g);
}

/* A backend that is the CPU backend minus attention. */
static twk_backend_iface limited;
static bool limited_supports(void *ctx, const twk_launch *l, char *why, size_t len) {
    if (l->op == TWK_OP_ATTN) {
        snprintf(why, len, "attention is not implemented here");
        return false;
    }
    return twk_cpu_backend()->supports_op(ctx, l, why, len);
}

static twk_graph *attention_graph(twk_id *ids_out, twk_id *seg_out, twk_id *y_out) {
    twk_graph *g = twk_graph_new();
    int64_t t1[1] = {TWK_T}, q_ne[3] = {TWK_T, 2, 4}, tab[2] = {10, 8};
    twk_id ids = twk_input(g, "ids", TWK_I32, 1, t1);
    twk_id seg = twk_input(g, "seg", TWK_I32, 1, t1);
    twk_id e = twk_get_rows(g, twk_param(g, "emb", 2, tab, true), ids);
    twk_id q = twk_reshape(g, e, 3, q_ne);
    twk_id y = twk_attention(g, q, q, q, seg, 0.5f);
    twk_node_set_name(g, y, "self_attn");
    twk_graph_output(g, y);
    *ids_out = ids;
    *seg_out = seg;
    *y_out = y;
    return g;
}

static void backend_errors(void) {
    limited = *twk_cpu_backend();
    limited.name = "limited";
    limited.supports_op = limited_supports;
    if (twk_backend_register(&limited) != TWK_OK) {
        printf("FAIL register: %s\n", twk_last_error());
        fails++;
        return;
    }
    twk_device *dev = NULL;
    twk_device_open("limited", &dev);
    twk_id ids, seg, y;
    twk_graph *g = attention_graph(&ids, &seg, &y);
    twk_plan *p = NULL;
    twk_status st = twk_plan_compile(g, dev, 8, NULL, 0, &p);
    expect("compile attention for a backend without it", st, TWK_ERR_UNSUPPORTED, twk_last_error(),
           NEEDLES("limited", "attn", "self_attn", "[T, 2, 4]"));
    if (p) { printf("FAIL plan returned on error\n"); fails++; }
    twk_device_close(dev);
    twk_backend_unregister("limited");
    twk_graph_free(g);
}

/* the fused unembedding's targets (forward and backward kernels): one outside [0, V), then V - 1 */
static void unembed_errors(twk_device *dev) {
    int64_t h_ne[2] = {-1, 4}, w_ne[2] = {5, 4}, t_ne[1] = {-1};
    twk_graph *g = twk_graph_new();
    twk_id h = twk_param(g, "h", 2, h_ne, true), w = twk_input(g, "w", TWK_F32, 2, w_ne);
    twk_id tg = twk_input(g, "targets", TWK_I32, 1, t_ne);
    twk_id y = twk_unembed_logprobs(g, h, w, tg);
    twk_plan *p = NULL;
    twk_graph_output(g, y);
    if (twk_graph_backward(g, twk_sum(g, y)) != TWK_OK || twk_graph_output(g, twk_graph_grad(g, h)) != TWK_OK ||
        twk_plan_compile(g, dev, 9, NULL, 0, &p) != TWK_OK) {
        printf("FAIL unembed graph: %s\n", twk_last_error());
        fails++;
        twk_graph_free(g);
        return;
    }
    float hv[36], wv[20];
    for (int i = 0; i < 36; i++) hv[i] = (float)(i % 7) * 0.1f;
    for (int i = 0; i < 20; i++) wv[i] = (float)(i % 5) * 0.2f - 0.3f;
    int32_t bad[9] = {0, 1, 5, 2, 3, 4, 0, 1, 2}, good[9] = {0, 1, 4, 2, 3, 4, 0, 1, 2};
    twk_plan_write(p, h, 9, hv, sizeof hv);
    twk_plan_write(p, w, 9, wv, sizeof wv);
    twk_plan_write(p, tg, 9, bad, sizeof bad);
    expect("unembed target 5 with a 5-word vocabulary", twk_plan_run(p, 9), TWK_ERR_RANGE, twk_last_error(),
           NEEDLES("unembed_logprobs", "targets[2] = 5", "[0, 5)"));
    twk_plan_write(p, tg, 9, good, sizeof good);
    expect("unembed with target V - 1 right after", twk_plan_run(p, 9), TWK_OK, "", NULL);
    twk_plan_free(p);
    twk_graph_free(g);
}

/* mixture-of-experts routing: an expert id outside [0, E) in moe_gate / moe_sort's ids (the
 * device kernels' error words, checked before the sort), then a good run */
static void moe_errors(twk_device *dev) {
    int64_t l_ne[2] = {-1, 8}, i_ne[2] = {-1, 2};
    twk_graph *g = twk_graph_new();
    twk_id l = twk_input(g, "router", TWK_F32, 2, l_ne), ids = twk_input(g, "experts", TWK_I32, 2, i_ne);
    twk_id w = twk_moe_gate(g, l, ids, true), order = twk_moe_sort(g, l, ids, 0);
    twk_plan *p = NULL;
    if (twk_graph_output(g, w) != TWK_OK || twk_graph_output(g, order) != TWK_OK ||
        twk_plan_compile(g, dev, 5, NULL, 0, &p) != TWK_OK) {
        printf("FAIL moe graph: %s\n", twk_last_error());
        fails++;
        twk_graph_free(g);
        return;
    }
    float lv[40];
    for (int i = 0; i < 40; i++) lv[i] = (float)((i * 7) % 11) * 0.1f;
    int32_t bad[10] = {0, 1, 7, 2, 3, 8, 4, 5, 6, 7}, good[10] = {0, 1, 7, 2, 3, 6, 4, 5, 6, 7};
    twk_plan_write(p, l, 5, lv, sizeof lv);
    twk_plan_write(p, ids, 5, bad, sizeof bad);
    expect("expert id 8 with 8 experts", twk_plan_run(p, 5), TWK_ERR_RANGE, twk_last_error(),
           NEEDLES("moe_", "[5] = 8", "[0, 8)"));
    twk_plan_write(p, ids, 5, good, sizeof good);
    expect("moe with expert E - 1 right after", twk_plan_run(p, 5), TWK_OK, "", NULL);
    twk_plan_free(p);
    twk_graph_free(g);
}

/* moe_router_stats alone (the load-balancing loss's statistics, per slot): an expert id outside
 * [0, E) (the device kernel's error word), then a good run */
static void router_stats_errors(twk_device *dev) {
    int64_t l_ne[2] = {-1, 8}, i_ne[2] = {-1, 2}, s_ne[1] = {-1};
    twk_graph *g = twk_graph_new();
    twk_id l = twk_input(g, "router", TWK_F32, 2, l_ne), ids = twk_input(g, "experts", TWK_I32, 2, i_ne);
    twk_id slot = twk_input(g, "slot", TWK_I32, 1, s_ne);
    twk_id y = twk_moe_router_stats_slots(g, l, ids, slot, 2);
    twk_plan *p = NULL;
    if (twk_graph_output(g, y) != TWK_OK || twk_plan_compile(g, dev, 5, NULL, 0, &p) != TWK_OK) {
        printf("FAIL router_stats graph: %s\n", twk_last_error());
        fails++;
        twk_graph_free(g);
        return;
    }
    float lv[40];
    for (int i = 0; i < 40; i++) lv[i] = (float)((i * 7) % 11) * 0.1f;
    int32_t bad[10] = {0, 1, 7, 2, 3, 8, 4, 5, 6, 7}, good[10] = {0, 1, 7, 2, 3, 6, 4, 5, 6, 7}, sv[5] = {0, 1, -1, 1, 0};
    twk_plan_write(p, l, 5, lv, sizeof lv);
    twk_plan_write(p, slot, 5, sv, sizeof sv);
    twk_plan_write(p, ids, 5, bad, sizeof bad);
    expect("router stats: expert id 8 with 8 experts", twk_plan_run(p, 5), TWK_ERR_RANGE, twk_last_error(),
           NEEDLES("moe_router_stats", "[5] = 8", "[0, 8)"));
    twk_plan_write(p, ids, 5, good, sizeof good);
    expect("router stats with expert E - 1 right after", twk_plan_run(p, 5), TWK_OK, "", NULL);
    twk_plan_free(p);
    twk_graph_free(g);
}

static void run_errors(void) {
    twk_device *dev = NULL;
    if (twk_device_open(test_device(), &dev) != TWK_OK) {
        printf("FAIL open %s: %s\n", test_device(), twk_last_error());
        fails++;
        return;
    }
    twk_id ids, seg, y;
    twk_graph *g = attention_graph(&ids, &seg, &y);
    twk_plan *p = NULL;
    if (twk_plan_compile(g, dev, 8, NULL, 0, &p) != TWK_OK) {
        printf("FAIL compile: %s\n", twk_last_error());
        fails++;
        return;
    }
    int32_t good_ids[8] = {1, 2, 3, 4, 5, 6, 7, 8}, bad_ids[8] = {1, 2, 3, 99, 5, 6, 7, 8};
    int32_t good_seg[8] = {0, 0, 0, 3, 3, 5, 5, 5}, bad_seg[8] = {0, 0, 0, 3, 2, 5, 5, 5};
    twk_plan_write(p, ids, 8, bad_ids, sizeof bad_ids);
    twk_plan_write(p, seg, 8, good_seg, sizeof good_seg);
    expect("token id 99 with a 10-row table", twk_plan_run(p, 8), TWK_ERR_RANGE, twk_last_error(),
           NEEDLES("get_rows", "ids[3] = 99", "[0, 10)"));
    twk_plan_write(p, ids, 8, good_ids, sizeof good_ids);
    twk_plan_write(p, seg, 8, bad_seg, sizeof bad_seg);
    expect("seg_start that goes backwards", twk_plan_run(p, 8), TWK_ERR_RANGE, twk_last_error(),
           NEEDLES("attn", "seg_start[4] = 2"));
    twk_plan_write(p, seg, 8, good_seg, sizeof good_seg);
    expect("a good run right after", twk_plan_run(p, 8), TWK_OK, "", NULL);
    expect("run with 9 tokens at capacity 8", twk_plan_run(p, 9), TWK_ERR_INVALID_ARG, twk_last_error(),
           NEEDLES("9", "1..8"));
    expect("write 7 tokens' bytes for n = 8", twk_plan_write(p, ids, 8, good_ids, 28), TWK_ERR_INVALID_ARG,
           twk_last_error(), NEEDLES("32 bytes", "got 28"));
    expect("read a tensor id past the graph", twk_plan_read(p, 999, 8, good_ids, 4), TWK_ERR_INVALID_ARG,
           twk_last_error(), NEEDLES("999"));
    unembed_errors(dev);
    moe_errors(dev);
    router_stats_errors(dev);
    twk_buffer *buf = NULL;
    twk_buffer_alloc(dev, 16, &buf);
    expect("upload past a buffer's end", twk_buffer_upload(dev, buf, 8, good_ids, 16), TWK_ERR_INVALID_ARG,
           twk_last_error(), NEEDLES("[8, 24)", "16 bytes"));
    twk_buffer_free(dev, buf);
    twk_plan_free(p);
    twk_graph_free(g);
    twk_device_close(dev);

    twk_device *d2 = NULL;
    expect("open device 'nosuch'", twk_device_open("nosuch", &d2), TWK_ERR_NOT_FOUND, twk_last_error(), NEEDLES("nosuch"));
    expect("open device 'cpu:3'", twk_device_open("cpu:3", &d2), TWK_ERR_NOT_FOUND, twk_last_error(), NEEDLES("cpu", "3"));
    expect("open device 'cpu:x'", twk_device_open("cpu:x", &d2), TWK_ERR_INVALID_ARG, twk_last_error(), NEEDLES("cpu:x"));
}

/* ---- allocation failure injection ---- */
static long alloc_count, fail_at;
static void *failing_alloc(void *user, size_t bytes, size_t align) {
    (void)user;
    if (++alloc_count == fail_at) return NULL;
    void *p = NULL;
    size_t rounded = (bytes + align - 1) / align * align;
    return posix_memalign(&p, align, rounded ? rounded : align) == 0 ? p : NULL;
}
static void plain_free(void *user, void *p) {
    (void)user;
    free(p);
}

/* The whole life of a small training model; returns its status. */
static twk_status whole_run(void) {
    twk_device *dev = NULL;
    twk_status st = twk_device_open(test_device(), &dev);
    if (st != TWK_OK) return st;
    twk_tiny_lm_config cfg = twk_tiny_lm_default();
    cfg.n_seqs = 2;
    cfg.seq_len = 8;
    twk_tiny_lm *m = NULL;
    st = twk_tiny_lm_new(&cfg, dev, &m);
    float loss;
    if (st == TWK_OK) st = twk_tiny_lm_step(m, &loss);
    twk_tiny_lm_free(m);
    twk_device_close(dev);
    return st;
}

static void alloc_failures(void) {
    twk_allocator a = {failing_alloc, plain_free, NULL};
    twk_set_allocator(&a);
    fail_at = -1;
    alloc_count = 0;
    twk_status st = whole_run();
    long total = alloc_count;
    int bad = st != TWK_OK, oom_seen = 0;
    for (fail_at = 1; fail_at <= total; fail_at++) {
        alloc_count = 0;
        st = whole_run();
        if (st == TWK_ERR_OOM) oom_seen++;
        else if (st != TWK_OK) {
            printf("FAIL allocation %ld failing gave %s: %s\n", fail_at, twk_status_name(st), twk_last_error());
            bad = 1;
        }
    }
    twk_set_allocator(NULL);
    printf("%s each of %ld host allocations failed in turn: %d runs reported oom, none crashed or leaked\n",
           bad ? "FAIL" : "ok  ", total, oom_seen);
    if (bad || oom_seen == 0) fails++;
}

int main(void) {
    graph_errors();
    backend_errors();
    run_errors();
    alloc_failures();
    printf("%d failures\n", fails);
    return fails ? 1 : 0;
}
