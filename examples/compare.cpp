// compare — the consistency checker (docs/precision.md): runs the same weights and the same
// batch under two precision policies and prints, per layer, the means, mean and max |A-B| and
// the relative error of every activation and parameter gradient, with pass/fail against the
// pair's tolerance and the first tensor that fails (loom::verify::compare).
//
//   compare --a fp32 --b bf16                                   # quickstart, random weights and tokens
//   compare --a fp32 --b fp16 --weights out/quickstart.safetensors --data ../shared/data/tinyshakespeare.txt
//   compare --a fp32 --b bf16 --model char_tiny --tolerance 1e-3  # a tighter bound than bf16's
//   compare --a fp32 --b bf16 --model quickstart_bpe --weights out/quickstart_bpe.safetensors --data out/shakespeare
//
// Exit status: 0 every tensor within tolerance, 1 some tensor outside it, 2 bad input.
#include "cli.hpp"  // CLI11 and parse_or_exit

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <loom/core/random.hpp>
#include <loom/data/byte_dataset.hpp>
#include <loom/data/indexed_dataset.hpp>
#include <loom/data/sampler.hpp>
#include <loom/data/source.hpp>
#include <loom/device/cpu.hpp>
#include <loom/io/weights.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/verify/compare.hpp>

namespace {

struct options {
  std::string a = "fp32", b = "bf16", model = "quickstart", weights, data;
  std::uint64_t seed = 1337;
  double tolerance = 0;  // 0: the pair's default
};

/// Calls f(P{}) for the precision named `name`.
template <class F>
int with_precision(const std::string& name, F&& f) {
  if (name == "bf16") return f(loom::precision::bf16{});
  if (name == "fp16") return f(loom::precision::fp16{});
  return f(loom::precision::fp32{});
}

template <class M, int B, int T>
int run(const options& o) {
  using namespace loom;
  context<device::cpu> ctx;
  // weights: from the file (any float dtype) or initialised with --seed, held in fp32
  nn::transformer<M, policy<device::cpu, precision::fp32>> source(ctx, o.seed);
  if (!o.weights.empty()) io::load_weights(source, o.weights);
  // batch: B windows of tinyshakespeare-like text (byte tokens), or random ids
  verify::batch<B, T> x;
  if (const auto prefix = o.data.empty() ? std::nullopt : data::indexed_dataset_prefix(o.data)) {
    // a prepare_data dataset: B consecutive windows of its token ids from a seeded position
    const data::indexed_dataset ds(*prefix);
    const std::uint64_t need = std::uint64_t(B) * (T + 1);
    if (ds.token_count() < need)
      throw input_error("dataset '" + prefix->string() + "' holds " + std::to_string(ds.token_count()) +
                        " tokens, fewer than the " + std::to_string(need) + " of one batch; pass a larger dataset");
    std::vector<std::int32_t> w(need);
    ds.read_tokens(random_below(ds.token_count() - need + 1, o.seed, 13, 0), std::span(w), M::vocab);
    for (int r = 0; r < B; ++r)
      for (int t = 0; t < T; ++t) {
        x.inputs.push_back(w[std::size_t(r) * (T + 1) + t]);
        x.targets.push_back(w[std::size_t(r) * (T + 1) + t + 1]);
      }
  } else if (!o.data.empty()) {
    if (M::name == models::quickstart_bpe::name)
      throw input_error("--data '" + o.data + "' is a text file (byte tokens), but model quickstart_bpe reads the "
                        "token ids of a prepare_data dataset; pass its prefix (e.g. --data out/shakespeare)");
    if (M::vocab < 256)
      throw input_error("--data gives byte tokens (0..255), but model " + std::string(M::name) +
                        " has a vocabulary of " + std::to_string(M::vocab) + "; use --model quickstart or char_tiny");
    const data::byte_dataset text(o.data, T + 1);
    data::window_sampler sampler(text.train().size(), T + 1, o.seed);
    std::vector<std::int32_t> w(std::size_t{B} * (T + 1));
    sampler.next(std::span<const std::uint8_t>(text.train()), std::span(w));
    for (int r = 0; r < B; ++r)
      for (int t = 0; t < T; ++t) {
        x.inputs.push_back(w[std::size_t(r) * (T + 1) + t]);
        x.targets.push_back(w[std::size_t(r) * (T + 1) + t + 1]);
      }
  } else {
    for (std::size_t i = 0; i < std::size_t(B) * T; ++i) {
      x.inputs.push_back(std::int32_t(random_below(M::vocab, o.seed, 11, i)));
      x.targets.push_back(std::int32_t(random_below(M::vocab, o.seed, 12, i)));
    }
  }
  verify::compare_options copt;
  if (o.tolerance > 0) copt.tol = verify::tolerance{o.tolerance, o.tolerance};
  std::printf("model %s, batch %d x %d, weights %s, tokens %s\n", std::string(M::name).c_str(), B, T,
              o.weights.empty() ? ("initialised with seed " + std::to_string(o.seed)).c_str() : o.weights.c_str(),
              o.data.empty() ? "random" : o.data.c_str());
  return with_precision(o.a, [&]<class PA>(PA) {
    return with_precision(o.b, [&]<class PB>(PB) {
      nn::transformer<M, policy<device::cpu, PA>> a(ctx, o.seed);
      nn::transformer<M, policy<device::cpu, PB>> b(ctx, o.seed);
      {  // A's weights = the source's, rounded to A's storage (compare then copies A's into B)
        const auto src = source.parameters();
        auto dst = a.parameters();
        for (std::size_t i = 0; i < src.size(); ++i) dst[i] = typename PA::storage(src[i]);
      }
      const auto r = verify::compare(a, ctx, b, ctx, x, copt);
      std::fputs(verify::format(r).c_str(), stdout);
      return r.pass() ? 0 : 1;
    });
  });
}

}  // namespace

int main(int argc, char** argv) {
  loom::device::configure_host_malloc_for_gemm();
  options o;
  CLI::App app{"compare: the same weights and batch under two precisions, layer by layer (loom::verify::compare)"};
  app.add_option("--a", o.a, "reference precision")->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--b", o.b, "compared precision")->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--model", o.model, "model config (quickstart_bpe: the quickstart's weights, out/quickstart_bpe.safetensors)")
      ->check(CLI::IsMember({"quickstart", "char_tiny", "quickstart_bpe"}));
  app.add_option("--weights", o.weights, "weights saved by train_gpt (safetensors); default: initialised with --seed");
  app.add_option("--data", o.data,
                 "the batch: a UTF-8 text file (byte tokens) or a prepare_data dataset prefix (token ids, for "
                 "quickstart_bpe); default: random token ids");
  app.add_option("--seed", o.seed, "initialisation and sampling seed");
  app.add_option("--tolerance", o.tolerance, "relative-error bound for every tensor (default: the precisions' own)");
  loom_examples::parse_or_exit(app, argc, argv);
  try {
    if (o.model == "char_tiny") return run<loom::models::char_tiny, 4, 32>(o);
    if (o.model == "quickstart_bpe") return run<loom::models::quickstart_bpe, 4, 128>(o);
    return run<loom::models::quickstart, 4, 128>(o);
  } catch (const loom::input_error& e) {
    std::fprintf(stderr, "compare: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare: failed: %s\n", e.what());
    return 1;
  }
}
