/* `twinkle devices`: every registered backend and its devices. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "twinkle/twinkle.h"

int twk_cmd_devices(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: twinkle devices\n  Lists each backend built into this binary and its devices.\n");
        return 0;
    }
    int nb = twk_backend_count();
    for (int b = 0; b < nb; b++) {
        const twk_backend_iface *be = twk_backend_get(b);
        twk_clear_error(); /* a backend with no devices may leave the reason */
        int nd = twk_backend_device_count(be);
        if (nd == 0) {
            const char *why = twk_last_error();
            printf("%-8s (no devices%s%s)\n", twk_backend_name(be), why[0] ? ": " : "", why);
            continue;
        }
        for (int d = 0; d < nd; d++) {
            twk_device_props p;
            if (twk_backend_device_props(be, d, &p) != TWK_OK) {
                printf("%s:%d  error: %s\n", twk_backend_name(be), d, twk_last_error());
                continue;
            }
            printf("%s:%d  %s  kind=%s  units=%d  threads=%d  memory=%.1f GiB\n", twk_backend_name(be), d, p.name,
                   p.kind, p.compute_units, p.max_threads, (double)p.memory_bytes / (1024.0 * 1024 * 1024));
        }
    }
    return 0;
}
