#pragma once
/// \file optim::offload_adamw: AdamW whose state lives in pinned host memory and whose update runs
/// on the host, streamed chunk by chunk between the device and the host. Source: Ren et al.,
/// "ZeRO-Offload: Democratizing Billion-Scale Model Training", arXiv:2101.06840 (§4: fp32
/// master weights and moments on the CPU, the update on the CPU, fp16 parameters back to the
/// device); MindSpore's optimizer offload does the same.
///
/// Per step (update()), for the parameter buffer cut into chunks of chunk() elements in the order
/// the forward reads it (forward_chunks<G>, optim/offload_order.hpp; a chunk is one or more
/// contiguous pieces):
///   1. the transfer stream waits for the compute stream (the gradients are final);
///   2. chunk i's fp32 gradients (and, without master weights, its parameters) go device ->
///      host into staging slot i % 2, while the host updates chunk i - 1;
///   3. the host runs the CPU AdamW kernels (kernels::cpu::adamw_update_master, or
///      kernels::cpu::adamw_update without master weights) on the chunk, tensor row by tensor row
///      so that weight decay follows the table: masters and moments updated in place in host
///      memory, the parameters' storage-type rounding written into the staging slot;
///   4. the slot's parameters go host -> device; the compute stream's next work waits for them.
/// Two slots, one in-order transfer stream: chunk i + 1's download is enqueued before the host
/// starts chunk i, and chunk i's upload after it, so the copies run beside the host's update.
/// The host waits on chunk i's download, which follows chunk i - 2's upload on the stream, so a
/// slot is never overwritten while an upload still reads it. The last uploads are not waited for
/// by the host: the next step's forward waits for them on the device.
///
/// Overlapped with the next forward (update_overlapped(); train::trainer_config::offload_overlap,
/// the trainer's default). ZeRO-Offload overlaps the host step with the next iteration through
/// its one-step delayed parameter update (DPU, §4.2), which trains on stale parameters; here the
/// forward waits per layer instead, so nothing is stale: the same pipeline runs on a host thread
/// owned by this object, over the chunks of forward_chunks<G> (optim/offload_order.hpp: the
/// parameter buffer in the order the forward reads it, embedding, block 0, block 1, ..., final
/// norm and head), and after each chunk's upload it records a mark for every layer whose
/// parameters are then all back. The caller returns at once
/// and enqueues the next step; before the forward reads a layer it calls await_layer(ctx, layer)
/// (nn::transformer::before_layer), which blocks the host only until that layer's mark is
/// recorded and makes the compute stream wait for it on the device, so block l computes while the
/// host updates block l + 1. Once the last chunk's gradients are on the host the thread zeroes the
/// gradients on the transfer stream (the next step's accumulation starts from them; the last mark,
/// which the forward waits for after the blocks, follows). wait() / finish() join it; the trainer
/// calls wait() before anything else reads the state (checkpoints, evaluation, model(),
/// sync_master_weights). No device memory beyond the non-overlapped design: the same two pinned
/// staging slots, and layers + 2 events.
///
/// Measured on the emulation (docs/memory.md, "Optimizer offload"; 2 cores shared with another
/// benchmark, so noisy), llama_quickstart bf16, 4 steps, runs alternating twice:
///   LOOM_DATA_DIR=/work/shared/data ASCEND_HOME_PATH=build/ascend_emulation nice -n 19
///   build/examples/train_gpt --device ascend --model llama_quickstart --precision bf16
///     --data out/shakespeare --synthetic-data --steps 4 --log-every 1 --log-dir '' --eval-every 0
///     --sample-tokens 0 --val-fraction 0.003 --offload-optimizer [--offload-overlap off]
/// overlap on 17.1-24.1 s per step, off 17.7-18.8 s, no offload 17.5-18.5 s; NPU peak 293.57 MiB
/// on and off (353.57 MiB without offload). The blocking update takes 98-112 ms there, 0.6 % of
/// the emulated step (whose kernels run on the host in double), so the emulation cannot show the
/// saving above its noise; it does show the host thread's uploads running beside the forward.
///
/// Elementwise this is the CPU kernel's AdamW on the same bits of gradients and state, so the
/// overlapped update equals update() bit for bit (tests/ascend/test_offload.cpp), and both equal
/// optim::adamw on device::cpu exactly; against the device's own AdamW it differs by the
/// two kernels' rounding (see docs/memory.md, "Optimizer offload").
#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/core/view.hpp>
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu/adamw.hpp>
#include <loom/models/params.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/optim/offload_order.hpp>
#include <loom/precision/policy.hpp>

namespace loom::optim {

/// True when device D can stream an offloaded optimizer: it has a transfer stream
/// (device::ascend::transfer_stream). device::cpu has none: its optimizer state is host memory.
template <class D>
inline constexpr bool can_offload_v = requires { typename D::transfer_stream; };

/// AdamW for model G on a device with a transfer stream, its state (first and second moments,
/// and fp32 master weights when the storage is 16-bit) in pinned host memory
/// (D::allocate_host: aclrtMallocHost on an NPU). See the file comment for the step.
/// Host memory: host_bytes_of(G::num_parameters, chunk) bytes; device memory: none.
template <class G>
class offload_adamw {
 public:
  using device = typename G::device;
  using master_t = typename G::precision::master;
  using storage_t = typename G::storage_t;
  using grad_t = typename G::grad_t;
  static constexpr bool has_master = precision::has_master_copy_v<typename G::precision>;
  static_assert(can_offload_v<device>,
                "loom::optim::offload_adamw: the device has no transfer stream; on device::cpu the optimizer state is "
                "in host memory already (use optim::adamw)");
  static_assert(!has_master || std::is_same_v<grad_t, master_t>,
                "loom::optim::offload_adamw: with master weights the gradients must be fp32 (G::grad_t)");
  /// Default elements per chunk: 1 Mi (4 MiB of fp32 gradients per copy).
  static constexpr std::size_t default_chunk = std::size_t(1) << 20;
  /// A chunk's elements must be a multiple of this, so every chunk starts 64-byte aligned in
  /// 2- and 4-byte arrays (what asynchronous NPU copies need).
  static constexpr std::size_t chunk_multiple = 32;

  /// Pinned host bytes for n parameters in chunks of `chunk` elements: the moments (2 n),
  /// masters (n, with has_master) and two staging slots of min(chunk, n) gradients and
  /// parameters. What host_bytes() returns; train::trainer::plan counts it.
  static constexpr std::size_t host_bytes_of(std::size_t n, std::size_t chunk) noexcept {
    const std::size_t c = std::min(chunk, n);
    return (2 + (has_master ? 1 : 0)) * n * sizeof(master_t) + 2 * c * (sizeof(grad_t) + sizeof(storage_t));
  }
  /// Throws loom::input_error unless chunk is a positive multiple of chunk_multiple.
  static void check_chunk(std::size_t chunk) {
    if (chunk == 0 || chunk % chunk_multiple != 0)
      throw input_error("optimizer offload: chunk of " + std::to_string(chunk) + " elements is not a positive multiple of " +
                        std::to_string(chunk_multiple) + " (64-byte aligned copies); pass e.g. " +
                        std::to_string(default_chunk));
  }

  /// Moments zero; masters (has_master) = `model`'s parameters, widened (read back from the
  /// device through the staging slots). Synchronizes ctx.stream. Throws loom::input_error for a
  /// bad chunk, device_error from the device.
  offload_adamw(context<device>& ctx, adamw_config cfg, const G& model, std::size_t chunk = default_chunk)
      : cfg_(cfg), chunk_((check_chunk(chunk), std::min(chunk, G::num_parameters))), m_(pinned<master_t>(N)),
        v_(pinned<master_t>(N)), master_(pinned<master_t>(has_master ? N : 0)), stage_g_(pinned<grad_t>(2 * chunk_)),
        stage_p_(pinned<storage_t>(2 * chunk_)), order_(chunk_), xfer_(ctx, order_.gates()) {
    std::memset(m_.get(), 0, N * sizeof(master_t));
    std::memset(v_.get(), 0, N * sizeof(master_t));
    sync_master_weights(ctx, model);
  }
  offload_adamw(const offload_adamw&) = delete;
  offload_adamw& operator=(const offload_adamw&) = delete;
  /// Stops the host thread of update_overlapped after its update in flight (its errors are
  /// dropped: call wait() to see them), then the transfer stream drains. Never throws.
  ~offload_adamw() {
    {
      std::lock_guard lock(m_sync_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  const adamw_config& config() const noexcept { return cfg_; }
  /// Elements per streamed chunk (the last chunk may be shorter).
  std::size_t chunk() const noexcept { return chunk_; }
  /// Pinned host bytes held (host_bytes_of(G::num_parameters, chunk())).
  std::size_t host_bytes() const noexcept { return host_bytes_of(N, chunk_); }
  /// The moments and (has_master) fp32 master weights, parameter-buffer layout, in host memory:
  /// views of device::cpu, so a checkpoint reads and writes them with the host's memcpy.
  view<loom::device::cpu, master_t> first_moment() const noexcept { return {m_.get(), N}; }
  view<loom::device::cpu, master_t> second_moment() const noexcept { return {v_.get(), N}; }
  view<loom::device::cpu, master_t> master_weights() const noexcept
    requires(has_master)
  {
    return {master_.get(), N};
  }

  /// Masters = `model`'s parameters, widened (after loading weights into the model from
  /// elsewhere). No-op without masters. Synchronizes ctx.stream and the transfer stream.
  void sync_master_weights(context<device>& ctx, const G& model) {
    wait();
    if constexpr (has_master) {
      const storage_t* p = model.parameters().data();
      xfer_.after_compute(ctx);
      for (std::size_t a = 0; a < N; a += chunk_) {
        const std::size_t n = std::min(chunk_, N - a);
        xfer_.to_host(stage_p_.get(), p + a, n * sizeof(storage_t));
        xfer_.record(0);
        xfer_.wait(0);
        kernels::cpu::cast(master_.get() + a, stage_p_.get(), n);
      }
    }
  }

  /// AdamW step t (1-based) at learning rate lr on `model`'s gradients multiplied by grad_scale
  /// (clip coefficient and unscaling): the chunk pipeline of the file comment. Writes the host
  /// masters and moments and `model`'s parameters (their rounding; in place without masters);
  /// work enqueued on ctx.stream afterwards sees the new parameters. Returns once the host
  /// update is done (the last uploads may still run). Throws device_error.
  void update(context<device>& ctx, G& model, double lr, double grad_scale, long t) {
    finish(ctx);
    xfer_.after_compute(ctx);
    stream_chunks(model.parameters().data(), model.gradients().data(), lr, grad_scale, t, false);
    xfer_.before_compute(ctx);
  }

  /// update()'s AdamW step, overlapped with the work the caller enqueues on ctx.stream next (the
  /// next step's forward): returns at once; a host thread of this object (started by the first
  /// call, with the NPU current on it: the transfer stream's bind_thread) streams the chunks of
  /// forward_chunks<G> (forward order) through the staging slots as update() does, records
  /// transfer-stream mark g + 1 after the upload of ready_after(g)'s chunk for every gate layer
  /// g, and zeroes `model`'s gradients on the transfer stream once the last chunk's are on the
  /// host. Before the forward reads layer g's parameters, call await_layer(ctx, g) (the trainer
  /// installs it as nn::transformer::before_layer). Until then, or until finish() / wait(), the
  /// parameters on the device, the host state and the gradients are in flux: read none of them,
  /// zero no gradients (pending() tells). Elementwise the same kernels on the same values as
  /// update(): the results are bitwise equal. Throws device_error (from the previous overlapped
  /// update, or from its own thread's start).
  void update_overlapped(context<device>& ctx, G& model, double lr, double grad_scale, long t) {
    finish(ctx);
    if (!worker_.joinable()) worker_ = std::thread([this] { serve(); });
    xfer_.after_compute(ctx);  // the gradients (and fp32 parameters) are final
    {
      std::lock_guard lock(m_sync_);
      done_chunks_ = 0;
      error_ = nullptr;
      job_ = job{model.parameters().data(), model.gradients().data(), lr, grad_scale, t};
      busy_ = true;
    }
    cv_.notify_all();
    awaited_ = -2;
    pending_ = true;
  }
  /// True from update_overlapped() until the compute stream waits for all of it (await_layer of
  /// the last gate, finish()) or the host did (wait()).
  bool pending() const noexcept { return pending_; }
  /// Work enqueued on ctx.stream from now on sees every parameter the forward reads up to gate
  /// `layer` (-1 the embedding, 0..layers-1 a block, layers what follows the blocks; clamped to
  /// that range) updated: blocks the host until the host thread has enqueued the chunks holding
  /// them, then makes ctx.stream wait for their uploads on the device. After the last gate
  /// nothing is pending. No-op without a pending update or for a gate already awaited. Rethrows
  /// the host thread's error.
  void await_layer(context<device>& ctx, int layer) {
    if (!pending_) return;
    layer = std::clamp(layer, -1, order_.layers());
    if (layer <= awaited_) return;
    const std::size_t need = order_.ready_after(layer);
    bool failed = false;
    {
      std::unique_lock lock(m_sync_);
      cv_.wait(lock, [&] { return error_ || done_chunks_ > need; });
      failed = error_ != nullptr;
    }
    if (failed) return wait();  // rethrows
    xfer_.compute_waits(ctx, layer + 1);
    awaited_ = layer;
    if (layer == order_.layers()) {  // the last mark follows every copy and the gradients' zeroing
      wait_idle();
      pending_ = false;
    }
  }
  /// Work enqueued on ctx.stream from now on sees the whole overlapped update (parameters
  /// uploaded, gradients zeroed); joins the host thread. No-op when nothing is pending. Rethrows
  /// the host thread's error.
  void finish(context<device>& ctx) {
    if (!pending_) return;
    wait_idle();
    if (error_) return wait();  // rethrows
    xfer_.before_compute(ctx);
    pending_ = false;
  }
  /// finish() for readers without a compute stream (checkpoints, host state): joins the host
  /// thread and synchronizes the transfer stream. No-op when nothing is pending. Rethrows the
  /// host thread's error (or the stream's).
  void wait() {
    if (!pending_) return;
    pending_ = false;
    wait_idle();
    xfer_.synchronize();
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  static constexpr std::size_t N = G::num_parameters;
  struct host_deleter {
    void operator()(void* p) const noexcept { device::deallocate_host(p); }
  };
  template <class X>
  using host_ptr = std::unique_ptr<X[], host_deleter>;
  template <class X>
  static host_ptr<X> pinned(std::size_t n) {
    return host_ptr<X>(n ? static_cast<X*>(device::allocate_host(n * sizeof(X))) : nullptr);
  }

  /// AdamW on elements [a, a + n) of the parameter buffer: gradients in `g`, parameters out (in
  /// and out without masters) in `p`, row by row of the table for the weight decay.
  void update_chunk(std::size_t a, std::size_t n, storage_t* p, const grad_t* g, double lr, double grad_scale, long t) {
    const std::size_t end = a + n;
    std::size_t k = row_of(a);
    for (std::size_t lo = a; lo < end; ++k) {
      const std::size_t hi = std::min(end, G::offsets[k] + G::table[k].size());
      if (hi <= lo) continue;
      const master_t wd = master_t(G::table[k].decay ? cfg_.weight_decay : 0.0);
      const std::size_t o = lo - a, len = hi - lo;
      if constexpr (has_master)
        kernels::cpu::adamw_update_master(p + o, master_.get() + lo, m_.get() + lo, v_.get() + lo, g + o, len,
                                          master_t(lr), master_t(cfg_.beta1), master_t(cfg_.beta2), master_t(cfg_.eps),
                                          wd, master_t(grad_scale), t);
      else
        kernels::cpu::adamw_update(p + o, m_.get() + lo, v_.get() + lo, g + o, len, master_t(lr),
                                   master_t(cfg_.beta1), master_t(cfg_.beta2), master_t(cfg_.eps), wd,
                                   master_t(grad_scale), t);
      lo = hi;
    }
  }
  /// One update of update_overlapped, for the host thread.
  struct job {
    storage_t* params;
    grad_t* grads;
    double lr, grad_scale;
    long t;
  };
  /// The host thread: binds itself to the NPU, then runs each job (stream_overlapped) until the
  /// destructor stops it; when the binding fails, every job fails with its error.
  void serve() noexcept {
    try {
      auto bound = xfer_.bind_thread();
      for (;;) {
        job j{};
        {
          std::unique_lock lock(m_sync_);
          cv_.wait(lock, [&] { return stop_ || job_; });
          if (!job_) return;
          j = *std::exchange(job_, std::nullopt);
        }
        stream_overlapped(j);
        {
          std::lock_guard lock(m_sync_);
          busy_ = false;
        }
        cv_.notify_all();
      }
    } catch (...) {
      const std::exception_ptr e = std::current_exception();
      std::unique_lock lock(m_sync_);
      for (;;) {
        if (job_) {
          job_.reset();
          error_ = e;
          busy_ = false;
          cv_.notify_all();
        }
        if (stop_) return;
        cv_.wait(lock, [&] { return stop_ || job_; });
      }
    }
  }
  /// Blocks until the host thread has no job queued or running.
  void wait_idle() {
    std::unique_lock lock(m_sync_);
    cv_.wait(lock, [&] { return !busy_; });
  }
  /// The chunk pipeline of the file comment over forward_chunks' pieces (chunk i + 1 downloads
  /// while the host updates chunk i; a slot is reused once its upload is done). overlapped: also
  /// records gate mark g + 1 after the upload of ready_after(g)'s chunk, zeroes the gradients on
  /// the transfer stream after the last download, and publishes its progress (done_chunks_) for
  /// await_layer. Throws device_error.
  void stream_chunks(storage_t* params, grad_t* grads, double lr, double grad_scale, long t, bool overlapped) {
    const std::size_t chunks = order_.chunks();
    auto download = [&](std::size_t i) {
      const std::size_t s = i % 2;
      order_.for_each_piece(i, [&](const chunk_piece& p) {
        xfer_.to_host(stage_g_.get() + s * chunk_ + p.slot_at, grads + p.at, p.n * sizeof(grad_t));
        if constexpr (!has_master)
          xfer_.to_host(stage_p_.get() + s * chunk_ + p.slot_at, params + p.at, p.n * sizeof(storage_t));
      });
      xfer_.record(int(s));
      if (overlapped && i + 1 == chunks) xfer_.zero(grads, N * sizeof(grad_t));  // the next step accumulates from 0
    };
    download(0);
    int gate = -1;
    for (std::size_t i = 0; i < chunks; ++i) {
      if (i + 1 < chunks) download(i + 1);
      const std::size_t s = i % 2;
      xfer_.wait(int(s));  // chunk i is on the host; the upload of chunk i - 2 from this slot has finished
      storage_t* sp = stage_p_.get() + s * chunk_;
      const grad_t* sg = stage_g_.get() + s * chunk_;
      order_.for_each_piece(i, [&](const chunk_piece& p) {
        update_chunk(p.at, p.n, sp + p.slot_at, sg + p.slot_at, lr, grad_scale, t);
      });
      order_.for_each_piece(i, [&](const chunk_piece& p) {
        xfer_.to_device(params + p.at, sp + p.slot_at, p.n * sizeof(storage_t));
      });
      if (!overlapped) continue;
      for (; gate <= order_.layers() && order_.ready_after(gate) <= i; ++gate) xfer_.mark(gate + 1);
      {
        std::lock_guard lock(m_sync_);
        done_chunks_ = i + 1;
      }
      cv_.notify_all();
    }
  }
  /// One job of the host thread: stream_chunks, overlapped; its error is published, not thrown.
  void stream_overlapped(const job& j) noexcept {
    try {
      stream_chunks(j.params, j.grads, j.lr, j.grad_scale, j.t, true);
    } catch (...) {
      {
        std::lock_guard lock(m_sync_);
        error_ = std::current_exception();
      }
      cv_.notify_all();
    }
  }
  /// The table row holding parameter element i.
  static std::size_t row_of(std::size_t i) noexcept {
    std::size_t k = 0;
    while (k + 1 < G::num_tensors && G::offsets[k + 1] <= i) ++k;
    return k;
  }

  adamw_config cfg_;
  std::size_t chunk_;
  host_ptr<master_t> m_, v_, master_;
  host_ptr<grad_t> stage_g_;
  host_ptr<storage_t> stage_p_;
  forward_chunks<G> order_;  // the streamed chunks, in forward order
  typename device::transfer_stream xfer_;
  // update_overlapped: the host thread, its job, its progress (chunks uploaded and marked) or
  // error (guarded by m_sync_); pending_ and awaited_ belong to the calling thread
  std::thread worker_;
  std::mutex m_sync_;
  std::condition_variable cv_;
  std::optional<job> job_;
  bool busy_ = false, stop_ = false;
  std::size_t done_chunks_ = 0;
  std::exception_ptr error_;
  bool pending_ = false;
  int awaited_ = -2;  // the last gate awaited
};

}  // namespace loom::optim
