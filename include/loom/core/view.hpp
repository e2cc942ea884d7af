#pragma once
/// \file view<D,T>: a non-owning, device-tagged span of elements.
///
/// The tag D says which memory space the pointer lives in, so a host loop cannot silently
/// read device memory: element access is only available when device::host_accessible_v<D>.
/// A view is two words, passed by value.
#include <cassert>
#include <cstddef>
#include <span>
#include <type_traits>

#include <loom/core/device.hpp>

namespace loom {

template <class D, class T>
class view {
 public:
  using device_type = D;
  using element_type = T;

  constexpr view() noexcept = default;
  constexpr view(T* data, std::size_t size) noexcept : data_(data), size_(size) {}
  /// A view of const T from a view of T.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  constexpr view(view<D, U> other) noexcept : data_(other.data()), size_(other.size()) {}

  constexpr T* data() const noexcept { return data_; }
  constexpr std::size_t size() const noexcept { return size_; }
  constexpr std::size_t bytes() const noexcept { return size_ * sizeof(T); }
  constexpr bool empty() const noexcept { return size_ == 0; }

  /// Elements [offset, offset+count). Precondition: offset+count <= size().
  constexpr view subview(std::size_t offset, std::size_t count) const noexcept {
    assert(offset + count <= size_);
    return {data_ + offset, count};
  }

  /// Host-side element access; only for host-accessible memory.
  constexpr T& operator[](std::size_t i) const noexcept
    requires loom::device::host_accessible_v<D>
  {
    assert(i < size_);
    return data_[i];
  }
  constexpr T* begin() const noexcept requires loom::device::host_accessible_v<D> { return data_; }
  constexpr T* end() const noexcept requires loom::device::host_accessible_v<D> { return data_ + size_; }
  std::span<T> span() const noexcept requires loom::device::host_accessible_v<D> { return {data_, size_}; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace loom
