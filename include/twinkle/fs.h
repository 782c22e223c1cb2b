/* twinkle — small filesystem helpers shared by the training CLI and the service. */
#ifndef TWINKLE_FS_H
#define TWINKLE_FS_H

#include "twinkle/export.h"
#include "twinkle/status.h"

/* Thread-safety: may be called from any thread. */

#ifdef __cplusplus
extern "C" {
#endif
TWK_API_BEGIN

/* Creates `dir` and every missing parent with `mode` (like `mkdir -p`); existing folders are kept.
 * Returns TWK_ERR_IO naming the folder that could not be made, or when `dir` is not a folder. */
twk_status twk_mkdir_p(const char *dir, unsigned mode);

TWK_API_END
#ifdef __cplusplus
}
#endif
#endif
