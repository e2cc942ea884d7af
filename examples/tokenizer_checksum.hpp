#pragma once
// The tokenizer a weights file was trained with, by checksum. train_gpt records, beside the
// "tokenizer" path of a prepare_data dataset, the XXH3-64 of that SentencePiece model
// ("tokenizer_xxh3_64" in the weights' metadata); sample checks the tokenizer it decodes with
// against it, so weights never decode with a tokenizer that was replaced since (prepare_data
// re-run on the same prefix keeps the old one as PREFIX.previous-<k>.model). Not a library
// header: examples/ only.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include <loom/core/checksum.hpp>
#include <loom/core/error.hpp>

#include "keep_previous.hpp"  // previous_runs

namespace loom_examples {

/// The weights-metadata key of the tokenizer's checksum (16 hex digits of XXH3-64, seed 0).
inline constexpr std::string_view tokenizer_checksum_key = "tokenizer_xxh3_64";

/// XXH3-64 of the bytes of file `path` (read whole: meant for tokenizer models, a few MB), as
/// 16 lower-case hex digits (loom::xxh3_hex). Throws loom::input_error naming the file when it
/// cannot be read.
inline std::string file_xxh3(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw loom::input_error("cannot open '" + path.string() + "' to checksum it; check the path");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw loom::input_error("cannot read '" + path.string() + "' to checksum it; check the path");
  return loom::xxh3_hex(bytes.data(), bytes.size());
}

/// A file with XXH3-64 `sum`, to name when the tokenizer `used` does not have it: `recorded`
/// (the path the weights record) when it is another file, else the newest kept earlier version
/// (previous_runs) of `recorded`, then of `used`. Empty when none has it. Files that cannot be
/// read are passed over.
inline std::filesystem::path matching_tokenizer(const std::filesystem::path& recorded, const std::filesystem::path& used,
                                                std::string_view sum) {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  std::error_code ec;
  const bool other = !recorded.empty() && !fs::equivalent(recorded, used, ec);
  if (other) candidates.push_back(recorded);
  for (const auto& of : {recorded, used}) {
    if (of.empty()) continue;
    auto kept = previous_runs(of);
    candidates.insert(candidates.end(), kept.rbegin(), kept.rend());
  }
  for (const auto& c : candidates) {
    try {
      if (file_xxh3(c) == sum) return c;
    } catch (const loom::input_error&) {
    }
  }
  return {};
}

}  // namespace loom_examples
