// Damaged dataset files are errors, not different data: prepare_data refuses binary input;
// PREFIX.json records the size and XXH3-64 of PREFIX.bin, .idx and .model and its own checksum,
// and batch_source / tokenizer::load check them (a flipped token id that stays in the
// vocabulary is an error naming the .bin). Summaries without checksums still load.
// (tests/cli/corrupt_sweep.py runs the same damage through the programs.)
#include "paths.hpp"
#ifdef LOOM_TEST_TEXT
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <loom/data/source.hpp>
#include <loom/data/text/prepare.hpp>

using namespace loom::data;
using namespace loom::data::text;

namespace {
void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}
// XOR one byte of a file in place.
void flip(const std::filesystem::path& p, std::size_t at, unsigned char x) {
  auto s = loom_test::read_file(p);
  REQUIRE(at < s.size());
  s[at] = char(static_cast<unsigned char>(s[at]) ^ x);
  write_bytes(p, s);
}
// The message of the loom::input_error `f` throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const loom::input_error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("prepare: binary input is refused, naming the file; text with a few invalid bytes is not") {
  loom_test::scratch_dir tmp("checksums_binary");
  std::vector<std::string> docs;
  write_bytes(tmp.path / "nul.txt", std::string("To be, or not\0to be", 19));
  CHECK(error_of([&] { read_documents(tmp.path / "nul.txt", split_mode::blank_line, "text", docs); }) ==
        "input file '" + (tmp.path / "nul.txt").string() + "' is not text: it has a NUL byte at offset 13 (binary or "
        "UTF-16); prepare_data reads UTF-8 text (.txt) or JSON lines (.jsonl); convert the file to UTF-8 or drop it "
        "from --input");
  std::string junk;  // no NUL, but mostly not UTF-8
  for (int i = 0; i < 400; ++i) junk += char(0x80 + i % 64);
  write_bytes(tmp.path / "junk.jsonl", junk);
  CHECK(error_of([&] { read_documents(tmp.path / "junk.jsonl", split_mode::blank_line, "text", docs); })
            .find("junk.jsonl' is not text: 400 of its first 400 bytes are not UTF-8") != std::string::npos);
  // Latin-1 in a UTF-8 file: a few invalid bytes, left to cleaning (--invalid-utf8)
  write_bytes(tmp.path / "latin1.txt", "Caf\xe9 au lait, cr\xe8me br\xfbl\xe9" "e, and the rest is plain ASCII text.\n");
  read_documents(tmp.path / "latin1.txt", split_mode::blank_line, "text", docs);
  CHECK(docs.size() == 1);
}

/// Prepares a 400-piece BPE dataset at dir/good/d from the first 20,000 bytes of
/// tinyshakespeare (up to its last blank line), one thread; `po` receives the options used.
static prepare_report prepare_small(const std::filesystem::path& dir, prepare_options& po) {
  const auto text = loom_test::read_file(loom_test::data_dir() / "tinyshakespeare.txt").substr(0, 20000);
  write_bytes(dir / "a.txt", text.substr(0, text.rfind("\n\n")));
  po.inputs = {dir / "a.txt"};
  po.output_prefix = dir / "good" / "d";
  po.tokenizer.vocab_size = 400;
  po.threads = 1;
  return prepare(po);
}

TEST_CASE("dataset checksums: recorded by prepare, checked when the dataset and its tokenizer are opened") {
  loom_test::scratch_dir tmp("checksums_dataset");
  prepare_options po;
  const auto rep = prepare_small(tmp.path, po);
  const auto summary = nlohmann::json::parse(loom_test::read_file(rep.summary));
  REQUIRE(summary.contains("checksums"));
  CHECK(summary["checksums"]["bin"]["bytes"] == std::filesystem::file_size(rep.bin));
  CHECK(summary["checksums"]["idx"]["bytes"] == std::filesystem::file_size(rep.idx));
  CHECK(summary["checksums"]["tokenizer"]["bytes"] == std::filesystem::file_size(rep.model));
  CHECK(summary["checksums"]["bin"]["xxh3_64"].get<std::string>().size() == 16);
  CHECK(summary["checksum"]["xxh3_64"] == loom::data::detail::json_xxh3(summary));

  source_options o;
  o.micro_batch = 2;
  o.seq_len = 16;
  o.vocab = 400;
  CHECK(batch_source<>(po.output_prefix, o).checksums() == checksum_state::verified);
  CHECK(tokenizer::verify_against_sidecar(rep.model));

  auto damaged = [&](const std::string& name) {  // a fresh copy of the dataset under `name`
    const auto dir = tmp.path / name;
    std::filesystem::copy(tmp.path / "good", dir, std::filesystem::copy_options::recursive);
    return dir / "d";
  };
  // a token of the .bin changed to another id inside the vocabulary: the structure is intact
  // (the low byte of a uint16 id; ids are < 400), only the checksum sees it
  const auto p1 = damaged("bin");
  flip(bin_path(p1), 100, 0x01);
  CHECK_NOTHROW(indexed_dataset{p1});
  CHECK(error_of([&] { batch_source<>(p1, o); }) ==
        "data file '" + bin_path(p1).string() + "' fails its checksum ('d.json' records XXH3-64 " +
            summary["checksums"]["bin"]["xxh3_64"].get<std::string>() + ", the file has " +
            loom::data::detail::xxh3_hex(loom_test::read_file(bin_path(p1)).data(), std::filesystem::file_size(bin_path(p1))) +
            "): its bytes changed after prepare_data wrote it; re-run prepare_data");
  auto skip = o;  // --no-data-checksum: not checked (and this damage passes the format's checks)
  skip.verify_checksums = false;
  CHECK(batch_source<>(p1, skip).checksums() == checksum_state::skipped);
  // a truncated index: its size first
  const auto p2 = damaged("idx");
  std::filesystem::resize_file(idx_path(p2), std::filesystem::file_size(idx_path(p2)) - 8);
  CHECK(error_of([&] { batch_source<>(p2, o); }).find("d.idx' is " + std::to_string(summary["checksums"]["idx"]["bytes"].get<std::uint64_t>() - 8) +
                                                      " bytes but 'd.json' records") != std::string::npos);
  // the summary itself: a changed digit of "tokens" fails its own checksum
  const auto p3 = damaged("json");
  auto s3 = loom_test::read_file(p3.string() + ".json");
  const auto at = s3.find("\"tokens\": ") + 10;
  s3[at] = s3[at] == '9' ? '8' : char(s3[at] + 1);
  write_bytes(p3.string() + ".json", s3);
  CHECK(error_of([&] { batch_source<>(p3, o); }).find("d.json' fails its checksum (stored ") != std::string::npos);
  CHECK(error_of([&] { (void)tokenizer::load(p3.string() + ".model"); }).find("d.json' fails its checksum") !=
        std::string::npos);
  // the tokenizer: one byte in the middle of the model changed
  const auto p4 = damaged("model");
  flip(p4.string() + ".model", std::filesystem::file_size(p4.string() + ".model") / 2, 0x01);
  CHECK(error_of([&] { (void)tokenizer::load(p4.string() + ".model"); }).find("tokenizer model '" + p4.string() +
                                                                                ".model' fails its checksum") !=
        std::string::npos);
  // a summary written before checksums were recorded: read unchecked, and the run says so
  const auto p5 = damaged("old");
  auto old = summary;
  old.erase("checksums");
  old.erase("checksum");
  write_bytes(p5.string() + ".json", old.dump(2));
  flip(bin_path(p5), 100, 0x01);
  batch_source<> unchecked(p5, o);
  CHECK(unchecked.checksums() == checksum_state::none_recorded);
  CHECK(unchecked.describe().find("no checksums recorded") != std::string::npos);
  CHECK_FALSE(tokenizer::verify_against_sidecar(p5.string() + ".model"));
}

TEST_CASE("dataset tokenizer: found as recorded, or as PREFIX.model when renamed or kept (still checked); else a clear error") {
  loom_test::scratch_dir tmp("checksums_moved");
  prepare_options po;
  const auto rep = prepare_small(tmp.path, po);
  CHECK(dataset_tokenizer_path(po.output_prefix) == rep.model);
  CHECK_FALSE(missing_dataset_tokenizer(po.output_prefix).has_value());
  auto copy = [&](const std::filesystem::path& to, std::initializer_list<const char*> exts) {
    std::filesystem::create_directories(to.parent_path());
    for (const char* e : exts) std::filesystem::copy_file(po.output_prefix.string() + e, to.string() + e);
  };
  // moved without its tokenizer: the error names the field, what it records and the fix
  const auto moved = tmp.path / "moved" / "d";
  copy(moved, {".bin", ".idx", ".json"});
  CHECK(missing_dataset_tokenizer(moved) ==
        "dataset '" + moved.string() + "': '" + moved.string() + ".json' names its tokenizer \"d.model\" (field "
        "\"tokenizer\", a file beside the .json), but '" + moved.string() + ".model' does not exist (was the dataset "
        "copied without it?); copy the SentencePiece .model the data was tokenized with (prepare_data's PREFIX.model) "
        "to '" + moved.string() + ".model'");
  // renamed: e.json still names d.model; without e.model both are named
  const auto renamed = tmp.path / "renamed" / "e";
  copy(renamed, {".bin", ".idx", ".json"});
  CHECK(missing_dataset_tokenizer(renamed)->find("but neither '" + (renamed.parent_path() / "d.model").string() +
                                                 "' nor '" + renamed.string() + ".model' exists") != std::string::npos);
  // with e.model: taken, checked against e.json's checksum, normalized as e.json says
  std::filesystem::copy_file(rep.model, renamed.string() + ".model");
  CHECK(dataset_tokenizer_path(renamed) == renamed.string() + ".model");
  CHECK_FALSE(missing_dataset_tokenizer(renamed).has_value());
  CHECK(tokenizer::verify_against_sidecar(renamed.string() + ".model"));
  CHECK(tokenizer::load(renamed.string() + ".model").text_normalization() == tokenizer::load(rep.model).text_normalization());
  CHECK(tokenizer::load(renamed.string() + ".model").text_normalization() != normalization::none());
  flip(renamed.string() + ".model", std::filesystem::file_size(rep.model) / 2, 0x01);
  CHECK(error_of([&] { (void)tokenizer::load(renamed.string() + ".model"); }).find("fails its checksum") !=
        std::string::npos);
  // the recorded name wins when it is there (e.json's tokenizer is d.model, not this e.model)
  std::filesystem::copy_file(rep.model, renamed.parent_path() / "d.model");
  CHECK(dataset_tokenizer_path(renamed) == renamed.parent_path() / "d.model");
  CHECK_FALSE(tokenizer::verify_against_sidecar(renamed.string() + ".model"));
  // kept by prepare_data as PREFIX.previous-1 (its d.previous-1.json names d.model), and d.model
  // since replaced by another dataset's: the kept PREFIX.model, checked against the kept .json
  const auto kept = tmp.path / "kept" / "d.previous-1";
  copy(kept, {".bin", ".idx", ".json", ".model"});
  write_bytes(kept.parent_path() / "d.model", loom_test::read_file(rep.model) + "another vocabulary");
  CHECK(dataset_tokenizer_path(kept) == kept.string() + ".model");
  CHECK(tokenizer::verify_against_sidecar(kept.string() + ".model"));
  flip(kept.string() + ".model", std::filesystem::file_size(rep.model) / 2, 0x01);
  CHECK(error_of([&] { (void)tokenizer::load(kept.string() + ".model"); }).find("fails its checksum") !=
        std::string::npos);
  std::filesystem::copy_file(rep.model, kept.parent_path() / "d.model", std::filesystem::copy_options::overwrite_existing);
  CHECK(dataset_tokenizer_path(kept) == kept.parent_path() / "d.model");  // d.model is the recorded one again
  // no PREFIX.json: PREFIX.model, and an error without a .json to name
  const auto bare = tmp.path / "bare" / "d";
  copy(bare, {".bin", ".idx"});
  CHECK(dataset_tokenizer_path(bare) == bare.string() + ".model");
  CHECK(missing_dataset_tokenizer(bare)->find("has no tokenizer: there is no '" + bare.string() + ".json'") !=
        std::string::npos);
  source_options o;
  o.micro_batch = 2;
  o.seq_len = 16;
  o.vocab = 400;
  batch_source<> unverified(bare, o);
  CHECK(unverified.checksums() == checksum_state::no_summary);
  CHECK(unverified.describe().find("; not verified (no " + bare.string() + ".json)") != std::string::npos);
}
#endif
