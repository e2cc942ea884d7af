// bench_data_pipeline — throughput of each preparation stage on the real corpora
// (tinyshakespeare, zh_classics): clean, MinHash signatures, dedup, filter, SentencePiece
// training, encoding (1 thread and all cores), writing the indexed dataset, and the whole
// prepare() run. MB/s are of the stage's input text; "cpu MB/s" divides by the process CPU
// time instead of wall time, which is steadier on a shared machine (and, for a multi-threaded
// stage, is the per-core rate).
//
//   bench_data_pipeline [--data DIR] [--vocab-size 8000] [--repeat 3]
//
// DIR defaults to LOOM_DATA_DIR or ../shared/data (relative to the working directory).
#if __has_include(<sentencepiece_processor.h>) && __has_include(<utf8proc.h>) && __has_include(<xxhash.h>) && \
    __has_include(<nlohmann/json.hpp>)
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <loom/data/indexed_dataset.hpp>
#include <loom/data/text/prepare.hpp>

namespace {
namespace text = loom::data::text;

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct timing {
  double wall = 0, cpu = 0;
};
// Best of `repeat` runs (wall), with that run's CPU time.
timing measure(int repeat, const std::function<void()>& f) {
  timing best{1e300, 0};
  for (int r = 0; r < repeat; ++r) {
    const double c0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double w = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (w < best.wall) best = {w, cpu_seconds() - c0};
  }
  return best;
}

void row(const char* stage, const char* threads, double mb, timing t, const std::string& extra) {
  std::printf("  %-22s %-8s %9.3f %9.2f %9.2f  %s\n", stage, threads, t.wall, mb / t.wall, mb / std::max(t.cpu, 1e-9),
              extra.c_str());
}

const char* arg(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}
}  // namespace

int main(int argc, char** argv) {
#ifdef LOOM_DATA_DIR
  const char* default_dir = LOOM_DATA_DIR;
#else
  const char* default_dir = "../shared/data";
#endif
  const std::filesystem::path dir = arg(argc, argv, "--data", default_dir);
  const int vocab = std::atoi(arg(argc, argv, "--vocab-size", "8000"));
  const int repeat = std::atoi(arg(argc, argv, "--repeat", "3"));
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::string all = std::to_string(cores);
  const auto tmp = std::filesystem::temp_directory_path() / "loom_bench_data_pipeline";
  std::filesystem::create_directories(tmp);
  std::printf("%u cores; best of %d runs; vocab %d\n", cores, repeat, vocab);

  for (const char* name : {"tinyshakespeare.txt", "zh_classics.txt"}) {
    const auto path = dir / name;
    std::vector<std::string> docs;
    const timing tr = measure(repeat, [&] {
      docs.clear();
      text::read_documents(path, text::split_mode::blank_line, "text", docs);
    });
    double mb = 0;
    for (const auto& d : docs) mb += double(d.size());
    mb /= 1e6;
    std::printf("\n%s: %zu documents, %.3f MB\n", name, docs.size(), mb);
    std::printf("  %-22s %-8s %9s %9s %9s  %s\n", "stage", "threads", "seconds", "MB/s", "cpu MB/s", "");
    row("read + split", "1", mb, tr, "");

    std::vector<std::string> cleaned;
    const timing tc = measure(repeat, [&] {
      cleaned.clear();
      text::clean_stats st;
      for (const auto& d : docs)
        if (auto c = text::clean(d, {}, st)) cleaned.push_back(std::move(*c));
    });
    row("clean", "1", mb, tc, "");

    std::vector<std::string_view> views(cleaned.begin(), cleaned.end());
    const text::minhash mh(5, 128, 1);
    const timing ts = measure(repeat, [&] {
      std::size_t n = 0;
      for (auto v : views) n += mh.signature(v).size();
      if (n == 42) std::puts("");
    });
    row("minhash signatures", "1", mb, ts, "k=5, P=128");
    text::dedup_stats ds;
    const timing td = measure(repeat, [&] {
      text::deduplicator d;
      d.insert_batch(views);
      ds = d.stats();
    });
    row("dedup (exact+near)", all.c_str(), mb, td,
        "removed " + std::to_string(ds.exact_duplicates) + " exact, " + std::to_string(ds.near_duplicates) + " near");

    const timing tf = measure(repeat, [&] {
      text::filter_stats fs;
      text::filter_options fo;
      fo.keep_scripts = {text::script::latin, text::script::han};
      for (auto v : views) text::filter(v, fo, fs);
    });
    row("filter (length+script)", "1", mb, tf, "");

    std::optional<text::tokenizer> tok;
    text::tokenizer_options to;
    to.vocab_size = vocab;
    const timing tt = measure(1, [&] { tok = text::tokenizer::train(views, to); });
    row("train SentencePiece", all.c_str(), mb, tt, "BPE vocab " + std::to_string(tok->vocab_size()));

    std::uint64_t tokens = 0;
    for (const unsigned threads : {1u, cores}) {
      std::vector<std::vector<std::int32_t>> ids;
      const timing te = measure(repeat, [&] { ids = tok->encode_all(views, int(threads)); });
      tokens = 0;
      for (const auto& v : ids) tokens += v.size();
      row("encode", std::to_string(threads).c_str(), mb, te,
          std::to_string(std::uint64_t(double(tokens) / te.wall)) + " tokens/s, " + std::to_string(tokens) + " tokens");
      if (threads == cores) {
        const auto prefix = tmp / "bench";
        const timing tw = measure(repeat, [&] {
          loom::data::indexed_dataset_writer w(prefix, loom::data::token_dtype_for(std::size_t(tok->vocab_size())));
          for (const auto& v : ids) w.add_document(v);
          w.finalize();
        });
        const double out_mb = double(std::filesystem::file_size(loom::data::bin_path(prefix))) / 1e6;
        row("write .bin/.idx", "1", mb, tw, std::to_string(out_mb).substr(0, 5) + " MB of tokens written (fsync incl.)");
      }
      if (cores == 1) break;
    }

    text::prepare_options po;
    po.inputs = {path};
    po.output_prefix = tmp / "whole";
    po.tokenizer.vocab_size = vocab;
    const timing tp = measure(1, [&] { text::prepare(po); });
    row("prepare() end to end", all.c_str(), mb, tp, "read..write incl. tokenizer training");
  }
  std::filesystem::remove_all(tmp);
  return 0;
}

#else
#include <cstdio>
int main() {
  std::fputs("bench_data_pipeline: built without the text libraries (SentencePiece, utf8proc, xxhash, nlohmann-json); "
             "install them with scripts/setup.sh and rebuild\n", stderr);
  return 2;
}
#endif
