// Tests of the multi-rank checkpoint paths of loom/io/checkpoint.hpp, with comm::threads:
// the collective save (every rank writes and verifies, the ranks agree, then one rank moves
// `latest`; a failing rank stops everyone), data parallelism with ZeRO-1 (each rank's moment
// shard, bitwise resume, loading into another data-parallel size or ZeRO setting), tensor and
// pipeline parallel files (train::trainer, also with ZeRO-1 on its dp group) and
// resharding across (TP, PP, DP) layouts, for GPT-2 and for a second recipe defined only as data
// (models::tiny_untied: no linear biases, an untied LM head).
#include <doctest/doctest.h>

#include <stdlib.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include <loom/core/random.hpp>
#include <loom/device/cpu.hpp>
#include <loom/io/checkpoint.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/parallel/comm_threads.hpp>
#include <loom/nn/transformer.hpp>
#include <loom/train/trainer.hpp>
#include <loom/train/trainer.hpp>

#include "../../support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace loom;

namespace {

using M = models::tiny;
using P = policy<device::cpu, precision::fp32>;
using trainer_t = train::trainer<M, P, 4, 16>;

using loom_test::temp_dir;

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// OpenMP threads of the calling thread set to 1 for the guard's lifetime, then restored (a
/// test must not leave its setting to the next test case of the same process).
class one_thread_per_rank {
 public:
#ifdef _OPENMP
  one_thread_per_rank() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }  // ranks are threads already; also makes the runs bitwise comparable
  ~one_thread_per_rank() { omp_set_num_threads(saved_); }
#else
  one_thread_per_rank() = default;
#endif
  one_thread_per_rank(const one_thread_per_rank&) = delete;
  one_thread_per_rank& operator=(const one_thread_per_rank&) = delete;

 private:
  [[maybe_unused]] int saved_ = 0;
};

train::trainer_config config(int micro_batch, std::uint64_t seed = 1337) {
  train::trainer_config cfg;
  cfg.micro_batch = micro_batch;
  cfg.seq_len = 13;
  cfg.grad_accum = 1;
  cfg.schedule = {3e-3, 3e-4, 1, 6};
  cfg.seed = seed;
  return cfg;
}

constexpr int global_windows = 6;  // per step: 6 windows = 3 per rank at dp 2, 2 at dp 3

/// Rows [first, first + count) of step s's global batch: windows of 14 tokens from a learnable
/// stream (next = 3 t + 1 mod vocab, every 5th token random), started at random offsets.
std::vector<std::int32_t> windows(long s, int first, int count) {
  std::vector<std::int32_t> out;
  for (int w = first; w < first + count; ++w) {
    std::int32_t t = std::int32_t(random_below(M::vocab, 21, std::uint64_t(s), std::uint64_t(w)));
    for (int i = 0; i < 14; ++i) {
      out.push_back(t);
      t = i % 5 == 4 ? std::int32_t(random_below(M::vocab, 22, std::uint64_t(s * 100 + w), std::uint64_t(i)))
                     : (3 * t + 1) % M::vocab;
    }
  }
  return out;
}

/// Step s on a rank of a dp-sized group (its share of the global batch).
double step(context<device::cpu>& ctx, trainer_t& tr, long s, int rank, int dp) {
  const int mine = global_windows / dp;
  return tr.step(ctx, windows(s, rank * mine, mine)).loss;
}

/// The whole AdamW moments of a trainer (its own, or its ZeRO-1 shard written into the right
/// places of `m`, `v`, which all ranks of a group share: their ranges are disjoint).
void collect_moments(const trainer_t& tr, std::vector<float>& m, std::vector<float>& v) {
  m.resize(trainer_t::model_t::num_parameters);
  v.resize(m.size());
  if (const auto* z = tr.zero1_optimizer()) {
    const auto sm = z->first_moment(), sv = z->second_moment();
    for (const auto& q : z->ranges()) {
      std::memcpy(m.data() + q.param_offset, sm.data() + q.shard_offset, q.length * sizeof(float));
      std::memcpy(v.data() + q.param_offset, sv.data() + q.shard_offset, q.length * sizeof(float));
    }
  } else {
    std::memcpy(m.data(), tr.optimizer().first_moment().data(), m.size() * sizeof(float));
    std::memcpy(v.data(), tr.optimizer().second_moment().data(), v.size() * sizeof(float));
  }
}

std::vector<float> params_of(const trainer_t& tr) {
  const auto p = tr.model().parameters();
  return {p.data(), p.data() + p.size()};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

io::run_state state_at(long s) {
  io::run_state st;
  st.tokens = std::uint64_t(s) * global_windows * 13;
  st.data = {{"kind", "test"}, {"step", s}};
  return st;
}

/// Trains `dp` ranks (ZeRO-1 or not) for steps [from, to), optionally loading `load` first and
/// saving (collectively) after step `save_at`. Returns rank 0's losses; params/moments of the end.
struct run_result {
  std::vector<double> losses;
  std::vector<float> params, m, v;
};
run_result run(int dp, bool zero1, long from, long to, const fs::path& load = {}, const fs::path& save_root = {},
               long save_at = -1) {
  run_result out;
  if (zero1) {
    out.m.assign(trainer_t::model_t::num_parameters, 0.0f);
    out.v.assign(out.m.size(), 0.0f);
  }
  std::mutex mu;
  comm::run_threads(dp, [&](comm::threads& world) {
    const one_thread_per_rank one_thread;
    context<device::cpu> ctx;
    parallel::ddp_options o;
    o.zero1 = zero1;
    trainer_t tr(ctx, config(global_windows / dp, load.empty() ? 1337 : 99), world, o);
    if (!load.empty()) {
      const auto info = io::load_checkpoint(ctx, load, tr);
      CHECK(info.step == from);
      const bool same = info.manifest["layout"]["dp"] == dp;
      const bool warned = !info.warnings.empty() && info.warnings.back().find("data-parallel size") != std::string::npos;
      CHECK(warned == !same);
    }
    for (long s = from; s < to; ++s) {
      const double l = step(ctx, tr, s, world.rank(), dp);
      if (world.rank() == 0) out.losses.push_back(l);
      if (s + 1 == save_at) io::save_checkpoint(ctx, save_root, tr, state_at(s + 1), world);
    }
    std::lock_guard lock(mu);
    if (world.rank() == 0) out.params = params_of(tr);
    if (zero1) {
      std::vector<float> m, v;
      collect_moments(tr, m, v);
      for (const auto& q : tr.zero1_optimizer()->ranges())
        for (std::size_t i = 0; i < q.length; ++i) {
          out.m[q.param_offset + i] = m[q.param_offset + i];
          out.v[q.param_offset + i] = v[q.param_offset + i];
        }
    } else if (world.rank() == 0) {
      collect_moments(tr, out.m, out.v);
    }
  });
  return out;
}

}  // namespace

TEST_CASE("checkpoint (dp 2, ZeRO-1): save after 2 steps, new trainers load it, 2 steps == 4 uninterrupted, bit for bit") {
  temp_dir dir;
  const fs::path root = dir.path / "ckpt";
  const auto whole = run(2, true, 0, 4);
  const auto first = run(2, true, 0, 2, {}, root, 2);
  const fs::path ck = root / io::checkpoint_dir_name(2);
  // the files: the model file of rank 0 (no moments) and one moment shard per rank
  const auto man = io::verify_checkpoint(ck);
  CHECK(man["layout"]["dp"] == 2);
  CHECK(man["layout"]["zero"] == 1);
  REQUIRE(man["files"].size() == 3);
  CHECK(man["files"][0]["path"] == "model-tp00-pp00.safetensors");
  CHECK(man["files"][1]["path"] == "optim-tp00-pp00-dp00.safetensors");
  CHECK(man["files"][2]["path"] == "optim-tp00-pp00-dp01.safetensors");
  CHECK(man["files"][2]["dp"] == 1);
  const io::safetensors_reader model_file(ck / "model-tp00-pp00.safetensors");
  CHECK(model_file.has("param.wte"));
  CHECK_FALSE(model_file.has("adam_m.wte"));
  const io::safetensors_reader shard1(ck / "optim-tp00-pp00-dp01.safetensors");
  CHECK(shard1.info("adam_m").numel() * 2 >= trainer_t::model_t::num_parameters - 64);  // about half
  CHECK(shard1.info("ranges").shape[1] == 3);
  CHECK(read_text(root / "latest") == "step_00000002\n");

  const auto second = run(2, true, 2, 4, ck);
  REQUIRE(whole.losses.size() == 4);
  REQUIRE(second.losses.size() == 2);
  for (int i = 0; i < 2; ++i) {
    CHECK(std::memcmp(&whole.losses[std::size_t(i)], &first.losses[std::size_t(i)], sizeof(double)) == 0);
    CHECK(std::memcmp(&whole.losses[std::size_t(i + 2)], &second.losses[std::size_t(i)], sizeof(double)) == 0);
  }
  CHECK(same_bits(whole.params, second.params));
  CHECK(same_bits(whole.m, second.m));
  CHECK(same_bits(whole.v, second.v));
  CHECK(whole.losses[3] < whole.losses[0]);  // it trains
}

TEST_CASE("checkpoint (ZeRO-1): the moments reshard across dp sizes and ZeRO settings, bit for bit") {
  temp_dir dir;
  const fs::path a = dir.path / "a", b = dir.path / "b";
  const auto src = run(2, true, 0, 2, {}, a, 2);  // dp 2, ZeRO-1
  const fs::path ck = a / io::checkpoint_dir_name(2);
  SUBCASE("into dp 3 with ZeRO-1 (other ranges), then saved and loaded into plain dp 2") {
    const auto three = run(3, true, 2, 2, ck, b, -1);
    CHECK(same_bits(three.params, src.params));
    CHECK(same_bits(three.m, src.m));
    CHECK(same_bits(three.v, src.v));
  }
  SUBCASE("into one rank without ZeRO; its save loads back into dp 2 with ZeRO-1") {
    context<device::cpu> ctx;
    trainer_t one(ctx, config(3, 7));  // only loaded: the batch shape does not matter
    (void)io::load_checkpoint(ctx, ck, one);
    std::vector<float> m, v;
    collect_moments(one, m, v);
    CHECK(same_bits(params_of(one), src.params));
    CHECK(same_bits(m, src.m));
    CHECK(same_bits(v, src.v));
    io::save_checkpoint(ctx, b, one, state_at(2));
    CHECK(io::verify_checkpoint(b / io::checkpoint_dir_name(2))["layout"]["zero"] == 0);
    const auto back = run(2, true, 2, 2, b / io::checkpoint_dir_name(2));
    CHECK(same_bits(back.m, src.m));
    CHECK(same_bits(back.v, src.v));
  }
  SUBCASE("into plain dp 2: training continues as ZeRO-1 would (ZeRO-1 and DDP are bitwise equal on comm::threads)") {
    const auto zero = run(2, true, 2, 4, ck);
    const auto plain = run(2, false, 2, 4, ck);
    REQUIRE(plain.losses.size() == 2);
    CHECK(std::memcmp(plain.losses.data(), zero.losses.data(), 2 * sizeof(double)) == 0);
    CHECK(same_bits(plain.params, zero.params));
  }
}

TEST_CASE("checkpoint (multi-rank): a rank whose write fails stops the save on every rank; latest stays") {
  temp_dir dir;
  const fs::path root = dir.path / "ckpt";
  std::vector<std::string> errors(2);
  std::string expect = "injected write failure of rank 1";
  // The SUBCASE is chosen here, on doctest's thread: doctest's subcase bookkeeping is not
  // thread-safe, and entering it from both rank threads crashed 3 runs in 6.
  bool real_io_error = false;
  SUBCASE("rank 1 fails after writing its shard") {}
  SUBCASE("rank 1 cannot create its file (a directory is in the way: a real I/O error)") {
    real_io_error = true;
    expect = "Is a directory";
  }
  comm::run_threads(2, [&](comm::threads& world) {
    const one_thread_per_rank one_thread;
    context<device::cpu> ctx;
    parallel::ddp_options o;
    o.zero1 = true;
    trainer_t tr(ctx, config(3), world, o);
    step(ctx, tr, 0, world.rank(), 2);
    io::save_checkpoint(ctx, root, tr, state_at(1), world);
    step(ctx, tr, 1, world.rank(), 2);
    io::checkpoint_options opt;
    const int r = world.rank();
    if (!real_io_error)
      opt.on_stage = [r](std::string_view s) {
        if (r == 1 && s == "file_written") throw error("injected write failure of rank 1");
      };
    else
      opt.on_stage = [r, &root](std::string_view s) {
        if (r != 0 || s != "prepared") return;
        for (const auto& e : fs::directory_iterator(root))
          if (e.path().filename().string().rfind(".tmp-", 0) == 0)
            fs::create_directory(e.path() / ("optim-tp00-pp00-dp01.safetensors.tmp." + std::to_string(::getpid())));
      };
    try {
      io::save_checkpoint(ctx, root, tr, state_at(2), world, opt);
    } catch (const error& e) {
      errors[std::size_t(r)] = e.what();
    }
  });
  for (const auto& e : errors) {
    CAPTURE(e);
    CHECK(e.find("rank 1: ") != std::string::npos);
    CHECK(e.find(expect) != std::string::npos);
    CHECK(e.find("latest") != std::string::npos);
  }
  CHECK(read_text(root / "latest") == "step_00000001\n");
  CHECK_FALSE(fs::exists(root / io::checkpoint_dir_name(2)));
  for (const auto& e : fs::directory_iterator(root)) CHECK(e.path().filename().string().rfind(".tmp-", 0) != 0);
  CHECK(io::find_checkpoint(root) == root / io::checkpoint_dir_name(1));
}

TEST_CASE("checkpoint (multi-rank, asynchronous): background saves equal blocking ones; a failed write fails every rank's commit") {
  temp_dir dir;
  const fs::path sync_root = dir.path / "sync", async_root = dir.path / "async";
  std::vector<std::string> errors(2);
  std::vector<int> committed_late(2, 0);
  comm::run_threads(2, [&](comm::threads& world) {
    const one_thread_per_rank one_thread;
    context<device::cpu> ctx;
    parallel::ddp_options o;
    o.zero1 = true;
    trainer_t tr(ctx, config(3), world, o);
    io::async_checkpointer<trainer_t> saver;
    for (long s = 0; s < 3; ++s) {
      step(ctx, tr, s, world.rank(), 2);
      io::save_checkpoint(ctx, sync_root, tr, state_at(s + 1), world);
      saver.save(ctx, async_root, tr, state_at(s + 1), world);  // commits the previous save first
      // step s + 1 is being written in the background; `latest` names the one before it
      if (s > 0 && read_text(async_root / "latest") == "step_0000000" + std::to_string(s) + "\n") ++committed_late[std::size_t(world.rank())];
    }
    CHECK(saver.pending());
    CHECK(saver.wait(world) == async_root / io::checkpoint_dir_name(3));
    step(ctx, tr, 3, world.rank(), 2);
    io::checkpoint_options opt;
    const int r = world.rank();
    opt.on_stage = [r](std::string_view st) {
      if (r == 1 && st == "file_written") throw error("injected write failure of rank 1");
    };
    saver.save(ctx, async_root, tr, state_at(4), world, opt);  // the failure happens in the background
    try {
      (void)saver.wait(world);
    } catch (const error& e) {
      errors[std::size_t(r)] = e.what();
    }
  });
  for (long s = 1; s <= 3; ++s) {  // the same files, byte for byte (the manifest lists each file's XXH3-64)
    CAPTURE(s);
    CHECK(io::verify_checkpoint(async_root / io::checkpoint_dir_name(s))["files"] ==
          io::verify_checkpoint(sync_root / io::checkpoint_dir_name(s))["files"]);
  }
  CHECK(committed_late == std::vector<int>{2, 2});
  for (const auto& e : errors) {
    CAPTURE(e);
    CHECK(e.find("rank 1: injected write failure of rank 1") != std::string::npos);
  }
  CHECK(read_text(async_root / "latest") == "step_00000003\n");
  CHECK_FALSE(fs::exists(async_root / io::checkpoint_dir_name(4)));
  for (const auto& e : fs::directory_iterator(async_root)) CHECK(e.path().filename().string().rfind(".tmp-", 0) != 0);
}

// ============================================================================================
// Tensor and pipeline parallel files; resharding across (TP, PP, DP) layouts
// ============================================================================================

namespace {

using MP = models::tiny_parallel;  // 4 layers, 4 heads: splits over tp 2 and pp 2
using MU = models::tiny_untied;  // MP's sizes, no linear biases, an untied LM head (models::gpt2_untied_nobias)
template <int TP, int PP, class Model = MP>
using layout_trainer = train::trainer<Model, policy<device::cpu, precision::fp32, layout<TP, PP>>, 2, 8, comm::threads>;
template <class Model = MP>
using plain_trainer = train::trainer<Model, P, 2, 8>;

/// Rows of step s's global batch of 4 windows of 9 tokens (next = 7 t + 3 mod vocab, every 4th
/// random); s = -1 is the evaluation batch.
std::vector<std::int32_t> mp_windows(long s, int first, int count) {
  std::vector<std::int32_t> out;
  for (int w = first; w < first + count; ++w)
    for (int i = 0; i < 9; ++i) {
      const auto noise = random_below(4, 31, std::uint64_t(s + 1), std::uint64_t(w * 9 + i));
      out.push_back(i == 0 || noise == 0 ? std::int32_t(random_below(MP::vocab, 32, std::uint64_t(s + 1), std::uint64_t(w * 9 + i)))
                                         : (7 * out.back() + 3) % MP::vocab);
    }
  return out;
}

train::trainer_config mp_config(int micro, int accum, std::uint64_t seed) {
  train::trainer_config cfg;
  cfg.micro_batch = micro;
  cfg.seq_len = 8;
  cfg.grad_accum = accum;
  cfg.schedule = {3e-3, 3e-4, 1, 6};
  cfg.seed = seed;
  return cfg;
}

/// A layout<TP,PP> run over TP*PP*dp ranks (4 windows per step: 2 micro-batches of 2 windows at
/// dp 1, one per replica at dp 2; ZeRO-1 on the dp group if zero1): optionally loads `load`,
/// evaluates, optionally saves (collectively, after loading / step `from`), then trains steps
/// [from, to). Returns the evaluation loss and the training losses.
template <int TP, int PP, class Model = MP>
std::pair<double, std::vector<double>> layout_run(long from, long to, const fs::path& load, const fs::path& save_root,
                                                  std::vector<std::string>* warnings = nullptr, int dp = 1,
                                                  bool zero1 = false) {
  double eval = 0;
  std::vector<double> losses;
  comm::run_threads(TP * PP * dp, [&](comm::threads& world) {
    const one_thread_per_rank one_thread;
    context<device::cpu> ctx;
    layout_trainer<TP, PP, Model> tr(ctx, mp_config(2, 2 / dp, load.empty() ? 5 : 77), world,
                              parallel::ddp_options{.bucket_mb = 0.004, .zero1 = zero1});
    const int share = 4 / dp, first = tr.dp_rank() * share;
    if (!load.empty()) {
      const auto info = io::load_checkpoint(ctx, load, tr);
      CHECK(info.step == from);
      if (warnings && world.rank() == 0) *warnings = info.warnings;
    }
    for (long s = 0; s < from && load.empty(); ++s) tr.step(ctx, mp_windows(s, first, share));
    const double e = tr.evaluate(ctx, mp_windows(-1, 0, 4));
    if (!save_root.empty()) io::save_checkpoint(ctx, save_root, tr, state_at(from), world);
    std::vector<double> mine;
    for (long s = from; s < to; ++s) mine.push_back(tr.step(ctx, mp_windows(s, first, share)).loss);
    if (world.rank() == 0) {
      eval = e;
      losses = mine;
    }
  });
  return {eval, losses};
}

/// The same on layout<1,1> with dp ranks (ZeRO-1 when dp > 1; each rank 4/dp windows).
template <class Model = MP>
std::pair<double, std::vector<double>> plain_run(int dp, long from, long to, const fs::path& load, const fs::path& save_root) {
  double eval = 0;
  std::vector<double> losses;
  auto body = [&](auto& tr, context<device::cpu>& ctx, int rank, auto save) {
    const auto info = io::load_checkpoint(ctx, load, tr);
    CHECK(info.step == from);
    const double e = tr.evaluate(ctx, mp_windows(-1, 0, 4));
    save();
    std::vector<double> mine;
    for (long s = from; s < to; ++s) mine.push_back(tr.step(ctx, mp_windows(s, rank * 4 / dp, 4 / dp)).loss);
    if (rank == 0) {
      eval = e;
      losses = mine;
    }
  };
  if (dp == 1) {
    const one_thread_per_rank one_thread;
    context<device::cpu> ctx;
    plain_trainer<Model> tr(ctx, mp_config(2, 2, 88));
    body(tr, ctx, 0, [&] {
      if (!save_root.empty()) io::save_checkpoint(ctx, save_root, tr, state_at(from));
    });
  } else {
    comm::run_threads(dp, [&](comm::threads& world) {
      const one_thread_per_rank one_thread;
      context<device::cpu> ctx;
      parallel::ddp_options o;
      o.zero1 = true;
      plain_trainer<Model> tr(ctx, mp_config(2, 4 / dp / 2, 88), world, o);
      body(tr, ctx, world.rank(), [&] {
        if (!save_root.empty()) io::save_checkpoint(ctx, save_root, tr, state_at(from), world);
      });
    });
  }
  return {eval, losses};
}

void check_close(double got, double want) {
  CHECK(got == doctest::Approx(want).epsilon(1e-5));
}

}  // namespace

TEST_CASE("checkpoint (layouts): (TP,PP,DP) = (2,2,1) -> (1,1,2) ZeRO-1 -> (1,1,1) -> (2,2,1): same loss, same curve") {
  temp_dir dir;
  const fs::path a = dir.path / "a", b = dir.path / "b", c = dir.path / "c";
  const auto step3 = io::checkpoint_dir_name(3);
  // (2,2,1): 3 steps, evaluate, save (4 files, one per (tp, pp)), 3 more steps
  const auto [eval_a, curve_a] = layout_run<2, 2>(3, 6, {}, a);
  const auto man = io::verify_checkpoint(a / step3);
  CHECK(man["layout"]["tp"] == 2);
  CHECK(man["layout"]["pp"] == 2);
  REQUIRE(man["files"].size() == 4);
  CHECK(man["files"][3]["path"] == "model-tp01-pp01.safetensors");
  CHECK(man["tensors"][models::rows_by_role<MP>[int(models::role::lnf_w)]]["used_on_stages"] == "last");
  // the files hold local shapes: qkv_w of a (tp 1, stage 1) rank = layers 2..3, its heads' rows
  const io::safetensors_reader r11(a / step3 / "model-tp01-pp01.safetensors");
  CHECK(r11.info("param.qkv_w").shape == std::vector<std::int64_t>{2, 30, 20});

  // the same layout resumes bit for bit
  const auto [eval_same, curve_same] = layout_run<2, 2>(3, 6, a / step3, {});
  CHECK(std::memcmp(&eval_same, &eval_a, sizeof(double)) == 0);
  REQUIRE(curve_same.size() == 3);
  CHECK(std::memcmp(curve_same.data(), curve_a.data(), 3 * sizeof(double)) == 0);

  // -> (1,1,2) with ZeRO-1 (moments resharded into flat ranges), saved again
  const auto [eval_b, curve_b] = plain_run(2, 3, 6, a / step3, b);
  // -> (1,1,1) from the ZeRO-1 checkpoint
  const auto [eval_c, curve_c] = plain_run(1, 3, 6, b / step3, c);
  // -> back to (2,2,1) from the ZeRO-1 checkpoint (moments gathered, then split by tp and pp)
  std::vector<std::string> warnings;
  const auto [eval_d, curve_d] = layout_run<2, 2>(3, 6, b / step3, {}, &warnings);
  CHECK(std::find_if(warnings.begin(), warnings.end(), [](const std::string& w) {
          return w.find("resharded onto tp = 2, pp = 2") != std::string::npos;
        }) != warnings.end());
  for (const double e : {eval_b, eval_c, eval_d}) check_close(e, eval_a);  // the loss after loading
  for (const auto* curve : {&curve_b, &curve_c, &curve_d}) {                // the curve after it
    REQUIRE(curve->size() == 3);
    for (std::size_t i = 0; i < 3; ++i) check_close((*curve)[i], curve_a[i]);
  }
  CHECK(curve_a[2] < eval_a);  // it still trains
  MESSAGE("eval loss before saving on (2,2,1) " << eval_a << "; after loading on (1,1,2) " << eval_b << ", (1,1,1) "
                                                << eval_c << ", (2,2,1) " << eval_d << "; step 6 loss " << curve_a[2] << " / "
                                                << curve_b[2] << " / " << curve_c[2] << " / " << curve_d[2]);
  // (1,1,1) and (1,1,2) are bitwise the same model after loading: same tensors, same order
  const auto [eval_c2, curve_c2] = plain_run(1, 3, 6, c / step3, {});
  CHECK(std::memcmp(&eval_c2, &eval_c, sizeof(double)) == 0);
}

TEST_CASE("checkpoint (layouts, ZeRO-1): (2,1,2) ZeRO-1 resumes bit for bit, reshards to (2,2,1) and (1,1,1) and back") {
  temp_dir dir;
  const fs::path a = dir.path / "a", c = dir.path / "c";
  const auto step3 = io::checkpoint_dir_name(3);
  // (2,1,2) with ZeRO-1: 3 steps, evaluate, save (2 model files, 4 moment shards), 3 more steps
  const auto [eval_a, curve_a] = layout_run<2, 1>(3, 6, {}, a, nullptr, 2, true);
  const auto man = io::verify_checkpoint(a / step3);
  CHECK(man["layout"]["tp"] == 2);
  CHECK(man["layout"]["dp"] == 2);
  CHECK(man["layout"]["zero"] == 1);
  std::vector<std::string> paths;
  for (const auto& f : man["files"]) paths.push_back(f["path"]);
  std::sort(paths.begin(), paths.end());
  CHECK(paths == std::vector<std::string>{"model-tp00-pp00.safetensors", "model-tp01-pp00.safetensors",
                                          "optim-tp00-pp00-dp00.safetensors", "optim-tp00-pp00-dp01.safetensors",
                                          "optim-tp01-pp00-dp00.safetensors", "optim-tp01-pp00-dp01.safetensors"});
  // no whole moments in the model files; each shard holds about half of its cell's moments
  const io::safetensors_reader m01(a / step3 / "model-tp01-pp00.safetensors");
  CHECK(!m01.has("adam_m.qkv_w"));
  const std::size_t cell = layout_trainer<2, 1>::model_t::num_parameters;
  const io::safetensors_reader o11(a / step3 / "optim-tp01-pp00-dp01.safetensors");
  CHECK(std::size_t(o11.info("adam_m").shape[0]) <= cell / 2 + 64 * 16);
  CHECK(std::size_t(o11.info("adam_m").shape[0]) + 64 * 16 >= cell / 2);

  // the same layout and ZeRO-1 resumes bit for bit
  const auto [eval_same, curve_same] = layout_run<2, 1>(3, 6, a / step3, {}, nullptr, 2, true);
  CHECK(std::memcmp(&eval_same, &eval_a, sizeof(double)) == 0);
  REQUIRE(curve_same.size() == 3);
  CHECK(std::memcmp(curve_same.data(), curve_a.data(), 3 * sizeof(double)) == 0);
  // -> (2,2,1) without ZeRO-1 (moments gathered per (tp, pp) cell, resharded over pp), saved again
  std::vector<std::string> warnings;
  const auto [eval_b, curve_b] = layout_run<2, 2>(3, 6, a / step3, c, &warnings);
  CHECK(std::find_if(warnings.begin(), warnings.end(), [](const std::string& w) {
          return w.find("resharded onto tp = 2, pp = 2") != std::string::npos;
        }) != warnings.end());
  // -> (1,1,1), and from the (2,2,1) checkpoint back onto (2,1,2) with ZeRO-1
  const auto [eval_c, curve_c] = plain_run(1, 3, 6, a / step3, {});
  const auto [eval_d, curve_d] = layout_run<2, 1>(3, 6, c / step3, {}, nullptr, 2, true);
  for (const double e : {eval_b, eval_c, eval_d}) check_close(e, eval_a);
  for (const auto* curve : {&curve_b, &curve_c, &curve_d}) {
    REQUIRE(curve->size() == 3);
    for (std::size_t i = 0; i < 3; ++i) check_close((*curve)[i], curve_a[i]);
  }
  CHECK(curve_a[2] < eval_a);  // it trains
}

TEST_CASE("recipe as data: tiny_untied (no linear biases, untied LM head) trains on every layout like one rank, "
          "checkpoints and reshards") {
  // The recipe lives in models/recipe.hpp and models/configs.hpp only; its table drives the rest.
  constexpr auto t = models::param_table<MU, layout<1, 1>>();
  static_assert(t.size() == 13 && models::rows_by_role<MU>[int(models::role::qkv_b)] == -1);
  const auto& head = t[std::size_t(models::rows_by_role<MU>[int(models::role::lm_head)])];
  CHECK(head.rule == models::shard::vocab);
  CHECK(head.used == models::stages::last);
  CHECK(t[0].used == models::stages::first);  // wte: the embedding only
  constexpr long C = 20, Vp = 64, H = 80;
  CHECK(models::parameter_count<MU>() == std::size_t(2 * Vp * C + 16 * C + 4 * (4 * C + 3 * C * C + C * C + 2 * C * H) + 2 * C));
  CHECK(models::parameter_count<MU>(false) == models::parameter_count<MU>() - std::size_t(Vp * C + 16 * C));

  // one rank from scratch (train::trainer): 3 steps, evaluate, 3 more
  std::vector<double> one;
  double eval_one = 0;
  {
    const one_thread_per_rank one_thread;
    context<device::cpu> ctx;
    plain_trainer<MU> tr(ctx, mp_config(2, 2, 5));
    for (long s = 0; s < 6; ++s) {
      if (s == 3) eval_one = tr.evaluate(ctx, mp_windows(-1, 0, 4));
      one.push_back(tr.step(ctx, mp_windows(s, 0, 4)).loss);
    }
    const auto wte = tr.model().parameter(models::role::wte), lm = tr.model().parameter(models::role::lm_head);
    CHECK(!std::equal(wte.begin(), wte.end(), lm.begin()));  // two matrices, trained apart
  }
  temp_dir dir;
  const fs::path a = dir.path / "a", b = dir.path / "b", g = dir.path / "gpt2";
  const auto step3 = io::checkpoint_dir_name(3);
  // every layout gives one rank's losses: (2,2,1) saving at step 3, (2,1,2) with ZeRO-1, (1,2,2)
  const auto [eval_a, curve_a] = layout_run<2, 2, MU>(3, 6, {}, a);
  const auto [eval_z, curve_z] = layout_run<2, 1, MU>(3, 6, {}, {}, nullptr, 2, true);
  const auto [eval_p, curve_p] = layout_run<1, 2, MU>(3, 6, {}, {}, nullptr, 2, false);
  for (const double e : {eval_a, eval_z, eval_p}) check_close(e, eval_one);
  for (const auto* curve : {&curve_a, &curve_z, &curve_p}) {
    REQUIRE(curve->size() == 3);
    for (std::size_t i = 0; i < 3; ++i) check_close((*curve)[i], one[3 + i]);
  }
  // the manifest is the table's: 13 tensors, the untied head used on the last stage
  const auto man = io::verify_checkpoint(a / step3);
  CHECK(man["model"]["arch"] == "gpt2_untied_nobias");
  REQUIRE(man["tensors"].size() == 13);
  CHECK(man["tensors"][12]["name"] == "lm_head");
  CHECK(man["tensors"][12]["used_on_stages"] == "last");
  CHECK(man["tensors"][0]["used_on_stages"] == "first");
  // reshard: (2,2,1) -> (1,2,2) ZeRO-1 (saved again) -> (1,1,1) -> (2,1,1)
  const auto [eval_b, curve_b] = layout_run<1, 2, MU>(3, 6, a / step3, b, nullptr, 2, true);
  const auto [eval_c, curve_c] = plain_run<MU>(1, 3, 6, b / step3, {});
  const auto [eval_d, curve_d] = layout_run<2, 1, MU>(3, 6, b / step3, {});
  for (const double e : {eval_b, eval_c, eval_d}) check_close(e, eval_a);
  for (const auto* curve : {&curve_b, &curve_c, &curve_d}) {
    REQUIRE(curve->size() == 3);
    for (std::size_t i = 0; i < 3; ++i) check_close((*curve)[i], curve_a[i]);
  }
  MESSAGE("tiny_untied: eval loss after 3 steps on one rank " << eval_one << ", (2,2,1) " << eval_a << ", (2,1,2) ZeRO-1 "
                                                              << eval_z << ", (1,2,2) " << eval_p << "; after resharding "
                                                              << eval_b << " / " << eval_c << " / " << eval_d);
  // a GPT-2 checkpoint of the same sizes is refused, naming both architectures
  layout_run<2, 1, MP>(1, 1, {}, g);
  const one_thread_per_rank one_thread;
  context<device::cpu> ctx;
  plain_trainer<MU> tr(ctx, mp_config(2, 2, 5));
  CHECK_THROWS_WITH_AS(io::load_checkpoint(ctx, g / io::checkpoint_dir_name(1), tr),
                       doctest::Contains("architecture 'gpt2' (model tiny_parallel), but this run has architecture "
                                         "'gpt2_untied_nobias'"),
                       input_error);
}

TEST_CASE("recipe as data: llama_tiny (RMSNorm, RoPE, SwiGLU, 6 query heads on 2 key/value heads) trains on every "
          "layout like one rank, checkpoints and reshards") {
  using ML = models::llama_tiny;
  constexpr auto t = models::param_table<ML, layout<2, 1>>();
  static_assert(t.size() == 9 && models::rows_by_role<ML>[int(models::role::wpe)] == -1);
  const auto& qkv = t[std::size_t(models::rows_by_role<ML>[int(models::role::qkv_w)])];
  CHECK(qkv.global[1] == (6 + 2 * 2) * 4);  // [q: 6 heads | k: 2 | v: 2] of 4 rows
  CHECK(qkv.shape[1] == (3 + 2 * 1) * 4);   // a tp rank: 3 query heads, 1 key and 1 value head
  CHECK(qkv.parts == std::array<int, 3>{6, 2, 2});
  CHECK(t[std::size_t(models::rows_by_role<ML>[int(models::role::fc_w)])].shape[1] == 14);  // [gate 7 | up 7]

  std::vector<double> one;
  double eval_one = 0;
  {
    const one_thread_per_rank one_thread;
    context<device::cpu> ctx;
    plain_trainer<ML> tr(ctx, mp_config(2, 2, 5));
    for (long s = 0; s < 6; ++s) {
      if (s == 3) eval_one = tr.evaluate(ctx, mp_windows(-1, 0, 4));
      one.push_back(tr.step(ctx, mp_windows(s, 0, 4)).loss);
    }
    CHECK(one[5] < one[0]);
  }
  temp_dir dir;
  const fs::path a = dir.path / "a";
  const auto step3 = io::checkpoint_dir_name(3);
  const auto [eval_a, curve_a] = layout_run<2, 2, ML>(3, 6, {}, a);
  const auto [eval_z, curve_z] = layout_run<2, 1, ML>(3, 6, {}, {}, nullptr, 2, true);
  const auto [eval_p, curve_p] = layout_run<1, 2, ML>(3, 6, {}, {}, nullptr, 2, false);
  for (const double e : {eval_a, eval_z, eval_p}) check_close(e, eval_one);
  for (const auto* curve : {&curve_a, &curve_z, &curve_p}) {
    REQUIRE(curve->size() == 3);
    for (std::size_t i = 0; i < 3; ++i) check_close((*curve)[i], one[3 + i]);
  }
  const auto man = io::verify_checkpoint(a / step3);
  CHECK(man["model"]["arch"] == "llama");
  REQUIRE(man["tensors"].size() == 9);
  CHECK(man["tensors"][2]["name"] == "qkv_w");
  CHECK(man["tensors"][2]["section_parts"] == nlohmann::json::array({6, 2, 2}));
  // reshard (2,2,1) -> one rank and -> (2,1,1): the shards of the unequal q/k/v sections land right
  const auto [eval_c, curve_c] = plain_run<ML>(1, 3, 6, a / step3, {});
  const auto [eval_d, curve_d] = layout_run<2, 1, ML>(3, 6, a / step3, {});
  for (const double e : {eval_c, eval_d}) check_close(e, eval_a);
  for (const auto* curve : {&curve_c, &curve_d}) {
    REQUIRE(curve->size() == 3);
    for (std::size_t i = 0; i < 3; ++i) check_close((*curve)[i], curve_a[i]);
  }
  MESSAGE("llama_tiny: eval loss after 3 steps on one rank " << eval_one << ", (2,2,1) " << eval_a << ", (2,1,2) ZeRO-1 "
                                                             << eval_z << ", (1,2,2) " << eval_p << "; after resharding "
                                                             << eval_c << " / " << eval_d);
}

TEST_CASE("reshard: io::shard_tensor places every element where nn::global_index says (layout<2,2>)") {
  using L = layout<2, 2>;
  constexpr auto t = models::param_table<MP, L>();
  for (int k = 0; k < int(models::num_params<MP>); ++k) {
    const auto g = io::geometry_of<MP>(k);
    std::vector<std::int32_t> logical(g.logical_elems());
    for (std::size_t i = 0; i < logical.size(); ++i) logical[i] = std::int32_t(i);
    for (int r = 0; r < 2; ++r)
      for (int s = 0; s < 2; ++s) {
        const auto shard = io::shard_tensor(g, 4, std::as_bytes(std::span<const std::int32_t>(logical)), 2, 2, r, s);
        REQUIRE(shard.size() == t[std::size_t(k)].size() * 4);
        bool same = true;
        for (std::size_t i = 0; i < t[std::size_t(k)].size(); ++i) {
          std::int32_t v;
          std::memcpy(&v, shard.data() + 4 * i, 4);
          same = same && std::size_t(v) == nn::global_index<MP, L>(std::size_t(k), r, s, i);
        }
        CAPTURE(k);
        CHECK(same);
      }
  }
}

TEST_CASE("checkpoint (ZeRO-1, bf16): the sharded fp32 masters go into the optim shards and reshard bit for bit") {
  // dp 2 with ZeRO-1 saves each rank's master shard beside its moments (no master.* in the model
  // file); one rank without ZeRO-1 loads the whole masters from the shards; its save (master.* in
  // the model file) loads into dp 3 with ZeRO-1, whose shards hold the same masters.
  using bf_t = train::trainer<M, policy<device::cpu, precision::bf16>, 4, 16>;
  constexpr std::size_t N = bf_t::model_t::num_parameters;
  const one_thread_per_rank one_thread;
  temp_dir dir;
  const fs::path a = dir.path / "a", b = dir.path / "b";
  std::vector<float> masters(N, 0.0f), m(N, 0.0f);  // the dp 2 run's whole state, from its shards
  std::vector<std::uint8_t> seen(N, 0);
  std::vector<Eigen::bfloat16> params;
  std::mutex mu;
  // the whole masters and first moment of a ZeRO-1 trainer, written at its ranges
  auto collect = [](const bf_t& tr, std::vector<float>& w, std::vector<float>& mm, std::vector<std::uint8_t>* seen_by) {
    const auto* z = tr.zero1_optimizer();
    REQUIRE(z != nullptr);
    for (const auto& q : z->ranges()) {
      std::memcpy(w.data() + q.param_offset, z->master_weights().data() + q.shard_offset, q.length * sizeof(float));
      std::memcpy(mm.data() + q.param_offset, z->first_moment().data() + q.shard_offset, q.length * sizeof(float));
      if (seen_by)
        for (std::size_t i = 0; i < q.length; ++i) ++(*seen_by)[q.param_offset + i];
    }
  };
  comm::run_threads(2, [&](comm::threads& world) {
    const one_thread_per_rank guard;
    context<device::cpu> ctx;
    bf_t tr(ctx, config(global_windows / 2), world, parallel::ddp_options{.zero1 = true});
    for (long s = 0; s < 2; ++s) tr.step(ctx, windows(s, world.rank() * 3, 3));
    CHECK(tr.optimizer().master_weights().size() == 0);
    io::save_checkpoint(ctx, a, tr, state_at(2), world);
    std::lock_guard lock(mu);
    collect(tr, masters, m, &seen);
    if (world.rank() == 0) params.assign(tr.model().parameters().begin(), tr.model().parameters().end());
  });
  CHECK(std::count(seen.begin(), seen.end(), std::uint8_t(1)) == std::ptrdiff_t(N));  // covered once
  const fs::path ck = a / io::checkpoint_dir_name(2);
  {
    const io::safetensors_reader model(ck / "model-tp00-pp00.safetensors");
    CHECK(!model.has("master.wte"));
    const io::safetensors_reader shard(ck / "optim-tp00-pp00-dp01.safetensors");
    CHECK(shard.has("master"));
    CHECK(shard.info("master").shape == shard.info("adam_m").shape);
  }
  // into one rank without ZeRO-1: the whole masters come back from the shards
  {
    context<device::cpu> ctx;
    bf_t one(ctx, config(3, 7));
    (void)io::load_checkpoint(ctx, ck, one);
    const auto w = one.optimizer().master_weights();
    CHECK(std::memcmp(w.data(), masters.data(), N * sizeof(float)) == 0);
    CHECK(std::memcmp(one.optimizer().first_moment().data(), m.data(), N * sizeof(float)) == 0);
    CHECK(std::memcmp(one.model().parameters().data(), params.data(), N * sizeof(Eigen::bfloat16)) == 0);
    io::save_checkpoint(ctx, b, one, state_at(2));
  }
  // the unsharded checkpoint into dp 3 with ZeRO-1: every rank's master shard is its slice
  std::vector<float> w3(N, 0.0f), m3(N, 0.0f);
  comm::run_threads(3, [&](comm::threads& world) {
    const one_thread_per_rank guard;
    context<device::cpu> ctx;
    bf_t tr(ctx, config(global_windows / 3, 99), world, parallel::ddp_options{.zero1 = true});
    (void)io::load_checkpoint(ctx, b / io::checkpoint_dir_name(2), tr);
    CHECK(tr.zero1_optimizer()->step() == 2);
    std::lock_guard lock(mu);
    collect(tr, w3, m3, nullptr);
  });
  CHECK(std::memcmp(w3.data(), masters.data(), N * sizeof(float)) == 0);
  CHECK(std::memcmp(m3.data(), m.data(), N * sizeof(float)) == 0);
}
