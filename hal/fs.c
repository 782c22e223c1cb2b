/* twk_mkdir_p: `mkdir -p` for checkpoint and output folders. */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "twinkle/fs.h"

twk_status twk_mkdir_p(const char *dir, unsigned mode) {
    char p[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof p) return twk_error(TWK_ERR_IO, "cannot create folder '%s': bad length", dir);
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != 0) continue;
        char c = p[i];
        p[i] = 0;
        if (mkdir(p, (mode_t)mode) != 0 && errno != EEXIST)
            return twk_error(TWK_ERR_IO, "cannot create folder %s: %s", p, strerror(errno));
        p[i] = c;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) return twk_error(TWK_ERR_IO, "%s is not a folder", dir);
    return TWK_OK;
}
