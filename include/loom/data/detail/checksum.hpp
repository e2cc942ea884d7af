#pragma once
/// \file Private to loom::data: XXH3-64 checksums of files and of JSON documents, and the
/// checked reading of the dataset summary (PREFIX.json) that prepare_data writes beside a
/// dataset. What the summary records (docs/data.md "Checksums"):
///   "checksums": {"bin": {"bytes": N, "xxh3_64": "<16 hex>"}, "idx": {...}, "tokenizer": {...}}
///   "checksum":  {"xxh3_64": "<16 hex>"}   the summary's own sum (json_xxh3)
/// Summaries written before these fields existed have neither and are read unchecked.
///
/// check_recorded_file hashes a whole file (memory-mapped; XXH3 outruns a disk, so reading the
/// file is the cost). json_xxh3 hashes the compact dump of a JSON object without its
/// "checksum" key: a parser's dump is canonical (keys sorted, numbers in shortest round-trip
/// form), so the sum does not depend on the file's whitespace, only on its values. It is the
/// scheme of the checkpoint manifest (io/checkpoint/manifest.hpp).
///
/// XXH3-64 itself is core/checksum.hpp's, shared with the checkpoint code.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include <loom/core/checksum.hpp>
#include <loom/core/error.hpp>
#include <loom/core/json.hpp>
#include <loom/data/detail/mapped_file.hpp>

namespace loom::data::detail {

using loom::json_xxh3;  // core/checksum.hpp
using loom::xxh3_hex;

/// Reads the dataset summary `file` (PREFIX.json): valid JSON, an object, and, when it records
/// "checksum", matching json_xxh3. Throws loom::input_error naming the file otherwise.
inline nlohmann::json read_summary_json(const std::filesystem::path& file) {
  const mapped_file f(file, "dataset summary", "re-run prepare_data");
  nlohmann::json j;
  try {
    j = parse_json(std::string_view(reinterpret_cast<const char*>(f.data()), f.size()),
                   "dataset summary '" + file.string() + "'", "re-run prepare_data or delete the file");
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for 1e400
    throw input_error("dataset summary '" + file.string() + "' is not valid JSON (" + e.what() +
                      "); re-run prepare_data or delete the file");
  }
  if (!j.is_object())
    throw input_error("dataset summary '" + file.string() + "' is not a JSON object; re-run prepare_data or delete the file");
  if (const auto c = j.find("checksum"); c != j.end()) {
    const std::string stored = c->is_object() && c->contains("xxh3_64") && (*c)["xxh3_64"].is_string()
                                   ? (*c)["xxh3_64"].get<std::string>() : std::string("(none)");
    const std::string computed = json_xxh3(j);
    if (stored != computed)
      throw input_error("dataset summary '" + file.string() + "' fails its checksum (stored " + stored + ", computed " +
                        computed + "): it was edited or corrupted; re-run prepare_data");
  }
  return j;
}

/// Checks `path` against entry `key` ("bin", "idx", "tokenizer") of the "checksums" of summary
/// `j` (read from `summary` by read_summary_json): its size, then its XXH3-64. Returns false
/// (nothing checked) when the summary records no such entry. `what` names the file's role
/// ("data file", "index file", "tokenizer model"). Throws loom::input_error naming the file
/// when it differs, or when the entry is malformed.
inline bool check_recorded_file(const nlohmann::json& j, std::string_view key, const std::filesystem::path& path,
                                std::string_view what, const std::filesystem::path& summary) {
  const auto sums = j.find("checksums");
  if (sums == j.end() || !sums->is_object() || !sums->contains(std::string(key))) return false;
  const auto& e = (*sums)[std::string(key)];
  if (!e.is_object() || !e.contains("bytes") || !e["bytes"].is_number_unsigned() || !e.contains("xxh3_64") ||
      !e["xxh3_64"].is_string())
    throw input_error("dataset summary '" + summary.string() + "' has a malformed checksum entry \"" + std::string(key) +
                      "\"; re-run prepare_data");
  const mapped_file f(path, what, "re-run prepare_data");
  const std::string who = std::string(what) + " '" + path.string() + "'";
  const auto bytes = e["bytes"].get<std::uint64_t>();
  if (f.size() != bytes)
    throw input_error(who + " is " + std::to_string(f.size()) + " bytes but '" + summary.filename().string() +
                      "' records " + std::to_string(bytes) + " (truncated or replaced); re-run prepare_data");
  const std::string stored = e["xxh3_64"].get<std::string>(), computed = xxh3_hex(f.data(), f.size());
  if (stored != computed)
    throw input_error(who + " fails its checksum ('" + summary.filename().string() + "' records XXH3-64 " + stored +
                      ", the file has " + computed + "): its bytes changed after prepare_data wrote it; re-run prepare_data");
  return true;
}

/// Whether `path` has the size and XXH3-64 that entry `key` of the "checksums" of summary `j`
/// records (check_recorded_file): true when `j` records no such entry (nothing to differ
/// from); false when the file differs, cannot be read, or the entry is malformed.
inline bool matches_recorded_file(const nlohmann::json& j, std::string_view key, const std::filesystem::path& path) {
  try {
    (void)check_recorded_file(j, key, path, "file", path);
    return true;
  } catch (const input_error&) {
    return false;
  }
}

/// The "checksums" entry of `path` for a summary: {"bytes": its size, "xxh3_64": its XXH3-64}.
inline nlohmann::json checksum_entry(const std::filesystem::path& path) {
  const mapped_file f(path, "file", "check the path");
  return {{"bytes", std::uint64_t(f.size())}, {"xxh3_64", xxh3_hex(f.data(), f.size())}};
}

}  // namespace loom::data::detail
