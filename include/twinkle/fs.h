/* twinkle — small filesystem helpers shared by the training CLI and the service. */
#ifndef TWINKLE_FS_H
#define TWINKLE_FS_H

#include "twinkle/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates `dir` and every missing parent with `mode` (like `mkdir -p`); existing folders are kept.
 * Returns TWK_ERR_IO naming the folder that could not be made, or when `dir` is not a folder. */
twk_status twk_mkdir_p(const char *dir, unsigned mode);

#ifdef __cplusplus
}
#endif
#endif
