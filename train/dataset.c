/* Token datasets from JSONL and packing of whole examples into batches of at
 * most a token budget (sequences end to end; attention stays within each). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "twinkle/data.h"
#include "twinkle/hal.h"

typedef struct example {
    int64_t off; /* into tokens/weights */
    int64_t len; /* tokens; targets = len - 1 */
    long line;   /* in the file, for messages */
    unsigned has; /* bit f: the line gave float field f (fields[]) */
} example;

/* Optional per-target float fields besides "weights" (RL rollouts). */
static const char *const fields[] = {"advantages", "logprobs"};
enum { N_FIELDS = 2 };

struct twk_dataset {
    int32_t *tokens;
    float *weights; /* per token; weights[off] unused */
    float *extra[N_FIELDS]; /* per token like weights; NaN where a line lacks the field */
    example *ex;
    int64_t n_ex, n_tok, cap_ex, cap_tok, cap_w, cap_x[N_FIELDS], n_targets;
};

void twk_dataset_free(twk_dataset *d) {
    if (!d) return;
    twk_host_free(d->tokens);
    twk_host_free(d->weights);
    for (int f = 0; f < N_FIELDS; f++) twk_host_free(d->extra[f]);
    twk_host_free(d->ex);
    twk_host_free(d);
}

int64_t twk_dataset_count(const twk_dataset *d) { return d ? d->n_ex : 0; }
int64_t twk_dataset_tokens(const twk_dataset *d) { return d ? d->n_targets : 0; }

int64_t twk_dataset_max_targets(const twk_dataset *d) {
    int64_t m = 0;
    for (int64_t i = 0; d && i < d->n_ex; i++)
        if (d->ex[i].len - 1 > m) m = d->ex[i].len - 1;
    return m;
}

static int grow(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return 1;
    int64_t nc = *cap ? *cap : 1024;
    while (nc < need) nc *= 2;
    void *np = twk_host_alloc((size_t)nc * elem, "dataset");
    if (!np) return 0;
    if (*p) memcpy(np, *p, (size_t)*cap * elem);
    twk_host_free(*p);
    *p = np;
    *cap = nc;
    return 1;
}

static twk_status parse_line(twk_dataset *d, const char *line, const char *path, long lineno, int vocab) {
    cJSON *j = cJSON_Parse(line);
    twk_status st = TWK_OK;
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(j, "tokens");
    const cJSON *ws = cJSON_GetObjectItemCaseSensitive(j, "weights");
    int n = cJSON_GetArraySize(toks);
    if (!cJSON_IsObject(j)) st = twk_error(TWK_ERR_INVALID_ARG, "%s:%ld: not a JSON object", path, lineno);
    else if (!cJSON_IsArray(toks) || n < 2)
        st = twk_error(TWK_ERR_INVALID_ARG, "%s:%ld: field 'tokens' must be an array of at least 2 token ids", path, lineno);
    else if (ws && !cJSON_IsNull(ws) &&
             (!cJSON_IsArray(ws) || (cJSON_GetArraySize(ws) != n && cJSON_GetArraySize(ws) != n - 1)))
        st = twk_error(TWK_ERR_INVALID_ARG, "%s:%ld: field 'weights' must have %d (per token) or %d (per target) entries",
                       path, lineno, n, n - 1);
    if (st == TWK_OK && (!grow((void **)&d->tokens, &d->cap_tok, d->n_tok + n, 4) ||
                         !grow((void **)&d->weights, &d->cap_w, d->n_tok + n, 4) ||
                         !grow((void **)&d->ex, &d->cap_ex, d->n_ex + 1, sizeof(example))))
        st = TWK_ERR_OOM;
    int i = 0;
    for (const cJSON *e = toks ? toks->child : NULL; st == TWK_OK && e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 || e->valuedouble >= vocab) {
            st = twk_error(TWK_ERR_INVALID_ARG, "%s:%ld: tokens[%d] is not a token id in [0, %d)", path, lineno, i, vocab);
            break;
        }
        d->tokens[d->n_tok + i] = (int32_t)e->valuedouble;
        d->weights[d->n_tok + i] = 1.0f;
    }
    if (st == TWK_OK && ws && cJSON_IsArray(ws)) {
        int shift = cJSON_GetArraySize(ws) == n ? 0 : 1, k = 0;
        for (const cJSON *e = ws->child; e; e = e->next, k++) {
            if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble)) {
                st = twk_error(TWK_ERR_INVALID_ARG, "%s:%ld: weights[%d] is not a finite number", path, lineno, k);
                break;
            }
            d->weights[d->n_tok + k + shift] = (float)e->valuedouble;
        }
    }
    unsigned has = 0;
    for (int f = 0; f < N_FIELDS && st == TWK_OK; f++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, fields[f]);
        if (!grow((void **)&d->extra[f], &d->cap_x[f], d->n_tok + n, 4)) {
            st = TWK_ERR_OOM;
            break;
        }
        for (int k = 0; k < n; k++) d->extra[f][d->n_tok + k] = NAN;
        if (!x || cJSON_IsNull(x)) continue;
        has |= 1u << f;
        if (cJSON_IsNumber(x) && f == 0 && isfinite(x->valuedouble)) { /* one advantage for the whole sequence */
            for (int k = 1; k < n; k++) d->extra[f][d->n_tok + k] = (float)x->valuedouble;
            continue;
        }
        if (!cJSON_IsArray(x) || (cJSON_GetArraySize(x) != n && cJSON_GetArraySize(x) != n - 1)) {
            st = twk_error(TWK_ERR_INVALID_ARG, "%s:%ld: field '%s' must be %san array of %d (per token) or %d (per target) numbers",
                           path, lineno, fields[f], f == 0 ? "a number or " : "", n, n - 1);
            break;
        }
        int shift = cJSON_GetArraySize(x) == n ? 0 : 1, k = 0;
        for (const cJSON *e = x->child; e; e = e->next, k++) {
            if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble)) {
                st = twk_error(TWK_ERR_INVALID_ARG, "%s:%ld: %s[%d] is not a finite number", path, lineno, fields[f], k);
                break;
            }
            d->extra[f][d->n_tok + k + shift] = (float)e->valuedouble;
        }
    }
    if (st == TWK_OK) {
        d->ex[d->n_ex++] = (example){d->n_tok, n, lineno, has};
        d->n_tok += n;
        d->n_targets += n - 1;
    }
    cJSON_Delete(j);
    return st;
}

twk_status twk_dataset_load_jsonl(const char *path, int vocab, twk_dataset **out) {
    if (!out || !path) return twk_error(TWK_ERR_INVALID_ARG, "dataset: NULL argument");
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f) return twk_error(TWK_ERR_IO, "cannot open %s", path);
    twk_dataset *d = twk_host_calloc(sizeof *d, "dataset");
    twk_status st = d ? TWK_OK : TWK_ERR_OOM;
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    ssize_t len;
    while (st == TWK_OK && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        int blank = 1;
        for (ssize_t i = 0; i < len; i++) blank &= line[i] == ' ' || line[i] == '\t' || line[i] == '\n' || line[i] == '\r';
        if (!blank) st = parse_line(d, line, path, lineno, vocab);
    }
    free(line);
    fclose(f);
    if (st == TWK_OK && d->n_ex == 0) st = twk_error(TWK_ERR_INVALID_ARG, "%s: no examples", path);
    if (st != TWK_OK) {
        twk_dataset_free(d);
        return st;
    }
    *out = d;
    return TWK_OK;
}

twk_status twk_dataset_require(const twk_dataset *d, const char *field, const char *path, const char *why) {
    for (int f = 0; d && f < N_FIELDS; f++)
        if (!strcmp(fields[f], field)) {
            for (int64_t i = 0; i < d->n_ex; i++)
                if (!(d->ex[i].has >> f & 1))
                    return twk_error(TWK_ERR_INVALID_ARG, "%s:%ld: field '%s' is required by %s", path, d->ex[i].line,
                                     field, why);
            return TWK_OK;
        }
    return twk_error(TWK_ERR_INVALID_ARG, "dataset: unknown field '%s'", field);
}

void twk_packed_free(twk_packed *p) {
    if (!p) return;
    twk_host_free(p->buf_i32);
    twk_host_free(p->buf_f32);
    memset(p, 0, sizeof *p);
}

twk_status twk_dataset_pack(const twk_dataset *d, int64_t budget, int64_t *cursor, twk_packed *out) {
    return twk_dataset_pack_groups(d, budget, 1, cursor, out);
}

twk_status twk_dataset_pack_groups(const twk_dataset *d, int64_t budget, int group, int64_t *cursor, twk_packed *out) {
    if (!d || !cursor || !out || budget < 1 || group < 1 || d->n_ex % group)
        return twk_error(TWK_ERR_INVALID_ARG, "dataset_pack: bad argument (%lld examples in groups of %d)",
                         d ? (long long)d->n_ex : 0LL, group);
    if (out->cap < budget) {
        twk_packed_free(out);
        out->buf_i32 = twk_host_alloc((size_t)budget * 4 * 4, "packed batch");
        out->buf_f32 = twk_host_alloc((size_t)budget * 4 * (1 + N_FIELDS), "packed batch");
        if (!out->buf_i32 || !out->buf_f32) {
            twk_packed_free(out);
            return TWK_ERR_OOM;
        }
        out->cap = budget;
    }
    int32_t *tok = out->buf_i32, *tgt = tok + budget, *pos = tgt + budget, *seg = pos + budget;
    float *w = out->buf_f32;
    int64_t n = 0;
    int n_seqs = 0;
    for (int64_t guard = 0; guard < d->n_ex; guard++) {
        const example *e = &d->ex[*cursor % d->n_ex];
        int64_t t = e->len - 1, gt = 0; /* a group starts where *cursor % group == 0 */
        if (*cursor % group == 0) {
            for (int k = 0; k < group; k++) gt += d->ex[(*cursor + k) % d->n_ex].len - 1;
            if (gt > budget)
                return twk_error(TWK_ERR_INVALID_ARG,
                                 "dataset: example%s %lld has %lld targets, more than the batch budget %lld",
                                 group > 1 ? "s from" : "", (long long)(*cursor % d->n_ex), (long long)gt,
                                 (long long)budget);
            if (n + gt > budget) break;
        }
        for (int64_t i = 0; i < t; i++) {
            tok[n + i] = d->tokens[e->off + i];
            tgt[n + i] = d->tokens[e->off + i + 1];
            w[n + i] = d->weights[e->off + i + 1];
            for (int f = 0; f < N_FIELDS; f++) w[(f + 1) * budget + n + i] = d->extra[f][e->off + i + 1];
            pos[n + i] = (int32_t)i;
            seg[n + i] = (int32_t)n;
        }
        n += t;
        n_seqs++;
        (*cursor)++;
    }
    out->n_seqs = n_seqs;
    out->batch = (twk_batch){n, tok, tgt, pos, seg, w};
    out->advantages = w + budget;
    out->sampler_logprobs = w + 2 * budget;
    return TWK_OK;
}
