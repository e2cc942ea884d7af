#!/usr/bin/env bash
# Llama 2 7B, 13B and 70B planned from their config.json (bench/configs/, Hugging Face's values)
# on Ascend 910B NPUs, without compiling anything (examples/plan, train::plan_shape): loom's own
# choice (--layout auto) on 8 and 64 NPUs, and MindSpeed-LLM's published layouts
# (examples/mcore/llama2/pretrain_llama2_{7b,13b,70b_pack}_ptd.sh: 7B tp1pp2 on 8 with the
# distributed optimizer, 13B tp8pp1 on 8 at micro-batch 4, 70B tp8pp4 on 32), as loom plans them.
# Assumed, not measured: 64 GB per NPU, 3 GiB of runtime overhead, 100 GB/s all-reduce bus
# bandwidth in an 8-NPU node and 20 GB/s between nodes, the 910B table peak.
#   bench/plan_llama2.sh [build dir]     (prints plan's output for each case)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
plan="${1:-build}/examples/plan"
[[ -x "$plan" ]] || { echo "plan_llama2.sh: no $plan; build it: cmake --build ${1:-build} --target plan" >&2; exit 2; }
net=(--device ascend --precision bf16 --seq-length 4096 --link-gbps 100 --devices-per-node 8 --inter-node-gbps 20)
for model in 7b 13b 70b; do
  for ranks in 8 64; do
    echo "== Llama 2 ${model^^} on $ranks NPUs, --layout auto, global batch 256 =="
    "$plan" --model-config "bench/configs/llama-2-$model.json" "${net[@]}" --layout auto --memory-limit 64GB \
      --ranks "$ranks" --global-batch 256 --micro-batch 1 --show 2 || true
    echo
  done
done
echo "== MindSpeed-LLM's layouts, planned by loom =="
"$plan" --model-config bench/configs/llama-2-7b.json "${net[@]}" --layout tp1pp2 --ranks 8 \
  --micro-batch 1 --grad-accum 64 --zero1 2>&1 | sed 's/^/7B: /' || true
"$plan" --model-config bench/configs/llama-2-13b.json "${net[@]}" --layout tp8pp1 --ranks 8 \
  --micro-batch 4 --grad-accum 128 2>&1 | sed 's/^/13B: /' || true
"$plan" --model-config bench/configs/llama-2-70b.json "${net[@]}" --layout tp8pp4 --ranks 32 \
  --micro-batch 1 --grad-accum 128 2>&1 | sed 's/^/70B: /' || true
