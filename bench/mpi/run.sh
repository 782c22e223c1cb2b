#!/bin/sh
# bench/mpi/run.sh — data-parallel `twinkle train` on this machine: the same global batch trained by
# 1 rank x 2 threads and by `mpirun -np 2` ranks x 1 thread, LoRA (rank 16) and full-parameter, on a
# model with Qwen3-0.6B's widths (hidden 1024, ffn 3072) and LAYERS layers, vocab 8192, random weights
# (written by bench_sample_inproc --save). Prints tokens/s, the gradient allreduce time per step (the
# `ranks N:` line twinkle train prints: the communication thread's wall time in the reductions), its
# share of the step, the time the step waited for the sum after its backward, and the share of the
# reductions hidden behind the backward (measured: 1 - waited / the reductions' time). The ranks run
# twice: the sum overlapped with the backward (the default) and after it (--no-overlap). Not a test;
# about 4-5 minutes on 2 cores. Exits 1 when a run fails or the runs' final losses disagree beyond 1e-3.
#
# Environment: BUILD (default build), LAYERS (2), BATCH (global batch tokens, 512), STEPS (3),
# RANKS (2), THREADS (total threads, 2), BUCKET_MB (16).
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
LAYERS=${LAYERS:-2}
BATCH=${BATCH:-512}
STEPS=${STEPS:-3}
RANKS=${RANKS:-2}
THREADS=${THREADS:-2}
BUCKET_MB=${BUCKET_MB:-16}
if [ ! -x "$BUILD/twinkle" ] || [ ! -x "$BUILD/bench/bench_sample_inproc" ]; then
    cmake -S . -B "$BUILD" >/dev/null
    make -C "$BUILD" -j2 twinkle_cli bench_sample_inproc >/dev/null
fi
MPIRUN=$(command -v mpirun || command -v mpiexec || true)
[ -n "$MPIRUN" ] || { echo "bench/mpi: no mpirun (scripts/install-deps.sh installs MPICH)" >&2; exit 2; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/twk-bench-mpi.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

"$BUILD/bench/bench_sample_inproc" --layers "$LAYERS" --vocab 8192 --ctx 64 --prompt 8 --new 8 --prefill 16 \
    --batch 1 --reps 1 --phase none --save "$TMP/model" > /dev/null
# 64 random sequences of 96..159 tokens
awk 'BEGIN { srand(11); for (s = 0; s < 64; s++) { n = 96 + int(rand() * 64); line = "{\"tokens\": [";
     for (i = 0; i < n; i++) line = line (i ? ", " : "") int(rand() * 8192); print line "]}" } }' > "$TMP/data.jsonl"

per_rank=$((THREADS / RANKS))
[ "$per_rank" -ge 1 ] || per_rank=1
status=0
printf '%-6s %-26s %10s %10s %14s %8s %10s %8s %12s\n' mode layout tokens/s ms/step allreduce_ms share waited_ms hidden final_loss
for mode in lora full; do
    case $mode in lora) args="--rank 16 --lr 1e-4" ;; full) args="--full --lr 1e-5" ;; esac
    common="--model $TMP/model --data $TMP/data.jsonl --batch-tokens $BATCH --steps $STEPS --bucket-mb $BUCKET_MB $args"
    for layout in single multi after; do
        log="$TMP/$mode-$layout.log"
        if [ $layout = single ]; then
            name="1 x $THREADS threads"
            TWK_THREADS=$THREADS "$BUILD/twinkle" train $common --out "$TMP/$mode-$layout" > "$log" 2>&1 || { cat "$log"; status=1; continue; }
        else
            name="$RANKS x $per_rank threads"
            extra=""
            [ $layout = multi ] || { extra=--no-overlap; name="$name, --no-overlap"; }
            TWK_THREADS=$per_rank "$MPIRUN" -np "$RANKS" "$BUILD/twinkle" train $common $extra --out "$TMP/$mode-$layout" \
                > "$log" 2>&1 || { cat "$log"; status=1; continue; }
        fi
        tps=$(sed -n 's/.*step [0-9]*\/[0-9]*  loss [-0-9.]*  \([0-9.]*\) tokens\/s.*/\1/p' "$log" | tail -n 1)
        loss=$(sed -n 's/^loss [-0-9.]* -> \([-0-9.]*\);.*/\1/p' "$log")
        ar=$(sed -n 's/^ranks [0-9]*: gradient allreduce \([0-9.]*\) ms\/step.*/\1/p' "$log")
        ar=${ar:-0}
        hid=$(sed -n 's/^ranks [0-9]*: .* \([-0-9]*\)% hidden behind the backward.*/\1/p' "$log")
        wt=$(sed -n 's/^ranks [0-9]*: .*, \([0-9.]*\) ms\/step waited for.*/\1/p' "$log")
        # ms/step from the batch budget (whole sequences are packed, so a step holds at most BATCH tokens)
        awk -v m=$mode -v n="$name" -v t="$tps" -v a="$ar" -v b="$BATCH" -v l="$loss" -v h="${hid:--}" -v w="${wt:-0}" 'BEGIN {
            ms = t > 0 ? 1000 * b / t : 0
            printf "%-6s %-26s %10.1f %10.0f %14.2f %7.1f%% %10.2f %8s %12s\n", m, n, t, ms, a, (ms > 0 ? 100 * a / ms : 0), w,
                   (h != "-" ? h "%" : "-"), l }'
        eval "loss_${mode}_$layout=$loss"
    done
    for other in multi after; do
        eval "a=\${loss_${mode}_single:-x} b=\${loss_${mode}_$other:-y}"
        awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "x" && b != "y" && d <= 1e-3) }' ||
            { echo "bench/mpi: $mode final losses differ: $a vs $b ($other)"; status=1; }
    done
done
exit $status
