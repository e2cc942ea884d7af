#pragma once
/// \file Private helpers of loom/io/checkpoint.hpp: durable file-system steps (atomic small-file
/// replacement over safetensors.hpp's detail::atomic_replace, best-effort removal) and XXH3-64 file
/// checksums, and a safetensors writer that streams from the caller's memory. Not a public header.
///
/// Durability recipe (POSIX; ext4/xfs semantics, as in LWN "Ensuring data reaches disk"):
/// write a temporary file, fsync it, rename(2) it over the target, fsync the directory that
/// holds both. rename is atomic: a reader sees the old file or the new one, never a mix.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <loom/core/checksum.hpp>
#include <loom/core/error.hpp>
#include <loom/io/safetensors.hpp>  // detail::mapped_file, write_all, dtype_size, checked_nbytes

namespace loom::io::detail {

using loom::xxh3_hex;  // core/checksum.hpp

/// XXH3-64 of a whole file (memory-mapped) and its size. Throws loom::input_error when the
/// file cannot be opened or mapped.
inline std::pair<std::string, std::uint64_t> xxh3_file(const std::filesystem::path& path) {
  const mapped_file f(path);
  return {xxh3_hex(f.data(), f.size()), f.size()};
}

// fsync_dir and atomic_replace (temporary file, fsync, rename, fsync of the directory) are
// safetensors.hpp's, shared with safetensors_writer::write.

/// Replaces `path` by a file holding `text`, atomically and durably (detail::atomic_replace).
/// On failure the temporary file is removed, `path` is unchanged, and loom::error
/// (loom::input_error when the file cannot be created) is thrown.
inline void write_file_atomic(const std::filesystem::path& path, std::string_view text) {
  atomic_replace(path, [&](int fd) { return write_all(fd, reinterpret_cast<const std::byte*>(text.data()), text.size()); });
}

/// The whole content of a small text file; throws loom::input_error when it cannot be read.
inline std::string read_small_file(const std::filesystem::path& path, std::size_t limit = 64u << 20) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw input_error("'" + path.string() + "' does not exist or is not a regular file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw input_error("cannot open '" + path.string() + "': " + std::strerror(errno));
  std::string s;
  char buf[65536];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int e = errno;
      (void)::close(fd);
      throw input_error("cannot read '" + path.string() + "': " + std::strerror(e));
    }
    if (r == 0) break;
    s.append(buf, static_cast<std::size_t>(r));
    if (s.size() > limit) {
      (void)::close(fd);
      throw input_error("'" + path.string() + "' is larger than " + std::to_string(limit) +
                        " bytes; it is not a checkpoint manifest");
    }
  }
  (void)::close(fd);
  return s;
}

/// A tensor to write, whose bytes live elsewhere (no copy is made).
struct tensor_ref {
  std::string name;
  std::string dtype;                 ///< safetensors dtype ("F32", "BF16", ...)
  std::vector<std::int64_t> shape;
  std::span<const std::byte> bytes;  ///< dtype size * product(shape) bytes, little-endian
};

/// Writes a safetensors file holding `tensors` (and `metadata` as "__metadata__") straight
/// from the caller's memory, atomically: `path.tmp.<pid>`, fsync, rename, fsync of the
/// directory. Same layout as safetensors_writer (header in the given order, data placed by
/// decreasing element size so every tensor is aligned), without its copy of the data, which
/// matters for multi-GB checkpoints. Returns the XXH3-64 of the bytes written (hashed while
/// writing), through detail::atomic_replace. On failure the temporary file is removed and
/// `path` is unchanged; throws
/// loom::input_error when the file cannot be created, loom::error when a write/fsync/rename
/// fails, loom::error when a tensor's byte count does not match its dtype and shape.
inline std::string write_safetensors(const std::filesystem::path& path, const std::vector<tensor_ref>& tensors,
                                     const std::map<std::string, std::string>& metadata) {
  for (const tensor_ref& t : tensors) {
    std::size_t need = 0;
    if (dtype_size(t.dtype) == 0 || !checked_nbytes(t.shape, dtype_size(t.dtype), need) || need != t.bytes.size())
      throw error("write_safetensors: tensor '" + t.name + "' (" + t.dtype + ", shape " + shape_string(t.shape) +
                  ") has " + std::to_string(t.bytes.size()) + " bytes of data; this is a bug in the caller");
  }
  const auto head = make_safetensors_head(
      tensors.size(), [&](std::size_t i) -> const tensor_ref& { return tensors[i]; },
      [&](std::size_t i) { return tensors[i].bytes.size(); }, metadata);

  xxh3_stream sum;
  atomic_replace(path, [&](int fd) {
    auto put = [&](const std::byte* p, std::size_t k) {
      sum.update(p, k);
      return write_all(fd, p, k);
    };
    bool ok = put(reinterpret_cast<const std::byte*>(head.head.data()), head.head.size());
    for (std::size_t i : head.order)
      if (ok) ok = put(tensors[i].bytes.data(), tensors[i].bytes.size());
    return ok;
  });
  return sum.hex();
}

/// Removes `p` recursively, ignoring errors (cleanup after a failure must not mask it).
inline void remove_quietly(const std::filesystem::path& p) noexcept {
  std::error_code ec;
  std::filesystem::remove_all(p, ec);
}

}  // namespace loom::io::detail
