// Hugging Face Llama export and import (io/hf_llama.hpp) for models::llama_tiny: the state dict
// that tests/golden/make_llama_tiny.py writes in LlamaForCausalLM's names imports into loom's
// fused layout and gives the golden loss; export then import round-trips bit for bit; wrong
// configs and files are refused before the model is touched.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <loom/device/cpu.hpp>
#include <loom/io/detail/checkpoint_fs.hpp>
#include <loom/io/hf_llama.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/nn/transformer.hpp>

#include "../../support/temp_dir.hpp"

#ifndef LOOM_SOURCE_DIR
#define LOOM_SOURCE_DIR "."
#endif

namespace fs = std::filesystem;
using namespace loom;
using M = models::llama_tiny;
using G = nn::transformer<M, policy<device::cpu, precision::fp64>>;
using G32 = nn::transformer<M, policy<device::cpu, precision::fp32>>;  // what export writes (F32) round-trips

namespace {
const fs::path golden_file = fs::path(LOOM_SOURCE_DIR) / "tests/golden/llama_tiny.safetensors";

/// Writes the golden file's "hf.*" tensors as `dir`/model.safetensors with a LlamaForCausalLM
/// config.json (`edit` may change the config first).
template <class Edit>
void write_hf_dir(const fs::path& dir, Edit&& edit) {
  fs::create_directories(dir);
  const io::safetensors_reader golden(golden_file);
  std::vector<std::vector<float>> data;
  std::vector<io::detail::tensor_ref> refs;
  for (const auto& t : golden.tensors())
    if (t.name.rfind("hf.", 0) == 0) data.push_back(golden.read<float>(t.name));
  std::size_t i = 0;
  for (const auto& t : golden.tensors())
    if (const std::string& name = t.name; name.rfind("hf.", 0) == 0) {
      refs.push_back({name.substr(3), "F32", golden.info(name).shape, std::as_bytes(std::span<const float>(data[i]))});
      ++i;
    }
  io::detail::write_safetensors(dir / "model.safetensors", refs, {{"format", "pt"}});
  auto cfg = io::llama_config<M>();
  cfg.erase("loom");
  edit(cfg);
  std::ofstream(dir / "config.json") << cfg.dump(2);
}
void write_hf_dir(const fs::path& dir) {
  write_hf_dir(dir, [](nlohmann::json&) {});
}
}  // namespace

TEST_CASE("llama import: the golden script's LlamaForCausalLM state dict gives the golden loss") {
  loom_test::temp_dir dir;
  write_hf_dir(dir / "hf");
  context<device::cpu> ctx;
  G model(ctx, 3);
  io::import_llama(ctx, model, dir / "hf");
  const io::safetensors_reader golden(golden_file);
  // every loom tensor is the golden file's initial one (padding rows of the vocabulary: zero)
  for (std::size_t k = 0; k < G::num_tensors; ++k) {
    const std::string name(G::table[k].name);
    CAPTURE(name);
    const auto want = golden.read<double>("param." + name);
    const auto got = model.parameter(k);
    REQUIRE(got.size() == want.size());
    const bool vocab = G::table[k].rule == models::shard::vocab;
    for (std::size_t i = 0; i < got.size(); ++i)
      if (!(vocab && i >= std::size_t(M::vocab) * M::d_model)) REQUIRE(got[i] == want[i]);
  }
  const auto tokens = golden.read<std::int32_t>("tokens"), targets = golden.read<std::int32_t>("targets");
  long count = 0;
  for (auto t : targets) count += t >= 0;
  G::activations<3, 13> acts(ctx);
  const double loss = model.forward(ctx, acts, tokens.data(), targets.data(), 3, 13) / double(count);
  CHECK(loss == doctest::Approx(golden.read<double>("loss")[0]).epsilon(1e-12));
}

TEST_CASE("llama export: config.json and names as LlamaForCausalLM; export then import is bit for bit") {
  loom_test::temp_dir dir;
  context<device::cpu> ctx;
  G32 a(ctx, 5), b(ctx, 6);
  io::export_llama(ctx, a, dir / "out");
  const auto cfg = nlohmann::json::parse(std::ifstream(dir / "out" / "config.json"));
  CHECK(cfg["model_type"] == "llama");
  CHECK(cfg["num_key_value_heads"] == 2);
  CHECK(cfg["intermediate_size"] == 14);
  CHECK(cfg["tie_word_embeddings"] == false);
  const io::safetensors_reader r(dir / "out" / "model.safetensors");
  CHECK(r.info("model.layers.1.self_attn.k_proj.weight").shape == std::vector<std::int64_t>{8, 24});
  CHECK(r.info("model.layers.0.mlp.up_proj.weight").shape == std::vector<std::int64_t>{14, 24});
  CHECK(r.info("lm_head.weight").shape == std::vector<std::int64_t>{61, 24});
  CHECK(r.tensors().size() == 2 + 2 * 9 + 1);
  io::import_llama(ctx, b, dir / "out");
  for (std::size_t k = 0; k < G32::num_tensors; ++k) {
    const auto pa = a.parameter(k), pb = b.parameter(k);
    const bool vocab = G32::table[k].rule == models::shard::vocab;
    const std::size_t n = vocab ? std::size_t(M::vocab) * M::d_model : pa.size();
    CAPTURE(G32::table[k].name);
    CHECK(std::equal(pa.begin(), pa.begin() + long(n), pb.begin()));
  }
}

TEST_CASE("llama import: another shape, rotary base, epsilon, a tied head or a changed file is refused untouched") {
  loom_test::temp_dir dir;
  context<device::cpu> ctx;
  G model(ctx, 5);
  const std::vector<double> before(model.parameters().begin(), model.parameters().end());
  auto refused = [&](const std::string& name, auto edit, const std::string& says) {
    write_hf_dir(dir / name, edit);
    CHECK_THROWS_WITH_AS(io::import_llama(ctx, model, dir / name), doctest::Contains(says.c_str()), input_error);
    CHECK(std::equal(before.begin(), before.end(), model.parameters().begin()));
  };
  refused("kv", [](nlohmann::json& c) { c["num_key_value_heads"] = 3; }, "num_key_value_heads = 3 but model llama_tiny has 2");
  refused("theta", [](nlohmann::json& c) { c["rope_theta"] = 500000.0; }, "rope_theta 500000");
  refused("eps", [](nlohmann::json& c) { c["rms_norm_eps"] = 1e-6; }, "rms_norm_eps");
  refused("tied", [](nlohmann::json& c) { c["tie_word_embeddings"] = true; }, "untied LM head");
  refused("gpt2", [](nlohmann::json& c) { c["model_type"] = "gpt2"; }, "not llama");
  refused("scaling", [](nlohmann::json& c) { c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; }, "rope_scaling");
  // a missing tensor
  write_hf_dir(dir / "missing");
  {
    const io::safetensors_reader golden(dir / "missing" / "model.safetensors");
    std::vector<std::vector<float>> data;
    std::vector<io::detail::tensor_ref> refs;
    for (const auto& t : golden.tensors())
      if (t.name != "model.layers.1.mlp.gate_proj.weight") data.push_back(golden.read<float>(t.name));
    std::size_t i = 0;
    for (const auto& t : golden.tensors())
      if (t.name != "model.layers.1.mlp.gate_proj.weight")
        refs.push_back({t.name, "F32", t.shape, std::as_bytes(std::span<const float>(data[i++]))});
    io::detail::write_safetensors(dir / "missing" / "model.safetensors", refs, {{"format", "pt"}});
  }
  CHECK_THROWS_WITH_AS(io::import_llama(ctx, model, dir / "missing"),
                       doctest::Contains("no tensor 'model.layers.1.mlp.gate_proj.weight'"), input_error);
  // an export whose weights changed afterwards fails the recorded checksum
  io::export_llama(ctx, model, dir / "changed");
  {
    std::fstream f(dir / "changed" / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  CHECK_THROWS_WITH_AS(io::import_llama(ctx, model, dir / "changed"), doctest::Contains("fails its checksum"), input_error);
  CHECK(std::equal(before.begin(), before.end(), model.parameters().begin()));
}
