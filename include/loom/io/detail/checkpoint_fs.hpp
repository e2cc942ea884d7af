#pragma once
/// \file Private helpers of loom/io/checkpoint.hpp: durable file-system steps (fsync of a file
/// and of a directory, atomic small-file replacement, best-effort removal) and XXH3-64 file
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
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/io/safetensors.hpp>  // detail::mapped_file, write_all, dtype_size, checked_nbytes

// xxHash, inlined (header only, no -lxxhash): https://github.com/Cyan4973/xxHash.
// XXH_INLINE_ALL renames the functions (XXH_INLINE_ prefix), so this coexists with a plain
// #include <xxhash.h> elsewhere in the same translation unit.
// On AVX-512 builds (-march=native) the AVX2 kernel is used: GCC 12 warns (falsely, from its
// own avx512fintrin.h) in xxHash's AVX-512 kernel, and AVX2 already hashes far faster than a
// disk writes.
#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#define LOOM_UNDEF_XXH_INLINE_ALL
#endif
#if defined(__AVX512F__) && defined(__AVX2__) && !defined(XXH_VECTOR)
#define XXH_VECTOR 2  // XXH_AVX2
#define LOOM_UNDEF_XXH_VECTOR
#endif
#include <xxhash.h>
#ifdef LOOM_UNDEF_XXH_INLINE_ALL
#undef XXH_INLINE_ALL
#undef LOOM_UNDEF_XXH_INLINE_ALL
#endif
#ifdef LOOM_UNDEF_XXH_VECTOR
#undef XXH_VECTOR
#undef LOOM_UNDEF_XXH_VECTOR
#endif

namespace loom::io::detail {

/// XXH3-64 (seed 0) of `bytes`, as 16 lower-case hex digits.
inline std::string xxh3_hex(const void* data, std::size_t n) {
  const XXH64_hash_t h = XXH3_64bits(data, n);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

/// XXH3-64 of a whole file (memory-mapped) and its size. Throws loom::input_error when the
/// file cannot be opened or mapped.
inline std::pair<std::string, std::uint64_t> xxh3_file(const std::filesystem::path& path) {
  const mapped_file f(path);
  return {xxh3_hex(f.data(), f.size()), f.size()};
}

/// fsync of directory `dir`; throws loom::error naming `what` on failure. EINVAL (a file system
/// that cannot sync directories) counts as success.
inline void fsync_dir(const std::filesystem::path& dir, std::string_view what) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || (::fsync(fd) != 0 && errno != EINVAL)) {
    const int e = errno;
    if (fd >= 0) (void)::close(fd);
    throw error("fsync of directory '" + dir.string() + "' (" + std::string(what) + ") failed: " +
                std::strerror(e) + "; check the file system, then save again");
  }
  (void)::close(fd);
}

/// Replaces `path` by a file holding `text`, atomically and durably: `path.tmp.<pid>`, fsync,
/// rename, fsync of the directory. On failure the temporary file is removed, `path` is
/// unchanged, and loom::error (loom::input_error when the file cannot be created) is thrown.
inline void write_file_atomic(const std::filesystem::path& path, std::string_view text) {
  const std::string target = path.string();
  const std::string tmp = target + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int e = errno;
    throw input_error("cannot create '" + tmp + "': " + std::strerror(e) +
                      "; check that its directory exists and is writable");
  }
  auto fail = [&](const char* step, int e, bool close_it) {
    if (close_it) (void)::close(fd);
    (void)::unlink(tmp.c_str());
    return error(std::string(step) + " '" + tmp + "' failed: " + std::strerror(e) + "; '" + target +
                 "' was left unchanged: check free space and the file system, then retry");
  };
  if (!write_all(fd, reinterpret_cast<const std::byte*>(text.data()), text.size()))
    throw fail("writing", errno, true);
  if (::fsync(fd) != 0) throw fail("fsync of", errno, true);
  if (::close(fd) != 0) throw fail("closing", errno, false);
  if (::rename(tmp.c_str(), target.c_str()) != 0) throw fail("renaming", errno, false);
  std::filesystem::path dir = path.parent_path();
  fsync_dir(dir.empty() ? "." : dir, "after replacing " + path.filename().string());
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
/// writing). On failure the temporary file is removed and `path` is unchanged; throws
/// loom::input_error when the file cannot be created, loom::error when a write/fsync/rename
/// fails, loom::error when a tensor's byte count does not match its dtype and shape.
inline std::string write_safetensors(const std::filesystem::path& path, const std::vector<tensor_ref>& tensors,
                                     const std::map<std::string, std::string>& metadata) {
  std::vector<std::size_t> order(tensors.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return dtype_size(tensors[a].dtype) > dtype_size(tensors[b].dtype);
  });
  std::vector<std::pair<std::size_t, std::size_t>> offsets(tensors.size());
  std::size_t pos = 0;
  for (std::size_t i : order) {
    std::size_t need = 0;
    if (dtype_size(tensors[i].dtype) == 0 || !checked_nbytes(tensors[i].shape, dtype_size(tensors[i].dtype), need) ||
        need != tensors[i].bytes.size())
      throw error("write_safetensors: tensor '" + tensors[i].name + "' (" + tensors[i].dtype + ", shape " +
                  shape_string(tensors[i].shape) + ") has " + std::to_string(tensors[i].bytes.size()) +
                  " bytes of data; this is a bug in the caller");
    offsets[i] = {pos, pos + tensors[i].bytes.size()};
    pos += tensors[i].bytes.size();
  }
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (std::size_t i = 0; i < tensors.size(); ++i)
    header[tensors[i].name] = {{"dtype", tensors[i].dtype},
                               {"shape", tensors[i].shape},
                               {"data_offsets", {offsets[i].first, offsets[i].second}}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::byte length[8];
  const std::uint64_t n = text.size();
  std::memcpy(length, &n, 8);

  const std::string target = path.string();
  const std::string tmp = target + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw input_error("cannot create '" + tmp + "': " + std::strerror(errno) +
                      "; check that the directory exists and is writable");
  auto fail = [&](const char* step, int e, bool close_it) {
    if (close_it) (void)::close(fd);
    (void)::unlink(tmp.c_str());
    return error(std::string(step) + " '" + tmp + "' failed: " + std::strerror(e) +
                 "; check free space and the file system, then retry");
  };
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr || XXH3_64bits_reset(state) == XXH_ERROR) {
    XXH3_freeState(state);
    throw fail("hashing", ENOMEM, true);
  }
  auto put = [&](const std::byte* p, std::size_t k) {
    (void)XXH3_64bits_update(state, p, k);
    return write_all(fd, p, k);
  };
  bool ok = put(length, 8) && put(reinterpret_cast<const std::byte*>(text.data()), text.size());
  for (std::size_t i : order)
    if (ok) ok = put(tensors[i].bytes.data(), tensors[i].bytes.size());
  const XXH64_hash_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (!ok) throw fail("writing", errno, true);
  if (::fsync(fd) != 0) throw fail("fsync of", errno, true);
  if (::close(fd) != 0) throw fail("closing", errno, false);
  if (::rename(tmp.c_str(), target.c_str()) != 0) throw fail("renaming", errno, false);
  std::filesystem::path dir = path.parent_path();
  fsync_dir(dir.empty() ? "." : dir, "after writing " + path.filename().string());
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

/// Removes `p` recursively, ignoring errors (cleanup after a failure must not mask it).
inline void remove_quietly(const std::filesystem::path& p) noexcept {
  std::error_code ec;
  std::filesystem::remove_all(p, ec);
}

}  // namespace loom::io::detail
