/* dlopen of libOpenCL (the ICD loader) and CLBlast, once per process. The
 * handles stay open for the process's life. */
#define OCL_API_IMPL
#include "ocl_api.h"

#include <dlfcn.h>
#include <pthread.h>

ocl_api_table ocl_api;

static int cl_ok, blas_ok;
static pthread_once_t cl_once = PTHREAD_ONCE_INIT, blas_once = PTHREAD_ONCE_INIT;

static void *open_first(const char *a, const char *b) {
    void *h = dlopen(a, RTLD_NOW | RTLD_LOCAL);
    return h ? h : dlopen(b, RTLD_NOW | RTLD_LOCAL);
}

static void load_cl(void) {
    void *h = open_first("libOpenCL.so.1", "libOpenCL.so");
    if (!h) return;
#define OCL_SYM_(f)                                        \
    *(void **)&ocl_api.f = dlsym(h, #f);                   \
    if (!ocl_api.f) return;
    OCL_CL_LIST(OCL_SYM_)
#undef OCL_SYM_
    cl_ok = 1;
}

static void load_blas(void) {
    void *h = open_first("libclblast.so.1", "libclblast.so");
    if (!h) return;
#define OCL_SYM_(f)                                        \
    *(void **)&ocl_api.f = dlsym(h, #f);                   \
    if (!ocl_api.f) return;
    OCL_BLAS_LIST(OCL_SYM_)
#undef OCL_SYM_
    blas_ok = 1;
}

int ocl_api_load_cl(void) {
    pthread_once(&cl_once, load_cl);
    return cl_ok;
}

int ocl_api_load_blas(const char **why) {
    pthread_once(&blas_once, load_blas);
    if (!blas_ok && why) *why = "CLBlast (libclblast.so.1) was not found or lacks CLBlastSgemm";
    return blas_ok;
}
