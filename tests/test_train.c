/* A tiny transformer trains end to end: the loss falls at least tenfold on a
 * memorisation task, and two runs with one seed give bit-identical losses. */
#include <stdio.h>
#include <string.h>

#include "twinkle/twinkle.h"

#define STEPS 60

static int run(twk_device *dev, uint64_t seed, float *losses) {
    twk_tiny_lm_config cfg = twk_tiny_lm_default();
    cfg.seed = seed;
    twk_tiny_lm *m = NULL;
    if (twk_tiny_lm_new(&cfg, dev, &m) != TWK_OK) {
        printf("FAIL tiny_lm_new: %s\n", twk_last_error());
        return 0;
    }
    for (int i = 0; i < STEPS; i++)
        if (twk_tiny_lm_step(m, &losses[i]) != TWK_OK) {
            printf("FAIL step %d: %s\n", i, twk_last_error());
            twk_tiny_lm_free(m);
            return 0;
        }
    twk_tiny_lm_free(m);
    return 1;
}

int main(void) {
    twk_device *dev = NULL;
    if (twk_device_open("cpu", &dev) != TWK_OK) {
        printf("%s\n", twk_last_error());
        return 1;
    }
    float a[STEPS], b[STEPS], c[STEPS];
    int fails = 0;
    if (!run(dev, 7, a) || !run(dev, 7, b) || !run(dev, 8, c)) return 1;
    for (int i = 0; i < STEPS; i += 10) printf("     step %2d loss %.5f\n", i, a[i]);
    printf("     step %2d loss %.5f\n", STEPS - 1, a[STEPS - 1]);
    double drop = a[0] / a[STEPS - 1];
    int ok = drop >= 10.0;
    printf("%s loss fell %.1fx in %d steps (want >= 10x)\n", ok ? "ok  " : "FAIL", drop, STEPS);
    fails += !ok;
    ok = memcmp(a, b, sizeof a) == 0;
    printf("%s two runs with seed 7 give bit-identical losses\n", ok ? "ok  " : "FAIL");
    fails += !ok;
    ok = memcmp(a, c, sizeof a) != 0;
    printf("%s a different seed gives different losses\n", ok ? "ok  " : "FAIL");
    fails += !ok;
    twk_device_close(dev);
    return fails ? 1 : 0;
}
