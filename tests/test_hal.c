/* HAL: the registry (built-in cpu, register/unregister, incomplete tables and
 * duplicates refused), device properties (through the table and the public
 * accessors), buffer round trips, the log hook and the API version, the op table,
 * and every built backend's kernel table against the CPU's (a missing kernel
 * fails unless the backend declares why it lacks it). */
#include <stdio.h>
#include <string.h>

#include "twinkle/twinkle.h"
#include "twk_backend.h" /* the backend interface: tables, launches */

static int fails;

/* The log hook's last message, level and count. */
static char logged[256];
static int logged_level = -1, n_logged;
static void capture(twk_log_level level, const char *msg, void *user) {
    snprintf(logged, sizeof logged, "%s", msg);
    logged_level = (int)level;
    n_logged += *(int *)user;
}

/* A backend whose kernel table misses ADD and declares MUL unsupported. */
static int gappy_op_kernel(twk_op op, const char **why) {
    *why = op == TWK_OP_MUL ? "declared: a test backend" : NULL;
    return op != TWK_OP_ADD && op != TWK_OP_MUL;
}

static void check(int cond, const char *what) {
    printf("%s %s%s%s\n", cond ? "ok  " : "FAIL", what, cond ? "" : ": ", cond ? "" : twk_last_error());
    fails += !cond;
}

int main(void) {
    check(twk_backend_count() >= 1 && twk_backend_find("cpu") != NULL, "the cpu backend is registered");
    const twk_backend_iface *cpu = twk_backend_find("cpu");
    twk_device_props props;
    check(cpu->device_count() == 1 && cpu->device_props(0, &props) == TWK_OK && props.compute_units >= 1,
          "cpu:0 has properties");
    printf("     cpu:0 = %s, %d units, %d threads, %.1f GiB\n", props.name, props.compute_units,
           props.max_threads, (double)props.memory_bytes / (1 << 30));

    twk_device_props pub;
    check(!strcmp(twk_backend_name(cpu), "cpu") && twk_backend_device_count(cpu) == 1 &&
              twk_backend_device_props(cpu, 0, &pub) == TWK_OK && !strcmp(pub.name, props.name) &&
              twk_backend_device_props(cpu, 1, &pub) == TWK_ERR_INVALID_ARG && !strcmp(twk_backend_name(NULL), ""),
          "the public accessors agree with the table; device 1 of the cpu is refused");

    twk_backend_iface copy = *cpu;
    check(twk_backend_register(&copy) == TWK_ERR_INVALID_ARG && strstr(twk_last_error(), "already"),
          "a second backend named 'cpu' is refused");
    copy.name = "half";
    copy.run = NULL;
    check(twk_backend_register(&copy) == TWK_ERR_INVALID_ARG && strstr(twk_last_error(), "incomplete"),
          "a table missing run() is refused");
    copy.run = cpu->run;
    check(twk_backend_register(&copy) == TWK_OK && twk_backend_find("half") == &copy, "a complete table registers");
    check(twk_backend_unregister("half") == TWK_OK && twk_backend_find("half") == NULL, "and unregisters");
    check(twk_backend_unregister("half") == TWK_ERR_NOT_FOUND, "unregistering twice is not found");

    twk_device *dev = NULL;
    check(twk_device_open(NULL, &dev) == TWK_OK && strcmp(twk_device_spec(dev), "cpu:0") == 0,
          "the default device is cpu:0");
    memset(&pub, 0, sizeof pub);
    check(twk_device_get_props(dev, &pub) == TWK_OK && !strcmp(pub.name, props.name), "an opened device's properties");
    twk_buffer *a = NULL, *b = NULL;
    check(twk_buffer_alloc(dev, 64, &a) == TWK_OK && twk_buffer_alloc(dev, 64, &b) == TWK_OK &&
              twk_buffer_size(a) == 64,
          "buffers allocate with their size");
    float in[16], out[16];
    for (int i = 0; i < 16; i++) in[i] = (float)i * 0.5f;
    memset(out, 0, sizeof out);
    check(twk_buffer_upload(dev, a, 0, in, 64) == TWK_OK && twk_buffer_copy(dev, b, 16, a, 0, 48) == TWK_OK &&
              twk_buffer_zero(dev, b, 0, 16) == TWK_OK && twk_buffer_download(dev, b, 0, out, 64) == TWK_OK,
          "upload, copy, zero, download");
    int same = 1;
    for (int i = 0; i < 16; i++) same &= out[i] == (i < 4 ? 0.0f : in[i - 4]);
    check(same, "the bytes arrive where they were sent");
    check(twk_device_synchronize(dev) == TWK_OK, "synchronize");
    twk_buffer_free(dev, a);
    twk_buffer_free(dev, b);
    twk_device_close(dev);
    int one = 1;
    twk_set_log_fn(TWK_LOG_WARN, capture, &one);
    twk_log(TWK_LOG_INFO, "below the level");
    check(n_logged == 0, "the log hook drops messages below its level");
    twk_log(TWK_LOG_WARN, "backend %s: %d\n", "x", 7);
    check(n_logged == 1 && logged_level == TWK_LOG_WARN && !strcmp(logged, "backend x: 7"),
          "the log hook gets a warning as one line without its newline");
    twk_set_log_fn(TWK_LOG_OFF, capture, &one);
    twk_log(TWK_LOG_ERROR, "off");
    check(n_logged == 1, "TWK_LOG_OFF passes nothing on");
    twk_set_log_fn(TWK_LOG_INFO, NULL, NULL); /* the default: stderr */
    check(twk_api_version() == TWK_API_VERSION && !strcmp(twk_version_string(), TWK_VERSION) &&
              twk_api_version() / 10000 == TWK_API_VERSION_MAJOR,
          "the library's API version is the header's");
    for (int s = TWK_OK; s <= TWK_ERR_STATE; s++)
        if (!strcmp(twk_status_name((twk_status)s), "unknown")) fails++;
    check(1, "every status has a name");
    check(!strcmp(twk_op_name(TWK_OP_MATMUL), "matmul") && !strcmp(twk_op_name(TWK_OP_COUNT), "?"),
          "op names come from the op list");
    /* the op table: a row per op, kinds consistent with the kernels */
    int rows_ok = 1;
    for (int op = 0; op < TWK_OP_COUNT; op++) {
        const twk_op_traits *t = twk_op_info((twk_op)op);
        const char *why = NULL;
        rows_ok &= t->name && strcmp(t->name, "?") != 0 && (t->checked & ~t->index) == 0;
        rows_ok &= (t->checked != 0) == (t->ids.check != TWK_IDS_NONE);
        rows_ok &= twk_op_has_kernel((twk_op)op) == (cpu->op_kernel((twk_op)op, &why) != 0);
        rows_ok &= t->kind != TWK_OPK_MAP || (t->nsrc == 1 && twk_op_info(t->back)->nsrc == 2);
    }
    check(rows_ok, "op table: named rows, checked ids are ids and have an id rule, the CPU runs exactly the ops that need a kernel, "
                   "every map has a (x, dy) gradient op");
    for (int i = 0; i < twk_backend_count(); i++) {
        const twk_backend_iface *be = twk_backend_get(i);
        char missing[300], declared[300], what[800];
        int n = twk_backend_missing_kernels(be, missing, sizeof missing, declared, sizeof declared);
        snprintf(what, sizeof what, "backend %s has a kernel for every op the cpu runs%s%s%s%s", be->name,
                 n ? "; missing:" : "", missing, declared[0] ? "; declared unsupported:" : "", declared);
        check(n == 0, what);
    }
    /* per-op 16-bit capability: the CPU reads every 16-bit source the op table allows */
    twk_device *cd = NULL;
    int half_ok = twk_device_open("cpu", &cd) == TWK_OK;
    for (int op = 0; half_ok && op < TWK_OP_COUNT; op++)
        half_ok = twk_device_half_srcs(cd, (twk_op)op) == twk_op_half_srcs((twk_op)op);
    half_ok = half_ok && twk_device_half_srcs(cd, TWK_OP_MATMUL) == TWK_SRC(1) && twk_device_half_srcs(cd, TWK_OP_ADD) == 0 &&
              twk_device_half_srcs(NULL, TWK_OP_MATMUL) == 0;
    check(half_ok, "twk_device_half_srcs: the cpu's masks are the op table's (matmul: src 1); 0 for other ops and NULL");
    twk_device_close(cd);
    twk_backend_iface gappy = *cpu;
    gappy.name = "gappy";
    gappy.op_kernel = gappy_op_kernel;
    char missing[256], declared[256];
    int n = twk_backend_missing_kernels(&gappy, missing, sizeof missing, declared, sizeof declared);
    printf("     gappy: missing%s; declared%s\n", missing, declared);
    check(n == 1 && !strcmp(missing, " add") && strstr(declared, "mul (declared: a test backend)"),
          "a missing kernel is found; a declared one is only listed");
    printf("%d failures\n", fails);
    return fails ? 1 : 0;
}
