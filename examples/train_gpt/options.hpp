#pragma once
// train_gpt's command-line options, shared by train_gpt.cpp (flags, ranks) and train_gpt/run.cpp
// (the run loop). Not a library header: examples/ only.
#include <cstdint>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/nn/activations.hpp>

namespace train_gpt_cli {

/// Every flag of train_gpt (see main() in train_gpt.cpp for their help strings).
struct options {
  std::string data, model = "quickstart", out, prompt = "\n";
  long steps = 2000;
  int micro_batch = 0, seq_len = 0, grad_accum = 1;
  double lr = 2e-3, min_lr = 2e-4, weight_decay = 0.1, max_grad_norm = 1.0, val_fraction = 0.1;
  double dropout = 0;  // --dropout P: training dropout probability, 0 <= P < 1 (nn/dropout.hpp)
  std::string recompute = "none";  // --recompute none|selective|full (nn::recompute)
  long warmup = 100;
  long decay_steps = 0;  // --decay-steps: the cosine reaches --min-lr here (0: --steps; Megatron's --lr-decay-iters)
  long eval_every = 250;
  long early_stop = 0;  // --early-stop PATIENCE: evaluations without improvement before stopping (0: off)
  int eval_windows = 64, sample_tokens = 400, top_k = 0;
  double temperature = 0.8;
  std::uint64_t seed = 1337;
  double time_budget = 0;  // seconds; 0 = none
  std::string log_dir = "out/logs", profile_steps;
  double peak_gflops = 0;  // 0 = measure at start-up
  bool synthetic_data = false;  // isolation switch: train on in-memory random batches
  bool no_data_checksum = false;  // --no-data-checksum: skip checking a dataset's .bin/.idx against PREFIX.json
  long summary_every = 500;
  // checkpoints (io/checkpoint.hpp, docs/checkpoint.md)
  std::string checkpoint_dir, resume, export_hf, init_from_hf;
  long save_every = 100, stop_at_step = 0;
  int keep = 5;
  bool discard_newer_checkpoints = false;  // --resume into a directory with newer checkpoints: move them aside
  bool exit_on_save_failure = false;       // stop at the first failed checkpoint save (else: exit 1 at the end)
  bool exit_signal_handler = false;        // SIGTERM/SIGINT: finish the step, save a checkpoint, exit 0
  double exit_duration_in_mins = 0;        // Megatron's name for --time-budget, in minutes
  int keep_previous = 5;                   // --keep-previous N: earlier runs' weights and logs kept beside --out, --log-dir (0: all)
  long exit_interval = 0;                  // --exit-interval N: stop after the first step that is a multiple of N
  // data parallelism (parallel/data_parallel.hpp, docs/parallel.md)
  int ranks = 1;
  std::string comm = "threads";
  double bucket_mb = 1.0;
  bool no_overlap = false, zero1 = false;
  bool offload_optimizer = false;  // --offload-optimizer: AdamW state in pinned host memory (device ascend; optim/offload.hpp)
  bool offload_overlap = true;     // --offload-overlap on|off: the host update beside the next forward (optim/offload.hpp)
  long replica_check_every = 100;
  double comm_timeout = 600;  // seconds a collective may take before the run ends with an error naming it
  std::string precision = "fp32";  // fp32 | bf16 | fp16 (docs/precision.md)
  std::string layout = "tp1pp1";   // tensor x pipeline parallel degrees, tp<T>pp<P> (docs/tensor_pipeline.md), or auto
  std::string memory_limit;        // --layout auto: bytes per rank (train::parse_bytes: 24GiB, 512MiB)
  int global_batch = 0;            // --layout auto: sequences per step over all ranks (0: micro x accum x ranks)
  std::string device = "cpu";      // cpu | ascend (an NPU per rank, HCCL; docs/ascend.md)
  bool allow_fp32_matmul = false;  // --device ascend --precision fp32: the deliberate fp32-matmul opt-in
  int npu = -1;                    // --device ascend: this rank's NPU ordinal (-1: the world rank)
  bool no_device_timing = false;   // --device ascend: no per-step device-time breakdown
  bool deterministic = false;      // --deterministic-mode: deterministic NPU kernels and HCCL reductions
  std::string attention = "fused"; // fused | reference (kernels::fused, kernels::reference)
  double loss_scale = 512;         // fp16: the dynamic loss scaler's initial scale
  long log_every = 10;             // console: one line every N steps (plus the first and the last)
  int redraw = -1;                 // console: -1 auto (terminal), 0 plain lines (--log-every given)
  int workers = 1;                 // loader prefetch threads for a dataset (0: read on the training thread)
  bool list_instances = false;     // --list-instances: print the compiled instances and exit
  bool prune_cache = false;        // --prune-cache: remove stale instances from the cache and exit
  // Megatron-LM's names without a loom flag of the same meaning (flags.hpp: add_megatron_flags,
  // apply_megatron_flags; docs/megatron.md)
  std::vector<std::string> data_path;  // --data-path PREFIX (one; a weighted blend is refused)
  std::string load;                    // --load DIR: --resume, or a fresh start when DIR is --save's and empty
  std::string lr_decay_style = "cosine";  // cosine | constant (--min-lr = --lr)
  double lr_warmup_fraction = 0;       // --lr-warmup-fraction: of the decay steps, rounded to whole steps
  double adam_beta1 = 0.9, adam_beta2 = 0.95, adam_eps = 1e-8;  // optim::adamw_config
  double init_method_std = 0.02;       // accepted as loom's own (nn/transformer.hpp initialize), other values refused
  bool bf16 = false, fp16 = false;     // --bf16 / --fp16: --precision bf16 / fp16
  int tp_size = 1, pp_size = 1;        // --tensor/--pipeline-model-parallel-size: --layout tp<T>pp<P>
  std::string recompute_granularity, recompute_method;  // full | selective -> --recompute; uniform (1 layer)
  int recompute_num_layers = 1;
  bool recompute_activations = false;  // Megatron's older spelling of --recompute-granularity selective
  bool sequence_parallel = false;      // refused: loom has no sequence parallelism
  int context_parallel_size = 1, expert_parallel_size = 1, virtual_pipeline_size = 1, num_experts = 0;
  std::string split;                   // refused: loom has --val-fraction and no test split
  long ckpt_step = -1;                 // --ckpt-step N with --load DIR: resume DIR/step_N
  std::vector<std::string> notes;      // "note: ..." / "warning: ..." lines main() prints to stderr once
};

/// --recompute's value as nn::recompute (the flag accepts only these three words).
inline loom::nn::recompute recompute_mode(const std::string& s) {
  return s == "full" ? loom::nn::recompute::full : s == "selective" ? loom::nn::recompute::selective
                                                                     : loom::nn::recompute::none;
}

/// "tp<T>pp<P>" -> {T, P}; throws loom::input_error for anything else.
inline std::pair<int, int> parse_layout(const std::string& s) {
  std::smatch m;
  static const std::regex re("tp([1-9][0-9]?)pp([1-9][0-9]?)");
  if (!std::regex_match(s, m, re))
    throw loom::input_error("--layout '" + s + "' is not of the form tp<TP>pp<PP>; pass e.g. --layout tp2pp2 "
                            "(tensor parallel 2, pipeline parallel 2) or tp1pp1 (the default)");
  return {std::stoi(m[1]), std::stoi(m[2])};
}

/// Throws loom::input_error when a world of `world_size` ranks is not a multiple of tp * pp.
inline void check_world_size(int tp, int pp, int world_size) {
  const std::string l = "--layout tp" + std::to_string(tp) + "pp" + std::to_string(pp);
  if (world_size % (tp * pp) != 0)
    throw loom::input_error(l + " needs a multiple of TP*PP = " + std::to_string(tp * pp) + " ranks (TP*PP*DP), got " +
                            std::to_string(world_size) + "; pass --ranks " + std::to_string(tp * pp) + " (DP=1) or " +
                            std::to_string(2 * tp * pp) + " (DP=2), or mpirun -np " + std::to_string(tp * pp) +
                            " ... --comm mpi");
}

}  // namespace train_gpt_cli
