/* server/ — API keys to tenants. A keys file maps each `tml-…` key to a
 * tenant name (one "KEY TENANT" per line, # comments; "KEY TENANT admin" marks an
 * operator key that may read the whole service: /metrics with tenant labels, the dashboard); without one (the
 * documented default, for local use) any `tml-` key is accepted and each
 * distinct key is its own tenant. */
#ifndef TWK_SERVER_AUTH_H
#define TWK_SERVER_AUTH_H

#include "twinkle/status.h"

typedef struct twk_auth twk_auth;

/* keys_file "" or NULL = open mode. Errors name the file and line. */
twk_status twk_auth_load(const char *keys_file, twk_auth **out);
void twk_auth_free(twk_auth *a);
/* 1 for open mode. */
int twk_auth_open_mode(const twk_auth *a);
/* Writes the tenant of `key` into tenant[64] and returns 1; 0 if the key is
 * missing or not accepted. */
int twk_auth_tenant(const twk_auth *a, const char *key, char *tenant);

/* 1 if key is a keys-file key marked `admin`; 0 otherwise (always 0 in open mode and for JWTs). */
int twk_auth_is_admin(const twk_auth *a, const char *key);

/* Remembers a JWT minted by auth/token for tenant until exp (unix seconds): twk_auth_tenant then
 * accepts it as the key (the SDK's pjwt auth sends it as X-API-Key). Tokens live in memory only;
 * a restart forgets them (the SDK exchanges its API key again on the 401). -1 on failure. */
int twk_auth_token_add(twk_auth *a, const char *token, const char *tenant, double exp);
/* 1 if key has the form of a JWT (a 401 for it tells the SDK to fetch a new one). */
int twk_auth_is_token(const char *key);

#endif
