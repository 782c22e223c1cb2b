/* tests/check.h — the check() of the C tests: prints "ok   <what>" or "FAIL <what>" and counts the
 * failures in check_failures (main returns it). check_quiet = 1 prints only failures;
 * check_last_error = 1 appends twk_last_error() to a failure's line. */
#ifndef TWK_TESTS_CHECK_H
#define TWK_TESTS_CHECK_H

#include <stdarg.h>
#include <stdio.h>

#include "twinkle/status.h"

static int check_failures, check_quiet, check_last_error;

static void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3), unused));
static void check(int ok, const char *fmt, ...) {
    if (!ok) check_failures++;
    if (ok && check_quiet) return;
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    va_end(ap);
    if (!ok && check_last_error) printf("   (last error: %s)", twk_last_error());
    printf("\n");
    fflush(stdout);
}

#endif
