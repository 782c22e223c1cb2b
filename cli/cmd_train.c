/* `twinkle train`: local SFT / pre-training from a JSONL file of token ids on
 * a Hugging Face model folder, LoRA or full, with periodic checkpoints and
 * resumption from a saved training state. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "dtype_opts.h"
#include "dist.h"
#include "train_data.h"
#include "train_step.h"
#include "twinkle/twinkle.h"

typedef struct train_opts {
    twk_data_files files;
    const char *eval_data;
    double eval_fraction, epochs;
    long eval_every, warmup, global_tokens;
    int shuffle;
    twk_lr_schedule sched;
    const char *model, *data, *out, *resume, *device, *loss, *teacher, *teacher_adapter, *dump;
    twk_data_opts dopts; /* --train-on, --max-len, --overflow */
    long steps, save_every, batch_tokens, rank, seed, topk;
    double bucket_mb; /* gradient allreduce bucket size across ranks */
    int no_overlap;   /* sum the gradients after the backward, not during it */
    double lr, alpha, weight_decay, grad_clip, beta1, beta2, eps;
    double dpo_beta, clip_lo, clip_hi, kl_beta, max_tokens, distill_beta; /* NaN: the loss's default */
    twk_loss_spec spec; /* --loss with the flags above */
    int full, train_unembed, no_attn, no_mlp, recompute, train_router, no_experts;
    twk_cli_dtypes dtypes; /* --dtype, --kv-dtype (the teacher's sampler) */
} train_opts;

static const char *const lr_names[] = {"constant", "linear", "cosine"};

static void usage(FILE *f) {
    fprintf(f,
            "usage: twinkle train --model DIR --data FILE.jsonl [options]\n"
            "\n"
            "  --model DIR          Hugging Face model folder (Llama / Qwen2 / Qwen3)\n"
            "  --data FILE          JSONL, one example per line, any of:\n"
            "                         {\"text\": \"...\"}                      pre-training (every token trained)\n"
            "                         {\"prompt\": \"...\", \"completion\": \"...\"}  loss on the completion\n"
            "                       text is encoded as transformers' tokenizer(text): bos / eos where tokenizer.json's\n"
            "                       post-processor or tokenizer_config.json's add_bos_token / add_eos_token put them\n"
            "                       (a prompt + completion as tokenizer(prompt + completion), its eos trained)\n"
            "                         {\"messages\": [...]}                 chat, rendered with the model's template\n"
            "                         {\"chosen\": X, \"rejected\": Y, \"prompt\": P}  preference pair (strings or messages)\n"
            "                         {\"tokens\": [...], \"weights\": [...]}  token ids; weights optional (default 1),\n"
            "                                                             per token or per target\n"
            "                       text needs DIR/tokenizer.json; messages DIR/tokenizer_config.json's chat_template\n"
            "  --train-on M         messages: all | assistant (default) | last assistant turn\n"
            "  --max-len N          the context: longest sequence in targets (default: --batch-tokens)\n"
            "  --overflow O         longer sequences: truncate (default) | split into pieces\n"
            "  --data FILE:W        several --data files are mixed: file i fills W_i / sum(W) of each epoch\n"
            "                       (its lines subsampled or repeated in a seeded order; default W = 1)\n"
            "  --shuffle            visit the examples in a new seeded order each epoch (--seed)\n"
            "  --epochs E           train for E passes over the data (instead of --steps)\n"
            "  --eval-data FILE     evaluation set (same formats); or --eval-fraction X: hold out X of the data\n"
            "  --eval-every N       evaluation loss every N steps (default 0: at the end only)\n"
            "  --lr-schedule S      constant (default) | linear | cosine decay to 0 at the last step\n"
            "  --warmup-steps N     linear warmup from 0 over the first N steps (default 0)\n"
            "  --global-batch-tokens N  accumulate gradients over micro-batches (each <= --batch-tokens)\n"
            "                       up to N tokens per optimizer step (default: one micro-batch)\n"
            "  --dump-batches FILE  debug: write each step's packed batch (tokens, targets, weights) as JSONL\n"
            "  --out DIR            checkpoints go to DIR/step-N and DIR/final (default: train-out)\n"
            "  --steps N            optimizer steps (default 100)\n"
            "  --batch-tokens N     pack whole examples up to N tokens per step (default 2048)\n"
            "  --save-every N       checkpoint every N steps (default 0: only at the end)\n"
            "  --full               train every parameter instead of a LoRA adapter\n"
            "  --recompute          per-layer activation recompute (less memory, ~1/3 more compute; identical\n"
            "                       gradients). Chosen by itself when a step would not fit the device otherwise;\n"
            "                       a configuration that fits neither way is refused with its memory table\n"
            "                       (`twinkle plan`). TWK_MEM_BUDGET=SIZE (512M, 1.5GiB) caps the device's\n"
            "                       memory for that check (the CPU's: the host's RAM)\n"
            "  --rank R             LoRA rank (default 32)\n"
            "  --alpha A            LoRA alpha; scale = alpha / rank (default 32)\n"
            "  --train-unembed      also adapt lm_head;  --no-attn / --no-mlp drop those targets\n"
            "                       (mixture of experts: the MLP is the experts' gate/up/down, PEFT's target_parameters\n"
            "                       on the fused stacks, and a shared expert; --no-experts keeps only the latter)\n"
            "  --train-router       mixture of experts: also adapt the router (mlp.gate)\n"
            "  --lr X               AdamW learning rate (default 1e-4)\n"
            "  --beta1 X --beta2 X --eps X --weight-decay X   AdamW (defaults 0.9 0.95 1e-8 0)\n"
            "  --grad-clip X        clip the global gradient norm to X (default 1.0; 0 = off)\n"
            "  --resume DIR         continue from a saved training state (weights + optimizer)\n"
            "  --seed S             LoRA initialisation, shuffling, mixing and eval-split seed (default 0)\n"
            TWK_CLI_DTYPE_HELP
            "                      (--full: f32 unless given; full-parameter training needs f32)\n"
            "  --device SPEC        cpu (default), opencl[:N], vulkan[:N] or cuda[:N]: see twinkle devices;\n"
            "                       under mpirun a GPU kind without :N picks device LOCAL_RANK\n"
            "  --bucket-mb X        under mpirun: sum gradients across ranks in buckets of X MB (default 16)\n"
            "  --no-overlap         under mpirun: sum the gradients after the backward (default: each bucket as\n"
            "                       soon as the backward made it final, while the rest of the backward runs)\n"
            "  --loss L             cross_entropy (default);\n"
            "                       dpo, ipo: preference pairs, lines 2i (chosen) and 2i+1 (rejected); weights\n"
            "                       mask the prompt; the reference is the base model (LoRA only);\n"
            "                       importance_sampling, ppo, cispo, dro, grpo, dapo, dr_grpo, gspo: RL on\n"
            "                       rollouts: each line adds \"advantages\" (a number or one per token) and\n"
            "                       optionally \"logprobs\" (the sampler's; absent: on-policy); weights mask;\n"
            "                       forward_kl, reverse_kl, jsd: distillation from --teacher's top-k\n"
            "  --dpo-beta X         beta of dpo / ipo (default 0.1)\n"
            "  --clip-low X --clip-high X   RL clip bounds (defaults per loss: ppo 0.8 1.2, ...)\n"
            "  --kl-beta X          RL: + X * KL(policy || base model), k3 estimate (default 0)\n"
            "  --max-tokens N       dr_grpo's normaliser (default: the longest sequence)\n"
            "  --teacher DIR        distillation teacher (a model folder; same vocabulary)\n"
            "  --teacher-adapter DIR  a PEFT adapter on the teacher\n"
            "  --topk K             teacher tokens per position (default 8, at most 64)\n"
            "  --distill-beta X     jsd's beta in (0, 1) (default 0.5)\n"
            "\n"
            "The loss of a step is -sum(weights * logprobs) over its tokens (Tinker's semantics);\n"
            "the printed loss is that sum divided by the sum of weights.\n"
            "\n"
            "Data-parallel: `mpirun -np N twinkle train ...` splits each global batch (--batch-tokens)\n"
            "across the N ranks by tokens (whole sequences), sums the gradients, and applies the same\n"
            "step on every rank; rank 0 prints and writes checkpoints. --resume works with any N.\n");
}

static int num(const char *flag, const char *s, double lo, double hi, double *out) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (!*s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "twinkle train: %s wants a number in [%g, %g], got '%s'\n", flag, lo, hi, s);
        return 0;
    }
    *out = v;
    return 1;
}

/* --loss and its flags as a loss spec (train/'s registry); 0 with the reason printed. */
static int loss_spec(train_opts *o) {
    if (twk_loss_spec_init(o->loss, &o->spec) != TWK_OK) {
        fprintf(stderr, "twinkle train: --loss: %s\n", twk_last_error());
        return 0;
    }
    twk_loss_family fam = o->spec.def->family;
    if ((!isnan(o->dpo_beta) && fam != TWK_FAMILY_PREF) || (!isnan(o->distill_beta) && fam != TWK_FAMILY_DISTILL)) {
        fprintf(stderr, "twinkle train: --%s-beta is not for --loss %s\n", isnan(o->dpo_beta) ? "distill" : "dpo", o->loss);
        return 0;
    }
    const struct { double v; twk_loss_config_id id; const char *flag; } flags[] = {
        {o->clip_lo, TWK_CFG_CLIP_LOW, "--clip-low"}, {o->clip_hi, TWK_CFG_CLIP_HIGH, "--clip-high"},
        {o->kl_beta, TWK_CFG_KL_BETA, "--kl-beta"},   {o->max_tokens, TWK_CFG_MAX_TOKENS, "--max-tokens"},
        {o->dpo_beta, TWK_CFG_BETA, "--dpo-beta"},    {o->distill_beta, TWK_CFG_BETA, "--distill-beta"}};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!isnan(flags[i].v) && twk_loss_spec_set(&o->spec, twk_loss_config_key(flags[i].id), flags[i].v) != TWK_OK) {
            fprintf(stderr, "twinkle train: %s: %s\n", flags[i].flag, twk_last_error());
            return 0;
        }
    return 1;
}

static int parse(int argc, char **argv, train_opts *o) {
    *o = (train_opts){.out = "train-out", .device = "cpu", .steps = 100, .batch_tokens = 2048, .rank = 32,
                      .lr = 1e-4, .dpo_beta = NAN, .loss = "cross_entropy", .topk = 8, .distill_beta = NAN,
                      .clip_lo = NAN, .clip_hi = NAN, .kl_beta = NAN, .max_tokens = NAN, .alpha = 32, .grad_clip = 1.0, .bucket_mb = 16, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                      .dopts = {.train_on = TWK_TRAIN_ON_ASSISTANT}, .dtypes = TWK_CLI_DTYPES_DEFAULT};
    int steps_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        double v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--full")) { o->full = 1; continue; }
        if (!strcmp(a, "--shuffle")) { o->shuffle = 1; continue; }
        if (!strcmp(a, "--train-unembed")) { o->train_unembed = 1; continue; }
        if (!strcmp(a, "--no-attn")) { o->no_attn = 1; continue; }
        if (!strcmp(a, "--no-mlp")) { o->no_mlp = 1; continue; }
        if (!strcmp(a, "--no-experts")) { o->no_experts = 1; continue; }
        if (!strcmp(a, "--train-router")) { o->train_router = 1; continue; }
        if (!strcmp(a, "--recompute")) { o->recompute = 1; continue; }
        if (!strcmp(a, "--no-overlap")) { o->no_overlap = 1; continue; }
        if (i + 1 >= argc) {
            fprintf(stderr, "twinkle train: %s needs a value (or is unknown)\n", a);
            return 0;
        }
        const char *val = argv[++i];
        if (!strcmp(a, "--model")) o->model = val;
        else if (!strcmp(a, "--train-on")) {
            twk_train_on m;
            if (twk_train_on_parse(val, &m) != TWK_OK) {
                fprintf(stderr, "twinkle train: --train-on: %s\n", twk_last_error());
                return 0;
            }
            o->dopts.train_on = (int)m;
        }
        else if (!strcmp(a, "--overflow")) {
            if (strcmp(val, "truncate") && strcmp(val, "split")) {
                fprintf(stderr, "twinkle train: --overflow wants truncate or split, got '%s'\n", val);
                return 0;
            }
            o->dopts.overflow = strcmp(val, "split") ? TWK_OVERFLOW_TRUNCATE : TWK_OVERFLOW_SPLIT;
        }
        else if (!strcmp(a, "--max-len")) { if (!num(a, val, 1, 1e7, &v)) return 0; o->dopts.max_targets = (int64_t)v; }
        else if (!strcmp(a, "--dump-batches")) o->dump = val;
        else if (!strcmp(a, "--data")) {
            if (!twk_data_files_add(&o->files, val)) return 0;
            o->data = o->files.path[0];
        }
        else if (!strcmp(a, "--eval-data")) o->eval_data = val;
        else if (!strcmp(a, "--eval-fraction")) { if (!num(a, val, 1e-9, 0.999999, &o->eval_fraction)) return 0; }
        else if (!strcmp(a, "--eval-every")) { if (!num(a, val, 0, 1e9, &v)) return 0; o->eval_every = (long)v; }
        else if (!strcmp(a, "--epochs")) { if (!num(a, val, 1e-6, 1e6, &o->epochs)) return 0; }
        else if (!strcmp(a, "--warmup-steps")) { if (!num(a, val, 0, 1e9, &v)) return 0; o->warmup = (long)v; }
        else if (!strcmp(a, "--global-batch-tokens")) { if (!num(a, val, 2, 1e12, &v)) return 0; o->global_tokens = (long)v; }
        else if (!strcmp(a, "--lr-schedule")) {
            if (!twk_lr_schedule_parse(val, &o->sched)) {
                fprintf(stderr, "twinkle train: --lr-schedule wants constant, linear or cosine, got '%s'\n", val);
                return 0;
            }
        }
        else if (!strcmp(a, "--out")) o->out = val;
        else if (!strcmp(a, "--resume")) o->resume = val;
        else if (!strcmp(a, "--device")) o->device = val;
        else if (!strcmp(a, "--dtype") || !strcmp(a, "--kv-dtype")) { if (twk_cli_dtype_option("train", a, val, &o->dtypes) < 0) return 0; }
        else if (!strcmp(a, "--loss")) o->loss = val;
        else if (!strcmp(a, "--dpo-beta")) { if (!num(a, val, 1e-6, 1e6, &o->dpo_beta)) return 0; }
        else if (!strcmp(a, "--clip-low")) { if (!num(a, val, 0, 1e6, &o->clip_lo)) return 0; }
        else if (!strcmp(a, "--clip-high")) { if (!num(a, val, 0, 1e6, &o->clip_hi)) return 0; }
        else if (!strcmp(a, "--kl-beta")) { if (!num(a, val, 0, 1e6, &o->kl_beta)) return 0; }
        else if (!strcmp(a, "--max-tokens")) { if (!num(a, val, 1, 1e9, &o->max_tokens)) return 0; }
        else if (!strcmp(a, "--teacher")) o->teacher = val;
        else if (!strcmp(a, "--teacher-adapter")) o->teacher_adapter = val;
        else if (!strcmp(a, "--topk")) { if (!num(a, val, 1, 64, &v)) return 0; o->topk = (long)v; }
        else if (!strcmp(a, "--distill-beta")) { if (!num(a, val, 1e-6, 1 - 1e-6, &o->distill_beta)) return 0; }
        else if (!strcmp(a, "--steps")) { if (!num(a, val, 1, 1e9, &v)) return 0; o->steps = (long)v; steps_given = 1; }
        else if (!strcmp(a, "--save-every")) { if (!num(a, val, 0, 1e9, &v)) return 0; o->save_every = (long)v; }
        else if (!strcmp(a, "--batch-tokens")) { if (!num(a, val, 2, 1e7, &v)) return 0; o->batch_tokens = (long)v; }
        else if (!strcmp(a, "--rank")) { if (!num(a, val, 1, 4096, &v)) return 0; o->rank = (long)v; }
        else if (!strcmp(a, "--seed")) { if (!num(a, val, 0, 1e18, &v)) return 0; o->seed = (long)v; }
        else if (!strcmp(a, "--alpha")) { if (!num(a, val, 1e-6, 1e6, &o->alpha)) return 0; }
        else if (!strcmp(a, "--lr")) { if (!num(a, val, 0, 10, &o->lr)) return 0; }
        else if (!strcmp(a, "--beta1")) { if (!num(a, val, 0, 0.999999, &o->beta1)) return 0; }
        else if (!strcmp(a, "--beta2")) { if (!num(a, val, 0, 0.999999999, &o->beta2)) return 0; }
        else if (!strcmp(a, "--eps")) { if (!num(a, val, 1e-30, 1, &o->eps)) return 0; }
        else if (!strcmp(a, "--weight-decay")) { if (!num(a, val, 0, 10, &o->weight_decay)) return 0; }
        else if (!strcmp(a, "--bucket-mb")) { if (!num(a, val, 0.001, 65536, &o->bucket_mb)) return 0; }
        else if (!strcmp(a, "--grad-clip")) { if (!num(a, val, 0, 1e9, &o->grad_clip)) return 0; }
        else {
            fprintf(stderr, "twinkle train: unknown option '%s'\n", a);
            return 0;
        }
    }
    if (!loss_spec(o)) return 0;
    twk_loss_family fam = o->spec.def->family;
    double kl = o->spec.config[TWK_CFG_KL_BETA];
    if ((fam == TWK_FAMILY_PREF || kl > 0) && o->full) {
        fprintf(stderr, "twinkle train: --loss %s%s needs LoRA (its reference is the base model), not --full\n", o->loss,
                kl > 0 ? " with --kl-beta" : "");
        return 0;
    }
    if ((fam == TWK_FAMILY_DISTILL) != (o->teacher != NULL)) {
        fprintf(stderr, "twinkle train: %s\n", fam == TWK_FAMILY_DISTILL ? "--loss forward_kl / reverse_kl / jsd needs --teacher DIR"
                                                          : "--teacher is for --loss forward_kl / reverse_kl / jsd");
        return 0;
    }
    if (!o->model || !o->data) {
        fprintf(stderr, "twinkle train: --model and --data are required (see --help)\n");
        return 0;
    }
    if (steps_given && o->epochs > 0) {
        fprintf(stderr, "twinkle train: give --steps or --epochs, not both\n");
        return 0;
    }
    if (o->eval_data && o->eval_fraction > 0) {
        fprintf(stderr, "twinkle train: give --eval-data or --eval-fraction, not both\n");
        return 0;
    }
    if (o->global_tokens && o->global_tokens < o->batch_tokens) {
        fprintf(stderr, "twinkle train: --global-batch-tokens %ld is below --batch-tokens %ld\n", o->global_tokens,
                o->batch_tokens);
        return 0;
    }
    if (o->full && o->dtypes.weights < 0) o->dtypes.weights = TWK_F32; /* trainable weights are f32 */
    o->dopts.model_dir = o->model;
    if (!o->dopts.max_targets) o->dopts.max_targets = o->batch_tokens;
    return 1;
}

/* The progress line: a bar redrawn in place on a terminal, one plain line per step otherwise. */
static void progress(long step, long steps, double loss, double aux, double eval, double tps, double eta_s, int tty) {
    int width = 24, done = (int)(width * step / steps);
    char bar[32], ev[32] = "", ax[40] = "";
    for (int i = 0; i < width; i++) bar[i] = i < done ? '#' : '.';
    bar[width] = 0;
    if (!isnan(eval)) snprintf(ev, sizeof ev, "  eval %.4f", eval);
    if (!isnan(aux)) snprintf(ax, sizeof ax, "  router_aux %.4f", aux);
    printf("%s[%s] step %ld/%ld  loss %.4f%s%s  %.0f tokens/s  ETA %ld:%02ld%s", tty ? "\r" : "", bar, step, steps,
           loss, ax, ev, tps, (long)eta_s / 60, (long)eta_s % 60, tty ? "\033[K" : "\n");
    fflush(stdout);
}

/* One JSON line: the step's packed batch (debugging; tests check the weights on it). */
static void dump_batch(FILE *f, long step, const twk_packed *p) {
    const twk_batch *b = &p->batch;
    fprintf(f, "{\"step\": %ld, \"seg_start\": [", step);
    for (int64_t i = 0; i < b->n; i++) fprintf(f, "%s%d", i ? ", " : "", b->seg_start[i]);
    fprintf(f, "], \"tokens\": [");
    for (int64_t i = 0; i < b->n; i++) fprintf(f, "%s%d", i ? ", " : "", b->tokens[i]);
    fprintf(f, "], \"targets\": [");
    for (int64_t i = 0; i < b->n; i++) fprintf(f, "%s%d", i ? ", " : "", b->targets[i]);
    fprintf(f, "], \"weights\": [");
    for (int64_t i = 0; i < b->n; i++) fprintf(f, "%s%.9g", i ? ", " : "", b->weights[i]);
    fprintf(f, "]}\n");
    fflush(f);
}

/* This rank's share of the loss over the evaluation set, forward only: sums[0] the loss, sums[1] its
 * normaliser (the caller sums them across ranks). Errors from the loss step. */
static twk_status eval_pass(twk_trainer *t, const train_opts *o, const twk_dataset *eval, int group, twk_sampler *ts,
                            double sums[2]) {
    twk_packed pk = {0};
    twk_status st = TWK_OK;
    sums[0] = sums[1] = 0;
    for (int64_t cursor = 0, n = twk_dataset_count(eval); st == TWK_OK && cursor < n;) {
        int64_t before = cursor;
        st = twk_dataset_pack_groups(eval, o->batch_tokens, group, &cursor, &pk);
        if (st != TWK_OK) break;
        if (cursor > n) { /* the pack wrapped past the end: keep the sequences before it */
            int keep = (int)(n - before), seen = 0;
            for (int64_t i = 0; i < pk.batch.n; i++)
                if (pk.batch.seg_start[i] == i && seen++ == keep) {
                    pk.batch.n = i;
                    break;
                }
            pk.n_seqs = keep;
        }
        int s0 = 0, s1 = pk.n_seqs;
        twk_train_shard(&pk, group, twk_dist_rank(), twk_dist_size(), &s0, &s1);
        twk_loss_result res;
        memset(&res, 0, sizeof res);
        if (s1 > s0) st = twk_train_step(t, &o->spec, &pk, s0, s1, ts, (int)o->topk, 0, &res);
        sums[0] += res.loss;
        sums[1] += res.values[2];
    }
    twk_packed_free(&pk);
    return st;
}

/* The memory plan of the run on dev (twinkle plan's table): 1 when it fits, recompute
 * chosen when only that fits (rq->recompute set, a line says so); 0 when nothing does. */
static int fits_device(const train_opts *o, twk_device *dev, twk_mem_request *rq, int me) {
    twk_mem_plan p;
    int asked = rq->recompute;
    twk_status st = twk_mem_plan_choose(o->model, rq, true, dev, &p);
    if (st == TWK_OK && rq->recompute && !asked && me == 0)
        printf("activation recompute is on: a step fits %s only with it\n", twk_device_spec(dev));
    if (st != TWK_ERR_OOM) return 1; /* a config error is reported by the model load */
    char table[2048];
    if (me == 0)
        fprintf(stderr, "twinkle train: the configuration does not fit: %s\n%s", twk_last_error(),
                twk_mem_plan_table(&p, rq, table, sizeof table));
    twk_error(TWK_ERR_OOM, "the configuration does not fit %s (see the table above)", twk_device_spec(dev));
    return 0;
}

static int train(train_opts *o) {
    int me = twk_dist_rank(), nr = twk_dist_size();
    twk_device *dev = NULL;
    twk_model *model = NULL;
    twk_dataset *data = NULL, *eval = NULL;
    twk_trainer *t = NULL;
    twk_model *teacher = NULL;
    twk_sampler *tsampler = NULL;
    twk_packed packed = {0};
    FILE *dump = NULL, *metrics = NULL;
    int rc = 1, tty = me == 0 && isatty(1);
    int whole_normalised = o->spec.def->family == TWK_FAMILY_RL && o->spec.def->aggregation != TWK_AGG_SUM;
    char devname[256], where[96] = ""; /* a failing rank's share, for its message */
    twk_mem_request rq = {.tokens = o->batch_tokens, .rank = o->full ? 0 : (int)o->rank, .train_unembed = o->train_unembed,
                          .recompute = o->recompute, .train_experts = !o->no_mlp && !o->no_experts,
                          .train_router = o->train_router};
    int wdtype = -1; /* the dtype the model load will hold the weights in: the plan's */
    if (twk_device_open(twk_dist_device(o->device, devname, sizeof devname), &dev) != TWK_OK ||
        (wdtype = twk_model_weights_dtype(o->model, dev, o->dtypes.weights)) < 0 ||
        (rq.dtype = twk_dtype_name((twk_dtype)wdtype), !fits_device(o, dev, &rq, me)) || twk_cli_model_load(o->model, dev, &o->dtypes, &model) != TWK_OK ||
        (o->dopts.vocab = twk_model_cfg(model)->vocab,
         twk_train_data_load(&o->files, &o->dopts, o->spec.def->group, (uint64_t)o->seed, o->eval_data,
                             o->eval_fraction, &data, &eval)) != TWK_OK)
        goto fail;
    if (o->dump && me == 0 && !(dump = fopen(o->dump, "w"))) {
        twk_error(TWK_ERR_IO, "--dump-batches: cannot write %s", o->dump);
        goto fail;
    }
    twk_lora_config lc = twk_lora_default();
    lc.rank = (int)o->rank;
    lc.alpha = (float)o->alpha;
    lc.train_attn = !o->no_attn;
    lc.train_mlp = !o->no_mlp;
    lc.train_unembed = o->train_unembed;
    lc.train_experts = !o->no_mlp && !o->no_experts; /* ignored by a dense model */
    lc.train_router = o->train_router;
    lc.seed = (uint64_t)o->seed;
    /* the overlapped gradient sum wants each gradient accumulated as soon as it exists */
    twk_trainer_opts topts = {.recompute = rq.recompute, .early_grads = nr > 1 && !o->no_overlap && o->global_tokens <= 0};
    if (twk_trainer_new_opts(model, o->full ? NULL : &lc, o->batch_tokens, &topts, &t) != TWK_OK) goto fail;
    if (o->resume && twk_trainer_load_state(t, o->resume, 1) != TWK_OK) goto fail;
    if (me == 0 && twk_mkdir_p(o->out, 0755) != TWK_OK) goto fail;
    char mpath[4200];
    snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", o->out);
    if (me == 0 && !(metrics = fopen(mpath, o->resume ? "a" : "w"))) {
        twk_error(TWK_ERR_IO, "cannot write %s", mpath);
        goto fail;
    }
    const twk_model_config *c = twk_model_cfg(model);
    long start = (long)twk_trainer_step(t);
    twk_adam_params ap = {(float)o->lr, (float)o->beta1, (float)o->beta2, (float)o->eps, (float)o->weight_decay,
                          (float)o->grad_clip};
    twk_loss_family fam = o->spec.def->family;
    int group = o->spec.def->group;
    if (fam == TWK_FAMILY_RL && twk_dataset_require(data, "advantages", o->data, o->loss) != TWK_OK) goto fail;
    if (fam == TWK_FAMILY_DISTILL) { /* the teacher scores every position of a sequence at once */
        twk_lora_config tl;
        if (twk_cli_model_load(o->teacher, dev, &o->dtypes, &teacher) != TWK_OK) goto fail;
        if (twk_model_cfg(teacher)->vocab != c->vocab) {
            twk_error(TWK_ERR_INVALID_ARG, "--teacher %s has vocabulary %d; the student's is %d", o->teacher,
                      twk_model_cfg(teacher)->vocab, c->vocab);
            goto fail;
        }
        if (o->teacher_adapter && twk_adapter_read_config(o->teacher_adapter, &tl) != TWK_OK) goto fail;
        /* the sampler scores max_seqs positions per pass: as many as 1 GiB of KV cache allows, up to 16 */
        const twk_model_config *tc = twk_model_cfg(teacher);
        int64_t len = twk_dataset_max_targets(data) + 1;
        double row_bytes = 8.0 * tc->layers * tc->kv_heads * tc->head_dim; /* k and v, f32 */
        int seqs = (int)fmin(16.0, fmax(1.0, (double)(1 << 30) / (row_bytes * (double)len)));
        if (twk_sampler_new(teacher, o->teacher_adapter ? &tl : NULL, seqs, len, &tsampler) !=
                TWK_OK ||
            (o->teacher_adapter && twk_sampler_load_adapter(tsampler, o->teacher_adapter) != TWK_OK))
            goto fail;
    }
    /* the data position follows from the step: packing (shuffled order included) is deterministic and the
       same on every rank, so a resumed run replays the packs of the steps it has done */
    packed.shuffle = o->shuffle;
    packed.seed = (uint64_t)o->seed;
    twk_step_packer sp = {data, o->batch_tokens, o->global_tokens, group, 0, 0, 0};
    if (o->epochs > 0 && (o->steps = twk_steps_for_epochs(&sp, &packed, o->epochs)) < 1) goto fail;
    for (long s = 0; s < start; s++) {
        int r;
        while ((r = twk_step_next(&sp, &packed)) == 1) {}
        if (r < 0) goto fail;
    }
    if (twk_dist_first_failure(TWK_OK) >= 0) goto stop; /* another rank failed to start */
    if (me == 0)
        printf("twinkle train: %s (%d layers, hidden %d, vocab %d), %s, %lld examples / %lld target tokens, "
               "batches of <= %ld tokens%s",
               c->arch_name, c->layers, c->hidden, c->vocab, o->full ? "full fine-tuning" : "LoRA",
               (long long)twk_dataset_count(data), (long long)twk_dataset_tokens(data), o->batch_tokens,
               start ? " (resumed)" : "");
    if (me == 0 && nr > 1) /* the CPU backend's pool size: cores / local ranks unless set */
        printf(", %d ranks (%d on this machine, TWK_THREADS=%s)", nr, twk_dist_local_size(),
               getenv("TWK_THREADS") ? getenv("TWK_THREADS") : "all cores");
    if (me == 0) printf("\n");
    if (me == 0) {
        twk_data_counts dc = twk_dataset_counts(data);
        printf("data: %lld lines -> %lld examples; %lld truncated, %lld split (to %lld targets), %lld dropped "
               "(no trained token)\n", (long long)dc.lines, (long long)twk_dataset_count(data), (long long)dc.truncated,
               (long long)dc.split, (long long)o->dopts.max_targets, (long long)dc.dropped);
        if (eval) printf("eval: %lld examples / %lld target tokens, every %ld steps\n", (long long)twk_dataset_count(eval),
                         (long long)twk_dataset_tokens(eval), o->eval_every);
        printf("steps %ld%s, lr %g %s schedule, %ld warmup steps%s\n", o->steps, o->epochs > 0 ? " (from --epochs)" : "",
               o->lr, lr_names[o->sched], o->warmup, o->shuffle ? ", shuffled" : "");
    }
    double t0 = twk_now(), tokens = 0, first = -1, loss_avg = 0, reduce_s = 0, exposed_s = 0;
    twk_dist_stats ds = {0, 0, 0, 0};
    size_t bucket = (size_t)(o->bucket_mb * 1048576.0);
    /* the sum overlaps the step's last backward pass when a step is one micro-batch (with
     * accumulation the last micro-batch is known only once the next one is packed) */
    int overlap = nr > 1 && !o->no_overlap && o->global_tokens <= 0, overlapped = 0;
    double eval_loss = NAN;
    for (long s = start + 1; s <= o->steps; s++) {
        double sums[2] = {0, 0}, step_tokens = 0, mean = 0;
        int r, micro = 0;
        while ((r = twk_step_next(&sp, &packed)) == 1) { /* the micro-batches: gradients accumulate */
            if (dump) dump_batch(dump, s, &packed);
            int s0 = 0, s1 = packed.n_seqs;
            twk_train_shard(&packed, group, me, nr, &s0, &s1);
            snprintf(where, sizeof where, " (step %ld, sequences %d..%d of %d)", s, s0, s1 - 1, packed.n_seqs);
            twk_loss_result res;
            memset(&res, 0, sizeof res);
            twk_dist_overlap *ov = NULL;
            if (overlap && twk_dist_overlap_begin(t, bucket, &ov) != TWK_OK) { /* the others are in its collectives */
                fprintf(stderr, "twinkle train: rank %d of %d%s: %s\n", me, nr, where, twk_last_error());
                twk_dist_abort(1);
            }
            twk_status st = s1 > s0 ? twk_train_step(t, &o->spec, &packed, s0, s1, tsampler, (int)o->topk, 1, &res) : TWK_OK;
            char step_err[1024];
            snprintf(step_err, sizeof step_err, "%s", twk_last_error());
            if (ov) { /* whatever happened: every rank runs every bucket's collectives */
                twk_status es = twk_dist_overlap_end(ov, &ds);
                overlapped = 1;
                reduce_s += ds.seconds;
                exposed_s += ds.exposed;
                if (st == TWK_OK && es != TWK_OK) st = es, snprintf(step_err, sizeof step_err, "%s", twk_last_error());
            }
            if (st != TWK_OK) {
                twk_error(st, "%s", step_err);
                goto fail;
            }
            sums[0] += res.loss;
            sums[1] += res.values[2];
            mean = res.mean;
            micro++;
            step_tokens += (double)packed.batch.n;
        }
        if (r < 0) goto fail;
        /* every rank's step succeeded before any gradient is summed (or, overlapped, before its sum is
         * used): a failure never leaves a rank waiting. What the step waits for after its backward —
         * the agreement (the slower ranks), the sum — counts as exposed in both ways */
        double t_agree = twk_now();
        if (twk_dist_first_failure(TWK_OK) >= 0) goto stop;
        exposed_s += twk_now() - t_agree;
        if (!overlapped) {
            if (twk_dist_sum_grads(t, bucket, &ds) != TWK_OK) goto fail;
            reduce_s += ds.seconds;
            exposed_s += ds.exposed;
        }
        overlapped = 0;
        twk_dist_sum_f64(sums, 2);
        /* an RL loss normalised over the whole batch is its own mean: the shares' losses add up to it */
        loss_avg = nr == 1 && micro == 1 ? mean
                   : whole_normalised        ? sums[0] / micro
                   : sums[1] != 0            ? sums[0] / sums[1]
                                             : sums[0];
        ap.learning_rate = (float)(o->lr * twk_lr_factor(o->sched, s - 1, o->steps, o->warmup));
        if (twk_trainer_optim_step(t, &ap, NULL) != TWK_OK) goto fail;
        double aux = twk_trainer_router_aux_loss(t, true); /* this rank's passes of the step (NAN: no such loss) */
        if (first < 0) first = loss_avg;
        tokens += step_tokens;
        int do_eval = eval && ((o->eval_every > 0 && s % o->eval_every == 0) || s == o->steps);
        if (do_eval) {
            double es[2];
            if (eval_pass(t, o, eval, group, tsampler, es) != TWK_OK) goto fail;
            twk_trainer_router_aux_loss(t, true); /* the evaluation's passes are not the next step's */
            if (twk_dist_first_failure(TWK_OK) >= 0) goto stop;
            twk_dist_sum_f64(es, 2);
            eval_loss = es[1] != 0 ? es[0] / es[1] : es[0];
        }
        double el = twk_now() - t0, tps = tokens / el;
        if (me == 0) {
            progress(s, o->steps, loss_avg, aux, eval_loss, tps, el / (double)(s - start) * (double)(o->steps - s), tty);
            fprintf(metrics, "{\"step\": %ld, \"loss\": %.9g, \"lr\": %.9g, \"tokens\": %.0f, \"tokens_per_s\": %.6g, "
                             "\"elapsed_s\": %.6g%s", s, loss_avg, (double)ap.learning_rate, step_tokens, tps, el, do_eval ? ", \"eval_loss\": " : "");
            if (do_eval) fprintf(metrics, "%.9g", eval_loss);
            if (!isnan(aux)) fprintf(metrics, ", \"router_aux_loss\": %.9g", aux);
            fprintf(metrics, "}\n");
            fflush(metrics);
        }
        if (me == 0 && o->save_every && s % o->save_every == 0 && s < o->steps) {
            char dir[4200];
            snprintf(dir, sizeof dir, "%s/step-%ld", o->out, s);
            if (twk_trainer_save_state(t, dir, o->model) != TWK_OK) goto fail;
            printf("%ssaved %s\n", tty ? "\n" : "", dir);
        }
        if (twk_dist_first_failure(TWK_OK) >= 0) goto stop; /* the step and rank 0's checkpoint */
        where[0] = 0;
    }
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/final", o->out);
    if (me == 0 && twk_trainer_save_state(t, dir, o->model) != TWK_OK) goto fail;
    if (twk_dist_first_failure(TWK_OK) >= 0) goto stop;
    int differ = twk_dist_params_differ(t);
    if (differ != -1) {
        if (me == 0) fprintf(stderr, "twinkle train: rank %d's parameters differ from rank 0's after the last step\n", differ);
        goto stop;
    }
    if (me == 0) {
        printf("%sloss %.4f -> %.4f", tty ? "\n" : "", first, loss_avg);
        if (!isnan(eval_loss)) printf("; eval loss %.4f", eval_loss);
        printf("; saved %s\n", dir);
        long steps = o->steps - start;
        if (nr > 1 && steps > 0)
            printf("ranks %d: gradient allreduce %.2f ms/step (%lld bytes in %d buckets of <= %g MB), "
                   "%.2f ms/step waited for: %.0f%% hidden behind the backward%s\n",
                   nr, 1e3 * reduce_s / (double)steps, (long long)ds.bytes, ds.buckets, o->bucket_mb,
                   1e3 * exposed_s / (double)steps, reduce_s > exposed_s ? 100.0 * (1.0 - exposed_s / reduce_s) : 0.0,
                   overlap ? "" : " (not overlapped)");
    }
    rc = 0;
    goto out;
fail:
    /* the failing rank meets the others at their next agreement; the lowest failing rank speaks */
    if (twk_dist_first_failure(TWK_ERR_STATE) == me) {
        if (nr > 1) fprintf(stderr, "%stwinkle train: rank %d of %d%s: %s\n", tty ? "\n" : "", me, nr, where, twk_last_error());
        else fprintf(stderr, "%stwinkle train: %s\n", tty ? "\n" : "", twk_last_error());
    }
stop:
    rc = 1;
out:
    if (dump) fclose(dump);
    if (metrics) fclose(metrics);
    twk_dataset_free(eval);
    twk_packed_free(&packed);
    twk_sampler_free(tsampler);
    twk_model_free(teacher);
    twk_trainer_free(t);
    twk_dataset_free(data);
    twk_model_free(model);
    twk_device_close(dev);
    return rc;
}

/* Parses, then trains (as one of several ranks under mpirun). */
static int run_train(int argc, char **argv, train_opts *o) {
    if (!parse(argc, argv, o)) return 2;
    twk_dist_init(&argc, &argv);
    if (twk_dist_launched_size() > twk_dist_size()) { /* N copies would each train alone, into one --out */
        fprintf(stderr, "twinkle train: started as one of %d ranks, but this twinkle was built without MPI "
                        "(TWK_MPI=OFF); rebuild with MPI or run one process\n", twk_dist_launched_size());
        return 2;
    }
    int rc = train(o);
    twk_dist_finalize();
    return rc;
}

int twk_cmd_train(int argc, char **argv) {
    train_opts o;
    int rc = run_train(argc, argv, &o);
    twk_data_files_free(&o.files);
    return rc;
}
