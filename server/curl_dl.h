/* libcurl opened at run time (dlopen of libcurl.so.4), only when a webhook is configured: the
 * binary itself does not link libcurl and the TLS libraries it pulls in. */
#ifndef TWK_SERVER_CURL_DL_H
#define TWK_SERVER_CURL_DL_H

#define CURL_DISABLE_TYPECHECK 1
#include <curl/curl.h>

typedef struct {
    CURLcode (*global_init)(long flags);
    void (*global_cleanup)(void);
    CURL *(*easy_init)(void);
    CURLcode (*easy_setopt)(CURL *h, CURLoption opt, ...);
    CURLcode (*easy_perform)(CURL *h);
    CURLcode (*easy_getinfo)(CURL *h, CURLINFO info, ...);
    void (*easy_cleanup)(CURL *h);
    struct curl_slist *(*slist_append)(struct curl_slist *l, const char *s);
    void (*slist_free_all)(struct curl_slist *l);
} twk_curl_api;

/* The loaded table (opened once, kept for the process), or NULL with the reason in *why
 * (a static string: the library or one of its functions is missing). Thread-safe. */
const twk_curl_api *twk_curl_load(const char **why);

#endif
