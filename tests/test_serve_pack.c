/* test_serve_pack — packed training at the service level: a `twinkle serve` runs in this process
 * (twk_serve_start: the built-in tiny model, port 0) with N_RUNS LoRA runs; each round sends one
 * forward_backward per run on its own connection, all written before any answer is read, so the
 * requests are at the heads of their runs' orders together, then polls every future. The pass
 * counter (twk_serve_pack_stats) must show shared passes — fewer passes than requests, one holding
 * several runs — not one pass per request (time sharing), and GET /metrics must report the same
 * numbers (twinkle_train_passes_total, twinkle_train_packed_runs_total). A round that found the
 * worker idle may run its first request alone; up to MAX_ROUNDS rounds are tried until one shares. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
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

#define N_RUNS 6
#define MAX_ROUNDS 8
#include "wire_request.h"

static int port;

/* ---- HTTP client: one connection per request, written first and read later ---- */

static int http_send(const char *method, const char *path, const char *ctype, const void *body, size_t blen) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {120, 0}; /* a hang guard */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    char head[512];
    int hl = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: x\r\nX-API-Key: tml-pack\r\nContent-Type: %s\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                      method, path, ctype, blen);
    if (write(fd, head, (size_t)hl) != hl || (blen && write(fd, body, blen) != (ssize_t)blen)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The answer's body (malloc'ed, NUL-terminated) and status; NULL when none came. */
static char *http_read(int fd, int *status) {
    *status = -1;
    if (fd < 0) return NULL;
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
    if (n < 12 || strncmp(buf, "HTTP/1.1 ", 9) || !sep) {
        free(buf);
        return NULL;
    }
    *status = atoi(buf + 9);
    memmove(buf, sep + 4, n - (size_t)(sep + 4 - buf) + 1);
    return buf;
}

static char *post(const char *path, const char *ctype, const void *body, size_t len, int *status) {
    char p[256];
    snprintf(p, sizeof p, "/api/v1/%s", path);
    return http_read(http_send("POST", p, ctype, body, len), status);
}

/* The string value of "key" in a JSON body, or "". */

/* Polls future id until it is no longer try_again; 1 if it succeeded. */
static int wait_future(const char *what, const char *id) {
    char q[256];
    int ql = snprintf(q, sizeof q, "{\"request_id\":\"%s\"}", id);
    for (int polls = 0; polls < 100; polls++) {
        int st;
        char *b = post("retrieve_future", "application/json", q, (size_t)ql, &st);
        int again = b && st == 200 && b[0] == '{' && strstr(b, "\"try_again\"");
        int ok = b && st == 200 && !(b[0] == '{' && strstr(b, "\"error\""));
        if (!again && !ok) printf("     %s: %d %s\n", what, st, b ? b : "(no answer)");
        free(b);
        if (!again) return ok;
    }
    return 0;
}

/* ---- the requests ---- */


/* The value of the /metrics sample line starting with prefix (name and labels), or -1. */
static double sample(const char *text, const char *prefix) {
    size_t n = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, prefix, n) && p[n] == ' ') return atof(p + n + 1);
    return -1;
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    signal(SIGPIPE, SIG_IGN);
    char dir[] = "/tmp/twk-serve-pack-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    twk_serve_config cfg;
    twk_serve_config_default(&cfg);
    cfg.port = 0;
    cfg.quiet = 1;
    snprintf(cfg.data_dir, sizeof cfg.data_dir, "%s", dir);
    twk_serve *srv = NULL;
    if (twk_serve_start(&cfg, &srv) != TWK_OK) {
        printf("FAIL the service did not start: %s\n", twk_last_error());
        return 1;
    }
    port = twk_serve_port(srv);
    int st;
    char *b = post("create_session", "application/json", "{}", 2, &st);
    char session[128], js[512], rid[128], model[N_RUNS][128];
    json_str(b, "session_id", session, sizeof session);
    free(b);
    int seq[N_RUNS], made = 0;
    for (int r = 0; r < N_RUNS; r++) {
        int l = snprintf(js, sizeof js,
                         "{\"session_id\":\"%s\",\"model_seq_id\":%d,\"base_model\":\"%s\",\"lora_config\":{\"rank\":%d}}",
                         session, r, TWK_DEFAULT_MODEL_NAME, 4 << (r % 3));
        b = post("create_model", "application/json", js, (size_t)l, &st);
        json_str(b, "request_id", rid, sizeof rid);
        json_str(b, "model_id", model[r], sizeof model[r]);
        free(b);
        made += st == 200 && model[r][0] && wait_future("create_model", rid);
        seq[r] = 1;
    }
    check(made == N_RUNS, "%d LoRA runs of ranks 4, 8, 16 created", made);
    twk_pack_stats ps = {0};
    int requests = 0, done = 0, rounds = 0;
    for (; made == N_RUNS && rounds < MAX_ROUNDS && ps.shared_passes == 0; rounds++) {
        int fd[N_RUNS];
        uint8_t fb[2048];
        for (int r = 0; r < N_RUNS; r++) { /* every request written before any answer is read */
            size_t n = fb_request(fb, model[r], seq[r]++);
            fd[r] = http_send("POST", "/api/v1/forward_backward", "application/x-protobuf", fb, n);
        }
        char ids[N_RUNS][128];
        for (int r = 0; r < N_RUNS; r++) {
            b = http_read(fd[r], &st);
            json_str(b, "request_id", ids[r], sizeof ids[r]);
            free(b);
            requests += st == 200 && ids[r][0];
        }
        for (int r = 0; r < N_RUNS; r++) done += ids[r][0] && wait_future("forward_backward", ids[r]);
        twk_serve_pack_stats(srv, &ps);
    }
    printf("     %d rounds, %d forward_backward requests: %lld passes, %lld of them shared, %lld run segments, "
           "at most %d runs in a pass\n",
           rounds, requests, (long long)ps.passes, (long long)ps.shared_passes, (long long)ps.segments, ps.max_segments);
    check(done == requests && requests == rounds * N_RUNS, "every forward_backward succeeded (%d of %d)", done,
          rounds * N_RUNS);
    check(ps.segments == requests, "one segment per request (cross_entropy: one pass's worth each)");
    check(ps.shared_passes > 0 && ps.max_segments > 1 && ps.passes < requests,
          "the concurrent requests shared passes: %lld passes for %d requests, not one each", (long long)ps.passes,
          requests);

    int fd = http_send("GET", "/metrics", "text/plain", NULL, 0);
    char *text = http_read(fd, &st);
    char l[200];
    snprintf(l, sizeof l, "twinkle_train_passes_total{model=\"%s\",kind=\"packed\"}", TWK_DEFAULT_MODEL_NAME);
    double packed = text ? sample(text, l) : -1;
    snprintf(l, sizeof l, "twinkle_train_passes_total{model=\"%s\",kind=\"alone\"}", TWK_DEFAULT_MODEL_NAME);
    double alone = text ? sample(text, l) : -1;
    snprintf(l, sizeof l, "twinkle_train_packed_runs_total{model=\"%s\"}", TWK_DEFAULT_MODEL_NAME);
    double runs = text ? sample(text, l) : -1;
    check(st == 200 && packed == (double)ps.shared_passes && alone == (double)(ps.passes - ps.shared_passes) &&
              runs == (double)(ps.segments - (ps.passes - ps.shared_passes)),
          "GET /metrics: packed %g, alone %g passes, %g runs in packed passes", packed, alone, runs);
    free(text);
    twk_serve_stop(srv);
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    if (system(rm) != 0) printf("note: could not remove %s\n", dir);
    printf("%s\n", check_failures ? "FAILED" : "all passed");
    return check_failures ? 1 : 0;
}
