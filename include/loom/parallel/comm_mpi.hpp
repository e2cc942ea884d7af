#pragma once
/// \file comm::mpi — a communicator over MPI (Open MPI): one process per rank, any number of
/// machines, launched with mpirun. Needs <mpi.h> and libmpi (CMake target loom::mpi, or mpicxx).
///
///   int main(int argc, char** argv) {
///     loom::comm::mpi_environment env(&argc, &argv);   // MPI_Init_thread ... MPI_Finalize
///     loom::comm::mpi world = env.world();              // owns a duplicate of MPI_COMM_WORLD
///     world.all_reduce(std::span{grads}, loom::parallel::reduce_op::avg);
///   }                                                   // communicators die before env
///
/// Design decisions (measurements in the report of issue 5):
///  * Blocking operations call the blocking MPI functions (MPI_Allreduce, MPI_Reduce_scatter_block,
///    MPI_Allgather, MPI_Bcast, MPI_Send/Recv, MPI_Barrier), whose tuned algorithms are the fastest
///    Open MPI has: a loom all_reduce costs what a plain MPI_Allreduce costs.
///  * Asynchronous operations run those same blocking calls on a progress thread owned by the
///    communicator (FIFO, like comm::threads), so they progress while the caller computes and
///    keep the fast algorithms. This needs MPI_THREAD_MULTIPLE, which mpi_environment requests.
///    Open MPI's nonblocking collectives (libnbc) were the alternative; on this machine
///    MPI_Ireduce_scatter_block is ~10x slower than MPI_Reduce_scatter_block and MPI_Iallreduce's
///    default algorithm ~1.5x slower than MPI_Allreduce, and they progress only inside MPI calls.
///    If MPI provides less than MPI_THREAD_MULTIPLE, async operations fall back to those
///    nonblocking collectives (completed by MPI_Wait/MPI_Test; call request::test() now and then
///    to make progress); MPI_THREAD_SERIALIZED is then the minimum, and all MPI calls of the
///    process must come from one thread at a time.
///  * Timeout (comm_options::timeout > 0, default 10 min). MPI can neither cancel a collective nor
///    tell which ranks arrived. A blocking operation that exceeds it makes a watchdog thread print
///    "loom: comm::mpi <op> on communicator '<name>' (size n) rank r did not complete within ..."
///    to stderr and end the job: MPI_Abort(MPI_COMM_WORLD, 124) with MPI_THREAD_MULTIPLE, else
///    _Exit(124) (mpirun then stops the others). request::wait() past the timeout throws
///    comm_timeout instead (the communicator is then broken: its destructor leaks the stuck thread
///    and the MPI_Comm rather than hang). recv is a blocking operation like the others.
///  * bf16 / fp16: MPI has neither type. Reductions convert to an fp32 temporary, reduce with
///    MPI_FLOAT (so accumulation is fp32, as in comm::threads) and round back once; a custom
///    MPI_Op on 16-bit data would round after every pairwise step. Data movement sends the 16-bit
///    words as MPI_UINT16_T, unconverted. Cost: an fp32 buffer of the same element count (kept
///    and reused by the communicator).
///  * avg = MPI_SUM, then one division by size() on the final sum.
///  * Every MPI return code is checked: failures throw loom::device_error(code, "MPI_Xxx", text
///    from MPI_Error_string). Communicators use MPI_ERRORS_RETURN so that this is possible.
///  * Determinism: the reduction order is Open MPI's (its algorithms give every rank the same
///    result in practice, and the tests check bitwise agreement across ranks; the standard only
///    recommends it). Counts are limited to INT_MAX elements per call (input_error beyond).
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

// The collectives over an mpi_state. block = true: blocking MPI call, temporaries from the shared
// scratch (caller's thread or progress thread); block = false: nonblocking call, temporaries
// owned by the returned mpi_pending.

template <reducible T>
mpi_pending mpi_all_reduce(mpi_state& s, std::span<T> x, reduce_op op, bool block) {
  mpi_pending p;
  p.info = {"all_reduce", dtype_name<T>(), x.size(), static_cast<int>(op)};
  const int n = mpi_count(x.size(), "all_reduce");
  const MPI_Datatype type = mpi_reduce_type<T>();
  void* buf = x.data();
  if constexpr (is_16bit_float_v<T>) {
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

namespace loom::parallel::comm {

class mpi_communicator;

/// RAII for MPI_Init_thread / MPI_Finalize. Create exactly one, first thing in main, and destroy
/// every mpi_communicator before it. If MPI is already initialised (by the caller), it neither
/// initialises nor finalises, and only checks the thread level.
/// Errors: device_error if MPI_Init_thread fails or the level provided is below `required`.
class mpi_environment {
 public:
  /// requested: MPI_THREAD_MULTIPLE (asynchronous operations on a progress thread); required:
  /// MPI_THREAD_SERIALIZED (the fallback, see the file comment). argc/argv may be null.
  explicit mpi_environment(int* argc = nullptr, char*** argv = nullptr, int required = MPI_THREAD_SERIALIZED,
                           int requested = MPI_THREAD_MULTIPLE) {
    int initialized = 0;
    detail::mpi_check(MPI_Initialized(&initialized), "MPI_Initialized");
    if (initialized) {
      detail::mpi_check(MPI_Query_thread(&provided_), "MPI_Query_thread");
    } else {
      detail::mpi_check(MPI_Init_thread(argc, argv, std::max(required, requested), &provided_), "MPI_Init_thread");
      owns_ = true;
    }
    if (provided_ < required) {
      const std::string msg =
          (owns_ ? "this MPI library provides thread level " : "MPI was initialised by the caller with thread level ") +
          std::to_string(provided_) + ", less than the required " + std::to_string(required) +
          (owns_ ? "; use an MPI built with thread support"
                 : "; initialise with MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) or let "
                   "mpi_environment initialise MPI");
      if (owns_) MPI_Finalize();
      owns_ = false;
      throw device_error(MPI_ERR_OTHER, initialized ? "MPI_Query_thread" : "MPI_Init_thread", msg);
    }
  }
  mpi_environment(const mpi_environment&) = delete;
  mpi_environment& operator=(const mpi_environment&) = delete;
  ~mpi_environment() {
    int finalized = 0;
    if (owns_ && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Finalize();
  }

  /// The thread level MPI provides (MPI_THREAD_SINGLE ... MPI_THREAD_MULTIPLE).
  int thread_level() const noexcept { return provided_; }

  /// A communicator over all processes (a duplicate of MPI_COMM_WORLD), named "world".
  inline mpi_communicator world(comm_options options = {}) const;

 private:
  int provided_ = 0;
  bool owns_ = false;
};

/// One rank of an MPI communicator; owns its MPI_Comm (a duplicate of the parent or the result of
/// split) and frees it on destruction. Move-only; used by one thread at a time. Models
/// loom::parallel::communicator.
class mpi_communicator {
 public:
  /// Duplicates `parent` (MPI_Comm_dup), so loom's traffic never matches the caller's, and sets
  /// MPI_ERRORS_RETURN on the duplicate. Collective over parent. Throws device_error.
  explicit mpi_communicator(MPI_Comm parent, comm_options options = {}, std::string name = "world") {
    MPI_Comm c = MPI_COMM_NULL;
    detail::mpi_check(MPI_Comm_dup(parent, &c), "MPI_Comm_dup");
    init(c, options, std::move(name));
  }
  mpi_communicator(mpi_communicator&&) noexcept = default;
  mpi_communicator& operator=(mpi_communicator&& other) noexcept {
    if (this != &other) {
      release();
      s_ = std::move(other.s_);
      progress_ = std::move(other.progress_);
      watchdog_ = std::move(other.watchdog_);
    }
    return *this;
  }
  ~mpi_communicator() { release(); }

  int rank() const noexcept { return s_->rank; }
  int size() const noexcept { return s_->size; }
  const std::string& name() const noexcept { return s_->name; }
  const comm_options& options() const noexcept { return s_->options; }
  /// True when asynchronous operations run on a progress thread (MPI_THREAD_MULTIPLE); false when
  /// they use MPI nonblocking collectives.
  bool async_on_thread() const noexcept { return s_->thread_level >= MPI_THREAD_MULTIPLE; }
  /// The owned MPI communicator, for calls loom does not wrap. Do not free it.
  MPI_Comm native() const noexcept { return s_->comm; }
  /// Attaches an observer of this rank's operations on this communicator (null = none, the
  /// default); split() children inherit it. See comm_observer in comm.hpp.
  void set_observer(comm_observer* o) noexcept { s_->observer = o; }
  comm_observer* observer() const noexcept { return s_->observer; }

  /// x = op over ranks of x, in place (MPI_Allreduce with MPI_IN_PLACE). See comm.hpp.
  template <reducible T>
  void all_reduce(std::span<T> x, reduce_op op = reduce_op::sum) {
    detail::check_op<T>(op, "comm::mpi::all_reduce");
    const comm_scope obs(s_->observer, event("all_reduce", x.size_bytes()));
    blocking({"all_reduce", detail::dtype_name<T>(), x.size(), static_cast<int>(op)},
             [&] { return detail::mpi_all_reduce(*s_, x, op, true); });
  }
  template <reducible T>
  request all_reduce_async(std::span<T> x, reduce_op op = reduce_op::sum) {
    detail::check_op<T>(op, "comm::mpi::all_reduce_async");
    const comm_scope obs(s_->observer, event("all_reduce_async", x.size_bytes()));
    request r = async({"all_reduce", detail::dtype_name<T>(), x.size(), static_cast<int>(op)},
                      [x, op](detail::mpi_state& s, bool block) { return detail::mpi_all_reduce(s, x, op, block); });
    return observed(event("all_reduce_wait", x.size_bytes()), std::move(r));
  }

  /// Rank r: out = op over ranks of in[r*m, (r+1)*m), m = out.size() (MPI_Reduce_scatter_block).
  /// out may lie inside in (reduced through a temporary then).
  template <class In, reducible T>
    requires std::same_as<std::remove_const_t<In>, T>
  void reduce_scatter(std::span<In> in, std::span<T> out, reduce_op op = reduce_op::sum) {
    check_chunks(in.size(), out.size(), "reduce_scatter");
    detail::check_op<T>(op, "comm::mpi::reduce_scatter");
    const comm_scope obs(s_->observer, event("reduce_scatter", in.size_bytes()));
    const T* p = in.data();
    const std::size_t n = in.size();
    blocking({"reduce_scatter", detail::dtype_name<T>(), out.size(), static_cast<int>(op)},
             [&] { return detail::mpi_reduce_scatter<T>(*s_, p, n, out, op, true); });
  }
  template <class In, reducible T>
    requires std::same_as<std::remove_const_t<In>, T>
  request reduce_scatter_async(std::span<In> in, std::span<T> out, reduce_op op = reduce_op::sum) {
    check_chunks(in.size(), out.size(), "reduce_scatter_async");
    detail::check_op<T>(op, "comm::mpi::reduce_scatter_async");
    const comm_scope obs(s_->observer, event("reduce_scatter_async", in.size_bytes()));
    const T* p = in.data();
    const std::size_t n = in.size();
    request r = async({"reduce_scatter", detail::dtype_name<T>(), out.size(), static_cast<int>(op)},
                      [p, n, out, op](detail::mpi_state& s, bool block) {
                        return detail::mpi_reduce_scatter<T>(s, p, n, out, op, block);
                      });
    return observed(event("reduce_scatter_wait", in.size_bytes()), std::move(r));
  }

  /// out[j*m, (j+1)*m) = in of rank j (MPI_Allgather). in may be exactly out[rank*m, (rank+1)*m)
  /// (then MPI_IN_PLACE); any other overlap is undefined.
  template <class In, transferable T>
    requires std::same_as<std::remove_const_t<In>, T>
  void all_gather(std::span<In> in, std::span<T> out) {
    check_chunks(out.size(), in.size(), "all_gather");
    const comm_scope obs(s_->observer, event("all_gather", out.size_bytes()));
    const T* p = in.data();
    const std::size_t n = in.size();
    blocking({"all_gather", detail::dtype_name<T>(), n, -1},
             [&] { return detail::mpi_all_gather<T>(*s_, p, n, out, true); });
  }
  template <class In, transferable T>
    requires std::same_as<std::remove_const_t<In>, T>
  request all_gather_async(std::span<In> in, std::span<T> out) {
    check_chunks(out.size(), in.size(), "all_gather_async");
    const comm_scope obs(s_->observer, event("all_gather_async", out.size_bytes()));
    const T* p = in.data();
    const std::size_t n = in.size();
    request r = async({"all_gather", detail::dtype_name<T>(), n, -1}, [p, n, out](detail::mpi_state& s, bool block) {
      return detail::mpi_all_gather<T>(s, p, n, out, block);
    });
    return observed(event("all_gather_wait", out.size_bytes()), std::move(r));
  }

  /// x = x of rank root (MPI_Bcast).
  template <transferable T>
  void broadcast(std::span<T> x, int root) {
    check_rank(root, "broadcast", "root");
    const comm_scope obs(s_->observer, event("broadcast", x.size_bytes(), root));
    const auto [type, k] = detail::mpi_transfer_type<T>();
    const int n = detail::mpi_count(x.size() * k, "broadcast");
    blocking({"broadcast", detail::dtype_name<T>(), x.size(), -1}, [&] {
      detail::mpi_check(MPI_Bcast(x.data(), n, type, root, s_->comm), "MPI_Bcast");
      return detail::mpi_pending{};
    });
  }

  /// MPI_Send (standard mode: may block until the matching recv is posted). Runs at once, also
  /// while asynchronous collectives are pending.
  template <class In>
    requires transferable<std::remove_const_t<In>>
  void send(std::span<In> in, int dst, int tag) {
    using T = std::remove_const_t<In>;
    check_rank(dst, "send", "destination");
    check_tag(tag, "send");
    const comm_scope obs(s_->observer, event("send", in.size_bytes(), dst));
    const auto [type, k] = detail::mpi_transfer_type<T>();
    const int n = detail::mpi_count(in.size() * k, "send");
    detail::mpi_armed armed(watchdog(), {"send", detail::dtype_name<T>(), in.size(), -1});
    detail::mpi_check(MPI_Send(in.data(), n, type, dst, tag, s_->comm), "MPI_Send");
  }

  /// MPI_Recv of exactly x.size() elements from src with tag; a message of another length
  /// throws input_error. Runs at once, also while asynchronous collectives are pending.
  template <transferable T>
  void recv(std::span<T> x, int src, int tag) {
    check_rank(src, "recv", "source");
    check_tag(tag, "recv");
    const comm_scope obs(s_->observer, event("recv", x.size_bytes(), src));
    const auto [type, k] = detail::mpi_transfer_type<T>();
    const int n = detail::mpi_count(x.size() * k, "recv");
    MPI_Status status{};
    {
      detail::mpi_armed armed(watchdog(), {"recv", detail::dtype_name<T>(), x.size(), -1});
      detail::mpi_check(MPI_Recv(x.data(), n, type, src, tag, s_->comm, &status), "MPI_Recv");
    }
    int got = 0;
    detail::mpi_check(MPI_Get_count(&status, type, &got), "MPI_Get_count");
    if (got != n)
      throw input_error("comm::mpi::recv: expected " + std::to_string(x.size()) + " elements from rank " +
                        std::to_string(src) + " (tag " + std::to_string(tag) + ") but the message has " +
                        std::to_string(static_cast<std::size_t>(got) / k) +
                        "; send and recv must agree on element type and count");
  }

  /// MPI_Barrier.
  void barrier() {
    const comm_scope obs(s_->observer, event("barrier", 0));
    blocking({"barrier", "", 0, -1}, [&] {
      detail::mpi_check(MPI_Barrier(s_->comm), "MPI_Barrier");
      return detail::mpi_pending{};
    });
  }

  /// MPI_Comm_split(color, key); the new communicator inherits the options and is named `name`
  /// ("<this name>/<color>" when empty). Throws input_error for color < 0, device_error.
  mpi_communicator split(int color, int key, std::string name = {}) {
    if (color < 0)
      throw input_error("comm::mpi::split: color " + std::to_string(color) +
                        " is negative; every rank must pass a color >= 0 (MPI_UNDEFINED is not supported)");
    drain();
    MPI_Comm c = MPI_COMM_NULL;
    {
      detail::mpi_armed armed(watchdog(), {"split", "", 0, -1});
      detail::mpi_check(MPI_Comm_split(s_->comm, color, key, &c), "MPI_Comm_split");
    }
    if (name.empty()) name = s_->name + "/" + std::to_string(color);
    mpi_communicator child(adopt{}, c, s_->options, std::move(name));
    child.s_->observer = s_->observer;
    return child;
  }

 private:
  struct adopt {};
  mpi_communicator(adopt, MPI_Comm c, comm_options options, std::string name) { init(c, options, std::move(name)); }

  void init(MPI_Comm c, comm_options options, std::string name) {
    s_ = std::make_shared<detail::mpi_state>();
    s_->comm = c;
    s_->options = options;
    s_->name = std::move(name);
    detail::mpi_check(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    detail::mpi_check(MPI_Comm_rank(c, &s_->rank), "MPI_Comm_rank");
    detail::mpi_check(MPI_Comm_size(c, &s_->size), "MPI_Comm_size");
    detail::mpi_check(MPI_Query_thread(&s_->thread_level), "MPI_Query_thread");
  }

  void release() noexcept {
    if (!s_) return;
    if (s_->broken.load()) {
      // An operation timed out and may never return: leak its thread and the MPI_Comm rather
      // than hang here (the job is ending anyway).
      (void)progress_.release();
      watchdog_.reset();
      s_.reset();
      return;
    }
    progress_.reset();  // finishes queued operations, then joins
    watchdog_.reset();
    int finalized = 0;
    if (s_->comm != MPI_COMM_NULL && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Comm_free(&s_->comm);
    s_.reset();
  }

  detail::mpi_watchdog* watchdog() {
    if (s_->options.timeout.count() <= 0) return nullptr;
    if (!watchdog_) watchdog_ = std::make_unique<detail::mpi_watchdog>(s_);
    return watchdog_.get();
  }

  void drain() {
    if (progress_) progress_->drain();
  }

  /// Runs start() (a blocking MPI call, returning the finishing step) under the watchdog, after
  /// the pending asynchronous operations.
  template <class Start>
  void blocking(const detail::mpi_op_info& info, Start&& start) {
    drain();
    detail::mpi_pending p = [&] {
      detail::mpi_armed armed(watchdog(), info);
      return start();
    }();
    detail::mpi_complete(p, *s_);
  }

  /// Queues start(state, true) on the progress thread (MPI_THREAD_MULTIPLE), or calls
  /// start(state, false) to begin a nonblocking collective (fallback).
  template <class Start>
  request async(const detail::mpi_op_info& info, Start start) {
    if (!async_on_thread())
      return request(std::make_unique<detail::mpi_request_state>(start(*s_, false), s_));
    if (!progress_) progress_ = std::make_unique<detail::progress_thread>();
    auto task = std::make_shared<detail::thread_task>(
        [s = s_, start] {
          detail::mpi_pending p = start(*s, true);
          detail::mpi_complete(p, *s);
        },
        nullptr, std::string());
    progress_->post(task);
    return request(std::make_unique<detail::mpi_thread_request>(std::move(task), s_, info));
  }

  comm_event event(const char* op, std::size_t bytes, int peer = -1) const noexcept {
    return {op, bytes, s_->size, s_->name, peer};
  }
  /// r with its wait observed as `wait` (r itself without an observer).
  request observed(const comm_event& wait, request r) const {
    if (!s_->observer) return r;
    return parallel::detail::observe_wait(std::move(r), s_->observer, wait);
  }

  void check_rank(int r, const char* api, const char* what) const {
    if (r < 0 || r >= s_->size)
      throw input_error(std::string("comm::mpi::") + api + ": " + what + " " + std::to_string(r) +
                        " is outside the communicator [0, " + std::to_string(s_->size) +
                        "); pass a rank of this communicator");
  }
  static void check_tag(int tag, const char* api) {
    if (tag < 0 || tag > 32767)  // MPI guarantees MPI_TAG_UB >= 32767
      throw input_error(std::string("comm::mpi::") + api + ": tag " + std::to_string(tag) +
                        " is outside [0, 32767]; use a small non-negative tag");
  }
  void check_chunks(std::size_t whole, std::size_t part, const char* api) const {
    if (whole != static_cast<std::size_t>(s_->size) * part)
      throw input_error(std::string("comm::mpi::") + api + ": the full buffer has " + std::to_string(whole) +
                        " elements but size() * chunk = " + std::to_string(s_->size) + " * " + std::to_string(part) +
                        "; the full buffer must hold exactly one chunk per rank");
  }

  std::shared_ptr<detail::mpi_state> s_;
  std::unique_ptr<detail::progress_thread> progress_;
  std::unique_ptr<detail::mpi_watchdog> watchdog_;
};

/// comm::mpi — the name used in DESIGN §4.
using mpi = mpi_communicator;

inline mpi_communicator mpi_environment::world(comm_options options) const {
  return mpi_communicator(MPI_COMM_WORLD, options, "world");
}

static_assert(communicator<mpi_communicator>);

}  // namespace loom::parallel::comm
