/// bench_sample: sampling tokens/s with the key/value cache (nn::generate_in_vocab, which
/// decodes one position per token through nn::decode_step) against rerunning the whole window
/// for every token (nn::generate), on the CPU in fp32, in the same process, alternating.
///
/// Usage: bench_sample [--model gpt2_small|quickstart_bpe] [--tokens 400] [--prompt 8]
///                     [--rounds 1] [--weights FILE] [--seed 42] [--temperature 0.8] [--top-k 0]
/// Each round times the window path, then the cached path, on the same prompt and seed, and
/// prints both rates, their ratio, and whether the two samples are the same tokens. The prompt
/// is --prompt ids drawn from a fixed seed; --weights loads loom weights (train_gpt --out) of
/// the model, else the initialisation with seed 1337. Results and the machine: docs/performance.md.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <loom/core/random.hpp>
#include <loom/device/cpu.hpp>
#include <loom/io/weights.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/nn/generate_in_vocab.hpp>
#include <loom/nn/transformer.hpp>

using namespace loom;

namespace {

struct options {
  std::string model = "gpt2_small", weights;
  int tokens = 400, prompt = 8, rounds = 1;
  nn::sampling s{0.8, 0, 42};
};

std::string cpu_name() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

template <class M>
int run(const options& o) {
  using G = nn::transformer<M, policy<device::cpu, precision::fp32>>;
  context<device::cpu> ctx;
  G model(ctx, 1337);
  if (!o.weights.empty()) io::load_weights(model, o.weights);
  typename G::template activations<1, M::max_seq> acts(ctx);
  std::vector<std::int32_t> prompt(std::size_t(o.prompt));
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = std::int32_t(random_uniform(11, 3, i) * M::vocab) % M::vocab;
  fmt::print("bench_sample: {} fp32, {} tokens after a {}-token prompt, {} positions; {}\n", M::name, o.tokens, o.prompt,
             M::max_seq, cpu_name());
  fmt::print("| round | window (tokens/s) | cached (tokens/s) | cached / window | same tokens |\n| ---: | ---: | ---: | ---: | --- |\n");
  for (int r = 0; r < o.rounds; ++r) {
    auto timed = [&](auto&& f) {
      std::vector<std::int32_t> t = prompt;
      const auto t0 = std::chrono::steady_clock::now();
      f(t);
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return std::pair{t, o.tokens / sec};
    };
    const auto [a, window] = timed([&](auto& t) { nn::generate(model, ctx, acts, t, o.tokens, o.s); });
    const auto [b, cached] = timed([&](auto& t) { nn::generate_in_vocab(model, ctx, acts, t, o.tokens, o.s, M::vocab); });
    fmt::print("| {} | {:.2f} | {:.2f} | {:.1f} | {} |\n", r + 1, window, cached, cached / window, a == b ? "yes" : "no");
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"bench_sample: sampling with the key/value cache against rerunning the window"};
  app.add_option("--model", o.model, "gpt2_small or quickstart_bpe")->check(CLI::IsMember({"gpt2_small", "quickstart_bpe"}));
  app.add_option("--tokens", o.tokens, "tokens to sample")->check(CLI::Range(1, 1 << 20));
  app.add_option("--prompt", o.prompt, "prompt length in tokens")->check(CLI::Range(1, 1 << 20));
  app.add_option("--rounds", o.rounds, "rounds (window, then cached, each)")->check(CLI::Range(1, 1000));
  app.add_option("--weights", o.weights, "loom weights of the model (train_gpt --out)")->check(CLI::ExistingFile);
  app.add_option("--seed", o.s.seed, "sampling seed");
  app.add_option("--temperature", o.s.temperature, "sampling temperature")->check(CLI::PositiveNumber);
  app.add_option("--top-k", o.s.top_k, "keep the k most likely tokens (0: all)")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    return o.model == "gpt2_small" ? run<models::gpt2_small>(o) : run<models::quickstart_bpe>(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_sample: %s\n", e.what());
    return 1;
  }
}
