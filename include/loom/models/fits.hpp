#pragma once
/// \file models::fits<L, M>(): whether layout L (core/layout.hpp) can split model M, at compile
/// time; models::model_facts::layout_problem (models/registry.hpp) is its run-time twin.
#include <loom/core/layout.hpp>
#include <loom/models/configs.hpp>

namespace loom::models {

/// Compile-time check that layout L can split model M. Each failure is a static_assert whose
/// message reads as a sentence naming the quantities and the fix. Use as
/// `static_assert(fits<L, M>())` or let loom::nn::transformer do it for you.
template <parallel::layout_policy L, class M>
consteval bool fits() {
  static_assert(M::d_model % M::n_head == 0,
                "the model's d_model must be a multiple of n_head: every head gets d_model/n_head channels");
  static_assert(M::n_head % L::tp == 0,
                "the tensor-parallel degree TP must divide n_head: a tensor-parallel rank owns whole attention heads");
  static_assert(kv_heads_of<M>() % L::tp == 0,
                "the tensor-parallel degree TP must divide n_kv_head: a tensor-parallel rank owns whole key/value "
                "heads (grouped-query attention splits query and key/value heads alike)");
  static_assert(mlp_hidden_of<M>() % L::tp == 0,
                "the tensor-parallel degree TP must divide the MLP width (d_ff, 4*d_model by default): fc1 is split "
                "by columns");
  static_assert(M::vocab_padded % L::tp == 0,
                "the tensor-parallel degree TP must divide vocab_padded: the embedding is split by vocabulary rows");
  static_assert(M::n_layer % L::pp == 0,
                "the pipeline-parallel degree PP must divide n_layer: every stage gets the same number of layers");
  return true;
}

}  // namespace loom::models
