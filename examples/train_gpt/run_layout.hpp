#pragma once
// train_gpt --layout tpXppY: chooses the compiled instantiation of the run loop (train_gpt/run.hpp)
// for a layout<TP,PP> with TP*PP > 1 (tensor and pipeline parallel, data parallel on top;
// docs/tensor_pipeline.md). Included by train_gpt/layout_*.cpp only, each instantiating
// run_layout<Model, World> for one model. bf16/fp16 only for char_tiny (run_layout_16bit,
// layout_char_tiny_16bit.cpp) and only on tp2pp2.
#include <string>
#include <type_traits>

#include <loom/core/error.hpp>

#include "options.hpp"
#include "run.hpp"

namespace train_gpt_cli {

/// Chooses the compiled fp32 instantiation for (tp, pp); B, T the model's capacities in train_gpt.
template <class M, int B, int T, class World>
int dispatch_layout(const options& o, int tp, int pp, World& world) {
  check_layout_fits<M>(tp, pp);
  check_layout_run(o, tp, pp, world.size());
  if constexpr (std::is_same_v<M, loom::models::char_tiny>)  // the only model with 16-bit instantiations
    if (o.precision != "fp32") return run_layout_16bit<M>(o, tp, pp, world);
  if (tp == 2 && pp == 1) return run<M, B, T, 2, 1>(o, &world);
  if (tp == 1 && pp == 2) return run<M, B, T, 1, 2>(o, &world);
  if (tp == 2 && pp == 2) return run<M, B, T, 2, 2>(o, &world);
  throw loom::input_error("--layout tp" + std::to_string(tp) + "pp" + std::to_string(pp) +
                          " is not compiled into this train_gpt; compiled layouts: tp1pp1, tp2pp1, tp1pp2, tp2pp2 "
                          "(add an instantiation in examples/train_gpt/run_layout.hpp for more)");
}

/// The 16-bit instantiations (tp2pp2 only: each costs compile time; check_layout_run has
/// refused every other 16-bit combination already); see layout_char_tiny_16bit.cpp.
template <class M, int B, int T, class World>
int dispatch_layout_16bit(const options& o, int tp, int pp, World& world) {
  if (tp == 2 && pp == 2 && o.precision == "bf16") return run<M, B, T, 2, 2, World, loom::precision::bf16>(o, &world);
  if (tp == 2 && pp == 2 && o.precision == "fp16") return run<M, B, T, 2, 2, World, loom::precision::fp16>(o, &world);
  throw loom::input_error("--layout tp" + std::to_string(tp) + "pp" + std::to_string(pp) + " --precision " + o.precision +
                          " is not compiled into this train_gpt; 16-bit layouts: tp2pp2 with --model char_tiny");
}

}  // namespace train_gpt_cli
