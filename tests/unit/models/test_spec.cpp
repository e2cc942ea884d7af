// models::model_spec (models/spec.hpp) and io::spec_from_hf_config (io/hf_config.hpp): a shape as
// run-time values agrees with the compile-time configs it mirrors, and Hugging Face's
// config.json files of GPT-2 small and Llama 2 7B (their published fields) give those models.
#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>

#include <loom/core/error.hpp>
#include <loom/io/hf_config.hpp>
#include <loom/models/spec.hpp>
#include <loom/models/params.hpp>

namespace lm = loom::models;

namespace {

template <class M>
void check_count() {
  CAPTURE(std::string(M::name));
  CHECK(lm::spec_of<M>().parameter_count() == std::int64_t(loom::models::parameter_count<M>()));
}

// GPT-2 small's config.json as published with the weights (openai-community/gpt2).
nlohmann::json gpt2_config() {
  return nlohmann::json::parse(R"({
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
    "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
    "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": null,
    "summary_first_dropout": 0.1, "summary_proj_to_labels": true, "summary_type": "cls_index",
    "summary_use_proj": true, "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
    "vocab_size": 50257})");
}

// Llama 2 7B's config.json (meta-llama/Llama-2-7b-hf).
nlohmann::json llama2_7b_config() {
  return nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null, "tie_word_embeddings": false,
    "torch_dtype": "float16", "transformers_version": "4.31.0.dev0", "use_cache": true, "vocab_size": 32000})");
}

}  // namespace

TEST_CASE("model_spec: parameter_count equals models::parameter_count for the presets and test configs") {
  check_count<lm::tiny>();
  check_count<lm::tiny_untied>();
  check_count<lm::llama_tiny>();
  check_count<lm::char_tiny>();
  check_count<lm::quickstart_bpe>();
  check_count<lm::llama_quickstart>();
  check_count<lm::gpt2_small>();
  check_count<lm::llama2_7b>();
}

TEST_CASE("model_spec: to_json then from_json gives back every field") {
  auto s = lm::spec_of<lm::llama_tiny>();
  s.rope_theta = 500000.0, s.norm_eps = 3e-6, s.tied_head = true;
  s.name_recipe();
  const auto t = lm::model_spec::from_json(nlohmann::json::parse(s.to_json().dump()), "test");
  CHECK(t.to_json() == s.to_json());
  CHECK(t.arch == "rmsnorm_rotary_swiglu_nobias_tied");
  CHECK(t.hf_model_type.empty());
  CHECK_THROWS_AS(lm::model_spec::from_json(nlohmann::json{{"name", "x"}}, "test"), loom::input_error);
}

TEST_CASE("model_spec: problem names the Megatron flag of a shape that cannot be built") {
  auto s = lm::spec_of<lm::llama_tiny>();
  CHECK(s.problem().empty());
  s.n_head = 5;
  CHECK(s.problem().find("--num-attention-heads 5") != std::string::npos);  // 24 % 5
  s = lm::spec_of<lm::llama_tiny>();
  s.n_kv_head = 4;
  CHECK(s.problem().find("--num-query-groups 4") != std::string::npos);  // 6 % 4
  s = lm::spec_of<lm::gpt2_small>();
  s.norm_eps = 1e-6;
  CHECK(s.problem().find("LayerNorm uses 1e-5") != std::string::npos);
}

TEST_CASE("hf config: GPT-2 small's config.json gives gpt2_small's shape and parameters") {
  const auto s = loom::io::spec_from_hf_config(gpt2_config(), "gpt2/config.json");
  const auto want = lm::spec_of<lm::gpt2_small>();
  CHECK(s.arch == "gpt2");
  CHECK(s.hf_model_type == "gpt2");
  CHECK(s.n_layer == 12);
  CHECK(s.n_head == 12);
  CHECK(s.n_kv_head == 12);
  CHECK(s.d_model == 768);
  CHECK(s.d_ff == 3072);
  CHECK(s.max_seq == 1024);
  CHECK(s.vocab == 50257);
  auto padded = s;
  padded.vocab_padded = lm::round_up(s.vocab, 128);
  CHECK(padded.vocab_padded == want.vocab_padded);
  CHECK(padded.parameter_count() == want.parameter_count());
  CHECK(s.problem().empty());
}

TEST_CASE("hf config: Llama 2 7B's config.json gives 6,738,415,616 parameters, llama2_7b's") {
  const auto s = loom::io::spec_from_hf_config(llama2_7b_config(), "llama/config.json");
  CHECK(s.arch == "llama");
  CHECK(s.hf_model_type == "llama");
  CHECK(s.parameter_count() == 6738415616);
  CHECK(s.parameter_count() == lm::spec_of<lm::llama2_7b>().parameter_count());
  CHECK(s.norm_eps == doctest::Approx(1e-5));
  CHECK(s.rope_theta == 10000.0);
}

TEST_CASE("hf config: a field the recipe cannot express is refused by name") {
  auto refused = [](nlohmann::json j, const std::string& field) {
    CAPTURE(field);
    try {
      (void)loom::io::spec_from_hf_config(j, "config.json");
      FAIL("accepted");
    } catch (const loom::input_error& e) {
      CHECK(std::string(e.what()).find(field) != std::string::npos);
    }
  };
  auto j = llama2_7b_config();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  refused(j, "\"rope_scaling\"");
  j = llama2_7b_config();
  j["attention_bias"] = true;
  refused(j, "\"attention_bias\"");
  j = llama2_7b_config();
  j["num_experts_per_tok"] = 2;
  refused(j, "\"num_experts_per_tok\"");
  j = llama2_7b_config();
  j["model_type"] = "mistral";
  j["sliding_window"] = 1024;
  refused(j, "\"sliding_window\"");
  j["sliding_window"] = nullptr;
  CHECK(loom::io::spec_from_hf_config(j, "config.json").arch == "llama");
  j = llama2_7b_config();
  j["model_type"] = "qwen2";
  refused(j, "q/k/v biases");
  j = gpt2_config();
  j["activation_function"] = "relu";
  refused(j, "\"activation_function\"");
  j = gpt2_config();
  j.erase("n_layer");
  refused(j, "\"n_layer\"");
}
