#pragma once
/// \file Megatron-compatible indexed dataset: a `.bin` file of tokens and an `.idx` index.
///
/// Format (little-endian; Megatron-LM `MMapIndexedDataset` / megatron.core
/// `IndexedDataset`, version 1; DESIGN §6):
///
///   .idx   offset  size        field
///          0       9           magic "MMIDIDX\x00\x00"
///          9       8  u64      version = 1
///          17      1  u8       dtype code: uint8=1 int8=2 int16=3 int32=4 int64=5
///                              float64=6 float32=7 uint16=8
///          18      8  u64      sequence count S
///          26      8  u64      document-index count D (= number of documents + 1)
///          34      4*S i32     sequence lengths, in tokens
///          34+4S   8*S i64     sequence pointers, byte offsets into .bin
///          34+12S  8*D i64     document indices: document d = sequences [doc[d], doc[d+1])
///   .bin   the tokens of sequence 0, then 1, ... as raw dtype elements.
///
/// The index arrays are unaligned in the file (offset 34), so the reader returns their
/// entries by value (memcpy) instead of handing out spans. Everything is 64-bit: datasets
/// larger than RAM and than 4 GiB are memory-mapped and paged in on demand.
///
/// Files written here are byte-identical to what Megatron's MMapIndexedDatasetBuilder writes
/// for the same tokens (tests/golden/megatron_idx/make_megatron_idx.py proves it).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/data/detail/mapped_file.hpp>

namespace loom::data {

/// Element type of a `.bin` file, with Megatron's numeric codes.
enum class dtype : std::uint8_t {
  uint8 = 1, int8 = 2, int16 = 3, int32 = 4, int64 = 5, float64 = 6, float32 = 7, uint16 = 8
};

/// Bytes per element of `t`.
constexpr std::size_t dtype_size(dtype t) noexcept {
  switch (t) {
    case dtype::uint8: case dtype::int8: return 1;
    case dtype::int16: case dtype::uint16: return 2;
    case dtype::int32: case dtype::float32: return 4;
    case dtype::int64: case dtype::float64: return 8;
  }
  return 0;
}

/// NumPy-style name of `t` ("uint16", ...).
constexpr std::string_view dtype_name(dtype t) noexcept {
  switch (t) {
    case dtype::uint8: return "uint8";     case dtype::int8: return "int8";
    case dtype::int16: return "int16";     case dtype::int32: return "int32";
    case dtype::int64: return "int64";     case dtype::float64: return "float64";
    case dtype::float32: return "float32"; case dtype::uint16: return "uint16";
  }
  return "unknown";
}

/// True for the codes 1..8 defined above.
constexpr bool valid_dtype_code(std::uint8_t code) noexcept { return code >= 1 && code <= 8; }

/// Token storage for a vocabulary of `vocab` ids: uint16 when every id fits (vocab <= 65536),
/// int32 otherwise. (Megatron's preprocess_data picks uint16 below 65500; both read the same.)
constexpr dtype token_dtype_for(std::size_t vocab) noexcept {
  return vocab <= 65536 ? dtype::uint16 : dtype::int32;
}

/// The 9-byte magic at the start of every `.idx` file.
inline constexpr std::array<char, 9> idx_magic = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr std::size_t idx_header_bytes = 34;  // magic + version + dtype + two counts

/// `prefix + ".idx"` and `prefix + ".bin"` (a prefix is the path without the extension).
inline std::filesystem::path idx_path(const std::filesystem::path& prefix) {
  auto p = prefix;
  p += ".idx";
  return p;
}
inline std::filesystem::path bin_path(const std::filesystem::path& prefix) {
  auto p = prefix;
  p += ".bin";
  return p;
}

/// A read-only, memory-mapped indexed dataset.
///
/// The constructor validates the whole index against the data file once (O(S + D)):
/// magic, version, dtype code, counts against the index file size, every sequence inside
/// the data file, document indices non-decreasing from 0 to S. Any violation throws
/// loom::input_error naming the file, the problem and the fix. After that, accessors do not
/// check again. Move-only; cheap to open twice (e.g. a train and a validation loader).
class indexed_dataset {
 public:
  indexed_dataset() = default;
  explicit indexed_dataset(const std::filesystem::path& prefix)
      : prefix_(prefix),
        idx_(idx_path(prefix), "index file", open_fix),
        bin_(bin_path(prefix), "data file", open_fix) {
    validate();
  }

  const std::filesystem::path& prefix() const noexcept { return prefix_; }
  dtype token_dtype() const noexcept { return dtype_; }
  std::size_t token_bytes() const noexcept { return dtype_size(dtype_); }

  /// Number of sequences S (Megatron "sequence count"; one per document when written here).
  std::size_t sequence_count() const noexcept { return seq_count_; }
  /// Number of documents = document-index entries - 1.
  std::size_t document_count() const noexcept { return doc_index_count_ - 1; }
  /// Sum of all sequence lengths, in tokens.
  std::uint64_t token_count() const noexcept { return token_count_; }
  /// True when sequence i+1 starts where sequence i ends and sequence 0 starts at byte 0, so
  /// the data file is one token stream (always true for files written by loom or Megatron).
  bool contiguous() const noexcept { return contiguous_; }

  /// Length in tokens of sequence `i` (< sequence_count()).
  std::int32_t sequence_length(std::size_t i) const noexcept {
    return load<std::int32_t>(idx_header_bytes + 4 * i);
  }
  /// Byte offset of sequence `i` in the data file.
  std::int64_t sequence_pointer(std::size_t i) const noexcept {
    return load<std::int64_t>(idx_header_bytes + 4 * seq_count_ + 8 * i);
  }
  /// Document-index entry `d` (< document_count() + 1): first sequence of document d.
  std::int64_t document_index(std::size_t d) const noexcept {
    return load<std::int64_t>(idx_header_bytes + 12 * seq_count_ + 8 * d);
  }
  /// Token offset (in the contiguous stream) where document `d` starts; d == document_count()
  /// gives the end of the stream. Requires contiguous().
  std::uint64_t document_token_offset(std::size_t d) const noexcept {
    const auto s = static_cast<std::size_t>(document_index(d));
    return s == seq_count_ ? token_count_ : static_cast<std::uint64_t>(sequence_pointer(s)) / token_bytes();
  }

  /// Raw bytes of the data file.
  std::span<const std::byte> data_bytes() const noexcept { return bin_.bytes(); }

  /// Tokens of sequence `i` as `T`, which must match token_dtype() (else loom::input_error).
  template <class T>
  std::span<const T> sequence(std::size_t i) const {
    check_type<T>();
    const auto* p = bin_.data() + sequence_pointer(i);
    return {reinterpret_cast<const T*>(p), static_cast<std::size_t>(sequence_length(i))};
  }

  /// Copies tokens [first, first + out.size()) of the contiguous stream into `out` (=),
  /// converted to int32. Throws loom::input_error if the data file is not one contiguous
  /// stream (!contiguous(): token_count() then need not fit the file), if the range passes the
  /// end, if a value does not fit int32, or (vocab > 0) if a token id is negative or >= vocab.
  void read_tokens(std::uint64_t first, std::span<std::int32_t> out, std::int64_t vocab = 0) const {
    if (!contiguous_)
      throw input_error("indexed dataset '" + prefix_.string() + "': the data file is not one contiguous token stream "
                        "(sequence pointers have gaps or overlap), so it cannot be read as one; rewrite it with prepare_data");
    if (first > token_count_ || out.size() > token_count_ - first)
      throw input_error("indexed dataset '" + prefix_.string() + "': token range [" + std::to_string(first) +
                        ", " + std::to_string(first + out.size()) + ") passes the end (" +
                        std::to_string(token_count_) + " tokens); use a shorter window");
    const std::byte* src = bin_.data() + first * token_bytes();
    const std::size_t n = out.size();
    std::int64_t lo = 0, hi = 0;
    switch (dtype_) {
      case dtype::uint16: convert<std::uint16_t>(src, out.data(), n, lo, hi); break;
      case dtype::int32: convert<std::int32_t>(src, out.data(), n, lo, hi); break;
      case dtype::uint8: convert<std::uint8_t>(src, out.data(), n, lo, hi); break;
      case dtype::int8: convert<std::int8_t>(src, out.data(), n, lo, hi); break;
      case dtype::int16: convert<std::int16_t>(src, out.data(), n, lo, hi); break;
      case dtype::int64: convert<std::int64_t>(src, out.data(), n, lo, hi); break;
      default: break;  // float dtypes are rejected by validate()
    }
    if (lo < 0 || hi > std::numeric_limits<std::int32_t>::max() || (vocab > 0 && hi >= vocab)) {
      const std::int64_t bad = (lo < 0) ? lo : hi;
      std::uint64_t at = first;
      for (std::size_t k = 0; k < n; ++k)
        if (value_at(src, k) == bad) { at = first + k; break; }
      throw input_error("indexed dataset '" + prefix_.string() + "': token " + std::to_string(bad) +
                        " at position " + std::to_string(at) + " is outside the vocabulary [0, " +
                        std::to_string(vocab > 0 ? vocab : std::int64_t(std::numeric_limits<std::int32_t>::max())) +
                        "); prepare the data with the model's tokenizer or raise the model's vocab");
    }
  }

 private:
  template <class T>
  T load(std::size_t offset) const noexcept {
    T v;
    std::memcpy(&v, idx_.data() + offset, sizeof(T));
    return v;
  }
  template <class T>
  static void convert(const std::byte* src, std::int32_t* dst, std::size_t n, std::int64_t& lo, std::int64_t& hi) {
    const T* s = reinterpret_cast<const T*>(src);
    T mn = n ? s[0] : T{}, mx = mn;
    for (std::size_t k = 0; k < n; ++k) {
      const T v = s[k];
      dst[k] = static_cast<std::int32_t>(v);
      mn = v < mn ? v : mn;
      mx = v > mx ? v : mx;
    }
    lo = static_cast<std::int64_t>(mn);
    hi = static_cast<std::int64_t>(mx);
  }
  std::int64_t value_at(const std::byte* src, std::size_t k) const noexcept {
    switch (dtype_) {
      case dtype::uint16: return reinterpret_cast<const std::uint16_t*>(src)[k];
      case dtype::int32: return reinterpret_cast<const std::int32_t*>(src)[k];
      case dtype::uint8: return reinterpret_cast<const std::uint8_t*>(src)[k];
      case dtype::int8: return reinterpret_cast<const std::int8_t*>(src)[k];
      case dtype::int16: return reinterpret_cast<const std::int16_t*>(src)[k];
      case dtype::int64: return reinterpret_cast<const std::int64_t*>(src)[k];
      default: return 0;
    }
  }
  template <class T>
  void check_type() const {
    const bool ok = (std::is_same_v<T, std::uint16_t> && dtype_ == dtype::uint16) ||
                    (std::is_same_v<T, std::int32_t> && dtype_ == dtype::int32) ||
                    (std::is_same_v<T, std::uint8_t> && dtype_ == dtype::uint8) ||
                    (std::is_same_v<T, std::int8_t> && dtype_ == dtype::int8) ||
                    (std::is_same_v<T, std::int16_t> && dtype_ == dtype::int16) ||
                    (std::is_same_v<T, std::int64_t> && dtype_ == dtype::int64);
    if (!ok)
      throw input_error("indexed dataset '" + prefix_.string() + "' stores " + std::string(dtype_name(dtype_)) +
                        " tokens; read it with that type or use read_tokens()");
  }
  static constexpr std::string_view open_fix =
      "pass the dataset prefix (the path without .idx/.bin) of files written by prepare_data or Megatron";
  [[noreturn]] void corrupt(const std::string& problem, const std::string& fix) const {
    throw input_error("index file '" + idx_path(prefix_).string() + "': " + problem + "; " + fix);
  }

  void validate() {
    const std::string rebuild = "rebuild it with prepare_data (or Megatron's preprocess_data)";
    const std::size_t isz = idx_.size();
    if (isz < idx_header_bytes)
      corrupt("only " + std::to_string(isz) + " bytes, shorter than the 34-byte header", rebuild);
    if (std::memcmp(idx_.data(), idx_magic.data(), idx_magic.size()) != 0)
      corrupt("wrong magic (expected \"MMIDIDX\\x00\\x00\"; not a Megatron mmap index)",
              "pass the prefix of a Megatron/loom .idx file or " + rebuild);
    const auto version = load<std::uint64_t>(9);
    if (version != 1) corrupt("unsupported version " + std::to_string(version) + " (only 1 is defined)", rebuild);
    const auto code = load<std::uint8_t>(17);
    if (!valid_dtype_code(code))
      corrupt("unknown dtype code " + std::to_string(code) + " (valid: 1..8)", rebuild);
    dtype_ = static_cast<dtype>(code);
    if (dtype_ == dtype::float32 || dtype_ == dtype::float64)
      corrupt("dtype " + std::string(dtype_name(dtype_)) + " is not a token type", "tokenize the corpus into integer ids");
    seq_count_ = load<std::uint64_t>(18);
    doc_index_count_ = load<std::uint64_t>(26);
    // 34 + 12 S + 8 D <= file size, without overflow.
    const std::uint64_t room = isz - idx_header_bytes;
    if (seq_count_ > room / 12 || doc_index_count_ > (room - 12 * seq_count_) / 8)
      corrupt("header claims " + std::to_string(seq_count_) + " sequences and " +
                  std::to_string(doc_index_count_) + " document indices, which need more than the file's " +
                  std::to_string(isz) + " bytes (truncated?)",
              rebuild);
    if (doc_index_count_ < 1) corrupt("document index is empty (it must start with 0)", rebuild);

    const std::size_t bsz = bin_.size(), w = token_bytes();
    std::uint64_t expect = 0;
    contiguous_ = true;
    token_count_ = 0;
    for (std::size_t i = 0; i < seq_count_; ++i) {
      const std::int32_t len = sequence_length(i);
      const std::int64_t ptr = sequence_pointer(i);
      if (len < 0) corrupt("sequence " + std::to_string(i) + " has negative length " + std::to_string(len), rebuild);
      if (ptr < 0 || std::uint64_t(ptr) % w != 0 || std::uint64_t(ptr) > bsz ||
          std::uint64_t(len) * w > bsz - std::uint64_t(ptr))
        corrupt("sequence " + std::to_string(i) + " (" + std::to_string(len) + " tokens at byte " + std::to_string(ptr) +
                    ") lies past the end of the data file '" + bin_path(prefix_).string() + "' (" + std::to_string(bsz) +
                    " bytes)",
                "the .bin and .idx do not belong together or the .bin is truncated; " + rebuild);
      if (std::uint64_t(ptr) != expect) contiguous_ = false;
      expect = std::uint64_t(ptr) + std::uint64_t(len) * w;
      token_count_ += std::uint64_t(len);
    }
    std::int64_t prev = 0;
    for (std::size_t d = 0; d < doc_index_count_; ++d) {
      const std::int64_t v = document_index(d);
      if ((d == 0 && v != 0) || v < prev || std::uint64_t(v) > seq_count_)
        corrupt("document index " + std::to_string(d) + " = " + std::to_string(v) +
                    " is not a non-decreasing sequence number starting at 0 and at most " + std::to_string(seq_count_),
                rebuild);
      prev = v;
    }
    if (std::uint64_t(prev) != seq_count_)
      corrupt("documents cover " + std::to_string(prev) + " sequences but the index has " + std::to_string(seq_count_),
              rebuild);
  }

  std::filesystem::path prefix_;
  detail::mapped_file idx_, bin_;
  dtype dtype_ = dtype::uint16;
  std::size_t seq_count_ = 0, doc_index_count_ = 1;
  std::uint64_t token_count_ = 0;
  bool contiguous_ = true;
};

/// Writes an indexed dataset the way Megatron's MMapIndexedDatasetBuilder does:
/// add_sequence() appends tokens to the .bin, end_document() closes a document,
/// finalize() writes the .idx. Both files are written under temporary names and renamed into
/// place only by finalize(), so an interrupted run never leaves a half-written dataset (and
/// never overwrites a good one). Throws loom::input_error on a token that does not fit the
/// dtype (e.g. >= 65536 for uint16) or a sequence longer than 2^31-1 tokens.
class indexed_dataset_writer {
 public:
  indexed_dataset_writer(const std::filesystem::path& prefix, dtype t)
      : prefix_(prefix), dtype_(t), bin_(bin_path(prefix)) {
    if (t == dtype::float32 || t == dtype::float64)
      throw input_error("indexed_dataset_writer: dtype " + std::string(dtype_name(t)) +
                        " is not a token type; use token_dtype_for(vocab)");
    doc_index_.push_back(0);
  }

  /// Appends one sequence (=, one entry in the index). Values must fit the dtype.
  void add_sequence(std::span<const std::int32_t> tokens) {
    if (tokens.size() > std::size_t(std::numeric_limits<std::int32_t>::max()))
      throw input_error("indexed_dataset_writer: a sequence of " + std::to_string(tokens.size()) +
                        " tokens exceeds the format's int32 length; split the document");
    switch (dtype_) {
      case dtype::uint16: put<std::uint16_t>(tokens); break;
      case dtype::int32: put<std::int32_t>(tokens); break;
      case dtype::uint8: put<std::uint8_t>(tokens); break;
      case dtype::int8: put<std::int8_t>(tokens); break;
      case dtype::int16: put<std::int16_t>(tokens); break;
      case dtype::int64: put<std::int64_t>(tokens); break;
      default: break;
    }
    lengths_.push_back(static_cast<std::int32_t>(tokens.size()));
  }
  /// Marks the end of a document: the sequences added since the previous call form one.
  void end_document() { doc_index_.push_back(static_cast<std::int64_t>(lengths_.size())); }
  /// add_sequence(tokens) then end_document().
  void add_document(std::span<const std::int32_t> tokens) {
    add_sequence(tokens);
    end_document();
  }

  std::size_t sequence_count() const noexcept { return lengths_.size(); }
  std::size_t document_count() const noexcept { return doc_index_.size() - 1; }
  std::uint64_t bytes_written() const noexcept { return bin_.bytes_written(); }

  /// Writes the .idx and moves both files into place (fsynced). Call once.
  void finalize() {
    detail::atomic_file idx(idx_path(prefix_));
    idx.write(idx_magic.data(), idx_magic.size());
    const std::uint64_t version = 1, s = lengths_.size(), d = doc_index_.size();
    const auto code = static_cast<std::uint8_t>(dtype_);
    idx.write(&version, 8);
    idx.write(&code, 1);
    idx.write(&s, 8);
    idx.write(&d, 8);
    idx.write(lengths_.data(), 4 * lengths_.size());
    std::vector<std::int64_t> ptr(lengths_.size());
    std::int64_t at = 0;
    for (std::size_t i = 0; i < lengths_.size(); ++i) {
      ptr[i] = at;
      at += std::int64_t(lengths_[i]) * std::int64_t(dtype_size(dtype_));
    }
    idx.write(ptr.data(), 8 * ptr.size());
    idx.write(doc_index_.data(), 8 * doc_index_.size());
    bin_.commit();
    idx.commit();
  }

 private:
  template <class T>
  void put(std::span<const std::int32_t> tokens) {
    constexpr std::int64_t lo = std::numeric_limits<T>::min(), hi = std::numeric_limits<T>::max();
    scratch_.resize(tokens.size() * sizeof(T));
    T* out = reinterpret_cast<T*>(scratch_.data());
    for (std::size_t k = 0; k < tokens.size(); ++k) {
      const std::int64_t v = tokens[k];
      if (v < lo || v > hi)
        throw input_error("indexed_dataset_writer: token " + std::to_string(v) + " does not fit " +
                          std::string(dtype_name(dtype_)) + "; use token_dtype_for(vocab) (int32 above 65536 ids)");
      out[k] = static_cast<T>(v);
    }
    bin_.write(scratch_.data(), scratch_.size());
  }

  std::filesystem::path prefix_;
  dtype dtype_;
  detail::atomic_file bin_;
  std::vector<std::int32_t> lengths_;
  std::vector<std::int64_t> doc_index_;
  std::vector<std::byte> scratch_;
};

}  // namespace loom::data
