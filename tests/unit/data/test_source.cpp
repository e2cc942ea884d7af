// batch_source: path detection; a text file gives exactly the batches and validation windows
// train_gpt's byte path always drew (byte_dataset + window_sampler + sequential_windows);
// an indexed dataset gives whole-epoch coverage of the training documents, the validation
// documents in order, resume from state(), data-parallel disjointness, vocabulary checks,
// and bits per byte from exact or average bytes. With the text libraries: the per-id byte
// table sums to prepare_data's text_bytes on slices of both corpora.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <new>
#include <numbers>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <loom/data/source.hpp>

#include "paths.hpp"

#ifdef LOOM_TEST_TEXT
#include <loom/data/text/prepare.hpp>
#endif

using namespace loom::data;

namespace {
// Documents of random lengths 1..90 whose tokens are their stream positions; returns the
// token offset where each document starts (plus the end).
std::vector<std::uint64_t> write_positions(const std::filesystem::path& prefix, int docs, std::uint32_t seed) {
  std::mt19937 rng(seed);
  indexed_dataset_writer w(prefix, dtype::int32);
  std::vector<std::uint64_t> starts{0};
  std::int32_t at = 0;
  for (int d = 0; d < docs; ++d) {
    std::vector<std::int32_t> doc(1 + rng() % 90);
    for (auto& t : doc) t = at++;
    w.add_document(doc);
    starts.push_back(std::uint64_t(at));
  }
  w.finalize();
  return starts;
}

void write_text(const std::filesystem::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }
}  // namespace

TEST_CASE("source: indexed_dataset_prefix tells datasets from text files") {
  loom_test::scratch_dir tmp("source_prefix");
  write_positions(tmp.path / "corpus.v2", 3, 1);
  write_text(tmp.path / "a.txt", "hello");
  CHECK(indexed_dataset_prefix(tmp.path / "corpus.v2") == tmp.path / "corpus.v2");  // dots in the prefix stay
  CHECK(indexed_dataset_prefix(tmp.path / "corpus.v2.idx") == tmp.path / "corpus.v2");
  CHECK(indexed_dataset_prefix(tmp.path / "corpus.v2.bin") == tmp.path / "corpus.v2");
  CHECK(indexed_dataset_prefix(tmp.path / "missing.idx") == tmp.path / "missing");  // named so: the reader reports it
  CHECK_FALSE(indexed_dataset_prefix(tmp.path / "a.txt").has_value());
  CHECK_FALSE(indexed_dataset_prefix(tmp.path / "missing").has_value());
  // a file that is also a dataset's prefix: the dataset wins, and file_is_also_dataset_prefix says so
  CHECK_FALSE(file_is_also_dataset_prefix(tmp.path / "corpus.v2"));  // a prefix, no file of that name
  CHECK_FALSE(file_is_also_dataset_prefix(tmp.path / "a.txt"));      // a file, no dataset beside it
  CHECK_FALSE(file_is_also_dataset_prefix(tmp.path / "corpus.v2.idx"));
  write_text(tmp.path / "corpus.v2", "text beside the dataset");
  CHECK(file_is_also_dataset_prefix(tmp.path / "corpus.v2"));
  CHECK(indexed_dataset_prefix(tmp.path / "corpus.v2") == tmp.path / "corpus.v2");
  std::filesystem::remove(tmp.path / "corpus.v2");
  // only the .bin left: still a dataset, and opening it names the missing index
  std::filesystem::remove(tmp.path / "corpus.v2.idx");
  CHECK(indexed_dataset_prefix(tmp.path / "corpus.v2") == tmp.path / "corpus.v2");
  source_options o;
  o.seq_len = 4;
  CHECK_THROWS_WITH_AS(batch_source<>(tmp.path / "corpus.v2", o), doctest::Contains("corpus.v2.idx"), loom::input_error);
}

TEST_CASE("source: a text file gives train_gpt's byte batches, validation windows and bits/byte") {
  loom_test::scratch_dir tmp("source_bytes");
  std::mt19937 rng(7);
  std::string text;
  for (int i = 0; i < 5003; ++i) text += char('a' + rng() % 26);
  write_text(tmp.path / "t.txt", text);
  source_options o;
  o.micro_batch = 3;
  o.seq_len = 11;
  o.grad_accum = 2;
  o.seed = 99;
  o.valid_fraction = 0.15;
  batch_source<> src(tmp.path / "t.txt", o);
  CHECK(src.kind() == source_kind::bytes);
  CHECK(src.data_vocab() == 256);
  CHECK(src.tokenizer_path().empty());

  // the reference: what train_gpt did before batch_source existed
  byte_dataset ds(tmp.path / "t.txt", 12, 0.15);
  window_sampler sampler(ds.train().size(), 12, 99);
  CHECK(src.train_tokens() == ds.train().size());
  CHECK(src.validation_tokens() == ds.validation().size());
  CHECK(src.describe().find(std::to_string(ds.train().size()) + " training bytes") != std::string::npos);
  std::vector<std::int32_t> ref(6 * 12);
  for (int step = 0; step < 5; ++step) {
    sampler.next(std::span<const std::uint8_t>(ds.train()), std::span(ref));
    const auto b = src.next();
    REQUIRE(b.size() == ref.size());
    CHECK(std::vector<std::int32_t>(b.begin(), b.end()) == ref);
  }
  CHECK(src.state() == source_state{source_kind::bytes, 0, 30, 99});

  // validation: every sequential window of the last 15 % (not only whole micro-batches of 3),
  // any number of them up to all; asking for more than there are is an error, never a repeat
  const std::size_t rows = (ds.validation().size() - 1) / 11;
  REQUIRE(rows % 3 != 0);
  CHECK(src.validation_rows() == rows);
  for (std::size_t r : {std::size_t(1), std::size_t(3), std::size_t(4), rows}) {
    std::vector<std::int32_t> v(r * 12);
    sequential_windows(std::span<const std::uint8_t>(ds.validation()), 12, 0, std::span(v));
    CHECK(src.validation_batch(r) == v);
  }
  CHECK_THROWS_WITH_AS(src.validation_batch(rows + 1), doctest::Contains("validation split has"), loom::input_error);

  // bits per byte of a byte model is nats / ln 2
  const auto v = src.validation_batch(3);
  CHECK(src.byte_counting() == bytes_method::tokens_are_bytes);
  CHECK(src.target_bytes(v) == 3 * 11);
  CHECK(src.bits_per_byte(1.5, v) == doctest::Approx(1.5 / std::log(2.0)).epsilon(1e-15));

  // resume: a new source restored to the saved state continues with the same batches
  const auto saved = src.state();
  std::vector<std::vector<std::int32_t>> expect;
  for (int i = 0; i < 3; ++i) {
    const auto b = src.next();
    expect.emplace_back(b.begin(), b.end());
  }
  batch_source<> resumed(tmp.path / "t.txt", o);
  resumed.restore(saved);
  for (int i = 0; i < 3; ++i) {
    const auto b = resumed.next();
    CHECK(std::vector<std::int32_t>(b.begin(), b.end()) == expect[std::size_t(i)]);
  }

  // data parallel: rank r of 2 takes the r-th half of the single-rank double-size batch
  source_options one = o, half = o;
  one.grad_accum = 4;  // 12 windows per global batch
  batch_source<> whole(tmp.path / "t.txt", one);
  std::vector<batch_source<>> ranks;
  for (int r = 0; r < 2; ++r) {
    half.dp_rank = r;
    half.dp_size = 2;
    ranks.emplace_back(tmp.path / "t.txt", half);
  }
  for (int step = 0; step < 3; ++step) {
    const auto w = whole.next();
    for (int r = 0; r < 2; ++r) {
      const auto b = ranks[std::size_t(r)].next();
      CHECK(std::equal(b.begin(), b.end(), w.begin() + std::ptrdiff_t(r) * std::ptrdiff_t(b.size())));
    }
  }
  CHECK(ranks[0].state() == whole.state());

  // a position saved on an indexed dataset does not restore into a text file
  CHECK_THROWS_WITH_AS(src.restore({source_kind::indexed, 0, 0, 99}), doctest::Contains("indexed dataset"), loom::input_error);
}

TEST_CASE("source: an indexed dataset gives every training window once per epoch, validation in order, resume") {
  loom_test::scratch_dir tmp("source_indexed");
  const auto starts = write_positions(tmp.path / "c", 200, 3);  // int32 token = stream position
  source_options o;
  o.micro_batch = 4;
  o.seq_len = 9;
  o.grad_accum = 3;
  o.seed = 5;
  o.valid_fraction = 0.1;
  o.workers = 1;
  batch_source<> src(tmp.path / "c.idx", o);
  CHECK(src.kind() == source_kind::indexed);
  CHECK(src.path() == tmp.path / "c");
  CHECK(src.tokenizer_path() == tmp.path / "c.model");  // no c.json: the default name
  CHECK_FALSE(src.summary().has_value());
  CHECK(src.byte_counting() == bytes_method::unknown);
  const std::uint64_t train_end = starts[180], valid_end = starts[200];  // ceil(0.1 * 200) = 20 validation docs
  CHECK(src.train_tokens() == train_end);
  CHECK(src.validation_tokens() == valid_end - train_end);

  // one epoch: S = W / G global batches; windows start at multiples of T inside the training
  // documents, are T+1 consecutive positions, and no window repeats
  const std::uint64_t W = (train_end - 1) / 9, G = 12, S = W / G;
  std::set<std::int32_t> seen;
  for (std::uint64_t s = 0; s < S; ++s) {
    const auto b = src.next();
    REQUIRE(b.size() == G * 10);
    for (std::size_t r = 0; r < G; ++r) {
      const std::int32_t first = b[r * 10];
      CHECK(first % 9 == 0);
      CHECK(std::uint64_t(first) + 10 <= train_end);
      for (std::size_t i = 0; i < 10; ++i) CHECK(b[r * 10 + i] == first + std::int32_t(i));
      CHECK(seen.insert(first).second);
    }
  }
  CHECK(seen.size() == S * G);
  CHECK(src.state() == source_state{source_kind::indexed, 1, 0, 5});

  // validation: every window of the validation documents in file order, from their first
  // token, also those of a last partial micro-batch of 4
  const std::size_t vrows = (valid_end - train_end - 1) / 9;
  CHECK(src.validation_rows() == vrows);
  const auto v = src.validation_batch(vrows);
  REQUIRE(v.size() == vrows * 10);
  for (std::size_t r = 0; r < vrows; ++r)
    for (std::size_t i = 0; i < 10; ++i) CHECK(v[r * 10 + i] == std::int32_t(train_end + r * 9 + i));
  CHECK(src.validation_batch(5) == std::vector<std::int32_t>(v.begin(), v.begin() + 50));  // same windows every time
  CHECK_THROWS_AS(src.validation_batch(vrows + 1), loom::input_error);
  CHECK(std::isnan(src.bits_per_byte(2.0, v)));  // no json, no table

  // resume mid-epoch with another worker count: the same batches
  for (int i = 0; i < 7; ++i) src.next();
  const auto saved = src.state();
  std::vector<std::vector<std::int32_t>> expect;
  for (int i = 0; i < 4; ++i) {
    const auto b = src.next();
    expect.emplace_back(b.begin(), b.end());
  }
  source_options o0 = o;
  o0.workers = 0;
  batch_source<> resumed(tmp.path / "c", o0);
  resumed.restore(saved);
  for (int i = 0; i < 4; ++i) {
    const auto b = resumed.next();
    CHECK(std::vector<std::int32_t>(b.begin(), b.end()) == expect[std::size_t(i)]);
  }
  CHECK_THROWS_WITH_AS(resumed.restore({source_kind::bytes, 0, 0, 5}), doctest::Contains("a text file"), loom::input_error);

  // two data-parallel ranks of B draw disjoint windows, together those of one rank of 2B
  source_options big = o, r0 = o, r1 = o;
  big.micro_batch = 8;
  r0.dp_size = r1.dp_size = 2;
  r1.dp_rank = 1;
  batch_source<> whole(tmp.path / "c", big), a(tmp.path / "c", r0), b(tmp.path / "c", r1);
  for (int s = 0; s < 3; ++s) {
    const auto w = whole.next();
    std::multiset<std::int32_t> mw, mab;
    for (std::size_t r = 0; r < 24; ++r) mw.insert(w[r * 10]);
    const auto ba = a.next();
    for (std::size_t r = 0; r < 12; ++r) mab.insert(ba[r * 10]);
    const auto bb = b.next();
    for (std::size_t r = 0; r < 12; ++r) mab.insert(bb[r * 10]);
    CHECK(mw == mab);
    CHECK(std::set<std::int32_t>(mab.begin(), mab.end()).size() == 24);
  }
}

TEST_CASE("source: PREFIX.json vocabulary check and bits per byte from average and exact bytes") {
  loom_test::scratch_dir tmp("source_bytes_per_token");
  // 30 documents of ids in [3, 60) each ending with eod 2; a made-up tokenizer where id k
  // stands for k % 4 bytes (eod 0)
  std::mt19937 rng(11);
  indexed_dataset_writer w(tmp.path / "c", dtype::uint16);
  std::uint64_t tokens = 0, text_bytes = 0;
  for (int d = 0; d < 30; ++d) {
    std::vector<std::int32_t> doc(5 + rng() % 40);
    for (auto& t : doc) {
      t = std::int32_t(3 + rng() % 57);
      text_bytes += std::uint64_t(t % 4);
    }
    doc.push_back(2);
    tokens += doc.size();
    w.add_document(doc);
  }
  w.finalize();
  write_text(tmp.path / "c.json", "{\"vocab_size\": 60, \"eod_id\": 2, \"documents\": 30, \"tokens\": " +
                                      std::to_string(tokens) + ", \"text_bytes\": " + std::to_string(text_bytes) +
                                      ", \"tokenizer\": \"spm.model\"}");
  source_options o;
  o.micro_batch = 2;
  o.seq_len = 7;
  o.valid_fraction = 0.2;
  o.vocab = 64;
  batch_source<> src(tmp.path / "c", o);
  REQUIRE(src.summary().has_value());
  CHECK(src.data_vocab() == 60);
  CHECK(src.tokenizer_path() == tmp.path / "spm.model");
  CHECK(src.describe().find("vocabulary 60") != std::string::npos);

  const auto v = src.validation_batch(src.validation_rows());
  const double targets = double(src.validation_rows() * 7);
  CHECK(src.byte_counting() == bytes_method::average);
  CHECK(src.target_bytes(v) == doctest::Approx(targets * double(text_bytes) / double(tokens)));
  CHECK(src.byte_counting_note().find("average") != std::string::npos);

  std::vector<std::uint32_t> table(60);
  for (std::size_t k = 0; k < table.size(); ++k) table[k] = std::uint32_t(k % 4);
  table[2] = 0;
  CHECK_THROWS_WITH_AS(src.set_token_bytes(std::vector<std::uint32_t>(50)), doctest::Contains("vocabulary of 60"),
                       loom::input_error);
  src.set_token_bytes(table);
  CHECK(src.byte_counting() == bytes_method::exact);
  double bytes = 0;  // targets are row[1..T]: the first id of each row is not counted
  for (std::size_t r = 0; r < src.validation_rows(); ++r)
    for (std::size_t i = 1; i <= 7; ++i) bytes += double(v[r * 8 + i] == 2 ? 0 : v[r * 8 + i] % 4);
  CHECK(src.target_bytes(v) == bytes);
  CHECK(src.bits_per_byte(1.25, v) == doctest::Approx(1.25 * targets / bytes / std::numbers::ln2).epsilon(1e-12));

  // a model vocabulary smaller than the data's: both sizes and the fix
  o.vocab = 50;
  CHECK_THROWS_WITH_AS(batch_source<>(tmp.path / "c", o), doctest::Contains("vocabulary of 60 tokens, more than the model's 50"),
                       loom::input_error);
  // a validation split smaller than one micro-batch is evaluated whole; no validation at all is an error
  o.vocab = 64;
  o.micro_batch = 2;
  o.valid_fraction = 0;
  CHECK_THROWS_WITH_AS(batch_source<>(tmp.path / "c", o), doctest::Contains("--val-fraction"), loom::input_error);
  // a broken summary
  write_text(tmp.path / "c.json", "{\"vocab_size\": ");
  o.valid_fraction = 0.2;
  CHECK_THROWS_WITH_AS(batch_source<>(tmp.path / "c", o), doctest::Contains("not valid JSON"), loom::input_error);
}

namespace {
// A stand-in tokenizer: id k decodes to letter 'a'+k, ids 0..2 (unk, bos, eos) to nothing.
struct letters {
  int vocab_size() const { return 6; }
  bool is_byte(int) const { return false; }
  int unk_id() const { return 0; }
  std::string decode(std::span<const std::int32_t> ids) const {
    std::string s;
    for (auto id : ids)
      if (id > 2) s += char('a' + id);
    return s;
  }
};
}  // namespace

TEST_CASE("source: decode_documents marks document ends with a blank line") {
  const std::vector<std::int32_t> ids = {3, 4, 2, 5, 2, 2, 3};
  CHECK(decode_documents(letters{}, ids, 2) == "de\n\nf\n\n\n\nd");
  CHECK(decode_documents(letters{}, std::span<const std::int32_t>(), 2).empty());
  CHECK(token_byte_lengths(letters{}) == std::vector<std::uint32_t>{0, 0, 0, 1, 1, 1});
}

#ifdef LOOM_TEST_TEXT
TEST_CASE("source: token_byte_lengths sums to prepare_data's text_bytes on both corpora") {
  loom_test::scratch_dir tmp("source_token_bytes");
  const std::map<std::string, int> corpora = {{"tinyshakespeare.txt", 800}, {"zh_classics.txt", 2000}};
  for (const auto& [file, vocab] : corpora) {
    CAPTURE(file);
    // a slice of whole paragraphs
    const auto all = loom_test::read_file(loom_test::data_dir() / file);
    write_text(tmp.path / "slice.txt", all.substr(0, all.find("\n\n", 60000)));
    text::prepare_options po;
    po.inputs = {tmp.path / "slice.txt"};
    po.output_prefix = tmp.path / file;
    po.tokenizer.vocab_size = vocab;
    po.threads = 2;
    const auto rep = text::prepare(po);
    const auto tok = text::tokenizer::load(rep.model);
    const auto len = token_byte_lengths(tok);
    REQUIRE(len.size() == std::size_t(tok.vocab_size()));
    CHECK(len[std::size_t(tok.eod_id())] == 0);
    // per document: the table's sum is the length of SentencePiece's decoding of the document
    indexed_dataset ds(po.output_prefix);
    std::uint64_t total = 0;
    std::vector<std::int32_t> ids;
    for (std::size_t d = 0; d < ds.document_count(); ++d) {
      const auto a = ds.document_token_offset(d), b = ds.document_token_offset(d + 1);
      ids.resize(b - a);
      ds.read_tokens(a, ids);
      std::uint64_t sum = 0;
      for (auto id : ids) sum += len[std::size_t(id)];
      CHECK(sum == tok.decode(ids).size());
      total += sum;
    }
    CHECK(total == rep.text_bytes);
    // and batch_source reads the same from PREFIX.json
    source_options o;
    o.micro_batch = 2;
    o.seq_len = 16;
    o.vocab = vocab;
    batch_source<> src(po.output_prefix, o);
    CHECK(src.tokenizer_path() == rep.model);
    CHECK(src.data_vocab() == tok.vocab_size());
    const auto v = src.validation_batch(src.validation_rows());
    const double avg = src.target_bytes(v);
    src.set_token_bytes(len);
    // exact and average agree to a few percent over the whole validation split
    CHECK(src.target_bytes(v) == doctest::Approx(avg).epsilon(0.15));
  }
}
#endif

namespace {
void* recorded_block = nullptr;
void* record_allocate(std::size_t n) { return recorded_block = ::operator new(n, std::align_val_t(64)); }
void record_free(void* p) noexcept {
  if (p == recorded_block) recorded_block = nullptr;
  ::operator delete(p, std::align_val_t(64));
}
}  // namespace

TEST_CASE("source: a text file's batches live in the given host memory (train_gpt passes the NPU's pinned memory)") {
  loom_test::scratch_dir tmp("source_host");
  std::mt19937 rng(11);
  std::string text;
  for (int i = 0; i < 3001; ++i) text += char('a' + rng() % 26);
  write_text(tmp.path / "t.txt", text);
  source_options o;
  o.micro_batch = 2;
  o.seq_len = 7;
  o.seed = 5;
  batch_source<> plain(tmp.path / "t.txt", o);
  o.host_memory = {&record_allocate, &record_free};
  {
    batch_source<> given(tmp.path / "t.txt", o);
    REQUIRE(recorded_block != nullptr);
    for (int step = 0; step < 3; ++step) {
      const auto a = plain.next(), b = given.next();
      CHECK(static_cast<const void*>(b.data()) == recorded_block);
      CHECK(std::vector<std::int32_t>(a.begin(), a.end()) == std::vector<std::int32_t>(b.begin(), b.end()));
    }
  }
  CHECK(recorded_block == nullptr);  // freed with the source
}
