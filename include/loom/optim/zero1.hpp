#pragma once
/// \file ZeRO-1: AdamW whose state exists only for the part of the parameter buffer this
/// data-parallel rank owns. Source: Rajbhandari et al., "ZeRO: Memory Optimizations Toward
/// Training Trillion Parameter Models", arXiv:1910.02054, stage 1 (P_os, optimizer state
/// partitioning); MindSpore calls it "optimizer parallel".
///
/// The state is sharded: the first and second moments and, when the storage precision is
/// narrower than fp32 (bf16, fp16), the fp32 master weights. Each is one array of shard_size()
/// elements laid out by the shard ranges the data-parallel engine cut (parallel::shard_range:
/// parameter-buffer offset, length, shard offset). A step, driven by train::trainer:
///   1. the engine reduce-scatters the gradient buckets (parallel::data_parallel);
///   2. for each bucket, the engine hands this rank's reduced chunk to update_block(), which runs
///      AdamW on the owned elements: with masters, kernels adamw_master updates the master shard
///      and writes its rounding into the owned parameter elements (cast once); without, the
///      parameters are updated in place;
///   3. the engine all-gathers the bucket's parameters in the storage type.
/// The optimizer itself communicates nothing; it never includes parallel/ beyond the shard
/// geometry (parallel/dp_shard.hpp), and parallel/ never includes optim/.
///
/// Memory per rank: (2 + has_master) * shard_size() * sizeof(master) bytes, shard_size() about
/// num_parameters / dp (plus each bucket's padding to a 64-byte chunk). Unsharded AdamW holds
/// (2 + has_master) * num_parameters * sizeof(master).
#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <loom/core/buffer.hpp>
#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/models/params.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/parallel/dp_shard.hpp>
#include <loom/precision/policy.hpp>

namespace loom::optim {

/// Sharded AdamW for model G (nn::transformer or any model with the same table interface).
/// Elementwise it computes exactly what optim::adamw computes on the same elements, so a ZeRO-1
/// run matches an unsharded one bit for bit when the gradients are the same bits.
template <class G>
class zero1 {
 public:
  using device = typename G::device;
  using master_t = typename G::precision::master;
  using storage_t = typename G::storage_t;
  using grad_t = typename G::grad_t;
  static constexpr bool has_master = precision::has_master_copy_v<typename G::precision>;

  /// State for the shard described by `ranges` (parallel::data_parallel::shard_ranges(): sorted
  /// by shard_offset, contiguous from 0, each inside one table row and the parameter buffer).
  /// Moments zero; master weights (if any) are `model`'s owned parameters, widened.
  /// Throws loom::input_error when the ranges break those rules.
  zero1(context<device>& ctx, adamw_config cfg, const G& model, std::vector<parallel::shard_range> ranges)
      : cfg_(cfg), ranges_(std::move(ranges)) {
    std::size_t next = 0;
    decay_.reserve(ranges_.size());
    for (const auto& q : ranges_) {
      if (q.shard_offset != next || q.length == 0 || q.param_offset > G::num_parameters ||
          q.length > G::num_parameters - q.param_offset)
        throw input_error("zero1: shard range (" + std::to_string(q.param_offset) + ", " + std::to_string(q.length) +
                          ", " + std::to_string(q.shard_offset) + ") is empty, leaves a gap in the shard or lies outside the " +
                          std::to_string(G::num_parameters) + " parameters");
      const std::size_t k = row_of(q.param_offset);
      if (q.param_offset + q.length > G::offsets[k] + G::table[k].size())
        throw input_error("zero1: shard range at parameter " + std::to_string(q.param_offset) + " crosses the end of tensor '" +
                          std::string(G::table[k].name) + "'");
      decay_.push_back(G::table[k].decay);
      next += q.length;
    }
    shard_ = next;
    m_ = buffer<device, master_t>(shard_, ctx.stream);
    v_ = buffer<device, master_t>(shard_, ctx.stream);
    if constexpr (has_master) master_ = buffer<device, master_t>(shard_, ctx.stream);
    sync_master_weights(ctx, model);
  }

  const adamw_config& config() const noexcept { return cfg_; }
  /// Completed optimizer steps (the t of bias correction is step() + 1 during an update).
  long step() const noexcept { return t_; }
  void set_step(long t) noexcept { t_ = t; }

  /// Where the shard lies in the parameter buffer (what checkpoints save beside the state).
  const std::vector<parallel::shard_range>& ranges() const noexcept { return ranges_; }
  /// Elements of each shard array.
  std::size_t shard_size() const noexcept { return shard_; }
  /// The shard of the first and second moments, and of the fp32 master weights (has_master
  /// only), laid out by ranges(). Writable, so that a checkpoint can be loaded into them.
  view<device, master_t> first_moment() const noexcept { return m_.all(); }
  view<device, master_t> second_moment() const noexcept { return v_.all(); }
  view<device, master_t> master_weights() const noexcept
    requires(has_master)
  {
    return master_.all();
  }
  /// Bytes of optimizer state this rank holds.
  std::size_t bytes() const noexcept { return m_.bytes() + v_.bytes() + master_.bytes(); }

  /// Master shard = the model's owned parameters, widened (after loading weights into the model
  /// from elsewhere). No-op without master weights.
  void sync_master_weights(context<device>& ctx, const G& model) {
    if constexpr (has_master) {
      const storage_t* p = model.parameters().data();
      for (const auto& q : ranges_) G::ops::cast(ctx, master_.data() + q.shard_offset, p + q.param_offset, q.length);
    }
  }

  /// AdamW step t (1-based; does not change step()) at learning rate lr on the shard elements of
  /// `g`, whose gradients are multiplied by grad_scale (clip coefficient and unscaling). Writes
  /// the moments and masters of those elements and the owned parameter elements of `model`
  /// (params = rounding of the masters when kept). Weight decay follows the table rows.
  /// Throws loom::input_error when `g` lies outside the shard.
  void update_block(context<device>& ctx, G& model, const parallel::grad_block<grad_t>& g, double lr, double grad_scale,
                    long t) {
    if (g.shard_offset > shard_ || g.length > shard_ - g.shard_offset)
      throw input_error("zero1: gradient block [" + std::to_string(g.shard_offset) + ", +" + std::to_string(g.length) +
                        ") lies outside the shard of " + std::to_string(shard_) + " elements");
    storage_t* params = model.parameters().data();
    const std::size_t end = g.shard_offset + g.length;
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), g.shard_offset,
                               [](std::size_t so, const parallel::shard_range& q) { return so < q.shard_offset + q.length; });
    for (; it != ranges_.end() && it->shard_offset < end; ++it) {
      const std::size_t a = std::max(it->shard_offset, g.shard_offset), e = std::min(it->shard_offset + it->length, end);
      const std::size_t po = it->param_offset + (a - it->shard_offset);
      const double wd = decay_[std::size_t(it - ranges_.begin())] ? cfg_.weight_decay : 0.0;
      const grad_t* gr = g.data + (a - g.shard_offset);
      if constexpr (has_master)
        G::ops::adamw_master(ctx, params + po, master_.data() + a, m_.data() + a, v_.data() + a, gr, e - a, master_t(lr),
                             master_t(cfg_.beta1), master_t(cfg_.beta2), master_t(cfg_.eps), master_t(wd),
                             master_t(grad_scale), t);
      else
        G::ops::adamw(ctx, params + po, m_.data() + a, v_.data() + a, gr, e - a, master_t(lr), master_t(cfg_.beta1),
                      master_t(cfg_.beta2), master_t(cfg_.eps), master_t(wd), master_t(grad_scale), t);
    }
  }

  /// One whole step: increments step(), then update_block() for every block (which together
  /// should cover the shard). The trainer instead calls update_block() bucket by bucket, so that
  /// each bucket's all-gather overlaps the next bucket's update.
  void update(context<device>& ctx, G& model, std::span<const parallel::grad_block<grad_t>> blocks, double lr,
              double grad_scale) {
    ++t_;
    for (const auto& g : blocks) update_block(ctx, model, g, lr, grad_scale, t_);
  }

 private:
  /// The table row holding parameter element i.
  static std::size_t row_of(std::size_t i) noexcept {
    std::size_t k = 0;
    while (k + 1 < G::num_tensors && G::offsets[k + 1] <= i) ++k;
    return k;
  }

  adamw_config cfg_;
  std::vector<parallel::shard_range> ranges_;
  std::vector<bool> decay_;  ///< per range: the row's weight decay applies
  std::size_t shard_ = 0;
  buffer<device, master_t> m_, v_, master_;
  long t_ = 0;
};

}  // namespace loom::optim
