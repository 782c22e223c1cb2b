#!/bin/sh
# `twinkle train` end to end on the qwen3 parity model: the loss falls, a run
# resumed from its step-10 state ends bit-identical to an uninterrupted run,
# the adapter it writes loads back, bad data is refused naming the line, and
# --loss dpo (reference: the base model) drives the pair loss down from log 2, distillation from a
# teacher adapter lowers the reverse KL, and grpo on rollouts moves logprobs the advantages' way.
set -eu
TWINKLE=$1
MODEL=$2
DIR=$(mktemp -d /tmp/twk_cli_train.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
fail() { echo "FAIL $*"; exit 1; }

# 12 random sequences of 8..19 tokens from a 1000-token vocabulary
awk 'BEGIN { srand(7); for (s = 0; s < 12; s++) { n = 8 + int(rand() * 12); line = "{\"tokens\": [";
     for (i = 0; i < n; i++) line = line (i ? ", " : "") int(rand() * 1000); print line "]}" } }' > "$DIR/data.jsonl"

common="--model $MODEL --data $DIR/data.jsonl --batch-tokens 64 --lr 1e-2 --rank 8 --steps 20"
"$TWINKLE" train $common --out "$DIR/a" --save-every 10 > "$DIR/a.log" || { cat "$DIR/a.log"; fail "training run"; }
tail -n 1 "$DIR/a.log"
first=$(sed -n 's/^loss \([0-9.]*\) -> \([0-9.]*\).*/\1/p' "$DIR/a.log")
last=$(sed -n 's/^loss \([0-9.]*\) -> \([0-9.]*\).*/\2/p' "$DIR/a.log")
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l * 5 < f) }' || fail "loss $first -> $last did not fall fivefold"
echo "ok   loss $first -> $last (want 5x lower)"
for f in adapter_config.json adapter_model.safetensors optimizer_state.safetensors; do
    [ -s "$DIR/a/step-10/$f" ] || fail "step-10/$f missing"
    [ -s "$DIR/a/final/$f" ] || fail "final/$f missing"
done
echo "ok   checkpoints at step 10 and the end hold the adapter and optimizer state"

"$TWINKLE" train $common --out "$DIR/b" --resume "$DIR/a/step-10" > "$DIR/b.log" || { cat "$DIR/b.log"; fail "resumed run"; }
cmp -s "$DIR/a/final/adapter_model.safetensors" "$DIR/b/final/adapter_model.safetensors" ||
    fail "resumed run differs from the uninterrupted one"
cmp -s "$DIR/a/final/optimizer_state.safetensors" "$DIR/b/final/optimizer_state.safetensors" ||
    fail "resumed optimizer state differs"
echo "ok   resumed from step 10: final adapter and optimizer state are bit-identical"

echo '{"tokens": [1, 2, 3]}' > "$DIR/bad.jsonl"
echo '{"tokens": [4, 1000, 5]}' >> "$DIR/bad.jsonl"
if "$TWINKLE" train --model "$MODEL" --data "$DIR/bad.jsonl" --out "$DIR/c" > "$DIR/c.log" 2>&1; then fail "bad token accepted"; fi
grep -q "bad.jsonl:2: tokens\[1\]" "$DIR/c.log" || { cat "$DIR/c.log"; fail "message does not name line 2 / tokens[1]"; }
echo "ok   out-of-vocabulary token refused: $(tail -n 1 "$DIR/c.log")"
echo '{"tokens": [4, 5], "weights": [1, "x"]}' > "$DIR/bad2.jsonl"
if "$TWINKLE" train --model "$MODEL" --data "$DIR/bad2.jsonl" --out "$DIR/c" > "$DIR/c.log" 2>&1; then fail "bad weight accepted"; fi
grep -q "weights\[1\]" "$DIR/c.log" || fail "message does not name weights[1]"
echo "ok   non-numeric weight refused: $(tail -n 1 "$DIR/c.log")"
if "$TWINKLE" train --model "$MODEL" --data "$DIR/data.jsonl" --rank 0 > "$DIR/c.log" 2>&1; then fail "rank 0 accepted"; fi
echo "ok   --rank 0 refused: $(tail -n 1 "$DIR/c.log")"

# `twinkle sample` with the adapter just trained: seeded runs repeat, bad input is refused
s1=$("$TWINKLE" sample --model "$MODEL" --adapter "$DIR/a/final" --prompt-tokens 5,6,7 --max-tokens 6 --num-samples 2 --seed 9)
s2=$("$TWINKLE" sample --model "$MODEL" --adapter "$DIR/a/final" --prompt-tokens 5,6,7 --max-tokens 6 --num-samples 2 --seed 9)
[ "$s1" = "$s2" ] || fail "seeded twinkle sample did not repeat"
[ "$(printf '%s\n' "$s1" | grep -c '"stop_reason"')" -eq 2 ] || fail "twinkle sample did not print 2 samples"
echo "ok   twinkle sample with the trained adapter: seeded runs repeat"
if "$TWINKLE" sample --model "$MODEL" --prompt-tokens 5000 > "$DIR/c.log" 2>&1; then fail "an out-of-vocabulary prompt was accepted"; fi
grep -q "vocabulary" "$DIR/c.log" || fail "the message does not name the vocabulary"
echo "ok   out-of-vocabulary prompt refused: $(tail -n 1 "$DIR/c.log")"

# DPO: 4 preference pairs (chosen: counting, rejected: random), prompt masked;
# 40 tokens hold one pair of 22 targets (ungrouped packing would take 3 lines)
awk 'BEGIN { srand(3); for (s = 0; s < 4; s++) { for (side = 0; side < 2; side++) {
     t = "{\"tokens\": ["; w = "\"weights\": [";
     for (i = 0; i < 12; i++) { v = i < 4 ? 10 * s + i : (side ? int(rand() * 1000) : 500 + s + i);
         t = t (i ? ", " : "") v; if (i) w = w (i > 1 ? ", " : "") (i < 4 ? 0 : 1) }
     print t "], " w "]}" } } }' > "$DIR/pairs.jsonl"
"$TWINKLE" train --model "$MODEL" --data "$DIR/pairs.jsonl" --loss dpo --dpo-beta 0.5 --batch-tokens 40 --lr 1e-2 \
    --rank 8 --steps 15 --out "$DIR/d" > "$DIR/d.log" || { cat "$DIR/d.log"; fail "dpo run"; }
first=$(sed -n 's/^loss \([0-9.]*\) -> \([0-9.]*\).*/\1/p' "$DIR/d.log")
last=$(sed -n 's/^loss \([0-9.]*\) -> \([0-9.]*\).*/\2/p' "$DIR/d.log")
awk -v f="$first" 'BEGIN { exit !(f >= 0.6931 && f <= 0.6932) }' || fail "dpo starts at $first, not log 2 (policy = reference)"
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l * 4 < f) }' || fail "dpo loss $first -> $last did not fall fourfold"
echo "ok   twinkle train --loss dpo: loss per pair $first (log 2) -> $last"
head -n 3 "$DIR/pairs.jsonl" > "$DIR/odd.jsonl"
if "$TWINKLE" train --model "$MODEL" --data "$DIR/odd.jsonl" --loss dpo > "$DIR/c.log" 2>&1; then fail "odd pairs accepted"; fi
grep -q "even count" "$DIR/c.log" || { cat "$DIR/c.log"; fail "the message does not explain the pairs"; }
echo "ok   an odd number of preference lines is refused: $(grep "even count" "$DIR/c.log")"

# Distillation: the teacher is the base model with the adapter trained above (run a);
# the student starts at the base model; reverse KL to the teacher's top-4 falls.
"$TWINKLE" train --model "$MODEL" --data "$DIR/data.jsonl" --loss reverse_kl --teacher "$MODEL" \
    --teacher-adapter "$DIR/a/final" --topk 4 --batch-tokens 64 --lr 1e-2 --rank 8 --steps 15 --out "$DIR/k" \
    > "$DIR/k.log" || { cat "$DIR/k.log"; fail "distillation run"; }
first=$(sed -n 's/^loss \([0-9.]*\) -> \([0-9.]*\).*/\1/p' "$DIR/k.log")
last=$(sed -n 's/^loss \([0-9.]*\) -> \([0-9.]*\).*/\2/p' "$DIR/k.log")
awk -v f="$first" -v l="$last" 'BEGIN { exit !(f > 0.05 && l * 3 < f) }' || fail "reverse KL $first -> $last did not fall threefold"
echo "ok   twinkle train --loss reverse_kl --teacher: KL to the teacher's top-4 $first -> $last nats/token"
if "$TWINKLE" train --model "$MODEL" --data "$DIR/data.jsonl" --loss jsd > "$DIR/c.log" 2>&1; then fail "jsd without a teacher accepted"; fi
grep -q "teacher" "$DIR/c.log" || fail "the message does not ask for --teacher"

# RL on rollouts: the sampler's logprobs are the base model's (twinkle score), advantages +1 on
# the first 6 lines and -1 on the rest, the first 3 tokens masked. grpo (with a KL penalty to the
# base model) must raise the positive sequences' logprobs and lower the negative ones'.
"$TWINKLE" score --model "$MODEL" --data "$DIR/data.jsonl" > "$DIR/base.scores" || fail "twinkle score"
python3 - "$DIR/data.jsonl" "$DIR/base.scores" > "$DIR/rollouts.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
scores = [json.loads(l)["logprobs"] for l in open(sys.argv[2])]
for i, (d, lp) in enumerate(zip(lines, scores)):
    n = len(d["tokens"])
    print(json.dumps({"tokens": d["tokens"], "weights": [0.0] * 3 + [1.0] * (n - 4),
                      "logprobs": lp, "advantages": 1.0 if i < 6 else -1.0}))
PY
"$TWINKLE" train --model "$MODEL" --data "$DIR/rollouts.jsonl" --loss grpo --kl-beta 0.05 --batch-tokens 64 --lr 5e-3 \
    --rank 8 --steps 12 --out "$DIR/r" > "$DIR/r.log" || { cat "$DIR/r.log"; fail "grpo run"; }
"$TWINKLE" score --model "$MODEL" --adapter "$DIR/r/final" --data "$DIR/data.jsonl" > "$DIR/rl.scores" || fail "score after rl"
python3 - "$DIR/base.scores" "$DIR/rl.scores" <<'PY' || fail "grpo did not move the sequences the advantages' way"
import json, sys
b = [json.loads(l)["logprobs"] for l in open(sys.argv[1])]
r = [json.loads(l)["logprobs"] for l in open(sys.argv[2])]
delta = [sum(y - x for x, y in zip(u[3:], v[3:])) / len(u[3:]) for u, v in zip(b, r)]
pos, neg = sum(delta[:6]) / 6, sum(delta[6:]) / 6
print(f"ok   twinkle train --loss grpo: mean logprob change {pos:+.3f} (advantage +1) vs {neg:+.3f} (advantage -1)")
sys.exit(0 if pos > 0.05 and neg < -0.05 else 1)
PY
if "$TWINKLE" train --model "$MODEL" --data "$DIR/data.jsonl" --loss ppo --out "$DIR/c" > "$DIR/c.log" 2>&1; then fail "ppo without advantages accepted"; fi
grep -q "data.jsonl:1: field 'advantages' is required by ppo" "$DIR/c.log" || { cat "$DIR/c.log"; fail "the message does not name the line and field"; }
echo "ok   rollouts without advantages refused: $(grep advantages "$DIR/c.log")"

# Mixture of experts (the mixtral parity model, vocabulary 256): LoRA on the attention, the experts
# (PEFT's target_parameters on the fused stacks) and the router; the loss falls, a resumed run is
# bit-identical, the adapter config names the stacks, twinkle sample loads it; router-only LoRA on a
# dense model is refused by name.
MOE=$(dirname "$(dirname "$MODEL")")/mixtral/model
awk 'BEGIN { srand(11); for (s = 0; s < 12; s++) { n = 8 + int(rand() * 12); line = "{\"tokens\": [";
     for (i = 0; i < n; i++) line = line (i ? ", " : "") int(rand() * 256); print line "]}" } }' > "$DIR/moe.jsonl"
moe="--model $MOE --data $DIR/moe.jsonl --batch-tokens 64 --lr 1e-2 --rank 8 --steps 20 --train-router"
"$TWINKLE" train $moe --out "$DIR/m" --save-every 10 > "$DIR/m.log" || { cat "$DIR/m.log"; fail "moe training run"; }
first=$(sed -n 's/^loss \([0-9.]*\) -> \([0-9.]*\).*/\1/p' "$DIR/m.log")
last=$(sed -n 's/^loss \([0-9.]*\) -> \([0-9.]*\).*/\2/p' "$DIR/m.log")
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l * 2 < f) }' || fail "moe loss $first -> $last did not fall twofold"
grep -q '"mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate.weight"' "$DIR/m/final/adapter_config.json" ||
    { cat "$DIR/m/final/adapter_config.json"; fail "the adapter config does not name the experts and the router"; }
echo "ok   twinkle train on mixtral (attention + experts + router): loss $first -> $last"
"$TWINKLE" train $moe --out "$DIR/m2" --resume "$DIR/m/step-10" > "$DIR/m2.log" || { cat "$DIR/m2.log"; fail "moe resumed run"; }
cmp -s "$DIR/m/final/adapter_model.safetensors" "$DIR/m2/final/adapter_model.safetensors" ||
    fail "the resumed moe run differs from the uninterrupted one"
echo "ok   mixtral resumed from step 10: final adapter bit-identical"
"$TWINKLE" sample --model "$MOE" --adapter "$DIR/m/final" --prompt-tokens 5,6,7 --max-tokens 4 > "$DIR/m.samples" ||
    fail "twinkle sample with the moe adapter"
echo "ok   twinkle sample with the expert / router adapter"
"$TWINKLE" export --checkpoint "$DIR/m/final" --merge --out "$DIR/mm" > "$DIR/mm.log" 2>&1 || { cat "$DIR/mm.log"; fail "moe merge"; }
"$TWINKLE" score --model "$MOE" --adapter "$DIR/m/final" --data "$DIR/moe.jsonl" > "$DIR/moe_lora.scores" || fail "moe score"
"$TWINKLE" score --model "$DIR/mm" --data "$DIR/moe.jsonl" > "$DIR/moe_merged.scores" || fail "merged moe score"
"$TWINKLE" score --model "$MOE" --data "$DIR/moe.jsonl" > "$DIR/moe_base.scores" || fail "base moe score"
python3 - "$DIR/moe_lora.scores" "$DIR/moe_merged.scores" "$DIR/moe_base.scores" <<'PY' || fail "the merged moe model differs from base + adapter"
import json, sys
a, b, c = ([json.loads(l)["logprobs"] for l in open(p)] for p in sys.argv[1:4])
diff = lambda u, v: max(abs(x - y) for s, t in zip(u, v) for x, y in zip(s, t) if x is not None and y is not None)
d, moved = diff(a, b), diff(a, c)
print(f"ok   twinkle export --merge of the expert / router adapter: logprobs equal base + adapter to {d:.2g} (the adapter moves them {moved:.2g})")
sys.exit(0 if d < 1e-4 and moved > 0.1 else 1)
PY
if "$TWINKLE" train --model "$MODEL" --data "$DIR/data.jsonl" --no-attn --no-mlp --train-router > "$DIR/c.log" 2>&1; then
    fail "router LoRA on a dense model accepted"; fi
grep -q "train_router need a mixture of experts" "$DIR/c.log" || { cat "$DIR/c.log"; fail "the message does not explain"; }
echo "ok   router-only LoRA on a dense model refused: $(tail -n 1 "$DIR/c.log")"
