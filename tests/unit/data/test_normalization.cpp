// Training text and inference text are normalised alike: prepare() records the normalisation in
// PREFIX.json, tokenizer::load(PREFIX.model) picks it up, and encode(x) of a raw prompt gives
// the ids the dataset holds for the same raw text (Chinese and English with full-width forms);
// decode(encode(x)) is the normalised x byte for byte.
#include "paths.hpp"
#ifdef LOOM_TEST_TEXT
#include <doctest/doctest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <loom/data/indexed_dataset.hpp>
#include <loom/data/text/prepare.hpp>

using namespace loom::data;
using namespace loom::data::text;

namespace {

// Raw documents with full-width letters, digits, punctuation and spaces, in Chinese and English
// text; each is one paragraph (no blank line inside), without HTML or surrounding whitespace.
const std::vector<std::string>& mixed_width_documents() {
  static const std::vector<std::string> docs = {
      "子曰：學而時習之，不亦說乎？我用ＡＰＰ學習ＧＰＴ－２模型，共１２３４５個參數！",
      "第３章　ＡＩ與人類。價格：ＵＳ＄９９，折扣２０％。",
      "ＲＯＭＥＯ：Ｈｅｌｌｏ，ｗｏｒｌｄ！　Ｗｈａｔ　ｌｉｇｈｔ　ｔｈｒｏｕｇｈ　ｙｏｎｄｅｒ　ｗｉｎｄｏｗ　ｂｒｅａｋｓ？",
      "Version ２.０ costs ＄５ (ｆｕｌｌ－ｗｉｄｔｈ), see ｐａｇｅ　４２。",
      "他說ＡＢＣ，",  // full-width letters between a wide character and full-width punctuation
  };
  return docs;
}

struct prepared {
  loom_test::scratch_dir tmp{"normalization"};
  prepare_report rep;
  prepared() {
    const auto en = loom_test::read_file(loom_test::data_dir() / "tinyshakespeare.txt").substr(0, 40000);
    const auto zh = loom_test::read_file(loom_test::data_dir() / "zh_classics.txt").substr(0, 60000);
    std::string txt = en.substr(0, en.rfind("\n\n")) + "\n\n" + zh.substr(0, zh.rfind("\n\n"));
    for (const auto& d : mixed_width_documents()) txt += "\n\n" + d;
    std::ofstream(tmp.path / "mixed.txt") << txt << "\n";
    prepare_options o;
    o.inputs = {tmp.path / "mixed.txt"};
    o.output_prefix = tmp.path / "mixed";
    o.tokenizer.vocab_size = 1200;
    o.dedup = false;
    o.filter.min_chars = 1;
    o.threads = 2;
    rep = prepare(o);
  }
};
const prepared& dataset() {
  static const prepared p;
  return p;
}

/// The ids of the document of the dataset whose decoded text is `text`, without the eod id.
std::vector<std::int32_t> dataset_ids_of(const indexed_dataset& ds, const tokenizer& tok, const std::string& text) {
  std::vector<std::int32_t> ids;
  for (std::size_t d = ds.document_count(); d-- > 0;) {
    const auto first = ds.document_token_offset(d), last = ds.document_token_offset(d + 1);
    ids.resize(last - first);
    ds.read_tokens(first, std::span(ids));
    if (!ids.empty() && ids.back() == tok.eod_id()) ids.pop_back();
    if (tok.decode(ids) == text) return ids;
  }
  return {};
}

}  // namespace

TEST_CASE("normalization: a raw prompt's ids equal the dataset's ids for the same text (zh and en, full-width forms)") {
  const auto& p = dataset();
  indexed_dataset ds(p.rep.bin.parent_path() / "mixed");
  const auto tok = tokenizer::load(p.rep.model);  // as sample and train_gpt load it
  for (const auto& raw : mixed_width_documents()) {
    CAPTURE(raw);
    const auto cleaned = clean(raw);
    REQUIRE(cleaned.has_value());
    CHECK(*cleaned != raw);  // every document has forms that cleaning folds
    const auto expected = dataset_ids_of(ds, tok, *cleaned);
    REQUIRE_FALSE(expected.empty());
    const auto ids = tok.encode(raw);  // the prompt path: raw text in
    CHECK(ids == expected);
    CHECK(tok.decode(ids) == *cleaned);  // decode(encode(x)) is the normalised x, byte for byte
  }
}

TEST_CASE("normalization: recorded in PREFIX.json; old sidecars load as loom-v1, a bare model as none") {
  const auto& p = dataset();
  const auto summary = nlohmann::json::parse(loom_test::read_file(p.rep.summary));
  REQUIRE(summary.contains("normalization"));
  CHECK(summary["normalization"]["name"] == "loom-v2");
  CHECK(summary["normalization"]["version"] == 2);
  CHECK(p.rep.norm == normalization{});
  CHECK(tokenizer::load(p.rep.model).text_normalization() == normalization{});

  loom_test::scratch_dir tmp("normalization_sidecars");
  // a sidecar written before the field existed: what prepare_data applied then
  std::filesystem::copy_file(p.rep.model, tmp.path / "old.model");
  auto old = summary;
  old.erase("normalization");
  old.erase("checksum");  // nor its own checksum
  std::ofstream(tmp.path / "old.json") << old.dump(2);
  const auto v1 = tokenizer::load(tmp.path / "old.model");
  CHECK(v1.text_normalization() == normalization::loom_v1());
  CHECK(v1.text_normalization().name() == "loom-v1");
  // version 1 keeps the full-width comma after full-width letters that follow a wide character
  CHECK(v1.decode(v1.encode("他說ＡＢＣ，")) == "他說ABC，");
  // no sidecar at all: the text is encoded as given
  std::filesystem::copy_file(p.rep.model, tmp.path / "bare.model");
  const auto bare = tokenizer::load(tmp.path / "bare.model");
  CHECK(bare.text_normalization() == normalization::none());
  CHECK(bare.decode(bare.encode("ＡＢＣ，１２")) == "ＡＢＣ，１２");
  // malformed fields are errors naming the file and the fix
  auto bad = summary;
  bad.erase("checksum");  // edited by hand: the field's own error, not the checksum's
  bad["normalization"]["version"] = 7;
  std::ofstream(tmp.path / "bad.json") << bad.dump(2);
  std::filesystem::copy_file(p.rep.model, tmp.path / "bad.model");
  CHECK_THROWS_WITH_AS(tokenizer::load(tmp.path / "bad.model"), doctest::Contains("bad.json"), loom::input_error);
  bad["normalization"] = {{"version", 2}, {"fold_width", "yes"}};
  std::ofstream(tmp.path / "bad.json") << bad.dump(2);
  CHECK_THROWS_WITH_AS(tokenizer::load(tmp.path / "bad.model"), doctest::Contains("fold_width"), loom::input_error);
  std::ofstream(tmp.path / "bad.json") << "{ not json";
  CHECK_THROWS_WITH_AS(tokenizer::load(tmp.path / "bad.model"), doctest::Contains("not valid JSON"), loom::input_error);
  // round trip through to_json / from_json
  for (const auto& n : {normalization{}, normalization::loom_v1(), normalization::none(),
                        normalization{2, true, false, true, false, true}}) {
    CHECK(normalization::from_json(n.to_json(), "x") == n);
  }
  CHECK(normalization{2, true, false, true, false, true}.name() == "custom");
}

TEST_CASE("normalization: normalize is clean without HTML and trimming, and idempotent (version 2)") {
  std::vector<std::string> texts = mixed_width_documents();
  texts.push_back("你Ａ，");                     // version 1 keeps the comma, then folds it on a second pass
  texts.push_back("ＵＳ＄９９，折扣");           // full-width punctuation between letters and digits
  texts.push_back("a\u3000b 你\u3000好 \u00A0x\u200By\r\nz");  // spaces, invisible, CR LF
  texts.push_back("e\u0301 Ａ\u0301");          // NFC
  for (const auto& x : texts) {
    CAPTURE(x);
    const auto n = normalize(x);
    CHECK(normalize(n) == n);
    if (const auto c = clean(x)) CHECK(*c == n);  // none of these has HTML or surrounding whitespace
  }
  CHECK(normalize("你Ａ，") == "你A,");
  CHECK(normalize("你Ａ，", normalization::loom_v1()) == "你A，");
  CHECK(normalize(normalize("你Ａ，", normalization::loom_v1()), normalization::loom_v1()) == "你A,");  // why version 2
  CHECK(normalize("ＧＰＴ－２") == "GPT-2");
  CHECK(normalize("你好，世界！") == "你好，世界！");
  CHECK(normalize("ＡＢＣ\xFF", normalization::none()) == "ＡＢＣ");  // invalid bytes are always dropped
  // the corpora are fixed points of normalize (cleaning already gave them their form)
  for (const char* corpus : {"tinyshakespeare.txt", "zh_classics.txt"}) {
    const auto text = loom_test::read_file(loom_test::data_dir() / corpus).substr(0, 200000);
    const auto once = normalize(text);
    CHECK(normalize(once) == once);
  }
}

#endif  // LOOM_TEST_TEXT
