// Dropout: the counter-based mask (core/dropout.hpp), the elementwise kernel
// (kernels/cpu/dropout.hpp) and attention-probability dropout inside the fused CPU attention
// (kernels/cpu/attention_fused.hpp), then the model and trainer with dropout on:
//   - the kept fraction over 2^22 draws within 4 sigma of 1-p (elementwise and attention masks);
//   - the fused kernel against PyTorch float64 autograd (tests/golden/attention_dropout.safetensors,
//     made by tests/golden/make_attention_dropout.py), after checking that loom's exported mask
//     equals the golden file's mask bit for bit; float64 and float32; both backward paths;
//   - the fused kernel's gradients against central differences with a fixed mask, at a
//     sequence length spanning several tiles, and the bf16 path against the float path;
//   - p = 0 is bitwise the path without dropout (kernel, model, trainer);
//   - the model's forward/backward with dropout is deterministic, and evaluate() runs without it;
//   - settings outside [0, 1) and implementations without dropout are refused with a sentence.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <loom/core/dropout.hpp>
#include <loom/device/cpu.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/nn/transformer.hpp>
#include <loom/train/trainer.hpp>

#include "../../support/scoped.hpp"

#include "../../support/gradcheck.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

using namespace loom;
using vec = std::vector<double>;

using loom_test::max_threads;
using loom_test::thread_scope;

struct problem {
  int B, T, C, NH;
};

/// Fused attention forward + backward in storage T over buffers allocated once (the kernel's
/// vectorised reductions depend on buffer alignment, so bitwise comparisons reuse the buffers).
/// run() returns out followed by dqkv (as double). Outputs start as garbage, scratch as NaN.
template <class T>
struct fused_run {
  using A = kernels::attention<device::cpu, T, kernels::fused>;
  using acc = typename A::acc;
  problem s;
  context<device::cpu> ctx;
  std::vector<T> x, dy, out, dqkv;
  std::vector<acc> lse, scratch;
  fused_run(const vec& qkv, const vec& dout, const problem& shape)
      : s(shape), x(qkv.begin(), qkv.end()), dy(dout.begin(), dout.end()), out(std::size_t(s.B) * s.T * s.C),
        dqkv(qkv.size()), lse(A::saved_elems(s.B, s.NH, s.T)), scratch(A::scratch_elems(max_threads(), s.T)) {}
  vec run(const attention_dropout& drop, bool with_out = true) {
    std::fill(out.begin(), out.end(), T(3));
    std::fill(dqkv.begin(), dqkv.end(), T(7));
    std::fill(lse.begin(), lse.end(), acc(5));
    std::fill(scratch.begin(), scratch.end(), std::numeric_limits<acc>::quiet_NaN());
    A::forward(ctx, out.data(), lse.data(), x.data(), s.B, s.T, s.C, s.NH, nullptr, drop);
    if (with_out)
      A::backward(ctx, dqkv.data(), dy.data(), x.data(), out.data(), lse.data(), scratch.data(), s.B, s.T, s.C, s.NH,
                  nullptr, drop);
    else
      A::backward(ctx, dqkv.data(), dy.data(), x.data(), lse.data(), scratch.data(), s.B, s.T, s.C, s.NH, nullptr, drop);
    vec r(out.begin(), out.end());
    r.insert(r.end(), dqkv.begin(), dqkv.end());
    return r;
  }
};

template <class T>
vec run_fused(const vec& qkv, const vec& dout, const problem& s, const attention_dropout& drop, bool with_out = true) {
  return fused_run<T>(qkv, dout, s).run(drop, with_out);
}

/// max |a - b| / max |b|: the error relative to the tensor's scale.
double scaled_error(const vec& a, const vec& b) {
  double d = 0, m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i])), m = std::max(m, std::abs(b[i]));
  return d / m;
}

double max_abs_diff(const vec& a, const vec& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

std::string golden_path() { return std::string(LOOM_SOURCE_DIR) + "/tests/golden/attention_dropout.safetensors"; }

}  // namespace

TEST_CASE("dropout mask: the kept fraction over 2^22 draws is within 4 sigma of 1-p") {
  constexpr std::uint64_t n = 1u << 22;
  for (const double p : {0.1, 0.5, 0.9}) {
    CAPTURE(p);
    const dropout_mask m = make_dropout_mask(p, dropout_key(11, 3, 2));
    std::uint64_t kept = 0;
    for (std::uint64_t i = 0; i < n; ++i) kept += m.keep(i) ? 1 : 0;
    const double sigma = std::sqrt(double(n) * p * (1 - p)), dev = (double(kept) - double(n) * (1 - p)) / sigma;
    MESSAGE("p = " << p << ": kept " << kept << " of " << n << " (" << double(kept) / double(n) << "), " << dev
                   << " sigma from n(1-p)");
    CHECK(std::abs(dev) < 4.0);
    CHECK(m.scale == doctest::Approx(1 / (1 - p)).epsilon(1e-15));
  }
  // the elementwise kernel: ones in, mean of the output ~ 1 (inverted dropout keeps the mean)
  std::vector<float> ones(n, 1.0f), out(n);
  kernels::cpu::dropout(out.data(), ones.data(), n, make_dropout_mask(0.25, 99));
  double sum = 0;
  std::uint64_t zeros = 0;
  for (float v : out) {
    sum += v;
    zeros += v == 0.0f ? 1 : 0;
    if (v != 0.0f) CHECK_EQ(v, float(1 / 0.75));
  }
  const double sigma = std::sqrt(double(n) * 0.25 * 0.75);
  CHECK(std::abs(double(zeros) - 0.25 * double(n)) < 4 * sigma);
  CHECK(std::abs(sum / double(n) - 1.0) < 4 * sigma / 0.75 / double(n));
  // attention mask over (B, NH, T, T) of a tp shard: every probability of heads 2..3 of 4
  const attention_dropout a{make_dropout_mask(0.3, 5), 2, 4};
  const int B = 4, NH = 2, T = 512;
  std::uint64_t kept = 0, total = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i)
        for (int j = 0; j < T; ++j, ++total) kept += attention_dropout_keep(a, NH, T, b, h, i, j) ? 1 : 0;
  const double s2 = std::sqrt(double(total) * 0.3 * 0.7);
  MESSAGE("attention mask: kept " << kept << " of " << total << ", " << (double(kept) - 0.7 * double(total)) / s2
                                  << " sigma from n(1-p)");
  CHECK(std::abs(double(kept) - 0.7 * double(total)) < 4 * s2);
}

TEST_CASE("dropout mask: probabilities outside [0, 1) are refused; p = 0 is inactive; heads are global") {
  CHECK_FALSE(make_dropout_mask(0.0, 1).active());
  CHECK(make_dropout_mask(1e-6, 1).active());
  for (const double p : {-0.1, 1.0, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    CAPTURE(p);
    CHECK_THROWS_WITH_AS(make_dropout_mask(p, 1), doctest::Contains("0 <= p < 1"), input_error);
  }
  // global head keying: head h of tp rank r (NH/TP local heads) is global head r*NH/TP + h
  const dropout_mask m = make_dropout_mask(0.5, 77);
  const attention_dropout whole{m, 0, 4}, rank1{m, 2, 4};
  int same = 0, n = 0;
  for (int i = 0; i < 9; ++i)
    for (int j = 0; j <= i; ++j, ++n) {
      same += attention_dropout_keep(whole, 4, 9, 1, 3, i, j) == attention_dropout_keep(rank1, 2, 9, 1, 1, i, j);
    }
  CHECK(same == n);
  // the kernel refuses heads beyond the global count
  std::vector<double> qkv(2 * 3 * 12, 0.5), out(2 * 3 * 4), lse(2 * 2 * 3);
  CHECK_THROWS_WITH_AS(kernels::cpu::attention_fused_forward(out.data(), lse.data(), qkv.data(), 2, 3, 4, 2, nullptr,
                                                             attention_dropout{m, 3, 4}),
                       doctest::Contains("head_offset"), input_error);
}

TEST_CASE("attention dropout: the fused kernel equals PyTorch float64 autograd with loom's exported mask") {
  io::safetensors_reader golden(golden_path());
  const auto& meta = golden.metadata();
  const problem s{std::stoi(meta.at("B")), std::stoi(meta.at("T")), std::stoi(meta.at("C")), std::stoi(meta.at("NH"))};
  const double p = std::stod(meta.at("p"));
  const attention_dropout drop{make_dropout_mask(p, std::stoull(meta.at("key"))), std::stoi(meta.at("head_offset")),
                               std::stoi(meta.at("heads"))};
  // 1. the mask loom materialises equals the one PyTorch used, bit for bit
  const auto keep = golden.read<std::uint8_t>("keep");
  std::size_t mismatches = 0, kept = 0, i = 0;
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int q = 0; q < s.T; ++q)
        for (int k = 0; k < s.T; ++k, ++i) {
          const bool mine = attention_dropout_keep(drop, s.NH, s.T, b, h, q, k);
          mismatches += mine != (keep[i] != 0);
          kept += mine ? 1 : 0;
        }
  CHECK(mismatches == 0);
  CHECK(kept == std::stoull(meta.at("kept")));  // over the whole (B, NH, T, T) square
  // 2. forward and gradients against the golden float64 values
  const vec qkv = golden.read<double>("qkv"), dout = golden.read<double>("dout");
  vec want = golden.read<double>("out");
  const vec dqkv = golden.read<double>("dqkv");
  want.insert(want.end(), dqkv.begin(), dqkv.end());
  double scale = 0;
  for (double v : want) scale = std::max(scale, std::abs(v));
  for (const int threads : {1, 8}) {  // 8 > B*NH: the tile-split backward
    const thread_scope ts(threads);
    for (const bool with_out : {true, false}) {
      CAPTURE(threads);
      CAPTURE(with_out);
      const double e64 = max_abs_diff(run_fused<double>(qkv, dout, s, drop, with_out), want);
      const double e32 = max_abs_diff(run_fused<float>(qkv, dout, s, drop, with_out), want);
      MESSAGE("threads " << threads << std::string(with_out ? ", D from out" : ", D recomputed") << ": max |loom - torch| float64 "
                         << e64 << ", float32 " << e32 << " (values up to " << scale << ")");
      CHECK(e64 < 1e-12 * scale);
      CHECK(e32 < 2e-5 * scale);
    }
  }
}

TEST_CASE("attention dropout: the kernel is not the one without dropout, and p = 0 is bitwise that one") {
  const problem s{2, 70, 16, 2};
  const vec qkv = test::random_vector(std::size_t(s.B) * s.T * 3 * s.C, 3), dout = test::random_vector(std::size_t(s.B) * s.T * s.C, 4);
  fused_run<float> f32(qkv, dout, s);
  const vec none = f32.run({});
  const vec zero = f32.run(attention_dropout{make_dropout_mask(0.0, 123), 1, 3});
  CHECK(std::memcmp(none.data(), zero.data(), none.size() * sizeof(double)) == 0);
  const attention_dropout drop{make_dropout_mask(0.1, 123), 1, 3};
  const vec some = f32.run(drop);
  CHECK(scaled_error(some, none) > 1e-2);
  // the 16-bit path (head by head, per-head mask coordinates) draws the float path's mask: its
  // error against float32 with dropout is the same as without
  fused_run<Eigen::bfloat16> bf(qkv, dout, s);
  const double e_none = scaled_error(bf.run({}), none), e_drop = scaled_error(bf.run(drop), some);
  MESSAGE("bf16 vs float32, max error / max value: without dropout " << e_none << ", with dropout 0.1 " << e_drop
                                                                      << "; dropout's own effect " << scaled_error(some, none));
  CHECK(e_drop < 2 * e_none + 1e-3);
  CHECK(e_drop < 0.02);
}

TEST_CASE("attention dropout: float64 gradients match central differences with a fixed mask (several tiles)") {
  const problem s{1, 70, 8, 2};  // 70 > one 64-row tile
  const attention_dropout drop{make_dropout_mask(0.3, 2718), 1, 3};
  vec qkv = test::random_vector(std::size_t(s.B) * s.T * 3 * s.C, 8), dout = test::random_vector(std::size_t(s.B) * s.T * s.C, 9);
  const vec r = run_fused<double>(qkv, dout, s, drop);
  const vec analytic(r.begin() + std::ptrdiff_t(dout.size()), r.end());
  // sample of elements: every 7th of q, k and v of every row
  vec num, ana;
  const std::size_t n_out = dout.size();
  auto loss = [&] {
    const vec o = run_fused<double>(qkv, dout, s, drop);
    return test::dot(vec(o.begin(), o.begin() + std::ptrdiff_t(n_out)), dout);
  };
  for (std::size_t i = 0; i < qkv.size(); i += 7) {
    const double old = qkv[i], h = 1e-6;
    qkv[i] = old + h;
    const double fp = loss();
    qkv[i] = old - h;
    const double fm = loss();
    qkv[i] = old;
    num.push_back((fp - fm) / (2 * h));
    ana.push_back(analytic[i]);
  }
  const double e = test::max_rel_error(ana, num);
  MESSAGE("fused attention with dropout 0.3, T = 70: max relative error vs central differences " << e << " over "
                                                                                                   << num.size() << " elements");
  CHECK(e < 1e-6);
}

TEST_CASE("gpt with dropout: p = 0 is bitwise no dropout; the same state repeats; evaluate runs without it") {
  using P = policy<device::cpu, precision::fp32>;
  using M = models::tiny;
  context<device::cpu> ctx;
  nn::transformer<M, P> model(ctx, 3);
  constexpr int B = 2, T = 16;
  typename nn::transformer<M, P>::template activations<B, T> acts(ctx);
  std::vector<std::int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < B * T; ++i)
    in[i] = std::int32_t(random_below(M::vocab, 1, 0, i)), tg[i] = std::int32_t(random_below(M::vocab, 1, 1, i));
  const float scale = 1.0f / (B * T);
  auto run = [&](const nn::dropout_state& d) {
    model.zero_grad(ctx);
    const float l = model.forward(ctx, acts, in.data(), tg.data(), B, T, scale, d);
    model.backward(ctx, acts, in.data(), B, T);
    const auto g = model.gradients();
    return std::pair<float, std::vector<float>>(l, std::vector<float>(g.data(), g.data() + g.size()));
  };
  const auto off = run({});
  const auto zero = run({0.0, dropout_key(1, 2, 3)});
  CHECK(off.first == zero.first);
  CHECK(std::memcmp(off.second.data(), zero.second.data(), off.second.size() * sizeof(float)) == 0);
  const auto on = run({0.1, dropout_key(1, 2, 3)}), again = run({0.1, dropout_key(1, 2, 3)});
  CHECK(on.first == again.first);
  CHECK(std::memcmp(on.second.data(), again.second.data(), on.second.size() * sizeof(float)) == 0);
  const auto other = run({0.1, dropout_key(1, 2, 4)});
  MESSAGE("loss without dropout " << off.first << ", with 0.1 " << on.first << ", another micro-batch's masks "
                                  << other.first);
  CHECK(on.first != off.first);
  CHECK(other.first != on.first);
  // probabilities outside [0, 1) are refused by forward
  CHECK_THROWS_AS(model.forward(ctx, acts, in.data(), tg.data(), B, T, scale, nn::dropout_state{1.0, 0}), input_error);
}

TEST_CASE("trainer: --dropout is validated, needs the fused attention, and evaluate() runs without it") {
  using P = policy<device::cpu, precision::fp32>;
  using M = models::tiny;
  context<device::cpu> ctx;
  train::trainer_config c;
  c.seed = 5;
  c.schedule = {1e-3, 1e-4, 1, 10};
  for (const double p : {-0.5, 1.0}) {
    c.dropout = p;
    CHECK_THROWS_WITH_AS((train::trainer<M, P, 2, 8>(ctx, c)), doctest::Contains("--dropout"), input_error);
  }
  c.dropout = 0.1;
  CHECK_THROWS_WITH_AS((train::trainer<M, P, 2, 8, parallel::local_group, kernels::reference>(ctx, c)),
                       doctest::Contains("kernels::fused"), input_error);
  train::trainer<M, P, 2, 8> with(ctx, c);
  c.dropout = 0;
  train::trainer<M, P, 2, 8> without(ctx, c);
  std::vector<std::int32_t> w(2 * 9);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::int32_t(random_below(M::vocab, 8, 0, i));
  const double e1 = with.evaluate(ctx, w), e0 = without.evaluate(ctx, w);
  CHECK(e1 == e0);  // evaluation ignores the dropout setting
  const double l1 = with.step(ctx, w).loss, l0 = without.step(ctx, w).loss;
  MESSAGE("first-step loss with dropout 0.1: " << l1 << ", without: " << l0 << "; evaluate: " << e1);
  CHECK(l1 != l0);
}
