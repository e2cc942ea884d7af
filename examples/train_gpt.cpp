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
// On NPUs started by a rank-table launcher (RANK_TABLE_FILE, and RANK_ID per process, as
// MindSpore's and torch_npu's scripts start them) `--device ascend --comm hccl` makes each process
// the table's rank on the table's device_id, its host traffic over HCCL (comm::hccl_host_world).
// --zero1 shards the AdamW moments. Only rank 0 prints, logs and evaluates; rank 0 saves
// checkpoints (in the background), or every rank with --zero1 (its moment shard; blocking).
//   train_gpt --data ../shared/data/tinyshakespeare.txt --ranks 2
//   mpirun -np 2 train_gpt --data ../shared/data/tinyshakespeare.txt --comm mpi --zero1
//
// Tensor and pipeline parallel (docs/tensor_pipeline.md): --layout tp2pp2 splits the model over
// TP*PP ranks (Megatron-LM's layout); the world is TP*PP*DP ranks, data parallel on top.
// --grad-accum is the pipeline's micro-batch count. --layout auto --memory-limit 512MiB chooses
// the fastest layout, micro-batch, recompute mode and ZeRO-1 whose memory plan fits
// (train::choose_layout; docs/memory.md), from this CPU's measured peak and links.
//
// Every (model, precision, layout, device, attention) train_gpt accepts is a compiled instance of
// train::session (cmake/LoomSessions.cmake; --list-instances prints them); the loop here and in
// train_gpt/run.cpp is compiled once. A combination that is not compiled is refused with the
// CMake setting that adds it.
//   train_gpt --data ../shared/data/tinyshakespeare.txt --model char_tiny --layout tp2pp2 --ranks 4 --grad-accum 4
//
// Precision (docs/precision.md): --precision bf16 stores weights and activations in bfloat16 with
// fp32 accumulation, fp32 gradients and fp32 master weights; fp16 adds dynamic loss scaling
// (--loss-scale: the initial scale, 512; logged as train/loss_scale; on the console whenever it
// changes).
//   train_gpt --data ../shared/data/tinyshakespeare.txt --precision bf16
//
// Megatron-LM's names for the training flags are aliases (--train-iters, --micro-batch-size,
// --global-batch-size, --save/--load, ...; docs/megatron.md); a flag that only tunes PyTorch
// internals is accepted with a note, one for a feature loom lacks is refused by name.
//
// Dropout (docs/model.md): --dropout P drops with probability P on the embedding, the attention
// probabilities and both residual branches while training (GPT-2 used 0.1), never in validation
// or sampling; off by default; masks are counter-based, so --resume and every --layout see the
// same masks. CPU only.
//   train_gpt --data ../shared/data/tinyshakespeare.txt --model char_tiny --dropout 0.1
//
// Weights and logs: the weights go to --out (default out/<model>.safetensors); a file already
// there (an earlier run's, or the interrupted part's of a --resume) is kept as
// <name>.previous-<k>.safetensors (the first free k; a line says so) when the run writes its own,
// atomically, at the end: a run that fails or is killed first leaves it in place. The logs go
// to --log-dir, by default logs/ in --out's directory (out/logs); a new run's metrics.jsonl keeps
// the previous one as metrics.previous-<k>.jsonl.
//
// Bad input (missing/empty/binary file, a corpus shorter than one sequence, an unknown or
// malformed flag, a sequence length above the model's maximum, a --checkpoint-dir or --resume
// that is a file, a --resume directory without checkpoints, a dataset whose tokenizer is missing)
// exits with status 2 and one line naming the problem and the fix; the flags and paths are
// checked before the peak probe or any rank.
// A dataset without PREFIX.json (nothing to verify its checksums against) trains with a warning.
#include <CLI/CLI.hpp>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <iostream>
#include <optional>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <unistd.h>  // sysconf: the machine's cores

#include <loom/data/source.hpp>
#include <loom/device/ascend.hpp>
#include <loom/device/ascend_runtime.hpp>
#include <loom/device/ascend_version.hpp>
#include <loom/device/cpu.hpp>
#include <loom/parallel/comm_threads.hpp>
#include <loom/train/session.hpp>
#if LOOM_WITH_MPI
#include <loom/parallel/comm_mpi.hpp>  // --comm mpi: links loom::mpi
#endif
#if LOOM_WITH_ASCEND && __has_include(<nlohmann/json.hpp>)
#include <loom/parallel/comm_hccl_host.hpp>  // --comm hccl: a rank-table launch
#define LOOM_TRAIN_GPT_RANK_TABLE 1
#endif

#include "cli.hpp"  // parse_or_exit
#include "layout_auto.hpp"  // --layout auto
#include "on_demand.hpp"  // instance_cache()
#include "train_gpt/flags.hpp"
#include "train_gpt/model_flags.hpp"
#include "train_gpt/options.hpp"
#include "train_gpt/run.hpp"  // the run loop, compiled once (train_gpt/run.cpp)

namespace {

using train_gpt_cli::options;
using loom::train::world_ref;

inline loom::parallel::comm_options comm_options_of(const options& o) {
  loom::parallel::comm_options c;
  c.timeout = train_gpt_cli::comm_timeout_ms(o);
  return c;
}

/// Runs by_world(world) on every rank: a single rank without a communicator (kind none), --ranks N threads
/// (each with its share of the OpenMP threads), one MPI process per rank, or with --comm hccl this
/// process as rank $RANK_ID of $RANK_TABLE_FILE on its device_id (`npu`), the world over HCCL. Returns rank 0's
/// exit status; an exception on any rank ends the run (the others are released) and is rethrown.
template <class F>
int run_ranks(const options& o, world_ref::kind kind, int& argc, char**& argv,
              const std::shared_ptr<const loom::device::ascend_runtime>& npu, F&& by_world) {
  if (o.comm == "mpi") {
#if LOOM_WITH_MPI
    if (o.ranks != 1)
      throw loom::input_error("--ranks is for --comm threads; under MPI the ranks are the processes: mpirun -np " +
                              std::to_string(o.ranks) + " train_gpt --comm mpi ...");
    loom::comm::mpi_environment env(&argc, &argv);
#ifdef _OPENMP
    if (!std::getenv("OMP_NUM_THREADS")) {  // the processes of one machine share its cores
      // the ranks on this machine, whatever launched them (MPI-3 shared-memory split)
      MPI_Comm local;
      int here = 1;
      if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local) == MPI_SUCCESS) {
        MPI_Comm_size(local, &here);
        MPI_Comm_free(&local);
      }
      // a process bound to fewer cores than the machine has (mpirun binds each rank to a core
      // by default) uses those; an unbound one its share of the machine
      const int mine = omp_get_num_procs();
      omp_set_num_threads(mine < ::sysconf(_SC_NPROCESSORS_ONLN) ? mine : std::max(1, mine / std::max(1, here)));
    }
#endif
    auto world = env.world(comm_options_of(o));
    try {
      return by_world(world_ref::of(world));
    } catch (const loom::input_error&) {
      throw;  // bad input is found alike on every rank: each ends, and MPI_Finalize returns
    } catch (const std::exception& e) {
      if (world.size() < 2) throw;
      // A peer may be stopped, dead or stuck in a collective (a comm_timeout): MPI_Finalize in
      // env's destructor would wait for it forever. End every rank of the job instead.
      std::fprintf(stderr, "train_gpt: failed: %s\ntrain_gpt: ending every rank of the job (MPI_Abort)\n", e.what());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
      throw;
    }
#else
    (void)argc;
    (void)argv;
    throw loom::input_error("--comm mpi: this train_gpt was built without MPI; install libopenmpi-dev and "
                            "rebuild (LOOM_WITH_MPI), or use --ranks N (threads)");
#endif
  }
  if (kind == world_ref::kind::none) return by_world(world_ref::none());
  if (o.comm == "hccl") {
#if LOOM_TRAIN_GPT_RANK_TABLE
    const auto table = loom::parallel::read_rank_table(loom::parallel::rank_table_path());
    const int rank = loom::parallel::rank_from_env();
    const auto& me = table.at(rank);
#ifdef _OPENMP
    if (!std::getenv("OMP_NUM_THREADS")) {  // the processes of one server share its cores
      const auto local = std::count_if(table.entries().begin(), table.entries().end(),
                                       [&](const auto& e) { return e.server_index == me.server_index; });
      omp_set_num_threads(std::max(1, omp_get_max_threads() / int(std::max<std::ptrdiff_t>(1, local))));
    }
#endif
    loom::device::ascend_device dev(npu, me.device_id);  // main() put the session on it too (o.npu)
    loom::comm::hccl_options h;
    h.timeout = comm_options_of(o).timeout;
    auto world = loom::comm::hccl_host_world(
        loom::comm::hccl::create_from_rank_table(dev.context(), table.path(), rank, h), dev.context());
    return by_world(world_ref::of(world));
#else
    (void)npu;
    throw loom::input_error("--comm hccl: this train_gpt was built without the Ascend policy or nlohmann-json "
                            "(LOOM_WITH_ASCEND, nlohmann-json3-dev); rebuild with them, or launch with mpirun --comm mpi");
#endif
  }
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
        const int s = by_world(world_ref::of(world));
        if (world.rank() == 0) status = s;
      },
      comm_options_of(o));
  return status;
}

/// --list-instances: the compiled instances, one per line, only those matching --model, --precision, --layout,
/// --device and --attention where the flag was given (e.g. `--list-instances --device ascend`), then the
/// instances compiled on first use in the cache.
void list_instances(const options& o, const CLI::App& app) {
  auto given = [&](const char* flag, std::string_view want, std::string_view have) {
    return app.count(flag) == 0 || want == have;
  };
  std::printf("compiled into this train_gpt (model precision layout device attention; each runs on one rank, --ranks N "
              "threads or mpirun, with data parallelism on top):\n");
  for (const auto& i : loom::train::compiled_sessions())
    if (given("--model", o.model, i.model) && given("--precision", o.precision, i.precision) &&
        given("--layout", o.layout, i.layout()) && given("--device", o.device, i.device) &&
        given("--attention", o.attention, i.attention))
      std::printf("  %s  (micro-batch <= %d, seq <= %d)\n", i.describe().c_str(), i.micro_batch, i.seq_len);
  try {
    auto& cache = loom_examples::instance_cache();
    const auto cached = cache.list();
    std::printf("compiled on first use, in %s (%zu; any other is compiled when a run asks for it):\n",
                cache.dir().c_str(), cached.size());
    std::size_t stale = 0;
    std::uintmax_t bytes = 0;
    for (const auto& c : cached) {
      bytes += c.bytes;
      if (!c.current) {
        ++stale;
        continue;
      }
      std::printf("  %s  [%s, %.0f MB]%s\n", c.description.c_str(), c.key.c_str(), double(c.bytes) / 1e6,
                  c.valid ? "" : "  (damaged: rebuilt on use)");
    }
    if (stale > 0)
      std::printf("  and %zu stale (built from other loom headers or another compiler; never loaded): "
                  "train_gpt --prune-cache removes them\n", stale);
    std::printf("the cache holds %.0f MB of instances and %.0f MB of precompiled headers\n", double(bytes) / 1e6,
                double(cache.precompiled_header_bytes()) / 1e6);
  } catch (const loom::input_error& e) {
    std::printf("no instances compile on first use here: %s\n", e.what());
  }
}

/// The instance for the flags: the build's own when one serves the model, precision, layout,
/// device and attention with capacities >= --micro-batch x --seq-len, else one compiled on first
/// use (train::instance_cache; exactly --micro-batch x --seq-len, the preset's capacity and the
/// model's positions when they are not given). Throws loom::input_error for a request that
/// cannot be built and when nothing can be compiled here (naming the CMake setting).
const loom::train::session_instance& choose_instance(const options& o, const loom::models::model_spec& spec, int tp,
                                                     int pp, bool compile_only) {
  const auto all = loom::train::compiled_sessions();
  int capacity = 0;
  for (const auto& i : all)
    if (i.model == spec.name) capacity = std::max(capacity, i.micro_batch);
  if (!compile_only)
    for (const auto& i : all)
      if (i.serves(spec.name, o.precision, tp, pp, o.device, o.attention) && o.micro_batch <= i.micro_batch &&
          o.seq_len <= i.seq_len)
        return i;
  loom::train::instance_request r;
  r.spec = spec, r.precision = o.precision, r.tp = tp, r.pp = pp, r.device = o.device, r.attention = o.attention;
  r.micro_batch = o.micro_batch > 0 ? o.micro_batch : capacity > 0 ? capacity : 4;
  r.seq_len = o.seq_len > 0 ? o.seq_len : spec.max_seq;
  if (auto p = r.problem(); !p.empty()) throw loom::input_error(p);
  auto& cache = loom_examples::instance_cache();
  const auto& i = cache.get(r, &std::cout);
  std::printf("on-demand instance %s (compiled on first use, cached in %s)\n", r.describe().c_str(),
              cache.dir().c_str());
  return i;
}

/// --layout auto: train::choose_layout among the compiled instances of --model, --precision,
/// --device, --attention for --ranks threads — or, when none is compiled, among every layout the
/// preset or shape `spec` divides (train::plan_shape; the chosen one is compiled on first use) — by their
/// memory plans (+ 100 MiB of runtime
/// overhead per rank, docs/memory.md) against --memory-limit and the step estimate from this
/// CPU's measured peak per rank and the measured all-reduce of --ranks threads. Prints the
/// choice and the runner-up, writes the chosen --layout, --micro-batch, --grad-accum, --recompute
/// and --zero1 into `o`, and returns {TP, PP}. Throws loom::input_error when nothing fits (naming
/// the smallest footprint) and for MPI or an NPU, whose links it cannot measure before the ranks
/// start (examples/plan --layout auto takes their figures).
std::pair<int, int> choose_auto_layout(options& o, const CLI::App& app, const loom::models::model_spec& spec) {
  if (o.comm == "mpi" || o.device != "cpu")
    throw loom::input_error("--layout auto measures this machine's links on --ranks threads before the ranks start; "
                            "with " + std::string(o.comm == "mpi" ? "--comm mpi" : "--device " + o.device) +
                            " run examples/plan --layout auto with your network's figures (--link-gbps) and pass the "
                            "layout it chooses");
  const auto all = loom::train::compiled_sessions();
  int capacity = 0;
  for (const auto& i : all)
    if (i.model == o.model && i.precision == o.precision && i.device == o.device && i.attention == o.attention)
      capacity = std::max(capacity, i.micro_batch);
  loom::train::layout_request r;
  r.model = o.model, r.precision = o.precision, r.device = o.device, r.attention = o.attention;
  r.world_size = o.ranks, r.seq_len = o.seq_len;
  if (app.count("--micro-batch") > 0) r.micro_batch = o.micro_batch;  // given: fixed, as --recompute
  r.memory_limit = loom::train::parse_bytes(o.memory_limit, "--memory-limit");
  r.overhead = std::size_t(100) << 20;
  r.global_batch = o.global_batch ? o.global_batch
                                   : (o.micro_batch ? o.micro_batch : capacity ? capacity : 4) * o.grad_accum * o.ranks;
  r.args.cfg.seq_len = o.seq_len;
  r.args.ddp = {.bucket_mb = o.bucket_mb, .overlap = !o.no_overlap, .zero1 = false, .check_every = 0};
  if (app.count("--recompute") > 0) r.recompute = {train_gpt_cli::recompute_mode(o.recompute)};
  r.net.intra = loom_examples::threads_link(o.ranks);
#ifdef _OPENMP
  const int all_threads = omp_get_max_threads();
  omp_set_num_threads(std::max(1, all_threads / o.ranks));  // a rank's share of the cores: its peak and its plan
#endif
#ifdef _OPENMP
  const int rank_threads = omp_get_max_threads();
#else
  const int rank_threads = 1;
#endif
  r.peak_flops = o.peak_gflops > 0 ? o.peak_gflops * 1e9 : loom_examples::cpu_peak(o.precision).first;
  // the compiled instances of the family, else every layout the preset divides, compiled on first use
  const int seq = o.seq_len > 0 ? o.seq_len : spec.max_seq;
  const auto choices = loom::train::family_options(all, &spec, o.precision, o.device, o.attention, o.ranks,
                                                   r.micro_batch > 0 ? r.micro_batch : std::min(r.global_batch, 32),
                                                   seq, rank_threads);
  if (capacity == 0) r.seq_len = seq;
  const auto best = loom_examples::choose_and_print(choices, r, "train_gpt");
#ifdef _OPENMP
  omp_set_num_threads(all_threads);
#endif
  o.layout = best.option.layout();
  o.micro_batch = best.micro_batch;
  o.grad_accum = best.grad_accum;
  o.recompute = loom::nn::recompute_name(best.recompute);
  o.zero1 = best.zero1;
  return {best.option.tp, best.option.pp};
}

/// The CANN runtime for --device ascend (device::ascend_runtime::load: ASCEND_HOME_PATH, the
/// toolkit's usual places, the loader path), loaded before any rank starts or any model is built,
/// and checked as doctor checks it: a CANN version inside loom's statement (device/ascend_version.hpp;
/// a runtime that reports none gets a warning) and every aclnn operator loom calls exported.
/// Otherwise throws loom::input_error with what doctor prints: the problem and the fix.
std::shared_ptr<const loom::device::ascend_runtime> load_npu_runtime() {
  const std::string doctor =
      "\n(examples/doctor checks the whole environment: cmake --build build --target doctor, then build/examples/doctor; "
      "--device cpu trains without an NPU)";
  std::shared_ptr<const loom::device::ascend_runtime> rt;
  try {
    rt = loom::device::ascend_runtime::load();
  } catch (const loom::device::runtime_not_found& e) {
    throw loom::input_error(std::string("--device ascend: ") + e.what() + doctor);
  }
  if (const std::string version = rt->cann_version(); version.empty()) {
    std::fprintf(stderr, "train_gpt: warning: the NPU runtime reports no CANN version; loom is tested with %s\n",
                 loom::device::cann_compatibility);
  } else if (std::string why; !loom::device::cann_supported(version, &why)) {
    throw loom::input_error("--device ascend: the installed CANN is " + version + ": " + why +
                            "; install a toolkit inside it and source its set_env.sh" + doctor);
  }
  if (!rt->has_operators()) {
    std::string missing;
    for (const auto& m : rt->missing_operators()) missing += (missing.empty() ? "" : " ") + m;
    throw loom::input_error("--device ascend: the NPU runtime lacks operators loom calls (" + missing +
                            "): the op-API libraries (libopapi.so or libopapi_{math,nn,transformer}.so) and "
                            "libnnopbase.so must sit next to libascendcl.so, as in a CANN 8.x toolkit" + doctor);
  }
  return rt;
}

/// The NPUs the flags ask for exist: --npu among the visible ones, and with --ranks threads one
/// NPU per rank. Throws loom::input_error naming the count and the fix.
void check_npus(const options& o, const loom::device::ascend_runtime& rt) {
  const int n = loom::device::ascend_device::count(rt);
  const std::string visible = std::to_string(n) + " NPU" + (n == 1 ? " is" : "s are") + " visible";
  if (n == 0)
    throw loom::input_error("--device ascend: no NPU is visible (aclrtGetDeviceCount = 0); check the driver "
                            "(npu-smi info) and ASCEND_RT_VISIBLE_DEVICES");
  if (o.npu >= n)
    throw loom::input_error("--npu " + std::to_string(o.npu) + ": only " + visible + " (0.." + std::to_string(n - 1) +
                            "); pass one of them, and check ASCEND_RT_VISIBLE_DEVICES");
  if (o.comm == "threads" && o.ranks > n)
    throw loom::input_error("--ranks " + std::to_string(o.ranks) + " with --device ascend: " + visible +
                            " and each rank needs its own; pass --ranks <= " + std::to_string(n) +
                            ", or one process per NPU on more machines (mpirun ... --comm mpi)");
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // one line at a time, also into a file or a pipe
  loom::device::configure_host_malloc_for_gemm();  // Eigen's GEMM buffers: reuse, don't re-fault (3x on big vocabularies)
  options o;
  CLI::App app{"train_gpt: train a GPT on a UTF-8 text file (byte tokens) or a prepare_data dataset (SentencePiece ids) "
               "(any compiled model, precision and layout), then sample from it"};
  train_gpt_cli::add_flags(app, o);
  train_gpt_cli::model_options mo;
  train_gpt_cli::add_model_flags(app, mo);
  train_gpt_cli::add_compile_only_flag(app, mo);
  loom_examples::parse_or_exit(app, argc, argv);
  if (o.list_instances) {
    list_instances(o, app);
    return 0;
  }
  if (o.prune_cache) {
    try {
      auto& cache = loom_examples::instance_cache();
      const auto p = cache.prune();
      std::printf("removed %zu stale or damaged entries (%.0f MB) from %s\n", p.entries, double(p.bytes) / 1e6,
                  cache.dir().c_str());
      return 0;
    } catch (const loom::input_error& e) {
      std::fprintf(stderr, "train_gpt: error: %s\n", e.what());
      return 2;
    }
  }
  std::shared_ptr<const loom::device::ascend_runtime> npu;
  struct finalize_last {  // aclFinalize once every rank, device and communicator is gone (reference §1.3)
    const std::shared_ptr<const loom::device::ascend_runtime>& rt;
    ~finalize_last() {
      if (rt)
        if (const int rc = rt->finalize(); rc != 0) std::fprintf(stderr, "train_gpt: aclFinalize returned %d\n", rc);
    }
  } finalize{npu};
  try {
    train_gpt_cli::apply_megatron_flags(o, app);  // Megatron-LM's names, --data-path first
    const auto prefix = loom::data::indexed_dataset_prefix(o.data);
    // a shape from flags or a config.json names the model; a preset is resolved after check_flags
    // (which picks quickstart_bpe for a dataset)
    const bool custom = train_gpt_cli::shape_from_flags(app) || !mo.model_config.empty() ||
                        (!o.init_from_hf.empty() && app.count("--model") == 0);
    std::optional<loom::models::model_spec> spec;
    if (custom) {
      // --layout auto: every layout the shape divides is a candidate; the vocabulary is padded for TP 1 here
      const auto [tp, pp] = o.layout == "auto" ? std::pair{1, 1} : train_gpt_cli::parse_layout(o.layout);
      spec = train_gpt_cli::resolve_model(o, mo, app, prefix.has_value(), tp);
      o.model = spec->name;
      // a layout the shape cannot take is the first thing to say (before the ranks it needs)
      if (const auto why = spec->facts().layout_problem(tp, pp); !why.empty()) throw loom::input_error(why);
    }
    auto layout = train_gpt_cli::check_flags(o, app, prefix.has_value());
    // the NPU runtime right after the flags, before a model is resolved or an instance compiled
    // (--compile-only fills the cache on a machine without an NPU, e.g. a login node)
    if (o.device == "ascend" && !mo.compile_only) npu = load_npu_runtime();
    if (!spec) spec = train_gpt_cli::resolve_model(o, mo, app, prefix.has_value(), 1);
    for (const auto& note : o.notes) std::fprintf(stderr, "train_gpt: %s\n", note.c_str());
    if (!prefix && !o.data.empty() && !std::filesystem::exists(o.data))  // before an instance is compiled
      throw loom::input_error("data file '" + o.data + "' does not exist; pass an existing UTF-8 text file, or the "
                              "PREFIX of a prepare_data dataset (PREFIX.bin and PREFIX.idx), with --data");
#if LOOM_WITH_TEXT
    if (prefix)  // the dataset's tokenizer is there, before the layout search, the peak probe and the ranks
      if (const auto why = loom::data::missing_dataset_tokenizer(*prefix))
        throw loom::input_error(*why + (loom::data::file_is_also_dataset_prefix(o.data)
                                            ? " (--data '" + o.data + "' is also a file; to train on its bytes, give it "
                                              "a name that is not the prefix of a dataset)"
                                            : std::string()));
#endif
    if (o.layout == "auto") layout = choose_auto_layout(o, app, *spec);  // a layout that fits the model and --ranks
    const auto [tp, pp] = layout;
    const auto kind = o.comm == "mpi" ? world_ref::kind::mpi : o.comm == "hccl" ? world_ref::kind::any
                      : o.ranks > 1 || tp * pp > 1                        ? world_ref::kind::threads
                                                                          : world_ref::kind::none;
    const auto& inst = choose_instance(o, *spec, tp, pp, mo.compile_only);  // before any rank starts
    if (mo.compile_only) {
      std::printf("train_gpt: %s is ready (--compile-only)\n", inst.describe().c_str());
      return 0;
    }
    if (o.comm == "threads") train_gpt_cli::derive_grad_accum(o, app, inst.micro_batch, o.ranks / (tp * pp));
#if LOOM_TRAIN_GPT_RANK_TABLE
    if (o.comm == "hccl")  // this process is the table's rank $RANK_ID, on that rank's device_id
      o.npu = loom::parallel::read_rank_table(loom::parallel::rank_table_path()).device_of(loom::parallel::rank_from_env());
#endif
    if (npu) check_npus(o, *npu);
    if (npu && o.deterministic) {  // HCCL reads it when a communicator is made: before any rank starts
      const char* had = std::getenv("HCCL_DETERMINISTIC");
      if (had && std::string(had) != "true" && std::string(had) != "strict")
        throw loom::input_error(std::string("--deterministic-mode with HCCL_DETERMINISTIC=") + had +
                                ": HCCL's reductions would not be deterministic; unset it or set it to true");
      if (!had) ::setenv("HCCL_DETERMINISTIC", "true", 0);
    }
    if (o.zero1 && o.comm == "threads" && o.ranks / (tp * pp) < 2)
      std::fprintf(stderr,
                   "train_gpt: warning: --zero1 with one data-parallel rank (--ranks %d / TP*PP %d) shards nothing; "
                   "pass --ranks %d for DP = 2\n",
                   o.ranks, tp * pp, 2 * tp * pp);
    return run_ranks(o, kind, argc, argv, npu, [&](world_ref world) {
      // a world of processes (mpirun, a rank table) is known now: its size against the layout, --global-batch-size
      int processes = 0;
#if LOOM_WITH_MPI
      if (world.type == world_ref::kind::mpi) processes = static_cast<loom::comm::mpi*>(world.comm)->size();
#endif
      if (world.type == world_ref::kind::any) processes = static_cast<loom::parallel::any_communicator*>(world.comm)->size();
      if (processes > 0) {
        if (tp * pp > 1) train_gpt_cli::check_world_size(tp, pp, processes);
        train_gpt_cli::derive_grad_accum(o, app, inst.micro_batch, processes / (tp * pp));
      }
      return train_gpt_cli::run(o, inst, world, npu);
    });
  } catch (const loom::input_error& e) {
    std::fprintf(stderr, "train_gpt: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt: failed: %s\n", e.what());
    return 1;
  }
}
