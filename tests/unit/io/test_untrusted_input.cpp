// Checkpoint manifests and flags from outside, as the fuzz targets (tests/fuzz/) feed them: each
// case used to convert a number out of range (undefined behaviour) or let a nlohmann exception
// escape, and now gives a loom::input_error naming the field.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include <loom/core/error.hpp>
#include <loom/io/checkpoint.hpp>
#include <loom/io/trace.hpp>

#include "support/temp_dir.hpp"

namespace {

// A running fp32 view on dp = 2 with a loss scaler, without tensors (what read_scalars compares).
loom::io::state_view running_view() {
  loom::io::state_view v;
  v.model = {{"name", "t"}, {"n_layer", 1}, {"n_head", 1}, {"d_model", 2}, {"max_seq", 2}, {"vocab", 3}, {"vocab_padded", 4}};
  v.storage_dtype = "F32";
  v.dp = 2;
  v.scaler_enabled = true;
  return v;
}

nlohmann::json manifest() {
  return nlohmann::json::parse(R"({"step": 12, "optimizer_step": 11, "tokens": 4096,
      "layout": {"tp": 1, "pp": 1, "dp": 2, "zero": 0},
      "loss_scaler": {"enabled": true, "scale": 512.0, "growth_tracker": 7}})");
}

}  // namespace

TEST_CASE("read_scalars: a manifest's dp and loss scaler fields are range- and type-checked") {
  const auto v = running_view();
  const loom::io::detail::saved_layout saved{1, 1, false};
  const auto ok = loom::io::detail::read_scalars(manifest(), v, "ckpt", saved);
  CHECK(ok.step == 12);
  CHECK(ok.optimizer_step == 11);
  REQUIRE(ok.loss_scaler.has_value());
  CHECK(ok.loss_scaler->scale == 512.0);
  CHECK(ok.loss_scaler->good_steps == 7);
  CHECK(ok.warnings.empty());

  auto with = [](const char* pointer, nlohmann::json value) {
    auto j = manifest();
    j[nlohmann::json::json_pointer(pointer)] = std::move(value);
    return j;
  };
  const nlohmann::json bad[] = {
      with("/layout/dp", 1e63),                         // get<int> of a float out of range: undefined
      with("/layout/dp", 4294967298ULL),                // wrapped to 2 before: no warning, wrong dp
      with("/layout/dp", 0),
      with("/layout/dp", "2"),                          // nlohmann::type_error escaped
      with("/loss_scaler/growth_tracker", 1e63),        // get<long> of a float out of range
      with("/loss_scaler/growth_tracker", 2.5),
      with("/loss_scaler/enabled", "yes"),              // nlohmann::type_error escaped
      with("/loss_scaler", 3),
      with("/loss_scaler/scale", "big")};
  for (const auto& j : bad) {
    CAPTURE(j.dump());
    CHECK_THROWS_AS(loom::io::detail::read_scalars(j, v, "ckpt", saved), loom::input_error);
  }
}

TEST_CASE("step_window::parse: a single step at the largest int64 is refused (its end would overflow)") {
  CHECK(loom::io::step_window::parse("9223372036854775806").last == 9223372036854775807LL);
  CHECK_THROWS_AS(loom::io::step_window::parse("9223372036854775807"), loom::input_error);
  CHECK_THROWS_AS(loom::io::step_window::parse("9223372036854775808"), loom::input_error);
}

TEST_CASE("safetensors and manifests nested a million levels deep are refused, not a stack overflow") {
  // nlohmann's parse recursed once per level (a stack overflow from ~80 000 levels), and the
  // reader's error message printed the shape, verify_checkpoint copies the whole manifest.
  loom_test::temp_dir dir;
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  std::string header = R"({"t":{"dtype":"F32","shape":)" + deep + R"(,"data_offsets":[0,0]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::uint64_t n = header.size();
  {
    std::ofstream f(dir / "deep.safetensors", std::ios::binary);
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header;
  }
  CHECK_THROWS_AS(loom::io::safetensors_reader(dir / "deep.safetensors"), loom::input_error);
  const auto step = dir / "step_00000001";
  std::filesystem::create_directories(step);
  std::ofstream(step / "manifest.json") << R"({"format": "loom.checkpoint", "extra": )" << deep << "}";
  CHECK_THROWS_AS(loom::io::verify_checkpoint(step), loom::input_error);
}
