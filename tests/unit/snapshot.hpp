#pragma once
// Test helpers: snapshot a host-visible buffer (a loom::view, std::span or vector) and compare
// it bit for bit later, e.g. to prove a skipped step left parameters untouched.
#include <cstring>
#include <type_traits>
#include <vector>

namespace loom_test {

/// A std::vector holding a copy of v's elements (v: anything with begin/end and operator[]).
template <class V>
auto copy_of(const V& v) {
  return std::vector<std::remove_cvref_t<decltype(v[0])>>(v.begin(), v.end());
}

/// True when b holds exactly a's elements, compared as bytes (so -0.0 != 0.0 and NaNs compare
/// by payload): b's element type must be X's.
template <class X, class V>
bool bitwise_equal(const std::vector<X>& a, const V& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(X)) == 0;
}

}  // namespace loom_test
