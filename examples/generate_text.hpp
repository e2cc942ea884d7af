#pragma once
// The sample of train_gpt and sample: a prompt to text through a train::whole_model. Not a
// library header: examples/ only.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <loom/data/source.hpp>  // decode_documents
#include <loom/data/utf8.hpp>    // printable_utf8
#include <loom/nn/generate.hpp>
#include <loom/train/session.hpp>
#if LOOM_WITH_TEXT
#include <loom/data/text/tokenizer.hpp>  // SentencePiece: links loom::text
#endif

namespace loom_examples {

#if LOOM_WITH_TEXT
using sample_tokenizer = loom::data::text::tokenizer;
#else
using sample_tokenizer = void;
#endif

/// `prompt` continued by `count` tokens of `model` under `s`, as text. Without `tok` the ids
/// are bytes (drawn from the model's first min(256, vocab) ids); bytes that form no UTF-8, and
/// control bytes other than newline and tab, come back as U+FFFD. With `tok` the prompt is
/// encoded with it, the ids drawn from its pieces only (nn::generate_in_vocab) and decoded, a
/// blank line for each end of document. Throws loom::input_error as train::whole_model::generate does.
inline std::string generate_text(const loom::train::whole_model& model, const std::string& prompt, int count,
                                 const loom::nn::sampling& s, const sample_tokenizer* tok) {
  std::vector<std::int32_t> tokens(prompt.begin(), prompt.end());
  for (auto& t : tokens) t = std::int32_t(std::uint8_t(t));
  // ids that have text: bytes (a byte-level run of a larger model, e.g. quickstart_bpe on a text
  // file, never saw an id above 255), or the tokenizer's pieces (quickstart_bpe has more rows)
  int vocab = std::min(256, model.model().vocab);
#if LOOM_WITH_TEXT
  if (tok) {
    tokens = tok->encode(prompt);
    vocab = tok->vocab_size();
  }
#endif
  model.generate(tokens, count, s, vocab);
#if LOOM_WITH_TEXT
  if (tok) return loom::data::decode_documents(*tok, tokens, tok->eod_id());
#else
  (void)tok;
#endif
  return loom::data::printable_utf8(std::string(tokens.begin(), tokens.end()));  // bytes may not be UTF-8
}

}  // namespace loom_examples
