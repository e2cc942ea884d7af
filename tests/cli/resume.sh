#!/usr/bin/env bash
# Checkpoints as a user meets them, with separate train_gpt processes:
#   1. exact resume: 6 steps in one run == 3 steps, stop, a new process resumes, 3 steps
#      (every loss bit for bit, from metrics.jsonl, and the final weights byte for byte; the
#      stopped run's weights are kept as w.previous-1.safetensors);
#   2. a damaged newest checkpoint: resume falls back to the previous one with a warning and
#      still reproduces the losses;
#   3. SIGKILL at random moments of a run that saves every step (so often mid-save): the
#      resumed run always finds a valid checkpoint and continues with the reference losses;
#   4. bad input: --resume on a missing, empty or foreign directory, another model, a fresh run
#      into another run's checkpoints -> exit 2 with one clear line (a path without checkpoints
#      before the banner);
#   5. --export-hf writes GPT-2 files, --init-from-hf starts from them;
#   6. fp16 with the dynamic loss scaler: losses, loss scales, the scaler's good-step counter and
#      the final weights of the resumed run equal the uninterrupted run's, bit for bit.
#   7. nothing on disk is lost: a resume from an older checkpoint is refused while newer ones
#      are in its directory, and --discard-newer-checkpoints moves them into set-aside/ byte for
#      byte; failed checkpoint saves (a file-size limit standing in for a full disk) end the run
#      with status 1 and a summary, or at once with --exit-on-save-failure;
#   8. preemption: SIGTERM under --exit-signal-handler finishes the step, saves, exits 0, and the
#      resumed run ends with the uninterrupted run's weights byte for byte; a second signal ends
#      the process at once and every checkpoint on disk still resumes; --exit-interval stops
#      after a multiple of N; --keep-previous bounds the earlier runs' weights and logs kept.
#   tests/cli/resume.sh <dir with train_gpt>
set -u
bin="$1"
t="$bin/train_gpt"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail=0
pass=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAILED: $*"; fail=$((fail + 1)); }

data="$work/data.txt"
head -c 60000 "${LOOM_DATA_DIR:-../shared/data}/tinyshakespeare.txt" > "$data"
common=(--data "$data" --model char_tiny --eval-every 0 --sample-tokens 1 --peak-gflops 1 --summary-every 0)
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"  # bitwise resumption holds for a fixed thread count

# "step loss" lines of a metrics.jsonl, the loss printed exactly (shortest round-trip text)
# (only the training-step lines: validation lines, such as the end-of-run one, carry no train/loss)
losses() { grep '"train/loss"' "$1" | grep -o '"step":[0-9]*\|"train/loss":[^,}]*' | paste -d' ' - - | sed 's/"step"://; s/"train\/loss"://'; }

# --- 1. exact resume ----------------------------------------------------------------------------
"$t" "${common[@]}" --steps 6 --log-dir "$work/a/logs" --out "$work/a/w.safetensors" \
  --checkpoint-dir "$work/a/ckpt" --save-every 3 > "$work/a.txt" 2>&1 || bad "uninterrupted run: $(tail -3 "$work/a.txt")"
"$t" "${common[@]}" --steps 6 --log-dir "$work/b/logs1" --out "$work/b/w.safetensors" \
  --checkpoint-dir "$work/b/ckpt" --stop-at-step 3 > "$work/b1.txt" 2>&1 || bad "run stopped at 3: $(tail -3 "$work/b1.txt")"
[[ "$(cat "$work/b/ckpt/latest" 2>/dev/null)" == "step_00000003" ]] && ok || bad "latest after --stop-at-step 3"
cp "$work/b/w.safetensors" "$work/b/w-step3.safetensors"  # the stopped run's weights, kept by the resumed run
"$t" "${common[@]}" --steps 6 --log-dir "$work/b/logs2" --out "$work/b/w.safetensors" \
  --resume "$work/b/ckpt" > "$work/b2.txt" 2>&1 || bad "resumed run: $(tail -3 "$work/b2.txt")"
grep -q "weights: the previous run's .*b/w.safetensors is kept as .*b/w.previous-1.safetensors$" "$work/b2.txt" && ok ||
  bad "the resumed run did not say where the stopped run's weights went: $(tail -5 "$work/b2.txt")"
cmp -s "$work/b/w.previous-1.safetensors" "$work/b/w-step3.safetensors" && ok || bad "the stopped run's weights were not kept"
grep -q "resumed from .*step_00000003: step 3" "$work/b2.txt" && ok || bad "resume message: $(head -5 "$work/b2.txt")"
grep -q "trained 3 steps (resumed at step 3, 6 in all) in" "$work/b2.txt" && ok || bad "resumed run's step count: $(tail -5 "$work/b2.txt")"
grep -q "trained 6 steps in" "$work/a.txt" && ok || bad "uninterrupted run's step count: $(tail -5 "$work/a.txt")"
ref="$(losses "$work/a/logs/metrics.jsonl")"
got="$(cat <(losses "$work/b/logs1/metrics.jsonl") <(losses "$work/b/logs2/metrics.jsonl"))"
[[ $(wc -l <<< "$ref") -eq 6 && "$ref" == "$got" ]] && ok || bad "losses differ:
$ref
vs
$got"
cmp -s "$work/a/w.safetensors" "$work/b/w.safetensors" && ok || bad "final weights differ"
[[ "$(cat "$work/b/ckpt/latest")" == "step_00000006" ]] && ok || bad "latest after the resumed run"

# --- 1b. extending a finished run: the warm-up and the decay follow --steps unless given; a resumed
# run with more steps names the flags that keep the checkpoint's schedule, and with them warns of nothing
cp -r "$work/a/ckpt" "$work/ext"
"$t" "${common[@]}" --steps 9 --log-dir '' --out "$work/ext1.safetensors" --resume "$work/ext" --stop-at-step 7 \
  > "$work/ext1.txt" 2>&1 || bad "extended run: $(tail -3 "$work/ext1.txt")"
grep -qx "train_gpt: warning: decay_steps is 9 now but 6 in the checkpoint: .*" "$work/ext1.txt" &&
  grep -qx "train_gpt: warning: to continue on the checkpoint's learning-rate schedule (warm-up and decay follow --steps unless given), pass --decay-steps 6" "$work/ext1.txt" &&
  ok || bad "no schedule hint when extending a run: $(grep warning "$work/ext1.txt")"
rm -rf "$work/ext" && cp -r "$work/a/ckpt" "$work/ext"
"$t" "${common[@]}" --steps 9 --decay-steps 6 --log-dir '' --out "$work/ext2.safetensors" --resume "$work/ext" \
  > "$work/ext2.txt" 2>&1 || bad "extended run with --decay-steps: $(tail -3 "$work/ext2.txt")"
! grep -q "warning" "$work/ext2.txt" && grep -q "decay to step 6" "$work/ext2.txt" && ok ||
  bad "--decay-steps 6 on the checkpoint's schedule: $(grep -i "warning\|decay" "$work/ext2.txt")"

# --- 2. a damaged newest checkpoint -------------------------------------------------------------
f="$work/b/ckpt/step_00000006/model-tp00-pp00.safetensors"
printf '\x5a' | dd of="$f" bs=1 seek=4000 conv=notrunc status=none
cp "$f" "$work/damaged-step6.safetensors"
"$t" "${common[@]}" --steps 6 --log-dir "$work/b/logs3" --out "$work/b/w3.safetensors" \
  --resume "$work/b/ckpt" > "$work/b3.txt" 2> "$work/b3.err" || bad "resume past a damaged checkpoint: $(cat "$work/b3.err")"
grep -q "step_00000006.*fails its checksum.*falling back" "$work/b3.err" && ok || bad "no fallback warning: $(cat "$work/b3.err")"
grep -q "resumed from .*step_00000003" "$work/b3.txt" && ok || bad "did not resume from step 3"
[[ "$(losses "$work/b/logs3/metrics.jsonl")" == "$(losses "$work/b/logs2/metrics.jsonl")" ]] && ok || bad "losses after fallback"
cmp -s "$work/a/w.safetensors" "$work/b/w3.safetensors" && ok || bad "final weights after fallback"
# the damaged checkpoint the resume passed over was moved aside, not overwritten by the new step 6
grep -q "warning: checkpoints newer than the one resumed did not verify.*moved step_00000006 into '.*b/ckpt/set-aside'" \
  "$work/b3.err" && cmp -s "$work/b/ckpt/set-aside/step_00000006/model-tp00-pp00.safetensors" "$work/damaged-step6.safetensors" &&
  ok || bad "the damaged step 6 was not kept aside: $(cat "$work/b3.err"; ls "$work/b/ckpt" "$work/b/ckpt/set-aside")"

# --- 3. SIGKILL at random moments ---------------------------------------------------------------
"$t" "${common[@]}" --steps 14 --log-dir "$work/k/ref" --out "$work/k/ref.safetensors" \
  --checkpoint-dir "$work/k/refckpt" --save-every 1 --keep 2 > /dev/null 2>&1 || bad "reference run for kills"
declare -A reference
while read -r s l; do reference[$s]="$l"; done < <(losses "$work/k/ref/metrics.jsonl")
for i in 1 2 3; do
  d="$work/k/run$i"
  "$t" "${common[@]}" --steps 14 --log-dir "$d/logs0" --out "$d/w.safetensors" \
    --checkpoint-dir "$d/ckpt" --save-every 1 --keep 2 > "$d.log" 2>&1 &
  pid=$!
  # wait for the first checkpoint, then kill at a random moment (steps and saves interleave)
  # (up to 60 s: under a loaded CI machine the first save can take longer than a few seconds)
  for _ in $(seq 1200); do [[ -e "$d/ckpt/latest" ]] && break; sleep 0.05; done
  sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  "$t" "${common[@]}" --steps 14 --log-dir "$d/logs1" --out "$d/w.safetensors" \
    --resume "$d/ckpt" > "$d.resume.log" 2>&1 || { bad "resume after kill $i: $(tail -3 "$d.resume.log")"; continue; }
  same=1
  while read -r s l; do [[ "${reference[$s]}" == "$l" ]] || same=0; done < <(losses "$d/logs1/metrics.jsonl")
  [[ $same -eq 1 ]] && ok || bad "losses after kill $i differ from the reference"
  cmp -s "$work/k/ref.safetensors" "$d/w.safetensors" && ok || bad "weights after kill $i differ from the reference"
  if grep -q "^saved weights" "$d.log"; then  # the kill came after the end: the resumed run kept those weights
    cmp -s "$work/k/ref.safetensors" "$d/w.previous-1.safetensors" && ok || bad "kill $i: the first run's weights not kept"
  else  # killed before its weights: nothing to keep, the resumed run wrote the first file
    [[ ! -e "$d/w.previous-1.safetensors" ]] && ok || bad "kill $i: a run killed before its weights left a file to keep"
  fi
  ls -a "$d/ckpt" | grep -q '^\.tmp' && bad "a temporary directory survived the resumed run's saves" || ok
done

# --- 4. bad input -------------------------------------------------------------------------------
expect_error() {  # expect_error <pattern> <command...>
  local pattern="$1"; shift
  local err status
  err="$("$@" 2>&1 >/dev/null)"; status=$?
  local lines; lines=$(printf '%s\n' "$err" | grep -c .)
  if [[ $status -eq 2 && "$err" =~ $pattern && $lines -eq 1 ]]; then ok
  else bad "$* -> status $status, stderr: $err (wanted one line matching /$pattern/)"; fi
}
mkdir -p "$work/empty" "$work/foreign/stepping"
echo hi > "$work/foreign/notes.txt"
expect_error "does not exist" "$t" "${common[@]}" --steps 2 --resume "$work/missing"
# a missing --resume path is reported before any work: nothing on stdout (no model or data banner)
out="$("$t" "${common[@]}" --steps 2 --resume "$work/missing" 2>/dev/null)"
[[ -z "$out" ]] && ok || bad "--resume of a missing path printed before its error: $out"
expect_error "holds no checkpoint" "$t" "${common[@]}" --steps 2 --resume "$work/empty"
# ... and so is a directory without checkpoints (no banner, no peak probe first)
out="$("$t" "${common[@]}" --steps 2 --resume "$work/empty" 2>/dev/null)"
[[ -z "$out" ]] && ok || bad "--resume of a directory without checkpoints printed before its error: $out"
expect_error "holds no checkpoint" "$t" "${common[@]}" --steps 2 --resume "$work/foreign"
expect_error "saved with model char_tiny" "$t" --data "$data" --model quickstart --steps 2 --peak-gflops 1 \
  --resume "$work/a/ckpt"
expect_error "already holds checkpoints" "$t" "${common[@]}" --steps 2 --checkpoint-dir "$work/a/ckpt"
cp -r "$work/a/ckpt" "$work/broken"
rm "$work/broken/step_00000003/manifest.json"
truncate -s 1000 "$work/broken/step_00000006/model-tp00-pp00.safetensors"
# every checkpoint damaged: one warning per checkpoint, then one error line naming both
err="$("$t" "${common[@]}" --steps 2 --resume "$work/broken" 2>&1 >/dev/null)"; status=$?
[[ $status -eq 2 && $(grep -c 'warning: .*is unusable' <<< "$err") -eq 2 && $(grep -c . <<< "$err") -eq 3 &&
   "$(tail -1 <<< "$err")" =~ error:.*no\ usable\ checkpoint.*step_00000006.*truncated.*step_00000003.*no\ manifest &&
   $(grep -c 'step_00000003.*no earlier checkpoint is left' <<< "$err") -eq 1 ]] &&
  ok || bad "all damaged -> status $status, stderr: $err"
expect_error "excludes|--init-from-hf" "$t" "${common[@]}" --steps 2 --resume "$work/a/ckpt" --init-from-hf "$work/x"
expect_error "config.json" "$t" "${common[@]}" --steps 2 --init-from-hf "$work/missing"
expect_error "--warmup 5 exceeds --decay-steps 3" "$t" "${common[@]}" --steps 9 --warmup 5 --decay-steps 3

# --- 5. GPT-2 export and import -----------------------------------------------------------------
"$t" "${common[@]}" --steps 6 --log-dir "" --out "$work/e/w.safetensors" --export-hf "$work/e/hf" > "$work/e.txt" 2>&1 ||
  bad "export run: $(tail -3 "$work/e.txt")"
[[ -s "$work/e/hf/model.safetensors" ]] && grep -q '"model_type": "gpt2"' "$work/e/hf/config.json" && ok || bad "export files"
"$t" "${common[@]}" --steps 1 --log-dir "$work/i/logs" --out "$work/i/w.safetensors" --init-from-hf "$work/e/hf" \
  > "$work/i.txt" 2>&1 || bad "init-from-hf run: $(tail -3 "$work/i.txt")"
grep -q "initialised from the Hugging Face gpt2 weights" "$work/i.txt" && ok || bad "no init message"
first_fresh=$(losses "$work/a/logs/metrics.jsonl" | head -1 | cut -d' ' -f2)
first_init=$(losses "$work/i/logs/metrics.jsonl" | head -1 | cut -d' ' -f2)
awk -v a="$first_init" -v b="$first_fresh" 'BEGIN { exit !(a < b - 0.1) }' && ok ||
  bad "a run from trained GPT-2 weights should start lower: $first_init vs fresh $first_fresh"

# --- 6. fp16 with dynamic loss scaling: bitwise resume, scaler state included --------------------
# The resumed run took 3 steps, so a growth_tracker of 6 proves the good-step counter came back
# from the checkpoint.
fp16=(--precision fp16 --steps 6)
"$t" "${common[@]}" "${fp16[@]}" --log-dir "$work/h/a" --out "$work/h/a.safetensors" --checkpoint-dir "$work/h/ca" \
  > "$work/h.a.txt" 2>&1 || bad "fp16 uninterrupted run: $(tail -3 "$work/h.a.txt")"
"$t" "${common[@]}" "${fp16[@]}" --log-dir "$work/h/b1" --out "$work/h/b.safetensors" --checkpoint-dir "$work/h/cb" \
  --stop-at-step 3 > "$work/h.b1.txt" 2>&1 || bad "fp16 run stopped at 3: $(tail -3 "$work/h.b1.txt")"
"$t" "${common[@]}" "${fp16[@]}" --log-dir "$work/h/b2" --out "$work/h/b.safetensors" --resume "$work/h/cb" \
  > "$work/h.b2.txt" 2>&1 || bad "fp16 resumed run: $(tail -3 "$work/h.b2.txt")"
verdict="$(python3 "$(dirname "$0")/check_fp16_resume.py" "fp16 resume" "$work/h/a/metrics.jsonl" \
  "$work/h/b1/metrics.jsonl" "$work/h/b2/metrics.jsonl" "$work/h/ca" "$work/h/cb")" && ok ||
  bad "fp16 resume: losses, loss scales or scaler state differ: $verdict"
cmp -s "$work/h/a.safetensors" "$work/h/b.safetensors" && ok || bad "fp16: the resumed run's final weights differ from the uninterrupted run's"

# --- 7. nothing on disk is lost -----------------------------------------------------------------
# 7a. an older checkpoint of a finished run: refused (exit 2, nothing changed), then moved aside
cp -r "$work/a/ckpt" "$work/old"
before="$(cd "$work/old" && find . -type f | sort | xargs md5sum)"
expect_error "holds newer checkpoints \(step_00000006\) that this run would overwrite.*--discard-newer-checkpoints" \
  "$t" "${common[@]}" --steps 6 --log-dir '' --out "$work/old.safetensors" --resume "$work/old/step_00000003"
[[ "$(cd "$work/old" && find . -type f | sort | xargs md5sum)" == "$before" && ! -e "$work/old.safetensors" ]] && ok ||
  bad "a refused resume changed the checkpoint directory or wrote weights"
"$t" "${common[@]}" --steps 6 --log-dir '' --out "$work/old.safetensors" --resume "$work/old/step_00000003" \
  --discard-newer-checkpoints > "$work/old.txt" 2>&1 || bad "--discard-newer-checkpoints run: $(tail -3 "$work/old.txt")"
moved="$(cd "$work/old/set-aside/step_00000006" && find . -type f | sort | xargs md5sum)"
[[ "$moved" == "$(grep ' ./step_00000006/' <<< "$before" | sed 's| ./step_00000006/| ./|')" ]] && ok ||
  bad "the newer checkpoint was not moved aside byte for byte: $moved"
[[ "$(cat "$work/old/latest")" == "step_00000006" ]] && cmp -s "$work/old.safetensors" "$work/a/w.safetensors" && ok ||
  bad "the continued run: latest $(cat "$work/old/latest"), weights differ from the uninterrupted run's"
expect_error "--discard-newer-checkpoints has no effect without --resume" "$t" "${common[@]}" --steps 2 \
  --discard-newer-checkpoints
# 7b. failed saves: a file-size limit lets the weights (1 x parameters) through but not a checkpoint
# (parameters and two moments); SIGXFSZ ignored, so a write fails with EFBIG as on a full disk
(trap '' XFSZ; ulimit -f 300; exec "$t" "${common[@]}" --steps 4 --save-every 2 --log-dir '' \
  --checkpoint-dir "$work/full" --out "$work/full.safetensors") > "$work/full.txt" 2>&1; status=$?
[[ $status -eq 1 && $(grep -c "warning: checkpoint save of step [24] .*failed: .*File too large" "$work/full.txt") -eq 2 &&
   "$(tail -1 "$work/full.txt")" =~ ^train_gpt:\ error:\ 2\ of\ 2\ checkpoint\ saves\ failed.*holds\ no\ checkpoint ]] &&
  grep -q "^saved weights" "$work/full.txt" && ok || bad "failed saves -> status $status: $(tail -4 "$work/full.txt")"
(trap '' XFSZ; ulimit -f 300; exec "$t" "${common[@]}" --steps 8 --save-every 2 --log-dir '' \
  --checkpoint-dir "$work/full2" --out "$work/full2.safetensors" --exit-on-save-failure) > "$work/full2.txt" 2>&1; status=$?
[[ $status -eq 1 && "$(tail -1 "$work/full2.txt")" =~ --exit-on-save-failure\ stops\ the\ run ]] &&
  ! grep -q "^step 8/8\|saved weights" "$work/full2.txt" && ok ||
  bad "--exit-on-save-failure -> status $status: $(tail -3 "$work/full2.txt")"

# --- 8. preemption ------------------------------------------------------------------------------
long=(--steps 400 --log-dir '')
"$t" "${common[@]}" "${long[@]}" --out "$work/p/ref.safetensors" > "$work/p.ref.txt" 2>&1 || bad "preemption reference"
"$t" "${common[@]}" "${long[@]}" --out "$work/p/w.safetensors" --checkpoint-dir "$work/p/ckpt" --save-every 20 --exit-signal-handler \
  > "$work/p1.txt" 2>&1 &
pid=$!
for _ in $(seq 1200); do [[ -e "$work/p/ckpt/latest" ]] && break; sleep 0.05; done  # mid-run: a checkpoint exists
kill -TERM "$pid"; wait "$pid"; status=$?
stopped="$(grep -o "^SIGTERM: checkpoint of step [0-9]* saved" "$work/p1.txt" | grep -o "[0-9]*")"
[[ $status -eq 0 && -n "$stopped" && "$stopped" -lt 400 && "$(cat "$work/p/ckpt/latest")" == "$(printf 'step_%08d' "$stopped")" &&
   ! -e "$work/p/w.safetensors" ]] && ok || bad "SIGTERM -> status $status, stopped at '$stopped': $(tail -3 "$work/p1.txt")"
"$t" "${common[@]}" "${long[@]}" --out "$work/p/w.safetensors" --resume "$work/p/ckpt" > "$work/p2.txt" 2>&1 ||
  bad "resume after SIGTERM: $(tail -3 "$work/p2.txt")"
cmp -s "$work/p/ref.safetensors" "$work/p/w.safetensors" && ok || bad "weights after SIGTERM and resume differ from the reference"
# two signals: the second ends the process at once; whatever was saved still resumes
"$t" "${common[@]}" "${long[@]}" --out "$work/q/w.safetensors" --checkpoint-dir "$work/q/ckpt" --exit-signal-handler \
  --save-every 1 > "$work/q1.txt" 2>&1 &
pid=$!
for _ in $(seq 1200); do [[ -e "$work/q/ckpt/latest" ]] && break; sleep 0.05; done
kill -INT "$pid"; kill -INT "$pid" 2>/dev/null; wait "$pid"; status=$?
[[ $status -eq 130 || $status -eq 0 ]] && ok || bad "two SIGINTs -> status $status: $(tail -3 "$work/q1.txt")"
"$t" "${common[@]}" "${long[@]}" --out "$work/q/w.safetensors" --resume "$work/q/ckpt" > "$work/q2.txt" 2>&1 &&
  cmp -s "$work/p/ref.safetensors" "$work/q/w.safetensors" && ok || bad "resume after two signals: $(tail -3 "$work/q2.txt")"
"$t" "${common[@]}" --steps 9 --log-dir '' --out "$work/x.safetensors" --checkpoint-dir "$work/x" --exit-interval 4 \
  > "$work/x.txt" 2>&1 && grep -q "stopping at step 4 (--exit-interval)" "$work/x.txt" &&
  [[ "$(cat "$work/x/latest")" == "step_00000004" ]] && ok || bad "--exit-interval 4: $(tail -3 "$work/x.txt")"

# --keep-previous 2: of the earlier runs' weights and logs the two newest stay, by age: the fifth
# run keeps the fourth's weights under the freed name previous-1 and removes the second's
for i in 1 2 3 4 5; do
  "$t" "${common[@]}" --steps "$i" --log-dir "$work/kp/logs" --out "$work/kp/w.safetensors" --keep-previous 2 \
    > "$work/kp$i.txt" 2>&1 || bad "--keep-previous run $i: $(tail -3 "$work/kp$i.txt")"
done
steps_of() { head -c 4096 "$1" | grep -ao '"steps":"[0-9]*"' | grep -o '[0-9]*'; }
kept="$(for f in "$work"/kp/w.previous-*.safetensors; do steps_of "$f"; done | sort | tr '\n' ' ')"
[[ "$kept" == "3 4 " && "$(steps_of "$work/kp/w.safetensors")" == 5 &&
   $(ls -d "$work"/kp/logs/previous-* | wc -l) == 2 && $(ls "$work"/kp/logs/metrics.previous-*.jsonl | wc -l) == 2 ]] &&
  grep -q "^weights: removed the older copy .*w.previous-2.safetensors (--keep-previous 2 keeps the newest 2)" "$work/kp5.txt" &&
  ok || bad "--keep-previous 2: kept the weights of runs '$kept'; $(ls "$work/kp" "$work/kp/logs"; grep removed "$work/kp5.txt")"

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
