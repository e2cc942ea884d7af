#pragma once
// The instance cache of loom's programs (train::instance_cache, include/loom/train/instance_cache.hpp):
// the build's toolchain file, compiled in as LOOM_INSTANCE_TOOLCHAIN (examples/CMakeLists.txt),
// or $LOOM_TOOLCHAIN_FILE, and the cache directory $LOOM_CACHE_DIR (default ~/.cache/loom).
// Not a library header: examples/ only.
#include <loom/train/instance_cache.hpp>

namespace loom_examples {

/// The program's instance cache, made on first call. Throws loom::input_error when the
/// toolchain file is missing or malformed (then nothing can be compiled on first use).
inline loom::train::instance_cache& instance_cache() {
#ifdef LOOM_INSTANCE_TOOLCHAIN
  static const char* built_in = LOOM_INSTANCE_TOOLCHAIN;
#else
  static const char* built_in = nullptr;
#endif
  static loom::train::instance_cache cache(loom::train::toolchain::load(loom::train::toolchain::default_file(built_in)),
                                           loom::train::instance_cache::default_dir());
  return cache;
}

}  // namespace loom_examples
