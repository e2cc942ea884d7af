#!/usr/bin/env bash
# The main job: install dependencies, build train_gpt and sample, train the quickstart GPT on
# tinyshakespeare (byte-level, CPU, fp32), then sample from the saved weights.
#   scripts/quickstart.sh [extra train_gpt flags, e.g. --steps 500]
# Environment: LOOM_DATA (default ../shared/data/tinyshakespeare.txt), LOOM_BUILD_DIR (default build).
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
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$build_dir" --target train_gpt sample
"$build_dir/examples/train_gpt" --data "$data" --out out/quickstart.safetensors "$@"
echo
echo "== sampling from out/quickstart.safetensors =="
"$build_dir/examples/sample" --weights out/quickstart.safetensors --prompt "ROMEO:" --tokens 400 --temperature 0.8 --top-k 40
