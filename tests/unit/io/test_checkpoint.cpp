// Tests of loom/io/checkpoint.hpp: bitwise resume, the manifest, keep-last-K, failures and
// crashes at every stage of a save, every kind of damaged or unrelated checkpoint, another
// model config, NaN guard, Hugging Face GPT-2 export/import, and the resharding functions.
#include <doctest/doctest.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <loom/core/random.hpp>
#include <loom/data/sampler.hpp>
#include <loom/device/cpu.hpp>
#include <loom/io/checkpoint.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/train/trainer.hpp>

#include "../../support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace loom;
using M = models::tiny;
using P = policy<device::cpu, precision::fp32>;
using trainer_t = train::trainer<M, P, 4, 16>;

namespace {

using loom_test::temp_dir;

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

/// Every regular file under `dir` with its bytes, to prove that nothing changed.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = read_bytes(e.path());
  return out;
}

train::trainer_config test_config(std::uint64_t seed = 1337) {
  train::trainer_config cfg;
  cfg.micro_batch = 3;  // below the capacity 4, 13 below 16: nothing a multiple of a tile
  cfg.seq_len = 13;
  cfg.grad_accum = 2;
  cfg.schedule = {3e-3, 3e-4, 2, 6};  // warm-up and cosine both inside the 6 steps
  cfg.seed = seed;
  return cfg;
}

/// A learnable token stream the sampler draws windows from: mostly t[i] = (3 t[i-1] + 1) mod
/// vocab, every 7th id random.
std::vector<std::int32_t> corpus() {
  std::vector<std::int32_t> t(3001);
  t[0] = 1;
  for (std::size_t i = 1; i < t.size(); ++i)
    t[i] = i % 7 == 0 ? std::int32_t(random_below(M::vocab, 11, 5, i)) : (3 * t[i - 1] + 1) % M::vocab;
  return t;
}

/// One training step drawing its batch from `s`, as train_gpt does.
train::step_result step(context<device::cpu>& ctx, trainer_t& tr, data::window_sampler& s,
                        const std::vector<std::int32_t>& tokens) {
  std::vector<std::int32_t> batch(tr.windows_per_step() * tr.window());
  s.next(std::span<const std::int32_t>(tokens), std::span(batch));
  return tr.step(ctx, batch);
}

io::run_state state_of(const data::window_sampler& s, std::uint64_t tokens) {
  io::run_state st;
  st.tokens = tokens;
  st.data = {{"kind", "window_sampler"}, {"position", s.position()}};
  return st;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

/// A trained trainer (2 steps) and its checkpoint root with steps 1 and 2 saved.
struct fixture {
  context<device::cpu> ctx;
  temp_dir dir;
  fs::path root = dir / "ckpt";
  std::vector<std::int32_t> tokens = corpus();
  trainer_t tr{ctx, test_config()};
  data::window_sampler sampler{tokens.size(), tr.window(), 7};
  fixture() {
    for (int i = 0; i < 2; ++i) {
      step(ctx, tr, sampler, tokens);
      io::save_checkpoint(ctx, root, tr, state_of(sampler, 0));
    }
  }
  fs::path file(long s) const { return root / io::checkpoint_dir_name(s) / io::checkpoint_file_name(0, 0); }
  fs::path manifest(long s) const { return root / io::checkpoint_dir_name(s) / "manifest.json"; }
};

std::string latest_of(const fs::path& root) { return read_bytes(root / "latest"); }

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const input_error& e) {
    return e.what();
  }
  return "(no input_error)";
}

}  // namespace

TEST_CASE("checkpoint: 3 steps, save, new objects, resume, 3 steps == 6 uninterrupted steps, bit for bit") {
  context<device::cpu> ctx;
  temp_dir dir;
  const auto tokens = corpus();
  std::vector<double> straight, resumed;
  std::vector<float> straight_params, straight_m, straight_v;
  {
    trainer_t tr(ctx, test_config());
    data::window_sampler s(tokens.size(), tr.window(), 7);
    for (int i = 0; i < 6; ++i) straight.push_back(step(ctx, tr, s, tokens).loss);
    auto p = tr.model().parameters();
    straight_params.assign(p.begin(), p.end());
    straight_m.assign(tr.optimizer().first_moment().begin(), tr.optimizer().first_moment().end());
    straight_v.assign(tr.optimizer().second_moment().begin(), tr.optimizer().second_moment().end());
  }
  {
    trainer_t tr(ctx, test_config());
    data::window_sampler s(tokens.size(), tr.window(), 7);
    std::uint64_t seen = 0;
    for (int i = 0; i < 3; ++i) {
      const auto r = step(ctx, tr, s, tokens);
      resumed.push_back(r.loss);
      seen += std::uint64_t(r.tokens);
    }
    const auto where = io::save_checkpoint(ctx, dir / "ckpt", tr, state_of(s, seen));
    CHECK(where == dir / "ckpt" / "step_00000003");
  }
  {
    // New objects with another initialisation seed and a fresh sampler: everything that
    // matters must come from the checkpoint.
    trainer_t tr(ctx, test_config(999));
    data::window_sampler s(tokens.size(), tr.window(), 7);
    const auto info = io::resume_checkpoint(ctx, dir / "ckpt", tr);
    CHECK(info.step == 3);
    CHECK(info.optimizer_step == 3);
    CHECK(info.state.tokens == 3u * 2 * 3 * 13);
    CHECK(info.warnings.empty());
    CHECK(tr.step_count() == 3);
    CHECK(tr.optimizer().step() == 3);
    s.set_position(info.state.data.at("position").get<std::uint64_t>());
    for (int i = 0; i < 3; ++i) resumed.push_back(step(ctx, tr, s, tokens).loss);
    REQUIRE(resumed.size() == 6);
    for (int i = 0; i < 6; ++i) {
      INFO("step ", i, ": ", straight[i], " vs ", resumed[i]);
      CHECK(std::memcmp(&straight[i], &resumed[i], sizeof(double)) == 0);
    }
    CHECK(same_bits(tr.model().parameters().span(), straight_params));
    CHECK(same_bits(tr.optimizer().first_moment().span(), straight_m));
    CHECK(same_bits(tr.optimizer().second_moment().span(), straight_v));
  }
  CHECK(straight[5] < straight[0]);  // it trained
}

TEST_CASE("checkpoint: the manifest records state, shapes and checksums; the file holds the tensors") {
  fixture f;
  const auto j = io::verify_checkpoint(f.root / "step_00000002");
  CHECK(j.at("step") == 2);
  CHECK(j.at("optimizer_step") == 2);
  CHECK(j.at("model").at("name") == "tiny");
  CHECK(j.at("model").at("vocab_padded") == 64);
  CHECK(j.at("layout").at("tp") == 1);
  CHECK(j.at("layout").at("pp") == 1);
  CHECK(j.at("precision").at("storage") == "F32");
  CHECK(j.at("precision").at("master_copy") == false);
  CHECK(j.at("lr_schedule").at("decay_steps") == 6);
  CHECK(j.at("lr_schedule").at("next_lr").get<double>() == f.tr.config().schedule(2));
  CHECK(j.at("loss_scaler").at("enabled") == false);
  CHECK(j.at("data").at("position") == f.sampler.position());
  CHECK(j.at("rng").at("init_seed") == 1337);
  CHECK(j.at("library").at("version") == "0.1.0");
  CHECK(j.at("trainer").at("grad_accum") == 2);
  // tensors: logical shape = the unsplit table's, with the shard rule
  REQUIRE(j.at("tensors").size() == models::num_params<M>);
  const auto& qkv = j.at("tensors").at(int(models::param::qkv_w));
  CHECK(qkv.at("name") == "qkv_w");
  CHECK(qkv.at("shard") == "column");
  CHECK(qkv.at("logical_shape") == nlohmann::json({2, 72, 24}));
  CHECK(j.at("tensors").at(0).at("shard") == "vocab");
  // files: the size on disk
  REQUIRE(j.at("files").size() == 1);
  CHECK(j.at("files").at(0).at("path") == "model-tp00-pp00.safetensors");
  CHECK(j.at("files").at(0).at("bytes") == fs::file_size(f.file(2)));
  CHECK(j.at("files").at(0).at("xxh3_64").get<std::string>().size() == 16);
  // tensors in the file equal the trainer's, bit for bit
  const io::safetensors_reader r(f.file(2));
  CHECK(r.tensors().size() == 3u * int(models::num_params<M>));
  const auto& opt = f.tr.optimizer();
  for (int k = 0; k < int(models::num_params<M>); ++k) {
    const std::string name(trainer_t::model_t::table[std::size_t(k)].name);
    const auto n = trainer_t::model_t::table[std::size_t(k)].size(), off = trainer_t::model_t::offsets[std::size_t(k)];
    CHECK(same_bits(r.read<float>("param." + name), f.tr.model().parameter(std::size_t(k)).span()));
    CHECK(same_bits(r.read<float>("adam_m." + name), opt.first_moment().subview(off, n).span()));
    CHECK(same_bits(r.read<float>("adam_v." + name), opt.second_moment().subview(off, n).span()));
  }
  CHECK(latest_of(f.root) == "step_00000002\n");
}

TEST_CASE("checkpoint: keeps the newest K, never a later branch, and latest names the newest") {
  context<device::cpu> ctx;
  temp_dir dir;
  trainer_t tr(ctx, test_config());
  io::checkpoint_options opt;
  opt.keep = 3;
  for (long s : {1, 2, 3, 4, 5, 6, 7}) {
    tr.set_step_count(s);
    io::save_checkpoint(ctx, dir / "c", tr, {}, opt);
  }
  auto steps = [&] {
    std::vector<long> v;
    for (const auto& e : io::list_checkpoints(dir / "c")) v.push_back(e.step);
    return v;
  };
  CHECK(steps() == std::vector<long>{5, 6, 7});
  CHECK(latest_of(dir / "c") == "step_00000007\n");
  // Resumed from step 5 and saved again at 6: step 7 (a later branch) stays, 6 is replaced.
  tr.set_step_count(6);
  io::save_checkpoint(ctx, dir / "c", tr, {}, opt);
  CHECK(steps() == std::vector<long>{5, 6, 7});
  CHECK(latest_of(dir / "c") == "step_00000006\n");
  CHECK(io::find_checkpoint(dir / "c") == dir / "c" / "step_00000006");  // latest wins over the later branch
  opt.keep = 0;  // keep all
  tr.set_step_count(8);
  io::save_checkpoint(ctx, dir / "c", tr, {}, opt);
  CHECK(steps() == std::vector<long>{5, 6, 7, 8});
  for (const auto& e : fs::directory_iterator(dir / "c")) CHECK(e.path().filename().string().rfind(".tmp", 0) != 0);
}

TEST_CASE("checkpoint: a failure at any stage of a save leaves the previous checkpoint and latest intact") {
  fixture f;
  const auto before = snapshot(f.root);
  for (const char* stage : {"file_written", "manifest_written"}) {
    CAPTURE(stage);
    io::checkpoint_options opt;
    opt.on_stage = [&](std::string_view s) {
      if (s == stage) throw std::runtime_error("injected failure");
    };
    step(f.ctx, f.tr, f.sampler, f.tokens);
    std::string what;
    try {
      io::save_checkpoint(f.ctx, f.root, f.tr, {}, opt);
    } catch (const error& e) {
      what = e.what();
    }
    CHECK(what.find("injected failure") != std::string::npos);
    CHECK(what.find("previous checkpoint") != std::string::npos);
    CHECK(snapshot(f.root) == before);  // not a byte changed, no temporary left
    CHECK(io::find_checkpoint(f.root) == f.root / "step_00000002");
  }
  // After the rename, before latest: the new checkpoint is complete, latest still names step 2.
  io::checkpoint_options opt;
  opt.on_stage = [&](std::string_view s) {
    if (s == "committed") throw std::runtime_error("injected failure");
  };
  CHECK_THROWS_AS(io::save_checkpoint(f.ctx, f.root, f.tr, {}, opt), error);
  CHECK(latest_of(f.root) == "step_00000002\n");
  CHECK(io::find_checkpoint(f.root) == f.root / "step_00000002");
  CHECK_NOTHROW(io::verify_checkpoint(f.root / "step_00000004"));
  for (const auto& [name, bytes] : before) CHECK(read_bytes(f.root / name) == bytes);
}

TEST_CASE("checkpoint: a process killed at any stage of a save leaves a resumable previous checkpoint") {
  for (const char* stage : {"file_written", "manifest_written", "committed", "latest_updated"}) {
    CAPTURE(stage);
    fixture f;
    const auto before = snapshot(f.root);
    step(f.ctx, f.tr, f.sampler, f.tokens);
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {  // the child saves and dies at `stage`, with no chance to clean up
      io::checkpoint_options opt;
      opt.on_stage = [&](std::string_view s) {
        if (s == stage) ::raise(SIGKILL);
      };
      try {
        io::save_checkpoint(f.ctx, f.root, f.tr, {}, opt);
      } catch (...) {
      }
      ::_exit(3);  // not reached when the stage was
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGKILL);
    for (const auto& [name, bytes] : before)
      if (name != "latest") CHECK(read_bytes(f.root / name) == bytes);  // step 1 and 2 untouched
    const bool new_latest = std::string_view(stage) == "latest_updated";
    CHECK(latest_of(f.root) == (new_latest ? "step_00000003\n" : "step_00000002\n"));
    const auto chosen = io::find_checkpoint(f.root);
    CHECK(chosen == f.root / (new_latest ? "step_00000003" : "step_00000002"));
    trainer_t other(f.ctx, test_config(5));
    CHECK(io::load_checkpoint(f.ctx, chosen, other).step == (new_latest ? 3 : 2));
    // The next save cleans up whatever the crash left behind.
    io::save_checkpoint(f.ctx, f.root, f.tr, {});
    for (const auto& e : fs::directory_iterator(f.root)) CHECK(e.path().filename().string()[0] != '.');
  }
}

// A process killed while it replaces `latest` (temporary file written, not yet renamed) leaves
// `latest.tmp.<pid>` beside it; tests/cli/kill_storm.py found such files piling up, one per
// unlucky kill. The next save must remove it, and resume must ignore it.
TEST_CASE("checkpoint: the next save removes the latest.tmp.<pid> a process killed while replacing latest left") {
  fixture f;
  step(f.ctx, f.tr, f.sampler, f.tokens);
  const fs::path left = f.root / "latest.tmp.4194000";  // what atomic_replace leaves when killed before its rename
  write_bytes(left, "step_00000003\n");
  CHECK(io::find_checkpoint(f.root) == f.root / "step_00000002");  // `latest` still names step 2
  io::save_checkpoint(f.ctx, f.root, f.tr, {});
  CHECK_FALSE(fs::exists(left));
  CHECK(latest_of(f.root) == "step_00000003\n");
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(f.root)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"latest", "step_00000001", "step_00000002", "step_00000003"});
}

TEST_CASE("checkpoint: damaged checkpoints are detected; resume falls back to the previous one with a warning") {
  SUBCASE("one flipped byte in the rank file") {
    fixture f;
    auto bytes = read_bytes(f.file(2));
    bytes[bytes.size() / 2] ^= 0x10;
    write_bytes(f.file(2), bytes);
    CHECK(error_of([&] { io::verify_checkpoint(f.root / "step_00000002"); }).find("fails its checksum") != std::string::npos);
    std::vector<std::string> warnings;
    CHECK(io::find_checkpoint(f.root, [&](const std::string& w) { warnings.push_back(w); }) == f.root / "step_00000001");
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].find("step_00000002") != std::string::npos);
    CHECK(warnings[0].find("falling back") != std::string::npos);
    trainer_t other(f.ctx, test_config());
    CHECK(io::resume_checkpoint(f.ctx, f.root, other).step == 1);
  }
  SUBCASE("a truncated rank file") {
    fixture f;
    fs::resize_file(f.file(2), fs::file_size(f.file(2)) - 100);
    CHECK(error_of([&] { io::verify_checkpoint(f.root / "step_00000002"); }).find("truncated") != std::string::npos);
    CHECK(io::find_checkpoint(f.root) == f.root / "step_00000001");
  }
  SUBCASE("a missing rank file") {
    fixture f;
    fs::remove(f.file(2));
    CHECK(error_of([&] { io::verify_checkpoint(f.root / "step_00000002"); }).find("is missing") != std::string::npos);
    CHECK(io::find_checkpoint(f.root) == f.root / "step_00000001");
  }
  SUBCASE("a deleted manifest") {
    fixture f;
    fs::remove(f.manifest(2));
    CHECK(error_of([&] { io::verify_checkpoint(f.root / "step_00000002"); }).find("no manifest.json") != std::string::npos);
    CHECK(io::find_checkpoint(f.root) == f.root / "step_00000001");
  }
  SUBCASE("an edited manifest (checksum mismatch)") {
    fixture f;
    auto text = read_bytes(f.manifest(2));
    const auto at = text.find("\"step\": 2");
    REQUIRE(at != std::string::npos);
    text.replace(at, 9, "\"step\": 9");
    write_bytes(f.manifest(2), text);
    CHECK(error_of([&] { io::verify_checkpoint(f.root / "step_00000002"); }).find("manifest.json fails its checksum") !=
          std::string::npos);
    CHECK(io::find_checkpoint(f.root) == f.root / "step_00000001");
  }
  SUBCASE("a manifest that is not JSON") {
    fixture f;
    write_bytes(f.manifest(2), "{\"format\": \"loom.checkpoint\", ");
    CHECK(error_of([&] { io::verify_checkpoint(f.root / "step_00000002"); }).find("not valid JSON") != std::string::npos);
  }
  SUBCASE("latest names nothing: the newest checkpoint that verifies, with a warning") {
    fixture f;
    write_bytes(f.root / "latest", "garbage\n");
    std::vector<std::string> warnings;
    CHECK(io::find_checkpoint(f.root, [&](const std::string& w) { warnings.push_back(w); }) == f.root / "step_00000002");
    CHECK(warnings.size() == 1);
  }
  SUBCASE("a checkpoint directory given directly is not replaced by another one") {
    fixture f;
    fs::remove(f.manifest(2));
    CHECK_THROWS_AS(io::find_checkpoint(f.root / "step_00000002"), input_error);  // it has no manifest: not a checkpoint dir
    CHECK(io::find_checkpoint(f.root / "step_00000001") == f.root / "step_00000001");
  }
  SUBCASE("every checkpoint damaged") {
    fixture f;
    fs::remove(f.manifest(1));
    fs::remove(f.manifest(2));
    std::vector<std::string> warnings;
    const auto what = error_of([&] { io::find_checkpoint(f.root, [&](const std::string& w) { warnings.push_back(w); }); });
    CHECK(what.find("no usable checkpoint") != std::string::npos);
    // step 2 falls back to step 1; step 1, the last candidate, promises no further fallback
    REQUIRE(warnings.size() == 2);
    CHECK(warnings[0].find("step_00000002") != std::string::npos);
    CHECK(warnings[0].find("falling back") != std::string::npos);
    CHECK(warnings[1].find("step_00000001") != std::string::npos);
    CHECK(warnings[1].find("no earlier checkpoint") != std::string::npos);
    CHECK(what.find("step_00000001") != std::string::npos);
    CHECK(what.find("step_00000002") != std::string::npos);
  }
}

TEST_CASE("checkpoint: --resume on a missing, empty or unrelated directory is a clear input_error") {
  temp_dir dir;
  CHECK(error_of([&] { io::find_checkpoint(dir / "missing"); }).find("does not exist") != std::string::npos);
  fs::create_directory(dir / "empty");
  CHECK(error_of([&] { io::find_checkpoint(dir / "empty"); }).find("holds no checkpoint") != std::string::npos);
  fs::create_directory(dir / "unrelated");
  write_bytes(dir / "unrelated" / "notes.txt", "hello");
  fs::create_directory(dir / "unrelated" / "stepping");
  CHECK(error_of([&] { io::find_checkpoint(dir / "unrelated"); }).find("holds no checkpoint") != std::string::npos);
}

TEST_CASE("checkpoint: another model config or precision, or a missing file, is refused before anything is loaded") {
  fixture f;
  const auto dir2 = f.root / "step_00000002";
  SUBCASE("another model") {
    context<device::cpu> ctx;
    train::trainer_config cfg;
    cfg.schedule = {1e-3, 1e-4, 0, 10};
    train::trainer<models::char_tiny, P, 2, 8> other(ctx, cfg);
    const auto before = std::vector<float>(other.model().parameters().begin(), other.model().parameters().end());
    const auto what = error_of([&] { io::load_checkpoint(ctx, dir2, other); });
    CHECK(what.find("model tiny (n_head = 3)") != std::string::npos);
    CHECK(what.find("model char_tiny (n_head = 2)") != std::string::npos);
    CHECK(same_bits(other.model().parameters().span(), before));
    CHECK(other.step_count() == 0);
  }
  auto rewrite = [&](auto&& edit) {  // edit the manifest and re-seal its checksum
    auto j = nlohmann::json::parse(read_bytes(f.manifest(2)));
    edit(j);
    j["checksum"]["xxh3_64"] = io::detail::manifest_checksum(j);
    write_bytes(f.manifest(2), j.dump(2));
  };
  trainer_t other(f.ctx, test_config(3));
  SUBCASE("a layout whose files are not there (another layout with its files reshards: test_checkpoint_parallel)") {
    rewrite([](nlohmann::json& j) { j["layout"]["tp"] = 2; });
    const auto what = error_of([&] { io::load_checkpoint(f.ctx, dir2, other); });
    CHECK(what.find("layout tp=2 pp=1 needs a model file of rank tp=1 pp=0") != std::string::npos);
  }
  SUBCASE("another precision") {
    rewrite([](nlohmann::json& j) { j["precision"]["storage"] = "BF16"; });
    CHECK(error_of([&] { io::load_checkpoint(f.ctx, dir2, other); }).find("storage precision BF16") != std::string::npos);
  }
  SUBCASE("a manifest from a newer loom") {
    rewrite([](nlohmann::json& j) { j["format_version"] = 99; });
    CHECK(error_of([&] { io::load_checkpoint(f.ctx, dir2, other); }).find("version 99") != std::string::npos);
  }
  SUBCASE("integers a file cannot hold as their type are errors, not conversions (a 64-digit version, a negative size)") {
    rewrite([](nlohmann::json& j) {
      j["format_version"] = nlohmann::json::parse("1331000000000000000000000000000000000000000000000000000000000000");
    });
    CHECK(error_of([&] { io::load_checkpoint(f.ctx, dir2, other); }).find("\"format_version\" is number") != std::string::npos);
    nlohmann::json bytes;
    rewrite([&](nlohmann::json& j) { j["format_version"] = 1; bytes = j["files"][0]["bytes"]; j["files"][0]["bytes"] = -5; });
    CHECK(error_of([&] { io::verify_checkpoint(dir2); }).find("\"bytes\" is -5, outside the range") != std::string::npos);
    rewrite([&](nlohmann::json& j) { j["files"][0]["bytes"] = bytes; j["layout"]["tp"] = 4294967297LL; });
    CHECK(error_of([&] { io::load_checkpoint(f.ctx, dir2, other); }).find("\"tp\" is 4294967297, outside the range") != std::string::npos);
  }
  SUBCASE("other schedule settings load, with warnings") {
    auto cfg = test_config();
    cfg.schedule.decay_steps = 100;
    trainer_t longer(f.ctx, cfg);
    const auto info = io::load_checkpoint(f.ctx, dir2, longer);
    REQUIRE(info.warnings.size() == 1);
    CHECK(info.warnings[0].find("decay_steps") != std::string::npos);
  }
  CHECK(other.step_count() == 0);
}

TEST_CASE("checkpoint: NaN weights are never written") {
  fixture f;
  const auto before = snapshot(f.root);
  f.tr.model().parameter(models::param::fc_w)[5] = std::numeric_limits<float>::quiet_NaN();
  f.tr.set_step_count(3);
  CHECK_THROWS_AS(io::save_checkpoint(f.ctx, f.root, f.tr, {}), numeric_error);
  CHECK(snapshot(f.root) == before);
}

TEST_CASE("checkpoint: an unwritable root is a clear error and writes nothing") {
  if (::geteuid() == 0) return;  // root ignores directory permissions
  fixture f;
  fs::permissions(f.root, fs::perms::owner_read | fs::perms::owner_exec);
  f.tr.set_step_count(3);
  CHECK_THROWS_AS(io::save_checkpoint(f.ctx, f.root, f.tr, {}), input_error);
  fs::permissions(f.root, fs::perms::owner_all);
  CHECK(latest_of(f.root) == "step_00000002\n");
}

// ---------------------------------------------------------------------------------------------
// Hugging Face GPT-2
// ---------------------------------------------------------------------------------------------

TEST_CASE("gpt2 export: names and shapes of GPT-2 small match the Hugging Face checkpoint (no PyTorch)") {
  const auto t = io::gpt2_tensors<models::gpt2_small>();
  REQUIRE(t.size() == 2 + 12 * 12 + 2);  // the hub's model.safetensors without the attn.bias buffers
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> head = {
      {"wte.weight", {50257, 768}},           {"wpe.weight", {1024, 768}},
      {"h.0.ln_1.weight", {768}},             {"h.0.ln_1.bias", {768}},
      {"h.0.attn.c_attn.weight", {768, 2304}}, {"h.0.attn.c_attn.bias", {2304}},
      {"h.0.attn.c_proj.weight", {768, 768}}, {"h.0.attn.c_proj.bias", {768}},
      {"h.0.ln_2.weight", {768}},             {"h.0.ln_2.bias", {768}},
      {"h.0.mlp.c_fc.weight", {768, 3072}},   {"h.0.mlp.c_fc.bias", {3072}},
      {"h.0.mlp.c_proj.weight", {3072, 768}}, {"h.0.mlp.c_proj.bias", {768}},
      {"h.1.ln_1.weight", {768}}};
  for (std::size_t i = 0; i < head.size(); ++i) {
    CHECK(t[i].name == head[i].first);
    CHECK(t[i].shape == head[i].second);
  }
  CHECK(t[t.size() - 3].name == "h.11.mlp.c_proj.bias");
  CHECK(t[t.size() - 2].name == "ln_f.weight");
  CHECK(t.back().name == "ln_f.bias");
  std::size_t total = 0;
  for (const auto& x : t) {
    std::size_t n = 1;
    for (auto d : x.shape) n *= std::size_t(d);
    total += n;
  }
  CHECK(total == 124'439'808);  // GPT-2 small as published (HF GPT2Model.num_parameters())
  const auto cfg = io::gpt2_config<models::gpt2_small>();
  CHECK(cfg.at("n_embd") == 768);
  CHECK(cfg.at("vocab_size") == 50257);
  CHECK(cfg.at("n_positions") == 1024);
  CHECK(cfg.at("activation_function") == "gelu_new");
}

TEST_CASE("gpt2 export: Conv1D orientation, F32, config.json; import restores the model and its logits") {
  context<device::cpu> ctx;
  temp_dir dir;
  using G = trainer_t::model_t;
  const G a(ctx, 21);
  io::export_gpt2(ctx, a, dir / "hf");
  const io::safetensors_reader r(dir / "hf" / "model.safetensors");
  CHECK(r.metadata().at("format") == "pt");
  const auto expected = io::gpt2_tensors<M>();
  REQUIRE(r.tensors().size() == expected.size());
  for (const auto& t : expected) {
    REQUIRE(r.has(t.name));
    CHECK(r.info(t.name).shape == t.shape);
    CHECK(r.info(t.name).dtype == "F32");
  }
  // h.1.attn.c_attn.weight[i][o] == qkv_w[layer 1][o][i]; C = 24
  const auto w = r.read<float>("h.1.attn.c_attn.weight");
  const auto qkv = a.parameter(models::param::qkv_w);
  for (int o : {0, 5, 30, 71})
    for (int i : {0, 7, 23}) CHECK(w[std::size_t(i) * 72 + o] == qkv[std::size_t(72 * 24) + std::size_t(o) * 24 + i]);
  const auto fcp = r.read<float>("h.0.mlp.c_proj.weight");  // (96, 24) = fcproj_w[0]^T, fcproj_w (24, 96)
  CHECK(fcp[std::size_t(50) * 24 + 3] == a.parameter(models::param::fcproj_w)[std::size_t(3) * 96 + 50]);
  const auto wte = r.read<float>("wte.weight");
  CHECK(wte.size() == std::size_t(M::vocab) * 24);  // padding rows are not exported
  CHECK(wte[std::size_t(60) * 24 + 23] == a.parameter(models::param::wte)[std::size_t(60) * 24 + 23]);
  const auto cfg = nlohmann::json::parse(read_bytes(dir / "hf" / "config.json"));
  CHECK(cfg.at("model_type") == "gpt2");
  CHECK(cfg.at("n_layer") == 2);
  CHECK(cfg.at("n_head") == 3);
  CHECK(cfg.at("n_embd") == 24);
  CHECK(cfg.at("n_positions") == 16);
  CHECK(cfg.at("vocab_size") == 61);
  CHECK(cfg.at("tie_word_embeddings") == true);

  G b(ctx, 22);
  io::import_gpt2(ctx, b, dir / "hf");
  for (int k = 0; k < int(models::num_params<M>); ++k) {
    CAPTURE(k);
    auto pa = a.parameter(std::size_t(k)).span(), pb = b.parameter(std::size_t(k)).span();
    if (k == int(models::param::wte)) {
      CHECK(same_bits(pa.first(std::size_t(M::vocab) * 24), pb.first(std::size_t(M::vocab) * 24)));
      for (std::size_t i = std::size_t(M::vocab) * 24; i < pb.size(); ++i) CHECK(pb[i] == 0.0f);
    } else {
      CHECK(same_bits(pa, pb));
    }
  }
  // Same logits over the real vocabulary (padding columns differ: they are never predicted).
  G::activations<2, 9> acts_a(ctx), acts_b(ctx);
  std::vector<std::int32_t> in(18);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = std::int32_t(random_below(M::vocab, 4, 4, i));
  a.forward(ctx, acts_a, in.data(), nullptr, 2, 9);
  b.forward(ctx, acts_b, in.data(), nullptr, 2, 9);
  for (std::size_t row = 0; row < 18; ++row)
    CHECK(std::memcmp(acts_a.logits() + row * 64, acts_b.logits() + row * 64, M::vocab * sizeof(float)) == 0);
}

TEST_CASE("gpt2 import: bad input is a clear input_error and leaves the model unchanged") {
  context<device::cpu> ctx;
  temp_dir dir;
  using G = trainer_t::model_t;
  const G a(ctx, 21);
  io::export_gpt2(ctx, a, dir / "hf");
  G b(ctx, 22);
  const std::vector<float> before(b.parameters().begin(), b.parameters().end());
  CHECK(error_of([&] { io::import_gpt2(ctx, b, dir / "missing"); }).find("config.json") != std::string::npos);
  auto cfg = nlohmann::json::parse(read_bytes(dir / "hf" / "config.json"));
  cfg["loom"].erase("model_safetensors_xxh3_64");  // the model files below are made by hand
  cfg["n_layer"] = 3;
  write_bytes(dir / "hf" / "config.json", cfg.dump());
  CHECK(error_of([&] { io::import_gpt2(ctx, b, dir / "hf"); }).find("n_layer = 3") != std::string::npos);
  cfg["n_layer"] = 2;
  cfg["activation_function"] = "relu";
  write_bytes(dir / "hf" / "config.json", cfg.dump());
  CHECK(error_of([&] { io::import_gpt2(ctx, b, dir / "hf"); }).find("relu") != std::string::npos);
  cfg["activation_function"] = "gelu_new";
  write_bytes(dir / "hf" / "config.json", cfg.dump());
  {  // a tensor missing, and one with the wrong shape
    const io::safetensors_reader r(dir / "hf" / "model.safetensors");
    io::safetensors_writer w1, w2, w3;
    for (const auto& t : r.tensors()) {
      const auto v = r.read<float>(t.name);
      if (t.name != "h.1.ln_2.bias") w1.add(t.name, t.shape, v);
      w2.add(t.name, t.name == "wpe.weight" ? std::vector<std::int64_t>{24, 16} : t.shape, v);
      w3.add("transformer." + t.name, t.shape, v);
    }
    auto head = r.read<float>("wte.weight");
    head[3] += 1.0f;
    w3.add("lm_head.weight", {M::vocab, 24}, head);
    w1.write(dir / "hf" / "one.safetensors");
    w2.write(dir / "hf" / "two.safetensors");
    w3.write(dir / "hf" / "three.safetensors");
  }
  fs::rename(dir / "hf" / "model.safetensors", dir / "hf" / "good.safetensors");
  fs::copy_file(dir / "hf" / "one.safetensors", dir / "hf" / "model.safetensors");
  CHECK(error_of([&] { io::import_gpt2(ctx, b, dir / "hf"); }).find("no tensor 'h.1.ln_2.bias'") != std::string::npos);
  fs::copy_file(dir / "hf" / "two.safetensors", dir / "hf" / "model.safetensors", fs::copy_options::overwrite_existing);
  CHECK(error_of([&] { io::import_gpt2(ctx, b, dir / "hf"); }).find("wpe.weight") != std::string::npos);
  fs::copy_file(dir / "hf" / "three.safetensors", dir / "hf" / "model.safetensors", fs::copy_options::overwrite_existing);
  CHECK(error_of([&] { io::import_gpt2(ctx, b, dir / "hf"); }).find("untied") != std::string::npos);
  CHECK(same_bits(b.parameters().span(), before));
  // The "transformer." prefix of save_pretrained is accepted.
  fs::copy_file(dir / "hf" / "good.safetensors", dir / "hf" / "model.safetensors", fs::copy_options::overwrite_existing);
  CHECK_NOTHROW(io::import_gpt2(ctx, b, dir / "hf"));
}

// ---------------------------------------------------------------------------------------------
// Resharding (pure functions; TP/PP execution does not exist yet)
// ---------------------------------------------------------------------------------------------

namespace {
/// A model that tp = 2 and pp = 2 can split (4 heads, 4 layers); odd-ish sizes otherwise.
struct reshard_model {
  static constexpr std::string_view name = "reshard_model";
  static constexpr int n_layer = 4, n_head = 4, d_model = 20, max_seq = 7, vocab = 37, vocab_padded = 40;
};
template <class L>
std::vector<std::vector<std::byte>> shards_of(const io::shard_geometry& g, const std::vector<std::byte>& logical) {
  std::vector<std::vector<std::byte>> out;  // index pp * tp + tp_rank
  for (int s = 0; s < L::pp; ++s)
    for (int r = 0; r < L::tp; ++r) out.push_back(io::shard_tensor(g, 4, logical, L::tp, L::pp, r, s));
  return out;
}
}  // namespace

TEST_CASE("reshard: shards match the layout's parameter table; gather inverts shard; (2,2) -> (1,2) -> (1,1)") {
  using RM = reshard_model;
  constexpr auto t22 = models::param_table<RM, parallel::layout<2, 2>>();
  constexpr auto t12 = models::param_table<RM, parallel::layout<1, 2>>();
  for (int k = 0; k < int(models::num_params<RM>); ++k) {
    CAPTURE(k);
    const auto g = io::geometry_of<RM>(k);
    std::vector<std::byte> logical(g.logical_elems() * 4);
    for (std::size_t i = 0; i < g.logical_elems(); ++i) {
      const float v = float(random_normal(3, std::uint64_t(k), i));
      std::memcpy(logical.data() + i * 4, &v, 4);
    }
    const auto s22 = shards_of<parallel::layout<2, 2>>(g, logical);
    for (const auto& s : s22) CHECK(s.size() == t22[std::size_t(k)].size() * 4);
    const auto back = io::gather_tensor(
        g, 4, [&](int r, int s) { return std::span<const std::byte>(s22[std::size_t(s * 2 + r)]); }, 2, 2);
    CHECK(back == logical);
    const auto to12 = io::reshard_tensor(
        g, 4, [&](int r, int s) { return std::span<const std::byte>(s22[std::size_t(s * 2 + r)]); }, 2, 2, 1, 2);
    REQUIRE(to12.size() == 2);
    for (int s = 0; s < 2; ++s) {
      REQUIRE(to12[std::size_t(s)].size() == 1);
      CHECK(to12[std::size_t(s)][0].size() == t12[std::size_t(k)].size() * 4);
      CHECK(to12[std::size_t(s)][0] == io::shard_tensor(g, 4, logical, 1, 2, 0, s));
    }
    const auto to11 = io::reshard_tensor(
        g, 4, [&](int, int s) { return std::span<const std::byte>(to12[std::size_t(s)][0]); }, 1, 2, 1, 1);
    CHECK(to11[0][0] == logical);
  }
}

TEST_CASE("reshard: a tensor-parallel rank owns whole heads of q, k and v, whole vocabulary rows, and its input columns") {
  using RM = reshard_model;
  constexpr long C = RM::d_model;
  auto iota_tensor = [](const io::shard_geometry& g) {  // element value = its logical index
    std::vector<std::byte> b(g.logical_elems() * 4);
    for (std::size_t i = 0; i < g.logical_elems(); ++i) {
      const float v = float(i);
      std::memcpy(b.data() + i * 4, &v, 4);
    }
    return b;
  };
  auto at = [](const std::vector<std::byte>& b, std::size_t i) {
    float v;
    std::memcpy(&v, b.data() + i * 4, 4);
    return std::size_t(v);
  };
  // qkv_w (layers 4, rows 3C, cols C) under tp = 2, pp = 2: rank 1 of stage 1 holds layers 2, 3;
  // its local row j of section q (k, v) is logical row q*C + C/2 + j.
  const auto g = io::geometry_of<RM>(int(models::param::qkv_w));
  const auto s = io::shard_tensor(g, 4, iota_tensor(g), 2, 2, 1, 1);
  const std::size_t layer = std::size_t(3 * C) * C;
  CHECK(at(s, 0) == 2 * layer + std::size_t(C / 2) * C);                              // layer 2, q row C/2
  CHECK(at(s, std::size_t(C / 2) * C) == 2 * layer + std::size_t(C + C / 2) * C);      // first k row of rank 1
  CHECK(at(s, std::size_t(C) * C + 3) == 2 * layer + std::size_t(2 * C + C / 2) * C + 3);  // first v row, col 3
  // attproj_w is row-parallel: rank 1 holds input columns [C/2, C) of every row.
  const auto gp = io::geometry_of<RM>(int(models::param::attproj_w));
  const auto sp = io::shard_tensor(gp, 4, iota_tensor(gp), 2, 1, 1, 0);
  CHECK(at(sp, 0) == std::size_t(C / 2));
  CHECK(at(sp, std::size_t(C / 2)) == std::size_t(C) + C / 2);  // next row
  // wte is vocabulary-parallel and held whole by every stage.
  const auto gw = io::geometry_of<RM>(int(models::param::wte));
  const auto sw = io::shard_tensor(gw, 4, iota_tensor(gw), 2, 2, 1, 1);
  CHECK(at(sw, 0) == std::size_t(RM::vocab_padded / 2) * C);
  // A split that does not divide is refused.
  CHECK_THROWS_AS(io::shard_tensor(g, 4, iota_tensor(g), 3, 1, 0, 0), input_error);
}

TEST_CASE("async checkpoint: training goes on while it is written; the files equal a synchronous save's") {
  context<device::cpu> ctx;
  temp_dir dir;
  const auto tokens = corpus();
  trainer_t tr(ctx, test_config());
  data::window_sampler s(tokens.size(), tr.window(), 7);
  for (int i = 0; i < 3; ++i) step(ctx, tr, s, tokens);
  const std::vector<float> at3(tr.model().parameters().begin(), tr.model().parameters().end());
  io::save_checkpoint(ctx, dir / "sync", tr, state_of(s, 0));
  io::async_checkpointer<trainer_t> saver;
  CHECK_FALSE(saver.wait().has_value());  // nothing in flight
  saver.save(ctx, dir / "async", tr, state_of(s, 0));
  for (int i = 0; i < 2; ++i) step(ctx, tr, s, tokens);  // mutates the trainer while the save runs
  const auto where = saver.wait();
  REQUIRE(where.has_value());
  CHECK(*where == dir / "async" / "step_00000003");
  CHECK_FALSE(saver.pending());
  const std::string file = "step_00000003/" + io::checkpoint_file_name(0, 0);
  CHECK(read_bytes(dir / "async" / file) == read_bytes(dir / "sync" / file));
  trainer_t other(ctx, test_config(8));
  CHECK(io::resume_checkpoint(ctx, dir / "async", other).step == 3);
  CHECK(same_bits(other.model().parameters().span(), at3));
  // A background failure surfaces in wait(), once; the previous checkpoint stays.
  io::checkpoint_options opt;
  opt.on_stage = [](std::string_view st) {
    if (st == "manifest_written") throw std::runtime_error("disk on fire");
  };
  saver.save(ctx, dir / "async", tr, state_of(s, 0), opt);
  std::string what;
  try {
    saver.wait();
  } catch (const error& e) {
    what = e.what();
  }
  CHECK(what.find("disk on fire") != std::string::npos);
  CHECK_FALSE(saver.wait().has_value());
  CHECK(latest_of(dir / "async") == "step_00000003\n");
  saver.save(ctx, dir / "async", tr, state_of(s, 0));
  CHECK(saver.wait() == dir / "async" / "step_00000005");
}
