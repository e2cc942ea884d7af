#pragma once
/// \file buffer<D,T>: one owning allocation of `size` elements in D's memory.
///
/// Move-only RAII. The contents are zero-filled on construction (ordered on the given stream).
/// Throws whatever D::allocate throws (std::bad_alloc on the CPU, loom::device_error on
/// a device); never throws from the destructor.
#include <cstddef>
#include <utility>

#include <loom/core/view.hpp>
#include <loom/core/device.hpp>

namespace loom {

template <device::device_policy D, class T>
class buffer {
 public:
  buffer() = default;
  explicit buffer(std::size_t size, typename D::stream_type stream = {})
      : data_(size ? static_cast<T*>(D::allocate(size * sizeof(T))) : nullptr), size_(size) {
    if (size) D::memset(data_, 0, size * sizeof(T), stream);
  }
  buffer(buffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  buffer& operator=(buffer&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  ~buffer() { reset(); }

  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return size_ * sizeof(T); }
  view<D, T> all() const noexcept { return {data_, size_}; }
  operator view<D, T>() const noexcept { return all(); }
  operator view<D, const T>() const noexcept { return {data_, size_}; }
  T& operator[](std::size_t i) const noexcept requires loom::device::host_accessible_v<D> { return data_[i]; }

 private:
  void reset() noexcept {
    if (data_) D::deallocate(data_);
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace loom
