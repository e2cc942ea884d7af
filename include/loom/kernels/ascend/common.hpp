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

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <Eigen/Core>
#include <loom/core/error.hpp>

#include <loom/device/ascend.hpp>
#include <loom/kernels/ops.hpp>

namespace loom::kernels::ascend {

using ctx_t = context<device::ascend>;
namespace acl = loom::device::acl;
using acl::aclDataType;

/// The aclDataType of a C++ element type.
template <class T>
constexpr aclDataType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return acl::dt_float;
  else if constexpr (std::is_same_v<T, Eigen::half>) return acl::dt_float16;
  else if constexpr (std::is_same_v<T, Eigen::bfloat16>) return acl::dt_bf16;
  else if constexpr (std::is_same_v<T, double>) return acl::dt_double;
  else if constexpr (std::is_same_v<T, std::int32_t>) return acl::dt_int32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return acl::dt_int64;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return acl::dt_uint8;
  else if constexpr (std::is_same_v<T, bool>) return acl::dt_bool;
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
  flash_attention, // aclnnFlashAttentionScore / aclnnFlashAttentionScoreGrad
  rmsnorm,         // aclnnRmsNorm / aclnnRmsNormGrad
  swiglu,          // aclnnSwiGlu / aclnnSwiGluGrad
  rope             // aclnnRotaryPositionEmbedding / aclnnRotaryPositionEmbeddingGrad
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

// --- entry points ------------------------------------------------------------------------------------
/// Throws device_error when the loaded CANN libraries do not export `fn` (an operator absent from
/// this CANN version or SoC, or a missing libnnopbase/op-API library): names the function and the
/// libraries searched. Code 561003 (ACLNN_ERR_INNER_FIND_KERNEL_ERROR), the closest documented
/// meaning ("no kernel for this operator").
template <class Fn>
void require(const acl::api_table&, Fn* fn, std::string_view name,
             loom::source_location where = loom::source_location::current()) {
  if (fn) [[likely]]
    return;
  throw device_error(device::detail::acl_status::aclnn_find_kernel_error, name,
                     "not exported by the loaded CANN libraries (looked in the op-API and nnopbase libraries next to "
                     "libascendcl.so): this CANN version or SoC lacks the operator, or ASCEND_HOME_PATH points at an "
                     "incomplete toolkit",
                     where);
}

/// The name and call site of one operator launch (implicit from a string literal, so the call
/// site is the caller's).
struct op_site {
  std::string_view name;
  loom::source_location where;
  op_site(const char* n, loom::source_location w = loom::source_location::current()) : name(n), where(w) {}
  op_site(std::string_view n, loom::source_location w) : name(n), where(w) {}
};

// --- descriptors -------------------------------------------------------------------------------------
/// An owned aclTensor: a strided view (outermost dimension first; strides in elements; empty
/// strides = contiguous) of elements of type `dt` starting at `data`.
class tensor {
 public:
  tensor(const ctx_t& ctx, const void* data, aclDataType dt, std::initializer_list<int64_t> dims,
         std::initializer_list<int64_t> strides = {}, loom::source_location where = loom::source_location::current())
      : tensor(ctx, data, dt, std::vector<int64_t>(dims), std::vector<int64_t>(strides), where) {}
  tensor(const ctx_t& ctx, const void* data, aclDataType dt, std::vector<int64_t> dims, std::vector<int64_t> strides,
         loom::source_location where = loom::source_location::current())
      : api_(&ctx.api()) {
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
    require(*api_, api_->aclCreateTensor, "aclCreateTensor", where);
    t_ = api_->aclCreateTensor(dims.data(), dims.size(), dt, strides.data(), /*offset=*/0, acl::format_nd, storage, 1,
                               const_cast<void*>(data));
    if (!t_)
      throw device_error(device::detail::acl_status::aclnn_param_invalid, "aclCreateTensor",
                         device::detail::acl_recent_message(*api_), where);
  }
  tensor(const tensor&) = delete;
  tensor& operator=(const tensor&) = delete;
  ~tensor() {
    if (t_) (void)api_->aclDestroyTensor(t_);
  }
  acl::aclTensor* get() const noexcept { return t_; }
  operator acl::aclTensor*() const noexcept { return t_; }

 private:
  const acl::api_table* api_;
  acl::aclTensor* t_ = nullptr;
};

/// An owned host scalar. The value lives in this object until the descriptor is destroyed (after
/// phase 2), because whether aclCreateScalar copies it is unconfirmed (reference §2.2).
class scalar {
 public:
  /// An ACL_FLOAT scalar.
  scalar(const ctx_t& ctx, float v) : api_(&ctx.api()), value_(v) {
    require(*api_, api_->aclCreateScalar, "aclCreateScalar");
    s_ = api_->aclCreateScalar(&value_, acl::dt_float);
    if (!s_) throw device_error(device::detail::acl_status::aclnn_param_invalid, "aclCreateScalar", "");
  }
  /// An ACL_INT64 scalar (for integer tensors: an alpha of the tensor's own integer type needs no
  /// cast, which aclnnAdd refuses for a float alpha with integer operands — ops-math aclnnAdd.md).
  scalar(const ctx_t& ctx, std::int64_t v) : api_(&ctx.api()), int_value_(v) {
    require(*api_, api_->aclCreateScalar, "aclCreateScalar");
    s_ = api_->aclCreateScalar(&int_value_, acl::dt_int64);
    if (!s_) throw device_error(device::detail::acl_status::aclnn_param_invalid, "aclCreateScalar", "");
  }
  scalar(const scalar&) = delete;
  scalar& operator=(const scalar&) = delete;
  ~scalar() {
    if (s_) (void)api_->aclDestroyScalar(s_);
  }
  operator acl::aclScalar*() const noexcept { return s_; }

 private:
  const acl::api_table* api_;
  float value_ = 0.0f;
  std::int64_t int_value_ = 0;
  acl::aclScalar* s_ = nullptr;
};

/// An owned aclIntArray (host int64 list, e.g. normalizedShape).
class int_array {
 public:
  int_array(const ctx_t& ctx, std::initializer_list<int64_t> v) : api_(&ctx.api()), v_(v) {
    require(*api_, api_->aclCreateIntArray, "aclCreateIntArray");
    a_ = api_->aclCreateIntArray(v_.data(), v_.size());
  }
  int_array(const int_array&) = delete;
  int_array& operator=(const int_array&) = delete;
  ~int_array() {
    if (a_) (void)api_->aclDestroyIntArray(a_);
  }
  operator acl::aclIntArray*() const noexcept { return a_; }

 private:
  const acl::api_table* api_;
  std::vector<int64_t> v_;
  acl::aclIntArray* a_ = nullptr;
};

/// An owned aclBoolArray (e.g. LayerNormBackward's outputMask).
class bool_array {
 public:
  bool_array(const ctx_t& ctx, std::initializer_list<bool> v) : api_(&ctx.api()) {
    int i = 0;
    for (bool b : v) v_[i++] = b;
    require(*api_, api_->aclCreateBoolArray, "aclCreateBoolArray");
    a_ = api_->aclCreateBoolArray(v_, std::size_t(i));
  }
  bool_array(const bool_array&) = delete;
  bool_array& operator=(const bool_array&) = delete;
  ~bool_array() {
    if (a_) (void)api_->aclDestroyBoolArray(a_);
  }
  operator acl::aclBoolArray*() const noexcept { return a_; }

 private:
  const acl::api_table* api_;
  bool v_[8] = {};
  acl::aclBoolArray* a_ = nullptr;
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

/// Runs one aclnn operator through its two phases on ctx.stream:
///   phase1(args..., &bytes, &executor)   aclnnXxxGetWorkspaceSize, arguments converted as declared
///   workspace of `bytes` from the context's pool (stream-ordered), phase2(ws, bytes, executor, stream)
/// Usage: launch(ctx, "aclnnMatmul", ctx.api().aclnnMatmulGetWorkspaceSize, ctx.api().aclnnMatmul, x, w, y, 0);
/// Throws loom::device_error naming the failing phase, with aclGetRecentErrMsg() and the call
/// site; or naming the function when the loaded libraries lack it (require).
template <class... Params, class... Args>
void launch(ctx_t& ctx, op_site site, acl::aclnnStatus (*phase1)(Params...),
            acl::aclnnStatus (*phase2)(void*, uint64_t, acl::aclOpExecutor*, acl::aclrtStream), Args&&... args) {
  const auto& api = ctx.api();
  require(api, phase1, std::string(site.name) + "GetWorkspaceSize", site.where);
  require(api, phase2, site.name, site.where);
  uint64_t bytes = 0;
  acl::aclOpExecutor* executor = nullptr;
  if (const int rc = phase1(std::forward<Args>(args)..., &bytes, &executor); rc != 0)
    throw device::detail::acl_error(api, rc, std::string(site.name) + "GetWorkspaceSize", site.where);
  scratch<std::byte> workspace(ctx, std::size_t(bytes));
  if (const int rc = phase2(workspace.data(), bytes, executor, ctx.stream); rc != 0)
    throw device::detail::acl_error(api, rc, site.name, site.where);
}

/// dst (n elements of D) = src (n elements of S), converting the dtype (aclnnInplaceCopy, which
/// accepts non-contiguous views and casts; ops-math documentation). The views may be strided.
inline void copy(ctx_t& ctx, const tensor& dst, const tensor& src,
                 loom::source_location where = loom::source_location::current()) {
  launch(ctx, op_site{"aclnnInplaceCopy", where}, ctx.api().aclnnInplaceCopyGetWorkspaceSize,
         ctx.api().aclnnInplaceCopy, dst, src);
}

/// Token windows -> inputs and targets on the device (the device side of train::split_windows):
/// `windows` (rows, T+1) int32; inputs (rows, T) = windows[:, 0:T], targets (rows, T) =
/// windows[:, 1:T+1], both contiguous, written by two aclnnInplaceCopy calls on strided views.
inline void split_windows(ctx_t& ctx, const std::int32_t* windows, std::int32_t* inputs, std::int32_t* targets,
                          int rows, int T) {
  const int64_t r = rows, t = T, w = int64_t(T) + 1;
  copy(ctx, tensor(ctx, inputs, acl::dt_int32, {r, t}), tensor(ctx, windows, acl::dt_int32, {r, t}, {w, 1}));
  copy(ctx, tensor(ctx, targets, acl::dt_int32, {r, t}), tensor(ctx, windows + 1, acl::dt_int32, {r, t}, {w, 1}));
}

/// self += alpha * other (aclnnInplaceAdd; other broadcasts to self), for floating operands: the
/// alpha is an ACL_FLOAT scalar. For integer or BOOL operands use the std::int64_t overload.
inline void add_inplace(ctx_t& ctx, const tensor& self, const tensor& other, float alpha = 1.0f,
                        loom::source_location where = loom::source_location::current()) {
  scalar a(ctx, alpha);
  launch(ctx, op_site{"aclnnInplaceAdd", where}, ctx.api().aclnnInplaceAddGetWorkspaceSize, ctx.api().aclnnInplaceAdd,
         self, other, a);
}

/// self += alpha * other (aclnnInplaceAdd; other broadcasts to self), for integer or BOOL operands:
/// the alpha is an ACL_INT64 scalar. aclnnAdd/aclnnInplaceAdd refuse "an alpha that cannot be cast
/// to the type promoted from self and other" with 161002 ACLNN_ERR_PARAM_INVALID (hicann/ops-math
/// math/add/docs/aclnnAdd&aclnnInplaceAdd.md; aclnn_add.cpp CheckPromoteType uses CanCast), and a
/// FLOAT alpha casts to no integer type; INT64 casts to every integer type (docs/ascend.md §4a).
inline void add_inplace(ctx_t& ctx, const tensor& self, const tensor& other, std::int64_t alpha,
                        loom::source_location where = loom::source_location::current()) {
  scalar a(ctx, alpha);
  launch(ctx, op_site{"aclnnInplaceAdd", where}, ctx.api().aclnnInplaceAddGetWorkspaceSize, ctx.api().aclnnInplaceAdd,
         self, other, a);
}

/// dst (dims, element type G) += src (dims, element type T, contiguous), ordered on ctx.stream.
/// G == T: one aclnnInplaceAdd. Otherwise (fp32 parameter gradients of 16-bit storage, Note
/// [fp32 gradients on Ascend]) src is first widened into G scratch with aclnnInplaceCopy (which
/// casts; ops-math docs) and then added in G, so the sum itself never rounds to T. No mixed-dtype
/// aclnnInplaceAdd is relied on: its type promotion is not in the reference.
template <class G, class T>
void accumulate(ctx_t& ctx, G* dst, const T* src, std::initializer_list<int64_t> dims,
                loom::source_location where = loom::source_location::current()) {
  if constexpr (std::is_same_v<G, T>) {
    add_inplace(ctx, tensor(ctx, dst, dtype_of<G>(), dims, {}, where), tensor(ctx, src, dtype_of<T>(), dims, {}, where),
                1.0f, where);
  } else {
    std::size_t n = 1;
    for (auto d : dims) n *= std::size_t(d);
    scratch<G> wide(ctx, n);
    tensor w(ctx, wide.data(), dtype_of<G>(), dims, {}, where);
    copy(ctx, w, tensor(ctx, src, dtype_of<T>(), dims, {}, where), where);
    add_inplace(ctx, tensor(ctx, dst, dtype_of<G>(), dims, {}, where), w, 1.0f, where);
  }
}

/// p[0, n) = value, ordered on ctx.stream: aclrtMemsetAsync to zero, then aclnnInplaceAdds(value).
template <class T>
void fill(ctx_t& ctx, T* p, std::size_t n, float value) {
  if (n) device::detail::acl_check(ctx.api(), ctx.api().aclrtMemsetAsync(p, n * sizeof(T), 0, n * sizeof(T), ctx.stream),
                                   "aclrtMemsetAsync");
  if (value == 0.0f) return;
  tensor t(ctx, p, dtype_of<T>(), {int64_t(n)});
  scalar v(ctx, value), one(ctx, 1.0f);
  launch(ctx, "aclnnInplaceAdds", ctx.api().aclnnInplaceAddsGetWorkspaceSize, ctx.api().aclnnInplaceAdds, t, v, one);
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
