#pragma once
/// \file UTF-8 well-formedness (RFC 3629, Unicode 15 §3.9 table 3-7) without a library: checks
/// and a printable repair, for byte-level text (a model's sample, a file read as bytes).
#include <cstddef>
#include <string>
#include <string_view>

namespace loom::data {

/// Length (1..4) of the well-formed UTF-8 sequence that starts at `s[i]`, or 0 if none does:
/// no overlong forms, no surrogates (U+D800..DFFF), nothing above U+10FFFF, no truncated
/// sequence at the end. Precondition: i < s.size().
inline std::size_t utf8_sequence_length(std::string_view s, std::size_t i) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const unsigned c = p[i];
  if (c < 0x80) return 1;
  std::size_t len;
  unsigned lo = 0x80, hi = 0xBF;  // the second byte's range (table 3-7)
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  if (p[i + 1] < lo || p[i + 1] > hi) return 0;
  for (std::size_t k = 2; k < len; ++k)
    if (p[i + k] < 0x80 || p[i + k] > 0xBF) return 0;
  return len;
}

/// Whether all of `s` is well-formed UTF-8 (utf8_sequence_length at every sequence).
inline bool valid_utf8(std::string_view s) noexcept {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t len = utf8_sequence_length(s, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

/// `s` with each maximal run of bytes that start no well-formed sequence, or are ASCII control
/// characters other than '\n' and '\t' (ESC would start a terminal escape sequence), replaced
/// by one U+FFFD (the replacement character, EF BF BD), so a terminal or a log shows it instead
/// of raw bytes; well-formed text without such controls comes back unchanged. E.g. for a byte-level model's sample, whose tokens
/// are bytes and may cut or invent sequences.
inline std::string printable_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool in_bad_run = false;
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const bool control = (c < 0x20 && c != '\n' && c != '\t') || c == 0x7F;
    const std::size_t len = control ? 0 : utf8_sequence_length(s, i);
    if (len == 0) {
      if (!in_bad_run) out += "\xEF\xBF\xBD";
      in_bad_run = true;
      ++i;
      continue;
    }
    out.append(s.substr(i, len));
    in_bad_run = false;
    i += len;
  }
  return out;
}

}  // namespace loom::data
