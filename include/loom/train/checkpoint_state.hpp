#pragma once
/// \file The trainer's side of checkpointing: its state as an io::state_view (named tensors,
/// ZeRO-1 shards, scalars), which io saves, loads and reshards without knowing the trainer.
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include <loom/core/context.hpp>
#include <loom/core/device.hpp>
#include <loom/io/checkpoint/manifest.hpp>
#include <loom/io/checkpoint/state.hpp>
#include <loom/models/params.hpp>
#include <loom/models/recipe.hpp>
#include <loom/nn/shard.hpp>
#include <loom/precision/policy.hpp>

namespace loom::train::detail {

/// The io::state_view of trainer `tr` (train::trainer): every table row with its
/// geometry; per row "param" (storage dtype) and, unless ZeRO-1 shards them, "master" (fp32,
/// when the precision keeps master weights) and "adam_m"/"adam_v"; with ZeRO-1 the sharded
/// optimizer's (optim::zero1) flat shards "adam_m", "adam_v" and "master" with their ranges;
/// step, optimizer step, loss scaler, and the configuration the manifest records. The pointers are the trainer's buffers (a load writes through them).
/// With optimizer offload (trainer::offload_optimizer()) "master"/"adam_m"/"adam_v" point
/// into its pinned host memory and are marked io::state_tensor::host (memcpy, not device copies).
/// Copies go through ctx's stream, which must outlive the view.
template <class Trainer>
io::state_view state_view_of(context<typename Trainer::device>& ctx, const Trainer& tr) {
  using G = typename Trainer::model_t;
  using M = typename G::model;
  using P = typename G::precision;
  using D = typename Trainer::device;
  using master_t = typename P::master;
  constexpr bool has_master = precision::has_master_copy_v<P>;
  const auto& model = tr.model();
  const auto& opt = tr.optimizer();
  const auto* zopt = tr.zero1_optimizer();
  // the view's pointers are writable: a load writes through them (the trainer is const only to io's save)
  auto bytes = [](auto view) {
    using E = std::remove_const_t<typename decltype(view)::element_type>;
    return reinterpret_cast<std::byte*>(const_cast<E*>(view.data()));
  };
  io::state_view v;
  v.model = {{"name", std::string(M::name)}, {"arch", std::string(models::arch_of<M>().name)},
             {"n_layer", M::n_layer},        {"n_head", M::n_head},
             {"d_model", M::d_model},        {"max_seq", M::max_seq},
             {"vocab", M::vocab},            {"vocab_padded", M::vocab_padded}};
  v.precision = std::string(P::name);
  v.storage_dtype = std::string(io::detail::tensor_dtype<typename P::storage>());
  v.master_dtype = std::string(io::detail::tensor_dtype<master_t>());
  v.master_copy = has_master;
  v.tp = Trainer::TP;
  v.pp = Trainer::PP;
  v.dp = tr.dp_size();
  v.tp_rank = tr.tp_rank();
  v.pp_rank = tr.stage();
  v.dp_rank = tr.dp_rank();
  v.zero1 = zopt != nullptr;
  v.cell_elems = G::num_parameters;
  for (std::size_t k = 0; k < G::num_tensors; ++k) {
    const auto& s = G::table[k];
    const auto g = nn::geometry_of(s, Trainer::PP);
    std::vector<std::int64_t> logical(s.global.begin(), s.global.begin() + s.ndim);
    if (s.per_layer) logical[0] = g.layers;
    v.rows.push_back({std::string(s.name), g, std::move(logical),
                      std::vector<std::int64_t>(s.shape.begin(), s.shape.begin() + s.ndim), s.used, s.decay,
                      G::offsets[k], s.size()});
    // a view of device::cpu on another device is host memory (the offloaded optimizer's state)
    auto add = [&](const char* kind, auto view) {
      using V = decltype(view);
      constexpr bool host = !std::is_same_v<typename V::device_type, D> && device::host_accessible_v<typename V::device_type>;
      v.tensors.push_back({kind, k, std::string(io::detail::tensor_dtype<std::remove_const_t<typename V::element_type>>()),
                           bytes(view), view.bytes(), host});
    };
    auto add_optimizer = [&](const auto& o) {
      if constexpr (has_master) add("master", o.master_weights().subview(G::offsets[k], s.size()));
      add("adam_m", o.first_moment().subview(G::offsets[k], s.size()));
      add("adam_v", o.second_moment().subview(G::offsets[k], s.size()));
    };
    add("param", model.parameter(k));
    if (!v.zero1) {
      if constexpr (requires { tr.offload_optimizer()->first_moment(); }) {
        if (const auto* off = tr.offload_optimizer()) add_optimizer(*off);
        else add_optimizer(opt);
      } else {
        add_optimizer(opt);
      }
    }
  }
  if (v.zero1) {
    const std::string md = v.master_dtype;
    v.shards.push_back({"adam_m", md, bytes(zopt->first_moment()), zopt->shard_size()});
    v.shards.push_back({"adam_v", md, bytes(zopt->second_moment()), zopt->shard_size()});
    if constexpr (has_master) v.shards.push_back({"master", md, bytes(zopt->master_weights()), zopt->shard_size()});
    for (const auto& q : zopt->ranges()) v.ranges.push_back({q.param_offset, q.length, q.shard_offset});
  }
  const auto& cfg = tr.config();
  v.step = tr.step_count();
  v.optimizer_step = opt.step();
  v.scaler_enabled = Trainer::scaler_t::enabled;
  v.scaler = tr.loss_scaler().state();
  v.trainer = {{"micro_batch", cfg.micro_batch}, {"seq_len", cfg.seq_len}, {"grad_accum", cfg.grad_accum},
               {"seed", cfg.seed}, {"capacity_micro_batch", Trainer::micro_batch}, {"capacity_seq_len", Trainer::seq_len}};
  v.optimizer = {{"kind", "adamw"},
                 {"beta1", cfg.adamw.beta1},
                 {"beta2", cfg.adamw.beta2},
                 {"eps", cfg.adamw.eps},
                 {"weight_decay", cfg.adamw.weight_decay},
                 {"max_grad_norm", cfg.adamw.max_grad_norm},
                 {"step", opt.step()}};
  v.lr_schedule = {{"kind", "cosine"},
                   {"max_lr", cfg.schedule.max_lr},
                   {"min_lr", cfg.schedule.min_lr},
                   {"warmup", cfg.schedule.warmup},
                   {"decay_steps", cfg.schedule.decay_steps},
                   {"step", v.step},
                   {"next_lr", cfg.schedule(v.step)}};
  v.host_accessible = device::host_accessible_v<D>;
  v.to_host = [&ctx](void* dst, const void* src, std::size_t n) { D::copy_to_host(dst, src, n, ctx.stream); };
  v.to_device = [&ctx](void* dst, const void* src, std::size_t n) { D::copy_to_device(dst, src, n, ctx.stream); };
  v.synchronize = [&ctx] { ctx.synchronize(); };
  return v;
}

}  // namespace loom::train::detail
