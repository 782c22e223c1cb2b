/* safetensors reading (mmap) and atomic writing. Untrusted input: every
 * offset, shape and size in a header is checked against the file. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>

#include "twinkle/hal.h"
#include "json_push.h"

#define MAX_FILES 256
#define MAX_HEADER (100u << 20)

typedef struct mapping {
    void *base;
    size_t len;
} mapping;

struct twk_safetensors {
    mapping files[MAX_FILES];
    int n_files;
    twk_st_tensor *t;
    int n, cap;
};

char *twk_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        twk_error(TWK_ERR_IO, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        twk_error(TWK_ERR_IO, "cannot seek %s", path);
        return NULL;
    }
    long size = ftell(f);
    rewind(f);
    char *buf = size >= 0 ? twk_host_alloc((size_t)size + 1, path) : NULL;
    if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size) {
        fclose(f);
        if (buf) {
            twk_host_free(buf);
            twk_error(TWK_ERR_IO, "cannot read %s", path);
        }
        return NULL;
    }
    fclose(f);
    buf[size] = 0;
    if (len) *len = (size_t)size;
    return buf;
}

static twk_st_dtype parse_dtype(const char *s, size_t *elem) {
    static const struct { const char *n; twk_st_dtype d; size_t e; } map[] = {
        {"F32", TWK_ST_F32, 4}, {"F16", TWK_ST_F16, 2}, {"BF16", TWK_ST_BF16, 2}, {"I32", TWK_ST_I32, 4},
        {"I64", TWK_ST_I64, 8}, {"F64", TWK_ST_OTHER, 8}, {"I16", TWK_ST_OTHER, 2}, {"I8", TWK_ST_OTHER, 1},
        {"U8", TWK_ST_OTHER, 1}, {"BOOL", TWK_ST_OTHER, 1}, {"U16", TWK_ST_OTHER, 2}, {"U32", TWK_ST_OTHER, 4},
        {"U64", TWK_ST_OTHER, 8}, {"F8_E4M3", TWK_ST_OTHER, 1}, {"F8_E5M2", TWK_ST_OTHER, 1},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(s, map[i].n)) {
            *elem = map[i].e;
            return map[i].d;
        }
    *elem = 0;
    return TWK_ST_OTHER;
}

static twk_status add_tensor(twk_safetensors *st, const twk_st_tensor *t) {
    if (st->n == st->cap) {
        int cap = st->cap ? st->cap * 2 : 64;
        twk_st_tensor *nt = twk_host_alloc((size_t)cap * sizeof *nt, "safetensors index");
        if (!nt) return TWK_ERR_OOM;
        if (st->n) memcpy(nt, st->t, (size_t)st->n * sizeof *nt);
        twk_host_free(st->t);
        st->t = nt;
        st->cap = cap;
    }
    st->t[st->n++] = *t;
    return TWK_OK;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = twk_host_alloc(n, "tensor name");
    if (d) memcpy(d, s, n);
    return d;
}

/* Maps one file and indexes its tensors. */
static twk_status open_file(twk_safetensors *st, const char *path) {
    if (st->n_files == MAX_FILES) return twk_error(TWK_ERR_INVALID_ARG, "%s: more than %d shards", path, MAX_FILES);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return twk_error(TWK_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size < 8) {
        close(fd);
        return twk_error(TWK_ERR_INVALID_ARG, "%s: not a safetensors file (%lld bytes)", path, (long long)sb.st_size);
    }
    size_t len = (size_t)sb.st_size;
    void *base = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (base == MAP_FAILED) return twk_error(TWK_ERR_IO, "cannot map %s: %s", path, strerror(errno));
    st->files[st->n_files].base = base;
    st->files[st->n_files].len = len;
    st->n_files++;
    const unsigned char *b = base;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b[i];
    if (hlen > MAX_HEADER || hlen > len - 8)
        return twk_error(TWK_ERR_INVALID_ARG, "%s: header length %llu exceeds the file (%zu bytes)", path,
                         (unsigned long long)hlen, len);
    cJSON *h = cJSON_ParseWithLength((const char *)b + 8, (size_t)hlen);
    if (!h || !cJSON_IsObject(h)) {
        cJSON_Delete(h);
        return twk_error(TWK_ERR_INVALID_ARG, "%s: header is not a JSON object", path);
    }
    const unsigned char *data = b + 8 + hlen;
    size_t data_len = len - 8 - (size_t)hlen;
    twk_status rc = TWK_OK;
    for (cJSON *e = h->child; e && rc == TWK_OK; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) continue;
        cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
        cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 ||
            cJSON_GetArraySize(sh) > 8) {
            rc = twk_error(TWK_ERR_INVALID_ARG, "%s: tensor '%s' has a malformed entry", path, e->string);
            break;
        }
        twk_st_tensor t;
        memset(&t, 0, sizeof t);
        size_t esize = 0;
        t.dtype = parse_dtype(dt->valuestring, &esize);
        snprintf(t.dtype_name, sizeof t.dtype_name, "%s", dt->valuestring);
        if (!esize) {
            rc = twk_error(TWK_ERR_DTYPE, "%s: tensor '%s' has unknown dtype %s", path, e->string, dt->valuestring);
            break;
        }
        t.ndim = cJSON_GetArraySize(sh);
        int64_t n = 1;
        int overflow = 0, zero = 0;
        for (int i = 0; i < t.ndim; i++) {
            cJSON *d = cJSON_GetArrayItem(sh, i);
            if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble > 1e12) {
                rc = twk_error(TWK_ERR_INVALID_ARG, "%s: tensor '%s' has a bad shape", path, e->string);
                break;
            }
            t.shape[i] = (int64_t)d->valuedouble;
            zero |= t.shape[i] == 0;
            overflow |= __builtin_mul_overflow(n, t.shape[i], &n);
        }
        if (rc != TWK_OK) break;
        t.nelem = zero ? 0 : overflow ? INT64_MAX : n; /* past data_len / esize either way: refused below */
        double b0 = cJSON_GetArrayItem(off, 0)->valuedouble, b1 = cJSON_GetArrayItem(off, 1)->valuedouble;
        if (!(b0 >= 0 && b1 >= b0 && b1 <= (double)data_len) || (uint64_t)t.nelem > data_len / esize ||
            (size_t)(b1 - b0) != (size_t)t.nelem * esize) {
            rc = twk_error(TWK_ERR_INVALID_ARG,
                           "%s: tensor '%s' offsets [%.0f, %.0f) do not fit %lld x %zu bytes in %zu data bytes", path,
                           e->string, b0, b1, (long long)t.nelem, esize, data_len);
            break;
        }
        t.data = data + (size_t)b0;
        t.bytes = (size_t)(b1 - b0);
        t.name = dup_str(e->string);
        if (!t.name) rc = TWK_ERR_OOM;
        else if ((rc = add_tensor(st, &t)) != TWK_OK) twk_host_free(t.name);
    }
    cJSON_Delete(h);
    return rc;
}

static int is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static twk_status open_index(twk_safetensors *st, const char *index_path) {
    char *text = twk_read_file(index_path, NULL);
    if (!text) return TWK_ERR_IO;
    cJSON *j = cJSON_Parse(text);
    twk_host_free(text);
    cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(j);
        return twk_error(TWK_ERR_INVALID_ARG, "%s: no weight_map object", index_path);
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", index_path);
    char *slash = strrchr(dir, '/');
    if (slash) slash[1] = 0;
    else dir[0] = 0;
    /* open each distinct shard once, in the order first named */
    const char *seen[MAX_FILES];
    int n_seen = 0;
    twk_status rc = TWK_OK;
    for (cJSON *e = wm->child; e && rc == TWK_OK; e = e->next) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || strstr(e->valuestring, "..")) {
            rc = twk_error(TWK_ERR_INVALID_ARG, "%s: bad shard name for '%s'", index_path, e->string);
            break;
        }
        int dup = 0;
        for (int i = 0; i < n_seen; i++) dup |= !strcmp(seen[i], e->valuestring);
        if (dup) continue;
        if (n_seen == MAX_FILES) {
            rc = twk_error(TWK_ERR_INVALID_ARG, "%s: more than %d shards", index_path, MAX_FILES);
            break;
        }
        seen[n_seen++] = e->valuestring;
        char path[4096 + 256];
        snprintf(path, sizeof path, "%s%s", dir, e->valuestring);
        rc = open_file(st, path);
    }
    for (cJSON *e = wm->child; e && rc == TWK_OK; e = e->next)
        if (!twk_st_find(st, e->string))
            rc = twk_error(TWK_ERR_INVALID_ARG, "%s: '%s' is not in its shard %s", index_path, e->string,
                           e->valuestring);
    cJSON_Delete(j);
    return rc;
}

twk_status twk_st_open(const char *path, twk_safetensors **out) {
    if (!out || !path) return twk_error(TWK_ERR_INVALID_ARG, "st_open: NULL argument");
    *out = NULL;
    twk_safetensors *st = twk_host_calloc(sizeof *st, "safetensors");
    if (!st) return TWK_ERR_OOM;
    twk_status rc;
    char buf[4096 + 64];
    if (is_dir(path)) {
        snprintf(buf, sizeof buf, "%s/model.safetensors", path);
        if (exists(buf)) rc = open_file(st, buf);
        else {
            snprintf(buf, sizeof buf, "%s/model.safetensors.index.json", path);
            rc = exists(buf) ? open_index(st, buf)
                             : twk_error(TWK_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json", path);
        }
    } else {
        size_t n = strlen(path);
        rc = n > 5 && !strcmp(path + n - 5, ".json") ? open_index(st, path) : open_file(st, path);
    }
    if (rc != TWK_OK) {
        twk_st_close(st);
        return rc;
    }
    *out = st;
    return TWK_OK;
}

void twk_st_close(twk_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n; i++) twk_host_free(st->t[i].name);
    twk_host_free(st->t);
    for (int i = 0; i < st->n_files; i++) munmap(st->files[i].base, st->files[i].len);
    twk_host_free(st);
}

int twk_st_count(const twk_safetensors *st) { return st ? st->n : 0; }
const twk_st_tensor *twk_st_at(const twk_safetensors *st, int i) {
    return st && i >= 0 && i < st->n ? &st->t[i] : NULL;
}

const twk_st_tensor *twk_st_find(const twk_safetensors *st, const char *name) {
    for (int i = 0; st && name && i < st->n; i++)
        if (!strcmp(st->t[i].name, name)) return &st->t[i];
    return NULL;
}

int twk_st_hal_dtype(twk_st_dtype d) {
    return d == TWK_ST_F32 ? TWK_F32 : d == TWK_ST_BF16 ? TWK_BF16 : d == TWK_ST_F16 ? TWK_F16 : -1;
}

twk_status twk_st_to_f32(const twk_st_tensor *t, float *dst) {
    int d = twk_st_hal_dtype(t->dtype);
    if (d < 0) return twk_error(TWK_ERR_DTYPE, "tensor '%s' has dtype %s; expected F32, F16 or BF16", t->name, t->dtype_name);
    return twk_dtype_to_f32((twk_dtype)d, t->data, dst, t->nelem); /* little-endian host: the file's bytes */
}

twk_status twk_st_from_f32(twk_st_dtype dtype, const float *src, int64_t n, void *dst) {
    int d = twk_st_hal_dtype(dtype);
    if (d < 0) return twk_error(TWK_ERR_DTYPE, "st_from_f32: not a float dtype");
    return twk_dtype_from_f32((twk_dtype)d, src, dst, n);
}

static int fsync_dir_of(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    int fd = open(dirname(tmp), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int r = fsync(fd);
    close(fd);
    return r;
}

static twk_status write_all(int fd, const void *data, size_t n, const char *path) {
    const unsigned char *p = data;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return twk_error(TWK_ERR_IO, "write to %s failed: %s", path, strerror(errno));
        p += w;
        n -= (size_t)w;
    }
    return TWK_OK;
}

/* Opens path.tmp.<pid> for writing. */
static int open_temp(const char *path, char *tmp, size_t tmp_len) {
    snprintf(tmp, tmp_len, "%s.tmp.%ld", path, (long)getpid());
    return open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
}

static twk_status finish_temp(int fd, const char *tmp, const char *path, twk_status rc) {
    if (rc == TWK_OK && fsync(fd) != 0) rc = twk_error(TWK_ERR_IO, "fsync %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && rc == TWK_OK) rc = twk_error(TWK_ERR_IO, "close %s: %s", tmp, strerror(errno));
    if (rc == TWK_OK && rename(tmp, path) != 0) rc = twk_error(TWK_ERR_IO, "rename %s: %s", path, strerror(errno));
    if (rc != TWK_OK) unlink(tmp);
    else fsync_dir_of(path);
    return rc;
}

twk_status twk_write_file_atomic(const char *path, const void *data, size_t bytes) {
    char tmp[4200];
    int fd = open_temp(path, tmp, sizeof tmp);
    if (fd < 0) return twk_error(TWK_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    return finish_temp(fd, tmp, path, write_all(fd, data, bytes, tmp));
}

static const char *dtype_str(twk_st_dtype d) {
    return d == TWK_ST_F32   ? "F32"
           : d == TWK_ST_I32  ? "I32"
           : d == TWK_ST_I64  ? "I64"
           : d == TWK_ST_F16  ? "F16"
           : d == TWK_ST_BF16 ? "BF16"
                              : NULL;
}

static size_t elem_bytes(twk_st_dtype d) { return d == TWK_ST_I64 ? 8 : d == TWK_ST_F16 || d == TWK_ST_BF16 ? 2 : 4; }

twk_status twk_st_write(const char *path, const twk_st_entry *e, int n, const char *const *meta, int n_meta) {
    cJSON *h = cJSON_CreateObject();
    if (!h) return twk_error(TWK_ERR_OOM, "st_write: out of memory");
    int ok = 1; /* every part of the header made: else out of memory */
    if (n_meta > 0) {
        cJSON *m = cJSON_AddObjectToObject(h, "__metadata__");
        ok = m != NULL;
        for (int i = 0; m && i < n_meta; i++) ok = cJSON_AddStringToObject(m, meta[2 * i], meta[2 * i + 1]) && ok;
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const char *ds = dtype_str(e[i].dtype);
        if (!ds || e[i].ndim < 0 || e[i].ndim > 8) {
            cJSON_Delete(h);
            return twk_error(TWK_ERR_INVALID_ARG, "st_write: tensor '%s' has an unsupported dtype or rank", e[i].name);
        }
        int64_t ne = 1;
        cJSON *t = cJSON_AddObjectToObject(h, e[i].name);
        ok = ok && t && cJSON_AddStringToObject(t, "dtype", ds);
        cJSON *sh = t ? cJSON_AddArrayToObject(t, "shape") : NULL;
        for (int k = 0; k < e[i].ndim; k++) {
            ok = twk_json_push(sh, cJSON_CreateNumber((double)e[i].shape[k])) && ok;
            ne *= e[i].shape[k];
        }
        ok = ok && sh;
        size_t bytes = (size_t)ne * elem_bytes(e[i].dtype);
        cJSON *o = t ? cJSON_AddArrayToObject(t, "data_offsets") : NULL;
        ok = twk_json_push(o, cJSON_CreateNumber((double)off)) && ok;
        ok = twk_json_push(o, cJSON_CreateNumber((double)(off + bytes))) && ok;
        off += bytes;
    }
    char *json = ok ? cJSON_PrintUnformatted(h) : NULL;
    cJSON_Delete(h);
    if (!json) return twk_error(TWK_ERR_OOM, "st_write: out of memory");
    size_t jl = strlen(json), padded = (jl + 7) / 8 * 8;
    char tmp[4200];
    int fd = open_temp(path, tmp, sizeof tmp);
    if (fd < 0) {
        cJSON_free(json);
        return twk_error(TWK_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    twk_status rc = write_all(fd, len8, 8, tmp);
    if (rc == TWK_OK) rc = write_all(fd, json, jl, tmp);
    if (rc == TWK_OK && padded > jl) rc = write_all(fd, "        ", padded - jl, tmp);
    cJSON_free(json);
    for (int i = 0; i < n && rc == TWK_OK; i++) {
        int64_t ne = 1;
        for (int k = 0; k < e[i].ndim; k++) ne *= e[i].shape[k];
        rc = write_all(fd, e[i].data, (size_t)ne * elem_bytes(e[i].dtype), tmp);
    }
    return finish_temp(fd, tmp, path, rc);
}
