#!/usr/bin/env bash
# The main job in miniature: train char_tiny for 60 steps on real text, check that the loss
# fell and the validation report, the weights and the logs beside them (the default --log-dir)
# exist, then sample from the weights (the same seed gives the same text twice; a different
# seed gives other text).
#   tests/cli/train_then_sample.sh <dir with train_gpt and sample>
set -euo pipefail
bin="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
data="${LOOM_DATA_DIR:-../shared/data}/tinyshakespeare.txt"

"$bin/train_gpt" --data "$data" --model char_tiny --steps 60 --eval-every 30 --lr 3e-3 \
  --out "$work/w.safetensors" --sample-tokens 50 > "$work/log.txt"
first=$(grep -m1 -oP '^step +0/60 \| loss \K[0-9.]+' "$work/log.txt")
last=$(grep -oP '^step +59/60 \| loss \K[0-9.]+' "$work/log.txt")
grep -q 'final validation' "$work/log.txt"
grep -q 'bits/byte' "$work/log.txt"
[[ -s "$work/w.safetensors" ]]
[[ -s "$work/logs/metrics.jsonl" ]] || { echo "no metrics.jsonl in logs/ beside --out (the default --log-dir)"; exit 1; }
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }' ||
  { echo "loss did not fall enough: $first -> $last"; cat "$work/log.txt"; exit 1; }
s1=$("$bin/sample" --weights "$work/w.safetensors" --prompt "ROMEO:" --tokens 80 --seed 3)
s2=$("$bin/sample" --weights "$work/w.safetensors" --prompt "ROMEO:" --tokens 80 --seed 3)
s3=$("$bin/sample" --weights "$work/w.safetensors" --prompt "ROMEO:" --tokens 80 --seed 4)
[[ "$s1" == "$s2" && "$s1" != "$s3" && "$s1" == ROMEO:* ]] || { echo "sampling not reproducible"; exit 1; }
echo "loss $first -> $last; sample: ${s1:0:60}"
echo "1 passed, 0 failed"
