#pragma once
/// \file train::choose_layout: the fastest layout that fits a memory limit, among compiled
/// instances (by their memory plans: train::session_instance::plan, the tables the trainer
/// allocates from) or among every layout a model's shape divides (by train::plan_shape, the
/// same arithmetic at run time, for instances compiled on first use), and the step estimate
/// (train/step_estimate.hpp). train_gpt --layout auto and examples/plan --layout auto call it.
///
///   train::layout_request r{.model = "quickstart", .precision = "fp32", .device = "cpu",
///                           .world_size = 4, .global_batch = 64, .memory_limit = 512 << 20, ...};
///   const auto options = train::layout_options(train::compiled_sessions());  // or (spec, ...)
///   const auto ranked = train::rank_layouts(options, r);  // every candidate
///   const auto best = train::choose_layout(options, r);   // or input_error
///
/// A candidate is a layout option (tp x pp) dividing the world, a micro-batch up to the option's
/// capacity whose micro-batch x dp divides the global batch (grad_accum the quotient), a
/// recompute mode, ZeRO-1 on or off (with more than one data-parallel rank) and, on an NPU when
/// asked, optimizer offload (its pinned host memory is not in the footprint: the limit is the
/// device's). Its footprint is
/// the largest rank's plan (data-parallel rank 0 of each stage: ZeRO-1 gives rank 0 the largest
/// shard) plus the stated per-rank overhead the plan does not hold (runtime, allocator slack).
#include <algorithm>
#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/nn/activations.hpp>
#include <loom/train/memory_plan.hpp>
#include <loom/train/session.hpp>
#include <loom/train/shape_plan.hpp>
#include <loom/train/step_estimate.hpp>

namespace loom::train {

/// Bytes from a size with its unit: "24GiB", "512 MiB", "64GB", "1.5TiB", "1048576" (bytes);
/// binary units KiB/MiB/GiB/TiB, decimal KB/MB/GB/TB, B. `flag` names the setting in errors.
/// Throws loom::input_error for anything else (a bare "G" is refused: GiB or GB?).
inline std::size_t parse_bytes(const std::string& text, std::string_view flag) {
  static constexpr std::pair<std::string_view, double> units[] = {
      {"", 1},          {"B", 1},         {"KiB", 1024.0},  {"MiB", 1048576.0}, {"GiB", 1073741824.0},
      {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6},  {"GB", 1e9},        {"TB", 1e12}};
  std::size_t used = 0;
  double value = -1;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  unit.erase(0, unit.find_first_not_of(' '));
  for (const auto& [name, scale] : units)
    if (used > 0 && unit == name && value >= 0 && value * scale < 1.8e19) return std::size_t(value * scale);
  throw input_error(std::string(flag) + " '" + text + "' is not a size; pass a number with a unit: KiB, MiB, GiB, TiB "
                    "(powers of 1024), KB, MB, GB, TB (of 1000) or B, e.g. 24GiB");
}

/// What to choose a layout for: the instance family (model, precision, device, attention), the
/// world, the global batch in sequences per optimizer step (over all data-parallel ranks), the
/// sequence length (0: the instance's capacity), the micro-batch (0: any), the per-rank memory
/// limit and overhead in bytes,
/// the per-rank peak in FLOP/s, the network, and the other settings (`args`: cfg and ddp as
/// given; micro_batch, grad_accum, recompute, ddp.zero1 and offload_optimizer are the
/// candidate's). `recompute`: the modes to consider; zero1: whether ZeRO-1 may be chosen;
/// offload: whether optimizer offload may be (an NPU's instances, without ZeRO-1; its time needs
/// net.host).
struct layout_request {
  std::string_view model, precision, device = "cpu", attention = "fused";
  int world_size = 1;
  int global_batch = 0;
  int seq_len = 0;
  int micro_batch = 0;  ///< 0: any up to the capacity; else only this micro-batch
  std::size_t memory_limit = 0, overhead = 0;
  double peak_flops = 0;
  network net;
  session_args args;
  std::vector<nn::recompute> recompute = {nn::recompute::none, nn::recompute::selective, nn::recompute::full};
  bool zero1 = true;
  bool offload = false;
};

/// One (model, precision, tp x pp, device, attention) a layout is chosen among: a compiled
/// instance (`instance` set; its capacities and plan), or a shape planned at run time
/// (plan_shape; `instance` null), which train_gpt compiles on first use with capacities equal
/// to the chosen micro-batch and sequence.
struct layout_option {
  std::string model, precision, device, attention;
  int tp = 1, pp = 1;
  int micro_batch = 1, seq_len = 1;  ///< the capacities (a shape's: the largest micro-batch to consider)
  /// The plan of one rank: (args, world size, dp rank, stage); throws input_error for settings
  /// the trainer refuses.
  std::function<memory_plan(const session_args&, int, int, int)> plan;
  models::model_facts facts;        ///< the model's sizes (a shape's views its model_spec's strings)
  std::size_t parameters = 0;       ///< of the whole model
  const session_instance* instance = nullptr;

  std::string layout() const { return "tp" + std::to_string(tp) + "pp" + std::to_string(pp); }
  /// "quickstart fp32 tp1pp2 cpu fused".
  std::string describe() const { return model + " " + precision + " " + layout() + " " + device + " " + attention; }
};

/// One option per instance with a plan and model facts.
inline std::vector<layout_option> layout_options(std::span<const session_instance> instances) {
  std::vector<layout_option> out;
  for (const auto& i : instances)
    if (i.plan && i.facts)
      out.push_back({std::string(i.model), std::string(i.precision), std::string(i.device), std::string(i.attention),
                     i.tp, i.pp, i.micro_batch, i.seq_len, i.plan, *i.facts, i.parameters, &i});
  return out;
}

/// The option of `spec` on tp x pp, planned by plan_shape with capacities equal to the settings'
/// micro-batch and sequence (micro_batch x seq_len when they give none: an instance compiled on
/// first use has exactly the capacities it runs with), with `threads` OpenMP threads per rank.
/// `spec` must outlive the option (its facts view the spec's strings).
inline layout_option shape_option(const models::model_spec& spec, const std::string& precision,
                                  const std::string& device, const std::string& attention, int tp, int pp,
                                  int micro_batch, int seq_len, int threads) {
  instance_request r{.spec = spec, .precision = precision, .tp = tp, .pp = pp, .device = device,
                     .attention = attention, .micro_batch = micro_batch, .seq_len = seq_len};
  auto plan = [r, threads](const session_args& a, int world, int dp_rank, int stage) {
    instance_request sized = r;
    if (a.cfg.micro_batch > 0) sized.micro_batch = a.cfg.micro_batch;
    if (a.cfg.seq_len > 0) sized.seq_len = a.cfg.seq_len;
    return plan_shape(sized, a, world, dp_rank, stage, threads);
  };
  return {spec.name, precision, device, attention, tp, pp, micro_batch, seq_len, plan, spec.facts(),
          std::size_t(spec.parameter_count()), nullptr};
}

/// shape_option for every layout tp x pp that divides world_size and `spec`
/// (model_facts::layout_problem), considering micro-batches up to max_micro_batch.
inline std::vector<layout_option> layout_options(const models::model_spec& spec, const std::string& precision,
                                                 const std::string& device, const std::string& attention,
                                                 int world_size, int max_micro_batch, int seq_len, int threads) {
  std::vector<layout_option> out;
  for (int tp = 1; tp <= world_size; ++tp)
    for (int pp = 1; tp * pp <= world_size; ++pp)
      if (world_size % (tp * pp) == 0 && spec.facts().layout_problem(tp, pp).empty())
        out.push_back(shape_option(spec, precision, device, attention, tp, pp, max_micro_batch, seq_len, threads));
  return out;
}

/// The options --layout auto chooses among for (model, precision, device, attention): the
/// compiled instances of `instances` (layout_options(instances)) when no spec is given or one of
/// that family is there, else every layout of `spec` (layout_options(spec, ...), the same
/// arguments). Throws what those throw.
inline std::vector<layout_option> family_options(std::span<const session_instance> instances,
                                                 const models::model_spec* spec, const std::string& precision,
                                                 const std::string& device, const std::string& attention,
                                                 int world_size, int max_micro_batch, int seq_len, int threads) {
  const bool compiled = spec == nullptr || std::any_of(instances.begin(), instances.end(), [&](const auto& i) {
                          return i.model == spec->name && i.precision == precision && i.device == device &&
                                 i.attention == attention && i.plan;
                        });
  if (compiled) return layout_options(instances);
  return layout_options(*spec, precision, device, attention, world_size, max_micro_batch, seq_len, threads);
}

/// One candidate layout and what it costs.
struct layout_candidate {
  layout_option option;
  int dp = 1, micro_batch = 1, grad_accum = 1, seq_len = 1;
  nn::recompute recompute = nn::recompute::none;
  bool zero1 = false, offload = false;
  memory_plan largest;        ///< the plan of the rank with the largest total
  int largest_stage = 0;      ///< its pipeline stage
  std::size_t footprint = 0;  ///< largest.total() + the request's overhead, bytes per rank
  step_estimate time;
  bool fits = false;

  /// "tp2pp2 x dp 2, micro-batch 4 x accum 8, recompute full, ZeRO-1" (", no ZeRO-1" with dp > 1
  /// without it).
  std::string describe() const {
    return option.layout() + " x dp " + std::to_string(dp) + ", micro-batch " + std::to_string(micro_batch) +
           " x accum " + std::to_string(grad_accum) + ", recompute " + nn::recompute_name(recompute) +
           (zero1 ? ", ZeRO-1" : dp > 1 ? ", no ZeRO-1" : "") + (offload ? ", optimizer offload" : "");
  }
};

/// The step of option `i` on `dp` data-parallel ranks under `a` (cfg's micro-batch, sequence —
/// 0: the option's capacities —, accumulation, recompute mode and offload; ddp.zero1) at
/// `peak_flops` per rank, for estimate_step: bf16/fp16 instances store 2 bytes per element,
/// every precision keeps fp32 gradients. The result points at i.facts: use it while i lives.
inline step_shape step_shape_of(const layout_option& i, int dp, const session_args& a, double peak_flops) {
  return {.facts = &i.facts, .parameters = double(i.parameters), .tp = i.tp, .pp = i.pp, .dp = dp,
          .micro_batch = a.cfg.micro_batch ? a.cfg.micro_batch : i.micro_batch, .grad_accum = a.cfg.grad_accum,
          .seq_len = a.cfg.seq_len ? a.cfg.seq_len : i.seq_len, .recompute = a.cfg.recompute, .zero1 = a.ddp.zero1,
          .offload = a.cfg.offload_optimizer, .offload_overlap = a.cfg.offload_overlap,
          .storage_bytes = i.precision == "fp32" ? 4 : 2, .grad_bytes = 4, .peak_flops = peak_flops};
}

namespace detail {

/// The candidate of option i with these settings, or false when the option refuses them.
inline bool evaluate_candidate(const layout_option& i, const layout_request& r, layout_candidate& c) {
  session_args a = r.args;
  a.cfg.micro_batch = c.micro_batch;
  a.cfg.seq_len = c.seq_len;
  a.cfg.grad_accum = c.grad_accum;
  a.cfg.recompute = c.recompute;
  a.ddp.zero1 = c.zero1;
  a.cfg.offload_optimizer = c.offload;
  try {
    for (int stage = 0; stage < i.pp; ++stage) {
      const memory_plan p = i.plan(a, r.world_size, 0, stage);
      if (stage == 0 || p.total() > c.largest.total()) c.largest = p, c.largest_stage = stage;
    }
  } catch (const input_error&) {
    return false;  // settings this instance refuses (e.g. a sequence above its capacity)
  }
  c.footprint = c.largest.total() + r.overhead;
  c.fits = r.memory_limit == 0 || c.footprint <= r.memory_limit;
  c.time = estimate_step(step_shape_of(i, c.dp, a, r.peak_flops), r.net);
  return true;
}

}  // namespace detail

/// Every candidate for `r` among `instances` (see the file comment): those that fit the limit
/// first, fastest first (ties: without optimizer offload, then the smaller footprint, then the
/// larger micro-batch), then the rest, smallest footprint first. Throws loom::input_error for a
/// request without a world, global batch or peak, or when no option is of the family.
inline std::vector<layout_candidate> rank_layouts(std::span<const layout_option> instances,
                                                  const layout_request& r) {
  if (r.world_size < 1 || r.global_batch < 1 || !(r.peak_flops > 0))
    throw input_error("layout auto: needs a world of at least one rank, a global batch of at least one sequence "
                      "and a peak above 0");
  std::vector<layout_candidate> out;
  bool family = false;
  for (const auto& i : instances) {
    if (i.model != r.model || i.precision != r.precision || i.device != r.device || i.attention != r.attention ||
        !i.plan)
      continue;
    family = true;
    if (r.world_size % (i.tp * i.pp) != 0) continue;
    const int dp = r.world_size / (i.tp * i.pp);
    for (int b = 1; b <= i.micro_batch; ++b) {
      if (r.global_batch % (b * dp) != 0 || (r.micro_batch > 0 && b != r.micro_batch)) continue;
      for (const auto mode : r.recompute)
        for (const bool z : {false, true})
          for (const bool off : {false, true}) {
            if ((z && (!r.zero1 || dp == 1)) || (off && (!r.offload || z || i.device == "cpu"))) continue;
            layout_candidate c;
            c.option = i, c.dp = dp, c.micro_batch = b, c.grad_accum = r.global_batch / (b * dp);
            c.seq_len = r.seq_len ? r.seq_len : i.seq_len, c.recompute = mode, c.zero1 = z, c.offload = off;
            if (detail::evaluate_candidate(i, r, c)) out.push_back(c);
          }
    }
  }
  if (!family)
    throw input_error("layout auto: no compiled instance of " + std::string(r.model) + " " + std::string(r.precision) +
                      " on " + std::string(r.device) + " (" + std::string(r.attention) +
                      " attention); --list-instances shows what is compiled");
  std::stable_sort(out.begin(), out.end(), [](const layout_candidate& a, const layout_candidate& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.fits && a.time.seconds() != b.time.seconds()) return a.time.seconds() < b.time.seconds();
    // offload costs host memory and a host pass the estimate does not see: not for free
    if (a.offload != b.offload) return !a.offload;
    if (a.footprint != b.footprint) return a.footprint < b.footprint;
    return a.micro_batch > b.micro_batch;  // the model does not see kernel efficiency: larger GEMMs win ties
  });
  return out;
}

/// The fastest candidate of rank_layouts that fits. Throws loom::input_error when none fits,
/// naming the smallest footprint, the candidate that has it and the limit or ranks that would
/// reach it; or when no candidate exists (a world no compiled layout divides, a global batch no
/// micro-batch x dp divides).
inline layout_candidate choose_layout(std::span<const layout_option> instances, const layout_request& r) {
  const auto ranked = rank_layouts(instances, r);
  if (ranked.empty())
    throw input_error("layout auto: no compiled layout of " + std::string(r.model) + " divides " +
                      std::to_string(r.world_size) + " ranks with a micro-batch x dp dividing the global batch " +
                      std::to_string(r.global_batch) + "; pass a global batch that is a multiple of the ranks");
  if (ranked.front().fits) return ranked.front();
  auto smallest = ranked.front();
  for (const auto& c : ranked) smallest = c.footprint < smallest.footprint ? c : smallest;
  const auto mib = [](std::size_t b) { return std::to_string((b + (1u << 20) - 1) >> 20); };  // rounded up
  throw input_error("layout auto: nothing fits " + mib(r.memory_limit) + " MiB per rank: the smallest footprint is " +
                    mib(smallest.footprint) + " MiB (" + smallest.describe() + ", stage " +
                    std::to_string(smallest.largest_stage) + "); pass --memory-limit " + mib(smallest.footprint) +
                    "MiB or more, or more ranks (--ranks: more data-parallel ranks shard the optimizer with ZeRO-1, "
                    "larger tp x pp layouts split the model; cmake -DLOOM_EXTRA_SESSIONS compiles more layouts)");
}

/// rank_layouts among the compiled instances `instances` (layout_options of them).
inline std::vector<layout_candidate> rank_layouts(std::span<const session_instance> instances, const layout_request& r) {
  return rank_layouts(layout_options(instances), r);
}

/// choose_layout among the compiled instances `instances` (layout_options of them).
inline layout_candidate choose_layout(std::span<const session_instance> instances, const layout_request& r) {
  return choose_layout(layout_options(instances), r);
}

}  // namespace loom::train
