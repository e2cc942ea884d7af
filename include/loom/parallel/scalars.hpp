#pragma once
/// \file One host scalar across the ranks of a communicator of any device: a sum and a broadcast.
///
/// Note [host scalars]. The trainer and the pipeline executor exchange a few host doubles per step
/// (the squared gradient norm over the tp and pp groups, the loss from the last stage). A host
/// communicator (comm::threads, comm::mpi on device::cpu) takes them as they are. A device
/// communicator (comm::hccl) takes device memory only, and HCCL has no fp64 reduction (loom's API
/// reference §3.3: AllReduce types int8..int64, fp16, fp32, bf16), so there the double travels
/// as its 64-bit pattern through a small device buffer: all-gathered (HcclAllGather moves INT64)
/// and summed on the host in rank order 0..n-1 — the order of the threads backend's sum, and the
/// same bits on every rank; or broadcast (HcclBroadcast of one INT64). The same staging as
/// parallel::data_parallel's token count and loss sums (Note [DDP on a device communicator]).
/// Both functions are collective over `comm` and synchronize ctx's stream on a device.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <loom/core/buffer.hpp>
#include <loom/core/context.hpp>
#include <loom/core/device.hpp>
#include <loom/parallel/comm.hpp>

namespace loom::parallel {

/// The sum of x over the ranks of `comm`, identical on every rank. Errors: what the communicator
/// throws (comm_timeout, device_error).
template <class D, class Comm>
double sum_over(context<D>& ctx, Comm& comm, double x) {
  if constexpr (device::host_accessible_v<D>) {
    (void)ctx;
    comm.all_reduce(std::span<double>(&x, 1), reduce_op::sum);
    return x;
  } else {
    const std::size_t n = std::size_t(comm.size()), me = std::size_t(comm.rank());
    buffer<D, std::int64_t> d(n, ctx.stream);
    const std::int64_t mine = std::bit_cast<std::int64_t>(x);
    D::copy_to_device(d.data() + me, &mine, sizeof mine, ctx.stream);
    comm.all_gather(std::span<const std::int64_t>(d.data() + me, 1), std::span<std::int64_t>(d.data(), n));
    std::vector<std::int64_t> all(n);
    D::copy_to_host(all.data(), d.data(), n * sizeof(std::int64_t), ctx.stream);
    ctx.synchronize();
    double s = std::bit_cast<double>(all[0]);
    for (std::size_t j = 1; j < n; ++j) s += std::bit_cast<double>(all[j]);
    return s;
  }
}

/// x of rank `root` of `comm`, on every rank (bitwise). Errors: as sum_over; input_error for a
/// root outside the group (from the communicator).
template <class D, class Comm>
double broadcast_from(context<D>& ctx, Comm& comm, double x, int root) {
  if constexpr (device::host_accessible_v<D>) {
    (void)ctx;
    comm.broadcast(std::span<double>(&x, 1), root);
    return x;
  } else {
    buffer<D, std::int64_t> d(1, ctx.stream);
    std::int64_t bits = std::bit_cast<std::int64_t>(x);
    D::copy_to_device(d.data(), &bits, sizeof bits, ctx.stream);
    comm.broadcast(std::span<std::int64_t>(d.data(), 1), root);
    D::copy_to_host(&bits, d.data(), sizeof bits, ctx.stream);
    ctx.synchronize();
    return std::bit_cast<double>(bits);
  }
}

}  // namespace loom::parallel
