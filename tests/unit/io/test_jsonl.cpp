#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <loom/io/jsonl.hpp>

namespace fs = std::filesystem;

namespace {
fs::path fresh_file(const char* name) {
  static int counter = 0;
  auto d = fs::temp_directory_path() /
           ("loom_test_jsonl_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  fs::remove_all(d);
  return d / name;
}
std::vector<std::string> lines_of(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}
}  // namespace

TEST_CASE("jsonl_writer: one parseable object per line, flushed, same scalars") {
  const auto file = fresh_file("metrics.jsonl");
  loom::io::jsonl_writer log(file);
  const loom::io::scalar s1[] = {{"train/loss", 3.25}, {"train/lr", 6e-4}, {"perf/tokens_per_s", 2912.5}};
  log.write_scalars(10, s1, 1.7e9);
  // Flushed after every line by default: readable while the writer is alive.
  auto lines = lines_of(file);
  REQUIRE(lines.size() == 1);
  auto j = nlohmann::json::parse(lines[0]);
  CHECK(j["step"] == 10);
  CHECK(j["time"].get<double>() == 1.7e9);
  CHECK(j["train/loss"].get<double>() == 3.25);
  CHECK(j["train/lr"].get<double>() == 6e-4);
  CHECK(j["perf/tokens_per_s"].get<double>() == 2912.5);

  const loom::io::scalar s2[] = {{"val/loss", std::numeric_limits<double>::quiet_NaN()}};
  log.write_scalars(11, s2);
  lines = lines_of(file);
  REQUIRE(lines.size() == 2);
  j = nlohmann::json::parse(lines[1]);
  CHECK(j["val/loss"].is_null());
  CHECK(j["time"].get<double>() > 1.6e9);
  CHECK_THROWS_AS(log.write(nlohmann::json::array({1, 2})), loom::input_error);
  fs::remove_all(file.parent_path());
}

TEST_CASE("jsonl_writer: appends after a torn line; append=false replaces only once written") {
  const auto file = fresh_file("m.jsonl");
  fs::create_directories(file.parent_path());
  std::ofstream(file) << "{\"step\": 1}\n{\"step\": 2, \"train/lo";  // a crash mid-line
  {
    loom::io::jsonl_writer log(file);
    log.write({{"step", 3}});
  }
  auto lines = lines_of(file);
  REQUIRE(lines.size() == 3);
  CHECK(nlohmann::json::parse(lines[0])["step"] == 1);
  CHECK_FALSE(nlohmann::json::accept(lines[1]));
  CHECK(nlohmann::json::parse(lines[2])["step"] == 3);

  {  // replace mode, nothing written: the old log stays
    loom::io::jsonl_writer log(file, {.append = false, .flush_every = 1});
  }
  CHECK(lines_of(file).size() == 3);
  CHECK_FALSE(fs::exists(file.string() + ".tmp"));
  {
    loom::io::jsonl_writer log(file, {.append = false, .flush_every = 1});
    log.write({{"step", 0}});
    CHECK(lines_of(file).size() == 1);
  }
  CHECK(nlohmann::json::parse(lines_of(file).at(0))["step"] == 0);
  fs::remove_all(file.parent_path());
}
