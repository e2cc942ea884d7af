#pragma once
/// \file The trainer's console: one compact live line per step, and every N steps a table of
/// where the time went.
///
/// On a terminal the line is redrawn in place ('\r' + clear-to-end-of-line), at most every
/// `min_redraw_seconds`; when the output is a file, a pipe, CI (the CI environment variable is
/// set, or TERM=dumb) or a rank started by an MPI launcher (OMPI_COMM_WORLD_SIZE or PMI_SIZE is
/// set: `mpirun` hands ranks a pseudo-terminal and merges their output), plain lines are printed every `print_every` steps instead, so logs stay
/// readable. Example line:
///   step  120/5000 | loss 3.2104 | lr 6.00e-04 | gnorm 0.812 | 2912 tok/s | MFU 50.6% | 41.2 ms/step | ETA 3m21s
/// (`| scale 512` appears when a loss scale is reported, `[skipped]` when the update was skipped.)
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <unistd.h>

#include <loom/core/memory.hpp>
#include <loom/train/metrics.hpp>

namespace loom::train {

/// Options of a console.
struct console_options {
  std::FILE* out = stdout;            ///< where to print (not owned)
  int redraw = -1;                    ///< -1 auto (a terminal; not CI, not mpirun), 0 plain lines, 1 redraw in place
  std::int64_t total_steps = 0;       ///< shown as step/total; 0 = just the step
  std::int64_t print_every = 10;      ///< plain mode: one line every N steps (plus the first and the last)
  std::int64_t summary_every = 100;   ///< breakdown table every N steps; 0 = never
  double min_redraw_seconds = 0.1;    ///< redraw mode: at most ~10 redraws per second
};

/// Formats a duration compactly: "45s", "3m21s", "2h05m", "3d04h".
inline std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<std::int64_t>(std::llround(seconds));
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  else if (s < 86400) std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600), static_cast<long long>(s / 60 % 60));
  else std::snprintf(buf, sizeof buf, "%lldd%02lldh", static_cast<long long>(s / 86400), static_cast<long long>(s / 3600 % 24));
  return buf;
}

/// The live line for one step (no newline, no escape codes). Fields whose value is NaN are left out.
inline std::string format_step_line(const step_record& s, std::int64_t total_steps) {
  std::string line;
  char buf[96];
  auto add = [&](const char* fmt, auto... v) {
    std::snprintf(buf, sizeof buf, fmt, v...);
    line += buf;
  };
  if (total_steps > 0) {
    const int w = static_cast<int>(std::to_string(total_steps).size());
    add("step %*lld/%lld", w, static_cast<long long>(s.report.step), static_cast<long long>(total_steps));
  } else {
    add("step %lld", static_cast<long long>(s.report.step));
  }
  if (!std::isnan(s.report.loss)) add(" | loss %.4f", s.report.loss);
  if (!std::isnan(s.report.lr)) add(" | lr %.2e", s.report.lr);
  if (!std::isnan(s.report.grad_norm)) add(" | gnorm %.3f", s.report.grad_norm);
  if (!std::isnan(s.report.loss_scale)) add(" | scale %.0f", s.report.loss_scale);
  add(" | %.0f tok/s", s.tokens_per_second);
  if (!std::isnan(s.mfu)) add(" | MFU %.1f%%", 100.0 * s.mfu);
  add(" | %.1f ms/step", 1e3 * s.step_seconds);
  if (!std::isnan(s.eta_seconds)) line += " | ETA " + format_duration(s.eta_seconds);
  if (s.report.skipped) line += " [skipped]";
  return line;
}

/// The breakdown table of a summary (lines end in '\n'). `mem` and `os` add a memory line.
inline std::string format_summary(const step_summary& sum, const memory_snapshot* mem = nullptr,
                                  const process_memory* os = nullptr) {
  std::string t;
  char buf[256];
  std::snprintf(buf, sizeof buf, "-- steps %lld..%lld (%zu): %.2f ms/step (min %.2f, max %.2f), %.0f tok/s --\n",
                static_cast<long long>(sum.first_step), static_cast<long long>(sum.last_step), sum.steps,
                sum.mean_step_ms(), 1e3 * sum.min_step, 1e3 * sum.max_step, sum.tokens_per_second());
  t += buf;
  t += "  phase          ms/step    share\n";
  for (std::size_t i = 0; i < phase_count; ++i) {
    const auto p = static_cast<phase>(i);
    std::snprintf(buf, sizeof buf, "  %-12s %9.2f %7.1f%%\n", std::string(phase_name(p)).c_str(), sum.mean_ms(p),
                  100.0 * sum.share(p));
    t += buf;
  }
  std::snprintf(buf, sizeof buf, "  %-12s %9.2f %7.1f%%\n", "total", sum.mean_step_ms(), sum.total > 0 ? 100.0 : 0.0);
  t += buf;
  constexpr double mib = 1.0 / (1024.0 * 1024.0);
  if (mem || (os && os->available)) {
    t += "  memory MiB:";
    if (mem) {
      for (std::size_t i = 0; i < memory_kind_count; ++i) {
        std::snprintf(buf, sizeof buf, " %s %.1f |", std::string(memory_kind_name(memory_kind(i))).c_str(),
                      double(mem->current[i]) * mib);
        t += buf;
      }
      std::snprintf(buf, sizeof buf, " tracked peak %.1f", double(mem->total_peak) * mib);
      t += buf;
    }
    if (os && os->available) {
      std::snprintf(buf, sizeof buf, "%s RSS %.1f | RSS peak %.1f", mem ? " |" : "", double(os->rss) * mib,
                    double(os->peak_rss) * mib);
      t += buf;
    }
    t += "\n";
  }
  return t;
}

/// The trainer's console; see the file comment. Not thread-safe: the training loop's thread.
/// Writes are flushed per line so that CI logs stream. Never throws on output errors.
class console {
 public:
  explicit console(console_options opt = {}) : opt_(opt) {
    if (!opt_.out) opt_.out = stdout;
    if (opt_.redraw < 0) opt_.redraw = auto_redraw(opt_.out) ? 1 : 0;
    if (opt_.print_every < 1) opt_.print_every = 1;
  }
  console(const console&) = delete;
  console& operator=(const console&) = delete;
  ~console() { finish(); }

  /// True if the live line is redrawn in place (a terminal), false for plain lines.
  bool redraws() const noexcept { return opt_.redraw == 1; }

  /// Shows step `s`; then, every summary_every steps, prints the breakdown table of
  /// m.summary() (with memory if given) and resets that summary.
  void step(const step_record& s, step_metrics& m, const memory_snapshot* mem = nullptr,
            const process_memory* os = nullptr) {
    const std::int64_t n = s.report.step + 1;  // steps done
    const bool last = opt_.total_steps > 0 && n >= opt_.total_steps;
    const bool table = opt_.summary_every > 0 && n % opt_.summary_every == 0;
    if (redraws()) {
      const auto now = std::chrono::steady_clock::now();
      if (last || table || !drawn_once_ ||
          std::chrono::duration<double>(now - last_draw_).count() >= opt_.min_redraw_seconds) {
        live(format_step_line(s, opt_.total_steps));
        last_draw_ = now;
        drawn_once_ = true;
      }
    } else if (s.report.step == first_step_seen(s.report.step) || last || n % opt_.print_every == 0) {
      line(format_step_line(s, opt_.total_steps));
    }
    if (table) {
      if (redraws()) end_live();
      put(format_summary(m.summary(), mem, os));
      m.reset_summary();
    }
    if (last) finish();
  }

  /// Prints a line (e.g. "validation loss 3.01", a checkpoint notice) without garbling the
  /// live line: the live line is ended first and redrawn at the next step.
  void message(std::string_view text) { line(text); }

  /// Ends the live line with a newline (idempotent). Called by the destructor.
  void finish() noexcept { end_live(); }

 private:
  static bool auto_redraw(std::FILE* f) noexcept {
    if (!::isatty(::fileno(f))) return false;
    if (std::getenv("CI")) return false;
    if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE")) return false;
    const char* term = std::getenv("TERM");
    return !(term && std::string_view(term) == "dumb");
  }
  std::int64_t first_step_seen(std::int64_t step) noexcept {
    if (first_step_ < 0) first_step_ = step;
    return first_step_;
  }
  void live(const std::string& text) noexcept {
    std::fputs("\r", opt_.out);
    std::fputs(text.c_str(), opt_.out);
    std::fputs("\x1b[K", opt_.out);  // clear what a longer previous line left
    std::fflush(opt_.out);
    live_open_ = true;
  }
  void end_live() noexcept {
    if (!live_open_) return;
    std::fputs("\n", opt_.out);
    std::fflush(opt_.out);
    live_open_ = false;
  }
  void line(std::string_view text) noexcept {
    end_live();
    std::fwrite(text.data(), 1, text.size(), opt_.out);
    std::fputs("\n", opt_.out);
    std::fflush(opt_.out);
  }
  void put(const std::string& text) noexcept {
    std::fputs(text.c_str(), opt_.out);
    std::fflush(opt_.out);
  }

  console_options opt_;
  bool live_open_ = false;
  bool drawn_once_ = false;
  std::int64_t first_step_ = -1;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace loom::train
