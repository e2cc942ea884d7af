#pragma once
/// \file JSON read out of files (manifests, safetensors headers, dataset summaries, Hugging Face
/// configs, JSON-lines corpora), defended against two things nlohmann does not refuse:
///
///  * Integers out of range. get<int>() converts whatever number it finds: a float such as
///    1e63 becomes an int by static_cast, which is undefined behaviour, and 4294967297 becomes
///    1. Every integer a file gives loom goes through json_integer<T>, which says "not
///    representable" for anything that is not a JSON integer inside T's range.
///  * Deep nesting. nlohmann's parse, copying a value and dump() recurse once per level: with an
///    8 MB stack, "[[[[...]]]]" 60 000 levels deep (120 KB) crashes a copy (a manifest's
///    checksum copies it) and 80 000 levels crash the parse itself (g++ 12 -O2, nlohmann
///    3.11.2). parse_json refuses nesting deeper than json_max_depth before parsing.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include <nlohmann/json.hpp>

#include <loom/core/error.hpp>

namespace loom {

/// The value of `j` as the integer type T, or std::nullopt when `j` is not a JSON integer
/// (a float, even 3.0, a string, ...) or its value lies outside [min(T), max(T)].
/// Never throws. Cost: O(1).
template <class T>
std::optional<T> json_integer(const nlohmann::json& j) noexcept {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>, "json_integer<T>: T must be an integer type");
  if (j.is_number_unsigned()) {
    const auto v = j.get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) return std::nullopt;
    return static_cast<T>(v);
  }
  if (j.is_number_integer()) {  // signed storage: may be negative
    const auto v = j.get<std::int64_t>();
    if constexpr (std::is_unsigned_v<T>) {
      if (v < 0 || static_cast<std::uint64_t>(v) > static_cast<std::uint64_t>(std::numeric_limits<T>::max()))
        return std::nullopt;
    } else {
      if (v < static_cast<std::int64_t>(std::numeric_limits<T>::min()) ||
          v > static_cast<std::int64_t>(std::numeric_limits<T>::max()))
        return std::nullopt;
    }
    return static_cast<T>(v);
  }
  return std::nullopt;
}

/// The deepest nesting of arrays and objects parse_json accepts. loom's own files nest at most
/// 4 levels (a manifest's files[i], a safetensors entry's shape).
inline constexpr std::size_t json_max_depth = 64;

/// The deepest nesting of arrays and objects in JSON text `text` (brackets inside strings do not
/// count; escapes are honoured), scanning at most until it exceeds `stop`. For malformed text
/// the count is still an upper bound of what a parser would build. O(n), no allocation.
inline std::size_t json_nesting_depth(std::string_view text, std::size_t stop = ~std::size_t(0)) noexcept {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > stop) break;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

/// nlohmann::json::parse(text), refusing nesting deeper than json_max_depth first: throws
/// loom::input_error "<where>: JSON nested deeper than 64 levels (...); <fix>" for that, and
/// nlohmann::json::parse_error (as parse does) for malformed text. Cost: one extra O(n) scan.
inline nlohmann::json parse_json(std::string_view text, const std::string& where, std::string_view fix) {
  if (json_nesting_depth(text, json_max_depth) > json_max_depth)
    throw input_error(where + ": JSON nested deeper than " + std::to_string(json_max_depth) +
                      " levels of arrays and objects (loom's files nest at most 4); " + std::string(fix));
  return nlohmann::json::parse(text);
}

}  // namespace loom
