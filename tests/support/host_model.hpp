#pragma once
// Test support: the smallest GPT-2 model config loom accepts, and a parameter holder with the
// members io::import_gpt2 and io::load_weights read (model, storage_t, layout, device, table,
// offsets, num_tensors, num_parameters, parameters(), parameter(k)), built from the same
// models::param_table a loom::nn::transformer uses — without the model's kernels, so a test or fuzz target that
// only loads weights compiles in seconds.
#include <cstddef>
#include <string_view>
#include <vector>

#include <loom/core/view.hpp>
#include <loom/device/cpu.hpp>
#include <loom/models/params.hpp>
#include <loom/core/layout.hpp>

namespace loom::test {

/// GPT-2 recipe, one layer, one head, width 2, two positions, vocabulary 3 (padded to 4): 90
/// parameters, so a whole weights file fits a fuzz seed of about 1.5 KiB.
struct micro_gpt2 {
  static constexpr std::string_view name = "micro_gpt2";
  static constexpr int n_layer = 1, n_head = 1, d_model = 2, max_seq = 2;
  static constexpr int vocab = 3, vocab_padded = 4;
};

/// The parameters of model M on one CPU rank (layout<1,1>), in loom's buffer order.
template <class M>
struct host_model {
  using model = M;
  using storage_t = float;
  using layout = ::loom::parallel::layout<1, 1>;
  using device = ::loom::device::cpu;
  static constexpr auto table = models::param_table<M, layout>();
  static constexpr std::size_t num_tensors = table.size();
  static constexpr auto offsets = models::param_offsets<M, layout>();
  static constexpr std::size_t num_parameters = offsets.back();

  std::vector<float> values = std::vector<float>(num_parameters, 0.0f);

  /// Every parameter, in buffer order.
  view<device, float> parameters() const noexcept { return {const_cast<float*>(values.data()), values.size()}; }
  /// The whole tensor of table row k.
  view<device, float> parameter(std::size_t k) const noexcept { return parameters().subview(offsets[k], table[k].size()); }
};

}  // namespace loom::test
