/* tests/fuzz — shared pieces of the libFuzzer harnesses: a scratch folder for
 * parsers that read files, and a driver that feeds one HTTP connection of a
 * server through a socketpair. */
#ifndef TWK_FUZZ_UTIL_H
#define TWK_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "http.h"

/* A per-process scratch folder (on tmpfs when /dev/shm is writable), made on
 * first use; aborts if none can be made (a harness setup failure). */
const char *twk_fuzz_tmpdir(void);

/* Writes data to DIR/name (DIR = twk_fuzz_tmpdir()) and returns the path in
 * a static buffer (valid until the next call); aborts on an I/O error. */
const char *twk_fuzz_file(const char *name, const uint8_t *data, size_t len);

/* One connection of `s` (on `loop`) over a socketpair: writes data in pieces
 * (sizes drawn from `seed`; 0 = all at once) while running the loop, so
 * requests arrive split and pipelined; reads the responses (the first
 * out_cap - 1 bytes into out, NUL-terminated, when out is not NULL);
 * half-closes; then runs the loop until the server has freed the connection.
 * Aborts if it never does (a hang is a bug). */
void twk_fuzz_drive(uv_loop_t *loop, twk_http_server *s, const uint8_t *data, size_t len, uint32_t seed, char *out,
                    size_t out_cap);

#endif
