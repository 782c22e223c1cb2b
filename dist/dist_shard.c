/* How a batch of whole sequences splits across ranks (built with and without MPI). */
#include <math.h>

#include "dist.h"

void twk_dist_shard(const int64_t *offsets, int n, int group, int rank, int size, int *s0, int *s1) {
    int g = group > 0 ? group : 1;
    int b[2] = {0, n};
    for (int e = 0; offsets && e < 2; e++) {
        int r = rank + e;
        if (r <= 0 || r >= size) {
            b[e] = r <= 0 ? 0 : n;
            continue;
        }
        /* the group boundary whose token offset is nearest r/size of the batch (ties: the lower) */
        double target = (double)offsets[n] * r / size;
        int best = 0;
        for (int s = 0; s <= n; s += g)
            if (fabs((double)offsets[s] - target) < fabs((double)offsets[best] - target)) best = s;
        b[e] = best;
    }
    *s0 = b[0];
    *s1 = b[1];
}
