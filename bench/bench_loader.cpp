// bench_loader — tokens/s the loader delivers for 0 (no threads), 1, 2, 4, 8 prefetch workers,
// with the training step replaced by a no-op and by a stand-in step that keeps every core busy
// for --step-ms (as an OpenMP training step does), and the fraction of step time spent
// inside next() — filling the batch (0 workers) or waiting for a worker — (the trainer's "data" share; the issue asks for < 2 % on the quickstart).
//
//   bench_loader [--data PREFIX] [--tokens N] [--batch B] [--seq T] [--step-ms MS] [--steps S]
//
// Without --data it writes a synthetic uint16 dataset of N tokens (default 64M = 128 MB, larger
// than the caches) to the temp directory once and memory-maps it like any prepared dataset.
// The stand-in step is honest about cores but not about memory traffic, so the last rows feed
// the real quickstart training step (loom::train::trainer, models::quickstart_bpe — the model
// the quickstart trains on a prepared dataset: vocabulary 8192, B=16, T=128, fp32 on the CPU —
// for 0, 1, 2, 4 and 8 workers; --real-steps 0 skips them) from the loader. A --data dataset
// must fit quickstart_bpe's vocabulary (prepare_data --vocab-size <= 8192).
//
//   bench_loader --data out/shakespeare      # after scripts/quickstart.sh (or prepare_data)
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <loom/data/loader.hpp>
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/train/trainer.hpp>

namespace {
using clock_type = std::chrono::steady_clock;

std::filesystem::path synthetic(std::uint64_t tokens) {
  const auto prefix = std::filesystem::temp_directory_path() / ("loom_bench_loader_v8000_" + std::to_string(tokens));
  if (std::filesystem::exists(loom::data::idx_path(prefix))) return prefix;
  loom::data::indexed_dataset_writer w(prefix, loom::data::dtype::uint16);
  std::mt19937_64 rng(1);
  std::vector<std::int32_t> doc;
  for (std::uint64_t done = 0; done < tokens;) {
    doc.resize(std::min<std::uint64_t>(tokens - done, 200 + rng() % 4000));
    for (auto& t : doc) t = std::int32_t(rng() % 8000);  // like prepare_data --vocab-size 8000
    w.add_document(doc);
    done += doc.size();
  }
  w.finalize();
  return prefix;
}

// Keeps `threads` cores busy for `ms` milliseconds (a stand-in for an OpenMP training step).
void busy_step(double ms, unsigned threads) {
  if (ms <= 0) return;
  const auto end = clock_type::now() + std::chrono::duration<double, std::milli>(ms);
  std::atomic<std::uint64_t> sink{0};
  auto spin = [&] {
    std::uint64_t x = 1;
    while (clock_type::now() < end)
      for (int k = 0; k < 1000; ++k) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    sink += x;
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(spin);
  spin();
  for (auto& t : pool) t.join();
}

const char* arg(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}
}  // namespace

int main(int argc, char** argv) {
  loom::device::configure_host_malloc_for_gemm();  // as train_gpt does (Eigen's packing buffers)
  const std::uint64_t tokens = std::strtoull(arg(argc, argv, "--tokens", "67108864"), nullptr, 10);
  const std::size_t B = std::strtoul(arg(argc, argv, "--batch", "16"), nullptr, 10);
  const std::size_t T = std::strtoul(arg(argc, argv, "--seq", "128"), nullptr, 10);
  const double step_ms = std::atof(arg(argc, argv, "--step-ms", "20"));
  const int steps = std::atoi(arg(argc, argv, "--steps", "0"));
  const std::string data = arg(argc, argv, "--data", "");
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());

  const auto prefix = data.empty() ? synthetic(tokens) : std::filesystem::path(data);
  loom::data::indexed_dataset probe(prefix);
  std::printf("dataset %s: %llu tokens (%s), B=%zu T=%zu, %u cores\n", prefix.c_str(),
              (unsigned long long)probe.token_count(), std::string(loom::data::dtype_name(probe.token_dtype())).c_str(),
              B, T, cores);
  std::printf("%-8s %-16s %8s %14s %12s %10s %12s\n", "workers", "step", "batches", "tokens/s", "ms/batch",
              "wait %", "wait ms/step");
  for (const double ms : {0.0, step_ms}) {
    for (const int workers : {0, 1, 2, 4, 8}) {
      loom::data::loader_options o;
      o.batch = B;
      o.seq_len = T;
      o.seed = 1;
      o.workers = workers;
      loom::data::loader<> l(prefix, o);
      const int n = steps > 0 ? steps : (ms > 0 ? int(std::max(20.0, 2000.0 / ms)) : 4000);
      std::uint64_t checksum = 0;
      for (int i = 0; i < 3; ++i) checksum += std::uint64_t(l.next()[0]);  // start the workers
      double waited = 0;  // seconds inside next(): filling (no workers) or waiting for a worker
      const auto t0 = clock_type::now();
      for (int i = 0; i < n; ++i) {
        const auto w0 = clock_type::now();
        const auto b = l.next();
        waited += std::chrono::duration<double>(clock_type::now() - w0).count();
        checksum += std::uint64_t(b[b.size() - 1]);
        busy_step(ms, cores);
      }
      const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
      std::printf("%-8d %-16s %8d %14.0f %12.3f %9.2f%% %12.3f%s\n", workers,
                  ms > 0 ? ("busy " + std::to_string(int(ms)) + " ms").c_str() : "no-op", n,
                  double(n) * double(B * T) / s, 1000.0 * s / n, 100.0 * waited / s, 1000.0 * waited / n,
                  checksum == 42 ? " " : "");
    }
  }
  // The real step: the quickstart's model on a prepared dataset (quickstart_bpe, vocab 8192),
  // B=16, T=128, fed by the loader.
  const int real_steps = std::atoi(arg(argc, argv, "--real-steps", "12"));
  if (real_steps > 0) {
    using namespace loom;
    constexpr int QB = 16, QT = 128;
    using P = policy<device::cpu, precision::fp32>;
    context<device::cpu> ctx;
    train::trainer_config cfg;
    cfg.schedule = {1e-3, 1e-4, 10, 1000};
    train::trainer<models::quickstart_bpe, P, QB, QT> tr(ctx, cfg);
    for (const int workers : {0, 1, 2, 4, 8}) {
      data::loader_options o;
      o.batch = QB;
      o.seq_len = QT;
      o.seed = 1;
      o.workers = workers;
      o.vocab = models::quickstart_bpe::vocab;  // a larger id is a clear error naming the file
      data::loader<> l(prefix, o);
      tr.step(ctx, l.next());  // warm-up
      double waited = 0, stepped = 0;
      const auto t0 = clock_type::now();
      for (int i = 0; i < real_steps; ++i) {
        const auto w0 = clock_type::now();
        const auto b = l.next();
        const auto w1 = clock_type::now();
        tr.step(ctx, b);
        waited += std::chrono::duration<double>(w1 - w0).count();
        stepped += std::chrono::duration<double>(clock_type::now() - w1).count();
      }
      const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
      std::printf("%-8d %-16s %8d %14.0f %12.3f %9.3f%% %12.3f\n", workers, "quickstart_bpe", real_steps,
                  double(real_steps) * QB * QT / s, 1000.0 * s / real_steps, 100.0 * waited / s,
                  1000.0 * waited / real_steps);
      (void)stepped;
    }
  }
  return 0;
}
