// sample — generate text from weights saved by train_gpt, with temperature and top-k.
//
//   sample --weights out/quickstart.safetensors --prompt "ROMEO:" --tokens 500 --temperature 0.8 --top-k 40
//
// The model config is read from the file's metadata. Errors (missing/corrupt file, unknown
// model, bad flag) exit with status 2 and one line naming the problem and the fix.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include <loom/device/cpu.hpp>
#include <loom/io/weights.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/nn/generate.hpp>
#include <loom/nn/gpt.hpp>

namespace {

struct options {
  std::string weights, prompt = "\n";
  int tokens = 500, top_k = 0;
  double temperature = 0.8;
  std::uint64_t seed = 42;
};

template <class M>
int run(const options& o) {
  using namespace loom;
  using P = policy<device::cpu, precision::fp32>;
  context<device::cpu> ctx;
  nn::gpt<M, P> model(ctx, 0);
  io::load_weights(model, o.weights);
  typename nn::gpt<M, P>::template activations<1, M::max_seq> acts(ctx);
  std::vector<std::int32_t> tokens;
  for (unsigned char ch : o.prompt) tokens.push_back(ch);
  nn::generate(model, ctx, acts, tokens, o.tokens, {o.temperature, o.top_k, o.seed});
  const std::string text(tokens.begin(), tokens.end());
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"sample: generate text from a byte-level GPT saved by train_gpt"};
  app.add_option("--weights", o.weights, "weights file written by train_gpt")->required();
  app.add_option("--prompt", o.prompt, "text to continue");
  app.add_option("--tokens", o.tokens, "bytes to generate")->check(CLI::NonNegativeNumber);
  app.add_option("--temperature", o.temperature, "sampling temperature (> 0)");
  app.add_option("--top-k", o.top_k, "sample from the k most likely tokens (0: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", o.seed, "seed of the sampling draws");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "sample: error: %s; run sample --help for the flags\n", e.what());
    return 2;
  }
  try {
    const loom::io::safetensors_reader file(o.weights);
    const auto it = file.metadata().find("model");
    const std::string name = it == file.metadata().end() ? "" : it->second;
    if (name == loom::models::quickstart::name) return run<loom::models::quickstart>(o);
    if (name == loom::models::char_tiny::name) return run<loom::models::char_tiny>(o);
    throw loom::input_error("weights file '" + o.weights + "' is for model '" + name +
                            "', which this sample program does not know; use weights written by train_gpt");
  } catch (const loom::input_error& e) {
    std::fprintf(stderr, "sample: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sample: failed: %s\n", e.what());
    return 1;
  }
}
