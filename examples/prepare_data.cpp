// prepare_data — text or JSON-lines files in, a tokenized Megatron-compatible dataset out.
//
//   prepare_data --input ../shared/data/tinyshakespeare.txt --output-prefix out/shakespeare --vocab-size 8000
//   prepare_data --input a.txt b.jsonl --output-prefix out/corpus --keep-scripts latin,han --dedup-threshold 0.8
//   prepare_data --input more.txt --output-prefix out/more --tokenizer out/corpus.model
//
// Stages: read -> clean -> dedup -> filter -> tokenizer (train or load) -> encode -> write.
// Writes <prefix>.bin, <prefix>.idx, <prefix>.model and <prefix>.json, and prints one table row
// per stage (documents and bytes kept/removed, seconds, MB/s). A dataset already at the prefix
// is kept, never lost: right before the new files are written, its files get a second name,
// <prefix>.previous-<k>.bin, .idx, .model, .json (one k, the first free; keep_previous.hpp),
// one stdout line each; a run that fails puts everything back as it was. See docs/data.md.
// Build: g++ -std=c++20 -O2 -Iinclude examples/prepare_data.cpp -lsentencepiece
//        -lsentencepiece_train -lutf8proc -lxxhash -pthread
#if __has_include(<sentencepiece_processor.h>) && __has_include(<utf8proc.h>) && __has_include(<xxhash.h>) && \
    __has_include(<nlohmann/json.hpp>) && __has_include(<CLI/CLI.hpp>)
#include "cli.hpp"  // CLI11 and parse_or_exit
#include "keep_previous.hpp"

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <loom/data/text/prepare.hpp>

int main(int argc, char** argv) {
  CLI::App app{"Clean, deduplicate, filter and tokenize text into a Megatron-compatible indexed dataset"};
  loom::data::text::prepare_options o;
  std::vector<std::string> inputs;
  std::string output, split = "blank-line", scripts, tokenizer, invalid = "drop";
  bool no_dedup = false, no_near = false, keep_html = false;
  app.add_option("--input", inputs, ".txt or .jsonl files (JSON lines: field --json-key)")->required();
  app.add_option("--output-prefix", output, "writes PREFIX.bin, .idx, .model, .json")->required();
  app.add_option("--vocab-size", o.tokenizer.vocab_size, "SentencePiece BPE vocabulary (upper bound)")
      ->capture_default_str()->check(CLI::Range(300, 1 << 30));
  app.add_option("--tokenizer", tokenizer, "existing SentencePiece .model to use instead of training one")
      ->check(CLI::ExistingFile);
  app.add_option("--character-coverage", o.tokenizer.character_coverage, "SentencePiece character coverage")
      ->capture_default_str()->check(CLI::Range(0.98, 1.0));
  app.add_option("--max-sentences", o.tokenizer.max_sentences, "lines sampled to train the tokenizer")
      ->capture_default_str();
  app.add_option("--split", split, "how .txt files become documents: blank-line | line | file")->capture_default_str();
  app.add_option("--json-key", o.json_key, "text field of JSON-lines inputs")->capture_default_str();
  app.add_option("--invalid-utf8", invalid, "drop | replace (U+FFFD) invalid UTF-8")->capture_default_str();
  app.add_option("--max-invalid-fraction", o.clean.max_invalid_fraction,
                 "drop a document whose invalid UTF-8 bytes exceed this fraction")->capture_default_str();
  app.add_flag("--keep-html", keep_html, "do not strip HTML tags and entities");
  app.add_flag("--no-dedup", no_dedup, "skip exact and near-duplicate removal");
  app.add_flag("--no-near-dedup", no_near, "exact duplicates only");
  app.add_option("--dedup-threshold", o.dedup_settings.threshold, "estimated Jaccard at which documents are near duplicates")
      ->capture_default_str()->check(CLI::Range(0.01, 1.0));
  app.add_option("--shingle", o.dedup_settings.shingle, "words per MinHash shingle")->capture_default_str();
  app.add_option("--permutations", o.dedup_settings.permutations, "MinHash hash functions")->capture_default_str();
  app.add_option("--bands", o.dedup_settings.bands, "LSH bands (0: chosen from the threshold)")->capture_default_str();
  app.add_option("--keep-scripts", scripts, "comma-separated scripts to keep, e.g. latin,han (empty: all)");
  app.add_option("--min-script-fraction", o.filter.min_script_fraction,
                 "share of a document's letters that must be in the kept scripts")->capture_default_str();
  app.add_option("--min-chars", o.filter.min_chars, "shortest document kept, in characters")->capture_default_str();
  app.add_option("--max-chars", o.filter.max_chars, "longest document kept (0: no limit)")->capture_default_str();
  app.add_option("--threads", o.threads, "threads for cleaning, MinHash and encoding (0: all cores)")->capture_default_str();
  loom_examples::parse_or_exit(app, argc, argv);

  try {
    for (const auto& i : inputs) o.inputs.emplace_back(i);
    o.output_prefix = output;
    o.split = loom::data::text::parse_split_mode(split);
    if (invalid != "drop" && invalid != "replace")
      throw loom::input_error("--invalid-utf8 " + invalid + " is not drop or replace; pick one");
    o.clean.on_invalid = invalid == "drop" ? loom::data::text::invalid_utf8::drop : loom::data::text::invalid_utf8::replace;
    o.clean.strip_html = !keep_html;
    o.dedup = !no_dedup;
    o.dedup_settings.near = !no_near;
    o.filter.keep_scripts = loom::data::text::parse_scripts(scripts);
    if (!tokenizer.empty()) o.tokenizer_model = tokenizer;
    // an earlier dataset at the prefix: kept right before the first new file replaces it
    const auto files = loom::data::text::dataset_files(o.output_prefix);
    std::vector<loom_examples::kept_file> kept;
    o.before_write = [&] { kept = loom_examples::keep_previous(files, "pass another --output-prefix"); };
    loom::data::text::prepare_report report;
    try {
      report = loom::data::text::prepare(o);
    } catch (...) {
      loom_examples::restore_previous(kept);
      throw;
    }
    std::fputs(loom::data::text::format_report(report).c_str(), stdout);
    std::printf("\n%llu documents, %llu tokens (%s, vocab %d, eod %d), %.2f bytes of text per token\n",
                (unsigned long long)report.documents, (unsigned long long)report.tokens,
                std::string(loom::data::dtype_name(report.token_dtype)).c_str(), report.vocab_size, report.eod_id,
                double(report.text_bytes) / double(report.tokens));
    for (const auto& k : kept)
      if (!k.kept.empty()) std::printf("dataset: the previous run's %s is kept as %s\n", k.out.c_str(), k.kept.c_str());
    std::printf("wrote %s %s %s %s\n", report.bin.c_str(), report.idx.c_str(), report.model.c_str(),
                report.summary.c_str());
  } catch (const loom::input_error& e) {
    std::fprintf(stderr, "prepare_data: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {  // I/O and library failures: one line, never an abort
    std::fprintf(stderr, "prepare_data: failed: %s\n", e.what());
    return 1;
  }
  return 0;
}

#else
#include <cstdio>
int main() {
  std::fputs("prepare_data: built without the text libraries (SentencePiece, utf8proc, xxhash, nlohmann-json, CLI11); "
             "install them with scripts/setup.sh and rebuild\n", stderr);
  return 2;
}
#endif
