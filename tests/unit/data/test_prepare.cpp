// The whole preparation on small hand-made inputs (.txt and .jsonl): stage counts, files on
// disk, documents decode back to their cleaned text followed by the end-of-document id.
#include "paths.hpp"
#ifdef LOOM_TEST_TEXT
#include <doctest/doctest.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <loom/data/loader.hpp>
#include <loom/data/text/prepare.hpp>

using namespace loom::data;
using namespace loom::data::text;

TEST_CASE("prepare: txt + jsonl -> clean -> dedup -> filter -> tokenize -> write") {
  loom_test::scratch_dir tmp("prepare");
  // A slice of real text as paragraphs, plus remnants to clean and duplicates to remove.
  const auto shakespeare = loom_test::read_file(loom_test::data_dir() / "tinyshakespeare.txt").substr(0, 30000);
  const std::string txt = shakespeare.substr(0, shakespeare.rfind("\n\n")) +
                          "\n\n<p>Some&nbsp;<b>HTML</b> remnant</p>\n\n"
                          "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"  // exact duplicate
                          "\xEF\xBB\xBF\n\n"                                                    // BOM only: empty
                          "Привет, как дела? Это русский текст.\n";                             // wrong script
  std::ofstream(tmp.path / "a.txt") << txt;
  std::ofstream(tmp.path / "b.jsonl") << R"({"text": "子曰：學而時習之，不亦說乎？有朋自遠方來，不亦樂乎？", "id": 1})" "\n"
                                      << R"({"text": "Ｈｅｌｌｏ　ｆｕｌｌ－ｗｉｄｔｈ world."})" "\n\n";
  prepare_options o;
  o.inputs = {tmp.path / "a.txt", tmp.path / "b.jsonl"};
  o.output_prefix = tmp.path / "out" / "corpus";
  o.tokenizer.vocab_size = 600;
  o.filter.keep_scripts = {script::latin, script::han};
  o.threads = 2;
  const auto rep = prepare(o);

  REQUIRE(rep.stages.size() == 7);
  const auto& read = rep.stages[0];
  const auto& clean = rep.stages[1];
  const auto& dedup = rep.stages[2];
  const auto& filt = rep.stages[3];
  CHECK(read.name == "read");
  CHECK(clean.documents_in == read.documents_out);
  CHECK(clean.documents_out == clean.documents_in - 1);  // the BOM-only paragraph
  CHECK(dedup.documents_out == dedup.documents_in - 1);  // the repeated first speech
  CHECK(filt.documents_out == filt.documents_in - 1);    // the Russian paragraph
  CHECK(rep.documents == filt.documents_out);

  // Files exist and agree with the report.
  indexed_dataset ds(o.output_prefix);
  CHECK(ds.document_count() == rep.documents);
  CHECK(ds.token_count() == rep.tokens);
  CHECK(ds.token_dtype() == dtype::uint16);
  const auto tok = tokenizer::load(rep.model);
  CHECK(tok.vocab_size() == rep.vocab_size);
  const auto summary = nlohmann::json::parse(loom_test::read_file(rep.summary));
  CHECK(summary["tokens"] == rep.tokens);
  CHECK(summary["eod_id"] == tok.eod_id());
  CHECK(summary["tokenizer"] == "corpus.model");

  // Every document decodes to cleaned text and ends with eod; check a few by content.
  std::vector<std::string> decoded;
  for (std::size_t d = 0; d < ds.document_count(); ++d) {
    const auto seq = ds.sequence<std::uint16_t>(d);
    REQUIRE(!seq.empty());
    CHECK(seq.back() == tok.eod_id());
    std::vector<std::int32_t> ids(seq.begin(), seq.end() - 1);
    decoded.push_back(tok.decode(ids));
  }
  CHECK(decoded.front() == "First Citizen:\nBefore we proceed any further, hear me speak.");
  CHECK(std::count(decoded.begin(), decoded.end(), "Some HTML remnant") == 1);
  CHECK(std::count(decoded.begin(), decoded.end(), "子曰：學而時習之，不亦說乎？有朋自遠方來，不亦樂乎？") == 1);
  CHECK(std::count(decoded.begin(), decoded.end(), "Hello full-width world.") == 1);

  // The loader serves windows of the prepared stream: each row decodes to a piece of the
  // documents joined by end-of-document tokens.
  std::string stream;
  for (const auto& d : decoded) stream += d;  // eod decodes to nothing
  loader_options lo;
  lo.batch = 4;
  lo.seq_len = 32;
  lo.vocab = rep.vocab_size;
  lo.seed = 5;
  loader<> l(o.output_prefix, lo);
  for (int step = 0; step < 5; ++step) {
    const auto batch = l.next();
    for (std::size_t r = 0; r < lo.batch; ++r) {
      // The row, without byte pieces at its edges (a window may cut a character's bytes).
      std::vector<std::int32_t> inner(batch.begin() + long(r * 33), batch.begin() + long(r * 33 + 33));
      while (!inner.empty() && tok.is_byte(inner.front())) inner.erase(inner.begin());
      while (!inner.empty() && tok.is_byte(inner.back())) inner.pop_back();
      std::string piece;
      std::vector<std::int32_t> chunk;
      for (auto id : inner) {
        if (id == tok.eod_id()) {
          piece += tok.decode(chunk);
          chunk.clear();
        } else {
          chunk.push_back(id);
        }
      }
      piece += tok.decode(chunk);
      CHECK_MESSAGE(stream.find(piece) != std::string::npos, piece);
    }
  }

  // Reusing the tokenizer gives the same tokens.
  prepare_options again = o;
  again.output_prefix = tmp.path / "again";
  again.tokenizer_model = rep.model;
  const auto rep2 = prepare(again);
  CHECK(rep2.tokens == rep.tokens);
  CHECK(loom_test::read_file(bin_path(again.output_prefix)) == loom_test::read_file(rep.bin));
}

TEST_CASE("prepare: input errors") {
  loom_test::scratch_dir tmp("prepare_err");
  std::ofstream(tmp.path / "bad.jsonl") << "{\"text\": \"ok\"}\n{not json}\n";
  std::ofstream(tmp.path / "nokey.jsonl") << "{\"content\": \"ok\"}\n";
  std::vector<std::string> docs;
  CHECK_THROWS_WITH_AS(read_documents(tmp.path / "bad.jsonl", split_mode::blank_line, "text", docs),
                       doctest::Contains("bad.jsonl:2: not valid JSON"), loom::input_error);
  CHECK_THROWS_WITH_AS(read_documents(tmp.path / "nokey.jsonl", split_mode::blank_line, "text", docs),
                       doctest::Contains("--json-key"), loom::input_error);
  CHECK_THROWS_WITH_AS(read_documents(tmp.path / "missing.txt", split_mode::line, "text", docs),
                       doctest::Contains("cannot be opened"), loom::input_error);
  CHECK_THROWS_AS(parse_split_mode("paragraph"), loom::input_error);
  // Splitting modes.
  std::ofstream(tmp.path / "s.txt") << "a\nb\n\n\n c \n\nd";
  std::vector<std::string> para, lines, whole;
  read_documents(tmp.path / "s.txt", split_mode::blank_line, "", para);
  read_documents(tmp.path / "s.txt", split_mode::line, "", lines);
  read_documents(tmp.path / "s.txt", split_mode::file, "", whole);
  CHECK(para == std::vector<std::string>{"a\nb", " c ", "d"});
  CHECK(lines == std::vector<std::string>{"a", "b", " c ", "d"});
  CHECK(whole == std::vector<std::string>{"a\nb\n\n\n c \n\nd"});
  // Nothing survives the filter.
  prepare_options o;
  o.inputs = {tmp.path / "s.txt"};
  o.output_prefix = tmp.path / "x";
  o.filter.min_chars = 100;
  CHECK_THROWS_WITH_AS(prepare(o), doctest::Contains("no document survived"), loom::input_error);
  CHECK_FALSE(std::filesystem::exists(tmp.path / "x.bin"));
}

TEST_CASE("prepare: dataset_files in write order; before_write runs once, right before the first file") {
  loom_test::scratch_dir tmp("prepare_before_write");
  const auto prefix = tmp.path / "out" / "d";
  CHECK(dataset_files(prefix) == std::array<std::filesystem::path, 4>{prefix.string() + ".bin", prefix.string() + ".idx",
                                                                      prefix.string() + ".model", prefix.string() + ".json"});
  std::ofstream(tmp.path / "a.txt") << loom_test::read_file(loom_test::data_dir() / "tinyshakespeare.txt").substr(0, 8000);
  prepare_options o;
  o.inputs = {tmp.path / "a.txt"};
  o.output_prefix = prefix;
  o.tokenizer.vocab_size = 400;
  o.threads = 1;
  int calls = 0;
  o.before_write = [&] {
    ++calls;
    for (const auto& f : dataset_files(prefix)) CHECK_FALSE(std::filesystem::exists(f));
    throw loom::error("keeping failed");
  };
  CHECK_THROWS_WITH_AS(prepare(o), "keeping failed", loom::error);
  CHECK(calls == 1);
  for (const auto& f : dataset_files(prefix)) CHECK_FALSE(std::filesystem::exists(f));
  o.before_write = [&] { ++calls; };
  const auto rep = prepare(o);
  CHECK(calls == 2);
  CHECK(dataset_files(prefix) == std::array{rep.bin, rep.idx, rep.model, rep.summary});
  for (const auto& f : dataset_files(prefix)) CHECK(std::filesystem::exists(f));
}

#endif  // LOOM_TEST_TEXT
