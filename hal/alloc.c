/* The pluggable host allocator: every host allocation of the engine goes
 * through here so tests can make the n-th allocation fail. Each block carries
 * a header (one alignment unit) recording its pool and the bytes it was
 * charged, so the per-pool counters always sum to the total. */
#include <malloc.h>
#include <sys/mman.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "twinkle/hal.h"

#define TWK_HOST_ALIGN 64
#define HDR TWK_HOST_ALIGN /* keeps the caller's block aligned */

typedef struct block_hdr {
    size_t charged; /* usable size when the default allocator made it; 0 for another allocator */
    int pool;
} block_hdr;
_Static_assert(sizeof(block_hdr) <= HDR, "the block header fits its alignment unit");

/* Bytes held per pool by the default allocator's blocks (their usable size). */
static size_t held[TWK_HPOOL_COUNT];
static _Thread_local int cur_pool;

static const char *const pool_names[TWK_HPOOL_COUNT] = {"other", "adapter_copies", "requests", "device_buffers"};

/* Large blocks (weights, arenas) are streamed whole by every step: ask for
 * transparent huge pages on their 2 MiB-aligned interior, which saves a TLB
 * miss per 4 KiB read. Advice only: a kernel that refuses it changes nothing. */
static void advise_huge_pages(void *p, size_t bytes) {
    const uintptr_t huge = (uintptr_t)2 << 20;
    if (bytes < 4 * huge) return;
    uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1), hi = ((uintptr_t)p + bytes) & ~(huge - 1);
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
}

static void *default_alloc(void *user, size_t bytes, size_t align) {
    (void)user;
    void *p = NULL;
    size_t rounded = (bytes + align - 1) / align * align;
    if (posix_memalign(&p, align, rounded ? rounded : align) != 0) return NULL;
    advise_huge_pages(p, rounded);
    return p;
}

static void default_free(void *user, void *ptr) {
    (void)user;
    free(ptr);
}

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

twk_host_pool twk_host_pool_enter(twk_host_pool p) {
    int prev = cur_pool;
    cur_pool = (int)p >= 0 && p < TWK_HPOOL_COUNT ? (int)p : TWK_HPOOL_OTHER;
    return (twk_host_pool)prev;
}

size_t twk_host_pool_bytes(twk_host_pool p) {
    return (int)p >= 0 && p < TWK_HPOOL_COUNT ? __atomic_load_n(&held[p], __ATOMIC_RELAXED) : 0;
}

size_t twk_host_pool_snapshot(size_t out[TWK_HPOOL_COUNT]) {
    size_t sum = 0;
    for (int i = 0; i < TWK_HPOOL_COUNT; i++) sum += out[i] = __atomic_load_n(&held[i], __ATOMIC_RELAXED);
    return sum;
}

size_t twk_host_bytes_in_use(void) {
    size_t v[TWK_HPOOL_COUNT];
    return twk_host_pool_snapshot(v);
}

const char *twk_host_pool_name(twk_host_pool p) {
    return (int)p >= 0 && p < TWK_HPOOL_COUNT ? pool_names[p] : "?";
}

/* A block of `bytes` charged to pool; NULL (error set) on failure. */
static void *alloc_in(int pool, size_t bytes, const char *what) {
    char *raw = bytes <= SIZE_MAX - HDR ? current.alloc(current.user, bytes + HDR, TWK_HOST_ALIGN) : NULL;
    if (!raw) {
        twk_error(TWK_ERR_OOM, "out of host memory allocating %zu bytes for %s", bytes, what ? what : "?");
        return NULL;
    }
    block_hdr *h = (block_hdr *)raw;
    h->pool = pool;
    h->charged = current.alloc == default_alloc ? malloc_usable_size(raw) : 0;
    __atomic_add_fetch(&held[pool], h->charged, __ATOMIC_RELAXED);
    return raw + HDR;
}

void *twk_host_alloc(size_t bytes, const char *what) { return alloc_in(cur_pool, bytes, what); }

void *twk_host_pool_alloc(twk_host_pool p, size_t bytes, const char *what) {
    return alloc_in((int)p >= 0 && p < TWK_HPOOL_COUNT ? (int)p : TWK_HPOOL_OTHER, bytes, what);
}

void *twk_host_calloc(size_t bytes, const char *what) {
    void *p = twk_host_alloc(bytes, what);
    if (p) memset(p, 0, bytes);
    return p;
}

void twk_host_free(void *ptr) {
    if (!ptr) return;
    char *raw = (char *)ptr - HDR;
    const block_hdr *h = (const block_hdr *)raw;
    __atomic_sub_fetch(&held[h->pool], h->charged, __ATOMIC_RELAXED);
    current.free(current.user, raw);
}

void *twk_host_realloc(void *ptr, size_t old_bytes, size_t new_bytes, const char *what) {
    int pool = ptr ? ((const block_hdr *)((char *)ptr - HDR))->pool : cur_pool;
    void *p = alloc_in(pool, new_bytes, what);
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
