// libFuzzer target for the weight importers: Hugging Face GPT-2 (io::import_gpt2: config.json
// and model.safetensors, as transformers' save_pretrained writes them) and loom's own weights
// file (io::load_weights: a safetensors file whose "__metadata__" names the model config), into
// loom::test::micro_gpt2 (tests/support/host_model.hpp: the same parameter table as a loom::nn::transformer,
// 90 parameters).
//
// Input: byte 0 selects the importer (even: import_gpt2, odd: load_weights); then bytes [1, 3)
// = n (little-endian), the first file (n bytes) and the second (the rest) — loom_fuzz::split2:
//   even  config.json, then model.safetensors
//   odd   (ignored), then the weights .safetensors
// What must hold: a malformed file, a config of another shape (also with integers beyond any
// C++ type), a missing tensor or one of another shape or dtype ends in loom::input_error, and
// the model is written only by a load that succeeds (all-or-nothing) — never a crash,
// undefined behaviour, a leak or a read outside the file (ASan + UBSan,
// tests/fuzz/run.sh hf_gpt2).
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/io/hf_gpt2.hpp>
#include <loom/io/weights.hpp>

#include <support/host_model.hpp>

#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const loom_fuzz::scratch_dir dir("hf_gpt2");
  if (size < 1) return 0;
  const auto [first, second] = loom_fuzz::split2(data + 1, size - 1);
  using G = loom::test::host_model<loom::test::micro_gpt2>;
  G model;
  std::fill(model.values.begin(), model.values.end(), 7.0f);
  bool loaded = false;
  try {
    if (data[0] % 2 == 0) {
      loom_fuzz::write_file(dir.path() / "config.json", first);
      loom_fuzz::write_file(dir.path() / "model.safetensors", second);
      loom::context<loom::device::cpu> ctx;
      loom::io::import_gpt2(ctx, model, dir.path());
      loom_fuzz::accepted("Hugging Face GPT-2 directory");
    } else {
      const auto file = dir.path() / "weights.safetensors";
      loom_fuzz::write_file(file, second);
      loom::io::load_weights(model, file);
      loom_fuzz::accepted("loom weights file");
    }
    loaded = true;
  } catch (const loom::input_error& e) {
    loom_fuzz::rejected(e);
  }
  // import_gpt2 is all-or-nothing: a refused import leaves every parameter as it was
  if (!loaded && data[0] % 2 == 0)
    loom_fuzz::require(std::all_of(model.values.begin(), model.values.end(), [](float v) { return v == 7.0f; }),
                       "a refused import_gpt2 changed the model");
  return 0;
}
