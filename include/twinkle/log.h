/* twinkle — the log hook. The library never writes to stderr itself: hal,
 * graph, backends and train send their messages (warnings, profiles asked for
 * with TWK_PROFILE) through twk_log, which passes each message at or above the
 * installed level to the installed function. The default writes to stderr at
 * TWK_LOG_INFO and above.
 *
 * Thread-safety: twk_log may be called from any thread; the callback is then
 * called on that thread and must be thread-safe itself. twk_set_log_fn may be
 * called from any thread (a message sees either the old or the new hook); a
 * message being delivered may still use the old hook and its `user`. */
#ifndef TWINKLE_LOG_H
#define TWINKLE_LOG_H

#include <stdarg.h>

#include "twinkle/export.h"

#ifdef __cplusplus
extern "C" {
#endif
TWK_API_BEGIN

typedef enum twk_log_level {
    TWK_LOG_DEBUG = 0,
    TWK_LOG_INFO,  /* profiles and notes the user asked for */
    TWK_LOG_WARN,  /* a fallback was taken (e.g. a GEMM mode the device lacks) */
    TWK_LOG_ERROR,
    TWK_LOG_OFF    /* as a level for twk_set_log_fn: nothing is passed on */
} twk_log_level;

/* Receives one message: one line without its newline. */
typedef void (*twk_log_fn)(twk_log_level level, const char *message, void *user);

/* Installs `fn` (NULL: the default, stderr) for messages at `min_level` and above. */
void twk_set_log_fn(twk_log_level min_level, twk_log_fn fn, void *user);

/* Formats one message (no trailing newline needed) and passes it to the hook
 * when `level` is at or above the installed level. Never fails. */
void twk_log(twk_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void twk_vlog(twk_log_level level, const char *fmt, va_list ap);

TWK_API_END
#ifdef __cplusplus
}
#endif
#endif
