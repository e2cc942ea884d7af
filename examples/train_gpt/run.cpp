// train_gpt's run loop: one rank of a run on any model, precision, layout and communicator,
// written once against the non-template train::session (include/loom/train/session.hpp) and
// compiled once; the session behind it is one of the compiled instances (loom::sessions).
//
// What TP*PP > 1 changes:
// - validation runs on the ranks of dp replica 0 (evaluate() is collective over tp and pp; on
//   tp1pp1 dp replica 0 is rank 0); world rank 0 prints and logs;
// - checkpoints are saved collectively (every rank takes part; docs/checkpoint.md "Multi-rank
//   save"), as on tp1pp1 with --zero1 only; --resume accepts a checkpoint of any layout
//   (resharded on load);
// - the banner names the layout and rank 0's memory.
// --init-from-hf loads into the whole fp32 model (train::whole_model) and each rank takes its
// slices; at the end the parameters are gathered to the whole model and rank 0 saves, exports
// and samples with it (fp32: bf16/fp16 weights widened, exact).
#ifdef _OPENMP
#include <omp.h>
#endif
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <loom/bench/peak.hpp>
#include <loom/device/ascend_peak.hpp>
#include <loom/core/memory.hpp>
#include <loom/data/source.hpp>
#if LOOM_WITH_TEXT
#include <loom/data/text/tokenizer.hpp>  // SentencePiece: links loom::text
#endif
#include <loom/io/checkpoint.hpp>
#include <loom/io/jsonl.hpp>
#include <loom/io/tensorboard.hpp>
#include <loom/io/trace.hpp>
#include <loom/models/configs.hpp>
#include <loom/parallel/schedule.hpp>
#include <loom/train/console.hpp>
#include <loom/train/metrics.hpp>
#include <loom/train/session.hpp>

#include "../generate_text.hpp"
#include "../tokenizer_checksum.hpp"
#include "loop.hpp"
#include "options.hpp"
#include "profile.hpp"
#include "resume.hpp"
#include "run.hpp"
#include "weights_file.hpp"

namespace train_gpt_cli {

/// x with two decimals ("0.07").
inline std::string fixed2(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", x);
  return b;
}

/// What a periodic validation line covers: "all 188 windows" when it evaluates the whole split,
/// else "first 64 of 188 windows" (--eval-windows takes the split's first windows).
inline std::string covered_windows(std::size_t evaluated, std::size_t total) {
  return evaluated >= total ? "all " + std::to_string(total) + " windows"
                            : "first " + std::to_string(evaluated) + " of " + std::to_string(total) + " windows";
}

/// Keeps an earlier run's logs in `log_dir` before a new run writes there: metrics.jsonl as
/// metrics.previous-<k>.jsonl, and its TensorBoard event files (events.out.tfevents.*) and
/// trace.json in the folder previous-<k>/ (so TensorBoard shows that run apart, as "previous-<k>",
/// instead of mixing its curves with the new run's), one k for all: the first that neither name
/// takes. Then only the newest `keep` earlier runs' logs stay (--keep-previous; 0: all;
/// loom_examples::drop_oldest). Returns one line per file kept or removed (nothing when there
/// was none). Throws std::filesystem::filesystem_error when a rename fails.
inline std::vector<std::string> keep_previous_logs(const std::filesystem::path& log_dir, int keep) {
  namespace fs = std::filesystem;
  const fs::path metrics = log_dir / "metrics.jsonl";
  std::vector<fs::path> moved;  // event files and the trace: into previous-<k>/
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(log_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file(ec) && (name.rfind("events.out.tfevents.", 0) == 0 || name == "trace.json"))
      moved.push_back(e.path());
  }
  std::sort(moved.begin(), moved.end());
  const bool has_metrics = fs::exists(metrics);
  if (!has_metrics && moved.empty()) return {};
  int k = 1;
  using loom_examples::detail::taken;
  while (taken(previous_run_name(metrics, k)) || taken(log_dir / ("previous-" + std::to_string(k)))) ++k;
  std::vector<std::string> lines;
  if (has_metrics) {
    const fs::path kept = previous_run_name(metrics, k);
    fs::rename(metrics, kept);
    lines.push_back("log: the previous run's " + metrics.string() + " is kept as " + kept.string());
  }
  if (!moved.empty()) {
    const fs::path dir = log_dir / ("previous-" + std::to_string(k));
    fs::create_directory(dir);
    for (const fs::path& f : moved) fs::rename(f, dir / f.filename());
    const bool trace = fs::exists(dir / "trace.json");
    lines.push_back("log: the previous run's TensorBoard events" + std::string(trace ? " and trace" : "") +
                    " are kept in " + dir.string() + "/");
  }
  // --keep-previous: the newest `keep` earlier runs' logs (metrics.previous-<k>.jsonl, previous-<k>/)
  std::vector<fs::path> kept_dirs;
  for (const auto& e : fs::directory_iterator(log_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory(ec) && name.rfind("previous-", 0) == 0 && name.size() > 9 &&
        name.find_first_not_of("0123456789", 9) == std::string::npos)
      kept_dirs.push_back(e.path());
  }
  for (const auto& group : {loom_examples::previous_runs(metrics), kept_dirs})
    for (const std::string& line : loom_examples::drop_oldest(group, keep, "--keep-previous")) lines.push_back("log: " + line);
  return lines;
}

/// Where a run resumed from `resume` keeps saving: the run's root (the parent of a
/// step_NNNNNNNN directory given directly).
inline std::string checkpoint_root_of(const std::string& resume) {
  const std::filesystem::path p(resume);
  return std::filesystem::exists(p / "manifest.json") ? p.parent_path().string() : resume;
}

/// Creates `dir` if needed and checks that a file can be created in it; throws
/// loom::input_error naming `flag` otherwise, so a long run never ends unable to save. The
/// probe is an unnamed O_TMPFILE file, so a process killed during the check leaves nothing
/// behind; on a file system without O_TMPFILE, a named `.loom_write_test.<pid>`, removed at once.
inline void ensure_writable_directory(const std::filesystem::path& dir, const char* flag) {
  const std::filesystem::path d = dir.empty() ? std::filesystem::path(".") : dir;
  std::error_code ec;
  std::filesystem::create_directories(d, ec);
#ifdef O_TMPFILE
  if (!ec)
    if (const int fd = ::open(d.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600); fd >= 0) {
      ::close(fd);
      return;
    }
#endif
  const auto probe = d / (".loom_write_test." + std::to_string(::getpid()));
  std::FILE* f = ec ? nullptr : std::fopen(probe.c_str(), "wb");
  if (!f)
    throw loom::input_error(std::string(flag) + ": cannot create files in '" + d.string() +
                            "'; choose a directory you can write to");
  std::fclose(f);
  std::filesystem::remove(probe, ec);
}


namespace {

/// "N OpenMP threads per rank of M cores" for the banner, and where N came from: OMP_NUM_THREADS,
/// the cores a launcher bound the process to (mpirun binds each rank to a core by default), or the
/// machine's cores divided among the ranks on it (--ranks N threads; the processes of one machine
/// under mpirun or a rank table), which train_gpt sets when OMP_NUM_THREADS is unset.
std::string threads_text(int world_size) {
#ifdef _OPENMP
  const int n = omp_get_max_threads(), usable = omp_get_num_procs();
  const long machine = ::sysconf(_SC_NPROCESSORS_ONLN);
  std::string t = std::to_string(n) + " OpenMP thread" + (n == 1 ? "" : "s") + (world_size > 1 ? " per rank" : "");
  if (usable < machine) t += " on the " + std::to_string(usable) + " of " + std::to_string(machine) + " cores this process is bound to";
  else t += " of " + std::to_string(machine) + " cores";
  if (std::getenv("OMP_NUM_THREADS")) t += " (OMP_NUM_THREADS)";
  else if (world_size > 1 && usable >= machine) t += " (shared by the ranks on this machine; OMP_NUM_THREADS sets it)";
  return t;
#else
  (void)world_size;
  return "no OpenMP";
#endif
}

using loom::train::session;

/// The end of a run on rank 0: saves `model` (the whole fp32 model) to `out` with `meta` (an
/// earlier run's file there is kept as <stem>.previous-<k>.safetensors, with a line saying so;
/// weights_file.hpp), exports it with --export-hf, then prints a sample (bytes for a text file;
/// SentencePiece ids for a dataset: prompt encoded, ids decoded with `tok`, a blank line for
/// each end of document). `saved`: the console line's "saved weights ..." words. No sample with
/// --sample-tokens 0.
void save_and_sample(const options& o, loom::train::whole_model& model, weights_file& out,
                     const std::map<std::string, std::string>& meta, const std::string& saved,
                     const loom::data::batch_source<>& src, const loom_examples::sample_tokenizer* tok) {
  using namespace loom;
  (void)src;  // for the note without LOOM_WITH_TEXT
  const auto parent = out.path().parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  const auto kept = out.write([&] { model.save_weights(out.path(), meta); });
  if (!kept.empty()) {
    std::printf("weights: the previous run's %s is kept as %s\n", out.path().c_str(), kept.c_str());
    for (const std::string& line : loom_examples::drop_oldest(loom_examples::previous_runs(out.path()), o.keep_previous,
                                                              "--keep-previous"))
      std::printf("weights: %s\n", line.c_str());
  }
  std::printf("%s to %s\n", saved.c_str(), out.path().c_str());
  if (!o.export_hf.empty()) {
    model.export_hf(o.export_hf);
    std::printf("exported Hugging Face %s weights to %s (model.safetensors, config.json)\n",
                std::string(model.model().arch).c_str(), o.export_hf.c_str());
  }
  if (o.sample_tokens <= 0) return;
#if !LOOM_WITH_TEXT
  if (src.kind() == data::source_kind::indexed) {
    std::printf("(no sample: this train_gpt was built without LOOM_WITH_TEXT, so it cannot decode SentencePiece ids)\n");
    return;
  }
#endif
  const std::string text =
      loom_examples::generate_text(model, o.prompt, o.sample_tokens, {o.temperature, o.top_k, o.seed}, tok);
  std::printf("---- sample (temperature %.2f) ----\n%s\n----\n", o.temperature, text.c_str());
}

/// Throws loom::input_error when a vocabulary of `n` ids (of `what`) does not fit model `m`.
void check_vocab(const loom::models::model_facts& m, std::int64_t n, const std::string& what) {
  using loom::input_error;
  if (n <= m.vocab) return;
  constexpr int bpe = loom::models::quickstart_bpe::vocab;
  throw input_error(what + " has a vocabulary of " + std::to_string(n) + " tokens, more than the " +
                    std::to_string(m.vocab) + " of model " + std::string(m.name) + "; " +
                    (n <= bpe ? std::string("train it with --model quickstart_bpe (vocabulary 8192)")
                              : "prepare the data again with --vocab-size <= " + std::to_string(bpe) +
                                    " and train it with --model quickstart_bpe"));
}

/// The trainer settings of the flags.
loom::train::session_args session_args_of(const options& o, rank_profile& prof,
                                          std::shared_ptr<const loom::device::ascend_runtime> npu) {
  loom::train::session_args a;
  a.ascend = std::move(npu);
  a.ordinal = o.npu;
  a.device_timing = !o.no_device_timing;
  a.deterministic = o.deterministic && o.device == "ascend";
  auto& cfg = a.cfg;
  cfg.micro_batch = o.micro_batch;
  cfg.seq_len = o.seq_len;
  cfg.grad_accum = o.grad_accum;
  cfg.schedule = {o.lr, o.min_lr, o.warmup, o.decay_steps};
  cfg.adamw.weight_decay = o.weight_decay;
  cfg.adamw.max_grad_norm = o.max_grad_norm;
  cfg.adamw.beta1 = o.adam_beta1;
  cfg.adamw.beta2 = o.adam_beta2;
  cfg.adamw.eps = o.adam_eps;
  cfg.seed = o.seed;
  cfg.dropout = o.dropout;
  cfg.recompute = train_gpt_cli::recompute_mode(o.recompute);
  cfg.loss_scaler.initial_scale = o.loss_scale;
  cfg.offload_optimizer = o.offload_optimizer;
  cfg.offload_overlap = o.offload_overlap;
  a.ddp = {.bucket_mb = o.bucket_mb, .overlap = !o.no_overlap, .zero1 = o.zero1, .check_every = o.replica_check_every};
  a.hook = prof.hook();
  a.observer = prof.observer();
  return a;
}

/// The banner: model, batch, data, layout or data parallelism, memory of rank 0.
void print_banner(const options& o, const session& s, const loom::data::batch_source<>& src, std::size_t synthetic,
                  double peak, const std::string& peak_source) {
  const auto& m = s.model();
  const auto& c = s.config();
  const auto r = s.rank();
  const bool layered = r.tp * r.pp > 1;
  std::printf("model %s: %d layers, %d heads, width %d, %zu parameters | %s %s, %s attention | micro-batch %d x seq %d "
              "x accum %d%s = %zu tokens/step\n",
              std::string(m.name).c_str(), m.n_layer, m.n_head, m.d_model, s.parameter_count(),
              std::string(s.device()).c_str(), std::string(s.precision()).c_str(), std::string(s.attention()).c_str(),
              c.micro_batch, c.seq_len, c.grad_accum,
              r.dp > 1 ? (" x " + std::to_string(r.dp) + (layered ? " replicas" : " ranks")).c_str() : "",
              s.tokens_per_step() * std::size_t(r.dp));
  std::printf("data %s | %ld steps, lr %.1e -> %.1e, warm-up %ld%s\n", src.describe().c_str(), o.steps, o.lr, o.min_lr,
              o.warmup, o.decay_steps != o.steps ? (", decay to step " + std::to_string(o.decay_steps)).c_str() : "");
  if (synthetic)
    std::printf("--synthetic-data: training on %zu in-memory batches of random ids, cycled (validation still uses the data)\n",
                synthetic);
  const auto mem = s.memory();
  if (layered) {
    std::printf("layout tp%dpp%d x dp %d = %d ranks (%s): tensor parallel %d, pipeline %d stages of %d layers, 1F1B "
                "over %d micro-batches (ideal bubble %.0f %%), data parallel %d%s\n",
                r.tp, r.pp, r.dp, r.world_size, o.comm.c_str(), r.tp, r.pp, m.n_layer / r.pp, c.grad_accum,
                100 * loom::parallel::bubble_fraction(r.pp, c.grad_accum), r.dp,
                o.zero1 ? " with ZeRO-1 (AdamW moments sharded)" : "");
  } else if (r.world_size == 1 && o.comm == "mpi") {
    std::printf("one rank under --comm mpi: no data parallelism (start N ranks with mpirun -np N)\n");
  } else if (s.bucket_count() > 0) {
    std::printf("data parallel: %d ranks (%s), %zu bucket%s of <= %.2f MiB, overlap %s%s | per rank: buckets %.1f MiB, "
                "optimizer state %.1f MiB\n",
                r.dp, o.comm.c_str(), s.bucket_count(), s.bucket_count() == 1 ? "" : "s", o.bucket_mb,
                o.no_overlap ? "off" : "on", o.zero1 ? ", ZeRO-1" : "",
                mem.dp_buffers / 1048576.0, mem.optimizer / 1048576.0);
  }
  const std::string staging = layered && mem.dp_buffers ? ", dp buckets " + fixed2(mem.dp_buffers / 1048576.0) + " MiB" : "";
  const std::string peak_text = std::isfinite(peak) ? std::to_string(std::llround(peak)) + " GFLOP/s" : "unknown";
  std::printf("peak %s (%s) | %s | memory%s: parameters %.2f MiB, gradients %.2f MiB, optimizer %.2f MiB%s, "
              "activations %.2f MiB%s\n",
              peak_text.c_str(), peak_source.c_str(), threads_text(r.world_size).c_str(), layered ? " of rank 0 (tp 0, stage 0)" : "", mem.parameters / 1048576.0,
              mem.gradients / 1048576.0, mem.optimizer / 1048576.0, staging.c_str(), mem.activations / 1048576.0,
              c.recompute == loom::nn::recompute::none
                  ? ""
                  : (std::string(" (recompute ") + loom::nn::recompute_name(c.recompute) + ")").c_str());
  if (o.deterministic && o.device == "ascend")
    std::printf("deterministic mode: ACL_OPT_DETERMINISTIC on every NPU's context, HCCL_DETERMINISTIC=%s (slower; "
                "a resumed run repeats bit for bit)\n",
                std::getenv("HCCL_DETERMINISTIC") ? std::getenv("HCCL_DETERMINISTIC") : "unset");
  if (mem.host_optimizer > 0)
    std::printf("optimizer offload: AdamW state (fp32 masters, moments, staging) in pinned host memory, %.2f MiB per "
                "rank; the update runs on the host%s\n",
                mem.host_optimizer / 1048576.0, c.offload_overlap ? ", beside the next step's forward" : "");
  if (mem.device_reserved > 0)
    std::printf("NPU memory of rank 0 (caching allocator): %.2f MiB in use, %.2f MiB peak, %.2f MiB reserved\n",
                mem.device_allocated / 1048576.0, mem.device_peak / 1048576.0, mem.device_reserved / 1048576.0);
  std::fflush(stdout);
}

}  // namespace

/// The step's breakdown for the metrics: the host's (train::step_timer), or on a device with its
/// own clock the device-time phases (session::device_breakdown: the step before, read without a
/// wait) with this step's host data_wait and wall time; `other` is then the wall time no device
/// phase covers (host work, idle device).
loom::train::step_breakdown on_device_time(loom::train::step_breakdown host,
                                           const std::optional<loom::train::step_breakdown>& device) {
  using loom::train::phase;
  if (!device) return host;
  loom::train::step_breakdown b = *device;
  b.seconds[std::size_t(phase::data_wait)] = host[phase::data_wait];
  b.seconds[std::size_t(phase::other)] = 0;
  double covered = 0;
  for (const double x : b.seconds) covered += x;
  b.seconds[std::size_t(phase::other)] = std::max(0.0, host.total - covered);
  b.total = std::max(host.total, covered);
  return b;
}

/// Per-rank peak GFLOP/s for MFU and where it came from: --peak-gflops; on an NPU the SoC's row
/// of device::ascend_peak_table for the precision (NaN when the table has none); on the CPU the
/// measured peak of the unit the precision's GEMMs run on (bench::step_peak_unit: AMX-BF16 or
/// VDPBF16PS for bf16, fp32 FMA otherwise; measured by the lead rank only).
std::pair<double, std::string> peak_of(const options& o, const loom::train::session& s,
                                       const loom::device::ascend_runtime* npu, bool lead) {
  if (o.peak_gflops > 0) return {o.peak_gflops, "--peak-gflops"};
  if (npu) {
    const auto row = loom::device::ascend_peak_of(*npu);
    if (!row) return {std::numeric_limits<double>::quiet_NaN(), "NPU not in loom's peak table: no MFU"};
    const double flops = row->flops(s.precision());
    return {flops / 1e9, std::string(s.precision()) + ", " + std::string(row->soc_prefix) +
                             (std::isnan(flops) ? ": no figure in loom's table row, no MFU"
                                                : row->confirmed ? "" : " (unconfirmed table row)")};
  }
  const loom::bench::peak_unit unit = loom::bench::step_peak_unit(s.precision());
  return {lead ? loom::bench::measure_peak(unit).gflops : 1.0,
          std::string(s.precision()) + " on " + std::string(loom::bench::unit_name(unit)) + ", measured"};
}

/// Throws loom::input_error when --seq-len exceeds the model's positions or --micro-batch /
/// --seq-len the instance's compiled capacities (0 takes the capacity).
void check_capacities(const options& o, const loom::train::session_instance& inst,
                      const loom::train::session_args& args) {
  using loom::input_error;
  if (args.cfg.seq_len > 0) {
    const auto* m = inst.facts;
    if (m && args.cfg.seq_len > m->max_seq)
      throw input_error("--seq-len " + std::to_string(o.seq_len) + " exceeds the maximum sequence length " +
                        std::to_string(m->max_seq) + " of model " + std::string(m->name) + "; pass --seq-len <= " +
                        std::to_string(m->max_seq));
  }
  auto capacity = [&](const char* flag, int v, int cap, const char* what) {
    if (v < 0 || v > cap)
      throw input_error(std::string(flag) + " " + std::to_string(v) + " is outside [1, " + std::to_string(cap) +
                        "], the compiled " + what + " capacity of model " + std::string(inst.model) + " (0 means all of it); " +
                        "pass a value in that range, or raise LOOM_SESSION_CAPACITY_" + std::string(inst.model) +
                        " when configuring the build");
  };
  capacity("--micro-batch", o.micro_batch, inst.micro_batch, "micro-batch");
  capacity("--seq-len", o.seq_len, inst.seq_len, "sequence");
}

/// "rank 3 (tp 1, dp 0, pp 1)" on a layout, "rank 1 (dp 1)" with data parallelism alone.
std::string rank_label(const loom::train::session_rank& r, loom::train::world_ref::kind world) {
  std::string name = "rank " + std::to_string(r.world_rank);
  if (r.tp * r.pp > 1)
    name += " (tp " + std::to_string(r.tp_rank) + ", dp " + std::to_string(r.dp_rank) + ", pp " + std::to_string(r.stage) + ")";
  else if (world != loom::train::world_ref::kind::none)
    name += " (dp " + std::to_string(r.world_rank) + ")";
  return name;
}

/// Before the data is opened: a note (lead rank) when --data is a file and also a dataset
/// prefix, and the dataset's vocabulary against the model's (check_vocab). Returns the prefix
/// when --data is a dataset.
std::optional<std::filesystem::path> check_data(const options& o, const loom::models::model_facts& m, bool lead) {
  const auto prefix = loom::data::indexed_dataset_prefix(o.data);
  if (lead && loom::data::file_is_also_dataset_prefix(o.data))
    std::fprintf(stderr, "train_gpt: note: --data '%s' is a file and also the prefix of the dataset '%s.idx'/'.bin' "
                 "beside it; training on the dataset (pass '%s.idx' to say so, or --data with another path to train on "
                 "the file's bytes)\n", o.data.c_str(), o.data.c_str(), o.data.c_str());
  if (prefix)
    if (const auto d = loom::data::read_dataset_summary(*prefix)) check_vocab(m, d->vocab_size, "dataset " + prefix->string());
  return prefix;
}

/// The periodic evaluations' windows: the first --eval-windows of the validation split (all of
/// them if it has fewer; a last partial micro-batch is evaluated too, no window twice). Throws
/// loom::input_error for --early-stop without a validation window.
std::vector<std::int32_t> periodic_validation(const options& o, loom::data::batch_source<>& src, int seq_len) {
  const std::size_t rows = std::min<std::size_t>(std::size_t(o.eval_windows), src.validation_rows());
  std::vector<std::int32_t> val = src.validation_batch(rows);
  if (o.early_stop > 0 && val.empty())
    throw loom::input_error("--early-stop " + std::to_string(o.early_stop) + ": the validation part of " + o.data +
                            " is shorter than one window of " + std::to_string(seq_len + 1) +
                            " tokens, so there is no validation loss to watch; raise --val-fraction or drop --early-stop");
  return val;
}

/// --synthetic-data: 8 batches of uniform random ids made once and cycled, so a step never waits
/// for the loader and the breakdown has no data_wait phase (docs/observability.md); per dp
/// replica, the same on its tp x pp ranks. Empty without the flag.
std::vector<std::vector<std::int32_t>> synthetic_batches(const options& o, const loom::data::batch_source<>& src,
                                                         const loom::train::session& s) {
  std::vector<std::vector<std::int32_t>> synthetic(o.synthetic_data ? 8 : 0);
  const std::int64_t vocab = s.model().vocab;
  for (std::size_t k = 0; k < synthetic.size(); ++k) {
    const std::int64_t v = src.data_vocab() > 0 ? std::min<std::int64_t>(src.data_vocab(), vocab) : vocab;
    std::mt19937_64 rng(o.seed + 1000003 * std::uint64_t(s.rank().dp_rank) + k);
    std::uniform_int_distribution<std::int32_t> id(0, std::int32_t(v - 1));
    synthetic[k].resize(s.windows_per_step() * s.window());
    for (auto& t : synthetic[k]) t = id(rng);
  }
  return synthetic;
}

/// Where training starts: --resume (model, optimizer, step, data position; every rank loads
/// its part, resharded when the checkpoint has another layout), or a fresh run, optionally from
/// Hugging Face weights, which never writes into another run's checkpoints (loom::input_error).
/// A resume never overwrites newer checkpoints of ckpt_dir (set_aside_newer_checkpoints).
/// Creates ckpt_dir when given.
template <class Warn>
resume_point start_of_run(const options& o, loom::train::session& s, const loom::train::session_instance& inst,
                          loom::data::batch_source<>& src, const std::string& ckpt_dir, Warn&& warn, bool lead) {
  resume_point at;
  if (!o.resume.empty()) {
    at = resume_run(s, o.resume, src, warn);
    // newer checkpoints in the directory this run saves to are never overwritten (moved aside or refused)
    std::error_code ec;
    const bool resumed_root = !std::filesystem::exists(std::filesystem::path(o.resume) / "manifest.json", ec) &&
                              std::filesystem::equivalent(o.resume, ckpt_dir, ec);
    for (const std::string& w : set_aside_newer_checkpoints(ckpt_dir, at.step, resumed_root, o.discard_newer_checkpoints,
                                                            lead, [&] { (void)s.broadcast_from_lead(0); }))
      warn(w);
    if (lead) std::printf("%s\n", at.line.c_str());
    if (at.step >= o.steps)
      warn("the checkpoint is at step " + std::to_string(at.step) + ", and --steps is " + std::to_string(o.steps) +
           ": no step is left to train (only the validation, the weights and the sample); pass --steps > " +
           std::to_string(at.step) + " to continue");
  } else {
    if (!o.init_from_hf.empty()) {  // into the whole model, then each rank takes its slices
      const auto whole = inst.whole(o.seed);
      whole->import_hf(o.init_from_hf);
      s.load_global_parameters(whole->parameters());
      if (lead)
        std::printf("initialised from the Hugging Face %s weights in %s\n", std::string(whole->model().arch).c_str(),
                    o.init_from_hf.c_str());
    }
    if (const auto old = loom::io::list_checkpoints(ckpt_dir); !ckpt_dir.empty() && !old.empty())
      throw loom::input_error("checkpoint directory '" + ckpt_dir + "' already holds checkpoints of an earlier run (newest " +
                              old.back().dir.filename().string() + "); pass --resume " + ckpt_dir +
                              " to continue it, or choose another --checkpoint-dir");
  }
  if (!ckpt_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(ckpt_dir, ec);
    if (ec) throw loom::input_error("cannot create --checkpoint-dir '" + ckpt_dir + "': " + ec.message() + "; check the path");
  }
  return at;
}

/// Adds this rank's memory by kind to `mem` (rank 0's on the console): its shards, its stage's
/// activations, the dp buckets on a layout (about one gradient buffer).
void count_memory(loom::memory_counter& mem, const loom::train::session& s) {
  using loom::memory_kind;
  const auto sm = s.memory();
  mem.add(memory_kind::parameters, sm.parameters);
  mem.add(memory_kind::gradients, sm.gradients);
  mem.add(memory_kind::optimizer, sm.optimizer);  // moments (+ fp32 masters below fp32); 1/dp with ZeRO-1
  mem.add(memory_kind::activations, sm.activations);
  if (s.rank().tp * s.rank().pp > 1) mem.add(memory_kind::other, sm.dp_buffers);
}

/// The lead rank's logs: TensorBoard events and metrics.jsonl under --log-dir (a new run moves an
/// earlier run's aside first, keep_previous_logs; a resumed run continues its own).
struct run_logs {
  std::optional<loom::io::tensorboard_writer> tb;
  std::optional<loom::io::jsonl_writer> jsonl;
  /// Creates --log-dir, keeps an earlier run's logs aside (each kept file a console line), opens
  /// both writers and says where they write. Throws std::filesystem::filesystem_error when the directory cannot be made.
  void open(const options& o, loom::train::console& con) {
    std::filesystem::create_directories(o.log_dir);
    if (o.resume.empty())
      for (const std::string& line : keep_previous_logs(o.log_dir, o.keep_previous)) con.message(line);
    tb.emplace(o.log_dir);
    jsonl.emplace(std::filesystem::path(o.log_dir) / "metrics.jsonl");
    con.message("log: " + (std::filesystem::path(o.log_dir) / "metrics.jsonl").string() + " and TensorBoard events in " +
                o.log_dir + " (--log-dir; `tensorboard --logdir " + o.log_dir + "`, or `report`)");
  }
  /// Appends scalars `sc` of step `step` to each open writer.
  void write(long step, std::span<const loom::io::scalar> sc) {
    if (tb) tb->add_scalars(step, sc);
    if (jsonl) jsonl->write_scalars(step, sc);
  }
  /// A step on the console and in the logs, with the memory of this process, of its
  /// memory_counter and, on an NPU, of the caching allocator.
  void step(loom::train::console& con, const loom::train::step_record& rec, loom::train::step_metrics& metrics,
            const loom::memory_counter& mem, const loom::train::session& s) {
    const auto snap = mem.snapshot();
    const auto os = loom::read_process_memory();
    con.step(rec, metrics, &snap, &os);
    if (!tb && !jsonl) return;
    auto sc = loom::train::step_metrics::scalars(rec, &snap, &os);
    if (const auto dm = s.memory(); dm.device_reserved > 0) {
      sc.push("memory/npu_allocated_mib", dm.device_allocated / 1048576.0);
      sc.push("memory/npu_peak_mib", dm.device_peak / 1048576.0);
      sc.push("memory/npu_reserved_mib", dm.device_reserved / 1048576.0);
    }
    write(rec.report.step, sc);
  }
};

/// The mean loss over `windows` (rows of s.window() ids; session::evaluate), evaluated in 16 or
/// so chunks of whole micro-batches and combined by their row counts, so that a long evaluation
/// says how far it is: on the lead rank, once it has run 5 s, a line every 10 s ("validating:
/// 1200 of 5000 windows in 12 s, about 38 s left"). The chunks depend only on the number of rows:
/// every evaluating rank calls this with the same windows.
double evaluate_with_progress(loom::train::session& s, std::span<const std::int32_t> windows, bool lead) {
  using clock = std::chrono::steady_clock;
  const std::size_t w = s.window(), rows = windows.size() / w, b = std::size_t(s.config().micro_batch);
  const std::size_t chunk = std::max(b, (rows / 16 + b - 1) / b * b);
  const auto t0 = clock::now();
  double last_print = 0, weighted = 0;
  for (std::size_t first = 0; first < rows; first += chunk) {
    const std::size_t n = std::min(chunk, rows - first);
    weighted += s.evaluate(windows.subspan(first * w, n * w)) * double(n);
    const double t = std::chrono::duration<double>(clock::now() - t0).count();
    if (lead && first + n < rows && t > 5 && t - last_print >= 10) {
      std::printf("validating: %zu of %zu windows in %.0f s, about %.0f s left\n", first + n, rows, t,
                  t * double(rows - first - n) / double(first + n));
      std::fflush(stdout);
      last_print = t;
    }
  }
  return weighted / double(rows);
}

/// The final validation over the whole validation split (collective over the evaluating ranks):
/// its line on the console and its scalars in the logs (lead rank), after `step` steps of which
/// the run trained those from `start` in `seconds`.
void final_validation(loom::train::session& s, loom::data::batch_source<>& src, run_logs& logs, long start, long step,
                      double seconds, bool lead) {
  const auto all_val = src.validation_batch(src.validation_rows());
  if (all_val.empty()) return;
  const double nats = evaluate_with_progress(s, all_val, lead), bpb = src.bits_per_byte(nats, all_val);
  if (!lead) return;
  const loom::io::scalar sc[] = {{"val/loss", nats}, {"val/bits_per_byte", bpb}};  // the run's final word in the logs
  logs.write(step, sc);
  const std::string how = src.kind() == loom::data::source_kind::indexed ? " (" + src.byte_counting_note() + ")" : "";
  const std::string resumed =
      start > 0 ? " (resumed at step " + std::to_string(start) + ", " + std::to_string(step) + " in all)" : "";
  std::printf("final validation (%zu windows) | val loss %.4f nats/token | %.4f bits/byte | trained %ld steps%s in "
              "%.0f s%s\n",
              all_val.size() / s.window(), nats, bpb, step - start, resumed.c_str(), seconds, how.c_str());
}

/// Which NPU and which CANN rank 0 runs on (an emulation says so in its SoC name).
void print_npu(const options& o, const loom::device::ascend_runtime& npu) {
  const char* soc = npu.api().aclrtGetSocName ? npu.api().aclrtGetSocName() : nullptr;
  const std::string cann = npu.cann_version();
  std::printf("NPU %d of rank 0: %s | CANN %s from %s\n", o.npu >= 0 ? o.npu : 0,
              soc ? soc : "(no SoC name: aclrtGetSocName missing)", cann.empty() ? "(version unknown)" : cann.c_str(),
              npu.home().empty() ? "the loader path" : npu.home().c_str());
}

/// Weights metadata: steps, data, precision, layout, --early-stop's best step, the tokenizer's
/// absolute path and XXH3-64 (sample finds and checks it).
std::map<std::string, std::string> weights_metadata(const options& o, const loom::train::session& s,
                                                    const loom::data::batch_source<>& src, long step,
                                                    const std::string& layout, long best_step,
                                                    const std::string& tokenizer_sum) {
  std::map<std::string, std::string> meta = {{"steps", std::to_string(step)}, {"data", o.data},
                                             {"precision", std::string(s.precision())}};
  if (s.rank().tp * s.rank().pp > 1) meta["layout"] = layout;
  if (best_step >= 0) meta["best_step"] = std::to_string(best_step);
  if (src.kind() == loom::data::source_kind::indexed)  // sample finds the tokenizer from any directory
    meta["tokenizer"] = std::filesystem::absolute(src.tokenizer_path()).lexically_normal().string();
  if (!tokenizer_sum.empty())  // and checks that it is still the one trained with
    meta[std::string(loom_examples::tokenizer_checksum_key)] = tokenizer_sum;
  return meta;
}

int run(const options& o, const loom::train::session_instance& inst, loom::train::world_ref world,
        std::shared_ptr<const loom::device::ascend_runtime> npu) {
  using namespace loom;
  rank_profile prof(o, 0, "rank 0");  // renamed below, once the session knows the rank
  const auto args = session_args_of(o, prof, npu);
  check_capacities(o, inst, args);
  auto session_ptr = inst.make(args, world);
  session& s = *session_ptr;
  const auto r = s.rank();
  const bool lead = r.world_rank == 0, layered = r.tp * r.pp > 1;
  prof.set_rank(r.world_rank, rank_label(r, world.type), world.type != train::world_ref::kind::threads || lead);
  const auto& m = s.model();
  const auto& c = s.config();
  if (c.grad_accum < r.pp && lead)
    std::fprintf(stderr, "train_gpt: warning: --grad-accum %d < PP=%d: the 1F1B pipeline never fills (bubble %.0f %%); "
                 "pass --grad-accum >= %d (the bubble shrinks as (PP-1)/(m+PP-1))\n", c.grad_accum, r.pp,
                 100 * parallel::bubble_fraction(r.pp, c.grad_accum), r.pp);
  // Training data: a text file (byte tokens) or a prepare_data dataset (data/source.hpp), this dp
  // replica's share of every global batch (the same on every rank of a tp x pp group). The
  // data's vocabulary must fit the model's: an id >= vocab has no embedding row.
  const auto prefix = check_data(o, m, lead);
  data::batch_source<> src(o.data, {.micro_batch = std::size_t(c.micro_batch), .seq_len = std::size_t(c.seq_len),
                                    .grad_accum = std::size_t(c.grad_accum), .valid_fraction = o.val_fraction,
                                    .seed = o.seed, .vocab = m.vocab, .workers = o.workers, .dp_rank = r.dp_rank,
                                    .dp_size = r.dp, .verify_checksums = !o.no_data_checksum,
                                    .host_memory = s.host_memory()});  // pinned on an NPU: copied from as is
  if (lead && src.kind() == data::source_kind::indexed && src.checksums() == data::checksum_state::no_summary &&
      !o.no_data_checksum)  // prepare_data always writes one: deleted, or data from another tool (Megatron's)
    std::fprintf(stderr, "train_gpt: warning: dataset '%s' has no '%s.json' (prepare_data's summary), so its .bin and "
                 ".idx are not verified against recorded checksums (and prompts are not normalized); re-run "
                 "prepare_data to write it, or pass --no-data-checksum for data that has none (e.g. Megatron's)\n",
                 src.path().c_str(), src.path().c_str());
  std::string tokenizer_sum;  // XXH3-64 of the tokenizer loaded now, recorded with the weights for sample
#if LOOM_WITH_TEXT
  std::optional<data::text::tokenizer> tok;  // encodes the prompt, decodes the sample, counts bytes exactly
  if (prefix) {
    tok = data::text::tokenizer::load(src.tokenizer_path());
    check_vocab(m, tok->vocab_size(), "tokenizer " + src.tokenizer_path().string());
    src.set_token_bytes(data::token_byte_lengths(*tok));
    tokenizer_sum = loom::xxh3_hex(tok->serialized().data(), tok->serialized().size());
  }
  const data::text::tokenizer* sample_tok = tok ? &*tok : nullptr;
#else
  const loom_examples::sample_tokenizer* sample_tok = nullptr;
#endif
  // fail before training, not after it, when the weights cannot be written
  weights_file out(o.out.empty() ? "out/" + std::string(m.name) + ".safetensors" : o.out);
  ensure_writable_directory(out.path().parent_path(), "--out");
  if (lead && !o.log_dir.empty()) ensure_writable_directory(o.log_dir, "--log-dir");
  const std::vector<std::int32_t> val = periodic_validation(o, src, c.seq_len);
  const auto synthetic = synthetic_batches(o, src, s);
  // per rank, times the ranks: each rank measures with its share of the cores (only rank 0 prints)
  const auto [rank_peak, peak_source] = peak_of(o, s, npu.get(), lead);
  const double peak = r.world_size * rank_peak;
  if (lead && npu) print_npu(o, *npu);
  if (lead) print_banner(o, s, src, synthetic.size(), peak, peak_source);

  const std::string ckpt_dir = !o.checkpoint_dir.empty() ? o.checkpoint_dir
                               : o.resume.empty()         ? std::string()
                                                          : checkpoint_root_of(o.resume);
  auto warn = [lead](const std::string& w) {
    if (lead) std::fprintf(stderr, "train_gpt: warning: %s\n", w.c_str());
  };
  const resume_point at = start_of_run(o, s, inst, src, ckpt_dir, warn, lead);
  const long start = at.step;
  std::uint64_t tokens_seen = at.tokens;
  std::fflush(stdout);

  // observability: step breakdown, MFU, memory, console, TensorBoard, JSON lines, trace window
  memory_counter mem;
  count_memory(mem, s);
  const double fpt = 6.0 * double(s.parameter_count(false)) + 12.0 * m.n_layer * c.seq_len * m.d_model;
  train::step_metrics metrics({.flops_per_token = fpt, .peak_flops = peak * 1e9, .total_steps = o.steps});
  train::step_timer timer;
  train::console con({.redraw = o.redraw, .total_steps = o.steps, .print_every = o.log_every,
                      .summary_every = lead ? o.summary_every : 0});
  run_logs logs;
  if (!o.log_dir.empty() && lead) logs.open(o, con);
  // the trace shows every rank's phases (on a layout, each pipeline action as forward / backward /
  // exposed_comm: waiting for the neighbouring stage or the tp/dp reductions), kernels and
  // communication: one trace.json (profile.hpp)
  io::trace_recorder& trace = prof.recorder();
  std::array<double, train::phase_count> began{};
  s.set_phase_callback([&](train::phase p, bool begin) {
    if (begin) {
      timer.enter(p);
      if (trace.recording()) began[std::size_t(p)] = io::trace_recorder::now_us();  // no clock read outside the window
    } else {
      timer.leave();
      if (trace.recording())
        trace.complete(train::phase_name(p), "step", began[std::size_t(p)], io::trace_recorder::now_us() - began[std::size_t(p)]);
    }
  });

  const bool evaluator = r.dp_rank == 0;  // dp replica 0's tp x pp ranks evaluate together
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto report_val = [&](long step) {
    if (!evaluator || val.empty()) return std::nan("");  // a validation part shorter than one window
    const double nats = s.evaluate(val), bpb = src.bits_per_byte(nats, val);
    if (!lead) return nats;
    con.message("step " + std::to_string(step) + " | val loss " + std::to_string(nats).substr(0, 6) + " nats/token | " +
                std::to_string(bpb).substr(0, 6) + " bits/byte | " +
                std::to_string(long(std::chrono::duration<double>(clock::now() - t0).count())) + " s | " +
                covered_windows(val.size() / s.window(), src.validation_rows()));
    const io::scalar sc[] = {{"val/loss", nats}, {"val/bits_per_byte", bpb}};
    logs.write(step, sc);
    return nats;
  };
  // Checkpoints written in the background. The save is collective (every rank writes its files;
  // latest moves only when all ranks succeeded) when every rank holds a part of the state: on a
  // layout, or with --zero1 (each rank's shard of the optimizer state); else rank 0 saves.
  const bool collective = world.type != train::world_ref::kind::none && (layered || o.zero1);
  checkpoint_saver saver(s, ckpt_dir, o.keep, start, collective, r.world_size, lead, o.exit_on_save_failure, con, warn);
  const exit_signal signals(o.exit_signal_handler);
  int stop_signal = 0;  // --exit-signal-handler: the signal that ends the run, the same on every rank
  const std::string layout_name = inst.layout();
  auto save_checkpoint = [&] {
    const auto st = src.state();
    io::run_state rs;
    rs.tokens = tokens_seen;
    rs.data = {{"kind", int(st.kind)}, {"epoch", st.epoch}, {"index", st.index}, {"seed", st.seed}};
    rs.extra = {{"program", "train_gpt"}, {"data_path", o.data}, {"precision", std::string(s.precision())}};
    if (layered) rs.extra["layout"] = layout_name;
    saver.save(rs);
  };
  // --early-stop: the ranks of dp replica 0 follow the validation loss (the same on each of them)
  // and keep a copy of their part of the parameters at the best evaluation; world rank 0 decides
  early_stopper stopper(evaluator ? o.early_stop : 0);
  long step = start;
  for (; step < o.steps; ++step) {
    int out_of_time = o.time_budget > 0 && std::chrono::duration<double>(clock::now() - t0).count() > o.time_budget;
    if (o.time_budget > 0) out_of_time = s.broadcast_from_lead(out_of_time);  // every rank stops together
    if (out_of_time) {
      if (lead) con.message("time budget of " + std::to_string(long(o.time_budget)) + " s reached after " + std::to_string(step) + " steps");
      break;
    }
    if (o.stop_at_step > 0 && step >= o.stop_at_step) {
      if (lead) con.message("stopping at step " + std::to_string(step) + " (--stop-at-step); continue with --resume " + ckpt_dir);
      break;
    }
    if (o.exit_interval > 0 && step > start && step % o.exit_interval == 0) {
      if (lead) con.message("stopping at step " + std::to_string(step) + " (--exit-interval); continue with --resume " + ckpt_dir);
      break;
    }
    if (o.exit_signal_handler && (stop_signal = s.broadcast_from_lead(exit_signal::requested())) != 0) {
      if (lead) con.message(std::string(exit_signal::name(stop_signal)) + " received: stopping at step " + std::to_string(step));
      break;
    }
    if (const auto msg = prof.begin_step(step, s); !msg.empty() && lead) con.message(msg);
    timer.begin_step();
    std::span<const std::int32_t> batch;
    if (o.synthetic_data) {
      batch = synthetic[std::size_t(step) % synthetic.size()];
    } else {
      auto d = timer.scope(train::phase::data_wait);
      const auto z = trace.zone("data_wait", "data");
      batch = src.next();  // valid until the next call
    }
    const auto res = s.step(batch);
    if (s.loss_scaling())  // the loss scale: in the logs every step, on the console when it changes
      report_loss_scale(step, res, s.loss_scale(), lead, con, warn, logs.tb, logs.jsonl);
    const auto rec = metrics.record({.step = step, .tokens = res.tokens, .loss = res.loss, .lr = res.lr,
                                     .grad_norm = res.grad_norm, .skipped = res.skipped},
                                    on_device_time(timer.end_step(), s.device_breakdown()));
    if (lead) logs.step(con, rec, metrics, mem, s);
    int stop_early = 0;
    if (o.eval_every > 0 && (step + 1) % o.eval_every == 0) {
      const double nats = report_val(step + 1);
      if (stopper.enabled()) stop_early = stopper.observe(step + 1, nats, [&] { return s.parameter_bytes(); });
      if (o.early_stop > 0) stop_early = s.broadcast_from_lead(stop_early);  // world rank 0 decides; every rank stops together
    }
    tokens_seen += std::uint64_t(res.tokens);
    if (o.save_every > 0 && (step + 1) % o.save_every == 0) save_checkpoint();
    if (stop_early) {
      if (lead) con.message(stopper.stop_message(step + 1));
      ++step;
      break;
    }
  }
  save_checkpoint();  // the last step, also after --stop-at-step, --exit-interval, a signal or the time budget
  saver.finish();
  const std::string save_failures = saver.failure_summary();
  if (const auto msg = prof.finish(s); !msg.empty() && lead) con.message(msg);
  if (stop_signal != 0) {  // preemption: the checkpoint is all that is wanted
    if (lead) {
      con.finish();
      if (!save_failures.empty()) std::fprintf(stderr, "train_gpt: error: %s\n", save_failures.c_str());
      else std::printf("%s: checkpoint of step %ld saved in %s; continue with --resume %s\n",
                       exit_signal::name(stop_signal), step, ckpt_dir.c_str(), ckpt_dir.c_str());
    }
    return save_failures.empty() ? 0 : 1;
  }
  if (!evaluator) return 0;  // the other dp replicas are done: replica 0 validates, rank 0 saves and samples
  if (lead) con.finish();
  if (const auto dm = s.memory(); lead && dm.device_reserved > 0)  // the high-water mark of the whole run
    std::printf("NPU memory of rank 0 after training: %.2f MiB peak (caching allocator), %.2f MiB reserved\n",
                dm.device_peak / 1048576.0, dm.device_reserved / 1048576.0);
  // --early-stop: the final validation, the weights and the sample are those of the best evaluation
  // (the checkpoints above hold the last state, to resume from)
  if (stopper.enabled() && stopper.best_step() >= 0 && stopper.best_step() != step) {
    s.restore_parameter_bytes(stopper.best());
    if (lead) std::printf("%s\n", stopper.keep_message().c_str());
  }
  final_validation(s, src, logs, start, step, std::chrono::duration<double>(clock::now() - t0).count(), lead);
  const auto meta = weights_metadata(o, s, src, step, layout_name, stopper.enabled() ? stopper.best_step() : -1,
                                     tokenizer_sum);
  auto global = s.gather_parameters();  // the whole model's parameters, gathered over tp and pp
  if (!lead) return 0;
  // the trainer's parameters, gradients, optimizer state and activations are freed before the whole
  // model is made: saving then needs the whole model and one copy, not the trainer besides them
  // (a 1B-parameter fp32 model trains in 16 GB and would need 28 GB here)
  session_ptr.reset();
  const auto whole = inst.whole(o.seed);
  std::copy(global.begin(), global.end(), whole->parameters().begin());
  std::vector<float>().swap(global);
  save_and_sample(o, *whole, out, meta,
                  layered ? "saved weights (gathered from " + std::to_string(r.tp) + " x " + std::to_string(r.pp) + " shards)"
                          : std::string("saved weights"),
                  src, sample_tok);
  if (save_failures.empty()) return 0;
  std::fprintf(stderr, "train_gpt: error: %s\n", save_failures.c_str());  // the run's weights are saved; its checkpoints not all
  return 1;
}

}  // namespace train_gpt_cli
