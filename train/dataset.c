/* Token datasets from JSONL and packing of whole examples into batches of at
 * most a token budget (sequences end to end; attention stays within each). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "twinkle/data.h"
#include "dataset_text.h"
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
    twk_data_counts counts;
};

twk_data_counts twk_dataset_counts(const twk_dataset *d) {
    twk_data_counts z = {0, 0, 0, 0};
    return d ? d->counts : z;
}

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

/* Adds the example of len tokens at off, cut to the context: truncated, or split into pieces that
 * share one token (the last of a piece is the first of the next, which nothing predicts). */
static twk_status add_record(twk_dataset *d, int64_t off, int64_t len, long lineno, unsigned has, int can_split,
                             const twk_data_opts *o) {
    int64_t m = o->max_targets;
    int split = m > 0 && len - 1 > m && can_split && o->overflow == TWK_OVERFLOW_SPLIT;
    if (m > 0 && len - 1 > m) {
        d->counts.truncated += !split;
        d->counts.split += split;
    }
    for (int64_t a = 0; a < len - 1; a += m) {
        int64_t n = m > 0 && len - a > m + 1 ? m + 1 : len - a;
        if (!grow((void **)&d->ex, &d->cap_ex, d->n_ex + 1, sizeof(example))) return TWK_ERR_OOM;
        d->ex[d->n_ex++] = (example){off + a, n, lineno, has};
        d->n_targets += n - 1;
        if (!split) break;
    }
    return TWK_OK;
}

/* Appends a text sequence (ids checked against the vocabulary) as an example. */
static twk_status add_seq(twk_dataset *d, const twk_text_seq *q, int can_split, const char *path, long lineno,
                          const twk_data_opts *o) {
    for (int64_t i = 0; i < q->n; i++)
        if (q->ids[i] < 0 || q->ids[i] >= o->vocab)
            return twk_error(TWK_ERR_INVALID_ARG, "%s:%ld: the tokenizer gave id %d, outside the model's vocabulary %d",
                             path, lineno, q->ids[i], o->vocab);
    if (!grow((void **)&d->tokens, &d->cap_tok, d->n_tok + q->n, 4) ||
        !grow((void **)&d->weights, &d->cap_w, d->n_tok + q->n, 4))
        return TWK_ERR_OOM;
    for (int f = 0; f < N_FIELDS; f++) {
        if (!grow((void **)&d->extra[f], &d->cap_x[f], d->n_tok + q->n, 4)) return TWK_ERR_OOM;
        for (int64_t k = 0; k < q->n; k++) d->extra[f][d->n_tok + k] = NAN;
    }
    memcpy(d->tokens + d->n_tok, q->ids, (size_t)q->n * 4);
    memcpy(d->weights + d->n_tok, q->w, (size_t)q->n * 4);
    int64_t off = d->n_tok;
    d->n_tok += q->n;
    return add_record(d, off, q->n, lineno, 0, can_split, o);
}

/* A text line (dataset_text.c): one sequence, dropped and counted when it has nothing to train,
 * or a preference pair. */
static twk_status text_line(twk_dataset *d, twk_text_ctx *c, const cJSON *j, const char *path, long lineno) {
    twk_text_seq q[2];
    int n = 0;
    twk_status st = twk_text_line(c, j, path, lineno, q, &n);
    if (st != TWK_OK) return st;
    int trained = 0;
    for (int64_t i = 1; i < q[0].n; i++) trained |= q[0].w[i] != 0.0f;
    if (n == 1 && (q[0].n < 2 || !trained)) d->counts.dropped++;
    else
        for (int k = 0; k < n && st == TWK_OK; k++) {
            if (q[k].n < 2)
                st = twk_error(TWK_ERR_INVALID_ARG, "%s:%ld: field '%s' encodes to %lld token(s), fewer than 2", path,
                               lineno, k ? "rejected" : "chosen", (long long)q[k].n);
            else st = add_seq(d, &q[k], n == 1, path, lineno, c->o);
        }
    twk_text_seq_free(&q[0]);
    twk_text_seq_free(&q[1]);
    return st;
}

static twk_status parse_line(twk_dataset *d, twk_text_ctx *c, const char *line, const char *path, long lineno) {
    int vocab = c->o->vocab;
    cJSON *j = cJSON_Parse(line);
    twk_status st = TWK_OK;
    if (cJSON_IsObject(j) && !cJSON_GetObjectItemCaseSensitive(j, "tokens") && twk_text_is_line(j)) {
        st = text_line(d, c, j, path, lineno);
        cJSON_Delete(j);
        return st;
    }
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
                         !grow((void **)&d->weights, &d->cap_w, d->n_tok + n, 4)))
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
        st = add_record(d, d->n_tok, n, lineno, has, 1, c->o);
        d->n_tok += n;
    }
    cJSON_Delete(j);
    return st;
}

twk_status twk_dataset_load_jsonl(const char *path, int vocab, twk_dataset **out) {
    twk_data_opts o = {vocab, NULL, 1, 0, TWK_OVERFLOW_TRUNCATE};
    return twk_dataset_load(path, &o, out);
}

twk_status twk_dataset_load(const char *path, const twk_data_opts *opts, twk_dataset **out) {
    if (!out || !path || !opts) return twk_error(TWK_ERR_INVALID_ARG, "dataset: NULL argument");
    twk_text_ctx tc = {opts, NULL, NULL};
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
        if (!blank) {
            d->counts.lines++;
            st = parse_line(d, &tc, line, path, lineno);
        }
    }
    twk_text_ctx_free(&tc);
    free(line);
    fclose(f);
    if (st == TWK_OK && d->n_ex == 0)
        st = twk_error(TWK_ERR_INVALID_ARG, "%s: no examples (%lld lines, %lld dropped without a trained token)", path,
                       (long long)d->counts.lines, (long long)d->counts.dropped);
    if (st != TWK_OK) {
        twk_dataset_free(d);
        return st;
    }
    *out = d;
    return TWK_OK;
}

twk_status twk_dataset_gather(const twk_dataset *const *parts, int n_parts, const int *part, const int64_t *idx,
                              int64_t n, twk_dataset **out) {
    if (!out || !parts || n_parts < 1 || !part || !idx || n < 1)
        return twk_error(TWK_ERR_INVALID_ARG, "dataset_gather: bad argument");
    *out = NULL;
    for (int64_t i = 0; i < n; i++)
        if (part[i] < 0 || part[i] >= n_parts || !parts[part[i]] || idx[i] < 0 || idx[i] >= parts[part[i]]->n_ex)
            return twk_error(TWK_ERR_INVALID_ARG, "dataset_gather: example %lld is out of range", (long long)i);
    twk_dataset *d = twk_host_calloc(sizeof *d, "dataset");
    int64_t *base = twk_host_calloc((size_t)n_parts * sizeof *base, "dataset");
    twk_status st = d && base ? TWK_OK : twk_error(TWK_ERR_OOM, "dataset: out of memory");
    for (int p = 0; p < n_parts && st == TWK_OK; p++) { /* the parts' storage end to end */
        const twk_dataset *s = parts[p];
        int64_t m = d->n_tok + s->n_tok;
        if (!grow((void **)&d->tokens, &d->cap_tok, m, 4) || !grow((void **)&d->weights, &d->cap_w, m, 4)) {
            st = TWK_ERR_OOM;
            break;
        }
        memcpy(d->tokens + d->n_tok, s->tokens, (size_t)s->n_tok * 4);
        memcpy(d->weights + d->n_tok, s->weights, (size_t)s->n_tok * 4);
        for (int f = 0; f < N_FIELDS && st == TWK_OK; f++)
            if (!grow((void **)&d->extra[f], &d->cap_x[f], m, 4)) st = TWK_ERR_OOM;
            else memcpy(d->extra[f] + d->n_tok, s->extra[f], (size_t)s->n_tok * 4);
        base[p] = d->n_tok;
        d->n_tok = m;
        d->counts.lines += s->counts.lines;
        d->counts.truncated += s->counts.truncated;
        d->counts.split += s->counts.split;
        d->counts.dropped += s->counts.dropped;
    }
    if (st == TWK_OK && !grow((void **)&d->ex, &d->cap_ex, n, sizeof(example))) st = TWK_ERR_OOM;
    for (int64_t i = 0; i < n && st == TWK_OK; i++) {
        example e = parts[part[i]]->ex[idx[i]];
        e.off += base[part[i]];
        d->ex[d->n_ex++] = e;
        d->n_targets += e.len - 1;
    }
    twk_host_free(base);
    if (st != TWK_OK) {
        twk_dataset_free(d);
        return st == TWK_ERR_OOM ? twk_error(st, "dataset: out of memory") : st;
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
    twk_host_free(p->perm);
    memset(p, 0, sizeof *p);
}

/* The example at position c of the visiting order (cursor c: epoch c / count); NULL on OOM. */
static const example *example_at(const twk_dataset *d, twk_packed *p, int group, int64_t c) {
    int64_t within = c % d->n_ex, epoch = c / d->n_ex, ng = d->n_ex / group;
    if (!p->shuffle) return &d->ex[within];
    if (!p->perm || p->perm_epoch != epoch || p->perm_n != ng) {
        int64_t *perm = twk_host_realloc(p->perm, 0, (size_t)ng * sizeof *perm, "dataset order"); /* refilled below */
        if (!perm) return NULL;
        p->perm = perm;
        twk_data_permute(perm, ng, p->seed * 0x9E3779B97F4A7C15ull + (uint64_t)epoch + 1);
        p->perm_epoch = epoch;
        p->perm_n = ng;
    }
    return &d->ex[p->perm[within / group] * group + within % group];
}

twk_status twk_dataset_pack(const twk_dataset *d, int64_t budget, int64_t *cursor, twk_packed *out) {
    return twk_dataset_pack_groups(d, budget, 1, cursor, out);
}

twk_status twk_dataset_pack_groups(const twk_dataset *d, int64_t budget, int group, int64_t *cursor, twk_packed *out) {
    if (!d || !cursor || !out || budget < 1 || group < 1 || d->n_ex % group)
        return twk_error(TWK_ERR_INVALID_ARG, "dataset_pack: bad argument (%lld examples in groups of %d)",
                         d ? (long long)d->n_ex : 0LL, group);
    if (out->cap < budget) {
        twk_host_free(out->buf_i32);
        twk_host_free(out->buf_f32);
        out->buf_i32 = twk_host_alloc((size_t)budget * 4 * 4, "packed batch");
        out->buf_f32 = twk_host_alloc((size_t)budget * 4 * (1 + N_FIELDS), "packed batch");
        if (!out->buf_i32 || !out->buf_f32) {
            twk_packed_free(out);
            return twk_error(TWK_ERR_OOM, "dataset: out of memory");
        }
        out->cap = budget;
    }
    int32_t *tok = out->buf_i32, *tgt = tok + budget, *pos = tgt + budget, *seg = pos + budget;
    float *w = out->buf_f32;
    int64_t n = 0;
    int n_seqs = 0;
    for (int64_t guard = 0; guard < d->n_ex; guard++) {
        const example *e = example_at(d, out, group, *cursor);
        if (!e) return twk_error(TWK_ERR_OOM, "dataset: out of memory");
        int64_t t = e->len - 1, gt = 0; /* a group starts where *cursor % group == 0 */
        if (*cursor % group == 0) {
            for (int k = 0; k < group; k++) gt += example_at(d, out, group, *cursor + k)->len - 1;
            if (gt > budget)
                return twk_error(TWK_ERR_INVALID_ARG,
                                 "dataset: line %ld%s: %lld targets, more than the batch budget %lld",
                                 e->line, group > 1 ? " (with its pair)" : "", (long long)gt,
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
