#pragma once
/// \file The `communicator` concept, reduction operators, the asynchronous `request` handle and
/// `make_groups<Layout>`: everything that is common to the communication backends.
///
/// Backends (one header each, all in namespace loom::parallel::comm, aliased as loom::comm):
///   comm::threads  (loom/parallel/comm_threads.hpp)  ranks are threads of one process
///   comm::mpi      (loom/parallel/comm_mpi.hpp)      one process per rank, Open MPI; needs mpi.h
///
/// Semantics follow MPI (MPI 4.0 standard, chapters 5 "Collective Communication" and 7 "Groups,
/// Contexts, Communicators"): every rank of a group calls the same collectives in the same order;
/// spans on different ranks describe the same logical buffer; a communicator is used by one thread
/// at a time (the backends' own progress machinery excepted). Groups are explicit values passed to
/// whoever communicates; there is no global registry (STYLE §3.9; Megatron-LM's module-global parallel_state is the counter-example).
///
/// Element types. Reductions (all_reduce, reduce_scatter) accept the `reducible` types: float,
/// double, Eigen::bfloat16 and Eigen::half (reduced in fp32, rounded once at the end), int32 and
/// int64 (sum wraps modulo 2^bits; avg is rejected with input_error). Data movement (all_gather,
/// broadcast, send, recv) accepts any trivially copyable type.
///
/// Rank order of the parallel groups (Megatron-LM's): tensor-parallel rank varies fastest, then
/// data-parallel, then pipeline stage. Worked example, layout<2,2> on 8 ranks (dp = 2):
///   world rank : 0 1 2 3 4 5 6 7
///   tp group   : {0,1} {2,3} {4,5} {6,7}          tp rank = world % 2
///   dp group   : {0,2} {1,3} {4,6} {5,7}          dp rank = (world / 2) % 2
///   pp group   : {0,4} {1,5} {2,6} {3,7}          pp rank = world / 4
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <Eigen/Core>

#include <loom/core/error.hpp>
#include <loom/parallel/comm_observer.hpp>
#include <loom/core/layout.hpp>

namespace loom::parallel {

/// Reduction applied element-wise across ranks.
///   sum  x_0 + x_1 + ... + x_{n-1}, added in rank order 0..n-1 by the threads backend
///   avg  sum / n, divided exactly once, on the final sum (floating-point types only)
///   max  largest value; min  smallest value (NaN handling is backend-defined: use sum or an
///        explicit flag to agree on non-finite values)
enum class reduce_op : std::uint8_t { sum, avg, max, min };

/// "sum", "avg", "max", "min".
constexpr std::string_view to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::avg: return "avg";
    case reduce_op::max: return "max";
    case reduce_op::min: return "min";
  }
  return "?";
}

/// Element types the reductions accept.
template <class T>
concept reducible = std::same_as<T, float> || std::same_as<T, double> ||
                    std::same_as<T, Eigen::bfloat16> || std::same_as<T, Eigen::half> ||
                    std::same_as<T, std::int32_t> || std::same_as<T, std::int64_t>;

/// Element types that data-movement collectives (all_gather, broadcast, send, recv) accept.
template <class T>
concept transferable = std::is_trivially_copyable_v<T> && !std::is_const_v<T> && !std::is_volatile_v<T>;

/// Options of a communicator, fixed when it is created and inherited by split().
struct comm_options {
  /// A blocking collective, send/recv or request wait that has not completed after this long
  /// throws loom::parallel::comm_timeout (naming the operation, the group and, where the backend
  /// can tell, the ranks that did and did not arrive). Zero waits forever. Default 10 minutes,
  /// as PyTorch's process groups.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

/// A collective or point-to-point operation did not complete within comm_options::timeout.
/// The group is unusable afterwards (a collective cannot be cancelled): end the run.
class comm_timeout : public error {
 public:
  using error::error;
};

/// The operation was abandoned because another rank of the same world failed (threw, timed out)
/// or left while operations were pending. what() carries the original reason.
class comm_aborted : public error {
 public:
  using error::error;
};

namespace detail {
/// Backend side of a request. wait() blocks until complete and throws the operation's error;
/// test() reports completion without blocking (and drives progress where the backend needs it);
/// abandon() is called when the owning request is destroyed during stack unwinding while the
/// operation may still be pending: backends that can, release the peers (abort the world).
struct request_state {
  virtual ~request_state() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
  virtual void abandon() noexcept {}
};
}  // namespace detail

class request;
namespace detail {
inline request observe_wait(request r, comm_observer* o, comm_event e);
}  // namespace detail

/// Handle of an asynchronous collective (all_reduce_async, reduce_scatter_async,
/// all_gather_async). Move-only. The spans passed to the operation must stay alive and untouched
/// (neither read nor written) until wait() returns or test() returns true.
///
///   wait()    blocks until the operation completes; throws its error (once). Afterwards the
///             request is empty and further wait()/test() calls return at once.
///   test()    true if complete (then behaves as wait(): finishes it and throws its error);
///             false otherwise. With MPI, test() also drives progress of the operation.
///   pending() true while the request still refers to an unfinished or unwaited operation.
/// Destroying a pending request waits for it and swallows its error; call wait() to see errors.
/// If the destruction happens during stack unwinding, the backend first releases the peer ranks
/// (the threads backend aborts the world), because the peers may never finish the operation.
class request {
 public:
  request() noexcept = default;
  explicit request(std::unique_ptr<detail::request_state> state) noexcept : state_(std::move(state)) {}
  request(request&&) noexcept = default;
  request& operator=(request&& other) noexcept {
    if (this != &other) {
      finish_quietly();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  ~request() { finish_quietly(); }

  void wait() {
    if (!state_) return;
    auto state = std::move(state_);
    state->wait();
  }
  bool test() {
    if (!state_) return true;
    if (!state_->test()) return false;
    wait();
    return true;
  }
  bool pending() const noexcept { return static_cast<bool>(state_); }

 private:
  friend request detail::observe_wait(request r, comm_observer* o, comm_event e);
  void finish_quietly() noexcept {
    if (!state_) return;
    if (std::uncaught_exceptions() > 0) state_->abandon();
    try {
      state_->wait();
    } catch (...) {  // a destructor never throws; wait() explicitly to see the error
    }
    state_.reset();
  }
  std::unique_ptr<detail::request_state> state_;
};

namespace detail {
/// The request's completion (wait(), or the destructor's wait) seen by an observer as
/// `e` (op "<collective>_wait"). Owns a copy of the group name, so the request does not depend on
/// its communicator's lifetime for it.
class observed_request_state final : public request_state {
 public:
  observed_request_state(std::unique_ptr<request_state> inner, comm_observer* o, comm_event e)
      : inner_(std::move(inner)), o_(o), e_(e), group_(e.group) {
    e_.group = group_;
  }
  void wait() override {
    const comm_scope s(o_, e_);
    inner_->wait();
  }
  bool test() override { return inner_->test(); }
  void abandon() noexcept override { inner_->abandon(); }

 private:
  std::unique_ptr<request_state> inner_;
  comm_observer* o_;
  comm_event e_;
  std::string group_;
};

/// r, with its wait observed by o (r unchanged when o is null or r is empty).
inline request observe_wait(request r, comm_observer* o, comm_event e) {
  if (!o || !r.state_) return r;
  r.state_ = std::make_unique<observed_request_state>(std::move(r.state_), o, e);
  return r;
}
}  // namespace detail

/// Waits for every request, then throws the first error encountered (in span order), if any.
inline void wait_all(std::span<request> requests) {
  std::exception_ptr first;
  for (auto& r : requests) {
    try {
      r.wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

/// Requirements on a communicator C for element type T (see the file comment for the semantics).
/// `x`, `out` are std::span<T>; `in` is std::span<const T>; n = size().
///   rank(), size()                        this rank in [0, n), group size n >= 1
///   all_reduce(x, op)                     x = op over ranks of x                       (in place)
///   reduce_scatter(in, out, op)           in.size() == n*out.size(); rank r gets
///                                         out = op over ranks of in[r*m, (r+1)*m),  m = out.size()
///   all_gather(in, out)                   out.size() == n*in.size(); out[j*m, (j+1)*m) = in of rank j
///   broadcast(x, root)                    x = x of rank root
///   send(in, dst, tag), recv(x, src, tag) point to point; messages between a pair with the same
///                                         tag arrive in order; sizes must match. send may block until
///                                         the matching recv (portable code must not rely on buffering)
///   barrier()                             returns once every rank has entered it
///   split(color, key) -> C                MPI_Comm_split: ranks with equal color (>= 0) form a group,
///                                         ordered by key, then by old rank. Collective.
///   all_reduce_async / reduce_scatter_async / all_gather_async -> request
///                                         as above, completing at request::wait(); async operations
///                                         match across ranks by issue order, like blocking ones.
///                                         All ranks must use the same variant for a given collective
///                                         (MPI nonblocking collectives never match blocking ones).
template <class C, class T>
concept communicator_for =
    std::movable<C> &&
    requires(C& c, const C& cc, std::span<T> x, std::span<const T> in, reduce_op op, int i) {
      { cc.rank() } -> std::same_as<int>;
      { cc.size() } -> std::same_as<int>;
      c.all_reduce(x, op);
      c.reduce_scatter(in, x, op);
      c.all_gather(in, x);
      c.broadcast(x, i);
      c.send(in, i, i);
      c.recv(x, i, i);
      c.barrier();
      { c.split(i, i) } -> std::same_as<C>;
      { c.all_reduce_async(x, op) } -> std::same_as<request>;
      { c.reduce_scatter_async(in, x, op) } -> std::same_as<request>;
      { c.all_gather_async(in, x) } -> std::same_as<request>;
    };

/// A communicator: communicator_for every reducible element type.
template <class C>
concept communicator = communicator_for<C, float> && communicator_for<C, double> &&
                       communicator_for<C, Eigen::bfloat16> && communicator_for<C, Eigen::half> &&
                       communicator_for<C, std::int32_t> && communicator_for<C, std::int64_t>;

/// A one-rank group: the tensor- and pipeline-parallel groups of a layout<1,1> trainer and of a
/// TP = 1 model called without a group. Its reductions and broadcasts are identities; send and
/// recv have no peer and throw loom::error.
struct local_group {
  static constexpr int size() noexcept { return 1; }
  static constexpr int rank() noexcept { return 0; }
  template <class X>
  void all_reduce(std::span<X>, reduce_op) noexcept {}
  template <class X>
  void broadcast(std::span<X>, int) noexcept {}
  template <class X>
  void send(std::span<const X>, int, int) {
    throw error("parallel::local_group: a one-rank group has no peer to send to");
  }
  template <class X>
  void recv(std::span<X>, int, int) {
    throw error("parallel::local_group: a one-rank group has no peer to receive from");
  }
};

/// The tensor-, data- and pipeline-parallel groups of one rank, built by make_groups.
///   tp  size L::tp; ranks of one tensor-parallel shard set (consecutive world ranks)
///   dp  size world/(L::tp*L::pp); replicas of the same shard (world stride L::tp)
///   pp  size L::pp; the pipeline stages (world stride L::tp*dp)
/// tp.rank(), dp.rank(), pp.rank() equal L::tp_rank(world), L::dp_rank(world, dp), L::pp_rank(...).
template <class C>
struct groups {
  C tp;
  C dp;
  C pp;
};

/// Splits `world` into the tensor-, data- and pipeline-parallel groups of layout L (Megatron rank
/// order: tp fastest, then dp, then pp; see the file comment for a worked example). Collective
/// over `world` (three splits). Throws loom::input_error, on every rank, if world.size() is not a
/// multiple of L::tp * L::pp. The new groups are named "<world name>/tp", ".../dp", ".../pp" where
/// the backend supports names.
template <layout_policy L, class C>
  requires communicator_for<C, float>
groups<C> make_groups(C& world) {
  const int n = world.size();
  constexpr int model = L::tp * L::pp;
  if (n % model != 0)
    throw input_error("make_groups: world size " + std::to_string(n) + " is not a multiple of TP*PP = " +
                      std::to_string(model) + " (TP=" + std::to_string(L::tp) + ", PP=" +
                      std::to_string(L::pp) + "); launch a multiple of " + std::to_string(model) +
                      " ranks or change layout<TP,PP>");
  const int dp = n / model;
  const int r = world.rank();
  const int tp_rank = L::tp_rank(r), dp_rank = L::dp_rank(r, dp), pp_rank = L::pp_rank(r, dp);
  // color = index of the group among groups of the same kind; key = rank inside the group.
  auto split = [&](int color, int key, std::string_view suffix) {
    if constexpr (requires { world.split(color, key, std::string()); })
      return world.split(color, key, world.name() + "/" + std::string(suffix));
    else
      return world.split(color, key);
  };
  C tp = split(pp_rank * dp + dp_rank, tp_rank, "tp");
  C dpg = split(pp_rank * L::tp + tp_rank, dp_rank, "dp");
  C pp = split(dp_rank * L::tp + tp_rank, pp_rank, "pp");
  return groups<C>{std::move(tp), std::move(dpg), std::move(pp)};
}

/// Namespace of the backends: loom::parallel::comm::threads, loom::parallel::comm::mpi.
namespace comm {}

}  // namespace loom::parallel

namespace loom {
namespace comm = parallel::comm;  // loom::comm::threads, loom::comm::run_threads, loom::comm::mpi
}
