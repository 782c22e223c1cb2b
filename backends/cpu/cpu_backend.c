/* The CPU backend: host buffers, the kernel table, and a plan runner that
 * resolves run-time sizes and calls one kernel per launch. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

#include "cpu_internal.h"
#include "twk_cpu_blas.h"

typedef struct cpu_buffer {
    struct twk_buffer base; /* first: the HAL reads the size */
    unsigned char *data;
} cpu_buffer;

/* The dispatch table: one kernel per op that needs one (CPU_KERNELS). */
static const cpu_kernel kernels[TWK_OP_COUNT] = {
#define CPU_ENTRY_(op, fn) [TWK_OP_##op] = fn,
    CPU_KERNELS(CPU_ENTRY_)
#undef CPU_ENTRY_
};
_Static_assert(sizeof kernels / sizeof kernels[0] == TWK_OP_COUNT, "one entry per op");

static cpu_kernel kernel_for(twk_op op) { return (int)op >= 0 && op < TWK_OP_COUNT ? kernels[op] : NULL; }

/* The CPU declares nothing unsupported: it is the reference every op has. */
static int cpu_op_kernel(twk_op op, const char **why) {
    *why = NULL;
    return kernel_for(op) != NULL;
}

/* Every 16-bit source the op table allows: the CPU's kernels widen them all. */
static unsigned cpu_half_srcs(twk_op op) { return twk_op_half_srcs(op); }

static int cpu_device_count(void) { return 1; }

static int n_threads_wanted(void) {
    const char *env = getenv("TWK_THREADS");
    long n = env ? strtol(env, NULL, 10) : 0;
    if (n < 1) n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > 256) n = 256;
    return (int)n;
}

static twk_status cpu_device_props(int index, twk_device_props *out) {
    if (index != 0) return twk_error(TWK_ERR_NOT_FOUND, "cpu: no device %d", index);
    memset(out, 0, sizeof *out);
    char model[96] = "CPU";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) == 0) {
                char *c = strchr(line, ':');
                if (c) {
                    c += 1 + (c[1] == ' ');
                    c[strcspn(c, "\n")] = 0;
                    snprintf(model, sizeof model, "%s", c);
                }
                break;
            }
        }
        fclose(f);
    }
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(out->name, sizeof out->name, "%s", model);
    snprintf(out->kind, sizeof out->kind, "cpu");
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    out->memory_bytes = pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : 0;
    out->compute_units = cores > 0 ? cores : 1;
    out->max_threads = n_threads_wanted();
    out->gemm_row_period = twk_cpu_blas_row_period();
    return TWK_OK;
}

static twk_status cpu_open(int index, void **out) {
    if (index != 0) return twk_error(TWK_ERR_NOT_FOUND, "cpu: no device %d", index);
    cpu_ctx *ctx = twk_host_calloc(sizeof *ctx, "cpu context");
    if (!ctx) return TWK_ERR_OOM;
    ctx->n_threads = n_threads_wanted();
    ctx->pool = cpu_pool_new(ctx->n_threads);
    if (!ctx->pool) {
        twk_host_free(ctx);
        return TWK_ERR_OOM;
    }
    ctx->n_threads = cpu_pool_threads(ctx->pool);
    ctx->profile = getenv("TWK_PROFILE") && atoi(getenv("TWK_PROFILE")) > 0;
    cpu_blas_threads(ctx, 1, 1, CPU_BLAS_THREADED_FMAS);
    *out = ctx;
    return TWK_OK;
}

static void cpu_close(void *vctx) {
    cpu_ctx *ctx = vctx;
    if (!ctx) return;
    if (ctx->profile) {
        double total = 0;
        for (int i = 0; i < TWK_OP_COUNT; i++) total += ctx->prof_s[i];
        twk_log(TWK_LOG_INFO, "cpu profile (%.3f s in kernels):", total);
        for (int i = 0; i < TWK_OP_COUNT; i++)
            if (ctx->prof_n[i])
                twk_log(TWK_LOG_INFO, "  %-16s %8ld launches %9.3f s %5.1f%%", twk_op_name((twk_op)i), ctx->prof_n[i],
                        ctx->prof_s[i], 100 * ctx->prof_s[i] / (total > 0 ? total : 1));
    }
    cpu_pool_free(ctx->pool);
    twk_host_free(ctx->scratch);
    twk_host_free(ctx);
}

static atomic_int blas_threads_set; /* openblas_set_num_threads' last value: it is process-wide */

void cpu_blas_threads(const cpu_ctx *ctx, int64_t m, int64_t n, int64_t k) {
    int want = (double)m * (double)n * (double)k < CPU_BLAS_THREADED_FMAS ? 1 : ctx->n_threads;
    if (atomic_exchange(&blas_threads_set, want) != want) openblas_set_num_threads(want);
}

void *cpu_scratch(cpu_ctx *ctx, size_t bytes) {
    if (bytes <= ctx->scratch_bytes) return ctx->scratch;
    void *p = twk_host_alloc(bytes, "cpu kernel scratch");
    if (!p) return NULL;
    twk_host_free(ctx->scratch);
    ctx->scratch = p;
    ctx->scratch_bytes = bytes;
    return p;
}

static twk_status cpu_buffer_alloc(void *ctx, size_t bytes, twk_buffer **out) {
    (void)ctx;
    cpu_buffer *b = twk_host_calloc(sizeof *b, "cpu buffer");
    if (!b) return TWK_ERR_OOM;
    b->data = twk_host_alloc(bytes ? bytes : 1, "cpu buffer data");
    if (!b->data) {
        twk_host_free(b);
        return TWK_ERR_OOM;
    }
    b->base.size = bytes;
    *out = &b->base;
    return TWK_OK;
}

static void cpu_buffer_free(void *ctx, twk_buffer *buf) {
    (void)ctx;
    cpu_buffer *b = (cpu_buffer *)buf;
    twk_host_free(b->data);
    twk_host_free(b);
}

static twk_status cpu_upload(void *ctx, twk_buffer *dst, size_t off, const void *src, size_t n) {
    (void)ctx;
    memcpy(((cpu_buffer *)dst)->data + off, src, n);
    return TWK_OK;
}

static twk_status cpu_download(void *ctx, const twk_buffer *src, size_t off, void *dst, size_t n) {
    (void)ctx;
    memcpy(dst, ((const cpu_buffer *)src)->data + off, n);
    return TWK_OK;
}

static twk_status cpu_copy(void *ctx, twk_buffer *dst, size_t doff, const twk_buffer *src,
                           size_t soff, size_t n) {
    (void)ctx;
    memmove(((cpu_buffer *)dst)->data + doff, ((const cpu_buffer *)src)->data + soff, n);
    return TWK_OK;
}

static twk_status cpu_memset_zero(void *ctx, twk_buffer *dst, size_t off, size_t n) {
    (void)ctx;
    memset(((cpu_buffer *)dst)->data + off, 0, n);
    return TWK_OK;
}

static bool cpu_supports_op(void *ctx, const twk_launch *l, char *why, size_t why_len) {
    (void)ctx;
    if (!kernel_for(l->op)) {
        if (why) snprintf(why, why_len, "no cpu kernel for %s", twk_op_name(l->op));
        return false;
    }
    return twk_launch_dtypes_ok(l, twk_op_half_srcs(l->op), "cpu", why, why_len);
}

typedef struct cpu_prepared {
    cpu_kernel *kernels;
    int infer; /* cpu_call.infer for every launch */
} cpu_prepared;

static twk_status cpu_prepare(void *ctx, const twk_hal_plan *plan, void **out) {
    (void)ctx;
    cpu_prepared *pp = twk_host_calloc(sizeof *pp, "cpu plan");
    if (!pp) return TWK_ERR_OOM;
    pp->kernels = twk_host_calloc((size_t)(plan->n_launches + 1) * sizeof *pp->kernels, "cpu plan");
    if (!pp->kernels) {
        twk_host_free(pp);
        return TWK_ERR_OOM;
    }
    for (int i = 0; i < plan->n_launches; i++) {
        twk_op op = plan->launches[i].op;
        if (op == TWK_OP_KV_WRITE || op == TWK_OP_ATTN_CACHE) pp->infer = 1;
        pp->kernels[i] = kernel_for(op);
        if (!pp->kernels[i]) {
            twk_host_free(pp->kernels);
            twk_host_free(pp);
            return twk_error(TWK_ERR_UNSUPPORTED, "cpu: no kernel for op %s",
                             twk_op_name(plan->launches[i].op));
        }
    }
    *out = pp;
    return TWK_OK;
}

static void cpu_release(void *ctx, void *prepared) {
    (void)ctx;
    cpu_prepared *pp = prepared;
    if (!pp) return;
    twk_host_free(pp->kernels);
    twk_host_free(pp);
}

static void resolve(cpu_tensor *t, const twk_tensor_desc *d, int64_t n) {
    t->data = d->buf ? ((cpu_buffer *)d->buf)->data + d->offset : NULL;
    t->type = d->type;
    t->ndim = d->ndim;
    t->nelem = 1;
    for (int i = 0; i < TWK_MAX_DIMS; i++) {
        t->ne[i] = i < d->ndim ? twk_desc_dim(d, i, n) : 1;
        if (i < d->ndim) t->nelem *= t->ne[i];
    }
}

/* Bad ids (the op table's IDS rule) as TWK_ERR_RANGE before the kernel runs. */
static twk_status check_ids(const cpu_call *c, int64_t n) {
    if (!twk_op_info(c->l->op)->checked) return TWK_OK;
    const void *host[TWK_MAX_SRC] = {0};
    for (int k = 0; k < c->l->nsrc; k++) host[k] = c->src[k].data;
    char msg[256];
    return twk_launch_bad_id(c->l, n, host, msg, sizeof msg) ? twk_error(TWK_ERR_RANGE, "%s", msg) : TWK_OK;
}

static twk_status cpu_run(void *vctx, void *prepared, const twk_hal_plan *plan, int64_t n) {
    cpu_ctx *ctx = vctx;
    cpu_prepared *pp = prepared;
    cpu_call c;
    c.ctx = ctx;
    c.ntok = n;
    c.infer = pp->infer;
    for (int i = 0; i < plan->n_launches; i++) {
        const twk_launch *l = &plan->launches[i];
        c.l = l;
        resolve(&c.dst, &l->dst, n);
        for (int k = 0; k < l->nsrc; k++) resolve(&c.src[k], &l->src[k], n);
        twk_status st = check_ids(&c, n);
        if (st != TWK_OK) return st;
        struct timespec t0, t1;
        if (ctx->profile) clock_gettime(CLOCK_MONOTONIC, &t0);
        st = pp->kernels[i](&c);
        if (st != TWK_OK) return st;
        if (ctx->profile) {
            clock_gettime(CLOCK_MONOTONIC, &t1);
            ctx->prof_s[l->op] += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
            ctx->prof_n[l->op]++;
        }
    }
    return TWK_OK;
}

static twk_status cpu_synchronize(void *ctx) {
    (void)ctx;
    return TWK_OK;
}

static const twk_backend_iface cpu_iface = {
    .name = "cpu",
    .device_count = cpu_device_count,
    .device_props = cpu_device_props,
    .open = cpu_open,
    .close = cpu_close,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .copy = cpu_copy,
    .memset_zero = cpu_memset_zero,
    .supports_op = cpu_supports_op,
    .op_kernel = cpu_op_kernel,
    .prepare = cpu_prepare,
    .release = cpu_release,
    .run = cpu_run,
    .synchronize = cpu_synchronize,
    .half_srcs = cpu_half_srcs,
};

const twk_backend_iface *twk_cpu_backend(void) { return &cpu_iface; }
