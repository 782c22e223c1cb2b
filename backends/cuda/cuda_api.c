/* dlopen of libcuda.so.1 and libcublas.so.13; see cuda_api.h. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"

#define CU_STR_(x) #x
#define CU_STR(x) CU_STR_(x) /* expands cuda.h's renaming first: "cuMemAlloc_v2" */

static cu_api api;
static int api_ok;
static char api_why[256];
static pthread_once_t api_once = PTHREAD_ONCE_INIT;

static pthread_mutex_t blas_lock = PTHREAD_MUTEX_INITIALIZER;
static int blas_tried;
static char blas_why[512];

static void *open_first(const char *const *names, char *err, size_t err_len) {
    err[0] = 0;
    for (int i = 0; names[i]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
        if (!err[0]) {
            const char *e = dlerror();
            snprintf(err, err_len, "%s", e ? e : names[i]);
        }
    }
    return NULL;
}

static void load_driver(void) {
    static const char *const names[] = {"libcuda.so.1", "libcuda.so", NULL};
    char err[200];
    void *h = open_first(names, err, sizeof err);
    if (!h) {
        snprintf(api_why, sizeof api_why, "no NVIDIA driver: cannot load libcuda.so.1 (%s)", err);
        return;
    }
#define CU_LOAD_(f)                                                                          \
    {                                                                                        \
        void *sym_ = dlsym(h, CU_STR(f));                                                    \
        memcpy(&api.f, &sym_, sizeof sym_);                                                  \
    }                                                                                        \
    if (!api.f) {                                                                            \
        snprintf(api_why, sizeof api_why, "the NVIDIA driver is too old: libcuda.so.1 lacks %s", \
                 CU_STR(f));                                                                 \
        return;                                                                              \
    }
    CU_FUNCS(CU_LOAD_)
#undef CU_LOAD_
#define CU_LOAD_OPT_(f)                                                                      \
    {                                                                                        \
        void *sym_ = dlsym(h, CU_STR(f));                                                    \
        memcpy(&api.f, &sym_, sizeof sym_);                                                  \
    }
    CU_OPT_FUNCS(CU_LOAD_OPT_)
#undef CU_LOAD_OPT_
    CUresult r = api.cuInit(0);
    if (r != CUDA_SUCCESS) {
        char b[160];
        snprintf(api_why, sizeof api_why, "cuInit failed: %s", cu_errstr(r, b, sizeof b));
        return;
    }
    if (api.cuDriverGetVersion(&api.driver_version) != CUDA_SUCCESS) api.driver_version = 0;
    api_ok = 1;
}

const cu_api *cu_load(void) {
    pthread_once(&api_once, load_driver);
    return api_ok ? &api : NULL;
}

const char *cu_unavailable(void) {
    pthread_once(&api_once, load_driver);
    return api_ok ? "" : api_why;
}

static void *open_blas_lib(const char *file, char *err, size_t err_len) {
    char paths[3][512];
    const char *names[5];
    int k = 0;
    names[k++] = file; /* the loader's own search (LD_LIBRARY_PATH, ld.so.cache) */
    const char *home = getenv("CUDA_HOME");
    if (!home || !*home) home = getenv("CUDA_PATH");
    if (home && *home) {
        snprintf(paths[0], sizeof paths[0], "%s/lib64/%s", home, file);
        names[k++] = paths[0];
    }
    snprintf(paths[1], sizeof paths[1], "/usr/local/cuda/lib64/%s", file);
    names[k++] = paths[1];
    names[k] = NULL;
    return open_first(names, err, err_len);
}

int cu_load_blas(char *why, size_t why_len) {
    if (!cu_load()) {
        snprintf(why, why_len, "%s", cu_unavailable());
        return 0;
    }
    pthread_mutex_lock(&blas_lock);
    if (!blas_tried) {
        blas_tried = 1;
        char err[300];
        /* cuBLAS needs cuBLASLt; loading it first from the same places lets
         * libcublas find it even where its directory is not on the search path */
        void *lt = open_blas_lib("libcublasLt.so.13", err, sizeof err);
        (void)lt; /* kept loaded for the process */
        void *h = open_blas_lib("libcublas.so.13", err, sizeof err);
        if (!h) {
            snprintf(blas_why, sizeof blas_why, "cannot load cuBLAS (libcublas.so.13): %s", err);
        } else {
            int ok = 1;
#define CUBLAS_LOAD_(f)                                                                        \
    if (ok) {                                                                                  \
        void *sym_ = dlsym(h, CU_STR(f));                                                      \
        memcpy(&api.f, &sym_, sizeof sym_);                                                    \
        if (!api.f) {                                                                          \
            snprintf(blas_why, sizeof blas_why, "libcublas.so.13 lacks %s", CU_STR(f));       \
            ok = 0;                                                                            \
        }                                                                                      \
    }
            CUBLAS_FUNCS(CUBLAS_LOAD_)
#undef CUBLAS_LOAD_
            api.blas_loaded = ok;
        }
    }
    int ok = api.blas_loaded;
    if (!ok) snprintf(why, why_len, "%s", blas_why);
    pthread_mutex_unlock(&blas_lock);
    return ok;
}

const char *cu_errstr(CUresult r, char *buf, size_t len) {
    const char *name = NULL, *desc = NULL;
    if (api.cuGetErrorName && api.cuGetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
    if (api.cuGetErrorString && api.cuGetErrorString(r, &desc) != CUDA_SUCCESS) desc = NULL;
    if (name && desc) snprintf(buf, len, "%s (%s)", name, desc);
    else snprintf(buf, len, "CUresult %d", (int)r);
    return buf;
}
