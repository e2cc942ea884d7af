#pragma once
/// \file Reading and writing safetensors files (the Hugging Face tensor container).
///
/// Format (source: https://github.com/huggingface/safetensors, README "Format"):
///   bytes [0, 8)        N, the header length, unsigned 64-bit little-endian
///   bytes [8, 8+N)      a UTF-8 JSON object, padded with spaces so that 8+N is a multiple of 8:
///                         {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]},
///                          ..., "__metadata__": {"<key>": "<string value>", ...}}   (optional)
///   bytes [8+N, end)    the data section: every tensor row-major, little-endian, at
///                       [b, e) relative to the start of the data section
/// A valid file's tensors tile the data section exactly (no overlap, no hole, no trailing
/// byte), and e - b == dtype size * product(shape); a shape [] is a scalar (1 element).
///
/// safetensors_reader memory-maps the file and validates all of the above when it opens it;
/// safetensors_writer writes atomically (temporary file, fsync, rename, fsync of the directory).
///
/// Both assume a little-endian host (x86-64, AArch64), as the format is little-endian.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/core/json.hpp>
#include <loom/io/detail/dtype.hpp>

namespace loom::io {

static_assert(std::endian::native == std::endian::little,
              "loom::io::safetensors assumes a little-endian host: the format is little-endian "
              "and the reader copies bytes without swapping");

/// One tensor entry of a safetensors header.
struct tensor_info {
  std::string name;                 ///< the header key
  std::string dtype;                ///< "F32", "F64", "F16", "BF16", "I32", "I64", "U8", ...
  std::vector<std::int64_t> shape;  ///< row-major; {} for a scalar
  std::size_t begin = 0, end = 0;   ///< byte range [begin, end) relative to the data section

  /// Number of elements: product of shape (1 for a scalar).
  std::size_t numel() const noexcept {
    std::size_t n = 1;
    for (auto d : shape) n *= static_cast<std::size_t>(d);
    return n;
  }
  /// Number of bytes, end - begin.
  std::size_t nbytes() const noexcept { return end - begin; }
};

namespace detail {

/// The longest header the reader accepts, as the reference implementation (100 MB).
inline constexpr std::uint64_t max_header_bytes = 100'000'000;

/// The fix halves of the reader's "<problem>; <fix>" messages.
inline constexpr std::string_view fix_truncated =
    "the file is truncated or not a safetensors file: write or download it again";
inline constexpr std::string_view fix_corrupt =
    "the header breaks the safetensors format: write the file again with a conforming writer "
    "(loom::io::safetensors_writer, safetensors.torch.save_file)";

/// A read-only, private memory mapping of a whole file; owns the descriptor and the mapping.
class mapped_file {
 public:
  mapped_file() = default;
  explicit mapped_file(const std::filesystem::path& path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0)
      throw input_error("cannot open safetensors file '" + path.string() +
                        "': " + std::strerror(errno) + "; check the path and its permissions");
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int e = errno;
      close_fd();
      throw input_error("cannot stat safetensors file '" + path.string() +
                        "': " + std::strerror(e) + "; check the path and its permissions");
    }
    if (!S_ISREG(st.st_mode)) {
      close_fd();
      throw input_error("'" + path.string() +
                        "' is not a regular file; pass the path of a .safetensors file");
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ == 0) return;  // mmap rejects length 0; the caller reports the short file
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      close_fd();
      throw input_error("cannot memory-map safetensors file '" + path.string() +
                        "': " + std::strerror(e) + "; check that the file is on a local or "
                        "mmap-capable file system");
    }
    data_ = static_cast<const std::byte*>(p);
  }
  mapped_file(mapped_file&& o) noexcept
      : fd_(std::exchange(o.fd_, -1)),
        data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  mapped_file& operator=(mapped_file&& o) noexcept {
    if (this != &o) {
      release();
      fd_ = std::exchange(o.fd_, -1);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file() { release(); }

  const std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  void close_fd() noexcept {
    if (fd_ >= 0) (void)::close(fd_);
    fd_ = -1;
  }
  void release() noexcept {
    if (data_ != nullptr) (void)::munmap(const_cast<std::byte*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
    close_fd();
  }
  int fd_ = -1;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// "[2, 3, 4]"
inline std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// product(shape) * elem_bytes, or false when it overflows std::size_t / a dim is negative.
inline bool checked_nbytes(const std::vector<std::int64_t>& shape, std::size_t elem_bytes,
                           std::size_t& out) noexcept {
  std::size_t n = elem_bytes;
  for (auto d : shape) {
    if (d < 0) return false;
    if (__builtin_mul_overflow(n, static_cast<std::size_t>(d), &n)) return false;
  }
  out = n;
  return true;
}

/// Throws loom::input_error unless `s` is valid UTF-8 (JSON strings must be).
inline void require_utf8(const std::string& s, std::string_view what) {
  try {
    (void)nlohmann::json(s).dump();
  } catch (const nlohmann::json::type_error&) {
    throw input_error("safetensors_writer: " + std::string(what) +
                      " is not valid UTF-8; the header is JSON: pass UTF-8 text");
  }
}

/// write(2) all of [p, p+n), retrying on EINTR and short writes; false with errno set on error.
inline bool write_all(int fd, const std::byte* p, std::size_t n) noexcept {
  while (n > 0) {
    const std::size_t chunk = std::min<std::size_t>(n, std::size_t{1} << 30);
    const ssize_t w = ::write(fd, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (w == 0) {  // no progress and no error: report it rather than spin
      errno = EIO;
      return false;
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

/// What a safetensors file holds before its data, for tensors i = 0..n-1 (`tensor(i)` has
/// name, dtype and shape; `nbytes(i)` is its byte count): `order`, the order their data is
/// stored in (by decreasing element size, stable, so every tensor stays aligned), and `head`,
/// the 8-byte little-endian header length followed by the JSON header ("__metadata__" first
/// when `metadata` is not empty, then the tensors in index order with their data_offsets),
/// padded with spaces to a multiple of 8 bytes.
struct safetensors_head {
  std::vector<std::size_t> order;
  std::string head;
};
template <class Tensor, class NBytes>
safetensors_head make_safetensors_head(std::size_t n, Tensor&& tensor, NBytes&& nbytes,
                                       const std::map<std::string, std::string>& metadata) {
  safetensors_head h;
  h.order.resize(n);
  for (std::size_t i = 0; i < n; ++i) h.order[i] = i;
  std::stable_sort(h.order.begin(), h.order.end(), [&](std::size_t a, std::size_t b) {
    return dtype_size(tensor(a).dtype) > dtype_size(tensor(b).dtype);
  });
  std::vector<std::pair<std::size_t, std::size_t>> offsets(n);
  std::size_t pos = 0;
  for (std::size_t i : h.order) {
    offsets[i] = {pos, pos + nbytes(i)};
    pos += nbytes(i);
  }
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (std::size_t i = 0; i < n; ++i) {
    const auto& t = tensor(i);
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offsets[i].first, offsets[i].second}}};
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::uint64_t length = text.size();  // stored little-endian (loom runs on little-endian hosts)
  h.head.resize(8);
  std::memcpy(h.head.data(), &length, 8);
  h.head += text;
  return h;
}

/// fsync of directory `dir`; throws loom::error naming `what` on failure. EINVAL (a file system
/// that cannot sync directories) counts as success.
inline void fsync_dir(const std::filesystem::path& dir, std::string_view what) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || (::fsync(fd) != 0 && errno != EINVAL)) {
    const int e = errno;
    if (fd >= 0) (void)::close(fd);
    throw error("fsync of directory '" + dir.string() + "' (" + std::string(what) + ") failed: " +
                std::strerror(e) + "; the new file may not survive a crash: check the file system, then write again");
  }
  (void)::close(fd);
}

/// Removes the `<path>.tmp.<pid>` files that processes no longer alive left beside `path` (a
/// writer killed between creating its temporary file and the rename). A pid that is alive,
/// or this process's, is left alone. Never throws.
inline void remove_dead_temporaries(const std::filesystem::path& path) noexcept {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  const std::string prefix = path.filename().string() + ".tmp.";
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string f = it->path().filename().string();
    if (f.size() <= prefix.size() || f.compare(0, prefix.size(), prefix) != 0 || f.size() - prefix.size() > 9) continue;
    const std::string_view digits = std::string_view(f).substr(prefix.size());
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    const long pid = std::strtol(std::string(digits).c_str(), nullptr, 10);
    if (pid <= 0 || pid == long(::getpid())) continue;
    if (::kill(pid_t(pid), 0) != 0 && errno == ESRCH) {
      std::error_code rm;
      fs::remove(it->path(), rm);
    }
  }
}

/// Replaces `path` by the file that `fill(fd)` writes, atomically and durably (POSIX; ext4/xfs
/// semantics, LWN "Ensuring data reaches disk"): `fill` writes `path.tmp.<pid>` (returns false
/// with errno set when a write fails), then fsync, close, rename(2) over `path`, fsync of the
/// directory. rename is atomic: a reader sees the old file or the new one, never a mix. On
/// failure (or when `fill` throws) the temporary file is removed and `path` is left as it was.
/// Not safe for two threads of one process replacing the same path at once (same temp name).
/// First removes the temporary files of writers that were killed (remove_dead_temporaries).
/// Throws loom::input_error when the temporary file cannot be created (missing directory, no
/// permission), loom::error when writing, fsync, close or rename fails (disk full, I/O error)
/// or when the directory cannot be synced; each carries the errno text.
template <class Fill>
void atomic_replace(const std::filesystem::path& path, Fill&& fill) {
  const std::string target = path.string();
  const std::string tmp = target + ".tmp." + std::to_string(::getpid());
  remove_dead_temporaries(path);
  std::filesystem::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int e = errno;
    throw input_error("cannot create '" + tmp + "' to write '" + target + "': " + std::strerror(e) +
                      "; check that directory '" + dir.string() + "' exists and is writable");
  }
  auto fail = [&](const char* step, int e, bool close_it, const char* fix) {
    if (close_it) (void)::close(fd);
    (void)::unlink(tmp.c_str());
    return error(std::string(step) + " '" + tmp + "' failed: " + std::strerror(e) + "; '" + target +
                 "' was left unchanged: " + fix);
  };
  constexpr const char* retry = "check free space and the file system, then retry";
  bool written = false;
  try {
    written = fill(fd);
  } catch (...) {
    (void)::close(fd);
    (void)::unlink(tmp.c_str());
    throw;
  }
  if (!written) throw fail("writing", errno, true, retry);
  if (::fsync(fd) != 0) throw fail("fsync of", errno, true, retry);
  if (::close(fd) != 0) throw fail("closing", errno, false, retry);
  if (::rename(tmp.c_str(), target.c_str()) != 0)
    throw fail("renaming", errno, false,
               "check that it is not a directory and lies on the same file system, then retry");
  fsync_dir(dir, "after writing " + path.filename().string());
}

}  // namespace detail

/// Reads a safetensors file. The constructor maps the file and validates the whole header;
/// accessors never see a malformed file.
///
/// Errors (all loom::input_error naming the file, the problem and the fix): the file cannot be
/// opened or is not a regular file; it is shorter than 8 bytes; the header length exceeds the
/// file or 100 MB; the header is not valid UTF-8 JSON, nests deeper than json_max_depth, is not
/// an object, or repeats a key; an
/// entry lacks dtype/shape/data_offsets or has them of the wrong JSON type; a dtype is
/// unknown; a shape has a negative dimension; data_offsets are reversed, out of the data
/// section, overlap, leave a hole or trailing bytes, or do not span dtype size * numel bytes;
/// "__metadata__" is not an object of strings.
///
/// The mapping is MAP_PRIVATE and read-only: do not truncate the file while a reader is open
/// (reading a truncated mapping raises SIGBUS). Move-only.
class safetensors_reader {
 public:
  /// Opens and validates `path`. Throws loom::input_error (see the class comment).
  explicit safetensors_reader(std::filesystem::path path) : path_(std::move(path)), file_(path_) {
    parse_header();
  }

  /// The path given to the constructor.
  const std::filesystem::path& path() const noexcept { return path_; }

  /// Every tensor, in data-section order (ascending begin).
  const std::vector<tensor_info>& tensors() const noexcept { return tensors_; }

  /// True when the file has a tensor called `name`.
  bool has(std::string_view name) const noexcept { return index_.find(name) != index_.end(); }

  /// The entry of tensor `name`. Throws loom::input_error when there is none.
  const tensor_info& info(std::string_view name) const {
    auto it = index_.find(name);
    if (it == index_.end()) throw missing(name);
    return tensors_[it->second];
  }

  /// The "__metadata__" map (empty when the file has none).
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }

  /// The raw little-endian bytes of tensor `name`, valid while the reader lives. The start is
  /// aligned to the element size only if the writer aligned it: copy with std::memcpy, do not
  /// reinterpret_cast. Throws loom::input_error when there is no such tensor.
  std::span<const std::byte> bytes(std::string_view name) const {
    const tensor_info& t = info(name);
    return {data_ + t.begin, t.nbytes()};
  }

  /// Tensor `name` as a flat row-major vector of T; see read_into for conversions and errors.
  template <class T>
  std::vector<T> read(std::string_view name) const {
    std::vector<T> out(info(name).numel());
    read_into(name, std::span<T>(out));
    return out;
  }

  /// Copies tensor `name` into `out` (=), converting the element type:
  ///   T = float or double: from F32, F64, F16 or BF16 (F64 -> float rounds to nearest);
  ///   T = an integer type:  only from exactly its dtype (int32 <- I32, uint8 <- U8 or BOOL, ...).
  /// Throws loom::input_error when there is no tensor `name`, when out.size() != numel, or when
  /// the dtype does not convert to T.
  template <class T>
  void read_into(std::string_view name, std::span<T> out) const {
    static_assert(!std::is_const_v<T>, "read_into writes into out: pass a span of non-const T");
    static_assert(std::is_floating_point_v<T> || !detail::dtype_of<T>().empty(),
                  "read_into<T>: T must be float, double or a fixed-width integer type "
                  "(for F16/BF16 bits use bytes(name))");
    const tensor_info& t = info(name);
    if (out.size() != t.numel())
      throw input_error("tensor '" + t.name + "' in '" + path_.string() + "' has " +
                        std::to_string(t.numel()) + " elements (shape " +
                        detail::shape_string(t.shape) + ") but the destination holds " +
                        std::to_string(out.size()) + "; size the destination to info(name).numel()");
    const std::byte* src = data_ + t.begin;
    const std::size_t n = out.size();
    if constexpr (std::is_floating_point_v<T>) {
      if (t.dtype == "F32") {
        convert<float>(src, out, [](float v) { return v; });
      } else if (t.dtype == "F64") {
        convert<double>(src, out, [](double v) { return v; });
      } else if (t.dtype == "F16") {
        convert<std::uint16_t>(src, out, detail::half_to_float);
      } else if (t.dtype == "BF16") {
        convert<std::uint16_t>(src, out, detail::bfloat16_to_float);
      } else {
        throw input_error("tensor '" + t.name + "' in '" + path_.string() + "' has dtype " +
                          t.dtype + ", which does not convert to a floating-point type; read it "
                          "with its own element type (I32 -> std::int32_t, U8 -> std::uint8_t, ...)");
      }
    } else {
      constexpr std::string_view want = detail::dtype_of<T>();
      const bool match = t.dtype == want || (want == "U8" && t.dtype == "BOOL");
      if (!match)
        throw input_error("tensor '" + t.name + "' in '" + path_.string() + "' has dtype " +
                          t.dtype + " but was read as " + std::string(want) +
                          "; integer tensors are read only as their exact type: use the C++ type "
                          "of " + t.dtype);
      if (n != 0) std::memcpy(out.data(), src, n * sizeof(T));
    }
  }

 private:
  template <class S, class T, class F>
  static void convert(const std::byte* src, std::span<T> out, F f) {
    if constexpr (std::is_same_v<S, T>) {
      if (!out.empty()) std::memcpy(out.data(), src, out.size() * sizeof(T));
    } else {
      for (std::size_t i = 0; i < out.size(); ++i) {
        S s;
        std::memcpy(&s, src + i * sizeof(S), sizeof(S));
        out[i] = static_cast<T>(f(s));
      }
    }
  }

  input_error bad(const std::string& problem, std::string_view fix) const {
    return input_error("safetensors file '" + path_.string() + "': " + problem + "; " +
                       std::string(fix));
  }

  input_error missing(std::string_view name) const {
    std::string known;
    for (std::size_t i = 0; i < tensors_.size() && i < 8; ++i)
      known += (i ? ", " : "") + tensors_[i].name;
    if (tensors_.size() > 8) known += ", ...";
    return input_error("safetensors file '" + path_.string() + "' has no tensor '" +
                       std::string(name) + "' (it has " + std::to_string(tensors_.size()) +
                       " tensors: " + known + "); check the name, or test with has(name) first");
  }

  void parse_header() {
    constexpr std::string_view truncated = detail::fix_truncated, corrupt = detail::fix_corrupt;
    const std::size_t size = file_.size();
    if (size < 8)
      throw bad("the file is " + std::to_string(size) +
                " bytes long, shorter than the 8-byte header length that starts every "
                "safetensors file", truncated);
    std::uint64_t n = 0;
    std::memcpy(&n, file_.data(), 8);
    if (n > size - 8)
      throw bad("the header length field says " + std::to_string(n) + " bytes but only " +
                std::to_string(size - 8) + " bytes follow it", truncated);
    if (n > detail::max_header_bytes)
      throw bad("the header is " + std::to_string(n) + " bytes, more than the 100 MB limit of "
                "the reference implementation", truncated);
    const char* h = reinterpret_cast<const char*>(file_.data()) + 8;
    data_ = file_.data() + 8 + n;
    const std::size_t data_size = size - 8 - static_cast<std::size_t>(n);

    // Parse, rejecting repeated top-level keys (nlohmann would keep the last one silently) and
    // deep nesting (printing it in an error message would overflow the stack; core/json.hpp).
    if (json_nesting_depth(std::string_view(h, n), json_max_depth) > json_max_depth)
      throw bad("the header nests arrays and objects deeper than " + std::to_string(json_max_depth) +
                " levels (a safetensors header nests 3)", corrupt);
    nlohmann::json header;
    std::string repeated;
    {
      std::vector<std::string> keys;
      auto on_event = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& j) {
        if (depth == 1 && event == nlohmann::json::parse_event_t::key) keys.push_back(j.get<std::string>());
        return true;
      };
      try {
        header = nlohmann::json::parse(h, h + n, on_event);
      } catch (const nlohmann::json::exception& e) {
        throw bad(std::string("the header is not valid JSON (") + e.what() + ")", corrupt);
      }
      std::sort(keys.begin(), keys.end());
      auto dup = std::adjacent_find(keys.begin(), keys.end());
      if (dup != keys.end()) repeated = *dup;
    }
    if (!header.is_object())
      throw bad(std::string("the header is a JSON ") + header.type_name() +
                ", not an object of tensor entries", corrupt);
    if (!repeated.empty())
      throw bad("the header lists the key '" + repeated + "' more than once",
                "each tensor name must be unique: fix the program that wrote it");

    for (auto& [key, value] : header.items()) {
      if (key == "__metadata__") {
        if (!value.is_object()) throw bad("\"__metadata__\" is not an object", corrupt);
        for (auto& [mk, mv] : value.items()) {
          if (!mv.is_string())
            throw bad("\"__metadata__\" value of '" + mk + "' is a JSON " + mv.type_name() +
                      ", not a string", "metadata values must be strings: store numbers as text");
          metadata_.emplace(mk, mv.get<std::string>());
        }
        continue;
      }
      tensors_.push_back(parse_entry(key, value, data_size, corrupt));
    }

    std::sort(tensors_.begin(), tensors_.end(), [](const tensor_info& a, const tensor_info& b) {
      return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
    });
    std::size_t expected = 0;  // the data section must be tiled exactly, as the reference requires
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const tensor_info& t = tensors_[i];
      if (t.begin < expected)
        throw bad("tensors '" + tensors_[i - 1].name + "' and '" + t.name +
                  "' overlap (data_offsets [" + std::to_string(tensors_[i - 1].begin) + ", " +
                  std::to_string(tensors_[i - 1].end) + ") and [" + std::to_string(t.begin) +
                  ", " + std::to_string(t.end) + "))", corrupt);
      if (t.begin > expected)
        throw bad("data bytes [" + std::to_string(expected) + ", " + std::to_string(t.begin) +
                  ") belong to no tensor (a hole before '" + t.name + "')", corrupt);
      expected = t.end;
    }
    if (expected != data_size)
      throw bad("the data section is " + std::to_string(data_size) +
                " bytes but the tensors cover only " + std::to_string(expected) +
                " (trailing bytes after the last tensor)", corrupt);
    for (std::size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
  }

  tensor_info parse_entry(const std::string& key, const nlohmann::json& value,
                          std::size_t data_size, std::string_view corrupt) const {
    const std::string what = "tensor '" + key + "'";
    if (!value.is_object()) throw bad(what + " is a JSON " + value.type_name() + ", not an object", corrupt);
    auto field = [&](const char* f) -> const nlohmann::json& {
      auto it = value.find(f);
      if (it == value.end()) throw bad(what + " has no \"" + f + "\"", corrupt);
      return *it;
    };
    const auto& dtype = field("dtype");
    const auto& shape = field("shape");
    const auto& offsets = field("data_offsets");
    if (!dtype.is_string()) throw bad(what + ": \"dtype\" is not a string", corrupt);
    tensor_info t;
    t.name = key;
    t.dtype = dtype.get<std::string>();
    const std::size_t elem = detail::dtype_size(t.dtype);
    if (elem == 0)
      throw bad(what + " has unknown dtype \"" + t.dtype + "\"",
                "loom reads " + std::string(detail::known_dtypes) +
                    ": convert the tensor to one of them");
    if (!shape.is_array()) throw bad(what + ": \"shape\" is not an array", corrupt);
    for (const auto& d : shape) {
      if (!d.is_number_integer() || (d.is_number_unsigned() ? d.get<std::uint64_t>() >
                                                                   std::uint64_t(INT64_MAX)
                                                             : d.get<std::int64_t>() < 0))
        throw bad(what + ": \"shape\" " + shape.dump() + " holds something other than a "
                  "non-negative integer", corrupt);
      t.shape.push_back(d.get<std::int64_t>());
    }
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      throw bad(what + ": \"data_offsets\" " + offsets.dump() +
                " is not a pair of non-negative integers [begin, end]", corrupt);
    const std::uint64_t b = offsets[0].get<std::uint64_t>(), e = offsets[1].get<std::uint64_t>();
    if (b > e)
      throw bad(what + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                "] end before they begin", corrupt);
    if (e > data_size)
      throw bad(what + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                "] run past the end of the " + std::to_string(data_size) + "-byte data section",
                detail::fix_truncated);
    t.begin = static_cast<std::size_t>(b);
    t.end = static_cast<std::size_t>(e);
    std::size_t need = 0;
    if (!detail::checked_nbytes(t.shape, elem, need) || need != t.nbytes())
      throw bad(what + " (" + t.dtype + ", shape " + detail::shape_string(t.shape) + ") needs " +
                (detail::checked_nbytes(t.shape, elem, need) ? std::to_string(need)
                                                             : std::string("an overflowing number of")) +
                " bytes but its data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                "] span " + std::to_string(e - b), corrupt);
    return t;
  }

  std::filesystem::path path_;
  detail::mapped_file file_;
  const std::byte* data_ = nullptr;  // start of the data section inside file_
  std::vector<tensor_info> tensors_;
  std::map<std::string, std::size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

/// Collects tensors and metadata in memory, then writes one safetensors file atomically.
///
/// add() copies the data, so the caller's buffers may die before write(). In the file, the
/// header lists tensors in the order they were added (after "__metadata__"); in the data
/// section they are placed by decreasing element size (stable), so every tensor starts at a
/// multiple of its element size from an 8-aligned data section.
class safetensors_writer {
 public:
  /// Adds tensor `name` of the given row-major `shape` ({} for a scalar) with elements `data`.
  /// The dtype follows the element type: float F32, double F64, std::int64_t I64,
  /// std::int32_t I32, std::int16_t I16, std::int8_t I8, std::uint64_t U64, std::uint32_t U32,
  /// std::uint16_t U16, std::uint8_t U8. `data` is any contiguous range (std::vector,
  /// std::span, std::array, loom::view on the host ...).
  /// Throws loom::input_error when the name is empty, "__metadata__", not UTF-8 or already
  /// added, a dimension is negative, or data holds a different number of elements than the shape.
  template <std::ranges::contiguous_range R>
  void add(std::string name, std::vector<std::int64_t> shape, const R& data) {
    using T = std::remove_cv_t<std::ranges::range_value_t<R>>;
    constexpr std::string_view dtype = detail::dtype_of<T>();
    static_assert(!dtype.empty() && !std::is_same_v<T, bool>,
                  "safetensors_writer::add: element type must be float, double or a fixed-width "
                  "integer; for F16/BF16 pass the bits with add_bytes(name, \"BF16\", shape, bytes)");
    const auto bytes = std::as_bytes(std::span(std::ranges::data(data), std::ranges::size(data)));
    add_bytes(std::move(name), std::string(dtype), std::move(shape), bytes);
  }

  /// Adds tensor `name` with an explicit safetensors `dtype` ("BF16", "F16", ...) and its raw
  /// little-endian bytes. Throws loom::input_error as add(), and when the dtype is unknown or
  /// bytes.size() != dtype size * numel.
  void add_bytes(std::string name, std::string dtype, std::vector<std::int64_t> shape,
                 std::span<const std::byte> bytes) {
    if (name.empty() || name == "__metadata__")
      throw input_error("safetensors_writer: tensor name '" + name +
                        "' is reserved or empty; choose another name");
    detail::require_utf8(name, "a tensor name");
    for (const auto& e : entries_)
      if (e.info.name == name)
        throw input_error("safetensors_writer: tensor '" + name +
                          "' was already added; every tensor needs a unique name");
    const std::size_t elem = detail::dtype_size(dtype);
    if (elem == 0)
      throw input_error("safetensors_writer: tensor '" + name + "' has unknown dtype \"" + dtype +
                        "\"; use one of " + std::string(detail::known_dtypes));
    std::size_t need = 0;
    if (!detail::checked_nbytes(shape, elem, need))
      throw input_error("safetensors_writer: tensor '" + name + "' has invalid shape " +
                        detail::shape_string(shape) + "; dimensions must be non-negative");
    if (need != bytes.size())
      throw input_error("safetensors_writer: tensor '" + name + "' (" + dtype + ", shape " +
                        detail::shape_string(shape) + ") needs " + std::to_string(need) +
                        " bytes of data but got " + std::to_string(bytes.size()) +
                        "; pass exactly product(shape) elements");
    entry e;
    e.info.name = std::move(name);
    e.info.dtype = std::move(dtype);
    e.info.shape = std::move(shape);
    e.data.assign(bytes.begin(), bytes.end());
    entries_.push_back(std::move(e));
  }

  /// Sets "__metadata__"[key] = value (=, replacing an earlier value). Throws
  /// loom::input_error when key or value is not valid UTF-8.
  void set_metadata(std::string key, std::string value) {
    detail::require_utf8(key, "metadata key '" + key + "'");
    detail::require_utf8(value, "the metadata value of '" + key + "'");
    metadata_.insert_or_assign(std::move(key), std::move(value));
  }

  /// Number of tensors added so far.
  std::size_t size() const noexcept { return entries_.size(); }

  /// Writes the file to `path` atomically (detail::atomic_replace): into `path + ".tmp.<pid>"`,
  /// fsync, rename over `path`, fsync of the directory. On any failure the temporary file is
  /// removed and an existing file at `path` is left as it was. The writer is unchanged and can
  /// write again. Not safe for two threads of one process writing the same path at once.
  /// Throws loom::input_error when the temporary file cannot be created (missing directory,
  /// no permission), loom::error when writing, fsync or rename fails (disk full, I/O error);
  /// both carry the errno text.
  void write(const std::filesystem::path& path) const {
    const auto h = detail::make_safetensors_head(
        entries_.size(), [&](std::size_t i) -> const tensor_info& { return entries_[i].info; },
        [&](std::size_t i) { return entries_[i].data.size(); }, metadata_);
    detail::atomic_replace(path, [&](int fd) {
      if (!detail::write_all(fd, reinterpret_cast<const std::byte*>(h.head.data()), h.head.size())) return false;
      for (std::size_t i : h.order)
        if (!detail::write_all(fd, entries_[i].data.data(), entries_[i].data.size())) return false;
      return true;
    });
  }

 private:
  struct entry {
    tensor_info info;  // begin/end are assigned by write()
    std::vector<std::byte> data;
  };
  std::vector<entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace loom::io
