// libFuzzer target for the Megatron indexed dataset reader (data::indexed_dataset, data::loader):
// the .idx header (magic, version, dtype code, counts), the sequence lengths and pointers and
// the document index, checked against the .bin file's length.
//
// Input: bytes [0, 2) = n (little-endian), then the .idx file (n bytes), then the .bin file
// (the rest) — loom_fuzz::split2.
// What must hold: a malformed pair ends in loom::input_error; for a pair the reader accepts,
// every sequence it describes is read whole as its own element type, the document index is
// non-decreasing within [0, S], the contiguous stream is read through read_tokens (which must
// refuse a non-contiguous file), and a shuffled loader over the training split yields batches
// or an input_error (a token outside the vocabulary) — never a crash, undefined behaviour, a
// leak or a read outside either file (ASan + UBSan, tests/fuzz/run.sh indexed_dataset).
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/data/indexed_dataset.hpp>
#include <loom/data/loader.hpp>

#include "fuzz_common.hpp"

namespace {

using loom::data::dtype;

// Sum of the elements of sequence i read as its own type: touches every byte it spans.
std::int64_t sequence_sum(const loom::data::indexed_dataset& ds, std::size_t i) {
  auto sum = [](auto span) {
    std::int64_t s = 0;
    for (auto v : span) s += static_cast<std::int64_t>(v) & 0xff;
    return s;
  };
  switch (ds.token_dtype()) {
    case dtype::uint8: return sum(ds.sequence<std::uint8_t>(i));
    case dtype::int8: return sum(ds.sequence<std::int8_t>(i));
    case dtype::int16: return sum(ds.sequence<std::int16_t>(i));
    case dtype::uint16: return sum(ds.sequence<std::uint16_t>(i));
    case dtype::int32: return sum(ds.sequence<std::int32_t>(i));
    case dtype::int64: return sum(ds.sequence<std::int64_t>(i));
    default: loom_fuzz::require(false, "the reader accepted a float dtype"); return 0;
  }
}

void read_everything(const loom::data::indexed_dataset& ds) {
  std::int64_t checksum = 0;
  for (std::size_t i = 0; i < ds.sequence_count(); ++i) {
    loom_fuzz::require(ds.sequence_length(i) >= 0, "an accepted sequence has a negative length");
    checksum += sequence_sum(ds, i);
  }
  std::int64_t prev = 0;
  for (std::size_t d = 0; d <= ds.document_count(); ++d) {
    const std::int64_t v = ds.document_index(d);
    loom_fuzz::require(v >= prev && std::uint64_t(v) <= ds.sequence_count(), "document index out of order or range");
    prev = v;
  }
  std::vector<std::int32_t> chunk(64);
  if (ds.contiguous()) {
    for (std::size_t d = 0; d <= ds.document_count(); ++d)
      loom_fuzz::require(ds.document_token_offset(d) <= ds.token_count(), "a document starts past the stream");
    for (std::uint64_t first = 0; first < ds.token_count(); first += chunk.size()) {
      const std::size_t n = std::size_t(std::min<std::uint64_t>(chunk.size(), ds.token_count() - first));
      try {
        ds.read_tokens(first, std::span(chunk.data(), n));
      } catch (const loom::input_error& e) {  // a value that does not fit int32 (int64 data)
        loom_fuzz::rejected(e);
      }
    }
  } else {
    bool refused = false;
    try {
      ds.read_tokens(0, std::span(chunk.data(), std::size_t(std::min<std::uint64_t>(1, ds.token_count()))));
    } catch (const loom::input_error&) {
      refused = true;
    }
    loom_fuzz::require(refused, "read_tokens read a non-contiguous data file as one stream");
  }
  (void)checksum;
}

// The training path: split by document, a shuffled loader without worker threads, a few batches.
void load_batches(loom::data::indexed_dataset ds) {
  const auto [train, valid] = loom::data::split_train_valid(ds, 0.25);
  loom::data::loader_options o;
  o.batch = 1;
  o.seq_len = 2;
  o.workers = 0;
  o.vocab = 300;
  o.documents = train;
  loom::data::loader<> l(std::move(ds), o);
  for (int k = 0; k < 4; ++k) {
    const auto b = l.next();
    for (const std::int32_t t : b) loom_fuzz::require(t >= 0 && t < 300, "a loader batch holds a token outside the vocabulary");
  }
  l.restore({1, l.windows_per_epoch(), 7});
  (void)l.next();
  (void)valid;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const loom_fuzz::scratch_dir dir("indexed_dataset");
  const auto [idx, bin] = loom_fuzz::split2(data, size);
  const auto prefix = dir.path() / "d";
  loom_fuzz::write_file(loom::data::idx_path(prefix), idx);
  loom_fuzz::write_file(loom::data::bin_path(prefix), bin);
  try {
    loom::data::indexed_dataset ds(prefix);
    read_everything(ds);
    loom_fuzz::accepted("index and data file");
    load_batches(std::move(ds));
    loom_fuzz::accepted("loader batches");
  } catch (const loom::input_error& e) {
    loom_fuzz::rejected(e);
  }
  return 0;
}
