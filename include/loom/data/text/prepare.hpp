#pragma once
/// \file loom::data::prepare — the whole data preparation: read -> clean -> dedup -> filter ->
/// tokenize -> write, with a per-stage report. examples/prepare_data is a command line over it.
///
/// Inputs: `.txt` files (split into documents by blank lines, by lines, or one per file) and
/// `.jsonl`/`.json` files (one JSON object per line; the document is the string field
/// `json_key`, default "text", as in Megatron's preprocess_data).
/// Outputs, for an output prefix P:
///   P.bin, P.idx   Megatron-compatible indexed dataset (indexed_dataset.hpp); one sequence per
///                  document, each followed by the tokenizer's end-of-document id
///   P.model        the SentencePiece model (trained here, or a copy of the one given)
///   P.json         summary: tokenizer, vocab_size, eod_id, dtype, documents, tokens,
///                  text_bytes (UTF-8 bytes of the documents, for bits-per-byte),
///                  normalization (the form cleaning gave the text, normalization::to_json();
///                  tokenizer::load(P.model) applies it to every text it encodes), stages,
///                  checksums (size and XXH3-64 of P.bin, P.idx, P.model: checked when the
///                  dataset is opened and the tokenizer loaded), checksum (its own)
/// Every file is written to a temporary name and renamed when complete, in the order of
/// dataset_files; prepare_options::before_write runs right before the first.
///
/// Memory: the documents that survive each stage are held in memory (about the corpus size
/// twice); the loader, not this step, handles datasets larger than RAM.
/// Needs -lsentencepiece -lsentencepiece_train -lutf8proc -lxxhash (target loom::text).
#include <nlohmann/json.hpp>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/json.hpp>
#include <loom/data/detail/checksum.hpp>
#include <loom/data/detail/mapped_file.hpp>
#include <loom/data/indexed_dataset.hpp>
#include <loom/data/text/clean.hpp>
#include <loom/data/text/dedup.hpp>
#include <loom/data/text/filter.hpp>
#include <loom/data/text/tokenizer.hpp>

namespace loom::data::text {

/// How a .txt file becomes documents.
enum class split_mode : std::uint8_t {
  blank_line,  ///< paragraphs separated by one or more empty lines (tinyshakespeare speeches, zh_classics pieces)
  line,        ///< every non-empty line
  file         ///< the whole file
};

/// Parses "blank-line" | "line" | "file".
inline split_mode parse_split_mode(std::string_view s) {
  if (s == "blank-line") return split_mode::blank_line;
  if (s == "line") return split_mode::line;
  if (s == "file") return split_mode::file;
  throw input_error("unknown split mode '" + std::string(s) + "'; use blank-line, line or file");
}

/// Throws loom::input_error when `text`, the content of input file `path`, is not text: it
/// holds a NUL byte (no UTF-8 or JSON text does; UTF-16 and binary files do), or more than a
/// quarter of its first MiB is not UTF-8 (a legacy 8-bit encoding has a few percent: cleaning
/// drops or replaces those, see --invalid-utf8). Cost: one pass over the file (memchr).
inline void refuse_binary(const std::filesystem::path& path, std::string_view text) {
  const auto fix = "prepare_data reads UTF-8 text (.txt) or JSON lines (.jsonl); convert the file to UTF-8 or "
                   "drop it from --input";
  if (const auto nul = text.find('\0'); nul != std::string_view::npos)
    throw input_error("input file '" + path.string() + "' is not text: it has a NUL byte at offset " +
                      std::to_string(nul) + " (binary or UTF-16); " + fix);
  const std::string_view head = text.substr(0, std::size_t(1) << 20);
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(head.data());
  std::size_t invalid = 0;
  for (std::size_t i = 0; i < head.size();) {
    utf8proc_int32_t cp;
    const auto n = utf8proc_iterate(p + i, static_cast<utf8proc_ssize_t>(head.size() - i), &cp);
    if (n <= 0) ++invalid;
    i += n <= 0 ? 1 : std::size_t(n);
  }
  if (invalid * 4 > head.size())
    throw input_error("input file '" + path.string() + "' is not text: " + std::to_string(invalid) + " of its first " +
                      std::to_string(head.size()) + " bytes are not UTF-8; " + fix);
}

/// Reads the documents of one input file and appends them to `out`. Splitting keeps the
/// text inside a document byte-exact (cleaning trims it later). Throws loom::input_error for
/// a missing or binary file (refuse_binary), malformed JSON (with file:line), or a JSON line
/// whose `json_key` field is missing or not a string.
inline void read_documents(const std::filesystem::path& path, split_mode split, const std::string& json_key,
                           std::vector<std::string>& out) {
  const data::detail::mapped_file f(path, "input file", "check the --input path");
  const std::string_view text(reinterpret_cast<const char*>(f.data()), f.size());
  refuse_binary(path, text);
  const auto ext = path.extension().string();
  if (ext == ".jsonl" || ext == ".json" || ext == ".ndjson") {
    std::size_t at = 0, line_no = 0;
    while (at < text.size()) {
      auto e = text.find('\n', at);
      if (e == std::string_view::npos) e = text.size();
      const auto line = text.substr(at, e - at);
      at = e + 1;
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      const auto where = path.string() + ":" + std::to_string(line_no);
      nlohmann::json j;
      try {
        j = parse_json(line, where, "write one JSON object per line");
      } catch (const nlohmann::json::exception& err) {  // also out_of_range: 1e400
        throw input_error(where + ": not valid JSON (" + err.what() + "); write one JSON object per line");
      }
      if (!j.is_object() || !j.contains(json_key) || !j[json_key].is_string())
        throw input_error(where + ": no string field \"" + json_key + "\"; pass --json-key with the text field's name");
      out.push_back(j[json_key].get<std::string>());
    }
    return;
  }
  if (split == split_mode::file) {
    out.emplace_back(text);
    return;
  }
  std::size_t at = 0;
  std::string cur;
  bool have = false;
  while (at <= text.size()) {
    auto e = text.find('\n', at);
    if (e == std::string_view::npos) e = text.size();
    const auto line = text.substr(at, e - at);
    const bool blank = line.find_first_not_of(" \t\r") == std::string_view::npos;
    if (split == split_mode::line) {
      if (!blank) out.emplace_back(line);
    } else if (blank) {
      if (have) out.push_back(std::move(cur));
      cur.clear();
      have = false;
    } else {
      if (have) cur.push_back('\n');
      cur.append(line);
      have = true;
    }
    if (e == text.size()) break;
    at = e + 1;
  }
  if (have) out.push_back(std::move(cur));
}

/// Everything prepare() needs.
struct prepare_options {
  std::vector<std::filesystem::path> inputs;
  std::filesystem::path output_prefix;
  split_mode split = split_mode::blank_line;
  std::string json_key = "text";
  clean_options clean{};
  bool dedup = true;
  dedup_options dedup_settings{};
  filter_options filter{};
  tokenizer_options tokenizer{};
  std::optional<std::filesystem::path> tokenizer_model;  ///< use this model instead of training one
  int threads = 0;                                       ///< 0: all cores
  /// Called once, after encoding, right before the first file of the prefix is written
  /// (prepare_data keeps an earlier dataset there); when it throws, prepare() stops with
  /// nothing written. Empty: nothing is called.
  std::function<void()> before_write;
};

/// The files prepare() writes for output prefix `prefix`, in the order it writes them:
/// P.bin, P.idx, P.model, P.json.
inline std::array<std::filesystem::path, 4> dataset_files(const std::filesystem::path& prefix) {
  auto model = prefix, summary = prefix;
  model += ".model";
  summary += ".json";
  return {bin_path(prefix), idx_path(prefix), model, summary};
}

/// One row of the report.
struct stage_report {
  std::string name;
  std::uint64_t documents_in = 0, documents_out = 0, bytes_in = 0, bytes_out = 0;
  double seconds = 0;
  std::string note;  ///< removals by reason, tokens, ...
};

/// What prepare() did.
struct prepare_report {
  std::vector<stage_report> stages;
  std::uint64_t documents = 0, tokens = 0, text_bytes = 0;
  int vocab_size = 0, eod_id = 0;
  dtype token_dtype = dtype::uint16;
  normalization norm;  ///< the documents' normalization (of the clean options), recorded in P.json
  std::filesystem::path bin, idx, model, summary;
};

namespace detail {
/// x with two decimals, rounded ("3.49"), as the summary lines print it.
inline std::string two_decimals(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", x);
  return b;
}
inline unsigned thread_count(int requested) {
  return requested > 0 ? unsigned(requested) : std::max(1u, std::thread::hardware_concurrency());
}
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
inline std::uint64_t total_bytes(const std::vector<std::string>& docs) {
  std::uint64_t b = 0;
  for (const auto& d : docs) b += d.size();
  return b;
}
}  // namespace detail

namespace detail {

/// The stages of prepare(), in order. Each returns its report row; the document stages keep
/// in `docs` the documents that survive them.

/// Read: every input file's documents.
inline stage_report read_stage(const prepare_options& o, std::vector<std::string>& docs) {
  const auto t0 = std::chrono::steady_clock::now();
  std::uint64_t file_bytes = 0;
  for (const auto& p : o.inputs) {
    read_documents(p, o.split, o.json_key, docs);
    std::error_code ec;
    file_bytes += std::filesystem::file_size(p, ec);
  }
  return {"read", 0, docs.size(), file_bytes, total_bytes(docs), seconds_since(t0),
          std::to_string(o.inputs.size()) + " file(s)"};
}

/// Clean, in parallel over documents on `nt` threads.
inline stage_report clean_stage(const clean_options& opt, unsigned nt, std::vector<std::string>& docs) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::optional<std::string>> cleaned(docs.size());
  std::vector<clean_stats> cstats(nt);
  {
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < nt; ++t)
      pool.emplace_back([&, t] {
        for (std::size_t i = t; i < docs.size(); i += nt) cleaned[i] = clean(docs[i], opt, cstats[t]);
      });
    for (auto& th : pool) th.join();
  }
  clean_stats cs;
  for (const auto& s : cstats) cs += s;
  docs.clear();
  for (auto& c : cleaned)
    if (c) docs.push_back(std::move(*c));
  return {"clean", cs.documents_in, cs.documents_out, cs.bytes_in, cs.bytes_out, seconds_since(t0),
          "empty " + std::to_string(cs.dropped_empty) + ", invalid-utf8 docs " + std::to_string(cs.dropped_invalid) +
              "; fixed: invalid runs " + std::to_string(cs.invalid_sequences) + ", html tags " +
              std::to_string(cs.html_tags) + ", entities " + std::to_string(cs.html_entities) + ", invisible " +
              std::to_string(cs.invisible) + ", control " + std::to_string(cs.control) + ", width " +
              std::to_string(cs.width_folded)};
}

/// Dedup: exact and near duplicates (MinHash LSH) removed, the first copy kept.
inline stage_report dedup_stage(dedup_options dopt, unsigned nt, std::vector<std::string>& docs) {
  const auto t0 = std::chrono::steady_clock::now();
  if (dopt.threads == 0) dopt.threads = int(nt);
  deduplicator dd(dopt);
  std::vector<std::string_view> views(docs.begin(), docs.end());
  const auto verdicts = dd.insert_batch(views);
  std::vector<std::string> kept;
  kept.reserve(docs.size());
  for (std::size_t i = 0; i < docs.size(); ++i)
    if (verdicts[i] == deduplicator::verdict::keep) kept.push_back(std::move(docs[i]));
  docs = std::move(kept);
  const auto& s = dd.stats();
  const auto b = dd.bands();
  return {"dedup", s.documents_in, s.kept, s.bytes_in, s.bytes_kept, seconds_since(t0),
          "exact " + std::to_string(s.exact_duplicates) + ", near " + std::to_string(s.near_duplicates) +
              " (k=" + std::to_string(dopt.shingle) + " P=" + std::to_string(dopt.permutations) + " b=" +
              std::to_string(b.bands) + " r=" + std::to_string(b.rows) + " t=" + std::to_string(dopt.threshold).substr(0, 4) +
              "), too short for a shingle " + std::to_string(s.too_short)};
}

/// Filter: length, script and letter rules.
inline stage_report filter_stage(const filter_options& opt, std::vector<std::string>& docs) {
  const auto t0 = std::chrono::steady_clock::now();
  filter_stats fs;
  std::vector<std::string> kept;
  kept.reserve(docs.size());
  for (auto& d : docs)
    if (filter(d, opt, fs) == filter_reason::kept) kept.push_back(std::move(d));
  docs = std::move(kept);
  return {"filter", fs.documents_in, fs.kept, fs.bytes_in, fs.bytes_kept, seconds_since(t0),
          "too short " + std::to_string(fs.too_short) + ", too long " + std::to_string(fs.too_long) +
              ", wrong script " + std::to_string(fs.wrong_script) + ", no letters " + std::to_string(fs.no_letters)};
}

/// Tokenizer: loads o.tokenizer_model, or trains one on `views`, into `tok`; sets rep.norm,
/// vocab_size, eod_id and token_dtype (rep.documents and text_bytes are set).
inline stage_report tokenizer_stage(const prepare_options& o, unsigned nt, std::span<const std::string_view> views,
                                    prepare_report& rep, std::optional<tokenizer>& tok) {
  const auto t0 = std::chrono::steady_clock::now();
  rep.norm = normalization_of(o.clean);  // the tokenizer encodes text in the form cleaning gave the documents
  stage_report s{"", rep.documents, rep.documents, rep.text_bytes, rep.text_bytes, 0, ""};
  if (o.tokenizer_model) {
    (void)tokenizer::verify_against_sidecar(*o.tokenizer_model);  // a model prepare_data wrote: its recorded checksum
    tok = tokenizer::load(*o.tokenizer_model, rep.norm);
    s.name = "tokenizer";
    s.note = "loaded " + o.tokenizer_model->string() + ", vocab " + std::to_string(tok->vocab_size());
  } else {
    auto topt = o.tokenizer;
    if (topt.threads == 0) topt.threads = int(nt);
    topt.norm = rep.norm;
    tok = tokenizer::train(views, topt);
    s.name = "train-spm";
    s.note = "BPE, byte fallback, vocab " + std::to_string(tok->vocab_size()) + " (asked " +
             std::to_string(o.tokenizer.vocab_size) + ")";
  }
  s.seconds = seconds_since(t0);
  rep.vocab_size = tok->vocab_size();
  rep.eod_id = tok->eod_id();
  rep.token_dtype = token_dtype_for(std::size_t(rep.vocab_size));
  return s;
}

/// P.json: the summary of `rep` (its stages so far included), with the size and XXH3-64 of
/// P.bin, P.idx and P.model (already written) and its own checksum (data/detail/checksum.hpp).
inline void write_summary(const prepare_report& rep) {
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& s : rep.stages)
    stages.push_back({{"stage", s.name}, {"documents_in", s.documents_in}, {"documents_out", s.documents_out},
                      {"bytes_in", s.bytes_in}, {"bytes_out", s.bytes_out}, {"seconds", s.seconds}, {"note", s.note}});
  nlohmann::json summary = {
      {"format", "megatron-mmap-indexed-dataset-v1"}, {"bin", rep.bin.filename().string()},
      {"idx", rep.idx.filename().string()}, {"tokenizer", rep.model.filename().string()},
      {"vocab_size", rep.vocab_size}, {"eod_id", rep.eod_id}, {"dtype", std::string(dtype_name(rep.token_dtype))},
      {"documents", rep.documents}, {"tokens", rep.tokens}, {"text_bytes", rep.text_bytes},
      {"normalization", rep.norm.to_json()}, {"stages", stages},
      {"checksums", {{"bin", data::detail::checksum_entry(rep.bin)}, {"idx", data::detail::checksum_entry(rep.idx)},
                     {"tokenizer", data::detail::checksum_entry(rep.model)}}}};
  summary["checksum"] = {{"xxh3_64", data::detail::json_xxh3(summary)}};
  data::detail::atomic_file f(rep.summary);
  const std::string s = summary.dump(2) + "\n";
  f.write(s.data(), s.size());
  f.commit();
}

/// Write: P.bin and P.idx (each document's `ids` and the end-of-document id), P.model (`tok`),
/// P.json; sets rep's paths.
inline stage_report write_stage(const prepare_options& o, const std::vector<std::vector<std::int32_t>>& ids,
                                const tokenizer& tok, prepare_report& rep) {
  const auto t0 = std::chrono::steady_clock::now();
  if (const auto dir = o.output_prefix.parent_path(); !dir.empty()) std::filesystem::create_directories(dir);
  const auto files = dataset_files(o.output_prefix);
  rep.bin = files[0];
  rep.idx = files[1];
  rep.model = files[2];
  rep.summary = files[3];
  {
    indexed_dataset_writer w(o.output_prefix, rep.token_dtype);
    std::vector<std::int32_t> doc;
    for (const auto& v : ids) {
      doc.assign(v.begin(), v.end());
      doc.push_back(rep.eod_id);
      w.add_document(doc);
    }
    w.finalize();
    tok.save(rep.model);
  }
  write_summary(rep);
  const std::uint64_t written = std::filesystem::file_size(rep.bin) + std::filesystem::file_size(rep.idx);
  return {"write", rep.documents, rep.documents, rep.text_bytes, written, seconds_since(t0),
          std::string(dtype_name(rep.token_dtype)) + " tokens -> " + rep.bin.string() + " (+.idx .model .json)"};
}

}  // namespace detail

/// Runs the pipeline (see the file comment). `log`, if given, receives one line per stage as
/// it finishes. Throws loom::input_error on bad input or options, and if no document
/// survives the filters (nothing to train on).
inline prepare_report prepare(const prepare_options& o, std::FILE* log = nullptr) {
  if (o.inputs.empty()) throw input_error("prepare: no input files; pass --input a.txt [b.jsonl ...]");
  if (o.output_prefix.empty()) throw input_error("prepare: no output prefix; pass --output-prefix out/corpus");
  prepare_report rep;
  auto note_stage = [&](stage_report s) {
    if (log)
      std::fprintf(log, "%-9s %8llu -> %8llu docs  %12llu -> %12llu bytes  %7.2f s  %s\n", s.name.c_str(),
                   (unsigned long long)s.documents_in, (unsigned long long)s.documents_out,
                   (unsigned long long)s.bytes_in, (unsigned long long)s.bytes_out, s.seconds, s.note.c_str());
    rep.stages.push_back(std::move(s));
  };
  const unsigned nt = detail::thread_count(o.threads);
  std::vector<std::string> docs;
  note_stage(detail::read_stage(o, docs));
  note_stage(detail::clean_stage(o.clean, nt, docs));
  if (o.dedup) note_stage(detail::dedup_stage(o.dedup_settings, nt, docs));
  note_stage(detail::filter_stage(o.filter, docs));
  if (docs.empty())
    throw input_error("prepare: no document survived cleaning, deduplication and filtering; check --keep-scripts, "
                      "--min-chars and the input files");
  rep.documents = docs.size();
  rep.text_bytes = detail::total_bytes(docs);
  std::vector<std::string_view> views(docs.begin(), docs.end());
  std::optional<tokenizer> tok;
  note_stage(detail::tokenizer_stage(o, nt, views, rep, tok));

  // Encode on all cores.
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok->encode_all(views, int(nt));
  for (const auto& v : ids) rep.tokens += v.size() + 1;  // + end of document
  note_stage({"encode", rep.documents, rep.documents, rep.text_bytes, rep.text_bytes, detail::seconds_since(t0),
              std::to_string(rep.tokens) + " tokens incl. eod, " +
                  detail::two_decimals(double(rep.text_bytes) / double(rep.tokens)) + " bytes/token"});
  if (o.before_write) o.before_write();
  note_stage(detail::write_stage(o, ids, *tok, rep));
  return rep;
}

/// The report as a fixed-width table with MB/s per stage. "removed" is in - out; a stage that
/// makes more than it takes (reading splits a file into documents) shows "-" there.
inline std::string format_report(const prepare_report& r) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-10s %10s %10s %9s %12s %12s %12s %8s %8s  %s\n", "stage", "docs in", "docs out",
                "removed", "bytes in", "bytes out", "removed", "seconds", "MB/s", "notes");
  out += line;
  auto removed = [](std::uint64_t in, std::uint64_t out) { return in >= out ? std::to_string(in - out) : std::string("-"); };
  for (const auto& s : r.stages) {
    std::snprintf(line, sizeof line, "%-10s %10llu %10llu %9s %12llu %12llu %12s %8.2f %8.2f  %s\n", s.name.c_str(),
                  (unsigned long long)s.documents_in, (unsigned long long)s.documents_out,
                  removed(s.documents_in, s.documents_out).c_str(), (unsigned long long)s.bytes_in,
                  (unsigned long long)s.bytes_out, removed(s.bytes_in, s.bytes_out).c_str(), s.seconds,
                  s.seconds > 0 ? double(s.bytes_in) / 1e6 / s.seconds : 0.0, s.note.c_str());
    out += line;
  }
  return out;
}

}  // namespace loom::data::text
