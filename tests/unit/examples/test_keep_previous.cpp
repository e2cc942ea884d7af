// Keeping what an earlier run left at an output path (examples/keep_previous.hpp): the names
// <stem>.previous-<k><extension>, one k for files written together (a dataset), hard links that
// leave the files in place, and putting everything back after a failed write.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../../../examples/keep_previous.hpp"
#include "../data/paths.hpp"

namespace {

namespace fs = std::filesystem;

void put(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// The four files of a dataset at `prefix`, as prepare_data writes them.
std::vector<fs::path> dataset(const fs::path& prefix) {
  std::vector<fs::path> files;
  for (const char* e : {".bin", ".idx", ".model", ".json"}) files.push_back(prefix.string() + e);
  return files;
}

ino_t inode(const fs::path& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_ino;
}

}  // namespace

TEST_CASE("keep previous: previous_run_name puts .previous-<k> before the extension") {
  CHECK(loom_examples::previous_run_name("out/quickstart.safetensors", 1) == "out/quickstart.previous-1.safetensors");
  CHECK(loom_examples::previous_run_name("w.safetensors", 12) == "w.previous-12.safetensors");
  CHECK(loom_examples::previous_run_name("out/shake.v2.bin", 3) == "out/shake.v2.previous-3.bin");
}

TEST_CASE("keep previous: previous_runs lists the kept files of a path, oldest first") {
  loom_test::scratch_dir d("keep_previous_list");
  const fs::path out = d.path / "d.model";
  CHECK(loom_examples::previous_runs(out).empty());
  for (const char* name : {"d.previous-10.model", "d.previous-2.model", "d.previous-1.model", "d.previous-01.model",
                           "d.previous-x.model", "d.previous-3.json", "e.previous-1.model", "d.previous-.model"})
    put(d.path / name, name);
  CHECK(loom_examples::previous_runs(out) ==
        std::vector<fs::path>{d.path / "d.previous-1.model", d.path / "d.previous-2.model", d.path / "d.previous-10.model"});
}

TEST_CASE("keep previous: a dataset's files are kept under one k, the first free for all of them") {
  loom_test::scratch_dir d("keep_previous_set");
  const auto files = dataset(d.path / "d");
  for (const auto& f : files) put(f, "old " + f.filename().string());
  put(d.path / "d.previous-1.idx", "older idx");  // k = 1 is taken for one file: k = 2 for all
  const auto kept = loom_examples::keep_previous(files, "pass another --output-prefix");
  REQUIRE(kept.size() == 4);
  for (std::size_t i = 0; i < files.size(); ++i) {
    CHECK(kept[i].out == files[i]);
    CHECK(kept[i].kept == loom_examples::previous_run_name(files[i], 2));
    CHECK(kept[i].linked);
    CHECK(inode(kept[i].kept) == inode(files[i]));  // a second name: the file is still in place
    CHECK(loom_test::read_file(files[i]) == "old " + files[i].filename().string());
  }
  CHECK(loom_test::read_file(d.path / "d.previous-1.idx") == "older idx");
  CHECK_FALSE(fs::exists(d.path / "d.previous-1.bin"));
}

TEST_CASE("keep previous: nothing there, nothing kept; a partial set keeps what exists") {
  loom_test::scratch_dir d("keep_previous_partial");
  const auto files = dataset(d.path / "d");
  auto kept = loom_examples::keep_previous(files, "fix");
  REQUIRE(kept.size() == 4);
  for (const auto& k : kept) CHECK(k.kept.empty());
  CHECK(std::distance(fs::directory_iterator(d.path), fs::directory_iterator()) == 0);
  put(files[0], "bin");
  put(files[1], "idx");
  kept = loom_examples::keep_previous(files, "fix");
  CHECK(kept[0].kept == d.path / "d.previous-1.bin");
  CHECK(kept[1].kept == d.path / "d.previous-1.idx");
  CHECK(kept[2].kept.empty());
  CHECK(kept[3].kept.empty());
}

TEST_CASE("keep previous: restore_previous after a failed write puts every file back as it was") {
  loom_test::scratch_dir d("keep_previous_restore");
  const auto files = dataset(d.path / "d");
  for (std::size_t i = 0; i < 3; ++i) put(files[i], "old " + std::to_string(i));  // no .json before
  const auto kept = loom_examples::keep_previous(files, "fix");
  // the write replaced .bin, wrote a .json where there was none, then failed
  put(d.path / "tmp", "new bin");
  fs::rename(d.path / "tmp", files[0]);
  put(files[3], "new json");
  loom_examples::restore_previous(kept);
  for (std::size_t i = 0; i < 3; ++i) CHECK(loom_test::read_file(files[i]) == "old " + std::to_string(i));
  CHECK_FALSE(fs::exists(files[3]));
  CHECK(std::distance(fs::directory_iterator(d.path), fs::directory_iterator()) == 3);  // no kept names left
  loom_examples::restore_previous({});  // keep_previous never ran: nothing to do
  CHECK(std::distance(fs::directory_iterator(d.path), fs::directory_iterator()) == 3);
}

TEST_CASE("keep previous: undo_keep drops the kept name while the file is still in place") {
  loom_test::scratch_dir d("keep_previous_undo");
  const fs::path out = d.path / "w.safetensors";
  put(out, "old");
  const auto kept = loom_examples::keep_previous(std::span(&out, 1), "fix").front();
  CHECK(kept.kept == d.path / "w.previous-1.safetensors");
  loom_examples::undo_keep(kept);
  CHECK(loom_test::read_file(out) == "old");
  CHECK_FALSE(fs::exists(kept.kept));
}

TEST_CASE("keep previous: drop_oldest removes all but the most recently written copies, files and folders") {
  loom_test::scratch_dir d("keep_previous_drop");
  const fs::path out = d.path / "w.safetensors";
  for (int k : {1, 2, 3, 10}) put(loom_examples::previous_run_name(out, k), std::to_string(k));
  fs::create_directory(d.path / "previous-1");
  put(d.path / "previous-1" / "trace.json", "{}");
  put(out, "current");
  // keep 0: everything stays
  CHECK(loom_examples::drop_oldest(loom_examples::previous_runs(out), 0, "--keep-previous").empty());
  CHECK(loom_examples::previous_runs(out).size() == 4);
  // keep 2: k = 1 and 2 go, 3 and 10 stay with their bytes, the current file is untouched
  const auto lines = loom_examples::drop_oldest(loom_examples::previous_runs(out), 2, "--keep-previous");
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].find("removed the older copy " + loom_examples::previous_run_name(out, 1).string()) == 0);
  CHECK(lines[1].find("--keep-previous 2 keeps the newest 2") != std::string::npos);
  CHECK(loom_examples::previous_runs(out) ==
        std::vector<fs::path>{loom_examples::previous_run_name(out, 3), loom_examples::previous_run_name(out, 10)});
  std::ifstream ten(loom_examples::previous_run_name(out, 10));
  CHECK(std::string(std::istreambuf_iterator<char>(ten), {}) == "10");
  CHECK(fs::exists(out));
  // by age, not by k: a newest copy that took the freed k = 1 stays, the oldest (k = 3) goes
  put(loom_examples::previous_run_name(out, 1), "newest");
  const auto now = fs::file_time_type::clock::now();
  fs::last_write_time(loom_examples::previous_run_name(out, 3), now - std::chrono::hours(2));
  fs::last_write_time(loom_examples::previous_run_name(out, 10), now - std::chrono::hours(1));
  fs::last_write_time(loom_examples::previous_run_name(out, 1), now);
  REQUIRE(loom_examples::drop_oldest(loom_examples::previous_runs(out), 2, "--keep-previous").size() == 1);
  CHECK(loom_examples::previous_runs(out) ==
        std::vector<fs::path>{loom_examples::previous_run_name(out, 1), loom_examples::previous_run_name(out, 10)});
  // a folder (a run's kept TensorBoard events) goes whole
  CHECK(loom_examples::drop_oldest({d.path / "previous-1", out}, 1, "--keep-previous").size() == 1);
  CHECK(!fs::exists(d.path / "previous-1"));
  CHECK(fs::exists(out));
}
