#pragma once
/// \file Private: per-thread fp32 workspaces of the CPU kernels, grown on first use and then
/// reused, so a training step allocates nothing once its first step has run (tests/alloc).
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace loom::kernels::cpu::detail {

/// Independent workspaces a thread may hold at once (a kernel uses slot 0, 1, ... for buffers it
/// needs together).
enum class workspace_slot : int { attention = 0, gemm_a = 1, gemm_b = 2, gemm_c = 3 };

/// At least n floats of this thread's workspace `slot`, 64-byte aligned on every thread (so
/// vectorised loops, and with them the order of additions, do not depend on which thread ran a
/// piece of work). Valid until this thread asks for the same slot again with a larger n.
/// Throws std::bad_alloc when growing fails.
inline float* thread_workspace(std::size_t n, workspace_slot slot = workspace_slot::attention) {
  struct aligned_free {
    void operator()(float* p) const noexcept { std::free(p); }
  };
  struct buffer {
    std::unique_ptr<float[], aligned_free> data;
    std::size_t size = 0;
  };
  thread_local buffer buffers[4];
  buffer& b = buffers[int(slot)];
  if (b.size < n) {
    const std::size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    b.data.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    if (!b.data) {
      b.size = 0;
      throw std::bad_alloc();
    }
    b.size = n;
  }
  return b.data.get();
}

}  // namespace loom::kernels::cpu::detail
