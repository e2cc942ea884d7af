// SentencePiece tokenizer trained on a slice of both corpora: exact round trip for both
// corpora (after cleaning), Chinese punctuation, unseen characters through byte fallback,
// chunked encoding equal to whole-text encoding, save/load, errors.
#include "paths.hpp"
#ifdef LOOM_TEST_TEXT
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include <loom/data/text/clean.hpp>
#include <loom/data/text/tokenizer.hpp>

using namespace loom::data::text;

namespace {
std::vector<std::string> paragraphs(const std::string& text) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < text.size()) {
    auto e = text.find("\n\n", at);
    if (e == std::string::npos) e = text.size();
    if (auto c = clean(text.substr(at, e - at))) out.push_back(std::move(*c));
    at = e + 2;
  }
  return out;
}
struct corpora {
  std::vector<std::string> en, zh;
  corpora()
      : en(paragraphs(loom_test::read_file(loom_test::data_dir() / "tinyshakespeare.txt"))),
        zh(paragraphs(loom_test::read_file(loom_test::data_dir() / "zh_classics.txt"))) {}
};
const corpora& text() {
  static const corpora c;
  return c;
}
// Trained once for all test cases: ~150 KB of each corpus, vocabulary 1500.
const tokenizer& small_model() {
  static const tokenizer t = [] {
    std::vector<std::string_view> slice;
    std::size_t en = 0, zh = 0;
    for (const auto& p : text().en) if ((en += p.size()) < 150000) slice.push_back(p);
    for (const auto& p : text().zh) if ((zh += p.size()) < 150000) slice.push_back(p);
    tokenizer_options o;
    o.vocab_size = 1500;
    return tokenizer::train(slice, o);
  }();
  return t;
}
}  // namespace

TEST_CASE("tokenizer: special ids and vocabulary") {
  const auto& t = small_model();
  CHECK(t.vocab_size() == 1500);
  CHECK(t.eod_id() == 2);
  CHECK(t.unk_id() == 0);
  CHECK(t.piece(t.eod_id()) == "</s>");
  const auto nl = t.encode("\n");
  REQUIRE(nl.size() == 1);
  CHECK(t.piece(nl[0]) == "\n");  // a user-defined symbol, not a byte
}

TEST_CASE("tokenizer: decode(encode(x)) == x for both corpora, encoded on all cores") {
  const auto& t = small_model();
  for (const auto* docs : {&text().en, &text().zh}) {
    std::vector<std::string_view> views(docs->begin(), docs->end());
    const auto ids = t.encode_all(views);
    REQUIRE(ids.size() == views.size());
    std::size_t bad = 0, tokens = 0, unk = 0;
    for (std::size_t i = 0; i < views.size(); ++i) {
      tokens += ids[i].size();
      unk += std::size_t(std::count(ids[i].begin(), ids[i].end(), t.unk_id()));
      if (t.decode(ids[i]) != views[i]) ++bad;
    }
    CHECK(bad == 0);
    CHECK(unk == 0);
    CHECK(tokens > 100000);
  }
}

TEST_CASE("tokenizer: Chinese punctuation and unseen characters survive via byte fallback") {
  const auto& t = small_model();
  for (const std::string s : {"子曰：“學而時習之，不亦說乎？”《論語》、「孟子」。",
                              "Ωμέγα ∑ 🙂 Привет мир — naïve café ½ ₿ 𠀀",
                              "  leading spaces,\ttabs\n\n\nand blank lines   ",
                              "</s> <unk> <s> look like specials but are text",
                              "２０２４ full-width digits and ｗｉｄｅ letters"}) {
    // the trained tokenizer normalizes (loom-v2: full-width letters and digits become ASCII) ...
    CHECK(t.decode(t.encode(s)) == normalize(s));
    // ... and without normalization every string comes back as it was, full-width forms included
    const auto raw = tokenizer::from_serialized(t.serialized());
    CHECK(raw.decode(raw.encode(s)) == s);
  }
  CHECK(t.text_normalization() == normalization{});
  CHECK(normalize("２０２４ full-width digits and ｗｉｄｅ letters") == "2024 full-width digits and wide letters");
  const auto ids = t.encode("🙂");
  REQUIRE(ids.size() == 4);  // 4 UTF-8 bytes
  for (auto id : ids) CHECK(t.is_byte(id));
  CHECK_THROWS_AS(t.decode(std::vector<std::int32_t>{5, 1500}), loom::input_error);
  CHECK(t.decode(std::vector<std::int32_t>{t.eod_id()}).empty());
}

TEST_CASE("tokenizer: chunked encoding gives the ids of the whole text") {
  const auto& t = small_model();
  std::string big;
  for (std::size_t i = 0; i < 40; ++i) big += text().en[i] + "\n\n" + text().zh[i] + "\n";
  std::vector<std::int32_t> whole, chunked, tiny;
  t.encode(big, whole, big.size() + 1);
  t.encode(big, chunked, 4096);
  t.encode(big, tiny, 7);  // cuts at every line
  CHECK(chunked == whole);
  CHECK(tiny == whole);
}

TEST_CASE("tokenizer: save and load, errors") {
  loom_test::scratch_dir tmp("tokenizer");
  const auto& t = small_model();
  t.save(tmp.path / "m.model");
  const auto u = tokenizer::load(tmp.path / "m.model");
  CHECK(u.vocab_size() == t.vocab_size());
  CHECK(u.encode("To be, or not to be") == t.encode("To be, or not to be"));
  CHECK_THROWS_WITH_AS(tokenizer::load(tmp.path / "missing.model"), doctest::Contains("cannot be opened"),
                       loom::input_error);
  {
    std::ofstream(tmp.path / "junk.model") << "not a model";
  }
  CHECK_THROWS_WITH_AS(tokenizer::load(tmp.path / "junk.model"), doctest::Contains("not a SentencePiece model"),
                       loom::input_error);
  const std::vector<std::string_view> empty_corpus = {"", "\n\n"};
  CHECK_THROWS_AS(tokenizer::train(empty_corpus, {}), loom::input_error);
  const std::vector<std::string_view> corpus = {"abc def", "ghi"};
  tokenizer_options tiny;
  tiny.vocab_size = 10;  // smaller than the 256 byte pieces
  CHECK_THROWS_WITH_AS(tokenizer::train(corpus, tiny), doctest::Contains("vocab-size"), loom::input_error);
}

#endif  // LOOM_TEST_TEXT
