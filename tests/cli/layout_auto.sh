#!/usr/bin/env bash
# --layout auto as a user runs it (quickstart, fp32, 4 ranks as threads, global batch 64):
# - examples/plan --layout auto ranks every candidate; the smallest footprint without
#   recomputation and the smallest with it bound a limit that only recomputation meets;
# - train_gpt --layout auto --memory-limit <that limit> chooses a recompute mode, trains 2 steps
#   with it and prints the chosen layout; its banner shows the chosen recompute mode;
# - a limit nothing meets exits 2 naming the smallest footprint and the --memory-limit that
#   reaches it; --layout auto without --memory-limit, --memory-limit without --layout auto and a
#   malformed size exit 2 naming the flag.
#   tests/cli/layout_auto.sh <dir with train_gpt and plan>
set -euo pipefail
bin="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
data="${LOOM_DATA_DIR:-../shared/data}/tinyshakespeare.txt"
export OMP_NUM_THREADS=4
"$bin/plan" --model quickstart --layout auto --ranks 4 --global-batch 64 --memory-limit 1TiB --show 1000 \
  > "$work/all.txt"
limit=$(python3 - "$work/all.txt" <<'PY'
import re, sys
rows = re.findall(r"^plan: \w[\w-]* (\S+ x dp \d+, micro-batch \d+ x accum \d+, recompute (\w+)[^:]*): ([0-9.]+) MiB", open(sys.argv[1]).read(), re.M)
assert len(rows) > 10, rows
none = min(float(r[2]) for r in rows if r[1] == "none")
rec = min(float(r[2]) for r in rows if r[1] != "none")
assert rec < none, (rec, none)
print(f"{(rec + none) / 2:.1f}MiB")
PY
)
echo "a limit only recomputation meets: $limit"
"$bin/train_gpt" --data "$data" --model quickstart --ranks 4 --layout auto --memory-limit "$limit" --global-batch 64 \
  --steps 2 --eval-every 0 --sample-tokens 0 --log-dir '' --peak-gflops 100 --out "$work/w.safetensors" > "$work/run.txt"
grep -E "^train_gpt: chosen .*recompute (selective|full)" "$work/run.txt" ||
  { echo "train_gpt did not choose recomputation:"; cat "$work/run.txt"; exit 1; }
grep -E "activations .*\(recompute (selective|full)\)" "$work/run.txt" ||
  { echo "the run did not train with recomputation:"; cat "$work/run.txt"; exit 1; }
grep -q "^step 1/2" "$work/run.txt" || { echo "no training steps:"; cat "$work/run.txt"; exit 1; }

expect_error() {  # the message it must contain, then train_gpt's flags
  local want="$1"; shift
  if "$bin/train_gpt" --data "$data" --steps 2 "$@" > "$work/err.txt" 2>&1; then
    echo "expected an error for $*"; cat "$work/err.txt"; exit 1
  fi
  local rc=0; "$bin/train_gpt" --data "$data" --steps 2 "$@" > /dev/null 2>&1 || rc=$?
  [[ $rc == 2 ]] || { echo "exit status $rc (not 2) for $*"; exit 1; }
  grep -qF -- "$want" "$work/err.txt" || { echo "message for $* lacks '$want':"; cat "$work/err.txt"; exit 1; }
}
expect_error "nothing fits 10 MiB per rank: the smallest footprint is" --model quickstart --ranks 4 --layout auto \
  --memory-limit 10MiB
grep -qE -- "pass --memory-limit [0-9]+MiB or more" "$work/err.txt" || { cat "$work/err.txt"; exit 1; }
expect_error "--layout auto needs --memory-limit" --layout auto
expect_error "--memory-limit is for --layout auto" --memory-limit 1GiB
expect_error "--memory-limit '24G' is not a size" --layout auto --memory-limit 24G
echo "layout auto: recomputation chosen under $limit; refusals name the fix"
