// plan — the memory of every rank of a training run, and its compute time, before launching it.
//
//   plan --model gpt2_small --precision bf16 --layout tp2pp2 --ranks 8 --micro-batch 4
//        --seq-len 256 --grad-accum 8 --recompute full --zero1
//
// For one compiled train_gpt instance (model, precision, layout, device: the same instances
// train_gpt runs) and the run-time settings, prints per pipeline stage (data-parallel rank 0,
// and the largest ZeRO-1 shard over the dp ranks) the bytes of parameters, gradients, fp32
// master weights, AdamW moments, activation tables and data-parallel buckets (with
// --offload-optimizer, --device ascend: masters and moments 0 and a host optimizer column), from
// train::basic_trainer::plan — the tables the trainer allocates from (the plan equals the
// trainer's allocation, tests/support/layout_matrix.hpp) — and the compute time of a step:
// the model FLOPs of the global batch (6 N + 12 L T C per token; full recompute adds one block
// forward) over world size x peak (on the CPU: the measured peak of the unit the precision's
// GEMMs run on, unless --peak-gflops), stretched by the 1F1B bubble (PP - 1) / m. Not included:
// communication time, allocator slack and the runtime's own memory (about 80 MiB of RSS for a
// CPU process; CANN's workspace on an NPU).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <loom/bench/peak.hpp>
#include <loom/core/error.hpp>
#include <loom/models/registry.hpp>
#include <loom/nn/activations.hpp>
#include <loom/train/session.hpp>

#include "cli.hpp"
#include "train_gpt/options.hpp"

namespace {

struct options {
  std::string model = "quickstart_bpe", precision = "fp32", layout = "tp1pp1", device = "cpu", attention = "fused";
  std::string recompute = "none";
  int ranks = 1, micro_batch = 0, seq_len = 0, grad_accum = 1, threads = 0;
  bool zero1 = false, offload_optimizer = false;
  double bucket_mb = 1.0, peak_gflops = 0;
};

double mib(std::size_t b) { return double(b) / 1048576.0; }

}  // namespace

int main(int argc, char** argv) {
  using namespace loom;
  options o;
  CLI::App app{"plan: per-rank memory and compute time of a train_gpt run, before launching it"};
  app.add_option("--model", o.model, "model config: " + models::model_names());
  app.add_option("--precision", o.precision, "fp32, bf16 or fp16")->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--layout", o.layout, "tp<N>pp<M>: tensor x pipeline parallel degrees");
  app.add_option("--device", o.device, "cpu or ascend")->check(CLI::IsMember({"cpu", "ascend"}));
  app.add_option("--attention", o.attention, "fused or reference")->check(CLI::IsMember({"fused", "reference"}));
  app.add_option("--ranks", o.ranks, "world size (a multiple of TP x PP; the rest is data parallel)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--micro-batch", o.micro_batch, "sequences per micro-batch (0: the instance's capacity)");
  app.add_option("--seq-len", o.seq_len, "tokens per sequence (0: the instance's capacity)");
  app.add_option("--grad-accum", o.grad_accum, "micro-batches per step (the pipeline's m)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--recompute", o.recompute, "none, selective or full")
      ->check(CLI::IsMember({"none", "selective", "full"}));
  app.add_flag("--zero1", o.zero1, "shard the AdamW state over the data-parallel ranks (ZeRO-1)");
  app.add_flag("--offload-optimizer", o.offload_optimizer,
               "--device ascend: AdamW state in pinned host memory (train_gpt --offload-optimizer); the plan adds a "
               "host optimizer column");
  app.add_option("--bucket-mb", o.bucket_mb, "data-parallel bucket size (MiB)")->check(CLI::PositiveNumber);
  app.add_option("--threads-per-rank", o.threads,
                 "OpenMP threads of each rank, which size the CPU attention's scratch (default: as train_gpt --ranks "
                 "shares this machine's threads)")
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--peak-gflops", o.peak_gflops, "per-rank peak for the time estimate (default on the CPU: measured)");
  loom_examples::parse_or_exit(app, argc, argv);
  try {
    const auto [tp, pp] = train_gpt_cli::parse_layout(o.layout);
    const auto instances = train::compiled_sessions();
    if (!train::find_whole_model(instances, o.model))
      throw input_error("--model " + o.model + ": no instance of it is compiled into this build; compiled models: " +
                        [&] {
                          std::string names;
                          for (const auto& i : instances)
                            if (names.find(std::string(i.model)) == std::string::npos)
                              names += (names.empty() ? "" : ", ") + std::string(i.model);
                          return names;
                        }());
    const auto* inst = train::find_session(instances, o.model, o.precision, tp, pp, o.device, o.attention);
    if (!inst)
      throw input_error("no compiled instance " + o.model + "/" + o.precision + "/" + o.layout + "/" + o.device + "/" +
                        o.attention + "; add it with cmake -DLOOM_EXTRA_SESSIONS=" + o.model + "/" + o.precision + "/" +
                        o.layout + "/" + o.device + "/" + o.attention + " and rebuild");
    train::session_args a;
    a.cfg.micro_batch = o.micro_batch;
    a.cfg.seq_len = o.seq_len;
    a.cfg.grad_accum = o.grad_accum;
    a.cfg.recompute = train_gpt_cli::recompute_mode(o.recompute);
    a.cfg.offload_optimizer = o.offload_optimizer;
    a.ddp = {.bucket_mb = o.bucket_mb, .zero1 = o.zero1};
    const int dp = o.ranks / std::max(1, tp * pp);
#ifdef _OPENMP
    const int threads = o.threads > 0 ? o.threads : std::max(1, omp_get_max_threads() / o.ranks);
    omp_set_num_threads(threads);  // the plan reads the calling thread's team size, as a rank does
#else
    const int threads = 1;
#endif
    // every stage's plan first: a setting the trainer refuses fails before anything is printed
    std::vector<train::memory_plan> plans;
    for (int stage = 0; stage < pp; ++stage) {
      train::memory_plan p = inst->plan(a, o.ranks, 0, stage);
      for (int r = 1; r < dp && o.zero1; ++r) {  // ZeRO-1 shards differ by a chunk's rounding: the largest
        const auto q = inst->plan(a, o.ranks, r, stage);
        if (q.total() > p.total()) p = q;
      }
      plans.push_back(p);
    }
    const int b = o.micro_batch ? o.micro_batch : inst->micro_batch, t = o.seq_len ? o.seq_len : inst->seq_len;
    std::printf("%s, micro-batch %d x seq %d x accum %d, %d rank%s = tp %d x pp %d x dp %d%s, recompute %s, "
                "%d thread%s per rank (memory is sized for the compiled capacity %d x %d)\n",
                inst->describe().c_str(), b, t, o.grad_accum, o.ranks, o.ranks == 1 ? "" : "s", tp, pp, dp,
                o.zero1 ? ", ZeRO-1" : "", o.recompute.c_str(), threads, threads == 1 ? "" : "s", inst->micro_batch,
                inst->seq_len);
    const bool off = o.offload_optimizer;  // one more column: the pinned host memory of the offloaded state
    std::printf("| stage | parameters | gradients | master weights | moments | activations | buckets | total (MiB) |%s\n",
                off ? " host optimizer (MiB) |" : "");
    std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |%s\n", off ? " ---: |" : "");
    std::size_t largest = 0;
    for (int stage = 0; stage < pp; ++stage) {
      const auto& p = plans[std::size_t(stage)];
      largest = std::max(largest, p.total());
      std::printf("| %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |", stage, mib(p.parameters), mib(p.gradients),
                  mib(p.master_weights), mib(p.moments), mib(p.activations), mib(p.buckets), mib(p.total()));
      if (off) std::printf(" %.2f |", mib(p.host_optimizer));
      std::printf("\n");
    }
    std::printf("largest rank: %.1f MiB (parameters, gradients, optimizer, activations, buckets; not the runtime's own "
                "memory or allocator slack)%s\n",
                mib(largest), off ? "; the offloaded optimizer state is in pinned host memory, not in the total" : "");
    // compute time: model FLOPs of the global batch over world x peak, stretched by the bubble
    const auto whole = inst->whole(1);  // the single-rank model: its parameter count and sizes
    const models::model_facts& f = whole->model();
    const double n = double(whole->parameters().size());
    const double fpt = 6.0 * n + 12.0 * f.n_layer * t * f.d_model;
    const double block_forward = 2.0 * (n - double(f.vocab_padded) * f.d_model) + 4.0 * f.n_layer * t * f.d_model;
    const double per_token = fpt + (o.recompute == "full" ? block_forward : 0.0);
    const double tokens = double(b) * t * o.grad_accum * dp;
    double peak = o.peak_gflops;
    std::string source = "--peak-gflops";
    if (!(peak > 0) && o.device == "cpu") {  // the unit the precision's GEMMs run on, measured
      const bool dot = o.precision != "fp32" && bench::peak_unit_available(bench::peak_unit::bf16_dot);
      peak = (dot ? bench::measure_peak(bench::peak_unit::bf16_dot) : bench::measure_fp32_peak()).gflops;
      source = dot ? "this CPU's VDPBF16PS peak, measured" : "this CPU's fp32 FMA peak, measured";
    }
    if (peak > 0) {
      const double bubble = pp > 1 ? double(pp - 1) / o.grad_accum : 0.0;
      const double seconds = per_token * tokens / (double(o.ranks) * peak * 1e9) * (1.0 + bubble);
      std::printf("compute: %.3g FLOP per step (%.0f tokens), peak %.0f GFLOP/s per rank (%s), bubble %.0f %%: "
                  "%.3g s per step at 100 %% MFU, %.3g s at 50 %%; communication not included\n",
                  per_token * tokens, tokens, peak, source.c_str(), 100 * bubble, seconds, 2 * seconds);
    } else {
      std::printf("compute: no time estimate without --peak-gflops for --device %s\n", o.device.c_str());
    }
    return 0;
  } catch (const loom::input_error& e) {
    std::fprintf(stderr, "plan: error: %s\n", e.what());
    return 2;
  }
}
