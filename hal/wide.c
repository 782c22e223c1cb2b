/* The cut of wide reductions (twk_wide.h): tile counts from the shapes and the device. */
#include <pthread.h>
#include <stdlib.h>

#include "twk_wide.h"

int64_t twk_wide_tiles(int compute_units, int64_t reductions, int64_t terms, int64_t grain) {
    int64_t cu = compute_units > 0 ? compute_units : TWK_WIDE_CU_UNKNOWN;
    if (reductions < 1) reductions = 1;
    if (grain < 1) grain = 1;
    int64_t by_device = (TWK_WIDE_PER_CU * cu + reductions - 1) / reductions;
    int64_t by_size = terms > 0 ? (terms + grain - 1) / grain : 1;
    int64_t t = by_device < by_size ? by_device : by_size;
    if (t > TWK_WIDE_MAX_TILES) t = TWK_WIDE_MAX_TILES;
    return t < 1 ? 1 : t;
}

int64_t twk_wide_tile_start(int64_t n, int64_t tiles, int64_t t) {
    int64_t q = n / tiles, r = n % tiles;
    return t * q + (t < r ? t : r);
}

int twk_wide_cols(int64_t D) {
    int c = 1;
    while (c < TWK_WIDE_COLS && c < D) c *= 2;
    return c;
}

static int narrow;
static pthread_once_t narrow_once = PTHREAD_ONCE_INIT;

static void read_narrow(void) {
    const char *e = getenv("TWK_REDUCE_NARROW");
    narrow = e && e[0] == '1' && e[1] == '\0';
}

int twk_reduce_narrow(void) {
    pthread_once(&narrow_once, read_narrow);
    return narrow;
}
