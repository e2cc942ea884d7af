#pragma once
// train_gpt's command-line options, shared by train_gpt.cpp (one layout: data parallel over
// replicas of the whole model) and train_gpt/layout_*.cpp (--layout tpXppY: tensor and pipeline
// parallel, data parallel on top). Not a library header: examples/ only.
#include <cstdint>
#include <regex>
#include <string>
#include <utility>

#include <loom/core/error.hpp>

namespace train_gpt_cli {

/// Every flag of train_gpt (see main() in train_gpt.cpp for their help strings).
struct options {
  std::string data, model = "quickstart", out, prompt = "\n";
  long steps = 2000;
  int micro_batch = 0, seq_len = 0, grad_accum = 1;
  double lr = 2e-3, min_lr = 2e-4, weight_decay = 0.1, max_grad_norm = 1.0, val_fraction = 0.1;
  double dropout = 0;  // --dropout P: training dropout probability, 0 <= P < 1 (nn/dropout.hpp)
  long warmup = 100;
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
  // data parallelism (train/data_parallel.hpp, docs/parallel.md)
  int ranks = 1;
  std::string comm = "threads";
  double bucket_mb = 1.0;
  bool no_overlap = false, zero1 = false;
  long replica_check_every = 100;
  double comm_timeout = 600;  // seconds a collective may take before the run ends with an error naming it
  std::string precision = "fp32";  // fp32 | bf16 | fp16 (docs/precision.md)
  std::string layout = "tp1pp1";   // tensor x pipeline parallel degrees, tp<T>pp<P> (docs/tensor_pipeline.md)
};

/// "tp<T>pp<P>" -> {T, P}; throws loom::input_error for anything else.
inline std::pair<int, int> parse_layout(const std::string& s) {
  std::smatch m;
  static const std::regex re("tp([1-9][0-9]?)pp([1-9][0-9]?)");
  if (!std::regex_match(s, m, re))
    throw loom::input_error("--layout '" + s + "' is not of the form tp<TP>pp<PP>; pass e.g. --layout tp2pp2 "
                            "(tensor parallel 2, pipeline parallel 2) or tp1pp1 (the default)");
  return {std::stoi(m[1]), std::stoi(m[2])};
}

/// Throws loom::input_error naming the first quantity of M that tp or pp does not divide (the
/// run-time twin of parallel::fits<layout<TP,PP>, M>(), which rejects such a layout at compile
/// time, so the dispatcher must check before choosing an instantiation). train_gpt runs it first,
/// before the world-size check: a layout that cannot split the model is the more basic problem.
template <class M>
void check_layout_fits(int tp, int pp) {
  const std::string l = "--layout tp" + std::to_string(tp) + "pp" + std::to_string(pp) + ": model " + std::string(M::name);
  auto bad = [&](const std::string& what, int n, const char* deg, int d) {
    throw loom::input_error(l + " has " + std::to_string(n) + " " + what + ", not divisible by " + deg + "=" +
                            std::to_string(d) + "; choose " + deg + " dividing " + std::to_string(n));
  };
  if (M::n_head % tp) bad("attention heads", M::n_head, "TP", tp);
  if ((4 * M::d_model) % tp) bad("MLP columns (4 x width)", 4 * M::d_model, "TP", tp);
  if (M::vocab_padded % tp) bad("padded vocabulary rows", M::vocab_padded, "TP", tp);
  if (M::n_layer % pp) bad("layers", M::n_layer, "PP", pp);
}

/// The flags a --layout run refuses, then the world size; throws loom::input_error.
inline void check_layout_run(const options& o, int tp, int pp, int world_size) {
  const std::string l = "--layout tp" + std::to_string(tp) + "pp" + std::to_string(pp);
  if (o.precision != "fp32" && (o.model != "char_tiny" || tp != 2 || pp != 2))
    throw loom::input_error(l + " with --precision " + o.precision + " and --model " + o.model +
                            ": 16-bit tensor/pipeline-parallel training is compiled for --layout tp2pp2 --model char_tiny "
                            "only (each instantiation costs build time); pass those, drop --precision (fp32), or use "
                            "--layout tp1pp1 --ranks 1");
  if (o.precision != "fp32" && o.comm != "threads")
    throw loom::input_error(l + " --precision " + o.precision + " --comm " + o.comm + ": 16-bit tensor/pipeline-"
                            "parallel training is compiled for --comm threads only; pass --comm threads --ranks N, or "
                            "drop --precision (fp32)");
  if (world_size % (tp * pp) != 0)
    throw loom::input_error(l + " needs a multiple of TP*PP = " + std::to_string(tp * pp) + " ranks (TP*PP*DP), got " +
                            std::to_string(world_size) + "; pass --ranks " + std::to_string(tp * pp) + " (DP=1) or " +
                            std::to_string(2 * tp * pp) + " (DP=2), or mpirun -np " + std::to_string(tp * pp) +
                            " ... --comm mpi");
}

/// Runs one rank of a --layout tp<tp>pp<pp> run (tp*pp > 1) of model M on `world`, whose size
/// must be tp*pp*DP. Explicitly instantiated for models::char_tiny and models::quickstart_bpe
/// (train_gpt/layout_<model>.cpp, one translation unit each so they compile in parallel) and
/// World = comm::threads, comm::mpi. Returns 0; throws loom::input_error for a layout that is
/// not compiled or does not divide the model, a world size that is not a multiple of tp*pp, or
/// a flag the layout trainer does not support.
template <class M, class World>
int run_layout(const options& o, int tp, int pp, World& world);

/// As run_layout in bf16 or fp16 (o.precision; fp16 with a dynamic loss scaler): --layout tp2pp2
/// only, instantiated for models::char_tiny in train_gpt/layout_char_tiny_16bit.cpp (its own
/// translation unit, built in parallel with the fp32 ones). Called by run_layout when
/// o.precision is not fp32; throws loom::input_error for another layout.
template <class M, class World>
int run_layout_16bit(const options& o, int tp, int pp, World& world);

}  // namespace train_gpt_cli
