/* tests/fuzz — see fuzz_util.h. */
#include "fuzz_util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_TURNS 200000 /* loop turns before a connection that never closes is called a hang */

const char *twk_fuzz_tmpdir(void) {
    static char dir[256];
    if (dir[0]) return dir;
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    snprintf(dir, sizeof dir, "%s/twk-fuzz-XXXXXX", base);
    if (!mkdtemp(dir)) {
        perror("fuzz: mkdtemp");
        abort();
    }
    return dir;
}

const char *twk_fuzz_file(const char *name, const uint8_t *data, size_t len) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", twk_fuzz_tmpdir(), name);
    FILE *f = fopen(path, "wb");
    if (!f || (len && fwrite(data, 1, len, f) != len) || fclose(f) != 0) {
        perror("fuzz: writing the input file");
        abort();
    }
    return path;
}

static uint32_t rng_next(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

typedef struct sink {
    char *out;
    size_t cap, len;
} sink;

/* Reads what the server sent (kept in sk while it fits); returns 1 at EOF or error. */
static int drain(int fd, sink *sk) {
    char buf[16384];
    for (;;) {
        ssize_t k = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (k > 0) {
            if (sk->out && sk->len + 1 < sk->cap) {
                size_t n = (size_t)k < sk->cap - 1 - sk->len ? (size_t)k : sk->cap - 1 - sk->len;
                memcpy(sk->out + sk->len, buf, n);
                sk->len += n;
                sk->out[sk->len] = 0;
            }
            continue;
        }
        if (k == 0) return 1;
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : 1;
    }
}

void twk_fuzz_drive(uv_loop_t *loop, twk_http_server *s, const uint8_t *data, size_t len, uint32_t seed, char *out,
                    size_t out_cap) {
    sink sk = {out, out_cap, 0};
    if (out && out_cap) out[0] = 0;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        perror("fuzz: socketpair");
        abort();
    }
    int cl = sv[1];
    fcntl(cl, F_SETFL, fcntl(cl, F_GETFL) | O_NONBLOCK);
    int base = twk_http_server_connections(s);
    if (twk_http_server_adopt(s, sv[0]) != 0) {
        fprintf(stderr, "fuzz: adopt failed\n");
        abort();
    }
    uint32_t rng = seed;
    unsigned max_piece = seed ? 1 + seed % 97 : 0;
    size_t off = 0;
    int stuck = 0;
    while (off < len && cl >= 0) {
        size_t piece = max_piece ? 1 + rng_next(&rng) % max_piece : len - off;
        if (piece > len - off) piece = len - off;
        ssize_t k = send(cl, data + off, piece, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k > 0) {
            off += (size_t)k;
            stuck = 0;
        } else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            break; /* the server closed: the rest is never read */
        } else if (++stuck > 1000) {
            break; /* the server stopped reading (a parked request): give up sending */
        }
        if (drain(cl, &sk)) break;
        uv_run(loop, UV_RUN_NOWAIT);
    }
    shutdown(cl, SHUT_WR);
    for (int turn = 0;; turn++) {
        if (cl >= 0 && drain(cl, &sk)) {
            close(cl);
            cl = -1;
        }
        uv_run(loop, UV_RUN_NOWAIT);
        if (twk_http_server_connections(s) <= base) break;
        if (turn == MAX_TURNS / 2 && cl >= 0) { /* a long wait: the client gives up too */
            close(cl);
            cl = -1;
        }
        if (turn > MAX_TURNS) {
            fprintf(stderr, "fuzz: the server never closed the connection\n");
            abort();
        }
    }
    if (cl >= 0) close(cl);
}
