// libFuzzer target for the parsers of untrusted checkpoint bytes (issue 7): the safetensors
// header (io::safetensors_reader), the checkpoint manifest (io::verify_checkpoint,
// io::find_checkpoint) and the ZeRO-1 shard ranges (io::detail::gather_zero1).
// Malformed input must end in loom::input_error, never a crash or a read outside the file
// (built with -fsanitize=fuzzer,address,undefined by tests/fuzz/run.sh, CTest fuzz_checkpoint).
//
// Input: byte 0 selects the target, the rest is the file content.
//   0  a safetensors file: open it, read every tensor's bytes, read F32/I64 tensors converted
//   1  manifest.json of a checkpoint directory, with its checksum recomputed by the harness when
//      the input is a JSON object (so the fuzzer reaches the fields behind the checksum); the
//      directory also holds a valid 8-byte-header file "f.safetensors"
//   2  a ZeRO-1 shard "optim-tp00-pp00-dp00.safetensors" gathered into 64-element moments
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <loom/io/checkpoint.hpp>

namespace fs = std::filesystem;

namespace {
const fs::path& work() {
  static const fs::path dir = [] {
    const fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    fs::path d = base / ("loom_fuzz_checkpoint_" + std::to_string(::getpid()));
    fs::create_directories(d / "ckpt" / "step_00000001");
    return d;
  }();
  return dir;
}
void write(const fs::path& p, const char* data, std::size_t n) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(data, static_cast<std::streamsize>(n));
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const char* body = reinterpret_cast<const char*>(data + 1);
  const std::size_t n = size - 1;
  try {
    switch (data[0] % 3) {
      case 0: {
        const fs::path p = work() / "x.safetensors";
        write(p, body, n);
        const loom::io::safetensors_reader r(p);
        std::size_t sum = 0;
        for (const auto& t : r.tensors()) {
          for (const std::byte b : r.bytes(t.name)) sum += std::size_t(b);
          if (t.dtype == "F32" || t.dtype == "F16" || t.dtype == "BF16") sum += r.read<float>(t.name).size();
          if (t.dtype == "I64") sum += r.read<std::int64_t>(t.name).size();
        }
        (void)r.metadata();
        return int(sum & 0);
      }
      case 1: {
        const fs::path dir = work() / "ckpt" / "step_00000001";
        std::string text(body, n);
        try {  // recompute the checksum so the fields behind it are reached
          auto j = nlohmann::json::parse(text);
          if (j.is_object()) {
            j["checksum"] = {{"xxh3_64", loom::io::detail::manifest_checksum(j)}};
            text = j.dump();
          }
        } catch (const nlohmann::json::exception&) {
        }
        write(dir / "manifest.json", text.data(), text.size());
        const char header[16] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
        write(dir / "f.safetensors", header, sizeof header);
        write(work() / "ckpt" / "latest", "step_00000001\n", 14);
        try {
          const auto j = loom::io::verify_checkpoint(dir);
          (void)loom::io::detail::manifest_files(j, dir);
        } catch (const loom::input_error&) {
        }
        (void)loom::io::find_checkpoint(work() / "ckpt");
        return 0;
      }
      default: {
        const fs::path dir = work();
        write(dir / "optim-tp00-pp00-dp00.safetensors", body, n);
        loom::io::checkpoint_file f;
        f.path = "optim-tp00-pp00-dp00.safetensors";
        std::vector<std::byte> m(64 * sizeof(float)), v(64 * sizeof(float));
        loom::io::detail::gather_zero1(dir, {f}, 0, 0, "adam_m", "F32", m);
        loom::io::detail::gather_zero1(dir, {f}, 0, 0, "adam_v", "F32", v);
        return 0;
      }
    }
  } catch (const loom::input_error&) {
    return 0;  // the expected outcome for malformed input
  }
}
