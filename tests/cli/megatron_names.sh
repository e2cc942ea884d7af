#!/usr/bin/env bash
# train_gpt under Megatron-LM's flag names trains exactly as under loom's: char_tiny for 8 steps
# (a derived --grad-accum, a warm-up fraction, a constant schedule, AdamW's numbers, full
# recomputation, checkpoints through --save/--load), the loss and validation lines and the weights
# bit for bit those of the run with loom's names; a run stopped at step 4 and continued by --load (the same
# --save directory) ends with the same numbers, and so does one continued from --ckpt-step 4;
# another --adam-beta2 changes the losses (the flag
# reaches the optimizer). The notes for flags that only tune PyTorch internals go to stderr once.
#   tests/cli/megatron_names.sh <dir with train_gpt>
set -euo pipefail
bin="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
data="${LOOM_DATA_DIR:-../shared/data}/tinyshakespeare.txt"
head -c 60000 "$data" > "$work/text.txt"
common=(--model char_tiny --summary-every 0 --log-dir '' --peak-gflops 100 --sample-tokens 0)

losses() { grep -oP '^step +\d+/8 \| loss \K[0-9.]+|val loss \K[0-9.]+' "$1" | tr '\n' ' '; }

loom=(--data "$work/text.txt" --steps 8 --micro-batch 4 --grad-accum 2 --lr 1e-3 --min-lr 1e-3 --warmup 2
      --weight-decay 0.05 --max-grad-norm 0.5 --seed 7 --eval-every 4 --eval-windows 8 --log-every 1
      --recompute full)
megatron=(--data-path "$work/text.txt" --train-iters 8 --micro-batch-size 4 --global-batch-size 8 --lr 1e-3
          --lr-decay-style constant --lr-warmup-fraction 0.25 --weight-decay 0.05 --clip-grad 0.5 --seed 7
          --eval-interval 4 --eval-iters 8 --log-interval 1 --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8
          --init-method-std 0.02 --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1
          --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
          --use-flash-attn --use-fused-rmsnorm --no-masked-softmax-fusion --transformer-impl local
          --use-mcore-models --no-gradient-accumulation-fusion --overlap-grad-reduce --distributed-backend nccl)

"$bin/train_gpt" "${common[@]}" "${loom[@]}" --out "$work/a.safetensors" --checkpoint-dir "$work/ca" --save-every 4 \
  > "$work/loom.txt"
"$bin/train_gpt" "${common[@]}" "${megatron[@]}" --out "$work/b.safetensors" --save "$work/cb" --load "$work/cb" \
  --save-interval 4 > "$work/megatron.txt" 2> "$work/megatron.err"
a=$(losses "$work/loom.txt"); b=$(losses "$work/megatron.txt")
[[ $(wc -w <<<"$a") -ge 10 && "$a" == "$b" ]] ||
  { echo "losses differ: loom's names: $a | Megatron's names: $b"; cat "$work/megatron.err"; exit 1; }
grep -q 'micro-batch 4 x seq 32 x accum 2' "$work/megatron.txt" ||
  { echo "--global-batch-size 8 / --micro-batch-size 4 is not --grad-accum 2:"; grep '^model' "$work/megatron.txt"; exit 1; }
cmp "$work/a.safetensors" "$work/b.safetensors" || { echo "the weights differ"; exit 1; }
[[ -d "$work/cb/step_00000004" && -d "$work/cb/step_00000008" ]] || { echo "--save/--save-interval wrote:"; ls -R "$work/cb"; exit 1; }
for flag in --use-flash-attn --use-fused-rmsnorm --no-masked-softmax-fusion --transformer-impl --use-mcore-models \
            --no-gradient-accumulation-fusion --overlap-grad-reduce --distributed-backend; do
  [[ $(grep -c "^train_gpt: note: $flag changes nothing: " "$work/megatron.err") -eq 1 ]] ||
    { echo "no single note for $flag:"; cat "$work/megatron.err"; exit 1; }
done
grep -q "^train_gpt: note: --load '.*cb' holds no checkpoint yet: starting from step 0" "$work/megatron.err" ||
  { echo "no note for the fresh --load:"; cat "$work/megatron.err"; exit 1; }

# stopped at step 4, continued by the same command line (--load the --save directory): the
# uninterrupted run's numbers from step 4 on
last() { grep -oP '^step +[4-7]/8 \| loss \K[0-9.]+|final validation.*loss \K[0-9.]+' "$1" | tr '\n' ' '; }
"$bin/train_gpt" "${common[@]}" "${megatron[@]}" --out "$work/c.safetensors" --save "$work/cc" --load "$work/cc" \
  --stop-at-step 4 > "$work/part1.txt" 2>/dev/null
"$bin/train_gpt" "${common[@]}" "${megatron[@]}" --out "$work/c.safetensors" --save "$work/cc" --load "$work/cc" \
  > "$work/part2.txt" 2>/dev/null
grep -q 'resumed from .*step_00000004: step 4' "$work/part2.txt" || { echo "--load did not resume:"; cat "$work/part2.txt"; exit 1; }
w=$(last "$work/megatron.txt"); r=$(last "$work/part2.txt")
[[ -n "$w" && "$w" == "$r" ]] || { echo "resumed by --load: $r | uninterrupted: $w"; exit 1; }
cmp "$work/b.safetensors" "$work/c.safetensors" || { echo "the resumed weights differ"; exit 1; }

# --ckpt-step 4 with --load: that checkpoint (newer ones moved aside on request), the same numbers
"$bin/train_gpt" "${common[@]}" "${megatron[@]}" --out "$work/e.safetensors" --save "$work/cb" --load "$work/cb" \
  --ckpt-step 4 --discard-newer-checkpoints --async-save --use-dist-ckpt > "$work/step4.txt" 2> "$work/step4.err"
grep -q 'resumed from .*cb/step_00000004: step 4' "$work/step4.txt" && cmp -s "$work/b.safetensors" "$work/e.safetensors" &&
  [[ -d "$work/cb/set-aside/step_00000008" ]] && grep -q "^train_gpt: note: --async-save changes nothing: " "$work/step4.err" ||
  { echo "--ckpt-step 4:"; cat "$work/step4.txt" "$work/step4.err"; exit 1; }

# --adam-beta2 reaches the optimizer: another value, other losses
beta=("${megatron[@]}")
for i in "${!beta[@]}"; do [[ ${beta[$i]} == --adam-beta2 ]] && beta[$((i + 1))]=0.999; done
"$bin/train_gpt" "${common[@]}" "${beta[@]}" --out "$work/d.safetensors" > "$work/beta.txt" 2>/dev/null
d=$(losses "$work/beta.txt")
[[ -n "$d" && "$d" != "$b" ]] || { echo "--adam-beta2 0.999 changed nothing: $d"; exit 1; }
# an alias given beside its loom name is one flag given twice: the refusal names both
"$bin/train_gpt" --data "$work/text.txt" --train-iters 3 --steps 3 > "$work/twice.txt" 2>&1 && rc=0 || rc=$?
[[ $rc == 2 ]] && grep -q '^train_gpt: error: --steps and --train-iters name one flag, given 2 times' "$work/twice.txt" ||
  { echo "--train-iters 3 --steps 3: exit $rc,"; cat "$work/twice.txt"; exit 1; }
echo "Megatron's names == loom's names: $a"
echo "1 passed, 0 failed"
