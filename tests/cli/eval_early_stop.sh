#!/usr/bin/env bash
# Validation covers the whole split whatever the micro-batch, and --early-stop ends a run on both
# run loops, keeping the best weights:
#  1. char_tiny on 20 kB of text (validation: 2000 bytes = 62 windows of 33, not a multiple of 4
#     or 8): micro-batch 8, 4 x 2 and 2 x 4 (the same global batch) report the same final
#     validation over all 62 windows, the same loss;
#  2. --early-stop 1 with a learning rate that makes the validation loss rise: training stops
#     early, says which step's weights it keeps, the weights file records best_step, and the
#     final validation (whole split = the periodic windows here, whose lines say "all 62
#     windows") equals the best periodic loss;
#  3. the same with --layout tp2pp2 --ranks 4 (tensor x pipeline parallel).
#   tests/cli/eval_early_stop.sh <dir with train_gpt>
set -euo pipefail
bin="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }
head -c 20000 "${LOOM_DATA_DIR:-../shared/data}/tinyshakespeare.txt" > "$work/t.txt"
common=(--data "$work/t.txt" --model char_tiny --log-dir '' --peak-gflops 100 --summary-every 0 --sample-tokens 0)

# 1. the final validation does not depend on the micro-batch
declare -a finals
for mb in "8 1" "4 2" "2 4"; do
  set -- $mb
  "$bin/train_gpt" "${common[@]}" --steps 2 --eval-every 0 --micro-batch "$1" --grad-accum "$2" \
    --out "$work/mb$1.safetensors" > "$work/mb$1.log" || { cat "$work/mb$1.log"; fail "micro-batch $1 run failed"; }
  line=$(grep '^final validation' "$work/mb$1.log") || fail "micro-batch $1: no final validation"
  finals+=("$line")
  [[ "$line" == "final validation (62 windows)"* ]] || fail "micro-batch $1 did not validate all 62 windows: $line"
done
loss() { grep -oP 'val loss \K[0-9.]+' <<< "$1"; }
for k in 1 2; do
  awk -v a="$(loss "${finals[0]}")" -v b="$(loss "${finals[$k]}")" 'BEGIN { d = a - b; exit !(d < 2e-4 && d > -2e-4) }' ||
    fail "final validation depends on the micro-batch: ${finals[0]} vs ${finals[$k]}"
done
echo "micro-batch 8, 4, 2: $(loss "${finals[0]}") $(loss "${finals[1]}") $(loss "${finals[2]}") nats/token over 62 windows"

# 2 and 3. early stopping on both run loops
check_early_stop() {  # check_early_stop NAME LOG WEIGHTS
  local name="$1" log="$2" weights="$3"
  grep -q '^early stop after step [0-9]*: the validation loss has not improved for 1 evaluation' "$log" ||
    { cat "$log"; fail "$name: no early-stop line"; }
  local best stop best_loss final_loss
  best=$(grep -oP 'keeping the best weights, of step \K[0-9]+' "$log" | head -1)
  stop=$(grep -oP '^early stop after step \K[0-9]+' "$log")
  [[ -n "$best" && "$best" -lt "$stop" ]] || fail "$name: best step '$best' is not before the stop at $stop"
  (( stop < 40 )) || fail "$name: did not stop early ($stop of 40 steps)"
  best_loss=$(grep -oP "^step $best \| val loss \K[0-9.]+" "$log")
  grep -q "^step $best | val loss .* | all 62 windows\$" "$log" ||
    fail "$name: the periodic validation line does not say it covers all 62 windows: $(grep "^step $best | val" "$log")"
  final_loss=$(grep -oP '^final validation.*val loss \K[0-9.]+' "$log")
  awk -v a="$best_loss" -v b="$final_loss" 'BEGIN { d = a - b; exit !(d < 2e-3 && d > -2e-3) }' ||
    fail "$name: final validation $final_loss is not the best evaluation's $best_loss (step $best)"
  python3 - "$weights" "$best" <<'EOF' || fail "$name: the weights do not record best_step $best"
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    meta = json.loads(f.read(n)).get("__metadata__", {})
sys.exit(0 if meta.get("best_step") == sys.argv[2] else 1)
EOF
  echo "$name: stopped after step $stop, kept step $best (val loss $best_loss = final $final_loss)"
}
stop_flags=(--steps 40 --eval-every 4 --early-stop 1 --lr 0.3 --warmup 0 --min-lr 0.3 --max-grad-norm 0)
"$bin/train_gpt" "${common[@]}" "${stop_flags[@]}" --out "$work/es.safetensors" > "$work/es.log" 2>&1 ||
  { cat "$work/es.log"; fail "early-stop run failed"; }
check_early_stop "one layout" "$work/es.log" "$work/es.safetensors"
"$bin/train_gpt" "${common[@]}" "${stop_flags[@]}" --layout tp2pp2 --ranks 4 --grad-accum 2 --micro-batch 4 \
  --out "$work/es_layout.safetensors" > "$work/es_layout.log" 2>&1 || { cat "$work/es_layout.log"; fail "--layout early-stop run failed"; }
check_early_stop "--layout tp2pp2" "$work/es_layout.log" "$work/es_layout.safetensors"
echo "3 passed, 0 failed"
