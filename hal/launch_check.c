/* The rules of a launch that every backend shares, read from the op table:
 * dtypes (copies keep the element size, index sources are i32/i64, the rest
 * f32, or 16-bit where the op table and the backend's half_srcs allow) and the
 * one wording of a bad id. */
#include <stdarg.h>
#include <stdio.h>

#include "twk_backend.h"

bool twk_why(char *why, size_t why_len, const char *fmt, ...) {
    if (why && why_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
    }
    return false;
}

bool twk_launch_dtypes_ok(const twk_launch *l, unsigned half, const char *backend, char *why, size_t why_len) {
    const twk_op_traits *op = twk_op_info(l->op);
    if (op->kind == TWK_OPK_COPY) {
        size_t es = twk_dtype_size(l->dst.type);
        for (int i = 0; i < l->nsrc; i++)
            if (twk_dtype_size(l->src[i].type) != es || es == 0) {
                if (why) snprintf(why, why_len, "source %d dtype %s differs from %s", i, twk_dtype_name(l->src[i].type),
                                  twk_dtype_name(l->dst.type));
                return false;
            }
        return true;
    }
    unsigned allowed = twk_op_half_srcs(l->op);
    half &= allowed;
    bool inplace = op->kind == TWK_OPK_INPLACE && l->nsrc > 0;
    twk_dtype out = twk_op_index_out(l->op) ? TWK_I32 : TWK_F32;
    if (inplace ? l->dst.type != l->src[0].type : l->dst.type != out) {
        if (why) snprintf(why, why_len, "output dtype %s; %s computes %s", twk_dtype_name(l->dst.type), backend,
                          twk_dtype_name(out));
        return false;
    }
    for (int i = 0; i < l->nsrc; i++) {
        twk_dtype t = l->src[i].type;
        bool ok = (op->index >> i & 1) ? (t == TWK_I32 || t == TWK_I64)
                                       : t == TWK_F32 || ((half >> i & 1) && twk_dtype_is_half(t));
        if (!ok && why && twk_dtype_is_half(t) && (allowed >> i & 1))
            snprintf(why, why_len, "source %d has dtype %s: %s has no %s %s kernel (load the model with --dtype f32)", i,
                     twk_dtype_name(t), backend, twk_dtype_name(t), op->name);
        else if (!ok && why)
            snprintf(why, why_len, "source %d has dtype %s", i, twk_dtype_name(t));
        if (!ok) return false;
    }
    return true;
}

static int64_t id_at(twk_dtype t, const void *p, int64_t i) {
    return t == TWK_I64 ? ((const int64_t *)p)[i] : ((const int32_t *)p)[i];
}

/* The lowest source index in mask, or -1. */
static int first_src(unsigned mask) {
    for (int i = 0; i < TWK_MAX_SRC; i++)
        if (mask >> i & 1u) return i;
    return -1;
}

bool twk_launch_bad_id(const twk_launch *l, int64_t n, const void *const *host, char *msg, size_t len) {
    if (msg && len) msg[0] = 0;
    if (!l || !host || !msg || !len) return false;
    const twk_op_traits *op = twk_op_info(l->op);
    const twk_op_ids *r = &op->ids;
    int src = first_src(op->checked);
    if (r->check == TWK_IDS_NONE || src < 0 || src >= l->nsrc || !host[src]) return false;
    const twk_tensor_desc *t = &l->src[src];
    const twk_tensor_desc *b = r->bound_src < 0 ? &l->dst : &l->src[r->bound_src];
    int64_t count = twk_desc_nelem(t, n), bound = twk_desc_dim(b, r->bound_dim, n), prev = 0;
    for (int64_t i = 0; i < count; i++) {
        int64_t v = id_at(t->type, host[src], i);
        if (r->check == TWK_IDS_RANGE && (v < 0 || v >= bound)) {
            snprintf(msg, len, "%s '%s': %s[%lld] = %lld is outside %s[0, %lld)", op->name, l->name, r->what,
                     (long long)i, (long long)v, r->in, (long long)bound);
            return true;
        }
        if (r->check == TWK_IDS_SEGMENTS) {
            if (v < 0 || v > i || (v != prev && v != i)) {
                snprintf(msg, len, "%s '%s': %s[%lld] = %lld is not a segment start (want %lld or %lld)", op->name,
                         l->name, r->what, (long long)i, (long long)v, (long long)prev, (long long)i);
                return true;
            }
            prev = v;
        }
        if (r->check == TWK_IDS_ROWS) {
            int64_t hi = src + 1 < l->nsrc && host[src + 1] ? id_at(l->src[src + 1].type, host[src + 1], i) : v + 1;
            if (v < 0 || hi <= v || hi > bound) {
                snprintf(msg, len, "%s '%s': %s [%lld, %lld) of query %lld are not a non-empty range in [0, %lld)",
                         op->name, l->name, r->what, (long long)v, (long long)hi, (long long)i, (long long)bound);
                return true;
            }
        }
    }
    return false;
}
