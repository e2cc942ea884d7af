#pragma once
// Paths used by the data tests: the shared corpora, the committed golden files, a scratch dir.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

// LOOM_TEST_TEXT: the text pipeline (utf8proc, xxhash, SentencePiece, nlohmann-json) can be
// tested. Under CMake only when loom::text is linked (it defines LOOM_WITH_TEXT); when a test is
// compiled by hand, when the headers are there.
#if defined(LOOM_SOURCE_DIR)
#if defined(LOOM_WITH_TEXT)
#define LOOM_TEST_TEXT 1
#endif
#elif __has_include(<utf8proc.h>) && __has_include(<xxhash.h>) && __has_include(<sentencepiece_processor.h>) && \
    __has_include(<nlohmann/json.hpp>)
#define LOOM_TEST_TEXT 1
#endif

namespace loom_test {

// The source root: LOOM_SOURCE_DIR if the build defines it, else three levels above this file.
inline std::filesystem::path source_root() {
#ifdef LOOM_SOURCE_DIR
  return LOOM_SOURCE_DIR;
#else
  return std::filesystem::absolute(std::filesystem::path(__FILE__)).parent_path().parent_path().parent_path().parent_path();
#endif
}

// Real corpora (tinyshakespeare.txt, zh_classics.txt): LOOM_DATA_DIR, else <root>/../shared/data.
inline std::filesystem::path data_dir() {
#ifdef LOOM_DATA_DIR
  return LOOM_DATA_DIR;
#else
  return source_root().parent_path() / "shared" / "data";
#endif
}

inline std::filesystem::path golden_dir() { return source_root() / "tests" / "golden"; }

// A fresh directory under the system temp dir, removed when the object dies.
struct scratch_dir {
  std::filesystem::path path;
  explicit scratch_dir(const std::string& name)
      : path(std::filesystem::temp_directory_path() / ("loom_test_" + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace loom_test
