// Optimizer offload on device::ascend (emulated): trainer_config::offload_optimizer keeps the fp32
// master weights and AdamW moments in pinned host memory and runs the update on the host
// (optim::offload_adamw; ZeRO-Offload, arXiv:2101.06840).
//
// Why a tolerance and not bitwise equality against the device optimizer: the offloaded update is
// loom's CPU AdamW kernel (fp32 arithmetic), the device update is aclnnApplyAdamWV2, which the
// emulation evaluates in double and rounds to fp32 once. After the first step (the same
// gradient bits on both sides) the two agree to about one fp32 ulp of the masters and moments; a
// bf16 parameter then differs only where a master lies next to a bf16 rounding boundary. From the
// second step on the gradients differ by those roundings too, and Adam's normalised update
// amplifies tiny differences of near-zero gradients into O(lr) parameter differences, so later
// steps are compared by their losses. Offload against offload (resume) is bitwise.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <span>
#include <vector>

#include <unistd.h>

#include <loom/io/checkpoint.hpp>
#include <loom/kernels/ascend.hpp>
#include <loom/train/trainer.hpp>

#include "support.hpp"

using namespace loom_test;

namespace {

namespace fs = std::filesystem;
constexpr int B = 2, T = 8;

/// A Llama the NPU kernels take (SwiGLU rows of 64-byte multiples; as test_gpt.cpp's llama_npu).
struct llama_offload {
  static constexpr std::string_view name = "llama_offload";
  static constexpr loom::models::recipe arch = loom::models::llama;
  static constexpr int n_layer = 2, n_head = 4, n_kv_head = 2, d_model = 32, d_ff = 32, max_seq = 16;
  static constexpr int vocab = 61, vocab_padded = 64;
};
template <class M, class Prec>
using npu_trainer = loom::train::trainer<M, loom::policy<npu, Prec>, B, T, loom::parallel::local_group, loom::kernels::fused>;

/// A config with a chunk that cuts the ~6k parameters into many chunks, most rows mid-way.
loom::train::trainer_config offload_config(bool offload) {
  loom::train::trainer_config cfg;
  cfg.grad_accum = 2;
  cfg.schedule = {1e-2, 1e-3, 1, 10};  // large steps: a missed update is far outside the tolerance
  cfg.seed = 23;
  cfg.offload_optimizer = offload;
  cfg.offload_chunk = 224;  // a multiple of 32 that is no row's size
  return cfg;
}

/// Random windows of step s (never constant).
template <class M>
std::vector<std::int32_t> windows_of(std::size_t ids, int s) {
  std::mt19937 rng(std::uint32_t(1000 + s));
  std::uniform_int_distribution<std::int32_t> id(0, M::vocab - 1);
  std::vector<std::int32_t> w(ids);
  for (auto& x : w) x = id(rng);
  return w;
}

/// The parameters, fp32 masters (or an empty vector) and moments of a trainer.
struct state {
  std::vector<float> params, master, m, v;
};
/// What a run leaves behind: per-step losses, the state after the first and the last step, and
/// the device's peak allocation during it.
struct run_result {
  std::vector<double> losses;
  state first, last;
  std::size_t peak = 0, optimizer_device = 0, optimizer_host = 0;
};

template <class Trainer>
void read_state(loom::context<npu>& ctx, const Trainer& tr, state& r) {
  const auto p = tr.model().parameters();
  r.params = download(ctx, p.data(), p.size());
  auto host = [](auto view) { return std::vector<float>(view.data(), view.data() + view.size()); };
  if (const auto* off = tr.offload_optimizer()) {
    if constexpr (loom::optim::adamw<typename Trainer::model_t>::has_master) r.master = host(off->master_weights());
    r.m = host(off->first_moment());
    r.v = host(off->second_moment());
  } else {
    const auto& o = tr.optimizer();
    if constexpr (loom::optim::adamw<typename Trainer::model_t>::has_master) r.master = download(ctx, o.master_weights().data(), o.master_weights().size());
    r.m = download(ctx, o.first_moment().data(), o.first_moment().size());
    r.v = download(ctx, o.second_moment().data(), o.second_moment().size());
  }
}

/// `steps` steps of a fresh trainer; peak allocation measured from before its construction.
template <class M, class Prec>
run_result run(loom::device::ascend_device& dev, bool offload, int steps) {
  auto& ctx = dev.context();
  ctx.synchronize();
  dev.memory().reset_peak_stats();
  run_result r;
  {
    npu_trainer<M, Prec> tr(ctx, offload_config(offload));
    for (int s = 0; s < steps; ++s) {
      const auto res = tr.step(ctx, windows_of<M>(tr.windows_per_step() * tr.window(), s));
      REQUIRE_FALSE(res.skipped);
      r.losses.push_back(res.loss);
      if (s == 0) read_state(ctx, tr, r.first);
    }
    ctx.synchronize();
    r.peak = dev.memory().stats().peak_allocated;
    r.optimizer_device = tr.optimizer_bytes();
    r.optimizer_host = tr.host_optimizer_bytes();
    read_state(ctx, tr, r.last);
  }
  return r;
}

/// max |a - b| / (|b| + floor) over the elements.
double max_rel(const std::vector<float>& a, const std::vector<float>& b, double floor) {
  REQUIRE(a.size() == b.size());
  double e = 0;
  for (std::size_t i = 0; i < a.size(); ++i) e = std::max(e, std::abs(double(a[i]) - b[i]) / (std::abs(double(b[i])) + floor));
  return e;
}

/// Elements of bf16 values a, b that differ by more than one bf16 ulp (2^-7 relative) plus 1e-8
/// (the masters' rounding difference, lr * 1e-6, decides the rounding of values near zero), and
/// the count that differ at all.
std::pair<std::size_t, std::size_t> bf16_differences(const std::vector<float>& a, const std::vector<float>& b) {
  std::size_t far = 0, any = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    ++any;
    if (std::abs(double(a[i]) - b[i]) > std::ldexp(std::abs(double(b[i])), -7) + 1e-8) ++far;
  }
  return {far, any};
}

}  // namespace

TEST_CASE("optimizer offload (emulated): llama bf16, four steps match the device optimizer; the device peak falls "
          "by the optimizer state") {
  using M = llama_offload;
  using P = loom::precision::bf16;
  loom::device::ascend_device dev(runtime(), 0);
  const auto base = run<M, P>(dev, false, 4);
  const auto off = run<M, P>(dev, true, 4);
  constexpr std::size_t N = npu_trainer<M, P>::model_t::num_parameters;
  static_assert(N > 20 * 224, "the chunk must cut the parameters into many chunks");

  CHECK(off.losses[0] == base.losses[0]);  // the same initial parameters
  for (std::size_t s = 1; s < base.losses.size(); ++s) {
    CAPTURE(s);
    CHECK(off.losses[s] == doctest::Approx(base.losses[s]).epsilon(1e-4));
  }
  // after the first update, from the same gradient bits: every element, to fp32 rounding
  CHECK(max_rel(off.first.master, base.first.master, 1e-2) < 1e-6);
  CHECK(max_rel(off.first.m, base.first.m, 1e-9) < 1e-5);
  CHECK(max_rel(off.first.v, base.first.v, 1e-12) < 1e-5);
  const auto [far, any] = bf16_differences(off.first.params, base.first.params);
  CHECK(far == 0);
  CHECK(any <= N / 100);  // masters next to a bf16 rounding boundary only
  // the parameters on the device are the host masters' rounding, after every step
  for (const auto* st : {&off.first, &off.last}) {
    std::size_t not_rounded = 0;
    for (std::size_t i = 0; i < N; ++i) not_rounded += st->params[i] != float(Eigen::bfloat16(st->master[i]));
    CHECK(not_rounded == 0);
  }

  const std::size_t state = 3 * N * sizeof(float);  // masters + two moments
  CHECK(base.optimizer_device == state);
  CHECK(off.optimizer_device == 0);
  CHECK(off.optimizer_host >= state);
  MESSAGE("device peak without offload " << base.peak << " B, with " << off.peak << " B; state " << state << " B");
  CHECK(base.peak >= off.peak + state);
}

TEST_CASE("optimizer offload (emulated): fp32 storage (no masters) offloads the moments; three steps match") {
  using M = loom::models::tiny;
  using P = loom::precision::fp32_ascend_matmul;
  loom::device::ascend_device dev(runtime(), 0);
  const auto base = run<M, P>(dev, false, 3);
  const auto off = run<M, P>(dev, true, 3);
  constexpr std::size_t N = npu_trainer<M, P>::model_t::num_parameters;
  CHECK(off.losses[0] == base.losses[0]);
  for (std::size_t s = 1; s < base.losses.size(); ++s) CHECK(off.losses[s] == doctest::Approx(base.losses[s]).epsilon(1e-4));
  CHECK(max_rel(off.first.params, base.first.params, 1e-2) < 1e-6);
  CHECK(max_rel(off.first.m, base.first.m, 1e-9) < 1e-5);
  CHECK(max_rel(off.first.v, base.first.v, 1e-12) < 1e-5);
  CHECK(off.last.master.empty());
  CHECK(off.optimizer_device == 0);
  CHECK(base.optimizer_device == 2 * N * sizeof(float));
  CHECK(base.peak >= off.peak + 2 * N * sizeof(float));
}

TEST_CASE("optimizer offload (emulated): a checkpoint of the host state resumes bitwise, and loads into a trainer "
          "without offload") {
  using M = llama_offload;
  using P = loom::precision::bf16;
  using trainer_t = npu_trainer<M, P>;
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  const fs::path root = fs::temp_directory_path() / ("loom_offload_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(root);
  loom::io::run_state st;
  st.data = {{"kind", "test"}};

  trainer_t a(ctx, offload_config(true));
  const std::size_t ids = a.windows_per_step() * a.window();
  for (int s = 0; s < 2; ++s) a.step(ctx, windows_of<M>(ids, s));
  const fs::path dir = loom::io::save_checkpoint(ctx, root, a, st);
  const auto want = a.step(ctx, windows_of<M>(ids, 2));
  state ra;
  read_state(ctx, a, ra);

  trainer_t b(ctx, offload_config(true));
  loom::io::load_checkpoint(ctx, dir, b);
  CHECK(b.optimizer().step() == 2);
  const auto got = b.step(ctx, windows_of<M>(ids, 2));
  state rb;
  read_state(ctx, b, rb);
  CHECK(got.loss == want.loss);
  CHECK(got.grad_norm == want.grad_norm);
  CHECK(rb.params == ra.params);
  CHECK(rb.master == ra.master);
  CHECK(rb.m == ra.m);
  CHECK(rb.v == ra.v);

  // the same files hold the state a device-resident optimizer loads
  trainer_t c(ctx, offload_config(false));
  loom::io::load_checkpoint(ctx, dir, c);
  trainer_t d(ctx, offload_config(true));
  loom::io::load_checkpoint(ctx, dir, d);
  state rc, rd;
  read_state(ctx, c, rc);
  read_state(ctx, d, rd);
  CHECK(rc.master == rd.master);
  CHECK(rc.m == rd.m);
  CHECK(rc.v == rd.v);
  CHECK(rc.params == rd.params);
  fs::remove_all(root);
}

TEST_CASE("optimizer offload (emulated): the plan moves the optimizer state to host memory and equals the trainer's "
          "allocation; ZeRO-1 and a bad chunk are refused") {
  using M = llama_offload;
  using trainer_t = npu_trainer<M, loom::precision::bf16>;
  loom::device::ascend_device dev(runtime(), 0);
  for (bool offload : {false, true}) {
    CAPTURE(offload);
    trainer_t tr(dev.context(), offload_config(offload));
    const auto p = trainer_t::plan(tr.config(), 1, 0, 0, nullptr);
    CHECK(p.parameters == tr.model().parameters().bytes());
    CHECK(p.gradients == tr.model().gradients().bytes());
    CHECK(p.optimizer() == tr.optimizer_bytes());
    CHECK(p.host_optimizer == tr.host_optimizer_bytes());
    CHECK(p.activations == tr.activation_bytes());
    CHECK((p.master_weights == 0) == offload);
    CHECK((p.host_optimizer > 0) == offload);
  }
  const loom::parallel::ddp_options zero1{.zero1 = true};
  CHECK_THROWS_WITH_AS(trainer_t::plan(offload_config(true), 2, 0, 0, &zero1), doctest::Contains("drop --zero1"),
                       loom::input_error);
  auto bad = offload_config(true);
  bad.offload_chunk = 100;
  CHECK_THROWS_AS(trainer_t(dev.context(), bad), loom::input_error);
}

namespace {

/// Losses, and the state after step `read_at` (which waits for its overlapped update) and after
/// the last step, of `steps` steps with offload, overlapped or not; the emulation's count of
/// parameter uploads that ran while the compute stream had operators queued.
struct overlap_result {
  std::vector<double> losses;
  state mid, last;
  std::uint64_t uploads_beside_work = 0;
};
template <class M, class Prec>
overlap_result run_offloaded(loom::device::ascend_device& dev, bool overlap, int steps, int read_at) {
  auto& ctx = dev.context();
  auto cfg = offload_config(true);
  cfg.offload_overlap = overlap;
  npu_trainer<M, Prec> tr(ctx, cfg);
  overlap_result r;
  const auto c0 = loomemu_get_counters();
  for (int s = 0; s < steps; ++s) {
    const auto res = tr.step(ctx, windows_of<M>(tr.windows_per_step() * tr.window(), s));
    REQUIRE_FALSE(res.skipped);
    r.losses.push_back(res.loss);
    if (s == read_at) read_state(ctx, tr, r.mid);
  }
  r.uploads_beside_work = loomemu_get_counters().h2d_copies_beside_work - c0.h2d_copies_beside_work;
  read_state(ctx, tr, r.last);
  ctx.synchronize();
  return r;
}

/// A file's bytes.
std::vector<char> read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

template <class M, class Prec>
void check_overlap_bitwise(int steps) {
  loom::device::ascend_device dev(runtime(), 0);
  const auto off = run_offloaded<M, Prec>(dev, false, steps, 1);
  const auto on = run_offloaded<M, Prec>(dev, true, steps, 1);
  CHECK(on.losses == off.losses);
  for (const auto* st : {&on.mid, &on.last}) {
    const auto& want = st == &on.mid ? off.mid : off.last;
    CHECK(st->params == want.params);
    CHECK(st->master == want.master);
    CHECK(st->m == want.m);
    CHECK(st->v == want.v);
  }
  MESSAGE("parameter uploads run beside compute: overlapped " << on.uploads_beside_work << ", not overlapped "
                                                             << off.uploads_beside_work);
}

}  // namespace

TEST_CASE("optimizer offload (emulated): forward-order chunks cover every parameter once; each layer's gate follows "
          "its last chunk") {
  using model_t = npu_trainer<llama_offload, loom::precision::bf16>::model_t;
  constexpr std::size_t N = model_t::num_parameters;
  const loom::optim::forward_chunks<model_t> f(224);
  CHECK(f.layers() == llama_offload::n_layer);
  CHECK(f.chunks() == (N + 223) / 224);
  std::vector<int> seen(N, 0);
  std::vector<int> gate_of(N, -2);  // the gate layer that reads element i
  for (int g = -1; g <= f.layers(); ++g) {
    const std::size_t c = f.ready_after(g);
    if (g > -1) CHECK(c >= f.ready_after(g - 1));
  }
  for (std::size_t c = 0; c < f.chunks(); ++c) {
    std::size_t slot = 0;
    f.for_each_piece(c, [&](const loom::optim::chunk_piece& p) {
      CHECK(p.slot_at == slot);  // packed in forward order
      slot += p.n;
      CHECK(p.at >= model_t::offsets[p.row]);
      CHECK(p.at + p.n <= model_t::offsets[p.row + 1]);
      for (std::size_t i = p.at; i < p.at + p.n; ++i) ++seen[i];
    });
    CHECK(slot == f.size(c));
    CHECK(slot <= 224);
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  // layer 0's q/k/v weights are in a chunk no later than layer 0's gate, layer 1's after it
  const std::size_t qkv = std::size_t(loom::models::rows_by_role<llama_offload>[std::size_t(loom::models::role::qkv_w)]);
  const std::size_t per = model_t::table[qkv].layer_size();
  auto chunk_of = [&](std::size_t element) {
    for (std::size_t c = 0; c < f.chunks(); ++c) {
      bool in = false;
      f.for_each_piece(c, [&](const loom::optim::chunk_piece& p) { in = in || (element >= p.at && element < p.at + p.n); });
      if (in) return c;
    }
    return f.chunks();
  };
  CHECK(chunk_of(model_t::offsets[qkv] + per - 1) <= f.ready_after(0));
  CHECK(chunk_of(model_t::offsets[qkv] + per) > f.ready_after(0));
  CHECK(f.ready_after(-1) < f.ready_after(0));
  CHECK(f.ready_after(f.layers()) == f.chunks() - 1);
}

TEST_CASE("optimizer offload (emulated): the update overlapped with the next forward is bitwise the non-overlapped "
          "one, llama bf16 with accumulation") {
  check_overlap_bitwise<llama_offload, loom::precision::bf16>(4);
}

TEST_CASE("optimizer offload (emulated): the update overlapped with the next forward is bitwise the non-overlapped "
          "one, fp32 GPT") {
  check_overlap_bitwise<loom::models::tiny, loom::precision::fp32_ascend_matmul>(3);
}

TEST_CASE("optimizer offload (emulated): a checkpoint saved mid-run with the overlapped update equals the "
          "non-overlapped one, and both resume alike") {
  using M = llama_offload;
  using P = loom::precision::bf16;
  using trainer_t = npu_trainer<M, P>;
  loom::device::ascend_device dev(runtime(), 0);
  auto& ctx = dev.context();
  const fs::path root = fs::temp_directory_path() / ("loom_overlap_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(root);
  loom::io::run_state st;
  st.data = {{"kind", "test"}};
  fs::path dirs[2];
  double next_loss[2] = {0, 0};
  state resumed[2];
  for (int overlap = 0; overlap < 2; ++overlap) {
    auto cfg = offload_config(true);
    cfg.offload_overlap = overlap == 1;
    trainer_t a(ctx, cfg);
    const std::size_t ids = a.windows_per_step() * a.window();
    for (int s = 0; s < 3; ++s) a.step(ctx, windows_of<M>(ids, s));  // the save follows an update in flight
    dirs[overlap] = loom::io::save_checkpoint(ctx, root / (overlap ? "on" : "off"), a, st);
    trainer_t b(ctx, cfg);
    loom::io::load_checkpoint(ctx, dirs[overlap], b);
    read_state(ctx, b, resumed[overlap]);
    next_loss[overlap] = b.step(ctx, windows_of<M>(ids, 3)).loss;
    ctx.synchronize();
  }
  CHECK(resumed[1].params == resumed[0].params);
  CHECK(resumed[1].master == resumed[0].master);
  CHECK(resumed[1].m == resumed[0].m);
  CHECK(resumed[1].v == resumed[0].v);
  CHECK(next_loss[1] == next_loss[0]);
  // the tensor files themselves, byte for byte (the manifest holds the time of the save)
  std::size_t compared = 0;
  for (const auto& e : fs::recursive_directory_iterator(dirs[0])) {
    if (!e.is_regular_file() || e.path().extension() != ".safetensors") continue;
    CAPTURE(e.path());
    const fs::path other = dirs[1] / fs::relative(e.path(), dirs[0]);
    REQUIRE(fs::exists(other));
    CHECK(read_bytes(e.path()) == read_bytes(other));
    ++compared;
  }
  CHECK(compared > 0);
  fs::remove_all(root);
}
