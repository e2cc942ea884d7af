#pragma once
// Shared by the libFuzzer targets tests/fuzz/fuzz_*.cpp (built by tests/fuzz/run.sh): a scratch
// directory per process (in /dev/shm when it exists, removed at exit), file writing, splitting
// one input into two files, and the two outcomes a target allows.
//
// LOOM_FUZZ_VERBOSE=1 prints why each input was rejected (or that it was accepted), to check
// that the committed seeds are valid files: LOOM_FUZZ_VERBOSE=1 ./fuzz tests/fuzz/corpus/<target>/*
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace loom_fuzz {

namespace fs = std::filesystem;

/// A directory "loom_fuzz_<name>_<pid>" that lives as long as the process (removed by the
/// destructor when libFuzzer exits normally; a crash leaves it for the post-mortem).
class scratch_dir {
 public:
  explicit scratch_dir(std::string_view name) {
    const fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    path_ = base / ("loom_fuzz_" + std::string(name) + "_" + std::to_string(::getpid()));
    fs::create_directories(path_);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const noexcept { return path_; }

 private:
  fs::path path_;
};

/// Writes `n` bytes at `data` to `p` (=, truncating).
inline void write_file(const fs::path& p, const void* data, std::size_t n) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
}
inline void write_file(const fs::path& p, std::string_view s) { write_file(p, s.data(), s.size()); }

/// Splits an input into two files: bytes [0, 2) are the first part's length n (little-endian,
/// clamped to what follows), then the first part (n bytes), then the second (the rest).
inline std::pair<std::string_view, std::string_view> split2(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return {};
  const std::size_t want = std::size_t(data[0]) | (std::size_t(data[1]) << 8);
  const auto* body = reinterpret_cast<const char*>(data + 2);
  const std::size_t n = std::min(want, size - 2);
  return {std::string_view(body, n), std::string_view(body + n, size - 2 - n)};
}

/// True when LOOM_FUZZ_VERBOSE is set (read once).
inline bool verbose() {
  static const bool v = std::getenv("LOOM_FUZZ_VERBOSE") != nullptr;
  return v;
}
/// The expected outcome for malformed input: a loom::input_error (or a parse error of the CLI).
inline void rejected(const std::exception& e) {
  if (verbose()) std::fprintf(stderr, "rejected: %s\n", e.what());
}
/// The input was a valid file and every reader of it succeeded.
inline void accepted(std::string_view what) {
  if (verbose()) std::fprintf(stderr, "accepted: %.*s\n", int(what.size()), what.data());
}

/// A property every accepted input must have; prints `what` and aborts (a libFuzzer crash) when not.
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "loom fuzz: property violated: %s\n", what);
    std::abort();
  }
}

}  // namespace loom_fuzz
