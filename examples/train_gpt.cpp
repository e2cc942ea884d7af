// train_gpt — the main job: train a GPT on the CPU from a UTF-8 text file (byte tokens) or
// from a dataset written by prepare_data (SentencePiece tokens), report loss, learning rate,
// gradient norm, step time and tokens/s per step, validation loss in nats per token and bits
// per byte, then save the weights and print a sample.
//
//   train_gpt --data ../shared/data/tinyshakespeare.txt            # the quickstart
//   train_gpt --data my.txt --model char_tiny --steps 50 --out out/tiny.safetensors
//   prepare_data --input ../shared/data/tinyshakespeare.txt --output-prefix out/shakespeare
//   train_gpt --data out/shakespeare                                # quickstart_bpe on the tokens
//
// --data names a dataset when it ends in .idx/.bin or PREFIX.idx exists (data::batch_source):
// then the model defaults to quickstart_bpe, the validation split is by document, and the
// sample is decoded with PREFIX.model (needs a build with LOOM_WITH_TEXT); the prompt is first
// normalized as the dataset's text was (PREFIX.json's "normalization").
//
// Validation: every --eval-every steps on the first --eval-windows windows of the validation
// split (all of them if it has fewer), at the end on every window of it (a last partial
// micro-batch included: the loss does not depend on --micro-batch). --early-stop PATIENCE ends
// training when the validation loss has not improved for PATIENCE evaluations; the saved
// weights, final validation and sample are then the best evaluation's (it says which step).
//
// Checkpoints (docs/checkpoint.md): --checkpoint-dir DIR saves every --save-every steps (100)
// and at the end, keeping the newest --keep (5); --resume DIR continues bit for bit from the
// newest valid one (a damaged newest one falls back to the previous, with a warning);
// --export-hf / --init-from-hf write / read Hugging Face GPT-2 weights.
//   train_gpt --data x.txt --model char_tiny --steps 600 --checkpoint-dir out/ckpt
//   train_gpt --data x.txt --model char_tiny --steps 600 --resume out/ckpt     # after a crash
//
// Data parallel (docs/parallel.md): --ranks N runs N replicas as threads of this process, each
// on its own part of every global batch (micro-batch x accumulation per rank), gradients
// all-reduced in --bucket-mb buckets while backward runs (--no-overlap serialises them);
// `mpirun -np N train_gpt --comm mpi ...` runs one process per rank (a build with loom::mpi).
// --zero1 shards the AdamW moments. Only rank 0 prints, logs and evaluates; rank 0 saves
// checkpoints (in the background), or every rank with --zero1 (its moment shard; blocking).
//   train_gpt --data ../shared/data/tinyshakespeare.txt --ranks 2
//   mpirun -np 2 train_gpt --data ../shared/data/tinyshakespeare.txt --comm mpi --zero1
//
// Tensor and pipeline parallel (docs/tensor_pipeline.md): --layout tp2pp2 splits the model over
// TP*PP ranks (Megatron-LM's layout; models char_tiny and quickstart_bpe, fp32; bf16/fp16 on
// tp2pp2 for char_tiny over threads: train_gpt/layout_char_tiny_16bit.cpp); the world is
// TP*PP*DP ranks, data parallel on top. --grad-accum is the pipeline's micro-batch count.
//   train_gpt --data ../shared/data/tinyshakespeare.txt --model char_tiny --layout tp2pp2 --ranks 4 --grad-accum 4
//
// Precision (docs/precision.md): --precision bf16 stores weights and activations in bfloat16 with
// fp32 accumulation, fp32 gradients and fp32 master weights; fp16 adds dynamic loss scaling
// (logged as train/loss_scale; on the console whenever it changes). One rank, or --layout tp2pp2
// with --model char_tiny (any DP on top); not yet data parallel on the one-layout path.
//   train_gpt --data ../shared/data/tinyshakespeare.txt --precision bf16
//
// Dropout (docs/model.md): --dropout P drops with probability P on the embedding, the attention
// probabilities and both residual branches while training (GPT-2 used 0.1), never in validation
// or sampling; off by default; masks are counter-based, so --resume and every --layout see the
// same masks. CPU only.
//   train_gpt --data ../shared/data/tinyshakespeare.txt --model char_tiny --dropout 0.1
//
// Bad input (missing/empty/binary file, a corpus shorter than one sequence, an unknown or
// malformed flag, a sequence length above the model's maximum) exits with status 2 and one
// line naming the problem and the fix.
#include <CLI/CLI.hpp>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <type_traits>

#include <loom/core/dropout.hpp>
#include <loom/core/memory.hpp>
#include <loom/data/source.hpp>
#include <loom/device/cpu.hpp>
#include <loom/io/trace.hpp>
#include <loom/parallel/comm_threads.hpp>
#if LOOM_WITH_MPI
#include <loom/parallel/comm_mpi.hpp>  // --comm mpi: links loom::mpi
#endif

#include "train_gpt/options.hpp"
#include "train_gpt/run.hpp"  // the run loop, on every layout

namespace {

using train_gpt_cli::options;

inline loom::parallel::comm_options comm_options_of(const options& o) {
  loom::parallel::comm_options c;
  c.timeout = std::chrono::milliseconds(static_cast<long long>(o.comm_timeout * 1000));
  return c;
}

/// Runs by_model(world) on every rank: a single rank without a communicator, --ranks N threads
/// (each with its share of the OpenMP threads), or one MPI process per rank. Returns rank 0's
/// exit status; an exception on any rank ends the run (the others are released) and is rethrown.
template <class F>
int run_ranks(const options& o, int& argc, char**& argv, F&& by_model) {
  if (o.comm == "mpi") {
#if LOOM_WITH_MPI
    if (o.ranks != 1)
      throw loom::input_error("--ranks is for --comm threads; under MPI the ranks are the processes: mpirun -np " +
                              std::to_string(o.ranks) + " train_gpt --comm mpi ...");
    loom::comm::mpi_environment env(&argc, &argv);
#ifdef _OPENMP
    if (!std::getenv("OMP_NUM_THREADS"))  // processes on one machine share its cores
      if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE"))
        omp_set_num_threads(std::max(1, omp_get_max_threads() / std::max(1, std::atoi(local))));
#endif
    auto world = env.world(comm_options_of(o));
    return by_model(&world);
#else
    (void)argc;
    (void)argv;
    throw loom::input_error("--comm mpi: this train_gpt was built without MPI; install libopenmpi-dev and "
                            "rebuild (LOOM_WITH_MPI), or use --ranks N (threads)");
#endif
  }
  if (o.ranks == 1) return by_model(static_cast<std::nullptr_t*>(nullptr));
  int status = 0;
#ifdef _OPENMP
  const int threads = std::max(1, omp_get_max_threads() / o.ranks);
#endif
  loom::comm::run_threads(
      o.ranks,
      [&](loom::comm::threads& world) {
#ifdef _OPENMP
        omp_set_num_threads(threads);  // per rank thread: the ranks share the cores
#endif
        const int s = by_model(&world);
        if (world.rank() == 0) status = s;
      },
      comm_options_of(o));
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // one line at a time, also into a file or a pipe
  loom::device::configure_host_malloc_for_gemm();  // Eigen's GEMM buffers: reuse, don't re-fault (3x on big vocabularies)
  options o;
  CLI::App app{"train_gpt: train a GPT on a UTF-8 text file (byte tokens) or a prepare_data dataset (SentencePiece ids) "
               "(CPU; fp32, bf16 or fp16), then sample from it"};
  app.add_option("--data", o.data, "UTF-8 text file (e.g. ../shared/data/tinyshakespeare.txt), or a dataset written by "
                                   "prepare_data: its prefix or its .idx/.bin (e.g. out/shakespeare)")->required();
  app.add_option("--model", o.model, "model config (default: quickstart for a text file, quickstart_bpe for a dataset)")
      ->check(CLI::IsMember({"quickstart", "char_tiny", "quickstart_bpe"}));
  app.add_option("--steps", o.steps, "optimizer steps (>= 1)")
      ->check(CLI::Validator(
          [](std::string& v) {
            char* end = nullptr;
            const long n = std::strtol(v.c_str(), &end, 10);
            return end != v.c_str() && *end == '\0' && n >= 1 ? std::string() : std::string("--steps must be a whole number >= 1");
          },
          "INT>=1"));
  app.add_option("--micro-batch", o.micro_batch, "sequences per micro-batch, 1..compiled capacity (0 or unset: the capacity)");
  app.add_option("--seq-len", o.seq_len, "tokens per sequence (default: the model's maximum)");
  app.add_option("--grad-accum", o.grad_accum, "micro-batches per optimizer step");
  app.add_option("--lr", o.lr, "peak learning rate");
  app.add_option("--min-lr", o.min_lr, "learning-rate floor after the cosine decay");
  app.add_option("--warmup", o.warmup, "linear warm-up steps");
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay (matrices only)");
  app.add_option("--max-grad-norm", o.max_grad_norm, "clip the global gradient norm (0: off)");
  app.add_option("--dropout", o.dropout,
                 "dropout probability P, 0 <= P < 1, on the embedding, the attention probabilities and both residual "
                 "branches while training (not in validation or sampling); 0 (default): off; CPU only");
  app.add_option("--val-fraction", o.val_fraction, "held out for validation: a fraction of a text file's bytes, of a dataset's documents");
  app.add_option("--eval-every", o.eval_every, "steps between validation evaluations (0: only at the end)");
  app.add_option("--eval-windows", o.eval_windows,
                 "validation windows per periodic evaluation: the first N of the validation split (all if it has fewer)")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--early-stop", o.early_stop,
                 "PATIENCE: end training when the validation loss has not improved for PATIENCE periodic evaluations "
                 "(--eval-every); the saved weights, final validation and sample are then the best evaluation's (0: off)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", o.seed, "seed for initialisation, data order and sampling");
  app.add_option("--time-budget", o.time_budget, "stop training after this many seconds (0: no limit)");
  app.add_option("--log-dir", o.log_dir, "TensorBoard events, metrics.jsonl and trace.json go here ('' = none)");
  app.add_option("--profile-steps", o.profile_steps, "record a Chrome/Perfetto timeline of steps A:B (half-open), off by default");
  app.add_option("--peak-gflops", o.peak_gflops, "fp32 peak for MFU (default: measured at start-up)");
  app.add_flag("--synthetic-data", o.synthetic_data,
               "isolation switch: train on 8 batches of random ids made once in memory (no loader, no data_wait); "
               "shows whether data loading limits the step");
  app.add_flag("--no-data-checksum", o.no_data_checksum,
               "do not check a dataset's .bin and .idx against the sizes and XXH3-64 checksums in PREFIX.json "
               "(one read of both files at start-up; for datasets too large to read twice)");
  app.add_option("--summary-every", o.summary_every, "steps between breakdown tables (0: never)");
  app.add_option("--out", o.out, "where to save the weights (default out/<model>.safetensors)");
  app.add_option("--sample-tokens", o.sample_tokens, "tokens to sample after training (bytes for a text file)");
  app.add_option("--prompt", o.prompt,
                 "prompt for the sample (for a dataset: normalized as prepare_data normalized its text, see docs/data.md)");
  app.add_option("--temperature", o.temperature, "sampling temperature");
  app.add_option("--top-k", o.top_k, "sample from the k most likely tokens (0: all)");
  app.add_option("--precision", o.precision,
                 "fp32, bf16 (16-bit weights/activations, fp32 masters) or fp16 (same, with dynamic loss scaling)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "save checkpoints here (step_NNNNNNNN/ directories and a 'latest' pointer; off by default)");
  app.add_option("--save-every", o.save_every, "steps between checkpoints (0: only at the end of the run)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--keep", o.keep, "newest checkpoints to keep (0: all)")->check(CLI::NonNegativeNumber);
  auto* resume = app.add_option("--resume", o.resume,
                                "continue from the newest valid checkpoint in DIR (a --checkpoint-dir) or from one "
                                "step_NNNNNNNN directory, bit for bit; checkpoints keep going to DIR");
  app.add_option("--stop-at-step", o.stop_at_step,
                 "end this run after this many completed steps, saving a checkpoint; the schedule still spans --steps")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--export-hf", o.export_hf,
                 "after training, write Hugging Face GPT-2 weights (model.safetensors, config.json) to this directory");
  app.add_option("--ranks", o.ranks, "data-parallel ranks as threads of this process (--comm threads)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--comm", o.comm, "communicator: threads (--ranks N) or mpi (run under mpirun -np N; needs a build with MPI)")
      ->check(CLI::IsMember({"threads", "mpi"}));
  app.add_option("--bucket-mb", o.bucket_mb, "data parallel: gradient bucket size in MiB (a layer never splits)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--no-overlap", o.no_overlap,
               "data parallel: run each bucket's all-reduce where it would start, blocking (communication not hidden)");
  app.add_flag("--zero1", o.zero1, "data parallel: shard the AdamW moments across ranks (ZeRO stage 1)");
  app.add_option("--comm-timeout", o.comm_timeout,
                 "data parallel: seconds a collective may wait for the other ranks before the run stops with an "
                 "error naming them (0: wait forever)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--replica-check-every", o.replica_check_every,
                 "data parallel: compare a parameter checksum across ranks every N steps (0: never)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--layout", o.layout,
                 "tensor x pipeline parallel degrees tp<TP>pp<PP> (tp1pp1, tp2pp1, tp1pp2, tp2pp2; fp32, --model "
                 "char_tiny or quickstart_bpe); the world (--ranks or mpirun -np) is TP*PP*DP ranks, data parallel on top");
  app.add_option("--init-from-hf", o.init_from_hf,
                 "start from the GPT-2 weights in this directory (config.json, model.safetensors)")
      ->excludes(resume);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "train_gpt: error: %s; run train_gpt --help for the flags\n", e.what());
    return 2;
  }
  if (app.count("--warmup") == 0) o.warmup = std::min<long>(100, o.steps / 10);
  try {
    if (app.count("--model") == 0 && loom::data::indexed_dataset_prefix(o.data)) o.model = "quickstart_bpe";
    loom::check_dropout_probability(o.dropout, "--dropout");  // before any data is read
    if (!o.resume.empty() && !std::filesystem::exists(o.resume))  // before the model and data banner
      throw loom::input_error("--resume '" + o.resume + "' does not exist; pass the --checkpoint-dir of an earlier run "
                              "(e.g. out/ckpt) or one step_NNNNNNNN directory inside it");
    if (const auto w = loom::io::step_window::parse(o.profile_steps); !w.empty() && w.first >= o.steps)
      throw loom::input_error("--profile-steps " + o.profile_steps + " starts after the run's last step (--steps " +
                              std::to_string(o.steps) + "): nothing would be recorded; choose a window inside 0:" +
                              std::to_string(o.steps));
    if (o.early_stop > 0 && o.eval_every <= 0)
      throw loom::input_error("--early-stop " + std::to_string(o.early_stop) + " watches the periodic validation loss, "
                              "but --eval-every is 0 (no periodic evaluations); pass e.g. --eval-every 100");
    if (o.early_stop > 0 && o.eval_every >= o.steps)
      throw loom::input_error("--early-stop " + std::to_string(o.early_stop) + " watches the periodic validation loss, "
                              "but --eval-every " + std::to_string(o.eval_every) + " >= --steps " +
                              std::to_string(o.steps) + " leaves no evaluation before the end; pass --eval-every < " +
                              std::to_string(o.steps));
    if (!o.out.empty() && (o.out.back() == '/' || std::filesystem::is_directory(o.out)))
      throw loom::input_error("--out '" + o.out + "' is a directory; the trained weights are one file: pass a file "
                              "name such as " + (std::filesystem::path(o.out) / "model.safetensors").string());
    const auto parsed_layout = train_gpt_cli::parse_layout(o.layout);
    const int tp = parsed_layout.first, pp = parsed_layout.second;
    if (tp * pp > 1) {  // tensor/pipeline parallel: train_gpt/layout_<model>.cpp
      if (o.model != "char_tiny" && o.model != "quickstart_bpe")
        throw loom::input_error("--layout " + o.layout + " is compiled for --model char_tiny and quickstart_bpe only, not " +
                                o.model + "; pass one of those, or --layout tp1pp1");
      if (o.model == "char_tiny")  // the model first: a layout that cannot split it is the basic problem
        train_gpt_cli::check_layout_fits<loom::models::char_tiny>(tp, pp);
      else
        train_gpt_cli::check_layout_fits<loom::models::quickstart_bpe>(tp, pp);
      if (o.comm == "threads") train_gpt_cli::check_layout_run(o, tp, pp, o.ranks);  // before starting the ranks
    }
    if (o.zero1 && o.comm == "threads" && o.ranks / (tp * pp) < 2)
      std::fprintf(stderr,
                   "train_gpt: warning: --zero1 with one data-parallel rank (--ranks %d / TP*PP %d) shards nothing; "
                   "pass --ranks %d for DP = 2\n",
                   o.ranks, tp * pp, 2 * tp * pp);
    auto by_model = [&](auto* world) {
      using W = std::remove_pointer_t<decltype(world)>;
      if constexpr (!std::is_same_v<W, std::nullptr_t>) {
        if (tp * pp > 1) {
          if (o.model == "char_tiny") return train_gpt_cli::run_layout<loom::models::char_tiny>(o, tp, pp, *world);
          return train_gpt_cli::run_layout<loom::models::quickstart_bpe>(o, tp, pp, *world);
        }
      }
      auto go = [&]<class M, int B, int T>() {
        if (o.precision == "bf16") return train_gpt_cli::run<M, B, T, 1, 1, W, loom::precision::bf16>(o, world);
        if (o.precision == "fp16") return train_gpt_cli::run<M, B, T, 1, 1, W, loom::precision::fp16>(o, world);
        return train_gpt_cli::run<M, B, T, 1, 1, W>(o, world);
      };
      if (o.model == "char_tiny") return go.template operator()<loom::models::char_tiny, 8, 32>();
      if (o.model == "quickstart_bpe") return go.template operator()<loom::models::quickstart_bpe, 16, 128>();
      return go.template operator()<loom::models::quickstart, 16, 128>();
    };
    return run_ranks(o, argc, argv, by_model);
  } catch (const loom::input_error& e) {
    std::fprintf(stderr, "train_gpt: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt: failed: %s\n", e.what());
    return 1;
  }
}
