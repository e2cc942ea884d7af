#pragma once
/// \file Data parallelism: a model's gradient buffer, named by its parameter table
/// (models/params.hpp), reduced over the data-parallel group for an optimizer — bucketed
/// gradient all-reduce overlapped with backward
/// (PyTorch DDP's scheme), the communication of ZeRO-1 (reduce-scatter, parameter all-gather),
/// agreed decisions, and a replica check.
/// train::trainer drives it through the grad_sync<G> interface (its communicator-taking
/// constructor); nothing here is global: the data-parallel group is passed in.
/// train::trainer uses the same engine (G = nn::transformer, one (tp, pp) cell's
/// buffer) for ZeRO-1 on the dp group of a 3D run: it reports every layer ready after the 1F1B
/// pipeline and restricts the norm to the cell's counted tensors (count_in_norm).
///
/// Note [DDP buckets]. The gradient buffer is tensor-major (models::param_table: all layers' qkv_w
/// together, ...), but backward finishes gradients layer by layer, last layer first. A bucket
/// of the tensor-major buffer would be complete only at the end of backward, so buckets are
/// layer-major and live in their own buffers ("copy into bucket"): backward reports each
/// finished group through transformer::backward's `ready` hook (lnf, then block L-1 .. 0, then the
/// embeddings); consecutive groups are packed into buckets of at most ddp_options::bucket_mb
/// (a group larger than that gets a bucket of its own; a group is never split); when the last
/// group of a bucket is ready its slices are copied into the bucket buffer and an asynchronous
/// all-reduce (sum) starts on the communicator's progress thread while backward continues. After
/// backward, finish() waits for every bucket and copies the sums back. Changing the parameter
/// layout to layer-major would save that copy (2 x gradient bytes of memcpy per step, a few
/// percent of a CPU step) but touches every kernel call, the optimizer's weight-decay table and
/// the checkpoint format: not worth it. Cost: one extra gradient-sized buffer per rank.
///
/// Loss and gradients. The trainer scales dlogits by 1 / (non-ignored targets of the whole
/// global batch, summed over ranks), so each rank's gradient is its share of the global mean,
/// and buckets are summed (reduce_op::sum), never averaged: divided exactly once. The loss is the
/// sum of per-token losses over all ranks divided by the same count: the number one rank gets
/// on the whole batch. Only the final micro-batch's backward reports groups: gradient
/// accumulation communicates nothing on the others.
///
/// Agreement. The squared gradient norm is summed over this rank's 1/n of every bucket and
/// all-reduced together with the loss (one collective of two doubles); every rank gets the same
/// number, so the norm, the clip coefficient and the non-finite decision (a NaN or inf anywhere
/// makes the sum non-finite on every rank) are identical everywhere.
///
/// ZeRO-1 (Rajbhandari et al., "ZeRO", arXiv:1910.02054, stage 1; MindSpore's "optimizer
/// parallel"). Each bucket is padded to n equal chunks; rank r owns chunk r of every bucket
/// (shard_ranges(): where those chunks lie in the parameter buffer). Buckets are
/// reduce-scattered instead of all-reduced. The optimizer state lives in a sharded optimizer,
/// not here (optim::zero1: moments and, below fp32, fp32 master weights of the owned chunks
/// only): gather_parameters() hands it each bucket's reduced chunk, the optimizer writes the
/// owned parameters, and the engine all-gathers the bucket's parameters in the storage type
/// (bf16/fp16: half the bytes of gathering fp32 masters). This engine never includes optim/
/// (parallel/dp_shard.hpp: include order). The reduction order is the same as the all-reduce's,
/// so ZeRO-1 and plain DDP give bitwise equal parameters with comm::threads.
///
/// Note [DDP on a device communicator]. Buckets live in memory of the model's device, so a
/// device communicator (comm::hccl on device::ascend) reduces them where they are. The few host
/// scalars (the token count, the loss and norm sums, the replica checksums) are passed to the
/// communicator directly when the device is device::cpu (comm::threads, comm::mpi: host memory,
/// unchanged); on any other device they are staged through a small device buffer, because a
/// device communicator takes device memory only. There they are all-gathered, doubles as their
/// 64-bit patterns (HCCL has no fp64 reduction), and summed on the host in rank order 0..n-1:
/// the order of the threads backend's sum, so every rank gets the same bits.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <loom/core/buffer.hpp>
#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/device/cpu.hpp>
#include <loom/models/params.hpp>
#include <loom/parallel/comm.hpp>
#include <loom/parallel/dp_shard.hpp>

namespace loom::parallel {

/// Data-parallel settings (runtime; none changes a shape).
struct ddp_options {
  double bucket_mb = 1.0;  ///< bucket capacity in MiB of gradients (> 0); PyTorch's bucket_cap_mb
  bool overlap = true;     ///< false: each bucket's collective blocks backward where it would have
                           ///< started (same numbers, communication not hidden: an isolation switch)
  bool zero1 = false;      ///< ZeRO-1: reduce-scatter the buckets, all-gather the parameters after a
                           ///< sharded optimizer (optim::zero1) updated this rank's chunks
  long check_every = 0;    ///< compare a parameter checksum across ranks every N steps (0: never)
};

/// The replicas' parameters differ (see grad_sync::check_replicas). Thrown on every rank.
class replica_mismatch : public error {
 public:
  using error::error;
};

/// What grad_sync::finish returns: sums over every rank of the data-parallel group, identical
/// on every rank.
struct synced_step {
  double loss_sum = 0;    ///< sum of per-token losses of the global batch (nats)
  double grad_sumsq = 0;  ///< squared L2 norm of the summed gradients
  double grad_norm() const noexcept { return std::sqrt(grad_sumsq); }
  bool finite() const noexcept { return std::isfinite(grad_sumsq); }
};

/// Per-rank memory of the data-parallel machinery, in bytes (the optimizer state is the
/// optimizer's: optim::zero1::bytes()).
struct ddp_memory {
  std::size_t buckets = 0;  ///< bucket buffers (about one gradient buffer; with ZeRO-1 and 16-bit
                            ///< storage also the parameters' all-gather buffers, half that)
};

/// What bucket_plan<G>::memory_of plans for one rank before anything is allocated.
struct ddp_plan {
  std::size_t buckets = 0;         ///< bytes of bucket buffers (ddp_memory::buckets once built)
  std::size_t shard_elements = 0;  ///< elements of the ZeRO-1 shard this rank owns
};

/// The interface train::trainer drives (the communicator type is erased behind it). Call order
/// per optimizer step, on every rank of the group: global_sum (token count); for the final
/// micro-batch begin_backward, then grads_ready for every `ready` call of gpt::backward;
/// finish; gather_parameters (ZeRO-1 only, with the sharded optimizer's update; otherwise the
/// trainer's own AdamW runs on the summed gradients); check_replicas.
/// Every call except grads_ready/begin_backward is collective. Errors: what the communicator
/// throws (comm_timeout naming the missing ranks, comm_aborted, device_error), replica_mismatch.
template <class G>
class grad_sync {
 public:
  using device = typename G::device;
  virtual ~grad_sync() = default;
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  virtual const ddp_options& options() const noexcept = 0;
  /// Sum of `local` over the group.
  virtual long global_sum(long local) = 0;
  /// Before the final micro-batch's backward.
  virtual void begin_backward(context<device>& ctx) = 0;
  /// gpt::backward's ready(layer): starts the bucket that `layer` completes.
  virtual void grads_ready(context<device>& ctx, G& model, int layer) = 0;
  /// Waits for every bucket; with plain DDP writes the summed gradients into model.gradients()
  /// (with ZeRO-1 they stay in the buckets; model.gradients() keeps this rank's local sums).
  /// Returns the loss sum and squared gradient norm over the group.
  virtual synced_step finish(context<device>& ctx, G& model, double local_loss_sum) = 0;
  /// Function receiving one bucket's reduced gradient chunk (gather_parameters).
  using update_fn = std::function<void(const grad_block<typename G::grad_t>&)>;
  /// ZeRO-1, after finish(): bucket by bucket, calls `update` with this rank's reduced gradient
  /// chunk of the bucket in shard coordinates (shard_ranges(); skipped when the rank owns
  /// nothing of it), which must write the owned parameter elements of `model` (a sharded
  /// optimizer's update, optim::zero1::update_block); then all-gathers the bucket's parameters in
  /// the storage type over the group, overlapping the next bucket's update (ddp_options::overlap).
  /// Returns when `model` holds every rank's updated parameters. Throws loom::error without zero1.
  virtual void gather_parameters(context<device>& ctx, G& model, const update_fn& update) = 0;
  /// After `steps` completed steps: every check_every steps, compares a checksum of every
  /// parameter tensor across ranks; throws replica_mismatch naming the ranks and the first
  /// differing tensor.
  virtual void check_replicas(context<device>& ctx, const G& model, long steps) = 0;
  virtual ddp_memory memory() const noexcept = 0;
  /// ZeRO-1: the chunks this rank owns, as pieces of the parameter buffer in shard order (empty
  /// without zero1). A sharded optimizer keeps its state for them (optim::zero1), and
  /// checkpoints save that state with these ranges (io::save_checkpoint, load_checkpoint).
  virtual std::vector<shard_range> shard_ranges() const = 0;
  /// Number of buckets (for logs and tests).
  virtual std::size_t bucket_count() const noexcept = 0;
};

namespace detail {
/// 64-bit checksum of n elements' bytes (SplitMix64 finaliser over 8-byte words; tail padded).
inline std::uint64_t checksum_bytes(const void* data, std::size_t bytes) noexcept {
  auto mix = [](std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  };
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h[4] = {1, 2, 3, 4};  // four independent lanes keep the multiplier pipeline busy
  std::size_t i = 0;
  for (; i + 32 <= bytes; i += 32)
    for (int k = 0; k < 4; ++k) {
      std::uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      h[k] = mix(h[k] ^ w);
    }
  std::uint64_t tail = 0;
  std::memcpy(&tail, p + i, bytes - i > 8 ? 8 : bytes - i);
  for (std::size_t j = i + 8; j < bytes; j += 8) {  // up to 3 more words
    std::uint64_t w = 0;
    std::memcpy(&w, p + j, bytes - j > 8 ? 8 : bytes - j);
    tail = mix(tail ^ w);
  }
  return mix(h[0] ^ mix(h[1] ^ mix(h[2] ^ mix(h[3] ^ mix(tail ^ bytes)))));
}
}  // namespace detail

/// One piece of a data-parallel bucket: a slice of the parameter/gradient buffer.
struct bucket_segment {
  std::size_t offset = 0;  ///< element offset in the parameter/gradient buffer
  std::size_t length = 0;  ///< elements
  std::size_t packed = 0;  ///< element offset inside its bucket
  int tensor = 0;          ///< table row
};

/// One bucket: its segments, length and this rank's part.
struct bucket_geometry {
  std::vector<bucket_segment> segs;
  std::size_t length = 0;        ///< packed elements
  std::size_t chunk = 0;         ///< per-rank part: length <= n * chunk
  std::size_t lo = 0, hi = 0;    ///< this rank's part [lo, hi) of the packed elements
  std::size_t shard_offset = 0;  ///< ZeRO-1: where its owned chunk starts in the shard
  int last_layer = 0;            ///< the ready() call that completes it
};

/// The slices a backward over `table` (element offsets `offsets`, `layers` layers on this
/// stage) finishes with ready(layer): layer l's slice of every per-layer row, or the global
/// rows whose models::ready_event is `layer` (layers or -1).
inline std::vector<bucket_segment> bucket_group(std::span<const models::param_spec> table,
                                                std::span<const std::size_t> offsets, int layers, int layer) {
  std::vector<bucket_segment> g;
  for (std::size_t k = 0; k < table.size(); ++k) {
    const auto& s = table[k];
    if (s.per_layer && layer >= 0 && layer < layers)
      g.push_back({offsets[k] + std::size_t(layer) * s.layer_size(), s.layer_size(), 0, int(k)});
    else if (!s.per_layer && models::ready_event(s, layers) == layer)
      g.push_back({offsets[k], s.size(), 0, int(k)});
  }
  return g;
}

/// The buckets of rank r in a group of n over `table` (gradients of grad_bytes bytes each):
/// groups in ready order (lnf = layer `layers`, blocks layers-1..0, embeddings = layer -1)
/// packed into buckets of at most bucket_mb MiB (a larger group gets its own), each split into n
/// chunks of a multiple of 64 bytes.
inline std::vector<bucket_geometry> plan_buckets(std::span<const models::param_spec> table,
                                                 std::span<const std::size_t> offsets, int layers,
                                                 std::size_t grad_bytes, std::size_t n, std::size_t r,
                                                 double bucket_mb) {
  std::vector<bucket_geometry> out;
  const std::size_t cap = std::size_t(bucket_mb * 1048576.0 / double(grad_bytes));
  bucket_geometry cur;
  for (int layer = layers; layer >= -1; --layer) {
    std::vector<bucket_segment> g = bucket_group(table, offsets, layers, layer);
    std::size_t len = 0;
    for (const auto& s : g) len += s.length;
    if (!cur.segs.empty() && cur.length + len > cap) {
      out.push_back(std::move(cur));
      cur = bucket_geometry{};
    }
    for (auto s : g) {
      s.packed = cur.length;
      cur.length += s.length;
      cur.segs.push_back(s);
    }
    cur.last_layer = layer;
  }
  if (!cur.segs.empty()) out.push_back(std::move(cur));
  std::size_t shard = 0;
  const std::size_t align = 64 / grad_bytes ? 64 / grad_bytes : 1;
  for (auto& b : out) {
    b.chunk = ((b.length + n - 1) / n + align - 1) / align * align;
    b.lo = std::min(b.length, r * b.chunk);
    b.hi = std::min(b.length, b.lo + b.chunk);
    b.shard_offset = shard;
    shard += b.hi - b.lo;
  }
  return out;
}

/// Throws loom::input_error for bucket_mb <= 0 or check_every < 0.
inline void check_ddp_options(const ddp_options& options) {
  if (!(options.bucket_mb > 0))
    throw input_error("data parallel: bucket size " + std::to_string(options.bucket_mb) +
                      " MiB must be > 0; pass e.g. --bucket-mb 1");
  if (options.check_every < 0) throw input_error("data parallel: replica check interval must be >= 0 (0: never)");
}

/// What data_parallel allocates on rank r of a group of n with `options` for `table` (bucket
/// buffers of grad_bytes elements; with ZeRO-1 and storage_bytes != grad_bytes also the
/// parameters' all-gather buffers), and the ZeRO-1 shard it gives that rank, without allocating.
/// Throws as check_ddp_options.
inline ddp_plan plan_bucket_memory(std::span<const models::param_spec> table, std::span<const std::size_t> offsets,
                                   int layers, std::size_t grad_bytes, std::size_t storage_bytes, std::size_t n,
                                   std::size_t r, const ddp_options& options) {
  check_ddp_options(options);
  ddp_plan p;
  for (const auto& b : plan_buckets(table, offsets, layers, grad_bytes, n, r, options.bucket_mb)) {
    p.buckets += n * b.chunk * grad_bytes;
    if (storage_bytes != grad_bytes && options.zero1) p.buckets += n * b.chunk * storage_bytes;
    p.shard_elements += b.hi - b.lo;
  }
  return p;
}

/// The bucket layout of data_parallel<G, C> (Note [DDP buckets]), which depends on the model and
/// the group's size only: data_parallel builds its buckets from it, train::trainer::plan
/// counts their bytes before anything is allocated (plan_buckets over G's table).
template <class G>
struct bucket_plan {
  using grad_t = std::remove_cvref_t<decltype(*std::declval<const G&>().gradients().data())>;
  using storage_t = typename G::storage_t;
  static constexpr int L = G::L;
  /// ZeRO-1 gathers the parameters through the gradient buckets when the types agree (fp32),
  /// else through buffers of the storage type.
  static constexpr bool gather_in_staging = std::is_same_v<storage_t, grad_t>;
  using segment = bucket_segment;
  using geometry = bucket_geometry;

  /// bucket_group over G's table.
  static std::vector<segment> group(int layer) { return bucket_group(G::table, G::offsets, L, layer); }

  /// plan_buckets over G's table.
  static std::vector<geometry> plan(std::size_t n, std::size_t r, double bucket_mb) {
    return plan_buckets(G::table, G::offsets, L, sizeof(grad_t), n, r, bucket_mb);
  }

  /// Throws loom::input_error for bucket_mb <= 0 or check_every < 0.
  static void check(const ddp_options& options) { check_ddp_options(options); }

  /// plan_bucket_memory over G's table.
  static ddp_plan memory_of(std::size_t n, std::size_t r, const ddp_options& options) {
    static_assert(gather_in_staging == (sizeof(storage_t) == sizeof(grad_t)));
    return plan_bucket_memory(G::table, G::offsets, L, sizeof(grad_t), sizeof(storage_t), n, r, options);
  }
};

/// grad_sync over communicator C (comm::threads, comm::mpi, comm::hccl, ...). See the file comment.
/// Holds references to `ctx` and `comm`, which must outlive it; `comm` must not be used by
/// another thread while a step runs. Memory: bucket buffers of about one gradient buffer (padded to n chunks),
/// plus with ZeRO-1 and 16-bit storage the parameters' all-gather buffers (half that); no
/// optimizer state.
template <class G, class C>
  requires communicator_for<C, float>
class data_parallel final : public grad_sync<G> {
 public:
  using device = typename G::device;
  using grad_t = std::remove_cvref_t<decltype(*std::declval<const G&>().gradients().data())>;
  using storage_t = typename G::storage_t;
  static constexpr int L = G::L;
  static constexpr bool gather_in_staging = bucket_plan<G>::gather_in_staging;
  using update_fn = typename grad_sync<G>::update_fn;

  /// Plans the buckets. Throws loom::input_error for bucket_mb <= 0 or check_every < 0.
  data_parallel(context<device>& ctx, C& comm, ddp_options options) : ctx_(&ctx), comm_(&comm), opt_(options) {
    bucket_plan<G>::check(opt_);
    for (auto& g : bucket_plan<G>::plan(std::size_t(comm.size()), std::size_t(comm.rank()), opt_.bucket_mb)) {
      bucket& b = buckets_.emplace_back();
      static_cast<typename bucket_plan<G>::geometry&>(b) = std::move(g);
      b.staging = buffer<device, grad_t>(std::size_t(comm.size()) * b.chunk, ctx.stream);
      if constexpr (!gather_in_staging)
        if (opt_.zero1) b.params = buffer<device, storage_t>(std::size_t(comm.size()) * b.chunk, ctx.stream);
    }
  }

  int rank() const noexcept override { return comm_->rank(); }
  int size() const noexcept override { return comm_->size(); }
  const ddp_options& options() const noexcept override { return opt_; }
  std::size_t bucket_count() const noexcept override { return buckets_.size(); }

  ddp_memory memory() const noexcept override {
    ddp_memory m;
    for (const auto& b : buckets_) m.buckets += b.staging.bytes() + b.params.bytes();
    return m;
  }

  std::vector<shard_range> shard_ranges() const override {
    std::vector<shard_range> out;
    if (!opt_.zero1) return out;
    for (const auto& b : buckets_)
      for (const auto& s : b.segs) {
        const std::size_t a = std::max(b.lo, s.packed), e = std::min(b.hi, s.packed + s.length);
        if (a < e) out.push_back({s.offset + (a - s.packed), e - a, b.shard_offset + (a - b.lo)});
      }
    return out;
  }

  /// Restricts finish()'s squared gradient norm to the table rows that count on rank
  /// (tp_rank, stage) of a tensor/pipeline-parallel model (G = nn::transformer,
  /// train::trainer), whose replicated and tied tensors must count on one (tp rank,
  /// stage) only (models::counts_in_norm), summed segment by segment over this rank's chunks.
  /// Without a call every element counts and each chunk is summed whole (the layout<1,1>
  /// trainer's path).
  void count_in_norm(int tp_rank, int stage) {
    for (std::size_t k = 0; k < G::num_tensors; ++k)
      norm_mask_[k] = models::counts_in_norm(G::table[k], tp_rank, stage, G::layout::pp);
    masked_ = true;
  }

  long global_sum(long local) override {
    std::int64_t x = local;
    if constexpr (host_scalars) {
      comm_->all_reduce(std::span<std::int64_t>(&x, 1), reduce_op::sum);
    } else {
      std::vector<std::int64_t> all(static_cast<std::size_t>(size()));
      gather_scalars(std::span<const std::int64_t>(&x, 1), std::span<std::int64_t>(all));
      x = 0;
      for (const auto v : all) x += v;
    }
    return long(x);
  }

  void begin_backward(context<device>&) override {
    for (auto& b : buckets_)
      if (b.req.pending())
        throw error("data parallel: a bucket of the previous step is still in flight; call finish() after backward");
    next_layer_ = L;
    next_bucket_ = 0;
  }

  void grads_ready(context<device>& ctx, G& model, int layer) override {
    if (layer != next_layer_)
      throw error("data parallel: gradients of layer " + std::to_string(layer) + " reported ready, expected " +
                  std::to_string(next_layer_) + " (gpt::backward reports L, L-1, ..., 0, -1)");
    --next_layer_;
    if (next_bucket_ < buckets_.size() && buckets_[next_bucket_].last_layer == layer) launch(ctx, model, buckets_[next_bucket_++]);
  }

  synced_step finish(context<device>& ctx, G& model, double local_loss_sum) override {
    if (next_bucket_ != buckets_.size())
      throw error("data parallel: finish() before backward reported every layer (" + std::to_string(next_bucket_) +
                  " of " + std::to_string(buckets_.size()) + " buckets started)");
    double sums[2] = {local_loss_sum, 0.0};
    for (auto& b : buckets_) {
      b.req.wait();
      if (!opt_.zero1) unpack(ctx, b.staging.data(), model.gradients().data(), b);
      if (b.hi <= b.lo) continue;
      if (!masked_) {
        sums[1] += G::ops::sum_of_squares(ctx, b.staging.data() + b.lo, b.hi - b.lo);
        continue;
      }
      for (const auto& s : b.segs) {
        const std::size_t a = std::max(b.lo, s.packed), e = std::min(b.hi, s.packed + s.length);
        if (a < e && norm_mask_[std::size_t(s.tensor)]) sums[1] += G::ops::sum_of_squares(ctx, b.staging.data() + a, e - a);
      }
    }
    if constexpr (host_scalars) {
      comm_->all_reduce(std::span<double>(sums, 2), reduce_op::sum);
    } else {  // Note [DDP on a device communicator]
      const std::int64_t mine[2] = {std::bit_cast<std::int64_t>(sums[0]), std::bit_cast<std::int64_t>(sums[1])};
      std::vector<std::int64_t> all(2 * std::size_t(size()));
      gather_scalars(std::span<const std::int64_t>(mine, 2), std::span<std::int64_t>(all));
      sums[0] = std::bit_cast<double>(all[0]);
      sums[1] = std::bit_cast<double>(all[1]);
      for (std::size_t j = 1; j < std::size_t(size()); ++j) {
        sums[0] += std::bit_cast<double>(all[2 * j]);
        sums[1] += std::bit_cast<double>(all[2 * j + 1]);
      }
    }
    return {sums[0], sums[1]};
  }

  void gather_parameters(context<device>& ctx, G& model, const update_fn& update) override {
    if (!opt_.zero1) throw error("data parallel: gather_parameters() is the ZeRO-1 path; without zero1 the trainer's AdamW runs");
    storage_t* params = model.parameters().data();
    for (auto& b : buckets_) {
      if (b.hi > b.lo) update(grad_block<grad_t>{b.shard_offset, b.hi - b.lo, b.staging.data() + b.lo});
      storage_t* stage = gather_buffer(b);  // fp32: the bucket itself, its gradients consumed
      pack_range(ctx, params, stage, b, b.lo, b.hi);
      ctx.synchronize();  // the collective reads the bucket from another thread
      const std::span<const storage_t> mine(stage + std::size_t(rank()) * b.chunk, b.chunk);
      const std::span<storage_t> all(stage, std::size_t(size()) * b.chunk);
      if (opt_.overlap) b.req = comm_->all_gather_async(mine, all);
      else comm_->all_gather(mine, all);
    }
    for (auto& b : buckets_) {
      b.req.wait();
      unpack(ctx, gather_buffer(b), params, b);
    }
  }

  void check_replicas(context<device>& ctx, const G& model, long steps) override {
    if (opt_.check_every <= 0 || steps % opt_.check_every != 0) return;
    constexpr int K = int(G::num_tensors);
    std::vector<std::int64_t> mine(K), all(std::size_t(K) * std::size_t(size()));
    std::vector<storage_t> host;
    ctx.synchronize();
    for (int k = 0; k < K; ++k) {
      const auto p = model.parameter(std::size_t(k));
      host.resize(p.size());
      device::copy_to_host(host.data(), p.data(), p.bytes(), ctx.stream);
      ctx.synchronize();
      mine[std::size_t(k)] = std::int64_t(detail::checksum_bytes(host.data(), p.bytes()));
    }
    if constexpr (host_scalars) comm_->all_gather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
    else gather_scalars(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
    for (int k = 0; k < K; ++k)
      for (int j = 1; j < size(); ++j)
        if (all[std::size_t(j) * K + k] != all[std::size_t(k)]) {
          std::string differ;
          for (int i = 1; i < size(); ++i)
            if (all[std::size_t(i) * K + k] != all[std::size_t(k)]) {
              // appended piece by piece: `"," + std::to_string(i)` (operator+(const char*, string&&),
              // an insert at the front) is what GCC 12's -Wrestrict misreads as an overlapping copy
              if (!differ.empty()) differ += ',';
              differ += std::to_string(i);
            }
          throw replica_mismatch("replica check after step " + std::to_string(steps) +
                                 ": the data-parallel replicas have different parameters; first differing tensor '" +
                                 std::string(G::table[k].name) + "' differs between rank 0 and rank(s) {" + differ +
                                 "}. The ranks started from different weights or diverged (non-deterministic "
                                 "communication or a bug); restart from a checkpoint");
        }
  }

 private:
  /// Host scalars go to the communicator as they are only on device::cpu (Note [DDP on a device
  /// communicator]).
  static constexpr bool host_scalars = std::is_same_v<device, loom::device::cpu>;

  /// all = every rank's `mine` in rank order (all.size() == size() * mine.size()), host spans,
  /// staged through device memory for a device communicator. Collective; synchronizes ctx_.
  template <class T>
  void gather_scalars(std::span<const T> mine, std::span<T> all) {
    const std::size_t m = mine.size();
    buffer<device, T> d(all.size(), ctx_->stream);
    device::copy_to_device(d.data() + std::size_t(rank()) * m, mine.data(), m * sizeof(T), ctx_->stream);
    comm_->all_gather(std::span<const T>(d.data() + std::size_t(rank()) * m, m), std::span<T>(d.data(), all.size()));
    device::copy_to_host(all.data(), d.data(), all.size() * sizeof(T), ctx_->stream);
    ctx_->synchronize();
  }

  using segment = typename bucket_plan<G>::segment;
  struct bucket : bucket_plan<G>::geometry {
    buffer<device, grad_t> staging;    ///< size() * chunk
    buffer<device, storage_t> params;  ///< ZeRO-1 all-gather buffer of the parameters (16-bit storage)
    request req;
  };
  static storage_t* gather_buffer(bucket& b) noexcept {
    if constexpr (gather_in_staging) return b.staging.data();
    else return b.params.data();
  }

  template <class T>
  static void pack_range(context<device>& ctx, const T* src, T* stage, const bucket& b, std::size_t lo, std::size_t hi) {
    for (const auto& s : b.segs) {
      const std::size_t a = std::max(lo, s.packed), e = std::min(hi, s.packed + s.length);
      if (a < e) device::copy(stage + a, src + s.offset + (a - s.packed), (e - a) * sizeof(T), ctx.stream);
    }
  }
  template <class T>
  static void unpack(context<device>& ctx, const T* stage, T* dst, const bucket& b) {
    for (const auto& s : b.segs) device::copy(dst + s.offset, stage + s.packed, s.length * sizeof(T), ctx.stream);
    ctx.synchronize();
  }

  void launch(context<device>& ctx, G& model, bucket& b) {
    pack_range(ctx, model.gradients().data(), b.staging.data(), b, 0, b.length);
    ctx.synchronize();  // the collective reads the bucket from another thread
    const std::span<grad_t> all(b.staging.data(), std::size_t(size()) * b.chunk);
    if (opt_.zero1) {
      const std::span<grad_t> mine(b.staging.data() + std::size_t(rank()) * b.chunk, b.chunk);
      if (opt_.overlap) b.req = comm_->reduce_scatter_async(std::span<const grad_t>(all), mine, reduce_op::sum);
      else comm_->reduce_scatter(std::span<const grad_t>(all), mine, reduce_op::sum);
    } else {
      if (opt_.overlap) b.req = comm_->all_reduce_async(all, reduce_op::sum);
      else comm_->all_reduce(all, reduce_op::sum);
    }
  }

  context<device>* ctx_;
  C* comm_;
  ddp_options opt_;
  std::vector<bucket> buckets_;
  std::array<bool, G::num_tensors> norm_mask_{};  // count_in_norm
  bool masked_ = false;
  int next_layer_ = L;
  std::size_t next_bucket_ = 0;
};

}  // namespace loom::parallel
