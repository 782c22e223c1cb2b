/* `twinkle train`'s data and schedule: see train_data.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_data.h"

int twk_data_files_add(twk_data_files *f, const char *arg) {
    if (f->n == TWK_MAX_DATA_FILES) {
        fprintf(stderr, "twinkle train: at most %d --data files\n", TWK_MAX_DATA_FILES);
        return 0;
    }
    const char *colon = strrchr(arg, ':');
    char *end = NULL;
    double w = colon ? strtod(colon + 1, &end) : 1.0;
    size_t len = strlen(arg);
    if (colon && colon[1] && end && !*end) { /* FILE:WEIGHT */
        if (!(w > 0 && w < 1e9)) {
            fprintf(stderr, "twinkle train: --data %s: the weight must be a positive number\n", arg);
            return 0;
        }
        len = (size_t)(colon - arg);
    } else w = 1.0;
    char *path = malloc(len + 1);
    if (!path) {
        fprintf(stderr, "twinkle train: out of memory\n");
        return 0;
    }
    memcpy(path, arg, len);
    path[len] = 0;
    f->path[f->n] = path;
    f->weight[f->n++] = w;
    return 1;
}

void twk_data_files_free(twk_data_files *f) {
    for (int i = 0; i < f->n; i++) free((char *)f->path[i]);
    f->n = 0;
}

twk_status twk_train_data_load(const twk_data_files *f, const twk_data_opts *opts, int group, uint64_t seed,
                               const char *eval_path, double eval_fraction, twk_dataset **train, twk_dataset **eval) {
    twk_dataset *parts[TWK_MAX_DATA_FILES] = {0}, *evals[TWK_MAX_DATA_FILES] = {0};
    *train = *eval = NULL;
    twk_status st = TWK_OK;
    int n_eval = 0;
    for (int i = 0; i < f->n && st == TWK_OK; i++) {
        st = twk_dataset_load(f->path[i], opts, &parts[i]);
        if (st == TWK_OK && twk_dataset_count(parts[i]) % group)
            st = twk_error(TWK_ERR_INVALID_ARG, "%s has %lld examples; pairs (chosen, rejected) need an even count",
                           f->path[i], (long long)twk_dataset_count(parts[i]));
        if (st == TWK_OK && !eval_path && eval_fraction > 0) {
            twk_dataset *rest = NULL;
            st = twk_dataset_split(parts[i], eval_fraction, group, seed + (uint64_t)i, &rest, &evals[i]);
            if (st == TWK_OK) {
                twk_dataset_free(parts[i]);
                parts[i] = rest;
                n_eval++;
            }
        }
    }
    if (st == TWK_OK && f->n == 1) {
        *train = parts[0];
        parts[0] = NULL;
    } else if (st == TWK_OK)
        st = twk_dataset_mix((const twk_dataset *const *)parts, f->weight, f->n, group, seed, train);
    if (st == TWK_OK && eval_path) st = twk_dataset_load(eval_path, opts, eval);
    if (st == TWK_OK && n_eval) { /* the held-out parts end to end */
        int64_t total = 0;
        for (int i = 0; i < f->n; i++) total += twk_dataset_count(evals[i]);
        int *part = malloc((size_t)total * sizeof *part);
        int64_t *idx = malloc((size_t)total * sizeof *idx), n = 0;
        for (int i = 0; part && idx && i < f->n; i++)
            for (int64_t k = 0; k < twk_dataset_count(evals[i]); k++, n++) {
                part[n] = i;
                idx[n] = k;
            }
        st = part && idx ? twk_dataset_gather((const twk_dataset *const *)evals, f->n, part, idx, n, eval)
                         : twk_error(TWK_ERR_OOM, "eval split: out of memory");
        free(part);
        free(idx);
    }
    for (int i = 0; i < f->n; i++) {
        twk_dataset_free(parts[i]);
        twk_dataset_free(evals[i]);
    }
    if (st != TWK_OK) {
        twk_dataset_free(*train);
        *train = NULL;
    }
    return st;
}

int twk_step_next(twk_step_packer *sp, twk_packed *pk) {
    if (sp->micro > 0 && (sp->global <= 0 || sp->acc >= sp->global)) {
        sp->acc = sp->micro = 0;
        return 0;
    }
    int64_t c = sp->cursor;
    if (twk_dataset_pack_groups(sp->d, sp->budget, sp->group, &c, pk) != TWK_OK) return -1;
    if (sp->micro > 0 && sp->acc + pk->batch.n > sp->global) { /* the next step starts with it */
        sp->acc = sp->micro = 0;
        return 0;
    }
    sp->cursor = c;
    sp->acc += pk->batch.n;
    sp->micro++;
    return 1;
}

long twk_steps_for_epochs(const twk_step_packer *sp, const twk_packed *order, double epochs) {
    twk_step_packer p = *sp;
    twk_packed pk = {0};
    pk.shuffle = order->shuffle;
    pk.seed = order->seed;
    p.cursor = p.acc = p.micro = 0;
    double end = epochs * (double)twk_dataset_count(sp->d);
    long steps = 0;
    while ((double)p.cursor < end) {
        int r;
        while ((r = twk_step_next(&p, &pk)) == 1) {}
        if (r < 0) {
            steps = -1;
            break;
        }
        steps++;
    }
    twk_packed_free(&pk);
    return steps;
}

int twk_lr_schedule_parse(const char *s, twk_lr_schedule *out) {
    static const char *const names[] = {"constant", "linear", "cosine"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, names[i])) {
            *out = (twk_lr_schedule)i;
            return 1;
        }
    return 0;
}

double twk_lr_factor(twk_lr_schedule kind, long step, long total, long warmup) {
    if (step < warmup) return (double)step / (double)(warmup > 1 ? warmup : 1);
    if (kind == TWK_LR_CONSTANT) return 1.0;
    long span = total - warmup > 1 ? total - warmup : 1;
    double progress = (double)(step - warmup) / (double)span;
    if (kind == TWK_LR_LINEAR) return fmax(0.0, (double)(total - step) / (double)span);
    return fmax(0.0, 0.5 * (1.0 + cos(3.14159265358979323846 * progress)));
}
