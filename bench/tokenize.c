/* bench_tokenize: twk_tokenizer_encode over the committed corpus (tests/tokenizer/corpus.bin.gz),
 * one thread, record by record with add_special on, for each fixture tokenizer: MB/s (best of
 * --reps passes; the corpus bytes over the thread's CPU time, and over the wall time). Every pass's ids must equal the library's
 * (the fixture's expected_ids.bin.gz), else exit 1. Run by bench/tokenize/run.sh beside the
 * `tokenizers` peer.
 *
 *   bench_tokenize [--reps N] [--dir tests/tokenizer] [fixture ...]
 * Prints one line per fixture and `SUMMARY name=cpu_MB/s:wall_MB/s ...`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "tokenizer/corpus.h"
#include "twinkle/hal.h"
#include "twinkle/tokenizer.h"

static double cpu_now(void) { /* this thread's CPU time: the machine may be shared */
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    int reps = 3;
    const char *dir = TWK_TOKENIZER_DIR;
    const char *names[32];
    int n_names = 0;
    for (int i = 1; i < argc; i++) {
        long v;
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            if (!bench_parse_long("bench_tokenize", argv[++i], "--reps", 1, 1000, &v)) return 2;
            reps = (int)v;
        }
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc)
            dir = argv[++i];
        else if (argv[i][0] != '-' && n_names < 32)
            names[n_names++] = argv[i];
        else {
            fprintf(stderr, "usage: bench_tokenize [--reps N] [--dir DIR] [fixture ...]\n");
            return 2;
        }
    }
    if (!n_names) {
        static const char *all[] = {"bytelevel", "sp", "sp_legacy", "metaspace", "gpt2",
                                    "llama3",    "qwen2", "llama2", "mistral",   "nfkc"};
        for (int i = 0; i < 10; i++) names[n_names++] = all[i];
    }
    if (reps < 1) reps = 1;
    char path[1024];
    tk_corpus corpus;
    snprintf(path, sizeof path, "%s/corpus.bin.gz", dir);
    if (tk_corpus_read(path, &corpus)) return 1;
    printf("corpus: %lld records, %zu bytes; one thread, best of %d passes\n", (long long)corpus.n, corpus.bytes,
           reps);
    int bad = 0;
    char summary[2048] = "SUMMARY";
    for (int f = 0; f < n_names; f++) {
        twk_tokenizer *t = NULL;
        snprintf(path, sizeof path, "%s/%s/tokenizer.json", dir, names[f]);
        if (twk_tokenizer_load(path, &t)) {
            fprintf(stderr, "%s\n", twk_last_error());
            return 1;
        }
        tk_corpus x = corpus;
        x.ids = NULL, x.n_ids = NULL, x.flags = NULL;
        snprintf(path, sizeof path, "%s/%s/expected_ids.bin.gz", dir, names[f]);
        if (tk_expected_read(path, &x)) return 1;
        double best = 1e30, best_wall = 1e30;
        int64_t total = 0, wrong = 0;
        for (int r = 0; r < reps; r++) {
            total = 0;
            double t0 = cpu_now(), w0 = twk_now();
            for (int64_t i = 0; i < x.n; i++) {
                int32_t *ids;
                int64_t n;
                if (twk_tokenizer_encode(t, x.data + x.off[i], x.off[i + 1] - x.off[i], true, &ids, &n)) {
                    fprintf(stderr, "%s: %s\n", names[f], twk_last_error());
                    return 1;
                }
                wrong += n != x.n_ids[i] || memcmp(ids, x.ids[i], (size_t)n * sizeof *ids);
                total += n;
                twk_host_free(ids);
            }
            double dt = cpu_now() - t0, dw = twk_now() - w0;
            if (dt < best) best = dt;
            if (dw < best_wall) best_wall = dw;
        }
        double mbs = (double)corpus.bytes / best / 1e6;
        double wall = (double)corpus.bytes / best_wall / 1e6;
        printf("%-10s %8.2f MB/s cpu %8.2f MB/s wall  %8lld ids  %s\n", names[f], mbs, wall, (long long)total,
               wrong ? "IDS DIFFER FROM THE LIBRARY'S" : "ids ok");
        size_t l = strlen(summary);
        snprintf(summary + l, sizeof summary - l, " %s=%.3f:%.3f", names[f], mbs, wall);
        bad |= wrong != 0;
        twk_tokenizer_free(t);
        x.data = NULL, x.off = NULL;
        tk_corpus_free(&x);
    }
    printf("%s\n", summary);
    tk_corpus_free(&corpus);
    return bad;
}
