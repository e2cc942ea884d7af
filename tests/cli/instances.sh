#!/usr/bin/env bash
# Every compiled train_gpt instance as a user runs it (train_gpt --list-instances): for each one
# of char_tiny, quickstart and quickstart_bpe (every precision and layout compiled for them; byte
# ids for quickstart_bpe too), 2 steps with a checkpoint every step, a profile window, a Hugging
# Face export and a sample; the run must end
# with "final validation", write its trace and export, then a resumed run continues the
# checkpoint on one rank (tp1pp1, resharded from the instance's layout) for one more step.
# Each instance runs over --comm threads with TP*PP ranks (DP 1); one tp2pp2 instance also with DP 2
# and --zero1.
#   tests/cli/instances.sh <dir with train_gpt>
set -u
bin="$1"
t="$bin/train_gpt"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail=0
pass=0
bad() { echo "FAILED: $*"; fail=$((fail + 1)); }
data="$work/data.txt"
head -c 40000 "${LOOM_DATA_DIR:-../shared/data}/tinyshakespeare.txt" > "$data"
export OMP_NUM_THREADS=1

run_instance() {  # model precision layout attention dp [extra flags...]
  local model="$1" prec="$2" layout="$3" attn="$4" dp="$5"; shift 5
  local tp="${layout#tp}"; tp="${tp%pp*}"; local pp="${layout#*pp}"
  local ranks=$((tp * pp * dp)) name="$model-$prec-$layout-$attn-dp$dp$*"
  name="${name// /_}"
  local d="$work/$name"
  mkdir -p "$d"
  local common=(--data "$data" --model "$model" --precision "$prec" --layout "$layout" --attention "$attn"
                --ranks "$ranks" --steps 2 --grad-accum "$pp" --micro-batch 1 --seq-len 32 --eval-every 1
                --eval-windows 2 --profile-steps 1:2 --log-dir "$d/logs" --out "$d/w.safetensors" --sample-tokens 8
                --summary-every 0 --peak-gflops 1)
  if ! "$t" "${common[@]}" --save-every 1 --checkpoint-dir "$d/ckpt" --export-hf "$d/hf" "$@" > "$d/run.txt" 2>&1; then
    bad "$name: $(tail -3 "$d/run.txt")"; return
  fi
  for want in "final validation" "---- sample" "trace of steps 1:2" "exported Hugging Face"; do
    grep -q -- "$want" "$d/run.txt" || { bad "$name: no '$want' in its output"; cat "$d/run.txt"; return; }
  done
  [[ -s "$d/logs/trace.json" && -s "$d/hf/model.safetensors" ]] || { bad "$name: no trace.json or export"; return; }
  # resume on one rank (resharded from the instance's layout), one more step
  if ! "$t" --data "$data" --model "$model" --precision "$prec" --attention "$attn" --steps 3 --micro-batch 1 \
       --seq-len 32 --eval-every 0 --resume "$d/ckpt" --log-dir '' --out "$d/w2.safetensors" --sample-tokens 0 \
       --peak-gflops 1 > "$d/resume.txt" 2>&1; then
    bad "$name resumed on tp1pp1: $(tail -3 "$d/resume.txt")"; return
  fi
  grep -q "resumed from .*step_00000002: step 2" "$d/resume.txt" || { bad "$name: no resume line"; cat "$d/resume.txt"; return; }
  pass=$((pass + 1))
}

while read -r model prec layout device attn _; do
  [[ "$device" == cpu ]] || continue
  case "$model" in
    char_tiny|quickstart|quickstart_bpe) run_instance "$model" "$prec" "$layout" "$attn" 1 ;;
  esac
done < <("$t" --list-instances | sed -n '2,/^compiled on first use/p' | grep '^  ')
run_instance char_tiny fp32 tp2pp2 fused 2 --zero1    # DP 2 on top, ZeRO-1
# --list-instances narrowed by the flags given: only matching lines, at least one, fewer than all
compiled() { "$t" --list-instances "$@" | sed -n '2,/^compiled on first use/p' | grep '^  '; }
all="$(compiled)"
some="$(compiled --model char_tiny --precision bf16)"
if [[ -n "$some" && $(wc -l <<< "$some") -lt $(wc -l <<< "$all") ]] && ! grep -vq '^  char_tiny bf16 ' <<< "$some"; then
  pass=$((pass + 1))
else
  bad "--list-instances --model char_tiny --precision bf16 listed: $some"
fi
echo "$pass passed, $fail failed"
[[ $fail == 0 && $pass -ge 20 ]]
