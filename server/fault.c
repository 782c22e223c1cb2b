/* TWK_FAULT: fault injection for tests (svc_fault in svc.h), next to ckpt_fs.c's TWK_CRASH_AT. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "svc.h"

int svc_fault(const char *action, const char *route, double *arg) {
    const char *env = getenv("TWK_FAULT");
    if (arg) *arg = 0;
    if (!env || !*env) return 0;
    size_t na = strlen(action), nr = strlen(route);
    for (const char *p = env; *p;) {
        size_t n = strcspn(p, ","), k = na + 1 + nr; /* ACTION:ROUTE is k bytes */
        if (n >= k && !strncmp(p, action, na) && p[na] == ':' && !strncmp(p + na + 1, route, nr) &&
            (n == k || p[k] == ':')) {
            if (arg && n > k) *arg = strtod(p + k + 1, NULL);
            return 1;
        }
        p += n;
        if (*p == ',') p++;
    }
    return 0;
}
