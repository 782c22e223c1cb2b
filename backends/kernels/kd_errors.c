/* Error messages for the codes kernels store: the code's meaning, and the
 * first bad id found again on the host (the error path only), worded like
 * the CPU backend's checks. */
#include <stdio.h>

#include "kd_internal.h"

const char *kd_error_message(int code) {
    switch (code) {
    case KD_ERR_NONE: return "no error";
    case KD_ERR_ID_RANGE: return "an id, target, row or slot is outside its table";
    case KD_ERR_SEGMENT: return "a seg_start is not a segment start (want the previous token's start or the token itself)";
    default: return "unknown kernel error";
    }
}

unsigned kd_checked_sources(const twk_launch *l) { return twk_op_info(l->op)->checked; }

static int64_t id_at(const twk_launch *l, int src, const void *p, int64_t i) {
    return l->src[src].type == TWK_I64 ? ((const int64_t *)p)[i] : ((const int32_t *)p)[i];
}

/* The first id of src outside [0, limit) as a message; 1 if one was found. */
static int first_out(const twk_launch *l, int64_t n, const void *const *host, int src, int64_t limit,
                     const char *what, char *msg, size_t len) {
    const void *p = host[src];
    int64_t cnt = kd_nelem(&l->src[src], n);
    for (int64_t i = 0; p && i < cnt; i++) {
        int64_t v = id_at(l, src, p, i);
        if (v < 0 || v >= limit) {
            snprintf(msg, len, "%s '%s': %s[%lld] = %lld is outside %s[0, %lld)", twk_op_name(l->op), l->name, what,
                     (long long)i, (long long)v, l->op == TWK_OP_KV_WRITE ? "the cache " : "", (long long)limit);
            return 1;
        }
    }
    return 0;
}

static void segments(const twk_launch *l, int64_t n, const void *const *host, int src, char *msg, size_t len) {
    const void *p = host[src];
    int64_t cnt = kd_nelem(&l->src[src], n), prev = 0;
    for (int64_t i = 0; p && i < cnt; i++) {
        int64_t s = id_at(l, src, p, i);
        if (s < 0 || s > i || (s != prev && s != i)) {
            snprintf(msg, len, "%s '%s': seg_start[%lld] = %lld is not a segment start (want %lld or %lld)",
                     twk_op_name(l->op), l->name, (long long)i, (long long)s, (long long)prev, (long long)i);
            return;
        }
        prev = s;
    }
}

void kd_error_detail(const twk_launch *l, int64_t n, const void *const *host, char *msg, size_t len) {
    if (!msg || !len) return;
    msg[0] = 0;
    if (!l || !host) return;
    switch (l->op) {
    case TWK_OP_GET_ROWS: first_out(l, n, host, 1, kd_dim(&l->src[0], 0, n), "ids", msg, len); break;
    case TWK_OP_GET_ROWS_BACK: first_out(l, n, host, 1, kd_dim(&l->dst, 0, n), "ids", msg, len); break;
    case TWK_OP_LOGPROBS:
    case TWK_OP_LOGPROBS_BACK: first_out(l, n, host, 1, kd_dim(&l->src[0], 1, n), "targets", msg, len); break;
    case TWK_OP_KV_WRITE: first_out(l, n, host, 2, kd_dim(&l->dst, 0, n), "rows", msg, len); break;
    case TWK_OP_LORA_GATHER: first_out(l, n, host, 2, kd_dim(&l->src[1], 0, n), "slot", msg, len); break;
    case TWK_OP_ATTN:
    case TWK_OP_ATTN_BACK: segments(l, n, host, 3, msg, len); break;
    case TWK_OP_ATTN_LSE: segments(l, n, host, 2, msg, len); break;
    case TWK_OP_ATTN_CACHE: {
        const void *lo = host[3], *hi = host[4];
        int64_t T = kd_dim(&l->src[3], 0, n), R = kd_dim(&l->src[1], 0, n);
        for (int64_t t = 0; lo && hi && t < T; t++) {
            int64_t a = id_at(l, 3, lo, t), b = id_at(l, 4, hi, t);
            if (a < 0 || b <= a || b > R) {
                snprintf(msg, len, "attn_cache '%s': rows [%lld, %lld) of query %lld are not a non-empty range in [0, %lld)",
                         l->name, (long long)a, (long long)b, (long long)t, (long long)R);
                break;
            }
        }
        break;
    }
    default: break;
    }
}
