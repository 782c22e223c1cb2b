/* twk_dist without MPI: one rank, every collective the identity. */
#include <stdlib.h>

#include "dist.h"

void twk_dist_init(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
}
void twk_dist_finalize(void) {}
int twk_dist_rank(void) { return 0; }
int twk_dist_size(void) { return 1; }
int twk_dist_local_rank(void) { return 0; }
int twk_dist_local_size(void) { return 1; }
int twk_dist_first_failure(twk_status st) { return st == TWK_OK ? -1 : 0; }
void twk_dist_sum_f64(double *v, int n) {
    (void)v;
    (void)n;
}
twk_status twk_dist_sum_grads(twk_trainer *t, size_t bucket_bytes, twk_dist_stats *stats) {
    (void)t;
    (void)bucket_bytes;
    if (stats) *stats = (twk_dist_stats){0, 0, 0, 0};
    return TWK_OK;
}
int twk_dist_params_differ(twk_trainer *t) {
    (void)t;
    return -1;
}
twk_status twk_dist_send(int to, int tag, const void *buf, int64_t n) {
    (void)to, (void)tag, (void)buf, (void)n;
    return twk_error(TWK_ERR_STATE, "dist: no other rank to send to");
}
twk_status twk_dist_send_async(int to, int tag, void *buf, int64_t n) {
    (void)to, (void)tag, (void)n;
    twk_host_free(buf);
    return twk_error(TWK_ERR_STATE, "dist: no other rank to send to");
}
twk_status twk_dist_recv(int from, int tag, void **buf, int64_t *n) {
    (void)from, (void)tag;
    *buf = NULL;
    *n = 0;
    return twk_error(TWK_ERR_STATE, "dist: no other rank to receive from");
}
void twk_dist_watch_failures(void) {}
int twk_dist_failed(void) { return 0; }
void twk_dist_abort(int code) { exit(code); }

twk_status twk_dist_overlap_begin(twk_trainer *t, size_t bucket_bytes, twk_dist_overlap **out) {
    (void)t;
    (void)bucket_bytes;
    *out = NULL; /* one rank: nothing to sum */
    return TWK_OK;
}

twk_status twk_dist_overlap_end(twk_dist_overlap *ov, twk_dist_stats *stats) {
    (void)ov;
    if (stats) *stats = (twk_dist_stats){0, 0, 0, 0};
    return TWK_OK;
}
