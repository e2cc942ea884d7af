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
/// Design decisions (see also the report of issue 5):
///  * Thread level: MPI_THREAD_SERIALIZED. Asynchronous operations use MPI-3 nonblocking
///    collectives (MPI_Iallreduce, MPI_Ireduce_scatter_block, MPI_Iallgather) completed by
///    MPI_Wait/MPI_Test, so loom starts no thread of its own and needs no MPI_THREAD_MULTIPLE.
///    Any thread may call, but only one at a time across all communicators. Open MPI progresses
///    nonblocking collectives only inside MPI calls: to overlap, call request::test() now and then
///    (e.g. after each backward layer), otherwise most of the work happens in wait().
///  * bf16 / fp16: MPI has neither type. Reductions convert to an fp32 temporary, reduce with
///    MPI_FLOAT (so accumulation is fp32, as in comm::threads) and round back once; a custom
///    MPI_Op on 16-bit data would round after every pairwise step. Data movement sends the 16-bit
///    words as MPI_UINT16_T, unconverted. Cost: an fp32 buffer of the same element count.
///  * avg = MPI_SUM, then one division by size() on the final sum.
///  * Every MPI return code is checked: failures throw loom::device_error(code, "MPI_Xxx", text
///    from MPI_Error_string). Communicators use MPI_ERRORS_RETURN so that this is possible.
///  * Timeout: with comm_options::timeout > 0 (the default) blocking operations are started as
///    nonblocking ones and polled with MPI_Test until done or the deadline passes, which throws
///    comm_timeout. MPI cannot report which ranks arrived, nor cancel a collective: after a
///    timeout the communicator is unusable and the job should end (MPI_Abort). timeout = 0 calls
///    the blocking MPI functions directly.
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

#include <chrono>
#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/parallel/comm.hpp>
#include <loom/parallel/detail/reduce.hpp>

namespace loom::parallel::detail {

/// Throws loom::device_error(rc, api, MPI_Error_string(rc)) unless rc == MPI_SUCCESS.
inline void mpi_check(int rc, std::string_view api, std::source_location where = std::source_location::current()) {
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

/// An MPI operation in flight: the request, fp32 temporaries for 16-bit reductions (owned here for
/// asynchronous operations, the communicator's reused scratch buffer for blocking ones), and the
/// step that completes it (divide for avg, round back to 16 bits). Moved into the request state
/// for asynchronous operations; the temporaries do not move in memory.
struct mpi_pending {
  MPI_Request req = MPI_REQUEST_NULL;
  std::unique_ptr<float[]> owned;  // temporaries of an asynchronous operation
  std::function<void()> finish;
  // for messages
  const char* api = "";
  const char* dtype = "";
  std::size_t count = 0;
  reduce_op op = reduce_op::sum;
  bool has_op = false;

  mpi_pending() = default;
  mpi_pending(mpi_pending&&) noexcept = default;
  mpi_pending& operator=(mpi_pending&&) noexcept = default;
  ~mpi_pending() {
    // Only after a failed wait (timeout) can the request still be active; MPI may still write
    // into the temporaries, so they are leaked on purpose rather than freed under its feet.
    if (req != MPI_REQUEST_NULL) (void)owned.release();
  }

  std::string describe() const {
    if (!*dtype) return std::string(api) + "()";
    std::string s = std::string(api) + "(" + dtype + " x " + std::to_string(count);
    if (has_op) s += ", " + std::string(to_string(op));
    return s + ")";
  }
};

/// Identity of a communicator, copied into requests for their error messages.
struct mpi_identity {
  std::string name;
  int rank = 0, size = 1;
  std::chrono::milliseconds timeout{0};
};

/// Completes p: waits for its request (polling against the timeout when one is set), then runs
/// its finishing step. Throws comm_timeout or device_error.
inline void mpi_complete(mpi_pending& p, const mpi_identity& id) {
  if (p.req != MPI_REQUEST_NULL) {
    if (id.timeout.count() <= 0) {
      mpi_check(MPI_Wait(&p.req, MPI_STATUS_IGNORE), "MPI_Wait");
    } else {
      const auto deadline = std::chrono::steady_clock::now() + id.timeout;
      int flag = 0;
      for (unsigned i = 0;; ++i) {
        mpi_check(MPI_Test(&p.req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
        if (flag) break;
        if ((i & 63u) == 0 && std::chrono::steady_clock::now() > deadline)
          throw comm_timeout("comm::mpi " + p.describe() + " on communicator '" + id.name + "' (size " +
                             std::to_string(id.size) + ") timed out after " + std::to_string(id.timeout.count()) +
                             " ms on rank " + std::to_string(id.rank) +
                             "; MPI cannot tell which ranks arrived, nor cancel the operation: end the job "
                             "(MPI_Abort)");
      }
    }
  }
  if (p.finish) {
    auto finish = std::move(p.finish);
    p.finish = nullptr;
    finish();
  }
}

class mpi_request_state final : public request_state {
 public:
  mpi_request_state(mpi_pending p, mpi_identity id) : p_(std::move(p)), id_(std::move(id)) {}
  void wait() override { mpi_complete(p_, id_); }
  bool test() override {
    if (p_.req == MPI_REQUEST_NULL) return true;
    int flag = 0;
    mpi_check(MPI_Test(&p_.req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    return flag != 0;
  }

 private:
  mpi_pending p_;
  mpi_identity id_;
};

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

}  // namespace loom::parallel::detail

namespace loom::parallel::comm {

class mpi_communicator;

/// RAII for MPI_Init_thread / MPI_Finalize. Create exactly one, first thing in main, and destroy
/// every mpi_communicator before it. If MPI is already initialised (by the caller), it neither
/// initialises nor finalises.
/// Errors: device_error if MPI_Init_thread fails or provides less than `required`.
class mpi_environment {
 public:
  /// required: MPI_THREAD_SERIALIZED by default (see the file comment); argc/argv may be null.
  explicit mpi_environment(int* argc = nullptr, char*** argv = nullptr, int required = MPI_THREAD_SERIALIZED) {
    int initialized = 0;
    detail::mpi_check(MPI_Initialized(&initialized), "MPI_Initialized");
    if (initialized) {
      detail::mpi_check(MPI_Query_thread(&provided_), "MPI_Query_thread");
    } else {
      detail::mpi_check(MPI_Init_thread(argc, argv, required, &provided_), "MPI_Init_thread");
      owns_ = true;
    }
    if (provided_ < required) {
      const std::string msg =
          (owns_ ? "this MPI library provides thread level " : "MPI was initialised by the caller with thread level ") +
          std::to_string(provided_) + ", less than the required " + std::to_string(required) +
          (owns_ ? "; use an MPI built with thread support"
                 : "; initialise with MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided) or let "
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
/// split) and frees it on destruction. Move-only. Models loom::parallel::communicator.
class mpi_communicator {
 public:
  /// Duplicates `parent` (MPI_Comm_dup), so loom's traffic never matches the caller's, and sets
  /// MPI_ERRORS_RETURN on the duplicate. Collective over parent. Throws device_error.
  explicit mpi_communicator(MPI_Comm parent, comm_options options = {}, std::string name = "world")
      : options_(options), name_(std::move(name)) {
    detail::mpi_check(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup");
    init();
  }
  mpi_communicator(mpi_communicator&& other) noexcept
      : comm_(std::exchange(other.comm_, MPI_COMM_NULL)), rank_(other.rank_), size_(other.size_),
        options_(other.options_), name_(std::move(other.name_)), scratch_(std::move(other.scratch_)),
        scratch_size_(std::exchange(other.scratch_size_, 0)) {}
  mpi_communicator& operator=(mpi_communicator&& other) noexcept {
    if (this != &other) {
      free();
      comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
      rank_ = other.rank_;
      size_ = other.size_;
      options_ = other.options_;
      name_ = std::move(other.name_);
      scratch_ = std::move(other.scratch_);
      scratch_size_ = std::exchange(other.scratch_size_, 0);
    }
    return *this;
  }
  ~mpi_communicator() { free(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const std::string& name() const noexcept { return name_; }
  const comm_options& options() const noexcept { return options_; }
  /// The owned MPI communicator, for calls loom does not wrap. Do not free it.
  MPI_Comm native() const noexcept { return comm_; }

  /// x = op over ranks of x, in place (MPI_Allreduce with MPI_IN_PLACE). See comm.hpp.
  template <reducible T>
  void all_reduce(std::span<T> x, reduce_op op = reduce_op::sum) {
    auto p = start_all_reduce(x, op, true);
    detail::mpi_complete(p, identity());
  }
  template <reducible T>
  request all_reduce_async(std::span<T> x, reduce_op op = reduce_op::sum) {
    return make_request(start_all_reduce(x, op, false));
  }

  /// Rank r: out = op over ranks of in[r*m, (r+1)*m), m = out.size() (MPI_Reduce_scatter_block).
  /// out may lie inside in (reduced through a temporary then).
  template <class In, reducible T>
    requires std::same_as<std::remove_const_t<In>, T>
  void reduce_scatter(std::span<In> in, std::span<T> out, reduce_op op = reduce_op::sum) {
    auto p = start_reduce_scatter<T>(in.data(), in.size(), out, op, true);
    detail::mpi_complete(p, identity());
  }
  template <class In, reducible T>
    requires std::same_as<std::remove_const_t<In>, T>
  request reduce_scatter_async(std::span<In> in, std::span<T> out, reduce_op op = reduce_op::sum) {
    return make_request(start_reduce_scatter<T>(in.data(), in.size(), out, op, false));
  }

  /// out[j*m, (j+1)*m) = in of rank j (MPI_Allgather). in may be exactly out[rank*m, (rank+1)*m)
  /// (then MPI_IN_PLACE); any other overlap is undefined.
  template <class In, transferable T>
    requires std::same_as<std::remove_const_t<In>, T>
  void all_gather(std::span<In> in, std::span<T> out) {
    auto p = start_all_gather<T>(in.data(), in.size(), out, true);
    detail::mpi_complete(p, identity());
  }
  template <class In, transferable T>
    requires std::same_as<std::remove_const_t<In>, T>
  request all_gather_async(std::span<In> in, std::span<T> out) {
    return make_request(start_all_gather<T>(in.data(), in.size(), out, false));
  }

  /// x = x of rank root (MPI_Bcast / MPI_Ibcast).
  template <transferable T>
  void broadcast(std::span<T> x, int root) {
    check_rank(root, "broadcast", "root");
    const auto [type, k] = detail::mpi_transfer_type<T>();
    const int n = detail::mpi_count(x.size() * k, "broadcast");
    detail::mpi_pending p = pending("broadcast", detail::dtype_name<T>(), x.size());
    if (blocking())
      detail::mpi_check(MPI_Bcast(x.data(), n, type, root, comm_), "MPI_Bcast");
    else
      detail::mpi_check(MPI_Ibcast(x.data(), n, type, root, comm_, &p.req), "MPI_Ibcast");
    detail::mpi_complete(p, identity());
  }

  /// MPI_Send (standard mode: may block until the matching recv is posted).
  template <class In>
    requires transferable<std::remove_const_t<In>>
  void send(std::span<In> in, int dst, int tag) {
    using T = std::remove_const_t<In>;
    check_rank(dst, "send", "destination");
    check_tag(tag, "send");
    const auto [type, k] = detail::mpi_transfer_type<T>();
    const int n = detail::mpi_count(in.size() * k, "send");
    detail::mpi_pending p = pending("send", detail::dtype_name<T>(), in.size());
    if (blocking())
      detail::mpi_check(MPI_Send(in.data(), n, type, dst, tag, comm_), "MPI_Send");
    else
      detail::mpi_check(MPI_Isend(in.data(), n, type, dst, tag, comm_, &p.req), "MPI_Isend");
    detail::mpi_complete(p, identity());
  }

  /// MPI_Recv of exactly x.size() elements from src with tag; a message of another length
  /// throws input_error.
  template <transferable T>
  void recv(std::span<T> x, int src, int tag) {
    check_rank(src, "recv", "source");
    check_tag(tag, "recv");
    const auto [type, k] = detail::mpi_transfer_type<T>();
    const int n = detail::mpi_count(x.size() * k, "recv");
    MPI_Status status{};
    if (blocking()) {
      detail::mpi_check(MPI_Recv(x.data(), n, type, src, tag, comm_, &status), "MPI_Recv");
    } else {
      MPI_Request req = MPI_REQUEST_NULL;
      detail::mpi_check(MPI_Irecv(x.data(), n, type, src, tag, comm_, &req), "MPI_Irecv");
      const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
      int flag = 0;
      for (unsigned i = 0;; ++i) {
        detail::mpi_check(MPI_Test(&req, &flag, &status), "MPI_Test");
        if (flag) break;
        if ((i & 63u) == 0 && std::chrono::steady_clock::now() > deadline)
          throw comm_timeout("comm::mpi recv(" + std::string(detail::dtype_name<T>()) + " x " +
                             std::to_string(x.size()) + " from rank " + std::to_string(src) + ", tag " +
                             std::to_string(tag) + ") on communicator '" + name_ + "' rank " +
                             std::to_string(rank_) + " timed out after " + std::to_string(options_.timeout.count()) +
                             " ms: the message was not sent; end the job (MPI_Abort)");
      }
    }
    int got = 0;
    detail::mpi_check(MPI_Get_count(&status, type, &got), "MPI_Get_count");
    if (got != n)
      throw input_error("comm::mpi::recv: expected " + std::to_string(x.size()) + " elements from rank " +
                        std::to_string(src) + " (tag " + std::to_string(tag) + ") but the message has " +
                        std::to_string(static_cast<std::size_t>(got) / k) +
                        "; send and recv must agree on element type and count");
  }

  /// MPI_Barrier / MPI_Ibarrier.
  void barrier() {
    detail::mpi_pending p = pending("barrier", "", 0);
    if (blocking())
      detail::mpi_check(MPI_Barrier(comm_), "MPI_Barrier");
    else
      detail::mpi_check(MPI_Ibarrier(comm_, &p.req), "MPI_Ibarrier");
    detail::mpi_complete(p, identity());
  }

  /// MPI_Comm_split(color, key); the new communicator inherits the options and is named `name`
  /// ("<this name>/<color>" when empty). Throws input_error for color < 0, device_error.
  mpi_communicator split(int color, int key, std::string name = {}) {
    if (color < 0)
      throw input_error("comm::mpi::split: color " + std::to_string(color) +
                        " is negative; every rank must pass a color >= 0 (MPI_UNDEFINED is not supported)");
    MPI_Comm c = MPI_COMM_NULL;
    detail::mpi_check(MPI_Comm_split(comm_, color, key, &c), "MPI_Comm_split");
    if (name.empty()) name = name_ + "/" + std::to_string(color);
    return mpi_communicator(adopt{}, c, options_, std::move(name));
  }

 private:
  struct adopt {};
  mpi_communicator(adopt, MPI_Comm c, comm_options options, std::string name)
      : comm_(c), options_(options), name_(std::move(name)) {
    init();
  }

  void init() {
    detail::mpi_check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    detail::mpi_check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    detail::mpi_check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }

  void free() noexcept {
    if (comm_ == MPI_COMM_NULL) return;
    int finalized = 0;
    if (MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

  bool blocking() const noexcept { return options_.timeout.count() <= 0; }
  detail::mpi_identity identity() const { return {name_, rank_, size_, options_.timeout}; }

  static detail::mpi_pending pending(const char* api, const char* dtype, std::size_t count) {
    detail::mpi_pending p;
    p.api = api;
    p.dtype = dtype;
    p.count = count;
    return p;
  }

  /// n floats of temporary storage: the reused scratch buffer for an operation that completes
  /// before the call returns (sync), a new allocation owned by p for an asynchronous one (several
  /// may be in flight). Not zeroed.
  float* temporary(detail::mpi_pending& p, std::size_t n, bool sync) {
    if (!sync) {
      p.owned.reset(new float[std::max<std::size_t>(n, 1)]);
      return p.owned.get();
    }
    if (n > scratch_size_) {
      scratch_.reset(new float[n]);
      scratch_size_ = n;
    }
    return scratch_.get();
  }

  request make_request(detail::mpi_pending p) {
    return request(std::make_unique<detail::mpi_request_state>(std::move(p), identity()));
  }

  void check_rank(int r, const char* api, const char* what) const {
    if (r < 0 || r >= size_)
      throw input_error(std::string("comm::mpi::") + api + ": " + what + " " + std::to_string(r) +
                        " is outside the communicator [0, " + std::to_string(size_) + "); pass a rank of this communicator");
  }
  static void check_tag(int tag, const char* api) {
    if (tag < 0 || tag > 32767)  // MPI guarantees MPI_TAG_UB >= 32767
      throw input_error(std::string("comm::mpi::") + api + ": tag " + std::to_string(tag) +
                        " is outside [0, 32767]; use a small non-negative tag");
  }
  void check_chunks(std::size_t whole, std::size_t part, const char* api) const {
    if (whole != static_cast<std::size_t>(size_) * part)
      throw input_error(std::string("comm::mpi::") + api + ": the full buffer has " + std::to_string(whole) +
                        " elements but size() * chunk = " + std::to_string(size_) + " * " + std::to_string(part) +
                        "; the full buffer must hold exactly one chunk per rank");
  }

  template <reducible T>
  detail::mpi_pending start_all_reduce(std::span<T> x, reduce_op op, bool sync) {
    const bool block = sync && blocking();
    detail::check_op<T>(op, "comm::mpi::all_reduce");
    detail::mpi_pending p = pending("all_reduce", detail::dtype_name<T>(), x.size());
    p.op = op;
    p.has_op = true;
    const int n = detail::mpi_count(x.size(), "all_reduce");
    const MPI_Datatype type = detail::mpi_reduce_type<T>();
    void* buf = x.data();
    const float divisor = op == reduce_op::avg ? static_cast<float>(size_) : 1.0f;
    if constexpr (detail::is_16bit_float_v<T>) {
      float* t = temporary(p, x.size(), sync);
      detail::to_float(t, x.data(), x.size());
      buf = t;
      p.finish = [x, t, divisor] { detail::from_float(x.data(), t, x.size(), divisor); };
    } else if constexpr (std::is_floating_point_v<T>) {
      if (op == reduce_op::avg)
        p.finish = [x, d = static_cast<T>(size_)] {
          for (auto& v : x) v /= d;
        };
    }
    if (block)
      detail::mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf, n, type, detail::mpi_op(op), comm_), "MPI_Allreduce");
    else
      detail::mpi_check(MPI_Iallreduce(MPI_IN_PLACE, buf, n, type, detail::mpi_op(op), comm_, &p.req),
                        "MPI_Iallreduce");
    return p;
  }

  template <reducible T>
  detail::mpi_pending start_reduce_scatter(const T* in, std::size_t in_size, std::span<T> out, reduce_op op,
                                           bool sync) {
    const bool block = sync && blocking();
    check_chunks(in_size, out.size(), "reduce_scatter");
    detail::check_op<T>(op, "comm::mpi::reduce_scatter");
    detail::mpi_pending p = pending("reduce_scatter", detail::dtype_name<T>(), out.size());
    p.op = op;
    p.has_op = true;
    const std::size_t m = out.size();
    const int n = detail::mpi_count(m, "reduce_scatter");
    detail::mpi_count(in_size, "reduce_scatter");
    const MPI_Datatype type = detail::mpi_reduce_type<T>();
    const float divisor = op == reduce_op::avg ? static_cast<float>(size_) : 1.0f;
    const void* send = in;
    void* recv = out.data();
    const bool overlap = m && out.data() < in + in_size && in < out.data() + m;
    if constexpr (detail::is_16bit_float_v<T>) {
      float* t = temporary(p, in_size + m, sync);
      detail::to_float(t, in, in_size);
      send = t;
      recv = t + in_size;
      p.finish = [out, t = t + in_size, divisor] { detail::from_float(out.data(), t, out.size(), divisor); };
    } else {
      const void* t = nullptr;
      if (overlap) {  // MPI forbids aliased buffers: reduce into a temporary, then copy
        float* scratch = temporary(p, (m * sizeof(T) + sizeof(float) - 1) / sizeof(float), sync);
        recv = scratch;
        t = scratch;
      }
      p.finish = [out, t, op, d = size_] {
        if (t) std::memcpy(out.data(), t, out.size_bytes());
        if constexpr (std::is_floating_point_v<T>)
          if (op == reduce_op::avg)
            for (auto& v : out) v /= static_cast<T>(d);
      };
    }
    if (block)
      detail::mpi_check(MPI_Reduce_scatter_block(send, recv, n, type, detail::mpi_op(op), comm_),
                        "MPI_Reduce_scatter_block");
    else
      detail::mpi_check(MPI_Ireduce_scatter_block(send, recv, n, type, detail::mpi_op(op), comm_, &p.req),
                        "MPI_Ireduce_scatter_block");
    return p;
  }

  template <transferable T>
  detail::mpi_pending start_all_gather(const T* in, std::size_t in_size, std::span<T> out, bool sync) {
    const bool block = sync && blocking();
    check_chunks(out.size(), in_size, "all_gather");
    detail::mpi_pending p = pending("all_gather", detail::dtype_name<T>(), in_size);
    const auto [type, k] = detail::mpi_transfer_type<T>();
    const int n = detail::mpi_count(in_size * k, "all_gather");
    detail::mpi_count(out.size() * k, "all_gather");
    const void* send = in == out.data() + static_cast<std::size_t>(rank_) * in_size ? MPI_IN_PLACE : in;
    if (in_size == 0) send = MPI_IN_PLACE;  // nothing to send; avoids a null buffer
    if (block)
      detail::mpi_check(MPI_Allgather(send, n, type, out.data(), n, type, comm_), "MPI_Allgather");
    else
      detail::mpi_check(MPI_Iallgather(send, n, type, out.data(), n, type, comm_, &p.req), "MPI_Iallgather");
    return p;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  comm_options options_;
  std::string name_;
  std::unique_ptr<float[]> scratch_;  // fp32 temporaries of blocking 16-bit reductions
  std::size_t scratch_size_ = 0;
};

/// comm::mpi — the name used in DESIGN §4.
using mpi = mpi_communicator;

inline mpi_communicator mpi_environment::world(comm_options options) const {
  return mpi_communicator(MPI_COMM_WORLD, options, "world");
}

static_assert(communicator<mpi_communicator>);

}  // namespace loom::parallel::comm
