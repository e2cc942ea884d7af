#pragma once
/// \file loom::data::batch_source — where the trainer's token windows come from: a UTF-8 text
/// file read as bytes (vocabulary 256; the quickstart) or an indexed dataset written by
/// prepare_data (SentencePiece ids), behind one type that
///   * yields global batches: grad_accum * micro_batch windows of T+1 ids, row-major (inputs
///     row[0..T), targets row[1..T]) — the layout train::trainer::step takes;
///   * holds a fixed validation set: every consecutive window of the validation split, in
///     order (not rounded to micro-batches: the trainers evaluate a last partial one);
///   * knows how many UTF-8 bytes of text the validation targets stand for, so a loss in
///     nats/token becomes bits per byte, comparable across tokenizers;
///   * has a position, state() / restore(), that a checkpoint saves to resume the data exactly.
///
///   byte file      split at byte (1 - valid_fraction) * size (data::byte_dataset); training
///                  windows at uniformly random offsets (data::window_sampler: draw j is a pure
///                  function of (seed, j)). Bits per byte = nats / ln 2 (a token is a byte).
///   indexed data   split by document (data::split_train_valid: the last ceil(f * D) documents
///                  validate); training windows from a shuffled data::loader (every window once
///                  per epoch, disjoint across data-parallel ranks, prefetched on a worker
///                  thread), validation windows from an unshuffled loader. Bits per byte from
///                  the exact bytes of the target tokens (set_token_bytes with a table from
///                  token_byte_lengths(tokenizer)), else from prepare_data's PREFIX.json
///                  average text_bytes / tokens.
///
/// A path names an indexed dataset when it ends in .idx or .bin, or when PATH.idx or PATH.bin
/// exists (indexed_dataset_prefix); anything else is read as a text file.
///
/// Checkpoints: save the four integers of state() (kind, epoch, index, seed) from rank 0 and
/// pass them to restore() after constructing the source with the same data, seq_len and
/// valid_fraction; the batches continue exactly as an uninterrupted run's (tested). For
/// indexed data the position counts global window slots, so it survives a change of
/// micro_batch, grad_accum or dp_size; for a byte file it counts random draws.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <numbers>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <loom/core/error.hpp>
#include <loom/core/json.hpp>
#include <loom/data/byte_dataset.hpp>
#include <loom/data/detail/checksum.hpp>
#include <loom/data/indexed_dataset.hpp>
#include <loom/data/loader.hpp>
#include <loom/data/sampler.hpp>
#include <loom/device/cpu.hpp>
#include <loom/core/device.hpp>

namespace loom::data {

/// What a batch_source reads.
enum class source_kind : std::uint8_t {
  bytes = 0,    ///< a UTF-8 text file, one token per byte (vocabulary 256)
  indexed = 1,  ///< a Megatron indexed dataset (PREFIX.idx + PREFIX.bin) written by prepare_data
};

/// The prefix of the indexed dataset `path` names, or nullopt when it names something else (a
/// text file, or nothing): "out/c.idx" and "out/c.bin" give "out/c"; "out/c" gives "out/c"
/// when out/c.idx or out/c.bin exists. The files are not opened or validated here.
inline std::optional<std::filesystem::path> indexed_dataset_prefix(const std::filesystem::path& path) {
  const auto ext = path.extension();
  if (ext == ".idx" || ext == ".bin") return std::filesystem::path(path).replace_extension();
  std::error_code ec;
  if (std::filesystem::exists(idx_path(path), ec) || std::filesystem::exists(bin_path(path), ec)) return path;
  return std::nullopt;
}

/// True when `path` is a regular file and also, as a prefix, names an indexed dataset beside it
/// ("in.txt" with "in.txt.idx"): indexed_dataset_prefix takes the dataset, so a caller that
/// means the file's bytes is told (train_gpt prints a note). Never throws.
inline bool file_is_also_dataset_prefix(const std::filesystem::path& path) {
  std::error_code ec;
  const auto prefix = indexed_dataset_prefix(path);
  return prefix && *prefix == path && std::filesystem::is_regular_file(path, ec);
}

/// prepare_data's PREFIX.json summary (the fields a trainer needs).
struct dataset_summary {
  std::int64_t vocab_size = 0;      ///< tokenizer vocabulary (ids in [0, vocab_size))
  std::int64_t eod_id = -1;         ///< end-of-document token
  std::uint64_t documents = 0;      ///< documents in the dataset
  std::uint64_t tokens = 0;         ///< tokens including one eod per document
  std::uint64_t text_bytes = 0;     ///< UTF-8 bytes of the documents' text (eods excluded)
  std::filesystem::path tokenizer;  ///< the SentencePiece .model (next to the .json)
};

/// Reads PREFIX.json; nullopt when the file does not exist (datasets from other tools).
/// Throws loom::input_error when it exists but is not valid JSON or not an object, fails the
/// checksum it records (detail::read_summary_json), when an integer field is not an integer of
/// its member's type (a float, a negative count), or when "tokenizer" is not a string. Missing
/// fields keep dataset_summary's defaults.
inline std::optional<dataset_summary> read_dataset_summary(const std::filesystem::path& prefix) {
  std::filesystem::path file = prefix;
  file += ".json";
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return std::nullopt;
  (void)detail::read_summary_json(file);  // its recorded checksum
  std::ifstream in(file, std::ios::binary);
  nlohmann::json j;
  try {
    j = parse_json(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()),
                   "dataset summary '" + file.string() + "'", "re-run prepare_data or delete the file");
  } catch (const nlohmann::json::exception& e) {
    throw input_error("dataset summary '" + file.string() + "' is not valid JSON (" + e.what() +
                      "); re-run prepare_data or delete the file");
  }
  if (!j.is_object())
    throw input_error("dataset summary '" + file.string() + "' is not a JSON object; re-run prepare_data or delete the file");
  // Each integer range-checked as the type it becomes (a float 1e63 or -1 tokens is an error).
  auto integer = [&]<class T>(const char* key, T otherwise) -> T {
    const auto it = j.find(key);
    if (it == j.end()) return otherwise;
    if (const auto v = json_integer<T>(*it)) return *v;
    throw input_error("dataset summary '" + file.string() + "': \"" + key + "\" is " + it->dump().substr(0, 40) +
                      ", not an integer in [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
                      std::to_string(std::numeric_limits<T>::max()) + "]; re-run prepare_data or delete the file");
  };
  dataset_summary s;
  s.vocab_size = integer("vocab_size", std::int64_t(0));
  s.eod_id = integer("eod_id", std::int64_t(-1));
  s.documents = integer("documents", std::uint64_t(0));
  s.tokens = integer("tokens", std::uint64_t(0));
  s.text_bytes = integer("text_bytes", std::uint64_t(0));
  const auto tok = j.find("tokenizer");
  if (tok != j.end() && !tok->is_string())
    throw input_error("dataset summary '" + file.string() + "': \"tokenizer\" is a JSON " + tok->type_name() +
                      ", not a file name; re-run prepare_data or delete the file");
  s.tokenizer = prefix.parent_path() / (tok != j.end() ? tok->get<std::string>() : prefix.filename().string() + ".model");
  return s;
}

/// Checks PREFIX.bin and PREFIX.idx against the size and XXH3-64 that PREFIX.json records for
/// them (data/detail/checksum.hpp). Returns false when there is no PREFIX.json or it records
/// none (written before prepare_data recorded them): nothing is checked. Throws
/// loom::input_error naming the file that differs (or PREFIX.json, when it fails its own
/// checksum). Cost: one read of both files (XXH3 hashes faster than a disk reads; measured in
/// docs/reliability.md).
inline bool verify_dataset_files(const std::filesystem::path& prefix) {
  std::filesystem::path file = prefix;
  file += ".json";
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return false;
  const nlohmann::json j = detail::read_summary_json(file);
  const bool idx = detail::check_recorded_file(j, "idx", idx_path(prefix), "index file", file);
  const bool bin = detail::check_recorded_file(j, "bin", bin_path(prefix), "data file", file);
  return idx && bin;
}

/// The SentencePiece model of the dataset at `prefix`: PREFIX.json's "tokenizer" (a file name,
/// relative to the .json's folder) when that file exists, unless PREFIX.model exists too and
/// the recorded file no longer has the checksum the .json records for it (a dataset that
/// prepare_data kept as PREFIX.previous-<k>: its .json names the newer dataset's model); else
/// PREFIX.model when it exists (the dataset was copied or renamed under another prefix, and its
/// .json, which cannot be edited without breaking its checksum, still names the old file;
/// tokenizer::load checks PREFIX.model against the .json's recorded checksum all the same);
/// else the recorded name. Without a PREFIX.json, PREFIX.model. The file may not exist:
/// missing_dataset_tokenizer says why.
inline std::filesystem::path dataset_tokenizer_path(const std::filesystem::path& prefix) {
  auto own = prefix, json = prefix;
  own += ".model";
  json += ".json";
  const auto s = read_dataset_summary(prefix);
  if (!s) return own;
  std::error_code ec;
  if (!std::filesystem::exists(own, ec) || s->tokenizer == own) return s->tokenizer;
  if (!std::filesystem::exists(s->tokenizer, ec)) return own;
  return detail::matches_recorded_file(detail::read_summary_json(json), "tokenizer", s->tokenizer) ? s->tokenizer : own;
}

/// Why the dataset at `prefix` has no tokenizer to load: one line naming PREFIX.json's
/// "tokenizer" field and what it records, the files looked for, and the fix (copy the .model
/// next to the dataset as PREFIX.model); nullopt when dataset_tokenizer_path(prefix) exists.
/// Throws what read_dataset_summary throws.
inline std::optional<std::string> missing_dataset_tokenizer(const std::filesystem::path& prefix) {
  const auto path = dataset_tokenizer_path(prefix);
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) return std::nullopt;
  auto own = prefix, json = prefix;
  own += ".model";
  json += ".json";
  const std::string copy = "copy the SentencePiece .model the data was tokenized with (prepare_data's PREFIX.model) "
                           "to '" + own.string() + "'";
  const auto s = read_dataset_summary(prefix);
  if (!s)
    return "dataset '" + prefix.string() + "' has no tokenizer: there is no '" + json.string() + "' to name one and '" +
           own.string() + "' does not exist; " + copy;
  const std::string field = "'" + json.string() + "' names its tokenizer \"" + s->tokenizer.filename().string() +
                            "\" (field \"tokenizer\", a file beside the .json)";
  if (s->tokenizer == own)
    return "dataset '" + prefix.string() + "': " + field + ", but '" + own.string() + "' does not exist (was the dataset "
           "copied without it?); " + copy;
  return "dataset '" + prefix.string() + "': " + field + ", but neither '" + s->tokenizer.string() + "' nor '" +
         own.string() + "' exists (was the dataset copied or renamed without it?); " + copy;
}

/// The text of `ids` decoded by `tok`, with "\n\n" (a blank line, prepare_data's default
/// document separator) for each end-of-document id `eod` (which decodes to nothing on its
/// own). For showing samples; `Tok` as for token_byte_lengths.
template <class Tok>
std::string decode_documents(const Tok& tok, std::span<const std::int32_t> ids, std::int32_t eod) {
  std::string out;
  std::size_t at = 0;
  for (std::size_t i = 0; i <= ids.size(); ++i)
    if (i == ids.size() || ids[i] == eod) {
      out += tok.decode(ids.subspan(at, i - at));
      if (i < ids.size()) out += "\n\n";
      at = i + 1;
    }
  return out;
}

/// UTF-8 bytes of text each id of `tok` stands for: a byte-fallback piece <0xNN> is 1, the
/// unknown id and control ids (bos, eos = end of document) are 0, any other piece the length
/// of its decoded text (SentencePiece's "▁" decodes to one space). The sum over a dataset's
/// tokens equals the text bytes it encodes (tested against prepare_data's text_bytes), so the
/// bytes behind any window are exact even when the window cuts a character's byte pieces.
/// `Tok` is data::text::tokenizer or anything with vocab_size(), is_byte(id), unk_id() and
/// decode(std::span<const std::int32_t>) -> std::string.
template <class Tok>
std::vector<std::uint32_t> token_byte_lengths(const Tok& tok) {
  std::vector<std::uint32_t> len(static_cast<std::size_t>(tok.vocab_size()));
  for (std::int32_t id = 0; id < std::int32_t(len.size()); ++id) {
    if (tok.is_byte(id)) len[std::size_t(id)] = 1;
    else if (id == tok.unk_id()) len[std::size_t(id)] = 0;
    else len[std::size_t(id)] = std::uint32_t(tok.decode(std::span<const std::int32_t>(&id, 1)).size());
  }
  return len;
}

/// How batch_source::target_bytes counts bytes.
enum class bytes_method : std::uint8_t {
  tokens_are_bytes,  ///< byte file: one byte per token
  exact,             ///< indexed: per-id byte lengths of the target tokens (set_token_bytes)
  average,           ///< indexed: targets * PREFIX.json text_bytes / tokens
  unknown,           ///< indexed without a table or a PREFIX.json: bits per byte is NaN
};

/// Whether batch_source checked an indexed dataset's files against its PREFIX.json.
enum class checksum_state : std::uint8_t {
  verified,       ///< .bin and .idx match the recorded sizes and XXH3-64
  skipped,        ///< source_options::verify_checksums was false
  none_recorded,  ///< PREFIX.json records no checksums
  no_summary,     ///< no PREFIX.json (or a text file)
};

/// A batch_source's position: what a checkpoint stores (four integers).
struct source_state {
  source_kind kind = source_kind::bytes;
  std::uint64_t epoch = 0;  ///< indexed: epochs completed; bytes: 0
  std::uint64_t index = 0;  ///< indexed: window slots of this epoch consumed by all ranks; bytes: windows drawn by all ranks
  std::uint64_t seed = 0;   ///< shuffle / draw seed
  friend bool operator==(const source_state&, const source_state&) = default;
};

/// Shapes and seeds of a run (see the file comment).
struct source_options {
  std::size_t micro_batch = 1;  ///< B: windows per micro-batch
  std::size_t seq_len = 1;      ///< T: a window holds T+1 ids
  std::size_t grad_accum = 1;   ///< micro-batches per optimizer step; a global batch has grad_accum*B windows
  double valid_fraction = 0.1;  ///< held out: bytes of a text file, documents of an indexed dataset
  std::uint64_t seed = 0;       ///< training order
  std::int64_t vocab = 0;       ///< the model's vocabulary: indexed ids >= vocab are a loom::input_error (0: unchecked)
  int workers = 1;              ///< indexed: loader prefetch threads (0: read on the caller)
  int dp_rank = 0, dp_size = 1; ///< data parallelism: ranks draw disjoint windows
  bool verify_checksums = true; ///< indexed: check .bin and .idx against PREFIX.json (verify_dataset_files)
  /// Where the training batches live (empty: D::allocate_host).
  device::host_allocator host_memory{};
};

/// See the file comment. Move-only. D selects the host allocator for the loader's buffers.
template <device::device_policy D = device::cpu>
class batch_source {
 public:
  /// Opens `path` (a text file or an indexed dataset, see indexed_dataset_prefix). Throws
  /// loom::input_error for a missing, empty, binary or too-short file; a corrupt dataset (a
  /// .bin or .idx that fails the checksums of PREFIX.json, unless options.verify_checksums is
  /// false, or breaks the format); a
  /// dataset whose vocabulary (PREFIX.json) exceeds options.vocab; or (indexed) a validation
  /// split with no document or shorter than one window.
  batch_source(const std::filesystem::path& path, const source_options& o) : path_(path), opt_(o) {
    if (o.micro_batch < 1 || o.seq_len < 1 || o.grad_accum < 1)
      throw input_error("batch_source: micro_batch, seq_len and grad_accum must be >= 1");
    if (o.dp_size < 1 || o.dp_rank < 0 || o.dp_rank >= o.dp_size)
      throw input_error("batch_source: dp_rank " + std::to_string(o.dp_rank) + " is outside [0, dp_size=" +
                        std::to_string(o.dp_size) + ")");
    if (const auto prefix = indexed_dataset_prefix(path)) open_indexed(*prefix);
    else open_bytes();
  }

  source_kind kind() const noexcept { return kind_; }
  /// The text file, or the dataset prefix.
  const std::filesystem::path& path() const noexcept { return path_; }
  const source_options& options() const noexcept { return opt_; }
  /// Ids per window: T + 1.
  std::size_t window() const noexcept { return opt_.seq_len + 1; }
  /// Windows per global batch: grad_accum * micro_batch.
  std::size_t windows_per_step() const noexcept { return opt_.grad_accum * opt_.micro_batch; }
  /// Tokens of the training / validation split (bytes for a text file).
  std::uint64_t train_tokens() const noexcept { return train_tokens_; }
  std::uint64_t validation_tokens() const noexcept { return valid_tokens_; }
  /// Whether the files of an indexed dataset were checked against PREFIX.json.
  checksum_state checksums() const noexcept { return checksums_; }
  /// PREFIX.json of an indexed dataset, if it has one.
  const std::optional<dataset_summary>& summary() const noexcept { return summary_; }
  /// The SentencePiece model of an indexed dataset: PREFIX.json's "tokenizer", else
  /// PREFIX.model (may not exist). Empty for a text file.
  std::filesystem::path tokenizer_path() const {
    if (kind_ == source_kind::bytes) return {};
    return dataset_tokenizer_path(path_);
  }
  /// Vocabulary of the data: 256 for bytes; PREFIX.json's vocab_size (0 if unknown) otherwise.
  std::int64_t data_vocab() const noexcept {
    return kind_ == source_kind::bytes ? 256 : summary_ ? summary_->vocab_size : 0;
  }
  /// One line for the log: sizes of both splits.
  std::string describe() const {
    if (kind_ == source_kind::bytes)
      return path_.string() + ": " + std::to_string(train_tokens_) + " training bytes, " + std::to_string(valid_tokens_) +
             " validation bytes";
    std::string s = path_.string() + " (indexed, " + std::string(dtype_name(train_->dataset().token_dtype())) + " ids";
    if (data_vocab() > 0) s += ", vocabulary " + std::to_string(data_vocab());
    s += "): " + std::to_string(train_tokens_) + " training tokens in " + std::to_string(train_docs_) + " documents, " +
         std::to_string(valid_tokens_) + " validation tokens in " + std::to_string(valid_docs_) + " documents";
    if (summary_ && summary_->tokens > 0)
      s += ", " + std::to_string(double(summary_->text_bytes) / double(summary_->tokens)).substr(0, 4) + " bytes/token";
    switch (checksums_) {
      case checksum_state::verified: return s + "; .bin and .idx checksums verified";
      case checksum_state::skipped: return s + "; checksums not checked (skipped)";
      case checksum_state::none_recorded: return s + "; no checksums recorded (prepared by an older prepare_data)";
      case checksum_state::no_summary: break;
    }
    return s + "; not verified (no " + path_.string() + ".json)";
  }

  /// The next global batch of this rank: windows_per_step() rows of window() ids. Valid until
  /// the next call to next() or restore(). Throws loom::input_error for an id >= vocab.
  std::span<const std::int32_t> next() {
    if (kind_ == source_kind::indexed) return train_->next();
    // rank r takes draws [p + r*G, p + (r+1)*G) of the global sequence; p advances by G*dp
    const std::uint64_t g = windows_per_step(), p = draws_;
    sampler_->set_position(p + std::uint64_t(opt_.dp_rank) * g);
    const std::span<std::int32_t> batch(batch_.get(), windows_per_step() * window());
    sampler_->next(std::span<const std::uint8_t>(bytes_->train()), batch);
    draws_ = p + g * std::uint64_t(opt_.dp_size);
    return batch;
  }

  /// Seconds next() spent blocked on the prefetch threads (indexed data; 0 for a text file,
  /// whose windows are copied on the calling thread).
  double wait_seconds() const noexcept { return kind_ == source_kind::indexed ? train_->wait_seconds() : 0.0; }

  /// The position of the batch the next call to next() returns; identical on every rank.
  source_state state() const noexcept {
    if (kind_ == source_kind::indexed) {
      const auto s = train_->state();
      return {kind_, s.epoch, s.index, s.seed};
    }
    return {kind_, 0, draws_, opt_.seed};
  }

  /// Continue from `s` (from state(), e.g. in a checkpoint). Throws loom::input_error if `s`
  /// is for the other kind of data, or (indexed) its index passes the end of an epoch (the
  /// data, seq_len or valid_fraction changed).
  void restore(const source_state& s) {
    if (s.kind != kind_)
      throw input_error("batch_source::restore: the saved data position is for " +
                        std::string(s.kind == source_kind::bytes ? "a text file" : "an indexed dataset") + ", but " +
                        path_.string() + " is " + (kind_ == source_kind::bytes ? "a text file" : "an indexed dataset") +
                        "; resume with the --data the checkpoint was trained on");
    if (kind_ == source_kind::indexed) {
      train_->restore({s.epoch, s.index, s.seed});
      return;
    }
    opt_.seed = s.seed;
    sampler_.emplace(bytes_->train().size(), window(), s.seed);
    draws_ = s.index;
  }

  /// Windows of the validation split: all of them, W = (validation tokens - 1) / seq_len
  /// (consecutive windows overlap by one token, so every validation token after the first is a
  /// target exactly once), whatever the micro-batch. 0 only for a text file whose validation
  /// part is shorter than one window.
  std::size_t validation_rows() const noexcept { return valid_rows_; }

  /// The first `rows` windows of the validation split, in order (=): rows * window() ids, any
  /// rows in [0, validation_rows()]; validation_batch(validation_rows()) is the whole split,
  /// each window once. The same call always returns the same windows. Throws loom::input_error
  /// when rows > validation_rows() (windows are never repeated to fill a request).
  std::vector<std::int32_t> validation_batch(std::size_t rows) {
    if (rows > valid_rows_)
      throw input_error("batch_source::validation_batch: " + std::to_string(rows) + " windows asked, but the validation split has " +
                        std::to_string(valid_rows_) + "; ask for at most validation_rows() (e.g. a smaller --eval-windows)");
    std::vector<std::int32_t> out(rows * window());
    if (rows == 0) return out;
    if (kind_ == source_kind::bytes) {
      sequential_windows(std::span<const std::uint8_t>(bytes_->validation()), window(), 0, std::span<std::int32_t>(out));
      return out;
    }
    valid_->restore({0, 0, opt_.seed});  // one window per batch: W batches per epoch, none skipped
    for (std::size_t at = 0; at < out.size(); at += window()) valid_->next(std::span<std::int32_t>(out.data() + at, window()));
    return out;
  }

  /// How target_bytes() counts (see bytes_method).
  bytes_method byte_counting() const noexcept { return bytes_method_; }
  /// Human-readable byte_counting(), for logs.
  std::string byte_counting_note() const {
    switch (bytes_method_) {
      case bytes_method::tokens_are_bytes: return "tokens are bytes";
      case bytes_method::exact: return "bytes: exact, from the decoded target tokens";
      case bytes_method::average:
        return "bytes: average " + std::to_string(double(summary_->text_bytes) / double(summary_->tokens)).substr(0, 5) +
               " per token from " + path_.string() + ".json";
      case bytes_method::unknown: break;
    }
    return "bytes unknown (no tokenizer table and no " + path_.string() + ".json)";
  }

  /// Uses `lengths[id]` (UTF-8 bytes of token id, from token_byte_lengths) to count the bytes
  /// behind targets exactly. Throws loom::input_error if the table is shorter than the data's
  /// vocabulary (PREFIX.json) — the tokenizer is not the one the data was prepared with.
  void set_token_bytes(std::vector<std::uint32_t> lengths) {
    if (kind_ == source_kind::bytes) return;
    if (data_vocab() > 0 && std::int64_t(lengths.size()) < data_vocab())
      throw input_error("tokenizer has " + std::to_string(lengths.size()) + " pieces but the dataset " + path_.string() +
                        " was prepared with a vocabulary of " + std::to_string(data_vocab()) +
                        "; use the .model prepare_data wrote next to it");
    token_bytes_ = std::move(lengths);
    bytes_method_ = bytes_method::exact;
  }

  /// UTF-8 bytes of text the targets (row[1..T]) of `windows` stand for (see byte_counting()).
  /// Exact for a text file and with set_token_bytes; an average otherwise; NaN if unknown.
  /// Throws loom::input_error for an id outside the byte table.
  double target_bytes(std::span<const std::int32_t> windows) const {
    const std::size_t w = window(), rows = windows.size() / w, targets = rows * opt_.seq_len;
    switch (bytes_method_) {
      case bytes_method::tokens_are_bytes: return double(targets);
      case bytes_method::average: return double(targets) * double(summary_->text_bytes) / double(summary_->tokens);
      case bytes_method::unknown: return std::nan("");
      case bytes_method::exact: break;
    }
    std::uint64_t sum = 0;
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t i = 1; i < w; ++i) {
        const std::int32_t id = windows[r * w + i];
        if (id < 0 || std::size_t(id) >= token_bytes_.size())
          throw input_error("batch_source::target_bytes: id " + std::to_string(id) + " is outside the tokenizer's " +
                            std::to_string(token_bytes_.size()) + " pieces; use the tokenizer the data was prepared with");
        sum += token_bytes_[std::size_t(id)];
      }
    return double(sum);
  }

  /// Bits per byte of a mean loss `nats` (nats per target token) over `windows`:
  /// nats * targets / target_bytes / ln 2 (nats / ln 2 for a text file). NaN if bytes are unknown.
  double bits_per_byte(double nats, std::span<const std::int32_t> windows) const {
    if (bytes_method_ == bytes_method::tokens_are_bytes) return nats / std::numbers::ln2;
    const double targets = double(windows.size() / window() * opt_.seq_len);
    return nats * targets / target_bytes(windows) / std::numbers::ln2;
  }

 private:
  void open_bytes() {
    kind_ = source_kind::bytes;
    bytes_method_ = bytes_method::tokens_are_bytes;
    bytes_ = std::make_unique<byte_dataset>(path_, window(), opt_.valid_fraction);
    sampler_.emplace(bytes_->train().size(), window(), opt_.seed);
    const auto mem = opt_.host_memory ? opt_.host_memory : device::host_allocator::of<D>();
    batch_ = {static_cast<std::int32_t*>(mem.allocate(windows_per_step() * window() * sizeof(std::int32_t))),
              host_free{mem.deallocate}};
    train_tokens_ = bytes_->train().size();
    valid_tokens_ = bytes_->validation().size();
    valid_rows_ = valid_tokens_ > opt_.seq_len ? (valid_tokens_ - 1) / opt_.seq_len : 0;  // 0 for a very short text
  }

  void open_indexed(const std::filesystem::path& prefix) {
    kind_ = source_kind::indexed;
    path_ = prefix;
    summary_ = read_dataset_summary(prefix);
    if (summary_ && opt_.vocab > 0 && summary_->vocab_size > opt_.vocab)
      throw input_error("dataset " + prefix.string() + " was prepared with a vocabulary of " +
                        std::to_string(summary_->vocab_size) + " tokens, more than the model's " + std::to_string(opt_.vocab) +
                        "; use a model with a vocabulary of at least " + std::to_string(summary_->vocab_size) +
                        " or prepare the data with --vocab-size <= " + std::to_string(opt_.vocab));
    bytes_method_ = summary_ && summary_->tokens > 0 && summary_->text_bytes > 0 ? bytes_method::average : bytes_method::unknown;
    checksums_ = !summary_ ? checksum_state::no_summary
                 : !opt_.verify_checksums ? checksum_state::skipped
                 : verify_dataset_files(prefix) ? checksum_state::verified : checksum_state::none_recorded;
    indexed_dataset ds(prefix);
    const auto [train_docs, valid_docs] = split_train_valid(ds, opt_.valid_fraction);
    if (valid_docs.first == valid_docs.last)
      throw input_error("dataset " + prefix.string() + ": a validation fraction of 0 leaves nothing to validate on; "
                        "pass e.g. --val-fraction 0.1");
    train_docs_ = train_docs.last - train_docs.first;
    valid_docs_ = valid_docs.last - valid_docs.first;
    train_tokens_ = ds.document_token_offset(train_docs.last) - ds.document_token_offset(train_docs.first);
    valid_tokens_ = ds.document_token_offset(valid_docs.last) - ds.document_token_offset(valid_docs.first);
    const std::uint64_t T = opt_.seq_len, vw = valid_tokens_ > T ? (valid_tokens_ - 1) / T : 0;
    if (vw < 1)
      throw input_error("dataset " + prefix.string() + ": the validation split (the last " + std::to_string(valid_docs_) +
                        " of " + std::to_string(ds.document_count()) + " documents, " + std::to_string(valid_tokens_) +
                        " tokens) is shorter than one window of " + std::to_string(T + 1) +
                        " tokens; raise --val-fraction, prepare more documents, or lower --seq-len");
    loader_options lo;
    lo.batch = windows_per_step();
    lo.seq_len = opt_.seq_len;
    lo.seed = opt_.seed;
    lo.dp_rank = opt_.dp_rank;
    lo.dp_size = opt_.dp_size;
    lo.workers = opt_.workers;
    lo.vocab = opt_.vocab;
    lo.documents = train_docs;
    lo.host_memory = opt_.host_memory;
    train_ = std::make_unique<loader<D>>(std::move(ds), lo);
    loader_options vo = lo;  // every rank evaluates the same windows, in file order, one at a time
    vo.batch = 1;
    vo.dp_rank = 0;
    vo.dp_size = 1;
    vo.workers = 0;
    vo.shuffle = false;
    vo.documents = valid_docs;
    valid_ = std::make_unique<loader<D>>(prefix, vo);
    valid_rows_ = std::size_t(valid_->windows_per_epoch());
  }

  std::filesystem::path path_;
  source_options opt_;
  source_kind kind_ = source_kind::bytes;
  bytes_method bytes_method_ = bytes_method::unknown;
  std::uint64_t train_tokens_ = 0, valid_tokens_ = 0;
  std::size_t train_docs_ = 0, valid_docs_ = 0, valid_rows_ = 0;
  // text file
  std::unique_ptr<byte_dataset> bytes_;
  std::optional<window_sampler> sampler_;
  std::uint64_t draws_ = 0;
  struct host_free {
    void (*free)(void*) noexcept = nullptr;
    void operator()(std::int32_t* p) const noexcept { free(p); }
  };
  std::unique_ptr<std::int32_t, host_free> batch_;  // the text path's batch, in host_memory
  // indexed dataset
  std::optional<dataset_summary> summary_;
  checksum_state checksums_ = checksum_state::no_summary;
  std::unique_ptr<loader<D>> train_, valid_;
  std::vector<std::uint32_t> token_bytes_;
};

}  // namespace loom::data
