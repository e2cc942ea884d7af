#pragma once
/// \file JSON-lines metrics log: one JSON object per line, the same scalars TensorBoard gets.
///
/// Format (https://jsonlines.org): UTF-8, one object per line, '\n' terminated. A metrics line is
///   {"step": 120, "time": 1732871234.51, "train/loss": 3.21, "train/lr": 0.0006, ...}
/// with "time" in Unix seconds. Non-finite values are written as null (JSON has no NaN).
/// Readers: `pandas.read_json(path, lines=True)`, `jq`, examples/report.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cerrno>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

#include <loom/core/error.hpp>
#include <loom/io/scalar.hpp>

namespace loom::io {

/// Options of a jsonl_writer.
struct jsonl_options {
  bool append = true;           ///< keep existing lines (a resumed run continues its log); false = start a new file
  std::size_t flush_every = 1;  ///< hand lines to the OS after this many (>= 1); 1 = every line
};

/// Writes JSON objects, one per line, to `file`.
///
/// Appending never loses earlier lines; if the file ends in a torn line (a crash mid-write),
/// a '\n' is written first so every new line parses on its own. With append = false an
/// existing file is replaced only once this writer has written its first line, via a
/// temporary file renamed over it (the old log survives a crash at start-up).
/// Not thread-safe: call from one thread.
/// Errors: loom::input_error if the file cannot be opened (names the path and the reason);
/// loom::error if a later write fails (disk full).
class jsonl_writer {
 public:
  explicit jsonl_writer(std::filesystem::path file, jsonl_options opt = {}) : path_(std::move(file)), opt_(opt) {
    if (opt_.flush_every == 0) opt_.flush_every = 1;
    std::error_code ec;
    if (path_.has_parent_path()) std::filesystem::create_directories(path_.parent_path(), ec);
    const auto target = opt_.append ? path_ : temp_path();
    bool torn = false;
    if (opt_.append && std::filesystem::exists(path_, ec) && std::filesystem::file_size(path_, ec) > 0) {
      if (std::FILE* r = std::fopen(path_.c_str(), "rb")) {
        std::fseek(r, -1, SEEK_END);
        torn = std::fgetc(r) != '\n';
        std::fclose(r);
      }
    }
    file_ = std::fopen(target.c_str(), opt_.append ? "ab" : "wb");
    if (!file_)
      throw input_error("jsonl: cannot open '" + target.string() + "' for writing: " + std::strerror(errno) +
                        "; choose a writable --log-dir");
    if (torn) put("\n");
  }
  jsonl_writer(jsonl_writer&& o) noexcept
      : path_(std::move(o.path_)), opt_(o.opt_), file_(std::exchange(o.file_, nullptr)),
        unflushed_(o.unflushed_), renamed_(o.renamed_) {}
  jsonl_writer& operator=(jsonl_writer&&) = delete;
  jsonl_writer(const jsonl_writer&) = delete;
  jsonl_writer& operator=(const jsonl_writer&) = delete;
  ~jsonl_writer() {
    if (!file_) return;
    std::fclose(file_);
    if (!opt_.append && !renamed_) {  // nothing written: leave the old file alone
      std::error_code ec;
      std::filesystem::remove(temp_path(), ec);
    }
  }

  /// Writes `object` as one line. Throws loom::input_error if it is not a JSON object.
  void write(const nlohmann::json& object) {
    if (!object.is_object()) throw input_error("jsonl: a line must be a JSON object; wrap the value in {...}");
    put(object.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    if (!opt_.append && !renamed_) {  // first line is out: make the new file the log
      flush();
      std::error_code ec;
      std::filesystem::rename(temp_path(), path_, ec);
      if (ec) throw error("jsonl: cannot rename '" + temp_path().string() + "' to '" + path_.string() + "': " + ec.message());
      renamed_ = true;
    }
    if (++unflushed_ >= opt_.flush_every) flush();
  }
  /// Writes {"step": step, "time": wall_time, <tag>: <value>, ...} (time default: now).
  /// A repeated tag keeps its last value.
  void write_scalars(std::int64_t step, std::span<const scalar> values, double wall_time = -1) {
    nlohmann::json j = nlohmann::json::object();
    j["step"] = step;
    j["time"] = wall_time >= 0 ? wall_time
                               : std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    for (const auto& s : values) j[std::string(s.tag)] = s.value;  // NaN/inf -> null
    write(j);
  }
  /// Hands buffered lines to the OS.
  void flush() {
    if (std::fflush(file_) != 0) fail();
    unflushed_ = 0;
  }
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path temp_path() const { return std::filesystem::path(path_.string() + ".tmp"); }
  void put(const std::string& s) {
    if (std::fwrite(s.data(), 1, s.size(), file_) != s.size()) fail();
  }
  [[noreturn]] void fail() {
    throw error("jsonl: writing '" + path_.string() + "' failed: " + std::strerror(errno) +
                "; check free space on the log directory's disk");
  }

  std::filesystem::path path_;
  jsonl_options opt_;
  std::FILE* file_ = nullptr;
  std::size_t unflushed_ = 0;
  bool renamed_ = false;
};

}  // namespace loom::io
