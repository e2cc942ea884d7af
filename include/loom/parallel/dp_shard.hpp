#pragma once
/// \file The part of the parameter buffer one data-parallel rank owns under ZeRO-1, as the
/// data-parallel engine (parallel/data_parallel.hpp) cuts it and a sharded optimizer
/// (optim/zero1.hpp) keeps its state for it.
///
/// Include order between parallel/ and optim/: one way only. parallel/ never includes optim/
/// (the engine reduces and gathers, knowing nothing of the update rule); optim/zero1.hpp
/// includes this header; train/ includes both and connects them (train::trainer).
#include <cstddef>

namespace loom::parallel {

/// One contiguous piece of a data-parallel rank's shard: elements [param_offset, param_offset +
/// length) of the parameter buffer (models::param_table order, this rank's model-parallel cell) are
/// held at [shard_offset, shard_offset + length) of the rank's shard arrays (AdamW moments and,
/// below fp32, master weights). A rank's pieces are disjoint and sorted by shard_offset, which
/// runs from 0 without gaps; the pieces of all ranks of the group cover the parameter buffer
/// exactly once. A piece never crosses a table row (one tensor, or one layer's slice of it).
struct shard_range {
  std::size_t param_offset = 0;
  std::size_t length = 0;
  std::size_t shard_offset = 0;
};

/// A block of reduced gradients in shard coordinates: data[0, length) are the gradients (summed
/// over the data-parallel group) of shard elements [shard_offset, shard_offset + length). The
/// engine hands one block per bucket to the optimizer; `data` lives in the engine's bucket and is
/// valid only during the call that receives it.
template <class T>
struct grad_block {
  std::size_t shard_offset = 0;
  std::size_t length = 0;
  const T* data = nullptr;
};

}  // namespace loom::parallel
