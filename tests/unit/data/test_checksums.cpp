// Damaged dataset files are errors, not different data: prepare_data refuses binary input.
#include "paths.hpp"
#ifdef LOOM_TEST_TEXT
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <loom/data/text/prepare.hpp>

using namespace loom::data;
using namespace loom::data::text;

namespace {
void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
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
#endif
