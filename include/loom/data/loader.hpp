#pragma once
/// \file loom::data::loader — fixed windows of T+1 tokens from a memory-mapped indexed
/// dataset, shuffled per epoch, split disjointly across data-parallel ranks, prefetched by
/// worker threads into pinned host buffers, with a position that goes into checkpoints.
///
/// Windows. The selected documents form one token stream of N tokens (documents are
/// concatenated with the end-of-document tokens prepare_data wrote, as in Megatron's
/// GPTDataset). Window w is tokens [w*T, w*T + T + 1): consecutive windows overlap by one
/// token, so every token is a target exactly once per epoch. W = (N - 1) / T windows.
///
/// Order. Epoch e visits windows in the order pi_e(0), pi_e(1), ... where pi_e is a keyed
/// pseudo-random permutation of [0, W) derived from (seed, e) (identity with shuffle=false).
/// One step consumes a global batch of G = B * dp_size consecutive slots of that order; rank r
/// takes slots [index + r*B, index + (r+1)*B) (Megatron's pretraining sampler). Each epoch has
/// S = W / G steps; the last W - S*G windows of an epoch's order are skipped so that all ranks
/// stay in step (a different set each epoch). Every rank computes the same order from the seed:
/// no communication, and ranks are disjoint by construction.
///
/// Position. state() = {epoch, index, seed}: index = slots of the current epoch consumed by all
/// ranks together, identical on every rank. restore(state) continues with exactly the batches
/// an uninterrupted run would have produced next — also after a change of dp_size, since the
/// position counts global slots.
///
/// Threads. With workers > 0, worker threads fill a ring of `prefetch` batch buffers in
/// D::allocate_host memory (pinned on devices that have it) ahead of the consumer; batch k
/// always lands in buffer k % prefetch, so the output is identical for any number of workers
/// (and to workers = 0, which fills on the calling thread). Errors raised by a worker (e.g. a
/// token id >= vocab) are rethrown by the next() that would have returned that batch.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/data/detail/permutation.hpp>
#include <loom/data/indexed_dataset.hpp>
#include <loom/device/cpu.hpp>
#include <loom/core/device.hpp>

namespace loom::data {

/// A loader's position: the part of a checkpoint that makes data resumable.
struct loader_state {
  std::uint64_t epoch = 0;  ///< epochs completed
  std::uint64_t index = 0;  ///< slots of this epoch's order consumed by all ranks together
  std::uint64_t seed = 0;   ///< shuffle seed
  friend bool operator==(const loader_state&, const loader_state&) = default;
};

/// Half-open range [first, last) of document numbers; last = npos means "to the end".
struct document_range {
  static constexpr std::size_t npos = ~std::size_t(0);
  std::size_t first = 0, last = npos;
};

/// Train/validation split by document: validation = the last ceil(valid_fraction * D)
/// documents (at least one when valid_fraction > 0), train = the rest, in file order
/// (contiguous ranges, like Megatron's --split). Throws loom::input_error if the fraction is
/// outside [0, 1) or the dataset has too few documents to give both parts one.
inline std::pair<document_range, document_range> split_train_valid(const indexed_dataset& ds,
                                                                   double valid_fraction) {
  if (!(valid_fraction >= 0.0 && valid_fraction < 1.0))
    throw input_error("split_train_valid: valid_fraction " + std::to_string(valid_fraction) +
                      " is outside [0, 1); pass e.g. 0.1 for 10% validation documents");
  const std::size_t d = ds.document_count();
  std::size_t nv = static_cast<std::size_t>(valid_fraction * double(d) + 0.999999);
  if (valid_fraction > 0 && nv == 0) nv = 1;
  if (nv >= d && valid_fraction > 0)
    throw input_error("split_train_valid: dataset '" + ds.prefix().string() + "' has " + std::to_string(d) +
                      " documents, too few to hold out " + std::to_string(nv) +
                      " for validation; prepare more documents or split text files into smaller ones");
  return {{0, d - nv}, {d - nv, d}};
}

/// Loader settings. B, T, seed and dp describe the run; workers and prefetch only speed it up
/// (they never change the batches).
struct loader_options {
  std::size_t batch = 1;        ///< B: windows per micro-batch on this rank
  std::size_t seq_len = 0;      ///< T: a window holds T+1 tokens (inputs [0,T), targets [1,T])
  std::uint64_t seed = 0;       ///< shuffle seed (loader_state::seed)
  int dp_rank = 0;              ///< this rank's data-parallel index
  int dp_size = 1;              ///< data-parallel degree
  int workers = 2;              ///< prefetch threads; 0 = fill on the calling thread
  int prefetch = 0;             ///< batch buffers in the ring; 0 = max(2, 2*workers)
  bool shuffle = true;          ///< false: windows in file order (e.g. validation)
  std::int64_t vocab = 0;       ///< > 0: a token id outside [0, vocab) is a loom::input_error
  document_range documents{};   ///< the documents to draw from (see split_train_valid)
  /// Where the batch buffers live; empty = D::allocate_host. A device's pinned memory lets
  /// next()'s batch go to the device without a host copy (train_gpt passes the session's).
  device::host_allocator host_memory{};
};

/// See the file comment. Not copyable or movable (worker threads point at it).
/// D selects the host allocator for the prefetch buffers (D::allocate_host).
template <device::device_policy D = device::cpu>
class loader {
 public:
  /// Opens `prefix`.idx/.bin. Throws loom::input_error on a bad dataset or options: missing
  /// or corrupt files, T < 1, B < 1, dp_rank outside [0, dp_size), a non-contiguous data
  /// file, fewer tokens than one window, or fewer windows than one global batch B*dp_size.
  loader(const std::filesystem::path& prefix, loader_options options)
      : loader(indexed_dataset(prefix), std::move(options)) {}

  loader(indexed_dataset dataset, loader_options options) : ds_(std::move(dataset)), opt_(std::move(options)) {
    const std::string name = "loader for '" + ds_.prefix().string() + "': ";
    if (opt_.seq_len < 1) throw input_error(name + "seq_len is 0; pass the model's sequence length T >= 1");
    if (opt_.batch < 1) throw input_error(name + "batch is 0; pass a micro-batch size B >= 1");
    if (opt_.dp_size < 1 || opt_.dp_rank < 0 || opt_.dp_rank >= opt_.dp_size)
      throw input_error(name + "dp_rank " + std::to_string(opt_.dp_rank) + " is outside [0, dp_size=" +
                        std::to_string(opt_.dp_size) + "); pass the rank's data-parallel index");
    if (opt_.workers < 0) throw input_error(name + "workers < 0; pass 0 (no threads) or more");
    if (!ds_.contiguous())
      throw input_error(name + "the data file is not one contiguous token stream (sequence pointers have gaps); "
                               "rewrite it with prepare_data");
    const std::size_t docs = ds_.document_count();
    const std::size_t last = opt_.documents.last == document_range::npos ? docs : opt_.documents.last;
    if (opt_.documents.first > last || last > docs)
      throw input_error(name + "document range [" + std::to_string(opt_.documents.first) + ", " + std::to_string(last) +
                        ") is not inside [0, " + std::to_string(docs) + "); use split_train_valid()");
    begin_ = ds_.document_token_offset(opt_.documents.first);
    end_ = ds_.document_token_offset(last);
    const std::uint64_t n_tok = end_ - begin_, T = opt_.seq_len;
    if (n_tok < T + 1)
      throw input_error(name + "the selected documents hold " + std::to_string(n_tok) +
                        " tokens, fewer than one window of T+1 = " + std::to_string(T + 1) +
                        "; use a shorter seq_len or more data");
    windows_ = (n_tok - 1) / T;
    global_batch_ = opt_.batch * std::uint64_t(opt_.dp_size);
    if (windows_ < global_batch_)
      throw input_error(name + "the selected documents give " + std::to_string(windows_) + " windows of " +
                        std::to_string(T + 1) + " tokens, fewer than one global batch B*dp_size = " +
                        std::to_string(global_batch_) + "; lower B or dp_size, shorten T, or prepare more data");
    row_ = T + 1;
    slots_ = std::size_t(opt_.prefetch > 0 ? opt_.prefetch : std::max(2, 2 * opt_.workers));
    if (opt_.workers == 0) slots_ = 1;
    const std::size_t bytes = slots_ * batch_tokens() * sizeof(std::int32_t);
    const auto mem = opt_.host_memory ? opt_.host_memory : device::host_allocator::of<D>();
    host_ = {static_cast<std::int32_t*>(mem.allocate(bytes)), host_deleter{mem.deallocate}};
    ready_.assign(slots_, none);
    errors_.assign(slots_, nullptr);
    base_ = {0, 0, opt_.seed};
  }

  loader(const loader&) = delete;
  loader& operator=(const loader&) = delete;
  ~loader() { stop_workers(); }

  /// Tokens per batch: B * (T + 1).
  std::size_t batch_tokens() const noexcept { return opt_.batch * row_; }
  /// W: windows of T+1 tokens in the selected documents.
  std::uint64_t windows_per_epoch() const noexcept { return windows_; }
  /// S: steps (= micro-batches per rank) per epoch.
  std::uint64_t batches_per_epoch() const noexcept { return windows_ / global_batch_; }
  /// Target tokens all ranks together see per epoch: S * B * dp_size * T.
  std::uint64_t tokens_per_epoch() const noexcept { return batches_per_epoch() * global_batch_ * opt_.seq_len; }
  /// Seconds next() spent waiting for a batch that was not ready (the trainer's "data" time).
  double wait_seconds() const noexcept { return wait_s_; }
  const indexed_dataset& dataset() const noexcept { return ds_; }
  const loader_options& options() const noexcept { return opt_; }

  /// The next micro-batch: B rows of T+1 tokens, row-major (row b = tokens[b*(T+1), (b+1)*(T+1))).
  /// Lives in the loader's pinned buffer and stays valid until the next call to next() or
  /// restore(); on an asynchronous device, synchronize the copy from it before calling again.
  /// Rethrows a worker's error (loom::input_error for a token id >= vocab) for that batch.
  std::span<const std::int32_t> next() {
    if (opt_.workers == 0) {
      std::int32_t* dst = host_.get();
      fill(consumed_, dst);
      ++consumed_;
      return {dst, batch_tokens()};
    }
    std::unique_lock lk(m_);
    released_ = consumed_;  // the batch returned last time is free again
    if (threads_.empty()) start_workers();
    work_cv_.notify_all();
    const std::size_t s = consumed_ % slots_;
    if (ready_[s] != consumed_) {
      const auto t0 = std::chrono::steady_clock::now();
      ready_cv_.wait(lk, [&] { return ready_[s] == consumed_; });
      wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (errors_[s]) {
      auto e = errors_[s];
      lk.unlock();
      stop_workers();  // the failing batch is retried on the next call
      clear_ring();
      std::rethrow_exception(e);
    }
    ++consumed_;
    return {host_.get() + s * batch_tokens(), batch_tokens()};
  }

  /// Copies the next micro-batch into `tokens` (=), which must hold exactly B*(T+1) values.
  void next(std::span<std::int32_t> tokens) {
    if (tokens.size() != batch_tokens())
      throw input_error("loader::next: output holds " + std::to_string(tokens.size()) + " tokens, a batch is B*(T+1) = " +
                        std::to_string(batch_tokens()) + "; size the buffer from batch_tokens()");
    const auto b = next();
    std::memcpy(tokens.data(), b.data(), b.size_bytes());
  }

  /// The position of the batch the next call to next() returns.
  loader_state state() const noexcept {
    const auto p = position_of(consumed_);
    return {p.epoch, p.index, base_.seed};
  }

  /// Continue from `s` (e.g. from a checkpoint): discards prefetched batches; the seed comes
  /// from `s`. Throws loom::input_error if s.index passes the end of an epoch of this
  /// dataset (the data, T or document range changed since the state was saved).
  void restore(const loader_state& s) {
    if (s.index > windows_)
      throw input_error("loader::restore: state index " + std::to_string(s.index) + " exceeds the " +
                        std::to_string(windows_) + " windows per epoch of '" + ds_.prefix().string() +
                        "'; resume with the dataset, seq_len and document range the state was saved with");
    stop_workers();
    base_ = s;
    opt_.seed = s.seed;
    consumed_ = 0;
    clear_ring();
  }

 private:
  static constexpr std::uint64_t none = ~std::uint64_t(0);
  struct host_deleter {
    void (*free)(void*) noexcept = nullptr;
    void operator()(std::int32_t* p) const noexcept { free(p); }
  };
  struct position {
    std::uint64_t epoch, index;
  };

  // Batch k counted from base_ -> (epoch, index).
  position position_of(std::uint64_t k) const noexcept {
    const std::uint64_t G = global_batch_, S = windows_ / G;
    const std::uint64_t r0 = base_.index <= windows_ ? (windows_ - base_.index) / G : 0;
    if (k < r0) return {base_.epoch, base_.index + k * G};
    k -= r0;
    return {base_.epoch + 1 + k / S, (k % S) * G};
  }

  void fill(std::uint64_t k, std::int32_t* dst) const {
    const position p = position_of(k);
    const detail::permutation perm(windows_, detail::mix64(base_.seed ^ detail::mix64(p.epoch + 0x5bd1e995ULL)));
    const std::uint64_t first_slot = p.index + std::uint64_t(opt_.dp_rank) * opt_.batch;
    for (std::size_t b = 0; b < opt_.batch; ++b) {
      const std::uint64_t slot = first_slot + b;
      const std::uint64_t w = opt_.shuffle ? perm(slot) : slot;
      ds_.read_tokens(begin_ + w * opt_.seq_len, {dst + b * row_, row_}, opt_.vocab);
    }
  }

  void start_workers() {  // called with m_ held
    stop_ = false;
    claimed_ = consumed_;
    for (int i = 0; i < opt_.workers; ++i) threads_.emplace_back([this] { work(); });
  }
  void stop_workers() {
    {
      std::lock_guard lk(m_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  void clear_ring() {
    std::fill(ready_.begin(), ready_.end(), none);
    std::fill(errors_.begin(), errors_.end(), nullptr);
    released_ = consumed_;
  }
  void work() {
    std::unique_lock lk(m_);
    for (;;) {
      work_cv_.wait(lk, [&] { return stop_ || claimed_ < released_ + slots_; });
      if (stop_) return;
      const std::uint64_t k = claimed_++;
      const std::size_t s = k % slots_;
      lk.unlock();
      std::exception_ptr err;
      try {
        fill(k, host_.get() + s * batch_tokens());
      } catch (...) {
        err = std::current_exception();
      }
      lk.lock();
      ready_[s] = k;
      errors_[s] = err;
      ready_cv_.notify_all();
    }
  }

  indexed_dataset ds_;
  loader_options opt_;
  std::uint64_t begin_ = 0, end_ = 0, windows_ = 0, global_batch_ = 1;
  std::size_t row_ = 1, slots_ = 1;
  std::unique_ptr<std::int32_t, host_deleter> host_;
  loader_state base_{};
  std::uint64_t consumed_ = 0;  // batches returned since base_

  std::mutex m_;
  std::condition_variable work_cv_, ready_cv_;
  std::vector<std::thread> threads_;
  std::vector<std::uint64_t> ready_;  // batch number held by each slot (none = empty)
  std::vector<std::exception_ptr> errors_;
  std::uint64_t claimed_ = 0, released_ = 0;
  bool stop_ = false;
  double wait_s_ = 0;
};

}  // namespace loom::data
