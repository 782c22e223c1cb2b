/* The pluggable host allocator: every host allocation of the engine goes
 * through here so tests can make the n-th allocation fail. */
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "twinkle/hal.h"

#define TWK_HOST_ALIGN 64

/* Bytes held by the default allocator's blocks (their usable size), for twk_host_bytes_in_use. */
static size_t held;

static void *default_alloc(void *user, size_t bytes, size_t align) {
    (void)user;
    void *p = NULL;
    size_t rounded = (bytes + align - 1) / align * align;
    if (posix_memalign(&p, align, rounded ? rounded : align) != 0) return NULL;
    __atomic_add_fetch(&held, malloc_usable_size(p), __ATOMIC_RELAXED);
    return p;
}

static void default_free(void *user, void *ptr) {
    (void)user;
    __atomic_sub_fetch(&held, malloc_usable_size(ptr), __ATOMIC_RELAXED);
    free(ptr);
}

size_t twk_host_bytes_in_use(void) { return __atomic_load_n(&held, __ATOMIC_RELAXED); }

static twk_allocator current = {default_alloc, default_free, NULL};

void twk_set_allocator(const twk_allocator *a) {
    if (a) {
        current = *a;
    } else {
        current.alloc = default_alloc;
        current.free = default_free;
        current.user = NULL;
    }
}

void *twk_host_alloc(size_t bytes, const char *what) {
    void *p = current.alloc(current.user, bytes, TWK_HOST_ALIGN);
    if (!p) twk_error(TWK_ERR_OOM, "out of host memory allocating %zu bytes for %s", bytes,
                      what ? what : "?");
    return p;
}

void *twk_host_calloc(size_t bytes, const char *what) {
    void *p = twk_host_alloc(bytes, what);
    if (p) memset(p, 0, bytes);
    return p;
}

void twk_host_free(void *ptr) {
    if (ptr) current.free(current.user, ptr);
}

void *twk_host_realloc(void *ptr, size_t old_bytes, size_t new_bytes, const char *what) {
    void *p = twk_host_alloc(new_bytes, what);
    if (!p) return NULL;
    if (ptr) memcpy(p, ptr, old_bytes < new_bytes ? old_bytes : new_bytes);
    twk_host_free(ptr);
    return p;
}

char *twk_host_strdup(const char *s, const char *what) {
    size_t n = strlen(s) + 1;
    char *d = twk_host_alloc(n, what);
    if (d) memcpy(d, s, n);
    return d;
}
