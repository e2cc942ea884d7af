#pragma once
/// \file XXH3-64 checksums, as loom records them in checkpoint manifests, dataset summaries,
/// weights files and Hugging Face exports: 16 lower-case hex digits of XXH3-64 with seed 0
/// (xxHash, https://github.com/Cyan4973/xxHash, "XXH3_64bits").
///
/// xxHash is inlined (header only, no -lxxhash). XXH_INLINE_ALL renames its functions
/// (XXH_INLINE_ prefix), so this coexists with a plain #include <xxhash.h> elsewhere in the same
/// translation unit. On AVX-512 builds (-march=native) the AVX2 kernel is used: GCC 12 warns
/// (falsely, from its own avx512fintrin.h) in xxHash's AVX-512 kernel, and AVX2 already hashes
/// far faster than a disk reads or writes.
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

#include <cstddef>
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include <loom/core/error.hpp>

namespace loom {

namespace detail {
/// 16 lower-case hex digits of a 64-bit hash.
inline std::string hash_hex(XXH64_hash_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}
}  // namespace detail

/// XXH3-64 (seed 0) of the n bytes at `data`, as 16 lower-case hex digits. Never throws except
/// std::bad_alloc.
inline std::string xxh3_hex(const void* data, std::size_t n) { return detail::hash_hex(XXH3_64bits(data, n)); }

/// XXH3-64 of the compact dump of `j` without its "checksum" key: the self-checksum of a JSON
/// document (checkpoint manifest, dataset summary). A parser's dump is canonical (keys sorted,
/// numbers in shortest round-trip form), so the sum depends on the values, not the whitespace.
inline std::string json_xxh3(nlohmann::json j) {
  if (j.is_object()) j.erase("checksum");
  const std::string text = j.dump();
  return xxh3_hex(text.data(), text.size());
}

/// XXH3-64 over bytes given in pieces: update() each piece in order, hex() at the end (equal to
/// xxh3_hex of the concatenation). Move-only. Throws loom::error when xxHash cannot allocate
/// its state.
class xxh3_stream {
 public:
  xxh3_stream() : state_(XXH3_createState(), &XXH3_freeState) {
    if (!state_ || XXH3_64bits_reset(state_.get()) == XXH_ERROR)
      throw error("xxh3_stream: cannot start an XXH3 hash (out of memory)");
  }
  /// Adds the n bytes at `data`.
  void update(const void* data, std::size_t n) noexcept { (void)XXH3_64bits_update(state_.get(), data, n); }
  /// The hash of everything added so far, as 16 lower-case hex digits.
  std::string hex() const { return detail::hash_hex(XXH3_64bits_digest(state_.get())); }

 private:
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state_;
};

}  // namespace loom
