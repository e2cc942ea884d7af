#pragma once
/// \file A timeline profiler that records only a chosen window of steps and writes a Chrome
/// trace-event JSON file (opens in https://ui.perfetto.dev and chrome://tracing).
///
/// Off by default: a profiler left on costs time and memory (the practice guide's warning: it
/// cost several GB of NPU memory). With `--profile-steps 50:60` the recorder switches itself on
/// at the start of step 50, records steps 50..59, switches itself off at the start of step 60
/// and writes the file; nothing before or after the window is kept.
///
/// Format (Trace Event Format, "JSON Object Format"; docs.google.com/document/d/
/// 1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU):
///   {"traceEvents": [ {"name","cat","ph":"X","ts":us,"dur":us,"pid","tid","args":{...}}, ... ],
///    "displayTimeUnit": "ms", "otherData": {...}}
/// ph "X" = complete event (a zone), "i" = instant, "C" = counter, "M" = metadata
/// (process_name / thread_name). pid = the rank, tid = a small integer per thread or stream,
/// so Perfetto shows one track per rank and per thread/stream. Timestamps are microseconds of
/// std::chrono::steady_clock (CLOCK_MONOTONIC on Linux), so files of ranks on one machine share
/// a time axis and can be merged with merge_trace_files().
///
/// Cost: outside the window a zone is one relaxed atomic load and one branch to open and one
/// branch to close, no clock read, no allocation. Inside, a zone costs two clock reads, a mutex
/// and a vector append (about 0.1-0.3 us); stats() reports the total measured recorder time.
/// Memory is bounded by trace_options::max_events (events beyond it are counted, not kept).
#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <loom/core/error.hpp>
#include <loom/core/kernel_hook.hpp>
#include <loom/parallel/comm_observer.hpp>

namespace loom::io {

/// Steps [first, last) to record. first == last means "off" (the default).
struct step_window {
  std::int64_t first = 0;
  std::int64_t last = 0;

  constexpr bool empty() const noexcept { return last <= first; }
  constexpr bool contains(std::int64_t step) const noexcept { return step >= first && step < last; }

  /// Parses a --profile-steps value: "A:B" = steps A..B-1 (half-open, like a Python slice and
  /// Megatron's --profile-step-start/--profile-step-end); "A" = step A only; "" = off.
  /// Throws loom::input_error for anything else (negative, B <= A, not a number, a single step
  /// at the largest int64, whose window end would not be representable).
  static step_window parse(std::string_view spec) {
    if (spec.empty()) return {};
    auto number = [&](std::string_view s) {
      std::int64_t v = -1;
      const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (ec != std::errc{} || p != s.data() + s.size() || v < 0) bad(spec);
      return v;
    };
    const auto colon = spec.find(':');
    if (colon == std::string_view::npos) {
      const auto a = number(spec);
      if (a == std::numeric_limits<std::int64_t>::max()) bad(spec);  // a + 1 would overflow
      return {a, a + 1};
    }
    const step_window w{number(spec.substr(0, colon)), number(spec.substr(colon + 1))};
    if (w.empty()) bad(spec);
    return w;
  }

 private:
  [[noreturn]] static void bad(std::string_view spec) {
    throw input_error("--profile-steps '" + std::string(spec) +
                      "' is not a step window; write FIRST:LAST with 0 <= FIRST < LAST, e.g. 50:60 "
                      "(records steps 50..59)");
  }
};

/// A numeric argument shown in the event's detail pane (e.g. {"bytes", 4.2e6}).
/// `key` must outlive the zone it is attached to (use string literals).
struct trace_arg {
  std::string_view key;
  double value = 0;
};

/// A string argument (e.g. {"group", "tp"}); both are copied (interned) when the event is stored.
struct trace_label {
  std::string_view key;  ///< empty = none
  std::string_view value;
};

/// Options of a trace_recorder.
struct trace_options {
  step_window window{};            ///< empty = never record
  std::filesystem::path file{};    ///< written when the window closes; empty = call write() yourself
  int pid = 0;                     ///< the rank: one process track per rank
  std::string process_name{};      ///< track label, e.g. "rank 3 (tp 1, dp 1, pp 0)"; default "rank <pid>"
  std::size_t max_events = 1 << 18;///< memory bound (88 bytes per event: 22 MiB); extra events are dropped
  std::function<void()> on_start{};///< called when recording starts (e.g. aclprofStart for msprof)
  std::function<void()> on_stop{};  ///< called when recording stops (e.g. aclprofStop)
};

/// What a recorder did, for the console and the trace's "otherData".
struct trace_stats {
  std::size_t events = 0;          ///< events kept
  std::size_t dropped = 0;         ///< events not kept: over max_events
  double recorder_seconds = 0;     ///< time spent inside the recorder while recording (overhead)
  bool finished = false;           ///< the window has closed
};

class trace_recorder;

/// RAII zone: records one complete ("X") event from construction to destruction, if the
/// recorder was recording when the zone opened and still is when it closes. Move-only.
class trace_zone {
 public:
  trace_zone() noexcept {}  // user-provided: `return {}` must not zero the whole object
  trace_zone(trace_zone&& o) noexcept
      : rec_(std::exchange(o.rec_, nullptr)), name_(o.name_), cat_(o.cat_), tid_(o.tid_), t0_(o.t0_), nargs_(o.nargs_) {
    for (std::uint8_t i = 0; i < nargs_; ++i) ::new (&args_.a[i]) trace_arg(o.args_.a[i]);
  }
  trace_zone& operator=(trace_zone&&) = delete;
  trace_zone(const trace_zone&) = delete;
  trace_zone& operator=(const trace_zone&) = delete;
  inline ~trace_zone();

  /// Attaches a numeric argument (up to 4; more are ignored). No-op when not recording.
  trace_zone& arg(std::string_view key, double value) noexcept {
    if (rec_ && nargs_ < 4) ::new (&args_.a[nargs_++]) trace_arg{key, value};
    return *this;
  }
  /// True if this zone will be recorded (the recorder was on when it opened).
  bool active() const noexcept { return rec_ != nullptr; }

 private:
  friend class trace_recorder;
  trace_zone(trace_recorder* r, std::string_view name, std::string_view cat, int tid, double t0) noexcept
      : rec_(r), name_(name), cat_(cat), tid_(tid), t0_(t0) {}
  trace_recorder* rec_ = nullptr;
  std::string_view name_, cat_;
  int tid_ = -1;
  double t0_ = 0;
  union arg_storage {  // left uninitialised: an inert zone (outside the window) writes nothing here
    arg_storage() noexcept {}
    trace_arg a[4];
  } args_;
  std::uint8_t nargs_ = 0;
};

/// Records zones, instants and counters inside a step window; see the file comment.
///
/// Threads: zone(), complete(), instant(), counter() and name_thread() may be called from any
/// thread at any time. begin_step(), stop(), write() and stats() belong to the training loop's
/// thread. The recorder must outlive its zones.
/// Errors: write() and begin_step() (when the window closes and `file` is set) throw
/// loom::input_error if the file cannot be written; the destructor only prints to stderr.
class trace_recorder {
 public:
  explicit trace_recorder(trace_options opt = {}) : opt_(std::move(opt)) {
    if (opt_.process_name.empty()) opt_.process_name = "rank " + std::to_string(opt_.pid);
  }
  trace_recorder(const trace_recorder&) = delete;
  trace_recorder& operator=(const trace_recorder&) = delete;
  ~trace_recorder() {
    try {
      stop();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "loom: trace not written: %s\n", e.what());
    }
  }

  /// Call at the start of every step, before any of its zones. Starts recording at
  /// window.first, closes the previous step's "step N" zone, and at window.last stops, calls
  /// on_stop and writes `file` (if set). Steps need not be contiguous.
  void begin_step(std::int64_t step) {
    const double t = now_us();
    if (state_.load(std::memory_order_relaxed) == st_recording) {
      if (!opt_.window.contains(step)) {
        stop();  // closes the open step zone
        return;
      }
      push_step_zone(t);
    } else if (state_.load(std::memory_order_relaxed) == st_idle && opt_.window.contains(step)) {
      {
        std::lock_guard lock(mutex_);
        events_.reserve(opt_.max_events);  // address space only: pages are touched as events arrive
      }
      if (opt_.on_start) opt_.on_start();
      state_.store(st_recording, std::memory_order_release);
    } else {
      return;
    }
    step_ = step;
    step_t0_ = now_us();
    step_tid_ = thread_tid();
  }

  /// Stops recording now (idempotent): closes the open step, calls on_stop, writes `file` if
  /// set. Called by begin_step at the window's end and by the destructor (a run that ends
  /// inside the window still gets its trace).
  void stop() {
    if (state_.load(std::memory_order_relaxed) != st_recording) return;
    push_step_zone(now_us());
    state_.store(st_finished, std::memory_order_release);
    if (opt_.on_stop) opt_.on_stop();
    if (!opt_.file.empty()) write(opt_.file);
  }

  /// True while inside the window. One relaxed atomic load.
  bool recording() const noexcept { return state_.load(std::memory_order_relaxed) == st_recording; }

  /// Opens a zone named `name` (category `cat`) on thread track `tid` (-1 = the calling
  /// thread's own track). `name` and `cat` must outlive the zone (use literals or stable
  /// strings). Outside the window the zone is inert: one load and one branch.
  [[nodiscard]] trace_zone zone(std::string_view name, std::string_view cat = "cpu", int tid = -1) noexcept {
    if (state_.load(std::memory_order_relaxed) != st_recording) [[likely]]
      return {};
    return {this, name, cat, tid, now_us()};
  }

  /// Records a complete event measured elsewhere (e.g. from device events): begins at
  /// `begin_us` (steady_clock microseconds, see now_us()) and lasts `dur_us`.
  /// `label` adds one string argument (e.g. the communication group).
  void complete(std::string_view name, std::string_view cat, double begin_us, double dur_us, int tid = -1,
                std::span<const trace_arg> args = {}, trace_label label = {}) {
    if (!recording()) return;
    push('X', name, cat, begin_us, dur_us, tid, args, label);
  }
  /// A zero-duration marker (ph "i", thread scope).
  void instant(std::string_view name, std::string_view cat = "cpu", int tid = -1) {
    if (!recording()) return;
    push('i', name, cat, now_us(), 0, tid, {});
  }
  /// A counter sample (ph "C"): Perfetto draws `name` as a graph, e.g. ("memory", {"bytes", n}).
  void counter(std::string_view name, std::span<const trace_arg> series) {
    if (!recording()) return;
    push('C', name, "counter", now_us(), 0, 0, series);
  }
  /// Names a track: `tid` as returned by this_thread_tid() or chosen by the caller for a
  /// device stream (use tids >= 1000 for streams to stay clear of thread tracks).
  void name_thread(int tid, std::string name) {
    std::lock_guard lock(mutex_);
    thread_names_[tid] = std::move(name);
  }
  /// Names the calling thread's track (e.g. "loader 0"); returns its tid.
  int name_this_thread(std::string name) {
    const int tid = thread_tid();
    name_thread(tid, std::move(name));
    return tid;
  }
  /// The calling thread's track id (0 for the first thread seen, then 1, 2, ...).
  int this_thread_tid() { return thread_tid(); }

  /// steady_clock now, in microseconds: the time axis of every event.
  static double now_us() noexcept {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  trace_stats stats() const {
    std::lock_guard lock(mutex_);
    return {events_.size(), dropped_, overhead_us_ * 1e-6, state_.load() == st_finished};
  }
  const trace_options& options() const noexcept { return opt_; }
  /// Sets the track this recorder writes to (trace_options::pid and process_name; an empty name
  /// becomes "rank <pid>"), e.g. once the rank is known. Call before recording starts.
  void set_process(int pid, std::string process_name) {
    std::lock_guard lock(mutex_);
    opt_.pid = pid;
    opt_.process_name = process_name.empty() ? "rank " + std::to_string(pid) : std::move(process_name);
  }

  /// Writes everything recorded so far as a trace-event JSON object to `file` (temporary file,
  /// then rename: an existing trace is never left half-written). Throws loom::input_error.
  void write(const std::filesystem::path& file) const { write_json(file, to_json()); }

  /// Everything recorded so far as a trace-event JSON object (what write() writes), e.g. to send
  /// it to the rank that merges the ranks' traces.
  nlohmann::json to_json() const {
    nlohmann::json events = nlohmann::json::array();
    {
      std::lock_guard lock(mutex_);
      events.push_back(meta("process_name", -1, opt_.process_name));
      events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", opt_.pid}, {"tid", 0},
                        {"args", {{"sort_index", opt_.pid}}}});
      for (const auto& [tid, name] : thread_names_) events.push_back(meta("thread_name", tid, name));
      std::vector<const event*> sorted;
      sorted.reserve(events_.size());
      for (const auto& e : events_) sorted.push_back(&e);
      std::stable_sort(sorted.begin(), sorted.end(), [](const event* a, const event* b) {
        return a->tid != b->tid ? a->tid < b->tid : a->ts != b->ts ? a->ts < b->ts : a->dur > b->dur;
      });
      for (const event* e : sorted) {
        nlohmann::json j = {{"name", names_[e->name]}, {"cat", names_[e->cat]}, {"ph", std::string(1, e->ph)},
                            {"ts", e->ts}, {"pid", opt_.pid}, {"tid", e->tid}};
        if (e->ph == 'X') j["dur"] = e->dur;
        if (e->ph == 'i') j["s"] = "t";
        if (e->nargs || e->label_key != no_label) {
          nlohmann::json a = nlohmann::json::object();
          for (std::size_t i = 0; i < e->nargs; ++i) a[names_[e->arg_keys[i]]] = e->arg_values[i];
          if (e->label_key != no_label) a[names_[e->label_key]] = names_[e->label_value];
          j["args"] = std::move(a);
        }
        events.push_back(std::move(j));
      }
    }
    const auto s = stats();
    nlohmann::json doc = {{"traceEvents", std::move(events)},
                          {"displayTimeUnit", "ms"},
                          {"otherData",
                           {{"producer", "loom"},
                            {"window", std::to_string(opt_.window.first) + ":" + std::to_string(opt_.window.last)},
                            {"events", s.events},
                            {"dropped_events", s.dropped},
                            {"recorder_seconds", s.recorder_seconds}}}};
    return doc;
  }

  /// Writes `doc` to `file` through a temporary file and a rename. Throws loom::input_error.
  static void write_json(const std::filesystem::path& file, const nlohmann::json& doc) {
    std::error_code ec;
    if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), ec);
    const std::filesystem::path tmp = file.string() + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out) throw input_error("trace: cannot write '" + tmp.string() + "'; choose a writable --log-dir");
      out << doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
      out.flush();
      if (!out) throw input_error("trace: writing '" + tmp.string() + "' failed; check free disk space");
    }
    std::filesystem::rename(tmp, file, ec);
    if (ec) throw input_error("trace: cannot rename '" + tmp.string() + "' to '" + file.string() + "': " + ec.message());
  }

 private:
  friend class trace_zone;
  enum : int { st_idle = 0, st_recording = 1, st_finished = 2 };
  static constexpr std::uint32_t no_label = ~std::uint32_t(0);
  struct event {  // 88 bytes; strings are interned in names_
    double ts = 0, dur = 0;
    std::uint32_t name = 0, cat = 0;
    int tid = 0;
    char ph = 'X';
    std::uint8_t nargs = 0;
    std::array<std::uint32_t, 4> arg_keys{};
    std::array<double, 4> arg_values{};
    std::uint32_t label_key = no_label, label_value = 0;
  };

  nlohmann::json meta(const char* what, int tid, const std::string& name) const {
    nlohmann::json j = {{"ph", "M"}, {"name", what}, {"pid", opt_.pid}, {"args", {{"name", name}}}};
    j["tid"] = tid < 0 ? 0 : tid;
    return j;
  }

  std::uint32_t intern(std::string_view s) {  // caller holds mutex_
    const auto it = ids_.find(s);
    if (it != ids_.end()) return it->second;
    const auto id = static_cast<std::uint32_t>(names_.size());
    names_.emplace_back(s);
    ids_.emplace(names_.back(), id);  // deque: the string_view key stays valid
    return id;
  }

  int thread_tid() {
    std::lock_guard lock(mutex_);
    return thread_tid_locked();
  }
  int thread_tid_locked() {
    const auto id = std::this_thread::get_id();
    const auto it = tids_.find(id);
    if (it != tids_.end()) return it->second;
    const int tid = static_cast<int>(tids_.size());
    tids_.emplace(id, tid);
    return tid;
  }

  void push_step_zone(double t_end) {
    const std::string name = "step " + std::to_string(step_);
    const trace_arg a{"step", double(step_)};
    push('X', name, "step", step_t0_, t_end - step_t0_, step_tid_, std::span<const trace_arg>(&a, 1));
  }

  void push(char ph, std::string_view name, std::string_view cat, double ts, double dur, int tid,
            std::span<const trace_arg> args, trace_label label = {}) {
    const double t_in = now_us();
    std::lock_guard lock(mutex_);
    if (state_.load(std::memory_order_relaxed) != st_recording) return;  // closed meanwhile: outside the window
    if (events_.size() >= opt_.max_events) {
      ++dropped_;
    } else {
      event& e = events_.emplace_back();
      e.name = intern(name);
      e.cat = intern(cat);
      e.ph = ph;
      e.ts = ts;
      e.dur = dur;
      e.tid = tid < 0 ? thread_tid_locked() : tid;
      for (const auto& a : args) {
        if (e.nargs == e.arg_keys.size()) break;
        e.arg_keys[e.nargs] = intern(a.key);
        e.arg_values[e.nargs++] = a.value;
      }
      if (!label.key.empty()) {
        e.label_key = intern(label.key);
        e.label_value = intern(label.value);
      }
    }
    overhead_us_ += now_us() - t_in;
  }

  void finish(const trace_zone& z) {  // push() accounts its own time as overhead
    push('X', z.name_, z.cat_, z.t0_, now_us() - z.t0_, z.tid_, std::span<const trace_arg>(z.args_.a, z.nargs_));
  }

  trace_options opt_;
  std::atomic<int> state_{st_idle};
  mutable std::mutex mutex_;
  std::vector<event> events_;                                  // reserved to max_events at the window's start
  std::deque<std::string> names_;                              // interned names, categories, arg keys
  std::unordered_map<std::string_view, std::uint32_t> ids_;
  std::map<std::thread::id, int> tids_;
  std::map<int, std::string> thread_names_;
  std::size_t dropped_ = 0;
  double overhead_us_ = 0;
  std::int64_t step_ = 0;
  double step_t0_ = 0;
  int step_tid_ = 0;
};

inline trace_zone::~trace_zone() {
  if (rec_) rec_->finish(*this);
}

/// Records kernels and communication as zones of a trace_recorder: a kernel_hook for
/// context<D>::hook (every kernel call a zone named after the kernel, category "kernel") and a
/// parallel::comm_observer for a communicator's set_observer() (every collective, send and recv
/// a zone named after the operation, category "comm", args bytes, group_size, peer (send/recv,
/// broadcast root) and group = the last component of the communicator's name: "tp", "dp", "pp"
/// for make_groups' groups, "world" for the world). Zones go on the calling thread's track of
/// the recorder, so they nest inside the step-phase zones recorded on that thread.
///
/// Outside the window a call costs a virtual call, one relaxed atomic load and a branch; with no
/// observer attached (context::hook and set_observer left null) nothing at all but the null test.
/// On Ascend the kernel zones are the host-side enqueues (the kernels run later on the stream).
class trace_observer final : public kernel_hook, public parallel::comm_observer {
 public:
  explicit trace_observer(trace_recorder& rec) noexcept : rec_(&rec) {}

  double begin(const char*) noexcept override { return rec_->recording() ? trace_recorder::now_us() : -1.0; }
  void end(const char* name, double t0) noexcept override {
    if (t0 < 0) return;
    try {
      rec_->complete(name, "kernel", t0, trace_recorder::now_us() - t0);
    } catch (...) {  // out of memory while recording: the zone is lost, training goes on
    }
  }

  double begin(const parallel::comm_event&) noexcept override {
    return rec_->recording() ? trace_recorder::now_us() : -1.0;
  }
  void end(const parallel::comm_event& e, double t0) noexcept override {
    if (t0 < 0) return;
    const trace_arg args[] = {{"bytes", double(e.bytes)}, {"group_size", double(e.group_size)}, {"peer", double(e.peer)}};
    const auto slash = e.group.rfind('/');
    const std::string_view group = slash == std::string_view::npos ? e.group : e.group.substr(slash + 1);
    try {
      rec_->complete(e.op, "comm", t0, trace_recorder::now_us() - t0, -1,
                     std::span<const trace_arg>(args, e.peer >= 0 ? 3 : 2), {"group", group});
    } catch (...) {
    }
  }

 private:
  trace_recorder* rec_;
};

/// Collects the traces of all ranks of `world` into one trace-event file `file` on rank 0: every
/// other rank sends its recorder's events (to_json(), as text) to rank 0 with send/recv, rank 0
/// appends them to its own and writes `file` (temporary file + rename). Each rank's events keep
/// its pid (trace_options::pid = its world rank), so Perfetto shows one process track per rank.
/// "otherData" gets "ranks" and "recorder_seconds_per_rank" (each rank's recorder overhead).
/// Collective over world (C: a loom communicator; tag 7411 must be free). Works across machines
/// (the text travels over the communicator); timestamps are CLOCK_MONOTONIC of each machine, so
/// ranks on different hosts are aligned only up to the hosts' boot-time offset. Throws
/// loom::input_error (rank 0) if the file cannot be written, and what the communicator throws.
template <class C>
void gather_trace(const trace_recorder& rec, C& world, const std::filesystem::path& file) {
  constexpr int tag = 7411;
  if (world.rank() != 0) {
    const std::string text = rec.to_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    const std::int64_t n = std::int64_t(text.size());
    world.send(std::span<const std::int64_t>(&n, 1), 0, tag);
    world.send(std::span<const char>(text.data(), text.size()), 0, tag);
    return;
  }
  nlohmann::json doc = rec.to_json();
  nlohmann::json per_rank = nlohmann::json::array({doc["otherData"]["recorder_seconds"]});
  for (int r = 1; r < world.size(); ++r) {
    std::int64_t n = 0;
    world.recv(std::span<std::int64_t>(&n, 1), r, tag);
    std::string text(std::size_t(n), '\0');
    world.recv(std::span<char>(text.data(), text.size()), r, tag);
    nlohmann::json part = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!part.is_object() || !part.contains("traceEvents")) {
      per_rank.push_back(nullptr);
      continue;
    }
    for (auto& e : part["traceEvents"]) doc["traceEvents"].push_back(std::move(e));
    per_rank.push_back(part["otherData"]["recorder_seconds"]);
  }
  doc["otherData"]["ranks"] = world.size();
  doc["otherData"]["recorder_seconds_per_rank"] = std::move(per_rank);
  trace_recorder::write_json(file, doc);
}

/// Merges trace files (e.g. one per rank, each with its own pid) into one file Perfetto opens
/// as a single timeline. Throws loom::input_error if an input is missing or not a trace.
inline void merge_trace_files(std::span<const std::filesystem::path> inputs, const std::filesystem::path& output) {
  nlohmann::json all = nlohmann::json::array();
  for (const auto& in : inputs) {
    std::ifstream f(in);
    if (!f) throw input_error("trace merge: cannot open '" + in.string() + "'; check the path");
    nlohmann::json doc = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (!doc.is_object() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array())
      throw input_error("trace merge: '" + in.string() + "' is not a trace-event JSON object; pass loom trace files");
    for (auto& e : doc["traceEvents"]) all.push_back(std::move(e));
  }
  nlohmann::json out = {{"traceEvents", std::move(all)}, {"displayTimeUnit", "ms"}};
  std::error_code ec;
  const std::filesystem::path tmp = output.string() + ".tmp";
  {
    std::ofstream o(tmp, std::ios::binary | std::ios::trunc);
    if (!o) throw input_error("trace merge: cannot write '" + tmp.string() + "'; choose a writable output path");
    o << out.dump() << '\n';
  }
  std::filesystem::rename(tmp, output, ec);
  if (ec) throw input_error("trace merge: cannot rename to '" + output.string() + "': " + ec.message());
}

}  // namespace loom::io
