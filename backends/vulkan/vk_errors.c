/* Messages for bad ids found on the device: the launch named by the error
 * word is re-checked on the host, with the CPU backend's words (op, node,
 * index, value). */
#include "vk_internal.h"

static twk_status fetch_ids(vk_ctx *c, const twk_tensor_desc *t, int64_t count, int64_t *out) {
    size_t es = twk_dtype_size(t->type);
    void *tmp = twk_host_alloc((size_t)count * es + 8, "vulkan id check");
    if (!tmp) return TWK_ERR_OOM;
    twk_status st = vk_download(c, t->buf, t->offset, tmp, (size_t)count * es);
    if (st == TWK_OK)
        for (int64_t i = 0; i < count; i++)
            out[i] = t->type == TWK_I64 ? ((const int64_t *)tmp)[i] : ((const int32_t *)tmp)[i];
    twk_host_free(tmp);
    return st;
}

twk_status vk_range_error(vk_ctx *c, const twk_launch *l, int64_t n) {
    const twk_tensor_desc *s = l->src;
    int src = -1;
    for (int i = 0; i < l->nsrc; i++)
        if (twk_op_info(l->op)->checked >> i & 1) {
            src = i;
            break;
        }
    if (src < 0) return twk_error(TWK_ERR_RANGE, "%s '%s': an id is out of range", twk_op_name(l->op), l->name);
    int64_t count = twk_desc_nelem(&s[src], n);
    int64_t *ids = twk_host_alloc((size_t)(2 * count + 1) * sizeof *ids, "vulkan id check");
    if (!ids) return TWK_ERR_OOM;
    twk_status st = fetch_ids(c, &s[src], count, ids);
    if (st == TWK_OK && l->op == TWK_OP_ATTN_CACHE) st = fetch_ids(c, &s[4], count, ids + count);
    if (st != TWK_OK) {
        twk_host_free(ids);
        return st;
    }
    st = TWK_ERR_RANGE;
    const char *op = twk_op_name(l->op);
    int found = 0;
    switch (l->op) {
    case TWK_OP_ATTN:
    case TWK_OP_ATTN_LSE:
    case TWK_OP_ATTN_BACK: {
        int64_t prev = 0;
        for (int64_t i = 0; i < count && !found; i++) {
            int64_t v = ids[i];
            if (v < 0 || v > i || (v != prev && v != i)) {
                twk_error(TWK_ERR_RANGE, "%s '%s': seg_start[%lld] = %lld is not a segment start (want %lld or %lld)",
                          op, l->name, (long long)i, (long long)v, (long long)prev, (long long)i);
                found = 1;
            }
            prev = v;
        }
        break;
    }
    case TWK_OP_ATTN_CACHE: {
        int64_t R = twk_desc_dim(&s[1], 0, n);
        for (int64_t t = 0; t < count && !found; t++) {
            int64_t lo = ids[t], hi = ids[count + t];
            if (lo < 0 || hi <= lo || hi > R) {
                twk_error(TWK_ERR_RANGE,
                          "attn_cache '%s': rows [%lld, %lld) of query %lld are not a non-empty range in [0, %lld)",
                          l->name, (long long)lo, (long long)hi, (long long)t, (long long)R);
                found = 1;
            }
        }
        break;
    }
    default: {
        int64_t limit = 0;
        const char *what = "ids";
        if (l->op == TWK_OP_GET_ROWS) limit = twk_desc_dim(&s[0], 0, n);
        else if (l->op == TWK_OP_GET_ROWS_BACK) limit = twk_desc_dim(&l->dst, 0, n);
        else if (l->op == TWK_OP_LOGPROBS || l->op == TWK_OP_LOGPROBS_BACK) {
            limit = twk_desc_dim(&s[0], 1, n);
            what = "targets";
        } else if (l->op == TWK_OP_KV_WRITE) limit = twk_desc_dim(&l->dst, 0, n);
        else if (l->op == TWK_OP_LORA_GATHER) limit = twk_desc_dim(&s[1], 0, n);
        for (int64_t i = 0; i < count && !found; i++) {
            int64_t v = ids[i];
            if (v >= 0 && v < limit) continue;
            found = 1;
            if (l->op == TWK_OP_KV_WRITE)
                twk_error(TWK_ERR_RANGE, "kv_write '%s': rows[%lld] = %lld is outside the cache [0, %lld)", l->name,
                          (long long)i, (long long)v, (long long)limit);
            else if (l->op == TWK_OP_LORA_GATHER)
                twk_error(TWK_ERR_RANGE, "lora_gather '%s': slot[%lld] = %lld is outside [0, %lld)", l->name,
                          (long long)i, (long long)v, (long long)limit);
            else
                twk_error(TWK_ERR_RANGE, "%s '%s': %s[%lld] = %lld is outside [0, %lld)", op, l->name, what,
                          (long long)i, (long long)v, (long long)limit);
        }
        break;
    }
    }
    if (!found) twk_error(TWK_ERR_RANGE, "%s '%s': an id is out of range", op, l->name);
    twk_host_free(ids);
    return st;
}
