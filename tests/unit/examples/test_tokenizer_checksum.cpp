// The tokenizer a weights file was trained with, by checksum (examples/tokenizer_checksum.hpp):
// file_xxh3 hashes a file's bytes as loom::xxh3_hex does, and matching_tokenizer finds the file
// to name when the tokenizer in use differs: the recorded one, else the newest kept earlier
// version (PREFIX.previous-<k>.model).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "../../../examples/tokenizer_checksum.hpp"
#include "../data/paths.hpp"

namespace {
namespace fs = std::filesystem;
void put(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }
std::string sum_of(const std::string& text) { return loom::xxh3_hex(text.data(), text.size()); }
}  // namespace

TEST_CASE("tokenizer checksum: file_xxh3 is the XXH3-64 of the file's bytes; a missing file is an input error") {
  loom_test::scratch_dir d("tokenizer_checksum_file");
  const std::string bytes("model\0bytes\xff", 12);
  put(d.path / "t.model", bytes);
  CHECK(loom_examples::file_xxh3(d.path / "t.model") == sum_of(bytes));
  CHECK(loom_examples::file_xxh3(d.path / "t.model").size() == 16);
  put(d.path / "empty.model", "");
  CHECK(loom_examples::file_xxh3(d.path / "empty.model") == sum_of(""));
  CHECK_THROWS_WITH_AS(loom_examples::file_xxh3(d.path / "missing.model"), doctest::Contains("missing.model"),
                       loom::input_error);
}

TEST_CASE("tokenizer checksum: matching_tokenizer names the recorded file, else the newest kept match") {
  loom_test::scratch_dir d("tokenizer_checksum_match");
  const fs::path model = d.path / "d.model", other = d.path / "other.model";
  put(model, "vocabulary 3");                       // PREFIX.model now: prepare_data ran twice more
  put(d.path / "d.previous-1.model", "vocabulary 1");
  put(d.path / "d.previous-2.model", "vocabulary 2");
  put(d.path / "d.previous-3.model", "vocabulary 1");  // the same as -1: the newest is named
  put(other, "vocabulary 9");
  // trained with vocabulary 1, decoding with the recorded PREFIX.model: a kept one
  CHECK(loom_examples::matching_tokenizer(model, model, sum_of("vocabulary 1")) == d.path / "d.previous-3.model");
  CHECK(loom_examples::matching_tokenizer(model, model, sum_of("vocabulary 2")) == d.path / "d.previous-2.model");
  // --tokenizer names another file: the recorded one when it matches
  CHECK(loom_examples::matching_tokenizer(model, other, sum_of("vocabulary 3")) == model);
  // nothing recorded: the kept versions of the file in use
  put(d.path / "other.previous-1.model", "vocabulary 8");
  CHECK(loom_examples::matching_tokenizer({}, other, sum_of("vocabulary 8")) == d.path / "other.previous-1.model");
  // no file has it; a recorded file that is gone is passed over
  CHECK(loom_examples::matching_tokenizer(model, model, sum_of("vocabulary 7")).empty());
  CHECK(loom_examples::matching_tokenizer(d.path / "gone.model", other, sum_of("vocabulary 7")).empty());
}
