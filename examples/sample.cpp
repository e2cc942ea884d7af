// sample — generate text from weights saved by train_gpt, with temperature and top-k.
//
//   sample --weights out/quickstart.safetensors --prompt "ROMEO:" --tokens 500 --temperature 0.8 --top-k 40
//   sample --weights out/quickstart_bpe.safetensors --tokenizer out/shakespeare.model --prompt "ROMEO:"
//
// The model config is read from the file's metadata (any named config: char_tiny, quickstart,
// quickstart_bpe, bench_small, gpt2_small). Byte-level models (vocabulary 256) read
// and write bytes; a model trained on a prepare_data dataset (quickstart_bpe) needs that
// data's SentencePiece model: --tokenizer, else the "tokenizer" path train_gpt recorded in the
// weights' metadata (a build with LOOM_WITH_TEXT). The prompt is normalized as the training
// text was (the normalization prepare_data recorded in PREFIX.json beside PREFIX.model: e.g.
// full-width letters and digits become ASCII), encoded with it, and the ids decoded, a blank
// line for each end-of-document id; the printed prompt is its normalized form. Weights trained on
// a text file (train_gpt recorded their "data" and no "tokenizer") are byte-level: --tokenizer is
// refused for them. The tokenizer (recorded or --tokenizer) must be the one the weights were
// trained with: train_gpt records its XXH3-64 ("tokenizer_xxh3_64"), and a tokenizer that
// differs (e.g. PREFIX.model after prepare_data was run again on the prefix, which keeps the old
// one as PREFIX.previous-<k>.model) is refused, naming a kept file that matches when there is
// one; weights saved before the checksum was recorded get a note on stderr that it is not
// verified. Errors (missing/corrupt file, unknown model, missing or other tokenizer, a tokenizer
// for byte-level weights, bad flag) exit with status 2 and one line naming the problem and the fix.
#include "cli.hpp"  // CLI11 and parse_or_exit
#include "on_demand.hpp"  // instance_cache()
#include "generate_text.hpp"
#include "tokenizer_checksum.hpp"

#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <loom/data/source.hpp>
#if LOOM_WITH_TEXT
#include <loom/data/text/tokenizer.hpp>  // SentencePiece: links loom::text
#endif
#include <loom/device/cpu.hpp>
#include <loom/io/weights.hpp>
#include <loom/models/registry.hpp>
#include <loom/train/session.hpp>  // the whole models of loom::sessions: one per named config

namespace {

struct options {
  std::string weights, prompt = "\n", tokenizer;  // tokenizer: a SentencePiece .model, or empty for bytes
  int tokens = 500, top_k = 0;
  double temperature = 0.8;
  std::uint64_t seed = 42;
};

/// Samples from the weights in o.weights with the whole model `model` (its config).
int run(const options& o, loom::train::whole_model& model) {
  using namespace loom;
  model.load_weights(o.weights);
  const auto& m = model.model();
#if LOOM_WITH_TEXT
  std::optional<data::text::tokenizer> tok;
  if (!o.tokenizer.empty()) {
    tok = data::text::tokenizer::load(o.tokenizer);
    if (tok->vocab_size() > m.vocab)
      throw input_error("tokenizer '" + o.tokenizer + "' has a vocabulary of " + std::to_string(tok->vocab_size()) +
                        " tokens, more than the " + std::to_string(m.vocab) + " of model " + std::string(m.name) +
                        "; pass the tokenizer of the data these weights were trained on");
  }
  const auto* sample_tok = tok ? &*tok : nullptr;
#else
  const loom_examples::sample_tokenizer* sample_tok = nullptr;
#endif
  const std::string text =
      loom_examples::generate_text(model, o.prompt, o.tokens, {o.temperature, o.top_k, o.seed}, sample_tok);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

/// Whether the weights' metadata says they were trained on bytes: train_gpt records the "data"
/// of every run and, for a prepare_data dataset, its "tokenizer"; "data" without "tokenizer" is
/// a text file read as bytes. Then --tokenizer (o.tokenizer) is refused with loom::input_error:
/// its pieces are not the ids the model learned. Weights that record neither (not written by
/// train_gpt) cannot be checked: a warning says so when --tokenizer is given.
bool check_tokenizer_matches(const options& o, const std::map<std::string, std::string>& meta) {
  const auto data = meta.find("data");
  const bool bytes = data != meta.end() && !meta.contains("tokenizer");
  if (bytes && !o.tokenizer.empty())
    throw loom::input_error("--tokenizer '" + o.tokenizer + "': weights file '" + o.weights + "' was trained on the "
                            "bytes of the text file '" + data->second + "' (no tokenizer recorded), so its ids are "
                            "bytes, not SentencePiece pieces; drop --tokenizer");
  if (data == meta.end() && !meta.contains("tokenizer") && !o.tokenizer.empty())
    std::fprintf(stderr, "sample: warning: weights file '%s' records neither its training data nor a tokenizer (not "
                 "saved by train_gpt), so whether --tokenizer '%s' is the one it was trained with cannot be checked\n",
                 o.weights.c_str(), o.tokenizer.c_str());
  return bytes;
}

/// Checks the tokenizer o.tokenizer (--tokenizer, or the one the weights record) against the
/// XXH3-64 train_gpt recorded for the tokenizer the weights were trained with
/// (tokenizer_checksum_key). Throws loom::input_error naming both files, the two checksums and
/// the fix when they differ: --tokenizer with a file that has the recorded checksum (the
/// recorded path, or a kept PREFIX.previous-<k>.model; matching_tokenizer) when there is one.
/// A tokenizer that also fails the checksum its dataset's .json records is reported as damaged
/// (tokenizer::verify_against_sidecar) before any mismatch. Weights that record a tokenizer but
/// no checksum (saved by an earlier train_gpt) load unverified, with a note on stderr. A
/// tokenizer file that does not exist is left to its loading, which names it.
void check_tokenizer_checksum(const options& o, const std::map<std::string, std::string>& meta) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (o.tokenizer.empty() || !fs::exists(o.tokenizer, ec)) return;
  const auto recorded = meta.find("tokenizer");
  const auto sum = meta.find(std::string(loom_examples::tokenizer_checksum_key));
  if (sum == meta.end()) {
    if (recorded != meta.end())
      std::fprintf(stderr, "sample: note: weights file '%s' records no checksum of its tokenizer (saved by an earlier "
                   "train_gpt), so tokenizer '%s' is not verified to be the one it was trained with\n",
                   o.weights.c_str(), o.tokenizer.c_str());
    return;
  }
  const std::string has = loom_examples::file_xxh3(o.tokenizer);
  if (has == sum->second) return;
#if LOOM_WITH_TEXT
  // a file damaged since prepare_data wrote it: say that (and its fix) rather than "another tokenizer"
  (void)loom::data::text::tokenizer::verify_against_sidecar(o.tokenizer);
#endif
  const fs::path recorded_path = recorded == meta.end() ? fs::path() : fs::path(recorded->second);
  const bool is_recorded = !recorded_path.empty() && fs::equivalent(recorded_path, o.tokenizer, ec);
  const std::string sums = "XXH3-64 " + has + ", the weights record " + sum->second;
  const std::string what =
      is_recorded ? "the tokenizer '" + o.tokenizer + "' recorded in weights file '" + o.weights +
                        "' changed after the weights were trained with it (" + sums + "; was prepare_data run again "
                        "on that prefix?)"
                  : "--tokenizer '" + o.tokenizer + "' is not the tokenizer weights file '" + o.weights +
                        "' was trained with (" + sums +
                        (recorded_path.empty() ? std::string() : " for '" + recorded_path.string() + "'") + ")";
  const fs::path match = loom_examples::matching_tokenizer(recorded_path, o.tokenizer, sum->second);
  throw loom::input_error(what + "; " +
                          (match.empty() ? std::string("pass --tokenizer with the .model the weights were trained "
                                                       "with (prepare_data keeps an earlier dataset's as "
                                                       "PREFIX.previous-<k>.model), or train again on the new data")
                                         : "pass --tokenizer " + match.string() + ", which has the recorded checksum"));
}

}  // namespace

int main(int argc, char** argv) {
  loom::device::configure_host_malloc_for_gemm();
  options o;
  CLI::App app{"sample: generate text from a GPT saved by train_gpt (byte-level, or SentencePiece with --tokenizer)"};
  app.option_defaults()->always_capture_default();  // --help shows every default
  app.add_option("--weights", o.weights, "weights file written by train_gpt")->required();
  app.add_option("--prompt", o.prompt,
                 "text to continue (with a tokenizer: normalized first, as prepare_data normalized the training text)");
  app.add_option("--tokenizer", o.tokenizer,
                 "SentencePiece .model of the data the weights were trained on (prepare_data's PREFIX.model; "
                 "default: the one recorded in the weights, if any)");
  app.add_option("--tokens,--sample-tokens", o.tokens,
                 "tokens to generate, >= 1 (bytes for a byte-level model; --sample-tokens as in train_gpt)");
  app.add_option("--temperature", o.temperature, "sampling temperature (> 0)");
  app.add_option("--top-k", o.top_k, "sample from the k most likely tokens (0: all)");
  app.add_option("--seed", o.seed, "seed of the sampling draws");
  loom_examples::parse_or_exit(app, argc, argv);
  try {
    if (o.tokens < 1)
      throw loom::input_error("--tokens " + std::to_string(o.tokens) +
                              " generates nothing (the output would be the prompt alone); pass --tokens 1 or more");
    if (o.top_k < 0)
      throw loom::input_error("--top-k " + std::to_string(o.top_k) + " is negative; pass --top-k 0 to sample from all tokens, or k >= 1");
    if (!(o.temperature > 0)) {
      char got[32];
      std::snprintf(got, sizeof got, "%g", o.temperature);
      throw loom::input_error(std::string("--temperature must be > 0 (got ") + got +
                              "); lower values (e.g. 0.5) make the text more predictable, 1 samples the model as trained");
    }
    const loom::io::safetensors_reader file(o.weights);
    (void)loom::io::verify_weights_checksum(file);  // before trusting its metadata (model, tokenizer)
    const auto it = file.metadata().find("model");
    const std::string name = it == file.metadata().end() ? "" : it->second;
    const bool bytes = check_tokenizer_matches(o, file.metadata());
    // the tokenizer: --tokenizer, else the one train_gpt recorded (if it is still there)
    if (const auto t = file.metadata().find("tokenizer"); o.tokenizer.empty() && t != file.metadata().end()) {
      if (!std::filesystem::exists(t->second))
        throw loom::input_error("weights file '" + o.weights + "' was trained with the tokenizer '" + t->second +
                                "', which does not exist; pass --tokenizer PREFIX.model (written by prepare_data)");
      o.tokenizer = t->second;
    }
#if !LOOM_WITH_TEXT
    if (!o.tokenizer.empty())
      throw loom::input_error("this sample was built without LOOM_WITH_TEXT, so it cannot use the SentencePiece tokenizer '" +
                              o.tokenizer + "'; rebuild loom with SentencePiece (scripts/setup.sh)");
#endif
    check_tokenizer_checksum(o, file.metadata());  // the tokenizer the weights were trained with, not a newer one
    if ((name == "quickstart_bpe" || name == "llama_quickstart") && o.tokenizer.empty() && !bytes)  // others: bytes
      throw loom::input_error("weights file '" + o.weights + "' is for model " + name + ", whose ids are SentencePiece "
                              "tokens; pass --tokenizer PREFIX.model, the tokenizer of the data it was trained on");
    auto whole = loom::train::find_whole_model(loom::train::compiled_sessions(), name);
    if (!whole) {  // a shape this program does not contain: its whole model, compiled on first use
      const auto spec = file.metadata().find("model_spec");
      if (spec == file.metadata().end())
        throw loom::input_error("weights file '" + o.weights + "' is for model '" + name +
                                "', which this sample program does not contain, and records no model_spec to compile "
                                "it from; use weights written by train_gpt");
      loom::train::instance_request r;
      r.spec = loom::models::model_spec::from_json(nlohmann::json::parse(spec->second), o.weights + " (model_spec)");
      r.whole_only = true, r.seq_len = r.spec.max_seq;
      whole = loom_examples::instance_cache().get(r, &std::cerr).whole;
    }
    return run(o, *whole(o.seed));
  } catch (const loom::input_error& e) {
    std::fprintf(stderr, "sample: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sample: failed: %s\n", e.what());
    return 1;
  }
}
