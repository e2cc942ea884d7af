#pragma once
/// \file Read-only memory mapping of a whole file, and crash-safe file writing (POSIX).
///
/// Private to loom::data. mapped_file maps a file with mmap(PROT_READ, MAP_SHARED) so that
/// datasets larger than RAM are paged in on demand; all sizes are std::size_t / 64-bit off_t,
/// never 32-bit. atomic_file writes to "<path>.tmp.<pid>", fsyncs, renames over <path> and
/// fsyncs the directory, so a crash never leaves a half-written file under the final name.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <utility>

#include <loom/core/error.hpp>

namespace loom::data::detail {

inline std::string errno_text() { return std::strerror(errno); }

/// A read-only view of a whole file. Move-only; unmaps in the destructor.
/// Throws loom::input_error if the file is missing or cannot be mapped.
class mapped_file {
 public:
  mapped_file() = default;
  /// `what` names the file's role in messages ("index file", "data file"), `fix` says what to
  /// do when it cannot be opened.
  explicit mapped_file(const std::filesystem::path& path, std::string_view what = "file",
                       std::string_view fix = "check the path") {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      throw input_error(std::string(what) + " '" + path.string() + "' cannot be opened (" + errno_text() + "); " +
                        std::string(fix));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      ::close(fd);
      throw input_error(std::string(what) + " '" + path.string() + "': fstat failed (" + errno_text() +
                        "); check permissions");
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        throw input_error(std::string(what) + " '" + path.string() + "' cannot be memory-mapped (" +
                          errno_text() + "); check that it is a regular file");
      }
      data_ = static_cast<const std::byte*>(p);
    }
    ::close(fd);  // the mapping keeps the file alive
  }
  mapped_file(mapped_file&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  mapped_file& operator=(mapped_file&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file() { reset(); }

  std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
  const std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  void reset() noexcept {
    if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
  }
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// A file written under a temporary name and atomically renamed into place by commit().
/// If commit() is never called, the destructor removes the temporary; the final path is
/// untouched. Writes are buffered (1 MiB). Throws loom::input_error on I/O failure
/// (full disk, missing directory), naming the path.
class atomic_file {
 public:
  explicit atomic_file(std::filesystem::path path) : path_(std::move(path)) {
    tmp_ = path_;
    tmp_ += ".tmp." + std::to_string(::getpid());
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw input_error("cannot create '" + tmp_.string() + "' (" + errno_text() +
                        "); check that the output directory exists and is writable");
    buf_.reserve(buffer_bytes);
  }
  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;
  ~atomic_file() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(tmp_.c_str());
    }
  }

  void write(const void* data, std::size_t bytes) {
    const auto* p = static_cast<const char*>(data);
    if (buf_.size() + bytes > buffer_bytes) flush();
    if (bytes >= buffer_bytes) {
      write_fd(p, bytes);
    } else {
      buf_.append(p, bytes);
    }
    written_ += bytes;
  }
  std::size_t bytes_written() const noexcept { return written_; }

  /// Flushes, fsyncs, renames the temporary over the final path, fsyncs the directory.
  void commit() {
    flush();
    if (::fsync(fd_) != 0) fail("fsync");
    ::close(fd_);
    fd_ = -1;
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      ::unlink(tmp_.c_str());
      fail("rename");
    }
    auto dir = path_.parent_path();
    if (dir.empty()) dir = ".";
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }

 private:
  static constexpr std::size_t buffer_bytes = std::size_t(1) << 20;
  void flush() {
    if (!buf_.empty()) write_fd(buf_.data(), buf_.size());
    buf_.clear();
  }
  void write_fd(const char* p, std::size_t n) {
    while (n > 0) {
      const ::ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        fail("write");
      }
      p += w;
      n -= static_cast<std::size_t>(w);
    }
  }
  [[noreturn]] void fail(const char* op) {
    throw input_error(std::string(op) + " of '" + tmp_.string() + "' failed (" + errno_text() +
                      "); check free disk space and permissions of the output directory");
  }
  std::filesystem::path path_, tmp_;
  int fd_ = -1;
  std::string buf_;
  std::size_t written_ = 0;
};

}  // namespace loom::data::detail
