#!/bin/sh
# bench/server/run.sh — what `twinkle serve` costs on top of the engine, through the official tinker SDK:
#   1. forward_backward round trip through the SDK (sdk_bench.py latency) against the same work in process
#      (bench_server_inproc: same model folder, same LoRA config, same capacity, same tokens): p50 / p99,
#      overhead = SDK p50 - in-process p50, and their ratio; the two losses must agree;
#   2. training steps/s (forward_backward + optim_step) of 1 tenant alone, then of 8 concurrent tenants
#      (8 processes, keys tml-tenant-0..7, one run each): aggregate and per-tenant steps/s, ratio 8/1;
#      then the same with the raw driver (sdk_bench.py --driver raw: the SDK's requests sent by a lean
#      client, ~0.5 ms of Python per step instead of ~12), so that the clients leave the cores to the server;
#      after each tenants row, every tenant's queue waits over its timed steps (count, mean, p50 / p99) from
#      the server's twinkle_queue_wait_seconds, read with an admin key of the keys file run.sh writes.
# Starts a server on a free port with a fresh data dir (the built-in model twinkle/tiny-qwen3), stops it
# with SIGTERM and removes the data dir at the end. About 15-20 s on 2 cores. See bench/README.md.
#
# Environment: BUILD (default build), TWK_SDK_PYTHON (a python with tinker 0.38.0; default
# $BUILD/venv-sdk/bin/python, which `make demo` creates, else python3), N (timed calls, 200),
# K (timed steps per tenant, 100), TENANTS (8). Other variables (TWK_THREADS, OPENBLAS_*) reach both
# the server and the in-process peer.
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
N=${N:-200}
K=${K:-100}
TENANTS=${TENANTS:-8}
. bench/server/common.sh
bench_setup bench_server_inproc

TMP=$(mktemp -d "${TMPDIR:-/tmp}/twk-bench-server.XXXXXX")
SERVER=""
cleanup() {
    if [ -n "$SERVER" ]; then
        kill -TERM "$SERVER" 2>/dev/null || true
        wait "$SERVER" 2>/dev/null || true
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# one tenant per key, as open mode would make them, named after the key; plus an admin key, so that
# /metrics shows each tenant's queue waits (open mode has no admin key: it would sum them)
{
    echo "tml-bench-latency bench-latency"
    for i in $(seq 0 $((TENANTS - 1))) 100 $(seq 200 $((200 + TENANTS - 1))); do echo "tml-tenant-$i tenant-$i"; done
    echo "tml-bench-admin bench-admin admin"
} >"$TMP/keys"
export TWK_BENCH_METRICS_KEY=tml-bench-admin

START=$(date +%s)
"$BUILD/twinkle" serve --port 0 --data-dir "$TMP/data" --keys "$TMP/keys" --quiet >"$TMP/server.out" 2>"$TMP/server.err" &
SERVER=$!
PORT=""
for _ in $(seq 1 300); do
    PORT=$(sed -n 's/^port \([0-9]*\)$/\1/p' "$TMP/server.out")
    [ -n "$PORT" ] && break
    kill -0 "$SERVER" 2>/dev/null || { echo "bench/server: the server did not start:" >&2; cat "$TMP/server.err" >&2; exit 1; }
    sleep 0.1
done
[ -n "$PORT" ] || { echo "bench/server: the server did not report its port" >&2; exit 1; }
URL=http://127.0.0.1:$PORT
rss_kib() { sed -n 's/^VmRSS:[[:space:]]*\([0-9]*\) kB$/\1/p' "/proc/$SERVER/status"; }
RSS0=$(rss_kib)
echo "twinkle serve on port $PORT (pid $SERVER), data dir $TMP/data; $(nproc) cores; SDK python $PY"

# 1. round trip: in process, then through the SDK (the server is idle during the first)
echo "--- forward_backward latency"
"$BUILD/bench/bench_server_inproc" --model "$TMP/data/models/tiny" --n "$N" --max-context 2048 | tee "$TMP/inproc"
"$PY" bench/server/sdk_bench.py latency --base-url "$URL" --n "$N" --server-pid "$SERVER" | tee "$TMP/sdk"

# 2. steps/s: one tenant alone, then all of them at once
echo "--- training steps/s"
"$PY" bench/server/sdk_bench.py tenants --base-url "$URL" --tenants 1 --steps "$K" --server-pid "$SERVER" | tee "$TMP/t1"
"$PY" bench/server/sdk_bench.py tenants --base-url "$URL" --tenants "$TENANTS" --steps "$K" --server-pid "$SERVER" \
    | tee "$TMP/tn"
"$PY" bench/server/sdk_bench.py tenants --base-url "$URL" --tenants 1 --first 100 --steps "$K" --driver raw \
    --server-pid "$SERVER" | tee "$TMP/r1"
"$PY" bench/server/sdk_bench.py tenants --base-url "$URL" --tenants "$TENANTS" --first 200 --steps "$K" --driver raw \
    --server-pid "$SERVER" | tee "$TMP/rn"

RSS1=$(rss_kib)
RUNS=$((2 * TENANTS + 3))
RSS_LINE="server RSS $((RSS0 / 1024)) MiB after start (model loaded), $((RSS1 / 1024)) MiB with $RUNS runs (one per\
 training client above): +$(((RSS1 - RSS0) / RUNS / 1024)) MiB per run"

# 3. stop the server (SIGTERM) and check it exits cleanly
kill -TERM "$SERVER"
RC=0
wait "$SERVER" || RC=$?
SERVER=""
[ "$RC" -eq 0 ] || { echo "bench/server: the server exited with status $RC after SIGTERM" >&2; exit 1; }

I=$(grep '^RESULT' "$TMP/inproc")
S=$(grep '^RESULT' "$TMP/sdk")
T1=$(grep '^RESULT' "$TMP/t1")
TN=$(grep '^RESULT' "$TMP/tn")
R1=$(grep '^RESULT' "$TMP/r1")
RN=$(grep '^RESULT' "$TMP/rn")
echo "--- summary (ratios are from this run; $(date +%F), $(nproc) cores)"
echo "$RSS_LINE"
echo "$I|$S|$T1|$TN|$(($(date +%s) - START))|$R1|$RN" | awk -F'|' '{
    split($1, i, " "); split($2, s, " "); split($3, a, " "); split($4, b, " "); split($6, r, " "); split($7, q, " ")
    # in-process: p50 p99 mean loss steps/s; sdk: p50 p99 mean loss submit_p50 healthz_p50
    # tenants: n aggregate min median max span
    printf "forward_backward  SDK p50 %.2f ms p99 %.2f ms | in-process p50 %.2f ms p99 %.2f ms\n", s[2], s[3], i[2], i[3]
    printf "  overhead p50 %+.2f ms, ratio SDK/in-process %.2fx (p99: %+.2f ms, %.2fx)\n", s[2] - i[2], s[2] / i[2], s[3] - i[3], s[3] / i[3]
    printf "  loss:sum SDK %.4f vs in-process %.4f\n", s[5], i[5]
    printf "steps/s  1 tenant %.1f | %d tenants aggregate %.1f (per tenant min %.1f median %.1f max %.1f)\n", a[3], b[2], b[3], b[4], b[5], b[6]
    printf "  ratio aggregate(%d)/single %.2f; in-process steps/s (compute only, no server) %.1f: single/in-process %.2f\n", b[2], b[3] / a[3], i[6], a[3] / i[6]
    printf "raw driver: steps/s  1 tenant %.1f | %d tenants aggregate %.1f: ratio %.2f\n", r[3], q[2], q[3], q[3] / r[3]
    printf "wall time %d s\n", $5
    d = s[5] - i[5]; if (d < 0) d = -d
    if (d > 1e-3 * (i[5] < 0 ? -i[5] : i[5]) + 1e-3) { print "MISMATCH: the server and the in-process trainer disagree on the loss"; exit 1 }
}'
echo "per-tenant queue waits (job submitted -> started on the worker) of the $TENANTS-tenant rows, SDK then raw driver:"
grep '^  queue wait' "$TMP/tn" "$TMP/rn" | sed 's/^[^:]*:/ /'
