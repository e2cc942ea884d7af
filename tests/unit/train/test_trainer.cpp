// Trainer semantics: determinism, gradient accumulation equivalence, the schedule, clipping,
// a non-finite gradient skipping the step, and bad input.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <loom/data/byte_dataset.hpp>
#include <loom/data/sampler.hpp>
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/train/trainer.hpp>

using namespace loom;
using M = models::tiny;
using P = policy<device::cpu, precision::fp32>;

namespace {
std::vector<std::int32_t> random_windows(std::size_t rows, std::size_t window, std::uint64_t seed) {
  std::vector<std::int32_t> w(rows * window);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::int32_t(random_below(M::vocab, seed, 3, i));
  return w;
}
train::trainer_config small_config() {
  train::trainer_config cfg;
  cfg.schedule = {3e-3, 3e-4, 2, 10};
  return cfg;
}
}  // namespace

TEST_CASE("trainer: two runs with the same seed give bitwise-equal losses") {
  context<device::cpu> ctx;
  std::vector<double> a, b;
  for (auto* out : {&a, &b}) {
    train::trainer<M, P, 4, 16> tr(ctx, small_config());
    for (int s = 0; s < 4; ++s) out->push_back(tr.step(ctx, random_windows(4, 17, 100)).loss);
  }
  REQUIRE(a.size() == 4);
  for (int s = 0; s < 4; ++s) CHECK(std::memcmp(&a[s], &b[s], sizeof(double)) == 0);
  CHECK(a[3] < a[0] - 0.05);  // it learns (the same batch every step)
}

TEST_CASE("trainer: 2 micro-batches of 3 equal 1 micro-batch of 6 (loss and update)") {
  context<device::cpu> ctx;
  auto cfg1 = small_config();
  auto cfg2 = small_config();
  cfg2.micro_batch = 3;
  cfg2.grad_accum = 2;
  train::trainer<M, P, 6, 11> one(ctx, cfg1), two(ctx, cfg2);
  const auto w = random_windows(6, 12, 7);
  const auto r1 = one.step(ctx, w), r2 = two.step(ctx, w);
  CHECK(r1.loss == doctest::Approx(r2.loss).epsilon(1e-6));
  CHECK(r1.grad_norm == doctest::Approx(r2.grad_norm).epsilon(1e-5));
  CHECK(r1.tokens == 66);
  CHECK(r2.tokens == 66);
  double worst = 0;
  const auto p1 = one.model().parameters(), p2 = two.model().parameters();
  for (std::size_t i = 0; i < p1.size(); ++i) worst = std::max(worst, double(std::abs(p1[i] - p2[i])));
  CHECK(worst < 1e-6);
}

TEST_CASE("cosine schedule: warm-up never starts at 0, decays, then stays at the floor") {
  optim::cosine_schedule s{1e-3, 1e-4, 10, 100};
  CHECK(s(0) == doctest::Approx(1e-4));
  CHECK(s(9) == doctest::Approx(1e-3));
  CHECK(s(10) == doctest::Approx(1e-3));
  CHECK(s(55) == doctest::Approx(1e-4 + 0.5 * 9e-4));
  CHECK(s(100) == doctest::Approx(1e-4));
  CHECK(s(100000) == doctest::Approx(1e-4));
  optim::cosine_schedule no_warmup{1e-3, 0, 0, 50};
  CHECK(no_warmup(0) == doctest::Approx(1e-3));
  CHECK_THROWS_AS((optim::cosine_schedule{-1, 0, 0, 1}.validate()), input_error);
  CHECK_THROWS_AS((optim::cosine_schedule{1e-3, 1e-2, 0, 1}.validate()), input_error);
}

TEST_CASE("clip coefficient follows clip_grad_norm_") {
  CHECK(optim::clip_coefficient(0.5, 1.0) == 1.0);
  CHECK(optim::clip_coefficient(4.0, 1.0) == doctest::Approx(1.0 / (4.0 + 1e-6)));
  CHECK(optim::clip_coefficient(4.0, 0.0) == 1.0);
}

TEST_CASE("trainer: a non-finite gradient skips the step and leaves parameters and moments untouched") {
  context<device::cpu> ctx;
  train::trainer<M, P, 2, 8> tr(ctx, small_config());
  const auto w = random_windows(2, 9, 5);
  tr.step(ctx, w);  // one normal step so the moments are non-zero
  tr.model().parameter(models::param::lnf_w)[3] = std::numeric_limits<float>::infinity();
  const std::vector<float> before(tr.model().parameters().begin(), tr.model().parameters().end());
  const std::vector<float> m_before(tr.optimizer().first_moment().begin(), tr.optimizer().first_moment().end());
  const auto r = tr.step(ctx, w);
  CHECK(r.skipped);
  CHECK_FALSE(std::isfinite(r.grad_norm));
  CHECK(std::memcmp(before.data(), tr.model().parameters().data(), before.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(m_before.data(), tr.optimizer().first_moment().data(), m_before.size() * sizeof(float)) == 0);
  CHECK(tr.optimizer().step() == 1);
  CHECK(tr.step_count() == 2);  // the schedule still advances
}

TEST_CASE("trainer: bad batches and settings raise input_error naming the problem") {
  context<device::cpu> ctx;
  train::trainer<M, P, 2, 8> tr(ctx, small_config());
  auto w = random_windows(2, 9, 5);
  w[11] = M::vocab;  // out of range
  try {
    tr.step(ctx, w);
    FAIL("no exception");
  } catch (const input_error& e) {
    CHECK(std::string(e.what()).find("token id 61 at position 11") != std::string::npos);
  }
  CHECK_THROWS_AS(tr.step(ctx, std::vector<std::int32_t>(5, 1)), input_error);
  std::vector<std::int32_t> in(16, 1), tg(16, -1);
  CHECK_THROWS_WITH_AS(tr.step(ctx, in, tg), doctest::Contains("ignored"), input_error);
  auto bad = small_config();
  bad.seq_len = 9;
  CHECK_THROWS_WITH_AS((train::trainer<M, P, 2, 8>(ctx, bad)), doctest::Contains("--seq-len <= 8"), input_error);
  bad = small_config();
  bad.grad_accum = 0;
  CHECK_THROWS_AS((train::trainer<M, P, 2, 8>(ctx, bad)), input_error);
}

TEST_CASE("byte_dataset: missing, empty, binary and too-short files are rejected with a fix") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "loom_test_byte_dataset";
  fs::create_directories(dir);
  auto write = [&](const char* name, const std::string& bytes) {
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return dir / name;
  };
  CHECK_THROWS_WITH_AS(data::byte_dataset(dir / "missing.txt", 9), doctest::Contains("does not exist"), input_error);
  CHECK_THROWS_WITH_AS(data::byte_dataset(write("empty.txt", ""), 9), doctest::Contains("is empty"), input_error);
  CHECK_THROWS_WITH_AS(data::byte_dataset(write("bin.txt", std::string("ab\0cd", 5)), 9), doctest::Contains("not UTF-8"), input_error);
  CHECK_THROWS_WITH_AS(data::byte_dataset(write("bad.txt", "abc\xff\xfe"), 2), doctest::Contains("not UTF-8"), input_error);
  CHECK_THROWS_WITH_AS(data::byte_dataset(write("short.txt", "hello world"), 9), doctest::Contains("too short"), input_error);
  CHECK_THROWS_AS(data::byte_dataset(dir, 9), input_error);
  const data::byte_dataset ok(write("ok.txt", std::string(1000, 'a') + "\xe4\xb8\xad"), 9);  // valid UTF-8 (CJK)
  CHECK(ok.train().size() + ok.validation().size() == 1003);
  CHECK(ok.validation().size() == 101);
  fs::remove_all(dir);
}

TEST_CASE("window_sampler: same seed same windows; windows are real slices of the data") {
  std::vector<std::uint8_t> text(500);
  for (std::size_t i = 0; i < text.size(); ++i) text[i] = std::uint8_t(i % 251);
  data::window_sampler a(text.size(), 9, 42), b(text.size(), 9, 42), c(text.size(), 9, 43);
  std::vector<std::int32_t> wa(36), wb(36), wc(36);
  a.next(std::span<const std::uint8_t>(text), std::span(wa));
  b.next(std::span<const std::uint8_t>(text), std::span(wb));
  c.next(std::span<const std::uint8_t>(text), std::span(wc));
  CHECK(wa == wb);
  CHECK(wa != wc);
  for (int r = 0; r < 4; ++r)
    for (int t = 1; t < 9; ++t) CHECK((wa[r * 9 + t] - wa[r * 9 + t - 1] + 251) % 251 == 1);
  CHECK(a.position() == 4);
  CHECK_THROWS_AS(data::window_sampler(5, 9, 1), input_error);
}
