// Weights files (io/weights.hpp) and Hugging Face exports (io/hf_gpt2.hpp) carry a checksum: a
// byte flipped in a weight or in the metadata is an error naming the file when it is loaded,
// not a different model; files without a checksum are still read, but a NaN or infinite
// weight is refused. (tests/cli/corrupt_sweep.py runs the same damage through the programs.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include <loom/device/cpu.hpp>
#include <loom/io/hf_gpt2.hpp>
#include <loom/io/weights.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/nn/transformer.hpp>

#include "../../support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace loom;
using M = models::tiny;
using G = nn::transformer<M, policy<device::cpu, precision::fp32>>;

namespace {
std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}
// The message of the loom::input_error `f` throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const input_error& e) {
    return e.what();
  }
  return "";
}
// Offset in safetensors file `p` of the first byte of tensor `name`: 8 + header length + begin.
std::size_t data_offset(const fs::path& p, const std::string& name) {
  std::uint64_t header = 0;
  std::memcpy(&header, read_bytes(p).data(), 8);
  return std::size_t(8 + header) + io::safetensors_reader(p).info(name).begin;
}
bool same_parameters(const G& a, const G& b) {
  return std::equal(a.parameters().begin(), a.parameters().end(), b.parameters().begin());
}
}  // namespace

TEST_CASE("weights: the checksum covers the tensors and the metadata; a NaN weight is refused") {
  context<device::cpu> ctx;
  loom_test::temp_dir dir;
  const G a(ctx, 7);
  const fs::path path = dir / "w.safetensors";
  io::save_weights(a, path, {{"data", "corpus.txt"}});
  {
    const io::safetensors_reader r(path);
    REQUIRE(r.metadata().count("xxh3_64"));
    CHECK(r.metadata().at("xxh3_64") == io::weights_checksum(r));
    CHECK(io::verify_weights_checksum(r));
  }
  G b(ctx, 8);
  io::load_weights(b, path);
  CHECK(same_parameters(a, b));

  const std::string good = read_bytes(path);
  // one weight changed by a ulp: a valid float, a different model
  auto bytes = good;
  const std::size_t at = data_offset(path, "wte") + 40;
  bytes[at] = char(bytes[at] ^ 0x01);
  write_bytes(path, bytes);
  CHECK(error_of([&] { io::load_weights(b, path); }).find("weights file '" + path.string() + "' fails its checksum") == 0);
  // a metadata value changed: "corpus.txt" -> "corpus.tyt"
  bytes = good;
  bytes[bytes.find("corpus.txt") + 8] = 'y';
  write_bytes(path, bytes);
  CHECK(error_of([&] { io::load_weights(b, path); }).find("fails its checksum") != std::string::npos);

  // a file without a checksum (another writer, or written before it was recorded) still loads,
  // unless it holds a NaN
  io::safetensors_writer w;
  for (std::size_t k = 0; k < G::num_tensors; ++k) {
    const auto& spec = G::table[k];
    w.add(std::string(spec.name), std::vector<std::int64_t>(spec.shape.begin(), spec.shape.begin() + spec.ndim),
          a.parameter(k).span());
  }
  for (const auto& [k, v] : io::model_metadata<M>()) w.set_metadata(k, v);
  w.write(path);
  G c(ctx, 9);
  io::load_weights(c, path);
  CHECK(same_parameters(a, c));
  bytes = read_bytes(path);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bytes.data() + data_offset(path, "ln1_w") + 4 * 3, &nan, 4);
  write_bytes(path, bytes);
  CHECK(error_of([&] { io::load_weights(c, path); }) ==
        "weights file '" + path.string() + "': tensor 'ln1_w' holds nan at element 3; the file is corrupt or was saved "
        "from a diverged run: use another file");
}

TEST_CASE("gpt2 export: config.json records the weights' checksum; import checks it and refuses NaN") {
  context<device::cpu> ctx;
  loom_test::temp_dir dir;
  const G a(ctx, 21);
  const fs::path hf = dir / "hf";
  io::export_gpt2(ctx, a, hf);
  const auto cfg = nlohmann::json::parse(read_bytes(hf / "config.json"));
  CHECK(cfg["loom"]["model_safetensors_xxh3_64"] == io::detail::xxh3_file(hf / "model.safetensors").first);
  G b(ctx, 22);
  io::import_gpt2(ctx, b, hf);
  io::export_gpt2(ctx, b, dir / "again");  // the same weights (loom's padding rows are not exported)
  CHECK(read_bytes(dir / "again" / "model.safetensors") == read_bytes(hf / "model.safetensors"));

  const std::string good = read_bytes(hf / "model.safetensors");
  auto bytes = good;
  const std::size_t at = data_offset(hf / "model.safetensors", "h.0.mlp.c_fc.weight") + 17;
  bytes[at] = char(bytes[at] ^ 0x01);
  write_bytes(hf / "model.safetensors", bytes);
  CHECK(error_of([&] { io::import_gpt2(ctx, b, hf); })
            .find("'" + (hf / "model.safetensors").string() + "' fails its checksum ('config.json' records XXH3-64 ") == 0);
  // without the recorded checksum (an export by transformers), a NaN is still refused
  auto plain = cfg;
  plain["loom"].erase("model_safetensors_xxh3_64");
  write_bytes(hf / "config.json", plain.dump(2));
  bytes = good;
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(bytes.data() + data_offset(hf / "model.safetensors", "ln_f.bias") + 4, &inf, 4);
  write_bytes(hf / "model.safetensors", bytes);
  CHECK(error_of([&] { io::import_gpt2(ctx, b, hf); }) ==
        "tensor 'ln_f.bias' in '" + (hf / "model.safetensors").string() + "' holds inf at element 1; the file is "
        "corrupt or the model diverged: use other weights");
}
