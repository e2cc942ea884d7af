#pragma once
/// \file loom::data::text::tokenizer — SentencePiece BPE with byte fallback: train, load,
/// encode on all cores, decode.
///
/// Training settings are chosen so that SentencePiece itself changes nothing: decode(encode(x))
/// == normalize(x, text_normalization()) for every string x (== x for well-formed UTF-8 when
/// the normalization is none()):
///   model_type=bpe, byte_fallback=true (a character outside the vocabulary becomes its UTF-8
///   bytes <0x..>, never <unk>), normalization_rule_name=identity (no NFKC: loom's own
///   normalization runs first, and NFKC would turn Chinese `，` into `,`), remove_extra_whitespaces=false,
///   add_dummy_prefix=false, "\n" and "\t" as user-defined symbols (one token each; they are
///   not in the training lines), split_digits=true, allow_whitespace_only_pieces=true.
/// Special ids: unk=0, bos=1, eos=2 (used as the end-of-document token), no pad.
///
/// Normalization (clean.hpp). A tokenizer carries the text normalization of its data and
/// applies it wherever text becomes ids: encode() and encode_all() encode normalize(text) (so a
/// prompt typed with full-width letters gets the ids the training text had), and train() learns
/// from normalized lines. decode(encode(x)) == normalize(x, text_normalization()) byte for byte.
/// prepare() records the normalization in the dataset's PREFIX.json ("normalization"), and
/// load(PREFIX.model) reads it from the .json beside the model (the model's path with the
/// extension .json):
///   "normalization" present          that normalization (e.g. "loom-v2", the default)
///   PREFIX.json without the field    normalization::loom_v1(): what prepare_data applied
///                                    before it recorded the field
///   no .json beside the model        normalization::none(): the text is encoded as given
///
/// Source: Kudo & Richardson, "SentencePiece", EMNLP 2018, arXiv:1808.06226; options as in
/// https://github.com/google/sentencepiece/blob/master/doc/options.md. Link with
/// -lsentencepiece -lsentencepiece_train.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <functional>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include <loom/core/error.hpp>
#include <loom/core/json.hpp>
#include <loom/data/detail/checksum.hpp>
#include <loom/data/detail/mapped_file.hpp>
#include <loom/data/text/clean.hpp>

namespace loom::data::text {

/// Tokenizer training settings (prepare_data's --vocab-size and friends).
struct tokenizer_options {
  int vocab_size = 8000;               ///< upper bound; a small corpus may give fewer pieces
  double character_coverage = 0.9995;  ///< share of characters that get their own piece (rest: bytes);
                                       ///< lowered automatically when the vocabulary is too small
                                       ///< (see tokenizer::effective_character_coverage)
  std::size_t max_sentences = 2000000; ///< lines sampled for training (SentencePiece input_sentence_size)
  int threads = 0;                     ///< training threads (0: all cores)
  normalization norm{};                ///< applied to the training lines; the trained tokenizer's normalization()
};

/// A loaded SentencePiece model. Encoding and decoding are const and thread-safe.
class tokenizer {
 public:
  /// Loads a .model file with the normalization recorded beside it (sidecar_normalization:
  /// see the file comment), after checking it against the checksum recorded there
  /// (verify_against_sidecar). Throws loom::input_error if the model is missing, not a
  /// SentencePiece model or fails that checksum, or the .json beside it is unreadable, fails
  /// its own checksum or has a malformed "normalization".
  static tokenizer load(const std::filesystem::path& model) {
    verify_against_sidecar(model);
    auto t = load(model, normalization::none());
    t.norm_ = sidecar_normalization(model);
    return t;
  }

  /// Checks `model` against the size and XXH3-64 that the .json beside it records for it
  /// ("checksums"."tokenizer", written by prepare_data; data/detail/checksum.hpp), when that
  /// .json exists, records them, and names this file as its "tokenizer" — or, while `model` is
  /// PREFIX.model, names a file that is not beside it (a dataset copied under another prefix)
  /// or one that no longer has the recorded checksum (a dataset prepare_data kept as
  /// PREFIX.previous-<k>, whose .json names the newer model): data::dataset_tokenizer_path
  /// takes PREFIX.model then, and it must be the recorded tokenizer. Returns whether it
  /// checked. Throws loom::input_error naming the file when it differs or the .json is corrupt.
  static bool verify_against_sidecar(const std::filesystem::path& model) {
    auto sidecar = model;
    sidecar.replace_extension(".json");
    std::error_code ec;
    if (!std::filesystem::is_regular_file(sidecar, ec)) return false;
    const auto j = data::detail::read_summary_json(sidecar);
    const auto name = j.find("tokenizer");
    if (name == j.end() || !name->is_string()) return false;
    const std::string recorded = name->get<std::string>();
    const auto recorded_path = sidecar.parent_path() / recorded;
    const bool renamed = model.extension() == ".model" && !recorded.empty() &&
                         (!std::filesystem::exists(recorded_path, ec) ||
                          (recorded != model.filename().string() &&
                           !data::detail::matches_recorded_file(j, "tokenizer", recorded_path)));
    if (recorded != model.filename().string() && !renamed) return false;
    return data::detail::check_recorded_file(j, "tokenizer", model, "tokenizer model", sidecar);
  }

  /// Loads a .model file that applies normalization `norm` (nothing is read beside it).
  static tokenizer load(const std::filesystem::path& model, const normalization& norm) {
    const data::detail::mapped_file f(model, "tokenizer model", "pass the .model file written by prepare_data or spm_train");
    std::string proto(reinterpret_cast<const char*>(f.data()), f.size());
    try {
      return from_serialized(std::move(proto), norm);
    } catch (const input_error& e) {
      throw input_error("tokenizer model '" + model.string() + "': " + e.what());
    }
  }

  /// The normalization recorded for `model` in the .json beside it (the model's path with the
  /// extension .json, e.g. PREFIX.json for PREFIX.model): its "normalization"; loom_v1() when
  /// the file has no such field (written before it was recorded); none() when there is no such
  /// file. Throws loom::input_error for an unreadable or non-object file, one that fails its
  /// recorded checksum, or a malformed field.
  static normalization sidecar_normalization(const std::filesystem::path& model) {
    auto sidecar = model;
    sidecar.replace_extension(".json");
    std::error_code ec;
    if (!std::filesystem::is_regular_file(sidecar, ec)) return normalization::none();
    const nlohmann::json j = data::detail::read_summary_json(sidecar);
    if (!j.is_object() || !j.contains("normalization")) return normalization::loom_v1();
    return normalization::from_json(j["normalization"], sidecar.string());
  }

  /// Loads a serialized ModelProto (the bytes of a .model file); encode() applies `norm`.
  static tokenizer from_serialized(std::string proto, const normalization& norm = normalization::none()) {
    tokenizer t;
    t.norm_ = norm;
    t.proto_ = std::move(proto);
    t.sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
    const auto st = t.sp_->LoadFromSerializedProto(t.proto_);
    if (!st.ok())
      throw input_error("not a SentencePiece model (" + st.ToString() +
                        "); pass a .model written by prepare_data or spm_train");
    return t;
  }

  /// Trains a BPE model on `documents` (in memory; each line is one training sentence, empty
  /// lines skipped). Throws loom::input_error if SentencePiece refuses (e.g. vocab_size too
  /// small for the byte pieces and the required characters) with its message and a fix.
  /// Cost: a few seconds per MB of text on 2 cores.
  static tokenizer train(std::span<const std::string_view> documents, const tokenizer_options& o) {
    line_iterator lines(documents, o.norm);
    if (lines.done())
      throw input_error("tokenizer training: the corpus has no non-empty line; check the input files and filters");
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    const double coverage = effective_character_coverage(documents, o.vocab_size, o.character_coverage);
    const std::unordered_map<std::string, std::string> kw = {
        {"model_type", "bpe"},
        {"vocab_size", std::to_string(o.vocab_size)},
        {"hard_vocab_limit", "false"},
        {"byte_fallback", "true"},
        {"character_coverage", std::to_string(coverage)},
        {"normalization_rule_name", "identity"},
        {"remove_extra_whitespaces", "false"},
        {"add_dummy_prefix", "false"},
        {"split_digits", "true"},
        {"allow_whitespace_only_pieces", "true"},
        {"user_defined_symbols", "\n,\t"},
        {"max_sentence_length", "65536"},
        {"input_sentence_size", std::to_string(o.max_sentences)},
        {"shuffle_input_sentence", "true"},
        {"num_threads", std::to_string(o.threads > 0 ? unsigned(o.threads) : hw)},
        {"unk_id", "0"}, {"bos_id", "1"}, {"eos_id", "2"}, {"pad_id", "-1"},
        {"minloglevel", "2"},
    };
    std::string proto;
    const auto st = sentencepiece::SentencePieceTrainer::Train(kw, &lines, &proto);
    if (!st.ok())
      throw input_error("SentencePiece training failed: " + st.ToString() +
                        "; try a larger --vocab-size (byte fallback needs > 259 + the distinct characters) or more text");
    return from_serialized(std::move(proto), o.norm);
  }

  /// The character coverage training uses: `requested`, lowered if needed (but not below
  /// SentencePiece's minimum 0.98) so that the characters it requires take at most 3/4 of the
  /// vocabulary left after the 256 byte pieces and 5 special/user symbols. SentencePiece fails
  /// when the required characters do not fit; with byte fallback, rarer characters are
  /// spelled as UTF-8 bytes instead. zh_classics has 6871 distinct characters (3565 cover
  /// 98% of the text), so vocabularies below ~8000 need this.
  static double effective_character_coverage(std::span<const std::string_view> documents, int vocab_size,
                                             double requested) {
    std::unordered_map<std::uint32_t, std::uint64_t> freq;
    std::uint64_t total = 0;
    for (const auto d : documents)
      for (std::size_t i = 0; i < d.size();) {
        const auto c = static_cast<unsigned char>(d[i]);
        const std::size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        std::uint32_t key = 0;
        for (std::size_t k = 0; k < len && i + k < d.size(); ++k) key = key << 8 | static_cast<unsigned char>(d[i + k]);
        i += len;
        if (c == '\n') continue;  // not part of training lines
        ++freq[key];
        ++total;
      }
    const long budget = std::max(1L, (long(vocab_size) - 261) * 3 / 4);
    if (total == 0 || long(freq.size()) <= budget) return requested;
    std::vector<std::uint64_t> counts;
    counts.reserve(freq.size());
    for (const auto& [k, n] : freq) counts.push_back(n);
    std::sort(counts.begin(), counts.end(), std::greater<>());
    std::uint64_t covered = 0;
    for (long k = 0; k < budget; ++k) covered += counts[std::size_t(k)];
    // Slightly below the share of the `budget` most frequent characters, to stay under it;
    // SentencePiece accepts no coverage below 0.98.
    return std::min(requested, std::max(0.98, 0.999 * double(covered) / double(total)));
  }

  /// Writes the model to `path` atomically (temporary file, fsync, rename).
  void save(const std::filesystem::path& path) const {
    data::detail::atomic_file f(path);
    f.write(proto_.data(), proto_.size());
    f.commit();
  }

  int vocab_size() const { return sp_->GetPieceSize(); }
  /// End-of-document token appended after every document (SentencePiece's eos, id 2).
  int eod_id() const { return sp_->eos_id(); }
  int unk_id() const { return sp_->unk_id(); }
  /// The piece string of `id` (e.g. "▁the", "<0x0A>").
  std::string piece(int id) const { return sp_->IdToPiece(id); }
  bool is_byte(int id) const { return sp_->IsByte(id); }
  const std::string& serialized() const noexcept { return proto_; }
  /// The normalization encode() applies (see the file comment).
  const normalization& text_normalization() const noexcept { return norm_; }
  void set_text_normalization(const normalization& n) { norm_ = n; }

  /// Appends the ids of normalize(text, text_normalization()) to `out`. Long texts are cut
  /// after a '\n' every ~chunk_bytes and encoded piece by piece (SentencePiece's BPE is
  /// superlinear in the input length; no piece spans a '\n', so the ids are the same as for the
  /// whole text). Throws loom::input_error if SentencePiece fails.
  void encode(std::string_view raw, std::vector<std::int32_t>& out, std::size_t chunk_bytes = 16384) const {
    std::string normalized;
    if (!(norm_ == normalization::none())) normalized = normalize(raw, norm_);
    const std::string_view text = norm_ == normalization::none() ? raw : std::string_view(normalized);
    std::vector<int> ids;
    std::size_t at = 0;
    while (at < text.size()) {
      std::size_t end = text.size();
      if (end - at > chunk_bytes) {
        const auto nl = text.rfind('\n', at + chunk_bytes);
        end = (nl != std::string_view::npos && nl >= at) ? nl + 1 : text.find('\n', at + chunk_bytes);
        end = end == std::string_view::npos ? text.size() : std::max(end, at + 1);
      }
      const auto st = sp_->Encode(text.substr(at, end - at), &ids);
      if (!st.ok()) throw input_error("SentencePiece encode failed: " + st.ToString() + "; is the text valid UTF-8?");
      out.insert(out.end(), ids.begin(), ids.end());
      at = end;
    }
  }
  std::vector<std::int32_t> encode(std::string_view text) const {
    std::vector<std::int32_t> out;
    encode(text, out);
    return out;
  }

  /// Encodes documents on `threads` threads (0: all cores); result[i] = ids of documents[i].
  std::vector<std::vector<std::int32_t>> encode_all(std::span<const std::string_view> documents, int threads = 0) const {
    std::vector<std::vector<std::int32_t>> out(documents.size());
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    const std::size_t nt = std::min<std::size_t>(documents.size(), threads > 0 ? unsigned(threads) : hw);
    std::vector<std::thread> pool;
    std::vector<std::exception_ptr> errors(nt);
    for (std::size_t t = 0; t < nt; ++t)
      pool.emplace_back([&, t] {
        try {
          for (std::size_t i = t; i < documents.size(); i += nt) encode(documents[i], out[i]);
        } catch (...) {
          errors[t] = std::current_exception();
        }
      });
    for (auto& th : pool) th.join();
    for (auto& e : errors) if (e) std::rethrow_exception(e);
    return out;
  }

  /// The text of `ids` (control ids such as eod decode to nothing). Throws loom::input_error
  /// on an id outside [0, vocab_size()).
  std::string decode(std::span<const std::int32_t> ids) const {
    const int n = vocab_size();
    for (const auto id : ids)
      if (id < 0 || id >= n)
        throw input_error("tokenizer decode: id " + std::to_string(id) + " is outside the vocabulary [0, " +
                          std::to_string(n) + "); decode with the tokenizer the data was prepared with");
    std::string text;
    const auto st = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    if (!st.ok()) throw input_error("SentencePiece decode failed: " + st.ToString());
    return text;
  }

 private:
  tokenizer() = default;

  // Feeds the non-empty lines of in-memory documents to the trainer.
  class line_iterator : public sentencepiece::SentenceIterator {
   public:
    line_iterator(std::span<const std::string_view> docs, const normalization& norm) : docs_(docs), norm_(norm) {
      advance();
    }
    bool done() const override { return doc_ >= docs_.size(); }
    void Next() override { advance(); }
    const std::string& value() const override { return line_; }
    sentencepiece::util::Status status() const override { return {}; }

   private:
    void advance() {
      while (doc_ < docs_.size()) {
        const std::string_view d = docs_[doc_];
        if (pos_ >= d.size()) {
          ++doc_;
          pos_ = 0;
          continue;
        }
        auto e = d.find('\n', pos_);
        if (e == std::string_view::npos) e = d.size();
        const auto line = d.substr(pos_, e - pos_);
        pos_ = e + 1;
        if (!line.empty()) {
          if (norm_ == normalization::none()) line_.assign(line);
          else line_ = normalize(line, norm_);
          if (!line_.empty()) return;
        }
      }
    }
    std::span<const std::string_view> docs_;
    normalization norm_;
    std::size_t doc_ = 0, pos_ = 0;
    std::string line_;
  };

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string proto_;
  normalization norm_ = normalization::none();
};

}  // namespace loom::data::text
