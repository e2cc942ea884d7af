// train_gpt's weights file (examples/train_gpt/weights_file.hpp): the first write of a run keeps
// an earlier run's file as <stem>.previous-<k><extension>, later writes do not, and a failed
// write leaves the directory as it was (the names: test_keep_previous.cpp).
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "../../../examples/train_gpt/weights_file.hpp"
#include "../data/paths.hpp"

namespace {

namespace fs = std::filesystem;

void put(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// An atomic write of `text` to `p`, as io::save_weights does it: a temporary file renamed over `p`.
void atomic_put(const fs::path& p, const std::string& text) {
  const fs::path tmp = p.string() + ".tmp";
  put(tmp, text);
  fs::rename(tmp, p);
}

}  // namespace

TEST_CASE("weights file: the first write keeps an earlier run's file, at the first free name") {
  loom_test::scratch_dir d("weights_file_keep");
  const fs::path out = d.path / "w.safetensors";
  put(out, "run 1");
  put(d.path / "w.previous-1.safetensors", "run 0");  // taken: never replaced
  train_gpt_cli::weights_file w(out);
  CHECK(w.write([&] { atomic_put(out, "run 2, first write"); }) == d.path / "w.previous-2.safetensors");
  CHECK(w.write([&] { atomic_put(out, "run 2, second write"); }).empty());  // the run's own file: not kept
  CHECK(loom_test::read_file(out) == "run 2, second write");
  CHECK(loom_test::read_file(d.path / "w.previous-1.safetensors") == "run 0");
  CHECK(loom_test::read_file(d.path / "w.previous-2.safetensors") == "run 1");
  CHECK_FALSE(fs::exists(d.path / "w.previous-3.safetensors"));
}

TEST_CASE("weights file: nothing to keep when --out does not exist yet") {
  loom_test::scratch_dir d("weights_file_fresh");
  const fs::path out = d.path / "w.safetensors";
  train_gpt_cli::weights_file w(out);
  CHECK(w.write([&] { atomic_put(out, "new"); }).empty());
  CHECK(loom_test::read_file(out) == "new");
  CHECK_FALSE(fs::exists(d.path / "w.previous-1.safetensors"));
}

TEST_CASE("weights file: a failed write leaves the earlier file where it was, and keeps it on the retry") {
  loom_test::scratch_dir d("weights_file_failed");
  const fs::path out = d.path / "w.safetensors";
  put(out, "old");
  train_gpt_cli::weights_file w(out);
  CHECK_THROWS_AS(w.write([] { throw std::runtime_error("disk full"); }), std::runtime_error);
  CHECK(loom_test::read_file(out) == "old");
  CHECK_FALSE(fs::exists(d.path / "w.previous-1.safetensors"));
  // failing after its rename (the directory's fsync): the new file is in place, the old one kept
  CHECK_THROWS_AS(w.write([&] {
    atomic_put(out, "new");
    throw std::runtime_error("fsync");
  }),
                  std::runtime_error);
  CHECK(loom_test::read_file(out) == "new");
  CHECK(loom_test::read_file(d.path / "w.previous-1.safetensors") == "old");
}
