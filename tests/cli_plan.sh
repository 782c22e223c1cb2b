#!/bin/sh
# `twinkle plan` and the start-up memory check of `twinkle train`: the weights line of
# Qwen3-8B's table (bench/models/qwen3-8b, config.json only) equals the parameter count
# computed here from the config's numbers; a configuration that cannot fit is refused
# with the table before any weight is read; --recompute trains to bit-identical files; under a
# TWK_MEM_BUDGET between the totals with and without recompute, train turns recompute on by itself
# (bit-identical again), above both it stays off, below both train and serve refuse with the table.
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

# Recompute chosen by itself under a memory budget (TWK_MEM_BUDGET caps the device's memory, the
# CPU's RAM here): budgets derived from twinkle plan's own totals for 512 tokens, without and with
# recompute (rounded to 0.1 of their unit, so each total is known within +-0.05 units).
bytes_of() { # "8.4 MiB" -> "lo hi" bytes
    echo "$1" | awk '{ u = $2 == "GiB" ? 1073741824 : $2 == "MiB" ? 1048576 : $2 == "KiB" ? 1024 : 1;
        d = $2 == "B" ? 0.5 : 0.05; printf "%.0f %.0f\n", ($1 - d) * u, ($1 + d) * u }'
}
total_of() { sed -n 's/^  total *\([0-9.]* [A-Za-z]*\).*/\1/p' "$1"; }
"$TWINKLE" plan --model "$MODEL" --tokens 512 --rank 8 --device cpu > "$DIR/p_plain.txt" || fail "plan 512 tokens"
"$TWINKLE" plan --model "$MODEL" --tokens 512 --rank 8 --recompute --device cpu > "$DIR/p_rc.txt" || fail "plan 512 tokens, recompute"
set -- $(bytes_of "$(total_of "$DIR/p_plain.txt")") $(bytes_of "$(total_of "$DIR/p_rc.txt")")
plain_lo=$1 plain_hi=$2 rc_lo=$3 rc_hi=$4
[ "$rc_hi" -lt "$plain_lo" ] || fail "recompute does not lower the planned total ($(total_of "$DIR/p_rc.txt") vs $(total_of "$DIR/p_plain.txt"))"
tight=$(( (rc_hi + plain_lo) / 2 )) roomy=$(( plain_hi * 2 )) tiny=$(( rc_lo / 2 ))
echo "     512 tokens: planned total $(total_of "$DIR/p_plain.txt"), with recompute $(total_of "$DIR/p_rc.txt");" \
     "budgets $tight (between), $roomy (above), $tiny (below both) bytes"
if TWK_MEM_BUDGET=$tight "$TWINKLE" plan --model "$MODEL" --tokens 512 --rank 8 --device cpu > "$DIR/p_tight.txt"; then
    fail "plan: $tight bytes held the plan without recompute"
fi
grep -q "^does not fit: .*(TWK_MEM_BUDGET)" "$DIR/p_tight.txt" || { cat "$DIR/p_tight.txt"; fail "plan: the refusal does not name TWK_MEM_BUDGET"; }
TWK_MEM_BUDGET=$tight "$TWINKLE" plan --model "$MODEL" --tokens 512 --rank 8 --recompute --device cpu > "$DIR/p_tight_rc.txt" ||
    { cat "$DIR/p_tight_rc.txt"; fail "plan: $tight bytes did not hold the plan with recompute"; }
grep -q "^fits cpu:0 (.*, TWK_MEM_BUDGET)" "$DIR/p_tight_rc.txt" || fail "plan: the fits line does not name the budget"
echo "ok   plan under TWK_MEM_BUDGET=$tight: $(tail -n 1 "$DIR/p_tight.txt"); with --recompute: $(tail -n 1 "$DIR/p_tight_rc.txt")"
if TWK_MEM_BUDGET=lots "$TWINKLE" plan --model "$MODEL" --tokens 512 --device cpu > "$DIR/p_bad.txt" 2>&1; then fail "TWK_MEM_BUDGET=lots accepted"; fi
grep -q "TWK_MEM_BUDGET='lots' is not a size" "$DIR/p_bad.txt" || { cat "$DIR/p_bad.txt"; fail "a bad budget is not named"; }
echo "ok   a bad budget is refused: $(tail -n 1 "$DIR/p_bad.txt")"
for b in "1.5GiB 1.5 GiB" "96k 96.0 KiB"; do
    set -- $b
    TWK_MEM_BUDGET=$1 "$TWINKLE" plan --model "$MODEL" --tokens 1 --rank 1 --device cpu > "$DIR/p_unit.txt" || true
    grep -q "[ (]$2 $3[ ,].*TWK_MEM_BUDGET" "$DIR/p_unit.txt" || { cat "$DIR/p_unit.txt"; fail "TWK_MEM_BUDGET=$1 is not $2 $3"; }
done
echo "ok   budget units: 1.5GiB and 96k read as 1.5 GiB and 96.0 KiB"

common="--model $MODEL --data $DIR/data.jsonl --batch-tokens 512 --lr 1e-2 --rank 8 --steps 2"
TWK_MEM_BUDGET=$roomy "$TWINKLE" train $common --out "$DIR/roomy" > "$DIR/roomy.log" || { cat "$DIR/roomy.log"; fail "run under $roomy bytes"; }
grep -q "activation recompute is on" "$DIR/roomy.log" && fail "recompute turned on although the step fits $roomy bytes without it"
echo "ok   train under TWK_MEM_BUDGET=$roomy: recompute stays off"
TWK_MEM_BUDGET=$tight "$TWINKLE" train $common --out "$DIR/tight" > "$DIR/tight.log" || { cat "$DIR/tight.log"; fail "run under $tight bytes"; }
grep -q "^activation recompute is on: a step fits cpu:0 only with it" "$DIR/tight.log" ||
    { cat "$DIR/tight.log"; fail "recompute was not chosen under $tight bytes"; }
cmp -s "$DIR/roomy/final/adapter_model.safetensors" "$DIR/tight/final/adapter_model.safetensors" ||
    fail "the run with recompute chosen differs from the one without"
echo "ok   train under TWK_MEM_BUDGET=$tight: $(grep '^activation recompute' "$DIR/tight.log"); adapter bit-identical to the run without"
if TWK_MEM_BUDGET=$tiny "$TWINKLE" train $common --out "$DIR/tiny" > "$DIR/tiny.log" 2>&1; then fail "train ran under $tiny bytes"; fi
grep -q "does not fit: cpu:0 needs .*(TWK_MEM_BUDGET)" "$DIR/tiny.log" && grep -q "^  activations (arena peak, recompute)" "$DIR/tiny.log" &&
    grep -q "^  total" "$DIR/tiny.log" || { cat "$DIR/tiny.log"; fail "train under $tiny bytes: no refusal with the recompute table"; }
[ -e "$DIR/tiny" ] && fail "the refused run wrote $DIR/tiny"
echo "ok   train under TWK_MEM_BUDGET=$tiny refused with the table: $(head -n 1 "$DIR/tiny.log")"
if TWK_MEM_BUDGET=$tiny "$TWINKLE" serve --model "$MODEL" --max-context 512 --port 0 --data-dir "$DIR/srv2" > "$DIR/serve2.log" 2>&1; then
    fail "serve started under $tiny bytes"
fi
grep -q "cannot be served" "$DIR/serve2.log" && grep -q "TWK_MEM_BUDGET" "$DIR/serve2.log" && grep -q "^  total" "$DIR/serve2.log" ||
    { cat "$DIR/serve2.log"; fail "serve under $tiny bytes: no refusal with the table"; }
echo "ok   serve under TWK_MEM_BUDGET=$tiny refused: $(grep TWK_MEM_BUDGET "$DIR/serve2.log" | head -n 1)"
