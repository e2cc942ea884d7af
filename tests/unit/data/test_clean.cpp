// Text cleaning: every rule on small hand-made inputs (mixed Chinese/English, HTML remnants,
// invisible characters, invalid UTF-8), and the two real corpora pass through unharmed.
#include "paths.hpp"
#ifdef LOOM_TEST_TEXT
#include <doctest/doctest.h>

#include <utf8proc.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <loom/data/text/clean.hpp>

using namespace loom::data::text;

namespace {
std::string cleaned(std::string_view in, clean_stats& st, const clean_options& o = {}) {
  auto r = clean(in, o, st);
  REQUIRE(r.has_value());
  return *r;
}
std::string cleaned(std::string_view in) {
  clean_stats st;
  return cleaned(in, st);
}
bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  for (std::size_t i = 0; i < s.size();) {
    utf8proc_int32_t cp;
    const auto n = utf8proc_iterate(p + i, utf8proc_ssize_t(s.size() - i), &cp);
    if (n <= 0) return false;
    i += std::size_t(n);
  }
  return true;
}
// Documents of a corpus: paragraphs separated by blank lines (as prepare_data --split blank-line).
std::vector<std::string> paragraphs(const std::string& text) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < text.size()) {
    auto e = text.find("\n\n", at);
    if (e == std::string::npos) e = text.size();
    out.push_back(text.substr(at, e - at));
    at = e + 2;
  }
  return out;
}
std::string trim(const std::string& s) {
  const auto a = s.find_first_not_of(" \t\n");
  if (a == std::string::npos) return {};
  return s.substr(a, s.find_last_not_of(" \t\n") - a + 1);
}
}  // namespace

TEST_CASE("clean: HTML tags, comments, script/style and entities") {
  clean_stats st;
  CHECK(cleaned("<p>Hello <b>world</b></p><br/>Next&nbsp;line &amp; more &#x4e2d;&#25991;", st) ==
        "Hello world\n\nNext line & more 中文");
  CHECK(st.html_tags == 5);
  CHECK(st.html_entities == 4);
  CHECK(cleaned("a<script type=\"text/javascript\">var s = '<p>';</script>b<STYLE>p { x: 1 }</STYLE>c") == "abc");
  CHECK(cleaned("x<!-- hidden <b> -->y<!DOCTYPE html>z") == "xyz");
  CHECK(cleaned("<a href=\"https://x.org/?a=1&b=2\" title='a > b'>link</a> text") == "link text");
  CHECK(cleaned("<table><tr><td>1</td><td>2</td></tr></table>") == "1  2");
  CHECK(cleaned("&lt;p&gt; is a tag") == "<p> is a tag");  // decoded once, not re-parsed
  // Look-alikes are kept.
  CHECK(cleaned("if a < b and c > d") == "if a < b and c > d");
  CHECK(cleaned("發<激楚>些") == "發<激楚>些");
  CHECK(cleaned("Wives, sisters, &c. AT&T &unknown; &#xD800; &#0; 5 &lt 6") ==
        "Wives, sisters, &c. AT&T &unknown; &#xD800; &#0; 5 &lt 6");
  CHECK(cleaned("<notatag> <p") == "<notatag> <p");
  clean_options no_html;
  no_html.strip_html = false;
  CHECK(cleaned("<b>x</b>", st, no_html) == "<b>x</b>");
}

TEST_CASE("clean: invisible and control characters") {
  clean_stats st;
  CHECK(cleaned("\xEF\xBB\xBFzero\u200Bwidth\u2060text soft\u00ADhyphen\u200E", st) == "zerowidthtext softhyphen");
  CHECK(st.invisible == 5);
  CHECK(cleaned("\U0001F468\u200D\U0001F469 family") == "\U0001F468\u200D\U0001F469 family");  // ZWJ in emoji kept
  CHECK(cleaned("a\u200Db") == "ab");                                                              // ZWJ in ASCII dropped
  clean_stats cs;
  CHECK(cleaned(std::string("a\0b\x07" "c\r\nd\re\x1b" "f\x7Fg\u0085h", 17), cs) == "abc\nd\nefgh");
  CHECK(cs.control == 7);
  CHECK(cleaned("line\u2028next\u2029para") == "line\nnext\npara");
  clean_stats us;
  CHECK(cleaned("a\uE031b\uFDD0c\U0010FFFFd", us) == "abcd");  // private use, noncharacters
  CHECK(us.unusable == 3);
  CHECK(cleaned("tab\there") == "tab\there");
}

TEST_CASE("clean: full-width ASCII repaired in half-width text, CJK punctuation kept") {
  CHECK(cleaned("Ｈｅｌｌｏ，ｗｏｒｌｄ！ １２３") == "Hello,world! 123");
  CHECK(cleaned("Price：１００ dollars（ＵＳＤ）") == "Price:100 dollars(USD)");
  CHECK(cleaned("我用ＡＰＩ和Ｐｙｔｈｏｎ３写程序，很好！") == "我用API和Python3写程序，很好！");
  CHECK(cleaned("你好，世界！“學而時習之，不亦說乎？”") == "你好，世界！“學而時習之，不亦說乎？”");
  CHECK(cleaned("子曰：“君子不器。”（論語）") == "子曰：“君子不器。”（論語）");
  CHECK(cleaned("mixed 中文，English，text") == "mixed 中文，English,text");  // comma beside 文 kept
  CHECK(cleaned("你好　世界") == "你好　世界");   // ideographic space between Han: kept
  CHECK(cleaned("hello　world") == "hello world");  // in Latin text: a space
  CHECK(cleaned("a\u00A0b\u2009c\u202Fd") == "a b c d");
  CHECK(cleaned("ｶﾀｶﾅ") == "ｶﾀｶﾅ");  // half-width katakana is not ours to change
  clean_options keep;
  keep.fold_width = false;
  clean_stats st;
  CHECK(cleaned("Ｈｅｌｌｏ", st, keep) == "Ｈｅｌｌｏ");
}

TEST_CASE("clean: invalid UTF-8 is dropped or replaced, counted, never passed on") {
  clean_stats st;
  CHECK(cleaned("ok\xFFgo\xC3(more text to keep the invalid fraction low)", st) ==
        "okgo(more text to keep the invalid fraction low)");
  CHECK(st.invalid_sequences == 2);
  CHECK(st.invalid_bytes == 2);
  clean_stats ov;  // overlong '/', a surrogate, a truncated sequence at the end
  clean_options tolerant;
  tolerant.max_invalid_fraction = 1.0;
  CHECK(cleaned("a\xC0\xAF" "b\xED\xA0\x80" "c\xE4\xB8", ov, tolerant) == "abc");
  CHECK(ov.invalid_sequences == 3);
  CHECK(ov.invalid_bytes == 7);
  clean_options rep;
  rep.on_invalid = invalid_utf8::replace;
  rep.max_invalid_fraction = 1.0;
  clean_stats rs;
  CHECK(cleaned("ok\xFF\xFEgo", rs, rep) == "ok\uFFFDgo");  // one U+FFFD per run
  // Mostly garbage: the whole document goes.
  clean_stats gs;
  CHECK_FALSE(clean("\xFF\xFE\xFD\xFC abc", clean_options{}, gs).has_value());
  CHECK(gs.dropped_invalid == 1);
  // Random bytes: output is always well-formed UTF-8.
  std::mt19937 rng(5);
  clean_options lenient;
  lenient.max_invalid_fraction = 1.0;
  for (int t = 0; t < 500; ++t) {
    std::string s(rng() % 64, '\0');
    for (auto& c : s) c = char(rng() % 4 == 0 ? rng() % 128 : rng());
    clean_stats fs;
    const auto r = clean(s, lenient, fs);
    if (r) CHECK(valid_utf8(*r));
  }
}

TEST_CASE("clean: empty documents, NFC, statistics") {
  clean_stats st;
  CHECK_FALSE(clean("", clean_options{}, st).has_value());
  CHECK_FALSE(clean(" \n\t\u200B\uFEFF \n", clean_options{}, st).has_value());
  CHECK(st.dropped_empty == 2);
  CHECK(st.documents_in == 2);
  CHECK(st.documents_out == 0);
  CHECK(cleaned("Cafe\u0301") == "Caf\u00E9");  // canonical composition
  clean_stats s2;
  cleaned("  padded  \n", s2);
  CHECK(s2.bytes_in == 11);
  CHECK(s2.bytes_out == 6);
}

TEST_CASE("clean: the real corpora pass through unchanged (except one private-use character)") {
  for (const char* name : {"tinyshakespeare.txt", "zh_classics.txt"}) {
    const std::string text = loom_test::read_file(loom_test::data_dir() / name);
    REQUIRE_MESSAGE(text.size() > 100000, "corpus missing: " << (loom_test::data_dir() / name));
    clean_stats st;
    std::size_t changed = 0;
    for (const auto& doc : paragraphs(text)) {
      const auto r = clean(doc, clean_options{}, st);
      std::string want = trim(doc);
      if (auto p = want.find("\uE031"); p != std::string::npos) want.erase(p, 3);  // zh: one PUA glyph
      if (!r) {
        CHECK(want.empty());
        continue;
      }
      if (*r != want) ++changed;
    }
    INFO(name);
    CHECK(changed == 0);
    CHECK(st.invalid_bytes == 0);
    CHECK(st.html_tags == 0);
    CHECK(st.width_folded == 0);  // zh_classics' full-width punctuation is all beside Han
    CHECK(st.unusable == (std::string(name) == "zh_classics.txt" ? 1u : 0u));
  }
}

#endif  // LOOM_TEST_TEXT
