#!/usr/bin/env bash
# The main job: install dependencies, build, prepare tinyshakespeare (clean, deduplicate, train a
# SentencePiece BPE tokenizer, write a Megatron-style indexed dataset), train the quickstart GPT
# on it (models::quickstart_bpe, CPU, fp32), report validation loss in nats/token and bits/byte,
# then sample from the saved weights.
#   scripts/quickstart.sh [extra train_gpt flags, e.g. --steps 300]
#   scripts/quickstart.sh --model llama_quickstart   # the same with the quickstart's Llama
# Environment: LOOM_DATA (default ../shared/data/tinyshakespeare.txt), LOOM_BUILD_DIR (default build).
# Writes out/shakespeare.{bin,idx,model,json} (a later run reuses them while the input is
# unchanged, else prepares again and keeps them as out/shakespeare.previous-<k>.*) and
# out/<model>.safetensors (a later run keeps it as
# out/<model>.previous-<k>.safetensors; train_gpt checks that --out is writable before
# training), logs in out/logs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

data="${LOOM_DATA:-../shared/data/tinyshakespeare.txt}"
build_dir="${LOOM_BUILD_DIR:-build}"
if [[ ! -f "$data" ]]; then
  echo "quickstart: $data not found; set LOOM_DATA to a UTF-8 text file, e.g. tinyshakespeare from" >&2
  echo "  https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt" >&2
  exit 2
fi

bash scripts/setup.sh
if [[ -f "$build_dir/CMakeCache.txt" ]] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$build_dir/CMakeCache.txt"; then
  echo "quickstart: $build_dir/ was configured with another generator; remove it or set LOOM_BUILD_DIR" >&2
  exit 1
fi
# a new build directory gets the quickstart's build: the programs and the one instance it trains
# (tests off; scripts/test.sh turns them on); an existing one keeps its settings
fresh=()
[[ -f "$build_dir/CMakeCache.txt" ]] || fresh=(-DLOOM_BUILD_TESTS=OFF -DLOOM_BUILD_BENCHMARKS=OFF)
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${fresh[@]}" > /dev/null
cmake --build "$build_dir" --target prepare_data train_gpt sample
mkdir -p out
# the dataset is prepared again unless this script prepared it from the same input: the stamp
# out/shakespeare.quickstart records the input's path, size and modification time, and is newer
# than the dataset's summary (a prepare_data run of your own on out/shakespeare replaces both)
stamp="$(realpath "$data") $(stat -c '%s %Y' "$data") vocab 8000"
if [[ -f out/shakespeare.quickstart && "$(cat out/shakespeare.quickstart)" == "$stamp" ]] &&
   [[ -f out/shakespeare.bin && -f out/shakespeare.idx && -f out/shakespeare.model && -f out/shakespeare.json ]] &&
   ! [[ out/shakespeare.json -nt out/shakespeare.quickstart ]]; then
  echo "== out/shakespeare is already prepared from $data (remove out/shakespeare.quickstart to prepare it again) =="
else
  echo "== preparing $data -> out/shakespeare (clean, dedup, filter, BPE tokenizer, indexed dataset) =="
  rm -f out/shakespeare.quickstart
  "$build_dir/examples/prepare_data" --input "$data" --output-prefix out/shakespeare --vocab-size 8000
  echo "$stamp" > out/shakespeare.quickstart
fi
echo
model=quickstart_bpe   # unless the caller passes --model
steps=(--steps 600)    # unless the caller passes --steps (1200 overfits: see docs/performance.md)
prev=""
for arg in "$@"; do
  [[ "$arg" == --steps || "$arg" == --steps=* ]] && steps=()
  [[ "$prev" == --model ]] && model="$arg"
  [[ "$arg" == --model=* ]] && model="${arg#--model=}"
  prev="$arg"
done
echo "== training models::$model on out/shakespeare =="
"$build_dir/examples/train_gpt" --data out/shakespeare "${steps[@]}" --out "out/$model.safetensors" "$@"
echo
echo "== sampling from out/$model.safetensors =="
"$build_dir/examples/sample" --weights "out/$model.safetensors" --prompt "ROMEO:" --tokens 200 --temperature 0.8 --top-k 40
