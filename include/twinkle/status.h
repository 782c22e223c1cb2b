/* twinkle — status codes and the last-error message (shared by every layer). */
#ifndef TWINKLE_STATUS_H
#define TWINKLE_STATUS_H

#include <stdarg.h>

#include "twinkle/export.h"

/* Thread-safety: every function here may be called from any thread; the last-error
 * message is per thread. */

#ifdef __cplusplus
extern "C" {
#endif
TWK_API_BEGIN

typedef enum twk_status {
    TWK_OK = 0,
    TWK_ERR_INVALID_ARG,  /* a bad argument: NULL, negative size, unknown id */
    TWK_ERR_SHAPE,        /* tensor shapes that do not agree */
    TWK_ERR_DTYPE,        /* a dtype the op does not accept */
    TWK_ERR_UNSUPPORTED,  /* an op or feature the backend lacks */
    TWK_ERR_OOM,          /* an allocation failed */
    TWK_ERR_RANGE,        /* a value out of range at run time (e.g. token id >= vocab) */
    TWK_ERR_BACKEND,      /* the backend's runtime reported a failure */
    TWK_ERR_IO,           /* a file could not be read or written */
    TWK_ERR_NOT_FOUND,    /* no such backend, device or name */
    TWK_ERR_STATE         /* a call made in the wrong state (e.g. run before compile) */
} twk_status;

/* Short constant name of a status ("shape", "oom", ...); never NULL. */
const char *twk_status_name(twk_status s);

/* The message of the last error set on this thread; "" when none. */
const char *twk_last_error(void);

/* Records a printf-style message for this thread and returns `code`, so
 * failing paths read `return twk_error(TWK_ERR_SHAPE, "...", ...);`. */
twk_status twk_error(twk_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
twk_status twk_verror(twk_status code, const char *fmt, va_list ap);

/* Clears this thread's last error message. */
void twk_clear_error(void);

TWK_API_END
#ifdef __cplusplus
}
#endif
#endif
