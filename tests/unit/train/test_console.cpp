#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <fcntl.h>
#include <unistd.h>

#include <loom/train/console.hpp>

#include "../../support/scoped.hpp"

using namespace loom::train;

namespace {
std::string read_all(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) s.append(buf, n);
  return s;
}
std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}
step_record rec(std::int64_t step) {
  step_record r;
  r.report = {.step = step, .tokens = 2048, .loss = 3.21039, .lr = 6e-4, .grad_norm = 0.8123};
  r.tokens_per_second = 2912.4;
  r.mfu = 0.5061;
  r.step_seconds = 0.0412;
  r.eta_seconds = 201;
  r.time.total = 0.0412;
  return r;
}
}  // namespace

TEST_CASE("format_duration and format_step_line") {
  CHECK(format_duration(45) == "45s");
  CHECK(format_duration(201) == "3m21s");
  CHECK(format_duration(7500) == "2h05m");
  CHECK(format_duration(3 * 86400 + 4 * 3600 + 10) == "3d04h");
  CHECK(format_duration(-1) == "?");
  CHECK(format_step_line(rec(120), 5000) ==
        "step  120/5000 | loss 3.2104 | lr 6.00e-04 | gnorm 0.812 | 2912 tok/s | MFU 50.6% | 41.2 ms/step | ETA 3m21s");
  auto r = rec(7);
  r.report.loss_scale = 512;
  r.report.skipped = true;
  r.mfu = std::nan("");
  r.eta_seconds = std::nan("");
  CHECK(format_step_line(r, 0) ==
        "step 7 | loss 3.2104 | lr 6.00e-04 | gnorm 0.812 | scale 512 | 2912 tok/s | 41.2 ms/step [skipped]");
}

TEST_CASE("console: plain lines to a file, every N steps, with a summary table") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  step_metrics m;
  {
    console c({.out = f, .redraw = -1, .total_steps = 25, .print_every = 10, .summary_every = 20});
    CHECK_FALSE(c.redraws());  // a file is not a terminal
    for (int s = 0; s < 25; ++s) {
      step_breakdown b;
      b.seconds[std::size_t(phase::forward)] = 0.03;
      b.seconds[std::size_t(phase::backward)] = 0.01;
      b.total = 0.04;
      c.step(m.record({.step = s, .tokens = 100}, b), m);
      if (s == 12) c.message("validation loss 2.9000");
    }
  }
  const auto out = read_all(f);
  std::fclose(f);
  CHECK(out.find('\r') == std::string::npos);
  CHECK(out.find("\x1b[") == std::string::npos);
  // Lines for steps 0 (first), 9, 19 (every 10th done), 24 (last).
  CHECK(count("\n" + out, "\nstep ") == 4);  // lines that start with "step "
  CHECK(out.find("step  0/25") != std::string::npos);
  CHECK(out.find("step  9/25") != std::string::npos);
  CHECK(out.find("step 19/25") != std::string::npos);
  CHECK(out.find("step 24/25") != std::string::npos);
  CHECK(count(out, "validation loss 2.9000\n") == 1);
  // One table, after step 19 (20 steps done), covering steps 0..19.
  CHECK(count(out, "-- steps 0..19 (20): 40.00 ms/step") == 1);
  CHECK(out.find("  forward          30.00    75.0%") != std::string::npos);
  CHECK(out.find("  backward         10.00    25.0%") != std::string::npos);
  CHECK(out.find("  total            40.00   100.0%") != std::string::npos);
  CHECK(m.summary().first_step == 20);  // reset after the table
}

TEST_CASE("console: on a terminal it redraws, but not under CI, TERM=dumb or an MPI launcher") {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  REQUIRE(master >= 0);
  REQUIRE(::grantpt(master) == 0);
  REQUIRE(::unlockpt(master) == 0);
  std::FILE* tty = std::fopen(::ptsname(master), "w");
  REQUIRE(tty);
  {
    loom_test::scoped_env ci("CI", nullptr), term("TERM", "xterm"), ompi("OMPI_COMM_WORLD_SIZE", nullptr),
        pmi("PMI_SIZE", nullptr);
    CHECK(console({.out = tty}).redraws());
    {
      loom_test::scoped_env mpi("OMPI_COMM_WORLD_SIZE", "2");
      CHECK_FALSE(console({.out = tty}).redraws());
    }
    {
      loom_test::scoped_env hydra("PMI_SIZE", "4");
      CHECK_FALSE(console({.out = tty}).redraws());
    }
    {
      loom_test::scoped_env ci_set("CI", "true");
      CHECK_FALSE(console({.out = tty}).redraws());
    }
    {
      loom_test::scoped_env dumb("TERM", "dumb");
      CHECK_FALSE(console({.out = tty}).redraws());
    }
    CHECK_FALSE(console({.out = tty, .redraw = 0}).redraws());
  }
  std::fclose(tty);
  ::close(master);
}

TEST_CASE("console: redraw mode rewrites one line in place and ends it once") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  step_metrics m;
  {
    console c({.out = f, .redraw = 1, .total_steps = 3, .summary_every = 0, .min_redraw_seconds = 0});
    CHECK(c.redraws());
    for (int s = 0; s < 3; ++s) {
      step_breakdown b;
      b.total = 0.01;
      c.step(m.record({.step = s, .tokens = 1}, b), m);
    }
  }
  const auto out = read_all(f);
  std::fclose(f);
  CHECK(count(out, "\r") == 3);
  CHECK(count(out, "\x1b[K") == 3);
  CHECK(count(out, "\n") == 1);  // the last step ends the line; the destructor adds nothing
  CHECK(out.back() == '\n');
}

TEST_CASE("format_summary: memory line") {
  step_summary s;
  s.steps = 2;
  s.first_step = 0;
  s.last_step = 1;
  s.total = 0.2;
  s.seconds[std::size_t(phase::other)] = 0.2;
  s.min_step = s.max_step = 0.1;
  s.tokens = 400;
  loom::memory_counter c;
  c.add(loom::memory_kind::optimizer, 5 << 20);
  const auto snap = c.snapshot();
  const loom::process_memory os{.rss = 64 << 20, .peak_rss = 96 << 20, .available = true};
  const auto t = format_summary(s, &snap, &os);
  CHECK(t.find("(2): 100.00 ms/step (min 100.00, max 100.00), 2000 tok/s") != std::string::npos);
  CHECK(t.find("optimizer 5.0 |") != std::string::npos);
  CHECK(t.find("tracked peak 5.0 | RSS 64.0 | RSS peak 96.0\n") != std::string::npos);
}
