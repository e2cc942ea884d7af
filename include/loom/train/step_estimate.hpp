#pragma once
/// \file train::estimate_step: the time of one optimizer step of a layout, on paper — compute
/// from the model FLOPs and the device peak, stretched by the 1F1B bubble, plus the exposed
/// communication of tensor, pipeline and data parallelism under an alpha-beta (latency,
/// bandwidth) model of the links. examples/plan prints it; train::choose_layout ranks layouts
/// by it. It is a model, not a measurement: what it leaves out is listed at estimate_step.
///
///   train::network net{.intra = {.bus_gbytes = 20, .latency_us = 15}, .devices_per_node = 8};
///   const auto e = train::estimate_step({.facts = &f, .parameters = n, .tp = 1, .pp = 2, .dp = 4,
///                                        .micro_batch = 1, .grad_accum = 64, .seq_len = 4096, ...}, net);
///   e.seconds();  // compute x (1 + bubble) + exposed communication
///
/// Sources: FLOPs per token 6N + 12 L T C (Kaplan et al. 2020 §2.1; Narayanan et al. 2021,
/// "Efficient Large-Scale Language Model Training on GPU Clusters", §5.1, with the attention
/// term); the bubble (PP - 1)/m of 1F1B (Narayanan et al. 2021 §2.2.1); Megatron's tensor
/// parallel: two all-reduces of b x s x h per layer forward and two backward (Shoeybi et al. 2019
/// §3); ring all-reduce 2 (p - 1)/p of the bytes per rank and 2 (p - 1) steps (Patarasuk & Yuan 2009).
#include <algorithm>
#include <cstddef>
#include <string>

#include <loom/core/error.hpp>
#include <loom/models/registry.hpp>
#include <loom/nn/activations.hpp>

namespace loom::train {

/// One kind of link: the bus bandwidth a ring all-reduce reaches on it (nccl-tests' "busbw":
/// 2 (p - 1)/p x bytes / time) in GB/s (1e9 bytes per second), and the latency of one step of a
/// collective or of a point-to-point message, in microseconds.
struct link {
  double bus_gbytes = 0;
  double latency_us = 0;
};

/// The links between ranks: `intra` within a node of devices_per_node ranks (threads of one
/// process, an NPU board's HCCS), `inter` between nodes (RoCE, InfiniBand). A group whose ranks
/// all sit in one node uses intra, else inter. devices_per_node <= 0: every rank in one node.
struct network {
  link intra, inter;
  int devices_per_node = 0;
  link host;  ///< device <-> host copies (PCIe), for optimizer offload; bus_gbytes 0: unknown

  /// The link a group of `size` ranks at rank stride `stride` uses (ranks r, r + stride, ...;
  /// the layout's order, parallel::layout: tensor fastest, then data, then pipeline).
  const link& of_group(int size, int stride) const noexcept {
    return devices_per_node <= 0 || size * stride <= devices_per_node ? intra : inter;
  }
};

/// A step to estimate: the model (`facts`, `parameters` of the whole model), the layout
/// (tp x pp x dp ranks), the batch (micro_batch sequences of seq_len tokens, grad_accum
/// micro-batches per dp rank), the recompute mode, ZeRO-1, the element sizes of parameters
/// (storage) and gradients, and the per-rank peak in FLOP/s.
struct step_shape {
  const models::model_facts* facts = nullptr;
  double parameters = 0;
  int tp = 1, pp = 1, dp = 1;
  int micro_batch = 1, grad_accum = 1, seq_len = 1;
  nn::recompute recompute = nn::recompute::none;
  bool zero1 = false;
  bool offload = false;  ///< optimizer offload: gradients down, parameters up every step
  /// With offload: the host update overlaps the next step's forward (trainer_config::offload_overlap)
  bool offload_overlap = true;
  int storage_bytes = 4, grad_bytes = 4;
  double peak_flops = 0;
};

/// One step's estimated time in seconds, by part.
struct step_estimate {
  double flops = 0;       ///< model FLOPs of the global batch, recompute included
  double compute = 0;     ///< flops / (ranks x peak)
  double bubble = 0;      ///< 1F1B idle fraction added to compute: (PP - 1) / m
  double tp_comm = 0;     ///< tensor-parallel all-reduces (on the critical path)
  double pp_comm = 0;     ///< pipeline sends of activations and their gradients
  double dp_comm = 0;     ///< data-parallel gradient reduction (and ZeRO-1's all-gather) not hidden
                          ///< behind the last micro-batch's backward
  double offload = 0;     ///< optimizer offload: the part of offload_copies not hidden behind the
                          ///< next step's first forward (all of it without offload_overlap)
  double offload_copies = 0;  ///< this rank's gradients to the host and parameters back
  double seconds() const noexcept { return compute * (1 + bubble) + tp_comm + pp_comm + dp_comm + offload; }
};

/// Seconds of a ring all-reduce of `bytes` per rank over p ranks on `l`: the 2 (p - 1)/p x bytes
/// each rank sends at the bus bandwidth, plus 2 (p - 1) latencies; 0 for p = 1.
inline double all_reduce_seconds(double bytes, int p, const link& l) noexcept {
  if (p <= 1) return 0;
  return 2.0 * (p - 1) / p * bytes / (l.bus_gbytes * 1e9) + 2.0 * (p - 1) * l.latency_us * 1e-6;
}

/// Model FLOPs per token of the whole model: 6 N + 12 L T C for forward and backward, plus the
/// recomputed forward: the blocks' (2 N_blocks + 4 L T C) with recompute::full, the attention
/// core's (4 L T C) with recompute::selective. N_blocks is N less the vocabulary matrices: the
/// embedding and the LM head, one tied matrix for GPT-2, two for Llama.
inline double flops_per_token(const models::model_facts& f, double parameters, int seq_len, nn::recompute r) noexcept {
  const double ltc = double(f.n_layer) * seq_len * f.d_model;
  const double lookups = double(f.vocab_padded) * f.d_model * (f.arch == "llama" ? 2 : 1);
  const double extra = r == nn::recompute::full        ? 2.0 * (parameters - lookups) + 4.0 * ltc
                       : r == nn::recompute::selective ? 4.0 * ltc
                                                       : 0.0;
  return 6.0 * parameters + 12.0 * ltc + std::max(0.0, extra);
}

/// The estimate of step `s` on `net` (see the file comment). Not modelled: kernel efficiency
/// (the compute is at 100 % of the peak: divide by an expected MFU), overlap of tensor-parallel
/// and pipeline communication with compute (counted exposed), the vocabulary-parallel
/// embedding's and cross-entropy's small reductions, host time (data, launches, an offloaded
/// optimizer's AdamW pass: taken as hidden with the copies). Throws loom::input_error for a shape without a model, ranks, batch or
/// peak, and for offload without the host link's bandwidth.
inline step_estimate estimate_step(const step_shape& s, const network& net) {
  if (!s.facts || s.tp < 1 || s.pp < 1 || s.dp < 1 || s.micro_batch < 1 || s.grad_accum < 1 || s.seq_len < 1 ||
      !(s.peak_flops > 0))
    throw input_error("estimate_step: needs a model, tp/pp/dp/micro-batch/accumulation/sequence >= 1 and a peak > 0");
  const auto& f = *s.facts;
  const int world = s.tp * s.pp * s.dp;
  const double tokens = double(s.micro_batch) * s.seq_len * s.grad_accum * s.dp;
  step_estimate e;
  e.flops = flops_per_token(f, s.parameters, s.seq_len, s.recompute) * tokens;
  e.compute = e.flops / (double(world) * s.peak_flops);
  e.bubble = s.pp > 1 ? double(s.pp - 1) / s.grad_accum : 0.0;
  // tensor parallel: 2 all-reduces forward, 2 backward, 2 more in a fully recomputed forward,
  // of one micro-batch's b x s x C activations, per layer of this stage, per micro-batch
  const double act = double(s.micro_batch) * s.seq_len * f.d_model * s.storage_bytes;
  const int per_layer = s.recompute == nn::recompute::full ? 6 : 4;
  e.tp_comm = double(s.grad_accum) * (f.n_layer / s.pp) * per_layer * all_reduce_seconds(act, s.tp, net.of_group(s.tp, 1));
  // pipeline: each micro-batch's activations forward and their gradient backward, per boundary
  if (s.pp > 1) {
    const link& l = net.of_group(s.pp, s.tp * s.dp);
    e.pp_comm = 2.0 * s.grad_accum * (act / s.tp / (l.bus_gbytes * 1e9) + l.latency_us * 1e-6);
  }
  // data parallel: this rank's gradients (and with ZeRO-1 the all-gather of its parameters),
  // overlapped with the last micro-batch's backward (about 2/3 of its compute)
  if (s.dp > 1) {
    const link& l = net.of_group(s.dp, s.tp);
    const double local = s.parameters / (s.tp * s.pp);
    // ZeRO-1's reduce-scatter of the gradients and all-gather of the parameters each move half
    // of what one all-reduce of their bytes does
    const double bytes = s.zero1 ? local * (s.grad_bytes + s.storage_bytes) / 2.0 : local * s.grad_bytes;
    const double t = all_reduce_seconds(bytes, s.dp, l);
    const double hidden = e.compute / s.grad_accum * 2.0 / 3.0;
    e.dp_comm = std::max(0.0, t - hidden);
  }
  // optimizer offload: the host update's copies at the host link's bandwidth. Overlapped
  // (optim::offload_adamw::update_overlapped), they run beside the next step's first forward,
  // whose layers wait for their own parameters: the forward of one micro-batch on this rank (a
  // third of the model FLOPs without recomputation) hides up to its own time. The host's AdamW
  // pass is not modelled (taken as keeping pace with the copies).
  if (s.offload) {
    if (!(net.host.bus_gbytes > 0))
      throw input_error("estimate_step: optimizer offload needs the host link's bandwidth (network::host)");
    e.offload_copies = s.parameters / (s.tp * s.pp) * (s.grad_bytes + s.storage_bytes) / (net.host.bus_gbytes * 1e9);
    const double forward = flops_per_token(f, s.parameters, s.seq_len, nn::recompute::none) / 3.0 /
                           flops_per_token(f, s.parameters, s.seq_len, s.recompute);
    const double hidden = s.offload_overlap ? e.compute / s.grad_accum * forward : 0.0;
    e.offload = std::max(0.0, e.offload_copies - hidden);
  }
  return e;
}

}  // namespace loom::train
