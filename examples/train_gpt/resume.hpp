#pragma once
// train_gpt's --resume, used by the run loop (train_gpt/run.cpp) on every layout.
// Not a library header: examples/ only.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

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
  std::string line;           ///< "resumed from DIR: step N, T tokens seen", for the console
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
/// `src` to the saved data position and passes every warning to `warn`; the returned point's
/// `line` says where the run resumes. Throws loom::input_error when nothing valid is found or the checkpoint
/// has no data position (it was not written by train_gpt).
template <class Source, class Warn>
resume_point resume_run(loom::train::session& s, const std::string& dir, Source& src, Warn&& warn) {
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
  return {info.step, info.state.tokens,
          "resumed from " + info.dir.string() + ": step " + std::to_string(info.step) + ", " +
              std::to_string(info.state.tokens) + " tokens seen"};
}

/// The checkpoints of `ckpt_dir` newer than the resumed step `step`, which a run continuing from
/// `step` into ckpt_dir would overwrite as it reaches their steps. `resumed_root`: --resume named
/// ckpt_dir itself, so the resume took the checkpoint `latest` names or the newest that verifies;
/// the newer ones that do not verify (damaged) are moved aside on their own, while a complete one
/// `latest` never named (a save cut short between its rename and `latest`) is left: it is this
/// run's, and the run saves that step again with the same bytes. Otherwise the user chose an
/// older checkpoint: without `discard` (--discard-newer-checkpoints) the run is refused
/// (loom::input_error naming the choices); with it they are moved aside. Moved aside = renamed into ckpt_dir/set-aside/ (a numbered suffix
/// when the name is taken there), `latest` rewritten to the newest checkpoint left (or removed):
/// nothing is deleted. Every rank calls this after the resume with the same arguments; the
/// decision is made before `barrier` (one collective over the world), the lead rank moves the
/// directories after it. Returns the warnings to print (empty when nothing was newer).
template <class Barrier>
std::vector<std::string> set_aside_newer_checkpoints(const std::string& ckpt_dir, long step, bool resumed_root,
                                                     bool discard, bool lead, Barrier&& barrier) {
  namespace fs = std::filesystem;
  std::vector<loom::io::checkpoint_entry> newer;
  for (const auto& e : loom::io::list_checkpoints(ckpt_dir)) {  // none for an empty ckpt_dir
    if (e.step <= step) continue;
    if (resumed_root) {  // only the damaged: a complete save `latest` never named is this run's, saved again alike
      try {
        (void)loom::io::verify_checkpoint(e.dir);
        continue;
      } catch (const loom::input_error&) {
      }
    }
    newer.push_back(e);
  }
  if (newer.empty()) return {};
  std::string names;
  for (const auto& e : newer) names += (names.empty() ? "" : ", ") + e.dir.filename().string();
  const fs::path aside = fs::path(ckpt_dir) / "set-aside";
  if (!resumed_root && !discard)
    throw loom::input_error("--resume continues from step " + std::to_string(step) + ", but '" + ckpt_dir +
                            "' holds newer checkpoints (" + names + ") that this run would overwrite as it reaches "
                            "their steps; pass another --checkpoint-dir (--save) for the continued run, or "
                            "--discard-newer-checkpoints to move them into '" + aside.string() + "' and go on here");
  barrier();  // every rank has listed the directory: it may change now
  if (!lead) return {};
  std::error_code ec;
  fs::create_directories(aside, ec);
  if (ec) throw loom::input_error("cannot create '" + aside.string() + "' (" + ec.message() + "); check the permissions of '" + ckpt_dir + "'");
  std::string moved;
  for (const auto& e : newer) {
    fs::path to = aside / e.dir.filename();
    for (int k = 1; fs::exists(to, ec); ++k) to = aside / (e.dir.filename().string() + "." + std::to_string(k));
    fs::rename(e.dir, to, ec);
    if (ec)
      throw loom::input_error("cannot move '" + e.dir.string() + "' to '" + to.string() + "' (" + ec.message() +
                              "); nothing was trained; move it yourself or pass another --checkpoint-dir");
    moved += (moved.empty() ? "" : ", ") + e.dir.filename().string() +
             (to.filename() == e.dir.filename() ? "" : " (as " + to.filename().string() + ")");
  }
  const auto left = loom::io::list_checkpoints(ckpt_dir);
  if (!left.empty()) loom::io::detail::write_latest(ckpt_dir, left.back().dir.filename().string());
  else fs::remove(fs::path(ckpt_dir) / "latest", ec);
  return {std::string(resumed_root ? "checkpoints newer than the one resumed did not verify; "
                                   : "--discard-newer-checkpoints: ") +
          "moved " + moved + " into '" + aside.string() + "', so that this run does not overwrite them"};
}

}  // namespace train_gpt_cli
