#pragma once
/// \file The aclnn plumbing every Ascend kernel shares: dtype mapping, RAII descriptors built from
/// shapes and strides, the one two-phase launcher, stream-ordered scratch memory, the operator
/// coverage table, and small helpers (fill, copy/cast).
///
/// The two-phase contract (reference §2.4, ggml-cann's GGML_CANN_CALL_ACLNN_OP): phase 1
/// aclnnXxxGetWorkspaceSize validates and returns (workspace bytes, executor); the workspace comes
/// from the context's caching allocator with the stream as key; phase 2 aclnnXxx enqueues on the
/// stream; the workspace goes back to the pool right after the enqueue — safe because the next
/// user of that block on the same stream runs after this kernel. Descriptors are destroyed after
/// phase 2 returns (after the enqueue, as the official samples and llama.cpp do). Executors are
/// single use and never reused.
///
/// Descriptors (reference §2.2, §7): aclCreateTensor(viewDims, n, dtype, stride, offset, format,
/// storageDims, m, data). Strides and offset are in ELEMENTS; argument 5 is the offset and 6 the
/// format (a swapped pair is a known silent bug). loom passes data = the first element of the
/// view, offset 0, format ND, and a 1-D storage shape covering exactly the view
/// (1 + sum((dim-1)*stride)), as llama.cpp does.
#include <aclnn/aclnn_base.h>
#include <aclnnop/aclnn_add.h>
#include <aclnnop/aclnn_copy.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <source_location>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include <loom/device/ascend.hpp>
#include <loom/kernels/ops.hpp>

namespace loom::kernels::ascend {

using ctx_t = context<device::ascend>;

/// The aclDataType of a C++ element type.
template <class T>
constexpr aclDataType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return ACL_FLOAT;
  else if constexpr (std::is_same_v<T, Eigen::half>) return ACL_FLOAT16;
  else if constexpr (std::is_same_v<T, Eigen::bfloat16>) return ACL_BF16;
  else if constexpr (std::is_same_v<T, double>) return ACL_DOUBLE;
  else if constexpr (std::is_same_v<T, std::int32_t>) return ACL_INT32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return ACL_INT64;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return ACL_UINT8;
  else if constexpr (std::is_same_v<T, bool>) return ACL_BOOL;
  else static_assert(dependent_false<T>, "loom::kernels::ascend::dtype_of: no aclDataType for this type");
}

// --- operator coverage -----------------------------------------------------------------------------
/// Operators of the Ascend kernel set, for the coverage table below.
enum class op {
  matmul,          // aclnnMatmul / aclnnAddmm / aclnnInplaceAddmm
  layernorm,       // aclnnLayerNorm / aclnnLayerNormBackward
  gelu,            // aclnnGeluV2 / aclnnGeluBackwardV2
  embedding,       // aclnnEmbedding / aclnnEmbeddingDenseBackward
  crossentropy,    // aclnnCrossEntropyLoss / aclnnCrossEntropyLossGrad
  add,             // aclnnAdd / aclnnInplaceAdd
  adamw,           // aclnnApplyAdamWV2
  flash_attention  // aclnnFlashAttentionScore / aclnnFlashAttentionScoreGrad
};

/// Whether the documented aclnn operators behind `O` take storage type T (A2/A3 training parts).
/// Every operator above documents FLOAT, FLOAT16 and BFLOAT16 (ops-nn / ops-transformer docs,
/// reference §2.5–2.6); nothing on the NPU takes double. fp32 matmul runs with cubeMathType 0
/// (KEEP_DTYPE, true fp32 on A2/A3; first-generation Atlas training parts reject it).
template <op O, class T>
inline constexpr bool supports_v =
    std::is_same_v<T, float> || std::is_same_v<T, Eigen::half> || std::is_same_v<T, Eigen::bfloat16>;

/// cubeMathType for aclnnMatmul/Addmm: 0 = KEEP_DTYPE (exact fp32 math on A2/A3).
inline constexpr int8_t cube_math_type = 0;

// --- descriptors -------------------------------------------------------------------------------------
/// An owned aclTensor: a strided view (outermost dimension first; strides in elements; empty
/// strides = contiguous) of elements of type `dt` starting at `data`.
class tensor {
 public:
  tensor(const void* data, aclDataType dt, std::initializer_list<int64_t> dims,
         std::initializer_list<int64_t> strides = {}, std::source_location where = std::source_location::current())
      : tensor(data, dt, std::vector<int64_t>(dims), std::vector<int64_t>(strides), where) {}
  tensor(const void* data, aclDataType dt, std::vector<int64_t> dims, std::vector<int64_t> strides,
         std::source_location where = std::source_location::current()) {
    if (strides.empty()) {
      strides.assign(dims.size(), 1);
      for (std::size_t i = dims.size(); i-- > 1;) strides[i - 1] = strides[i] * dims[i];
    }
    int64_t extent = 1;
    for (std::size_t i = 0; i < dims.size(); ++i)
      if (dims[i] > 0) extent += (dims[i] - 1) * strides[i];
    for (auto d : dims)
      if (d == 0) extent = 0;
    const int64_t storage[1] = {extent};
    t_ = aclCreateTensor(dims.data(), dims.size(), dt, strides.data(), /*offset=*/0, ACL_FORMAT_ND, storage, 1,
                         const_cast<void*>(data));
    if (!t_)
      throw device_error(device::detail::acl_status::aclnn_param_invalid, "aclCreateTensor",
                         device::detail::acl_recent_message(), where);
  }
  tensor(const tensor&) = delete;
  tensor& operator=(const tensor&) = delete;
  ~tensor() {
    if (t_) (void)aclDestroyTensor(t_);
  }
  aclTensor* get() const noexcept { return t_; }
  operator aclTensor*() const noexcept { return t_; }

 private:
  aclTensor* t_ = nullptr;
};

/// An owned host scalar. The value lives in this object until the descriptor is destroyed (after
/// phase 2), because whether aclCreateScalar copies it is unconfirmed (reference §2.2).
class scalar {
 public:
  explicit scalar(float v) : value_(v), s_(aclCreateScalar(&value_, ACL_FLOAT)) {
    if (!s_) throw device_error(device::detail::acl_status::aclnn_param_invalid, "aclCreateScalar", "");
  }
  scalar(const scalar&) = delete;
  scalar& operator=(const scalar&) = delete;
  ~scalar() { (void)aclDestroyScalar(s_); }
  operator aclScalar*() const noexcept { return s_; }

 private:
  float value_;
  aclScalar* s_;
};

/// An owned aclIntArray (host int64 list, e.g. normalizedShape).
class int_array {
 public:
  explicit int_array(std::initializer_list<int64_t> v) : v_(v), a_(aclCreateIntArray(v_.data(), v_.size())) {}
  int_array(const int_array&) = delete;
  int_array& operator=(const int_array&) = delete;
  ~int_array() { (void)aclDestroyIntArray(a_); }
  operator aclIntArray*() const noexcept { return a_; }

 private:
  std::vector<int64_t> v_;
  aclIntArray* a_;
};

/// An owned aclBoolArray (e.g. LayerNormBackward's outputMask).
class bool_array {
 public:
  explicit bool_array(std::initializer_list<bool> v) {
    int i = 0;
    for (bool b : v) v_[i++] = b;
    a_ = aclCreateBoolArray(v_, std::size_t(i));
  }
  bool_array(const bool_array&) = delete;
  bool_array& operator=(const bool_array&) = delete;
  ~bool_array() { (void)aclDestroyBoolArray(a_); }
  operator aclBoolArray*() const noexcept { return a_; }

 private:
  bool v_[8] = {};
  aclBoolArray* a_ = nullptr;
};

// --- memory ----------------------------------------------------------------------------------------------
/// Temporary device memory for n elements from the context's pool, keyed by the context's stream
/// (stream-ordered reuse: returning it while kernels that use it are still queued is safe for
/// later work on the same stream).
template <class T>
class scratch {
 public:
  scratch(ctx_t& ctx, std::size_t n) : ctx_(ctx), n_(n) {
    if (n) p_ = static_cast<T*>(ctx.memory().allocate(n * sizeof(T), ctx.stream));
  }
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
  ~scratch() {
    if (p_) ctx_.memory().deallocate(p_);
  }
  T* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }

 private:
  ctx_t& ctx_;
  std::size_t n_;
  T* p_ = nullptr;
};

/// Runs one aclnn operator through its two phases on ctx.stream. `phase1(&bytes, &executor)`
/// calls aclnnXxxGetWorkspaceSize with the operator's arguments; `phase2` is aclnnXxx. Throws
/// loom::device_error naming the failing phase, with aclGetRecentErrMsg() and the call site.
template <class Phase1, class Phase2>
void launch(ctx_t& ctx, std::string_view name, Phase1&& phase1, Phase2 phase2,
            std::source_location where = std::source_location::current()) {
  uint64_t bytes = 0;
  aclOpExecutor* executor = nullptr;
  if (const int rc = phase1(&bytes, &executor); rc != 0)
    throw device::detail::acl_error(rc, std::string(name) + "GetWorkspaceSize", where);
  scratch<std::byte> workspace(ctx, std::size_t(bytes));
  if (const int rc = phase2(workspace.data(), bytes, executor, ctx.stream); rc != 0)
    throw device::detail::acl_error(rc, name, where);
}

/// dst (n elements of D) = src (n elements of S), converting the dtype (aclnnInplaceCopy, which
/// accepts non-contiguous views and casts; ops-math documentation). The views may be strided.
inline void copy(ctx_t& ctx, const tensor& dst, const tensor& src,
                 std::source_location where = std::source_location::current()) {
  launch(
      ctx, "aclnnInplaceCopy",
      [&](uint64_t* ws, aclOpExecutor** ex) { return aclnnInplaceCopyGetWorkspaceSize(dst, src, ws, ex); },
      aclnnInplaceCopy, where);
}

/// self += alpha * other (aclnnInplaceAdd; other broadcasts to self).
inline void add_inplace(ctx_t& ctx, const tensor& self, const tensor& other, float alpha = 1.0f,
                        std::source_location where = std::source_location::current()) {
  scalar a(alpha);
  launch(
      ctx, "aclnnInplaceAdd",
      [&](uint64_t* ws, aclOpExecutor** ex) { return aclnnInplaceAddGetWorkspaceSize(self, other, a, ws, ex); },
      aclnnInplaceAdd, where);
}

/// p[0, n) = value, ordered on ctx.stream: aclrtMemsetAsync to zero, then aclnnInplaceAdds(value).
template <class T>
void fill(ctx_t& ctx, T* p, std::size_t n, float value) {
  device::ascend::memset(p, 0, n * sizeof(T), ctx.stream);
  if (value == 0.0f) return;
  tensor t(p, dtype_of<T>(), {int64_t(n)});
  scalar v(value), one(1.0f);
  launch(
      ctx, "aclnnInplaceAdds",
      [&](uint64_t* ws, aclOpExecutor** ex) { return aclnnInplaceAddsGetWorkspaceSize(t, v, one, ws, ex); },
      aclnnInplaceAdds);
}

/// A device vector of at least n ones of type T, cached in the context (GEMV-based reductions).
template <class T>
const T* ones(ctx_t& ctx, std::size_t n) {
  const std::size_t want = n < 256 ? 256 : n;
  return static_cast<const T*>(ctx.constants->get(
      std::string("ones/") + std::to_string(int(dtype_of<T>())), want * sizeof(T), ctx.ordinal, ctx.stream,
      [&](void* p, std::size_t bytes) { fill(ctx, static_cast<T*>(p), bytes / sizeof(T), 1.0f); }));
}

/// Reads n device elements into a host vector (synchronizes ctx.stream).
template <class T>
std::vector<T> to_host(ctx_t& ctx, const T* p, std::size_t n) {
  std::vector<T> h(n);
  device::ascend::copy_to_host(h.data(), p, n * sizeof(T), ctx.stream);  // pageable: synchronous
  return h;
}

}  // namespace loom::kernels::ascend
