#!/bin/sh
# `twinkle plan` and the start-up memory check of `twinkle train`: the weights line of
# Qwen3-8B's table (bench/models/qwen3-8b, config.json only) equals the parameter count
# computed here from the config's numbers; a configuration that cannot fit is refused
# with the table before any weight is read; --recompute trains to bit-identical files.
set -eu
TWINKLE=$1
MODEL=$2
BENCH8B=$3
DIR=$(mktemp -d /tmp/twk_cli_plan.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
fail() { echo "FAIL $*"; exit 1; }

"$TWINKLE" plan --model "$BENCH8B" --tokens 4096 --rank 32 --dtype bf16 > "$DIR/plan.txt" || fail "twinkle plan"
cat "$DIR/plan.txt"
# Qwen3-8B: vocab 151936, hidden 4096, 36 layers, q 32x128, kv 8x128, ffn 12288, untied lm_head,
# q_norm / k_norm of 128, bf16 (2 bytes); the RoPE table is 64 f32
want=$(awk 'BEGIN { V = 151936; H = 4096; L = 36; Q = 32 * 128; K = 8 * 128; F = 12288; D = 128;
  layer = H + H * Q + 2 * H * K + Q * H + 2 * D + H + 3 * H * F; n = 2 * V * H + L * layer + H;
  b = 2 * n + 64 * 4; printf "%.1f GiB", b / 1024 / 1024 / 1024 }')
got=$(sed -n 's/^  weights (bf16) *\([0-9.]* [A-Za-z]*\).*/\1/p' "$DIR/plan.txt")
[ "$got" = "$want" ] || fail "weights line '$got', the config's parameters give '$want'"
echo "ok   Qwen3-8B bf16 weights: $got (from the config's numbers: $want)"
# the adapter: r * (in + out) per module, 7 modules a layer, f32
want=$(awk 'BEGIN { H = 4096; Q = 32 * 128; K = 8 * 128; F = 12288; r = 32;
  a = r * ((H + Q) + 2 * (H + K) + (Q + H) + 2 * (H + F) + (F + H)); printf "%.1f MiB", 36 * a * 4 / 1024 / 1024 }')
got=$(sed -n 's/^  LoRA adapter (rank 32, f32) *\([0-9.]* [A-Za-z]*\).*/\1/p' "$DIR/plan.txt")
[ "$got" = "$want" ] || fail "adapter line '$got', want '$want'"
echo "ok   Qwen3-8B rank-32 adapter: $got (want $want)"

"$TWINKLE" plan --model "$BENCH8B" --tokens 4096 --rank 32 > "$DIR/plan_default.txt" || fail "twinkle plan without --dtype"
grep -q "^  weights (bf16)" "$DIR/plan_default.txt" || { cat "$DIR/plan_default.txt"; fail "no --dtype: not the config's torch_dtype (bfloat16)"; }
echo "ok   no --dtype: planned in the config's torch_dtype (bf16)"
"$TWINKLE" plan --model "$MODEL" --tokens 64 --rank 8 --device cpu > "$DIR/fix.txt" || { cat "$DIR/fix.txt"; fail "plan on the fixture"; }
grep -q "^fits cpu:0" "$DIR/fix.txt" || fail "the fixture's plan does not say it fits"
echo "ok   $(tail -n 1 "$DIR/fix.txt")"
if "$TWINKLE" plan --model "$MODEL" --tokens 64 --dtype f8 > "$DIR/bad.txt" 2>&1; then fail "--dtype f8 accepted"; fi
grep -q "dtype" "$DIR/bad.txt" || fail "the message does not name --dtype"
echo "ok   bad dtype refused: $(cat "$DIR/bad.txt")"

echo '{"tokens": [1, 2, 3, 4]}' > "$DIR/d.jsonl"
if "$TWINKLE" train --model "$BENCH8B" --data "$DIR/d.jsonl" --batch-tokens 1000000 --out "$DIR/x" > "$DIR/big.log" 2>&1; then
    fail "a configuration beyond the machine's memory was accepted"
fi
grep -q "does not fit" "$DIR/big.log" && grep -q "^  total" "$DIR/big.log" || { cat "$DIR/big.log"; fail "no refusal with the table"; }
grep -q "safetensors" "$DIR/big.log" && fail "weights were looked for before the memory check"
echo "ok   train refuses at start-up with the table: $(head -n 1 "$DIR/big.log")"

awk 'BEGIN { srand(3); for (s = 0; s < 8; s++) { n = 8 + int(rand() * 12); line = "{\"tokens\": [";
     for (i = 0; i < n; i++) line = line (i ? ", " : "") int(rand() * 1000); print line "]}" } }' > "$DIR/data.jsonl"
common="--model $MODEL --data $DIR/data.jsonl --batch-tokens 64 --lr 1e-2 --rank 8 --steps 4"
"$TWINKLE" train $common --out "$DIR/a" > "$DIR/a.log" || { cat "$DIR/a.log"; fail "run without recompute"; }
"$TWINKLE" train $common --recompute --out "$DIR/b" > "$DIR/b.log" || { cat "$DIR/b.log"; fail "run with recompute"; }
cmp -s "$DIR/a/final/adapter_model.safetensors" "$DIR/b/final/adapter_model.safetensors" || fail "recompute changed the adapter"
cmp -s "$DIR/a/final/optimizer_state.safetensors" "$DIR/b/final/optimizer_state.safetensors" || fail "recompute changed the moments"
echo "ok   4 steps with --recompute: adapter and optimizer state bit-identical to the run without"

if "$TWINKLE" serve --model "$BENCH8B" --max-context 65536 --port 0 --data-dir "$DIR/srv" > "$DIR/serve.log" 2>&1; then
    fail "serve started a model beyond the machine's memory"
fi
grep -q "cannot be served" "$DIR/serve.log" && grep -q "^  total" "$DIR/serve.log" || { cat "$DIR/serve.log"; fail "serve: no refusal with the table"; }
grep -q "safetensors" "$DIR/serve.log" && fail "serve looked for weights before the memory check"
echo "ok   serve refuses at start-up with the table: $(tail -n 1 "$DIR/serve.log")"
