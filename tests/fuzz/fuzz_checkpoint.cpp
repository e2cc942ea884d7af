// libFuzzer target for the parsers of untrusted checkpoint bytes: the safetensors header
// (io::safetensors_reader), the checkpoint manifest (io::verify_checkpoint,
// io::find_checkpoint), the ZeRO-1 shard ranges (io::detail::gather_zero1) and the manifest's
// identity and scalars as a resume reads them (io::detail::check_identity, read_scalars).
//
// Input: byte 0 selects the target, the rest is the file content.
//   0  a safetensors file: open it, read every tensor's bytes, read F32/I64 tensors converted
//   1  manifest.json of a checkpoint directory, with its checksum recomputed by the harness when
//      the input is a JSON object (so the fuzzer reaches the fields behind the checksum); the
//      directory also holds a valid 8-byte-header file "f.safetensors"
//   2  a ZeRO-1 shard "optim-tp00-pp00-dp00.safetensors" gathered into 64-element moments
//   3  a manifest's JSON checked against a running fp32 model on dp = 2 with a loss scaler:
//      model dimensions, layout, precision, step counts, dp, loss scaler state
// What must hold: malformed input ends in loom::input_error, never a crash, undefined
// behaviour (a float-to-integer conversion of a manifest number), a leak or a read outside the
// file (ASan + UBSan, tests/fuzz/run.sh checkpoint).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <loom/io/checkpoint.hpp>

#include "fuzz_common.hpp"

namespace {

void read_safetensors(const loom_fuzz::fs::path& p) {
  const loom::io::safetensors_reader r(p);
  std::size_t sum = 0;
  for (const auto& t : r.tensors()) {
    for (const std::byte b : r.bytes(t.name)) sum += std::size_t(b);
    if (t.dtype == "F32" || t.dtype == "F16" || t.dtype == "BF16") sum += r.read<float>(t.name).size();
    if (t.dtype == "I64") sum += r.read<std::int64_t>(t.name).size();
  }
  (void)r.metadata();
  (void)sum;
  loom_fuzz::accepted("safetensors file");
}

void verify_manifest(const loom_fuzz::fs::path& root, std::string text) {
  const auto dir = root / "step_00000001";
  loom_fuzz::fs::create_directories(dir);
  try {  // recompute the checksum so the fields behind it are reached
    auto j = nlohmann::json::parse(text);
    if (j.is_object()) {
      j["checksum"] = {{"xxh3_64", loom::io::detail::manifest_checksum(j)}};
      text = j.dump();
    }
  } catch (const nlohmann::json::exception&) {
  }
  loom_fuzz::write_file(dir / "manifest.json", text);
  const char header[16] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
  loom_fuzz::write_file(dir / "f.safetensors", header, sizeof header);
  loom_fuzz::write_file(root / "latest", "step_00000001\n");
  try {
    const auto j = loom::io::verify_checkpoint(dir);
    (void)loom::io::detail::manifest_files(j, dir);
    loom_fuzz::accepted("manifest");
  } catch (const loom::input_error& e) {
    loom_fuzz::rejected(e);
  }
  (void)loom::io::find_checkpoint(root);
}

void gather_shard(const loom_fuzz::fs::path& dir, std::string_view body) {
  loom_fuzz::write_file(dir / "optim-tp00-pp00-dp00.safetensors", body);
  loom::io::checkpoint_file f;
  f.path = "optim-tp00-pp00-dp00.safetensors";
  std::vector<std::byte> m(64 * sizeof(float)), v(64 * sizeof(float));
  loom::io::detail::gather_zero1(dir, {f}, 0, 0, "adam_m", "F32", m);
  loom::io::detail::gather_zero1(dir, {f}, 0, 0, "adam_v", "F32", v);
  loom_fuzz::accepted("ZeRO-1 shard");
}

// A running view without tensors: what check_identity and read_scalars compare against.
loom::io::state_view running_view() {
  loom::io::state_view v;
  v.model = {{"name", "fuzz"}, {"arch", "gpt2"}, {"n_layer", 1}, {"n_head", 1}, {"d_model", 2},
             {"max_seq", 2},   {"vocab", 3},     {"vocab_padded", 4}};
  v.precision = "fp32";
  v.storage_dtype = "F32";
  v.master_dtype = "F32";
  v.dp = 2;
  v.scaler_enabled = true;
  v.lr_schedule = {{"max_lr", 1e-3}, {"warmup", 10}};
  v.trainer = {{"micro_batch", 4}, {"seq_len", 2}};
  return v;
}

void read_identity_and_scalars(const loom_fuzz::fs::path& dir, std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    return;  // verify_checkpoint refuses it before these run (case 1)
  }
  if (!j.is_object()) return;  // likewise
  static const loom::io::state_view v = running_view();
  const auto saved = loom::io::detail::check_identity(j, v, dir);
  const auto info = loom::io::detail::read_scalars(j, v, dir, saved);
  loom_fuzz::require(info.step >= 0 && info.optimizer_step >= 0 && info.optimizer_step <= info.step,
                     "read_scalars accepted inconsistent step counts");
  loom_fuzz::require(!info.loss_scaler || info.loss_scaler->scale > 0, "read_scalars accepted a loss scale <= 0");
  loom_fuzz::accepted("manifest identity and scalars");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const loom_fuzz::scratch_dir dir("checkpoint");
  if (size < 1) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    switch (data[0] % 4) {
      case 0:
        loom_fuzz::write_file(dir.path() / "x.safetensors", body);
        read_safetensors(dir.path() / "x.safetensors");
        break;
      case 1: verify_manifest(dir.path() / "ckpt", std::string(body)); break;
      case 2: gather_shard(dir.path(), body); break;
      default: read_identity_and_scalars(dir.path(), body); break;
    }
  } catch (const loom::input_error& e) {
    loom_fuzz::rejected(e);  // the expected outcome for malformed input
  }
  return 0;
}
