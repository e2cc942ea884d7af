#pragma once
/// \file loom::gpt<Model, Policy, Attention>: the whole model on one rank (layout<1,1>; data
/// parallelism replicates it), forward and backward — nn::transformer (nn/model.hpp), the one class
/// for every layout.
#include <loom/nn/model.hpp>

namespace loom::nn {

/// The model on one rank: nn::transformer<M, Policy, Attn> with Policy::layout = layout<1,1>
/// (loom::gpt<M, Policy> keeps user code of the single-layout API compiling).
template <models::model_config M, class Policy, class Attn = kernels::fused>
using gpt = transformer<M, Policy, Attn>;

}  // namespace loom::nn

namespace loom {
using nn::gpt;
}
