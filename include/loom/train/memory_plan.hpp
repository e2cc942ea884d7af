#pragma once
/// \file train::memory_plan: the bytes one rank of a trainer allocates, computed before anything
/// is allocated from the same compile-time tables the trainer allocates from
/// (train::trainer::plan; examples/plan prints it for a compiled instance).
#include <cstddef>

namespace loom::train {

/// One rank's allocation by kind, in bytes. Equal, kind by kind, to what the constructed trainer
/// holds (tested for every layout of the layout matrix): parameters and gradients
/// (model().parameters()/gradients()), master_weights + moments (optimizer_bytes(): AdamW's, or
/// this rank's ZeRO-1 shard), activations (activation_bytes(): the parallel::max_in_flight
/// activation tables of its pipeline stage, sized for the recompute mode) and buckets (the
/// data-parallel engine's bucket buffers, data_parallel::memory()). With optimizer offload
/// (trainer_config::offload_optimizer) master_weights and moments are 0 and host_optimizer holds
/// the pinned host bytes of the offloaded state (host_optimizer_bytes()); total() counts the
/// device-side kinds only.
struct memory_plan {
  std::size_t parameters = 0;      ///< this rank's parameters in the storage type
  std::size_t gradients = 0;       ///< their gradients (fp32 below fp32 storage)
  std::size_t master_weights = 0;  ///< fp32 master weights (16-bit storage only; 1/DP with ZeRO-1)
  std::size_t moments = 0;         ///< AdamW's first and second moments (1/DP with ZeRO-1)
  std::size_t activations = 0;     ///< activation tables (saved tensors and backward scratch)
  std::size_t buckets = 0;         ///< data-parallel bucket buffers (0 without data parallelism)
  /// Pinned host memory of an offloaded optimizer (optim::offload_adamw::host_bytes_of: fp32
  /// masters, both moments and two staging slots); 0 without offload.
  std::size_t host_optimizer = 0;

  /// master_weights + moments: what the trainer reports as its (device) optimizer state.
  std::size_t optimizer() const noexcept { return master_weights + moments; }
  /// The device-side bytes (host_optimizer excluded).
  std::size_t total() const noexcept { return parameters + gradients + optimizer() + activations + buckets; }
};

}  // namespace loom::train
