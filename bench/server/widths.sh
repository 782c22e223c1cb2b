#!/bin/sh
# bench/server/widths.sh — packed multi-LoRA training through the service on a model whose weights do
# not stay in cache: 8 tenants (one LoRA run each, rank 8) take forward_backward + optim_step steps of
# 1 datum x 256 tokens on a 4-layer model with Qwen3-0.6B's widths (hidden 1024, 16 / 8 heads of 128,
# ffn 3072, vocab 151936, tied; random weights, f32: 1.2 GB), against the same 8 tenants on a server
# started with --pack-runs 1 (every run's pass alone: time-shared, the base weights read 8 times).
# Both servers run twice, alternating (packed, time-shared, packed, time-shared), so a change of load
# on a shared machine shows as a spread between the rounds. Prints aggregate steps/s and tokens/s of
# each and the ratio packed / time-shared per round. Clients: the raw driver (sdk_bench.py --driver
# raw, the SDK's requests from a lean client). See bench/README.md, "bench/server/widths.sh".
#
# Environment: BUILD (default build), TWK_SDK_PYTHON (a python with tinker 0.38.0; default
# $BUILD/venv-sdk/bin/python, else python3), TENANTS (8), TOKENS (256), STEPS (timed steps per
# tenant, 3), LAYERS (4), ROUNDS (2). Other variables (TWK_THREADS, OPENBLAS_*) reach the servers.
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
TENANTS=${TENANTS:-8}
TOKENS=${TOKENS:-256}
STEPS=${STEPS:-3}
LAYERS=${LAYERS:-4}
ROUNDS=${ROUNDS:-2}
. bench/server/common.sh
bench_setup bench_sample_inproc
TMP=$(mktemp -d "${TMPDIR:-/tmp}/twk-bench-widths.XXXXXX")
SERVER=""
stop_server() {
    if [ -n "$SERVER" ]; then
        kill -TERM "$SERVER" 2>/dev/null || true
        wait "$SERVER" 2>/dev/null || true
    fi
    SERVER=""
}
trap 'stop_server; rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM

echo "--- model: $LAYERS layers of Qwen3-0.6B's widths, random weights (f32)"
"$BUILD/bench/bench_sample_inproc" --layers "$LAYERS" --save "$TMP/qwen-widths" --phase prefill --prompt 16 \
    --prefill 16 --new 2 --reps 1 >"$TMP/make-model.log" 2>&1 || { cat "$TMP/make-model.log" >&2; exit 1; }

# one server (extra options: $1), the tenants against it; prints the tenants' RESULT line into $2
measure() {
    rm -rf "$TMP/data"
    # shellcheck disable=SC2086 # $1 is a list of options
    "$BUILD/twinkle" serve --port 0 --data-dir "$TMP/data" --model "$TMP/qwen-widths=qwen-widths" --quiet $1 \
        >"$TMP/server.out" 2>"$TMP/server.err" &
    SERVER=$!
    PORT=""
    for _ in $(seq 1 600); do
        PORT=$(sed -n 's/^port \([0-9]*\)$/\1/p' "$TMP/server.out")
        [ -n "$PORT" ] && break
        kill -0 "$SERVER" 2>/dev/null || { echo "bench/server/widths: the server did not start:" >&2; cat "$TMP/server.err" >&2; exit 1; }
        sleep 0.1
    done
    [ -n "$PORT" ] || { echo "bench/server/widths: the server did not report its port" >&2; exit 1; }
    "$PY" bench/server/sdk_bench.py tenants --base-url "http://127.0.0.1:$PORT" --tenants "$TENANTS" \
        --datums 1 --tokens "$TOKENS" --steps "$STEPS" --warmup 1 --barrier-s 3600 --driver raw --server-pid "$SERVER" | tee "$TMP/out"
    grep '^RESULT' "$TMP/out" > "$2"
    stop_server
}

r=1
while [ "$r" -le "$ROUNDS" ]; do
    echo "--- round $r: packed (the server's default)"
    measure "" "$TMP/packed-$r"
    echo "--- round $r: time-shared (--pack-runs 1)"
    measure "--pack-runs 1" "$TMP/shared-$r"
    r=$((r + 1))
done

echo "--- summary ($(date +%F), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)): $TENANTS tenants x 1 datum x $TOKENS tokens, rank 8"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    paste -d' ' "$TMP/packed-$r" "$TMP/shared-$r" | awk -v r="$r" -v t="$TOKENS" '{
        # RESULT tenants aggregate min median max span (twice)
        printf "round %d: packed %.3f steps/s (%.1f tokens/s) | time-shared %.3f steps/s (%.1f tokens/s) | ratio %.2f\n",
            r, $3, $3 * t, $10, $10 * t, $3 / $10 }'
    r=$((r + 1))
done
