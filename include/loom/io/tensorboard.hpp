#pragma once
/// \file TensorBoard event files written by loom itself: TFRecord framing with masked CRC-32C,
/// `Event` protocol buffers carrying scalar summaries. No TensorFlow, no libprotobuf.
///
/// Format (sources: tensorflow/core/lib/io/record_writer.cc, tensorflow/core/lib/hash/crc32c.h,
/// tensorflow/core/util/event.proto, tensorflow/core/framework/summary.proto):
///   file    = record*
///   record  = u64 length (little-endian) | u32 masked_crc32c(length bytes)
///             | data[length]            | u32 masked_crc32c(data)
///   masked  = ((crc >> 15) | (crc << 17)) + 0xa282ead8        (mod 2^32)
///   crc32c  = CRC-32 with the Castagnoli polynomial (reflected 0x82F63B78), init/xorout ~0
///   data    = Event { double wall_time = 1; int64 step = 2;
///                     oneof { string file_version = 3; Summary summary = 5; ... } }
///   Summary = { repeated Value value = 1; }
///   Value   = { string tag = 1; oneof { float simple_value = 2; ... } }
/// The first record is Event{wall_time, file_version = "brain.Event:2"}; TensorBoard reads the
/// scalar values as the "Scalars" dashboard (legacy simple_value, still supported by its reader).
///
/// Why a 60-line encoder instead of libprotobuf: we write three message types with five field
/// kinds. libprotobuf would need protoc-generated code for event.proto/summary.proto (and their
/// import closure) checked in or generated at build time, a link dependency (the header-only
/// library would stop being header-only for everyone who logs), and a version match between
/// protoc and the runtime. The wire format for varints, fixed64/fixed32 and length-delimited
/// fields is stable and tiny; tests decode our files with two independent decoders.
#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <unistd.h>

#include <loom/core/error.hpp>
#include <loom/io/scalar.hpp>

namespace loom::io {

namespace detail {
/// The 256-entry table of the reflected Castagnoli polynomial 0x82F63B78.
inline constexpr std::array<std::uint32_t, 256> crc32c_table = [] {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}();
}  // namespace detail

/// CRC-32C (Castagnoli; iSCSI, RFC 3720 §B.4) of `bytes`, table-driven, one byte per step.
/// `crc` continues a previous result (pass the value returned for the preceding bytes).
/// Check value: crc32c("123456789") == 0xE3069283.
constexpr std::uint32_t crc32c(std::string_view bytes, std::uint32_t crc = 0) noexcept {
  crc = ~crc;
  for (unsigned char b : bytes) crc = detail::crc32c_table[(crc ^ b) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

/// TFRecord's masked CRC: rotate right by 15 bits and add a constant, so that a CRC stored
/// inside CRC-covered data does not make the CRC of that data trivial (record_writer.cc).
constexpr std::uint32_t mask_crc(std::uint32_t crc) noexcept {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

namespace detail {
/// Minimal protobuf wire-format encoder (https://protobuf.dev/programming-guides/encoding/).
/// Appends to a std::string; field numbers and wire types as in the proto files quoted above.
struct pb_writer {
  std::string out;
  void varint(std::uint64_t v) {
    while (v >= 0x80) {
      out.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out.push_back(static_cast<char>(v));
  }
  void key(int field, int wire_type) { varint((std::uint64_t(field) << 3) | std::uint64_t(wire_type)); }
  void fixed(std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void field_double(int field, double v) {  // wire type 1: 8 bytes little-endian
    key(field, 1);
    fixed(std::bit_cast<std::uint64_t>(v), 8);
  }
  void field_float(int field, float v) {  // wire type 5: 4 bytes little-endian
    key(field, 5);
    fixed(std::bit_cast<std::uint32_t>(v), 4);
  }
  void field_int64(int field, std::int64_t v) {  // wire type 0: two's complement varint
    key(field, 0);
    varint(static_cast<std::uint64_t>(v));
  }
  void field_bytes(int field, std::string_view v) {  // wire type 2: length-delimited
    key(field, 2);
    varint(v.size());
    out.append(v);
  }
};

/// Serialises Event{wall_time, step, summary{value{tag, simple_value}...}}.
inline std::string encode_scalar_event(double wall_time, std::int64_t step, std::span<const scalar> values) {
  pb_writer summary;
  for (const auto& s : values) {
    pb_writer v;
    v.field_bytes(1, s.tag);
    v.field_float(2, static_cast<float>(s.value));
    summary.field_bytes(1, v.out);
  }
  pb_writer event;
  event.field_double(1, wall_time);
  event.field_int64(2, step);
  event.field_bytes(5, summary.out);
  return std::move(event.out);
}

/// Serialises Event{wall_time, file_version}.
inline std::string encode_version_event(double wall_time, std::string_view version) {
  pb_writer event;
  event.field_double(1, wall_time);
  event.field_bytes(3, version);
  return std::move(event.out);
}

/// Frames `data` as one TFRecord: length, masked CRC of the length, data, masked CRC of data.
inline std::string frame_record(std::string_view data) {
  pb_writer r;
  r.fixed(data.size(), 8);
  const std::string len = r.out;
  r.fixed(mask_crc(crc32c(len)), 4);
  r.out.append(data);
  r.fixed(mask_crc(crc32c(data)), 4);
  return std::move(r.out);
}

inline double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

inline std::string host_name() {
  std::array<char, 256> buf{};
  if (::gethostname(buf.data(), buf.size() - 1) != 0) return "localhost";
  return buf.data();
}
}  // namespace detail

/// Options of a tensorboard_writer.
struct tensorboard_options {
  std::size_t flush_every = 20;  ///< flush to the OS after this many records (>= 1); also on destruction
  std::string filename_suffix{}; ///< appended to the file name, e.g. ".rank3" when ranks share a directory
};

/// Appends scalar summaries to a new TensorBoard event file in `log_dir`.
///
/// File: <log_dir>/events.out.tfevents.<unix seconds>.<hostname><suffix>; created exclusively
/// (an existing file is never truncated: ".1", ".2", ... is appended on a name clash), so
/// several runs or ranks can share a log directory. Open it with `tensorboard --logdir log_dir`.
/// Values are stored as float32 (TensorBoard's simple_value); NaN and inf are stored as such.
/// Records are buffered by stdio and flushed every `flush_every` records and by the destructor,
/// so a crash loses at most the last flush_every - 1 records and never corrupts earlier ones
/// (a torn last record fails its CRC and readers stop there).
/// Not thread-safe: call from one thread (the trainer's logging thread or rank 0).
/// Errors: loom::input_error when the directory cannot be created or the file opened (message
/// names the path and the OS reason); loom::error when a write fails later (disk full).
class tensorboard_writer {
 public:
  explicit tensorboard_writer(const std::filesystem::path& log_dir, tensorboard_options opt = {})
      : opt_(std::move(opt)) {
    if (opt_.flush_every == 0) opt_.flush_every = 1;
    std::error_code ec;
    std::filesystem::create_directories(log_dir, ec);
    if (ec)
      throw input_error("tensorboard: cannot create log directory '" + log_dir.string() + "': " + ec.message() +
                        "; choose a writable --log-dir");
    const double now = detail::unix_seconds_now();
    const std::string base = "events.out.tfevents." + std::to_string(static_cast<std::int64_t>(now)) + "." +
                             detail::host_name() + opt_.filename_suffix;
    for (int attempt = 0; attempt < 1000 && !file_; ++attempt) {
      path_ = log_dir / (attempt == 0 ? base : base + "." + std::to_string(attempt));
      file_ = std::fopen(path_.c_str(), "wbx");  // C11 'x': fail if it exists, never truncate
      if (!file_ && errno != EEXIST) break;
    }
    if (!file_)
      throw input_error("tensorboard: cannot create event file '" + path_.string() + "': " + std::strerror(errno) +
                        "; choose a writable --log-dir");
    write_record(detail::encode_version_event(now, "brain.Event:2"));
    flush();
  }
  tensorboard_writer(tensorboard_writer&& o) noexcept
      : opt_(std::move(o.opt_)), path_(std::move(o.path_)), file_(std::exchange(o.file_, nullptr)),
        records_(o.records_), unflushed_(o.unflushed_) {}
  tensorboard_writer& operator=(tensorboard_writer&&) = delete;
  tensorboard_writer(const tensorboard_writer&) = delete;
  tensorboard_writer& operator=(const tensorboard_writer&) = delete;
  ~tensorboard_writer() {
    if (file_) std::fclose(file_);  // flushes; errors cannot be reported from a destructor
  }

  /// Writes one Event at `step` holding all `values` (one point per tag on TensorBoard's step
  /// axis); `wall_time` in Unix seconds, default now. Writes nothing for an empty span.
  void add_scalars(std::int64_t step, std::span<const scalar> values, double wall_time = -1) {
    if (values.empty()) return;
    write_record(detail::encode_scalar_event(wall_time < 0 ? detail::unix_seconds_now() : wall_time, step, values));
  }
  /// One scalar; same as add_scalars with one value.
  void add_scalar(std::string_view tag, double value, std::int64_t step, double wall_time = -1) {
    const scalar s{tag, value};
    add_scalars(step, std::span<const scalar>(&s, 1), wall_time);
  }
  /// Hands buffered records to the OS (fflush; no fsync: the OS keeps them across a crash of
  /// this process, which is what matters for a training log).
  void flush() {
    if (std::fflush(file_) != 0) fail("flushing");
    unflushed_ = 0;
  }

  /// The file being written.
  const std::filesystem::path& path() const noexcept { return path_; }
  /// Records written so far, including the file_version record.
  std::size_t records() const noexcept { return records_; }

 private:
  void write_record(std::string_view event) {
    const std::string rec = detail::frame_record(event);
    if (std::fwrite(rec.data(), 1, rec.size(), file_) != rec.size()) fail("writing");
    ++records_;
    if (++unflushed_ >= opt_.flush_every) flush();
  }
  [[noreturn]] void fail(const char* what) {
    throw error("tensorboard: " + std::string(what) + " '" + path_.string() + "' failed: " + std::strerror(errno) +
                "; check free space on the log directory's disk");
  }

  tensorboard_options opt_;
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  std::size_t records_ = 0;
  std::size_t unflushed_ = 0;
};

}  // namespace loom::io
