#pragma once
/// \file loom::data::text — document filters by length and by writing system (script).
///
/// Script identification is the cheap form of language identification: every letter (Unicode
/// general category L*) is assigned a script from its block (Unicode Standard Annex #24 /
/// Scripts.txt, coarsened to the ranges below); digits, punctuation, symbols and spaces do
/// not vote. A document passes the script filter when the letters of the scripts the user
/// keeps make up at least min_script_fraction of its letters. Documents without any letter
/// are removed when a script filter is active (they are numbers, symbols or markup debris).
/// Length is measured in Unicode code points.
///
/// Cost: O(n) per document, one utf8proc_category lookup per non-ASCII code point.
#include <utf8proc.h>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <loom/core/error.hpp>

namespace loom::data::text {

/// Coarse writing systems. `kana` = Hiragana and Katakana; `other` = any letter not listed.
enum class script : std::uint8_t {
  latin, greek, cyrillic, armenian, hebrew, arabic, devanagari, bengali, tamil, thai,
  georgian, hangul, kana, han, ethiopic, other, count_
};
inline constexpr std::size_t script_count = std::size_t(script::count_);

/// Lower-case name of `s` ("latin", "han", ...), as used by --keep-scripts.
constexpr std::string_view script_name(script s) noexcept {
  constexpr std::array<std::string_view, script_count> names = {
      "latin", "greek", "cyrillic", "armenian", "hebrew", "arabic", "devanagari", "bengali", "tamil", "thai",
      "georgian", "hangul", "kana", "han", "ethiopic", "other"};
  return names[std::size_t(s)];
}

/// Parses a script name; throws loom::input_error listing the valid names.
inline script parse_script(std::string_view name) {
  for (std::size_t i = 0; i < script_count; ++i)
    if (script_name(script(i)) == name) return script(i);
  std::string valid;
  for (std::size_t i = 0; i < script_count; ++i) {
    if (i) valid.push_back(',');
    valid.append(script_name(script(i)));
  }
  throw input_error("unknown script '" + std::string(name) + "'; use a comma-separated list of: " + valid);
}

/// Parses "latin,han" into scripts (empty string: empty list).
inline std::vector<script> parse_scripts(std::string_view list) {
  std::vector<script> out;
  while (!list.empty()) {
    const auto comma = list.find(',');
    const auto item = list.substr(0, comma);
    if (!item.empty()) out.push_back(parse_script(item));
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return out;
}

/// The script of code point `cp`, judged by its block; meaningful for letters.
constexpr script script_of(std::int32_t cp) noexcept {
  struct range { std::int32_t lo, hi; script s; };
  constexpr range table[] = {
      {0x0041, 0x024F, script::latin},      {0x0250, 0x02AF, script::latin},   // Latin-1, Ext-A/B, IPA
      {0x0370, 0x03FF, script::greek},      {0x0400, 0x052F, script::cyrillic},
      {0x0530, 0x058F, script::armenian},   {0x0590, 0x05FF, script::hebrew},
      {0x0600, 0x06FF, script::arabic},     {0x0750, 0x077F, script::arabic},
      {0x08A0, 0x08FF, script::arabic},     {0x0900, 0x097F, script::devanagari},
      {0x0980, 0x09FF, script::bengali},    {0x0B80, 0x0BFF, script::tamil},
      {0x0E00, 0x0E7F, script::thai},       {0x10A0, 0x10FF, script::georgian},
      {0x1100, 0x11FF, script::hangul},     {0x1200, 0x139F, script::ethiopic},
      {0x1C80, 0x1C8F, script::cyrillic},   {0x1C90, 0x1CBF, script::georgian},
      {0x1D00, 0x1DBF, script::latin},      {0x1E00, 0x1EFF, script::latin},
      {0x1F00, 0x1FFF, script::greek},      {0x2C60, 0x2C7F, script::latin},
      {0x2D00, 0x2D2F, script::georgian},   {0x2DE0, 0x2DFF, script::cyrillic},
      {0x2E80, 0x2FDF, script::han},        {0x3005, 0x3007, script::han},
      {0x3021, 0x3029, script::han},        {0x3038, 0x303B, script::han},
      {0x3040, 0x309F, script::kana},       {0x30A0, 0x30FF, script::kana},
      {0x3130, 0x318F, script::hangul},     {0x31F0, 0x31FF, script::kana},
      {0x3400, 0x4DBF, script::han},        {0x4E00, 0x9FFF, script::han},
      {0xA640, 0xA69F, script::cyrillic},   {0xA720, 0xA7FF, script::latin},
      {0xAB30, 0xAB6F, script::latin},      {0xAC00, 0xD7AF, script::hangul},
      {0xF900, 0xFAFF, script::han},        {0xFB00, 0xFB06, script::latin},
      {0xFB1D, 0xFB4F, script::hebrew},     {0xFB50, 0xFDFF, script::arabic},
      {0xFE70, 0xFEFF, script::arabic},     {0xFF21, 0xFF5A, script::latin},
      {0xFF66, 0xFF9F, script::kana},       {0xFFA0, 0xFFDC, script::hangul},
      {0x1B000, 0x1B16F, script::kana},     {0x20000, 0x3134F, script::han},
  };
  for (const auto& r : table)
    if (cp >= r.lo && cp <= r.hi) return r.s;
  return script::other;
}

/// Letters per script in a document, and its length in code points.
struct script_profile {
  std::array<std::uint64_t, script_count> letters{};
  std::uint64_t total_letters = 0, code_points = 0;
};

/// Counts letters by script (ASCII letters are Latin) and code points (invalid bytes count as one).
inline script_profile profile_scripts(std::string_view doc) {
  script_profile p;
  const auto* s = reinterpret_cast<const utf8proc_uint8_t*>(doc.data());
  for (std::size_t i = 0; i < doc.size();) {
    ++p.code_points;
    if (s[i] < 0x80) {
      const unsigned char c = s[i++];
      if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') {
        ++p.letters[std::size_t(script::latin)];
        ++p.total_letters;
      }
      continue;
    }
    utf8proc_int32_t cp;
    const auto len = utf8proc_iterate(s + i, utf8proc_ssize_t(doc.size() - i), &cp);
    if (len <= 0) { ++i; continue; }
    i += std::size_t(len);
    const auto cat = utf8proc_category(cp);
    if (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) {
      ++p.letters[std::size_t(script_of(cp))];
      ++p.total_letters;
    }
  }
  return p;
}

/// Filter settings (prepare_data's --min-chars, --max-chars, --keep-scripts, --min-script-fraction).
struct filter_options {
  std::uint64_t min_chars = 1;          ///< shortest document kept, in code points
  std::uint64_t max_chars = 0;          ///< longest document kept (0: no limit)
  std::vector<script> keep_scripts{};   ///< empty: no script filter
  double min_script_fraction = 0.5;     ///< share of letters in kept scripts needed to pass
};

/// Counters: documents and bytes in / kept, and removals by reason.
struct filter_stats {
  std::uint64_t documents_in = 0, kept = 0, bytes_in = 0, bytes_kept = 0;
  std::uint64_t too_short = 0, too_long = 0, wrong_script = 0, no_letters = 0;
};

/// Why a document was removed (or `kept`).
enum class filter_reason : std::uint8_t { kept, too_short, too_long, wrong_script, no_letters };

/// Applies the length and script filters to one document; adds to `stats`.
/// Throws loom::input_error for contradictory options (min_chars > max_chars > 0, or a
/// fraction outside [0, 1]).
inline filter_reason filter(std::string_view doc, const filter_options& o, filter_stats& stats) {
  if (o.max_chars > 0 && o.min_chars > o.max_chars)
    throw input_error("filter: min_chars " + std::to_string(o.min_chars) + " > max_chars " +
                      std::to_string(o.max_chars) + "; raise --max-chars or lower --min-chars");
  if (!(o.min_script_fraction >= 0.0 && o.min_script_fraction <= 1.0))
    throw input_error("filter: min_script_fraction " + std::to_string(o.min_script_fraction) +
                      " is outside [0, 1]; e.g. 0.5");
  ++stats.documents_in;
  stats.bytes_in += doc.size();
  const script_profile p = profile_scripts(doc);
  filter_reason r = filter_reason::kept;
  if (p.code_points < o.min_chars) {
    r = filter_reason::too_short;
  } else if (o.max_chars > 0 && p.code_points > o.max_chars) {
    r = filter_reason::too_long;
  } else if (!o.keep_scripts.empty()) {
    if (p.total_letters == 0) {
      r = filter_reason::no_letters;
    } else {
      std::uint64_t kept_letters = 0;
      for (const script s : o.keep_scripts) kept_letters += p.letters[std::size_t(s)];
      if (double(kept_letters) < o.min_script_fraction * double(p.total_letters)) r = filter_reason::wrong_script;
    }
  }
  switch (r) {
    case filter_reason::kept: ++stats.kept; stats.bytes_kept += doc.size(); break;
    case filter_reason::too_short: ++stats.too_short; break;
    case filter_reason::too_long: ++stats.too_long; break;
    case filter_reason::wrong_script: ++stats.wrong_script; break;
    case filter_reason::no_letters: ++stats.no_letters; break;
  }
  return r;
}

}  // namespace loom::data::text
