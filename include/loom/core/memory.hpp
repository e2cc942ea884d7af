#pragma once
/// \file Where the bytes go: a byte counter with a high-water mark, allocation through a device
/// policy that feeds it, and the operating system's view of the process (resident set size).
///
/// Three pieces, all explicit objects (no global mutable state, STYLE §3.9):
///   * memory_counter            bytes live per memory_kind and in total, with high-water marks;
///                               thread-safe (atomics), cheap enough to update on every allocation.
///   * tracked_allocator<D>      D::allocate / D::deallocate that report to a counter.
///   * tracked_buffer<D, T>      an owning, zero-filled buffer (like loom::buffer) that reports
///                               its bytes to a counter for its whole lifetime.
///   * read_process_memory()     VmRSS and VmHWM from /proc/self/status (Linux).
///
/// Why not a `tracked<D>` device-policy adaptor: a device policy is a stateless type with static
/// members, so an adaptor could only count into a static (global) counter — which is exactly the
/// global mutable state the design forbids, and would mix the counts of two trainers (or two
/// thread-ranks) in one process. The counter is therefore an object passed to whoever allocates.
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>

#include <loom/core/view.hpp>
#include <loom/core/device.hpp>

namespace loom {

/// What an allocation holds; the categories of Megatron's memory estimate plus two catch-alls.
///   parameters   model weights in storage precision
///   gradients    the flat gradient buffer (and its all-reduce buckets if separate)
///   optimizer    AdamW moments and fp32 master weights (ZeRO-1 shards count per rank)
///   activations  tensors saved by forward for backward, and forward scratch
///   workspace    kernel workspaces, communication staging, pinned loader buffers
///   other        anything else
enum class memory_kind : std::uint8_t { parameters, gradients, optimizer, activations, workspace, other };
inline constexpr std::size_t memory_kind_count = 6;

/// Short lower-case name of a memory kind ("parameters", ...), used as a metric tag.
constexpr std::string_view memory_kind_name(memory_kind k) noexcept {
  constexpr std::array<std::string_view, memory_kind_count> names{
      "parameters", "gradients", "optimizer", "activations", "workspace", "other"};
  return names[static_cast<std::size_t>(k)];
}

/// A plain copy of a memory_counter's state at one moment (bytes).
struct memory_snapshot {
  std::array<std::size_t, memory_kind_count> current{};  ///< live bytes per kind
  std::array<std::size_t, memory_kind_count> peak{};     ///< high-water mark per kind
  std::size_t total = 0;                                 ///< live bytes, all kinds
  std::size_t total_peak = 0;                            ///< high-water mark of `total`
  std::size_t live_allocations = 0;                      ///< allocations not yet released
  std::size_t operator[](memory_kind k) const noexcept { return current[static_cast<std::size_t>(k)]; }
};

/// Counts bytes allocated and released, per memory_kind and in total, and keeps high-water marks.
///
/// Thread-safe: every member may be called concurrently (relaxed atomics; the peak is updated
/// with a compare-exchange loop, so it is exact: it never misses a maximum that a sequence of
/// add/remove calls reached). Non-copyable, non-movable: allocators hold a reference to it.
/// Invariant kept by callers: remove(k, n) only for bytes previously add(k, n)-ed.
class memory_counter {
 public:
  memory_counter() = default;
  memory_counter(const memory_counter&) = delete;
  memory_counter& operator=(const memory_counter&) = delete;

  /// Records `bytes` newly allocated as kind `k`; raises the high-water marks if exceeded.
  void add(memory_kind k, std::size_t bytes) noexcept {
    const auto i = static_cast<std::size_t>(k);
    raise(peak_[i], current_[i].fetch_add(bytes, std::memory_order_relaxed) + bytes);
    raise(total_peak_, total_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
    live_.fetch_add(1, std::memory_order_relaxed);
  }
  /// Records `bytes` of kind `k` released.
  void remove(memory_kind k, std::size_t bytes) noexcept {
    current_[static_cast<std::size_t>(k)].fetch_sub(bytes, std::memory_order_relaxed);
    total_.fetch_sub(bytes, std::memory_order_relaxed);
    live_.fetch_sub(1, std::memory_order_relaxed);
  }

  std::size_t current() const noexcept { return total_.load(std::memory_order_relaxed); }
  std::size_t current(memory_kind k) const noexcept {
    return current_[static_cast<std::size_t>(k)].load(std::memory_order_relaxed);
  }
  /// High-water mark of the total (bytes) since construction or the last reset_peak().
  std::size_t peak() const noexcept { return total_peak_.load(std::memory_order_relaxed); }
  std::size_t peak(memory_kind k) const noexcept {
    return peak_[static_cast<std::size_t>(k)].load(std::memory_order_relaxed);
  }
  std::size_t live_allocations() const noexcept { return live_.load(std::memory_order_relaxed); }

  /// Lowers every high-water mark to the current value (e.g. after start-up, to watch one step).
  void reset_peak() noexcept {
    for (std::size_t i = 0; i < memory_kind_count; ++i)
      peak_[i].store(current_[i].load(std::memory_order_relaxed), std::memory_order_relaxed);
    total_peak_.store(total_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }

  memory_snapshot snapshot() const noexcept {
    memory_snapshot s;
    for (std::size_t i = 0; i < memory_kind_count; ++i) {
      s.current[i] = current_[i].load(std::memory_order_relaxed);
      s.peak[i] = peak_[i].load(std::memory_order_relaxed);
    }
    s.total = current();
    s.total_peak = peak();
    s.live_allocations = live_allocations();
    return s;
  }

 private:
  static void raise(std::atomic<std::size_t>& peak, std::size_t value) noexcept {
    std::size_t seen = peak.load(std::memory_order_relaxed);
    while (seen < value && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
    }
  }
  std::array<std::atomic<std::size_t>, memory_kind_count> current_{};
  std::array<std::atomic<std::size_t>, memory_kind_count> peak_{};
  std::atomic<std::size_t> total_{0}, total_peak_{0}, live_{0};
};

/// D's allocator, reporting every allocation of kind `kind` to `counter`.
///
/// Like std::allocator, deallocate needs the size that was allocated (D::deallocate does not;
/// the counter does). Copyable; copies report to the same counter. Throws what D::allocate
/// throws (std::bad_alloc on the CPU, loom::device_error on a device); the counter is updated
/// only after a successful allocation.
template <device::device_policy D>
class tracked_allocator {
 public:
  explicit tracked_allocator(memory_counter& counter, memory_kind kind = memory_kind::other) noexcept
      : counter_(&counter), kind_(kind) {}
  void* allocate(std::size_t bytes) {
    void* p = D::allocate(bytes);
    counter_->add(kind_, bytes);
    return p;
  }
  void deallocate(void* p, std::size_t bytes) noexcept {
    if (!p) return;
    D::deallocate(p);
    counter_->remove(kind_, bytes);
  }
  memory_counter& counter() const noexcept { return *counter_; }
  memory_kind kind() const noexcept { return kind_; }

 private:
  memory_counter* counter_;
  memory_kind kind_;
};

/// One owning allocation of `size` elements of T in D's memory, counted as `kind` in a
/// memory_counter from construction to destruction. Same contract as loom::buffer<D,T>:
/// move-only, zero-filled on construction (ordered on `stream`), views convert implicitly.
/// The counter must outlive the buffer.
template <device::device_policy D, class T>
class tracked_buffer {
 public:
  tracked_buffer() = default;
  tracked_buffer(std::size_t size, memory_counter& counter, memory_kind kind,
                 typename D::stream_type stream = {})
      : counter_(&counter), kind_(kind), size_(size) {
    if (size) {
      data_ = static_cast<T*>(tracked_allocator<D>(counter, kind).allocate(size * sizeof(T)));
      D::memset(data_, 0, size * sizeof(T), stream);
    }
  }
  tracked_buffer(tracked_buffer&& o) noexcept
      : counter_(o.counter_), kind_(o.kind_), data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  tracked_buffer& operator=(tracked_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      counter_ = o.counter_;
      kind_ = o.kind_;
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  tracked_buffer(const tracked_buffer&) = delete;
  tracked_buffer& operator=(const tracked_buffer&) = delete;
  ~tracked_buffer() { reset(); }

  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return size_ * sizeof(T); }
  memory_kind kind() const noexcept { return kind_; }
  view<D, T> all() const noexcept { return {data_, size_}; }
  operator view<D, T>() const noexcept { return all(); }
  operator view<D, const T>() const noexcept { return {data_, size_}; }
  T& operator[](std::size_t i) const noexcept requires device::host_accessible_v<D> { return data_[i]; }

 private:
  void reset() noexcept {
    if (data_) tracked_allocator<D>(*counter_, kind_).deallocate(data_, size_ * sizeof(T));
    data_ = nullptr;
    size_ = 0;
  }
  memory_counter* counter_ = nullptr;
  memory_kind kind_ = memory_kind::other;
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

/// The operating system's view of this process's memory, in bytes.
struct process_memory {
  std::size_t rss = 0;       ///< resident set size now (VmRSS)
  std::size_t peak_rss = 0;  ///< high-water mark of the resident set (VmHWM)
  bool available = false;    ///< false where /proc/self/status cannot be read (non-Linux)
};

/// Reads VmRSS and VmHWM from /proc/self/status (proc(5): values are in kB = 1024 bytes).
/// Cost: one small file read, about 10-30 us; call it at logging steps, not in inner loops.
/// Never throws: returns available = false when the file or the fields are missing.
inline process_memory read_process_memory() noexcept {
  process_memory m;
  try {
    std::ifstream in("/proc/self/status");
    std::string line;
    int found = 0;
    while (found < 2 && std::getline(in, line)) {
      auto parse_kb = [&](std::string_view key, std::size_t& out) {
        if (!line.starts_with(key)) return;
        out = std::stoull(line.substr(key.size())) * 1024;  // stoull skips the blanks
        ++found;
      };
      parse_kb("VmRSS:", m.rss);
      parse_kb("VmHWM:", m.peak_rss);
    }
    m.available = found == 2;
  } catch (...) {
    m = {};
  }
  return m;
}

}  // namespace loom
