/* A monotonic clock for timings in tools, benches and logs. */
#include <time.h>

#include "twinkle/hal.h"

double twk_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
