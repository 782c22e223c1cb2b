/* The log hook (include/twinkle/log.h): one function every library layer
 * writes its messages through; stderr by default. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "twinkle/log.h"

typedef struct log_hook {
    twk_log_fn fn; /* NULL: stderr */
    void *user;
    twk_log_level min_level;
} log_hook;

static log_hook hook = {NULL, NULL, TWK_LOG_INFO};
static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;

void twk_set_log_fn(twk_log_level min_level, twk_log_fn fn, void *user) {
    pthread_mutex_lock(&hook_lock);
    hook = (log_hook){fn, user, min_level};
    pthread_mutex_unlock(&hook_lock);
}

void twk_vlog(twk_log_level level, const char *fmt, va_list ap) {
    pthread_mutex_lock(&hook_lock);
    log_hook h = hook;
    pthread_mutex_unlock(&hook_lock);
    if (level < h.min_level || level >= TWK_LOG_OFF || !fmt) return;
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t len = strlen(msg);
    if (len && msg[len - 1] == '\n') msg[len - 1] = 0;
    if (h.fn)
        h.fn(level, msg, h.user);
    else
        fprintf(stderr, "%s\n", msg);
}

void twk_log(twk_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    twk_vlog(level, fmt, ap);
    va_end(ap);
}
