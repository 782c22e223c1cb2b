/* API key authentication: a keys file, or open mode. */
#include "auth.h"
#include "twinkle/hal.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct key_entry {
    char key[160];
    char tenant[64];
    int admin; /* keys-file line ends in `admin` */
} key_entry;

#define AUTH_TOKENS 1024 /* live auth/token JWTs kept (the oldest is forgotten first) */

typedef struct token_entry {
    char token[512];
    char tenant[64];
    double exp;
} token_entry;

struct twk_auth {
    int open;
    key_entry *keys;
    int n;
    token_entry *tokens; /* a ring of AUTH_TOKENS, allocated on the first token */
    int next_token;
};

static int valid_tenant(const char *t) {
    size_t n = strlen(t);
    if (n < 1 || n > 48) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)t[i]) && t[i] != '-' && t[i] != '_' && t[i] != '.') return 0;
    return 1;
}

twk_status twk_auth_load(const char *keys_file, twk_auth **out) {
    *out = NULL;
    twk_auth *a = twk_host_calloc(sizeof *a, "auth a");
    if (!a) return twk_error(TWK_ERR_OOM, "auth: out of memory");
    if (!keys_file || !*keys_file) {
        a->open = 1;
        *out = a;
        return TWK_OK;
    }
    FILE *f = fopen(keys_file, "r");
    if (!f) {
        twk_host_free(a);
        return twk_error(TWK_ERR_IO, "cannot open keys file %s", keys_file);
    }
    char line[512];
    int lineno = 0;
    twk_status st = TWK_OK;
    while (st == TWK_OK && fgets(line, sizeof line, f)) {
        lineno++;
        char *p = line;
        while (isspace((unsigned char)*p)) p++;
        if (!*p || *p == '#') continue;
        char key[200], tenant[100], extra[8];
        char more[8];
        int got = sscanf(p, "%199s %99s %7s %7s", key, tenant, extra, more);
        int admin = got == 3 && !strcmp(extra, "admin");
        if ((got != 2 && !admin) || strncmp(key, "tml-", 4) || strlen(key) >= sizeof a->keys[0].key || !valid_tenant(tenant)) {
            st = twk_error(TWK_ERR_INVALID_ARG,
                           "%s:%d: want 'tml-KEY TENANT' or 'tml-KEY TENANT admin' (tenant: 1-48 of [A-Za-z0-9._-])",
                           keys_file, lineno);
            break;
        }
        for (int i = 0; i < a->n; i++)
            if (!strcmp(a->keys[i].key, key)) st = twk_error(TWK_ERR_INVALID_ARG, "%s:%d: duplicate key", keys_file, lineno);
        if (st != TWK_OK) break;
        key_entry *nk = twk_host_realloc(a->keys, (size_t)a->n * sizeof *nk, (size_t)(a->n + 1) * sizeof *nk, "keys");
        if (!nk) {
            st = twk_error(TWK_ERR_OOM, "auth: out of memory");
            break;
        }
        a->keys = nk;
        snprintf(a->keys[a->n].key, sizeof a->keys[0].key, "%s", key);
        snprintf(a->keys[a->n].tenant, sizeof a->keys[0].tenant, "%s", tenant);
        a->keys[a->n].admin = admin;
        a->n++;
    }
    fclose(f);
    if (st == TWK_OK && a->n == 0) st = twk_error(TWK_ERR_INVALID_ARG, "%s: no keys", keys_file);
    if (st != TWK_OK) {
        twk_auth_free(a);
        return st;
    }
    *out = a;
    return TWK_OK;
}

void twk_auth_free(twk_auth *a) {
    if (!a) return;
    twk_host_free(a->keys);
    twk_host_free(a->tokens);
    twk_host_free(a);
}

int twk_auth_open_mode(const twk_auth *a) { return a->open; }

/* Compares without an early exit on the first differing byte. */
static int same_key(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned char diff = (unsigned char)(la != lb);
    for (size_t i = 0; i < la && i < lb; i++) diff |= (unsigned char)(a[i] ^ b[i]);
    return diff == 0;
}

int twk_auth_token_add(twk_auth *a, const char *token, const char *tenant, double exp) {
    if (strlen(token) >= sizeof a->tokens[0].token) return -1;
    if (!a->tokens && !(a->tokens = twk_host_calloc(AUTH_TOKENS * sizeof *a->tokens, "auth tokens"))) return -1;
    token_entry *t = &a->tokens[a->next_token];
    a->next_token = (a->next_token + 1) % AUTH_TOKENS;
    snprintf(t->token, sizeof t->token, "%s", token);
    snprintf(t->tenant, sizeof t->tenant, "%s", tenant);
    t->exp = exp;
    return 0;
}

int twk_auth_is_token(const char *key) { return key && !strncmp(key, "eyJ", 3); }

int twk_auth_tenant(const twk_auth *a, const char *key, char *tenant) {
    if (twk_auth_is_token(key) && a->tokens) {
        double now = (double)time(NULL);
        for (int i = 0; i < AUTH_TOKENS; i++)
            if (a->tokens[i].token[0] && a->tokens[i].exp > now && same_key(a->tokens[i].token, key)) {
                snprintf(tenant, 64, "%s", a->tokens[i].tenant);
                return 1;
            }
        return 0;
    }
    if (!key || strncmp(key, "tml-", 4) || strlen(key) > 512) return 0;
    if (a->open) {
        /* one tenant per key; the key itself is never stored or logged */
        uint64_t h = 1469598103934665603ull;
        for (const char *p = key; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
        snprintf(tenant, 64, "open-%016llx", (unsigned long long)h);
        return 1;
    }
    for (int i = 0; i < a->n; i++)
        if (same_key(a->keys[i].key, key)) {
            snprintf(tenant, 64, "%s", a->keys[i].tenant);
            return 1;
        }
    return 0;
}

int twk_auth_is_admin(const twk_auth *a, const char *key) {
    if (!key || a->open) return 0;
    for (int i = 0; i < a->n; i++)
        if (same_key(a->keys[i].key, key)) return a->keys[i].admin;
    return 0;
}
