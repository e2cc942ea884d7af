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
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <optional>
#include <random>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/bench/peak.hpp>
#include <loom/core/dropout.hpp>
#include <loom/core/memory.hpp>
#include <loom/data/source.hpp>
#if LOOM_WITH_TEXT
#include <loom/data/text/tokenizer.hpp>  // SentencePiece: links loom::text
#endif
#include <loom/device/cpu.hpp>
#include <loom/io/checkpoint.hpp>
#include <loom/io/jsonl.hpp>
#include <loom/io/tensorboard.hpp>
#include <loom/io/trace.hpp>
#include <loom/io/weights.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/nn/generate.hpp>
#include <loom/nn/generate_in_vocab.hpp>
#include <loom/parallel/comm_threads.hpp>
#if LOOM_WITH_MPI
#include <loom/parallel/comm_mpi.hpp>  // --comm mpi: links loom::mpi
#endif
#include <loom/train/console.hpp>
#include <loom/train/metrics.hpp>
#include <loom/train/trainer.hpp>

#include "train_gpt/loop.hpp"
#include "train_gpt/options.hpp"
#include "train_gpt/profile.hpp"
#include "train_gpt/resume.hpp"

namespace {

using train_gpt_cli::options;

/// Where a run resumed from `resume` keeps saving: the run's root (the parent of a
/// step_NNNNNNNN directory given directly).
inline std::string checkpoint_root_of(const std::string& resume) {
  const std::filesystem::path p(resume);
  return std::filesystem::exists(p / "manifest.json") ? p.parent_path().string() : resume;
}

/// Creates `dir` if needed and checks that a file can be created in it; throws
/// loom::input_error naming `flag` otherwise, so a long run never ends unable to save.
inline void ensure_writable_directory(const std::filesystem::path& dir, const char* flag) {
  const std::filesystem::path d = dir.empty() ? std::filesystem::path(".") : dir;
  std::error_code ec;
  std::filesystem::create_directories(d, ec);
  const auto probe = d / (".loom_write_test." + std::to_string(::getpid()));
  std::FILE* f = ec ? nullptr : std::fopen(probe.c_str(), "wb");
  if (!f)
    throw loom::input_error(std::string(flag) + ": cannot create files in '" + d.string() +
                            "'; choose a directory you can write to");
  std::fclose(f);
  std::filesystem::remove(probe, ec);
}

/// One rank's run. World is a communicator (comm::threads, comm::mpi) or std::nullptr_t for
/// a single rank without data parallelism; only rank 0 prints, logs, evaluates and saves.
template <class M, int B, int T, class World, class Prec = loom::precision::fp32>
int run(const options& o, World* world) {
  using namespace loom;
  using P = policy<device::cpu, Prec>;
  // fp16 needs dynamic loss scaling (a trainer without it does not compile); bf16/fp32 run without
  using scaler = std::conditional_t<Prec::needs_loss_scaling, train::dynamic_loss_scaler, train::no_loss_scaler>;
  using trainer_t = train::trainer<M, P, B, T, kernels::fused, scaler>;
  constexpr bool is_parallel = !std::is_same_v<World, std::nullptr_t>;
  int dp = 1, dp_rank = 0;
  if constexpr (is_parallel) dp = world->size(), dp_rank = world->rank();
  const bool lead = dp_rank == 0;
  context<device::cpu> ctx;
  const std::string rank_name = "rank " + std::to_string(dp_rank);
  train_gpt_cli::rank_profile prof(o, dp_rank, is_parallel ? rank_name + " (dp " + std::to_string(dp_rank) + ")" : rank_name);
  prof.attach(ctx, world);  // before the trainer: its groups inherit the observer
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
    trainer_storage.emplace(ctx, cfg, *world,
                            parallel::ddp_options{.bucket_mb = o.bucket_mb, .overlap = !o.no_overlap, .zero1 = o.zero1,
                                                  .check_every = o.replica_check_every});
  } else {
    trainer_storage.emplace(ctx, cfg);
  }
  trainer_t& tr = *trainer_storage;
  const auto& c = tr.config();
  // Training data: a text file (byte tokens) or a prepare_data dataset (data/source.hpp). The
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
                                    .seed = o.seed, .vocab = M::vocab, .dp_rank = dp_rank, .dp_size = dp});
#if LOOM_WITH_TEXT
  std::optional<data::text::tokenizer> tok;  // encodes the prompt, decodes the sample, counts bytes exactly
  if (prefix) {
    tok = data::text::tokenizer::load(src.tokenizer_path());
    check_vocab(tok->vocab_size(), "tokenizer " + src.tokenizer_path().string());
    src.set_token_bytes(data::token_byte_lengths(*tok));
  }
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
  for (std::size_t k = 0; k < synthetic.size(); ++k) {
    const std::int64_t v = src.data_vocab() > 0 ? std::min<std::int64_t>(src.data_vocab(), M::vocab) : M::vocab;
    std::mt19937_64 rng(o.seed + 1000003 * std::uint64_t(dp_rank) + k);  // each rank its own batches
    std::uniform_int_distribution<std::int32_t> id(0, std::int32_t(v - 1));
    synthetic[k].resize(tr.windows_per_step() * tr.window());
    for (auto& t : synthetic[k]) t = id(rng);
  }

  if (lead) {
    std::printf("model %s: %d layers, %d heads, width %d, %zu parameters | micro-batch %d x seq %d x accum %d%s = %zu tokens/step\n",
                std::string(M::name).c_str(), M::n_layer, M::n_head, M::d_model, nn::parameter_count<M>(), c.micro_batch,
                c.seq_len, c.grad_accum, dp > 1 ? (" x " + std::to_string(dp) + " ranks").c_str() : "",
                tr.tokens_per_step() * std::size_t(dp));
    std::printf("data %s | %ld steps, lr %.1e -> %.1e, warm-up %ld\n", src.describe().c_str(), o.steps, o.lr, o.min_lr,
                o.warmup);
    if (o.synthetic_data)
      std::printf("--synthetic-data: training on %zu in-memory batches of random ids, cycled (validation still uses the data)\n",
                  synthetic.size());
    if (const auto* s = tr.data_parallel()) {
      const auto m = s->memory();
      std::printf("data parallel: %d ranks (%s), %zu buckets of <= %.2f MiB, overlap %s%s | per rank: buckets %.1f MiB, "
                  "optimizer state %.1f MiB\n",
                  dp, o.comm.c_str(), s->bucket_count(), o.bucket_mb, o.no_overlap ? "off" : "on",
                  o.zero1 ? ", ZeRO-1" : "", m.buckets / 1048576.0, tr.optimizer_bytes() / 1048576.0);
    }
    std::fflush(stdout);
  }

  // checkpoints: resume (model, optimizer, step, data position), or a fresh run, optionally
  // from Hugging Face GPT-2 weights; a fresh run never writes into another run's checkpoints
  const std::string ckpt_dir = !o.checkpoint_dir.empty() ? o.checkpoint_dir
                               : o.resume.empty()         ? std::string()
                                                          : checkpoint_root_of(o.resume);
  long start = 0;
  std::uint64_t tokens_seen = 0;
  auto warn = [lead](const std::string& w) {
    if (lead) std::fprintf(stderr, "train_gpt: warning: %s\n", w.c_str());
  };
  if (!o.resume.empty()) {
    const auto at = train_gpt_cli::resume_run(ctx, o.resume, tr, src, warn, lead);
    start = at.step;
    tokens_seen = at.tokens;
  } else {
    if (!o.init_from_hf.empty()) {
      io::import_gpt2(ctx, tr.model(), o.init_from_hf);
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
  memory_counter mem;
  mem.add(memory_kind::parameters, tr.model().parameters().bytes());
  mem.add(memory_kind::gradients, tr.model().gradients().bytes());
  mem.add(memory_kind::optimizer, tr.optimizer_bytes());  // moments (+ fp32 masters below fp32); 1/dp with ZeRO-1
  mem.add(memory_kind::activations, tr.activation_bytes());
  // per rank, times the ranks: each rank measures with its share of the cores (only rank 0 prints)
  const double peak = dp * (o.peak_gflops > 0 ? o.peak_gflops : lead ? bench::measure_fp32_peak().gflops : 1.0);
  if (lead)
    std::printf("fp32 peak %.0f GFLOP/s (%s) | memory: parameters %.1f MiB, gradients %.1f MiB, optimizer %.1f MiB, activations %.1f MiB\n",
              peak, o.peak_gflops > 0 ? "--peak-gflops" : "measured", mem.current(memory_kind::parameters) / 1048576.0,
              mem.current(memory_kind::gradients) / 1048576.0, mem.current(memory_kind::optimizer) / 1048576.0,
              mem.current(memory_kind::activations) / 1048576.0);
  const double fpt = 6.0 * double(nn::parameter_count<M>(false)) + 12.0 * M::n_layer * c.seq_len * M::d_model;
  train::step_metrics metrics({.flops_per_token = fpt, .peak_flops = peak * 1e9, .total_steps = o.steps});
  train::step_timer timer;
  train::console con({.total_steps = o.steps, .summary_every = o.summary_every});
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
  io::trace_recorder& trace = prof.recorder();  // every rank's; one trace.json (profile.hpp)
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

  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto report_val = [&](long step) {
    if (val.empty()) return std::nan("");  // a validation part shorter than one window
    const double nats = tr.evaluate(ctx, val), bpb = src.bits_per_byte(nats, val);
    con.message("step " + std::to_string(step) + " | val loss " + std::to_string(nats).substr(0, 6) + " nats/token | " +
                std::to_string(bpb).substr(0, 6) + " bits/byte | " +
                std::to_string(long(std::chrono::duration<double>(clock::now() - t0).count())) + " s");
    const io::scalar sc[] = {{"val/loss", nats}, {"val/bits_per_byte", bpb}};
    if (tb) tb->add_scalars(step, sc);
    if (jsonl) jsonl->write_scalars(step, sc);
    return nats;
  };
  // Checkpoints written in the background; with --zero1 every rank holds a shard of the
  // optimizer state, so the save is collective (latest moves only when all ranks succeeded).
  World* save_world = nullptr;
  if constexpr (is_parallel) save_world = o.zero1 ? world : nullptr;
  train_gpt_cli::checkpoint_saver<trainer_t, World> saver(ckpt_dir, o.keep, start, save_world, lead, con, warn);
  auto save_checkpoint = [&] {
    const auto s = src.state();
    io::run_state st;
    st.tokens = tokens_seen;
    st.data = {{"kind", int(s.kind)}, {"epoch", s.epoch}, {"index", s.index}, {"seed", s.seed}};
    st.extra = {{"program", "train_gpt"}, {"data_path", o.data}};
    saver.save(ctx, tr, st);
  };
  // --early-stop: the best periodic validation loss, its step and a copy of the parameters (rank 0)
  train_gpt_cli::early_stopper<typename trainer_t::model_t::storage_t> stopper(lead ? o.early_stop : 0);
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
    if (const auto m = prof.begin_step(step, world); !m.empty()) con.message(m);
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
      train_gpt_cli::report_loss_scale(step, r, tr.loss_scaler(), lead, con, warn, tb, jsonl);
    const auto rec = metrics.record({.step = step, .tokens = r.tokens, .loss = r.loss, .lr = r.lr, .grad_norm = r.grad_norm,
                                     .skipped = r.skipped},
                                    timer.end_step());
    const auto snap = mem.snapshot();
    const auto os = read_process_memory();
    if (lead) con.step(rec, metrics, &snap, &os);
    if (tb || jsonl) {
      const auto sc = train::step_metrics::scalars(rec, &snap, &os);
      if (tb) tb->add_scalars(step, sc);
      if (jsonl) jsonl->write_scalars(step, sc);
    }
    int stop_early = 0;
    if (o.eval_every > 0 && (step + 1) % o.eval_every == 0 && lead) {
      const double nats = report_val(step + 1);
      const auto p = tr.model().parameters();
      stop_early = stopper.observe(step + 1, nats, std::span(p.data(), p.size()));
    }
    tokens_seen += std::uint64_t(r.tokens);
    if (o.save_every > 0 && (step + 1) % o.save_every == 0) save_checkpoint();
    if constexpr (is_parallel)  // rank 0 evaluates and decides; every rank stops together
      if (o.early_stop > 0 && o.eval_every > 0 && (step + 1) % o.eval_every == 0)
        world->broadcast(std::span<int>(&stop_early, 1), 0);
    if (stop_early) {
      if (lead) con.message(stopper.stop_message(step + 1));
      ++step;
      break;
    }
  }
  save_checkpoint();  // the last step, also after --stop-at-step or the time budget
  saver.finish();
  if (const auto m = prof.finish(world); !m.empty()) con.message(m);
  if (!lead) return 0;  // the other ranks are done: rank 0 validates, saves and samples
  con.finish();
  // --early-stop: the final validation, the weights and the sample are those of the best evaluation
  // (the checkpoints above hold the last state, to resume from)
  if (stopper.enabled() && stopper.best_step() >= 0 && stopper.best_step() != step) {
    const auto p = tr.model().parameters();
    stopper.restore(std::span(p.data(), p.size()));
    std::printf("%s\n", stopper.keep_message().c_str());
  }
  // final validation over the whole validation split
  if (const auto all_val = src.validation_batch(src.validation_rows()); !all_val.empty()) {
    const double nats = tr.evaluate(ctx, all_val), bpb = src.bits_per_byte(nats, all_val);
    const io::scalar sc[] = {{"val/loss", nats}, {"val/bits_per_byte", bpb}};  // the run's final word in the logs
    if (tb) tb->add_scalars(step, sc);
    if (jsonl) jsonl->write_scalars(step, sc);
    const std::string how = src.kind() == data::source_kind::indexed ? " (" + src.byte_counting_note() + ")" : "";
    std::printf("final validation (%zu windows) | val loss %.4f nats/token | %.4f bits/byte | trained %ld steps in %.0f s%s\n",
                all_val.size() / tr.window(), nats, bpb, step,
                std::chrono::duration<double>(clock::now() - t0).count(), how.c_str());
  }
  const auto parent = std::filesystem::path(out).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::map<std::string, std::string> meta = {{"steps", std::to_string(step)}, {"data", o.data}};
  if (stopper.enabled() && stopper.best_step() >= 0) meta["best_step"] = std::to_string(stopper.best_step());
  if (src.kind() == data::source_kind::indexed)  // sample finds the tokenizer from any directory
    meta["tokenizer"] = std::filesystem::absolute(src.tokenizer_path()).lexically_normal().string();
  io::save_weights(tr.model(), out, meta);
  std::printf("saved weights to %s\n", out.c_str());
  if (!o.export_hf.empty()) {
    io::export_gpt2(ctx, tr.model(), o.export_hf);
    std::printf("exported Hugging Face GPT-2 weights to %s (model.safetensors, config.json)\n", o.export_hf.c_str());
  }

  // the sample: bytes for a text file; SentencePiece ids for a dataset (prompt encoded, ids
  // decoded with the dataset's tokenizer, a blank line for each end of document)
  typename trainer_t::model_t::template activations<1, T> sacts(ctx);
  std::vector<std::int32_t> tokens(o.prompt.begin(), o.prompt.end());
  for (auto& t : tokens) t = std::int32_t(std::uint8_t(t));
  int sample_vocab = M::vocab;  // ids that have text: the tokenizer's pieces (quickstart_bpe has more rows)
#if LOOM_WITH_TEXT
  if (tok) {
    tokens = tok->encode(o.prompt);
    sample_vocab = tok->vocab_size();
  }
#else
  if (src.kind() == data::source_kind::indexed) {
    std::printf("(no sample: this train_gpt was built without LOOM_WITH_TEXT, so it cannot decode SentencePiece ids)\n");
    return 0;
  }
#endif
  nn::generate_in_vocab(tr.model(), ctx, sacts, tokens, o.sample_tokens, {o.temperature, o.top_k, o.seed}, sample_vocab);
  std::string text(tokens.begin(), tokens.end());
#if LOOM_WITH_TEXT
  if (tok) text = data::decode_documents(*tok, tokens, tok->eod_id());
#endif
  std::printf("---- sample (temperature %.2f) ----\n%s\n----\n", o.temperature, text.c_str());
  return 0;
}

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
        if (o.precision == "bf16") return run<M, B, T, W, loom::precision::bf16>(o, world);
        if (o.precision == "fp16") return run<M, B, T, W, loom::precision::fp16>(o, world);
        return run<M, B, T, W>(o, world);
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
