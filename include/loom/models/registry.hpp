#pragma once
/// \file The model configs a program can choose by name (train_gpt --model), as values:
/// models::model_facts carries a config's sizes without its type, so the code that parses flags,
/// prints banners and checks layouts is compiled once, not once per model.
#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include <loom/models/configs.hpp>

namespace loom::models {

/// The sizes of a models::model_config, as values.
struct model_facts {
  std::string_view name;
  int n_layer = 0, n_head = 0, d_model = 0, vocab = 0, vocab_padded = 0, max_seq = 0;
  int mlp_columns = 0;  ///< the MLP's hidden width (models::mlp_hidden_of): 4 * d_model for GPT-2
  int n_kv_head = 0;    ///< key/value heads (models::kv_heads_of): n_head without grouped-query attention
  std::string_view arch;  ///< the recipe's name ("gpt2", "llama")

  /// "" when layout tp x pp divides the model, else the first quantity it does not divide, as a
  /// sentence with the fix (the run-time twin of models::fits<layout<TP,PP>, M>()).
  std::string layout_problem(int tp, int pp) const {
    const std::string l = "--layout tp" + std::to_string(tp) + "pp" + std::to_string(pp) + ": model " + std::string(name);
    auto bad = [&](const std::string& what, int n, const char* deg, int d) {
      return l + " has " + std::to_string(n) + " " + what + ", not divisible by " + deg + "=" + std::to_string(d) +
             "; choose " + deg + " dividing " + std::to_string(n);
    };
    if (n_head % tp) return bad("attention heads", n_head, "TP", tp);
    if (n_kv_head % tp) return bad("key/value heads", n_kv_head, "TP", tp);
    if (mlp_columns % tp) return bad("MLP columns", mlp_columns, "TP", tp);
    if (vocab_padded % tp) return bad("padded vocabulary rows", vocab_padded, "TP", tp);
    if (n_layer % pp) return bad("layers", n_layer, "PP", pp);
    return {};
  }
};

/// The model_facts of config M.
template <model_config M>
constexpr model_facts facts_of() noexcept {
  return {M::name,         M::n_layer, M::n_head, M::d_model, M::vocab, M::vocab_padded, M::max_seq,
          mlp_hidden_of<M>(), kv_heads_of<M>(), models::arch_of<M>().name};
}

/// The configs a user chooses by name, smallest first (the test configs tiny, tiny_parallel,
/// tiny_untied and llama_tiny are not among them, nor llama_100m, which bench_step runs).
inline constexpr std::array<model_facts, 6> named_models = {facts_of<char_tiny>(),        facts_of<quickstart>(),
                                                            facts_of<llama_quickstart>(), facts_of<quickstart_bpe>(),
                                                            facts_of<bench_small>(),      facts_of<gpt2_small>()};

/// The named config called `name`, or null.
constexpr const model_facts* find_model(std::string_view name) noexcept {
  for (const auto& m : named_models)
    if (m.name == name) return &m;
  return nullptr;
}

/// "char_tiny, quickstart, llama_quickstart, quickstart_bpe, bench_small, gpt2_small".
inline std::string model_names() {
  std::string s;
  for (const auto& m : named_models) s += (s.empty() ? "" : ", ") + std::string(m.name);
  return s;
}

}  // namespace loom::models
