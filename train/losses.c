/* Tinker's built-in losses as functions of the per-token logprobs p of the
 * current model: each gives the loss (a sum) and dL/dp per token. Training
 * then backpropagates through a cross-entropy pass with weights -dL/dp
 * (the loss -sum w p has exactly that gradient), so every loss runs on the
 * same graph. Formulas: docs/wire.md, "Loss functions". */
#include <math.h>
#include <string.h>

#include "twinkle/train.h"

twk_status twk_loss_eval(twk_loss_kind kind, int64_t n, const float *p, const float *q, const float *adv,
                         const float *w, const float *clip_lo, const float *clip_hi, double beta, float *dldp,
                         twk_loss_stats *out) {
    if (n < 0 || !p || !dldp || !out) return twk_error(TWK_ERR_INVALID_ARG, "loss: NULL argument");
    if (kind != TWK_LOSS_CROSS_ENTROPY && (!q || !adv))
        return twk_error(TWK_ERR_INVALID_ARG, "loss: this loss needs logprobs (the sampler's) and advantages");
    memset(out, 0, sizeof *out);
    double loss = 0, ratio_sum = 0;
    int64_t clipped = 0;
    for (int64_t i = 0; i < n; i++) {
        double pi = p[i], g = 0;
        switch (kind) {
        case TWK_LOSS_CROSS_ENTROPY: { /* L = -w p */
            double wi = w ? w[i] : 1.0;
            loss += -wi * pi;
            g = -wi;
            break;
        }
        case TWK_LOSS_IMPORTANCE_SAMPLING: { /* L = -exp(p - q) A */
            double r = exp(pi - q[i]);
            loss += -r * adv[i];
            g = -r * adv[i];
            ratio_sum += r;
            break;
        }
        case TWK_LOSS_PPO: { /* L = -min(r A, clip(r, lo, hi) A) */
            double r = exp(pi - q[i]), lo = clip_lo ? clip_lo[i] : 0.8, hi = clip_hi ? clip_hi[i] : 1.2;
            double rc = r < lo ? lo : r > hi ? hi : r;
            double a = r * adv[i], b = rc * adv[i];
            if (a <= b) { /* the unclipped term is the min: gradient through r */
                loss += -a;
                g = -r * adv[i];
            } else { /* the clipped term: constant in p */
                loss += -b;
                g = 0;
                clipped++;
            }
            ratio_sum += r;
            break;
        }
        case TWK_LOSS_CISPO: { /* L = -sg(clip(r, lo, hi)) p A */
            double r = exp(pi - q[i]), lo = clip_lo ? clip_lo[i] : 0.0, hi = clip_hi ? clip_hi[i] : 4.0;
            double rc = r < lo ? lo : r > hi ? hi : r;
            if (rc != r) clipped++;
            loss += -rc * pi * adv[i];
            g = -rc * adv[i];
            ratio_sum += r;
            break;
        }
        case TWK_LOSS_STABLE_REINFORCE: { /* L = -sg(min(r, hi)) p A: the weight truncated above, a constant in p */
            double r = exp(pi - q[i]), hi = clip_hi ? clip_hi[i] : 2.0, rc = r > hi ? hi : r;
            if (rc != r && adv[i] != 0) clipped++; /* a truncation that changes the loss (prompt tokens have A = 0) */
            loss += -rc * pi * adv[i];
            g = -rc * adv[i];
            ratio_sum += r;
            break;
        }
        case TWK_LOSS_DRO: { /* L = -(p A - beta/2 (p - q)^2) */
            double d = pi - q[i];
            loss += -(pi * adv[i] - 0.5 * beta * d * d);
            g = -(adv[i] - beta * d);
            ratio_sum += exp(d);
            break;
        }
        default:
            return twk_error(TWK_ERR_INVALID_ARG, "loss: unknown kind %d", (int)kind);
        }
        if (!isfinite(g)) return twk_error(TWK_ERR_RANGE, "loss: the gradient at token %lld is not finite", (long long)i);
        dldp[i] = (float)g;
    }
    out->loss = loss;
    out->ratio_mean = n ? ratio_sum / (double)n : 0;
    out->clip_fraction = n ? (double)clipped / (double)n : 0;
    return TWK_OK;
}

twk_status twk_loss_gspo(int n_seqs, const int64_t *offsets, const float *p, const float *q, const float *adv,
                         const float *w, double lo, double hi, float *dldp, twk_loss_stats *out) {
    return twk_loss_gspo_share(n_seqs, n_seqs, offsets, p, q, adv, w, lo, hi, dldp, out);
}

twk_status twk_loss_gspo_share(int n_seqs, int64_t whole_seqs, const int64_t *offsets, const float *p, const float *q,
                               const float *adv, const float *w, double lo, double hi, float *dldp, twk_loss_stats *out) {
    if (!offsets || !p || !q || !adv || !dldp || !out) return twk_error(TWK_ERR_INVALID_ARG, "gspo: NULL argument");
    if (n_seqs < 1) return twk_error(TWK_ERR_INVALID_ARG, "gspo: no sequences");
    if (whole_seqs < n_seqs)
        return twk_error(TWK_ERR_INVALID_ARG, "gspo: a share of %d sequences of a batch of %lld", n_seqs, (long long)whole_seqs);
    if (!(lo <= hi)) return twk_error(TWK_ERR_INVALID_ARG, "gspo: clip bounds %g > %g", lo, hi);
    memset(out, 0, sizeof *out);
    double N = (double)whole_seqs; /* the loss's mean over the whole batch's sequences */
    int clipped = 0;
    for (int s = 0; s < n_seqs; s++) {
        double dsum = 0, asum = 0, m = 0;
        for (int64_t i = offsets[s]; i < offsets[s + 1]; i++)
            if (!w || w[i] != 0.0f) dsum += (double)p[i] - q[i], asum += adv[i], m += 1;
        double r = m > 0 ? exp(dsum / m) : 1.0, a = m > 0 ? asum / m : 0.0;
        if (!isfinite(r)) return twk_error(TWK_ERR_RANGE, "gspo: the ratio of sequence %d is not finite", s);
        double rc = r < lo ? lo : r > hi ? hi : r, g = 0;
        if (r * a <= rc * a) { /* the unclipped term is the min: gradient through s */
            out->loss += -r * a / N;
            g = m > 0 ? -r * a / (m * N) : 0;
        } else {
            out->loss += -rc * a / N;
            clipped++;
        }
        out->ratio_mean += r / n_seqs;
        for (int64_t i = offsets[s]; i < offsets[s + 1]; i++) dldp[i] = (!w || w[i] != 0.0f) ? (float)g : 0.0f;
    }
    out->clip_fraction = (double)clipped / n_seqs;
    return TWK_OK;
}

twk_status twk_loss_add_kl(int64_t n, const float *p, const float *ref, const float *c, float *dldp, double *loss,
                           double *kl_mean) {
    if (!p || !ref || !c || !dldp || !loss || !kl_mean) return twk_error(TWK_ERR_INVALID_ARG, "kl: NULL argument");
    double sum = 0;
    int64_t counted = 0;
    for (int64_t i = 0; i < n; i++) {
        if (c[i] == 0.0f) continue;
        double d = (double)ref[i] - p[i], e = exp(d), k3 = e - d - 1.0;
        if (!isfinite(k3)) return twk_error(TWK_ERR_RANGE, "kl: the estimate at token %lld is not finite", (long long)i);
        *loss += c[i] * k3;
        dldp[i] = (float)(dldp[i] + c[i] * (1.0 - e));
        sum += k3;
        counted++;
    }
    *kl_mean = counted ? sum / (double)counted : 0.0;
    return TWK_OK;
}

twk_status twk_loss_dpo(int n_seqs, const int64_t *offsets, const float *p, const float *ref, const float *w, double beta,
                        int ipo, float *dldp, twk_dpo_stats *out) {
    if (!offsets || !p || !ref || !dldp || !out) return twk_error(TWK_ERR_INVALID_ARG, "dpo: NULL argument");
    if (n_seqs < 2 || n_seqs % 2)
        return twk_error(TWK_ERR_INVALID_ARG, "dpo: %d sequences; pairs (chosen, rejected) need an even count", n_seqs);
    if (!(beta > 0)) return twk_error(TWK_ERR_INVALID_ARG, "dpo: beta %g must be > 0", beta);
    memset(out, 0, sizeof *out);
    int pairs = n_seqs / 2, wins = 0;
    for (int k = 0; k < pairs; k++) {
        double h = 0;
        for (int side = 0; side < 2; side++)
            for (int64_t i = offsets[2 * k + side]; i < offsets[2 * k + side + 1]; i++)
                h += (side ? -1.0 : 1.0) * (w ? w[i] : 1.0) * ((double)p[i] - ref[i]);
        double dldh;
        if (ipo) {
            double d = h - 1.0 / (2.0 * beta);
            out->loss += d * d;
            dldh = 2.0 * d;
        } else {
            double z = beta * h; /* -log sigmoid(z) = softplus(-z), computed stably */
            out->loss += z > 0 ? log1p(exp(-z)) : -z + log1p(exp(z));
            dldh = -beta / (1.0 + exp(z));
        }
        out->margin_mean += h / pairs;
        wins += h > 0;
        for (int side = 0; side < 2; side++)
            for (int64_t i = offsets[2 * k + side]; i < offsets[2 * k + side + 1]; i++)
                dldp[i] = (float)((side ? -1.0 : 1.0) * (w ? w[i] : 1.0) * dldh);
    }
    out->accuracy = (double)wins / pairs;
    return TWK_OK;
}

twk_status twk_loss_distill(twk_distill_kind kind, int64_t n, int K, const float *p, const float *t, const float *w,
                            double beta, float *dldp, double *loss) {
    if (!p || !t || !dldp || !loss) return twk_error(TWK_ERR_INVALID_ARG, "distill: NULL argument");
    if (K < 1 || K > 64) return twk_error(TWK_ERR_INVALID_ARG, "distill: K = %d must be in 1..64", K);
    if (kind == TWK_DISTILL_JSD && !(beta > 0 && beta < 1))
        return twk_error(TWK_ERR_INVALID_ARG, "distill: jsd beta %g must be in (0, 1)", beta);
    *loss = 0;
    for (int64_t i = 0; i < n; i++) {
        const float *pi = p + i * K, *ti = t + i * K;
        double a[64], b[64], s[64], g[64], mp = -INFINITY, mt = -INFINITY, zp = 0, zt = 0;
        for (int k = 0; k < K; k++) mp = fmax(mp, pi[k]), mt = fmax(mt, ti[k]);
        for (int k = 0; k < K; k++) zp += exp(pi[k] - mp), zt += exp(ti[k] - mt);
        double l = 0, gs = 0, wi = w ? w[i] : 1.0;
        for (int k = 0; k < K; k++) { /* a, b: student / teacher log-probs renormalized over the K tokens */
            a[k] = pi[k] - mp - log(zp);
            b[k] = ti[k] - mt - log(zt);
            s[k] = exp(a[k]);
            double q = exp(b[k]);
            if (kind == TWK_DISTILL_FORWARD_KL) {
                l += q * (b[k] - a[k]);
                g[k] = -q; /* dL/da */
            } else if (kind == TWK_DISTILL_REVERSE_KL) {
                l += s[k] * (a[k] - b[k]);
                g[k] = s[k] * (a[k] - b[k] + 1.0);
            } else {
                double lm = log(beta * q + (1.0 - beta) * s[k]);
                l += beta * q * (b[k] - lm) + (1.0 - beta) * s[k] * (a[k] - lm);
                g[k] = (1.0 - beta) * s[k] * (a[k] - lm);
            }
            gs += g[k];
        }
        for (int k = 0; k < K; k++) dldp[i * K + k] = (float)(wi * (g[k] - s[k] * gs)); /* a = p - logsumexp(p) */
        *loss += wi * l;
        if (!isfinite(l)) return twk_error(TWK_ERR_RANGE, "distill: the loss at token %lld is not finite", (long long)i);
    }
    return TWK_OK;
}
