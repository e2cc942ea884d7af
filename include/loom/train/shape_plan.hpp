#pragma once
/// \file train::plan_shape — the memory plan of any instance, computed at run time from the
/// model's shape, without compiling its trainer.
///
///   train::instance_request r{.spec = *io::read_hf_config("llama2_7b/config.json"), .precision = "bf16",
///                             .tp = 1, .pp = 2, .device = "ascend", .micro_batch = 1, .seq_len = 4096};
///   train::memory_plan p = train::plan_shape(r, args, /*world_size=*/8, /*dp_rank=*/0, /*stage=*/0);
///
/// The arithmetic is the compiled trainer's (train::trainer::plan): the parameter table
/// comes from models::build_table, the same function the compiled table is generated with; the
/// data-parallel buckets from train::plan_bucket_memory, the function data_parallel builds its
/// buckets with; the activation table from nn::activation_table. What depends on a kernel type —
/// the attention's saved state and scratch, the element sizes of each precision — is restated
/// here by name; tests/unit/train/test_shape_plan.cpp checks that the result equals
/// session_instance::plan for every compiled and plan-only instance, in every setting
/// (recompute, ZeRO-1, data-parallel sizes, stages, offload).
#include <cstddef>
#include <string>
#include <vector>

#include <loom/core/dropout.hpp>
#include <loom/core/error.hpp>
#include <loom/kernels/cpu/attention_traits.hpp>
#include <loom/models/spec.hpp>
#include <loom/nn/activations.hpp>
#include <loom/models/params.hpp>
#include <loom/parallel/schedule.hpp>
#include <loom/parallel/data_parallel.hpp>
#include <loom/train/instance_source.hpp>
#include <loom/train/memory_plan.hpp>
#include <loom/train/session.hpp>

namespace loom::train {

/// The table_shape of a run-time model.
inline models::table_shape table_shape_of(const models::model_spec& s) {
  models::recipe r{.name = s.arch, .norm = s.norm, .position = s.position, .mlp = s.mlp, .linear_bias = s.linear_bias,
               .tied_head = s.tied_head, .hf_model_type = s.hf_model_type};
  return {r, s.n_layer, s.d_model, s.n_head, s.n_kv_head, s.d_ff, s.vocab_padded, s.max_seq};
}

/// The parameter table of `s` on tp x pp (models::build_table), one row per tensor in table order,
/// local shapes. Throws loom::input_error when the layout does not divide the model.
inline std::vector<models::param_spec> table_of(const models::model_spec& s, int tp, int pp) {
  if (auto p = s.facts().layout_problem(tp, pp); !p.empty()) throw input_error(p);
  const auto b = models::build_table(table_shape_of(s), tp, pp);
  return {b.rows.begin(), b.rows.begin() + long(b.n)};
}

/// The activation widths of one rank of instance r (its capacities micro_batch x seq_len, its
/// stage's layers, its tensor-parallel slices) with `threads` OpenMP threads per rank, under
/// recompute mode `mode`: what nn::transformer::activations<B, T>::sizes_of builds from. The
/// attention's saved state and scratch are those of kernels::attention<device, storage, attn>
/// (kernels/cpu_fused.hpp, kernels/cpu.hpp, kernels/ascend/attention_fused.hpp).
inline nn::activation_dims activation_dims_of(const instance_request& r, int threads, nn::recompute mode) {
  const auto& s = r.spec;
  const std::size_t B = std::size_t(r.micro_batch), T = std::size_t(r.seq_len), tp = std::size_t(r.tp);
  const std::size_t NHl = std::size_t(s.n_head) / tp, KVl = std::size_t(s.n_kv_head) / tp;
  const std::size_t hd = std::size_t(s.d_model / s.n_head), Hl = std::size_t(s.d_ff) / tp;
  std::size_t saved = B * NHl * T, scratch = 0;  // fused attention on the CPU: one log-sum-exp per row
  if (r.device == "ascend") {
    saved = 2 * B * NHl * T * 8;  // aclnnFlashAttentionScore's softmax max and sum, [B, NH, T, 8] each
  } else if (r.attention == "reference") {
    saved = B * NHl * T * T, scratch = std::size_t(threads) * T * T;  // the probabilities
  } else if (r.precision == "fp32") {
    scratch = std::size_t(threads) * (T + 2 * std::size_t(kernels::cpu::attention_max_tile_elems));
  }
  return {.B = B, .T = T, .layers = std::size_t(s.n_layer / r.pp), .C = std::size_t(s.d_model),
          .qkv = (NHl + 2 * KVl) * hd, .att_out = std::size_t(s.d_model) / tp,
          .mlp_in = s.mlp == models::mlp_kind::swiglu ? 2 * Hl : Hl, .hidden = Hl,
          .logits = std::size_t(s.vocab_padded) / tp, .attn_saved = saved, .attn_scratch = scratch,
          .ce_scratch = r.tp > 1 ? 3 * B * T : 0,  // parallel::vocab_parallel_crossentropy_scratch
          .mode = mode};
}

/// The bytes one rank of instance `r` allocates (train::memory_plan) for a world of world_size
/// ranks (data-parallel size world_size / (tp x pp)), at data-parallel rank dp_rank and pipeline
/// stage `stage`, with `a` as train_gpt passes it (cfg's micro-batch and sequence: 0 = the
/// capacities r.micro_batch x r.seq_len; ddp) and `threads` OpenMP threads per rank: equal to
/// session_instance::plan of the compiled instance r. A data-parallel engine exists as in
/// train::plan_session (one rank on tp1pp1: none). Storage is 4 bytes (fp32) or 2; gradients,
/// master weights, moments and accumulators are fp32. Throws loom::input_error for what the
/// compiled trainer refuses: a request with a problem (instance_request::problem), a world that
/// is not a multiple of tp x pp, a micro-batch or sequence above the capacities, grad_accum < 1,
/// dropout where it is not implemented, optimizer offload on the CPU or with ZeRO-1, a bad
/// offload chunk or bucket size.
inline memory_plan plan_shape(const instance_request& r, const session_args& a, int world_size, int dp_rank, int stage,
                              int threads) {
  if (auto p = r.problem(); !p.empty()) throw input_error(p);
  const int TP = r.tp, PP = r.pp;
  if (world_size < 1 || world_size % (TP * PP) != 0)
    throw input_error("memory plan: " + std::to_string(world_size) + " ranks are not a multiple of TP x PP = " +
                      std::to_string(TP * PP) + "; pass --ranks " + std::to_string(TP * PP) + " (or a multiple)");
  const int dp = world_size / (TP * PP);
  const bool engine = TP * PP > 1 ? dp > 1 || a.ddp.zero1 : world_size > 1;
  // the settings trainer::checked refuses
  trainer_config c = a.cfg;
  if (c.micro_batch == 0) c.micro_batch = r.micro_batch;
  if (c.seq_len == 0) c.seq_len = r.seq_len;
  if (c.micro_batch < 1 || c.micro_batch > r.micro_batch)
    throw input_error("micro-batch size " + std::to_string(c.micro_batch) + " is outside [1, " +
                      std::to_string(r.micro_batch) + "], the capacity of " + r.describe() + "; pass --micro-batch <= " +
                      std::to_string(r.micro_batch) + " or plan a larger capacity");
  if (c.seq_len < 1 || c.seq_len > r.seq_len)
    throw input_error("sequence length " + std::to_string(c.seq_len) + " is outside [1, " + std::to_string(r.seq_len) +
                      "], the capacity of " + r.describe() + "; pass --seq-len <= " + std::to_string(r.seq_len));
  if (c.grad_accum < 1)
    throw input_error("gradient accumulation steps (the pipeline's micro-batches) must be >= 1; pass e.g. --grad-accum " +
                      std::to_string(PP));
  c.schedule.validate();
  check_dropout_probability(c.dropout, "dropout (--dropout)");
  if (c.dropout > 0 && (r.device != "cpu" || r.attention != "fused"))
    throw input_error("dropout " + std::to_string(c.dropout) + " needs the fused attention on the CPU (" + r.describe() +
                      " has no dropout); train with --dropout 0 there");
  const bool npu = r.device == "ascend";
  if (c.offload_optimizer) {
    if (!npu)
      throw input_error("--offload-optimizer on device " + r.device + ": the optimizer state is in host memory "
                        "already; drop --offload-optimizer (it moves the state off an NPU: --device ascend)");
    if (c.offload_chunk == 0 || c.offload_chunk % 32 != 0)  // optim::offload_adamw::check_chunk
      throw input_error("optimizer offload: chunk of " + std::to_string(c.offload_chunk) +
                        " elements is not a positive multiple of 32 (64-byte aligned copies); pass e.g. 1048576");
    if (engine && a.ddp.zero1)
      throw input_error("--offload-optimizer with --zero1: the offloaded optimizer holds the whole state, not a ZeRO-1 "
                        "shard; drop --zero1 or drop --offload-optimizer");
  }
  if (dp_rank < 0 || dp_rank >= dp || stage < 0 || stage >= PP)
    throw input_error("memory plan: dp rank " + std::to_string(dp_rank) + " of " + std::to_string(dp) + ", stage " +
                      std::to_string(stage) + " of " + std::to_string(PP) + " is not a rank of the layout");

  const std::size_t storage = r.precision == "fp32" ? 4 : 2, grad = 4, master = 4, acc = 4;
  const auto table = table_of(r.spec, TP, PP);
  std::vector<std::size_t> offsets(table.size() + 1, 0);
  for (std::size_t k = 0; k < table.size(); ++k) offsets[k + 1] = offsets[k] + table[k].size();
  const std::size_t N = offsets.back();
  memory_plan p;
  p.parameters = N * storage;
  p.gradients = N * grad;
  std::size_t state = N;
  if (engine) {
    const auto d = plan_bucket_memory(table, offsets, r.spec.n_layer / PP, grad, storage, std::size_t(dp),
                                      std::size_t(dp_rank), a.ddp);
    p.buckets = d.buckets;
    if (a.ddp.zero1) state = d.shard_elements;
  }
  const bool has_master = storage < master;
  if (c.offload_optimizer) {
    const std::size_t chunk = std::min(c.offload_chunk, N);  // optim::offload_adamw::host_bytes_of
    p.host_optimizer = (2 + (has_master ? 1 : 0)) * N * master + 2 * chunk * (grad + storage);
  } else {
    p.moments = 2 * state * master;
    p.master_weights = has_master ? state * master : 0;
  }
  const auto t = nn::activation_table(activation_dims_of(r, threads, c.recompute));
  p.activations = std::size_t(parallel::max_in_flight(PP, c.grad_accum, stage)) * (t.storage_total * storage + t.acc_total * acc);
  return p;
}

}  // namespace loom::train
