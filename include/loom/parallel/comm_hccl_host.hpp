#pragma once
/// \file comm::hccl_host_world — a communicator on *host* memory whose every call travels over an
/// HCCL communicator: the host world of a rank-table launch, where a launcher starts one process
/// per NPU with the same RANK_TABLE_FILE and its own RANK_ID (MindSpore's and torch_npu's
/// rank-table scripts) and nothing but HCCL connects the processes (no MPI, no shared memory).
///
///   device::ascend_device dev(rt, table.device_of(rank));
///   auto hc = comm::hccl::create_from_rank_table(dev.context());           // HcclCommInitClusterInfo
///   parallel::any_communicator world = comm::hccl_host_world(std::move(hc), dev.context());
///   auto s = instance.make(args, train::world_ref::of(world));            // a host world like MPI's
///
/// Each call stages its host spans through NPU buffers, synchronously: copy in
/// (aclrtMemcpy host -> device on the context's stream), the HCCL call, copy out, synchronize.
/// Reductions gather every rank's data (HcclAllGather) and reduce on the host in rank order with
/// the threads backend's kernel (parallel/detail/reduce.hpp), so they take every element type and
/// operation of parallel::reduce_op — fp64 and avg too, which HCCL lacks on A2 — and every rank
/// gets bitwise the same result. It is meant for the small host traffic of a run (the root info of
/// further HCCL communicators, losses, checkpoint agreement, traces), not for gradients, which run
/// on comm::hccl in NPU memory. Asynchronous calls complete before they return. Errors are
/// comm::hccl's (device_error, comm_timeout) and input_error for mismatched sizes.
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/buffer.hpp>
#include <loom/parallel/any_comm.hpp>
#include <loom/parallel/comm_hccl.hpp>
#include <loom/parallel/detail/reduce.hpp>

namespace loom::parallel {

namespace detail {

/// any_comm_backend over an owned comm::hccl: host spans staged through NPU memory (file comment).
class hccl_host_backend final : public any_comm_backend {
 public:
  hccl_host_backend(comm::hccl hc, context<device::ascend>& ctx) : hc_(std::move(hc)), ctx_(&ctx) {}

  int rank() const noexcept override { return hc_.rank(); }
  int size() const noexcept override { return hc_.size(); }
  std::string name() const override { return hc_.name(); }
  void set_observer(comm_observer* o) noexcept override { hc_.set_observer(o); }

  void all_reduce(reduce_type t, void* x, std::size_t n, reduce_op op) override {
    with_reduce_type(t, [&]<class T>() { reduce<T>(static_cast<const T*>(x), n, static_cast<T*>(x), 0, n, op); });
  }
  request all_reduce_async(reduce_type t, void* x, std::size_t n, reduce_op op) override {
    all_reduce(t, x, n, op);
    return {};
  }
  void reduce_scatter(reduce_type t, const void* in, std::size_t n_in, void* out, std::size_t n_out,
                      reduce_op op) override {
    if (n_in != n_out * std::size_t(size()))
      throw input_error("hccl_host_world: reduce_scatter of " + std::to_string(n_in) + " elements into " +
                        std::to_string(n_out) + " per rank on " + std::to_string(size()) + " ranks; pass size() x out");
    with_reduce_type(t, [&]<class T>() {
      reduce<T>(static_cast<const T*>(in), n_in, static_cast<T*>(out), n_out * std::size_t(rank()), n_out, op);
    });
  }
  request reduce_scatter_async(reduce_type t, const void* in, std::size_t n_in, void* out, std::size_t n_out,
                               reduce_op op) override {
    reduce_scatter(t, in, n_in, out, n_out, op);
    return {};
  }
  void all_gather(std::span<const std::byte> in, std::span<std::byte> out) override {
    if (out.size() != in.size() * std::size_t(size()))
      throw input_error("hccl_host_world: all_gather of " + std::to_string(in.size()) + " bytes into " +
                        std::to_string(out.size()) + " on " + std::to_string(size()) + " ranks; pass size() x in");
    if (in.empty()) return;
    auto d_in = upload(in);
    buffer<device::ascend, std::byte> d_out(out.size(), ctx_->stream);
    hc_.all_gather(std::span<const std::byte>(d_in.data(), in.size()), std::span<std::byte>(d_out.data(), out.size()));
    copy_out(out.data(), d_out.data(), out.size());
  }
  request all_gather_async(std::span<const std::byte> in, std::span<std::byte> out) override {
    all_gather(in, out);
    return {};
  }
  void broadcast(std::span<std::byte> x, int root) override {
    if (x.empty()) return;
    auto d = upload(x);
    hc_.broadcast(std::span<std::byte>(d.data(), x.size()), root);
    copy_out(x.data(), d.data(), x.size());
  }
  void send(std::span<const std::byte> in, int dst, int tag) override {
    if (in.empty()) return;
    auto d = upload(in);
    hc_.send(std::span<const std::byte>(d.data(), in.size()), dst, tag);
  }
  void recv(std::span<std::byte> x, int src, int tag) override {
    if (x.empty()) return;
    buffer<device::ascend, std::byte> d(x.size(), ctx_->stream);
    hc_.recv(std::span<std::byte>(d.data(), x.size()), src, tag);
    copy_out(x.data(), d.data(), x.size());
  }
  void barrier() override { hc_.barrier(); }
  std::unique_ptr<any_comm_backend> split(int color, int key, std::string name) override {
    return std::make_unique<hccl_host_backend>(hc_.split(color, key, std::move(name)), *ctx_);
  }

 private:
  /// out[0, n_out) = op over ranks of in[first, first + n_out) (every rank's `in` of n_in elements).
  template <class T>
  void reduce(const T* in, std::size_t n_in, T* out, std::size_t first, std::size_t n_out, reduce_op op) {
    check_op<T>(op, "hccl_host_world");
    if (n_in == 0) return;
    const int p = size();
    std::vector<T> all(n_in * std::size_t(p));
    all_gather(std::as_bytes(std::span<const T>(in, n_in)), std::as_writable_bytes(std::span<T>(all)));
    std::vector<const T*> srcs(std::size_t(p), nullptr);
    for (int r = 0; r < p; ++r) srcs[std::size_t(r)] = all.data() + std::size_t(r) * n_in + first;
    T* dst = out;
    reduce_into(srcs.data(), p, &dst, 1, n_out, op, p);
  }
  /// An NPU buffer holding a copy of the host bytes `x` (queued on the context's stream).
  buffer<device::ascend, std::byte> upload(std::span<const std::byte> x) {
    buffer<device::ascend, std::byte> d(x.size(), ctx_->stream);
    device::ascend::copy_to_device(d.data(), x.data(), x.size(), ctx_->stream);
    return d;
  }
  /// host[0, bytes) = dev[0, bytes), waiting for the stream.
  void copy_out(void* host, const void* dev, std::size_t bytes) {
    device::ascend::copy_to_host(host, dev, bytes, ctx_->stream);
    ctx_->synchronize();
  }

  comm::hccl hc_;
  context<device::ascend>* ctx_;
};

}  // namespace detail

namespace comm {

/// The host-memory communicator over `hc` (file comment): owns `hc`; `ctx` (the NPU context `hc`
/// was created on) must outlive it and every group split from it. rank() and size() are hc's.
inline any_communicator hccl_host_world(hccl hc, context<device::ascend>& ctx) {
  return any_communicator(std::make_unique<detail::hccl_host_backend>(std::move(hc), ctx));
}

}  // namespace comm

}  // namespace loom::parallel
