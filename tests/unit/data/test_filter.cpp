// Filters: length in code points, script identification and the keep-scripts rule.
#include "paths.hpp"
#ifdef LOOM_TEST_TEXT
#include <doctest/doctest.h>

#include <string>

#include <loom/data/text/filter.hpp>

using namespace loom::data::text;

TEST_CASE("filter: script of a code point and letter profiles") {
  CHECK(script_of('a') == script::latin);
  CHECK(script_of(0xE9) == script::latin);    // é
  CHECK(script_of(0x4E2D) == script::han);    // 中
  CHECK(script_of(0x20000) == script::han);   // CJK Extension B
  CHECK(script_of(0x3042) == script::kana);   // あ
  CHECK(script_of(0xD55C) == script::hangul); // 한
  CHECK(script_of(0x0416) == script::cyrillic);
  CHECK(script_of(0x05D0) == script::hebrew);
  CHECK(script_of(0x0627) == script::arabic);
  CHECK(script_of(0x0E01) == script::thai);
  const auto p = profile_scripts("子曰：“Hello, 世界！” 123 Жж");
  CHECK(p.letters[std::size_t(script::han)] == 4);
  CHECK(p.letters[std::size_t(script::latin)] == 5);
  CHECK(p.letters[std::size_t(script::cyrillic)] == 2);
  CHECK(p.total_letters == 11);
  CHECK(p.code_points == 22);
}

TEST_CASE("filter: parse script lists") {
  CHECK(parse_scripts("latin,han") == std::vector<script>{script::latin, script::han});
  CHECK(parse_scripts("").empty());
  CHECK_THROWS_WITH_AS(parse_scripts("latin,klingon"), doctest::Contains("unknown script 'klingon'"),
                       loom::input_error);
}

TEST_CASE("filter: length and script rules") {
  filter_options o;
  o.min_chars = 5;
  o.max_chars = 40;
  o.keep_scripts = {script::latin, script::han};
  filter_stats st;
  CHECK(filter("abc", o, st) == filter_reason::too_short);
  CHECK(filter("中文四字", o, st) == filter_reason::too_short);  // 4 code points, 12 bytes
  CHECK(filter(std::string(41, 'x'), o, st) == filter_reason::too_long);
  CHECK(filter("Hello world", o, st) == filter_reason::kept);
  CHECK(filter("學而時習之，不亦說乎？", o, st) == filter_reason::kept);
  CHECK(filter("我用Python写程序", o, st) == filter_reason::kept);
  CHECK(filter("Привет, как дела?", o, st) == filter_reason::wrong_script);
  CHECK(filter("12345 67890 !!!", o, st) == filter_reason::no_letters);
  CHECK(filter("Привет world, hi", o, st) == filter_reason::kept);  // 7 Latin of 13 letters >= 0.5
  CHECK(st.documents_in == 9);
  CHECK(st.kept == 4);
  CHECK(st.too_short == 2);
  CHECK(st.too_long == 1);
  CHECK(st.wrong_script == 1);
  CHECK(st.no_letters == 1);
  // Only Han: the mixed line fails at a high fraction.
  filter_options han;
  han.keep_scripts = {script::han};
  han.min_script_fraction = 0.9;
  filter_stats hs;
  CHECK(filter("我用Python写程序", han, hs) == filter_reason::wrong_script);
  han.min_chars = 10;
  han.max_chars = 5;
  CHECK_THROWS_AS(filter("x", han, hs), loom::input_error);
}

TEST_CASE("filter: the real corpora are Latin and Han respectively") {
  filter_options latin, hanonly;
  latin.keep_scripts = {script::latin};
  hanonly.keep_scripts = {script::han};
  const auto en = loom_test::read_file(loom_test::data_dir() / "tinyshakespeare.txt");
  const auto zh = loom_test::read_file(loom_test::data_dir() / "zh_classics.txt");
  filter_stats st;
  CHECK(filter(en, latin, st) == filter_reason::kept);
  CHECK(filter(zh, hanonly, st) == filter_reason::kept);
  CHECK(filter(en, hanonly, st) == filter_reason::wrong_script);
  CHECK(filter(zh, latin, st) == filter_reason::wrong_script);
  CHECK(profile_scripts(zh).code_points == 317894);  // the README's character count
}

#endif  // LOOM_TEST_TEXT
