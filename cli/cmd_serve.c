/* `twinkle serve`: the Tinker-compatible training service. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "serve_limits.h"
#include "service.h"
#include "cli.h"
#include "dist.h"
#include "dist_serve.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: twinkle serve [--model DIR[=NAME]]... [options]\n"
            "\n"
            "Serves the Tinker training API (the official `tinker` SDK works unchanged) for LoRA\n"
            "training on the given Hugging Face model folders. With no --model, the built-in\n"
            "default model %s (a small random Qwen3-architecture model, generated\n"
            "into DATA_DIR/models/tiny on first start) is served, so it works offline.\n"
            "\n"
            "  --model DIR[=NAME]   a base model folder, served as NAME (default: the folder name); repeatable\n"
            "  --host H             listen address (default 127.0.0.1)\n"
            "  --port P             port (default %d; 0 = any free port, printed as 'port N' on stdout)\n"
            "  --data-dir DIR       SQLite store and checkpoints (default ./twinkle-data)\n"
            "  --keys FILE          API keys: lines 'tml-KEY TENANT'. Default: open mode — any tml- key\n"
            "                       is accepted and each distinct key is its own tenant\n"
            "  --device SPEC        cpu (default), opencl[:N], vulkan[:N] or cuda[:N]: see twinkle devices\n"
            "  --dtype D            base weights: f32, bf16 or f16 (default: as each checkpoint stores them\n"
            "                       where the device reads 16-bit weights, every backend today; else f32)\n"
            "  --kv-dtype D         samplers' KV caches: f32, bf16 or f16 (default: the weights' dtype)\n"
            "  --max-lora-rank R    (default %d)   --max-context N   tokens per datum (default %d)\n"
            "  --max-datums N       per request (default %d)   --max-body-mb M   (default %d)\n"
            "  --seq-timeout S      fail ops queued behind a seq_id missing this long (default %d)\n"
            "  --stability-ttl S    stable_reinforce: a sequence sampled with record_stability_info stays\n"
            "                       usable this long after its last use (default %d: one day)\n"
            "  --stability-records N  such sequences kept at most; the least recently used go first (default %d)\n"
            "  --poll-timeout S     long-poll hold of retrieve_future (default %d)\n"
            "  --url-ttl S          signed download URLs of external weights expire after S (default 3600)\n"
            "  --fwdbwd-chunk-len N datums per forward_backward request the SDK sends (default %d)\n"
            "buffering limits (per tenant = over all its runs / futures):\n"
            "  --max-early-mb-run M     ops held ahead of a run's seq order, MiB; 429 past it (default %d)\n"
            "  --max-early-mb-tenant M  the same over all runs of a tenant (default %d)\n"
            "  --max-results-mb-tenant M finished results not yet retrieved, per tenant; past it the oldest\n"
            "                       are dropped (their futures fail naming this limit) (default %d)\n"
            "  --result-keep S      a retrieved result is kept S seconds for re-polls, then freed (default %d)\n"
            "  --result-ttl S       an unretrieved result is kept S seconds (default %d)\n"
            "  --checkpoint-sweep S checkpoints past their ttl_seconds are deleted every S seconds (default 60)\n"
            "  connection limits (at a cap, the oldest idle connection without an accepted key is closed\n"
            "  to make room; only when every one is keyed or busy is the new one refused):\n"
            "  --max-connections N  open connections in total (default 4096)\n"
            "  --max-connections-per-addr N  per client IP address (default 512)\n"
            "  --header-timeout S   a request's headers must arrive within S of its first byte, and a\n"
            "                       connection that has not sent an accepted key is closed idle after S\n"
            "                       (default 10)\n"
            "  --idle-timeout S     close a keyed keep-alive connection idle this long (default 75)\n"
            "  --read-timeout S     a whole request must arrive within S of its first byte (default 30)\n"
            "sampling limits:\n"
            "  --sample-queue N     asample requests queued or running; 429 past it (default %d)\n"
            "  --sampler-slots N    adapter slots of a base model's shared sampler, slot 0 the base model,\n"
            "                       2..%d (default %d)\n"
            "  --slot-rank R        adapters up to this rank share that sampler; larger ones get their own\n"
            "                       (default %d, the default LoRA rank)\n"
            "  --live-samplers N    samplers (each a KV cache) alive at once, the least recently used\n"
            "                       dropped first, 1..%d (default %d)\n"
            "scheduling and memory (server/README.md, \"Fair scheduling\", \"Bounded memory\"):\n"
            "  --max-queue-per-tenant N  jobs of one tenant waiting for the compute worker; 429 past it\n"
            "                       (default %d)\n"
            "  --run-idle-s S       a run idle S seconds is spilled to the data dir, restored on its next op\n"
            "                       (default %d)\n"
            "  --max-live-runs N    runs resident in memory; the least recently used are spilled (default %d)\n"
            "  --sampler-idle-s S   an unnamed sampler snapshot unused S seconds is freed (default %d)\n"
            "  --max-sampler-host-mb M  host memory of unnamed snapshots; the least recently used freed\n"
            "                       past it (default %d)\n"
            "packed training (several runs of one base model in one pass):\n"
            "  --pack-runs N        forward / forward_backward ops of up to N runs that are ready together\n"
            "                       run as one pass, 1..%d (default %d; 1: each op alone, time-shared)\n"
            "  --pack-tokens N      tokens of one packed pass (default: --max-context; at least that)\n"
            "  --config FILE        the same options as 'key = value' lines (model may repeat)\n"
            "  --log-format F       text (default: a line per failed request or future) or json (one JSON\n"
            "                       object per line: every request with level, request_id, tenant, route,\n"
            "                       status and duration_ms; failed futures; the server's messages)\n"
            "metrics and alerts:\n"
            "  --metrics-auth M     who may read GET /metrics: key (default: any accepted key; an admin\n"
            "                       key sees per-tenant labels, others service-wide sums), admin, open\n"
            "  --alert-webhook [F=]URL  post alerts to URL (repeatable, up to 8); F slack, feishu, dingtalk\n"
            "                       or generic (default: guessed from the host, else generic JSON)\n"
            "  --alert-stall-s S    alert when the compute worker finishes nothing for S seconds while it\n"
            "                       has work (default %d; 0 off)\n"
            "  --alert-disk-pct P   alert when the data dir's disk is fuller than P %% (default %d; 0 off)\n"
            "  --alert-mem-pct P    alert when the host's memory in use passes P %% (default %d; 0 off)\n"
            "  --alert-check-s S    how often those checks run (default %d)\n"
            "  --alert-rate-s S     at most one alert of a kind per S seconds (default %d)\n"
            "  --alert-retries N    retries of a failed post (default %d), the first after\n"
            "  --alert-backoff-s S  seconds, doubling (default %d); --alert-timeout-s S per post (default %d)\n"
            "  --jwt-auth           have the SDK exchange its key for a short-lived JWT (auth/token), which\n"
            "                       its whoami reads (tenant as tml:user:TENANT)\n"
            "  --recompute          per-layer activation recompute in every run (less memory, identical\n"
            "                       gradients); chosen by itself when a model fits the device only with it.\n"
            "                       At start-up each model's memory plan (weights, the activation arena all\n"
            "                       runs share, the sampler's KV cache, one run at --max-lora-rank) is checked\n"
            "                       against the device (TWK_MEM_BUDGET=SIZE, e.g. 512M or 1.5GiB, caps\n"
            "                       its memory); one that cannot fit is refused with its table\n"
                        "  --quiet              no log lines\n"
            "\n"
            "mpirun -np N twinkle serve ...: one service over N ranks (MPI). Rank 0 answers HTTP and keeps\n"
            "the store; every rank loads the base models and a replica of each run; forward_backward's\n"
            "datums are split across the ranks by tokens and the gradients summed before each optim_step.\n"
            "A GPU --device without an index becomes KIND:LOCAL_RANK. The data dir must be readable by\n"
            "every rank (load_weights reads checkpoints on each). A rank that dies ends the whole job.\n",
            TWK_DEFAULT_MODEL_NAME, TWK_SERVE_DEF_PORT, TWK_SERVE_DEF_MAX_LORA_RANK, TWK_SERVE_DEF_MAX_CONTEXT,
            TWK_SERVE_DEF_MAX_DATUMS, TWK_SERVE_DEF_MAX_BODY_MB, TWK_SERVE_DEF_SEQ_TIMEOUT_S,
            TWK_SERVE_DEF_STABILITY_TTL_S, TWK_SERVE_DEF_STABILITY_RECORDS, TWK_SERVE_DEF_POLL_TIMEOUT_S,
            TWK_SERVE_DEF_FWDBWD_CHUNK_LEN, TWK_SERVE_DEF_EARLY_MB_RUN, TWK_SERVE_DEF_EARLY_MB_TENANT,
            TWK_SERVE_DEF_RESULTS_MB_TENANT, TWK_SERVE_DEF_RESULT_KEEP_S, TWK_SERVE_DEF_RESULT_TTL_S,
            TWK_SERVE_DEF_SAMPLE_QUEUE, TWK_SERVE_CAP_SAMPLER_SLOTS, TWK_SERVE_DEF_SAMPLER_SLOTS,
            twk_lora_default().rank, TWK_SERVE_CAP_LIVE_SAMPLERS, TWK_SERVE_DEF_LIVE_SAMPLERS,
            TWK_SERVE_DEF_MAX_QUEUE_TENANT, TWK_SERVE_DEF_RUN_IDLE_S, TWK_SERVE_DEF_MAX_LIVE_RUNS,
            TWK_SERVE_DEF_SAMPLER_IDLE_S, TWK_SERVE_DEF_SAMPLER_HOST_MB, TWK_SERVE_CAP_PACK_RUNS, TWK_SERVE_DEF_PACK_RUNS,
            TWK_ALERT_DEF_STALL_S, TWK_ALERT_DEF_DISK_PCT, TWK_ALERT_DEF_MEM_PCT, TWK_ALERT_DEF_CHECK_S,
            TWK_ALERT_DEF_RATE_S, TWK_ALERT_DEF_RETRIES, TWK_ALERT_DEF_BACKOFF_S, TWK_ALERT_DEF_TIMEOUT_S);
}

/* One rank, or `mpirun -np N twinkle serve`: rank 0 serves HTTP, the others follow its commands. */
static int serve_ranks(const twk_serve_config *cfg, int argc, char **argv) {
    if (twk_dist_launched_size() <= 1) return twk_serve_run(cfg);
    twk_dist_init(&argc, &argv);
    if (twk_dist_size() == 1) { /* built without MPI: N copies would fight over one port and one data dir */
        fprintf(stderr, "twinkle serve: started as one of %d ranks, but this twinkle was built without MPI "
                        "(TWK_MPI=OFF): run one process\n", twk_dist_launched_size());
        return 2;
    }
    twk_serve_config mine = *cfg; /* --device cuda: cuda:LOCAL_RANK on each rank (an explicit :N wins) */
    char dev[sizeof mine.device];
    snprintf(mine.device, sizeof mine.device, "%s", twk_dist_device(cfg->device, dev, sizeof dev));
    cfg = &mine;
    twk_dist_watch_failures(); /* a lost rank: MPI errors return and no wait outlasts a failure notice */
    signal(SIGPIPE, SIG_IGN);  /* a closed output pipe of the process manager must not end a rank mid-shutdown */
    int rc = twk_dist_rank() == 0 ? twk_serve_run(cfg) : twk_serve_follower(cfg);
    twk_dist_finalize();
    return rc;
}

int twk_cmd_serve(int argc, char **argv) {
    twk_serve_config cfg;
    twk_serve_config_default(&cfg);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc || twk_serve_config_file(&cfg, argv[++i]) != TWK_OK) {
                fprintf(stderr, "twinkle serve: %s\n", i + 1 > argc ? "--config needs a file" : twk_last_error());
                return 2;
            }
            continue;
        }
        int used = 0;
        if (strncmp(argv[i], "--", 2) ||
            twk_serve_config_arg(&cfg, argv[i], i + 1 < argc ? argv[i + 1] : NULL, &used) != TWK_OK) {
            fprintf(stderr, "twinkle serve: %s\n", strncmp(argv[i], "--", 2) ? "options start with --" : twk_last_error());
            return 2;
        }
        i += used;
    }
    return serve_ranks(&cfg, argc, argv);
}
