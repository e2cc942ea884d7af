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

#include "train_gpt/flags.hpp"
#include "train_gpt/options.hpp"
#include "train_gpt/run.hpp"  // the run loop, on every layout

namespace {

using train_gpt_cli::options;

inline loom::parallel::comm_options comm_options_of(const options& o) {
  loom::parallel::comm_options c;
  c.timeout = train_gpt_cli::comm_timeout_ms(o);
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
  train_gpt_cli::add_flags(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "train_gpt: error: %s; run train_gpt --help for the flags\n", e.what());
    return 2;
  }
  try {
    const auto layout = train_gpt_cli::check_flags(o, app, loom::data::indexed_dataset_prefix(o.data).has_value());
    const int tp = layout.first, pp = layout.second;
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
