#pragma once
// train_gpt's run loop: one rank of a run on any layout (train::basic_trainer). Included by
// train_gpt.cpp (layout<1,1>: one rank, or data parallel over --ranks / mpirun) and by
// train_gpt/run_layout.hpp (--layout tpXppY, TP*PP > 1: tensor and pipeline parallel with data
// parallelism on top; docs/tensor_pipeline.md). Not a library header: examples/ only.
//
// The loop is the same on every layout; what TP*PP > 1 changes:
// - validation runs on the ranks of dp replica 0 (evaluate() is collective over tp and pp; on
//   layout<1,1> dp replica 0 is rank 0); world rank 0 prints and logs;
// - checkpoints are saved collectively (every rank takes part; docs/checkpoint.md "Multi-rank
//   save"), as on layout<1,1> with --zero1 only; --resume accepts a checkpoint of any layout
//   (resharded on load);
// - --init-from-hf loads into the single-rank model and each rank takes its slices; at the end
//   the parameters are gathered to the single-rank model's shape (nn::gather_parameters) and
//   rank 0 saves, exports and samples with an nn::gpt (fp32);
// - the banner names the layout and rank 0's memory; bf16/fp16 only for char_tiny on tp2pp2.
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
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/bench/peak.hpp>
#include <loom/core/memory.hpp>
#include <loom/data/source.hpp>
#if LOOM_WITH_TEXT
#include <loom/data/text/tokenizer.hpp>  // SentencePiece: links loom::text
#endif
#include <loom/device/cpu.hpp>
#include <loom/io/checkpoint.hpp>  // checkpoints, import_gpt2 / export_gpt2
#include <loom/io/jsonl.hpp>
#include <loom/io/tensorboard.hpp>
#include <loom/io/trace.hpp>
#include <loom/io/weights.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/nn/generate_in_vocab.hpp>
#include <loom/nn/gpt.hpp>
#include <loom/nn/gpt_parallel.hpp>
#include <loom/parallel/layout.hpp>
#include <loom/train/console.hpp>
#include <loom/train/metrics.hpp>
#include <loom/train/trainer.hpp>

#include "loop.hpp"
#include "options.hpp"
#include "profile.hpp"
#include "resume.hpp"

namespace train_gpt_cli {

/// x with two decimals ("0.07").
inline std::string fixed2(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", x);
  return b;
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

/// The end of a run on rank 0: saves `model` (the whole model) to `out` with `meta`, exports it
/// with --export-hf, then prints a sample (bytes for a text file; SentencePiece ids for a dataset:
/// prompt encoded, ids decoded with `tok`, a blank line for each end of document). `saved`: the
/// console line's "saved weights ..." words. No sample with --sample-tokens 0.
template <class M, int T, class Model, class Source, class Tokenizer>
int save_and_sample(const options& o, loom::context<loom::device::cpu>& ctx, Model& model, const std::string& out,
                    const std::map<std::string, std::string>& meta, const std::string& saved, const Source& src,
                    const Tokenizer* tok) {
  using namespace loom;
  (void)src;  // for the note without LOOM_WITH_TEXT
  const auto parent = std::filesystem::path(out).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  io::save_weights(model, out, meta);
  std::printf("%s to %s\n", saved.c_str(), out.c_str());
  if (!o.export_hf.empty()) {
    io::export_gpt2(ctx, model, o.export_hf);
    std::printf("exported Hugging Face GPT-2 weights to %s (model.safetensors, config.json)\n", o.export_hf.c_str());
  }
  if (o.sample_tokens <= 0) return 0;
  typename Model::template activations<1, T> sacts(ctx);
  std::vector<std::int32_t> tokens(o.prompt.begin(), o.prompt.end());
  for (auto& t : tokens) t = std::int32_t(std::uint8_t(t));
  int sample_vocab = M::vocab;  // ids that have text: the tokenizer's pieces (quickstart_bpe has more rows)
#if LOOM_WITH_TEXT
  if (tok) {
    tokens = tok->encode(o.prompt);
    sample_vocab = tok->vocab_size();
  }
#else
  (void)tok;
  if (src.kind() == data::source_kind::indexed) {
    std::printf("(no sample: this train_gpt was built without LOOM_WITH_TEXT, so it cannot decode SentencePiece ids)\n");
    return 0;
  }
#endif
  nn::generate_in_vocab(model, ctx, sacts, tokens, o.sample_tokens, {o.temperature, o.top_k, o.seed}, sample_vocab);
  std::string text(tokens.begin(), tokens.end());
#if LOOM_WITH_TEXT
  if (tok) text = data::decode_documents(*tok, tokens, tok->eod_id());
#endif
  std::printf("---- sample (temperature %.2f) ----\n%s\n----\n", o.temperature, text.c_str());
  return 0;
}

/// One rank's run of model M on layout<TP, PP> in precision Prec; B, T the compiled micro-batch
/// and sequence capacities. World is a communicator (comm::threads, comm::mpi) or std::nullptr_t
/// for a single rank without data parallelism (world == nullptr; TP = PP = 1 only). Returns 0;
/// throws loom::input_error for bad input (on every rank alike where it is collective).
template <class M, int B, int T, int TP, int PP, class World, class Prec = loom::precision::fp32>
int run(const options& o, World* world) {
  using namespace loom;
  constexpr bool is_parallel = !std::is_same_v<World, std::nullptr_t>;
  constexpr bool layered = TP * PP > 1;  // tensor and/or pipeline parallel
  static_assert(is_parallel || !layered, "train_gpt: a --layout run needs a world communicator");
  using L = parallel::layout<TP, PP>;
  using P = policy<device::cpu, Prec, L>;
  // fp16 needs dynamic loss scaling (a trainer without it does not compile); bf16/fp32 run without
  using scaler = std::conditional_t<Prec::needs_loss_scaling, train::dynamic_loss_scaler, train::no_loss_scaler>;
  // layout<1,1>: the trainer's dp communicator is erased (train::trainer); otherwise the world's
  using comm_t = std::conditional_t<layered, World, parallel::local_group>;
  using trainer_t = train::basic_trainer<M, P, B, T, comm_t, kernels::fused, scaler>;
  using storage_t = typename trainer_t::storage_t;
  int wr = 0, ranks = 1;  // world rank (the trace's pid) and size
  if constexpr (is_parallel) wr = world->rank(), ranks = world->size();
  const bool lead = wr == 0;
  context<device::cpu> ctx;
  std::string rank_name = "rank " + std::to_string(wr);
  if constexpr (layered) {
    const int wdp = std::max(1, ranks / (TP * PP));
    rank_name += " (tp " + std::to_string(L::tp_rank(wr)) + ", dp " + std::to_string(L::dp_rank(wr, wdp)) + ", pp " +
                 std::to_string(L::pp_rank(wr, wdp)) + ")";
  } else if (is_parallel) {
    rank_name += " (dp " + std::to_string(wr) + ")";
  }
  rank_profile prof(o, wr, rank_name);
  prof.attach(ctx, world);  // before the trainer: the groups it splits inherit the observer
  train::trainer_config cfg;
  cfg.micro_batch = o.micro_batch;
  cfg.seq_len = o.seq_len;
  cfg.grad_accum = o.grad_accum;
  cfg.schedule = {o.lr, o.min_lr, o.warmup, o.steps};
  cfg.adamw.weight_decay = o.weight_decay;
  cfg.adamw.max_grad_norm = o.max_grad_norm;
  cfg.seed = o.seed;
  cfg.dropout = o.dropout;
  if (o.seq_len > M::max_seq)
    throw input_error("--seq-len " + std::to_string(o.seq_len) + " exceeds the maximum sequence length " +
                      std::to_string(M::max_seq) + " of model " + std::string(M::name) + "; pass --seq-len <= " +
                      std::to_string(M::max_seq));
  std::optional<trainer_t> trainer_storage;
  if constexpr (is_parallel) {
    parallel::ddp_options ddp{.bucket_mb = o.bucket_mb, .overlap = !o.no_overlap, .zero1 = o.zero1};
    if constexpr (!layered) ddp.check_every = o.replica_check_every;
    trainer_storage.emplace(ctx, cfg, *world, ddp);
  } else {
    trainer_storage.emplace(ctx, cfg);
  }
  trainer_t& tr = *trainer_storage;
  const int dp = tr.dp_size();
  const auto& c = tr.config();
  if (c.grad_accum < PP && lead)
    std::fprintf(stderr, "train_gpt: warning: --grad-accum %d < PP=%d: the 1F1B pipeline never fills (bubble %.0f %%); "
                 "pass --grad-accum >= %d (the bubble shrinks as (PP-1)/(m+PP-1))\n", c.grad_accum, PP,
                 100 * parallel::bubble_fraction(PP, c.grad_accum), PP);
  // Training data: a text file (byte tokens) or a prepare_data dataset (data/source.hpp), this dp
  // replica's share of every global batch (the same on every rank of a tp x pp group). The
  // data's vocabulary must fit the model's: an id >= M::vocab has no embedding row.
  const auto prefix = data::indexed_dataset_prefix(o.data);
  auto check_vocab = [&](std::int64_t n, const std::string& what) {
    if (n <= M::vocab) return;
    constexpr int bpe = models::quickstart_bpe::vocab;
    throw input_error(what + " has a vocabulary of " + std::to_string(n) + " tokens, more than the " +
                      std::to_string(M::vocab) + " of model " + std::string(M::name) + "; " +
                      (n <= bpe ? std::string("train it with --model quickstart_bpe (vocabulary 8192)")
                                : "prepare the data again with --vocab-size <= " + std::to_string(bpe) +
                                      " and train it with --model quickstart_bpe"));
  };
  if (prefix)
    if (const auto s = data::read_dataset_summary(*prefix)) check_vocab(s->vocab_size, "dataset " + prefix->string());
  data::batch_source<> src(o.data, {.micro_batch = std::size_t(c.micro_batch), .seq_len = std::size_t(c.seq_len),
                                    .grad_accum = std::size_t(c.grad_accum), .valid_fraction = o.val_fraction,
                                    .seed = o.seed, .vocab = M::vocab, .dp_rank = tr.dp_rank(), .dp_size = dp,
                                    .verify_checksums = !o.no_data_checksum});
#if LOOM_WITH_TEXT
  std::optional<data::text::tokenizer> tok;  // encodes the prompt, decodes the sample, counts bytes exactly
  if (prefix) {
    tok = data::text::tokenizer::load(src.tokenizer_path());
    check_vocab(tok->vocab_size(), "tokenizer " + src.tokenizer_path().string());
    src.set_token_bytes(data::token_byte_lengths(*tok));
  }
  const data::text::tokenizer* sample_tok = tok ? &*tok : nullptr;
#else
  const std::nullptr_t* sample_tok = nullptr;
#endif
  // fail before training, not after it, when the weights cannot be written
  const std::string out = o.out.empty() ? "out/" + std::string(M::name) + ".safetensors" : o.out;
  ensure_writable_directory(std::filesystem::path(out).parent_path(), "--out");
  // periodic evaluations: the first --eval-windows windows of the validation split (all of them
  // if it has fewer; a last partial micro-batch is evaluated too, no window twice)
  const std::size_t val_rows = std::min<std::size_t>(std::size_t(o.eval_windows), src.validation_rows());
  std::span<const std::int32_t> batch;
  const std::vector<std::int32_t> val = src.validation_batch(val_rows);
  if (o.early_stop > 0 && val.empty())
    throw input_error("--early-stop " + std::to_string(o.early_stop) + ": the validation part of " + o.data +
                      " is shorter than one window of " + std::to_string(c.seq_len + 1) +
                      " tokens, so there is no validation loss to watch; raise --val-fraction or drop --early-stop");
  // --synthetic-data: a few batches of uniform random ids made once and cycled, so a step never
  // waits for the loader and the breakdown has no data_wait phase (docs/observability.md)
  std::vector<std::vector<std::int32_t>> synthetic(o.synthetic_data ? 8 : 0);
  for (std::size_t k = 0; k < synthetic.size(); ++k) {  // per dp replica, the same on its tp x pp ranks
    const std::int64_t v = src.data_vocab() > 0 ? std::min<std::int64_t>(src.data_vocab(), M::vocab) : M::vocab;
    std::mt19937_64 rng(o.seed + 1000003 * std::uint64_t(tr.dp_rank()) + k);
    std::uniform_int_distribution<std::int32_t> id(0, std::int32_t(v - 1));
    synthetic[k].resize(tr.windows_per_step() * tr.window());
    for (auto& t : synthetic[k]) t = id(rng);
  }

  if (lead) {
    std::printf("model %s: %d layers, %d heads, width %d, %zu parameters | micro-batch %d x seq %d x accum %d%s = %zu tokens/step\n",
                std::string(M::name).c_str(), M::n_layer, M::n_head, M::d_model, nn::parameter_count<M>(), c.micro_batch,
                c.seq_len, c.grad_accum,
                dp > 1 ? (" x " + std::to_string(dp) + (layered ? " replicas" : " ranks")).c_str() : "",
                tr.tokens_per_step() * std::size_t(dp));
    std::printf("data %s | %ld steps, lr %.1e -> %.1e, warm-up %ld\n", src.describe().c_str(), o.steps, o.lr, o.min_lr,
                o.warmup);
    if (o.synthetic_data)
      std::printf("--synthetic-data: training on %zu in-memory batches of random ids, cycled (validation still uses the data)\n",
                  synthetic.size());
    if (layered) {
      std::printf("layout tp%dpp%d x dp %d = %d ranks (%s), %s: tensor parallel %d, pipeline %d stages of %d layers, 1F1B "
                  "over %d micro-batches (ideal bubble %.0f %%), data parallel %d%s\n",
                  TP, PP, dp, ranks, o.comm.c_str(), o.precision.c_str(), TP, PP, M::n_layer / PP, c.grad_accum,
                  100 * parallel::bubble_fraction(PP, c.grad_accum), dp, o.zero1 ? " with ZeRO-1 (AdamW moments sharded)" : "");
    } else if (const auto* s = tr.data_parallel()) {
      const auto m = s->memory();
      std::printf("data parallel: %d ranks (%s), %zu buckets of <= %.2f MiB, overlap %s%s | per rank: buckets %.1f MiB, "
                  "optimizer state %.1f MiB\n",
                  dp, o.comm.c_str(), s->bucket_count(), o.bucket_mb, o.no_overlap ? "off" : "on",
                  o.zero1 ? ", ZeRO-1" : "", m.buckets / 1048576.0, tr.optimizer_bytes() / 1048576.0);
    }
    std::fflush(stdout);
  }

  // checkpoints: resume (model, optimizer, step, data position; every rank loads its part,
  // resharded when the checkpoint has another layout), or a fresh run, optionally from Hugging
  // Face GPT-2 weights; a fresh run never writes into another run's checkpoints
  const std::string ckpt_dir = !o.checkpoint_dir.empty() ? o.checkpoint_dir
                               : o.resume.empty()         ? std::string()
                                                          : checkpoint_root_of(o.resume);
  long start = 0;
  std::uint64_t tokens_seen = 0;
  auto warn = [lead](const std::string& w) {
    if (lead) std::fprintf(stderr, "train_gpt: warning: %s\n", w.c_str());
  };
  if (!o.resume.empty()) {
    const auto at = resume_run(ctx, o.resume, tr, src, warn, lead);
    start = at.step;
    tokens_seen = at.tokens;
  } else {
    if (!o.init_from_hf.empty()) {
      if constexpr (layered) {  // into the single-rank model, then each rank takes its slices
        nn::gpt<M, policy<device::cpu, precision::fp32>> whole(ctx, o.seed);
        io::import_gpt2(ctx, whole, o.init_from_hf);
        const auto p = whole.parameters();
        const std::vector<storage_t> narrow(p.begin(), p.end());  // bf16/fp16: rounded once, here
        nn::load_global_parameters(ctx, tr.model(), std::span<const storage_t>(narrow));
      } else {
        io::import_gpt2(ctx, tr.model(), o.init_from_hf);
      }
      tr.sync_master_weights(ctx);  // bf16/fp16: the fp32 masters start from the imported weights
      if (lead) std::printf("initialised from the GPT-2 weights in %s\n", o.init_from_hf.c_str());
    }
    if (const auto old = io::list_checkpoints(ckpt_dir); !ckpt_dir.empty() && !old.empty())
      throw input_error("checkpoint directory '" + ckpt_dir + "' already holds checkpoints of an earlier run (newest " +
                        old.back().dir.filename().string() + "); pass --resume " + ckpt_dir +
                        " to continue it, or choose another --checkpoint-dir");
  }
  if (!ckpt_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(ckpt_dir, ec);
    if (ec) throw input_error("cannot create --checkpoint-dir '" + ckpt_dir + "': " + ec.message() + "; check the path");
  }
  std::fflush(stdout);

  // observability: step breakdown, MFU, memory, console, TensorBoard, JSON lines, trace window
  memory_counter mem;  // this rank's (rank 0's on the console): its shards, its stage's activations
  mem.add(memory_kind::parameters, tr.model().parameters().bytes());
  mem.add(memory_kind::gradients, tr.model().gradients().bytes());
  mem.add(memory_kind::optimizer, tr.optimizer_bytes());  // moments (+ fp32 masters below fp32); 1/dp with ZeRO-1
  mem.add(memory_kind::activations, tr.activation_bytes());
  const std::size_t dp_buffers = layered && tr.data_parallel() ? tr.data_parallel()->memory().buckets : 0;
  if (layered) mem.add(memory_kind::other, dp_buffers);  // the dp buckets (about one gradient buffer; ZeRO-1 bf16/fp16: +half)
  // per rank, times the ranks: each rank measures with its share of the cores (only rank 0 prints)
  const double peak = ranks * (o.peak_gflops > 0 ? o.peak_gflops : lead ? bench::measure_fp32_peak().gflops : 1.0);
  if (lead && layered)
    std::printf("fp32 peak %.0f GFLOP/s (%s) | memory of rank 0 (tp 0, stage 0): parameters %.2f MiB, gradients %.2f MiB, "
                "optimizer %.2f MiB%s, activations %.2f MiB\n",
                peak, o.peak_gflops > 0 ? "--peak-gflops" : "measured", mem.current(memory_kind::parameters) / 1048576.0,
                mem.current(memory_kind::gradients) / 1048576.0, mem.current(memory_kind::optimizer) / 1048576.0,
                dp_buffers ? (", ZeRO-1 staging " + fixed2(dp_buffers / 1048576.0) + " MiB").c_str() : "",
                mem.current(memory_kind::activations) / 1048576.0);
  else if (lead)
    std::printf("fp32 peak %.0f GFLOP/s (%s) | memory: parameters %.1f MiB, gradients %.1f MiB, optimizer %.1f MiB, activations %.1f MiB\n",
              peak, o.peak_gflops > 0 ? "--peak-gflops" : "measured", mem.current(memory_kind::parameters) / 1048576.0,
              mem.current(memory_kind::gradients) / 1048576.0, mem.current(memory_kind::optimizer) / 1048576.0,
              mem.current(memory_kind::activations) / 1048576.0);
  std::fflush(stdout);
  const double fpt = 6.0 * double(nn::parameter_count<M>(false)) + 12.0 * M::n_layer * c.seq_len * M::d_model;
  train::step_metrics metrics({.flops_per_token = fpt, .peak_flops = peak * 1e9, .total_steps = o.steps});
  train::step_timer timer;
  train::console con({.total_steps = o.steps, .summary_every = lead ? o.summary_every : 0});
  std::optional<io::tensorboard_writer> tb;
  std::optional<io::jsonl_writer> jsonl;
  if (!o.log_dir.empty() && lead) {
    std::filesystem::create_directories(o.log_dir);
    const auto log_file = std::filesystem::path(o.log_dir) / "metrics.jsonl";
    if (o.resume.empty() && std::filesystem::exists(log_file)) {
      // A new run starts a new log (a resumed run continues its own); the old one is kept.
      auto kept = log_file;
      for (int k = 1; std::filesystem::exists(kept); ++k)
        kept = std::filesystem::path(o.log_dir) / ("metrics.previous-" + std::to_string(k) + ".jsonl");
      std::filesystem::rename(log_file, kept);
      con.message("log: the previous run's " + log_file.string() + " is kept as " + kept.string());
    }
    tb.emplace(o.log_dir);
    jsonl.emplace(log_file);
  }
  // the trace shows every rank's phases (on a layout, each pipeline action as forward / backward /
  // exposed_comm: waiting for the neighbouring stage or the tp/dp reductions), kernels and
  // communication: one trace.json (profile.hpp)
  io::trace_recorder& trace = prof.recorder();
  std::array<double, train::phase_count> began{};
  tr.on_phase = [&](train::phase p, bool begin) {
    if (begin) {
      timer.enter(p);
      if (trace.recording()) began[std::size_t(p)] = io::trace_recorder::now_us();  // no clock read outside the window
    } else {
      timer.leave();
      if (trace.recording())
        trace.complete(train::phase_name(p), "step", began[std::size_t(p)], io::trace_recorder::now_us() - began[std::size_t(p)]);
    }
  };

  const bool evaluator = tr.dp_rank() == 0;  // dp replica 0's tp x pp ranks evaluate together
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto report_val = [&](long step) {
    if (!evaluator || val.empty()) return std::nan("");  // a validation part shorter than one window
    const double nats = tr.evaluate(ctx, val), bpb = src.bits_per_byte(nats, val);
    if (!lead) return nats;
    con.message("step " + std::to_string(step) + " | val loss " + std::to_string(nats).substr(0, 6) + " nats/token | " +
                std::to_string(bpb).substr(0, 6) + " bits/byte | " +
                std::to_string(long(std::chrono::duration<double>(clock::now() - t0).count())) + " s");
    const io::scalar sc[] = {{"val/loss", nats}, {"val/bits_per_byte", bpb}};
    if (tb) tb->add_scalars(step, sc);
    if (jsonl) jsonl->write_scalars(step, sc);
    return nats;
  };
  // Checkpoints written in the background. The save is collective (every rank writes its files;
  // latest moves only when all ranks succeeded) when every rank holds a part of the state: on a
  // layout, or with --zero1 (each rank's shard of the optimizer state); else rank 0 saves.
  World* save_world = nullptr;
  if constexpr (is_parallel) save_world = layered || o.zero1 ? world : nullptr;
  checkpoint_saver<trainer_t, World> saver(ckpt_dir, o.keep, start, save_world, lead, con, warn);
  const std::string layout_name = "tp" + std::to_string(TP) + "pp" + std::to_string(PP);
  auto save_checkpoint = [&] {
    const auto s = src.state();
    io::run_state st;
    st.tokens = tokens_seen;
    st.data = {{"kind", int(s.kind)}, {"epoch", s.epoch}, {"index", s.index}, {"seed", s.seed}};
    st.extra = {{"program", "train_gpt"}, {"data_path", o.data}};
    if (layered) st.extra["layout"] = layout_name;
    saver.save(ctx, tr, st);
  };
  // --early-stop: the ranks of dp replica 0 follow the validation loss (the same on each of them)
  // and keep a copy of their part of the parameters at the best evaluation; world rank 0 decides
  early_stopper<storage_t> stopper(evaluator ? o.early_stop : 0);
  long step = start;
  for (; step < o.steps; ++step) {
    int out_of_time = o.time_budget > 0 && std::chrono::duration<double>(clock::now() - t0).count() > o.time_budget;
    if constexpr (is_parallel)
      if (o.time_budget > 0) world->broadcast(std::span<int>(&out_of_time, 1), 0);  // every rank stops together
    if (out_of_time) {
      if (lead) con.message("time budget of " + std::to_string(long(o.time_budget)) + " s reached after " + std::to_string(step) + " steps");
      break;
    }
    if (o.stop_at_step > 0 && step >= o.stop_at_step) {
      if (lead) con.message("stopping at step " + std::to_string(step) + " (--stop-at-step); continue with --resume");
      break;
    }
    if (const auto m = prof.begin_step(step, world); !m.empty() && lead) con.message(m);
    timer.begin_step();
    if (o.synthetic_data) {
      batch = synthetic[std::size_t(step) % synthetic.size()];
    } else {
      auto d = timer.scope(train::phase::data_wait);
      const auto z = trace.zone("data_wait", "data");
      batch = src.next();  // valid until the next call
    }
    const auto r = tr.step(ctx, batch);
    if constexpr (scaler::enabled)  // the loss scale: in the logs every step, on the console when it changes
      report_loss_scale(step, r, tr.loss_scaler(), lead, con, warn, tb, jsonl);
    const auto rec = metrics.record({.step = step, .tokens = r.tokens, .loss = r.loss, .lr = r.lr, .grad_norm = r.grad_norm,
                                     .skipped = r.skipped},
                                    timer.end_step());
    if (lead) {
      const auto snap = mem.snapshot();
      const auto os = read_process_memory();
      con.step(rec, metrics, &snap, &os);
      if (tb || jsonl) {
        const auto sc = train::step_metrics::scalars(rec, &snap, &os);
        if (tb) tb->add_scalars(step, sc);
        if (jsonl) jsonl->write_scalars(step, sc);
      }
    }
    int stop_early = 0;
    if (o.eval_every > 0 && (step + 1) % o.eval_every == 0) {
      const double nats = report_val(step + 1);
      const auto p = tr.model().parameters();
      stop_early = stopper.observe(step + 1, nats, std::span<const storage_t>(p.data(), p.size()));
      if constexpr (is_parallel)  // world rank 0 decides; every rank stops together
        if (o.early_stop > 0) world->broadcast(std::span<int>(&stop_early, 1), 0);
    }
    tokens_seen += std::uint64_t(r.tokens);
    if (o.save_every > 0 && (step + 1) % o.save_every == 0) save_checkpoint();
    if (stop_early) {
      if (lead) con.message(stopper.stop_message(step + 1));
      ++step;
      break;
    }
  }
  save_checkpoint();  // the last step, also after --stop-at-step or the time budget
  saver.finish();
  if (const auto m = prof.finish(world); !m.empty() && lead) con.message(m);
  if (!evaluator) return 0;  // the other dp replicas are done: replica 0 validates, rank 0 saves and samples
  if (lead) con.finish();
  // --early-stop: the final validation, the weights and the sample are those of the best evaluation
  // (the checkpoints above hold the last state, to resume from)
  if (stopper.enabled() && stopper.best_step() >= 0 && stopper.best_step() != step) {
    const auto p = tr.model().parameters();
    stopper.restore(std::span<storage_t>(p.data(), p.size()));
    if (lead) std::printf("%s\n", stopper.keep_message().c_str());
  }
  // final validation over the whole validation split
  if (const auto all_val = src.validation_batch(src.validation_rows()); !all_val.empty()) {
    const double nats = tr.evaluate(ctx, all_val), bpb = src.bits_per_byte(nats, all_val);
    if (lead) {
      const io::scalar sc[] = {{"val/loss", nats}, {"val/bits_per_byte", bpb}};  // the run's final word in the logs
      if (tb) tb->add_scalars(step, sc);
      if (jsonl) jsonl->write_scalars(step, sc);
      const std::string how = src.kind() == data::source_kind::indexed ? " (" + src.byte_counting_note() + ")" : "";
      std::printf("final validation (%zu windows) | val loss %.4f nats/token | %.4f bits/byte | trained %ld steps in %.0f s%s\n",
                  all_val.size() / tr.window(), nats, bpb, step,
                  std::chrono::duration<double>(clock::now() - t0).count(), how.c_str());
    }
  }
  std::map<std::string, std::string> meta = {{"steps", std::to_string(step)}, {"data", o.data}};
  if (layered) meta["layout"] = layout_name;
  if (stopper.enabled() && stopper.best_step() >= 0) meta["best_step"] = std::to_string(stopper.best_step());
  if (src.kind() == data::source_kind::indexed)  // sample finds the tokenizer from any directory
    meta["tokenizer"] = std::filesystem::absolute(src.tokenizer_path()).lexically_normal().string();
  if constexpr (layered) {  // the single-rank model's parameters, gathered over tp and pp
    const auto global = nn::gather_parameters(ctx, tr.model(), tr.tp_group(), tr.pp_group());
    if (!lead) return 0;
    nn::gpt<M, policy<device::cpu, precision::fp32>> whole(ctx, o.seed);  // bf16/fp16 weights widened (exact)
    std::transform(global.begin(), global.end(), whole.parameters().begin(), [](storage_t x) { return static_cast<float>(x); });
    return save_and_sample<M, T>(o, ctx, whole, out, meta,
                              "saved weights (gathered from " + std::to_string(TP) + " x " + std::to_string(PP) + " shards)",
                              src, sample_tok);
  } else {
    return save_and_sample<M, T>(o, ctx, tr.model(), out, meta, "saved weights", src, sample_tok);
  }
}

}  // namespace train_gpt_cli
