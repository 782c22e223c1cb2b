/* Error messages for the codes kernels store: the code's meaning, and the
 * first bad id found again on the host (the error path only), in the words
 * every backend shares (twk_launch_bad_id). */
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

void kd_error_detail(const twk_launch *l, int64_t n, const void *const *host, char *msg, size_t len) {
    twk_launch_bad_id(l, n, host, msg, len);
}
