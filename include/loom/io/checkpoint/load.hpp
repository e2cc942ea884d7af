#pragma once
/// \file Loading a checkpoint into a state_view, on the saved layout (bitwise) or any other
/// (resharded through nn::shard_geometry), with or without ZeRO-1 on either side. Not templates,
/// except the thin overloads that take a trainer.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/core/json.hpp>
#include <loom/io/checkpoint/manifest.hpp>
#include <loom/io/checkpoint/reshard.hpp>
#include <loom/io/checkpoint/save.hpp>
#include <loom/io/checkpoint/state.hpp>
#include <loom/io/safetensors.hpp>

namespace loom::io {

namespace detail {

/// ZeRO-1 load, gather half: fills `whole` (the flat array `kind` of saved cell (tp, pp): that
/// cell's parameter buffer, whole.size() / dtype_size(dtype) elements) from the cell's
/// optim-tp..-pp..-dp..safetensors shard files listed in `files`. Checks each file's dtype,
/// shapes and ranges (in bounds of the buffer and of the shard) and that the shards cover the
/// buffer exactly once. Throws bad_checkpoint (loom::input_error) otherwise. Pure host I/O.
inline void gather_zero1(const std::filesystem::path& dir, const std::vector<checkpoint_file>& files, int tp, int pp,
                         const std::string& kind, const std::string& dtype, std::span<std::byte> whole) {
  const std::size_t es = dtype_size(dtype), total = whole.size() / es;
  std::vector<std::uint8_t> seen(total, 0);
  std::size_t covered = 0, shards = 0;
  for (const auto& f : files) {
    if (f.tp != tp || f.pp != pp || f.path.rfind("optim-", 0) != 0) continue;
    ++shards;
    const safetensors_reader r(dir / f.path);
    for (const std::string& t : {kind, std::string("ranges")})
      if (!r.has(t)) throw bad_checkpoint(dir, "its ZeRO-1 shard '" + f.path + "' has no tensor '" + t + "'");
    const auto& mi = r.info(kind);
    if (mi.dtype != dtype || mi.shape.size() != 1)
      throw bad_checkpoint(dir, "its ZeRO-1 shard '" + f.path + "' holds " + kind + " of dtype " + mi.dtype + " " +
                                    shape_string(mi.shape) + ", not a 1-D " + dtype + " array");
    const auto& ri = r.info("ranges");
    if (ri.dtype != "I64" || ri.shape.size() != 2 || ri.shape[1] != 3)
      throw bad_checkpoint(dir, "its ZeRO-1 shard '" + f.path + "' has ranges " + ri.dtype + " " + shape_string(ri.shape) +
                                    ", not I64 (pieces, 3)");
    const auto ranges = r.read<std::int64_t>("ranges");
    const std::size_t n = std::size_t(mi.shape[0]);
    const auto src = r.bytes(kind);
    for (std::size_t i = 0; i + 2 < ranges.size(); i += 3) {
      const std::int64_t po = ranges[i], len = ranges[i + 1], so = ranges[i + 2];
      // no po + len: the values come from the file and may be anything (the fuzzer found the overflow)
      if (po < 0 || len < 0 || so < 0 || std::uint64_t(len) > total || std::uint64_t(po) > total - std::size_t(len) ||
          std::uint64_t(len) > n || std::uint64_t(so) > n - std::size_t(len))
        throw bad_checkpoint(dir, "its ZeRO-1 shard '" + f.path + "' has a range (" + std::to_string(po) + ", " +
                                      std::to_string(len) + ", " + std::to_string(so) + ") outside the model's " +
                                      std::to_string(total) + " parameters or its " + std::to_string(n) + " elements");
      for (std::int64_t j = 0; j < len; ++j)
        if (seen[std::size_t(po + j)]++)
          throw bad_checkpoint(dir, "its ZeRO-1 shards cover parameter element " + std::to_string(po + j) + " twice");
      std::memcpy(whole.data() + std::size_t(po) * es, src.data() + std::size_t(so) * es, std::size_t(len) * es);
      covered += std::size_t(len);
    }
  }
  if (covered != total)
    throw bad_checkpoint(dir, "its " + std::to_string(shards) + " ZeRO-1 shard file(s) of rank tp=" + std::to_string(tp) +
                                  " pp=" + std::to_string(pp) + " cover " + std::to_string(covered) + " of " +
                                  std::to_string(total) + " " + kind + " elements (a shard file is missing from the manifest)");
}

/// The saved layout of a manifest, checked against the running view: same architecture and
/// dimensions, same storage precision, a layout that divides the model.
struct saved_layout {
  int tp = 1, pp = 1;
  bool zero1 = false;
};

inline saved_layout check_identity(const nlohmann::json& j, const state_view& v, const std::filesystem::path& dir) {
  auto mismatch = [&](const std::string& theirs, const std::string& ours, const std::string& fix) {
    return input_error("checkpoint '" + dir.string() + "' was saved with " + theirs + ", but this run has " + ours +
                       "; " + fix);
  };
  const auto& model_j = field<nlohmann::json>(j, "model", dir);
  const std::string their_name = string_or(model_j, "name", "?"), our_name = string_or(v.model, "name", "?");
  const std::string our_arch = string_or(v.model, "arch", "gpt2");
  if (const std::string arch = string_or(model_j, "arch", "gpt2"); arch != our_arch)
    throw mismatch("architecture '" + arch + "' (model " + their_name + ")",
                   "architecture '" + our_arch + "' (model " + our_name + ")",
                   "resume with the checkpoint's --model, or start a new run");
  for (const char* key : {"n_layer", "n_head", "d_model", "max_seq", "vocab", "vocab_padded"}) {
    const long ours = field<long>(v.model, key, dir), theirs = field<long>(model_j, key, dir);
    if (theirs != ours)
      throw mismatch("model " + their_name + " (" + key + " = " + std::to_string(theirs) + ")",
                     "model " + our_name + " (" + key + " = " + std::to_string(ours) + ")",
                     "resume with the checkpoint's --model, or start a new run");
  }
  const auto& layout_j = field<nlohmann::json>(j, "layout", dir);
  saved_layout s{field<int>(layout_j, "tp", dir), field<int>(layout_j, "pp", dir), false};
  const int zero = field<int>(layout_j, "zero", dir);
  bool fits = s.tp >= 1 && s.pp >= 1;
  for (const auto& r : v.rows) fits = fits && nn::splits(r.geometry, s.tp, s.pp);
  if (!fits)
    throw bad_checkpoint(dir, "its layout tp = " + std::to_string(s.tp) + ", pp = " + std::to_string(s.pp) +
                                  " cannot hold model " + our_name);
  if (zero != 0 && zero != 1) throw bad_checkpoint(dir, "its layout has zero = " + std::to_string(zero) + " (loom writes 0 or 1)");
  s.zero1 = zero == 1;
  const auto storage = field<std::string>(field<nlohmann::json>(j, "precision", dir), "storage", dir);
  if (storage != v.storage_dtype)
    throw mismatch("storage precision " + storage, "storage precision " + v.storage_dtype + " (" + v.precision + ")",
                   "resume with the checkpoint's precision");
  return s;
}

/// The saved state of a checkpoint as this rank needs it: local tensors of the running layout,
/// read straight from the rank's own file (same layout) or gathered from the saved layout's
/// files and re-split (io::gather_tensor, io::shard_tensor); flat arrays ZeRO-1 sharded in the
/// checkpoint come from its optim-* files. Every span it returns lives as long as it does.
class saved_state {
 public:
  saved_state(const std::filesystem::path& dir, const nlohmann::json& j, const state_view& v, saved_layout saved)
      : dir_(dir), v_(v), saved_(saved), files_(manifest_files(j, dir)) {
    same_layout_ = saved.tp == v.tp && saved.pp == v.pp;
    for (const auto& f : files_)
      if (f.path.rfind("model-", 0) == 0 && (!same_layout_ || (f.tp == v.tp_rank && f.pp == v.pp_rank)))
        readers_[{f.tp, f.pp}] = std::make_unique<safetensors_reader>(dir / f.path);
    for (int a = 0; a < (same_layout_ ? 1 : saved.tp); ++a)
      for (int b = 0; b < (same_layout_ ? 1 : saved.pp); ++b) {
        const int ta = same_layout_ ? v.tp_rank : a, pb = same_layout_ ? v.pp_rank : b;
        if (!readers_.count({ta, pb}))
          throw bad_checkpoint(dir, "its layout tp=" + std::to_string(saved.tp) + " pp=" + std::to_string(saved.pp) +
                                        " needs a model file of rank tp=" + std::to_string(ta) + " pp=" +
                                        std::to_string(pb) + ", which manifest.json does not list");
      }
  }

  bool same_layout() const noexcept { return same_layout_; }

  /// This rank's local tensor "<kind>.<row name>" as `dtype` bytes (rows[row].elems elements).
  /// Throws bad_checkpoint on a missing tensor or another dtype or shape.
  std::span<const std::byte> local(const std::string& kind, std::size_t row, const std::string& dtype) {
    const auto& r = v_.rows[row];
    const std::string name = kind + "." + r.name;
    const bool in_model_file = readers_.begin()->second->has(name);
    if (!in_model_file && !saved_.zero1)
      throw bad_checkpoint(dir_, "its file '" + readers_.begin()->second->path().filename().string() +
                                     "' has no tensor '" + name + "'");
    auto cell = [&](int tr, int st, const std::vector<std::int64_t>* shape) {
      return in_model_file ? checked(*readers_.at({tr, st}), name, dtype, shape) : zero1_slice(kind, dtype, row, tr, st);
    };
    std::span<const std::byte> out;
    if (same_layout_) {
      out = cell(v_.tp_rank, v_.pp_rank, &r.local_shape);
    } else {
      const auto& g = r.geometry;
      const std::size_t elem = dtype_size(dtype);
      const auto logical = gather_tensor(g, elem, [&](int tr, int st) {
        return cell(tr, g.per_layer ? st : (r.used == models::stages::last ? saved_.pp - 1 : 0), nullptr);
      }, saved_.tp, saved_.pp);
      owned_.push_back(shard_tensor(g, elem, logical, v_.tp, v_.pp, v_.tp_rank, v_.pp_rank));
      out = owned_.back();
    }
    if (out.size() != r.elems * dtype_size(dtype))
      throw bad_checkpoint(dir_, "tensor '" + name + "' has " + std::to_string(out.size()) + " bytes for this rank, not " +
                                     std::to_string(r.elems * dtype_size(dtype)));
    return out;
  }

  /// Keeps `bytes` alive as long as this object and returns them.
  std::span<std::byte> keep(std::vector<std::byte> bytes) {
    owned_.push_back(std::move(bytes));
    return owned_.back();
  }

 private:
  std::span<const std::byte> checked(const safetensors_reader& r, const std::string& name, const std::string& dtype,
                                     const std::vector<std::int64_t>* shape) const {
    if (!r.has(name)) throw bad_checkpoint(dir_, "its file '" + r.path().filename().string() + "' has no tensor '" + name + "'");
    const auto& info = r.info(name);
    if (info.dtype != dtype || (shape && info.shape != *shape))
      throw bad_checkpoint(dir_, "tensor '" + name + "' is " + info.dtype + " " + shape_string(info.shape) +
                                     ", this model needs " + dtype + (shape ? " " + shape_string(*shape) : std::string()));
    return r.bytes(name);
  }

  /// Row `row`'s slice of saved cell (tr, st)'s flat ZeRO-1 array `kind` (the cell's buffer in
  /// table order: row j's shard_elems under the saved degrees), gathered once per cell.
  std::span<const std::byte> zero1_slice(const std::string& kind, const std::string& dtype, std::size_t row, int tr, int st) {
    const std::size_t es = dtype_size(dtype);
    auto it = zero1_.find({kind, tr, st});
    if (it == zero1_.end()) {
      std::size_t n = 0;
      for (const auto& r : v_.rows) n += shard_elems(r.geometry, saved_.tp, saved_.pp);
      std::vector<std::byte> whole(n * es);
      gather_zero1(dir_, files_, tr, st, kind, dtype, whole);
      it = zero1_.emplace(std::tuple{kind, tr, st}, std::move(whole)).first;
    }
    std::size_t off = 0;
    for (std::size_t j = 0; j < row; ++j) off += shard_elems(v_.rows[j].geometry, saved_.tp, saved_.pp);
    return std::span<const std::byte>(it->second).subspan(off * es, shard_elems(v_.rows[row].geometry, saved_.tp, saved_.pp) * es);
  }

  std::filesystem::path dir_;
  const state_view& v_;
  saved_layout saved_;
  std::vector<checkpoint_file> files_;
  bool same_layout_ = true;
  std::map<std::pair<int, int>, std::unique_ptr<safetensors_reader>> readers_;
  std::map<std::tuple<std::string, int, int>, std::vector<std::byte>> zero1_;
  std::deque<std::vector<std::byte>> owned_;
};

/// The scalar state of manifest `j` (steps, the caller's run_state, the loss scaler), and
/// warnings for the running view's settings that differ from the checkpoint's (schedule,
/// optimizer, batch shape, layout, dp size), which break bitwise resumption but not loading.
/// Throws bad_checkpoint (loom::input_error) when a step count, the layout's dp or the loss
/// scaler's fields are missing where required, of the wrong JSON type or out of range.
inline checkpoint_info read_scalars(const nlohmann::json& j, const state_view& v, const std::filesystem::path& dir,
                                    const saved_layout& saved) {
  checkpoint_info out;
  out.dir = dir;
  out.step = field<long>(j, "step", dir);
  out.optimizer_step = field<long>(j, "optimizer_step", dir);
  out.state.tokens = field<std::uint64_t>(j, "tokens", dir);
  out.state.data = j.value("data", nlohmann::json::object());
  out.state.rng = j.value("rng", nlohmann::json::object());
  out.state.extra = j.value("extra", nlohmann::json::object());
  if (out.step < 0 || out.optimizer_step < 0 || out.optimizer_step > out.step)
    throw bad_checkpoint(dir, "its step counts (step " + std::to_string(out.step) + ", optimizer step " +
                                  std::to_string(out.optimizer_step) + ") are inconsistent");
  auto differs = [&](const char* section, const nlohmann::json& ours, std::initializer_list<const char*> keys) {
    const auto theirs = j.value(section, nlohmann::json::object());
    for (const char* key : keys) {
      const auto f = theirs.find(key), o = ours.find(key);
      if (f == theirs.end() || o == ours.end() || *f == *o) continue;
      out.warnings.push_back(std::string(key) + " is " + o->dump() + " now but " + f->dump() +
                             " in the checkpoint: the run continues, but not bit for bit as the original would have");
    }
  };
  differs("lr_schedule", v.lr_schedule, {"max_lr", "min_lr", "warmup", "decay_steps"});
  differs("optimizer", v.optimizer, {"beta1", "beta2", "eps", "weight_decay", "max_grad_norm"});
  differs("trainer", v.trainer, {"micro_batch", "seq_len", "grad_accum"});
  if (saved.tp != v.tp || saved.pp != v.pp)
    out.warnings.push_back("the checkpoint was saved on tp = " + std::to_string(saved.tp) + ", pp = " +
                           std::to_string(saved.pp) + " and is resharded onto tp = " + std::to_string(v.tp) + ", pp = " +
                           std::to_string(v.pp) + ": the run continues within fp32 tolerance, not bit for bit (another "
                           "summation order)");
  const auto& layout_j = field<nlohmann::json>(j, "layout", dir);
  const int dp_then = layout_j.contains("dp") ? field<int>(layout_j, "dp", dir) : 1;  // range-checked, not get<int>
  if (dp_then < 1) throw bad_checkpoint(dir, "its layout has dp = " + std::to_string(dp_then) + " (at least 1)");
  if (dp_then != v.dp)
    out.warnings.push_back("the data-parallel size is " + std::to_string(v.dp) + " now but " + std::to_string(dp_then) +
                           " in the checkpoint (optimizer state resharded): the run continues, but not bit for bit as "
                           "the original would have (another global batch or summation order)");
  if (v.scaler_enabled) {
    const auto ls = j.value("loss_scaler", nlohmann::json::object());
    if (!ls.is_object())
      throw bad_checkpoint(dir, std::string("its loss_scaler is a JSON ") + ls.type_name() + ", not an object");
    const auto enabled = ls.find("enabled");
    if (enabled != ls.end() && !enabled->is_boolean())
      throw bad_checkpoint(dir, "its loss_scaler.enabled is " + enabled->dump().substr(0, 40) + ", not true or false");
    if (enabled != ls.end() && enabled->get<bool>()) {
      const auto scale = ls.find("scale");
      const auto good = ls.contains("growth_tracker") ? json_integer<long>(ls["growth_tracker"]) : std::nullopt;
      if (scale == ls.end() || !scale->is_number() || !good)
        throw bad_checkpoint(dir, "its loss_scaler section has no numeric scale and integer growth_tracker");
      const precision::loss_scaler_state st{scale->get<double>(), *good};
      if (!(st.scale > 0) || !std::isfinite(st.scale) || st.good_steps < 0)
        throw bad_checkpoint(dir, "its loss scale " + std::to_string(st.scale) + " is not positive and finite");
      out.loss_scaler = st;
    } else {
      out.warnings.push_back("the checkpoint has no loss scaler state: the loss scale starts again at its initial value");
    }
  }
  return out;
}

}  // namespace detail

/// Loads checkpoint directory `dir` (one step_NNNNNNNN; see find_checkpoint to pick one) into
/// the tensors of state view `v`: parameters, master weights and AdamW moments (whole or
/// ZeRO-1 shards). Returns the steps, the restored loss scaler state and the caller's
/// run_state (which the caller applies: trainer::restore), the manifest, and warnings
/// for settings that differ from the checkpoint's (schedule, optimizer, batch shape, layout),
/// which break bitwise resumption but not loading.
///
/// From a checkpoint of any layout of the same model and storage precision: on the saved
/// (tp, pp) a rank reads its own file (bitwise); on another one it reads every model file,
/// gathers each logical tensor and cuts its own shard (non-per-layer tensors from the stage
/// that uses them). ZeRO-1 state (either side, any dp size) is gathered from the shards by
/// their ranges and re-split by this rank's ranges. Called on every rank; no communication.
///
/// All-or-nothing: every check runs before the first byte is copied into the view.
/// Memory: with the same layout and no ZeRO-1, none beyond the mapped file; otherwise this
/// rank's resharded state on the host, one logical tensor at a time, plus the whole flat
/// arrays when ZeRO-1 is on either side.
/// Errors (loom::input_error): the checkpoint fails verify_checkpoint; it was saved for another
/// model or storage precision (naming both); a file of the saved layout, a tensor or a ZeRO-1
/// range is missing, or has another shape or dtype; the saved layout does not divide the model.
inline checkpoint_info load_checkpoint(const std::filesystem::path& dir, const state_view& v) {
  nlohmann::json j = verify_checkpoint(dir);
  const auto saved = detail::check_identity(j, v, dir);
  detail::saved_state src(dir, j, v, saved);
  struct copy_job {
    std::span<const std::byte> src;
    std::byte* dst;
    bool host = false;  // dst is host memory (state_tensor::host)
  };
  std::vector<copy_job> jobs;
  for (const auto& t : v.tensors) jobs.push_back({src.local(t.kind, t.row, t.dtype), t.data, t.host});
  for (const auto& s : v.shards) {  // ZeRO-1 here: the cell's whole flat array, cut by this rank's ranges
    const std::size_t es = detail::dtype_size(s.dtype);
    auto whole = src.keep(std::vector<std::byte>(v.cell_elems * es));
    for (std::size_t row = 0; row < v.rows.size(); ++row) {
      const auto part = src.local(s.kind, row, s.dtype);
      std::memcpy(whole.data() + v.rows[row].offset * es, part.data(), part.size());
    }
    for (const auto& q : v.ranges)
      jobs.push_back({std::span<const std::byte>(whole).subspan(q.param_offset * es, q.length * es),
                      s.data + q.shard_offset * es});
  }
  checkpoint_info out = detail::read_scalars(j, v, dir, saved);
  for (const auto& job : jobs) {
    if (job.host) std::memcpy(job.dst, job.src.data(), job.src.size());
    else v.to_device(job.dst, job.src.data(), job.src.size());
  }
  v.synchronize();
  out.manifest = std::move(j);
  return out;
}

/// Loads `dir` into trainer `tr` (load_checkpoint of tr.checkpoint_state(ctx), then
/// tr.restore: step count, optimizer step, loss scaler). Errors as load_checkpoint.
template <checkpointable_trainer Trainer>
checkpoint_info load_checkpoint(context<typename Trainer::device>& ctx, const std::filesystem::path& dir, Trainer& tr) {
  auto info = load_checkpoint(dir, std::as_const(tr).checkpoint_state(ctx));
  tr.restore(restored_scalars{info.step, info.optimizer_step, info.loss_scaler});
  return info;
}

/// find_checkpoint(dir, warn) then load_checkpoint: what `train_gpt --resume DIR` does.
template <checkpointable_trainer Trainer>
checkpoint_info resume_checkpoint(context<typename Trainer::device>& ctx, const std::filesystem::path& dir, Trainer& tr,
                                  const std::function<void(const std::string&)>& warn = {}) {
  return load_checkpoint(ctx, find_checkpoint(dir, warn), tr);
}

}  // namespace loom::io
