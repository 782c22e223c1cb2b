/* Datasets made of others: several files mixed by weight, and an evaluation split. Both pick whole
 * groups (pairs for preference losses) in a seeded random order and build the result with
 * twk_dataset_gather. */
#include <math.h>
#include <stdlib.h>

#include "dataset_text.h"
#include "twinkle/data.h"
#include "twinkle/rng.h"
#include "twinkle/hal.h"

void twk_data_permute(int64_t *p, int64_t n, uint64_t seed) {
    twk_rng r;
    twk_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) p[i] = i;
    for (int64_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
        int64_t k = twk_rng_below(&r, i + 1), t = p[i];
        p[i] = p[k];
        p[k] = t;
    }
}

/* A seeded random permutation of 0..n-1 (free with twk_host_free), or NULL on OOM. */
static int64_t *permutation(int64_t n, uint64_t seed) {
    int64_t *p = twk_host_alloc((size_t)(n ? n : 1) * sizeof *p, "dataset permutation");
    if (p) twk_data_permute(p, n, seed);
    return p;
}

/* Appends group g of part p (group examples) to the index lists at *n. */
static void put_group(int *part, int64_t *idx, int64_t *n, int p, int64_t g, int group) {
    for (int k = 0; k < group; k++) {
        part[*n] = p;
        idx[(*n)++] = g * group + k;
    }
}

twk_status twk_dataset_mix(const twk_dataset *const *parts, const double *weights, int n_parts, int group,
                           uint64_t seed, twk_dataset **out) {
    if (!parts || !weights || n_parts < 1 || group < 1 || !out) return twk_error(TWK_ERR_INVALID_ARG, "dataset_mix: bad argument");
    double wsum = 0;
    int64_t groups = 0, total = 0, take[64];
    if (n_parts > 64) return twk_error(TWK_ERR_INVALID_ARG, "dataset_mix: at most 64 parts");
    for (int p = 0; p < n_parts; p++) {
        if (twk_dataset_count(parts[p]) % group || !(weights[p] >= 0))
            return twk_error(TWK_ERR_INVALID_ARG, "dataset_mix: part %d has %lld examples (groups of %d), weight %g", p,
                             (long long)twk_dataset_count(parts[p]), group, weights[p]);
        wsum += weights[p];
        groups += twk_dataset_count(parts[p]) / group;
    }
    if (!(wsum > 0)) return twk_error(TWK_ERR_INVALID_ARG, "dataset_mix: the weights sum to %g", wsum);
    for (int p = 0; p < n_parts; p++) {
        take[p] = (int64_t)llround(weights[p] / wsum * (double)groups);
        if (take[p] < 1 && weights[p] > 0) take[p] = 1;
        total += take[p];
    }
    int *part = twk_host_alloc((size_t)total * group * sizeof *part, "dataset_mix");
    int64_t *idx = twk_host_alloc((size_t)total * group * sizeof *idx, "dataset_mix"), n = 0;
    twk_status st = part && idx ? TWK_OK : twk_error(TWK_ERR_OOM, "dataset_mix: out of memory");
    for (int p = 0; p < n_parts && st == TWK_OK; p++) {
        int64_t ng = twk_dataset_count(parts[p]) / group;
        int64_t *perm = permutation(ng, seed * 1000003u + (uint64_t)p);
        if (!perm) {
            st = twk_error(TWK_ERR_OOM, "dataset_mix: out of memory");
            break;
        }
        for (int64_t i = 0; i < take[p]; i++) put_group(part, idx, &n, p, perm[i % ng], group);
        twk_host_free(perm);
    }
    if (st == TWK_OK) st = twk_dataset_gather(parts, n_parts, part, idx, n, out);
    twk_host_free(part);
    twk_host_free(idx);
    return st;
}

twk_status twk_dataset_split(const twk_dataset *d, double fraction, int group, uint64_t seed, twk_dataset **train,
                             twk_dataset **eval) {
    int64_t ng = group > 0 ? twk_dataset_count(d) / group : 0;
    if (!train || !eval || ng < 2 || twk_dataset_count(d) % group || !(fraction > 0 && fraction < 1))
        return twk_error(TWK_ERR_INVALID_ARG, "eval split: needs at least 2 examples%s and a fraction in (0, 1), got %lld and %g",
                         group > 1 ? " (pairs)" : "", (long long)ng, fraction);
    int64_t n_eval = (int64_t)llround(fraction * (double)ng);
    n_eval = n_eval < 1 ? 1 : n_eval >= ng ? ng - 1 : n_eval;
    int64_t *perm = permutation(ng, seed ^ 0x5eed5eedull),
            *idx = twk_host_alloc((size_t)ng * group * sizeof *idx, "eval split"), n = 0;
    int *part = twk_host_calloc((size_t)ng * group * sizeof *part, "eval split");
    twk_status st = perm && idx && part ? TWK_OK : twk_error(TWK_ERR_OOM, "eval split: out of memory");
    *train = *eval = NULL;
    for (int side = 0; side < 2 && st == TWK_OK; side++) { /* eval: the first n_eval groups; train: the rest, in order */
        n = 0;
        if (side == 0)
            for (int64_t i = 0; i < n_eval; i++) put_group(part, idx, &n, 0, perm[i], group);
        else {
            char *in_eval = twk_host_calloc((size_t)ng, "eval split");
            if (!in_eval) st = twk_error(TWK_ERR_OOM, "eval split: out of memory");
            for (int64_t i = 0; in_eval && i < n_eval; i++) in_eval[perm[i]] = 1;
            for (int64_t g = 0; in_eval && g < ng; g++)
                if (!in_eval[g]) put_group(part, idx, &n, 0, g, group);
            twk_host_free(in_eval);
        }
        if (st == TWK_OK) st = twk_dataset_gather(&d, 1, part, idx, n, side ? train : eval);
    }
    if (st != TWK_OK) {
        twk_dataset_free(*eval);
        *eval = NULL;
    }
    twk_host_free(perm);
    twk_host_free(idx);
    twk_host_free(part);
    return st;
}
