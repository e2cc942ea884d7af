// libFuzzer target for the dataset/tokenizer JSON sidecar PREFIX.json that prepare_data writes
// (data::text::detail::write_summary) beside PREFIX.idx/.bin/.model: its readers are
// data::read_dataset_summary (train_gpt: vocabulary, end-of-document id, token and byte counts,
// the tokenizer's file name) and data::text::tokenizer::sidecar_normalization (the text
// normalization a tokenizer applies to prompts, data::text::normalization::from_json).
//
// Input: the bytes of PREFIX.json.
// What must hold: malformed JSON, a field of the wrong type or an integer outside its member's
// range ends in loom::input_error (no float-to-integer conversion, no nlohmann exception
// escaping); an accepted normalization round-trips through to_json() and normalizes text —
// never a crash, undefined behaviour or leak (ASan + UBSan, tests/fuzz/run.sh sidecar).
#include <cstddef>
#include <cstdint>
#include <string>

#include <loom/core/error.hpp>
#include <loom/data/source.hpp>
#include <loom/data/text/clean.hpp>
#include <loom/data/text/tokenizer.hpp>

#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const loom_fuzz::scratch_dir dir("sidecar");
  const auto prefix = dir.path() / "corpus";
  auto json = prefix;
  json += ".json";
  auto model = prefix;
  model += ".model";
  loom_fuzz::write_file(json, data, size);
  try {
    const auto s = loom::data::read_dataset_summary(prefix);
    loom_fuzz::require(s.has_value(), "the summary was not found");
    // train_gpt's uses: the vocabulary check and the average bytes per token (source.hpp)
    const bool too_big = s->vocab_size > 8192;
    const double bytes_per_token = s->tokens > 0 ? double(s->text_bytes) / double(s->tokens) : 0.0;
    (void)too_big;
    (void)bytes_per_token;
    (void)s->tokenizer.string();
    loom_fuzz::accepted("dataset summary");
  } catch (const loom::input_error& e) {
    loom_fuzz::rejected(e);
  }
  try {
    namespace text = loom::data::text;
    const text::normalization n = text::tokenizer::sidecar_normalization(model);
    loom_fuzz::require(n.version == 1 || n.version == 2, "an accepted normalization has an unknown version");
    loom_fuzz::require(text::normalization::from_json(n.to_json(), "round trip") == n,
                       "normalization::from_json(to_json()) changed it");
    (void)text::normalize("\xEF\xBC\xA1\xE3\x80\x80" "a\xE2\x80\x8B\r\n" "b\xEF\xBC\x8C\xE4\xBD\xA0", n);
    loom_fuzz::accepted("normalization " + n.name());
  } catch (const loom::input_error& e) {
    loom_fuzz::rejected(e);
  }
  return 0;
}
