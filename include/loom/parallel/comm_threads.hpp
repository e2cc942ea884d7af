#pragma once
/// \file comm::threads — a communicator whose ranks are threads of one process.
///
/// The embedded default for tests, examples and single-machine runs. Start a world with
///   loom::comm::run_threads(4, [&](loom::comm::threads& world) { ... world.all_reduce(x); ... });
///
/// Algorithms (shared memory, no gather to rank 0). Every collective is: each rank publishes
/// its buffer pointers in its slot, barrier, each rank does 1/n of the work reading and writing the
/// other ranks' buffers directly, barrier (Note [threads barrier] in detail/thread_group.hpp).
///   all_reduce      rank r owns elements [lo_r, hi_r) (n nearly equal parts on 64-byte
///                   boundaries); for each 64-element tile (sum/avg of 2-4 ranks; otherwise each
///                   2048-element block) it sums the n buffers in rank order 0..n-1 into an
///                   fp32/T accumulator held in registers/L1, divides once for avg, rounds once,
///                   and writes the result into all n buffers (detail/reduce.hpp): a fused reduce-scatter +
///                   all-gather that reads and writes each buffer exactly once (the minimum memory
///                   traffic; a ring moves 2(n-1)/n of the buffer per rank per phase). The result
///                   is bitwise identical on every rank and from run to run.
///   reduce_scatter  rank r reduces chunk r of the n input buffers into its own output.
///   all_gather      rank r copies the n inputs into its own output.
///   broadcast       every non-root rank copies root's buffer.
///   send/recv       eager: send copies the payload into the destination's mailbox and returns;
///                   recv takes the oldest message with that (source, tag). Messages between a
///                   pair with equal tags are received in order.
/// Cost per collective: two barriers (~1-10 us when ranks <= cores, more when oversubscribed)
/// plus the memory traffic above. Calls are checked for agreement across ranks: ranks calling
/// different collectives, element types, sizes, ops or roots get loom::input_error on every rank.
///
/// Asynchronous variants run on a progress thread owned by the communicator (started on first
/// use), in issue order, so ranks issuing them in the same order match. A blocking call or split()
/// first waits for every outstanding asynchronous operation of this communicator (point-to-point
/// excepted: send/recv run at once, concurrently with pending collectives).
///
/// Failure: when one rank throws, run_threads aborts the world: every rank blocked in (or later
/// entering) an operation of any group of the world throws comm_aborted naming the first failure,
/// and run_threads rethrows that first exception. A wait longer than comm_options::timeout throws
/// comm_timeout naming the operation, the group and the ranks that did and did not arrive.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/parallel/comm.hpp>
#include <loom/parallel/detail/progress.hpp>
#include <loom/parallel/detail/reduce.hpp>
#include <loom/parallel/detail/thread_group.hpp>

namespace loom::parallel::detail {

// The collectives, as free functions over the shared group state, so that the caller's thread and
// the progress thread run the same code.

template <class T>
void publish(thread_group& g, int r, coll_kind kind, std::size_t count, reduce_op op, int root, const void* in,
             void* out) {
  slot& s = g.at(r);
  s.kind = kind;
  s.op = op;
  s.elem_size = sizeof(T);
  s.dtype = dtype_name<T>();
  s.count = count;
  s.root = root;
  s.in = in;
  s.out = out;
  s.color = s.key = 0;
}

/// After the first barrier: every rank checks that all ranks posted the same call. On a mismatch
/// every rank sees it (equality is transitive), passes one more barrier so nobody overwrites its
/// slot while others still read, and throws input_error.
inline void verify_same_call(thread_group& g, int r) {
  const slot& mine = g.at(r);
  bool same = true;
  for (int j = 0; j < g.size(); ++j) same = same && g.at(j).same_call(mine);
  if (same) return;
  std::string msg = "comm::threads: the ranks of group '" + g.name() + "' called different collectives:";
  for (int j = 0; j < g.size(); ++j) msg += (j ? ", rank " : " rank ") + std::to_string(j) + " " + g.at(j).describe();
  msg += "; every rank of a group must issue the same collectives, in the same order, with the same sizes";
  g.arrive_and_wait(r);
  throw input_error(msg);
}

inline void check_rank(int rank, int size, const char* api, const char* what) {
  if (rank < 0 || rank >= size)
    throw input_error(std::string("comm::threads::") + api + ": " + what + " " + std::to_string(rank) +
                      " is outside the group [0, " + std::to_string(size) + "); pass a rank of this communicator");
}

template <class T>
void threads_all_reduce(thread_group& g, int r, std::span<T> x, reduce_op op) {
  g.world().check("comm::threads::all_reduce");
  const int n = g.size();
  if (n == 1) return;  // x op nothing = x; avg divides by 1 exactly
  publish<T>(g, r, coll_kind::all_reduce, x.size(), op, 0, x.data(), x.data());
  g.arrive_and_wait(r);
  verify_same_call(g, r);
  const auto [lo, hi] = partition<T>(x.size(), n, r);
  if (lo < hi) {
    std::vector<T*> ptrs(static_cast<std::size_t>(n));
    for (int j = 0; j < n; ++j) ptrs[static_cast<std::size_t>(j)] = static_cast<T*>(g.at(j).out) + lo;
    reduce_into<T>(ptrs.data(), n, ptrs.data(), n, hi - lo, op, n);
  }
  g.arrive_and_wait(r);
}

template <class T>
void threads_reduce_scatter(thread_group& g, int r, const T* in, std::span<T> out, reduce_op op) {
  g.world().check("comm::threads::reduce_scatter");
  const int n = g.size();
  const std::size_t m = out.size();
  if (n == 1) {
    if (m && in != out.data()) std::memmove(out.data(), in, m * sizeof(T));
    return;
  }
  publish<T>(g, r, coll_kind::reduce_scatter, m, op, 0, in, out.data());
  g.arrive_and_wait(r);
  verify_same_call(g, r);
  if (m) {
    std::vector<const T*> srcs(static_cast<std::size_t>(n));
    const std::size_t offset = static_cast<std::size_t>(r) * m;
    for (int j = 0; j < n; ++j) srcs[static_cast<std::size_t>(j)] = static_cast<const T*>(g.at(j).in) + offset;
    T* dst = out.data();
    reduce_into<T>(srcs.data(), n, &dst, 1, m, op, n);
  }
  g.arrive_and_wait(r);
}

template <class T>
void threads_all_gather(thread_group& g, int r, const T* in, std::span<T> out) {
  g.world().check("comm::threads::all_gather");
  const int n = g.size();
  const std::size_t m = out.size() / static_cast<std::size_t>(n);
  if (n == 1) {
    if (m && in != out.data()) std::memmove(out.data(), in, m * sizeof(T));
    return;
  }
  publish<T>(g, r, coll_kind::all_gather, m, reduce_op::sum, 0, in, out.data());
  g.arrive_and_wait(r);
  verify_same_call(g, r);
  if (m)
    for (int j = 0; j < n; ++j) {
      T* dst = out.data() + static_cast<std::size_t>(j) * m;
      const T* src = static_cast<const T*>(g.at(j).in);
      if (dst != src) std::memcpy(dst, src, m * sizeof(T));  // in may alias out[r*m, (r+1)*m)
    }
  g.arrive_and_wait(r);
}

template <class T>
void threads_broadcast(thread_group& g, int r, std::span<T> x, int root) {
  g.world().check("comm::threads::broadcast");
  if (g.size() == 1) return;
  publish<T>(g, r, coll_kind::broadcast, x.size(), reduce_op::sum, root, x.data(), x.data());
  g.arrive_and_wait(r);
  verify_same_call(g, r);
  if (r != root && !x.empty()) std::memcpy(x.data(), g.at(root).in, x.size_bytes());
  g.arrive_and_wait(r);
}

inline void threads_barrier(thread_group& g, int r) {
  g.world().check("comm::threads::barrier");
  if (g.size() == 1) return;
  publish<std::byte>(g, r, coll_kind::barrier, 0, reduce_op::sum, 0, nullptr, nullptr);
  g.arrive_and_wait(r);
  verify_same_call(g, r);
  g.arrive_and_wait(r);
}

/// Returns {new group, new rank}.
inline std::pair<std::shared_ptr<thread_group>, int> threads_split(thread_group& g, int r, int color, int key,
                                                                   std::string name) {
  g.world().check("comm::threads::split");
  publish<std::byte>(g, r, coll_kind::split, 0, reduce_op::sum, 0, nullptr, nullptr);
  g.at(r).color = color;
  g.at(r).key = key;
  g.arrive_and_wait(r);
  verify_same_call(g, r);
  std::vector<int> members;  // old ranks with my color, ordered by (key, old rank)
  for (int j = 0; j < g.size(); ++j)
    if (g.at(j).color == color) members.push_back(j);
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return g.at(a).key < g.at(b).key; });
  const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());
  const int leader = members.front();
  if (r == leader) g.at(r).created = std::make_shared<thread_group>(static_cast<int>(members.size()), name, g.world_ptr());
  g.arrive_and_wait(r);
  auto created = g.at(leader).created;
  g.arrive_and_wait(r);
  if (r == leader) g.at(r).created.reset();
  return {std::move(created), new_rank};
}

}  // namespace loom::parallel::detail

namespace loom::parallel::comm {

class threads_communicator;
template <class F>
void run_threads(int world_size, F&& f, comm_options options = {});

/// One rank of a comm::threads group. Created by run_threads (the world) and split(); move-only;
/// used by one thread at a time. Models loom::parallel::communicator. Destroying it finishes its
/// pending asynchronous operations first.
class threads_communicator {
 public:
  threads_communicator(threads_communicator&& other) noexcept = default;
  threads_communicator& operator=(threads_communicator&& other) noexcept {
    if (this != &other) {
      release();
      group_ = std::move(other.group_);
      rank_ = other.rank_;
      progress_ = std::move(other.progress_);
      observer_ = other.observer_;
    }
    return *this;
  }
  ~threads_communicator() { release(); }

  /// This rank, in [0, size()).
  int rank() const noexcept { return rank_; }
  /// Number of ranks in the group.
  int size() const noexcept { return group_->size(); }
  /// "world" for run_threads' communicator; split() children get the name passed to split().
  const std::string& name() const noexcept { return group_->name(); }
  const comm_options& options() const noexcept { return group_->world().options; }
  /// Attaches an observer of this rank's operations on this communicator (null = none, the
  /// default); split() children inherit it. See comm_observer for why it is per communicator.
  void set_observer(comm_observer* o) noexcept { observer_ = o; }
  comm_observer* observer() const noexcept { return observer_; }

  /// x = op over ranks of x, in place; x.size() equal on every rank (may be 0).
  /// Sum order is rank 0..n-1; 16-bit types accumulate in fp32 and round once; avg divides once.
  /// Throws input_error (avg on integers, mismatched calls), comm_aborted, comm_timeout.
  template <reducible T>
  void all_reduce(std::span<T> x, reduce_op op = reduce_op::sum) {
    detail::check_op<T>(op, "comm::threads::all_reduce");
    const comm_scope obs(observer_, event("all_reduce", x.size_bytes()));
    drain();
    detail::threads_all_reduce(*group_, rank_, x, op);
  }

  /// Rank r: out = op over ranks of in[r*m, (r+1)*m), m = out.size(); in.size() == size()*m.
  /// out may be that chunk of in (in place). Same errors as all_reduce; input_error on bad sizes.
  template <class In, reducible T>
    requires std::same_as<std::remove_const_t<In>, T>
  void reduce_scatter(std::span<In> in, std::span<T> out, reduce_op op = reduce_op::sum) {
    check_scatter(in.size(), out.size(), "reduce_scatter");
    detail::check_op<T>(op, "comm::threads::reduce_scatter");
    const comm_scope obs(observer_, event("reduce_scatter", in.size_bytes()));
    drain();
    detail::threads_reduce_scatter<T>(*group_, rank_, in.data(), out, op);
  }

  /// out[j*m, (j+1)*m) = in of rank j, m = in.size(); out.size() == size()*m. in may be the
  /// rank's own chunk of out (in place). Throws input_error on bad sizes, comm_aborted, comm_timeout.
  template <class In, transferable T>
    requires std::same_as<std::remove_const_t<In>, T>
  void all_gather(std::span<In> in, std::span<T> out) {
    check_scatter(out.size(), in.size(), "all_gather");
    const comm_scope obs(observer_, event("all_gather", out.size_bytes()));
    drain();
    detail::threads_all_gather<T>(*group_, rank_, in.data(), out);
  }

  /// x = x of rank `root` on every rank. Throws input_error for a root outside [0, size()).
  template <transferable T>
  void broadcast(std::span<T> x, int root) {
    detail::check_rank(root, size(), "broadcast", "root");
    const comm_scope obs(observer_, event("broadcast", x.size_bytes(), root));
    drain();
    detail::threads_broadcast<T>(*group_, rank_, x, root);
  }

  /// Sends in to rank dst with tag (>= 0). Eager: copies the payload and returns at once.
  template <class In>
    requires transferable<std::remove_const_t<In>>
  void send(std::span<In> in, int dst, int tag) {
    using T = std::remove_const_t<In>;
    detail::check_rank(dst, size(), "send", "destination");
    check_tag(tag, "send");
    const comm_scope obs(observer_, event("send", in.size_bytes(), dst));
    group_->world().check("comm::threads::send");
    detail::message m{rank_, tag, detail::dtype_name<T>(), sizeof(T), in.size(), nullptr};
    if (!in.empty()) {
      m.payload.reset(new std::byte[in.size_bytes()]);
      std::memcpy(m.payload.get(), in.data(), in.size_bytes());
    }
    group_->post(dst, std::move(m));
  }

  /// Receives into x the oldest message from rank src with tag. The message must have exactly
  /// x.size() elements of type T (input_error otherwise). Blocks; comm_aborted, comm_timeout.
  template <transferable T>
  void recv(std::span<T> x, int src, int tag) {
    detail::check_rank(src, size(), "recv", "source");
    check_tag(tag, "recv");
    const comm_scope obs(observer_, event("recv", x.size_bytes(), src));
    const auto what = [&] {
      return "comm::threads::recv(" + std::string(detail::dtype_name<T>()) + " x " + std::to_string(x.size()) +
             " from rank " + std::to_string(src) + ", tag " + std::to_string(tag) + ") on rank " +
             std::to_string(rank_);
    };
    detail::message m = group_->take(rank_, src, tag, what());
    if (m.elem_size * m.count != x.size_bytes() || std::strcmp(m.dtype, detail::dtype_name<T>()) != 0)
      throw input_error(what() + ": the message holds " + m.dtype + " x " + std::to_string(m.count) +
                        "; send and recv must agree on element type and count");
    if (!x.empty()) std::memcpy(x.data(), m.payload.get(), x.size_bytes());
  }

  /// Returns once every rank of the group has entered barrier().
  void barrier() {
    const comm_scope obs(observer_, event("barrier", 0));
    drain();
    detail::threads_barrier(*group_, rank_);
  }

  /// MPI_Comm_split: ranks passing the same color (>= 0) form a new group, ranked by key, then by
  /// rank in this group. Collective over this group. The new group shares this world's abort flag
  /// and options; its name is `name`, or "<this name>/<color>" when empty.
  threads_communicator split(int color, int key, std::string name = {}) {
    if (color < 0)
      throw input_error("comm::threads::split: color " + std::to_string(color) +
                        " is negative; every rank must pass a color >= 0 (MPI_UNDEFINED is not supported)");
    drain();
    if (name.empty()) name = group_->name() + "/" + std::to_string(color);
    auto [g, r] = detail::threads_split(*group_, rank_, color, key, std::move(name));
    threads_communicator child(std::move(g), r);
    child.observer_ = observer_;
    return child;
  }

  /// all_reduce on the progress thread; x must stay untouched until the request completes.
  template <reducible T>
  request all_reduce_async(std::span<T> x, reduce_op op = reduce_op::sum) {
    detail::check_op<T>(op, "comm::threads::all_reduce_async");
    return post([g = group_, r = rank_, x, op] { detail::threads_all_reduce(*g, r, x, op); }, "all_reduce_async",
                "all_reduce_wait", x.size_bytes());
  }

  /// reduce_scatter on the progress thread; in and out untouched until the request completes.
  template <class In, reducible T>
    requires std::same_as<std::remove_const_t<In>, T>
  request reduce_scatter_async(std::span<In> in, std::span<T> out, reduce_op op = reduce_op::sum) {
    check_scatter(in.size(), out.size(), "reduce_scatter_async");
    detail::check_op<T>(op, "comm::threads::reduce_scatter_async");
    const T* p = in.data();
    return post([g = group_, r = rank_, p, out, op] { detail::threads_reduce_scatter<T>(*g, r, p, out, op); },
                "reduce_scatter_async", "reduce_scatter_wait", in.size_bytes());
  }

  /// all_gather on the progress thread; in and out untouched until the request completes.
  template <class In, transferable T>
    requires std::same_as<std::remove_const_t<In>, T>
  request all_gather_async(std::span<In> in, std::span<T> out) {
    check_scatter(out.size(), in.size(), "all_gather_async");
    const T* p = in.data();
    return post([g = group_, r = rank_, p, out] { detail::threads_all_gather<T>(*g, r, p, out); },
                "all_gather_async", "all_gather_wait", out.size_bytes());
  }

 private:
  template <class F>
  friend void run_threads(int, F&&, comm_options);

  threads_communicator(std::shared_ptr<detail::thread_group> g, int rank) : group_(std::move(g)), rank_(rank) {}

  void check_scatter(std::size_t whole, std::size_t part, const char* api) const {
    if (whole != static_cast<std::size_t>(size()) * part)
      throw input_error(std::string("comm::threads::") + api + ": the full buffer has " + std::to_string(whole) +
                        " elements but size() * chunk = " + std::to_string(size()) + " * " + std::to_string(part) +
                        "; the full buffer must hold exactly one chunk per rank");
  }
  static void check_tag(int tag, const char* api) {
    if (tag < 0)
      throw input_error(std::string("comm::threads::") + api + ": tag " + std::to_string(tag) +
                        " is negative; use a tag >= 0");
  }

  void drain() {
    if (progress_) progress_->drain();
  }

  comm_event event(const char* op, std::size_t bytes, int peer = -1) const noexcept {
    return {op, bytes, size(), name(), peer};
  }

  /// `what` is "<collective>_async": the observer sees the start as `what` and the request's
  /// wait as `wait_op` ("<collective>_wait").
  request post(std::function<void()> fn, const char* what, const char* wait_op, std::size_t bytes) {
    const comm_scope obs(observer_, event(what, bytes));
    group_->world().check(std::string("comm::threads::") + what);
    if (!progress_) progress_ = std::make_unique<detail::progress_thread>();
    auto task = std::make_shared<detail::thread_task>(
        std::move(fn), group_->world_ptr(),
        std::string("comm::threads::") + what + " on group '" + group_->name() + "' rank " + std::to_string(rank_));
    progress_->post(task);
    request r(std::make_unique<detail::thread_request>(std::move(task)));
    if (observer_) return parallel::detail::observe_wait(std::move(r), observer_, event(wait_op, bytes));
    return r;
  }

  void release() noexcept {
    if (!progress_) return;
    if (std::uncaught_exceptions() > 0 && progress_->outstanding() > 0)
      group_->world().abort("rank " + std::to_string(rank_) + " of group '" + group_->name() +
                            "' left with asynchronous operations pending (an exception is propagating)");
    progress_.reset();  // runs what is left (released by the abort if peers are gone), then joins
  }

  std::shared_ptr<detail::thread_group> group_;
  int rank_ = 0;
  std::unique_ptr<detail::progress_thread> progress_;
  comm_observer* observer_ = nullptr;
};

/// comm::threads — the name used in DESIGN §4.
using threads = threads_communicator;

/// Runs f(threads_communicator&) on world_size ranks (rank 0 on the calling thread, the others on
/// new threads) sharing one world group named "world", and returns when all have returned. f is
/// invoked concurrently from all ranks, so it must be safe to call that way (capture by reference
/// what is shared read-only, write only per-rank state).
/// Errors: input_error if world_size < 1. If any rank throws, the world is aborted (blocked peers
/// throw comm_aborted) and, after every rank has finished, the first exception is rethrown —
/// preferring an original failure over the comm_aborted errors it caused in other ranks.
template <class F>
void run_threads(int world_size, F&& f, comm_options options) {
  if (world_size < 1)
    throw input_error("comm::run_threads: world_size " + std::to_string(world_size) + " must be at least 1");
  auto world = std::make_shared<detail::thread_world>(options);
  auto group = std::make_shared<detail::thread_group>(world_size, "world", world);
  std::mutex mutex;
  std::exception_ptr first_original, first_any;

  auto body = [&](int rank) noexcept {
    try {
      threads_communicator c(group, rank);
      std::invoke(f, c);
    } catch (...) {
      auto err = std::current_exception();
      std::string what = "unknown exception";
      bool aborted = false;
      try {
        throw;
      } catch (const comm_aborted& e) {
        aborted = true;
        what = e.what();
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      {
        std::lock_guard lock(mutex);
        if (!first_any) first_any = err;
        if (!aborted && !first_original) first_original = err;
      }
      world->abort("rank " + std::to_string(rank) + " threw: " + what);
    }
  };

  std::vector<std::thread> workers;
  workers.reserve(static_cast<std::size_t>(world_size - 1));
  try {
    for (int r = 1; r < world_size; ++r) workers.emplace_back(body, r);
  } catch (...) {  // could not start a thread: release those that did start, then report
    world->abort("comm::run_threads could not start all threads");
    for (auto& t : workers) t.join();
    throw;
  }
  body(0);
  for (auto& t : workers) t.join();
  if (first_original) std::rethrow_exception(first_original);
  if (first_any) std::rethrow_exception(first_any);
}

static_assert(communicator<threads_communicator>);

}  // namespace loom::parallel::comm
