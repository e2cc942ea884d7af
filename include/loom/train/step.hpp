#pragma once
/// \file What a trainer's step takes and returns, and the checks on a batch of token ids:
/// train::trainer_config, train::step_result, validate_tokens, count_targets, split_windows.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <loom/core/error.hpp>
#include <loom/kernels/ops.hpp>
#include <loom/nn/activations.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/optim/lr_schedule.hpp>
#include <loom/precision/loss_scaler.hpp>

namespace loom::train {

/// Settings that do not change shapes (runtime).
struct trainer_config {
  int micro_batch = 0;             ///< sequences per micro-batch, 1..B (0: the capacity B)
  int seq_len = 0;                 ///< tokens per sequence, 1..T (0: the capacity T)
  int grad_accum = 1;              ///< micro-batches per optimizer step
  optim::cosine_schedule schedule; ///< learning rate per step
  optim::adamw_config adamw;       ///< AdamW and clipping
  std::uint64_t seed = 1337;       ///< parameter initialisation seed; also keys the dropout masks
  /// Dropout probability in [0, 1) (train_gpt --dropout): embedding, attention-probability and
  /// residual dropout (nn/dropout.hpp), training steps only — evaluate() and sampling run
  /// without it. 0 (the default) is off and bitwise the model without dropout. The masks depend
  /// only on (seed, step, global micro-batch, layer, position), so a resumed run repeats the
  /// uninterrupted one. CPU only so far: p > 0 on device::ascend is refused at construction.
  double dropout = 0;
  /// Activation recomputation (train_gpt --recompute; nn::recompute in nn/activations.hpp):
  /// none keeps every block's activations, selective reruns the attention core and the MLP
  /// activation in backward, full keeps only each block's input and reruns the block. The
  /// activation tables are sized for it; losses and gradients are bitwise those of none.
  nn::recompute recompute = nn::recompute::none;
  precision::loss_scaler_config loss_scaler;  ///< dynamic loss scaling (used when the trainer has a loss scaler)
  /// Optimizer offload (train_gpt --offload-optimizer; optim/offload.hpp, ZeRO-Offload
  /// arXiv:2101.06840): the fp32 master weights and AdamW moments live in pinned host memory and
  /// the update runs on the host, streamed in chunks of offload_chunk elements. Devices with a
  /// transfer stream only (device::ascend); device::cpu refuses it (its state is host memory
  /// already), and so does ZeRO-1.
  bool offload_optimizer = false;
  std::size_t offload_chunk = std::size_t(1) << 20;  ///< elements per streamed chunk (multiple of 32)
  /// With offload_optimizer: the host update overlaps the next step's forward (chunks in forward
  /// order on a host thread of the optimizer, each layer of the forward waiting on the device for
  /// its own parameters; optim::offload_adamw::update_overlapped), bitwise the same results as
  /// without (train_gpt --offload-overlap off: the update finishes before the next step).
  bool offload_overlap = true;
};

/// What one optimizer step did.
struct step_result {
  double loss = 0;        ///< mean cross-entropy over the global batch's non-ignored targets (nats/token)
  double grad_norm = 0;   ///< global L2 norm before clipping
  double lr = 0;          ///< learning rate used
  bool skipped = false;   ///< true when the gradient norm was not finite: nothing was updated
  long tokens = 0;        ///< non-ignored target tokens in the global batch
  double loss_scale = 1;  ///< loss scale S this step ran with (1 without a loss scaler)
  std::string warning;    ///< the loss scaler's warning (scale reduced too often), else empty
};

/// Checks that every id in `ids` lies in [0, vocab) (or equals ignore for targets) and
/// throws loom::input_error naming the first offending id and its position otherwise.
inline void validate_tokens(std::span<const std::int32_t> ids, int vocab, std::string_view what) {
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      throw input_error(std::string(what) + ": token id " + std::to_string(ids[i]) + " at position " +
                        std::to_string(i) + " is outside the model's vocabulary [0, " + std::to_string(vocab) +
                        "); re-tokenize the data with at most " + std::to_string(vocab) +
                        " tokens or choose a model with a larger vocabulary");
}

/// Number of targets in `targets` that are not kernels::ignore_index (-1): the tokens a batch
/// learns from. Throws loom::input_error (via validate_tokens) naming the first id outside
/// [0, vocab) that is not the ignore index.
inline long count_targets(std::span<const std::int32_t> targets, int vocab) {
  long count = 0;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] == kernels::ignore_index) continue;
    if (targets[i] < 0 || targets[i] >= vocab) validate_tokens(targets.subspan(i, 1), vocab, "training targets");
    ++count;
  }
  return count;
}

/// Rows of seq_len+1 token ids (row-major) -> inputs row[0..seq_len) and targets row[1..seq_len],
/// each (rows, seq_len) int32. Writes `in` and `tg` (at least rows * seq_len ids each).
inline void split_windows(std::span<const std::int32_t> w, std::size_t seq_len, std::span<std::int32_t> in,
                          std::span<std::int32_t> tg) {
  const std::size_t wn = seq_len + 1;
  for (std::size_t r = 0; r * wn < w.size(); ++r)
    for (std::size_t i = 0; i < seq_len; ++i) {
      in[r * seq_len + i] = w[r * wn + i];
      tg[r * seq_len + i] = w[r * wn + i + 1];
    }
}


}  // namespace loom::train
