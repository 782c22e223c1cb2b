/* The launch environment, read without MPI (built with and without TWK_MPI). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"

int twk_dist_launched_size(void) {
    /* MPICH's hydra and PMI-2 launchers (srun --mpi=pmi2), Open MPI, PMIx */
    static const char *const vars[] = {"PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return getenv("PMI_RANK") || getenv("PMIX_RANK") ? 1 : 0;
}

const char *twk_dist_device(const char *spec, char *buf, size_t cap) {
    if (twk_dist_local_size() < 2 || strchr(spec, ':') || !strcmp(spec, "cpu")) return spec;
    snprintf(buf, cap, "%s:%d", spec, twk_dist_local_rank());
    return buf;
}
