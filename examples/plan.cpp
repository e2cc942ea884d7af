// plan — the memory of every rank of a training run, and its step time, before launching it;
// or, with --layout auto, the fastest layout that fits a memory limit.
//
//   plan --model gpt2_small --precision bf16 --layout tp2pp2 --ranks 8 --micro-batch 4
//        --seq-len 256 --grad-accum 8 --recompute full --zero1
//   plan --model quickstart --layout auto --ranks 4 --global-batch 64 --memory-limit 40MiB
//   plan --model llama2_7b --precision bf16 --device ascend --layout auto --ranks 64
//        --global-batch 256 --memory-limit 64GB --devices-per-node 8 --link-gbps 100 --inter-node-gbps 20
//
// For one instance (model, precision, layout, device: the instances train_gpt runs, and the
// plan-only ones of LOOM_PLAN_SESSIONS) and the run-time settings, prints per pipeline stage
// (data-parallel rank 0, whose ZeRO-1 shard is the largest) the bytes of parameters, gradients,
// fp32 master weights, AdamW moments, activation tables and data-parallel buckets, from
// train::trainer::plan — the tables the trainer allocates from (the plan equals the
// trainer's allocation, tests/support/layout_matrix.hpp) — plus the stated runtime overhead
// (--overhead), and the step time of train::estimate_step: model FLOPs over world size x peak
// (on the CPU the measured peak of the unit the precision's GEMMs run on; on an NPU the SoC's
// table figure, device/ascend_peak.hpp), stretched by the 1F1B bubble, plus the exposed
// communication at the links' bandwidth and latency (on the CPU measured on --ranks threads;
// on an NPU from --link-gbps / --inter-node-gbps, hccl_test's busbw).
#include <algorithm>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <loom/core/error.hpp>
#include <loom/device/ascend_peak.hpp>
#include <loom/train/auto_layout.hpp>
#include <loom/train/session.hpp>

#include "cli.hpp"
#include "layout_auto.hpp"
#include "train_gpt/model_flags.hpp"
#include "train_gpt/options.hpp"

namespace {

struct options {
  std::string model = "quickstart_bpe", precision = "fp32", layout = "tp1pp1", device = "cpu", attention = "fused";
  std::string recompute = "none", memory_limit, overhead, soc = "Ascend910B";
  int show = 2;
  int ranks = 1, micro_batch = 0, seq_len = 0, grad_accum = 1, global_batch = 0, threads = 0, devices_per_node = 0;
  bool zero1 = false, offload_optimizer = false, offload_overlap = true;
  double bucket_mb = 1.0, peak_gflops = 0, link_gbps = 0, link_latency_us = 10, inter_gbps = 0, inter_latency_us = 20;
  double host_gbps = 0;
};

double mib(std::size_t b) { return double(b) / 1048576.0; }

/// The instance's model, or an error naming the models that are planned in this build.
void check_model(std::span<const loom::train::session_instance> all, const std::string& model) {
  std::string names;
  for (const auto& i : all) {
    if (i.model == model) return;
    if (names.find(std::string(i.model)) == std::string::npos) names += (names.empty() ? "" : ", ") + std::string(i.model);
  }
  throw loom::input_error("--model " + model + ": unknown model (none of its instances is compiled into this build); "
                          "planned models: " + names);
}

/// The per-rank peak in FLOP/s: --peak-gflops, the CPU's measured unit, or the NPU table's.
std::pair<double, std::string> peak_of(const options& o) {
  using namespace loom;
  if (o.peak_gflops > 0) return {o.peak_gflops * 1e9, "--peak-gflops"};
  if (o.device == "cpu") return loom_examples::cpu_peak(o.precision);
  const auto row = device::ascend_peak_for(o.soc);
  const double f = row ? row->flops(o.precision) : 0.0;
  if (!(f > 0))
    throw input_error("--device ascend: no peak for SoC " + o.soc + " in " + o.precision +
                      " (device/ascend_peak.hpp); pass --peak-gflops");
  return {f, std::string(row->product) + (row->confirmed ? "" : ", unconfirmed table figure")};
}

/// The links: on the CPU measured on --ranks threads (unless --link-gbps), on an NPU the flags.
loom::train::network network_of(const options& o, std::string& source) {
  using namespace loom;
  train::network net{.intra = {o.link_gbps, o.link_latency_us}, .inter = {o.inter_gbps, o.inter_latency_us},
                     .devices_per_node = o.devices_per_node, .host = {o.host_gbps, 0}};
  if (o.link_gbps > 0) {
    source = "--link-gbps";
  } else if (o.device == "cpu" && o.ranks > 1) {
    net.intra = loom_examples::threads_link(o.ranks);
    source = "measured all-reduce on " + std::to_string(o.ranks) + " threads";
  } else if (o.ranks > 1) {
    throw input_error("--device " + o.device + " with --ranks " + std::to_string(o.ranks) +
                      ": pass the links' bus bandwidth, --link-gbps (and --inter-node-gbps with --devices-per-node), "
                      "as hccl_test measures it");
  }
  if (net.devices_per_node > 0 && o.ranks > net.devices_per_node && !(net.inter.bus_gbytes > 0))
    throw input_error("--devices-per-node " + std::to_string(o.devices_per_node) + " < --ranks: pass --inter-node-gbps");
  return net;
}

void print_plans(const loom::train::layout_option& inst, const options& o, const loom::train::session_args& a,
                 int b, int t, int accum, int threads, std::size_t overhead) {
  using namespace loom;
  const int dp = o.ranks / (inst.tp * inst.pp);
  std::vector<train::memory_plan> plans;  // every stage first: a refused setting prints nothing
  for (int stage = 0; stage < inst.pp; ++stage) plans.push_back(inst.plan(a, o.ranks, 0, stage));
  const std::string per_rank =
      o.device == "cpu" ? ", " + std::to_string(threads) + " thread" + (threads == 1 ? "" : "s") + " per rank" : "";
  const std::string sized = inst.instance ? "memory is sized for the compiled capacity " + std::to_string(inst.micro_batch) +
                                                " x " + std::to_string(inst.seq_len)
                                          : "an instance compiled on first use, for exactly " + std::to_string(b) +
                                                " x " + std::to_string(t);
  std::printf("%s, %.3g B parameters, micro-batch %d x seq %d x accum %d, %d rank%s = tp %d x pp %d x dp %d%s, "
              "recompute %s%s (%s)\n",
              inst.describe().c_str(), double(inst.parameters) / 1e9, b, t, accum, o.ranks, o.ranks == 1 ? "" : "s",
              inst.tp, inst.pp, dp, a.ddp.zero1 ? ", ZeRO-1" : "", nn::recompute_name(a.cfg.recompute),
              per_rank.c_str(), sized.c_str());
  const bool off = a.cfg.offload_optimizer;  // one more column: the pinned host memory of the offloaded state
  std::printf("| stage | parameters | gradients | master weights | moments | activations | buckets | total (MiB) |%s\n",
              off ? " host optimizer (MiB) |" : "");
  std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |%s\n", off ? " ---: |" : "");
  std::size_t largest = 0;
  for (int stage = 0; stage < inst.pp; ++stage) {
    const auto& p = plans[std::size_t(stage)];
    largest = std::max(largest, p.total());
    std::printf("| %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |", stage, mib(p.parameters), mib(p.gradients),
                mib(p.master_weights), mib(p.moments), mib(p.activations), mib(p.buckets), mib(p.total()));
    if (off) std::printf(" %.2f |", mib(p.host_optimizer));
    std::printf("\n");
  }
  std::printf("largest rank: %.1f MiB planned + %.1f MiB runtime overhead (--overhead) = %.1f MiB%s\n", mib(largest),
              mib(overhead), mib(largest + overhead),
              off ? "; the offloaded optimizer state is in pinned host memory, not in the total" : "");
}

void print_estimate(const loom::train::step_estimate& e, double tokens, double peak, const std::string& peak_source,
                    const loom::train::network& net, const std::string& net_source) {
  std::printf("step estimate: %.3g FLOP (%.0f tokens), peak %.0f GFLOP/s per rank (%s); links %.1f GB/s bus, %.1f us",
              e.flops, tokens, peak / 1e9, peak_source.c_str(), net.intra.bus_gbytes, net.intra.latency_us);
  if (net.devices_per_node > 0 && net.inter.bus_gbytes > 0)
    std::printf(" within %d-rank nodes, %.1f GB/s, %.1f us between", net.devices_per_node, net.inter.bus_gbytes,
                net.inter.latency_us);
  std::printf(" (%s)\n", net_source.c_str());
  std::printf("  compute %.3g s at 100 %% of peak, bubble +%.0f %%, tensor-parallel %.3g s, pipeline %.3g s, "
              "data-parallel %.3g s exposed: %.3g s per step (%.3g s at 50 %% MFU)\n",
              e.compute, 100 * e.bubble, e.tp_comm, e.pp_comm, e.dp_comm, e.seconds(),
              e.seconds() + e.compute * (1 + e.bubble));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace loom;
  options o;
  CLI::App app{"plan: per-rank memory and step time of a train_gpt run before launching it, or (--layout auto) the "
               "fastest layout that fits a memory limit"};
  app.add_option("--model", o.model,
                 "a preset model, or a compiled test model (any other shape: --model-config or the shape flags)")
      ->capture_default_str();
  app.add_option("--precision", o.precision, "fp32, bf16 or fp16")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))->capture_default_str();
  app.add_option("--layout", o.layout, "tp<N>pp<M>: tensor x pipeline parallel degrees, or auto (needs --memory-limit)")
      ->capture_default_str();
  app.add_option("--device", o.device, "cpu or ascend")->check(CLI::IsMember({"cpu", "ascend"}))->capture_default_str();
  app.add_option("--attention", o.attention, "fused or reference")
      ->check(CLI::IsMember({"fused", "reference"}))->capture_default_str();
  app.add_option("--ranks", o.ranks, "world size (a multiple of TP x PP; the rest is data parallel)")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--micro-batch,--micro-batch-size", o.micro_batch,
                 "sequences per micro-batch (0: the instance's capacity; with --layout auto, 0: auto chooses it)")
      ->capture_default_str();
  app.add_option("--seq-len,--seq-length", o.seq_len,
                 "tokens per sequence (0: a compiled instance's capacity, else the model's positions)")
      ->capture_default_str();
  app.add_option("--grad-accum", o.grad_accum, "micro-batches per step (the pipeline's m)")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--global-batch", o.global_batch,
                 "--layout auto: sequences per step over all ranks (0: micro-batch x grad-accum x ranks)")
      ->check(CLI::Range(0, 1 << 30))->capture_default_str();
  app.add_option("--show", o.show, "--layout auto: print this many ranked candidates")->capture_default_str();
  app.add_option("--memory-limit", o.memory_limit, "--layout auto: bytes per rank, e.g. 24GiB, 64GB, 512MiB");
  app.add_option("--overhead", o.overhead,
                 "runtime memory per rank the plan does not hold (default: 100MiB on the cpu, 3GiB on an NPU; "
                 "docs/memory.md)");
  app.add_option("--recompute", o.recompute, "none, selective or full")
      ->check(CLI::IsMember({"none", "selective", "full"}))->capture_default_str();
  app.add_flag("--zero1", o.zero1, "shard the AdamW state over the data-parallel ranks (ZeRO-1)");
  app.add_flag("--offload-optimizer", o.offload_optimizer,
               "--device ascend: AdamW state in pinned host memory (train_gpt --offload-optimizer); the plan adds a "
               "host optimizer column");
  app.add_option("--offload-overlap", o.offload_overlap,
                 "with --offload-optimizer: on (default) hides the copies behind the next step's first forward, as "
                 "train_gpt --offload-overlap on does; off counts them all")
      ->needs(app.get_option("--offload-optimizer"));
  app.add_option("--bucket-mb", o.bucket_mb, "data-parallel bucket size (MiB)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--threads-per-rank", o.threads,
                 "OpenMP threads of each rank, which size the CPU attention's scratch (0: as train_gpt --ranks "
                 "shares this machine's threads)")
      ->check(CLI::Range(0, 1 << 16))->capture_default_str();
  app.add_option("--peak-gflops", o.peak_gflops, "per-rank peak (0: the CPU's measured, the NPU's table figure)")
      ->capture_default_str();
  app.add_option("--soc", o.soc, "--device ascend: the SoC whose table peak to use")->capture_default_str();
  app.add_option("--link-gbps", o.link_gbps, "all-reduce bus bandwidth within a node, GB/s (0: measured on the cpu)")
      ->capture_default_str();
  app.add_option("--link-latency-us", o.link_latency_us, "latency of one collective step within a node, us")
      ->capture_default_str();
  app.add_option("--devices-per-node", o.devices_per_node, "ranks per node (0: one node)")->capture_default_str();
  app.add_option("--inter-node-gbps", o.inter_gbps, "bus bandwidth between nodes, GB/s")->capture_default_str();
  app.add_option("--inter-node-latency-us", o.inter_latency_us, "latency between nodes, us")->capture_default_str();
  app.add_option("--host-gbps", o.host_gbps,
                 "--device ascend: device <-> host copy bandwidth, GB/s; the time of --offload-optimizer, and with "
                 "--layout auto lets it choose optimizer offload (0: offload not estimated nor chosen)")
      ->capture_default_str();
  train_gpt_cli::model_options mo;
  train_gpt_cli::add_model_flags(app, mo);
  loom_examples::parse_or_exit(app, argc, argv);
  try {
    const auto all = train::planned_sessions();
    const bool automatic = o.layout == "auto";
    // the model: the shape flags or --model-config (any shape), a preset, or a compiled test model
    std::optional<models::model_spec> spec;
    if (train_gpt_cli::shape_from_flags(app) || !mo.model_config.empty()) {
      train_gpt_cli::options to;
      to.model = o.model, to.seq_len = o.seq_len;
      spec = train_gpt_cli::resolve_model(to, mo, app, false,
                                          automatic ? 1 : train_gpt_cli::parse_layout(o.layout).first);
      o.model = spec->name;
    } else {
      spec = models::preset_spec(o.model);
      if (!spec) check_model(all, o.model);
    }
    if (automatic && o.memory_limit.empty())
      throw input_error("--layout auto needs --memory-limit (bytes per rank, e.g. 24GiB)");
    if (!automatic && !o.memory_limit.empty())
      throw input_error("--memory-limit is for --layout auto; drop it or pass --layout auto");
    const auto [tp, pp] = automatic ? std::pair{1, 1} : train_gpt_cli::parse_layout(o.layout);
    if (!automatic) {  // a layout that cannot split the model is the basic problem (as train_gpt says it)
      std::optional<models::model_facts> f;
      if (spec) f = spec->facts();
      for (const auto& i : all)
        if (!f && i.model == o.model) f = *i.facts;
      if (const auto problem = f ? f->layout_problem(tp, pp) : std::string(); !problem.empty())
        throw input_error(problem);
    }
    const auto* inst = automatic ? nullptr : train::find_session(all, o.model, o.precision, tp, pp, o.device, o.attention);
    if (!automatic && !inst && !spec)
      throw input_error("no compiled instance " + o.model + "/" + o.precision + "/" + o.layout + "/" + o.device + "/" +
                        o.attention + "; add it with cmake -DLOOM_EXTRA_SESSIONS=" + o.model + "/" + o.precision + "/" +
                        o.layout + "/" + o.device + "/" + o.attention + " (or LOOM_PLAN_SESSIONS) and rebuild");
    const std::size_t overhead = train::parse_bytes(
        !o.overhead.empty() ? o.overhead : o.device == "cpu" ? "100MiB" : "3GiB", "--overhead");
#ifdef _OPENMP
    const int threads = o.threads > 0 ? o.threads : std::max(1, omp_get_max_threads() / o.ranks);
#else
    const int threads = 1;
#endif
    std::string net_source;
    const auto net = network_of(o, net_source);  // before the peak: the probe uses every thread
#ifdef _OPENMP
    omp_set_num_threads(threads);  // the plan reads the calling thread's team size, as a rank does
#endif
    const auto [peak, peak_source] = peak_of(o);
    train::session_args a;
    a.cfg.micro_batch = o.micro_batch;
    a.cfg.seq_len = o.seq_len;
    a.cfg.grad_accum = o.grad_accum;
    a.cfg.recompute = train_gpt_cli::recompute_mode(o.recompute);
    a.cfg.offload_optimizer = o.offload_optimizer;
    a.cfg.offload_overlap = o.offload_overlap;
    a.ddp = {.bucket_mb = o.bucket_mb, .zero1 = o.zero1};
    // without a compiled instance: the instance train_gpt compiles on first use (capacities: the
    // micro-batch, 4 when not given, and the sequence, the model's positions when not given)
    const int seq = o.seq_len > 0 ? o.seq_len : spec ? spec->max_seq : 0;
    std::vector<train::layout_option> choices;
    if (automatic) {
      choices = train::family_options(all, spec ? &*spec : nullptr, o.precision, o.device, o.attention, o.ranks,
                                      o.micro_batch > 0 ? o.micro_batch : 32, seq, threads);
    } else {
      choices.push_back(inst ? train::layout_options(std::span(inst, 1)).front()
                             : train::shape_option(*spec, o.precision, o.device, o.attention, tp, pp,
                                                   o.micro_batch > 0 ? o.micro_batch : 4, seq, threads));
    }
    const train::layout_option* chosen = automatic ? nullptr : &choices.front();
    train::layout_option best_option;
    if (automatic) {
      train::layout_request r{.model = o.model, .precision = o.precision, .device = o.device, .attention = o.attention,
                              .world_size = o.ranks, .seq_len = o.seq_len, .micro_batch = o.micro_batch,
                              .memory_limit = train::parse_bytes(o.memory_limit, "--memory-limit"),
                              .overhead = overhead, .peak_flops = peak, .net = net, .args = a,
                              .offload = o.device != "cpu" && o.host_gbps > 0};
      int capacity = 0;
      for (const auto& i : choices)
        if (i.model == o.model && i.instance) capacity = std::max(capacity, i.micro_batch);
      if (capacity == 0) r.seq_len = seq;  // a shape: every option is compiled on first use
      r.global_batch = o.global_batch ? o.global_batch
                                      : (o.micro_batch ? o.micro_batch : capacity ? capacity : 4) * o.grad_accum * o.ranks;
      const auto best = loom_examples::choose_and_print(choices, r, "plan", std::size_t(std::max(o.show, 0)));
      best_option = best.option;
      chosen = &best_option;
      a.cfg.micro_batch = best.micro_batch;
      a.cfg.grad_accum = best.grad_accum;
      a.cfg.recompute = best.recompute;
      a.ddp.zero1 = best.zero1;
      a.cfg.offload_optimizer = best.offload;
    }
    if (!chosen->instance && a.cfg.seq_len == 0) a.cfg.seq_len = seq;
    const int b = a.cfg.micro_batch ? a.cfg.micro_batch : chosen->micro_batch;
    const int t = a.cfg.seq_len ? a.cfg.seq_len : chosen->seq_len;
    print_plans(*chosen, o, a, b, t, a.cfg.grad_accum, threads, overhead);
    const int dp = o.ranks / (chosen->tp * chosen->pp);
    auto shape = train::step_shape_of(*chosen, dp, a, peak);
    shape.offload = shape.offload && o.host_gbps > 0;  // the copies are estimated only with the host link
    const auto e = train::estimate_step(shape, net);
    print_estimate(e, double(b) * t * a.cfg.grad_accum * dp, peak, peak_source, net, net_source);
    if (a.cfg.offload_optimizer && o.host_gbps > 0)
      std::printf("  optimizer offload: %.3g s of copies at %.1f GB/s (--host-gbps), %.3g s of them hidden behind the "
                  "next step's first forward (--offload-overlap %s), %.3g s included; the host's AdamW pass is not\n",
                  e.offload_copies, o.host_gbps, e.offload_copies - e.offload, o.offload_overlap ? "on" : "off",
                  e.offload);
    else if (a.cfg.offload_optimizer)
      std::printf("  optimizer offload: its copies are not estimated (pass --host-gbps)\n");
    return 0;
  } catch (const loom::input_error& e) {
    std::fprintf(stderr, "plan: error: %s\n", e.what());
    return 2;
  }
}
