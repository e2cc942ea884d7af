#!/usr/bin/env bash
# Bad input to the examples: each case must exit non-zero with one line on stderr that names
# the problem (checked by a pattern), never a crash or a stack trace; and nothing on disk
# may be damaged (an existing weights file or dataset survives a failed run, and is kept by a
# later one; sample refuses a tokenizer other than the one its weights were trained with).
#   tests/cli/bad_input.sh <dir with train_gpt and sample>
set -u
bin="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail=0
pass=0

expect_error() {  # expect_error <pattern> <command...>
  local pattern="$1"; shift
  local err status
  err="$("$@" 2>&1 >/dev/null)"; status=$?
  local lines; lines=$(printf '%s\n' "$err" | grep -c .)
  if [[ $status -ne 0 && $status -lt 128 && "$err" =~ $pattern && $lines -eq 1 ]]; then
    pass=$((pass + 1))
  else
    echo "FAILED: $* -> status $status, stderr: $err (wanted one line matching /$pattern/)"
    fail=$((fail + 1))
  fi
}

expect_refusal() {  # expect_refusal <pattern> <command...>: exit 2, one stderr line, nothing on stdout
  local pattern="$1"; shift
  local out err status
  out="$("$@" 2>"$work/stderr")"; status=$?
  err="$(cat "$work/stderr")"
  local lines; lines=$(printf '%s\n' "$err" | grep -c .)
  if [[ $status -eq 2 && "$err" =~ $pattern && $lines -eq 1 && -z "$out" ]]; then
    pass=$((pass + 1))
  else
    echo "FAILED: $* -> status $status, stdout ${#out} bytes, stderr: $err (wanted status 2, no output, one line matching /$pattern/)"
    fail=$((fail + 1))
  fi
}

unchanged() {  # unchanged <what> <file> <sha256 before>
  if [[ "$(sha256sum < "$2")" == "$3" ]]; then
    pass=$((pass + 1))
  else
    echo "FAILED: $1 changed $2"
    fail=$((fail + 1))
  fi
}

printf 'hello\0world' > "$work/binary.txt"
: > "$work/empty.txt"
printf 'To be, or not to be' > "$work/short.txt"
printf '\xff\xfe\xfd not utf8 %.0s' {1..100} > "$work/latin1.txt"
head -c 20000 "${LOOM_DATA_DIR:-../shared/data}/tinyshakespeare.txt" > "$work/ok.txt"
mkdir "$work/dir.txt"

t="$bin/train_gpt"
expect_error "does not exist" "$t" --data "$work/missing.txt" --model char_tiny --steps 1
expect_error "is empty" "$t" --data "$work/empty.txt" --model char_tiny --steps 1
expect_error "not UTF-8" "$t" --data "$work/binary.txt" --model char_tiny --steps 1
expect_error "not UTF-8" "$t" --data "$work/latin1.txt" --model char_tiny --steps 1
expect_error "is a directory" "$t" --data "$work/dir.txt" --model char_tiny --steps 1
expect_error "too short" "$t" --data "$work/short.txt" --model char_tiny --steps 1
expect_error "exceeds the maximum sequence length 32" "$t" --data "$work/ok.txt" --model char_tiny --seq-len 33
expect_error "nothing would be recorded" "$t" --data "$work/ok.txt" --model char_tiny --steps 3 --profile-steps 50:60
# a micro-batch above the compiled capacity compiles an instance on first use (tests/cli/on_demand.sh)
expect_error "outside \[1, 8\]" "$t" --data "$work/ok.txt" --model char_tiny --micro-batch -1
expect_error "not expected|--bogus" "$t" --data "$work/ok.txt" --bogus
expect_error "--stpes: did you mean --steps\?" "$t" --data "$work/ok.txt" --stpes 3
expect_error "--micro_batch: did you mean --micro-batch\?" "$t" --data "$work/ok.txt" --micro_batch=2
expect_error "--steps" "$t" --data "$work/ok.txt" --steps abc
expect_error "^train_gpt: error: --micro-batch / --micro-batch-size: 'abc' is not a whole number; pass a whole number" "$t" --data "$work/ok.txt" --micro-batch-size abc
expect_error "--model" "$t" --data "$work/ok.txt" --model gpt5
expect_error "required" "$t"
expect_error "learning rate" "$t" --data "$work/ok.txt" --model char_tiny --lr -1
expect_error "--steps: '0' is not a whole number >= 1" "$t" --data "$work/ok.txt" --model char_tiny --steps 0
expect_error "--steps: '-5' is not a whole number >= 1" "$t" --data "$work/ok.txt" --model char_tiny --steps -5
expect_error "--early-stop 3 .*--eval-every is 0.*pass e.g. --eval-every" "$t" --data "$work/ok.txt" --model char_tiny --early-stop 3 --eval-every 0
expect_error "--early-stop" "$t" --data "$work/ok.txt" --model char_tiny --early-stop -2
expect_error "--eval-windows" "$t" --data "$work/ok.txt" --model char_tiny --eval-windows 0
expect_error "--warmup 50 exceeds --steps 10" "$t" --data "$work/ok.txt" --model char_tiny --steps 10 --warmup 50
expect_error "--eval-every" "$t" --data "$work/ok.txt" --model char_tiny --eval-every -1
expect_error "--seed" "$t" --data "$work/ok.txt" --model char_tiny --seed -1
expect_error "--max-grad-norm" "$t" --data "$work/ok.txt" --model char_tiny --max-grad-norm -1
expect_error "--time-budget" "$t" --data "$work/ok.txt" --model char_tiny --time-budget -5
expect_error "--allow-fp32-matmul is for --device ascend" "$t" --data "$work/ok.txt" --model char_tiny --allow-fp32-matmul
expect_error "--allow-fp32-matmul is for --precision fp32" "$t" --data "$work/ok.txt" --device ascend --precision bf16 --allow-fp32-matmul
expect_error "--dropout 0.1 with --device ascend.*--dropout 0, or --device cpu" "$t" --data "$work/ok.txt" --device ascend --precision bf16 --dropout 0.1
expect_error "--npu 1 with --ranks 2" "$t" --data "$work/ok.txt" --device ascend --precision bf16 --ranks 2 --npu 1
expect_error "--recompute: block not in .none,selective,full." "$t" --data "$work/ok.txt" --model char_tiny --recompute block
expect_error "--dropout 1 is not a dropout probability.*0 <= p < 1" "$t" --data "$work/ok.txt" --model char_tiny --dropout 1
expect_error "--dropout -0.1 is not a dropout probability" "$t" --data "$work/ok.txt" --model char_tiny --dropout -0.1
expect_error "--out '.*' is a directory.*model.safetensors" "$t" --data "$work/ok.txt" --model char_tiny --steps 1 --out "$work/"
expect_error "--eval-every 250 >= --steps 20 leaves no evaluation" "$t" --data "$work/ok.txt" --model char_tiny --steps 20 --early-stop 2
cp "$work/ok.txt" "$work/ok.copy"
expect_error "--out '.*ok.txt' is one of the run's --data files.*model.safetensors" "$t" --data "$work/ok.txt" \
  --model char_tiny --steps 1 --out "$work/ok.txt"
printf 'notes' > "$work/notes.md"
expect_error "--out '.*notes.md' exists and is not a .safetensors file" "$t" --data "$work/ok.txt" --model char_tiny \
  --steps 1 --out "$work/notes.md"
cmp -s "$work/ok.txt" "$work/ok.copy" && [[ "$(cat "$work/notes.md")" == notes ]] ||
  { echo "FAILED: a refused --out changed an existing file"; exit 1; }
expect_error "--out: cannot create files" "$t" --data "$work/ok.txt" --model char_tiny --steps 1 --out /proc/nonexistent/w.safetensors

# a good run writes weights; a later failing run must leave them intact
"$t" --data "$work/ok.txt" --model char_tiny --steps 3 --eval-every 0 --sample-tokens 5 --out "$work/w.safetensors" >/dev/null 2>&1 ||
  { echo "FAILED: a good char_tiny run failed"; fail=$((fail + 1)); }
sum_before=$(md5sum < "$work/w.safetensors")
expect_error "does not exist" "$t" --data "$work/missing.txt" --model char_tiny --out "$work/w.safetensors"
[[ "$(md5sum < "$work/w.safetensors")" == "$sum_before" ]] && pass=$((pass + 1)) ||
  { echo "FAILED: weights file changed by a failed run"; fail=$((fail + 1)); }

# an earlier run's weights are kept, never lost: three default runs (no --out) in an empty working
# directory leave out/char_tiny.safetensors (the newest) and out/char_tiny.previous-1 and -2 (the
# earlier two, byte for byte: the first free name, as the log's metrics.previous-<k>.jsonl), with
# one line each saying so; the logs of the default --out stay in out/logs
check() {  # check <what> <command...>: counts a pass when the command succeeds
  local what="$1"; shift
  if "$@"; then pass=$((pass + 1)); else echo "FAILED: $what"; fail=$((fail + 1)); fi
}
sha() { sha256sum < "$1"; }
quick=(--data "$work/ok.txt" --model char_tiny --steps 2 --eval-every 0 --sample-tokens 0 --peak-gflops 100
       --summary-every 0)
mkdir "$work/cwd"
for seed in 1 2 3; do
  (cd "$work/cwd" && "$t" "${quick[@]}" --seed $seed > "$work/run$seed.txt" 2>&1) ||
    { echo "FAILED: default run $seed: $(tail -3 "$work/run$seed.txt")"; fail=$((fail + 1)); }
  cp "$work/cwd/out/char_tiny.safetensors" "$work/run$seed.safetensors"
done
o="$work/cwd/out"
check "run 1 had nothing to keep" bash -c "! grep -q '^weights: ' '$work/run1.txt'"
check "run 2 names where the previous weights went" \
  grep -qx "weights: the previous run's out/char_tiny.safetensors is kept as out/char_tiny.previous-1.safetensors" "$work/run2.txt"
check "run 3 names where the previous weights went" \
  grep -qx "weights: the previous run's out/char_tiny.safetensors is kept as out/char_tiny.previous-2.safetensors" "$work/run3.txt"
check "previous-1 is run 1's weights" cmp -s "$o/char_tiny.previous-1.safetensors" "$work/run1.safetensors"
check "previous-2 is run 2's weights" cmp -s "$o/char_tiny.previous-2.safetensors" "$work/run2.safetensors"
check "the weights are run 3's, not run 2's" bash -c "! cmp -s '$o/char_tiny.safetensors' '$work/run2.safetensors'"
check "one kept file per run" bash -c "[[ \$(ls '$o' | grep -c safetensors) -eq 3 ]]"
check "default --log-dir: out/logs" test -s "$o/logs/metrics.jsonl"
check "the log is kept too" test -s "$o/logs/metrics.previous-2.jsonl"
check "each earlier run's TensorBoard events in previous-<k>/, the newest run's alone at the top" bash -c \
  "ls '$o/logs/previous-1/' | grep -q '^events.out.tfevents' && ls '$o/logs/previous-2/' | grep -q '^events.out.tfevents' &&
   [[ \$(ls '$o/logs' | grep -c '^events.out.tfevents') -eq 1 ]]"
check "run 3 says where the events went" grep -qx "log: the previous run's TensorBoard events are kept in out/logs/previous-2/" "$work/run3.txt"
# --out naming an existing .safetensors file: kept the same way; the logs go beside it (logs/ in
# --out's directory), nothing into the working directory; a refused run keeps nothing aside
mkdir "$work/cwd2"
(cd "$work/cwd2" && "$t" "${quick[@]}" --out "$work/keep/run.safetensors" > "$work/keep1.txt" 2>&1 &&
  cp "$work/keep/run.safetensors" "$work/keep1.safetensors" &&
  "$t" "${quick[@]}" --seed 9 --out "$work/keep/run.safetensors" > "$work/keep2.txt" 2>&1) ||
  { echo "FAILED: runs with --out: $(tail -3 "$work/keep2.txt")"; fail=$((fail + 1)); }
check "--out: the line" grep -q "weights: the previous run's .*/keep/run.safetensors is kept as .*/keep/run.previous-1.safetensors$" "$work/keep2.txt"
check "--out: kept byte for byte" cmp -s "$work/keep/run.previous-1.safetensors" "$work/keep1.safetensors"
check "--out: logs beside the weights" test -s "$work/keep/logs/metrics.jsonl"
check "--out: logs kept there" test -s "$work/keep/logs/metrics.previous-1.jsonl"
check "--out: nothing in the working directory" bash -c "[[ -z \$(ls -A '$work/cwd2') ]]"
run_sum=$(sha "$work/keep/run.safetensors")
expect_error "does not exist" "$t" --data "$work/missing.txt" --model char_tiny --out "$work/keep/run.safetensors"
unchanged "a refused run" "$work/keep/run.safetensors" "$run_sum"
check "a refused run keeps nothing aside" test ! -e "$work/keep/run.previous-2.safetensors"

s="$bin/sample"
expect_error "cannot open" "$s" --weights "$work/missing.safetensors"
expect_error "not a safetensors file|truncated" "$s" --weights "$work/ok.txt"
expect_error "temperature" "$s" --weights "$work/w.safetensors" --temperature 0
expect_error "--top-k -1 is negative; pass --top-k 0" "$s" --weights "$work/w.safetensors" --top-k -1
expect_error "not expected|--nope" "$s" --weights "$work/w.safetensors" --nope 3
expect_error "^sample: error: --tokens 0 generates nothing.*--tokens 1 or more" "$s" --weights "$work/w.safetensors" --tokens 0
expect_error "^sample: error: --tokens / --sample-tokens: 'abc' is not a whole number; pass a whole number" "$s" --weights "$work/w.safetensors" --tokens abc
expect_error "^train_gpt: error: --lr: 'fast' is not a number; pass a number" "$t" --data "$work/ok.txt" --lr fast
expect_error "^sample: error: --sample-tokens 0 generates nothing|^sample: error: --tokens 0 generates nothing" \
  "$s" --weights "$work/w.safetensors" --sample-tokens 0
head -c 100 "$work/w.safetensors" > "$work/cut.safetensors"
expect_error "truncated|safetensors" "$s" --weights "$work/cut.safetensors"

# --checkpoint-dir / --resume naming a file: refused right after parsing (nothing printed: no banner,
# no peak probe), the file left as it is
notes_sum=$(sha256sum < "$work/notes.md")
expect_refusal "^train_gpt: error: --checkpoint-dir '.*notes.md': '.*notes.md' is a file, and checkpoints go into a directory.*pass a directory name" \
  "$t" --data "$work/ok.txt" --model char_tiny --steps 1 --checkpoint-dir "$work/notes.md"
expect_refusal "^train_gpt: error: --checkpoint-dir '.*notes.md/ckpt': '.*notes.md' is a file" \
  "$t" --data "$work/ok.txt" --model char_tiny --steps 1 --checkpoint-dir "$work/notes.md/ckpt"
# the same path for the checkpoints and the weights: refused before anything is written there
expect_refusal "^train_gpt: error: --checkpoint-dir and --out name the same path '.*same.safetensors'.*--checkpoint-dir out/ckpt" \
  "$t" --data "$work/ok.txt" --model char_tiny --steps 1 --checkpoint-dir "$work/same.safetensors" \
  --out "$work/same.safetensors"
pushd "$work" > /dev/null  # the same path spelled two ways, relative to the working directory
expect_refusal "^train_gpt: error: --checkpoint-dir and --out name the same path" \
  "$t" --data "$work/ok.txt" --model char_tiny --steps 1 --checkpoint-dir ./same.safetensors --out same.safetensors
popd > /dev/null
if [ -e "$work/same.safetensors" ]; then echo "FAILED: a refused run created $work/same.safetensors"; fail=$((fail + 1)); else pass=$((pass + 1)); fi
expect_refusal "^train_gpt: error: --resume '.*notes.md' is a file, and a checkpoint is a directory; pass the --checkpoint-dir of an earlier run" \
  "$t" --data "$work/ok.txt" --model char_tiny --steps 1 --resume "$work/notes.md"
unchanged "a refused --checkpoint-dir or --resume" "$work/notes.md" "$notes_sum"
mkdir -p "$work/ck/step_00000003" && printf '{}' > "$work/ck/step_00000003/manifest.json"
manifest_sum=$(sha256sum < "$work/ck/step_00000003/manifest.json")
expect_refusal "--resume '.*manifest.json' is a file, and a checkpoint is a directory; pass the directory that holds it, --resume .*/ck/step_00000003$" \
  "$t" --data "$work/ok.txt" --model char_tiny --steps 1 --resume "$work/ck/step_00000003/manifest.json"
unchanged "a refused --resume" "$work/ck/step_00000003/manifest.json" "$manifest_sum"

# --resume naming a directory without a checkpoint: refused right after parsing too, with the
# directory to pass where one is plain (a run's root one level down; the run of a step_NNNNNNNN
# directory without its manifest); nothing in them changes
mkdir -p "$work/nockpt" "$work/runs/ckpt/step_00000002" "$work/runs/ckpt/step_00000004"
printf '{}' > "$work/runs/ckpt/step_00000002/manifest.json"
runs_before=$(cd "$work" && find nockpt runs | sort; sha256sum runs/ckpt/step_00000002/manifest.json)
expect_refusal "^train_gpt: error: --resume '.*nockpt' holds no checkpoint \(no manifest.json, no step_NNNNNNNN directory\); pass the --checkpoint-dir of an earlier run \(e.g. out/ckpt\) or one step_NNNNNNNN directory inside it, or start without --resume$" \
  "$t" --data "$work/ok.txt" --model char_tiny --steps 1 --resume "$work/nockpt"
expect_refusal "^train_gpt: error: --resume '.*/runs' holds no checkpoint .*; its subdirectory 'ckpt' does: pass --resume .*/runs/ckpt$" \
  "$t" --data "$work/ok.txt" --model char_tiny --steps 1 --resume "$work/runs"
expect_refusal "^train_gpt: error: --resume '.*step_00000004/' holds no checkpoint .*unfinished or damaged save: pass the run's directory, --resume .*/runs/ckpt, to resume from its newest valid checkpoint$" \
  "$t" --data "$work/ok.txt" --model char_tiny --steps 1 --resume "$work/runs/ckpt/step_00000004/"
[[ "$(cd "$work" && find nockpt runs | sort; sha256sum runs/ckpt/step_00000002/manifest.json)" == "$runs_before" ]] &&
  pass=$((pass + 1)) || { echo "FAILED: a refused --resume changed its directory"; fail=$((fail + 1)); }

# a one-value flag given twice
expect_refusal "^train_gpt: error: --log-dir was given 2 times; it takes one value: pass it once" \
  "$t" --data "$work/ok.txt" --model char_tiny --log-dir "$work/a" --log-dir "$work/b"

# flags that would have no effect in the combination given: refused, naming the missing or
# conflicting flag; a dataset's JSON summary or tokenizer given as a text file
expect_refusal "^train_gpt: error: --save-every has no effect without --checkpoint-dir \(--save\): no checkpoint is written; pass --checkpoint-dir DIR" \
  "$t" --data "$work/ok.txt" --model char_tiny --steps 3 --save-every 1 --keep 2
expect_refusal "^train_gpt: error: --keep has no effect without --checkpoint-dir" "$t" --data "$work/ok.txt" --model char_tiny --keep 2
expect_refusal "^train_gpt: error: --stop-at-step has no effect without --checkpoint-dir" \
  "$t" --data "$work/ok.txt" --model char_tiny --steps 3 --stop-at-step 2
expect_refusal "^train_gpt: error: --stop-at-step 5 is not before --steps 2: the run ends first.*pass --stop-at-step < 2" \
  "$t" --data "$work/ok.txt" --model char_tiny --steps 2 --stop-at-step 5 --checkpoint-dir "$work/never"
printf '{}' > "$work/sidecar.json"; : > "$work/sidecar.idx"; : > "$work/sidecar.bin"
expect_refusal "^train_gpt: error: --data '.*sidecar.json' is the JSON summary of the dataset '.*sidecar', not a text to train on; pass the dataset, --data .*sidecar$" \
  "$t" --data "$work/sidecar.json" --model char_tiny
expect_refusal "^train_gpt: error: --data '.*sidecar.model' is the tokenizer of the dataset" \
  "$t" --data "$work/sidecar.model" --model char_tiny
# Megatron-LM's names: a feature loom lacks, refused by name; two flags that disagree
m=(--data "$work/ok.txt" --model char_tiny --steps 2)
expect_refusal "^train_gpt: error: --data-path with 4 values is a blend of datasets .*blending is not supported yet; pass one dataset" \
  "$t" --model char_tiny --data-path 0.3 "$work/ok.txt" 0.7 "$work/ok.txt"
expect_refusal "^train_gpt: error: --data and --data-path both name the data" "$t" "${m[@]}" --data-path "$work/ok.txt"
expect_refusal "^train_gpt: error: --sequence-parallel: loom has no sequence parallelism yet" "$t" "${m[@]}" --sequence-parallel
expect_refusal "^train_gpt: error: --context-parallel-size 2: loom has no context parallelism yet" "$t" "${m[@]}" --context-parallel-size 2
expect_refusal "^train_gpt: error: --num-experts: loom has no mixture-of-experts layers yet" "$t" "${m[@]}" --num-experts 8
expect_refusal "^train_gpt: error: --expert-model-parallel-size: loom has no mixture-of-experts" "$t" "${m[@]}" --expert-model-parallel-size 2
expect_refusal "^train_gpt: error: --virtual-pipeline-model-parallel-size 2: loom's pipeline is 1F1B without interleaved" \
  "$t" "${m[@]}" --virtual-pipeline-model-parallel-size 2
expect_refusal "^train_gpt: error: --split 969,30,1: loom holds out --val-fraction .*no test split; pass e.g. --val-fraction" \
  "$t" "${m[@]}" --split 969,30,1
for flag in --finetune --no-load-optim --no-load-rng; do
  expect_refusal "^train_gpt: error: $flag: loom loads a checkpoint whole .*pass --init-from-hf DIR$" "$t" "${m[@]}" $flag
done
expect_refusal "^train_gpt: error: --no-save-optim: loom's checkpoints always hold the whole state" "$t" "${m[@]}" --no-save-optim
expect_refusal "^train_gpt: error: --ckpt-step 4 chooses a step of --load's directory; pass --load DIR too" \
  "$t" "${m[@]}" --ckpt-step 4
for style in linear inverse-square-root WSD; do
  expect_refusal "^train_gpt: error: --lr-decay-style $style: loom's schedule is a linear warm-up, then a cosine decay .*$style is not implemented yet; pass --lr-decay-style cosine or constant" \
    "$t" "${m[@]}" --lr-decay-style $style
done
expect_refusal "^train_gpt: error: --init-method-std 0.006: loom initialises the weights with standard deviation 0.02.*pass 0.02 or drop it" \
  "$t" "${m[@]}" --init-method-std 0.006
expect_refusal "^train_gpt: error: --recompute-method block --recompute-num-layers 2: loom's full recomputation reruns every layer" \
  "$t" "${m[@]}" --recompute-granularity full --recompute-method block --recompute-num-layers 2
expect_refusal "^train_gpt: error: --recompute-method and --recompute-num-layers are for --recompute-granularity full" \
  "$t" "${m[@]}" --recompute-method uniform
expect_refusal "^train_gpt: error: --recompute none and Megatron's recompute flags \(selective\) say different things" \
  "$t" "${m[@]}" --recompute none --recompute-activations
expect_refusal "^train_gpt: error: --bf16 and --precision fp32 choose different precisions" "$t" "${m[@]}" --bf16 --precision fp32
expect_refusal "^train_gpt: error: --bf16 and --fp16 both choose the precision" "$t" "${m[@]}" --bf16 --fp16
for p in bf16 fp16; do  # --bf16/--fp16 are --precision bf16/fp16 (what --allow-fp32-matmul then names)
  expect_refusal "^train_gpt: error: --allow-fp32-matmul is for --precision fp32 .*drop it with --precision $p$" \
    "$t" "${m[@]}" --$p --device ascend --allow-fp32-matmul
done
expect_refusal "^train_gpt: error: --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 is --layout tp2pp1, but --layout tp1pp1 is given too" \
  "$t" "${m[@]}" --tensor-model-parallel-size 2 --layout tp1pp1
expect_refusal "^train_gpt: error: --lr-warmup-fraction and --lr-warmup-iters \(--warmup\) both set the warm-up" \
  "$t" "${m[@]}" --lr-warmup-fraction 0.1 --lr-warmup-iters 1
expect_refusal "^train_gpt: error: --lr-warmup-fraction 2 is not a fraction" "$t" "${m[@]}" --lr-warmup-fraction 2
expect_refusal "^train_gpt: error: --adam-beta2 1 is outside \[0, 1\)" "$t" "${m[@]}" --adam-beta2 1
expect_refusal "^train_gpt: error: --adam-eps 0 must be a positive number" "$t" "${m[@]}" --adam-eps 0
expect_refusal "^train_gpt: error: --load and --resume both name the checkpoint" "$t" "${m[@]}" --load "$work/a" --resume "$work/a"
expect_refusal "^train_gpt: error: --load '.*nowhere' does not exist; pass the --save directory of an earlier run" \
  "$t" "${m[@]}" --load "$work/nowhere"
expect_refusal "^train_gpt: error: --use-flash-attn asks for the fused attention, but --attention reference is given" \
  "$t" "${m[@]}" --use-flash-attn --attention reference
expect_refusal "^train_gpt: error: --overlap-grad-reduce and --no-overlap say different things" "$t" "${m[@]}" --overlap-grad-reduce --no-overlap
expect_refusal "^train_gpt: error: --global-batch-size 6 over micro-batch 4 x data-parallel 1 is not a whole number of micro-batches per rank; pass a multiple of 4 \(e.g. 4\)" \
  "$t" "${m[@]}" --micro-batch-size 4 --global-batch-size 6
expect_refusal "^train_gpt: error: --global-batch-size 8 over micro-batch 4 x data-parallel 1 is --grad-accum 2, but --grad-accum 3 is given" \
  "$t" "${m[@]}" --micro-batch-size 4 --global-batch-size 8 --grad-accum 3
expect_refusal "^train_gpt: error: --transformer-impl: te not in \{local,transformer_engine\}" "$t" "${m[@]}" --transformer-impl te
# ... and warnings for flags that have no effect here: the run goes on, one line each on stderr
warn_run() {  # warn_run <pattern> <flags...>: a 1-step run succeeds with a stderr line matching
  local pattern="$1"; shift
  if "$t" --data "$work/ok.txt" --model char_tiny --steps 1 --eval-every 0 --log-dir '' --peak-gflops 100 \
       --summary-every 0 --out "$work/warn.safetensors" "$@" >/dev/null 2>"$work/stderr" &&
     [[ $(grep -c -E "$pattern" "$work/stderr") -eq 1 ]]; then
    pass=$((pass + 1))
  else
    echo "FAILED: $* -> wanted one stderr line matching /$pattern/, got: $(cat "$work/stderr")"; fail=$((fail + 1))
  fi
}
warn_run "^train_gpt: warning: --loss-scale \(--initial-loss-scale\) 4096 has no effect with --precision fp32: only fp16 scales the loss$" \
  --sample-tokens 0 --initial-loss-scale 4096
warn_run "^train_gpt: warning: --loss-scale .* 1024 has no effect with --precision fp32" --sample-tokens 0 --loss-scale 1024
# with --bf16 the same warning, before training (checked whatever the bf16 run then does on this CPU)
"$t" --data "$work/ok.txt" --model char_tiny --steps 1 --eval-every 0 --log-dir '' --peak-gflops 100 --sample-tokens 0 \
  --out "$work/warn.safetensors" --bf16 --loss-scale 512 >/dev/null 2>"$work/stderr" || true
check "--loss-scale with --bf16 warns" grep -qx "train_gpt: warning: --loss-scale (--initial-loss-scale) 512 has no effect with --precision bf16: only fp16 scales the loss" "$work/stderr"
warn_run "^train_gpt: warning: --top-k has no effect with --sample-tokens 0 \(no sample\)$" --sample-tokens 0 --top-k 5
warn_run "^train_gpt: warning: --temperature has no effect with --sample-tokens 0" --sample-tokens 0 --temperature 0.5
warn_run "^train_gpt: warning: --lr-decay-style constant keeps the learning rate at --lr after the warm-up: --min-lr 1e-05 has no effect$" \
  --sample-tokens 0 --lr-decay-style constant --min-lr 1e-5
warn_run "^train_gpt: note: --tokenizer-type changes nothing: loom uses the tokenizer of the --data dataset" \
  --sample-tokens 0 --tokenizer-type GPT2BPETokenizer
warn_run "^train_gpt: note: --tokenizer-model changes nothing" --sample-tokens 0 --tokenizer-model "$work/notes.md"
# --help shows each flag's default
"$t" --help > "$work/help.txt"
check "--help: --steps' default" grep -qE -- "--steps,--train-iters INT:INT>=1=2000" "$work/help.txt"
check "--help: --lr's default" grep -qE -- "--lr FLOAT=0.002 " "$work/help.txt"
check "--help: --adam-beta2's default" grep -qE -- "--adam-beta2 FLOAT=0.95 " "$work/help.txt"
check "--help: --precision's default" grep -qE -- "--precision TEXT:\{fp32,bf16,fp16\}=fp32" "$work/help.txt"

# byte-level weights (trained on a text file: no tokenizer recorded) with --tokenizer: refused
# (any existing file will do as the tokenizer: the weights decide first)
w_sum=$(sha256sum < "$work/w.safetensors")
expect_refusal "^sample: error: --tokenizer '.*notes.md': weights file '.*w.safetensors' was trained on the bytes of the text file '.*ok.txt'.*drop --tokenizer" \
  "$s" --weights "$work/w.safetensors" --tokenizer "$work/notes.md"
unchanged "sample --tokenizer on byte-level weights" "$work/w.safetensors" "$w_sum"
# a byte-level run of a model with a larger vocabulary samples bytes without a tokenizer
"$t" --data "$work/ok.txt" --model quickstart_bpe --steps 1 --micro-batch 1 --seq-len 32 --eval-every 0 --log-dir '' \
  --peak-gflops 100 --sample-tokens 0 --out "$work/wb.safetensors" >/dev/null 2>&1 ||
  { echo "FAILED: a byte-level quickstart_bpe run failed"; fail=$((fail + 1)); }
"$s" --weights "$work/wb.safetensors" --tokens 5 >/dev/null 2>"$work/stderr" && pass=$((pass + 1)) ||
  { echo "FAILED: sample of byte-level quickstart_bpe weights: $(cat "$work/stderr")"; fail=$((fail + 1)); }
expect_refusal "^sample: error: --tokenizer .*wb.safetensors' was trained on the bytes of the text file" \
  "$s" --weights "$work/wb.safetensors" --tokenizer "$work/notes.md"

# a prepare_data dataset moved without its tokenizer, renamed, or without its PREFIX.json
# (needs a build with SentencePiece: skipped without one)
common=(--steps 1 --micro-batch 1 --seq-len 32 --eval-every 0 --log-dir '' --peak-gflops 100 --sample-tokens 0)
if "$bin/prepare_data" --input "$work/ok.txt" --output-prefix "$work/ds/d" --vocab-size 400 --threads 1 >/dev/null 2>&1 &&
   [[ -s "$work/ds/d.model" ]]; then
  mkdir "$work/moved" "$work/renamed"
  for x in bin idx json; do cp "$work/ds/d.$x" "$work/moved/d.$x"; cp "$work/ds/d.$x" "$work/renamed/e.$x"; done
  sums_before=$(cd "$work" && sha256sum moved/* renamed/*)
  expect_refusal "^train_gpt: error: dataset '.*moved/d': '.*moved/d.json' names its tokenizer \"d.model\" \(field \"tokenizer\", a file beside the .json\), but '.*moved/d.model' does not exist.*copy the SentencePiece .model .* to '.*moved/d.model'" \
    "$t" --data "$work/moved/d" "${common[@]}" --out "$work/x.safetensors"
  expect_refusal "^train_gpt: error: dataset '.*renamed/e': '.*renamed/e.json' names its tokenizer \"d.model\".*but neither '.*renamed/d.model' nor '.*renamed/e.model' exists.*to '.*renamed/e.model'" \
    "$t" --data "$work/renamed/e" "${common[@]}" --out "$work/x.safetensors"
  [[ "$(cd "$work" && sha256sum moved/* renamed/*)" == "$sums_before" && ! -e "$work/x.safetensors" ]] &&
    pass=$((pass + 1)) || { echo "FAILED: a refused dataset changed files"; fail=$((fail + 1)); }
  # renamed with its tokenizer as PREFIX.model: found, and still checked against e.json's checksum
  cp "$work/ds/d.model" "$work/renamed/e.model"
  "$t" --data "$work/renamed/e" "${common[@]}" --out "$work/e.safetensors" >/dev/null 2>"$work/stderr" &&
    "$s" --weights "$work/e.safetensors" --tokens 5 >/dev/null 2>>"$work/stderr" &&
    pass=$((pass + 1)) || { echo "FAILED: a renamed dataset with PREFIX.model: $(cat "$work/stderr")"; fail=$((fail + 1)); }
  printf 'x' >> "$work/renamed/e.model"
  expect_error "tokenizer model '.*renamed/e.model' is [0-9]+ bytes but 'e.json' records" \
    "$t" --data "$work/renamed/e" "${common[@]}" --out "$work/e2.safetensors"
  # no PREFIX.json: trains, with a warning that nothing is verified; --no-data-checksum silences it
  mkdir "$work/bare"
  for x in bin idx model; do cp "$work/ds/d.$x" "$work/bare/d.$x"; done
  bare_out="$("$t" --data "$work/bare/d" "${common[@]}" --out "$work/b.safetensors" 2>"$work/stderr")"; status=$?
  warning="^train_gpt: warning: dataset '.*bare/d' has no '.*bare/d.json' .*not verified .*--no-data-checksum"
  if [[ $status -eq 0 && "$(cat "$work/stderr")" =~ $warning ]] && grep -q "not verified (no .*bare/d.json)" <<<"$bare_out"; then
    pass=$((pass + 1))
  else
    echo "FAILED: no PREFIX.json -> status $status, stderr: $(cat "$work/stderr")"; fail=$((fail + 1))
  fi
  "$t" --data "$work/bare/d" "${common[@]}" --out "$work/b.safetensors" --no-data-checksum >/dev/null 2>"$work/stderr"
  [[ $? -eq 0 && ! -s "$work/stderr" ]] && pass=$((pass + 1)) ||
    { echo "FAILED: --no-data-checksum without PREFIX.json: $(cat "$work/stderr")"; fail=$((fail + 1)); }
  for x in bin idx model; do
    cmp -s "$work/ds/d.$x" "$work/bare/d.$x" || { echo "FAILED: bare/d.$x changed"; fail=$((fail + 1)); }
  done
  # a --data path that is both a file and a dataset's prefix: the dataset, with a note naming both
  cp "$work/ok.txt" "$work/bare/d"
  "$t" --data "$work/bare/d" "${common[@]}" --out "$work/b2.safetensors" --no-data-checksum >/dev/null 2>"$work/stderr"
  [[ $? -eq 0 ]] && grep -qx "train_gpt: note: --data '$work/bare/d' is a file and also the prefix of the dataset '$work/bare/d.idx'/'.bin' beside it; training on the dataset (pass '$work/bare/d.idx' to say so, or --data with another path to train on the file's bytes)" "$work/stderr" &&
    pass=$((pass + 1)) || { echo "FAILED: a file that is also a prefix: $(cat "$work/stderr")"; fail=$((fail + 1)); }
  rm "$work/bare/d"
  # ... and when that dataset has no tokenizer, the refusal says the path is also a file
  mkdir "$work/amb"
  cp "$work/ds/d.bin" "$work/ds/d.idx" "$work/amb/"
  cp "$work/ok.txt" "$work/amb/d"
  expect_refusal "^train_gpt: error: dataset '$work/amb/d' has no tokenizer: .* \(--data '$work/amb/d' is also a file; to train on its bytes, give it a name that is not the prefix of a dataset\)$" \
    "$t" --data "$work/amb/d" "${common[@]}" --out "$work/amb.safetensors"
  # the dataset's real tokenizer on byte-level weights
  expect_refusal "^sample: error: --tokenizer '.*ds/d.model': weights file .* was trained on the bytes" \
    "$s" --weights "$work/w.safetensors" --tokenizer "$work/ds/d.model"

  # prepare_data run again on an existing prefix keeps the earlier dataset, byte for byte, as
  # d.previous-1.{bin,idx,model,json} with one stdout line per file; a run that fails (a bad
  # --input) first changes nothing and keeps nothing aside
  "$t" --data "$work/ds/d" "${common[@]}" --out "$work/d.safetensors" >/dev/null 2>"$work/stderr" ||
    { echo "FAILED: training on ds/d: $(cat "$work/stderr")"; fail=$((fail + 1)); }
  mkdir "$work/ds1"
  cp "$work/ds/d".{bin,idx,model,json} "$work/ds1/"
  ds_before=$(cd "$work/ds" && ls; sha256sum *)
  expect_refusal "^prepare_data: error: .*missing.txt.*cannot be opened" \
    "$bin/prepare_data" --input "$work/missing.txt" --output-prefix "$work/ds/d" --vocab-size 500 --threads 1
  check "a failed prepare_data leaves the dataset as it was" [ "$(cd "$work/ds" && ls; sha256sum *)" == "$ds_before" ]
  "$bin/prepare_data" --input "$work/ok.txt" --output-prefix "$work/ds/d" --vocab-size 500 --threads 1 \
    > "$work/prep2.txt" 2>"$work/stderr" || { echo "FAILED: prepare_data again: $(cat "$work/stderr")"; fail=$((fail + 1)); }
  for x in bin idx model json; do
    check "d.$x kept byte for byte" cmp -s "$work/ds1/d.$x" "$work/ds/d.previous-1.$x"
    check "the line for d.$x" grep -qx "dataset: the previous run's $work/ds/d.$x is kept as $work/ds/d.previous-1.$x" \
      "$work/prep2.txt"
  done
  check "the new dataset replaced the old one" bash -c "! cmp -s '$work/ds1/d.model' '$work/ds/d.model'"
  check "nothing else kept" [ "$(ls "$work/ds" | grep -c previous)" -eq 4 ]

  # the kept dataset trains as PREFIX.previous-1, with its own tokenizer (not the newer d.model)
  "$t" --data "$work/ds/d.previous-1" "${common[@]}" --out "$work/k.safetensors" >/dev/null 2>"$work/stderr" &&
    "$s" --weights "$work/k.safetensors" --tokens 5 >/dev/null 2>>"$work/stderr" && [[ ! -s "$work/stderr" ]] &&
    pass=$((pass + 1)) || { echo "FAILED: training on the kept dataset: $(cat "$work/stderr")"; fail=$((fail + 1)); }
  check "the kept dataset's weights record its own tokenizer" \
    grep -qa "\"tokenizer\":\"$work/ds/d.previous-1.model\"" "$work/k.safetensors"

  # weights trained on the old dataset: sample refuses the new d.model (recorded, or as
  # --tokenizer) and names the kept one, exit 2, no file changed; with it, it samples
  w_before=$(cd "$work" && sha256sum d.safetensors ds/*)
  expect_refusal "^sample: error: the tokenizer '$work/ds/d.model' recorded in weights file '$work/d.safetensors' changed after the weights were trained with it \(XXH3-64 [0-9a-f]{16}, the weights record [0-9a-f]{16}; .*\); pass --tokenizer $work/ds/d.previous-1.model, which has the recorded checksum$" \
    "$s" --weights "$work/d.safetensors" --tokens 5
  cp "$work/ds/d.model" "$work/new.model"
  expect_refusal "^sample: error: --tokenizer '$work/new.model' is not the tokenizer weights file '$work/d.safetensors' was trained with \(XXH3-64 [0-9a-f]{16}, the weights record [0-9a-f]{16} for '$work/ds/d.model'\); pass --tokenizer $work/ds/d.previous-1.model, which has" \
    "$s" --weights "$work/d.safetensors" --tokenizer "$work/new.model" --tokens 5
  check "a refused sample changes no file" [ "$(cd "$work" && sha256sum d.safetensors ds/*)" == "$w_before" ]
  # a tokenizer damaged since prepare_data wrote it is reported as damaged, not as another tokenizer
  mkdir "$work/ds4"
  for x in bin idx model json; do cp "$work/ds/d.previous-1.$x" "$work/ds4/d.$x"; done
  printf '\xff' | dd of="$work/ds4/d.model" bs=1 seek=100 conv=notrunc status=none
  expect_refusal "^sample: error: tokenizer model '$work/ds4/d.model' fails its checksum \('d.json' records XXH3-64 [0-9a-f]{16}, the file has [0-9a-f]{16}\): its bytes changed after prepare_data wrote it; re-run prepare_data$" \
    "$s" --weights "$work/d.safetensors" --tokenizer "$work/ds4/d.model" --tokens 5
  "$s" --weights "$work/d.safetensors" --tokenizer "$work/ds/d.previous-1.model" --tokens 5 >/dev/null 2>"$work/stderr" &&
    [[ ! -s "$work/stderr" ]] && pass=$((pass + 1)) ||
    { echo "FAILED: sample with the kept tokenizer: $(cat "$work/stderr")"; fail=$((fail + 1)); }
  # weights saved before the tokenizer's checksum was recorded: still sample, with a note
  python3 - "$work/d.safetensors" "$work/old.safetensors" <<'PY' || { echo "FAILED: writing old-style weights"; fail=$((fail + 1)); }
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
for k in ("xxh3_64", "tokenizer_xxh3_64"):  # no file checksum either: it would cover the metadata
    h["__metadata__"].pop(k)
hb = json.dumps(h).encode()
hb += b" " * (-len(hb) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(hb)) + hb + b[8 + n:])
PY
  "$s" --weights "$work/old.safetensors" --tokenizer "$work/ds/d.previous-1.model" --tokens 5 >/dev/null 2>"$work/stderr"
  status=$?
  note="^sample: note: weights file '.*old.safetensors' records no checksum of its tokenizer .*not verified"
  [[ $status -eq 0 && "$(cat "$work/stderr")" =~ $note && $(wc -l < "$work/stderr") -eq 1 ]] &&
    pass=$((pass + 1)) || { echo "FAILED: old-style weights: $(cat "$work/stderr")"; fail=$((fail + 1)); }
else
  echo "note: prepare_data did not run (a build without SentencePiece?): dataset cases skipped"
fi

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
