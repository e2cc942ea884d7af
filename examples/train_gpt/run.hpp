#pragma once
// train_gpt's run loop (train_gpt/run.cpp), compiled once for every model, precision, layout and
// communicator. Not a library header: examples/ only.
#include <loom/train/session.hpp>

#include "options.hpp"

namespace train_gpt_cli {

/// One rank's run of train_gpt with the flags `o` on the compiled instance `inst` over `world`
/// (world_ref::none() for one rank without data parallelism); `npu` the CANN runtime for a
/// device "ascend" instance (null for cpu). Returns 0; throws loom::input_error for bad input
/// (on every rank alike where it is collective).
int run(const options& o, const loom::train::session_instance& inst, loom::train::world_ref world,
        std::shared_ptr<const loom::device::ascend_runtime> npu);

}  // namespace train_gpt_cli
