#!/usr/bin/env bash
# train_gpt --layout as a user runs it: tensor and pipeline parallel (with data parallel on top)
# give the losses of one rank on the same global batch. char_tiny, 6 steps, threads:
#   --layout tp2pp2 --ranks 4 --grad-accum 4   (TP=2, PP=2, DP=1)
#   --layout tp2pp2 --ranks 8 --grad-accum 2   (DP=2: each replica half of the global batch)
#   --layout tp2pp1 --ranks 2, --layout tp1pp2 --ranks 2
#   --layout tp2pp1 --ranks 4 --grad-accum 2, with and without --zero1 (bitwise the same losses;
#   the ZeRO-1 rank holds half the optimizer memory)
# all equal `--layout tp1pp1 --ranks 1 --grad-accum 4` within 1e-5 relative (train/loss and the
# final val/loss of metrics.jsonl); one run samples from the gathered weights; bad layouts exit
# with status 2 and a message; a tp2pp2 checkpoint resumes bit for bit on tp2pp2 and within 1e-5
# on one rank (resharded). 16-bit (tp2pp2, char_tiny): bf16 on tp2pp2 within 2^-7 relative of bf16
# on one rank; fp16 (dynamic loss scaler) stopped at step 3 resumes on tp2pp2 bit for bit (losses,
# loss scales, scaler state, weights). The tp2pp2 run profiles steps 2:4: one trace.json with a
# track per rank holding its kernels, its tp all-reduces and pipeline send/recv of one (B,T,C)
# activation (tests/cli/check_trace.py). examples/plan's stage-0 row for tp2pp2 and for tp2pp1 x
# dp 2 with ZeRO-1 equals the memory rank 0 printed. Given mpiexec (and its flags), also the 3D case under MPI:
# `mpiexec -n 8 train_gpt --comm mpi --layout tp2pp2 --grad-accum 2` (profiled too: the ranks'
# traces travel to rank 0 over MPI), and ZeRO-1 on the dp groups of
# `mpiexec -n 4 train_gpt --comm mpi --layout tp2pp1 --grad-accum 2 --zero1`.
#   tests/cli/layout.sh <dir with train_gpt> [mpiexec [mpiexec flags...]]
set -euo pipefail
bin="$1"
shift
mpiexec=("$@")
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
data="${LOOM_DATA_DIR:-../shared/data}/tinyshakespeare.txt"
common=(--data "$data" --steps 6 --eval-every 0 --summary-every 0 --peak-gflops 100
        --micro-batch 4 --out "$work/w.safetensors")

run() {  # name, then flags
  local name="$1"; shift
  "$@" "${common[@]}" --model char_tiny --log-dir "$work/$name" > "$work/$name.txt" 2>&1 ||
    { echo "run $name failed:"; cat "$work/$name.txt"; exit 1; }
}
# the same numbers within 1e-5 relative (or $3): train/loss of every step and the final val/loss
same() {
  python3 - "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" "${3:-1e-5}" <<'PY'
import json, sys
tol = float(sys.argv[3])
def read(p):
    train, val = {}, None
    for line in open(p):
        j = json.loads(line)
        if "train/loss" in j: train[j["step"]] = j["train/loss"]
        if "val/loss" in j: val = j["val/loss"]
    return train, val
(a, va), (b, vb) = read(sys.argv[1]), read(sys.argv[2])
assert len(a) == 6 and a.keys() == b.keys(), (a, b)
worst = max(abs(a[k] / b[k] - 1) for k in a)
assert va is not None and vb is not None and abs(va / vb - 1) <= tol, (va, vb)
assert worst <= tol, (worst, a, b)
print(f"{sys.argv[1].split('/')[-2]}: losses {[round(a[k], 5) for k in sorted(a)]}, val {va:.5f}, worst relative {worst:.1e}")
PY
}

tg=("$bin/train_gpt")
OMP_NUM_THREADS=1 run one "${tg[@]}" --grad-accum 4 --sample-tokens 0
OMP_NUM_THREADS=4 run tp2pp2 "${tg[@]}" --layout tp2pp2 --ranks 4 --grad-accum 4 --sample-tokens 40 --profile-steps 2:4
OMP_NUM_THREADS=8 run tp2pp2dp2 "${tg[@]}" --layout tp2pp2 --ranks 8 --grad-accum 2 --sample-tokens 0
OMP_NUM_THREADS=2 run tp2pp1 "${tg[@]}" --layout tp2pp1 --ranks 2 --grad-accum 4 --sample-tokens 0
OMP_NUM_THREADS=2 run tp1pp2 "${tg[@]}" --layout tp1pp2 --ranks 2 --grad-accum 4 --sample-tokens 0
OMP_NUM_THREADS=4 run tp2pp1dp2 "${tg[@]}" --layout tp2pp1 --ranks 4 --grad-accum 2 --sample-tokens 0
OMP_NUM_THREADS=4 run tp2pp1dp2z "${tg[@]}" --layout tp2pp1 --ranks 4 --grad-accum 2 --sample-tokens 0 --zero1
[[ "$(grep -o '"train/loss":[^,}]*' "$work/tp2pp1dp2/metrics.jsonl")" == \
   "$(grep -o '"train/loss":[^,}]*' "$work/tp2pp1dp2z/metrics.jsonl")" ]] ||
  { echo "tp2pp1 x dp 2: --zero1 changed the losses"; exit 1; }
grep -q 'data parallel 2 with ZeRO-1' "$work/tp2pp1dp2z.txt" || { echo "no ZeRO-1 in the layout line"; cat "$work/tp2pp1dp2z.txt"; exit 1; }
python3 - "$work/tp2pp1dp2/metrics.jsonl" "$work/tp2pp1dp2z/metrics.jsonl" <<'PY'
import json, sys
opt = [next(json.loads(l)["memory/optimizer_mib"] for l in open(p) if "memory/optimizer_mib" in l) for p in sys.argv[1:]]
assert abs(opt[1] / opt[0] - 0.5) < 0.02, opt  # rank 0 holds 1/DP of its cell's moments
print(f"tp2pp1 x dp 2: optimizer memory of rank 0 {opt[0]:.4f} MiB, with --zero1 {opt[1]:.4f} MiB")
PY
# examples/plan before the run: its stage-0 row equals the memory rank 0 printed (2 decimals)
plan_matches() {  # run name, then plan's flags
  local name="$1"; shift
  "$bin/plan" --model char_tiny --micro-batch 4 --peak-gflops 100 "$@" > "$work/$name.plan" 2>&1 ||
    { echo "plan for $name failed:"; cat "$work/$name.plan"; exit 1; }
  python3 - "$work/$name.txt" "$work/$name.plan" <<'PY'
import re, sys
run, plan = open(sys.argv[1]).read(), open(sys.argv[2]).read()
m = re.search(r"parameters ([0-9.]+) MiB, gradients ([0-9.]+) MiB, optimizer ([0-9.]+) MiB(?:, dp buckets ([0-9.]+) MiB)?, activations ([0-9.]+) MiB", run)
row = re.search(r"^\| 0 \| (.*) \|$", plan, re.M)
assert m and row, (run, plan)
p, g, master, moments, act, buckets, total = (float(x) for x in row.group(1).split(" | "))
got = {"parameters": float(m[1]), "gradients": float(m[2]), "optimizer": float(m[3]), "activations": float(m[5])}
want = {"parameters": p, "gradients": g, "optimizer": master + moments, "activations": act}
assert all(abs(got[k] - want[k]) <= 0.011 for k in got), (got, want)
if m[4]: assert abs(float(m[4]) - buckets) <= 0.011, (m[4], buckets)
print(f"{sys.argv[1].split('/')[-1]}: plan equals rank 0's memory {want}")
PY
}
OMP_NUM_THREADS=4 plan_matches tp2pp2 --layout tp2pp2 --ranks 4 --grad-accum 4
OMP_NUM_THREADS=4 plan_matches tp2pp1dp2z --layout tp2pp1 --ranks 4 --grad-accum 2 --zero1
# a layout that cannot split the model: plan says so (as train_gpt does), not "add an instance"
rc=0; "$bin/plan" --model quickstart --layout tp4pp1 --ranks 4 --peak-gflops 100 > "$work/badplan.txt" 2>&1 || rc=$?
[[ $rc == 2 ]] && grep -q 'not divisible by TP=4' "$work/badplan.txt" && ! grep -q LOOM_EXTRA_SESSIONS "$work/badplan.txt" ||
  { echo "plan --layout tp4pp1 on 6 heads: exit $rc"; cat "$work/badplan.txt"; exit 1; }
for r in tp2pp2 tp2pp2dp2 tp2pp1 tp1pp2 tp2pp1dp2z; do
  same "$r" one
  [[ $(grep -c '^model ' "$work/$r.txt") == 1 ]] || { echo "$r: more than one rank printed"; cat "$work/$r.txt"; exit 1; }
done
grep -q 'layout tp2pp2 x dp 2 = 8 ranks' "$work/tp2pp2dp2.txt"
grep -q -- '---- sample' "$work/tp2pp2.txt" || { echo "no sample"; cat "$work/tp2pp2.txt"; exit 1; }
# the profile: 4 pids, 2 steps each; activations (micro-batch 4 x seq 32 x width 32 fp32) between stages
act=$((4 * 32 * 32 * 4))
grep -q 'trace of steps 2:4 (4 ranks) written to' "$work/tp2pp2.txt" || { echo "no trace message"; cat "$work/tp2pp2.txt"; exit 1; }
python3 "$(dirname "$0")/check_trace.py" "$work/tp2pp2/trace.json" 4 2 --p2p $act \
  --comm all_reduce:tp:$act --comm send:pp:$act --comm recv:pp:$act

# checkpoints: tp2pp2 stopped after step 3 (a collective save: one file per (tp, pp)) and resumed
# on tp2pp2 gives the uninterrupted run's numbers and weights bit for bit; the same checkpoint
# resumed on one rank (--layout tp1pp1: resharded on load) gives them within 1e-5.
OMP_NUM_THREADS=4 run ck1 "${tg[@]}" --layout tp2pp2 --ranks 4 --grad-accum 4 --sample-tokens 0 \
  --checkpoint-dir "$work/ckpt" --stop-at-step 3
ls "$work/ckpt/step_00000003/model-tp01-pp01.safetensors" > /dev/null
cp -r "$work/ckpt" "$work/ckpt1"
OMP_NUM_THREADS=4 run ck2 "${tg[@]}" --layout tp2pp2 --ranks 4 --grad-accum 4 --sample-tokens 0 --resume "$work/ckpt"
cp "$work/w.safetensors" "$work/w.resumed.safetensors"
OMP_NUM_THREADS=4 run whole "${tg[@]}" --layout tp2pp2 --ranks 4 --grad-accum 4 --sample-tokens 0
cmp "$work/w.safetensors" "$work/w.resumed.safetensors" || { echo "tp2pp2 resume: final weights differ"; exit 1; }
grep -q 'resumed from .*step_00000003: step 3' "$work/ck2.txt" || { echo "no resume message"; cat "$work/ck2.txt"; exit 1; }
mkdir -p "$work/joined"
grep -v '"val/loss"' "$work/ck1/metrics.jsonl" | cat - "$work/ck2/metrics.jsonl" > "$work/joined/metrics.jsonl"
[[ "$(grep '"train/loss"' "$work/joined/metrics.jsonl" | grep -o '"train/loss":[^,}]*')" == \
   "$(grep '"train/loss"' "$work/whole/metrics.jsonl" | grep -o '"train/loss":[^,}]*')" ]] ||
  { echo "tp2pp2 resume: losses differ"; exit 1; }
OMP_NUM_THREADS=1 run ck3 "${tg[@]}" --grad-accum 4 --sample-tokens 0 --resume "$work/ckpt1"
grep -q 'resharded onto tp = 1, pp = 1' "$work/ck3.txt" || { echo "no resharding warning"; cat "$work/ck3.txt"; exit 1; }
mkdir -p "$work/resharded"
grep -v '"val/loss"' "$work/ck1/metrics.jsonl" | cat - "$work/ck3/metrics.jsonl" > "$work/resharded/metrics.jsonl"
same resharded whole
echo "checkpoints: tp2pp2 resumes bit for bit; resharded onto one rank within 1e-5"

# 16-bit layouts. bf16: the two runs round differently (each row-parallel partial product is
# rounded to bf16 before the fp32 all-reduce), so activations differ by O(u), u = 2^-8, and the
# loss by O(u) relative; 2^-7 = 2u bounds it (unit test "parallel_trainer bf16": measured 2.2e-4).
OMP_NUM_THREADS=1 run one_bf16 "${tg[@]}" --grad-accum 4 --sample-tokens 0 --precision bf16
OMP_NUM_THREADS=4 run tp2pp2_bf16 "${tg[@]}" --layout tp2pp2 --ranks 4 --grad-accum 4 --sample-tokens 0 --precision bf16
same tp2pp2_bf16 one_bf16 0.0078125
# fp16 with the dynamic loss scaler: stopped after step 3 and resumed, bit for bit; the resumed
# run took 3 steps, so a growth_tracker of 6 proves the scaler state came back from the checkpoint
f16=(--layout tp2pp2 --ranks 4 --grad-accum 4 --sample-tokens 0 --precision fp16)
OMP_NUM_THREADS=4 run f16_whole "${tg[@]}" "${f16[@]}" --checkpoint-dir "$work/f16a"
cp "$work/w.safetensors" "$work/w.f16_whole.safetensors"
OMP_NUM_THREADS=4 run f16_1 "${tg[@]}" "${f16[@]}" --checkpoint-dir "$work/f16b" --stop-at-step 3
OMP_NUM_THREADS=4 run f16_2 "${tg[@]}" "${f16[@]}" --resume "$work/f16b"
cmp "$work/w.safetensors" "$work/w.f16_whole.safetensors" || { echo "fp16 tp2pp2 resume: final weights differ"; exit 1; }
python3 "$(dirname "$0")/check_fp16_resume.py" "fp16 tp2pp2 resume" "$work/f16_whole/metrics.jsonl" \
  "$work/f16_1/metrics.jsonl" "$work/f16_2/metrics.jsonl" "$work/f16a" "$work/f16b"

if (( ${#mpiexec[@]} )); then
  OMP_NUM_THREADS=1 run mpi "${mpiexec[@]}" -n 8 "$bin/train_gpt" --comm mpi --layout tp2pp2 --grad-accum 2 --sample-tokens 0 \
    --profile-steps 2:4
  same mpi one
  python3 "$(dirname "$0")/check_trace.py" "$work/mpi/trace.json" 8 2 --p2p $act --comm all_reduce:tp:$act \
    --comm all_reduce:dp:'*'
  OMP_NUM_THREADS=1 run mpizero "${mpiexec[@]}" -n 4 "$bin/train_gpt" --comm mpi --layout tp2pp1 --grad-accum 2 \
    --sample-tokens 0 --zero1
  same mpizero one
fi

expect_status_2() {  # expected message, then the flags (--model char_tiny unless given)
  local want="$1"; shift
  set +e
  local model=(--model char_tiny)
  [[ " $* " == *" --model "* ]] && model=()
  OMP_NUM_THREADS=1 "$bin/train_gpt" "${common[@]}" "${model[@]}" --log-dir '' --sample-tokens 0 "$@" > "$work/bad.txt" 2>&1
  local rc=$?
  set -e
  [[ $rc == 2 ]] && grep -q -- "$want" "$work/bad.txt" ||
    { echo "expected status 2 and '$want' for $*, got $rc:"; cat "$work/bad.txt"; exit 1; }
}
expect_status_2 "needs a multiple of TP\*PP = 4" --layout tp2pp2 --ranks 6
expect_status_2 "needs a multiple of TP\*PP = 4" --layout tp2pp2
expect_status_2 "2 attention heads, not divisible by TP=4" --layout tp4pp1 --ranks 4
# the model check comes before the world-size check: tp3 names what does not divide, not --ranks 3
expect_status_2 "not divisible by TP=3" --model quickstart_bpe --layout tp3pp1 --ranks 2
expect_status_2 "not of the form tp<TP>pp<PP>" --layout tp2 --ranks 2
# a combination the build lacks, where no compiler can run (a toolchain file naming none), names
# the CMake setting that compiles it into the build (tests/cli/on_demand.sh compiles such ones)
printf '{"compiler": "/nonexistent/c++", "flags": [], "include_root": "/nonexistent"}\n' > "$work/nocompiler.json"
export LOOM_TOOLCHAIN_FILE="$work/nocompiler.json"
expect_status_2 "is not compiled into this program.*-DLOOM_EXTRA_SESSIONS=quickstart_bpe/fp32/tp1pp4/cpu/fused" \
  --model quickstart_bpe --layout tp1pp4 --ranks 4
expect_status_2 "LOOM_EXTRA_SESSIONS=quickstart/fp32/tp2pp1/cpu/fused" --model quickstart --layout tp2pp1 --ranks 2
expect_status_2 "LOOM_EXTRA_SESSIONS=char_tiny/bf16/tp2pp1/cpu/fused" --layout tp2pp1 --ranks 2 --precision bf16
expect_status_2 "LOOM_EXTRA_SESSIONS=quickstart_bpe/fp16/tp2pp2/cpu/fused" --model quickstart_bpe --layout tp2pp2 --ranks 4 \
  --precision fp16
unset LOOM_TOOLCHAIN_FILE
echo "1 passed, 0 failed"
