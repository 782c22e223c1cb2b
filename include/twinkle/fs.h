/* twinkle — small filesystem helpers shared by the training CLI and the service. */
#ifndef TWINKLE_FS_H
#define TWINKLE_FS_H

#include <stddef.h>

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
/* Writes `bytes` of `data` to `path` atomically (temp file, fsync, rename, fsync of the folder).
 * TWK_ERR_IO names the file on failure. */
twk_status twk_write_file_atomic(const char *path, const void *data, size_t bytes);
/* Reads a whole file into a NUL-terminated host buffer (free with twk_host_free); NULL with
 * TWK_ERR_IO set on failure. */
char *twk_read_file(const char *path, size_t *len);

TWK_API_END
#ifdef __cplusplus
}
#endif
#endif
