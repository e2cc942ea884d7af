#pragma once
// Pieces of train_gpt's training loop shared by train_gpt.cpp (one layout, DDP over --ranks /
// mpirun) and run_layout.hpp (--layout tpXppY). Not a library header: examples/ only.
#include <optional>
#include <string>

#include <loom/io/jsonl.hpp>
#include <loom/io/scalar.hpp>
#include <loom/io/tensorboard.hpp>
#include <loom/train/console.hpp>

namespace train_gpt_cli {

/// After step `step` of a run with a dynamic loss scaler (fp16): writes the scale the step used
/// (`r.loss_scale`) as `train/loss_scale` to the TensorBoard and JSON-lines logs (those that are
/// open), prints a console line on the lead rank when the step was skipped or the scale changed
/// (`r.loss_scale -> scaler.scale()`), and passes the scaler's warning (`r.warning`, if any) to
/// `warn`. Result: train::step_result; Scaler: train::dynamic_loss_scaler.
template <class Result, class Scaler, class Warn>
void report_loss_scale(long step, const Result& r, const Scaler& scaler, bool lead, loom::train::console& con,
                       Warn&& warn, std::optional<loom::io::tensorboard_writer>& tb,
                       std::optional<loom::io::jsonl_writer>& jsonl) {
  if (lead && (r.skipped || r.loss_scale != scaler.scale()))
    con.message("step " + std::to_string(step) + (r.skipped ? ": non-finite gradients, step skipped" : "") +
                " | loss scale " + std::to_string(r.loss_scale) + " -> " + std::to_string(scaler.scale()));
  if (!r.warning.empty()) warn(r.warning);
  const loom::io::scalar sc[] = {{"train/loss_scale", r.loss_scale}};
  if (tb) tb->add_scalars(step, sc);
  if (jsonl) jsonl->write_scalars(step, sc);
}

}  // namespace train_gpt_cli
