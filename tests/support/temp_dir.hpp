#pragma once
// A fresh directory under $TMPDIR for one test, removed with everything in it at scope exit.
#include <doctest/doctest.h>

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace loom_test {

struct temp_dir {
  std::filesystem::path path;
  /// mkdtemp("<TMPDIR>/<prefix>XXXXXX"); fails the test when it cannot be created.
  explicit temp_dir(const std::string& prefix = "loom_test_") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  std::filesystem::path operator/(const std::string& name) const { return path / name; }
};

}  // namespace loom_test
