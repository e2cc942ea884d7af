// train_gpt — the main job: train a byte-level GPT on a UTF-8 text file on the CPU, report
// loss, learning rate, gradient norm, step time and tokens/s per step, validation loss in
// nats per token and bits per byte, then save the weights and print a sample.
//
//   train_gpt --data ../shared/data/tinyshakespeare.txt            # the quickstart
//   train_gpt --data my.txt --model char_tiny --steps 50 --out out/tiny.safetensors
//
// Bad input (missing/empty/binary file, a corpus shorter than one sequence, an unknown or
// malformed flag, a sequence length above the model's maximum) exits with status 2 and one
// line naming the problem and the fix.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <loom/data/byte_dataset.hpp>
#include <loom/data/sampler.hpp>
#include <loom/device/cpu.hpp>
#include <loom/io/weights.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/nn/generate.hpp>
#include <loom/train/trainer.hpp>

namespace {

struct options {
  std::string data, model = "quickstart", out, prompt = "\n";
  long steps = 2000;
  int micro_batch = 0, seq_len = 0, grad_accum = 1;
  double lr = 2e-3, min_lr = 2e-4, weight_decay = 0.1, max_grad_norm = 1.0, val_fraction = 0.1;
  long warmup = 100;
  long eval_every = 250;
  int eval_windows = 64, sample_tokens = 400, top_k = 0;
  double temperature = 0.8;
  std::uint64_t seed = 1337;
  double time_budget = 0;  // seconds; 0 = none
};

template <class M, int B, int T>
int run(const options& o) {
  using namespace loom;
  using P = policy<device::cpu, precision::fp32>;
  context<device::cpu> ctx;
  train::trainer_config cfg;
  cfg.micro_batch = o.micro_batch;
  cfg.seq_len = o.seq_len;
  cfg.grad_accum = o.grad_accum;
  cfg.schedule = {o.lr, o.min_lr, o.warmup, o.steps};
  cfg.adamw.weight_decay = o.weight_decay;
  cfg.adamw.max_grad_norm = o.max_grad_norm;
  cfg.seed = o.seed;
  if (o.seq_len > M::max_seq)
    throw input_error("--seq-len " + std::to_string(o.seq_len) + " exceeds the maximum sequence length " +
                      std::to_string(M::max_seq) + " of model " + std::string(M::name) + "; pass --seq-len <= " +
                      std::to_string(M::max_seq));
  train::trainer<M, P, B, T> tr(ctx, cfg);
  const auto& c = tr.config();
  data::byte_dataset ds(o.data, tr.window(), o.val_fraction);
  data::window_sampler sampler(ds.train().size(), tr.window(), o.seed);
  const std::span<const std::uint8_t> train_bytes(ds.train()), val_bytes(ds.validation());
  const std::size_t val_rows = std::max<std::size_t>(c.micro_batch, std::size_t(o.eval_windows) / c.micro_batch * c.micro_batch);
  std::vector<std::int32_t> batch(tr.windows_per_step() * tr.window()), val(val_rows * tr.window());
  data::sequential_windows(val_bytes, tr.window(), 0, std::span(val));

  std::printf("model %s: %d layers, %d heads, width %d, %zu parameters | micro-batch %d x seq %d x accum %d = %zu tokens/step\n",
              std::string(M::name).c_str(), M::n_layer, M::n_head, M::d_model, nn::parameter_count<M>(), c.micro_batch,
              c.seq_len, c.grad_accum, tr.tokens_per_step());
  std::printf("data %s: %zu training bytes, %zu validation bytes | %ld steps, lr %.1e -> %.1e, warm-up %ld\n",
              o.data.c_str(), ds.train().size(), ds.validation().size(), o.steps, o.lr, o.min_lr, o.warmup);
  std::fflush(stdout);

  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto report_val = [&](long step) {
    const double nats = tr.evaluate(ctx, val);
    std::printf("step %5ld | val loss %.4f nats/token | %.4f bits/byte | %.0f s\n", step, nats, nats / std::log(2.0),
                std::chrono::duration<double>(clock::now() - t0).count());
    std::fflush(stdout);
    return nats;
  };
  long step = 0;
  for (; step < o.steps; ++step) {
    if (o.time_budget > 0 && std::chrono::duration<double>(clock::now() - t0).count() > o.time_budget) {
      std::printf("time budget of %.0f s reached after %ld steps\n", o.time_budget, step);
      break;
    }
    sampler.next(train_bytes, std::span(batch));
    const auto s0 = clock::now();
    const auto r = tr.step(ctx, batch);
    const double ms = std::chrono::duration<double, std::milli>(clock::now() - s0).count();
    if (step % 10 == 0 || step == o.steps - 1 || r.skipped)
      std::printf("step %5ld/%ld | loss %.4f | lr %.2e | grad norm %.3f | %.1f ms | %.0f tokens/s%s\n", step + 1, o.steps,
                  r.loss, r.lr, r.grad_norm, ms, double(r.tokens) / ms * 1e3, r.skipped ? " | skipped (non-finite gradient)" : "");
    if (o.eval_every > 0 && (step + 1) % o.eval_every == 0) report_val(step + 1);
  }
  // final validation over the whole validation split
  std::vector<std::int32_t> all_val((val_bytes.size() - 1) / (tr.window() - 1) / c.micro_batch * c.micro_batch * tr.window());
  if (!all_val.empty()) {
    data::sequential_windows(val_bytes, tr.window(), 0, std::span(all_val));
    const double nats = tr.evaluate(ctx, all_val);
    std::printf("final validation (%zu windows) | val loss %.4f nats/token | %.4f bits/byte | trained %ld steps in %.0f s\n",
                all_val.size() / tr.window(), nats, nats / std::log(2.0), step,
                std::chrono::duration<double>(clock::now() - t0).count());
  }
  std::string out = o.out.empty() ? "out/" + std::string(M::name) + ".safetensors" : o.out;
  const auto parent = std::filesystem::path(out).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  io::save_weights(tr.model(), out, {{"steps", std::to_string(step)}, {"data", o.data}});
  std::printf("saved weights to %s\n", out.c_str());

  typename decltype(tr)::model_t::template activations<1, T> sacts(ctx);
  std::vector<std::int32_t> tokens(o.prompt.begin(), o.prompt.end());
  for (auto& t : tokens) t = std::int32_t(std::uint8_t(t));
  nn::generate(tr.model(), ctx, sacts, tokens, o.sample_tokens, {o.temperature, o.top_k, o.seed});
  std::string text(tokens.begin(), tokens.end());
  std::printf("---- sample (temperature %.2f) ----\n%s\n----\n", o.temperature, text.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"train_gpt: train a byte-level GPT on a UTF-8 text file (CPU, fp32), then sample from it"};
  app.add_option("--data", o.data, "UTF-8 text file to train on (e.g. ../shared/data/tinyshakespeare.txt)")->required();
  app.add_option("--model", o.model, "model config")->check(CLI::IsMember({"quickstart", "char_tiny"}));
  app.add_option("--steps", o.steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--micro-batch", o.micro_batch, "sequences per micro-batch (default: the compiled capacity)");
  app.add_option("--seq-len", o.seq_len, "tokens per sequence (default: the model's maximum)");
  app.add_option("--grad-accum", o.grad_accum, "micro-batches per optimizer step");
  app.add_option("--lr", o.lr, "peak learning rate");
  app.add_option("--min-lr", o.min_lr, "learning-rate floor after the cosine decay");
  app.add_option("--warmup", o.warmup, "linear warm-up steps");
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay (matrices only)");
  app.add_option("--max-grad-norm", o.max_grad_norm, "clip the global gradient norm (0: off)");
  app.add_option("--val-fraction", o.val_fraction, "fraction of the file held out for validation");
  app.add_option("--eval-every", o.eval_every, "steps between validation evaluations (0: only at the end)");
  app.add_option("--eval-windows", o.eval_windows, "validation windows per periodic evaluation");
  app.add_option("--seed", o.seed, "seed for initialisation, data order and sampling");
  app.add_option("--time-budget", o.time_budget, "stop training after this many seconds (0: no limit)");
  app.add_option("--out", o.out, "where to save the weights (default out/<model>.safetensors)");
  app.add_option("--sample-tokens", o.sample_tokens, "bytes to sample after training");
  app.add_option("--prompt", o.prompt, "prompt for the sample");
  app.add_option("--temperature", o.temperature, "sampling temperature");
  app.add_option("--top-k", o.top_k, "sample from the k most likely tokens (0: all)");
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
    if (o.model == "char_tiny") return run<loom::models::char_tiny, 8, 32>(o);
    return run<loom::models::quickstart, 16, 128>(o);
  } catch (const loom::input_error& e) {
    std::fprintf(stderr, "train_gpt: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt: failed: %s\n", e.what());
    return 1;
  }
}
