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
//
//   build/bench/bench_step --gemm-shapes [--steps N] [--rounds R] [--gpt2-small]
//
// --gemm-shapes prints, instead of the table above, the step's GEMMs shape by shape beside the
// same oneDNN matmul primitive run alone: bench_small 8 x 256 (and GPT-2 small 4 x 256 with
// --gpt2-small), fp32 and bf16. After two warm-up steps, each of R rounds runs N training steps
// with the context's onednn_matmul_cache timing on (calls and seconds per key: execute plus
// stream wait), then every key alone on the same cache: as many back-to-back calls as a step
// makes, on separate random buffers of the key's sizes (leading dimensions included), after one
// untimed call. Medians over the rounds; ratio = in-step / alone per call, and the total weights
// each shape by its time per step. Operands in the step come from other layers (colder caches);
// alone they are the same buffers call after call. Two more alone runs bracket the step's cache
// state: "L2-cold" evicts every thread's L2 before each call, "memory-cold" every cache level
// (twice the L3 rewritten; at most two calls per key and round, the eviction is slow); neither
// eviction is timed. In-step times between the two say the difference is where the operands
// are, not the calls loom makes.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <unistd.h>

#include <loom/bench/peak.hpp>
#include <loom/core/memory.hpp>
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/train/trainer.hpp>

#ifdef _OPENMP
#include <omp.h>
#endif

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
  constexpr bool llama = loom::models::arch_of<M>().mlp == loom::models::mlp_kind::swiglu;
  return {std::string(M::name), std::string(Prec::name), M::vocab, T, M::d_model, M::n_layer, M::n_head, B,
          llama ? "llama" : "gpt2", loom::models::kv_heads_of<M>(), loom::models::mlp_hidden_of<M>(),
          double(loom::models::parameter_count<M>(false))};
}

/// The trainer every loom row runs: config M, micro-batch B x T, precision Prec, fused attention,
/// AdamW (lr 1e-3 -> 1e-4, 10 warm-up steps), a loss scaler where Prec needs one, and one step's
/// windows of random tokens (the same every step). step() runs one training step and returns
/// its wall time in ms.
template <class M, int B, int T, class Prec>
struct bench_trainer {
  using scaler =
      std::conditional_t<Prec::needs_loss_scaling, loom::precision::dynamic_loss_scaler, loom::precision::no_loss_scaler>;
  static loom::train::trainer_config config() {
    loom::train::trainer_config cfg;
    cfg.schedule = {1e-3, 1e-4, 10, 1000};
    return cfg;
  }
  loom::context<loom::device::cpu> ctx;
  loom::train::trainer<M, loom::policy<loom::device::cpu, Prec>, B, T, loom::parallel::local_group, loom::kernels::fused, scaler> tr{ctx, config()};
  std::vector<std::int32_t> w = [this] {
    std::vector<std::int32_t> v(tr.windows_per_step() * tr.window());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::int32_t(loom::random_below(M::vocab, 1, 0, i));
    return v;
  }();
  double step() {
    const auto t0 = std::chrono::steady_clock::now();
    tr.step(ctx, w);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
};

/// Trains `steps` steps after one warm-up step on random tokens; median step time.
template <class M, int B, int T, class Prec>
loom_result run_loom(int steps) {
  bench_trainer<M, B, T, Prec> b;
  auto& tr = b.tr;
  b.step();  // warm-up: first touch of every buffer, thread pool start
  std::vector<double> ms;
  for (int s = 0; s < steps; ++s) ms.push_back(b.step());
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

namespace gemm_shapes {

using loom::kernels::cpu::detail::onednn_dtype;
using loom::kernels::cpu::detail::onednn_matmul_cache;
using loom::kernels::cpu::detail::onednn_matmul_key;

/// OpenMP threads oneDNN runs on.
int threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

std::size_t bytes_of(onednn_dtype t) { return t == onednn_dtype::f32 ? 4 : 2; }
const char* name_of(onednn_dtype t) { return t == onednn_dtype::f32 ? "f32" : t == onednn_dtype::bf16 ? "bf16" : "f16"; }

/// Random operands for every key of a run: one 64-byte aligned buffer per role (A, B, C) and
/// element type, sized to the largest key that uses it; values uniform in [-1, 1).
class operand_pool {
 public:
  void reserve(const onednn_matmul_key& k) {
    need(k.ab, 'a', std::size_t(k.trans_a ? k.K : k.M) * std::size_t(k.lda));
    need(k.ab, 'b', std::size_t(k.trans_b ? k.N : k.K) * std::size_t(k.ldb));
    need(k.c, 'c', std::size_t(k.M) * std::size_t(k.ldc));
    if (k.bias) need(k.ab, 'x', std::size_t(k.N));
  }
  /// Allocates and fills every buffer reserved so far (call once, after every reserve).
  void fill() {
    std::uint64_t seed = 1;
    for (auto& [id, buf] : bufs_) {
      buf.data.reset(static_cast<std::byte*>(::operator new[](buf.count * bytes_of(id.first), std::align_val_t(64))));
      for (std::size_t i = 0; i < buf.count; ++i) {
        const float v = float(2 * loom::random_uniform(seed, 0, i) - 1);
        if (id.first == onednn_dtype::f32) reinterpret_cast<float*>(buf.data.get())[i] = v;
        else if (id.first == onednn_dtype::bf16) reinterpret_cast<Eigen::bfloat16*>(buf.data.get())[i] = Eigen::bfloat16(v);
        else reinterpret_cast<Eigen::half*>(buf.data.get())[i] = Eigen::half(v);
      }
      ++seed;
    }
  }
  /// C = alpha (op(A) op(B) + bias) + beta C through `cache`'s primitive of key `k` (a bias
  /// only when the key has one).
  void run(onednn_matmul_cache& cache, const onednn_matmul_key& k) {
    float alpha, beta;
    std::memcpy(&alpha, &k.alpha_bits, 4);
    std::memcpy(&beta, &k.beta_bits, 4);
    auto go = [&]<class T, class OutT>(T*, OutT*) {
      cache.run<T, OutT>(k.trans_a, k.trans_b, k.M, k.N, k.K, alpha, at<T>(k.ab, 'a'), k.lda, at<T>(k.ab, 'b'), k.ldb,
                         beta, at<OutT>(k.c, 'c'), k.ldc, k.bias ? at<T>(k.ab, 'x') : nullptr);
    };
    const bool c32 = k.c == onednn_dtype::f32;
    if (k.ab == onednn_dtype::f32) go((float*)nullptr, (float*)nullptr);
    else if (k.ab == onednn_dtype::bf16) c32 ? go((Eigen::bfloat16*)nullptr, (float*)nullptr)
                                             : go((Eigen::bfloat16*)nullptr, (Eigen::bfloat16*)nullptr);
    else c32 ? go((Eigen::half*)nullptr, (float*)nullptr) : go((Eigen::half*)nullptr, (Eigen::half*)nullptr);
  }

 private:
  struct aligned_free {
    void operator()(std::byte* p) const noexcept { ::operator delete[](p, std::align_val_t(64)); }
  };
  struct buffer {
    std::size_t count = 0;
    std::unique_ptr<std::byte[], aligned_free> data;
  };
  void need(onednn_dtype t, char role, std::size_t n) {
    auto& b = bufs_[{t, role}];
    b.count = std::max(b.count, n);
  }
  template <class T>
  T* at(onednn_dtype t, char role) { return reinterpret_cast<T*>(bufs_.at({t, role}).data.get()); }
  std::map<std::pair<onednn_dtype, char>, buffer> bufs_;
};

/// One key's measurements over the rounds (microseconds per call).
struct shape_row {
  double calls_per_step = 0;
  std::string impl;
  std::vector<double> in_step_us, alone_us, l2_cold_us, memory_cold_us;
};

/// Caches to empty before an untimed call: each OpenMP thread reads and rewrites its own block of
/// `floats` floats, first touched by that thread.
struct cache_evictor {
  std::size_t floats = 0;
  std::vector<std::vector<float>> junk = std::vector<std::vector<float>>(std::size_t(threads()));
  void operator()() {
#pragma omp parallel
    {
#ifdef _OPENMP
      auto& v = junk[std::size_t(omp_get_thread_num())];
#else
      auto& v = junk[0];
#endif
      if (v.empty()) v.assign(floats, 1.0f);
      for (float& x : v) x = x * 0.5f + 0.5f;
    }
  }
};

/// Evicts every thread's L2 (and L1): 16 MiB per thread, eight times this machine kind's 2 MiB
/// L2, so the next product's operands come from L3 or memory. L3 is left as it is.
cache_evictor l2_evictor() { return {std::size_t(4) << 20}; }

/// Evicts every cache level: the threads together rewrite twice the L3 (sysconf; 256 MiB in all
/// when it does not say), so the next product's operands come from memory.
cache_evictor memory_evictor() {
  long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l3 <= 0) l3 = 128L << 20;
  return {std::size_t(2 * l3) / sizeof(float) / std::size_t(threads())};
}

/// Microseconds per call of `n` back-to-back calls of `key` alone, `evict` (if not null; untimed:
/// it runs no GEMM) run before each.
double timed_after(onednn_matmul_cache& cache, operand_pool& pool, const onednn_matmul_key& key, int n,
                   cache_evictor* evict) {
  cache.reset_timings();
  for (int i = 0; i < n; ++i) {
    if (evict) (*evict)();
    pool.run(cache, key);
  }
  const auto t = cache.timings();
  return t.at(0).seconds / double(t.at(0).calls) * 1e6;
}

/// Trains bench config M (micro-batch B x T, precision Prec) with GEMM timing on and prints its
/// table: per key, calls per step, in-step and alone microseconds per call (medians over
/// `rounds`), GFLOP/s of each and their ratio; then the time-weighted total.
template <class M, int B, int T, class Prec>
void run_table(int steps, int rounds) {
  bench_trainer<M, B, T, Prec> b;
  for (int s = 0; s < 2; ++s) b.step();  // warm-up, timing off: primitives made, buffers touched
  fmt::print("\n{} {}, micro-batch {} x {}: ", M::name, Prec::name, B, T);
  onednn_matmul_cache* cache = b.ctx.gemm_cache.get();
  if (!cache) {
    fmt::print("its linear layers do not use oneDNN's matmul primitive here (linear_uses_onednn_matmul)\n");
    return;
  }
  if (!cache->timings().empty()) fmt::print("(unexpected: timings recorded while timing was off) ");

  std::map<onednn_matmul_key, shape_row> rows;
  operand_pool pool;
  cache_evictor evict_l2 = l2_evictor(), evict_all = memory_evictor();
  std::vector<double> step_ms;
  for (int r = 0; r < rounds; ++r) {
    cache->reset_timings();
    cache->set_timing(true);
    for (int s = 0; s < steps; ++s) step_ms.push_back(b.step());
    cache->set_timing(false);
    for (const auto& t : cache->timings()) {
      auto& row = rows[t.key];
      row.calls_per_step = double(t.calls) / steps;
      row.impl = t.impl;
      row.in_step_us.push_back(t.seconds / double(t.calls) * 1e6);
    }
    if (r == 0) {
      for (const auto& [key, row] : rows) pool.reserve(key);
      pool.fill();
    }
    cache->set_timing(true);
    for (const auto& [key, row] : rows) {
      pool.run(*cache, key);  // not counted: the key's operands into the caches, as for a benchmark
      const int n = std::max(1, int(row.calls_per_step + 0.5));
      rows[key].alone_us.push_back(timed_after(*cache, pool, key, n, nullptr));
      rows[key].l2_cold_us.push_back(timed_after(*cache, pool, key, n, &evict_l2));
      rows[key].memory_cold_us.push_back(timed_after(*cache, pool, key, std::min(n, 2), &evict_all));
    }
    cache->set_timing(false);
  }

  const double step = median(step_ms);
  fmt::print("{} rounds of {} steps, step {:.1f} ms (median), {} threads\n", rounds, steps, step, threads());
  fmt::print("| op | M x N x K | A,B -> C | beta | calls/step | in-step us | alone us | L2-cold us | memory-cold us "
             "| in-step GFLOP/s | alone GFLOP/s | in-step/alone | in-step/L2-cold | in-step/memory-cold | oneDNN impl |\n");
  fmt::print("|----|-----------|----------|------|-----------:|-----------:|---------:|-----------:|---------------:"
             "|----------------:|--------------:|--------------:|----------------:|--------------------:|-------------|\n");
  double in_total = 0, alone_total = 0, l2_total = 0, mem_total = 0, calls = 0;
  for (const auto& [k, row] : rows) {
    const double in = median(row.in_step_us), alone = median(row.alone_us), l2 = median(row.l2_cold_us),
                 mem = median(row.memory_cold_us);
    const double gflop = 2.0 * k.M * k.N * k.K * 1e-9;
    float beta;
    std::memcpy(&beta, &k.beta_bits, 4);
    fmt::print("| {}{} | {} x {} x {} | {} -> {} | {:g}{} | {:.0f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.0f} | {:.0f} "
               "| {:.2f} | {:.2f} | {:.2f} | {} |\n",
               k.trans_a ? 'T' : 'N', k.trans_b ? 'T' : 'N', k.M, k.N, k.K, name_of(k.ab), name_of(k.c), beta, k.bias ? ", +bias" : "",
               row.calls_per_step, in, alone, l2, mem, gflop / (in * 1e-6), gflop / (alone * 1e-6), in / alone,
               in / l2, in / mem, row.impl);
    in_total += row.calls_per_step * in;
    alone_total += row.calls_per_step * alone;
    l2_total += row.calls_per_step * l2;
    mem_total += row.calls_per_step * mem;
    calls += row.calls_per_step;
  }
  fmt::print("| total | {} shapes | | | {:.0f} | {:.1f} ms/step | {:.1f} ms/step | {:.1f} ms/step | {:.1f} ms/step | | "
             "| {:.2f} | {:.2f} | {:.2f} | |\n",
             rows.size(), calls, in_total * 1e-3, alone_total * 1e-3, l2_total * 1e-3, mem_total * 1e-3,
             in_total / alone_total, in_total / l2_total, in_total / mem_total);
  fmt::print("GEMMs through the cache: {:.0f} % of the step. NT: forward y = x W^T (+bias: the primitive adds b); NN: backward "
             "dx = dy W (beta 1: +=); TN: backward dW += dy^T x (W stored (OC,C)).\n",
             100.0 * in_total * 1e-3 / step);
}

}  // namespace gemm_shapes

}  // namespace

int main(int argc, char** argv) {
  loom::device::configure_host_malloc_for_gemm();
  int steps = 3, rounds = 3;
  double peak_gflops = 0;
  bool no_torch = false, gpt2 = false, llama = false, gemm_mode = false;
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
  app.add_flag("--gemm-shapes", gemm_mode,
               "instead: each GEMM shape of the step (bench_small; GPT-2 small with --gpt2-small) beside the same "
               "oneDNN matmul primitive run alone; --steps steps per round, --rounds rounds");
  app.add_option("--python", python, "interpreter with torch for the reference")->capture_default_str();
  app.add_option("--torch-script", script, "the reference script")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  using loom::models::bench_small, loom::models::gpt2_small, loom::models::quickstart;
  using loom::precision::bf16, loom::precision::fp32;
  if (gemm_mode) {
    fmt::print("bench_step --gemm-shapes: in-step = the training step's calls, alone = the same primitive on its own "
               "buffers; microseconds per call, medians over rounds\n");
    gemm_shapes::run_table<bench_small, 8, 256, fp32>(steps, rounds);
    gemm_shapes::run_table<bench_small, 8, 256, bf16>(steps, rounds);
    if (gpt2) {
      gemm_shapes::run_table<gpt2_small, 4, 256, fp32>(steps, rounds);
      gemm_shapes::run_table<gpt2_small, 4, 256, bf16>(steps, rounds);
    }
    return 0;
  }

  int threads = 1;
  const auto peaks = measure_peaks(peak_gflops, threads);
  const bool torch = !no_torch && python_has_torch(python);
  std::string peak_line;
  for (const auto& [u, g] : peaks) peak_line += fmt::format("{}{} {:.0f}", peak_line.empty() ? "" : ", ", loom::bench::unit_name(u), g);
  fmt::print("peaks (GFLOP/s, {} threads): {}; PyTorch reference: {}\n", threads, peak_line,
             torch ? python : no_torch ? "off (--no-torch)" : python + " has no torch (Debian: python3-torch)");

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
    auto mfu = [&](double tps) {  // PyTorch's oneDNN runs bf16 on the same unit as loom
      const peak_unit u = loom::bench::step_peak_unit(s.precision);
      return fmt::format("{:5.1f} % {:>9}", 100.0 * s.flops_per_token() * tps / (peaks.at(u) * 1e9), loom::bench::unit_name(u));
    };
    const auto& m = mine[i].back();
    fmt::print("| {:<16} | {:<4} | {:2} x {:4} | {:10.1f} | {:10.0f} | {} | {:>13} | {:>17} | {:>12} | {:7.1f} | {:7.1f} | {:7.1f} |\n",
               s.config, s.precision, s.batch, s.seq, s.params / 1e6, loom_tok[i], mfu(loom_tok[i]),
               theirs[i].empty() ? "-" : fmt::format("{:.0f}", torch_tok[i]),
               theirs[i].empty() ? "-" : mfu(torch_tok[i]),
               ratio[i].empty() ? "-" : fmt::format("{:.2f}", median(ratio[i])), m.param_mib, m.opt_mib, m.act_mib);
  }
  const auto mem = loom::read_process_memory();
  fmt::print("medians over {} rounds of {} steps; loom's peak RSS {:.1f} MiB (cumulative over the rows)\n", rounds, steps,
             double(mem.peak_rss) / 1048576.0);
  fmt::print("bench_small bf16/fp32 tokens/s: loom {:.2f}", loom_tok[2] / loom_tok[1]);
  if (!theirs[1].empty() && !theirs[2].empty()) fmt::print(", PyTorch {:.2f}", torch_tok[2] / torch_tok[1]);
  fmt::print("\n");
}
