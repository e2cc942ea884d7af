// report — turn a training log into one self-contained HTML page: loss (and validation
// loss), learning rate, gradient norm, step time, throughput (tokens/s, MFU) and memory
// plots drawn as inline SVG, a summary table and the step-breakdown table. Give two logs to
// compare two runs on the same axes (the second run's figures also as a ratio to the first).
//
//   report out/logs/metrics.jsonl -o out/report.html
//   report runs/a/metrics.jsonl runs/b/metrics.jsonl --label fp32 --label bf16 -o cmp.html
//   report out/logs                       # a --log-dir: reads out/logs/metrics.jsonl
//
// Input: the JSON-lines log train_gpt writes into --log-dir (io/jsonl.hpp, tags in
// docs/observability.md). Lines torn by a crash (a JSON prefix) are skipped with a warning;
// a resumed run that logged some steps twice keeps the later values. The page loads nothing:
// no scripts, fonts or images from anywhere (open it offline, attach it to an issue).
//
// Errors (missing, empty, corrupt log; unwritable output; bad flag) exit with status 2 and
// one line naming the problem and the fix.
#include "cli.hpp"  // CLI11 and parse_or_exit
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/io/detail/checkpoint_fs.hpp>

namespace {

namespace fs = std::filesystem;
using loom::input_error;

// ---- reading a log -------------------------------------------------------------------------

struct point {
  double step, value;
};
using series = std::vector<point>;  // increasing step

/// One run's log: every numeric tag as a series over steps.
struct run_log {
  std::string label, path;
  std::map<std::string, series, std::less<>> tags;
  std::size_t records = 0, torn = 0, nulls = 0;
  double first_time = NAN, last_time = NAN;
  const series* find(std::string_view tag) const {
    const auto it = tags.find(tag);
    return it == tags.end() || it->second.empty() ? nullptr : &it->second;
  }
};

/// Appends (step, v); a step at or before the series' last one means the run was resumed from
/// an earlier checkpoint, so the points logged after that step by the first attempt are dropped.
void append(series& s, double step, double v) {
  while (!s.empty() && s.back().step >= step) s.pop_back();
  s.push_back({step, v});
}

/// nlohmann-json's parse error without its "[json.exception.parse_error.N] " tag, and at most
/// about `limit` characters, shortened at a word boundary (a "last read" quote of a long line
/// would otherwise fill the terminal).
std::string json_error_text(const nlohmann::json::parse_error& e, std::size_t limit = 160) {
  std::string text = e.what();
  if (text.starts_with("[json.exception.")) {
    const std::size_t tag_end = text.find("] ");
    if (tag_end != std::string::npos) text.erase(0, tag_end + 2);
  }
  if (text.size() > limit) {
    const std::size_t space = text.rfind(' ', limit);
    text.erase(space == std::string::npos || space < limit / 2 ? limit : space);
    text += " ...";
  }
  return text;
}

/// Reads `path` (a metrics.jsonl, or a --log-dir holding one). Throws input_error for a
/// missing, unreadable, empty or corrupt log.
run_log read_log(std::string path, std::string label) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path f = fs::path(path) / "metrics.jsonl";
    if (!fs::exists(f, ec))
      throw input_error("'" + path + "' is a directory without metrics.jsonl; pass the --log-dir of a train_gpt run "
                        "(it holds metrics.jsonl) or the .jsonl file itself");
    path = f.string();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw input_error("cannot open log '" + path + "': " + std::strerror(errno) +
                      "; pass the metrics.jsonl that train_gpt writes into its --log-dir (default: logs/ in --out's "
                      "directory, out/logs)");
  run_log run{std::move(label), path, {}, 0, 0, 0, NAN, NAN};
  std::string line;
  std::size_t lineno = 0;
  std::vector<std::size_t> torn_lines;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      // a crash mid-write leaves a prefix of a JSON object: the parser runs out of input
      if (line.front() == '{' && e.byte >= line.size()) {
        ++run.torn;
        torn_lines.push_back(lineno);
        continue;
      }
      throw input_error("log '" + path + "', line " + std::to_string(lineno) + " is not JSON (" +
                        json_error_text(e) +
                        "); pass a metrics.jsonl written by train_gpt --log-dir, or delete the damaged lines");
    }
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number())
      throw input_error("log '" + path + "', line " + std::to_string(lineno) +
                        " is not a metrics record (a JSON object with a numeric \"step\"); pass a metrics.jsonl "
                        "written by train_gpt --log-dir");
    const double step = j["step"].get<double>();
    ++run.records;
    for (const auto& [key, v] : j.items()) {
      if (key == "step") continue;
      if (key == "time") {
        if (v.is_number()) {
          const double t = v.get<double>();
          if (std::isnan(run.first_time)) run.first_time = t;
          run.last_time = t;
        }
        continue;
      }
      if (v.is_null()) {  // non-finite value (NaN/inf is written as null)
        ++run.nulls;
        continue;
      }
      if (!v.is_number()) continue;  // other fields (strings, objects): not plotted
      const double x = v.get<double>();
      if (std::isfinite(x)) append(run.tags[key], step, x);
    }
  }
  if (in.bad()) throw input_error("cannot read log '" + path + "': " + std::strerror(errno) + "; check the file");
  if (run.records == 0)
    throw input_error("log '" + path + "' is empty" + (run.torn ? " (only a torn line)" : std::string()) +
                      ": no step was logged; train for at least one step with --log-dir set, or pass another log");
  if (!torn_lines.empty()) {
    std::string which;
    for (std::size_t i = 0; i < torn_lines.size() && i < 5; ++i) which += (i ? ", " : "") + std::to_string(torn_lines[i]);
    std::fprintf(stderr, "report: warning: log '%s': skipped %zu line(s) cut short by a crash (line %s%s)\n", path.c_str(),
                 torn_lines.size(), which.c_str(), torn_lines.size() > 5 ? ", ..." : "");
  }
  return run;
}

// ---- numbers as text ---------------------------------------------------------------------

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

/// Short axis/table label: 12.5k, 1.2M, 6e-04, 0.25, 3.21.
std::string short_number(double v) {
  const double a = std::fabs(v);
  if (v == 0) return "0";
  if (a >= 1e9) return fmt("%.3gG", v / 1e9);
  if (a >= 1e6) return fmt("%.3gM", v / 1e6);
  if (a >= 1e4) return fmt("%.3gk", v / 1e3);
  if (a < 1e-2) return fmt("%.2g", v);
  return fmt("%.4g", v);
}

std::string html_escape(std::string_view s) {
  std::string o;
  for (char c : s) switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  return o;
}

// ---- statistics -------------------------------------------------------------------------

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return NAN;
  const auto k = std::size_t(std::clamp(q, 0.0, 1.0) * double(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(k), v.end());
  return v[k];
}
std::vector<double> values(const series& s, double from_fraction = 0) {
  std::vector<double> v;
  for (std::size_t i = std::size_t(from_fraction * double(s.size())); i < s.size(); ++i) v.push_back(s[i].value);
  return v;
}
/// Exponential moving average with TensorBoard's debiasing (weight w on the past).
series smooth(const series& s, double w) {
  series o;
  double acc = 0, norm = 0;
  for (const auto& p : s) {
    acc = w * acc + (1 - w) * p.value;
    norm = w * norm + (1 - w);
    o.push_back({p.step, acc / norm});
  }
  return o;
}

// ---- SVG plots ------------------------------------------------------------------------------

constexpr std::array<const char*, 2> run_colors{"#1f6fb4", "#d9480f"};  // run A blue, run B orange

struct line_spec {
  const series* data = nullptr;
  std::string name;             // legend
  const char* color = "#000";
  enum kind { raw, smoothed, dashed, markers, area } style = raw;
  double scale = 1;             // plotted value = value * scale
  const series* lower = nullptr;  // area: filled between `lower` (same steps; null = 0) and `data`
};

struct plot_spec {
  std::string id, title, unit;
  std::vector<line_spec> lines;
  bool include_zero = false;  // throughput, memory: start the axis at 0
  bool robust_top = false;    // cut the y-axis above the 99th percentile (first-step outliers)
  std::string note;           // small text under the title
};

/// 1-2-5 tick spacing for about `n` ticks over [lo, hi].
double nice_step(double lo, double hi, int n) {
  const double raw = (hi - lo) / n;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  return (hi - lo) / step < 3 ? step / 2 : step;  // at least 3 intervals
}

constexpr double plot_w = 560, plot_h = 215;
constexpr double pad_l = 58, pad_r = 14, pad_t = 12, pad_b = 34;

/// Points to draw: all of them, or for long runs the min and max of each pixel column (keeps
/// spikes, a few thousand points at most).
std::vector<point> decimate(const series& s, double x0, double x1) {
  const double cols = plot_w - pad_l - pad_r;
  if (double(s.size()) <= 2 * cols) return s;
  std::vector<point> o;
  std::size_t i = 0;
  while (i < s.size()) {
    const auto col = std::floor((s[i].step - x0) / (x1 - x0) * cols);
    point lo = s[i], hi = s[i];
    std::size_t j = i;
    for (; j < s.size() && std::floor((s[j].step - x0) / (x1 - x0) * cols) == col; ++j) {
      if (s[j].value < lo.value) lo = s[j];
      if (s[j].value > hi.value) hi = s[j];
    }
    if (lo.step <= hi.step) o.insert(o.end(), {lo, hi});
    else o.insert(o.end(), {hi, lo});
    i = j;
  }
  return o;
}

/// One plot as an <svg class="plot">; empty string if no line has data.
std::string svg_plot(const plot_spec& p) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  std::vector<double> all;
  for (const auto& l : p.lines) {
    if (!l.data) continue;
    for (const auto& q : *l.data) {
      x0 = std::min(x0, q.step), x1 = std::max(x1, q.step);
      y0 = std::min(y0, q.value * l.scale), y1 = std::max(y1, q.value * l.scale);
      all.push_back(q.value * l.scale);
    }
  }
  if (all.empty()) return {};
  std::string clipped;
  if (p.robust_top && all.size() >= 20) {
    const double top = quantile(all, 0.99), med = quantile(all, 0.5);
    const double cut = top + 0.25 * (top - std::min(y0, med));
    if (cut < y1) {
      clipped = " (axis cut at " + short_number(cut) + "; max " + short_number(y1) + ")";
      y1 = cut;
    }
  }
  if (p.include_zero) y0 = std::min(y0, 0.0), y1 = std::max(y1, 0.0);
  if (y1 - y0 < 1e-12 * std::max(1.0, std::fabs(y1))) {  // flat line: give it some room
    const double d = y1 == 0 ? 1 : 0.1 * std::fabs(y1);
    y0 -= p.include_zero && y0 == 0 ? 0 : d, y1 += d;
  } else if (!p.include_zero) {
    const double m = 0.04 * (y1 - y0);
    y0 -= m, y1 += m;
  } else {
    y1 += 0.04 * (y1 - y0);
  }
  if (x1 == x0) x0 -= 1, x1 += 1;
  const double ix0 = pad_l, ix1 = plot_w - pad_r, iy0 = pad_t, iy1 = plot_h - pad_b;
  auto X = [&](double x) { return ix0 + (x - x0) / (x1 - x0) * (ix1 - ix0); };
  auto Y = [&](double y) { return iy1 - (std::clamp(y, y0 - 0.02 * (y1 - y0), y1 + 0.02 * (y1 - y0)) - y0) / (y1 - y0) * (iy1 - iy0); };

  std::string s = "<svg class=\"plot\" id=\"plot-" + p.id + "\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 " +
                  fmt("%.0f", plot_w) + " " + fmt("%.0f", plot_h) + "\" role=\"img\" aria-label=\"" + html_escape(p.title) + "\">\n";
  s += "<title>" + html_escape(p.title) + "</title>\n";
  s += "<defs><clipPath id=\"clip-" + p.id + "\"><rect x=\"" + fmt("%.1f", ix0) + "\" y=\"" + fmt("%.1f", iy0 - 2) +
       "\" width=\"" + fmt("%.1f", ix1 - ix0) + "\" height=\"" + fmt("%.1f", iy1 - iy0 + 4) + "\"/></clipPath></defs>\n";
  // grid and tick labels
  const double ys = nice_step(y0, y1, 5), xs = nice_step(x0, x1, 6);
  s += "<g class=\"grid\">";
  for (double y = std::ceil(y0 / ys) * ys; y <= y1 + 1e-9 * ys; y += ys) {
    const double v = std::fabs(y) < 1e-9 * ys ? 0 : y;
    s += "<line x1=\"" + fmt("%.1f", ix0) + "\" x2=\"" + fmt("%.1f", ix1) + "\" y1=\"" + fmt("%.1f", Y(v)) + "\" y2=\"" +
         fmt("%.1f", Y(v)) + "\"/><text class=\"yt\" x=\"" + fmt("%.1f", ix0 - 6) + "\" y=\"" + fmt("%.1f", Y(v) + 4) +
         "\">" + short_number(v) + "</text>";
  }
  for (double x = std::ceil(x0 / xs) * xs; x <= x1 + 1e-9 * xs; x += xs)
    s += "<line x1=\"" + fmt("%.1f", X(x)) + "\" x2=\"" + fmt("%.1f", X(x)) + "\" y1=\"" + fmt("%.1f", iy0) + "\" y2=\"" +
         fmt("%.1f", iy1) + "\"/><text class=\"xt\" x=\"" + fmt("%.1f", X(x)) + "\" y=\"" + fmt("%.1f", iy1 + 16) + "\">" +
         short_number(x) + "</text>";
  s += "</g>\n<rect class=\"frame\" x=\"" + fmt("%.1f", ix0) + "\" y=\"" + fmt("%.1f", iy0) + "\" width=\"" +
       fmt("%.1f", ix1 - ix0) + "\" height=\"" + fmt("%.1f", iy1 - iy0) + "\"/>\n";
  s += "<text class=\"axis\" x=\"" + fmt("%.1f", ix1) + "\" y=\"" + fmt("%.1f", plot_h - 3) + "\">step</text>\n";
  // lines
  s += "<g clip-path=\"url(#clip-" + p.id + ")\">\n";
  for (const auto& l : p.lines) {
    if (!l.data) continue;
    if (l.style == line_spec::area) {  // stacked series are bucketed already (stack_phases)
      s += "<polygon fill=\"" + std::string(l.color) + "\" fill-opacity=\"0.85\" stroke=\"none\" points=\"";
      for (const auto& q : *l.data) s += fmt("%.1f", X(q.step)) + "," + fmt("%.1f", Y(q.value * l.scale)) + " ";
      for (std::size_t i = l.data->size(); i-- > 0;)
        s += fmt("%.1f", X((*l.data)[i].step)) + "," + fmt("%.1f", Y(l.lower ? (*l.lower)[i].value * l.scale : 0.0)) + " ";
      s += "\"/>\n";
      continue;
    }
    const auto pts = decimate(*l.data, x0, x1);
    if (l.style == line_spec::markers || pts.size() == 1) {
      s += "<g fill=\"" + std::string(l.color) + "\">";
      for (const auto& q : pts)
        s += "<circle cx=\"" + fmt("%.1f", X(q.step)) + "\" cy=\"" + fmt("%.1f", Y(q.value * l.scale)) +
             "\" r=\"3.2\"><title>" + html_escape(l.name) + ", step " + fmt("%.0f", q.step) + ": " +
             short_number(q.value * l.scale) + "</title></circle>";
      s += "</g>\n";
      if (l.style == line_spec::markers && pts.size() > 1) {  // join the markers thinly
        s += "<polyline class=\"line\" stroke=\"" + std::string(l.color) + "\" stroke-width=\"1.2\" stroke-dasharray=\"4 3\" points=\"";
        for (const auto& q : pts) s += fmt("%.1f", X(q.step)) + "," + fmt("%.1f", Y(q.value * l.scale)) + " ";
        s += "\"/>\n";
      }
      continue;
    }
    const char* extra = l.style == line_spec::raw      ? "stroke-width=\"1\" stroke-opacity=\"0.28\""
                        : l.style == line_spec::dashed ? "stroke-width=\"1.6\" stroke-dasharray=\"6 4\""
                                                       : "stroke-width=\"1.8\"";
    s += "<polyline class=\"line\" stroke=\"" + std::string(l.color) + "\" " + extra + " points=\"";
    for (const auto& q : pts) s += fmt("%.1f", X(q.step)) + "," + fmt("%.1f", Y(q.value * l.scale)) + " ";
    s += "\"/>\n";
  }
  s += "</g>\n</svg>\n";
  // legend (HTML, wraps nicely) and title around the svg
  std::string legend;
  for (const auto& l : p.lines)
    if (l.data && l.style != line_spec::raw)
      legend += "<span class=\"key\"><i class=\"sw " + std::string(l.style == line_spec::dashed ? "dash" : l.style == line_spec::markers ? "dot" : l.style == line_spec::area ? "box" : "solid") +
                "\" style=\"--c:" + l.color + "\"></i>" + html_escape(l.name) + "</span>";
  std::string unit = p.unit.empty() ? "" : " <span class=\"unit\">" + html_escape(p.unit) + "</span>";
  std::string note = p.note + clipped;
  return "<figure class=\"card\"><figcaption><b>" + html_escape(p.title) + "</b>" + unit +
         (note.empty() ? "" : "<span class=\"note\">" + html_escape(note) + "</span>") + "</figcaption>" + s +
         "<div class=\"legend\">" + legend + "</div></figure>\n";
}

// ---- the page -----------------------------------------------------------------------------

/// Phase tags time/<phase>_ms in a fixed order (the step_timer's), then any other ones.
std::vector<std::string> phase_tags(const std::vector<run_log>& runs) {
  std::vector<std::string> tags = {"time/data_wait_ms", "time/h2d_copy_ms",  "time/forward_ms", "time/backward_ms",
                                   "time/exposed_comm_ms", "time/optimizer_ms", "time/other_ms"};
  for (const auto& r : runs)
    for (const auto& [t, s] : r.tags)
      if (t.starts_with("time/") && t.ends_with("_ms") && std::find(tags.begin(), tags.end(), t) == tags.end())
        tags.insert(tags.end() - 1, t);  // before "other"
  return tags;
}
std::string phase_label(std::string_view tag) { return std::string(tag.substr(5, tag.size() - 8)); }

constexpr std::array<const char*, 9> phase_colors{"#8c6bb1", "#bcbddc", "#1f6fb4", "#6baed6", "#e6550d",
                                                  "#31a354", "#bdbdbd", "#fdae6b", "#9e9ac8"};

/// Mean of a series over its steps after the first (the first step pays for warm-up).
double steady_mean(const series* s) {
  if (!s || s->empty()) return NAN;
  const std::size_t from = s->size() > 1 ? 1 : 0;
  double sum = 0;
  for (std::size_t i = from; i < s->size(); ++i) sum += (*s)[i].value;
  return sum / double(s->size() - from);
}

/// Cumulative phase times per step, ready for a stacked area plot: out[k] = sum of phases 0..k.
/// Long runs are averaged over buckets of steps so that there is about one point per pixel.
std::vector<series> stack_phases(const run_log& run, const std::vector<std::string>& tags) {
  std::map<double, std::vector<double>> at;  // step -> ms per phase
  for (std::size_t k = 0; k < tags.size(); ++k)
    if (const series* s = run.find(tags[k]))
      for (const auto& p : *s) {
        auto& v = at[p.step];
        v.resize(tags.size(), 0.0);
        v[k] = p.value;
      }
  std::vector<series> cum(tags.size());
  const std::size_t per = std::max<std::size_t>(1, (at.size() + 480) / 481);
  auto it = at.begin();
  while (it != at.end()) {
    double step = 0;
    std::vector<double> mean(tags.size(), 0.0);
    std::size_t n = 0;
    for (; it != at.end() && n < per; ++it, ++n) {
      step += it->first;
      for (std::size_t k = 0; k < tags.size(); ++k) mean[k] += it->second[k];
    }
    double acc = 0;
    for (std::size_t k = 0; k < tags.size(); ++k) {
      acc += mean[k] / double(n);
      cum[k].push_back({step / double(n), acc});
    }
  }
  return cum;
}

std::string breakdown_section(const std::vector<run_log>& runs) {
  const auto tags = phase_tags(runs);
  std::vector<std::vector<double>> ms(runs.size());  // [run][phase] mean ms per step
  std::vector<double> total(runs.size(), 0);
  bool any = false;
  for (std::size_t r = 0; r < runs.size(); ++r)
    for (const auto& t : tags) {
      const double m = steady_mean(runs[r].find(t));
      ms[r].push_back(m);
      if (!std::isnan(m)) total[r] += m, any = true;
    }
  if (!any) return "<p class=\"missing\">No step breakdown in the log (no time/&lt;phase&gt;_ms tags).</p>\n";
  std::string h = "<table class=\"breakdown\"><thead><tr><th rowspan=\"2\">phase</th>";
  for (const auto& r : runs) h += "<th colspan=\"2\" class=\"run\">" + html_escape(r.label) + "</th>";
  if (runs.size() == 2)
    h += "<th rowspan=\"2\" title=\"" + html_escape(runs[1].label) + " / " + html_escape(runs[0].label) + "\">ratio</th>";
  h += "</tr><tr>";
  for (std::size_t r = 0; r < runs.size(); ++r) h += "<th>ms/step</th><th>share</th>";
  h += "</tr></thead><tbody>\n";
  for (std::size_t i = 0; i < tags.size(); ++i) {
    h += "<tr><td><i class=\"sw solid\" style=\"--c:" + std::string(phase_colors[i % phase_colors.size()]) + "\"></i>" +
         html_escape(phase_label(tags[i])) + "</td>";
    for (std::size_t r = 0; r < runs.size(); ++r) {
      const double m = ms[r][i];
      h += std::isnan(m) ? "<td>&ndash;</td><td></td>"
                         : "<td>" + fmt("%.3f", m) + "</td><td>" + fmt("%.1f%%", total[r] > 0 ? 100 * m / total[r] : 0) + "</td>";
    }
    if (runs.size() == 2)
      h += "<td>" + (ms[0][i] > 0 && !std::isnan(ms[1][i]) ? fmt("%.2f&times;", ms[1][i] / ms[0][i]) : std::string("&ndash;")) + "</td>";
    h += "</tr>\n";
  }
  h += "<tr class=\"total\"><td>total</td>";
  for (std::size_t r = 0; r < runs.size(); ++r) h += "<td>" + fmt("%.3f", total[r]) + "</td><td>100%</td>";
  if (runs.size() == 2) h += "<td>" + (total[0] > 0 ? fmt("%.2f&times;", total[1] / total[0]) : std::string("&ndash;")) + "</td>";
  h += "</tr></tbody></table>\n";
  // the mean is the right accounting (phases add up), but say so when slow steps dominate it
  for (std::size_t r = 0; r < runs.size(); ++r)
    if (const series* st = runs[r].find("perf/step_ms"); st && st->size() > 2) {
      const auto v = values(*st, 1.0 / double(st->size()));
      const double med = quantile(v, 0.5), mx = quantile(v, 1.0);
      if (total[r] > 1.5 * med)
        h += "<p class=\"note\">" + html_escape(runs[r].label) + ": median step " + fmt("%.2f", med) + " ms, slowest " +
             fmt("%.0f", mx) + " ms &mdash; a few slow steps carry the mean (machine load?)</p>\n";
    }
  // one stacked bar per run, scaled to the slower run's step time
  const double longest = *std::max_element(total.begin(), total.end());
  const double bw = 520, bh = 22, lab = 70;
  std::string svg = "<svg class=\"bars\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 " + fmt("%.0f", lab + bw + 70) +
                    " " + fmt("%.0f", runs.size() * (bh + 12) + 4) + "\">\n";
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const double y = 4 + double(r) * (bh + 12);
    svg += "<text class=\"bl\" x=\"" + fmt("%.0f", lab - 8) + "\" y=\"" + fmt("%.1f", y + bh * 0.7) + "\">" +
           html_escape(runs[r].label) + "</text>";
    double x = lab;
    for (std::size_t i = 0; i < tags.size(); ++i) {
      const double m = ms[r][i];
      if (std::isnan(m) || m <= 0 || longest <= 0) continue;
      const double w = m / longest * bw;
      svg += "<rect x=\"" + fmt("%.2f", x) + "\" y=\"" + fmt("%.1f", y) + "\" width=\"" + fmt("%.2f", w) + "\" height=\"" +
             fmt("%.0f", bh) + "\" fill=\"" + phase_colors[i % phase_colors.size()] + "\"><title>" +
             html_escape(phase_label(tags[i])) + ": " + fmt("%.3f", m) + " ms</title></rect>";
      x += w;
    }
    svg += "<text class=\"bv\" x=\"" + fmt("%.1f", x + 6) + "\" y=\"" + fmt("%.1f", y + bh * 0.7) + "\">" +
           fmt("%.2f ms", total[r]) + "</text>\n";
  }
  svg += "</svg>\n";
  return h + svg;
}

/// Last value, and the same for a summary row.
struct summary_row {
  std::string name;
  std::vector<double> v;  // per run
  const char* format;
  bool lower_is_better;
  bool compare = true;  // show the relative change of the second run
};

std::string summary_section(const std::vector<run_log>& runs) {
  std::vector<summary_row> rows = {
      {"steps logged", {}, "%.0f", false, false},  {"last step", {}, "%.0f", false, false},
      {"final train loss (mean of last 10)", {}, "%.4f", true},
      {"best validation loss", {}, "%.4f", true},  {"final validation loss", {}, "%.4f", true},
      {"median step time, ms", {}, "%.2f", true},  {"median tokens/s (2nd half)", {}, "%.0f", false},
      {"median MFU (2nd half), %", {}, "%.1f", false}, {"peak RSS, MiB", {}, "%.1f", true},
      {"tracked peak, MiB", {}, "%.1f", true},     {"wall time span, s", {}, "%.0f", true}};
  for (const auto& r : runs) {
    auto last_mean = [](const series* s, std::size_t n) {
      if (!s) return double(NAN);
      double sum = 0;
      const std::size_t k = std::min(n, s->size());
      for (std::size_t i = s->size() - k; i < s->size(); ++i) sum += (*s)[i].value;
      return sum / double(k);
    };
    auto med = [](const series* s, double from, double scale = 1) {
      return s ? scale * quantile(values(*s, from), 0.5) : double(NAN);
    };
    auto maxv = [](const series* s) { return s ? quantile(values(*s), 1.0) : double(NAN); };
    const series* loss = r.find("train/loss");
    const series* val = r.find("val/loss");
    double last_step = -INFINITY;
    for (const auto& [t, s] : r.tags) last_step = std::max(last_step, s.back().step);
    rows[0].v.push_back(double(r.records));
    rows[1].v.push_back(last_step);
    rows[2].v.push_back(last_mean(loss, 10));
    rows[3].v.push_back(val ? quantile(values(*val), 0.0) : NAN);
    rows[4].v.push_back(last_mean(val, 1));
    rows[5].v.push_back(med(r.find("perf/step_ms"), 0));
    rows[6].v.push_back(med(r.find("perf/tokens_per_s"), 0.5));
    rows[7].v.push_back(med(r.find("perf/mfu"), 0.5, 100));
    rows[8].v.push_back(maxv(r.find("memory/rss_peak_mib")));
    rows[9].v.push_back(maxv(r.find("memory/tracked_peak_mib")));
    rows[10].v.push_back(r.last_time - r.first_time);
  }
  std::string h = "<table class=\"summary\"><thead><tr><th></th>";
  for (std::size_t i = 0; i < runs.size(); ++i)
    h += "<th><i class=\"sw solid\" style=\"--c:" + std::string(run_colors[i]) + "\"></i>" + html_escape(runs[i].label) + "</th>";
  if (runs.size() == 2) h += "<th>change</th>";
  h += "</tr></thead><tbody>\n";
  for (const auto& row : rows) {
    h += "<tr><td>" + html_escape(row.name) + "</td>";
    for (double v : row.v) h += "<td>" + (std::isnan(v) ? std::string("&ndash;") : fmt(row.format, v)) + "</td>";
    if (runs.size() == 2) {
      const double a = row.v[0], b = row.v[1];
      std::string c = "&ndash;";
      if (std::isfinite(a) && std::isfinite(b) && a != 0 && row.compare) {
        const double rel = (b - a) / std::fabs(a);
        const bool better = row.lower_is_better ? rel < 0 : rel > 0;
        c = "<span class=\"" + std::string(std::fabs(rel) < 0.005 ? "same" : better ? "better" : "worse") + "\">" +
            fmt("%+.1f%%", 100 * rel) + "</span>";
      }
      h += "<td>" + c + "</td>";
    }
    h += "</tr>\n";
  }
  return h + "</tbody></table>\n";
}

const char* css = R"(
:root{--fg:#1d232a;--muted:#66707a;--line:#e3e7ec;--bg:#f6f7f9}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif}
main{max-width:1180px;margin:0 auto;padding:20px 18px 40px}
header h1{font-size:22px;margin:0 0 2px}
header p{margin:0;color:var(--muted)}
.runs{display:flex;flex-wrap:wrap;gap:6px 22px;margin:8px 0 0}
.runs span{color:var(--muted)} .runs b{color:var(--fg)}
.top{display:grid;grid-template-columns:1fr 1fr;gap:14px;margin:16px 0}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:14px}
.card{background:#fff;border:1px solid var(--line);border-radius:8px;padding:10px 12px 8px;margin:0;min-width:0;overflow-x:auto}
th.run{text-align:center;border-bottom:1px solid #c9ced6}
.card h2{font-size:15px;margin:0 0 8px}
figcaption{display:flex;align-items:baseline;gap:8px;margin-bottom:2px}
figcaption b{font-size:15px} .unit{color:var(--muted);font-size:12px}
.note{margin-left:auto;color:var(--muted);font-size:11px}
p.note{margin:6px 0 0;font-size:12px}
svg.plot{width:100%;height:auto;display:block}
svg.plot .grid line{stroke:#eef0f3;stroke-width:1}
svg.plot .frame{fill:none;stroke:#c9ced6}
svg.plot text{font-size:11px;fill:var(--muted)}
svg.plot .yt{text-anchor:end} svg.plot .xt{text-anchor:middle} svg.plot .axis{text-anchor:end}
svg.plot .line{fill:none;stroke-linejoin:round;stroke-linecap:round}
.legend{display:flex;flex-wrap:wrap;gap:2px 14px;font-size:12px;color:var(--muted);min-height:18px}
.sw{display:inline-block;width:16px;height:0;border-top:3px solid var(--c);margin-right:5px;vertical-align:middle}
.sw.dash{border-top-style:dashed} .sw.dot{width:9px;height:9px;border:0;border-radius:50%;background:var(--c)}
.sw.box,td .sw.solid{width:11px;height:11px;border:0;border-radius:2px;background:var(--c)}
th .sw.solid{width:14px}
table{border-collapse:collapse;width:100%;font-size:13px;font-variant-numeric:tabular-nums}
th,td{padding:3px 8px;border-bottom:1px solid var(--line);text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}
th{font-weight:600;color:var(--muted)}
tr.total td{font-weight:600;border-bottom:0}
.better{color:#2b8a3e} .worse{color:#c92a2a} .same{color:var(--muted)}
svg.bars{width:100%;height:auto;margin-top:10px}
svg.bars text{font-size:12px;fill:var(--fg)} svg.bars .bl{text-anchor:end}
.missing{color:var(--muted);font-style:italic}
footer{margin-top:16px;color:var(--muted);font-size:12px}
)";

std::string page(const std::vector<run_log>& runs, const std::string& title) {
  // series the plots draw; smoothed copies are kept here so the specs can point at them
  std::deque<series> smoothed;  // stable addresses
  auto sm = [&](const series* s) -> const series* {
    if (!s || s->size() < 30) return nullptr;
    smoothed.push_back(smooth(*s, std::clamp(1.0 - 3.0 / std::sqrt(double(s->size())), 0.5, 0.98)));
    return &smoothed.back();
  };
  std::vector<plot_spec> plots(7);
  plots[0] = {"loss", "Loss", "nats/token", {}, false, false, ""};
  plots[1] = {"lr", "Learning rate", "", {}, true, false, ""};
  plots[2] = {"grad_norm", "Gradient norm", "before clipping", {}, false, true, ""};
  plots[3] = {"step_time", "Step time", "ms", {}, true, true, ""};
  plots[4] = {"tokens_per_s", "Throughput", "tokens/s, rolling 20 steps", {}, true, false, ""};
  plots[5] = {"mfu", "Model FLOPs utilisation", "%", {}, true, false, ""};
  plots[6] = {"memory", "Memory", "MiB", {}, true, false, ""};
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const auto& run = runs[r];
    const char* c = run_colors[r];
    const std::string who = runs.size() > 1 ? run.label + " " : "";
    // raw and smoothed for the noisy per-step series
    auto noisy = [&](plot_spec& p, const char* tag, const std::string& name) {
      const series* s = run.find(tag);
      const series* m = sm(s);
      if (m) {
        p.lines.push_back({s, name, c, line_spec::raw});
        p.lines.push_back({m, name + " (smoothed)", c, line_spec::smoothed});
      } else {
        p.lines.push_back({s, name, c, line_spec::smoothed});
      }
    };
    noisy(plots[0], "train/loss", who + "train");
    plots[0].lines.push_back({run.find("val/loss"), who + "validation", c, line_spec::markers});
    plots[1].lines.push_back({run.find("train/lr"), who + "lr", c, line_spec::smoothed});
    noisy(plots[2], "train/grad_norm", who + "grad norm");
    noisy(plots[3], "perf/step_ms", who + "step");
    plots[4].lines.push_back({run.find("perf/tokens_per_s"), who + "tokens/s", c, line_spec::smoothed});
    plots[5].lines.push_back({run.find("perf/mfu"), who + "MFU", c, line_spec::smoothed, 100});
    plots[6].lines.push_back({run.find("memory/rss_mib"), who + "RSS", c, line_spec::smoothed});
    plots[6].lines.push_back({run.find("memory/tracked_peak_mib"), who + "tracked peak", c, line_spec::dashed});
  }
  const auto tags = phase_tags(runs);
  for (std::size_t r = 0; r < runs.size(); ++r) {
    plot_spec p{"breakdown" + std::string(runs.size() > 1 ? "-" + std::to_string(r + 1) : ""),
                "Step breakdown" + (runs.size() > 1 ? " \u00b7 " + runs[r].label : std::string()), "ms per step, stacked",
                {}, true, true, ""};
    const series* prev = nullptr;
    auto cum = stack_phases(runs[r], tags);
    for (std::size_t k = 0; k < tags.size(); ++k) {
      if (cum[k].empty()) break;
      bool adds = false;  // leave out phases that are 0 throughout
      for (std::size_t i = 0; i < cum[k].size() && !adds; ++i) adds = cum[k][i].value > (prev ? (*prev)[i].value : 0.0);
      if (!adds) continue;
      smoothed.push_back(std::move(cum[k]));
      p.lines.push_back({&smoothed.back(), phase_label(tags[k]), phase_colors[k % phase_colors.size()], line_spec::area, 1, prev});
      prev = &smoothed.back();
    }
    if (runs[r].find("perf/step_ms") && runs[r].find("perf/step_ms")->size() > 2 * 481)
      p.note = "means over buckets of steps";
    plots.push_back(std::move(p));
  }
  std::string figs, missing;
  int drawn = 0;
  for (const auto& p : plots) {
    const std::string f = svg_plot(p);
    if (f.empty()) missing += (missing.empty() ? "" : ", ") + p.title;
    else figs += f, ++drawn;
  }
  char when[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
                  "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
                  "<meta name=\"generator\" content=\"loom examples/report\">\n<title>" +
                  html_escape(title) + "</title>\n<style>" + css + "</style></head>\n<body><main>\n<header><h1>" +
                  html_escape(title) + "</h1><p>generated " + when + " by loom's report from " +
                  std::to_string(runs.size()) + (runs.size() == 1 ? " log" : " logs") + "</p><div class=\"runs\">";
  for (std::size_t r = 0; r < runs.size(); ++r) {
    h += "<div><i class=\"sw solid\" style=\"--c:" + std::string(run_colors[r]) + "\"></i><b>" + html_escape(runs[r].label) +
         "</b> <span>" + html_escape(runs[r].path) + " &middot; " + std::to_string(runs[r].records) + " records";
    if (runs[r].torn) h += " &middot; " + std::to_string(runs[r].torn) + " torn line(s) skipped";
    if (runs[r].nulls) h += " &middot; " + std::to_string(runs[r].nulls) + " non-finite value(s)";
    h += "</span></div>";
  }
  h += "</div></header>\n<section class=\"top\"><div class=\"card\"><h2>Summary</h2>\n" + summary_section(runs) +
       "</div>\n<div class=\"card\"><h2>Step breakdown <span class=\"unit\">mean over all steps but the first</span></h2>\n" +
       breakdown_section(runs) + "</div></section>\n<section class=\"grid\" data-plots=\"" + std::to_string(drawn) + "\">\n" +
       figs + "</section>\n";
  if (!missing.empty()) h += "<p class=\"missing\">Not in the log" + std::string(runs.size() > 1 ? "s" : "") + ": " + html_escape(missing) + ".</p>\n";
  h += "<footer>Smoothed lines: exponential moving average with TensorBoard's debiasing; faint lines: every step. "
       "Tags and units: docs/observability.md.</footer>\n</main></body></html>\n";
  return h;
}

/// Writes `text` to `path` through a temporary file in the same directory (fsync, rename, fsync of
/// the directory): an existing page survives a failed write.
void write_atomically(const fs::path& path, const std::string& text) {
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw input_error("-o '" + path.string() + "': directory '" + dir.string() + "' does not exist; create it or choose another path");
  if (fs::is_directory(path, ec)) throw input_error("-o '" + path.string() + "' is a directory; name a file, e.g. " + (path / "report.html").string());
  // temporary file, fsync, rename over `path`, fsync of the directory (the checkpoints' writer)
  loom::io::detail::write_file_atomic(path, text);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> logs, labels;
  std::string output = "report.html", title;
  CLI::App app{"report: turn one train_gpt metrics.jsonl (or two, to compare runs) into a self-contained HTML page "
               "with SVG plots and the step-breakdown table"};
  app.add_option("logs", logs, "metrics.jsonl files (or --log-dir directories holding one): one, or two to compare")
      ->required()
      ->expected(1, 2);
  app.add_option("-o,--output", output, "the HTML page to write (replaced atomically)");
  app.add_option("--label", labels, "a name per log, in order (default: the log's directory name)")->expected(1, 2);
  app.add_option("--title", title, "page title (default: 'loom training report')");
  loom_examples::parse_or_exit(app, argc, argv);
  try {
    if (labels.size() > logs.size())
      throw input_error("--label given " + std::to_string(labels.size()) + " times for " + std::to_string(logs.size()) +
                        " log(s); pass one label per log");
    std::vector<run_log> runs;
    for (std::size_t i = 0; i < logs.size(); ++i) {
      std::string label = i < labels.size() ? labels[i] : "";
      if (label.empty()) {
        const fs::path p = fs::absolute(logs[i]).lexically_normal();
        const fs::path d = fs::is_directory(p) ? p : p.parent_path();
        label = d.filename().empty() ? p.filename().string() : d.filename().string();
      }
      runs.push_back(read_log(logs[i], label));
    }
    if (runs.size() == 2 && runs[0].label == runs[1].label) runs[0].label += " (1)", runs[1].label += " (2)";
    if (title.empty()) title = runs.size() == 2 ? "loom: " + runs[0].label + " vs " + runs[1].label : "loom training report: " + runs[0].label;
    write_atomically(output, page(runs, title));
    std::printf("report: wrote %s (%zu run%s)\n", output.c_str(), runs.size(), runs.size() == 1 ? "" : "s");
    return 0;
  } catch (const input_error& e) {
    std::fprintf(stderr, "report: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "report: failed: %s\n", e.what());
    return 1;
  }
}
