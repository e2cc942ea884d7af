// Indexed dataset: round trip, byte-for-byte compatibility with Megatron's builder (golden
// files written by tests/golden/megatron_idx/make_megatron_idx.py), and corrupt-file errors.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include <loom/data/indexed_dataset.hpp>

#include "paths.hpp"

using namespace loom::data;
using docs_t = std::vector<std::vector<std::vector<std::int32_t>>>;  // documents -> sequences -> tokens

namespace {
// The same documents as DOCUMENTS_U16 / DOCUMENTS_I32 in make_megatron_idx.py.
const docs_t docs_u16 = {{{5, 17, 65535, 0, 2}}, {{300, 301}, {302}, {}}, {{}}, {{7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 2}}};
const docs_t docs_i32 = {{{100000, 2, 70000}}, {{2147483647, 0}, {1, 2, 3}}, {{65536, 65537, 2}}};

void write(const std::filesystem::path& prefix, dtype t, const docs_t& docs) {
  indexed_dataset_writer w(prefix, t);
  for (const auto& doc : docs) {
    for (const auto& seq : doc) w.add_sequence(seq);
    w.end_document();
  }
  w.finalize();
}

void check_matches(const indexed_dataset& ds, const docs_t& docs) {
  std::size_t s = 0;
  std::vector<std::int32_t> flat;
  for (std::size_t d = 0; d < docs.size(); ++d) {
    CHECK(ds.document_index(d) == std::int64_t(s));
    for (const auto& seq : docs[d]) {
      REQUIRE(s < ds.sequence_count());
      CHECK(ds.sequence_length(s) == std::int32_t(seq.size()));
      ++s;
      flat.insert(flat.end(), seq.begin(), seq.end());
    }
  }
  CHECK(ds.sequence_count() == s);
  CHECK(ds.document_count() == docs.size());
  CHECK(ds.document_index(docs.size()) == std::int64_t(s));
  CHECK(ds.token_count() == flat.size());
  CHECK(ds.contiguous());
  std::vector<std::int32_t> got(flat.size());
  ds.read_tokens(0, got);
  CHECK(got == flat);
}

void patch(const std::filesystem::path& file, std::size_t offset, const void* bytes, std::size_t n) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(std::streamoff(offset));
  f.write(static_cast<const char*>(bytes), std::streamsize(n));
}

void copy_golden(const std::filesystem::path& to, const std::string& name) {
  const auto g = loom_test::golden_dir() / "megatron_idx";
  std::filesystem::copy_file(g / (name + ".idx"), idx_path(to), std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(g / (name + ".bin"), bin_path(to), std::filesystem::copy_options::overwrite_existing);
}
}  // namespace

TEST_CASE("indexed_dataset: reads the Megatron-format golden files written by the Python builder") {
  const auto g = loom_test::golden_dir() / "megatron_idx";
  indexed_dataset u16(g / "tiny_u16");
  CHECK(u16.token_dtype() == dtype::uint16);
  check_matches(u16, docs_u16);
  CHECK(u16.sequence<std::uint16_t>(0)[2] == 65535);
  CHECK(u16.sequence<std::uint16_t>(3).empty());
  CHECK_THROWS_AS(u16.sequence<std::int32_t>(0), loom::input_error);  // wrong element type

  indexed_dataset i32(g / "tiny_i32");
  CHECK(i32.token_dtype() == dtype::int32);
  check_matches(i32, docs_i32);
  CHECK(i32.document_token_offset(1) == 3);
  CHECK(i32.document_token_offset(3) == i32.token_count());
}

TEST_CASE("indexed_dataset: loom's writer is byte-identical to Megatron's builder") {
  loom_test::scratch_dir tmp("idx_bytes");
  write(tmp.path / "u16", dtype::uint16, docs_u16);
  write(tmp.path / "i32", dtype::int32, docs_i32);
  const auto g = loom_test::golden_dir() / "megatron_idx";
  for (const char* name : {"u16", "i32"}) {
    const std::string golden = std::string("tiny_") + name;
    CHECK(loom_test::read_file(idx_path(tmp.path / name)) == loom_test::read_file(g / (golden + ".idx")));
    CHECK(loom_test::read_file(bin_path(tmp.path / name)) == loom_test::read_file(g / (golden + ".bin")));
  }
  // No temporaries left behind.
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(tmp.path)) ++files;
  CHECK(files == 4);
}

TEST_CASE("indexed_dataset: random round trip, token dtype from vocabulary size") {
  CHECK(token_dtype_for(50257) == dtype::uint16);
  CHECK(token_dtype_for(65536) == dtype::uint16);
  CHECK(token_dtype_for(65537) == dtype::int32);
  loom_test::scratch_dir tmp("idx_rt");
  std::mt19937 rng(7);
  for (const std::int32_t vocab : {1000, 65536, 150000}) {
    docs_t docs;
    for (int d = 0; d < 37; ++d) {
      std::vector<std::int32_t> seq(rng() % 300);
      for (auto& t : seq) t = std::int32_t(rng() % std::uint32_t(vocab));
      docs.push_back({seq});
    }
    const auto prefix = tmp.path / ("v" + std::to_string(vocab));
    write(prefix, token_dtype_for(std::size_t(vocab)), docs);
    indexed_dataset ds(prefix);
    CHECK(ds.token_dtype() == token_dtype_for(std::size_t(vocab)));
    check_matches(ds, docs);
    // Partial reads at arbitrary offsets, and vocab checking.
    std::vector<std::int32_t> part(25);
    ds.read_tokens(100, part, vocab);
    std::vector<std::int32_t> all(ds.token_count());
    ds.read_tokens(0, all);
    CHECK(std::equal(part.begin(), part.end(), all.begin() + 100));
    CHECK_THROWS_AS(ds.read_tokens(0, all, 1), loom::input_error);  // every id >= 1 is out of vocab
    CHECK_THROWS_AS(ds.read_tokens(ds.token_count() - 3, part), loom::input_error);
  }
}

TEST_CASE("indexed_dataset: writer rejects tokens that do not fit and leaves no files") {
  loom_test::scratch_dir tmp("idx_bad_token");
  {
    indexed_dataset_writer w(tmp.path / "x", dtype::uint16);
    const std::vector<std::int32_t> bad = {1, 65536};
    CHECK_THROWS_AS(w.add_sequence(bad), loom::input_error);
  }  // destroyed without finalize
  CHECK(std::filesystem::is_empty(tmp.path));
}

TEST_CASE("indexed_dataset: corrupt index files are clear input errors") {
  loom_test::scratch_dir tmp("idx_corrupt");
  const auto p = tmp.path / "c";
  auto expect_error = [&](const char* needle) {
    try {
      indexed_dataset ds(p);
      FAIL("no error for a corrupt index; expected: " << needle);
    } catch (const loom::input_error& e) {
      const std::string what = e.what();
      CHECK_MESSAGE(what.find(needle) != std::string::npos, what);
      CHECK_MESSAGE(what.find("; ") != std::string::npos, what);  // "problem; fix"
    }
  };
  SUBCASE("missing files") { expect_error("cannot be opened"); }
  SUBCASE("wrong magic") {
    copy_golden(p, "tiny_u16");
    patch(idx_path(p), 0, "XMIDIDX", 7);
    expect_error("wrong magic");
  }
  SUBCASE("wrong version") {
    copy_golden(p, "tiny_u16");
    const std::uint64_t v = 2;
    patch(idx_path(p), 9, &v, 8);
    expect_error("version 2");
  }
  SUBCASE("unknown dtype code") {
    copy_golden(p, "tiny_u16");
    const std::uint8_t code = 9;
    patch(idx_path(p), 17, &code, 1);
    expect_error("dtype code 9");
  }
  SUBCASE("float dtype") {
    copy_golden(p, "tiny_i32");
    const std::uint8_t code = 7;
    patch(idx_path(p), 17, &code, 1);
    expect_error("not a token type");
  }
  SUBCASE("sequence count larger than the file") {
    copy_golden(p, "tiny_u16");
    const std::uint64_t n = 1000;
    patch(idx_path(p), 18, &n, 8);
    expect_error("truncated");
  }
  SUBCASE("huge counts do not overflow the size check") {
    copy_golden(p, "tiny_u16");
    const std::uint64_t n = ~std::uint64_t(0) / 4;
    patch(idx_path(p), 18, &n, 8);
    patch(idx_path(p), 26, &n, 8);
    expect_error("truncated");
  }
  SUBCASE("sequence past the end of the data file") {
    copy_golden(p, "tiny_u16");
    std::filesystem::resize_file(bin_path(p), 30);  // last sequence (12 tokens at byte 16) no longer fits
    expect_error("past the end of the data file");
  }
  SUBCASE("negative length") {
    copy_golden(p, "tiny_u16");
    const std::int32_t len = -1;
    patch(idx_path(p), 34, &len, 4);
    expect_error("negative length");
  }
  SUBCASE("document indices not covering the sequences") {
    copy_golden(p, "tiny_u16");
    const std::int64_t last = 5;  // the last of 5 document indices, should be 6
    patch(idx_path(p), 34 + 12 * 6 + 8 * 4, &last, 8);
    expect_error("documents cover 5 sequences");
  }
  SUBCASE("header shorter than 34 bytes") {
    copy_golden(p, "tiny_u16");
    std::filesystem::resize_file(idx_path(p), 20);
    expect_error("shorter than the 34-byte header");
  }
}
