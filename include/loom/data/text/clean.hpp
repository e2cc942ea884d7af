#pragma once
/// \file loom::data::text::clean — make one document of raw text safe to train on.
///
/// Rules, in the order they run (each can be switched off in clean_options):
///  1. UTF-8 repair. Byte sequences that are not well-formed UTF-8 (stray continuation bytes,
///     truncated sequences, overlong forms, surrogates, > U+10FFFF) are dropped, or with
///     invalid_utf8::replace become one U+FFFD per run. Every run is counted. A document whose
///     invalid bytes exceed max_invalid_fraction of its size is dropped whole (it is binary or
///     in a legacy encoding, and repairing it would produce garbage).
///  2. HTML remnants. Tags of known HTML elements (`<p class="x">`, `</div>`, `<br/>`),
///     comments `<!-- -->`, `<!DOCTYPE>`, and the contents of <script> and <style> are removed;
///     block-level tags become a line break, table cells a space. Entities `&amp;` `&lt;`
///     `&nbsp;` ... (a fixed table of the common ones) and numeric `&#39;` `&#x4e2d;` are
///     decoded. Text that only looks similar ("a < b", "<激楚>", "&c.") is left alone.
///  3. Invisible and control characters. Format characters (Unicode category Cf: zero-width
///     space U+200B, BOM U+FEFF, soft hyphen U+00AD, word joiner, bidi controls ...) are
///     removed, except ZWJ/ZWNJ between two non-ASCII characters of the result (emoji sequences,
///     Indic and Persian scripts need them; a neighbour removed or folded to ASCII does not
///     count). Control characters (Cc) other than \n and \t are removed; \r\n and lone \r
///     become \n; U+2028/U+2029 become \n. Private-use characters and noncharacters are removed.
///  4. Spaces and width. Unicode spaces (NBSP, en/em/thin spaces ...) become ' '.
///     Full-width ASCII letters and digits (U+FF10-FF19, U+FF21-FF3A, U+FF41-FF5A) become
///     ASCII (their compatibility decomposition; NFKC does the same). Full-width punctuation
///     (U+FF01-FF5E) and the ideographic space U+3000 become ASCII only when neither
///     neighbour is a wide (East Asian) character: "Hello，world！" -> "Hello,world!", while
///     "你好，世界！" keeps its `，！`. The neighbour is the nearest character that is not
///     whitespace, another such punctuation mark or a format character; a full-width letter or
///     digit counts as the ASCII character it becomes (not wide), so "ＧＰＴ－２" -> "GPT-2"
///     and cleaning cleaned text changes nothing (normalization version 2; version 1, what
///     prepare_data did before it recorded its normalization, skipped full-width letters and
///     digits like punctuation). Chinese punctuation outside that block (`。、“”「」《》`) is
///     never touched.
///  5. Canonical composition (NFC) of non-ASCII text, and trimming of ASCII whitespace at
///     the ends of the document. A document left empty is dropped.
///
/// Rules 1 (dropping invalid bytes), 3, 4 and 5's NFC are the text's *normalization*: its form,
/// not its content. normalize() applies exactly them, with the settings of a `normalization`
/// that prepare() records in the dataset's PREFIX.json and tokenizer::load() reads back, so
/// a prompt encoded at inference gets the form the training text had (see tokenizer.hpp).
/// Unicode properties (category, East Asian width, decomposition, NFC) come from utf8proc
/// (https://juliastrings.github.io/utf8proc/doc/); link with -lutf8proc.
///
/// Cost: O(n) in the document's bytes; one decoded copy (4 bytes per code point) per call.
#include <utf8proc.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/json.hpp>

namespace loom::data::text {

/// What to do with bytes that are not well-formed UTF-8.
enum class invalid_utf8 : std::uint8_t { drop, replace };

/// Switches for clean(); the defaults are what prepare_data uses.
struct clean_options {
  bool strip_html = true;          ///< rule 2
  bool remove_invisible = true;    ///< rule 3: Cf, private use, noncharacters
  bool remove_control = true;      ///< rule 3: Cc, CR
  bool normalize_spaces = true;    ///< rule 4: Unicode spaces -> ' '
  bool fold_width = true;          ///< rule 4: full-width ASCII forms
  bool nfc = true;                 ///< rule 5
  bool trim = true;                ///< rule 5
  invalid_utf8 on_invalid = invalid_utf8::drop;  ///< rule 1
  double max_invalid_fraction = 0.05;            ///< rule 1: drop the document above this
  int normalization_version = 2;   ///< rule 4's neighbour test: 2 (idempotent), or 1 (see the file comment)
};

/// The form text is brought into before it becomes token ids: rules 1 (invalid UTF-8 dropped),
/// 3, 4 and 5's NFC of clean(), with these switches. The default is what prepare_data applies
/// (name "loom-v2"); prepare() records it in PREFIX.json as "normalization" and
/// tokenizer::load() reads it back (see tokenizer.hpp for the defaults of older files).
struct normalization {
  int version = 2;                ///< rule 4's neighbour test (clean_options::normalization_version): 1 or 2
  bool remove_invisible = true;   ///< rule 3: Cf, private use, noncharacters
  bool remove_control = true;     ///< rule 3: Cc, CR
  bool normalize_spaces = true;   ///< rule 4: Unicode spaces -> ' '
  bool fold_width = true;         ///< rule 4: full-width ASCII forms
  bool nfc = true;                ///< rule 5: canonical composition

  /// Nothing changes the text (apart from dropping invalid UTF-8): a SentencePiece model with
  /// no recorded normalization.
  static normalization none() noexcept { return {2, false, false, false, false, false}; }
  /// What prepare_data applied before it recorded the field: every rule on, version 1.
  static normalization loom_v1() noexcept { return {1, true, true, true, true, true}; }
  /// "loom-v2" (the default), "loom-v1", "none", or "custom" for another combination.
  std::string name() const {
    if (*this == normalization{}) return "loom-v2";
    if (*this == loom_v1()) return "loom-v1";
    if (*this == none()) return "none";
    return "custom";
  }
  /// As recorded in PREFIX.json: {"name", "version", and the five switches}.
  nlohmann::json to_json() const {
    return {{"name", name()},
            {"version", version},
            {"remove_invisible", remove_invisible},
            {"remove_control", remove_control},
            {"normalize_spaces", normalize_spaces},
            {"fold_width", fold_width},
            {"nfc", nfc}};
  }
  /// Reads to_json()'s object; a missing switch is on, a missing version is 1. Throws
  /// loom::input_error (naming `where`) for a value of the wrong type or an unknown version.
  static normalization from_json(const nlohmann::json& j, const std::string& where);
  friend bool operator==(const normalization&, const normalization&) = default;
};

/// The rules of `n` as clean_options (HTML stripping and trimming off: they change content).
inline clean_options clean_options_of(const normalization& n) {
  clean_options o;
  o.strip_html = false;
  o.trim = false;
  o.remove_invisible = n.remove_invisible;
  o.remove_control = n.remove_control;
  o.normalize_spaces = n.normalize_spaces;
  o.fold_width = n.fold_width;
  o.nfc = n.nfc;
  o.normalization_version = n.version;
  return o;
}

/// The normalization part of clean_options `o` (what prepare() records for its documents).
inline normalization normalization_of(const clean_options& o) {
  return {o.normalization_version, o.remove_invisible, o.remove_control, o.normalize_spaces, o.fold_width, o.nfc};
}

/// Counters, accumulated (+=) by every clean() call that receives them.
struct clean_stats {
  std::uint64_t documents_in = 0, documents_out = 0;
  std::uint64_t dropped_empty = 0, dropped_invalid = 0;  ///< documents removed, by reason
  std::uint64_t bytes_in = 0, bytes_out = 0;
  std::uint64_t invalid_sequences = 0, invalid_bytes = 0;  ///< rule 1
  std::uint64_t html_tags = 0, html_entities = 0;          ///< rule 2
  std::uint64_t invisible = 0, control = 0, unusable = 0;  ///< rule 3 (unusable: private use, noncharacters)
  std::uint64_t spaces = 0, width_folded = 0;              ///< rule 4

  clean_stats& operator+=(const clean_stats& o) noexcept {
    documents_in += o.documents_in;   documents_out += o.documents_out;
    dropped_empty += o.dropped_empty; dropped_invalid += o.dropped_invalid;
    bytes_in += o.bytes_in;           bytes_out += o.bytes_out;
    invalid_sequences += o.invalid_sequences; invalid_bytes += o.invalid_bytes;
    html_tags += o.html_tags;         html_entities += o.html_entities;
    invisible += o.invisible;         control += o.control;   unusable += o.unusable;
    spaces += o.spaces;               width_folded += o.width_folded;
    return *this;
  }
};

namespace detail {

inline void append_utf8(std::string& out, std::int32_t cp) {
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(cp, buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<std::size_t>(n));
}

/// Rule 1: returns well-formed UTF-8; counts runs and bytes of invalid input.
inline std::string repair_utf8(std::string_view in, invalid_utf8 mode, clean_stats& st) {
  std::string out;
  out.reserve(in.size());
  const auto* s = reinterpret_cast<const utf8proc_uint8_t*>(in.data());
  const std::size_t n = in.size();
  std::size_t i = 0;
  bool in_bad_run = false;
  while (i < n) {
    std::size_t j = i;
    while (j < n && s[j] < 0x80) ++j;  // ASCII run
    if (j > i) {
      out.append(in.data() + i, j - i);
      i = j;
      in_bad_run = false;
      continue;
    }
    utf8proc_int32_t cp;
    const auto len = utf8proc_iterate(s + i, static_cast<utf8proc_ssize_t>(n - i), &cp);
    if (len > 0) {
      out.append(in.data() + i, static_cast<std::size_t>(len));
      i += static_cast<std::size_t>(len);
      in_bad_run = false;
    } else {
      ++st.invalid_bytes;
      if (!in_bad_run) {
        ++st.invalid_sequences;
        if (mode == invalid_utf8::replace) out += "\xEF\xBF\xBD";
      }
      in_bad_run = true;
      ++i;
    }
  }
  return out;
}

inline char ascii_lower(char c) noexcept { return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c; }
inline bool ascii_alpha(char c) noexcept { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
inline bool ascii_alnum(char c) noexcept { return ascii_alpha(c) || (c >= '0' && c <= '9'); }

inline bool starts_with_ci(std::string_view s, std::size_t at, std::string_view lower_word) noexcept {
  if (s.size() - at < lower_word.size()) return false;
  for (std::size_t k = 0; k < lower_word.size(); ++k)
    if (ascii_lower(s[at + k]) != lower_word[k]) return false;
  return true;
}

/// The first position >= from where `lower_word` starts, ignoring ASCII case, or npos. O(n * word).
inline std::size_t find_ci(std::string_view s, std::size_t from, std::string_view lower_word) noexcept {
  for (std::size_t m = from; m + lower_word.size() <= s.size(); ++m)
    if (s[m] == lower_word[0] && starts_with_ci(s, m, lower_word)) return m;
  return std::string_view::npos;
}

/// 0: not an HTML element name; 1: inline (removed); 2: block (line break); 3: cell (space).
inline int html_tag_kind(std::string_view name) noexcept {
  static constexpr std::array<std::string_view, 44> block = {
      "address", "article", "aside", "blockquote", "body", "br", "caption", "center", "dd", "details",
      "dialog", "div", "dl", "dt", "fieldset", "figcaption", "figure", "footer", "form", "frameset",
      "h1", "h2", "h3", "h4", "h5", "h6", "head", "header", "hr", "html", "li", "main", "nav", "ol",
      "p", "pre", "section", "summary", "table", "tbody", "tfoot", "thead", "title", "tr"};
  static constexpr std::array<std::string_view, 2> cell = {"td", "th"};
  static constexpr std::array<std::string_view, 72> inline_tags = {
      "a", "abbr", "area", "audio", "b", "base", "bdi", "bdo", "big", "button", "canvas", "cite", "code",
      "col", "colgroup", "data", "datalist", "del", "dfn", "em", "embed", "font", "frame", "i", "iframe",
      "img", "input", "ins", "kbd", "label", "legend", "link", "map", "mark", "meta", "meter", "noscript",
      "object", "optgroup", "option", "output", "param", "picture", "progress", "q", "rp", "rt", "ruby",
      "s", "samp", "script", "select", "small", "source", "span", "strike", "strong", "style", "sub",
      "sup", "svg", "template", "textarea", "time", "track", "tt", "u", "ul", "var", "video", "wbr",
      "nobr"};
  for (auto t : block) if (t == name) return 2;
  for (auto t : cell) if (t == name) return 3;
  for (auto t : inline_tags) if (t == name) return 1;
  return 0;
}

/// Position just past the '>' closing a tag that starts at `from` (quotes respected), or npos
/// if there is none within 2048 bytes or a '<' comes first.
inline std::size_t tag_end(std::string_view s, std::size_t from) noexcept {
  char quote = 0;
  const std::size_t limit = std::min(s.size(), from + 2048);
  for (std::size_t k = from; k < limit; ++k) {
    const char c = s[k];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '>') {
      return k + 1;
    } else if (c == '<') {
      return std::string_view::npos;
    }
  }
  return std::string_view::npos;
}

inline std::int32_t named_entity(std::string_view name) noexcept {
  struct entry { std::string_view name; std::int32_t cp; };
  static constexpr entry table[] = {
      {"amp", '&'}, {"lt", '<'}, {"gt", '>'}, {"quot", '"'}, {"apos", '\''}, {"nbsp", 0xA0},
      {"ensp", 0x2002}, {"emsp", 0x2003}, {"thinsp", 0x2009}, {"zwsp", 0x200B}, {"zwnj", 0x200C},
      {"zwj", 0x200D}, {"shy", 0xAD}, {"ndash", 0x2013}, {"mdash", 0x2014}, {"lsquo", 0x2018},
      {"rsquo", 0x2019}, {"sbquo", 0x201A}, {"ldquo", 0x201C}, {"rdquo", 0x201D}, {"bdquo", 0x201E},
      {"hellip", 0x2026}, {"middot", 0xB7}, {"bull", 0x2022}, {"copy", 0xA9}, {"reg", 0xAE},
      {"trade", 0x2122}, {"deg", 0xB0}, {"plusmn", 0xB1}, {"times", 0xD7}, {"divide", 0xF7},
      {"laquo", 0xAB}, {"raquo", 0xBB}, {"euro", 0x20AC}, {"pound", 0xA3}, {"yen", 0xA5},
      {"cent", 0xA2}, {"sect", 0xA7}, {"para", 0xB6}, {"iexcl", 0xA1}, {"iquest", 0xBF}};
  for (const auto& e : table) if (e.name == name) return e.cp;
  return -1;
}

/// Decodes an entity at s[at] == '&'. Returns the code point and sets `len`, or -1.
inline std::int32_t parse_entity(std::string_view s, std::size_t at, std::size_t& len) noexcept {
  std::size_t k = at + 1;
  if (k < s.size() && s[k] == '#') {
    ++k;
    const bool hex = k < s.size() && (s[k] == 'x' || s[k] == 'X');
    if (hex) ++k;
    const std::size_t d0 = k;
    std::int64_t v = 0;
    while (k < s.size() && k - d0 < 8) {
      const char c = s[k];
      int digit = -1;
      if (c >= '0' && c <= '9') digit = c - '0';
      else if (hex && c >= 'a' && c <= 'f') digit = c - 'a' + 10;
      else if (hex && c >= 'A' && c <= 'F') digit = c - 'A' + 10;
      if (digit < 0) break;
      v = v * (hex ? 16 : 10) + digit;
      ++k;
    }
    if (k == d0 || k >= s.size() || s[k] != ';') return -1;
    if (v <= 0 || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return -1;
    len = k + 1 - at;
    return static_cast<std::int32_t>(v);
  }
  const std::size_t n0 = k;
  while (k < s.size() && k - n0 < 10 && ascii_alnum(s[k])) ++k;
  if (k == n0 || k >= s.size() || s[k] != ';') return -1;
  const std::int32_t cp = named_entity(s.substr(n0, k - n0));
  if (cp < 0) return -1;
  len = k + 1 - at;
  return cp;
}

/// Rule 2 on well-formed UTF-8 (all markup is ASCII, so a byte scan is exact).
inline std::string strip_html(std::string_view s, clean_stats& st) {
  std::string out;
  out.reserve(s.size());
  auto line_break = [&] {
    if (!(out.size() >= 2 && out[out.size() - 1] == '\n' && out[out.size() - 2] == '\n')) out.push_back('\n');
  };
  std::size_t i = 0;
  const std::size_t n = s.size();
  // The first "</script", "</style" and "-->" at or after the position of the last search for
  // it: i only grows, so a cached hit at or after the new start is still the first one, and a
  // miss stays a miss. Without this, many unclosed <script> tags or "<!--" would each rescan the
  // rest of the document (quadratic time on a long line).
  constexpr std::size_t unsearched = std::string_view::npos - 1;
  std::size_t next_end[3] = {unsearched, unsearched, unsearched};
  while (i < n) {
    const char c = s[i];
    if (c == '<') {
      if (starts_with_ci(s, i, "<!--")) {
        std::size_t& e = next_end[2];
        if (e == unsearched || (e != std::string_view::npos && e < i + 4)) e = s.find("-->", i + 4);
        if (e != std::string_view::npos) {
          ++st.html_tags;
          i = e + 3;
          continue;
        }
      } else if (starts_with_ci(s, i, "<!doctype") || starts_with_ci(s, i, "<![cdata[")) {
        const auto e = tag_end(s, i + 2);
        if (e != std::string_view::npos) {
          ++st.html_tags;
          i = e;
          continue;
        }
      } else {
        std::size_t k = i + 1;
        const bool closing = k < n && s[k] == '/';
        if (closing) ++k;
        std::string name;
        while (k < n && name.size() < 12 && ascii_alnum(s[k])) name.push_back(ascii_lower(s[k++]));
        const bool delimited = k < n && (s[k] == '>' || s[k] == '/' || s[k] == ' ' || s[k] == '\t' ||
                                         s[k] == '\n' || s[k] == '\r');
        const int kind = (!name.empty() && ascii_alpha(name[0]) && delimited) ? html_tag_kind(name) : 0;
        const std::size_t e = kind ? tag_end(s, k) : std::string_view::npos;
        if (e != std::string_view::npos) {
          ++st.html_tags;
          i = e;
          const bool self_closing = s[e - 2] == '/';
          if (!closing && !self_closing && (name == "script" || name == "style")) {
            // Drop everything up to and including the matching end tag (if any).
            const std::string end_tag = "</" + name;
            std::size_t& m = next_end[name == "style"];
            if (m == unsearched || (m != std::string_view::npos && m < i)) m = find_ci(s, i, end_tag);
            if (m != std::string_view::npos) {
              const auto e2 = tag_end(s, m + end_tag.size());
              if (e2 != std::string_view::npos) {
                ++st.html_tags;
                i = e2;
              }
            }
          }
          if (kind == 2) line_break();
          else if (kind == 3) out.push_back(' ');
          continue;
        }
      }
    } else if (c == '&') {
      std::size_t len = 0;
      const std::int32_t cp = parse_entity(s, i, len);
      if (cp >= 0) {
        ++st.html_entities;
        append_utf8(out, cp);
        i += len;
        continue;
      }
    }
    out.push_back(c);
    ++i;
  }
  return out;
}

inline bool is_fullwidth_ascii(std::int32_t cp) noexcept { return cp >= 0xFF01 && cp <= 0xFF5E; }
inline bool is_fullwidth_alnum(std::int32_t cp) noexcept {
  return (cp >= 0xFF10 && cp <= 0xFF19) || (cp >= 0xFF21 && cp <= 0xFF3A) || (cp >= 0xFF41 && cp <= 0xFF5A);
}
/// Characters that say nothing about the width of their surroundings: whitespace, the
/// full-width forms being decided (version 2: punctuation only; full-width letters and digits
/// count as the ASCII they become), format characters, and quotes/dashes/dots used in both
/// Chinese and English text (East Asian Width "ambiguous").
inline bool width_neutral(std::int32_t cp, int version) noexcept {
  if (cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r' || cp == 0x3000) return true;
  if (is_fullwidth_ascii(cp)) return version < 2 || !is_fullwidth_alnum(cp);
  switch (cp) {
    case 0x2018: case 0x2019: case 0x201C: case 0x201D: case 0x2014: case 0x2026: case 0xB7: return true;
    default: break;
  }
  if (cp < 0x80) return false;
  const auto cat = utf8proc_category(cp);
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_CF;
}
/// Is the nearest non-neutral character in direction `step` (+1/-1) from position i wide?
inline bool wide_neighbour(const std::vector<std::int32_t>& cps, std::size_t i, int step, int version) noexcept {
  std::size_t k = i;
  for (int walked = 0; walked < 64; ++walked) {
    if (step < 0 ? k == 0 : k + 1 >= cps.size()) return false;
    k = step < 0 ? k - 1 : k + 1;
    if (!width_neutral(cps[k], version))
      return cps[k] >= 0x80 && !is_fullwidth_alnum(cps[k]) && utf8proc_charwidth(cps[k]) == 2;
  }
  return false;
}
inline std::int32_t compat_ascii(std::int32_t cp) noexcept {  // U+FF01..FF5E -> U+0021..007E
  utf8proc_int32_t out[4];
  int last = 0;
  const auto n = utf8proc_decompose_char(cp, out, 4, utf8proc_option_t(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT), &last);
  return (n == 1 && out[0] < 0x80) ? out[0] : cp;
}
inline bool is_noncharacter(std::int32_t cp) noexcept {
  return (cp >= 0xFDD0 && cp <= 0xFDEF) || (cp & 0xFFFE) == 0xFFFE;
}

/// Rules 3 and 4 on well-formed UTF-8.
inline std::string clean_code_points(std::string_view s, const clean_options& o, clean_stats& st) {
  std::vector<std::int32_t> cps;
  cps.reserve(s.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  for (std::size_t i = 0; i < s.size();) {
    if (p[i] < 0x80) {
      cps.push_back(p[i++]);
      continue;
    }
    utf8proc_int32_t cp;
    const auto len = utf8proc_iterate(p + i, static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (len <= 0) { ++i; continue; }  // cannot happen after repair_utf8
    cps.push_back(cp);
    i += static_cast<std::size_t>(len);
  }
  const int v = o.normalization_version;
  std::string out;
  out.reserve(s.size());
  std::int32_t prev_out = 0;
  // ZWJ/ZWNJ stay only between two non-ASCII characters of the *output*: a joiner run after a
  // non-ASCII character is appended tentatively and cut again when the next character emitted
  // is ASCII (also one folded to ASCII) or nothing follows. Judging by the input instead (the
  // next code point, perhaps removed or folded) left joiners a second pass removes.
  std::size_t joiners_at = std::string::npos;  // out.size() before the tentative joiner run
  std::uint64_t joiners = 0;
  auto settle_joiners = [&](bool keep) {
    if (joiners_at == std::string::npos) return;
    if (!keep) {
      out.resize(joiners_at);
      st.invisible += joiners;
    }
    joiners_at = std::string::npos;
    joiners = 0;
  };
  auto emit = [&](std::int32_t cp) {
    settle_joiners(cp >= 0x80);
    if (cp < 0x80) out.push_back(static_cast<char>(cp));
    else append_utf8(out, cp);
    prev_out = cp;
  };
  for (std::size_t i = 0; i < cps.size(); ++i) {
    const std::int32_t cp = cps[i];
    if (cp < 0x80) {
      if (cp >= 0x20 && cp != 0x7F) { emit(cp); continue; }
      if (cp == '\n' || cp == '\t' || !o.remove_control) { emit(cp); continue; }
      ++st.control;
      if (cp == '\r' && !(i + 1 < cps.size() && cps[i + 1] == '\n')) emit('\n');
      continue;
    }
    const auto cat = utf8proc_category(cp);
    if (cat == UTF8PROC_CATEGORY_CC) {
      if (o.remove_control) { ++st.control; continue; }
    } else if (cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP) {
      if (o.remove_control) { ++st.control; emit('\n'); continue; }
    } else if (cat == UTF8PROC_CATEGORY_CF) {
      if (o.remove_invisible) {
        const bool joiner = cp == 0x200C || cp == 0x200D;
        if (!joiner || prev_out < 0x80) { ++st.invisible; continue; }
        if (joiners_at == std::string::npos) joiners_at = out.size();
        ++joiners;
        append_utf8(out, cp);  // tentatively: settled by the next emit() or the end
        prev_out = cp;
        continue;
      }
    } else if (cat == UTF8PROC_CATEGORY_CO || is_noncharacter(cp)) {
      if (o.remove_invisible) { ++st.unusable; continue; }
    } else if (cp == 0x3000) {
      if (o.fold_width && !wide_neighbour(cps, i, -1, v) && !wide_neighbour(cps, i, +1, v)) {
        ++st.width_folded;
        emit(' ');
        continue;
      }
    } else if (cat == UTF8PROC_CATEGORY_ZS) {
      if (o.normalize_spaces) { ++st.spaces; emit(' '); continue; }
    } else if (is_fullwidth_ascii(cp) && o.fold_width) {
      if (is_fullwidth_alnum(cp) || (!wide_neighbour(cps, i, -1, v) && !wide_neighbour(cps, i, +1, v))) {
        ++st.width_folded;
        emit(compat_ascii(cp));
        continue;
      }
    }
    emit(cp);
  }
  settle_joiners(false);  // a joiner at the end has no non-ASCII character after it
  return out;
}

inline bool all_ascii(std::string_view s) noexcept {
  for (unsigned char c : s) if (c >= 0x80) return false;
  return true;
}

/// Rule 5a: NFC through utf8proc (returns the input unchanged for ASCII).
inline std::string nfc(std::string s) {
  if (all_ascii(s)) return s;
  utf8proc_uint8_t* mapped = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              static_cast<utf8proc_ssize_t>(s.size()), &mapped,
                              utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return s;  // cannot happen on well-formed input
  std::string out(reinterpret_cast<const char*>(mapped), static_cast<std::size_t>(n));
  std::free(mapped);
  return out;
}

/// Rules 3, 4 and 5's NFC on well-formed UTF-8: the part of clean() that normalize() shares.
inline std::string normalize_form(std::string_view s, const clean_options& o, clean_stats& st) {
  std::string out = clean_code_points(s, o, st);
  if (o.nfc) out = nfc(std::move(out));
  return out;
}

}  // namespace detail

inline normalization normalization::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object())
    throw input_error(where + ": \"normalization\" is not an object; prepare the data again with prepare_data");
  normalization n;
  n.version = 1;
  if (j.contains("version")) {
    const auto v = json_integer<int>(j["version"]);  // range-checked: 4294967297 must not read as 1
    if (!v || (*v != 1 && *v != 2))
      throw input_error(where + ": \"normalization\".version " + j["version"].dump() +
                        " is not 1 or 2 (written by a newer loom?); use a loom that knows it, or prepare the data again");
    n.version = *v;
  }
  auto flag = [&](const char* key, bool& out) {
    if (!j.contains(key)) return;
    if (!j[key].is_boolean())
      throw input_error(where + ": \"normalization\"." + key + " is not true/false; prepare the data again with prepare_data");
    out = j[key].get<bool>();
  };
  flag("remove_invisible", n.remove_invisible);
  flag("remove_control", n.remove_control);
  flag("normalize_spaces", n.normalize_spaces);
  flag("fold_width", n.fold_width);
  flag("nfc", n.nfc);
  return n;
}

/// `text` in the form `n` describes: invalid UTF-8 dropped, then rules 3, 4 and 5's NFC of
/// clean() with n's switches — the same code clean() runs, without HTML stripping or trimming,
/// so normalize(x) == clean(x) for a document without HTML or surrounding whitespace. Version 2
/// is idempotent: normalize(normalize(x)) == normalize(x). Apply it wherever text becomes ids
/// (tokenizer::encode does, with the tokenizer's normalization). Never throws on any bytes
/// (std::bad_alloc aside). Cost: O(n) in the bytes of `text`.
inline std::string normalize(std::string_view text, const normalization& n = {}) {
  clean_stats st;
  return detail::normalize_form(detail::repair_utf8(text, invalid_utf8::drop, st), clean_options_of(n), st);
}

/// Cleans one document by the rules in the file comment. Returns the cleaned text, or
/// std::nullopt when the document is dropped (empty after cleaning, or too much invalid
/// UTF-8). Adds to `stats` (+=). Never throws on any input bytes (std::bad_alloc aside).
inline std::optional<std::string> clean(std::string_view document, const clean_options& options,
                                        clean_stats& stats) {
  clean_stats st;
  st.documents_in = 1;
  st.bytes_in = document.size();
  std::string s = detail::repair_utf8(document, options.on_invalid, st);
  std::optional<std::string> result;
  if (!document.empty() && double(st.invalid_bytes) > options.max_invalid_fraction * double(document.size())) {
    st.dropped_invalid = 1;
  } else {
    if (options.strip_html && (s.find('<') != std::string::npos || s.find('&') != std::string::npos))
      s = detail::strip_html(s, st);
    s = detail::normalize_form(s, options, st);
    if (options.trim) {
      const auto first = s.find_first_not_of(" \t\n");
      if (first == std::string::npos) s.clear();
      else s = s.substr(first, s.find_last_not_of(" \t\n") - first + 1);
    }
    if (s.empty()) {
      st.dropped_empty = 1;
    } else {
      st.documents_out = 1;
      st.bytes_out = s.size();
      result = std::move(s);
    }
  }
  stats += st;
  return result;
}

/// clean() with default options, for one-off use.
inline std::optional<std::string> clean(std::string_view document) {
  clean_stats st;
  return clean(document, clean_options{}, st);
}

}  // namespace loom::data::text
