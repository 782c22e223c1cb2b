/* The OpenCL program: the prelude + kd_kernel_source(), built once per
 * context, with an on-disk cache of program binaries keyed by a hash of
 * (source, build options, platform, device, driver version). Cache files
 * are written to a temp file and renamed into place; an unreadable,
 * corrupt or rejected entry falls back to building from source. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kd.h"
#include "ocl_internal.h"

const char *ocl_prelude_source(void); /* generated from kd_prelude_opencl.h */

static const char magic[8] = {'T', 'W', 'K', 'C', 'L', 'B', 'I', 'N'};

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t fnv_str(uint64_t h, const char *s) { return fnv(h, s, strlen(s) + 1); }

/* Creates every missing directory of path (like mkdir -p); 0 on success. */
static int make_dirs(const char *path) {
    char buf[1024];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return -1;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* $TWK_CACHE_DIR/opencl, else $XDG_CACHE_HOME/twinkle/opencl, else
 * ~/.cache/twinkle/opencl; 0 when none can be named. */
static int cache_dir(char *out, size_t len) {
    const char *t = getenv("TWK_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    int n;
    if (t && *t) n = snprintf(out, len, "%s/opencl", t);
    else if (x && *x) n = snprintf(out, len, "%s/twinkle/opencl", x);
    else if (h && *h) n = snprintf(out, len, "%s/.cache/twinkle/opencl", h);
    else return 0;
    return n > 0 && (size_t)n < len;
}

static void device_str(cl_device_id d, cl_device_info what, char *buf, size_t len) {
    buf[0] = 0;
    if (clGetDeviceInfo(d, what, len - 1, buf, NULL) != CL_SUCCESS) buf[0] = 0;
    buf[len - 1] = 0;
}

static void platform_str(cl_platform_id p, cl_platform_info what, char *buf, size_t len) {
    buf[0] = 0;
    if (clGetPlatformInfo(p, what, len - 1, buf, NULL) != CL_SUCCESS) buf[0] = 0;
    buf[len - 1] = 0;
}

/* Reads a cache file; the binary (twk_host_alloc'd) or NULL if absent or corrupt. */
static unsigned char *cache_read(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char head[24];
    unsigned char *bin = NULL;
    uint64_t n = 0, sum = 0;
    if (fread(head, 1, sizeof head, f) != sizeof head || memcmp(head, magic, 8) != 0) goto bad;
    memcpy(&n, head + 8, 8);
    memcpy(&sum, head + 16, 8);
    if (n == 0 || n > ((uint64_t)1 << 31)) goto bad;
    bin = twk_host_alloc((size_t)n, "opencl cached binary");
    if (!bin) goto bad;
    if (fread(bin, 1, (size_t)n, f) != (size_t)n || fgetc(f) != EOF) goto bad;
    if (fnv(14695981039346656037ull, bin, (size_t)n) != sum) goto bad;
    fclose(f);
    *size = (size_t)n;
    return bin;
bad:
    twk_host_free(bin);
    twk_clear_error();
    fclose(f);
    return NULL;
}

/* Writes the binary atomically (temp file + rename); failures are ignored:
 * the cache only saves time. */
static void cache_write(const char *dir, const char *path, const unsigned char *bin, size_t n) {
    if (make_dirs(dir) != 0) return;
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return;
    uint64_t n64 = n, sum = fnv(14695981039346656037ull, bin, n);
    int ok = fwrite(magic, 1, 8, f) == 8 && fwrite(&n64, 8, 1, f) == 1 && fwrite(&sum, 8, 1, f) == 1 &&
             fwrite(bin, 1, n, f) == n;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) remove(tmp);
}

/* The built program's binary (twk_host_alloc'd) or NULL. */
static unsigned char *program_binary(cl_program prog, size_t *size) {
    size_t n = 0;
    if (clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof n, &n, NULL) != CL_SUCCESS || n == 0) return NULL;
    unsigned char *bin = twk_host_alloc(n, "opencl program binary");
    if (!bin) {
        twk_clear_error();
        return NULL;
    }
    unsigned char *ptrs[1] = {bin};
    if (clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof ptrs, ptrs, NULL) != CL_SUCCESS) {
        twk_host_free(bin);
        return NULL;
    }
    *size = n;
    return bin;
}

static twk_status build_failed(ocl_ctx *ctx, cl_program prog, cl_int code) {
    char log[2048] = "";
    size_t n = 0;
    clGetProgramBuildInfo(prog, ctx->device, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, &n);
    log[sizeof log - 1] = 0;
    return twk_error(TWK_ERR_BACKEND, "opencl: building the kernels for %s failed: %s (%d)\n%s", ctx->device_name,
                     ocl_code_name(code), (int)code, log);
}

twk_status ocl_program_build(ocl_ctx *ctx) {
    const char *pre = ocl_prelude_source(), *src = kd_kernel_source();
    size_t lp = strlen(pre), ls = strlen(src);
    char *full = twk_host_alloc(lp + ls + 2, "opencl program source");
    if (!full) return TWK_ERR_OOM;
    memcpy(full, pre, lp);
    full[lp] = '\n';
    memcpy(full + lp + 1, src, ls + 1);

    char opts[160] = "-cl-std=CL1.2";
    cl_device_fp_config fp = 0;
    if (clGetDeviceInfo(ctx->device, CL_DEVICE_SINGLE_FP_CONFIG, sizeof fp, &fp, NULL) == CL_SUCCESS &&
        (fp & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT))
        strcat(opts, " -cl-fp32-correctly-rounded-divide-sqrt");

    char s1[256], s2[256], s3[256], s4[256];
    platform_str(ctx->platform, CL_PLATFORM_NAME, s1, sizeof s1);
    platform_str(ctx->platform, CL_PLATFORM_VERSION, s2, sizeof s2);
    device_str(ctx->device, CL_DEVICE_VERSION, s3, sizeof s3);
    device_str(ctx->device, CL_DRIVER_VERSION, s4, sizeof s4);
    uint64_t h1 = 14695981039346656037ull, h2 = 0x9e3779b97f4a7c15ull;
    const char *parts[] = {full, opts, s1, s2, ctx->device_name, s3, s4};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        h1 = fnv_str(h1, parts[i]);
        h2 = fnv_str(h2, parts[i]);
    }
    char dir[1024], path[1100];
    int have_dir = cache_dir(dir, sizeof dir);
    if (have_dir) snprintf(path, sizeof path, "%s/%016llx%016llx.bin", dir, (unsigned long long)h1,
                           (unsigned long long)h2);

    cl_int e;
    if (have_dir) {
        size_t n = 0;
        unsigned char *bin = cache_read(path, &n);
        if (bin) {
            const unsigned char *bins[1] = {bin};
            cl_int bstatus = CL_SUCCESS;
            cl_program prog = clCreateProgramWithBinary(ctx->context, 1, &ctx->device, &n, bins, &bstatus, &e);
            twk_host_free(bin);
            if (e == CL_SUCCESS && bstatus == CL_SUCCESS &&
                clBuildProgram(prog, 1, &ctx->device, opts, NULL, NULL) == CL_SUCCESS) {
                ctx->program = prog;
                twk_host_free(full);
                return TWK_OK;
            }
            if (prog) clReleaseProgram(prog); /* rejected: build from source */
        }
    }
    const char *srcs[1] = {full};
    cl_program prog = clCreateProgramWithSource(ctx->context, 1, srcs, NULL, &e);
    twk_host_free(full);
    if (e != CL_SUCCESS) return ocl_fail(e, "clCreateProgramWithSource");
    e = clBuildProgram(prog, 1, &ctx->device, opts, NULL, NULL);
    if (e != CL_SUCCESS) {
        twk_status s = build_failed(ctx, prog, e);
        clReleaseProgram(prog);
        return s;
    }
    ctx->program = prog;
    if (have_dir) {
        size_t n = 0;
        unsigned char *bin = program_binary(prog, &n);
        if (bin) cache_write(dir, path, bin, n);
        twk_host_free(bin);
    }
    return TWK_OK;
}

cl_kernel ocl_kernel(ocl_ctx *ctx, const char *name) {
    for (int i = 0; i < ctx->n_kernels; i++)
        if (strcmp(ctx->kernel_names[i], name) == 0) return ctx->kernels[i];
    if (ctx->n_kernels == OCL_MAX_KERNELS) {
        twk_error(TWK_ERR_BACKEND, "opencl: more than %d kernels", OCL_MAX_KERNELS);
        return NULL;
    }
    cl_int e;
    cl_kernel k = clCreateKernel(ctx->program, name, &e);
    if (e != CL_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "clCreateKernel(%s)", name);
        ocl_fail(e, what);
        return NULL;
    }
    ctx->kernel_names[ctx->n_kernels] = name; /* kd's names are string literals */
    ctx->kernels[ctx->n_kernels++] = k;
    return k;
}
