#!/usr/bin/env bash
# The main job with --device ascend, end to end, on loom's host emulation of CANN (ASCEND_HOME_PATH
# is <build>/ascend_emulation, set by CTest: nothing here runs on an NPU). prepare_data writes a
# SentencePiece dataset; for fp32 (--allow-fp32-matmul) and bf16, on one rank and on two
# (--ranks 2: data parallel over HCCL, bootstrapped over the threads communicator):
#   - train_gpt --device ascend trains quickstart_bpe 20 steps with a checkpoint every 5 and
#     samples; its loss at every step tracks the same run with --device cpu (relative 1e-3 for
#     fp32, 2e-2 for bf16, inside verify::tolerance_of's 3e-2 for a bf16 activation);
#   - a run resumed from step 15 repeats steps 15..19 of the first run exactly (printed losses),
#     and on one rank the CPU run's checkpoint resumed on the NPU tracks the CPU run;
#   - sample reads the trained weights on the CPU.
# Every other Ascend instance of the build trains two steps and samples. Then, from the
# emulation's counters (LOOMEMU_COUNTERS_FILE): one host wait per step (the gradient norm, which
# brings the loss), and the batch copied from the loader's pinned buffer on the copy stream while
# the compute stream still ran the previous step (h2d_copies_beside_work); the profile
# window (trace and CANN profiler), the device-time breakdown and NPU memory in the logs; bad
# input: fp32 without --allow-fp32-matmul, no runtime, a layout the build lacks where no compiler runs.
# The rank-table launch: two processes with RANK_TABLE_FILE and RANK_ID 0 / 1 (--comm hccl, nothing
# shared but the emulation's HCCL) train bitwise the losses of --ranks 2 and save a checkpoint
# that --ranks 2 resumes; its refusals name the fix.
#   tests/cli/ascend.sh <dir with prepare_data, train_gpt and sample> <emulation home> [part]
# part: fp32 or bf16 (the training, resume and sample checks of that precision), rank_table, rest
# (everything else), or all (the default); CTest runs the parts as tests, side by side.
set -u
bin="$1"
home="$2"
part="${3:-all}"
case "$part" in fp32 | bf16 | rank_table | rest | all) ;;
  *) echo "ascend.sh: part '$part' is not fp32, bf16, rank_table, rest or all"; exit 2 ;;
esac
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
export ASCEND_HOME_PATH="$home"
fail=0
bad() { echo "FAILED: $*"; fail=$((fail + 1)); }
finish() { [[ $fail == 0 ]] && echo "all passed" && exit 0; echo "$fail failed"; exit 1; }
losses() { grep -oP '^step +\d+/\d+ \| loss \K[0-9.]+' "$1" | tr '\n' ' '; }

head -n 2000 "${LOOM_DATA_DIR:-../shared/data}/tinyshakespeare.txt" > "$work/text.txt"
"$bin/prepare_data" --input "$work/text.txt" --output-prefix "$work/ds" --vocab-size 500 --threads 2 \
  > "$work/prep.txt" 2>&1 || { cat "$work/prep.txt"; echo "FAILED: prepare_data"; exit 1; }

base=(--data "$work/ds" --model quickstart_bpe --micro-batch 2 --seq-len 16 --log-every 1 --val-fraction 0.003
      --eval-windows 4 --peak-gflops 1)
common=("${base[@]}" --log-dir '' --summary-every 0)
precisions=()
[[ $part == all || $part == fp32 ]] && precisions+=(fp32)
[[ $part == all || $part == bf16 ]] && precisions+=(bf16)
for prec in "${precisions[@]}"; do
  tol=$([[ $prec == fp32 ]] && echo 1e-3 || echo 2e-2)
  opt=$([[ $prec == fp32 ]] && echo --allow-fp32-matmul || true)
  for ranks in 1 2; do
    name="$prec-ranks$ranks"
    d="$work/$name"
    mkdir -p "$d"
    if ! "$bin/train_gpt" "${common[@]}" --steps 20 --eval-every 10 --precision "$prec" --ranks "$ranks" --device ascend $opt \
         --checkpoint-dir "$d/ckpt" --save-every 5 --out "$d/w.safetensors" --sample-tokens 16 \
         > "$d/npu.txt" 2>&1; then
      bad "$name: $(tail -3 "$d/npu.txt")"; continue
    fi
    "$bin/train_gpt" "${common[@]}" --steps 20 --eval-every 10 --precision "$prec" --ranks "$ranks" --device cpu \
      --out "$d/cpu.safetensors" --checkpoint-dir "$d/cpu-ckpt" --save-every 5 --sample-tokens 0 > "$d/cpu.txt" 2>&1 ||
      { bad "$name on cpu: $(tail -3 "$d/cpu.txt")"; continue; }
    grep -q "| ascend $prec, fused attention |" "$d/npu.txt" || bad "$name: the banner does not say ascend $prec"
    grep -q "^NPU memory of rank 0 (caching allocator): " "$d/npu.txt" || bad "$name: no NPU memory line"
    grep -q -- "---- sample" "$d/npu.txt" || bad "$name: no sample"
    [[ -d "$d/ckpt/step_00000015" && -d "$d/ckpt/step_00000020" ]] || bad "$name: checkpoints 15 and 20 missing"
    read -r -a a <<< "$(losses "$d/npu.txt")"
    read -r -a c <<< "$(losses "$d/cpu.txt")"
    [[ ${#a[@]} == 20 && ${#c[@]} == 20 ]] || { bad "$name: ${#a[@]} and ${#c[@]} step lines, not 20"; continue; }
    worst=$(for i in $(seq 0 19); do echo "${a[$i]} ${c[$i]}"; done |
            awk '{ d = ($1 - $2) / $2; if (d < 0) d = -d; if (d > w) w = d } END { printf "%.2e", w }')
    echo "$name: losses ${a[0]} -> ${a[19]} (cpu ${c[0]} -> ${c[19]}), worst relative difference $worst (bound $tol)"
    awk -v w="$worst" -v t="$tol" 'BEGIN { exit !(w <= t) }' || bad "$name: NPU loss differs from cpu by $worst > $tol"
    awk -v a="${a[0]}" -v b="${a[19]}" 'BEGIN { exit !(b < a - 0.5) }' || bad "$name: loss did not fall: ${a[0]} -> ${a[19]}"
    # resume from step 15 (checkpoints go to a copy, its step 20 moved aside): steps 15..19 again, the same losses
    cp -r "$d/ckpt" "$d/ckpt2"
    if ! "$bin/train_gpt" "${common[@]}" --steps 20 --eval-every 10 --precision "$prec" --ranks "$ranks" --device ascend $opt \
         --resume "$d/ckpt2/step_00000015" --discard-newer-checkpoints --out "$d/w2.safetensors" --sample-tokens 0 > "$d/resume.txt" 2>&1; then
      bad "$name resumed: $(tail -3 "$d/resume.txt")"; continue
    fi
    grep -q "resumed from .*step_00000015: step 15" "$d/resume.txt" || bad "$name: no resume line"
    read -r -a r <<< "$(losses "$d/resume.txt")"
    [[ "${r[*]}" == "${a[*]:15}" ]] || bad "$name: resumed losses '${r[*]}' != '${a[*]:15}'"
    # the CPU run's checkpoint resumed on the NPU: its steps 15..19 within the tolerance
    if [[ $ranks == 1 ]]; then
      "$bin/train_gpt" "${common[@]}" --steps 20 --precision "$prec" --device ascend $opt --no-device-timing \
        --resume "$d/cpu-ckpt/step_00000015" --checkpoint-dir "$d/cross-ckpt" \
        --out "$d/w3.safetensors" --sample-tokens 0 > "$d/cross.txt" 2>&1 || bad "$name cpu -> ascend: $(tail -3 "$d/cross.txt")"
      read -r -a x <<< "$(losses "$d/cross.txt")"
      [[ ${#x[@]} == 5 ]] || bad "$name cpu -> ascend: ${#x[@]} step lines, not 5"
      for i in $(seq 0 4); do
        awk -v a="${x[$i]}" -v b="${c[$((i + 15))]}" -v t="$tol" 'BEGIN { d = (a - b) / b; exit !(d <= t && -d <= t) }' ||
          bad "$name cpu -> ascend: step $((i + 15)) loss ${x[$i]} vs cpu ${c[$((i + 15))]}"
      done
    fi
    "$bin/sample" --weights "$d/w.safetensors" --tokenizer "$work/ds.model" --prompt "ROMEO:" --tokens 16 \
      > "$d/sample.txt" 2>&1 || bad "$name: sample failed: $(tail -2 "$d/sample.txt")"
  done
done

[[ $part == fp32 || $part == bf16 ]] && finish

if [[ $part == all || $part == rank_table ]]; then
  # a one-server rank table of two NPUs (device_id 3 and 5: the table, not the rank, names the NPU)
  cat > "$work/hccl.json" <<'JSON'
{"status": "completed", "version": "1.0", "server_count": "1",
 "server_list": [{"server_id": "node_0", "device": [
   {"device_id": "3", "device_ip": "192.168.1.8", "rank_id": "0"},
   {"device_id": "5", "device_ip": "192.168.1.9", "rank_id": "1"}]}]}
JSON
  rt=("${common[@]}" --steps 8 --eval-every 4 --precision bf16 --device ascend --sample-tokens 0)
  for r in 0 1; do
    RANK_TABLE_FILE="$work/hccl.json" RANK_ID=$r HCCL_CONNECT_TIMEOUT=60 "$bin/train_gpt" "${rt[@]}" --comm hccl \
      --checkpoint-dir "$work/rt-ckpt" --save-every 4 --out "$work/rt.safetensors" > "$work/rt$r.txt" 2>&1 &
  done
  wait %1; s0=$?
  wait %2; s1=$?
  "$bin/train_gpt" "${rt[@]}" --ranks 2 --out "$work/thr.safetensors" > "$work/thr.txt" 2>&1 ||
    bad "--ranks 2 on the NPU: $(tail -3 "$work/thr.txt")"
  if [[ $s0 == 0 && $s1 == 0 ]]; then
    read -r -a a <<< "$(losses "$work/rt0.txt")"
    read -r -a b <<< "$(losses "$work/thr.txt")"
    echo "rank table: losses ${a[*]}"
    [[ ${#a[@]} == 8 && "${a[*]}" == "${b[*]}" ]] || bad "rank-table losses '${a[*]}' != --ranks 2 '${b[*]}'"
    grep -q "^data parallel: 2 ranks (hccl)" "$work/rt0.txt" || bad "rank 0 does not say 2 ranks over hccl: $(head -8 "$work/rt0.txt")"
    [[ -d "$work/rt-ckpt/step_00000004" && -d "$work/rt-ckpt/step_00000008" ]] || bad "rank table: checkpoints 4 and 8 missing"
    # its checkpoint resumed by --ranks 2: steps 4..7 again, the same losses
    "$bin/train_gpt" "${rt[@]}" --ranks 2 --resume "$work/rt-ckpt/step_00000004" --discard-newer-checkpoints --out "$work/thr2.safetensors" \
      > "$work/thr2.txt" 2>&1 || bad "--ranks 2 resuming the rank-table checkpoint: $(tail -3 "$work/thr2.txt")"
    read -r -a c <<< "$(losses "$work/thr2.txt")"
    [[ "${c[*]}" == "${a[*]:4}" ]] || bad "resumed losses '${c[*]}' != rank-table steps 4..7 '${a[*]:4}'"
  else
    bad "rank-table launch: rank 0 $s0: $(tail -3 "$work/rt0.txt"); rank 1 $s1: $(tail -3 "$work/rt1.txt")"
  fi
  # refusals, before any NPU is touched
  check_refusal() {  # <expected text> <env...> -- <flags...>
    local want="$1"; shift
    local envs=()
    while [[ $1 != -- ]]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]}" "$bin/train_gpt" --data "$work/ds" --model quickstart_bpe --steps 1 "$@" > "$work/rr.txt" 2>&1
    [[ $? == 2 ]] && grep -q -- "$want" "$work/rr.txt" || bad "refusal '$want': $(cat "$work/rr.txt")"
  }
  check_refusal "pass --device ascend" RANK_TABLE_FILE="$work/hccl.json" RANK_ID=0 -- --comm hccl
  check_refusal "drop --ranks" RANK_TABLE_FILE="$work/hccl.json" RANK_ID=0 -- --comm hccl --device ascend --precision bf16 --ranks 2
  check_refusal "RANK_TABLE_FILE is not set" RANK_TABLE_FILE= RANK_ID=0 -- --comm hccl --device ascend --precision bf16
  check_refusal "set RANK_ID (or RANK)" RANK_TABLE_FILE="$work/hccl.json" RANK_ID=2 -- --comm hccl --device ascend --precision bf16
  [[ $part == rank_table ]] && finish
fi

# host waits (aclrtSynchronize*) and synchronous copies per step of one rank: the difference of a
# 7- and a 2-step run (LOOMEMU_COUNTERS_FILE), with the device-time breakdown (its events are
# read a step late: no wait of its own)
for steps in 2 7; do
  LOOMEMU_COUNTERS_FILE="$work/counters-$steps.txt" "$bin/train_gpt" "${common[@]}" --steps "$steps" \
    --eval-every 0 --precision bf16 --device ascend --out "$work/c.safetensors" --sample-tokens 0 \
    > "$work/c$steps.txt" 2>&1 || bad "counted run: $(tail -2 "$work/c$steps.txt")"
done
count() { grep -oP "\b$1 \K\d+" "$work/counters-$2.txt" 2>/dev/null || echo 0; }
per_step() { echo $(( ($(count "$1" 7) - $(count "$1" 2)) / 5 )); }
waits=$(per_step host_waits) copies=$(per_step sync_copies) behind=$(per_step h2d_copies_behind_work)
beside=$(( $(count h2d_copies_beside_work 7) - $(count h2d_copies_beside_work 2) ))
echo "per step on one NPU: $waits host waits, $copies synchronous copies, $behind batch copies queued behind" \
     "compute on its stream; in 5 steps $beside batch copies ran on the copy stream beside computation"
(( $(count host_waits 7) > 0 )) || bad "no counters written (LOOMEMU_COUNTERS_FILE)"
# one wait: the gradient norm's readback, which brings the losses copied out before it
(( waits == 1 )) || bad "$waits host waits per step; expected 1 (the gradient norm, with the loss)"
(( copies <= 1 )) || bad "$copies synchronous copies per step > 1 (the batch is pageable?)"
# the batch goes from the loader's pinned buffer on the copy stream, not behind the compute stream
(( behind == 0 )) || bad "$behind batch copies per step were queued on the compute stream"
# the step returns with the optimizer still queued: the next step's copy runs beside it
(( beside >= 1 )) || bad "no batch copy ran beside the previous step's work ($beside in 5 steps)"

# every other Ascend instance compiled in (train_gpt --list-instances): two steps and a sample
while read -r model prec layout device attn _; do
  [[ "$device" == ascend && "$model" != quickstart_bpe ]] || continue
  data="$work/ds"
  [[ "$model" == quickstart ]] && data="$work/text.txt"
  opt=$([[ $prec == fp32 ]] && echo --allow-fp32-matmul || true)
  "$bin/train_gpt" --data "$data" --model "$model" --precision "$prec" --layout "$layout" --device ascend $opt \
    --steps 2 --micro-batch 1 --seq-len 16 --eval-every 0 --val-fraction 0.003 --log-dir '' --peak-gflops 1 \
    --sample-tokens 4 --out "$work/i.safetensors" > "$work/i.txt" 2>&1 && grep -q -- "---- sample" "$work/i.txt" ||
    bad "instance $model $prec $layout ascend: $(tail -3 "$work/i.txt")"
done < <("$bin/train_gpt" --list-instances | sed -n '2,/^compiled on first use/p' | grep '^  ')

# observability on the NPU: the profile window (trace.json and the CANN profiler), the device-time
# breakdown in the summary, the NPU allocator in the JSON log
if "$bin/train_gpt" "${base[@]}" --steps 5 --eval-every 0 --precision bf16 --device ascend --profile-steps 2:4 \
     --log-dir "$work/logs" --summary-every 5 --out "$work/p.safetensors" --sample-tokens 0 > "$work/p.txt" 2>&1; then
  grep -q "CANN profiler data under $work/logs/cann_profile" "$work/p.txt" || bad "no CANN profiler line: $(cat "$work/p.txt")"
  [[ -s "$work/logs/trace.json" && -d "$work/logs/cann_profile" ]] || bad "no trace.json or cann_profile/"
  grep -q '"memory/npu_peak_mib"' "$work/logs/metrics.jsonl" || bad "no NPU memory in metrics.jsonl"
  grep -qE "^  forward +[0-9.]+ " "$work/p.txt" || bad "no breakdown in the summary: $(cat "$work/p.txt")"
else
  bad "profiled run: $(tail -3 "$work/p.txt")"
fi

# bad input
"$bin/train_gpt" --data "$work/ds" --model quickstart_bpe --device ascend --steps 1 > "$work/b1.txt" 2>&1
[[ $? == 2 ]] && grep -q -- "--allow-fp32-matmul" "$work/b1.txt" || bad "fp32 without the opt-in: $(cat "$work/b1.txt")"
ASCEND_HOME_PATH="$work/none" LD_LIBRARY_PATH='' "$bin/train_gpt" --data "$work/ds" --model quickstart_bpe \
  --device ascend --precision bf16 --steps 1 > "$work/b2.txt" 2>&1
[[ $? == 2 ]] && grep -q "examples/doctor" "$work/b2.txt" && ! grep -q "^model " "$work/b2.txt" ||
  bad "no runtime: $(cat "$work/b2.txt")"
printf '{"compiler": "/nonexistent/c++", "flags": [], "include_root": "/nonexistent"}\n' > "$work/nocompiler.json"
LOOM_TOOLCHAIN_FILE="$work/nocompiler.json" \
"$bin/train_gpt" --data "$work/ds" --model quickstart_bpe --device ascend --precision bf16 --layout tp2pp2 --ranks 4 \
  --steps 1 > "$work/b3.txt" 2>&1
[[ $? == 2 ]] && grep -q "LOOM_EXTRA_SESSIONS=quickstart_bpe/bf16/tp2pp2/ascend/fused" "$work/b3.txt" ||
  bad "uncompiled layout: $(cat "$work/b3.txt")"
# NPUs that are not there (the emulation has 8)
for args in "--npu 8" "--ranks 9"; do
  "$bin/train_gpt" --data "$work/text.txt" --model quickstart --device ascend --precision bf16 $args --steps 1 \
    > "$work/b4.txt" 2>&1
  [[ $? == 2 ]] && grep -q "8 NPUs are visible" "$work/b4.txt" && ! grep -q "^model " "$work/b4.txt" ||
    bad "$args: $(cat "$work/b4.txt")"
done
# a CANN outside loom's statement, and a deterministic mode HCCL_DETERMINISTIC contradicts
LOOMEMU_CANN_VERSION=7.0.0 "$bin/train_gpt" --data "$work/text.txt" --model quickstart --device ascend \
  --precision bf16 --steps 1 > "$work/b5.txt" 2>&1
[[ $? == 2 ]] && grep -q "the installed CANN is 7.0.0" "$work/b5.txt" && ! grep -q "^model " "$work/b5.txt" ||
  bad "CANN 7.0: $(cat "$work/b5.txt")"
HCCL_DETERMINISTIC=false "$bin/train_gpt" --data "$work/text.txt" --model quickstart --device ascend \
  --precision bf16 --deterministic-mode --steps 1 > "$work/b6.txt" 2>&1
[[ $? == 2 ]] && grep -q "unset it or set it to true" "$work/b6.txt" || bad "HCCL_DETERMINISTIC=false: $(cat "$work/b6.txt")"
# --deterministic-mode on two NPUs: said in the banner, the losses of the default mode (the
# emulation's operators are deterministic either way)
for mode in "" --deterministic-mode; do
  "$bin/train_gpt" --data "$work/text.txt" --model quickstart --device ascend --precision bf16 --ranks 2 --steps 3 \
    --eval-every 0 --sample-tokens 0 $mode --out "$work/det$mode.safetensors" > "$work/det$mode.txt" 2>&1 ||
    bad "deterministic '$mode': $(tail -3 "$work/det$mode.txt")"
done
grep -q "^deterministic mode: ACL_OPT_DETERMINISTIC on every NPU's context, HCCL_DETERMINISTIC=true" \
  "$work/det--deterministic-mode.txt" || bad "no deterministic banner: $(head -8 "$work/det--deterministic-mode.txt")"
[[ "$(losses "$work/det.txt")" == "$(losses "$work/det--deterministic-mode.txt")" && -n "$(losses "$work/det.txt")" ]] ||
  bad "deterministic losses differ: $(losses "$work/det.txt") / $(losses "$work/det--deterministic-mode.txt")"
finish
