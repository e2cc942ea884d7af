#pragma once
// train_gpt's --resume, used by the run loop (train_gpt/run.cpp) on every layout.
// Not a library header: examples/ only.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <loom/core/error.hpp>
#include <loom/core/json.hpp>
#include <loom/data/source.hpp>
#include <loom/io/checkpoint.hpp>
#include <loom/train/session.hpp>

namespace train_gpt_cli {

/// Where a resumed run continues.
struct resume_point {
  long step = 0;              ///< optimizer steps already taken
  std::uint64_t tokens = 0;   ///< training tokens already consumed
};

/// From the resume warnings "warmup is A now but B in the checkpoint: ..." and the same for
/// decay_steps (the wording of io/checkpoint/load.hpp's read_scalars; tests/cli/resume.sh checks
/// the result): the flags that give the checkpoint's values back ("--warmup B --decay-steps C");
/// empty when neither differs.
inline std::string schedule_flags_of(const std::vector<std::string>& warnings) {
  std::string flags;
  for (const auto& [key, flag] : {std::pair{"warmup", "--warmup"}, std::pair{"decay_steps", "--decay-steps"}})
    for (const auto& w : warnings) {
      const std::string head = std::string(key) + " is ";
      const std::size_t but = w.find(" now but "), in = w.find(" in the checkpoint");
      if (w.rfind(head, 0) != 0 || but == std::string::npos || in == std::string::npos || in < but) continue;
      flags += (flags.empty() ? "" : " ") + std::string(flag) + " " + w.substr(but + 9, in - but - 9);
    }
  return flags;
}

/// Loads the newest valid checkpoint under `dir` into `s` (io::resume_checkpoint: parameters,
/// optimizer state, step, loss scaler; resharded when it was saved under another layout), moves
/// `src` to the saved data position, passes every warning to `warn` and, on the lead rank, prints
/// where the run resumes. Throws loom::input_error when nothing valid is found or the checkpoint
/// has no data position (it was not written by train_gpt).
template <class Source, class Warn>
resume_point resume_run(loom::train::session& s, const std::string& dir, Source& src, Warn&& warn, bool lead) {
  const auto info = s.resume(dir, warn);
  for (const auto& w : info.warnings) warn(w);
  if (const std::string flags = schedule_flags_of(info.warnings); !flags.empty())
    warn("to continue on the checkpoint's learning-rate schedule (warm-up and decay follow --steps unless given), pass " +
         flags);
  const nlohmann::json& d = info.state.data;
  // Each field range-checked as the type it becomes (json_integer): a file's 1e63 is no uint64.
  auto field = [&]<class T>(const char* key, T) -> std::optional<T> {
    return d.is_object() && d.contains(key) ? loom::json_integer<T>(d[key]) : std::nullopt;
  };
  const auto kind = field("kind", std::uint8_t{});
  const auto epoch = field("epoch", std::uint64_t{}), index = field("index", std::uint64_t{}),
             seed = field("seed", std::uint64_t{});
  if (!kind || *kind > std::uint8_t(loom::data::source_kind::indexed) || !epoch || !index || !seed)
    throw loom::input_error("checkpoint '" + info.dir.string() + "' has no data position (kind 0 or 1, and unsigned "
                            "integers epoch, index, seed); it was not written by train_gpt: start a new run, or load "
                            "its weights with --init-from-hf after export");
  src.restore({loom::data::source_kind(*kind), *epoch, *index, *seed});
  if (lead)
    std::printf("resumed from %s: step %ld, %llu tokens seen\n", info.dir.c_str(), info.step,
                static_cast<unsigned long long>(info.state.tokens));
  return {info.step, info.state.tokens};
}

}  // namespace train_gpt_cli
