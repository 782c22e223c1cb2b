/* The RL policy losses as one driver shared by the service and `twinkle
 * train`: Tinker's per-token surrogates (twk_loss_eval), the GRPO family's
 * token aggregations, GSPO's sequence-level ratio and an optional KL penalty
 * to a reference, all as dL/dp per token. */
#include <math.h>
#include <string.h>

#include "twinkle/train.h"

/* The aggregation's coefficients of sequences [0, n_seqs), normalised by the whole batch's numbers
 * (whole; NULL: these sequences are the whole batch). */
static twk_status coefficients(twk_rl_aggregation agg, int n_seqs, const int64_t *offsets, const float *mask,
                               double max_tokens, const twk_loss_whole *whole, float *c) {
    double masked = 0, longest = 0;
    for (int s = 0; s < n_seqs; s++) {
        double ns = 0;
        for (int64_t i = offsets[s]; i < offsets[s + 1]; i++) ns += !mask || mask[i] != 0.0f;
        masked += ns;
        longest = ns > longest ? ns : longest;
    }
    double n_all = n_seqs;
    if (whole) masked = whole->masked_tokens, longest = whole->longest, n_all = (double)whole->n_seqs;
    double norm = max_tokens > 0 ? max_tokens : longest;
    if (agg == TWK_AGG_DR_GRPO && !(norm > 0))
        return twk_error(TWK_ERR_INVALID_ARG, "dr_grpo: max_tokens = %g must be > 0", norm);
    for (int s = 0; s < n_seqs; s++) {
        double ns = 0;
        for (int64_t i = offsets[s]; i < offsets[s + 1]; i++) ns += !mask || mask[i] != 0.0f;
        double k = agg == TWK_AGG_SUM                          ? 1.0
                   : agg == TWK_AGG_GRPO || agg == TWK_AGG_GSPO ? 1.0 / (n_all * (ns > 0 ? ns : 1))
                   : agg == TWK_AGG_DAPO                        ? 1.0 / (masked > 0 ? masked : 1)
                                                                : 1.0 / (n_all * norm);
        for (int64_t i = offsets[s]; i < offsets[s + 1]; i++) c[i] = !mask || mask[i] != 0.0f ? (float)k : 0.0f;
    }
    return TWK_OK;
}

twk_status twk_rl_token_coefficients(twk_rl_aggregation agg, int n_seqs, const int64_t *offsets, const float *mask,
                                     double max_tokens, float *c) {
    return coefficients(agg, n_seqs, offsets, mask, max_tokens, NULL, c);
}

twk_status twk_loss_rl(const twk_rl_spec *spec, int n_seqs, const int64_t *offsets, const float *p, const float *q,
                       const float *adv, const float *mask, const float *lo, const float *hi, const float *ref,
                       float *dldp, twk_loss_stats *out) {
    if (!spec || !offsets || !p || !q || !adv || !dldp || !out || n_seqs < 1)
        return twk_error(TWK_ERR_INVALID_ARG, "rl loss: NULL argument or no sequences");
    if (spec->kl_beta > 0 && !ref)
        return twk_error(TWK_ERR_INVALID_ARG, "rl loss: kl_beta %g needs reference logprobs", spec->kl_beta);
    int64_t n = offsets[n_seqs];
    size_t bytes = (size_t)(n ? n : 1) * 4;
    float *c = twk_host_alloc(bytes, "token coefficients"), *a = twk_host_alloc(bytes, "advantages"),
          *l = twk_host_alloc(bytes, "clip bounds"), *h = twk_host_alloc(bytes, "clip bounds");
    twk_status st = c && a && l && h ? TWK_OK : TWK_ERR_OOM;
    if (st == TWK_OK && spec->whole && spec->whole->n_seqs < n_seqs)
        st = twk_error(TWK_ERR_INVALID_ARG, "rl loss: a share of %d sequences of a batch of %lld", n_seqs,
                       (long long)spec->whole->n_seqs);
    if (st == TWK_OK) st = coefficients(spec->aggregation, n_seqs, offsets, mask, spec->max_tokens, spec->whole, c);
    for (int64_t i = 0; st == TWK_OK && i < n; i++) {
        /* the GRPO family: the aggregation as a positive scale on the advantages (masked: 0) */
        a[i] = spec->aggregation == TWK_AGG_SUM || spec->aggregation == TWK_AGG_GSPO ? adv[i] : adv[i] * c[i];
        l[i] = lo && !isnan(lo[i]) ? lo[i] : (float)spec->clip_lo; /* per-token bounds win */
        h[i] = hi && !isnan(hi[i]) ? hi[i] : (float)spec->clip_hi;
    }
    memset(out, 0, sizeof *out);
    if (st == TWK_OK && spec->aggregation == TWK_AGG_GSPO) /* c is 0 exactly on the masked tokens */
        st = twk_loss_gspo_share(n_seqs, spec->whole ? spec->whole->n_seqs : n_seqs, offsets, p, q, a, c, spec->clip_lo,
                                 spec->clip_hi, dldp, out);
    else if (st == TWK_OK)
        st = twk_loss_eval(spec->kind, n, p, q, a, NULL, l, h, spec->beta, dldp, out);
    if (st == TWK_OK && spec->kl_beta > 0) { /* + kl_beta * sum_t c_t k3_t */
        for (int64_t i = 0; i < n; i++) c[i] = (float)(c[i] * spec->kl_beta);
        st = twk_loss_add_kl(n, p, ref, c, dldp, &out->loss, &out->kl_mean);
    }
    twk_host_free(c);
    twk_host_free(a);
    twk_host_free(l);
    twk_host_free(h);
    return st;
}
