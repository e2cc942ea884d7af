// libFuzzer target for train_gpt's command line: the CLI11 flag definitions and the checks after
// parsing (examples/train_gpt/flags.hpp: add_flags, apply_megatron_flags, check_flags,
// comm_timeout_ms; the --layout parser and divisibility checks of examples/train_gpt/options.hpp;
// --profile-steps through io::step_window::parse), exactly as train_gpt's main() runs them,
// without training.
//
// Input: byte 0 bit 0 = whether --data names a dataset (the default model then changes); the
// rest is the argument vector after argv[0] = "train_gpt", arguments separated by '\0' (at most
// 64 of them).
// What must hold: a bad flag ends in a CLI11 parse error or loom::input_error (what train_gpt
// prints as one line with exit status 2); accepted flags give a layout that divides the chosen
// model, finite numbers and a representable collective timeout — never a crash, undefined
// behaviour (signed overflow, a float-to-integer conversion out of range) or a leak
// (ASan + UBSan, tests/fuzz/run.sh cli).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <loom/core/error.hpp>

#include "fuzz_common.hpp"
#include "train_gpt/flags.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  std::vector<std::string> args{"train_gpt"};
  std::string cur;
  for (std::size_t i = 1; i < size && args.size() < 65; ++i) {
    if (data[i] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(char(data[i]));
    }
  }
  if (!cur.empty() && args.size() < 65) args.push_back(cur);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());

  train_gpt_cli::options o;
  CLI::App app{"train_gpt"};
  train_gpt_cli::add_flags(app, o);
  try {
    app.parse(int(argv.size()), argv.data());
  } catch (const CLI::Error& e) {  // parse errors, --help: train_gpt prints them and exits
    loom_fuzz::rejected(e);
    return 0;
  }
  try {
    train_gpt_cli::apply_megatron_flags(o, app);
    const auto [tp, pp] = train_gpt_cli::check_flags(o, app, data[0] & 1);
    loom_fuzz::require(tp >= 1 && pp >= 1 && tp * pp <= 99 * 99, "a layout outside tp1..99 pp1..99");
    loom_fuzz::require(std::isfinite(o.lr) && std::isfinite(o.bucket_mb) && std::isfinite(o.comm_timeout),
                       "check_flags accepted a non-finite number");
    const auto timeout = train_gpt_cli::comm_timeout_ms(o);
    loom_fuzz::require(timeout.count() >= 0, "a negative collective timeout");
    loom_fuzz::require(o.warmup <= o.steps || app.count("--warmup") > 0, "the default warm-up exceeds the run");
    loom_fuzz::require(o.decay_steps >= 1 && o.warmup <= o.decay_steps, "a decay that ends before the warm-up");
    loom_fuzz::accepted("flags");
  } catch (const loom::input_error& e) {
    loom_fuzz::rejected(e);
  }
  return 0;
}
