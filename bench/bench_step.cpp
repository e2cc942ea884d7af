// bench_step — one whole training step (forward, backward, clip, AdamW) on the CPU, loom beside
// PyTorch in the same run: the quickstart config (fp32) and the comparison config bench_small
// (vocab 8192, seq 256, width 384, 6 layers, 6 heads, micro-batch 8) in fp32 and bf16.
//
//   build/bench/bench_step [--steps N] [--rounds R] [--no-torch] [--python /usr/bin/python3] [--gpt2-small] [--llama]
//
// Each round runs every row once with loom, then the same row with PyTorch
// (bench/reference/torch_step.py: the same model and optimizer, bf16 through torch.autocast),
// so the two share the machine's state; the table shows medians over the rounds and the
// loom/PyTorch ratio (median of the per-round ratios). PyTorch rows are skipped when the python
// has no torch (Debian: python3-torch). Both use every core (OpenMP / torch.set_num_threads).
//
// MFU = (6 N + 12 L T d) * tokens/s / peak, N = parameters without position embeddings, against
// the peak of the unit the precision runs its GEMMs on (bench::peak_unit, measured at start-up):
// fp32 FMA for fp32; for bf16 AMX-BF16 where present (oneDNN's tiles, in loom and PyTorch), else
// VDPBF16PS (loom's kernel; PyTorch's oneDNN), else fp32. Memory: loom's buffers and the
// process's peak RSS (cumulative over rows).
//
// --gpt2-small adds GPT-2 small (124M, vocab 50257, micro-batch 4 x 256 tokens) in fp32 and bf16.
// --llama adds llama_quickstart beside quickstart_bpe (16 x 128), and with --gpt2-small llama_100m
// (4 x 256) beside GPT-2 small, fp32 and bf16, with PyTorch's Llama (torch_step.py --arch llama).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/bench/peak.hpp>
#include <loom/core/memory.hpp>
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/train/trainer.hpp>

#ifndef LOOM_BENCH_REFERENCE_DIR
#define LOOM_BENCH_REFERENCE_DIR "bench/reference"
#endif

namespace {

using loom::bench::peak_unit;

/// One loom measurement of a row.
struct loom_result {
  double tokens_per_s = 0, ms = 0;
  double param_mib = 0, opt_mib = 0, act_mib = 0;
};

/// Shape of a row, for the PyTorch script and the MFU formula.
struct row_shape {
  std::string config, precision;
  int vocab, seq, width, layers, heads, batch;
  std::string arch;   // "gpt2" or "llama" (the PyTorch script's --arch)
  int kv_heads, ffn;  // Llama's key/value heads and SwiGLU width
  double params;  // without position embeddings
  double flops_per_token() const { return 6 * params + 12.0 * layers * seq * width; }
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class M, int B, int T, class Prec>
row_shape shape_of() {
  constexpr bool llama = loom::nn::arch_of<M>().mlp == loom::nn::mlp_kind::swiglu;
  return {std::string(M::name), std::string(Prec::name), M::vocab, T, M::d_model, M::n_layer, M::n_head, B,
          llama ? "llama" : "gpt2", loom::models::kv_heads_of<M>(), loom::models::mlp_hidden_of<M>(),
          double(loom::nn::parameter_count<M>(false))};
}

/// Trains `steps` steps after one warm-up step on random tokens; median step time.
template <class M, int B, int T, class Prec>
loom_result run_loom(int steps) {
  using namespace loom;
  using P = policy<device::cpu, Prec>;
  context<device::cpu> ctx;
  train::trainer_config cfg;
  cfg.schedule = {1e-3, 1e-4, 10, 1000};
  using scaler = std::conditional_t<Prec::needs_loss_scaling, train::dynamic_loss_scaler, train::no_loss_scaler>;
  train::trainer<M, P, B, T, kernels::fused, scaler> tr(ctx, cfg);
  std::vector<std::int32_t> w(tr.windows_per_step() * tr.window());
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::int32_t(random_below(M::vocab, 1, 0, i));
  tr.step(ctx, w);  // warm-up: first touch of every buffer, thread pool start
  std::vector<double> ms;
  for (int s = 0; s < steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    tr.step(ctx, w);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  loom_result r;
  r.ms = median(ms);
  r.tokens_per_s = double(B) * T / r.ms * 1e3;
  r.param_mib = double(tr.model().parameters().bytes() + tr.model().gradients().bytes()) / 1048576.0;
  std::size_t opt_bytes = 2 * tr.optimizer().first_moment().bytes();  // moments (+ fp32 masters below fp32)
  if constexpr (std::remove_cvref_t<decltype(tr.optimizer())>::has_master) opt_bytes += tr.optimizer().master_weights().bytes();
  r.opt_mib = double(opt_bytes) / 1048576.0;
  r.act_mib = double(tr.activation_bytes()) / 1048576.0;
  return r;
}

/// Runs the PyTorch reference for `s`; tokens/s, or nothing when it failed (message printed once).
std::optional<double> run_torch(const std::string& python, const std::string& script, const row_shape& s, int steps,
                                int threads) {
  const std::string cmd = fmt::format(
      "'{}' '{}' --vocab {} --seq {} --width {} --layers {} --heads {} --batch {} --precision {} --steps {} "
      "--threads {} --arch {} --kv-heads {} --ffn {} 2>&1",
      python, script, s.vocab, s.seq, s.width, s.layers, s.heads, s.batch, s.precision, steps, threads, s.arch,
      s.kv_heads, s.ffn);
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return std::nullopt;
  std::string out;
  std::array<char, 512> buf{};
  while (std::fgets(buf.data(), int(buf.size()), p)) out += buf.data();
  const int rc = ::pclose(p);
  const auto at = out.find("tokens_per_s=");
  if (rc != 0 || at == std::string::npos) {
    std::fprintf(stderr, "bench_step: the PyTorch reference failed (%s); its output:\n%s", cmd.c_str(), out.c_str());
    return std::nullopt;
  }
  return std::strtod(out.c_str() + at + 13, nullptr);
}

bool python_has_torch(const std::string& python) {
  const std::string cmd = "'" + python + "' -c 'import torch' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

/// Peak (GFLOP/s) of each unit this CPU has, measured once; `threads` gets the team size.
std::map<peak_unit, double> measure_peaks(double fp32_override, int& threads) {
  std::map<peak_unit, double> peaks;
  for (const peak_unit u : {peak_unit::fp32_fma, peak_unit::bf16_dot, peak_unit::amx_bf16})
    if (loom::bench::peak_unit_available(u)) {
      const auto r = loom::bench::measure_peak(u);
      peaks[u] = r.gflops;
      threads = r.threads;
    }
  if (fp32_override > 0) peaks[peak_unit::fp32_fma] = fp32_override;
  return peaks;
}

/// The unit a precision's GEMMs run on: loom's dispatch, or oneDNN's (which prefers AMX).
peak_unit unit_for(const std::string& precision, bool torch, const std::map<peak_unit, double>& peaks) {
  if (precision != "bf16") return peak_unit::fp32_fma;
  // both run bf16 GEMMs on oneDNN's AMX tiles where the CPU has them (loom: linear_uses_onednn_matmul)
  if (peaks.count(peak_unit::amx_bf16)) return peak_unit::amx_bf16;
  if (peaks.count(peak_unit::bf16_dot) && (torch || loom::kernels::cpu::detail::cpu_has_avx512_bf16()))
    return peak_unit::bf16_dot;
  return peak_unit::fp32_fma;
}

}  // namespace

int main(int argc, char** argv) {
  loom::device::configure_host_malloc_for_gemm();
  int steps = 3, rounds = 3;
  double peak_gflops = 0;
  bool no_torch = false, gpt2 = false, llama = false;
  std::string python = "/usr/bin/python3", script = std::string(LOOM_BENCH_REFERENCE_DIR) + "/torch_step.py";
  CLI::App app{"bench_step: one training step on the CPU, loom beside PyTorch in the same run: tokens/s, MFU, memory"};
  app.add_option("--steps", steps, "timed steps per row and round (after one warm-up step)")
      ->check(CLI::Range(1, 1000000))->capture_default_str();
  app.add_option("--rounds", rounds, "rounds of loom-then-PyTorch per row; medians are shown")
      ->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--peak-gflops", peak_gflops, "fp32 peak for MFU (default: measured at start-up)");
  app.add_flag("--no-torch", no_torch, "skip the PyTorch reference");
  app.add_flag("--gpt2-small", gpt2, "also GPT-2 small (124M), micro-batch 4 x 256, fp32 and bf16 (minutes)");
  app.add_flag("--llama", llama,
               "also the Llama rows: llama_quickstart 16 x 128 beside quickstart_bpe, and with --gpt2-small "
               "llama_100m 4 x 256 beside GPT-2 small, fp32 and bf16");
  app.add_option("--python", python, "interpreter with torch for the reference")->capture_default_str();
  app.add_option("--torch-script", script, "the reference script")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  int threads = 1;
  const auto peaks = measure_peaks(peak_gflops, threads);
  const bool torch = !no_torch && python_has_torch(python);
  std::string peak_line;
  for (const auto& [u, g] : peaks) peak_line += fmt::format("{}{} {:.0f}", peak_line.empty() ? "" : ", ", loom::bench::unit_name(u), g);
  fmt::print("peaks (GFLOP/s, {} threads): {}; PyTorch reference: {}\n", threads, peak_line,
             torch ? python : no_torch ? "off (--no-torch)" : python + " has no torch (Debian: python3-torch)");

  using loom::models::bench_small, loom::models::gpt2_small, loom::models::quickstart;
  using loom::precision::bf16, loom::precision::fp32;
  // rows 1 and 2 are bench_small fp32 and bf16 (the closing ratio line reads them)
  std::vector<row_shape> shapes = {shape_of<quickstart, 16, 128, fp32>(), shape_of<bench_small, 8, 256, fp32>(),
                                   shape_of<bench_small, 8, 256, bf16>()};
  std::vector<loom_result (*)(int)> runs = {&run_loom<quickstart, 16, 128, fp32>, &run_loom<bench_small, 8, 256, fp32>,
                                            &run_loom<bench_small, 8, 256, bf16>};
  if (gpt2) {
    shapes.push_back(shape_of<gpt2_small, 4, 256, fp32>());
    shapes.push_back(shape_of<gpt2_small, 4, 256, bf16>());
    runs.push_back(&run_loom<gpt2_small, 4, 256, fp32>);
    runs.push_back(&run_loom<gpt2_small, 4, 256, bf16>);
  }
  if (llama) {
    using loom::models::llama_quickstart, loom::models::quickstart_bpe, loom::models::llama_100m;
    shapes.push_back(shape_of<quickstart_bpe, 16, 128, fp32>());
    shapes.push_back(shape_of<llama_quickstart, 16, 128, fp32>());
    shapes.push_back(shape_of<quickstart_bpe, 16, 128, bf16>());
    shapes.push_back(shape_of<llama_quickstart, 16, 128, bf16>());
    runs.push_back(&run_loom<quickstart_bpe, 16, 128, fp32>);
    runs.push_back(&run_loom<llama_quickstart, 16, 128, fp32>);
    runs.push_back(&run_loom<quickstart_bpe, 16, 128, bf16>);
    runs.push_back(&run_loom<llama_quickstart, 16, 128, bf16>);
    if (gpt2) {
      shapes.push_back(shape_of<llama_100m, 4, 256, fp32>());
      shapes.push_back(shape_of<llama_100m, 4, 256, bf16>());
      runs.push_back(&run_loom<llama_100m, 4, 256, fp32>);
      runs.push_back(&run_loom<llama_100m, 4, 256, bf16>);
    }
  }
  std::vector<std::vector<loom_result>> mine(shapes.size());
  std::vector<std::vector<double>> theirs(shapes.size()), ratio(shapes.size());
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      mine[i].push_back(runs[i](steps));
      if (!torch) continue;
      if (const auto t = run_torch(python, script, shapes[i], steps, threads)) {
        theirs[i].push_back(*t);
        ratio[i].push_back(mine[i].back().tokens_per_s / *t);
      }
    }
    std::fprintf(stderr, "bench_step: round %d of %d done\n", r + 1, rounds);
  }

  fmt::print("| config           | prec | B  x  T   | params (M) | loom tok/s | MFU loom          | PyTorch tok/s | MFU PyTorch       "
             "| loom/PyTorch | p+g MiB | opt MiB | act MiB |\n");
  fmt::print("|------------------|------|-----------|------------|------------|-------------------|---------------|-------------------"
             "|--------------|---------|---------|---------|\n");
  std::vector<double> loom_tok(shapes.size()), torch_tok(shapes.size());
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const auto& s = shapes[i];
    std::vector<double> tok;
    for (const auto& m : mine[i]) tok.push_back(m.tokens_per_s);
    loom_tok[i] = median(tok);
    torch_tok[i] = median(theirs[i]);
    auto mfu = [&](double tps, bool t) {
      const peak_unit u = unit_for(s.precision, t, peaks);
      return fmt::format("{:5.1f} % {:>9}", 100.0 * s.flops_per_token() * tps / (peaks.at(u) * 1e9), loom::bench::unit_name(u));
    };
    const auto& m = mine[i].back();
    fmt::print("| {:<16} | {:<4} | {:2} x {:4} | {:10.1f} | {:10.0f} | {} | {:>13} | {:>17} | {:>12} | {:7.1f} | {:7.1f} | {:7.1f} |\n",
               s.config, s.precision, s.batch, s.seq, s.params / 1e6, loom_tok[i], mfu(loom_tok[i], false),
               theirs[i].empty() ? "-" : fmt::format("{:.0f}", torch_tok[i]),
               theirs[i].empty() ? "-" : mfu(torch_tok[i], true),
               ratio[i].empty() ? "-" : fmt::format("{:.2f}", median(ratio[i])), m.param_mib, m.opt_mib, m.act_mib);
  }
  const auto mem = loom::read_process_memory();
  fmt::print("medians over {} rounds of {} steps; loom's peak RSS {:.1f} MiB (cumulative over the rows)\n", rounds, steps,
             double(mem.peak_rss) / 1048576.0);
  fmt::print("bench_small bf16/fp32 tokens/s: loom {:.2f}", loom_tok[2] / loom_tok[1]);
  if (!theirs[1].empty() && !theirs[2].empty()) fmt::print(", PyTorch {:.2f}", torch_tok[2] / torch_tok[1]);
  fmt::print("\n");
}
