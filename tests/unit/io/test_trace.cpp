#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <loom/io/trace.hpp>

namespace fs = std::filesystem;
using loom::io::step_window;
using loom::io::trace_recorder;

namespace {
fs::path fresh_dir() {
  static int counter = 0;
  auto d = fs::temp_directory_path() / ("loom_test_trace_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

nlohmann::json load(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE(in);
  return nlohmann::json::parse(in);  // throws (fails the test) on invalid JSON
}

/// Complete events on each (pid, tid) track must nest: sorted by start, each event lies
/// entirely inside the enclosing open event or starts after it ended. Returns the number of
/// violations.
int nesting_violations(const nlohmann::json& events) {
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> tracks;
  for (const auto& e : events)
    if (e["ph"] == "X") tracks[{e["pid"].get<int>(), e["tid"].get<int>()}].push_back({e["ts"].get<double>(), e["dur"].get<double>()});
  int bad = 0;
  for (auto& [track, zs] : tracks) {
    std::sort(zs.begin(), zs.end(), [](auto a, auto b) { return a.first != b.first ? a.first < b.first : a.second > b.second; });
    std::vector<double> open_ends;  // stack of end times
    for (auto [ts, dur] : zs) {
      while (!open_ends.empty() && ts >= open_ends.back()) open_ends.pop_back();
      if (!open_ends.empty() && ts + dur > open_ends.back() + 1e-3) ++bad;  // overlaps its parent's end
      open_ends.push_back(ts + dur);
    }
  }
  return bad;
}

void busy_us(double us) {
  const double t0 = trace_recorder::now_us();
  while (trace_recorder::now_us() - t0 < us) {
  }
}
}  // namespace

TEST_CASE("step_window::parse: half-open A:B, single step, off, and clear errors") {
  CHECK(step_window::parse("50:60").first == 50);
  CHECK(step_window::parse("50:60").last == 60);
  CHECK(step_window::parse("50:60").contains(59));
  CHECK_FALSE(step_window::parse("50:60").contains(60));
  CHECK_FALSE(step_window::parse("50:60").contains(49));
  CHECK(step_window::parse("7").contains(7));
  CHECK_FALSE(step_window::parse("7").contains(8));
  CHECK(step_window::parse("").empty());
  for (const char* bad : {"60:50", "5:5", "a:b", "-1:3", "3:", ":3", "1:2:3", "1.5:3", " 1:3"})
    CHECK_THROWS_AS(step_window::parse(bad), loom::input_error);
}

TEST_CASE("trace_recorder: off by default, zones are inert and nothing is written") {
  const auto dir = fresh_dir();
  {
    trace_recorder trace({.file = dir / "trace.json"});
    for (int step = 0; step < 5; ++step) {
      trace.begin_step(step);
      auto z = trace.zone("forward");
      CHECK_FALSE(z.active());
      CHECK_FALSE(trace.recording());
    }
    CHECK(trace.stats().events == 0);
  }
  CHECK_FALSE(fs::exists(dir / "trace.json"));
  fs::remove_all(dir);
}

TEST_CASE("trace_recorder: records exactly the window, nests per track, valid trace JSON") {
  const auto dir = fresh_dir();
  const auto file = dir / "trace.json";
  int starts = 0, stops = 0;
  std::vector<std::pair<double, double>> step_bounds;  // what the loop saw, for the window check
  double window_begin = 0, window_end = 0;
  {
    trace_recorder trace({.window = step_window::parse("3:5"),
                          .file = file,
                          .pid = 2,
                          .process_name = "rank 2",
                          .on_start = [&] { ++starts; },
                          .on_stop = [&] { ++stops; }});
    trace.name_this_thread("main");
    std::optional<loom::io::trace_zone> straddling;
    for (int step = 0; step < 8; ++step) {
      if (step == 3) window_begin = trace_recorder::now_us();
      trace.begin_step(step);
      if (step == 5) {
        window_end = trace_recorder::now_us();
        straddling.reset();  // opened in step 4, closes in step 5: outside the window, dropped
      }
      CHECK(trace.recording() == (step == 3 || step == 4));
      {
        auto fwd = trace.zone("forward", "compute");
        busy_us(30);
        {
          auto mm = trace.zone("matmul", "kernel");
          mm.arg("m", 7).arg("n", 13);
          busy_us(20);
        }
        auto ln = trace.zone("layernorm", "kernel");
        busy_us(10);
      }
      {
        auto bwd = trace.zone("backward", "compute");
        // A data-loader thread records on its own track.
        std::thread loader([&] {
          trace.name_this_thread("loader");
          auto z = trace.zone("data_wait", "data");
          busy_us(15);
        });
        loader.join();
        auto ar = trace.zone("all_reduce dp", "comm");
        ar.arg("bytes", 4096);
        busy_us(10);
      }
      trace.instant("marker");
      const loom::io::trace_arg mem[] = {{"bytes", 1000.0 + step}};
      trace.counter("memory", mem);
      if (step == 4) straddling.emplace(trace.zone("straddling"));
    }
    CHECK(starts == 1);
    CHECK(stops == 1);
    CHECK(trace.stats().finished);
    CHECK(trace.stats().dropped == 0);
    CHECK(fs::exists(file));  // written as the window closed, before destruction
  }
  const auto doc = load(file);
  const auto& ev = doc["traceEvents"];
  REQUIRE(ev.is_array());
  std::map<std::string, int> count;
  std::map<int, std::string> thread_names;
  for (const auto& e : ev) {
    CHECK(e["pid"] == 2);
    CHECK(e.contains("tid"));
    if (e["ph"] == "M") {
      if (e["name"] == "thread_name") thread_names[e["tid"].get<int>()] = e["args"]["name"];
      if (e["name"] == "process_name") CHECK(e["args"]["name"] == "rank 2");
      continue;
    }
    ++count[e["name"].get<std::string>()];
    const double ts = e["ts"].get<double>();
    const double end = ts + (e["ph"] == "X" ? e["dur"].get<double>() : 0.0);
    CHECK(ts >= window_begin);  // nothing from steps 0..2
    CHECK(end <= window_end);   // nothing from steps 5..7
    if (e["name"] == "matmul") {
      CHECK(e["args"]["m"] == 7);
      CHECK(e["args"]["n"] == 13);
      CHECK(e["cat"] == "kernel");
    }
    if (e["name"] == "all_reduce dp") CHECK(e["args"]["bytes"] == 4096);
  }
  CHECK(count["step 3"] == 1);
  CHECK(count["step 4"] == 1);
  CHECK(count["step 5"] == 0);
  CHECK(count["forward"] == 2);
  CHECK(count["matmul"] == 2);
  CHECK(count["data_wait"] == 2);
  CHECK(count["marker"] == 2);
  CHECK(count["memory"] == 2);
  CHECK(count["straddling"] == 0);
  CHECK(nesting_violations(ev) == 0);
  // One track per thread, named.
  CHECK(thread_names.size() >= 2);
  CHECK(std::count_if(thread_names.begin(), thread_names.end(), [](auto& p) { return p.second == "main"; }) == 1);
  CHECK(std::count_if(thread_names.begin(), thread_names.end(), [](auto& p) { return p.second == "loader"; }) >= 1);
  for (const auto& e : ev)
    if (e["name"] == "data_wait") CHECK(thread_names[e["tid"].get<int>()] == "loader");
  CHECK(doc["otherData"]["window"] == "3:5");
  CHECK(doc["otherData"]["dropped_events"] == 0);
  fs::remove_all(dir);
}

TEST_CASE("trace_recorder: the nesting check catches overlapping zones") {
  // Guard that the validator above can fail: partial overlap on one track.
  nlohmann::json ev = nlohmann::json::array();
  ev.push_back({{"ph", "X"}, {"pid", 0}, {"tid", 0}, {"ts", 0.0}, {"dur", 10.0}});
  ev.push_back({{"ph", "X"}, {"pid", 0}, {"tid", 0}, {"ts", 5.0}, {"dur", 10.0}});
  CHECK(nesting_violations(ev) == 1);
  ev[1]["tid"] = 1;  // same times on another track: fine
  CHECK(nesting_violations(ev) == 0);
}

TEST_CASE("trace_recorder: memory is bounded by max_events; drops are reported") {
  const auto dir = fresh_dir();
  trace_recorder trace({.window = {0, 100}, .max_events = 10});
  for (int step = 0; step < 3; ++step) {
    trace.begin_step(step);
    for (int i = 0; i < 20; ++i) auto z = trace.zone("tiny");
  }
  trace.stop();
  const auto s = trace.stats();
  CHECK(s.events == 10);
  CHECK(s.dropped == 3 * 20 + 3 - 10);  // 60 zones + 3 step zones
  CHECK(s.recorder_seconds > 0);
  trace.write(dir / "t.json");
  const auto doc = load(dir / "t.json");
  CHECK(doc["otherData"]["dropped_events"] == 53);
  fs::remove_all(dir);
}

TEST_CASE("trace_recorder: a run ending inside the window still writes; ranks merge") {
  const auto dir = fresh_dir();
  for (int rank = 0; rank < 2; ++rank) {
    trace_recorder trace({.window = {1, 1000}, .file = dir / ("rank" + std::to_string(rank) + ".json"), .pid = rank});
    for (int step = 0; step < 3; ++step) {
      trace.begin_step(step);
      auto z = trace.zone("forward");
    }
  }  // destructor closes step 2 and writes
  const fs::path in[] = {dir / "rank0.json", dir / "rank1.json"};
  loom::io::merge_trace_files(in, dir / "merged.json");
  const auto doc = load(dir / "merged.json");
  std::map<int, int> forward_per_pid;
  for (const auto& e : doc["traceEvents"])
    if (e["name"] == "forward") ++forward_per_pid[e["pid"].get<int>()];
  CHECK(forward_per_pid[0] == 2);
  CHECK(forward_per_pid[1] == 2);
  const fs::path missing[] = {dir / "nope.json"};
  CHECK_THROWS_AS(loom::io::merge_trace_files(missing, dir / "m2.json"), loom::input_error);
  fs::remove_all(dir);
}
