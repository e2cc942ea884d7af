#pragma once
// train_gpt's --resume, used by the run loop (train_gpt/run.cpp) on every layout.
// Not a library header: examples/ only.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include <loom/core/error.hpp>
#include <loom/core/json.hpp>
#include <loom/data/source.hpp>
#include <loom/io/checkpoint.hpp>
#include <loom/optim/lr_schedule.hpp>
#include <loom/train/session.hpp>

namespace train_gpt_cli {

/// Where a resumed run continues.
struct resume_point {
  long step = 0;              ///< optimizer steps already taken
  std::uint64_t tokens = 0;   ///< training tokens already consumed
};

/// The flags that give back a checkpoint's warm-up and decay where they differ from the running
/// schedule `now` ("--warmup 2 --decay-steps 20"), read from the manifest's "lr_schedule"
/// (io/checkpoint: integers warmup, decay_steps); empty when both agree or are not recorded.
inline std::string schedule_flags(const nlohmann::json& manifest, const loom::optim::cosine_schedule& now) {
  if (!manifest.is_object() || !manifest.contains("lr_schedule") || !manifest["lr_schedule"].is_object()) return {};
  const nlohmann::json& saved = manifest["lr_schedule"];
  std::string flags;
  auto add = [&](const char* key, const char* flag, long ours) {
    const auto f = saved.find(key);
    if (f == saved.end() || !f->is_number_integer() || f->get<long>() == ours) return;
    flags += (flags.empty() ? "" : " ") + std::string(flag) + " " + std::to_string(f->get<long>());
  };
  add("warmup", "--warmup", now.warmup);
  add("decay_steps", "--decay-steps", now.decay_steps);
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
  if (const std::string flags = schedule_flags(info.manifest, s.config().schedule); !flags.empty())
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
