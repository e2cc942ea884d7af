#pragma once
/// \file Private: shared state of a comm::threads group — the per-rank slots through which ranks
/// publish their buffers, a reusable barrier with abort and timeout, and point-to-point mailboxes.
///
/// Note [threads barrier]. A barrier is a counter of arrivals plus a generation number. The last
/// rank to arrive resets the counter and bumps the generation (seq_cst); the others wait for the
/// generation to change: first spinning for a few microseconds (only while the group has no more
/// ranks than hardware threads), then yielding, then sleeping on a condition variable in slices of at most 20 ms so
/// that an abort of the world or the timeout is noticed. Before sleeping a waiter registers in
/// `sleepers_` under the mutex and re-checks the generation; the releaser reads `sleepers_` after
/// bumping the generation and only then takes the mutex to notify (Dekker-style, both seq_cst), so
/// no wake-up is lost and the fast path takes no lock. Arrival and release are acq_rel/seq_cst
/// read-modify-writes, so everything a rank wrote before arriving is visible to every rank after
/// the barrier: that is what lets ranks read and write each other's buffers between barriers.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/parallel/comm.hpp>

namespace loom::parallel::detail {

/// State shared by every group derived (by split) from one run_threads world: the abort flag and
/// its reason, and the options.
struct thread_world {
  explicit thread_world(comm_options o) : options(o) {}

  comm_options options;
  std::atomic<bool> aborted{false};

  /// Marks the world aborted (first reason wins). Every blocked operation of every group of the
  /// world throws comm_aborted within one wait slice; every later operation throws at entry.
  void abort(const std::string& why) noexcept {
    std::lock_guard lock(mutex_);
    if (!aborted.load()) {
      try {
        reason_ = why;
      } catch (...) {
      }
      aborted.store(true);
    }
  }
  std::string reason() const {
    std::lock_guard lock(mutex_);
    return reason_;
  }
  [[noreturn]] void throw_aborted(std::string_view where) const {
    throw comm_aborted(std::string(where) + ": aborted because another rank failed: " + reason());
  }
  void check(std::string_view where) const {
    if (aborted.load(std::memory_order_acquire)) [[unlikely]]
      throw_aborted(where);
  }

 private:
  mutable std::mutex mutex_;
  std::string reason_;
};

class thread_group;

/// What kind of collective a rank posted; ranks compare slots to catch mismatched calls.
enum class coll_kind : std::uint8_t { none, all_reduce, reduce_scatter, all_gather, broadcast, barrier, split };

inline const char* to_cstr(coll_kind k) noexcept {
  switch (k) {
    case coll_kind::none: return "none";
    case coll_kind::all_reduce: return "all_reduce";
    case coll_kind::reduce_scatter: return "reduce_scatter";
    case coll_kind::all_gather: return "all_gather";
    case coll_kind::broadcast: return "broadcast";
    case coll_kind::barrier: return "barrier";
    case coll_kind::split: return "split";
  }
  return "?";
}

/// What one rank publishes for the collective in progress. Written by its owner before the first
/// barrier of a collective, read by everyone until the last barrier.
struct alignas(64) slot {
  coll_kind kind = coll_kind::none;
  reduce_op op = reduce_op::sum;
  std::size_t elem_size = 0;
  const char* dtype = "";  // static string from dtype_name<T>()
  std::size_t count = 0;   // elements: all_reduce/broadcast: x, reduce_scatter: out, all_gather: in
  int root = 0;
  const void* in = nullptr;
  void* out = nullptr;
  int color = 0, key = 0;
  std::shared_ptr<thread_group> created;  // split: the new group, published by its leader

  bool same_call(const slot& o) const noexcept {
    return kind == o.kind && op == o.op && elem_size == o.elem_size && std::strcmp(dtype, o.dtype) == 0 &&
           count == o.count && root == o.root;
  }
  std::string describe() const {
    if (kind == coll_kind::barrier) return "barrier()";
    if (kind == coll_kind::split)
      return "split(color " + std::to_string(color) + ", key " + std::to_string(key) + ")";
    std::string s = std::string(to_cstr(kind)) + "(" + dtype;
    if (std::strcmp(dtype, "raw") == 0) s += std::to_string(elem_size) + "B";
    s += " x " + std::to_string(count);
    if (kind == coll_kind::all_reduce || kind == coll_kind::reduce_scatter)
      s += ", " + std::string(to_string(op));
    if (kind == coll_kind::broadcast) s += ", root " + std::to_string(root);
    return s + ")";
  }
};

/// A point-to-point message in flight (send is eager: the payload is copied into the mailbox).
struct message {
  int src = 0, tag = 0;
  const char* dtype = "";
  std::size_t elem_size = 0, count = 0;
  std::unique_ptr<std::byte[]> payload;  // elem_size*count bytes, not zero-initialised
};

struct mailbox {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<message> queue;
};

/// The shared state of one group of `size` ranks.
class thread_group {
 public:
  thread_group(int size, std::string name, std::shared_ptr<thread_world> world)
      : size_(size), name_(std::move(name)), world_(std::move(world)), slots_(static_cast<std::size_t>(size)),
        entered_(static_cast<std::size_t>(size)), mail_(static_cast<std::size_t>(size)) {
    for (auto& e : entered_) e.value.store(0);
    for (auto& m : mail_) m = std::make_unique<mailbox>();
    spin_ = size_ <= static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }

  int size() const noexcept { return size_; }
  const std::string& name() const noexcept { return name_; }
  thread_world& world() noexcept { return *world_; }
  const std::shared_ptr<thread_world>& world_ptr() const noexcept { return world_; }
  slot& at(int rank) noexcept { return slots_[static_cast<std::size_t>(rank)]; }

  /// Blocks until all ranks of the group have called arrive_and_wait the same number of times.
  /// The rank's slot describes the operation in error messages. Throws comm_aborted/comm_timeout.
  void arrive_and_wait(int rank) {
    const std::uint64_t my_count = entered_[static_cast<std::size_t>(rank)].value.fetch_add(1) + 1;
    const std::uint64_t gen = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<std::uint64_t>(size_)) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.store(gen + 1);  // seq_cst, pairs with the sleepers_ check below
      if (sleepers_.load() > 0) {
        { std::lock_guard lock(mutex_); }
        cv_.notify_all();
      }
      return;
    }
    // Spin ~5 us (a pause costs ~40 ns on Zen), then yield, which hands the core to a peer that
    // shares it (oversubscription: spinning longer only delays the peer), then sleep.
    if (spin_)
      for (int i = 0; i < 128; ++i) {
        if (generation_.load(std::memory_order_acquire) != gen) return;
        pause();
      }
    for (int i = 0; i < 128; ++i) {
      if (generation_.load(std::memory_order_acquire) != gen) return;
      std::this_thread::yield();
    }
    wait_generation(gen, rank, my_count);
  }

  /// Eager send: copies the payload into dst's mailbox and returns.
  void post(int dst, message m) {
    auto& box = *mail_[static_cast<std::size_t>(dst)];
    {
      std::lock_guard lock(box.mutex);
      box.queue.push_back(std::move(m));
    }
    box.cv.notify_all();
  }

  /// Blocks until a message from `src` with `tag` is in `rank`'s mailbox, removes and returns the
  /// oldest such message. Throws comm_aborted / comm_timeout.
  message take(int rank, int src, int tag, const std::string& what) {
    auto& box = *mail_[static_cast<std::size_t>(rank)];
    const auto timeout = world_->options.timeout;
    const auto start = std::chrono::steady_clock::now();
    std::unique_lock lock(box.mutex);
    for (;;) {
      for (auto it = box.queue.begin(); it != box.queue.end(); ++it)
        if (it->src == src && it->tag == tag) {
          message m = std::move(*it);
          box.queue.erase(it);
          return m;
        }
      world_->check(what);
      const auto waited = std::chrono::steady_clock::now() - start;
      if (timeout.count() > 0 && waited >= timeout) {
        lock.unlock();
        const std::string msg = what + " on group '" + name_ + "' (size " + std::to_string(size_) +
                                ") timed out after " + std::to_string(timeout.count()) + " ms: rank " +
                                std::to_string(src) + " did not send";
        world_->abort(msg);
        throw comm_timeout(msg);
      }
      box.cv.wait_for(lock, std::chrono::milliseconds(20));
    }
  }

 private:
  static void pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  void wait_generation(std::uint64_t gen, int rank, std::uint64_t my_count) {
    const auto timeout = world_->options.timeout;
    const auto start = std::chrono::steady_clock::now();
    std::unique_lock lock(mutex_);
    sleepers_.fetch_add(1);
    struct unregister {
      std::atomic<int>& n;
      ~unregister() { n.fetch_sub(1); }
    } guard{sleepers_};
    while (generation_.load() == gen) {
      if (world_->aborted.load()) {
        lock.unlock();
        world_->throw_aborted("comm::threads " + at(rank).describe() + " on group '" + name_ + "'");
      }
      const auto waited = std::chrono::steady_clock::now() - start;
      if (timeout.count() > 0 && waited >= timeout) {
        lock.unlock();
        const std::string msg = timeout_message(rank, my_count, timeout);
        world_->abort(msg);
        throw comm_timeout(msg);
      }
      cv_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }

  std::string timeout_message(int rank, std::uint64_t my_count, std::chrono::milliseconds timeout) const {
    std::string arrived, missing;
    for (int j = 0; j < size_; ++j) {
      auto& list = entered_[static_cast<std::size_t>(j)].value.load() >= my_count ? arrived : missing;
      if (!list.empty()) list += ',';
      list += std::to_string(j);
    }
    return "comm::threads " + slots_[static_cast<std::size_t>(rank)].describe() + " on group '" + name_ + "' (size " + std::to_string(size_) + ") timed out after " +
           std::to_string(timeout.count()) + " ms on rank " + std::to_string(rank) + ": arrived ranks {" +
           arrived + "}, missing ranks {" + missing + "}";
  }

  struct alignas(64) counter {
    std::atomic<std::uint64_t> value;
  };

  int size_;
  std::string name_;
  std::shared_ptr<thread_world> world_;
  std::vector<slot> slots_;
  std::vector<counter> entered_;  // barrier arrivals per rank, for the timeout message
  std::vector<std::unique_ptr<mailbox>> mail_;
  bool spin_ = true;

  alignas(64) std::atomic<std::uint64_t> arrived_{0};
  alignas(64) std::atomic<std::uint64_t> generation_{0};
  std::atomic<int> sleepers_{0};
  std::mutex mutex_;
  std::condition_variable cv_;
};

}  // namespace loom::parallel::detail
