#!/usr/bin/env bash
# Models from Megatron-LM's flags and Hugging Face config.json files, trained through instances
# compiled on first use (train::instance_cache) into the suite's cache ($LOOM_CACHE_DIR, the
# build's loom-cache), against the same shapes compiled into the build:
#   - odd_gqa (3 layers, 5 heads of 16 sharing one key/value head, SwiGLU 144, vocabulary 1999
#     padded to 2048) from flags: bitwise the train/loss of `--model odd_gqa` (compiled in);
#     a second run starts from the cache (no "compiling" line); a Llama config.json of that
#     shape is the same instance: the same parameter count and losses; examples/plan of the
#     flags (no instance compiled) equals the memory the run printed, and plan --layout auto of
#     the config.json chooses among the layouts it divides;
#   - char_tiny's shape from flags on --layout tp2pp2 (4 ranks): bitwise `--model char_tiny`
#     tp2pp2; a GPT-2 config.json of that shape on tp1pp1 equals the flags on tp1pp1;
#   - --device ascend on the emulation (optional 2nd argument, its home): quickstart's shape from
#     flags in bf16, bitwise `--model quickstart --device ascend --precision bf16`;
#   - sample of weights whose shape no program contains: its whole model compiled on first use;
#   - --prune-cache keeps the entries this build loads, and --list-instances lists them;
#   - refusals naming the fix: a layout that does not divide, a config.json field the recipe
#     lacks, shape flags beside --model, --num-query-groups without --group-query-attention.
#   tests/cli/on_demand.sh <dir with train_gpt and sample> [emulation home]
set -u
bin="$1"
home="${2:-}"
t="$bin/train_gpt"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export LOOM_CACHE_DIR="${LOOM_CACHE_DIR:-$work/cache}"
export OMP_NUM_THREADS=1
fail=0
pass=0
bad() { echo "FAILED: $*"; fail=$((fail + 1)); }
ok() { echo "ok: $*"; pass=$((pass + 1)); }
losses() { grep -o '"train/loss":[^,}]*' "$1/metrics.jsonl" | tr '\n' ' '; }
head -c 30000 "${LOOM_DATA_DIR:-../shared/data}/tinyshakespeare.txt" > "$work/data.txt"

run() {  # name [flags...]: trains 4 steps into $work/name, output in $work/name.txt
  local name="$1"; shift
  "$t" --data "$work/data.txt" --steps 4 --eval-every 0 --sample-tokens 0 --peak-gflops 1 --log-every 1 \
    --log-dir "$work/$name" --out "$work/$name.safetensors" "$@" > "$work/$name.txt" 2>&1 ||
    { bad "$name: $(tail -3 "$work/$name.txt")"; return 1; }
}
same() {  # a b what
  local la lb
  la="$(losses "$work/$1")"; lb="$(losses "$work/$2")"
  if [[ -n "$la" && "$la" == "$lb" ]]; then ok "$3: $la"; else bad "$3: '$la' vs '$lb'"; fi
}

odd=(--num-layers 3 --hidden-size 80 --num-attention-heads 5 --group-query-attention --num-query-groups 1
     --ffn-hidden-size 144 --swiglu --normalization RMSNorm --position-embedding-type rope
     --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 1999 --seq-length 24 --micro-batch 4)
if run odd_flags "${odd[@]}" && run odd_built --model odd_gqa --seq-len 24 --micro-batch 4; then
  grep -q "on-demand instance" "$work/odd_flags.txt" || bad "odd shape: no on-demand instance line"
  grep -q "on-demand instance" "$work/odd_built.txt" && bad "odd_gqa: took an on-demand instance, not the build's"
  same odd_flags odd_built "odd shape from flags (on first use) = odd_gqa compiled in"
  run odd_again "${odd[@]}" &&
    { grep -q "^compiling" "$work/odd_again.txt" && bad "second run compiled again" || ok "second run started from the cache"; }
  # --layout auto for the shape from flags: one rank, so tp1pp1, the cached instance; the same losses
  run odd_auto "${odd[@]}" --layout auto --memory-limit 2GiB &&
    { grep -q "^train_gpt: chosen tp1pp1" "$work/odd_auto.txt" && ! grep -q "^compiling" "$work/odd_auto.txt" ||
        bad "--layout auto of the odd shape: $(head -12 "$work/odd_auto.txt")"
      same odd_auto odd_flags "--layout auto of a shape from flags = its tp1pp1 run"; }
fi

# the cache after the runs: --prune-cache keeps what this build loads, --list-instances shows it
if "$t" --prune-cache > "$work/prune.txt" 2>&1 && grep -q "^removed [0-9]* stale or damaged entries" "$work/prune.txt" &&
   "$t" --list-instances > "$work/list.txt" 2>&1 && grep -q "^  llama_L3_C80_H5_KV1_F144_V1999p2048_S24 fp32 tp1pp1 cpu fused 4x24  \[" "$work/list.txt"; then
  ok "--prune-cache kept the current entries; --list-instances lists them"
else
  bad "--prune-cache / --list-instances: $(cat "$work/prune.txt" "$work/list.txt" 2>/dev/null)"
fi

# examples/plan of the same flags, no instance compiled (train::plan_shape): its row equals the
# memory the on-demand run printed
if [[ -f "$work/odd_flags.txt" ]]; then
  "$bin/plan" "${odd[@]}" --peak-gflops 100 > "$work/odd.plan" 2>&1 || bad "plan of the odd shape: $(cat "$work/odd.plan")"
  if python3 - "$work/odd_flags.txt" "$work/odd.plan" <<'PY'; then ok "plan of the odd shape from flags = the run's memory"; else bad "plan of the odd shape"; fi
import re, sys
run, plan = open(sys.argv[1]).read(), open(sys.argv[2]).read()
m = re.search(r"parameters ([0-9.]+) MiB, gradients ([0-9.]+) MiB, optimizer ([0-9.]+) MiB, activations ([0-9.]+) MiB", run)
row = re.search(r"^\| 0 \| (.*) \|$", plan, re.M)
assert m and row and "compiled on first use, for exactly 4 x 24" in plan, (run, plan)
p, g, master, moments, act, buckets, total = (float(x) for x in row.group(1).split(" | "))
got = (float(m[1]), float(m[2]), float(m[3]), float(m[4]))
want = (p, g, master + moments, act)
assert all(abs(a - b) <= 0.011 for a, b in zip(got, want)), (got, want)
PY
fi

cat > "$work/llama.json" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 80, "intermediate_size": 144,
 "num_hidden_layers": 3, "num_attention_heads": 5, "num_key_value_heads": 1, "max_position_embeddings": 24,
 "vocab_size": 1999, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "hidden_act": "silu",
 "tie_word_embeddings": false, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}
EOF
if run odd_config --model-config "$work/llama.json" --make-vocab-size-divisible-by 128 --micro-batch 4; then
  same odd_config odd_flags "Llama config.json = the same flags"
  pa="$(grep -o '[0-9,.]*[0-9] parameters' "$work/odd_config.txt" | head -1)"
  pb="$(grep -o '[0-9,.]*[0-9] parameters' "$work/odd_flags.txt" | head -1)"
  [[ -n "$pa" && "$pa" == "$pb" ]] && ok "Llama config.json parameters: $pa" || bad "parameters '$pa' vs '$pb'"
fi

tiny=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 32 --micro-batch 2)
if run tiny_tp2pp2 "${tiny[@]}" --layout tp2pp2 --ranks 4 --grad-accum 2 &&
   run char_tp2pp2 --model char_tiny --layout tp2pp2 --ranks 4 --grad-accum 2 --seq-len 32 --micro-batch 2; then
  same tiny_tp2pp2 char_tp2pp2 "char_tiny's shape from flags on tp2pp2 (on first use) = char_tiny tp2pp2 compiled in"
fi
cat > "$work/gpt2.json" <<'EOF'
{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32,
 "n_positions": 32, "n_ctx": 32, "vocab_size": 256, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05,
 "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1, "initializer_range": 0.02}
EOF
run tiny_flags "${tiny[@]}" && run tiny_config --model-config "$work/gpt2.json" --micro-batch 2 &&
  same tiny_config tiny_flags "GPT-2 config.json = the same flags"

# sample: weights of a shape no program contains; its whole model is compiled on first use
if "$bin/sample" --weights "$work/odd_flags.safetensors" --prompt "ROMEO:" --tokens 8 > "$work/sample.txt" 2>&1 &&
   grep -q "ROMEO:" "$work/sample.txt"; then
  ok "sample of an on-demand shape"
else
  bad "sample: $(tail -3 "$work/sample.txt")"
fi

if [[ -n "$home" ]]; then
  qs=(--num-layers 4 --hidden-size 192 --num-attention-heads 6 --max-position-embeddings 128 --vocab-size 256)
  common=(--device ascend --precision bf16 --micro-batch 2 --seq-len 32)
  ASCEND_HOME_PATH="$home" run npu_flags "${qs[@]}" "${common[@]}" &&
    ASCEND_HOME_PATH="$home" run npu_built --model quickstart "${common[@]}" &&
    same npu_flags npu_built "quickstart's shape from flags on the NPU emulation (on first use) = the build's"
fi

# examples/plan --layout auto for a config.json no build contains: every layout it divides
if "$bin/plan" --model-config "$work/llama.json" --layout auto --ranks 6 --global-batch 12 --memory-limit 1GiB \
     --peak-gflops 100 --link-gbps 10 > "$work/auto.plan" 2>&1 &&
   grep -q "^plan: chosen tp1pp[13] x dp [26]" "$work/auto.plan" && grep -q "compiled on first use" "$work/auto.plan"; then
  ok "plan --layout auto of a config.json"
else
  bad "plan --layout auto of a config.json: $(cat "$work/auto.plan")"
fi

refuse() {  # what expected-text [flags...]
  local what="$1" want="$2"; shift 2
  "$t" --data "$work/data.txt" --steps 1 "$@" > "$work/refuse.txt" 2>&1
  local rc=$?
  if [[ $rc == 2 ]] && grep -q -- "$want" "$work/refuse.txt"; then ok "refused: $what"; else
    bad "$what: exit $rc, $(cat "$work/refuse.txt")"; fi
}
refuse "5 heads on TP 2" "5 attention heads, not divisible by TP=2" "${odd[@]}" --layout tp2pp1 --ranks 2
sed 's/"torch_dtype"/"rope_scaling": {"type": "linear", "factor": 2.0}, "torch_dtype"/' "$work/llama.json" > "$work/scaled.json"
refuse "rope_scaling in a config.json" '"rope_scaling"' --model-config "$work/scaled.json"
refuse "shape flags beside --model" "is a preset" --model char_tiny --num-layers 3 --hidden-size 32 --num-attention-heads 2
refuse "--num-query-groups alone" "with --group-query-attention" "${tiny[@]}" --num-query-groups 1
refuse "6 heads on TP 4 before the ranks it needs" "6 attention heads, not divisible by TP=4" \
  --num-layers 2 --hidden-size 96 --num-attention-heads 6 --seq-length 16 --layout tp4pp1
"$t" --data "$work/missing.txt" --steps 1 --num-layers 2 --hidden-size 48 --num-attention-heads 3 --seq-length 16 \
  > "$work/missing.out" 2>&1 && rc=0 || rc=$?
if [[ $rc == 2 ]] && grep -q "missing.txt' does not exist" "$work/missing.out" && ! grep -q "^compiling" "$work/missing.out"; then
  ok "refused: a missing --data file, before anything is compiled"
else
  bad "a missing --data file: exit $rc, $(cat "$work/missing.out")"
fi
refuse "--num-layers alone names both missing flags" \
  "^train_gpt: error: --hidden-size and --num-attention-heads are needed" --num-layers 2 --seq-length 16

echo "$pass passed, $fail failed"
[[ $fail == 0 ]]
