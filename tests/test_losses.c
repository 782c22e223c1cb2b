/* Tinker's losses (train/losses.c): the value against an independent float64
 * evaluation of the formulas in docs/wire.md ("Loss functions"), and dL/dp against central
 * finite differences of that evaluation, on random inputs (ratios on both
 * sides of the clip bounds). Tolerances: value 1e-6 relative, gradient 1e-5. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "twinkle/twinkle.h"

#define N 257

static int fails;

/* The reference: the loss of one token. */
static double ref_token(twk_loss_kind k, double p, double q, double a, double w, double lo, double hi, double beta) {
    double r = exp(p - q);
    switch (k) {
    case TWK_LOSS_CROSS_ENTROPY: return -w * p;
    case TWK_LOSS_IMPORTANCE_SAMPLING: return -r * a;
    case TWK_LOSS_PPO: return -fmin(r * a, fmin(fmax(r, lo), hi) * a);
    case TWK_LOSS_CISPO: return -fmin(fmax(r, lo), hi) * p * a; /* value; the gradient treats the clip as a constant */
    case TWK_LOSS_DRO: return -(p * a - 0.5 * beta * (p - q) * (p - q));
    case TWK_LOSS_STABLE_REINFORCE: return -fmin(r, hi) * p * a; /* value; the truncated weight is a constant */
    }
    return 0;
}

/* The registry: names unique and found, every loss reads target_tokens,
 * unknown names and config keys refused naming the alternatives, defaults
 * as documented. Returns the failures. */
static int check_registry(void) {
    int bad = 0;
    for (int i = 0; i < twk_loss_count(); i++) {
        const twk_loss_def *d = twk_loss_at(i);
        int ok = twk_loss_find(d->name) == d && twk_loss_input_find(d, "target_tokens") && d->n_metrics >= 3 &&
                 d->n_metrics <= TWK_LOSS_MAX_METRICS && !strcmp(d->metrics[0], "loss:sum") && d->group >= 1;
        if (!ok) printf("FAIL registry entry %s\n", d->name);
        bad += !ok;
    }
    twk_loss_spec s;
    int ok = twk_loss_spec_init("no_such_loss", &s) == TWK_ERR_INVALID_ARG && strstr(twk_last_error(), "no_such_loss") &&
             strstr(twk_last_error(), "gspo");
    printf("%s an unknown loss is refused listing the losses: %s\n", ok ? "ok  " : "FAIL", twk_last_error());
    bad += !ok;
    ok = twk_loss_spec_init("cross_entropy", &s) == TWK_OK && twk_loss_spec_set(&s, "kl_beta", 0.1) == TWK_ERR_INVALID_ARG &&
         strstr(twk_last_error(), "kl_beta");
    printf("%s a config key the loss does not take is refused: %s\n", ok ? "ok  " : "FAIL", twk_last_error());
    bad += !ok;
    ok = twk_loss_spec_init("grpo", &s) == TWK_OK && twk_loss_spec_set(&s, "kl_beta", -1) == TWK_ERR_INVALID_ARG &&
         twk_loss_spec_set(&s, "kl_beta", 0.25) == TWK_OK && s.config[TWK_CFG_KL_BETA] == 0.25;
    printf("%s kl_beta < 0 refused, 0.25 taken\n", ok ? "ok  " : "FAIL");
    bad += !ok;
    ok = twk_loss_spec_init("gspo", &s) == TWK_OK && s.config[TWK_CFG_CLIP_LOW] == 1 - 3e-4 &&
         s.config[TWK_CFG_CLIP_HIGH] == 1 + 4e-4 && twk_loss_spec_init("dpo", &s) == TWK_OK &&
         s.config[TWK_CFG_BETA] == 0.1 && s.def->group == 2;
    printf("%s defaults: gspo clip 1 - 3e-4 / 1 + 4e-4, dpo beta 0.1 in pairs\n", ok ? "ok  " : "FAIL");
    bad += !ok;
    return bad;
}

int main(void) {
    const char *names[] = {"cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "stable_reinforce"};
    twk_rng r;
    twk_rng_seed(&r, 7);
    float p[N], q[N], a[N], w[N], lo[N], hi[N], g[N];
    for (int k = 0; k < 6; k++) {
        for (int i = 0; i < N; i++) {
            q[i] = (float)(-3 * twk_rng_uniform(&r));
            p[i] = q[i] + (float)(0.6 * twk_rng_normal(&r)); /* ratios spread across the bounds */
            a[i] = (float)twk_rng_normal(&r);
            w[i] = (float)(2 * twk_rng_uniform(&r) - 0.5); /* some negative weights */
            lo[i] = k == TWK_LOSS_CISPO ? 0.0f : 0.8f;
            hi[i] = k == TWK_LOSS_CISPO ? (i % 2 ? 4.0f : 1.3f) : k == TWK_LOSS_STABLE_REINFORCE ? (i % 2 ? 2.0f : 1.1f)
                                                                                           : (i % 3 ? 1.2f : 1.5f);
        }
        double beta = 0.05;
        twk_loss_stats st;
        if (!twk_loss_find(names[k]) || twk_loss_find(names[k])->variant != k ||
            twk_loss_eval((twk_loss_kind)k, N, p, q, a, w, lo, hi, beta, g, &st) != TWK_OK) {
            printf("FAIL %s: %s\n", names[k], twk_last_error());
            fails++;
            continue;
        }
        double ref = 0, gerr = 0, gscale = 1e-3;
        int clipped = 0;
        for (int i = 0; i < N; i++) {
            ref += ref_token((twk_loss_kind)k, p[i], q[i], a[i], w[i], lo[i], hi[i], beta);
            double h = 1e-6, fd;
            if (k == TWK_LOSS_CISPO || k == TWK_LOSS_STABLE_REINFORCE) { /* stop-gradient on the clipped ratio */
                double rc = fmin(k == TWK_LOSS_CISPO ? fmax(exp((double)p[i] - q[i]), lo[i]) : exp((double)p[i] - q[i]), hi[i]);
                fd = -rc * a[i];
                clipped += rc != exp((double)p[i] - q[i]);
            } else {
                fd = (ref_token((twk_loss_kind)k, p[i] + h, q[i], a[i], w[i], lo[i], hi[i], beta) -
                      ref_token((twk_loss_kind)k, p[i] - h, q[i], a[i], w[i], lo[i], hi[i], beta)) /
                     (2 * h);
            }
            gerr = fmax(gerr, fabs(g[i] - fd));
            gscale = fmax(gscale, fabs(fd));
        }
        double verr = fabs(st.loss - ref) / fmax(1.0, fabs(ref));
        int ok = verr <= 1e-6 && gerr / gscale <= 1e-5;
        printf("%s %-20s loss %10.4f (ref %10.4f, rel err %.1e)  dL/dp err %.1e  ratio mean %.3f  clipped %.2f\n",
               ok ? "ok  " : "FAIL", names[k], st.loss, ref, verr, gerr / gscale, st.ratio_mean, st.clip_fraction);
        fails += !ok;
        if (k == TWK_LOSS_PPO || k == TWK_LOSS_CISPO || k == TWK_LOSS_STABLE_REINFORCE) {
            int both = st.clip_fraction > 0.05 && st.clip_fraction < 0.95;
            printf("%s %-20s inputs exercise both sides of the clip (%.2f clipped)\n", both ? "ok  " : "FAIL", names[k],
                   st.clip_fraction);
            fails += !both;
        }
    }
    /* DPO (sigmoid and IPO) against finite differences of a float64 evaluation */
    for (int ipo = 0; ipo < 2; ipo++) {
        int64_t off[7] = {0, 5, 9, 16, 18, 25, 31};
        float pp[31], ref[31], ww[31], gg[31];
        for (int i = 0; i < 31; i++) {
            pp[i] = (float)(-2 * twk_rng_uniform(&r));
            ref[i] = (float)(-2 * twk_rng_uniform(&r));
            ww[i] = (float)(i % 4 ? 1.0 : 0.0);
        }
        double beta = 0.3;
        twk_dpo_stats ds;
        twk_loss_dpo(6, off, pp, ref, ww, beta, ipo, gg, &ds);
        double gerr = 0, gscale = 1e-3;
        for (int i = 0; i < 31; i++) {
            double h = 1e-4, lp = 0, lm = 0;
            for (int sgn = 0; sgn < 2; sgn++) {
                double tot = 0;
                for (int k = 0; k < 3; k++) {
                    double hk = 0;
                    for (int side = 0; side < 2; side++)
                        for (int64_t j = off[2 * k + side]; j < off[2 * k + side + 1]; j++) {
                            double pj = pp[j] + (j == i ? (sgn ? -h : h) : 0);
                            hk += (side ? -1.0 : 1.0) * ww[j] * (pj - ref[j]);
                        }
                    tot += ipo ? (hk - 1 / (2 * beta)) * (hk - 1 / (2 * beta)) : log1p(exp(-beta * hk));
                }
                if (sgn) lm = tot;
                else lp = tot;
            }
            double fd = (lp - lm) / (2 * h);
            gerr = fmax(gerr, fabs(gg[i] - fd));
            gscale = fmax(gscale, fabs(fd));
        }
        int ok = gerr / gscale <= 1e-5;
        printf("%s %-20s loss %10.4f  dL/dp err %.1e  margin %.3f  accuracy %.2f\n", ok ? "ok  " : "FAIL",
               ipo ? "dpo (ipo)" : "dpo (sigmoid)", ds.loss, gerr / gscale, ds.margin_mean, ds.accuracy);
        fails += !ok;
    }

    /* GSPO (sequence-level ratio) against finite differences of a float64 evaluation;
     * the bounds are chosen so that some sequences clip and some do not */
    {
        enum { GS = 6, GN = 40 };
        int64_t off[GS + 1] = {0, 5, 12, 19, 26, 33, 40};
        float pp[GN], qq[GN], aa[GN], ww[GN], gg[GN];
        for (int i = 0; i < GN; i++) {
            pp[i] = (float)(-2 * twk_rng_uniform(&r));
            qq[i] = (float)(pp[i] + 0.3 * (twk_rng_uniform(&r) - 0.5));
            ww[i] = (float)(i % 5 ? 1.0 : 0.0);
        }
        for (int s = 0; s < GS; s++)
            for (int64_t i = off[s]; i < off[s + 1]; i++) aa[i] = (float)(s % 2 ? -1.0 : 0.7 + 0.1 * s);
        double glo = 0.98, ghi = 1.02;
        twk_loss_stats gs;
        twk_status gst = twk_loss_gspo(GS, off, pp, qq, aa, ww, glo, ghi, gg, &gs);
        double gerr = 0, gscale = 1e-3, v[3] = {0, 0, 0};
        for (int i = 0; i <= GN; i++) { /* i == GN: the unperturbed value */
            double h = 1e-5;
            for (int sgn = 0; sgn < 2; sgn++) {
                double tot = 0;
                for (int s = 0; s < GS; s++) {
                    double d = 0, adv = 0, m = 0;
                    for (int64_t j = off[s]; j < off[s + 1]; j++)
                        if (ww[j] != 0.0f) d += pp[j] + (j == i ? (sgn ? -h : h) : 0) - (double)qq[j], adv += aa[j], m++;
                    double rr = exp(d / m), rc = fmin(fmax(rr, glo), ghi);
                    adv /= m;
                    tot += -fmin(rr * adv, rc * adv) / GS;
                }
                v[sgn] = tot;
            }
            if (i == GN) {
                v[2] = v[0];
                break;
            }
            double fd = (v[0] - v[1]) / (2 * h);
            gerr = fmax(gerr, fabs(gg[i] - fd));
            gscale = fmax(gscale, fabs(fd));
        }
        double lerr = fabs(gs.loss - v[2]) / fmax(1.0, fabs(v[2]));
        int ok = gst == TWK_OK && gerr / gscale <= 1e-4 && lerr <= 1e-6 && gs.clip_fraction > 0 && gs.clip_fraction < 1;
        printf("%s %-20s loss %10.6f (float64 %10.6f, err %.1e)  dL/dp err %.1e  ratio mean %.4f  clipped %.2f\n",
               ok ? "ok  " : "FAIL", "gspo", gs.loss, v[2], lerr, gerr / gscale, gs.ratio_mean, gs.clip_fraction);
        fails += !ok;
    }
    /* the KL-to-reference penalty (k3 estimator) against finite differences */
    {
        enum { KN = 17 };
        float pp[KN], rf[KN], cc[KN], gg[KN];
        for (int i = 0; i < KN; i++) {
            pp[i] = (float)(-2 * twk_rng_uniform(&r));
            rf[i] = (float)(-2 * twk_rng_uniform(&r));
            cc[i] = (float)(i % 6 ? 0.1 + twk_rng_uniform(&r) : 0.0);
            gg[i] = 0.25f; /* added to */
        }
        double loss = 1.0, klm = 0, gerr = 0, gscale = 1e-3, ref_loss = 1.0, ref_sum = 0;
        int counted = 0;
        twk_status kst = twk_loss_add_kl(KN, pp, rf, cc, gg, &loss, &klm);
        for (int i = 0; i < KN; i++) {
            double k3 = exp((double)rf[i] - pp[i]) - ((double)rf[i] - pp[i]) - 1;
            ref_loss += cc[i] * k3;
            if (cc[i] != 0.0f) ref_sum += k3, counted++;
            double h = 1e-5, kp = exp(rf[i] - (pp[i] + h)) - (rf[i] - (pp[i] + h)) - 1,
                   km = exp(rf[i] - (pp[i] - h)) - (rf[i] - (pp[i] - h)) - 1;
            double fd = 0.25 + cc[i] * (kp - km) / (2 * h);
            gerr = fmax(gerr, fabs(gg[i] - fd));
            gscale = fmax(gscale, fabs(fd));
        }
        double lerr = fabs(loss - ref_loss) / fmax(1.0, fabs(ref_loss));
        int ok = kst == TWK_OK && lerr <= 1e-6 && gerr / gscale <= 1e-5 && fabs(klm - ref_sum / counted) <= 1e-9;
        printf("%s %-20s loss %10.6f (float64 %10.6f, err %.1e)  dL/dp err %.1e  kl mean %.4f\n", ok ? "ok  " : "FAIL",
               "kl penalty (k3)", loss, ref_loss, lerr, gerr / gscale, klm);
        fails += !ok;
    }

    /* a data-parallel split: shares normalised by the whole batch (twk_loss_whole_of) give the whole
     * batch's dL/dp bit for bit and its loss as a sum (within double rounding, 1e-12 relative) */
    {
        enum { WS = 7, WN = 52 };
        int64_t off[WS + 1] = {0, 5, 12, 19, 26, 33, 44, 52};
        float pp[WN], qq[WN], aa[WN], ww[WN], rf[WN], g1[WN], g2[WN];
        for (int i = 0; i < WN; i++) {
            pp[i] = (float)(-2 * twk_rng_uniform(&r));
            qq[i] = (float)(pp[i] + 0.3 * (twk_rng_uniform(&r) - 0.5));
            aa[i] = (float)(twk_rng_uniform(&r) - 0.4);
            ww[i] = (float)(i % 4 ? 1.0 : 0.0);
            rf[i] = (float)(pp[i] - 0.2 * twk_rng_uniform(&r));
        }
        twk_loss_batch wb = {WS, off, NULL, 0, NULL, {0}, NULL};
        wb.in[TWK_IN_WEIGHTS] = ww;
        twk_loss_whole whole, part;
        twk_status wst = twk_loss_whole_of(&wb, 0, WS, &whole);
        int ok = wst == TWK_OK && whole.n_seqs == WS && whole.masked_tokens == 39 && whole.longest == 9 && /* 52 - 13 every 4th; 11 - 2 of sequence 5 */
                 twk_loss_whole_of(&wb, 3, 9, &part) == TWK_ERR_INVALID_ARG;
        printf("%s whole-batch statistics: %lld sequences, %.0f masked tokens, longest %.0f\n", ok ? "ok  " : "FAIL",
               (long long)whole.n_seqs, whole.masked_tokens, whole.longest);
        fails += !ok;
        const twk_rl_aggregation aggs[] = {TWK_AGG_GRPO, TWK_AGG_DAPO, TWK_AGG_DR_GRPO, TWK_AGG_DR_GRPO, TWK_AGG_GSPO, TWK_AGG_SUM};
        const char *agg_names[] = {"grpo", "dapo", "dr_grpo", "dr_grpo max_tokens", "gspo", "sum + kl"};
        for (int ag = 0; ag < 6; ag++) {
            twk_rl_spec sp = {TWK_LOSS_PPO, aggs[ag], 0.9, 1.1, 0, ag == 3 ? 12.0 : 0, ag >= 4 ? 0.05 : 0, NULL};
            twk_loss_stats s_all, s_a, s_b;
            twk_status st1 = twk_loss_rl(&sp, WS, off, pp, qq, aa, ww, NULL, NULL, rf, g1, &s_all);
            sp.whole = &whole; /* shares: sequences [0, 3) and [3, 7) */
            int64_t off_b[5];
            for (int i = 0; i < 5; i++) off_b[i] = off[3 + i] - off[3];
            twk_status st2 = twk_loss_rl(&sp, 3, off, pp, qq, aa, ww, NULL, NULL, rf, g2, &s_a);
            twk_status st3 = twk_loss_rl(&sp, 4, off_b, pp + off[3], qq + off[3], aa + off[3], ww + off[3], NULL, NULL,
                                         rf + off[3], g2 + off[3], &s_b);
            int same = !memcmp(g1, g2, sizeof g1);
            double lerr = fabs(s_a.loss + s_b.loss - s_all.loss) / fmax(1e-30, fabs(s_all.loss));
            ok = st1 == TWK_OK && st2 == TWK_OK && st3 == TWK_OK && same && lerr <= 1e-12;
            printf("%s %-20s split 3 + 4 of 7 sequences: dL/dp %s, loss %.9f vs %.9f (rel err %.1e)\n", ok ? "ok  " : "FAIL",
                   agg_names[ag], same ? "bit-identical" : "DIFFERS", s_a.loss + s_b.loss, s_all.loss, lerr);
            fails += !ok;
        }
    }

    /* distillation over top-K against finite differences of a float64 evaluation */
    for (int kind = 0; kind < 3; kind++) {
        enum { DN = 5, DK = 4 };
        float pp[DN * DK], tt[DN * DK], ww[DN], gg[DN * DK];
        for (int i = 0; i < DN * DK; i++) pp[i] = (float)(-3 * twk_rng_uniform(&r)), tt[i] = (float)(-3 * twk_rng_uniform(&r));
        for (int i = 0; i < DN; i++) ww[i] = (float)(i == 2 ? 0.0 : 0.5 + twk_rng_uniform(&r));
        double beta = 0.3, loss = 0;
        twk_status dst = twk_loss_distill((twk_distill_kind)kind, DN, DK, pp, tt, ww, beta, gg, &loss);
        double gerr = 0, gscale = 1e-3, ref_loss = 0;
        for (int i = 0; i < DN * DK; i++) {
            double h = 1e-4, v[2] = {0, 0};
            for (int sgn = 0; sgn < 3; sgn++) { /* 0: +h, 1: -h, 2: unperturbed (the value) */
                double tot = 0;
                for (int n = 0; n < DN; n++) {
                    double x[DK], y[DK], zx = 0, zy = 0, l = 0;
                    for (int k = 0; k < DK; k++) {
                        int j = n * DK + k;
                        x[k] = pp[j] + (j == i && sgn < 2 ? (sgn ? -h : h) : 0);
                        y[k] = tt[j];
                        zx += exp(x[k]), zy += exp(y[k]);
                    }
                    for (int k = 0; k < DK; k++) {
                        double sa = exp(x[k]) / zx, qb = exp(y[k]) / zy, m = beta * qb + (1 - beta) * sa;
                        l += kind == 0 ? qb * log(qb / sa) : kind == 1 ? sa * log(sa / qb)
                                                                        : beta * qb * log(qb / m) + (1 - beta) * sa * log(sa / m);
                    }
                    tot += ww[n] * l;
                }
                if (sgn < 2) v[sgn] = tot;
                else ref_loss = tot;
            }
            double fd = (v[0] - v[1]) / (2 * h);
            gerr = fmax(gerr, fabs(gg[i] - fd));
            gscale = fmax(gscale, fabs(fd));
        }
        static const char *const dnames[] = {"distill forward_kl", "distill reverse_kl", "distill jsd"};
        double lerr = fabs(loss - ref_loss) / fmax(1.0, fabs(ref_loss));
        int ok = dst == TWK_OK && gerr / gscale <= 1e-5 && lerr <= 1e-6 && gg[2 * DK] == 0.0f;
        printf("%s %-20s loss %10.6f (float64 %10.6f, err %.1e)  dL/dp err %.1e\n", ok ? "ok  " : "FAIL", dnames[kind], loss,
               ref_loss, lerr, gerr / gscale);
        fails += !ok;
    }

    /* missing inputs are refused by name */
    twk_loss_stats st;
    int ok = twk_loss_eval(TWK_LOSS_PPO, N, p, NULL, a, NULL, NULL, NULL, 0, g, &st) == TWK_ERR_INVALID_ARG &&
             strstr(twk_last_error(), "logprobs");
    printf("%s ppo without the sampler's logprobs is refused: %s\n", ok ? "ok  " : "FAIL", twk_last_error());
    fails += !ok;
    fails += check_registry();
    printf("%d failures\n", fails);
    return fails ? 1 : 0;
}
