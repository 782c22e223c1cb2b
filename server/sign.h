/* server/ — signed, expiring download URLs: SHA-256 and HMAC-SHA256 (FIPS 180-4,
 * RFC 2104), and the server's signing key, made at first start and kept in the
 * data dir. Pure functions except twk_sign_key_load. */
#ifndef TWK_SERVER_SIGN_H
#define TWK_SERVER_SIGN_H

#include <stddef.h>

#define TWK_SIGN_KEY_BYTES 32

/* out = SHA-256(msg). */
void twk_sha256(const void *msg, size_t n, unsigned char out[32]);
/* out = HMAC-SHA256(key, msg). */
void twk_hmac_sha256(const unsigned char *key, size_t key_len, const void *msg, size_t n, unsigned char out[32]);
/* The lowercase hex HMAC of msg under key (65 bytes with the NUL). */
void twk_hmac_hex(const unsigned char *key, const char *msg, char out[65]);
/* 1 if the two NUL-terminated strings are equal, in time independent of where they differ. */
int twk_const_eq(const char *a, const char *b);
/* Reads DATA_DIR/url_signing.key (64 hex digits), creating it (random bytes from
 * getrandom, mode 0600, written atomically) when absent. -1 with a message in err. */
int twk_sign_key_load(const char *data_dir, unsigned char key[TWK_SIGN_KEY_BYTES], char *err, size_t err_len);

#endif
