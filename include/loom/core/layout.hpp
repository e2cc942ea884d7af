#pragma once
/// \file layout<TP,PP>: the shape-changing parallel degrees (models/fits.hpp checks them against a
/// model at compile time).
///
/// Tensor-parallel degree TP and pipeline-parallel degree PP change every per-rank shape, so
/// they are template arguments; the data-parallel degree dp = world_size / (TP*PP) is read
/// from the communicator at run time, so one binary runs on 1 or 64 replicas.
/// Rank order (Megatron-LM's): tensor-parallel rank varies fastest, then data-parallel, then
/// pipeline stage. Worked example, TP=2, PP=2, world 8 (dp=2):
///   rank: 0 1 2 3 4 5 6 7
///   tp  : 0 1 0 1 0 1 0 1
///   dp  : 0 0 1 1 0 0 1 1
///   pp  : 0 0 0 0 1 1 1 1
#include <concepts>

namespace loom::parallel {

template <int TP, int PP = 1>
struct layout {
  static_assert(TP >= 1, "loom::layout<TP,PP>: the tensor-parallel degree TP must be at least 1");
  static_assert(PP >= 1, "loom::layout<TP,PP>: the pipeline-parallel degree PP must be at least 1");
  static constexpr int tp = TP, pp = PP;
  static constexpr int tp_rank(int rank) noexcept { return rank % TP; }
  static constexpr int dp_rank(int rank, int dp) noexcept { return (rank / TP) % dp; }
  static constexpr int pp_rank(int rank, int dp) noexcept { return rank / (TP * dp); }
};

/// Plain data parallelism: every rank holds the whole model.
using ddp = layout<1, 1>;

/// A layout policy: a type with integral tp and pp (layout<TP, PP>; what loom::policy's Layout,
/// models::fits and models::param_table take).
template <class L>
concept layout_policy = requires {
  { L::tp } -> std::convertible_to<int>;
  { L::pp } -> std::convertible_to<int>;
};

}  // namespace loom::parallel

namespace loom {
using parallel::layout;
}
