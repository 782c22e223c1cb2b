/* The launch environment, read without MPI (built with and without TWK_MPI). */
#include <stdlib.h>

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
