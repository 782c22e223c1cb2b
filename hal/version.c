/* The run-time side of include/twinkle/version.h. */
#include "twinkle/version.h"

int twk_api_version(void) { return TWK_API_VERSION; }

const char *twk_version_string(void) { return TWK_VERSION; }
