#!/bin/sh
# Data-parallel `twinkle train` under `mpirun -np NP` against the one-process
# run on the qwen3 parity model: LoRA and full-parameter SFT and LoRA RL
# (importance_sampling, and grpo, which normalises over the whole batch), parameters after 5 steps and the loss curve; with 2
# ranks also checkpoints crossing rank counts (2 -> 1 and 1 -> 2) and a rank
# killed with SIGKILL ending the job; and a rank whose share holds bad data
# stops every rank with one message naming it. The gradient sum overlapped with
# the backward gives the parameters of the sum after it, bit for bit (CPU, and
# OpenCL / Vulkan with 2 ranks when present).
#
# Tolerance, from the summation order. A gradient element is a float32 sum of
# per-token terms over the T tokens of the global batch: one rank sums them in
# one order, NP ranks per share and then across ranks. Two orders of a float32
# sum of T terms differ by at most 2 gamma_T sum|terms| (Higham; gamma_T ~ T u,
# u = 2^-24), i.e. a relative gradient change of delta = 2 T u where terms do
# not cancel. AdamW's update m / (sqrt(v) + eps) does not change when the
# gradient is scaled, so to first order each step's update moves by at most
# delta of itself, and after S steps the parameters differ by at most S delta
# of the total update:  ||w_NP - w_1|| / ||w_1 - w_0|| <= S * 2 T u.
# The loss curve is compared at the printed resolution (1e-4).
set -eu
MPIRUN=$1
NP=$2
TWINKLE=$3
MODEL=$4
FAKE_CUDA=${5:-} # build/cuda_fake when the CUDA backend's host stand-in was built: checks the rank -> device map
HERE=$(dirname "$0")
DIR=$(mktemp -d /tmp/twk_mpi_train.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
fail() { echo "FAIL $*"; exit 1; }
T=64
tol() { awk -v s="$1" -v t="$T" 'BEGIN { printf "%.6e", s * 2 * t * 2 ^ -24 }'; }
run() { # ranks out-dir args...: a run that must succeed; a hang fails the test after $RUN_S s (default 60)
    np=$1 out=$2
    shift 2
    if [ "$np" = 1 ]; then
        timeout "${RUN_S:-60}" "$TWINKLE" train --model "$MODEL" --batch-tokens $T --out "$out" "$@" > "$out.log" 2>&1 ||
            { cat "$out.log"; fail "1-rank run $out"; }
    else
        timeout "${RUN_S:-60}" "$MPIRUN" -np "$np" "$TWINKLE" train --model "$MODEL" --batch-tokens $T --out "$out" "$@" > "$out.log" 2>&1 ||
            { cat "$out.log"; fail "$np-rank run $out"; }
    fi
}
losses() { sed -n 's/.*step \([0-9]*\)\/[0-9]*  loss \([-0-9.]*\).*/\1 \2/p' "$1"; }
same_curve() { # log-a log-b label
    losses "$1" > "$DIR/la"
    losses "$2" > "$DIR/lb"
    [ -s "$DIR/la" ] || fail "$3: no loss lines"
    paste "$DIR/la" "$DIR/lb" | awk -v l="$3" '{ d = $2 - $4; if (d < 0) d = -d; if (d > m) m = d; if ($1 != $3 || d > 1e-4) bad = 1 }
        END { printf "%s %s: loss curve over %d steps, max |diff| %.1e (tolerance 1e-4)\n", bad ? "FAIL" : "ok  ", l, NR, m; exit bad }'
}

# 12 random sequences of 8..19 tokens; the RL set adds an advantage of +-1 per line
awk 'BEGIN { srand(7); for (s = 0; s < 12; s++) { n = 8 + int(rand() * 12); line = "{\"tokens\": [";
     for (i = 0; i < n; i++) line = line (i ? ", " : "") int(rand() * 1000); print line "]}" } }' > "$DIR/sft.jsonl"
awk 'BEGIN { srand(3) } { sub(/\]\}$/, "], \"advantages\": " (rand() < 0.5 ? -1 : 1) "}"); print }' "$DIR/sft.jsonl" > "$DIR/rl.jsonl"

lora="--rank 8 --lr 1e-2"
# the ranks split the cores unless TWK_THREADS is set
cores=$(getconf _NPROCESSORS_ONLN)
want_threads=${TWK_THREADS:-$((cores / NP > 1 ? cores / NP : 1))}
run 1 "$DIR/init" --data "$DIR/sft.jsonl" $lora --lr 0 --steps 1 # the adapter before any step
for cfg in lora-sft full-sft lora-rl lora-grpo lora-sched; do
    case $cfg in
    lora-sched) args="--data $DIR/sft.jsonl $lora --shuffle --seed 3 --eval-fraction 0.25 --eval-every 2 \
        --global-batch-tokens 128 --lr-schedule cosine --warmup-steps 2" w=adapter_model.safetensors init="$DIR/init/final/$w" ;;
    lora-sft) args="--data $DIR/sft.jsonl $lora" w=adapter_model.safetensors init="$DIR/init/final/$w" ;;
    full-sft) args="--data $DIR/sft.jsonl --full --lr 1e-3" w=model.safetensors init="$MODEL/model.safetensors" ;;
    lora-rl) args="--data $DIR/rl.jsonl --loss importance_sampling $lora" w=adapter_model.safetensors init="$DIR/init/final/$w" ;;
    # grpo normalises over the whole batch: each rank's share by the whole batch's sequence count
    lora-grpo) args="--data $DIR/rl.jsonl --loss grpo $lora" w=adapter_model.safetensors init="$DIR/init/final/$w" ;;
    esac
    run 1 "$DIR/$cfg-1" $args --steps 5
    run "$NP" "$DIR/$cfg-$NP" $args --steps 5
    grep -q "$NP ranks ($NP on this machine, TWK_THREADS=$want_threads)" "$DIR/$cfg-$NP.log" ||
        { head -n 1 "$DIR/$cfg-$NP.log"; fail "$cfg: want $NP ranks sharing the cores (TWK_THREADS=$want_threads)"; }
    # lora-sched: shuffled, eval split, 2 micro-batches of <= 64 tokens per step (T = 128 tokens: tol 10)
    python3 "$HERE/mpi_params.py" "$DIR/$cfg-1/final/$w" "$DIR/$cfg-$NP/final/$w" "$init" \
        "$(tol $([ $cfg = lora-sched ] && echo 10 || echo 5))" "$cfg 1 vs $NP ranks, 5 steps"
    same_curve "$DIR/$cfg-1.log" "$DIR/$cfg-$NP.log" "$cfg 1 vs $NP ranks"
    if [ $cfg = lora-sched ]; then
        e1=$(sed -n 's/.*; eval loss \([0-9.]*\);.*/\1/p' "$DIR/$cfg-1.log")
        en=$(sed -n 's/.*; eval loss \([0-9.]*\);.*/\1/p' "$DIR/$cfg-$NP.log")
        [ -n "$e1" ] && [ "$e1" = "$en" ] || fail "$cfg: eval loss $e1 on 1 rank, '$en' on $NP"
        echo "ok   $cfg: eval loss $e1 on 1 and $NP ranks (printed resolution 1e-4)"
    fi
done

# the gradient sum overlapped with the backward (the default: each bucket reduced by a communication
# thread as soon as the backward made it final) against the sum after the backward (--no-overlap):
# the same buckets, the same collectives, so the parameters are bit-identical. Buckets of 10 KB
# (several per tensor set), so the backward is cut in several places; the GPU backends when present.
same_bits() { # label weights-file args...
    label=$1 w=$2
    shift 2
    run "$NP" "$DIR/ov" "$@" --steps 3 --bucket-mb 0.01
    run "$NP" "$DIR/no" "$@" --steps 3 --bucket-mb 0.01 --no-overlap
    cmp -s "$DIR/ov/final/$w" "$DIR/no/final/$w" || fail "$label: the overlapped sum changed the parameters"
    grep -q "hidden behind the backward$" "$DIR/ov.log" || { tail -n 2 "$DIR/ov.log"; fail "$label: the sum was not overlapped"; }
    echo "ok   $label on $NP ranks: overlapped and after-the-backward sums give bit-identical parameters;" \
        "$(sed -n 's/^ranks [0-9]*: //p' "$DIR/ov.log")"
    rm -rf "$DIR/ov" "$DIR/no"
}
same_bits "lora-sft overlap" adapter_model.safetensors --data "$DIR/sft.jsonl" $lora
same_bits "full-sft overlap" model.safetensors --data "$DIR/sft.jsonl" --full --lr 1e-3
same_bits "lora-rl overlap" adapter_model.safetensors --data "$DIR/rl.jsonl" --loss importance_sampling $lora
if [ "$NP" = 2 ]; then
    for dev in opencl:0 vulkan:0; do # every rank on the one device
        if "$TWINKLE" devices 2>/dev/null | grep -q "^${dev%:0}"; then
            same_bits "lora-sft overlap on $dev" adapter_model.safetensors --data "$DIR/sft.jsonl" $lora --device "$dev"
        else
            echo "skip lora-sft overlap on $dev: no such device"
        fi
    done
fi

if [ "$NP" = 2 ]; then # checkpoints cross rank counts: 10 steps, resumed at step 5 on the other count
    w=adapter_model.safetensors
    run 1 "$DIR/a1" --data "$DIR/sft.jsonl" $lora --steps 10 --save-every 5
    run 2 "$DIR/a2" --data "$DIR/sft.jsonl" $lora --steps 5
    run 1 "$DIR/b1" --data "$DIR/sft.jsonl" $lora --steps 10 --resume "$DIR/a2/final"
    run 2 "$DIR/b2" --data "$DIR/sft.jsonl" $lora --steps 10 --resume "$DIR/a1/step-5"
    grep -q resumed "$DIR/b1.log" && grep -q resumed "$DIR/b2.log" || fail "the runs did not resume"
    python3 "$HERE/mpi_params.py" "$DIR/a1/final/$w" "$DIR/b1/final/$w" "$DIR/init/final/$w" "$(tol 10)" \
        "2-rank step-5 checkpoint resumed on 1 rank, step 10"
    python3 "$HERE/mpi_params.py" "$DIR/a1/final/$w" "$DIR/b2/final/$w" "$DIR/init/final/$w" "$(tol 10)" \
        "1-rank step-5 checkpoint resumed on 2 ranks, step 10"
fi

if [ "$NP" = 2 ]; then # a rank killed with SIGKILL mid-run: the process manager ends the job (no hang)
    timeout 60 "$MPIRUN" -np 2 "$TWINKLE" train --model "$MODEL" --data "$DIR/sft.jsonl" $lora --batch-tokens $T \
        --steps 1000000 --out "$DIR/killed" > "$DIR/killed.log" 2>&1 &
    job=$!
    i=0
    until grep -q "step 2/" "$DIR/killed.log" 2>/dev/null; do
        i=$((i + 1))
        [ $i -lt 300 ] || { kill "$job"; fail "the run to be killed did not start"; }
        sleep 0.1
    done
    victim=$(ps -eo pid=,args= | grep "[ ]train --model .* --out $DIR/killed\$" | grep -v "mpirun\|hydra" | awk 'NR == 2 { print $1 }')
    [ -n "$victim" ] || { kill "$job"; fail "no second rank to kill"; }
    kill -9 "$victim"
    rc=0
    wait "$job" || rc=$?
    [ "$rc" != 124 ] || fail "the surviving rank hung after the other was killed"
    [ "$rc" != 0 ] || fail "a killed rank went unnoticed"
    grep -q "BAD TERMINATION" "$DIR/killed.log" || { tail -n 5 "$DIR/killed.log"; fail "no report of the killed rank"; }
    echo "ok   rank process $victim killed with SIGKILL: the job ended (mpirun exit $rc, hydra names the PID)"
fi

if [ "$NP" = 2 ] && [ -n "$FAKE_CUDA" ] && [ -e "$FAKE_CUDA/libcuda.so.1" ]; then
    # the fake driver has one device: --device cuda sends rank 1 to cuda:1, which is refused naming the rank;
    # an explicit --device cuda:0 wins on both ranks
    rc=0
    LD_LIBRARY_PATH="$FAKE_CUDA${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 60 "$MPIRUN" -np 2 "$TWINKLE" train \
        --model "$MODEL" --data "$DIR/sft.jsonl" $lora --batch-tokens $T --steps 1 --device cuda --out "$DIR/cu" \
        > "$DIR/cu.log" 2>&1 || rc=$?
    [ "$rc" != 0 ] && [ "$rc" != 124 ] && grep -q "rank 1 of 2: device_open: .*no index 1" "$DIR/cu.log" ||
        { cat "$DIR/cu.log"; fail "--device cuda under 2 ranks: rank 1 should have asked for cuda:1"; }
    ! grep -q "twinkle train: Qwen3" "$DIR/cu.log" || fail "rank 0 went on after rank 1 failed to start"
    # the fake driver runs every kernel on the host, ~10x slower than the CPU backend and far slower under
    # ASan with the other tests beside it: two short sequences (one per rank) and a longer bound
    head -2 "$DIR/sft.jsonl" > "$DIR/cu.jsonl"
    LD_LIBRARY_PATH="$FAKE_CUDA${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" RUN_S=300 run 2 "$DIR/cu0" --data "$DIR/cu.jsonl" $lora \
        --steps 1 --device cuda:0
    echo "ok   --device cuda: rank 1 asked for cuda:1 (the fake driver has one device; refused naming rank 1);" \
        "--device cuda:0 ran on both ranks"
fi

# bad data on the last rank's share: sampler logprobs of -1e30 make the ratio (and the gradient) infinite
(head -3 "$DIR/rl.jsonl"; echo '{"tokens": [1, 2, 3, 4], "advantages": 1, "logprobs": [-1e30, -1e30, -1e30]}'
 tail -n 8 "$DIR/rl.jsonl") > "$DIR/bad.jsonl"
rc=0
timeout 60 "$MPIRUN" -np "$NP" "$TWINKLE" train --model "$MODEL" --data "$DIR/bad.jsonl" --loss importance_sampling \
    $lora --batch-tokens $T --steps 3 --out "$DIR/bad" > "$DIR/bad.out" 2> "$DIR/bad.err" || rc=$?
[ "$rc" != 124 ] || fail "the ranks hung after one failed"
[ "$rc" != 0 ] || fail "bad data on one rank's share was accepted"
grep "rank" "$DIR/bad.err" > "$DIR/bad.msg" || true
[ "$(wc -l < "$DIR/bad.msg")" = 1 ] || { cat "$DIR/bad.err"; fail "want one message naming the failing rank"; }
grep -q "rank $((NP - 1)) of $NP (step 1, .*gradient at token .* is not finite" "$DIR/bad.msg" ||
    { cat "$DIR/bad.err"; fail "the message does not name rank $((NP - 1)) and the cause"; }
[ ! -e "$DIR/bad/final" ] || fail "a checkpoint was written after the failure"
echo "ok   bad data on rank $((NP - 1))'s share: every rank stopped (exit $rc), one message: $(cat "$DIR/bad.msg")"
