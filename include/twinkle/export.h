/* twinkle — the export macro of the public API.
 *
 * The libraries are built with -fvisibility=hidden: only what the public headers
 * declare is exported from libtwinkle.so. TWK_API marks one declaration;
 * TWK_API_BEGIN / TWK_API_END bracket a header's declarations (inside its
 * extern "C" block) so that every function declared between them is TWK_API. */
#ifndef TWINKLE_EXPORT_H
#define TWINKLE_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define TWK_API __attribute__((visibility("default")))
#define TWK_API_BEGIN _Pragma("GCC visibility push(default)")
#define TWK_API_END _Pragma("GCC visibility pop")
#else
#define TWK_API
#define TWK_API_BEGIN
#define TWK_API_END
#endif

#endif
