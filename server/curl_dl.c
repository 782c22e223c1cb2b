/* dlopen of libcurl.so.4; see curl_dl.h. */
#include "curl_dl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

static twk_curl_api api;
static const twk_curl_api *loaded;
static char why_buf[256];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void) {
    void *h = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(why_buf, sizeof why_buf, "webhook alerts need libcurl.so.4 (Debian: libcurl4): %s", e ? e : "not found");
        return;
    }
    struct {
        const char *name;
        void **slot;
    } fns[] = {
        {"curl_global_init", (void **)&api.global_init},     {"curl_global_cleanup", (void **)&api.global_cleanup},
        {"curl_easy_init", (void **)&api.easy_init},         {"curl_easy_setopt", (void **)&api.easy_setopt},
        {"curl_easy_perform", (void **)&api.easy_perform},   {"curl_easy_getinfo", (void **)&api.easy_getinfo},
        {"curl_easy_cleanup", (void **)&api.easy_cleanup},   {"curl_slist_append", (void **)&api.slist_append},
        {"curl_slist_free_all", (void **)&api.slist_free_all},
    };
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        *fns[i].slot = dlsym(h, fns[i].name);
        if (!*fns[i].slot) {
            snprintf(why_buf, sizeof why_buf, "libcurl.so.4 lacks %s", fns[i].name);
            dlclose(h);
            return;
        }
    }
    loaded = &api;
}

const twk_curl_api *twk_curl_load(const char **why) {
    pthread_once(&once, load);
    if (!loaded && why) *why = why_buf;
    return loaded;
}
