#pragma once
/// \file train::gpt_whole_model: the train::whole_model (train/session.hpp) of one config, an
/// fp32 nn::transformer on the CPU: saving, Hugging Face export and import, sampling. Compiled once per
/// model in loom::sessions (cmake/LoomSessions.cmake).
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/device/cpu.hpp>
#include <loom/io/hf_gpt2.hpp>
#include <loom/io/hf_llama.hpp>
#include <loom/io/weights.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/nn/generate_in_vocab.hpp>
#include <loom/nn/transformer.hpp>
#include <loom/policy.hpp>
#include <loom/train/session_instance.hpp>

namespace loom::train {

/// whole_model for config M: an nn::transformer<M, policy<cpu, fp32>> initialised with `seed`.
template <models::model_config M>
class gpt_whole_model final : public whole_model {
  using gpt_t = nn::transformer<M, policy<device::cpu, precision::fp32>>;
  static constexpr std::string_view hf = models::arch_of<M>().hf_model_type;
  [[noreturn]] static void no_hf(const char* flag, const std::filesystem::path& dir) {
    throw input_error(std::string(flag) + " '" + dir.string() + "': model " + std::string(M::name) + " has architecture '" +
                      std::string(models::arch_of<M>().name) +
                      "', which loom maps to no Hugging Face model; save loom weights (--out) or a checkpoint instead");
  }

 public:
  explicit gpt_whole_model(std::uint64_t seed) : model_(ctx_, seed) {}
  const model_facts& model() const noexcept override { return facts_ref<M>(); }
  std::span<float> parameters() noexcept override {
    auto p = model_.parameters();
    return {p.data(), p.size()};
  }
  void save_weights(const std::filesystem::path& path, const std::map<std::string, std::string>& meta) const override {
    io::save_weights(model_, path, meta);
  }
  void load_weights(const std::filesystem::path& path) override { io::load_weights(model_, path); }
  /// Throws loom::input_error for a recipe without a Hugging Face map (models::recipe::hf_model_type).
  void export_hf(const std::filesystem::path& dir) const override {
    if constexpr (hf == "gpt2") io::export_gpt2(ctx_, model_, dir);
    else if constexpr (hf == "llama") io::export_llama(ctx_, model_, dir);
    else no_hf("--export-hf", dir);
  }
  void import_hf(const std::filesystem::path& dir) override {
    if constexpr (hf == "gpt2") io::import_gpt2(ctx_, model_, dir);
    else if constexpr (hf == "llama") io::import_llama(ctx_, model_, dir);
    else no_hf("--init-from-hf", dir);
  }
  void generate(std::vector<std::int32_t>& tokens, int count, const nn::sampling& s, int vocab) const override {
    typename gpt_t::template activations<1, M::max_seq> acts(ctx_);
    nn::generate_in_vocab(model_, ctx_, acts, tokens, count, s, vocab);
  }

 private:
  mutable context<device::cpu> ctx_;
  gpt_t model_;
};

}  // namespace loom::train
