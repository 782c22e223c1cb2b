/* server/gen_progress.c — a generation's tokens handed from the worker to the loop thread while it
 * decodes (svc_generate with a step callback: streamed OpenAI completions). The worker copies each
 * pass's new tokens into a mutex-guarded buffer and wakes the loop with a uv_async; the loop hands
 * every sequence's tokens so far to the step callback. Coalesced wakeups deliver several passes at
 * once. */
#include <string.h>

#include "svc.h"

struct svc_gen_progress {
    uv_async_t async; /* data = this */
    pthread_mutex_t mu;
    int n;
    int64_t cap;      /* tokens per sequence */
    int32_t *tokens;  /* n * cap; [i * cap, i * cap + filled[i]) are final */
    int64_t *filled;  /* worker writes under mu */
    int64_t *handed;  /* loop: what the callback has seen */
    svc_gen_step_fn step;
    void *ctx;
    int closed;
};

static void progress_wake(uv_async_t *a) {
    svc_gen_progress *g = a->data;
    for (int i = 0; !g->closed && i < g->n; i++) {
        pthread_mutex_lock(&g->mu);
        int64_t f = g->filled[i];
        pthread_mutex_unlock(&g->mu);
        if (f == g->handed[i]) continue;
        g->handed[i] = f;
        g->step(g->ctx, i, g->tokens + (size_t)i * (size_t)g->cap, f);
    }
}

static void progress_free(svc_gen_progress *g) {
    twk_host_free(g->tokens);
    twk_host_free(g->filled);
    twk_host_free(g->handed);
    twk_host_free(g);
}

svc_gen_progress *svc_gen_progress_new(uv_loop_t *loop, int n, int64_t max_tokens, svc_gen_step_fn step, void *ctx) {
    svc_gen_progress *g = twk_host_calloc(sizeof *g, "generation progress");
    if (!g) return NULL;
    *g = (svc_gen_progress){.n = n, .cap = max_tokens, .step = step, .ctx = ctx};
    g->tokens = twk_host_alloc((size_t)n * (size_t)max_tokens * sizeof *g->tokens, "generation progress");
    g->filled = twk_host_calloc((size_t)n * sizeof *g->filled, "generation progress");
    g->handed = twk_host_calloc((size_t)n * sizeof *g->handed, "generation progress");
    if (!g->tokens || !g->filled || !g->handed) {
        progress_free(g);
        return NULL;
    }
    if (pthread_mutex_init(&g->mu, NULL) != 0) {
        progress_free(g);
        return NULL;
    }
    if (uv_async_init(loop, &g->async, progress_wake) != 0) {
        pthread_mutex_destroy(&g->mu);
        progress_free(g);
        return NULL;
    }
    g->async.data = g;
    return g;
}

void svc_gen_progress_step(void *ctx, const twk_sampled_seq *out, int num_samples) {
    svc_gen_progress *g = ctx;
    int any = 0;
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < num_samples && i < g->n; i++) {
        int64_t from = g->filled[i], to = out[i].n < g->cap ? out[i].n : g->cap;
        if (to <= from) continue;
        memcpy(g->tokens + (size_t)i * (size_t)g->cap + from, out[i].tokens + from, (size_t)(to - from) * sizeof *g->tokens);
        g->filled[i] = to;
        any = 1;
    }
    pthread_mutex_unlock(&g->mu);
    if (any) uv_async_send(&g->async);
}

static void progress_closed(uv_handle_t *h) {
    svc_gen_progress *g = h->data;
    pthread_mutex_destroy(&g->mu);
    progress_free(g);
}

void svc_gen_progress_close(svc_gen_progress *g) {
    if (!g) return;
    g->closed = 1;
    uv_close((uv_handle_t *)&g->async, progress_closed);
}
