/* The backend registry and opened devices. Backends are found by name here,
 * never through their headers. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "twk_backend.h"

#define TWK_MAX_BACKENDS 16

struct twk_device {
    const twk_backend_iface *iface;
    void *ctx;
    int index;
    char spec[48];
    _Atomic uint64_t mem_live, mem_peak; /* bytes of buffers allocated through twk_buffer_alloc */
    _Atomic uint64_t pool_live[TWK_DPOOL_COUNT]; /* the same bytes per twk_device_pool */
};

static _Thread_local int cur_pool; /* this thread's twk_device_pool */
static const char *const pool_names[TWK_DPOOL_COUNT] = {"other", "weights", "adapters", "sampler_adapters",
                                                         "pack_slots", "activations", "kv_cache"};

static const twk_backend_iface *backends[TWK_MAX_BACKENDS];
static int n_backends;
/* per registry slot: bytes up, bytes down, uploads, downloads (twk_backend_transfers) */
static _Atomic uint64_t transfers[TWK_MAX_BACKENDS][4];
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t builtin_once = PTHREAD_ONCE_INIT;

static bool iface_complete(const twk_backend_iface *b) {
    return b->name && b->device_count && b->device_props && b->open && b->close &&
           b->buffer_alloc && b->buffer_free && b->upload && b->download && b->copy &&
           b->memset_zero && b->supports_op && b->op_kernel && b->prepare && b->release && b->run &&
           b->synchronize;
}

static twk_status register_locked(const twk_backend_iface *iface) {
    if (!iface || !iface_complete(iface))
        return twk_error(TWK_ERR_INVALID_ARG, "backend_register: incomplete function table%s%s",
                         iface && iface->name ? " for " : "", iface && iface->name ? iface->name : "");
    for (int i = 0; i < n_backends; i++)
        if (strcmp(backends[i]->name, iface->name) == 0)
            return twk_error(TWK_ERR_INVALID_ARG, "backend_register: '%s' is already registered",
                             iface->name);
    if (n_backends == TWK_MAX_BACKENDS)
        return twk_error(TWK_ERR_INVALID_ARG, "backend_register: registry full (%d)",
                         TWK_MAX_BACKENDS);
    backends[n_backends++] = iface;
    return TWK_OK;
}

/* Appends " name" to buf (truncating quietly). */
static void list_add(char *buf, size_t len, size_t *used, const char *fmt, const char *a, const char *b) {
    if (!buf || *used >= len) return;
    int k = snprintf(buf + *used, len - *used, fmt, a, b);
    if (k > 0) *used += (size_t)k;
}

int twk_backend_missing_kernels(const twk_backend_iface *b, char *msg, size_t len, char *note, size_t note_len) {
    const twk_backend_iface *cpu = twk_cpu_backend();
    size_t used = 0, nused = 0;
    int missing = 0;
    if (msg && len) msg[0] = 0;
    if (note && note_len) note[0] = 0;
    for (int op = 0; op < TWK_OP_COUNT; op++) {
        const char *why = NULL;
        if (!twk_op_has_kernel((twk_op)op) || !cpu->op_kernel((twk_op)op, &why)) continue;
        why = NULL;
        if (b->op_kernel((twk_op)op, &why)) continue;
        if (why) {
            list_add(note, note_len, &nused, " %s (%s)", twk_op_name((twk_op)op), why);
            continue;
        }
        missing++;
        list_add(msg, len, &used, " %s%s", twk_op_name((twk_op)op), "");
    }
    return missing;
}

/* Built-in optional backends (each defined by its folder when built). */
#ifdef TWK_HAVE_OPENCL
const twk_backend_iface *twk_opencl_backend(void);
#endif
#ifdef TWK_HAVE_VULKAN
const twk_backend_iface *twk_vulkan_backend(void);
#endif
#ifdef TWK_HAVE_CUDA
const twk_backend_iface *twk_cuda_backend(void);
#endif

static void register_builtins(void) {
    pthread_mutex_lock(&reg_lock);
    register_locked(twk_cpu_backend());
#ifdef TWK_HAVE_OPENCL
    register_locked(twk_opencl_backend());
#endif
#ifdef TWK_HAVE_VULKAN
    register_locked(twk_vulkan_backend());
#endif
#ifdef TWK_HAVE_CUDA
    register_locked(twk_cuda_backend());
#endif
    pthread_mutex_unlock(&reg_lock);
}

twk_status twk_backend_register(const twk_backend_iface *iface) {
    pthread_once(&builtin_once, register_builtins);
    pthread_mutex_lock(&reg_lock);
    twk_status s = register_locked(iface);
    pthread_mutex_unlock(&reg_lock);
    return s;
}

twk_status twk_backend_unregister(const char *name) {
    pthread_once(&builtin_once, register_builtins);
    twk_status s = twk_error(TWK_ERR_NOT_FOUND, "backend_unregister: no backend '%s'",
                             name ? name : "(null)");
    pthread_mutex_lock(&reg_lock);
    for (int i = 0; name && i < n_backends; i++) {
        if (strcmp(backends[i]->name, name) == 0) {
            memmove(&backends[i], &backends[i + 1], (size_t)(n_backends - i - 1) * sizeof *backends);
            for (int j = i; j < TWK_MAX_BACKENDS; j++) /* the counters follow their backends */
                for (int k = 0; k < 4; k++)
                    atomic_store(&transfers[j][k], j + 1 < TWK_MAX_BACKENDS ? atomic_load(&transfers[j + 1][k]) : 0);
            n_backends--;
            s = TWK_OK;
            twk_clear_error();
            break;
        }
    }
    pthread_mutex_unlock(&reg_lock);
    return s;
}

int twk_backend_count(void) {
    pthread_once(&builtin_once, register_builtins);
    pthread_mutex_lock(&reg_lock);
    int n = n_backends;
    pthread_mutex_unlock(&reg_lock);
    return n;
}

const twk_backend_iface *twk_backend_get(int i) {
    pthread_once(&builtin_once, register_builtins);
    pthread_mutex_lock(&reg_lock);
    const twk_backend_iface *b = (i >= 0 && i < n_backends) ? backends[i] : NULL;
    pthread_mutex_unlock(&reg_lock);
    return b;
}

const twk_backend_iface *twk_backend_find(const char *name) {
    pthread_once(&builtin_once, register_builtins);
    const twk_backend_iface *b = NULL;
    pthread_mutex_lock(&reg_lock);
    for (int i = 0; name && i < n_backends; i++)
        if (strcmp(backends[i]->name, name) == 0) b = backends[i];
    pthread_mutex_unlock(&reg_lock);
    return b;
}

twk_status twk_device_open(const char *spec, twk_device **out) {
    if (!out) return twk_error(TWK_ERR_INVALID_ARG, "device_open: out is NULL");
    *out = NULL;
    if (!spec || !*spec) spec = "cpu";
    char name[32];
    const char *colon = strchr(spec, ':');
    size_t len = colon ? (size_t)(colon - spec) : strlen(spec);
    if (len == 0 || len >= sizeof name)
        return twk_error(TWK_ERR_INVALID_ARG, "device_open: bad device spec '%s'", spec);
    memcpy(name, spec, len);
    name[len] = 0;
    long index = 0;
    if (colon) {
        char *end = NULL;
        index = strtol(colon + 1, &end, 10);
        if (!colon[1] || *end || index < 0 || index > 1024)
            return twk_error(TWK_ERR_INVALID_ARG,
                             "device_open: bad device index in '%s' (want name[:N])", spec);
    }
    const twk_backend_iface *b = twk_backend_find(name);
    if (!b) return twk_error(TWK_ERR_NOT_FOUND, "device_open: no backend '%s' in this build", name);
    twk_clear_error(); /* a backend with no devices may leave the reason */
    int count = b->device_count();
    if (index >= count) {
        const char *why = twk_last_error();
        return twk_error(TWK_ERR_NOT_FOUND, "device_open: backend '%s' has %d device(s); no index %ld%s%s%s",
                         name, count, index, why[0] ? " (" : "", why, why[0] ? ")" : "");
    }
    twk_device *d = twk_host_calloc(sizeof *d, "device");
    if (!d) return TWK_ERR_OOM;
    twk_status s = b->open((int)index, &d->ctx);
    if (s != TWK_OK) {
        twk_host_free(d);
        return s;
    }
    d->iface = b;
    d->index = (int)index;
    snprintf(d->spec, sizeof d->spec, "%s:%ld", name, index);
    *out = d;
    return TWK_OK;
}

void twk_device_close(twk_device *dev) {
    if (!dev) return;
    dev->iface->close(dev->ctx);
    twk_host_free(dev);
}

const twk_backend_iface *twk_device_backend(const twk_device *dev) { return dev->iface; }
void *twk_device_ctx(const twk_device *dev) { return dev->ctx; }
const char *twk_device_spec(const twk_device *dev) { return dev->spec; }

size_t twk_buffer_size(const twk_buffer *buf) { return buf ? buf->size : 0; }

twk_status twk_buffer_alloc(twk_device *dev, size_t bytes, twk_buffer **out) {
    if (!dev || !out) return twk_error(TWK_ERR_INVALID_ARG, "buffer_alloc: NULL argument");
    *out = NULL;
    /* a host-memory backend's buffers are the host's device_buffers pool */
    twk_host_pool hp = twk_host_pool_enter(TWK_HPOOL_DEVICE_BUFFERS);
    twk_status st = dev->iface->buffer_alloc(dev->ctx, bytes, out);
    twk_host_pool_enter(hp);
    if (st != TWK_OK) return st;
    (*out)->pool = cur_pool;
    atomic_fetch_add(&dev->pool_live[cur_pool], (uint64_t)bytes);
    uint64_t live = atomic_fetch_add(&dev->mem_live, (uint64_t)bytes) + bytes, peak = atomic_load(&dev->mem_peak);
    while (live > peak && !atomic_compare_exchange_weak(&dev->mem_peak, &peak, live)) {
    }
    return TWK_OK;
}

void twk_buffer_free(twk_device *dev, twk_buffer *buf) {
    if (!dev || !buf) return;
    atomic_fetch_sub(&dev->mem_live, (uint64_t)twk_buffer_size(buf));
    atomic_fetch_sub(&dev->pool_live[buf->pool >= 0 && buf->pool < TWK_DPOOL_COUNT ? buf->pool : 0],
                     (uint64_t)twk_buffer_size(buf));
    dev->iface->buffer_free(dev->ctx, buf);
}

unsigned twk_device_half_srcs(const twk_device *dev, twk_op op) {
    if (!dev || (int)op < 0 || op >= TWK_OP_COUNT || !dev->iface->half_srcs) return 0;
    return dev->iface->half_srcs(op) & twk_op_half_srcs(op);
}

bool twk_device_has_op(const twk_device *dev, twk_op op) {
    const char *why = NULL;
    return dev && twk_op_has_kernel(op) && dev->iface->op_kernel(op, &why);
}

void twk_device_memory(twk_device *dev, uint64_t *live, uint64_t *peak, bool reset_peak) {
    if (live) *live = dev ? atomic_load(&dev->mem_live) : 0;
    if (peak) *peak = dev ? atomic_load(&dev->mem_peak) : 0;
    if (dev && reset_peak) atomic_store(&dev->mem_peak, atomic_load(&dev->mem_live));
}

size_t twk_device_buffer_bytes(const twk_device *dev) {
    return dev ? (size_t)atomic_load(&((twk_device *)dev)->mem_live) : 0;
}

twk_device_pool twk_device_pool_enter(twk_device_pool p) {
    int prev = cur_pool;
    cur_pool = (int)p >= 0 && p < TWK_DPOOL_COUNT ? (int)p : TWK_DPOOL_OTHER;
    return (twk_device_pool)prev;
}

size_t twk_device_pool_bytes(const twk_device *dev, twk_device_pool p) {
    return dev && (int)p >= 0 && p < TWK_DPOOL_COUNT ? (size_t)atomic_load(&((twk_device *)dev)->pool_live[p]) : 0;
}

size_t twk_device_pool_snapshot(const twk_device *dev, size_t out[TWK_DPOOL_COUNT]) {
    size_t sum = 0;
    for (int i = 0; i < TWK_DPOOL_COUNT; i++) sum += out[i] = twk_device_pool_bytes(dev, (twk_device_pool)i);
    return sum;
}

const char *twk_device_pool_name(twk_device_pool p) {
    return (int)p >= 0 && p < TWK_DPOOL_COUNT ? pool_names[p] : "?";
}

static twk_status check_range(const char *what, const twk_buffer *b, size_t off, size_t bytes) {
    if (!b) return twk_error(TWK_ERR_INVALID_ARG, "%s: NULL buffer", what);
    if (off > b->size || bytes > b->size - off)
        return twk_error(TWK_ERR_INVALID_ARG, "%s: range [%zu, %zu) outside buffer of %zu bytes",
                         what, off, off + bytes, b->size);
    return TWK_OK;
}

/* The registry slot of backend b, or -1. */
static int slot_of(const twk_backend_iface *b) {
    for (int i = 0; b && i < n_backends; i++)
        if (backends[i] == b) return i;
    return -1;
}

/* Counts `bytes` moved by dev in direction dir (0 up, 1 down). */
static void count_transfer(const twk_device *dev, int dir, size_t bytes) {
    int i = slot_of(dev->iface);
    if (i < 0) return;
    atomic_fetch_add(&transfers[i][dir], (uint64_t)bytes);
    atomic_fetch_add(&transfers[i][2 + dir], 1);
}

twk_transfer_stats twk_backend_transfers(const twk_backend_iface *b) {
    twk_transfer_stats s = {0, 0, 0, 0};
    int only = b ? slot_of(b) : -1;
    for (int i = 0; i < n_backends && (!b || only >= 0); i++) {
        if (b && i != only) continue;
        s.upload_bytes += atomic_load(&transfers[i][0]);
        s.download_bytes += atomic_load(&transfers[i][1]);
        s.uploads += atomic_load(&transfers[i][2]);
        s.downloads += atomic_load(&transfers[i][3]);
    }
    return s;
}

void twk_backend_transfers_reset(const twk_backend_iface *b) {
    int only = b ? slot_of(b) : -1;
    for (int i = 0; i < TWK_MAX_BACKENDS; i++)
        for (int k = 0; k < 4 && (!b || i == only); k++) atomic_store(&transfers[i][k], 0);
}

twk_status twk_buffer_upload(twk_device *dev, twk_buffer *dst, size_t off, const void *src,
                             size_t bytes) {
    twk_status s = check_range("buffer_upload", dst, off, bytes);
    if (s != TWK_OK) return s;
    if (!src && bytes) return twk_error(TWK_ERR_INVALID_ARG, "buffer_upload: NULL source");
    if (!bytes) return TWK_OK;
    count_transfer(dev, 0, bytes);
    return dev->iface->upload(dev->ctx, dst, off, src, bytes);
}

twk_status twk_buffer_download(twk_device *dev, const twk_buffer *src, size_t off, void *dst,
                               size_t bytes) {
    twk_status s = check_range("buffer_download", src, off, bytes);
    if (s != TWK_OK) return s;
    if (!dst && bytes) return twk_error(TWK_ERR_INVALID_ARG, "buffer_download: NULL destination");
    if (!bytes) return TWK_OK;
    count_transfer(dev, 1, bytes);
    return dev->iface->download(dev->ctx, src, off, dst, bytes);
}

twk_status twk_buffer_copy(twk_device *dev, twk_buffer *dst, size_t doff, const twk_buffer *src,
                           size_t soff, size_t bytes) {
    twk_status s = check_range("buffer_copy (dst)", dst, doff, bytes);
    if (s == TWK_OK) s = check_range("buffer_copy (src)", src, soff, bytes);
    if (s != TWK_OK) return s;
    return bytes ? dev->iface->copy(dev->ctx, dst, doff, src, soff, bytes) : TWK_OK;
}

twk_status twk_buffer_zero(twk_device *dev, twk_buffer *dst, size_t off, size_t bytes) {
    twk_status s = check_range("buffer_zero", dst, off, bytes);
    if (s != TWK_OK) return s;
    return bytes ? dev->iface->memset_zero(dev->ctx, dst, off, bytes) : TWK_OK;
}

twk_status twk_device_synchronize(twk_device *dev) {
    if (!dev) return twk_error(TWK_ERR_INVALID_ARG, "device_synchronize: NULL device");
    return dev->iface->synchronize(dev->ctx);
}

const char *twk_backend_name(const twk_backend_iface *b) { return b ? b->name : ""; }

int twk_backend_device_count(const twk_backend_iface *b) { return b ? b->device_count() : 0; }

twk_status twk_backend_device_props(const twk_backend_iface *b, int index, twk_device_props *out) {
    if (!b || !out) return twk_error(TWK_ERR_INVALID_ARG, "backend_device_props: NULL argument");
    if (index < 0 || index >= b->device_count())
        return twk_error(TWK_ERR_INVALID_ARG, "backend_device_props: %s has no device %d", b->name, index);
    return b->device_props(index, out);
}

twk_status twk_device_get_props(const twk_device *dev, twk_device_props *out) {
    if (!dev) return twk_error(TWK_ERR_INVALID_ARG, "device_get_props: NULL device");
    return twk_backend_device_props(dev->iface, dev->index, out);
}
