#include <stdio.h>
#include "twinkle/twinkle.h"
int main(void) {
    twk_device *dev;
    if (twk_device_open("cpu", &dev) != TWK_OK) { printf("%s\n", twk_last_error()); return 1; }
    twk_tiny_lm_config c = twk_tiny_lm_default();
    twk_tiny_lm *m;
    if (twk_tiny_lm_new(&c, dev, &m) != TWK_OK) { printf("%s\n", twk_last_error()); return 1; }
    for (int i = 0; i < 5; i++) { float l; if (twk_tiny_lm_step(m, &l) != TWK_OK) { printf("%s\n", twk_last_error()); return 1; } printf("%f\n", l); }
    twk_tiny_lm_free(m); twk_device_close(dev); return 0;
}
