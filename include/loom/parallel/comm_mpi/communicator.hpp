#pragma once
/// \file comm::mpi_communicator (comm::mpi) — one rank of an MPI communicator
/// (loom/parallel/comm_mpi.hpp, which documents the design).
#include <concepts>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include <loom/core/error.hpp>
#include <loom/parallel/comm.hpp>
#include <loom/parallel/comm_mpi/environment.hpp>
#include <loom/parallel/detail/mpi_operations.hpp>  // <mpi.h>, the operations
#include <loom/parallel/detail/progress.hpp>
#include <loom/parallel/detail/reduce.hpp>

namespace loom::parallel::comm {

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

  /// x = op over ranks of x, in place (MPI_Allreduce with MPI_IN_PLACE; bf16/fp16 sum/avg: loom's
  /// ring of MPI_Sendrecv with fp32 partial sums, rounded once, see detail::mpi_ring_all_reduce).
  /// See comm.hpp.
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
    if (MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) {
      if (s_->ring != MPI_COMM_NULL) MPI_Comm_free(&s_->ring);
      if (s_->comm != MPI_COMM_NULL) MPI_Comm_free(&s_->comm);
    }
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
