#pragma once
/// \file caching_allocator<Backend>: a framework-style pool over an expensive device allocator.
///
/// The reference documents frequent aclrtMalloc/aclrtFree as a performance problem; torch_npu and
/// llama.cpp's ggml-cann keep freed blocks for reuse. This pool does the same, independent of any
/// vendor API (the Backend supplies raw allocation), so its logic is testable on the host:
///
///   size classes  requests are rounded up: to a multiple of 512 bytes up to 1 MiB, above that to a
///                 quarter of the enclosing power of two (1.25, 1.5, 1.75, 2 × 2^k), so a cached
///                 block wastes at most 25% of its size. A freed block is reused only by a request
///                 of the same class (no splitting: every block is one raw allocation, so each
///                 block start keeps the raw allocator's alignment — the reference requires 64-byte
///                 aligned starts for sub-allocated segments).
///   streams       a block remembers the stream key it was allocated for and is reused only for the
///                 same key. Work on one stream runs in order, so a block freed right after its last
///                 kernel was enqueued can be handed to the next kernel on that stream without a
///                 synchronize (llama.cpp's stream-ordered workspace pool). Using a block on another
///                 stream needs an event (the caller's job), exactly as with torch's record_stream.
///   out of memory the pool synchronizes the device (Backend::synchronize), returns every cached
///                 block to the device and retries once; if that fails it throws loom::device_error
///                 with Backend::out_of_memory_code and the memory_summary().
///   statistics    allocated / requested / reserved bytes, their peaks, block counts, cache hits,
///                 raw allocations and frees, OOM retries (the names of torch's memory_stats()).
///
/// Backend requirements (b a Backend):
///   b.raw_allocate(bytes) -> void*   nullptr when out of memory; throws on any other failure
///   b.raw_free(p) noexcept           returns a block to the device
///   b.synchronize()                  waits for all work that might still use cached blocks
///   Backend::out_of_memory_code      int, the code the OOM device_error carries
///   Backend::allocate_api            std::string_view, e.g. "aclrtMalloc"
/// Thread safe (one mutex). Never throws from deallocate or the destructor.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <loom/core/error.hpp>

namespace loom::device {

/// Counters of a caching_allocator. Bytes unless noted; "allocated" counts rounded block sizes.
struct allocator_stats {
  std::size_t allocated = 0;       ///< bytes in blocks currently handed out
  std::size_t requested = 0;       ///< bytes the callers asked for (allocated minus rounding)
  std::size_t reserved = 0;        ///< bytes held from the device: handed out + cached
  std::size_t peak_allocated = 0;  ///< high-water mark of allocated since construction/reset
  std::size_t peak_reserved = 0;   ///< high-water mark of reserved
  std::size_t active_blocks = 0;   ///< blocks handed out (count)
  std::size_t cached_blocks = 0;   ///< blocks kept for reuse (count)
  std::uint64_t allocations = 0;   ///< allocate() calls (count)
  std::uint64_t cache_hits = 0;    ///< allocate() calls served from the cache (count)
  std::uint64_t device_allocations = 0;  ///< raw allocations (count)
  std::uint64_t device_frees = 0;        ///< raw frees (count)
  std::uint64_t oom_retries = 0;         ///< times the cache was emptied to satisfy a request (count)
};

template <class Backend>
class caching_allocator {
 public:
  /// Identifies the stream a block is used on (an aclrtStream handle; nullptr = the default).
  using stream_key = const void*;
  static constexpr std::size_t small_limit = std::size_t(1) << 20;  ///< bytes; 512-byte classes below
  static constexpr std::size_t small_granularity = 512;             ///< bytes

  explicit caching_allocator(Backend backend, std::string name = "device")
      : backend_(std::move(backend)), name_(std::move(name)) {}
  caching_allocator(const caching_allocator&) = delete;
  caching_allocator& operator=(const caching_allocator&) = delete;
  /// Returns cached blocks to the device; blocks still handed out are left alone (leaked).
  ~caching_allocator() { release_cached(); }

  /// The size class of a request of `bytes` (see the file comment).
  static constexpr std::size_t round_size(std::size_t bytes) noexcept {
    if (bytes == 0) bytes = 1;
    if (bytes <= small_limit) return (bytes + small_granularity - 1) / small_granularity * small_granularity;
    const std::size_t step = std::bit_floor(bytes) / 4;
    return (bytes + step - 1) / step * step;
  }

  /// A block of at least `bytes` for use on `stream`. Throws loom::device_error when the device
  /// is out of memory even after emptying the cache, and whatever Backend::raw_allocate throws.
  void* allocate(std::size_t bytes, stream_key stream = nullptr) {
    const std::size_t size = round_size(bytes);
    std::unique_lock lock(mutex_);
    ++stats_.allocations;
    auto& list = free_[{stream, size}];
    void* p = nullptr;
    if (!list.empty()) {
      p = list.back();
      list.pop_back();
      --stats_.cached_blocks;
      ++stats_.cache_hits;
    } else {
      p = backend_.raw_allocate(size);
      if (!p) {  // out of memory: give the cache back to the device and try once more
        ++stats_.oom_retries;
        lock.unlock();
        backend_.synchronize();
        release_cached();
        lock.lock();
        p = backend_.raw_allocate(size);
        if (!p) {
          const std::string summary = summary_locked();
          throw device_error(Backend::out_of_memory_code, Backend::allocate_api,
                             "out of device memory on " + name_ + ": tried to allocate " + format_bytes(size) +
                                 " (" + std::to_string(bytes) + " bytes requested) after returning every cached "
                                 "block to the device\n" + summary);
        }
      }
      ++stats_.device_allocations;
      stats_.reserved += size;
      stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
    }
    blocks_[p] = block{size, bytes, stream};
    stats_.allocated += size;
    stats_.requested += bytes;
    ++stats_.active_blocks;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    return p;
  }

  /// Returns p to the cache of its size class and stream. False (and nothing done) when p was not
  /// allocated here. Never throws.
  bool try_deallocate(void* p) noexcept {
    if (!p) return true;
    std::lock_guard lock(mutex_);
    auto it = blocks_.find(p);
    if (it == blocks_.end()) return false;
    const block b = it->second;
    blocks_.erase(it);
    stats_.allocated -= b.size;
    stats_.requested -= b.requested;
    --stats_.active_blocks;
    try {
      free_[{b.stream, b.size}].push_back(p);
      ++stats_.cached_blocks;
    } catch (...) {  // no memory for the free list: give the block back to the device instead
      stats_.reserved -= b.size;
      ++stats_.device_frees;
      backend_.raw_free(p);
    }
    return true;
  }
  void deallocate(void* p) noexcept { (void)try_deallocate(p); }

  /// True when p is a block handed out by this pool.
  bool owns(const void* p) const {
    std::lock_guard lock(mutex_);
    return blocks_.count(const_cast<void*>(p)) != 0;
  }

  /// Bytes from p (anywhere inside a block handed out by this pool) to the end of what the caller
  /// requested for that block; 0 when p is in no such block. Lets a kernel bound a tensor whose
  /// extent its interface does not carry.
  std::size_t bytes_after(const void* p) const {
    std::lock_guard lock(mutex_);
    auto it = blocks_.upper_bound(const_cast<void*>(p));
    if (it == blocks_.begin()) return 0;
    --it;
    const auto off = std::size_t(static_cast<const char*>(p) - static_cast<const char*>(it->first));
    return off < it->second.requested ? it->second.requested - off : 0;
  }

  /// Synchronizes the device and returns every cached block to it (torch.npu.empty_cache()).
  void empty_cache() {
    backend_.synchronize();
    release_cached();
  }

  allocator_stats stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }
  /// Restarts the peak counters at the current values.
  void reset_peak_stats() {
    std::lock_guard lock(mutex_);
    stats_.peak_allocated = stats_.allocated;
    stats_.peak_reserved = stats_.reserved;
  }
  const std::string& name() const noexcept { return name_; }

  /// A human-readable table in the spirit of torch.npu.memory_summary().
  std::string memory_summary() const {
    std::lock_guard lock(mutex_);
    return summary_locked();
  }

  /// "1.50 MiB" style formatting (binary units).
  static std::string format_bytes(std::size_t bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = double(bytes);
    int u = 0;
    while (v >= 1024 && u < 4) {
      v /= 1024;
      ++u;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
    return buf;
  }

 private:
  struct block {
    std::size_t size;       // size class (bytes held)
    std::size_t requested;  // bytes asked for
    stream_key stream;
  };

  void release_cached() noexcept {
    std::vector<void*> victims;
    {
      std::lock_guard lock(mutex_);
      for (auto& [key, list] : free_) {
        for (void* p : list) {
          victims.push_back(p);
          stats_.reserved -= key.second;
          ++stats_.device_frees;
        }
        list.clear();
      }
      stats_.cached_blocks = 0;
    }
    for (void* p : victims) backend_.raw_free(p);
  }

  std::string summary_locked() const {
    const auto& s = stats_;
    auto row = [](std::string_view label, const std::string& cur, const std::string& peak) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "| %-26s | %14s | %14s |\n", std::string(label).c_str(), cur.c_str(), peak.c_str());
      return std::string(buf);
    };
    auto count = [](std::uint64_t n) { return std::to_string(n); };
    const std::string line = "|" + std::string(28, '-') + "|" + std::string(16, '-') + "|" + std::string(16, '-') + "|\n";
    std::string out = "|" + std::string(62, '=') + "|\n";
    char title[96];
    std::snprintf(title, sizeof title, "| %-60s |\n", ("loom caching allocator: " + name_).c_str());
    out += title;
    out += line + row("", "current", "peak") + line;
    out += row("Allocated memory", format_bytes(s.allocated), format_bytes(s.peak_allocated));
    out += row("Requested memory", format_bytes(s.requested), "");
    out += row("Reserved memory", format_bytes(s.reserved), format_bytes(s.peak_reserved));
    out += row("Cached (reusable) memory", format_bytes(s.reserved - s.allocated), "");
    out += line;
    out += row("Active blocks", count(s.active_blocks), "");
    out += row("Cached blocks", count(s.cached_blocks), "");
    out += row("Allocation calls", count(s.allocations), "");
    out += row("Served from cache", count(s.cache_hits), "");
    out += row("Device allocations", count(s.device_allocations), "");
    out += row("Device frees", count(s.device_frees), "");
    out += row("OOM retries (cache flushed)", count(s.oom_retries), "");
    out += "|" + std::string(62, '=') + "|\n";
    return out;
  }

  struct key_hash {
    std::size_t operator()(const std::pair<stream_key, std::size_t>& k) const noexcept {
      return std::hash<const void*>()(k.first) ^ (std::hash<std::size_t>()(k.second) * 0x9e3779b97f4a7c15ull);
    }
  };

  Backend backend_;
  std::string name_;
  mutable std::mutex mutex_;
  std::map<void*, block, std::less<>> blocks_;
  std::unordered_map<std::pair<stream_key, std::size_t>, std::vector<void*>, key_hash> free_;
  allocator_stats stats_;
};

}  // namespace loom::device
