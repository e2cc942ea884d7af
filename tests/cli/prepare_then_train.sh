#!/usr/bin/env bash
# The SentencePiece path end to end, on a slice of each real corpus: prepare_data (clean, dedup,
# train a small BPE tokenizer, write the indexed dataset) -> train_gpt --data PREFIX (defaults to
# quickstart_bpe; 30 steps at micro-batch 2 x seq 32) -> sample. Checks: the loss falls, the
# validation report gives bits/byte from exact bytes and it agrees with PREFIX.json's average
# bytes/token, samples are valid UTF-8 (Chinese characters for zh_classics) and reproducible,
# a prompt typed with full-width forms is normalized as the training text was (PREFIX.json's
# "normalization": the same sample as the half-width prompt), and a byte-level model is refused
# for the dataset with the fix named. The quickstart's Llama (--model llama_quickstart) trains on
# the English dataset too, exports Hugging Face LlamaForCausalLM weights and samples.
#   tests/cli/prepare_then_train.sh <dir with prepare_data, train_gpt and sample>
set -euo pipefail
bin="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
data="${LOOM_DATA_DIR:-../shared/data}"
# One OpenMP thread: the model is tiny at these shapes, and on a shared (oversubscribed)
# machine two spinning OpenMP threads make a step 5-30x slower.
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }

# usage: run_corpus NAME FILE LINES VOCAB PROMPT WIDE_PROMPT (PROMPT with full-width forms)
run_corpus() {
  local name="$1" file="$2" lines="$3" vocab="$4" prompt="$5" wide="$6"
  head -n "$lines" "$data/$file" > "$work/$name.txt"
  "$bin/prepare_data" --input "$work/$name.txt" --output-prefix "$work/$name" --vocab-size "$vocab" \
    --threads 2 > "$work/$name.prep.txt"
  [[ -s "$work/$name.idx" && -s "$work/$name.bin" && -s "$work/$name.model" && -s "$work/$name.json" ]] ||
    fail "$name: prepare_data did not write PREFIX.idx/.bin/.model/.json"

  "$bin/train_gpt" --data "$work/$name" --steps 30 --micro-batch 2 --seq-len 32 --eval-every 15 --eval-windows 8 \
    --log-dir '' --peak-gflops 100 --summary-every 0 --sample-tokens 40 --prompt "$prompt" \
    --out "$work/$name.safetensors" > "$work/$name.log" || { cat "$work/$name.log"; fail "$name: train_gpt failed"; }
  local log="$work/$name.log"
  grep -q '^model quickstart_bpe:' "$log" || fail "$name: a dataset did not default to quickstart_bpe"
  grep -q "(indexed, uint16 ids, vocabulary $vocab)" "$log" || fail "$name: data line does not describe the dataset"
  grep -q "; .bin and .idx checksums verified" "$log" || fail "$name: the dataset's checksums were not verified"
  local first last
  first=$(grep -oP '^step +0/30 \| loss \K[0-9.]+' "$log")
  last=$(grep -oP '^step +29/30 \| loss \K[0-9.]+' "$log")
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }' || { cat "$log"; fail "$name: loss did not fall: $first -> $last"; }
  local final nats bpb
  final=$(grep '^final validation' "$log") || fail "$name: no final validation line"
  [[ "$final" == *"(bytes: exact, from the decoded target tokens)"* ]] || fail "$name: bits/byte not from exact bytes: $final"
  nats=$(grep -oP '^final validation.*val loss \K[0-9.]+' "$log")
  bpb=$(grep -oP '^final validation.*nats/token \| \K[0-9.]+(?= bits/byte)' "$log")
  # independent check: with PREFIX.json's average bytes per token, bpb ~ nats / ln2 / (bytes/token)
  python3 - "$work/$name.json" "$nats" "$bpb" <<'EOF' || fail "$name: bits/byte $bpb disagrees with the average bytes/token"
import json, math, sys
s = json.load(open(sys.argv[1]))
nats, bpb = float(sys.argv[2]), float(sys.argv[3])
approx = nats / math.log(2) / (s["text_bytes"] / s["tokens"])
print(f"  bits/byte {bpb:.4f} (exact bytes) vs {approx:.4f} (average {s['text_bytes'] / s['tokens']:.2f} bytes/token)")
sys.exit(0 if 0 < bpb and abs(bpb - approx) < 0.25 * approx else 1)
EOF

  # samples: valid UTF-8, starting with the prompt; same seed -> same text, other seed -> other text
  "$bin/sample" --weights "$work/$name.safetensors" --prompt "$prompt" --tokens 40 --seed 3 > "$work/$name.s1"
  "$bin/sample" --weights "$work/$name.safetensors" --tokenizer "$work/$name.model" --prompt "$prompt" --tokens 40 \
    --seed 3 > "$work/$name.s2"
  "$bin/sample" --weights "$work/$name.safetensors" --prompt "$prompt" --tokens 40 --seed 4 > "$work/$name.s3"
  cmp -s "$work/$name.s1" "$work/$name.s2" || fail "$name: the same seed gave different samples"
  # the prompt's normalization is the dataset's: full-width letters, digits and punctuation give
  # the ids of their half-width forms, so the same sample
  python3 -c 'import json,sys; n=json.load(open(sys.argv[1]))["normalization"]; sys.exit(n["name"] != "loom-v2")' \
    "$work/$name.json" || fail "$name: PREFIX.json does not record the normalization loom-v2"
  "$bin/sample" --weights "$work/$name.safetensors" --prompt "$wide" --tokens 40 --seed 3 > "$work/$name.s4"
  cmp -s "$work/$name.s1" "$work/$name.s4" ||
    fail "$name: the prompt '$wide' was not normalized to '$prompt': $(head -c 80 "$work/$name.s4")"
  ! cmp -s "$work/$name.s1" "$work/$name.s3" || fail "$name: different seeds gave the same sample"
  sed -n '/^---- sample/,/^----$/p' "$log" > "$work/$name.s0"
  for f in s0 s1 s3; do
    python3 - "$work/$name.$f" "$prompt" "$name" <<'EOF' || fail "$name: sample $f is not what it should be"
import sys
raw = open(sys.argv[1], "rb").read()
text = raw.decode("utf-8")  # strict: invalid UTF-8 raises
prompt, name = sys.argv[2], sys.argv[3]
if not sys.argv[1].endswith("s0") and not text.startswith(prompt): sys.exit(1)
han = sum(1 for c in text if "\u4e00" <= c <= "\u9fff")
letters = sum(1 for c in text if c.isascii() and c.isalpha())
print(f"  {name} {sys.argv[1][-2:]}: {len(raw)} bytes, {han} CJK characters: {text[:60]!r}")
sys.exit(0 if (han > 5 if name == "zh" else letters > 10) else 1)
EOF
  done

  # the byte-level quickstart cannot take this vocabulary: exit 2, both sizes, the fix
  local err
  if err=$("$bin/train_gpt" --data "$work/$name.idx" --model quickstart --steps 1 --log-dir '' 2>&1 >/dev/null); then
    fail "$name: --model quickstart accepted a $vocab-token dataset"
  fi
  [[ "$err" == *"vocabulary of $vocab tokens, more than the 256 of model quickstart"*"--model quickstart_bpe"* ]] ||
    fail "$name: unexpected error: $err"
  echo "$name: loss $first -> $last, final val $nats nats/token, $bpb bits/byte"
}

run_corpus en tinyshakespeare.txt 4000 1000 "ROMEO:" "ＲＯＭＥＯ："
run_corpus zh zh_classics.txt 400 2000 "第1章子曰" "第１章子曰"

# the Llama on the English dataset: the loss falls, the export is a Llama checkpoint, sampling works
"$bin/train_gpt" --data "$work/en" --model llama_quickstart --steps 30 --micro-batch 2 --seq-len 32 --eval-windows 8 \
  --log-dir '' --peak-gflops 100 --summary-every 0 --sample-tokens 0 --out "$work/llama.safetensors" \
  --export-hf "$work/llama_hf" > "$work/llama.log" || { cat "$work/llama.log"; fail "llama: train_gpt failed"; }
grep -q '^model llama_quickstart:' "$work/llama.log" || { cat "$work/llama.log"; fail "llama: no model line"; }
first=$(grep -oP '^step +0/30 \| loss \K[0-9.]+' "$work/llama.log")
last=$(grep -oP '^step +29/30 \| loss \K[0-9.]+' "$work/llama.log")
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }' || { cat "$work/llama.log"; fail "llama: loss did not fall: $first -> $last"; }
python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); sys.exit(not (c["model_type"] == "llama" and c["num_key_value_heads"] == 2))' \
  "$work/llama_hf/config.json" || fail "llama: the export's config.json is not a Llama config with 2 key/value heads"
"$bin/sample" --weights "$work/llama.safetensors" --prompt "ROMEO:" --tokens 30 --seed 3 > "$work/llama.s1"
python3 -c 'import sys; t=open(sys.argv[1],"rb").read().decode("utf-8"); sys.exit(not t.startswith("ROMEO:"))' \
  "$work/llama.s1" || fail "llama: the sample does not start with the prompt"
echo "llama: loss $first -> $last"
echo "3 passed, 0 failed"
