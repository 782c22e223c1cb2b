/* Status names and the per-thread last-error message. */
#include <stdio.h>
#include <string.h>

#include "twinkle/status.h"

static _Thread_local char last_error[1024];

const char *twk_status_name(twk_status s) {
    switch (s) {
    case TWK_OK: return "ok";
    case TWK_ERR_INVALID_ARG: return "invalid_arg";
    case TWK_ERR_SHAPE: return "shape";
    case TWK_ERR_DTYPE: return "dtype";
    case TWK_ERR_UNSUPPORTED: return "unsupported";
    case TWK_ERR_OOM: return "oom";
    case TWK_ERR_RANGE: return "range";
    case TWK_ERR_BACKEND: return "backend";
    case TWK_ERR_IO: return "io";
    case TWK_ERR_NOT_FOUND: return "not_found";
    case TWK_ERR_STATE: return "state";
    }
    return "unknown";
}

const char *twk_last_error(void) { return last_error; }

void twk_clear_error(void) { last_error[0] = 0; }

twk_status twk_verror(twk_status code, const char *fmt, va_list ap) {
    char tmp[sizeof last_error];
    vsnprintf(tmp, sizeof tmp, fmt, ap); /* fmt may reference last_error */
    memcpy(last_error, tmp, sizeof tmp);
    return code;
}

twk_status twk_error(twk_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    twk_verror(code, fmt, ap);
    va_end(ap);
    return code;
}
