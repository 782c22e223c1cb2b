/* twinkle — the version of the embedding API.
 *
 * The major number changes when a public header changes incompatibly (a type,
 * a signature or a meaning), the minor number when something is added, the
 * patch number for fixes. Compare the header a program was built with
 * (TWK_API_VERSION) to the library it runs with (twk_api_version()).
 * Thread-safety: both functions may be called from any thread at any time. */
#ifndef TWINKLE_VERSION_H
#define TWINKLE_VERSION_H

#include "twinkle/export.h"

#define TWK_API_VERSION_MAJOR 0
#define TWK_API_VERSION_MINOR 6
#define TWK_API_VERSION_PATCH 0
/* One number: major * 10000 + minor * 100 + patch. */
#define TWK_API_VERSION (TWK_API_VERSION_MAJOR * 10000 + TWK_API_VERSION_MINOR * 100 + TWK_API_VERSION_PATCH)
#define TWK_VERSION_STR_(x) #x
#define TWK_VERSION_STR(x) TWK_VERSION_STR_(x)
/* "0.6.0" */
#define TWK_VERSION                                                                   \
    TWK_VERSION_STR(TWK_API_VERSION_MAJOR) "." TWK_VERSION_STR(TWK_API_VERSION_MINOR) "." \
    TWK_VERSION_STR(TWK_API_VERSION_PATCH)

#ifdef __cplusplus
extern "C" {
#endif
TWK_API_BEGIN

/* TWK_API_VERSION of the library linked at run time (never fails). */
int twk_api_version(void);
/* The same as a string, e.g. "0.2.0" (static storage; never NULL). */
const char *twk_version_string(void);

TWK_API_END
#ifdef __cplusplus
}
#endif
#endif
