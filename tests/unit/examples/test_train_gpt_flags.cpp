// train_gpt's flags (examples/train_gpt/flags.hpp), parsed as main() parses them: the cases the
// CLI fuzz target (tests/fuzz/fuzz_cli.cpp) feeds that used to reach undefined behaviour or an
// exception other than loom::input_error, the defaults check_flags fills in, and the paths it
// refuses before any work.
#include <doctest/doctest.h>

#if __has_include(<CLI/CLI.hpp>)
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <loom/core/error.hpp>

#include "../../../examples/train_gpt/flags.hpp"

namespace {

struct parsed {
  train_gpt_cli::options o;
  CLI::App app{"train_gpt"};
  std::pair<int, int> layout;
};

// Parses `args` (after argv[0]) and runs check_flags; CLI11 errors propagate.
void parse(parsed& p, std::vector<std::string> args, bool dataset = false) {
  args.insert(args.begin(), "train_gpt");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  train_gpt_cli::add_flags(p.app, p.o);
  p.app.parse(int(argv.size()), argv.data());
  p.layout = train_gpt_cli::check_flags(p.o, p.app, dataset);
}

}  // namespace

TEST_CASE("train_gpt flags: defaults, the dataset model and the layout") {
  parsed a;
  parse(a, {"--data", "x.txt", "--steps", "300"});
  CHECK(a.o.warmup == 30);
  CHECK(a.o.model == "quickstart");
  CHECK(a.layout == std::pair{1, 1});
  parsed b;
  parse(b, {"--data", "out/c", "--layout", "tp2pp2", "--ranks", "4"}, true);
  CHECK(b.o.model == "quickstart_bpe");
  CHECK(b.layout == std::pair{2, 2});
  CHECK(train_gpt_cli::comm_timeout_ms(b.o).count() == 600000);
}

TEST_CASE("train_gpt flags: a Llama model trains on layouts its key/value heads allow") {
  parsed a;
  parse(a, {"--data", "x.txt", "--model", "llama_quickstart", "--layout", "tp2pp2", "--ranks", "4"});
  CHECK(a.layout == std::pair{2, 2});
  parsed b;  // 6 query heads divide by 3, its 2 key/value heads do not
  CHECK_THROWS_WITH_AS(parse(b, {"--data", "x.txt", "--model", "llama_quickstart", "--layout", "tp3pp1", "--ranks", "3"}),
                       doctest::Contains("2 key/value heads, not divisible by TP=3"), loom::input_error);
}

TEST_CASE("train_gpt flags: --recompute takes none, selective or full") {
  parsed a;
  parse(a, {"--data", "x.txt"});
  CHECK(train_gpt_cli::recompute_mode(a.o.recompute) == loom::nn::recompute::none);
  parsed b;
  parse(b, {"--data", "x.txt", "--recompute", "full"});
  CHECK(train_gpt_cli::recompute_mode(b.o.recompute) == loom::nn::recompute::full);
  parsed c;
  parse(c, {"--data", "x.txt", "--recompute", "selective"});
  CHECK(train_gpt_cli::recompute_mode(c.o.recompute) == loom::nn::recompute::selective);
  parsed d;
  CHECK_THROWS_AS(parse(d, {"--data", "x.txt", "--recompute", "block"}), CLI::ValidationError);
}

TEST_CASE("train_gpt flags: non-finite and oversized numbers are input errors, not undefined conversions") {
  // --comm-timeout nan or 1e300 became static_cast<long long>(...) milliseconds, --bucket-mb nan
  // or 1e300 a size_t(...) bucket capacity: both undefined. NaN passes CLI11's range checks
  // (which refuse inf themselves); flags without a check took inf too.
  const std::vector<std::vector<std::string>> cases = {{"--comm-timeout", "nan"}, {"--comm-timeout", "1e300"},
                                                        {"--bucket-mb", "nan"},     {"--bucket-mb", "1e300"},
                                                        {"--lr", "nan"},            {"--temperature", "inf"},
                                                        {"--time-budget", "-inf"}};
  // refused by the flag's own check (CLI::ValidationError) or after parsing (loom::input_error),
  // either way naming the flag (train_gpt exits 2 on both)
  for (const auto& args : cases) {
    CAPTURE(args[0] + " " + args[1]);
    parsed p;
    auto full = args;
    full.insert(full.end(), {"--data", "x.txt"});
    std::string what;
    try {
      parse(p, full);
    } catch (const loom::input_error& e) {
      what = e.what();
    } catch (const CLI::ValidationError& e) {
      what = e.what();
    }
    CAPTURE(what);
    CHECK(what.find(args[0]) != std::string::npos);
  }
}

TEST_CASE("train_gpt flags: --log-dir defaults to logs/ in --out's directory") {
  parsed a;
  parse(a, {"--data", "x.txt"});
  CHECK(a.o.log_dir == "out/logs");  // the default --out, out/<model>.safetensors
  parsed b;
  parse(b, {"--data", "x.txt", "--out", "runs/a/w.safetensors"});
  CHECK(b.o.log_dir == "runs/a/logs");
  parsed c;
  parse(c, {"--data", "x.txt", "--out", "w.safetensors"});
  CHECK(c.o.log_dir == "logs");
  parsed d;  // given: as given, '' included (no logs)
  parse(d, {"--data", "x.txt", "--out", "runs/a/w.safetensors", "--log-dir", ""});
  CHECK(d.o.log_dir.empty());
  parsed e;
  parse(e, {"--data", "x.txt", "--out", "runs/a/w.safetensors", "--log-dir", "elsewhere"});
  CHECK(e.o.log_dir == "elsewhere");
}

TEST_CASE("train_gpt flags: --resume of a directory without checkpoints is refused, naming the one to pass") {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("loom_test_resume_dir_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "empty");
  fs::create_directories(root / "run" / "ckpt" / "step_00000002");
  fs::create_directories(root / "run" / "ckpt" / "step_00000004");  // no manifest: an unfinished save
  std::ofstream(root / "run" / "ckpt" / "step_00000002" / "manifest.json") << "{}";
  parsed a;
  CHECK_THROWS_WITH_AS(parse(a, {"--data", "x.txt", "--resume", (root / "empty").string()}),
                       doctest::Contains("holds no checkpoint"), loom::input_error);
  const std::string subdirectory = "pass --resume " + (root / "run" / "ckpt").string();
  parsed b;
  CHECK_THROWS_WITH_AS(parse(b, {"--data", "x.txt", "--resume", (root / "run").string()}),
                       doctest::Contains(subdirectory.c_str()), loom::input_error);
  const std::string run_root = "--resume " + (root / "run" / "ckpt").string() + ", to resume from";
  parsed c;
  CHECK_THROWS_WITH_AS(parse(c, {"--data", "x.txt", "--resume", (root / "run" / "ckpt" / "step_00000004").string()}),
                       doctest::Contains(run_root.c_str()), loom::input_error);
  parsed d;  // a run's root and one checkpoint of it pass (verified later, when the run loads them)
  CHECK_NOTHROW(parse(d, {"--data", "x.txt", "--resume", (root / "run" / "ckpt").string()}));
  parsed e;
  CHECK_NOTHROW(parse(e, {"--data", "x.txt", "--resume", (root / "run" / "ckpt" / "step_00000002").string()}));
  fs::remove_all(root);
}

TEST_CASE("train_gpt flags: a path too long for the file system is an input error, not a filesystem_error") {
  const std::string long_name(5000, 'a');  // ENAMETOOLONG: std::filesystem::exists(path) threw
  parsed a;
  CHECK_THROWS_AS(parse(a, {"--data", "x.txt", "--resume", long_name}), loom::input_error);
  parsed b;
  CHECK_NOTHROW(parse(b, {"--data", "x.txt", "--out", long_name}));
  parsed c;  // --profile-steps N at the largest int64: N + 1 overflowed
  CHECK_THROWS_AS(parse(c, {"--data", "x.txt", "--profile-steps", "9223372036854775807"}), loom::input_error);
}
#endif
