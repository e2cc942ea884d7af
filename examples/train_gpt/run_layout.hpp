#pragma once
// train_gpt --layout tpXppY: one rank of a tensor- and pipeline-parallel run with data parallelism
// on top (train::parallel_trainer; docs/tensor_pipeline.md). Included by train_gpt/layout_*.cpp
// only, each instantiating run_layout<Model, World> for one model.
//
// What differs from the one-layout path (train_gpt.cpp's run()): bf16/fp16 only for char_tiny
// (run_layout_16bit, layout_char_tiny_16bit.cpp) and only on tp2pp2; checkpoints are saved
// collectively in the background (every rank takes part; docs/checkpoint.md "Multi-rank save") and
// --resume accepts a checkpoint of any layout (resharded on load); the gradient buffer is
// all-reduced over the dp group once after the pipeline (--zero1: reduce-scattered, the AdamW
// moments sharded over the dp group, the parameters all-gathered). Validation runs on
// the ranks of dp replica 0 (evaluate() is collective over tp and pp); rank 0 prints and logs.
// At the end the parameters are gathered to the single-rank model's shape
// (nn::gather_parameters) and rank 0 saves, exports and samples with an nn::gpt.
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <array>
#include <chrono>
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
#include <loom/data/text/tokenizer.hpp>
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
#include <loom/train/parallel_trainer.hpp>

#include "options.hpp"
#include "loop.hpp"
#include "profile.hpp"
#include "resume.hpp"

namespace train_gpt_cli {

/// x with two decimals ("0.07").
inline std::string fixed2(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", x);
  return b;
}

template <class M, int B, int T, int TP, int PP, class World, class Prec = loom::precision::fp32>
int run_layout_impl(const options& o, World& world) {
  using namespace loom;
  using P = policy<device::cpu, Prec, parallel::layout<TP, PP>>;
  // fp16 needs dynamic loss scaling (a trainer without it does not compile); bf16/fp32 run without
  using scaler = std::conditional_t<Prec::needs_loss_scaling, train::dynamic_loss_scaler, train::no_loss_scaler>;
  using trainer_t = train::parallel_trainer<M, P, B, T, World, kernels::fused, scaler>;
  using storage_t = typename trainer_t::storage_t;
  context<device::cpu> ctx;
  using L = parallel::layout<TP, PP>;
  const int wr = world.rank(), wdp = std::max(1, world.size() / (TP * PP));  // world rank: the trace's pid
  rank_profile prof(o, wr, "rank " + std::to_string(wr) + " (tp " + std::to_string(L::tp_rank(wr)) + ", dp " +
                               std::to_string(L::dp_rank(wr, wdp)) + ", pp " + std::to_string(L::pp_rank(wr, wdp)) + ")");
  prof.attach(ctx, &world);  // before the trainer: the tp/dp/pp groups it splits inherit the observer
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
  trainer_t tr(ctx, cfg, world,
               parallel::ddp_options{.bucket_mb = o.bucket_mb, .overlap = !o.no_overlap, .zero1 = o.zero1});
  const bool lead = world.rank() == 0;
  const int dp = tr.dp_size();
  const auto& c = tr.config();
  if (c.grad_accum < PP && lead)
    std::fprintf(stderr, "train_gpt: warning: --grad-accum %d < PP=%d: the 1F1B pipeline never fills (bubble %.0f %%); "
                 "pass --grad-accum >= %d (the bubble shrinks as (PP-1)/(m+PP-1))\n", c.grad_accum, PP,
                 100 * parallel::bubble_fraction(PP, c.grad_accum), PP);

  // data: this dp replica's share of every global batch (the same on every rank of a tp x pp group)
  const auto prefix = data::indexed_dataset_prefix(o.data);
  if (prefix)
    if (const auto s = data::read_dataset_summary(*prefix); s && s->vocab_size > M::vocab)
      throw input_error("dataset " + prefix->string() + " has a vocabulary of " + std::to_string(s->vocab_size) +
                        " tokens, more than the " + std::to_string(M::vocab) + " of model " + std::string(M::name) +
                        "; prepare it again with a smaller --vocab-size or choose a larger model");
  data::batch_source<> src(o.data, {.micro_batch = std::size_t(c.micro_batch), .seq_len = std::size_t(c.seq_len),
                                    .grad_accum = std::size_t(c.grad_accum), .valid_fraction = o.val_fraction,
                                    .seed = o.seed, .vocab = M::vocab, .dp_rank = tr.dp_rank(), .dp_size = dp});
#if LOOM_WITH_TEXT
  std::optional<data::text::tokenizer> tok;
  if (prefix) {
    tok = data::text::tokenizer::load(src.tokenizer_path());
    src.set_token_bytes(data::token_byte_lengths(*tok));
  }
#endif
  const std::string out = o.out.empty() ? "out/" + std::string(M::name) + ".safetensors" : o.out;
  // periodic evaluations: the first --eval-windows windows of the validation split (all of them
  // if it has fewer; a last partial micro-batch is evaluated too, no window twice)
  const std::size_t val_rows = std::min<std::size_t>(std::size_t(o.eval_windows), src.validation_rows());
  const std::vector<std::int32_t> val = src.validation_batch(val_rows);
  if (o.early_stop > 0 && val.empty())
    throw input_error("--early-stop " + std::to_string(o.early_stop) + ": the validation part of " + o.data +
                      " is shorter than one window of " + std::to_string(c.seq_len + 1) +
                      " tokens, so there is no validation loss to watch; raise --val-fraction or drop --early-stop");
  std::vector<std::vector<std::int32_t>> synthetic(o.synthetic_data ? 8 : 0);
  for (std::size_t k = 0; k < synthetic.size(); ++k) {  // per dp replica, the same on its tp x pp ranks
    const std::int64_t v = src.data_vocab() > 0 ? std::min<std::int64_t>(src.data_vocab(), M::vocab) : M::vocab;
    std::mt19937_64 rng(o.seed + 1000003 * std::uint64_t(tr.dp_rank()) + k);
    std::uniform_int_distribution<std::int32_t> id(0, std::int32_t(v - 1));
    synthetic[k].resize(tr.windows_per_step() * tr.window());
    for (auto& t : synthetic[k]) t = id(rng);
  }

  // --init-from-hf: GPT-2 weights into the single-rank model, then each rank takes its slices
  if (!o.init_from_hf.empty()) {
    nn::gpt<M, policy<device::cpu, precision::fp32>> whole(ctx, o.seed);
    io::import_gpt2(ctx, whole, o.init_from_hf);
    const auto p = whole.parameters();
    const std::vector<storage_t> narrow(p.begin(), p.end());  // bf16/fp16: rounded once, here
    nn::load_global_parameters(ctx, tr.model(), std::span<const storage_t>(narrow));
    tr.sync_master_weights(ctx);  // bf16/fp16: the fp32 masters start from the imported weights
  }

  // checkpoints: every rank loads its part (resharded when the checkpoint has another layout);
  // a fresh run never writes into another run's checkpoints
  const std::string ckpt_dir = !o.checkpoint_dir.empty() ? o.checkpoint_dir
                               : o.resume.empty()         ? std::string()
                               : std::filesystem::exists(std::filesystem::path(o.resume) / "manifest.json")
                                   ? std::filesystem::path(o.resume).parent_path().string()
                                   : o.resume;
  auto warn = [lead](const std::string& w) {
    if (lead) std::fprintf(stderr, "train_gpt: warning: %s\n", w.c_str());
  };
  long start = 0;
  std::uint64_t tokens_seen = 0;
  if (!o.resume.empty()) {
    const auto at = resume_run(ctx, o.resume, tr, src, warn, lead);
    start = at.step;
    tokens_seen = at.tokens;
  } else if (const auto old = io::list_checkpoints(ckpt_dir); !ckpt_dir.empty() && !old.empty()) {
    throw input_error("checkpoint directory '" + ckpt_dir + "' already holds checkpoints of an earlier run (newest " +
                      old.back().dir.filename().string() + "); pass --resume " + ckpt_dir +
                      " to continue it, or choose another --checkpoint-dir");
  }

  memory_counter mem;  // this rank's (rank 0's on the console): its shards, its stage's activations
  mem.add(memory_kind::parameters, tr.model().parameters().bytes());
  mem.add(memory_kind::gradients, tr.model().gradients().bytes());
  mem.add(memory_kind::optimizer, tr.optimizer_bytes());  // with --zero1 this rank's 1/dp of moments and masters
  mem.add(memory_kind::activations, tr.activation_bytes());
  const std::size_t dp_buffers = tr.data_parallel() ? tr.data_parallel()->memory().buckets : 0;
  mem.add(memory_kind::other, dp_buffers);  // the dp buckets (about one gradient buffer; ZeRO-1 bf16/fp16: +half)
  const double peak = world.size() * (o.peak_gflops > 0 ? o.peak_gflops : lead ? bench::measure_fp32_peak().gflops : 1.0);
  if (lead) {
    std::printf("model %s: %d layers, %d heads, width %d, %zu parameters | micro-batch %d x seq %d x accum %d%s = %zu tokens/step\n",
                std::string(M::name).c_str(), M::n_layer, M::n_head, M::d_model, nn::parameter_count<M>(), c.micro_batch,
                c.seq_len, c.grad_accum, dp > 1 ? (" x " + std::to_string(dp) + " replicas").c_str() : "",
                tr.tokens_per_step() * std::size_t(dp));
    std::printf("data %s | %ld steps, lr %.1e -> %.1e, warm-up %ld\n", src.describe().c_str(), o.steps, o.lr, o.min_lr,
                o.warmup);
    std::printf("layout tp%dpp%d x dp %d = %d ranks (%s), %s: tensor parallel %d, pipeline %d stages of %d layers, 1F1B "
                "over %d micro-batches (ideal bubble %.0f %%), data parallel %d%s\n",
                TP, PP, dp, world.size(), o.comm.c_str(), o.precision.c_str(), TP, PP, M::n_layer / PP, c.grad_accum,
                100 * parallel::bubble_fraction(PP, c.grad_accum), dp, o.zero1 ? " with ZeRO-1 (AdamW moments sharded)" : "");
    std::printf("fp32 peak %.0f GFLOP/s (%s) | memory of rank 0 (tp 0, stage 0): parameters %.2f MiB, gradients %.2f MiB, "
                "optimizer %.2f MiB%s, activations %.2f MiB\n",
                peak, o.peak_gflops > 0 ? "--peak-gflops" : "measured", mem.current(memory_kind::parameters) / 1048576.0,
                mem.current(memory_kind::gradients) / 1048576.0, mem.current(memory_kind::optimizer) / 1048576.0,
                dp_buffers ? (", ZeRO-1 staging " + fixed2(dp_buffers / 1048576.0) + " MiB").c_str() : "",
                mem.current(memory_kind::activations) / 1048576.0);
    std::fflush(stdout);
  }

  const double fpt = 6.0 * double(nn::parameter_count<M>(false)) + 12.0 * M::n_layer * c.seq_len * M::d_model;
  train::step_metrics metrics({.flops_per_token = fpt, .peak_flops = peak * 1e9, .total_steps = o.steps});
  train::step_timer timer;
  train::console con({.total_steps = o.steps, .summary_every = lead ? o.summary_every : 0});
  std::optional<io::tensorboard_writer> tb;
  std::optional<io::jsonl_writer> jsonl;
  if (!o.log_dir.empty() && lead) {
    std::filesystem::create_directories(o.log_dir);
    const auto log_file = std::filesystem::path(o.log_dir) / "metrics.jsonl";
    if (o.resume.empty() && std::filesystem::exists(log_file)) {  // a new run starts a new log (kept); a resumed one continues
      auto kept = log_file;
      for (int k = 1; std::filesystem::exists(kept); ++k)
        kept = std::filesystem::path(o.log_dir) / ("metrics.previous-" + std::to_string(k) + ".jsonl");
      std::filesystem::rename(log_file, kept);
    }
    tb.emplace(o.log_dir);
    jsonl.emplace(log_file);
  }
  // the trace shows every rank's phases (each pipeline action as forward / backward / exposed_comm:
  // waiting for the neighbouring stage or the tp/dp reductions), kernels and communication
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
    if (!evaluator || val.empty()) return std::nan("");
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
  // --early-stop: dp replica 0's ranks follow the validation loss (the same on each of them) and
  // keep a copy of their shard of the parameters at the best evaluation; world rank 0 decides
  early_stopper<storage_t> stopper(evaluator ? o.early_stop : 0);

  // Collective checkpoints written in the background (every rank writes its files; the commit
  // runs at the next save or at the end, on every rank).
  checkpoint_saver<trainer_t, World> saver(ckpt_dir, o.keep, start, &world, lead, con, warn);
  auto save_checkpoint = [&] {
    const auto s = src.state();
    io::run_state st;
    st.tokens = tokens_seen;
    st.data = {{"kind", int(s.kind)}, {"epoch", s.epoch}, {"index", s.index}, {"seed", s.seed}};
    st.extra = {{"program", "train_gpt"}, {"data_path", o.data}, {"layout", "tp" + std::to_string(TP) + "pp" + std::to_string(PP)}};
    saver.save(ctx, tr, st);
  };
  long step = start;
  std::span<const std::int32_t> batch;
  for (; step < o.steps; ++step) {
    int stop = o.time_budget > 0 && std::chrono::duration<double>(clock::now() - t0).count() > o.time_budget;
    if (o.time_budget > 0) world.broadcast(std::span<int>(&stop, 1), 0);  // every rank stops together
    if (stop) {
      if (lead) con.message("time budget of " + std::to_string(long(o.time_budget)) + " s reached after " + std::to_string(step) + " steps");
      break;
    }
    if (o.stop_at_step > 0 && step >= o.stop_at_step) {
      if (lead) con.message("stopping at step " + std::to_string(step) + " (--stop-at-step); continue with --resume");
      break;
    }
    if (const auto m = prof.begin_step(step, &world); !m.empty() && lead) con.message(m);
    timer.begin_step();
    if (o.synthetic_data) {
      batch = synthetic[std::size_t(step) % synthetic.size()];
    } else {
      auto d = timer.scope(train::phase::data_wait);
      const auto z = trace.zone("data_wait", "data");
      batch = src.next();
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
      if (o.early_stop > 0) world.broadcast(std::span<int>(&stop_early, 1), 0);  // every rank stops together
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
  if (const auto m = prof.finish(&world); !m.empty() && lead) con.message(m);
  if (lead) con.finish();
  // --early-stop: the final validation, the gathered weights and the sample are those of the best
  // evaluation (the checkpoints above hold the last state, to resume from)
  if (stopper.enabled() && stopper.best_step() >= 0 && stopper.best_step() != step) {
    const auto p = tr.model().parameters();
    stopper.restore(std::span<storage_t>(p.data(), p.size()));
    if (lead) std::printf("%s\n", stopper.keep_message().c_str());
  }
  // final validation over the whole validation split (dp replica 0), then the gathered model
  if (evaluator)
    if (const auto all_val = src.validation_batch(src.validation_rows()); !all_val.empty()) {
      const double nats = tr.evaluate(ctx, all_val), bpb = src.bits_per_byte(nats, all_val);
      if (lead) {
        const io::scalar sc[] = {{"val/loss", nats}, {"val/bits_per_byte", bpb}};
        if (tb) tb->add_scalars(step, sc);
        if (jsonl) jsonl->write_scalars(step, sc);
        const std::string how = src.kind() == data::source_kind::indexed ? " (" + src.byte_counting_note() + ")" : "";
        std::printf("final validation (%zu windows) | val loss %.4f nats/token | %.4f bits/byte | trained %ld steps in %.0f s%s\n",
                    all_val.size() / tr.window(), nats, bpb, step,
                    std::chrono::duration<double>(clock::now() - t0).count(), how.c_str());
      }
    }
  if (!evaluator) return 0;
  const auto global = nn::gather_parameters(ctx, tr.model(), tr.tp_group(), tr.pp_group());
  if (!lead) return 0;
  nn::gpt<M, policy<device::cpu, precision::fp32>> whole(ctx, o.seed);  // bf16/fp16 weights widened (exact)
  std::transform(global.begin(), global.end(), whole.parameters().begin(), [](storage_t x) { return static_cast<float>(x); });
  const auto parent = std::filesystem::path(out).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::map<std::string, std::string> meta = {{"steps", std::to_string(step)}, {"data", o.data},
                                             {"layout", "tp" + std::to_string(TP) + "pp" + std::to_string(PP)}};
  if (stopper.enabled() && stopper.best_step() >= 0) meta["best_step"] = std::to_string(stopper.best_step());
  if (src.kind() == data::source_kind::indexed)
    meta["tokenizer"] = std::filesystem::absolute(src.tokenizer_path()).lexically_normal().string();
  io::save_weights(whole, out, meta);
  std::printf("saved weights (gathered from %d x %d shards) to %s\n", TP, PP, out.c_str());
  if (!o.export_hf.empty()) {
    io::export_gpt2(ctx, whole, o.export_hf);
    std::printf("exported Hugging Face GPT-2 weights to %s (model.safetensors, config.json)\n", o.export_hf.c_str());
  }
  if (o.sample_tokens <= 0) return 0;
  typename nn::gpt<M, policy<device::cpu, precision::fp32>>::template activations<1, T> sacts(ctx);
  std::vector<std::int32_t> tokens(o.prompt.begin(), o.prompt.end());
  for (auto& t : tokens) t = std::int32_t(std::uint8_t(t));
  int sample_vocab = M::vocab;
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
  nn::generate_in_vocab(whole, ctx, sacts, tokens, o.sample_tokens, {o.temperature, o.top_k, o.seed}, sample_vocab);
  std::string text(tokens.begin(), tokens.end());
#if LOOM_WITH_TEXT
  if (tok) text = data::decode_documents(*tok, tokens, tok->eod_id());
#endif
  std::printf("---- sample (temperature %.2f) ----\n%s\n----\n", o.temperature, text.c_str());
  return 0;
}

/// Chooses the compiled fp32 instantiation for (tp, pp); B, T the model's capacities in train_gpt.
template <class M, int B, int T, class World>
int dispatch_layout(const options& o, int tp, int pp, World& world) {
  check_layout_fits<M>(tp, pp);
  check_layout_run(o, tp, pp, world.size());
  if constexpr (std::is_same_v<M, loom::models::char_tiny>)  // the only model with 16-bit instantiations
    if (o.precision != "fp32") return run_layout_16bit<M>(o, tp, pp, world);
  if (tp == 2 && pp == 1) return run_layout_impl<M, B, T, 2, 1>(o, world);
  if (tp == 1 && pp == 2) return run_layout_impl<M, B, T, 1, 2>(o, world);
  if (tp == 2 && pp == 2) return run_layout_impl<M, B, T, 2, 2>(o, world);
  throw loom::input_error("--layout tp" + std::to_string(tp) + "pp" + std::to_string(pp) +
                          " is not compiled into this train_gpt; compiled layouts: tp1pp1, tp2pp1, tp1pp2, tp2pp2 "
                          "(add an instantiation in examples/train_gpt/run_layout.hpp for more)");
}

/// The 16-bit instantiations (tp2pp2 only: each costs compile time; check_layout_run has
/// refused every other 16-bit combination already); see layout_char_tiny_16bit.cpp.
template <class M, int B, int T, class World>
int dispatch_layout_16bit(const options& o, int tp, int pp, World& world) {
  if (tp == 2 && pp == 2 && o.precision == "bf16") return run_layout_impl<M, B, T, 2, 2, World, loom::precision::bf16>(o, world);
  if (tp == 2 && pp == 2 && o.precision == "fp16") return run_layout_impl<M, B, T, 2, 2, World, loom::precision::fp16>(o, world);
  throw loom::input_error("--layout tp" + std::to_string(tp) + "pp" + std::to_string(pp) + " --precision " + o.precision +
                          " is not compiled into this train_gpt; 16-bit layouts: tp2pp2 with --model char_tiny");
}

}  // namespace train_gpt_cli
