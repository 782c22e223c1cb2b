/* Messages for bad ids found on the device: the checked sources of the
 * launch named by the error word are read back and re-checked on the host,
 * in the words every backend shares (twk_launch_bad_id: op, node, index, value). */
#include "vk_internal.h"

twk_status vk_range_error(vk_ctx *c, const twk_launch *l, int64_t n) {
    unsigned mask = twk_op_info(l->op)->checked;
    void *host[TWK_MAX_SRC] = {0};
    twk_status st = TWK_OK;
    for (int i = 0; i < l->nsrc && st == TWK_OK; i++) {
        if (!(mask >> i & 1u)) continue;
        size_t bytes = (size_t)twk_desc_nelem(&l->src[i], n) * twk_dtype_size(l->src[i].type);
        host[i] = twk_host_alloc(bytes ? bytes : 1, "vulkan id check");
        st = host[i] ? vk_download(c, l->src[i].buf, l->src[i].offset, host[i], bytes) : TWK_ERR_OOM;
    }
    char msg[256] = "";
    if (st == TWK_OK) twk_launch_bad_id(l, n, (const void *const *)host, msg, sizeof msg);
    for (int i = 0; i < TWK_MAX_SRC; i++) twk_host_free(host[i]);
    if (st != TWK_OK) return st;
    if (msg[0]) return twk_error(TWK_ERR_RANGE, "%s", msg);
    return twk_error(TWK_ERR_RANGE, "%s '%s': an id is out of range", twk_op_name(l->op), l->name);
}
