#pragma once
/// \file Internal to comm::mpi (loom/parallel/comm_mpi.hpp): MPI error checks, datatypes and
/// counts, 16-bit conversion, the state a communicator shares with its progress thread, the
/// timeout watchdog, pending operations and their requests, and the collectives started over
/// them (blocking on the progress thread, or nonblocking MPI as the fallback).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the deprecated MPI C++ bindings: not used, slow to compile
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>

#include <loom/core/error.hpp>
#include <loom/parallel/comm.hpp>
#include <loom/parallel/detail/progress.hpp>
#include <loom/parallel/detail/reduce.hpp>

namespace loom::parallel::detail {

/// Throws loom::device_error(rc, api, MPI_Error_string(rc)) unless rc == MPI_SUCCESS.
inline void mpi_check(int rc, std::string_view api, loom::source_location where = loom::source_location::current()) {
  if (rc == MPI_SUCCESS) [[likely]]
    return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  throw device_error(rc, api, std::string_view(text, static_cast<std::size_t>(len)), where);
}

template <class T>
inline constexpr bool is_16bit_float_v = std::is_same_v<T, Eigen::bfloat16> || std::is_same_v<T, Eigen::half>;

/// The MPI datatype of one element for reductions (16-bit floats are reduced as MPI_FLOAT).
template <class T>
MPI_Datatype mpi_reduce_type() {
  if constexpr (std::is_same_v<T, float> || is_16bit_float_v<T>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, std::int32_t>) return MPI_INT32_T;
  else return MPI_INT64_T;
}

/// {datatype, elements per T} for moving T unchanged (no arithmetic).
template <class T>
std::pair<MPI_Datatype, std::size_t> mpi_transfer_type() {
  if constexpr (std::is_same_v<T, float>) return {MPI_FLOAT, 1};
  else if constexpr (std::is_same_v<T, double>) return {MPI_DOUBLE, 1};
  else if constexpr (sizeof(T) == 1) return {MPI_UINT8_T, 1};
  else if constexpr (sizeof(T) == 2 && alignof(T) >= 2) return {MPI_UINT16_T, 1};
  else if constexpr (sizeof(T) == 4 && alignof(T) >= 4) return {MPI_UINT32_T, 1};
  else if constexpr (sizeof(T) == 8 && alignof(T) >= 8) return {MPI_UINT64_T, 1};
  else return {MPI_BYTE, sizeof(T)};
}

inline MPI_Op mpi_op(reduce_op op) {
  switch (op) {
    case reduce_op::max: return MPI_MAX;
    case reduce_op::min: return MPI_MIN;
    default: return MPI_SUM;  // avg: sum, then one division
  }
}

inline int mpi_count(std::size_t n, const char* api) {
  if (n > static_cast<std::size_t>(INT_MAX))
    throw input_error(std::string("comm::mpi::") + api + ": " + std::to_string(n) +
                      " elements exceed MPI's int count limit; split the buffer into pieces of at most " +
                      std::to_string(INT_MAX) + " elements");
  return static_cast<int>(n);
}

/// dst[i] = float(src[i]); vectorized for bf16 (detail::widen on the raw words).
template <class T>
void to_float(float* __restrict dst, const T* __restrict src, std::size_t n) {
  const auto* __restrict s = lanes(src);
  for (std::size_t i = 0; i < n; ++i) dst[i] = widen<float>(s[i]);
}
/// dst[i] = T(src[i] / divisor), rounded to nearest even once.
template <class T>
void from_float(T* __restrict dst, const float* __restrict src, std::size_t n, float divisor) {
  auto* __restrict d = lanes(dst);
  if (divisor != 1.0f)
    for (std::size_t i = 0; i < n; ++i) d[i] = narrow<lane_t<T>>(src[i] / divisor);
  else
    for (std::size_t i = 0; i < n; ++i) d[i] = narrow<lane_t<T>>(src[i]);
}

/// What an mpi_communicator shares with its progress thread and its requests.
struct mpi_state {
  MPI_Comm comm = MPI_COMM_NULL;
  /// Private duplicate of `comm` for the point-to-point messages of loom's own collective
  /// algorithms (mpi_ring_all_reduce), so they never match the caller's send/recv on `comm` or
  /// on native(). MPI_COMM_NULL until ring_comm() creates it; freed with `comm`.
  MPI_Comm ring = MPI_COMM_NULL;
  int rank = 0, size = 1;
  int thread_level = MPI_THREAD_SINGLE;
  comm_options options;
  std::string name;
  comm_observer* observer = nullptr;  // set_observer(); inherited by split()
  std::atomic<bool> broken{false};  // a request wait timed out: an operation is stuck in MPI

  /// n floats of scratch for operations that complete before they return or that run on the
  /// progress thread (never concurrently: blocking calls drain the progress queue first).
  float* scratch(std::size_t n) {
    if (n > scratch_size_) {
      scratch_.reset(new float[n]);
      scratch_size_ = n;
    }
    return scratch_.get();
  }

  /// `ring`, created on first use by MPI_Comm_dup(comm) (with comm's MPI_ERRORS_RETURN). The dup
  /// is collective over `comm`: call this only inside an operation that every rank of `comm`
  /// runs at the same point of its sequence (a blocking collective, or one on the progress
  /// thread). Throws device_error.
  MPI_Comm ring_comm() {
    if (ring == MPI_COMM_NULL) mpi_check(MPI_Comm_dup(comm, &ring), "MPI_Comm_dup");
    return ring;
  }

 private:
  std::unique_ptr<float[]> scratch_;
  std::size_t scratch_size_ = 0;
};

/// Description of an operation, for error messages (static strings, no allocation).
struct mpi_op_info {
  const char* api = "";
  const char* dtype = "";
  std::size_t count = 0;
  int op = -1;  // reduce_op, or -1
  std::string describe() const {
    if (!*dtype) return std::string(api) + "()";
    std::string s = std::string(api) + "(" + dtype + " x " + std::to_string(count);
    if (op >= 0) s += ", " + std::string(to_string(static_cast<reduce_op>(op)));
    return s + ")";
  }
};

/// Ends the job when a blocking operation exceeds the timeout (see the file comment). Armed and
/// disarmed around every blocking call with a few relaxed atomic stores; the thread wakes every
/// timeout/8 (between 1 ms and 1 s) to look.
class mpi_watchdog {
 public:
  explicit mpi_watchdog(std::shared_ptr<const mpi_state> s) : s_(std::move(s)) {
    const auto t = s_->options.timeout;
    poll_ = std::clamp<std::chrono::milliseconds>(t / 8, std::chrono::milliseconds(1), std::chrono::milliseconds(1000));
    thread_ = std::thread([this] { loop(); });
  }
  mpi_watchdog(const mpi_watchdog&) = delete;
  mpi_watchdog& operator=(const mpi_watchdog&) = delete;
  ~mpi_watchdog() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void arm(const mpi_op_info& info) noexcept {
    api_.store(info.api, std::memory_order_relaxed);
    dtype_.store(info.dtype, std::memory_order_relaxed);
    count_.store(info.count, std::memory_order_relaxed);
    op_.store(info.op, std::memory_order_relaxed);
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    start_.store(now == 0 ? 1 : now, std::memory_order_release);
  }
  void disarm() noexcept { start_.store(0, std::memory_order_release); }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    while (!stop_) {
      cv_.wait_for(lock, poll_);
      if (stop_) return;
      const auto start = start_.load(std::memory_order_acquire);
      if (start == 0) continue;
      const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
      if (std::chrono::steady_clock::duration(now - start) > s_->options.timeout) fire();
    }
  }

  [[noreturn]] void fire() noexcept {
    const mpi_op_info info{api_.load(), dtype_.load(), count_.load(), op_.load()};
    std::string msg;
    try {
      msg = "loom: comm::mpi " + info.describe() + " on communicator '" + s_->name + "' (size " +
            std::to_string(s_->size) + ") rank " + std::to_string(s_->rank) + " did not complete within " +
            std::to_string(s_->options.timeout.count()) +
            " ms (comm_options::timeout); MPI can neither cancel a collective nor tell which ranks arrived, "
            "so the job ends now (exit code 124). Look for the rank that did not call this operation.\n";
    } catch (...) {
      msg = "loom: comm::mpi operation timed out; ending the job\n";
    }
    std::fputs(msg.c_str(), stderr);
    std::fflush(stderr);
    if (s_->thread_level >= MPI_THREAD_MULTIPLE) MPI_Abort(MPI_COMM_WORLD, 124);
    std::_Exit(124);
  }

  std::shared_ptr<const mpi_state> s_;
  std::chrono::milliseconds poll_{1000};
  std::atomic<std::int64_t> start_{0};  // steady_clock ticks when armed, 0 when idle
  std::atomic<const char*> api_{""}, dtype_{""};
  std::atomic<std::size_t> count_{0};
  std::atomic<int> op_{-1};
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: started after the other members exist
};

/// Arms a watchdog (if any) for the lifetime of a blocking call.
struct mpi_armed {
  mpi_watchdog* w;
  mpi_armed(mpi_watchdog* watchdog, const mpi_op_info& info) noexcept : w(watchdog) {
    if (w) w->arm(info);
  }
  mpi_armed(const mpi_armed&) = delete;
  mpi_armed& operator=(const mpi_armed&) = delete;
  ~mpi_armed() {
    if (w) w->disarm();
  }
};

/// An MPI operation started by the functions below. Blocking: already done, `finish` (divide for
/// avg, round back to 16 bits, copy out of a temporary) still to run. Nonblocking (fallback
/// without MPI_THREAD_MULTIPLE): `req` in flight, temporaries in `owned`.
struct mpi_pending {
  MPI_Request req = MPI_REQUEST_NULL;
  std::unique_ptr<float[]> owned;
  std::function<void()> finish;
  mpi_op_info info;

  mpi_pending() = default;
  mpi_pending(mpi_pending&& o) noexcept
      : req(std::exchange(o.req, MPI_REQUEST_NULL)), owned(std::move(o.owned)), finish(std::move(o.finish)),
        info(o.info) {}
  mpi_pending& operator=(mpi_pending&&) = delete;
  ~mpi_pending() {
    // Only after a wait that timed out can the request still be active; MPI may still write
    // into the temporaries, so they are leaked on purpose rather than freed under its feet.
    if (req != MPI_REQUEST_NULL) (void)owned.release();
  }
};

/// Completes p: waits for its request (nonblocking fallback; polls against the timeout when one
/// is set, throwing comm_timeout), then runs its finishing step.
inline void mpi_complete(mpi_pending& p, mpi_state& s) {
  if (p.req != MPI_REQUEST_NULL) {
    if (s.options.timeout.count() <= 0) {
      mpi_check(MPI_Wait(&p.req, MPI_STATUS_IGNORE), "MPI_Wait");
    } else {
      const auto deadline = std::chrono::steady_clock::now() + s.options.timeout;
      int flag = 0;
      for (unsigned i = 0;; ++i) {
        mpi_check(MPI_Test(&p.req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
        if (flag) break;
        if ((i & 63u) == 0 && std::chrono::steady_clock::now() > deadline) {
          s.broken.store(true);
          throw comm_timeout("comm::mpi " + p.info.describe() + " on communicator '" + s.name + "' (size " +
                             std::to_string(s.size) + ") timed out after " + std::to_string(s.options.timeout.count()) +
                             " ms on rank " + std::to_string(s.rank) +
                             "; MPI cannot tell which ranks arrived, nor cancel the operation: end the job (MPI_Abort)");
        }
      }
    }
  }
  if (p.finish) {
    auto finish = std::move(p.finish);
    p.finish = nullptr;
    finish();
  }
}

/// Request of a nonblocking MPI collective (fallback path).
class mpi_request_state final : public request_state {
 public:
  mpi_request_state(mpi_pending p, std::shared_ptr<mpi_state> s) : p_(std::move(p)), s_(std::move(s)) {}
  void wait() override { mpi_complete(p_, *s_); }
  bool test() override {
    if (p_.req == MPI_REQUEST_NULL) return true;
    int flag = 0;
    mpi_check(MPI_Test(&p_.req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    return flag != 0;
  }

 private:
  mpi_pending p_;
  std::shared_ptr<mpi_state> s_;
};

/// Request of an operation queued on the progress thread; wait() honours the timeout.
class mpi_thread_request final : public request_state {
 public:
  mpi_thread_request(std::shared_ptr<thread_task> t, std::shared_ptr<mpi_state> s, mpi_op_info info)
      : task_(std::move(t)), s_(std::move(s)), info_(info) {}
  void wait() override {
    const auto timeout = s_->options.timeout;
    if (timeout.count() <= 0) return task_->wait();
    if (task_->wait_until(std::chrono::steady_clock::now() + timeout)) return;
    s_->broken.store(true);
    throw comm_timeout("comm::mpi " + info_.describe() + " (asynchronous) on communicator '" + s_->name +
                       "' (size " + std::to_string(s_->size) + ") rank " + std::to_string(s_->rank) +
                       " did not complete within " + std::to_string(timeout.count()) +
                       " ms; MPI cannot tell which ranks arrived, nor cancel the operation: end the job (MPI_Abort)");
  }
  bool test() override { return task_->test(); }

 private:
  std::shared_ptr<thread_task> task_;
  std::shared_ptr<mpi_state> s_;
  mpi_op_info info_;
};

// The 16-bit ring all-reduce (sum/avg of bf16 or fp16 on the blocking path).

/// Elements per piece of mpi_ring_all_reduce: 128 Ki, i.e. 256 KiB of received 16-bit words or
/// 512 KiB of fp32 partial sums, so a piece is still in L2 when it is added.
inline constexpr std::size_t ring_piece = std::size_t{1} << 17;

/// partial[i] = float(recv[i]) + float(own[i]), i < n, in fp32 (no rounding to 16 bits). recv
/// holds 16-bit lanes (the first hop) or fp32 partial sums (later hops); own is this rank's data.
template <class R, class L>
void ring_accumulate(float* __restrict partial, const R* __restrict recv, const L* __restrict own, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) partial[i] = widen<float>(recv[i]) + widen<float>(own[i]);
}

/// x[i] = L((float(recv[i]) + float(x[i])) / divisor), i < n, in place: the last hop adds this
/// rank's own element in fp32, divides (avg; exact IEEE division, skipped for 1) and rounds to
/// nearest even once.
template <class R, class L>
void ring_finish(L* x, const R* __restrict recv, std::size_t n, float divisor) {
  if (divisor != 1.0f)
    for (std::size_t i = 0; i < n; ++i) x[i] = narrow<L>((widen<float>(recv[i]) + widen<float>(x[i])) / divisor);
  else
    for (std::size_t i = 0; i < n; ++i) x[i] = narrow<L>(widen<float>(recv[i]) + widen<float>(x[i]));
}

/// Blocking all-reduce of bf16/fp16 `x` (sum or avg) over s.comm, in place, as a ring
/// reduce-scatter + ring all-gather of point-to-point messages (MPI_Sendrecv on s.ring_comm()).
///
/// Layout: x (n) is cut into size() segments (detail::partition, 64-byte boundaries; the last
/// ones may be short or empty); rank r owns segment r. Reduce-scatter, piece by piece (ring_piece
/// elements of every segment at a time) in size()-1 hops: at hop k rank r sends segment r-k-1
/// to rank r+1 and receives segment r-k-2 from rank r-1 (indices mod size()). Hop 0 sends the
/// rank's own 16-bit words (exact: its data); later hops send fp32 partial sums; each receiver
/// adds its own element in fp32 (ring_accumulate), and the owner adds the last one, divides for
/// avg and rounds once into x (ring_finish). All-gather: size()-1 hops moving the rounded 16-bit
/// segments straight into x.
/// Result: element i of segment j is T(((x_{j+1} + x_{j+2}) + ... + x_j) [/ size()]) with the sum
/// in fp32 in this rank order, rounded once; computed by one rank and copied to the others, so
/// bitwise the same on every rank and every run. On 2 ranks that is exactly "sum in fp32, round
/// once" (what MPI_Allreduce on an fp32 copy gives); on more ranks the fp32 sum order differs
/// from MPI's, within fp32 rounding of it.
/// Traffic: each rank sends (n/P)(2 + 4(P-2)) bytes in the reduce-scatter and 2n(P-1)/P bytes
/// in the all-gather (P = size()): on 2 ranks 2n bytes, half of what a ring on an fp32 copy
/// sends (4n); on 3 ranks 3.3n against 5.3n. Adding a piece is not overlapped with moving the
/// next: Open MPI's shared-memory transport copies inside the receiver's MPI call, on the core
/// that would add.
/// Memory: 2 * min(ring_piece, n/P) floats of s.scratch(); no allocation after the first call.
/// Preconditions: every rank calls this with the same n and op, where the blocking collectives
/// of this communicator run (the caller's thread after drain(), or the progress thread), so one
/// operation at a time uses s.ring and the scratch. n <= INT_MAX (mpi_count). Throws
/// device_error on a failed MPI call (x is then unspecified).
template <class T>
  requires is_16bit_float_v<T>
void mpi_ring_all_reduce(mpi_state& s, std::span<T> x, reduce_op op) {
  using L = lane_t<T>;
  const int size = s.size, me = s.rank;
  const std::size_t n = x.size();
  if (n == 0 || size == 1) return;  // one rank: the sum (and the average) of one value is itself
  const MPI_Comm c = s.ring_comm();
  const int next = (me + 1) % size, prev = (me + size - 1) % size;
  constexpr int tag = 0;  // s.ring carries nothing else, and one operation at a time
  auto segment = [&](int j) { return partition<T>(n, size, ((j % size) + size) % size); };
  const std::size_t longest = segment(0).second;  // segment 0 is a longest one
  const std::size_t piece = std::min(ring_piece, longest);
  float* recv = s.scratch(2 * piece);  // piece received: 16-bit lanes (hop 0) or fp32
  float* partial = recv + piece;       // fp32 partial sum to send at the next hop
  const float divisor = op == reduce_op::avg ? static_cast<float>(size) : 1.0f;
  L* xl = lanes(x.data());
  auto part = [&](std::pair<std::size_t, std::size_t> seg, std::size_t off) {  // {first, count} of a piece
    const std::size_t len = seg.second - seg.first;
    return std::pair{seg.first + std::min(off, len), off < len ? std::min(piece, len - off) : std::size_t{0}};
  };
  for (std::size_t off = 0; off < longest; off += piece) {
    for (int k = 0; k + 1 < size; ++k) {
      const auto [send_at, send_n] = part(segment(me - k - 1), off);
      const auto [recv_at, recv_n] = part(segment(me - k - 2), off);
      const bool first = k == 0, last = k + 2 == size;
      if (first)
        mpi_check(MPI_Sendrecv(xl + send_at, static_cast<int>(send_n), MPI_UINT16_T, next, tag, recv,
                               static_cast<int>(recv_n), MPI_UINT16_T, prev, tag, c, MPI_STATUS_IGNORE),
                  "MPI_Sendrecv");
      else
        mpi_check(MPI_Sendrecv(partial, static_cast<int>(send_n), MPI_FLOAT, next, tag, recv, static_cast<int>(recv_n),
                               MPI_FLOAT, prev, tag, c, MPI_STATUS_IGNORE),
                  "MPI_Sendrecv");
      const auto* recv16 = reinterpret_cast<const L*>(recv);
      if (last && first) ring_finish(xl + recv_at, recv16, recv_n, divisor);
      else if (last) ring_finish(xl + recv_at, static_cast<const float*>(recv), recv_n, divisor);
      else if (first) ring_accumulate(partial, recv16, xl + recv_at, recv_n);
      else ring_accumulate(partial, static_cast<const float*>(recv), xl + recv_at, recv_n);
    }
  }
  for (int k = 0; k + 1 < size; ++k) {  // all-gather: hop k sends segment me-k, receives me-k-1
    const auto [send_lo, send_hi] = segment(me - k);
    const auto [recv_lo, recv_hi] = segment(me - k - 1);
    mpi_check(MPI_Sendrecv(xl + send_lo, static_cast<int>(send_hi - send_lo), MPI_UINT16_T, next, tag, xl + recv_lo,
                           static_cast<int>(recv_hi - recv_lo), MPI_UINT16_T, prev, tag, c, MPI_STATUS_IGNORE),
              "MPI_Sendrecv");
  }
}

// The collectives over an mpi_state. block = true: blocking MPI call, temporaries from the shared
// scratch (caller's thread or progress thread); block = false: nonblocking call, temporaries
// owned by the returned mpi_pending.

/// x (n elements, in place) = op over the ranks of s.comm; avg = sum, then one division by
/// size(). What runs:
///   bf16/fp16, sum/avg, block:  mpi_ring_all_reduce (16-bit hops where exact, fp32 partial sums,
///                               one rounding; nothing left for `finish`)
///   bf16/fp16, otherwise:       widened into an fp32 temporary (s.scratch() when blocking, owned
///                               by the result otherwise), MPI_Allreduce / MPI_Iallreduce on
///                               MPI_FLOAT, `finish` divides for avg and rounds back once. The
///                               nonblocking fallback (no MPI_THREAD_MULTIPLE) keeps this path:
///                               the ring needs a sequence of MPI calls, which MPI_Wait/Test
///                               alone would not drive.
///   other types:                MPI_Allreduce / MPI_Iallreduce on x; `finish` divides for avg.
/// Returns the pending operation (block: done but for `finish`). Throws input_error for more than
/// INT_MAX elements, device_error on a failed MPI call.
template <reducible T>
mpi_pending mpi_all_reduce(mpi_state& s, std::span<T> x, reduce_op op, bool block) {
  mpi_pending p;
  p.info = {"all_reduce", dtype_name<T>(), x.size(), static_cast<int>(op)};
  const int n = mpi_count(x.size(), "all_reduce");
  const MPI_Datatype type = mpi_reduce_type<T>();
  void* buf = x.data();
  if constexpr (is_16bit_float_v<T>) {
    if (block && (op == reduce_op::sum || op == reduce_op::avg)) {
      mpi_ring_all_reduce(s, x, op);
      return p;
    }
    float* t = block ? s.scratch(x.size()) : (p.owned.reset(new float[std::max<std::size_t>(x.size(), 1)]), p.owned.get());
    to_float(t, x.data(), x.size());
    buf = t;
    const float divisor = op == reduce_op::avg ? static_cast<float>(s.size) : 1.0f;
    p.finish = [x, t, divisor] { from_float(x.data(), t, x.size(), divisor); };
  } else if constexpr (std::is_floating_point_v<T>) {
    if (op == reduce_op::avg)
      p.finish = [x, d = static_cast<T>(s.size)] {
        for (auto& v : x) v /= d;
      };
  }
  if (block)
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf, n, type, mpi_op(op), s.comm), "MPI_Allreduce");
  else
    mpi_check(MPI_Iallreduce(MPI_IN_PLACE, buf, n, type, mpi_op(op), s.comm, &p.req), "MPI_Iallreduce");
  return p;
}

template <reducible T>
mpi_pending mpi_reduce_scatter(mpi_state& s, const T* in, std::size_t in_size, std::span<T> out, reduce_op op,
                               bool block) {
  mpi_pending p;
  p.info = {"reduce_scatter", dtype_name<T>(), out.size(), static_cast<int>(op)};
  const std::size_t m = out.size();
  const int n = mpi_count(m, "reduce_scatter");
  mpi_count(in_size, "reduce_scatter");
  const MPI_Datatype type = mpi_reduce_type<T>();
  const void* send = in;
  void* recv = out.data();
  auto temporary = [&](std::size_t count) {
    if (block) return s.scratch(count);
    p.owned.reset(new float[std::max<std::size_t>(count, 1)]);
    return p.owned.get();
  };
  if constexpr (is_16bit_float_v<T>) {
    float* t = temporary(in_size + m);
    to_float(t, in, in_size);
    send = t;
    recv = t + in_size;
    const float divisor = op == reduce_op::avg ? static_cast<float>(s.size) : 1.0f;
    p.finish = [out, t = t + in_size, divisor] { from_float(out.data(), t, out.size(), divisor); };
  } else {
    const bool overlap = m && out.data() < in + in_size && in < out.data() + m;
    const void* t = nullptr;
    if (overlap) {  // MPI forbids aliased buffers: reduce into a temporary, then copy
      float* scratch = temporary((m * sizeof(T) + sizeof(float) - 1) / sizeof(float));
      recv = scratch;
      t = scratch;
    }
    p.finish = [out, t, op, d = s.size] {
      if (t) std::memcpy(out.data(), t, out.size_bytes());
      if constexpr (std::is_floating_point_v<T>)
        if (op == reduce_op::avg)
          for (auto& v : out) v /= static_cast<T>(d);
    };
  }
  if (block)
    mpi_check(MPI_Reduce_scatter_block(send, recv, n, type, mpi_op(op), s.comm), "MPI_Reduce_scatter_block");
  else
    mpi_check(MPI_Ireduce_scatter_block(send, recv, n, type, mpi_op(op), s.comm, &p.req), "MPI_Ireduce_scatter_block");
  return p;
}

template <transferable T>
mpi_pending mpi_all_gather(mpi_state& s, const T* in, std::size_t in_size, std::span<T> out, bool block) {
  mpi_pending p;
  p.info = {"all_gather", dtype_name<T>(), in_size, -1};
  const auto [type, k] = mpi_transfer_type<T>();
  const int n = mpi_count(in_size * k, "all_gather");
  mpi_count(out.size() * k, "all_gather");
  const void* send = in == out.data() + static_cast<std::size_t>(s.rank) * in_size ? MPI_IN_PLACE : in;
  if (in_size == 0) send = MPI_IN_PLACE;  // nothing to send; avoids a null buffer
  if (block)
    mpi_check(MPI_Allgather(send, n, type, out.data(), n, type, s.comm), "MPI_Allgather");
  else
    mpi_check(MPI_Iallgather(send, n, type, out.data(), n, type, s.comm, &p.req), "MPI_Iallgather");
  return p;
}

}  // namespace loom::parallel::detail
