/* test_alloc_fail — the service under host-allocation failure.
 *
 * A `twinkle serve` runs in this process (twk_serve_start: the built-in tiny model, port 0) with a
 * counting allocator installed through twk_set_allocator; this thread is its client over HTTP.
 * A pass is one forward_backward, one optim_step, one save_weights and one asample, each with its
 * retrieve_future polls, and a trace_export of the session (rebuilt each pass). A clean pass counts the host allocations it causes (N); then for
 * k = 1, 1 + stride, ... <= N a pass runs with the k-th allocation after its start failing. Every
 * answer must be 200, or 5xx (the client then sends the same request again, as the SDK does; a
 * training op's resubmit is deduplicated by its seq_id), and every finished future either succeeds
 * or fails with category "server" — an answer of 4xx or a future of category "user" is a failure
 * of this test. The service must answer the next request; a last clean pass must succeed fully.
 * Leaks on the failure paths are found by LeakSanitizer in the sanitizer build (the service is
 * stopped and freed before exit). The test's own buffers use libc directly (never counted).
 * The stride keeps the run short: at most MAX_PASSES failing passes (TWK_ALLOC_FAIL_ALL=1: every k). */
#include <arpa/inet.h>
#include <execinfo.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "check.h"
#include "service.h"
#include "twinkle/hal.h"

#define MAX_PASSES 150
#define POLL_S 2.0    /* --poll-timeout: a future still pending is answered try_again after this */
#define MAX_POLLS 30  /* a future pending this many polls is lost (every op here takes well under a second) */
#include "wire_request.h"

static atomic_long n_alloc;   /* allocations so far */
static atomic_long fail_at;   /* the allocation number to fail; 0 = none */
static atomic_int n_failed;   /* failures injected */

static void *count_alloc(void *user, size_t bytes, size_t align) {
    (void)user;
    long n = atomic_fetch_add(&n_alloc, 1) + 1;
    if (n == atomic_load(&fail_at)) {
        atomic_fetch_add(&n_failed, 1);
        if (getenv("TWK_ALLOC_FAIL_TRACE")) { /* where the failing allocation is */
            void *bt[24];
            backtrace_symbols_fd(bt, backtrace(bt, 24), 2);
        }
        return NULL;
    }
    void *p = NULL;
    size_t rounded = (bytes + align - 1) / align * align;
    return posix_memalign(&p, align, rounded ? rounded : align) == 0 ? p : NULL;
}

static void count_free(void *user, void *p) {
    (void)user;
    free(p);
}

static int port;
static struct {
    int ok, retried_5xx, dropped, future_server;
} seen;

/* ---- HTTP client: one connection per request ---- */

typedef struct resp {
    int status; /* -1: no answer (connection failed or closed) */
    char *body;
    size_t len;
} resp;

static const char *method = "POST"; /* of the next requests (GET: trace_export) */

static resp http(const char *path, const char *ctype, const void *body, size_t blen) {
    resp r = {-1, NULL, 0};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {120, 0}; /* a hang guard, not an assertion */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return r;
    }
    char head[512];
    int hl = snprintf(head, sizeof head,
                      "%s /api/v1/%s HTTP/1.1\r\nHost: x\r\nX-API-Key: tml-alloc\r\nContent-Type: %s\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                      method, path, ctype, blen);
    if (write(fd, head, (size_t)hl) != hl || (blen && write(fd, body, blen) != (ssize_t)blen)) {
        close(fd);
        return r;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (n + 1024 > cap) buf = realloc(buf, cap *= 2);
        ssize_t k = read(fd, buf + n, cap - n - 1);
        if (k <= 0) break;
        n += (size_t)k;
    }
    close(fd);
    buf[n] = 0;
    char *sep = strstr(buf, "\r\n\r\n");
    if (n > 12 && !strncmp(buf, "HTTP/1.1 ", 9) && sep) {
        r.status = atoi(buf + 9);
        r.len = n - (size_t)(sep + 4 - buf);
        r.body = malloc(r.len + 1);
        memcpy(r.body, sep + 4, r.len);
        r.body[r.len] = 0;
    }
    free(buf);
    return r;
}

/* The string value of "key" in a JSON body, or "" */

/* Sends until the service answers other than 5xx / no answer; returns that answer (200 expected). */
static resp send_until_answered(const char *what, const char *path, const char *ctype, const void *body, size_t len) {
    for (int attempt = 0;; attempt++) {
        resp r = http(path, ctype, body, len);
        if (r.status == 200 || attempt == 20 || (r.status >= 400 && r.status < 500)) {
            check(r.status == 200, "%s: answered %d: %s", what, r.status, r.body ? r.body : "(no answer)");
            return r;
        }
        if (r.status < 0) seen.dropped++;
        else seen.retried_5xx++;
        free(r.body);
    }
}

/* Submits a request that answers a future, then polls it to its end. 1 if it succeeded; 0 if it
 * failed with category server (acceptable here); a user failure or any other answer is a FAIL. */
static int run_future(const char *what, const char *path, const char *ctype, const void *body, size_t len,
                      char *model_id, size_t model_len) {
    resp r = send_until_answered(what, path, ctype, body, len);
    char id[128];
    json_str(r.body, "request_id", id, sizeof id);
    if (model_id) json_str(r.body, "model_id", model_id, model_len);
    free(r.body);
    if (!id[0]) {
        check(0, "%s: no request_id", what);
        return 0;
    }
    char q[256];
    int ql = snprintf(q, sizeof q, "{\"request_id\":\"%s\"}", id);
    for (int polls = 0;; polls++) {
        resp f = send_until_answered(what, "retrieve_future", "application/json", q, (size_t)ql);
        if (f.status != 200) return 0;
        int json = f.len && f.body[0] == '{';
        if (json && strstr(f.body, "\"try_again\"")) {
            free(f.body);
            if (polls < MAX_POLLS) continue;
            check(0, "%s: its future did not finish (%d polls of %g s)", what, polls, POLL_S);
            return 0;
        }
        int ok = 1;
        if (json && strstr(f.body, "\"category\"")) {
            check(strstr(f.body, "\"category\":\"server\"") != NULL, "%s: future failed not as server: %s", what, f.body);
            seen.future_server++;
            ok = 0;
        } else if (!f.len) {
            check(0, "%s: empty result", what);
            ok = 0;
        }
        free(f.body);
        return ok;
    }
}

/* ---- the requests ---- */


static char model_id[128], sampler_id[160], session[128];
static int seq = 1;

/* One pass; returns how many of its four ops succeeded. */
static int pass(void) {
    uint8_t fb[2048];
    char js[512];
    int ok = 0;
    size_t n = fb_request(fb, model_id, seq++);
    ok += run_future("forward_backward", "forward_backward", "application/x-protobuf", fb, n, NULL, 0);
    int l = snprintf(js, sizeof js, "{\"model_id\":\"%s\",\"seq_id\":%d,\"adam_params\":{\"learning_rate\":0.001}}",
                     model_id, seq++);
    ok += run_future("optim_step", "optim_step", "application/json", js, (size_t)l, NULL, 0);
    l = snprintf(js, sizeof js, "{\"model_id\":\"%s\",\"seq_id\":%d,\"path\":\"ck\",\"overwrite\":true}", model_id,
                 seq++);
    ok += run_future("save_weights", "save_weights", "application/json", js, (size_t)l, NULL, 0);
    l = snprintf(js, sizeof js,
                 "{\"sampling_session_id\":\"%s\",\"prompt\":{\"chunks\":[{\"type\":\"encoded_text\",\"tokens\":[1,2,3]}]},"
                 "\"sampling_params\":{\"max_tokens\":4,\"seed\":1},\"num_samples\":1}",
                 sampler_id);
    ok += run_future("asample", "asample", "application/json", js, (size_t)l, NULL, 0);
    /* the session's trace, rebuilt each pass (it has new records): ready, or 5xx and asked again */
    char route[200];
    snprintf(route, sizeof route, "sessions/%s/trace_export", session);
    method = "GET";
    resp r = send_until_answered("trace_export", route, "application/json", "", 0);
    method = "POST";
    check(r.status != 200 || (r.body && strstr(r.body, "\"status\":\"ready\"")), "trace_export: %s", r.body);
    free(r.body);
    return ok;
}

int main(void) {
    check_quiet = 1; /* thousands of passes: only the failures are worth a line */
    setvbuf(stdout, NULL, _IONBF, 0);
    signal(SIGPIPE, SIG_IGN); /* a refused connection closes while we write */
    char dir[] = "/tmp/twk-alloc-fail-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    twk_allocator a = {count_alloc, count_free, NULL};
    twk_set_allocator(&a);
    twk_serve_config cfg;
    twk_serve_config_default(&cfg);
    cfg.port = 0;
    cfg.quiet = 1;
    cfg.poll_timeout_s = POLL_S;
    snprintf(cfg.data_dir, sizeof cfg.data_dir, "%s", dir);
    twk_serve *srv = NULL;
    if (twk_serve_start(&cfg, &srv) != TWK_OK) {
        printf("FAIL the service did not start: %s\n", twk_last_error());
        return 1;
    }
    port = twk_serve_port(srv);

    /* set up: a session, a LoRA run, a sampling session on the base model */
    resp r = send_until_answered("create_session", "create_session", "application/json", "{}", 2);
    char js[512];
    json_str(r.body, "session_id", session, sizeof session);
    free(r.body);
    int l = snprintf(js, sizeof js,
                     "{\"session_id\":\"%s\",\"model_seq_id\":0,\"base_model\":\"%s\",\"lora_config\":{\"rank\":4}}",
                     session, TWK_DEFAULT_MODEL_NAME);
    int created = run_future("create_model", "create_model", "application/json", js, (size_t)l, model_id, sizeof model_id);
    l = snprintf(js, sizeof js, "{\"session_id\":\"%s\",\"sampling_session_seq_id\":0,\"base_model\":\"%s\"}", session,
                 TWK_DEFAULT_MODEL_NAME);
    r = send_until_answered("create_sampling_session", "create_sampling_session", "application/json", js, (size_t)l);
    json_str(r.body, "sampling_session_id", sampler_id, sizeof sampler_id);
    free(r.body);
    check(created && model_id[0] && sampler_id[0], "set-up: run '%s', sampler '%s'", model_id, sampler_id);

    if (!check_failures) {
        pass(); /* warm: the sampler and the first checkpoint exist from here on */
        long before = atomic_load(&n_alloc);
        int clean = pass();
        long count = atomic_load(&n_alloc) - before;
        check(clean == 4, "a clean pass: %d of 4 ops succeeded", clean);
        long stride = (count + MAX_PASSES - 1) / MAX_PASSES;
        if (stride < 1 || getenv("TWK_ALLOC_FAIL_ALL")) stride = 1; /* TWK_ALLOC_FAIL_ALL=1: every k */
        printf("a clean pass makes %ld host allocations; failing the k-th for k = 1..%ld, stride %ld\n", count, count,
               stride);
        int passes = 0, hit = 0;
        const char *only = getenv("TWK_ALLOC_FAIL_K"); /* one k, to debug it */
        for (long k = only ? atol(only) : 1; k <= count && check_failures < 10; k += only ? count : stride, passes++) {
            int f0 = atomic_load(&n_failed), fail0 = check_failures;
            atomic_store(&fail_at, atomic_load(&n_alloc) + k);
            pass();
            atomic_store(&fail_at, 0);
            hit += atomic_load(&n_failed) > f0;
            if (check_failures > fail0) printf("  ^ with the allocation k = %ld of the pass failing\n", k);
        }
        int last = pass();
        check(last == 4, "a clean pass after the failures: %d of 4 ops succeeded", last);
        printf("%d failing passes (%d injected a failure); answers retried after 5xx: %d, after no answer: %d; "
               "futures failed with category server: %d\n",
               passes, hit, seen.retried_5xx, seen.dropped, seen.future_server);
    }
    twk_serve_stop(srv);
    twk_set_allocator(NULL);
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    if (system(rm) != 0) printf("note: could not remove %s\n", dir);
    printf("%d failures\n", check_failures);
    return check_failures ? 1 : 0;
}
