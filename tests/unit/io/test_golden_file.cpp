// Validates tests/golden/gpt_tiny.safetensors itself (made by tests/golden/make_gpt_tiny.py):
// every key with its dtype and shape, and that its numbers are consistent with one another
// (loss from logits, norm from grads, lr schedule, losses going down). The comparison of
// loom's model against this file lives with the model's tests.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <numbers>
#include <set>
#include <string>
#include <vector>

#include <loom/io/safetensors.hpp>
#include <loom/models/configs.hpp>

namespace {

std::filesystem::path golden_path() {
#ifdef LOOM_SOURCE_DIR
  return std::filesystem::path(LOOM_SOURCE_DIR) / "tests/golden/gpt_tiny.safetensors";
#else
  return std::filesystem::current_path() / "tests/golden/gpt_tiny.safetensors";
#endif
}

using shape_t = std::vector<std::int64_t>;
using M = loom::models::tiny;
constexpr std::int64_t L = M::n_layer, C = M::d_model, V = M::vocab, Vp = M::vocab_padded;
constexpr std::int64_t B = 3, T = 13, steps = 10;

/// The parameter table of the golden file, in llm.c order (linear weights are (out, in)).
const std::vector<std::pair<std::string, shape_t>>& parameters() {
  static const std::vector<std::pair<std::string, shape_t>> table = {
      {"wte", {Vp, C}},          {"wpe", {M::max_seq, C}},  {"ln1_w", {L, C}},
      {"ln1_b", {L, C}},         {"qkv_w", {L, 3 * C, C}},  {"qkv_b", {L, 3 * C}},
      {"attproj_w", {L, C, C}},  {"attproj_b", {L, C}},     {"ln2_w", {L, C}},
      {"ln2_b", {L, C}},         {"fc_w", {L, 4 * C, C}},   {"fc_b", {L, 4 * C}},
      {"fcproj_w", {L, C, 4 * C}}, {"fcproj_b", {L, C}},    {"lnf_w", {C}},
      {"lnf_b", {C}}};
  return table;
}

/// Every key of the file -> (dtype, shape).
std::map<std::string, std::pair<std::string, shape_t>> expected_entries() {
  std::map<std::string, std::pair<std::string, shape_t>> e = {
      {"tokens", {"I32", {B, T}}},     {"targets", {"I32", {B, T}}},
      {"logits", {"F64", {B, T, Vp}}}, {"loss", {"F64", {1}}},
      {"losses", {"F64", {steps}}},    {"grad_norms", {"F64", {steps}}},
      {"lrs", {"F64", {steps}}}};
  for (const auto& [name, shape] : parameters()) {
    e["param." + name] = {"F32", shape};
    e["grad." + name] = {"F64", shape};
    e["final." + name] = {"F64", shape};
  }
  return e;
}

bool all_finite(const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

}  // namespace

TEST_CASE("golden gpt_tiny: every key has the dtype and shape of the table") {
  const loom::io::safetensors_reader r(golden_path());
  const auto expected = expected_entries();
  CHECK(r.tensors().size() == expected.size());
  for (const auto& t : r.tensors()) {
    CAPTURE(t.name);
    REQUIRE(expected.count(t.name) == 1);
    CHECK(t.dtype == expected.at(t.name).first);
    CHECK(t.shape == expected.at(t.name).second);
  }
  for (const auto& entry : expected) CHECK_MESSAGE(r.has(entry.first), entry.first);

  const auto& meta = r.metadata();
  CHECK(meta.at("model") == "tiny");
  CHECK(meta.at("n_layer") == std::to_string(M::n_layer));
  CHECK(meta.at("n_head") == std::to_string(M::n_head));
  CHECK(meta.at("d_model") == std::to_string(M::d_model));
  CHECK(meta.at("max_seq") == std::to_string(M::max_seq));
  CHECK(meta.at("vocab") == std::to_string(M::vocab));
  CHECK(meta.at("vocab_padded") == std::to_string(M::vocab_padded));
  CHECK(meta.at("B") == std::to_string(B));
  CHECK(meta.at("T") == std::to_string(T));
}

TEST_CASE("golden gpt_tiny: batch, initial parameters and gradients are sane") {
  const loom::io::safetensors_reader r(golden_path());
  const auto tokens = r.read<std::int32_t>("tokens");
  const auto targets = r.read<std::int32_t>("targets");
  CHECK(std::all_of(tokens.begin(), tokens.end(), [](int t) { return t >= 0 && t < V; }));
  CHECK(std::all_of(targets.begin(), targets.end(), [](int t) { return t >= -1 && t < V; }));
  CHECK(std::count(targets.begin(), targets.end(), -1) == 2);

  double grad_sq = 0;
  for (const auto& entry : parameters()) {
    const std::string& name = entry.first;  // not a structured binding: CAPTURE takes it by reference
    CAPTURE(name);
    const auto p = r.read<float>("param." + name);
    CHECK(std::all_of(p.begin(), p.end(), [](float x) { return std::isfinite(x) && x != 0.f; }));
    const auto g = r.read<double>("grad." + name);
    CHECK(all_finite(g));
    CHECK(std::any_of(g.begin(), g.end(), [](double x) { return x != 0.0; }));  // every path has a gradient
    for (double x : g) grad_sq += x * x;
  }
  // Padded vocabulary rows are never looked up nor scored: zero gradient.
  const auto gwte = r.read<double>("grad.wte");
  CHECK(std::all_of(gwte.begin() + V * C, gwte.end(), [](double x) { return x == 0.0; }));
  // The first recorded norm is the norm of the recorded gradients.
  const auto norms = r.read<double>("grad_norms");
  CHECK(norms[0] == doctest::Approx(std::sqrt(grad_sq)).epsilon(1e-12));
}

TEST_CASE("golden gpt_tiny: loss equals the cross-entropy of the recorded logits") {
  const loom::io::safetensors_reader r(golden_path());
  const auto logits = r.read<double>("logits");  // (B,T,Vp)
  const auto targets = r.read<std::int32_t>("targets");
  CHECK(all_finite(logits));
  double sum = 0;
  int count = 0;
  for (std::int64_t bt = 0; bt < B * T; ++bt) {
    if (targets[bt] == -1) continue;
    const double* row = logits.data() + bt * Vp;  // softmax over the real vocabulary only
    const double mx = *std::max_element(row, row + V);
    double z = 0;
    for (std::int64_t v = 0; v < V; ++v) z += std::exp(row[v] - mx);
    sum += std::log(z) + mx - row[targets[bt]];
    ++count;
  }
  const double loss = r.read<double>("loss").at(0);
  CHECK(count == B * T - 2);
  CHECK(loss == doctest::Approx(sum / count).epsilon(1e-12));
  CHECK(std::abs(loss - std::log(double(V))) < 0.3);  // small init: near-uniform prediction
}

TEST_CASE("golden gpt_tiny: training record is finite, decreasing and clips on some steps") {
  const loom::io::safetensors_reader r(golden_path());
  const auto losses = r.read<double>("losses");
  const auto norms = r.read<double>("grad_norms");
  const auto lrs = r.read<double>("lrs");
  REQUIRE(losses.size() == steps);
  CHECK(all_finite(losses));
  CHECK(all_finite(norms));
  CHECK(losses[0] == r.read<double>("loss").at(0));
  int decreases = 0;
  for (std::size_t s = 1; s < losses.size(); ++s) decreases += losses[s] < losses[s - 1];
  CHECK(decreases >= 8);
  CHECK(losses.back() < losses.front() - 0.5);

  // Both clip branches are exercised, each norm clearly away from max_norm = 1.
  CHECK(std::any_of(norms.begin(), norms.end(), [](double n) { return n > 1.0; }));
  CHECK(std::any_of(norms.begin(), norms.end(), [](double n) { return n < 1.0; }));
  for (double n : norms) CHECK(std::abs(n - 1.0) > 0.01);

  // lr: linear warmup over 3 steps to 1e-2, cosine to 1e-3 at step 8, then constant.
  for (int s = 0; s < steps; ++s) {
    double lr = 1e-3;
    if (s < 3) lr = 1e-2 * (s + 1) / 3;
    else if (s < 8) lr = 1e-3 + 0.5 * (1 + std::cos(std::numbers::pi * (s - 3) / 5.0)) * 9e-3;
    CHECK(lrs[s] == doctest::Approx(lr).epsilon(1e-15));
  }

  for (const auto& entry : parameters()) {
    const std::string& name = entry.first;  // not a structured binding: CAPTURE takes it by reference
    CAPTURE(name);
    const auto p0 = r.read<double>("param." + name);
    const auto p1 = r.read<double>("final." + name);
    CHECK(all_finite(p1));
    double moved = 0;
    for (std::size_t i = 0; i < p0.size(); ++i) moved = std::max(moved, std::abs(p1[i] - p0[i]));
    CHECK(moved > 1e-3);  // 10 Adam steps at lr ~1e-2 move every tensor
  }
  // Padded wte rows: zero gradient and no weight decay, so AdamW leaves them exactly as they were.
  const auto w0 = r.read<double>("param.wte"), w1 = r.read<double>("final.wte");
  CHECK(std::equal(w0.begin() + V * C, w0.end(), w1.begin() + V * C));
}
