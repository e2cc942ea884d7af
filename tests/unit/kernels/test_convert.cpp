// The CPU kernels' vectorisable 16-bit conversions (kernels/cpu/detail/convert.hpp) against
// Eigen's scalar conversions, bit for bit: every bf16 value widened, and floats of every kind
// (random bit patterns, ties, the largest finite values, infinities, NaNs, subnormals) narrowed.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <loom/core/random.hpp>
#include <loom/kernels/cpu/detail/convert.hpp>

namespace {
using loom::kernels::cpu::detail::narrow;
using loom::kernels::cpu::detail::widen;
}  // namespace

TEST_CASE("convert: widening every bf16 value equals Eigen's conversion bit for bit") {
  std::vector<Eigen::bfloat16> in(1 << 16);
  for (std::uint32_t b = 0; b < (1u << 16); ++b) in[b] = std::bit_cast<Eigen::bfloat16>(std::uint16_t(b));
  std::vector<float> out(in.size() + 3, -1.0f);
  widen(out.data() + 3, in.data(), std::ptrdiff_t(in.size()));  // misaligned destination
  int mismatches = 0;
  for (std::size_t i = 0; i < in.size(); ++i)
    mismatches += std::bit_cast<std::uint32_t>(out[i + 3]) != std::bit_cast<std::uint32_t>(static_cast<float>(in[i]));
  CHECK(mismatches == 0);
  CHECK(out[2] == -1.0f);  // nothing written before the destination
}

TEST_CASE("convert: narrowing floats to bf16 and half equals Eigen's rounding bit for bit") {
  std::vector<float> in;
  const std::size_t random_count = 1 << 20;
  for (std::size_t i = 0; i < random_count; ++i)
    in.push_back(std::bit_cast<float>(std::uint32_t(loom::random_below(std::uint64_t(1) << 32, 91, 0, i))));
  for (std::uint32_t hi : {0x3F80u, 0x3F81u, 0x7F7Fu, 0x0001u, 0x8000u, 0xC2F7u}) {
    in.push_back(std::bit_cast<float>((hi << 16) | 0x8000u));  // exactly halfway: ties to even
    in.push_back(std::bit_cast<float>((hi << 16) | 0x7FFFu));  // just below halfway
    in.push_back(std::bit_cast<float>((hi << 16) | 0x8001u));  // just above halfway
  }
  for (float f : {0.0f, -0.0f, std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::signaling_NaN(), std::numeric_limits<float>::denorm_min(), 65504.0f,
                  65520.0f, 1e-8f})
    in.push_back(f);
  in.push_back(std::bit_cast<float>(0x7F800001u));  // NaN with the smallest payload: must stay NaN
  in.push_back(std::bit_cast<float>(0xFFFFFFFFu));

  std::vector<Eigen::bfloat16> b(in.size());
  narrow(b.data(), in.data(), std::ptrdiff_t(in.size()));
  std::vector<Eigen::half> h(in.size());
  narrow(h.data(), in.data(), std::ptrdiff_t(in.size()));
  int bf16_mismatches = 0, half_mismatches = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    bf16_mismatches += b[i].value != Eigen::bfloat16(in[i]).value;
    half_mismatches += h[i].x != Eigen::half(in[i]).x;
  }
  CHECK(bf16_mismatches == 0);
  CHECK(half_mismatches == 0);
  CHECK(std::isnan(float(b[in.size() - 2])));
  CHECK(b[in.size() - 2].value == 0x7FC0);  // Eigen's quiet NaN
}

TEST_CASE("convert: a float round-trips through widen and narrow for every bf16 value but NaNs") {
  std::vector<Eigen::bfloat16> in;
  for (std::uint32_t b = 0; b < (1u << 16); ++b) {
    const auto v = std::bit_cast<Eigen::bfloat16>(std::uint16_t(b));
    if (!std::isnan(float(v))) in.push_back(v);
  }
  std::vector<float> f(in.size());
  widen(f.data(), in.data(), std::ptrdiff_t(in.size()));
  std::vector<Eigen::bfloat16> back(in.size());
  narrow(back.data(), f.data(), std::ptrdiff_t(in.size()));
  int mismatches = 0;
  for (std::size_t i = 0; i < in.size(); ++i) mismatches += back[i].value != in[i].value;
  CHECK(mismatches == 0);
}
