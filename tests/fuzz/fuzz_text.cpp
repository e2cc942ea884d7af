// libFuzzer target for text cleaning, filtering and deduplication on arbitrary bytes
// (data::text::clean, normalize, filter, parse_scripts, deduplicator): invalid UTF-8, overlong
// forms, encoded surrogates, code points above U+10FFFF, HTML remnants, long lines.
//
// Input: byte 0 = clean_options switches (bit 0 strip_html, 1 remove_invisible, 2 remove_control,
// 3 normalize_spaces, 4 fold_width, 5 nfc, 6 trim, 7 on_invalid = replace); byte 1 = bit 0
// normalization version (1 or 2), bits 1-3 the shingle size - 1, bits 4-7 the kept script;
// the rest is the document.
// What must hold: no input bytes make these throw or crash; clean() and normalize() return
// well-formed UTF-8 (no surrogate, nothing above U+10FFFF, no overlong form); normalize()
// under version 2 is idempotent, as clean.hpp documents; a document's exact repeat is an
// exact duplicate — and no undefined behaviour or leak (ASan + UBSan, tests/fuzz/run.sh text).
#include <utf8proc.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <loom/core/error.hpp>
#include <loom/data/text/clean.hpp>
#include <loom/data/text/dedup.hpp>
#include <loom/data/text/filter.hpp>

#include "fuzz_common.hpp"

namespace {

namespace text = loom::data::text;

// Well-formed UTF-8: utf8proc_iterate decodes every code point (it rejects overlong forms,
// surrogates and values above U+10FFFF).
bool well_formed(std::string_view s) {
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  for (std::size_t i = 0; i < s.size();) {
    utf8proc_int32_t cp;
    const auto len = utf8proc_iterate(p + i, utf8proc_ssize_t(s.size() - i), &cp);
    if (len <= 0) return false;
    i += std::size_t(len);
  }
  return true;
}

text::clean_options options_of(std::uint8_t a, std::uint8_t b) {
  text::clean_options o;
  o.strip_html = a & 1;
  o.remove_invisible = a & 2;
  o.remove_control = a & 4;
  o.normalize_spaces = a & 8;
  o.fold_width = a & 16;
  o.nfc = a & 32;
  o.trim = a & 64;
  o.on_invalid = (a & 128) ? text::invalid_utf8::replace : text::invalid_utf8::drop;
  o.normalization_version = (b & 1) ? 1 : 2;
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::string_view doc(reinterpret_cast<const char*>(data + 2), size - 2);
  const text::clean_options o = options_of(data[0], data[1]);
  try {
    text::clean_stats st;
    const auto cleaned = text::clean(doc, o, st);
    loom_fuzz::require(!cleaned || well_formed(*cleaned), "clean() returned malformed UTF-8");
    loom_fuzz::require(st.documents_in == 1 && st.documents_out == (cleaned ? 1u : 0u), "clean() miscounted");

    const text::normalization n = text::normalization_of(o);
    const std::string once = text::normalize(doc, n);
    loom_fuzz::require(well_formed(once), "normalize() returned malformed UTF-8");
    if (n.version == 2)
      loom_fuzz::require(text::normalize(once, n) == once, "normalize() under version 2 is not idempotent");

    text::filter_options fo;
    fo.keep_scripts = {text::script(std::size_t(data[1] >> 4) % text::script_count)};
    text::filter_stats fs;
    (void)text::filter(doc, fo, fs);
    loom_fuzz::require(text::profile_scripts(doc).code_points <= doc.size(), "more code points than bytes");
    try {
      (void)text::parse_scripts(doc);
    } catch (const loom::input_error& e) {
      loom_fuzz::rejected(e);  // not a list of script names
    }

    text::dedup_options dopt;
    dopt.shingle = 1 + ((data[1] >> 1) & 7);
    dopt.permutations = 16;
    dopt.threads = 1;
    text::deduplicator dd(dopt);
    const auto first = dd.insert(doc);
    loom_fuzz::require(first == text::deduplicator::verdict::keep, "the first document was not kept");
    const auto again = dd.insert(doc);
    loom_fuzz::require(doc.empty() ? again == text::deduplicator::verdict::keep
                                   : again == text::deduplicator::verdict::exact_duplicate,
                       "an exact repeat was not an exact duplicate");
    (void)dd.insert(doc.substr(0, doc.size() / 2));
    if (cleaned) (void)dd.insert(*cleaned);
    loom_fuzz::accepted("document");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom fuzz: text functions threw on input bytes: %s\n", e.what());
    std::abort();  // documented never to throw on any input bytes
  }
  return 0;
}
