/* Helpers shared by the bench programs. */
#ifndef TWK_BENCH_UTIL_H
#define TWK_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>

/* Parses an integer option value in [lo, hi]; prints "<prog>: <flag> wants ..." and returns 0 otherwise. */
static inline int bench_parse_long(const char *prog, const char *s, const char *flag, long lo, long hi, long *out) {
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) {
        fprintf(stderr, "%s: %s wants an integer in %ld..%ld, got '%s'\n", prog, flag, lo, hi, s);
        return 0;
    }
    *out = v;
    return 1;
}

#endif
