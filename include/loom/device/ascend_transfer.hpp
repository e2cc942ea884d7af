#pragma once
/// \file loom::device::ascend_transfer_stream: copies in both directions between device memory
/// and pinned host memory on a stream of their own, with per-slot events the host waits on —
/// what optim::offload_adamw streams its chunks through (gradients device -> host, updated
/// parameters host -> device) while the host computes. Source: ZeRO-Offload (Ren et al.,
/// arXiv:2101.06840, §4.2: the CPU update overlapped with the transfers); aclrtMemcpyAsync,
/// aclrtRecordEvent, aclrtStreamWaitEvent, aclrtSynchronizeEvent (shared/reference/ascend-api.md §1).
#include <array>
#include <cstddef>
#include <memory>
#include <vector>

#include <loom/core/context.hpp>
#include <loom/device/ascend.hpp>

namespace loom::device {

/// A copy stream beside a context's compute stream, with `slots` host-waitable events. Usage,
/// one pass (optim::offload_adamw::update):
///   t.after_compute(ctx);                    // the copies start after the compute stream's work so far
///   t.to_host(h, d, n); t.record(k);         // device -> host into a pinned slot buffer
///   t.wait(k);                               // the host blocks until slot k's copies finished
///   t.to_device(d, h, n);                    // host -> device from a pinned buffer
///   t.before_compute(ctx);                   // the compute stream's next work waits for every copy
/// Overlapped with the compute stream's next work (optim::offload_adamw's overlapped update, which
/// drives the copies from a host thread of its own):
///   auto bound = t.bind_thread();            // on that thread: the NPU current, loom's binding made
///   t.mark(k);                               // after the copies so far (0 <= k < marks)
///   t.compute_waits(ctx, k);                 // ctx.stream's next work waits for mark k's last record
///   t.zero(d, n);                            // device memory zeroed on the transfer stream
/// A stream wait refers to the last record made before it (aclrtStreamWaitEvent): the caller
/// orders mark(k) before compute_waits(ctx, k) on the host.
/// Copies on the stream run in order. A host side that is not pinned (ascend::allocate_host) or
/// an address not 64-byte aligned cannot be copied asynchronously: such a copy synchronizes the
/// transfer stream and runs synchronously (correct, slow). Create it on the thread that holds
/// ctx's NPU; ctx's runtime must outlive it. Destruction synchronizes the stream; never throws.
/// Throws device_error from the ACL calls.
class ascend_transfer_stream {
 public:
  static constexpr int slots = 2;  ///< events the host can wait on separately (double buffering)

  /// A transfer stream beside ctx's compute stream with `marks` events for mark() (none by
  /// default). Throws device_error from the ACL calls.
  explicit ascend_transfer_stream(const loom::context<ascend>& ctx, int marks = 0)
      : runtime_(ctx.runtime), ordinal_(ctx.ordinal), stream_(*runtime_), start_(*runtime_), done_(*runtime_),
        slot_{ascend_event(*runtime_), ascend_event(*runtime_)} {
    for (int k = 0; k < marks; ++k) marks_.push_back(std::make_unique<ascend_event>(*runtime_));
  }
  ~ascend_transfer_stream() {
    const auto& api = runtime_->api();
    detail::acl_warn(api, api.aclrtSynchronizeStream(stream_.get()), "aclrtSynchronizeStream");
  }
  ascend_transfer_stream(const ascend_transfer_stream&) = delete;
  ascend_transfer_stream& operator=(const ascend_transfer_stream&) = delete;

  /// Copies enqueued from now on start after the work enqueued so far on ctx.stream.
  void after_compute(loom::context<ascend>& ctx) {
    start_.record(ctx.stream);
    start_.wait(stream_.get());
  }
  /// `bytes` from device `src` to pinned host `dst`, on the transfer stream.
  void to_host(void* dst, const void* src, std::size_t bytes) { copy(dst, src, bytes, acl::memcpy_device_to_host, dst); }
  /// `bytes` from pinned host `src` to device `dst`, on the transfer stream; `src` must stay
  /// unchanged until the copy finished (a later wait() on a slot recorded after it).
  void to_device(void* dst, const void* src, std::size_t bytes) { copy(dst, src, bytes, acl::memcpy_host_to_device, src); }
  /// Marks slot k (0 <= k < slots) after the copies enqueued so far.
  void record(int k) { slot_[std::size_t(k)].record(stream_.get()); }
  /// Blocks the host until slot k's mark is reached (aclrtSynchronizeEvent).
  void wait(int k) const { slot_[std::size_t(k)].synchronize(); }
  /// Work enqueued on ctx.stream from now on waits (on the device) for every copy enqueued so far.
  void before_compute(loom::context<ascend>& ctx) {
    done_.record(stream_.get());
    done_.wait(ctx.stream);
  }
  /// Zeroes `bytes` of device memory at `dst`, on the transfer stream (aclrtMemsetAsync).
  void zero(void* dst, std::size_t bytes) {
    if (!bytes) return;
    const auto& api = runtime_->api();
    detail::acl_check(api, api.aclrtMemsetAsync(dst, bytes, 0, bytes, stream_.get()), "aclrtMemsetAsync");
  }
  /// Records mark k (0 <= k < the constructor's `marks`) after the work enqueued so far.
  void mark(int k) { marks_[std::size_t(k)]->record(stream_.get()); }
  /// Work enqueued on ctx.stream from now on waits (on the device) for mark k's last record.
  void compute_waits(loom::context<ascend>& ctx, int k) const { marks_[std::size_t(k)]->wait(ctx.stream); }
  /// Makes this stream's NPU current on the calling thread (aclrtSetDevice) and binds the thread
  /// to its runtime, for the guard's lifetime: what a host thread other than the one that
  /// created the stream needs before it enqueues copies. Throws device_error.
  device_guard bind_thread() const { return device_guard(*runtime_, ordinal_); }
  /// Blocks the host until every copy enqueued so far has finished.
  void synchronize() const { stream_.synchronize(); }
  /// The transfer stream (for tests).
  acl::aclrtStream stream() const noexcept { return stream_.get(); }

 private:
  void copy(void* dst, const void* src, std::size_t bytes, acl::aclrtMemcpyKind kind, const void* host) {
    if (!bytes) return;
    const auto& api = runtime_->api();
    if (ascend::is_pinned(host, bytes) && detail::aligned64(dst) && detail::aligned64(src)) {
      detail::acl_check(api, api.aclrtMemcpyAsync(dst, bytes, src, bytes, kind, stream_.get()), "aclrtMemcpyAsync");
      return;
    }
    stream_.synchronize();  // the synchronous copy is not ordered with the stream: drain it first
    detail::acl_check(api, api.aclrtMemcpy(dst, bytes, src, bytes, kind), "aclrtMemcpy");
  }

  std::shared_ptr<const ascend_runtime> runtime_;
  int ordinal_;
  ascend_stream stream_;
  ascend_event start_, done_;
  std::array<ascend_event, slots> slot_;
  std::vector<std::unique_ptr<ascend_event>> marks_;
};

}  // namespace loom::device
