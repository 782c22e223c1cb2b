/* The checkpoint sweeper: a timer on the loop that deletes checkpoints whose
 * TTL has passed (row, then folder: svc_ckpt_remove), a batch per tick. */
#include <time.h>

#include "svc.h"

#define SWEEP_BATCH 64

int svc_sweep_expired(svc *s) {
    twk_store_ckpt *list = NULL;
    int n = 0, removed = 0;
    if (twk_store_ckpt_expired(s->store, (double)time(NULL), SWEEP_BATCH, &list, &n) != TWK_OK) {
        twk_log_info("sweeper: %s", twk_last_error());
        return 0;
    }
    for (int i = 0; i < n; i++) {
        char err[512];
        if (svc_ckpt_remove(s, &list[i], err, sizeof err) != 0) {
            twk_log_info("sweeper: %s", err);
            continue;
        }
        removed++;
        twk_log_info("sweeper: deleted expired checkpoint tinker://%s/%s (tenant %s)", list[i].run_id,
                     list[i].checkpoint_id, list[i].tenant);
    }
    twk_host_free(list);
    return removed;
}

static void on_sweep(uv_timer_t *t) {
    svc *s = t->data;
    /* a full batch: more may be waiting, so sweep again on the next loop turn */
    if (svc_sweep_expired(s) == SWEEP_BATCH) uv_timer_start(&s->sweep_timer, on_sweep, 0, 0);
    else uv_timer_start(&s->sweep_timer, on_sweep, (uint64_t)(s->cfg.ckpt_sweep_s * 1000), 0);
}

void svc_sweeper_start(svc *s) {
    uv_timer_init(s->loop, &s->sweep_timer);
    s->sweep_timer.data = s;
    uv_timer_start(&s->sweep_timer, on_sweep, 0, 0);
}

void svc_sweeper_stop(svc *s) {
    uv_timer_stop(&s->sweep_timer);
    uv_close((uv_handle_t *)&s->sweep_timer, NULL);
}
