// loom's HOST EMULATION of CANN aclnn operators — NOT the vendor library (libopapi).
// Each operator validates its arguments in phase 1 as its documentation describes (dtypes, shapes,
// required outputs; see docs/ascend.md for sources) and computes on the stream worker with plain
// double-precision loops, rounding once into the output dtype. Independent of loom's own CPU
// kernels on purpose: the tests compare the two.
#include <aclnnop/aclnn_add.h>
#include <aclnnop/aclnn_addmm.h>
#include <aclnnop/aclnn_amax.h>
#include <aclnnop/aclnn_apply_adam_w_v2.h>
#include <aclnnop/aclnn_cast.h>
#include <aclnnop/aclnn_clamp.h>
#include <aclnnop/aclnn_copy.h>
#include <aclnnop/aclnn_cross_entropy_loss.h>
#include <aclnnop/aclnn_cross_entropy_loss_grad.h>
#include <aclnnop/aclnn_embedding.h>
#include <aclnnop/aclnn_embedding_dense_backward.h>
#include <aclnnop/aclnn_exp.h>
#include <aclnnop/aclnn_gelu_backward_v2.h>
#include <aclnnop/aclnn_gelu_v2.h>
#include <aclnnop/aclnn_isfinite.h>
#include <aclnnop/aclnn_layer_norm.h>
#include <aclnnop/aclnn_layer_norm_backward.h>
#include <aclnnop/aclnn_log.h>
#include <aclnnop/aclnn_matmul.h>
#include <aclnnop/aclnn_mm.h>
#include <aclnnop/aclnn_mul.h>
#include <aclnnop/aclnn_reduce_sum.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "internal.hpp"
#include "op_common.hpp"

using namespace loomemu;

namespace {

using dims_t = std::vector<int64_t>;

std::string dims_string(const dims_t& d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
  return s + "]";
}

/// Right-aligned broadcast of a and b; false when incompatible.
bool broadcast_shape(const dims_t& a, const dims_t& b, dims_t* out) {
  const std::size_t n = std::max(a.size(), b.size());
  out->assign(n, 1);
  for (std::size_t i = 0; i < n; ++i) {
    const int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (x != y && x != 1 && y != 1) return false;
    (*out)[i] = std::max(x, y);
  }
  return true;
}

/// Values of `v` (shape `from`) broadcast to shape `to` (row-major).
std::vector<double> expand(const std::vector<double>& v, const dims_t& from, const dims_t& to) {
  if (from == to) return v;
  int64_t n = 1;
  for (auto d : to) n *= d;
  std::vector<double> out(std::size_t(std::max<int64_t>(n, 0)));
  const std::size_t nd = to.size(), pad = nd - from.size();
  std::vector<int64_t> src_stride(nd, 0);
  int64_t s = 1;
  for (std::size_t i = nd; i-- > pad;) {
    const int64_t d = from[i - pad];
    src_stride[i] = d == 1 ? 0 : s;
    s *= d;
  }
  std::vector<int64_t> idx(nd, 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t o = 0;
    for (std::size_t i = 0; i < nd; ++i) o += idx[i] * src_stride[i];
    out[std::size_t(k)] = v[std::size_t(o)];
    for (std::size_t i = nd; i-- > 0;) {
      if (++idx[i] < to[i]) break;
      idx[i] = 0;
    }
  }
  return out;
}


// --- matrix multiply ------------------------------------------------------------------------------------------
std::string check_cube(const aclTensor& a, const aclTensor& b, const aclTensor& out, int8_t cube) {
  if (!is_nn_float(a.dtype)) return std::string("dtype ") + dtype_name(a.dtype) + " not in FLOAT, FLOAT16, BFLOAT16";
  if (a.dtype != b.dtype || a.dtype != out.dtype)
    return std::string("mixed dtypes ") + dtype_name(a.dtype) + "/" + dtype_name(b.dtype) + "/" + dtype_name(out.dtype) +
           " cannot be deduced on A2/A3";
  if (cube < 0 || cube > 4) return "cubeMathType " + std::to_string(cube) + " is not 0..4";
  if (cube == 2 && a.dtype == ACL_BF16) return "cubeMathType 2 (USE_FP16) is not allowed for BFLOAT16 input";
  return "";
}

/// c(M,N) = a(M,K) b(K,N), batched over `batch` with per-batch element strides (0 = broadcast).
void gemm(const std::vector<double>& a, const std::vector<double>& b, std::vector<double>& c, int64_t batch,
          int64_t M, int64_t K, int64_t N, int64_t sa, int64_t sb) {
  c.assign(std::size_t(batch * M * N), 0.0);
  for (int64_t p = 0; p < batch; ++p)
    for (int64_t i = 0; i < M; ++i) {
      double* crow = c.data() + (p * M + i) * N;
      for (int64_t k = 0; k < K; ++k) {
        const double x = a[std::size_t(p * sa + i * K + k)];
        const double* brow = b.data() + p * sb + k * N;
        for (int64_t j = 0; j < N; ++j) crow[j] += x * brow[j];
      }
    }
}

}  // namespace

extern "C" aclnnStatus aclnnMatmulGetWorkspaceSize(const aclTensor* self, const aclTensor* mat2, aclTensor* out,
                                                   int8_t cubeMathType, uint64_t* workspaceSize,
                                                   aclOpExecutor** executor) {
  constexpr const char* name = "aclnnMatmul";
  INJECT_PHASE1("aclnnMatmul");
  NEED(self, name, "self");
  NEED(mat2, name, "mat2");
  NEED(out, name, "out");
  if (auto why = check_cube(*self, *mat2, *out, cubeMathType); !why.empty()) return invalid(name, why);
  const auto &a = self->dims, &b = mat2->dims;
  if (a.size() < 2 || a.size() > 3 || b.size() < 2 || b.size() > 3)
    return invalid(name, "the emulation implements 2-D and 3-D operands only, got " + dims_string(a) + " x " + dims_string(b));
  const int64_t M = a[a.size() - 2], K = a.back(), K2 = b[b.size() - 2], N = b.back();
  const int64_t batch = std::max(a.size() == 3 ? a[0] : 1, b.size() == 3 ? b[0] : 1);
  if (K != K2) return invalid(name, "inner dimensions differ: " + dims_string(a) + " x " + dims_string(b));
  if ((a.size() == 3 && a[0] != batch) || (b.size() == 3 && b[0] != batch))
    return invalid(name, "batch dimensions differ: " + dims_string(a) + " x " + dims_string(b));
  const dims_t want = (a.size() == 3 || b.size() == 3) ? dims_t{batch, M, N} : dims_t{M, N};
  if (out->dims != want) return invalid(name, "out is " + dims_string(out->dims) + ", expected " + dims_string(want));
  const aclTensor A = *self, B = *mat2, C = *out;
  const int64_t sa = a.size() == 3 ? M * K : 0, sb = b.size() == 3 ? K * N : 0;
  return make_executor(name, {self, mat2, out}, 1024 + uint64_t(batch * M * N) * 4,
                       [=](void*) {
                         std::vector<double> c;
                         gemm(gather(A), gather(B), c, batch, M, K, N, sa, sb);
                         scatter(C, c);
                       },
                       workspaceSize, executor);
}
PHASE2(aclnnMatmul)

extern "C" aclnnStatus aclnnMmGetWorkspaceSize(const aclTensor* self, const aclTensor* mat2, aclTensor* out,
                                               int8_t cubeMathType, uint64_t* workspaceSize, aclOpExecutor** executor) {
  constexpr const char* name = "aclnnMm";
  INJECT_PHASE1("aclnnMm");
  NEED(self, name, "self");
  NEED(mat2, name, "mat2");
  NEED(out, name, "out");
  if (auto why = check_cube(*self, *mat2, *out, cubeMathType); !why.empty()) return invalid(name, why);
  if (self->dims.size() != 2 || mat2->dims.size() != 2 || out->dims.size() != 2)
    return invalid(name, "aclnnMm takes 2-D tensors only");
  const int64_t M = self->dims[0], K = self->dims[1], N = mat2->dims[1];
  if (mat2->dims[0] != K || out->dims != dims_t{M, N})
    return invalid(name, dims_string(self->dims) + " x " + dims_string(mat2->dims) + " -> " + dims_string(out->dims));
  const aclTensor A = *self, B = *mat2, C = *out;
  return make_executor(name, {self, mat2, out}, 1024 + uint64_t(M * N) * 4,
                       [=](void*) {
                         std::vector<double> c;
                         gemm(gather(A), gather(B), c, 1, M, K, N, 0, 0);
                         scatter(C, c);
                       },
                       workspaceSize, executor);
}
PHASE2(aclnnMm)

static aclnnStatus addmm_common(const char* name, const aclTensor* self, const aclTensor* mat1, const aclTensor* mat2,
                                const aclScalar* beta, const aclScalar* alpha, const aclTensor* out, int8_t cube,
                                uint64_t* workspaceSize, aclOpExecutor** executor) {
  NEED(self, name, "self");
  NEED(mat1, name, "mat1");
  NEED(mat2, name, "mat2");
  NEED(beta, name, "beta");
  NEED(alpha, name, "alpha");
  NEED(out, name, "out");
  if (auto why = check_cube(*mat1, *mat2, *out, cube); !why.empty()) return invalid(name, why);
  if (self->dtype != out->dtype) return invalid(name, "self and out dtypes differ");
  if (mat1->dims.size() != 2 || mat2->dims.size() != 2) return invalid(name, "mat1 and mat2 must be 2-D");
  const int64_t M = mat1->dims[0], K = mat1->dims[1], N = mat2->dims[1];
  if (mat2->dims[0] != K) return invalid(name, "inner dimensions differ: " + dims_string(mat1->dims) + " x " + dims_string(mat2->dims));
  if (out->dims != dims_t{M, N}) return invalid(name, "out is " + dims_string(out->dims) + ", expected [M,N]");
  dims_t bc;
  if (!broadcast_shape(self->dims, {M, N}, &bc) || bc != dims_t{M, N})
    return invalid(name, "self " + dims_string(self->dims) + " does not broadcast to " + dims_string({M, N}));
  const aclTensor S = *self, A = *mat1, B = *mat2, C = *out;
  const double be = beta->value, al = alpha->value;
  return make_executor(name, {self, mat1, mat2, out}, 1024 + uint64_t(M * N) * 4,
                       [=](void*) {
                         std::vector<double> c;
                         gemm(gather(A), gather(B), c, 1, M, K, N, 0, 0);
                         const auto s = expand(gather(S), S.dims, {M, N});
                         for (std::size_t i = 0; i < c.size(); ++i) c[i] = (be == 0 ? 0.0 : be * s[i]) + al * c[i];
                         scatter(C, c);
                       },
                       workspaceSize, executor);
}

extern "C" aclnnStatus aclnnAddmmGetWorkspaceSize(const aclTensor* self, const aclTensor* mat1, const aclTensor* mat2,
                                                  const aclScalar* beta, const aclScalar* alpha, aclTensor* out,
                                                  int8_t cubeMathType, uint64_t* workspaceSize,
                                                  aclOpExecutor** executor) {
  INJECT_PHASE1("aclnnAddmm");
  return addmm_common("aclnnAddmm", self, mat1, mat2, beta, alpha, out, cubeMathType, workspaceSize, executor);
}
PHASE2(aclnnAddmm)

extern "C" aclnnStatus aclnnInplaceAddmmGetWorkspaceSize(const aclTensor* selfRef, const aclTensor* mat1,
                                                         const aclTensor* mat2, const aclScalar* beta,
                                                         const aclScalar* alpha, int8_t cubeMathType,
                                                         uint64_t* workspaceSize, aclOpExecutor** executor) {
  INJECT_PHASE1("aclnnInplaceAddmm");
  return addmm_common("aclnnInplaceAddmm", selfRef, mat1, mat2, beta, alpha, selfRef, cubeMathType, workspaceSize,
                      executor);
}
PHASE2(aclnnInplaceAddmm)

// --- elementwise ---------------------------------------------------------------------------------------------------
static bool is_integral(aclDataType dt) {
  return dt == ACL_INT8 || dt == ACL_INT16 || dt == ACL_INT32 || dt == ACL_INT64 || dt == ACL_UINT8 ||
         dt == ACL_UINT16 || dt == ACL_UINT32 || dt == ACL_UINT64 || dt == ACL_BOOL;
}

static aclnnStatus binary(const char* name, const aclTensor* self, const aclTensor* other, const aclScalar* other_s,
                          const aclScalar* alpha, const aclTensor* out, bool mul, uint64_t* workspaceSize,
                          aclOpExecutor** executor) {
  NEED(self, name, "self");
  NEED(out, name, "out");
  if (!other && !other_s) return reject(name, param_nullptr, "other is NULL");
  if (!mul && !alpha) return reject(name, param_nullptr, "alpha is NULL");
  if (!is_nn_float(self->dtype) && self->dtype != ACL_INT32 && self->dtype != ACL_INT64 && self->dtype != ACL_UINT8 &&
      self->dtype != ACL_INT8)
    return invalid(name, std::string("self dtype ") + dtype_name(self->dtype) + " not supported");
  if (out->dtype != self->dtype) return invalid(name, "out dtype differs from self");
  // aclnnAdd/Adds and their in-place forms: "alpha无法转换为self和other推导后的数据类型" -> 161002
  // (hicann/ops-math docs/aclnnAdd&aclnnInplaceAdd.md, aclnnAdds.md; math/add/op_api/aclnn_add.cpp
  // CheckPromoteType: CanCast(alpha, promoteType), a BOOL promoteType taking integral or BOOL
  // alphas only). The promoted type of two integral/BOOL operands is integral or BOOL, and a
  // floating alpha casts to neither; with a floating operand every real alpha casts.
  if (!mul && is_integral(self->dtype) && is_integral(other ? other->dtype : other_s->dtype) &&
      !is_integral(alpha->dtype))
    return invalid(name, std::string("alpha dtype ") + dtype_name(alpha->dtype) +
                             " can't be cast to the promoted integer dtype of self " + dtype_name(self->dtype) +
                             " and other " + dtype_name(other ? other->dtype : other_s->dtype) +
                             " (pass an integer alpha)");
  dims_t want = self->dims;
  if (other && !broadcast_shape(self->dims, other->dims, &want))
    return invalid(name, "self " + dims_string(self->dims) + " and other " + dims_string(other->dims) + " do not broadcast");
  if (out->dims != want) return invalid(name, "out " + dims_string(out->dims) + " is not the broadcast shape " + dims_string(want));
  const aclTensor S = *self, C = *out;
  const bool has_t = other != nullptr;
  const aclTensor O = has_t ? *other : aclTensor{};
  const double os = other_s ? other_s->value : 0.0, al = alpha ? alpha->value : 1.0;
  std::vector<const aclTensor*> ts{self, out};
  if (other) ts.push_back(other);
  return make_executor(name, ts, 0,
                       [=](void*) {
                         auto s = expand(gather(S), S.dims, want);
                         std::vector<double> o = has_t ? expand(gather(O), O.dims, want)
                                                       : std::vector<double>(s.size(), os);
                         for (std::size_t i = 0; i < s.size(); ++i) s[i] = mul ? s[i] * o[i] : s[i] + al * o[i];
                         scatter(C, s);
                       },
                       workspaceSize, executor);
}

extern "C" aclnnStatus aclnnAddGetWorkspaceSize(const aclTensor* self, const aclTensor* other, const aclScalar* alpha,
                                                aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  INJECT_PHASE1("aclnnAdd");
  NEED(other, "aclnnAdd", "other");
  return binary("aclnnAdd", self, other, nullptr, alpha, out, false, ws, ex);
}
PHASE2(aclnnAdd)
extern "C" aclnnStatus aclnnAddsGetWorkspaceSize(const aclTensor* self, const aclScalar* other, const aclScalar* alpha,
                                                 aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  INJECT_PHASE1("aclnnAdds");
  NEED(other, "aclnnAdds", "other");
  return binary("aclnnAdds", self, nullptr, other, alpha, out, false, ws, ex);
}
PHASE2(aclnnAdds)
extern "C" aclnnStatus aclnnInplaceAddGetWorkspaceSize(const aclTensor* selfRef, const aclTensor* other,
                                                       const aclScalar* alpha, uint64_t* ws, aclOpExecutor** ex) {
  INJECT_PHASE1("aclnnInplaceAdd");
  NEED(other, "aclnnInplaceAdd", "other");
  return binary("aclnnInplaceAdd", selfRef, other, nullptr, alpha, selfRef, false, ws, ex);
}
PHASE2(aclnnInplaceAdd)
extern "C" aclnnStatus aclnnInplaceAddsGetWorkspaceSize(const aclTensor* selfRef, const aclScalar* other,
                                                        const aclScalar* alpha, uint64_t* ws, aclOpExecutor** ex) {
  INJECT_PHASE1("aclnnInplaceAdds");
  NEED(other, "aclnnInplaceAdds", "other");
  return binary("aclnnInplaceAdds", selfRef, nullptr, other, alpha, selfRef, false, ws, ex);
}
PHASE2(aclnnInplaceAdds)
extern "C" aclnnStatus aclnnMulGetWorkspaceSize(const aclTensor* self, const aclTensor* other, aclTensor* out,
                                                uint64_t* ws, aclOpExecutor** ex) {
  INJECT_PHASE1("aclnnMul");
  NEED(other, "aclnnMul", "other");
  return binary("aclnnMul", self, other, nullptr, nullptr, out, true, ws, ex);
}
PHASE2(aclnnMul)
extern "C" aclnnStatus aclnnMulsGetWorkspaceSize(const aclTensor* self, const aclScalar* other, aclTensor* out,
                                                 uint64_t* ws, aclOpExecutor** ex) {
  INJECT_PHASE1("aclnnMuls");
  NEED(other, "aclnnMuls", "other");
  return binary("aclnnMuls", self, nullptr, other, nullptr, out, true, ws, ex);
}
PHASE2(aclnnMuls)
extern "C" aclnnStatus aclnnInplaceMulGetWorkspaceSize(aclTensor* selfRef, const aclTensor* other, uint64_t* ws,
                                                       aclOpExecutor** ex) {
  INJECT_PHASE1("aclnnInplaceMul");
  NEED(other, "aclnnInplaceMul", "other");
  return binary("aclnnInplaceMul", selfRef, other, nullptr, nullptr, selfRef, true, ws, ex);
}
PHASE2(aclnnInplaceMul)
extern "C" aclnnStatus aclnnInplaceMulsGetWorkspaceSize(aclTensor* selfRef, const aclScalar* other, uint64_t* ws,
                                                        aclOpExecutor** ex) {
  INJECT_PHASE1("aclnnInplaceMuls");
  NEED(other, "aclnnInplaceMuls", "other");
  return binary("aclnnInplaceMuls", selfRef, nullptr, other, nullptr, selfRef, true, ws, ex);
}
PHASE2(aclnnInplaceMuls)

extern "C" aclnnStatus aclnnInplaceCopyGetWorkspaceSize(aclTensor* selfRef, const aclTensor* src, uint64_t* ws,
                                                        aclOpExecutor** ex) {
  constexpr const char* name = "aclnnInplaceCopy";
  INJECT_PHASE1("aclnnInplaceCopy");
  NEED(selfRef, name, "selfRef");
  NEED(src, name, "src");
  dims_t bc;
  if (!broadcast_shape(src->dims, selfRef->dims, &bc) || bc != selfRef->dims)
    return invalid(name, "src " + dims_string(src->dims) + " does not broadcast to selfRef " + dims_string(selfRef->dims));
  const aclTensor D = *selfRef, S = *src;
  return make_executor(name, {selfRef, src}, 0, [=](void*) { scatter(D, expand(gather(S), S.dims, D.dims)); }, ws, ex);
}
PHASE2(aclnnInplaceCopy)

extern "C" aclnnStatus aclnnCastGetWorkspaceSize(const aclTensor* self, const aclDataType dtype, aclTensor* out,
                                                 uint64_t* ws, aclOpExecutor** ex) {
  constexpr const char* name = "aclnnCast";
  INJECT_PHASE1("aclnnCast");
  NEED(self, name, "self");
  NEED(out, name, "out");
  if (out->dtype != dtype) return invalid(name, "out dtype differs from the requested dtype");
  if (out->dims != self->dims) return invalid(name, "out shape differs from self");
  const aclTensor S = *self, D = *out;
  return make_executor(name, {self, out}, 0, [=](void*) { scatter(D, gather(S)); }, ws, ex);
}
PHASE2(aclnnCast)

extern "C" aclnnStatus aclnnIsFiniteGetWorkspaceSize(const aclTensor* self, aclTensor* out, uint64_t* ws,
                                                     aclOpExecutor** ex) {
  constexpr const char* name = "aclnnIsFinite";
  INJECT_PHASE1("aclnnIsFinite");
  NEED(self, name, "self");
  NEED(out, name, "out");
  if (out->dtype != ACL_BOOL) return invalid(name, "out must be BOOL");
  if (out->dims != self->dims) return invalid(name, "out shape differs from self");
  const aclTensor S = *self, D = *out;
  return make_executor(name, {self, out}, 0,
                       [=](void*) {
                         auto v = gather(S);
                         for (auto& x : v) x = std::isfinite(x) ? 1.0 : 0.0;
                         scatter(D, v);
                       },
                       ws, ex);
}
PHASE2(aclnnIsFinite)

// --- GELU --------------------------------------------------------------------------------------------------------
namespace {
constexpr double sqrt_2_over_pi = 0.79788456080286535588;
double gelu(double x, bool tanh_form) {
  if (tanh_form) return 0.5 * x * (1 + std::tanh(sqrt_2_over_pi * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}
double gelu_grad(double x, bool tanh_form) {
  if (tanh_form) {
    const double u = sqrt_2_over_pi * (x + 0.044715 * x * x * x);
    const double t = std::tanh(u);
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * sqrt_2_over_pi * (1 + 3 * 0.044715 * x * x);
  }
  const double pdf = std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
  return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * pdf;
}
}  // namespace

extern "C" aclnnStatus aclnnGeluV2GetWorkspaceSize(const aclTensor* x, int64_t approximate, aclTensor* y, uint64_t* ws,
                                                   aclOpExecutor** ex) {
  constexpr const char* name = "aclnnGeluV2";
  INJECT_PHASE1("aclnnGeluV2");
  NEED(x, name, "x");
  NEED(y, name, "y");
  if (approximate != 0 && approximate != 1) return invalid(name, "approximate must be 0 (none) or 1 (tanh)");
  if (!is_nn_float(x->dtype) || x->dtype != y->dtype || x->dims != y->dims)
    return invalid(name, "x and y must have the same float dtype and shape: " + shape_string(*x) + " vs " + shape_string(*y));
  const aclTensor X = *x, Y = *y;
  const bool t = approximate == 1;
  return make_executor(name, {x, y}, 0,
                       [=](void*) {
                         auto v = gather(X);
                         for (auto& e : v) e = gelu(e, t);
                         scatter(Y, v);
                       },
                       ws, ex);
}
PHASE2(aclnnGeluV2)

extern "C" aclnnStatus aclnnGeluBackwardV2GetWorkspaceSize(const aclTensor* gradOutput, const aclTensor* self,
                                                           char* approximate, aclTensor* gradInput, uint64_t* ws,
                                                           aclOpExecutor** ex) {
  constexpr const char* name = "aclnnGeluBackwardV2";
  INJECT_PHASE1("aclnnGeluBackwardV2");
  NEED(gradOutput, name, "gradOutput");
  NEED(self, name, "self");
  NEED(approximate, name, "approximate");
  NEED(gradInput, name, "gradInput");
  const std::string mode = approximate;
  if (mode != "none" && mode != "tanh") return invalid(name, "approximate must be \"none\" or \"tanh\", got \"" + mode + "\"");
  if (!is_nn_float(self->dtype) || self->dtype != gradOutput->dtype || self->dtype != gradInput->dtype ||
      self->dims != gradOutput->dims || self->dims != gradInput->dims)
    return invalid(name, "gradOutput, self and gradInput must share dtype and shape");
  const aclTensor G = *gradOutput, X = *self, D = *gradInput;
  const bool t = mode == "tanh";
  return make_executor(name, {gradOutput, self, gradInput}, 0,
                       [=](void*) {
                         auto x = gather(X);
                         const auto g = gather(G);
                         for (std::size_t i = 0; i < x.size(); ++i) x[i] = gelu_grad(x[i], t) * g[i];
                         scatter(D, x);
                       },
                       ws, ex);
}
PHASE2(aclnnGeluBackwardV2)

// --- LayerNorm -----------------------------------------------------------------------------------------------------
namespace {
/// Rows A and row length R of input for normalizedShape; "" or the reason it does not fit.
std::string split_rows(const aclTensor& in, const std::vector<int64_t>& norm, int64_t* A, int64_t* R) {
  if (norm.empty()) return "normalizedShape is empty";
  if (norm.size() > in.dims.size()) return "normalizedShape has more dimensions than input";
  *A = 1;
  *R = 1;
  const std::size_t lead = in.dims.size() - norm.size();
  for (std::size_t i = 0; i < in.dims.size(); ++i) {
    if (i < lead) {
      *A *= in.dims[i];
    } else {
      if (in.dims[i] != norm[i - lead])
        return "input " + dims_string(in.dims) + " does not end in normalizedShape " + dims_string(norm);
      *R *= in.dims[i];
    }
  }
  return "";
}
dims_t stats_dims(const aclTensor& in, std::size_t nnorm) {
  dims_t d = in.dims;
  for (std::size_t i = d.size() - nnorm; i < d.size(); ++i) d[i] = 1;
  return d;
}
}  // namespace

extern "C" aclnnStatus aclnnLayerNormGetWorkspaceSize(const aclTensor* input, const aclIntArray* normalizedShape,
                                                      const aclTensor* weightOptional, const aclTensor* biasOptional,
                                                      double eps, aclTensor* out, aclTensor* meanOutOptional,
                                                      aclTensor* rstdOutOptional, uint64_t* ws, aclOpExecutor** ex) {
  constexpr const char* name = "aclnnLayerNorm";
  INJECT_PHASE1("aclnnLayerNorm");
  NEED(input, name, "input");
  NEED(normalizedShape, name, "normalizedShape");
  NEED(out, name, "out");
  int64_t A = 0, R = 0;
  if (auto why = split_rows(*input, normalizedShape->v, &A, &R); !why.empty()) return invalid(name, why);
  if (!is_nn_float(input->dtype)) return invalid(name, "input dtype not in FLOAT, FLOAT16, BFLOAT16");
  if (out->dtype != input->dtype || out->dims != input->dims) return invalid(name, "out must match input in dtype and shape");
  for (const aclTensor* p : {weightOptional, biasOptional})
    if (p && (p->dims != normalizedShape->v || (p->dtype != input->dtype && p->dtype != ACL_FLOAT)))
      return invalid(name, "weight/bias must have shape normalizedShape and the input dtype or FLOAT, got " + shape_string(*p));
  if (weightOptional && biasOptional && weightOptional->dtype != biasOptional->dtype)
    return invalid(name, "weight and bias dtypes differ");
  const dims_t sd = stats_dims(*input, normalizedShape->v.size());
  for (const aclTensor* p : {meanOutOptional, rstdOutOptional})
    if (p && (p->dtype != input->dtype || p->dims != sd))
      return invalid(name, "mean/rstd must have the input dtype (documented: same as input) and shape " +
                               dims_string(sd) + ", got " + shape_string(*p));
  const aclTensor X = *input, O = *out;
  const bool hw = weightOptional, hb = biasOptional, hm = meanOutOptional, hr = rstdOutOptional;
  const aclTensor W = hw ? *weightOptional : aclTensor{}, Bt = hb ? *biasOptional : aclTensor{};
  const aclTensor Mt = hm ? *meanOutOptional : aclTensor{}, Rt = hr ? *rstdOutOptional : aclTensor{};
  return make_executor(name, {input, weightOptional, biasOptional, out, meanOutOptional, rstdOutOptional},
                       uint64_t(A) * 8,
                       [=](void*) {
                         auto x = gather(X);
                         const auto w = hw ? gather(W) : std::vector<double>(std::size_t(R), 1.0);
                         const auto b = hb ? gather(Bt) : std::vector<double>(std::size_t(R), 0.0);
                         std::vector<double> mean(static_cast<std::size_t>(A)), rstd(static_cast<std::size_t>(A));
                         for (int64_t a = 0; a < A; ++a) {
                           double* row = x.data() + a * R;
                           double m = 0, v = 0;
                           for (int64_t r = 0; r < R; ++r) m += row[r];
                           m /= double(R);
                           for (int64_t r = 0; r < R; ++r) v += (row[r] - m) * (row[r] - m);
                           v /= double(R);
                           const double s = 1.0 / std::sqrt(v + eps);
                           for (int64_t r = 0; r < R; ++r) row[r] = (row[r] - m) * s * w[std::size_t(r)] + b[std::size_t(r)];
                           mean[std::size_t(a)] = m;
                           rstd[std::size_t(a)] = s;
                         }
                         scatter(O, x);
                         if (hm) scatter(Mt, mean);
                         if (hr) scatter(Rt, rstd);
                       },
                       ws, ex);
}
PHASE2(aclnnLayerNorm)

extern "C" aclnnStatus aclnnLayerNormBackwardGetWorkspaceSize(
    const aclTensor* gradOut, const aclTensor* input, const aclIntArray* normalizedShape, const aclTensor* mean,
    const aclTensor* rstd, const aclTensor* weightOptional, const aclTensor* biasOptional, const aclBoolArray* outputMask,
    aclTensor* gradInputOut, aclTensor* gradWeightOut, aclTensor* gradBiasOut, uint64_t* ws, aclOpExecutor** ex) {
  constexpr const char* name = "aclnnLayerNormBackward";
  INJECT_PHASE1("aclnnLayerNormBackward");
  NEED(gradOut, name, "gradOut");
  NEED(input, name, "input");
  NEED(normalizedShape, name, "normalizedShape");
  NEED(mean, name, "mean");
  NEED(rstd, name, "rstd");
  NEED(outputMask, name, "outputMask");
  if (outputMask->v.size() != 3) return invalid(name, "outputMask must have length 3 (dx, dw, db)");
  const bool want_dx = outputMask->v[0], want_dw = outputMask->v[1], want_db = outputMask->v[2];
  if (want_dx) NEED(gradInputOut, name, "gradInputOut (outputMask[0] is true)");
  if (want_dw) NEED(gradWeightOut, name, "gradWeightOut (outputMask[1] is true)");
  if (want_db) NEED(gradBiasOut, name, "gradBiasOut (outputMask[2] is true)");
  int64_t A = 0, R = 0;
  if (auto why = split_rows(*input, normalizedShape->v, &A, &R); !why.empty()) return invalid(name, why);
  if (!is_nn_float(input->dtype) || gradOut->dtype != input->dtype || gradOut->dims != input->dims)
    return invalid(name, "gradOut and input must share a float dtype and shape");
  if (mean->dtype != rstd->dtype || dtype_size(mean->dtype) < dtype_size(input->dtype) || !is_nn_float(mean->dtype))
    return invalid(name, std::string("mean/rstd must share a float dtype at least as wide as input, got ") +
                             dtype_name(mean->dtype) + "/" + dtype_name(rstd->dtype));
  if (numel(*mean) != A || numel(*rstd) != A) return invalid(name, "mean/rstd element count differs from the row count");
  if (weightOptional && (weightOptional->dims != normalizedShape->v ||
                         (weightOptional->dtype != input->dtype && weightOptional->dtype != ACL_FLOAT)))
    return invalid(name, "weight must have shape normalizedShape and the input dtype or FLOAT");
  if (want_dx && (gradInputOut->dims != input->dims || gradInputOut->dtype != input->dtype))
    return invalid(name, "gradInputOut must match input");
  const aclDataType wdt = weightOptional ? weightOptional->dtype : input->dtype;
  for (const aclTensor* p : {want_dw ? gradWeightOut : nullptr, want_db ? gradBiasOut : nullptr})
    if (p && (p->dims != normalizedShape->v || p->dtype != wdt))
      return invalid(name, "gradWeightOut/gradBiasOut must have shape normalizedShape and the weight dtype");
  const aclTensor G = *gradOut, X = *input, Mn = *mean, Rs = *rstd;
  const bool hw = weightOptional;
  const aclTensor W = hw ? *weightOptional : aclTensor{};
  const aclTensor DX = want_dx ? *gradInputOut : aclTensor{}, DW = want_dw ? *gradWeightOut : aclTensor{},
                  DB = want_db ? *gradBiasOut : aclTensor{};
  return make_executor(
      name, {gradOut, input, mean, rstd, weightOptional, biasOptional, want_dx ? gradInputOut : nullptr,
             want_dw ? gradWeightOut : nullptr, want_db ? gradBiasOut : nullptr},
      uint64_t(R) * 8,
      [=](void*) {
        const auto g = gather(G), x = gather(X), m = gather(Mn), s = gather(Rs);
        const auto w = hw ? gather(W) : std::vector<double>(std::size_t(R), 1.0);
        std::vector<double> dx(x.size()), dw(std::size_t(R), 0.0), db(std::size_t(R), 0.0);
        for (int64_t a = 0; a < A; ++a) {
          const double mu = m[std::size_t(a)], rs = s[std::size_t(a)];
          double t1 = 0, t2 = 0;
          for (int64_t r = 0; r < R; ++r) {
            const std::size_t i = std::size_t(a * R + r);
            const double xh = (x[i] - mu) * rs, gw = g[i] * w[std::size_t(r)];
            t1 += gw;
            t2 += gw * xh;
            dw[std::size_t(r)] += g[i] * xh;
            db[std::size_t(r)] += g[i];
          }
          t1 /= double(R);
          t2 /= double(R);
          for (int64_t r = 0; r < R; ++r) {
            const std::size_t i = std::size_t(a * R + r);
            const double xh = (x[i] - mu) * rs;
            dx[i] = (g[i] * w[std::size_t(r)] - (t1 + xh * t2)) * rs;
          }
        }
        if (want_dx) scatter(DX, dx);
        if (want_dw) scatter(DW, dw);
        if (want_db) scatter(DB, db);
      },
      ws, ex);
}
PHASE2(aclnnLayerNormBackward)

// --- embedding ---------------------------------------------------------------------------------------------------------
extern "C" aclnnStatus aclnnEmbeddingGetWorkspaceSize(const aclTensor* weight, const aclTensor* indices,
                                                      const aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  constexpr const char* name = "aclnnEmbedding";
  INJECT_PHASE1("aclnnEmbedding");
  NEED(weight, name, "weight");
  NEED(indices, name, "indices");
  NEED(out, name, "out");
  if (weight->dims.size() != 2) return invalid(name, "weight must be 2-D (num_embeddings, dim)");
  if (indices->dtype != ACL_INT32 && indices->dtype != ACL_INT64) return invalid(name, "indices must be INT32 or INT64");
  dims_t want = indices->dims;
  want.push_back(weight->dims[1]);
  if (out->dims != want || out->dtype != weight->dtype)
    return invalid(name, "out must be " + dims_string(want) + " with the weight dtype, got " + shape_string(*out));
  const aclTensor W = *weight, I = *indices, O = *out;
  return make_executor(name, {weight, indices, out}, 0,
                       [=](void*) {
                         const auto w = gather(W), idx = gather(I);
                         const int64_t V = W.dims[0], C = W.dims[1];
                         std::vector<double> o(idx.size() * std::size_t(C));
                         for (std::size_t n = 0; n < idx.size(); ++n) {
                           const auto k = int64_t(idx[n]);
                           if (k < 0 || k >= V)
                             throw task_error{ACL_ERROR_RT_AICORE_EXCEPTION,
                                              "aclnnEmbedding: index " + std::to_string(k) + " outside [0, " +
                                                  std::to_string(V) + ")"};
                           std::copy_n(w.begin() + k * C, C, o.begin() + std::ptrdiff_t(n) * C);
                         }
                         scatter(O, o);
                       },
                       ws, ex);
}
PHASE2(aclnnEmbedding)

extern "C" aclnnStatus aclnnEmbeddingDenseBackwardGetWorkspaceSize(const aclTensor* grad, const aclTensor* indices,
                                                                   uint64_t numWeights, uint64_t paddingIdx,
                                                                   bool scaleGradByFreq, const aclTensor* out,
                                                                   uint64_t* ws, aclOpExecutor** ex) {
  constexpr const char* name = "aclnnEmbeddingDenseBackward";
  INJECT_PHASE1("aclnnEmbeddingDenseBackward");
  NEED(grad, name, "grad");
  NEED(indices, name, "indices");
  NEED(out, name, "out");
  if (!is_nn_float(grad->dtype)) return invalid(name, "grad dtype not in FLOAT, FLOAT16, BFLOAT16");
  if (grad->dims.size() < 2) return invalid(name, "grad must have 2-8 dimensions");
  const int64_t C = grad->dims.back();
  if (numel(*grad) != numel(*indices) * C)
    return invalid(name, "grad " + dims_string(grad->dims) + " does not match indices " + dims_string(indices->dims));
  // out: "数据类型支持float32类型" (the CANN 8.1.RC1 header aclnnop/aclnn_embedding_dense_backward.h);
  // 9.0's header widens it to grad's types. The emulation keeps the 8.1 rule, valid on both.
  if (out->dims != dims_t{int64_t(numWeights), C} || out->dtype != ACL_FLOAT)
    return invalid(name, "out must be [numWeights, C] FLOAT (CANN 8.1 documents float32 only), got " +
                             shape_string(*out));
  const auto pad = int64_t(paddingIdx);  // documented: a negative paddingIdx (as uint64) means none
  if (pad >= int64_t(numWeights))
    return invalid(name, "paddingIdx " + std::to_string(pad) + " is not below numWeights; pass (uint64_t)-1 for none");
  const aclTensor G = *grad, I = *indices, O = *out;
  const int64_t V = int64_t(numWeights);
  return make_executor(name, {grad, indices, out}, uint64_t(V) * 4,
                       [=](void*) {
                         const auto g = gather(G), idx = gather(I);
                         std::vector<double> o(std::size_t(V * C), 0.0), count(std::size_t(V), 0.0);
                         for (double k : idx) {
                           if (k < 0 || k >= double(V))
                             throw task_error{ACL_ERROR_RT_AICORE_EXCEPTION, "aclnnEmbeddingDenseBackward: index out of range"};
                           count[std::size_t(k)] += 1;
                         }
                         for (std::size_t n = 0; n < idx.size(); ++n) {
                           const auto k = int64_t(idx[n]);
                           if (k == pad) continue;
                           const double sc = scaleGradByFreq ? 1.0 / count[std::size_t(k)] : 1.0;
                           for (int64_t c = 0; c < C; ++c) o[std::size_t(k * C + c)] += sc * g[n * std::size_t(C) + std::size_t(c)];
                         }
                         scatter(O, o);
                       },
                       ws, ex);
}
PHASE2(aclnnEmbeddingDenseBackward)

// --- cross-entropy -----------------------------------------------------------------------------------------------------
// Rules of the Atlas A2 (910B) / A3 kernels, which the emulation enforces (docs/ascend.md):
//  * target must be INT64: the operator definitions register only DT_INT64 for "target" on
//    ascend910b and ascend910_93 (INT32 only on ascend950) — hicann/ops-nn v9.0.0
//    loss/cross_entropy_loss/op_host/cross_entropy_loss_def.cpp and
//    loss/cross_entropy_loss_grad/op_host/cross_entropy_loss_grad_def.cpp; rejected in phase 1
//    with ACLNN_ERR_PARAM_INVALID (161002, "dtype not supported" in aclnnCrossEntropyLoss.md);
//  * N < 200,000 rows per call ("input第零维N需满足N<200000", hicann/ops-nn loss/cross_entropy_loss/
//    README.md and loss/cross_entropy_loss_grad/README.md, commit e11fe07f): phase 1 returns
//    ACLNN_ERR_INNER_TILING_ERROR (561002, "shape not supported");
//  * targets lie in [0, C), or equal ignoreIndex "when ignoreIndex is specified"
//    (aclnnCrossEntropyLoss.md, target row; the CANN 8.3.RC1 page on hiascend.com states [0, C)
//    with no exception). The strict reading, enforced here: a negative ignoreIndex specifies
//    nothing, so a negative target is an out-of-range gather on the AI core —
//    ACL_ERROR_RT_AICORE_EXCEPTION (507015) at the next synchronize. (What the kernel does with a
//    negative ignoreIndex is not documented; the strict reading is the safe one to test against.)
namespace {
std::string reduction_of(const char* r) { return r ? std::string(r) : std::string("mean"); }
constexpr int64_t cross_entropy_max_rows = 200000;  // N must stay below this
/// Whether target y is skipped: only a non-negative ignoreIndex ignores anything.
bool ignored(int64_t y, int64_t ignoreIndex) { return ignoreIndex >= 0 && y == ignoreIndex; }
}

extern "C" aclnnStatus aclnnCrossEntropyLossGetWorkspaceSize(
    const aclTensor* input, const aclTensor* target, const aclTensor* weightOptional, char* reductionOptional,
    int64_t ignoreIndex, double labelSmoothing, double, bool, const aclTensor* lossOut, const aclTensor* logProbOut,
    const aclTensor* zlossOut, const aclTensor* lseForZlossOut, uint64_t* ws, aclOpExecutor** ex) {
  constexpr const char* name = "aclnnCrossEntropyLoss";
  INJECT_PHASE1("aclnnCrossEntropyLoss");
  NEED(input, name, "input");
  NEED(target, name, "target");
  NEED(lossOut, name, "lossOut");
  NEED(logProbOut, name, "logProbOut");
  NEED(zlossOut, name, "zlossOut (must be passed even though zloss is unsupported)");
  NEED(lseForZlossOut, name, "lseForZlossOut (must be passed even though zloss is unsupported)");
  const std::string red = reduction_of(reductionOptional);
  if (red != "mean" && red != "sum" && red != "none") return invalid(name, "reduction must be mean, sum or none");
  if (input->dims.size() != 2 || !is_nn_float(input->dtype)) return invalid(name, "input must be 2-D (N, C) float");
  const int64_t N = input->dims[0], C = input->dims[1];
  if (target->dims != dims_t{N} || target->dtype != ACL_INT64)
    return invalid(name, "target must be [N] INT64 on Ascend910B (INT32 only on Ascend950), got " +
                             shape_string(*target));
  if (N >= cross_entropy_max_rows)
    return reject(name, inner_tiling_error, "input has N = " + std::to_string(N) + " rows; N must be below 200000");
  if (weightOptional && (weightOptional->dims != dims_t{C} || weightOptional->dtype != ACL_FLOAT))
    return invalid(name, "weight must be [C] FLOAT");
  if (weightOptional && labelSmoothing != 0) return invalid(name, "weight with label smoothing is not emulated");
  if (logProbOut->dims != input->dims || logProbOut->dtype != input->dtype) return invalid(name, "logProbOut must match input");
  if (lossOut->dtype != input->dtype) return invalid(name, "lossOut must have the input dtype");
  if (red == "none" ? lossOut->dims != dims_t{N} : numel(*lossOut) != 1)
    return invalid(name, "lossOut must be [N] for reduction none, one element otherwise");
  const aclTensor X = *input, Tg = *target, L = *lossOut, LP = *logProbOut;
  const bool hw = weightOptional;
  const aclTensor W = hw ? *weightOptional : aclTensor{};
  const double eps = labelSmoothing;
  return make_executor(
      name, {input, target, weightOptional, lossOut, logProbOut}, uint64_t(N) * 8,
      [=](void*) {
        auto x = gather(X);
        const auto t = gather(Tg);
        const auto w = hw ? gather(W) : std::vector<double>(std::size_t(C), 1.0);
        std::vector<double> loss(std::size_t(N), 0.0);
        double total = 0, wsum = 0;
        for (int64_t n = 0; n < N; ++n) {
          double* row = x.data() + n * C;
          const double mx = *std::max_element(row, row + C);
          double se = 0;
          for (int64_t c = 0; c < C; ++c) se += std::exp(row[c] - mx);
          const double lse = mx + std::log(se);
          for (int64_t c = 0; c < C; ++c) row[c] -= lse;  // log-probabilities
          const auto y = int64_t(t[std::size_t(n)]);
          if (ignored(y, ignoreIndex)) continue;
          if (y < 0 || y >= C)
            throw task_error{ACL_ERROR_RT_AICORE_EXCEPTION, "aclnnCrossEntropyLoss: target " + std::to_string(y) +
                                                                " outside [0, " + std::to_string(C) + ")"};
          double l = -(1 - eps) * row[y];
          if (eps != 0) {
            double s = 0;
            for (int64_t c = 0; c < C; ++c) s += row[c];
            l -= eps * s / double(C);
          }
          loss[std::size_t(n)] = w[std::size_t(y)] * l;
          total += loss[std::size_t(n)];
          wsum += w[std::size_t(y)];
        }
        scatter(LP, x);
        if (red == "none") scatter(L, loss);
        else scatter(L, {red == "sum" ? total : total / wsum});
      },
      ws, ex);
}
PHASE2(aclnnCrossEntropyLoss)

extern "C" aclnnStatus aclnnCrossEntropyLossGradGetWorkspaceSize(
    const aclTensor* gradLoss, const aclTensor* logProb, const aclTensor* target, const aclTensor* weightOptional,
    const aclTensor*, const aclTensor*, char* reductionOptional, int64_t ignoreIndex, double labelSmoothing, double,
    const aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  constexpr const char* name = "aclnnCrossEntropyLossGrad";
  INJECT_PHASE1("aclnnCrossEntropyLossGrad");
  NEED(gradLoss, name, "gradLoss");
  NEED(logProb, name, "logProb");
  NEED(target, name, "target");
  NEED(out, name, "out");
  const std::string red = reduction_of(reductionOptional);
  if (red != "mean" && red != "sum" && red != "none") return invalid(name, "reduction must be mean, sum or none");
  if (logProb->dims.size() != 2 || !is_nn_float(logProb->dtype)) return invalid(name, "logProb must be 2-D (N, C) float");
  const int64_t N = logProb->dims[0], C = logProb->dims[1];
  if (target->dims != dims_t{N} || target->dtype != ACL_INT64)
    return invalid(name, "target must be [N] INT64 on Ascend910B (INT32 only on Ascend950), got " +
                             shape_string(*target));
  if (N >= cross_entropy_max_rows)
    return reject(name, inner_tiling_error, "logProb has N = " + std::to_string(N) + " rows; N must be below 200000");
  if (red == "none" ? gradLoss->dims != dims_t{N} : numel(*gradLoss) != 1)
    return invalid(name, "gradLoss must be [N] for reduction none, one element otherwise");
  if (gradLoss->dtype != logProb->dtype) return invalid(name, "gradLoss must have the logProb dtype");
  if (out->dims != logProb->dims || out->dtype != logProb->dtype) return invalid(name, "out must match logProb");
  if (weightOptional && (weightOptional->dims != dims_t{C} || weightOptional->dtype != ACL_FLOAT))
    return invalid(name, "weight must be [C] FLOAT");
  if (weightOptional && labelSmoothing != 0) return invalid(name, "weight with label smoothing is not emulated");
  const aclTensor G = *gradLoss, LP = *logProb, Tg = *target, O = *out;
  const bool hw = weightOptional;
  const aclTensor W = hw ? *weightOptional : aclTensor{};
  const double eps = labelSmoothing;
  return make_executor(
      name, {gradLoss, logProb, target, weightOptional, out}, 0,
      [=](void*) {
        auto lp = gather(LP);
        const auto t = gather(Tg), g = gather(G);
        const auto w = hw ? gather(W) : std::vector<double>(std::size_t(C), 1.0);
        double wsum = 0;
        for (int64_t n = 0; n < N; ++n)
          if (const auto y = int64_t(t[std::size_t(n)]); !ignored(y, ignoreIndex) && y >= 0 && y < C) wsum += w[std::size_t(y)];
        for (int64_t n = 0; n < N; ++n) {
          double* row = lp.data() + n * C;
          const auto y = int64_t(t[std::size_t(n)]);
          if (ignored(y, ignoreIndex)) {
            std::fill(row, row + C, 0.0);
            continue;
          }
          if (y < 0 || y >= C) throw task_error{ACL_ERROR_RT_AICORE_EXCEPTION, "aclnnCrossEntropyLossGrad: target out of range"};
          double gn = red == "none" ? g[std::size_t(n)] : g[0];
          if (red == "mean") gn /= wsum;
          gn *= w[std::size_t(y)];
          for (int64_t c = 0; c < C; ++c) row[c] = gn * (std::exp(row[c]) - (c == y ? 1 - eps : 0) - eps / double(C));
        }
        scatter(O, lp);
      },
      ws, ex);
}
PHASE2(aclnnCrossEntropyLossGrad)

// --- AdamW ---------------------------------------------------------------------------------------------------------------
extern "C" aclnnStatus aclnnApplyAdamWV2GetWorkspaceSize(aclTensor* varRef, aclTensor* mRef, aclTensor* vRef,
                                                         aclTensor* maxGradNormOptionalRef, const aclTensor* grad,
                                                         const aclTensor* step, float lr, float beta1, float beta2,
                                                         float weightDecay, float eps, bool amsgrad, bool maximize,
                                                         uint64_t* ws, aclOpExecutor** ex) {
  constexpr const char* name = "aclnnApplyAdamWV2";
  INJECT_PHASE1("aclnnApplyAdamWV2");
  NEED(varRef, name, "varRef");
  NEED(mRef, name, "mRef");
  NEED(vRef, name, "vRef");
  NEED(grad, name, "grad");
  NEED(step, name, "step");
  if (amsgrad) NEED(maxGradNormOptionalRef, name, "maxGradNormOptionalRef (amsgrad is true)");
  if (!is_nn_float(varRef->dtype)) return invalid(name, "varRef dtype not in FLOAT16, BFLOAT16, FLOAT32");
  for (const aclTensor* p : {static_cast<const aclTensor*>(mRef), static_cast<const aclTensor*>(vRef), grad})
    if (p->dtype != varRef->dtype || p->dims != varRef->dims)
      return invalid(name, "varRef, mRef, vRef and grad must share dtype and shape (documented constraint): " +
                               shape_string(*varRef) + " vs " + shape_string(*p));
  if (numel(*step) != 1 || (step->dtype != ACL_INT64 && step->dtype != ACL_FLOAT))
    return invalid(name, "step must have one INT64 or FLOAT element");
  const aclTensor P = *varRef, M = *mRef, V = *vRef, G = *grad, S = *step;
  const aclTensor MX = amsgrad ? *maxGradNormOptionalRef : aclTensor{};
  return make_executor(
      name, {varRef, mRef, vRef, maxGradNormOptionalRef, grad, step}, 0,
      [=](void*) {
        const double t = gather(S)[0];
        if (!(t > 0)) throw task_error{ACL_ERROR_RT_AICORE_EXCEPTION, "aclnnApplyAdamWV2: step must be > 0"};
        auto p = gather(P), m = gather(M), v = gather(V);
        const auto g = gather(G);
        std::vector<double> mx = amsgrad ? gather(MX) : std::vector<double>();
        const double b1 = beta1, b2 = beta2, bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
        for (std::size_t i = 0; i < p.size(); ++i) {
          const double gi = maximize ? -g[i] : g[i];
          m[i] = b1 * m[i] + (1 - b1) * gi;
          v[i] = b2 * v[i] + (1 - b2) * gi * gi;
          double vv = v[i];
          if (amsgrad) vv = mx[i] = std::max(mx[i], v[i]);
          p[i] = p[i] - double(lr) * (m[i] / bc1) / (std::sqrt(vv / bc2) + double(eps)) -
                 double(lr) * double(weightDecay) * p[i];
        }
        scatter(P, p);
        scatter(M, m);
        scatter(V, v);
        if (amsgrad) scatter(MX, mx);
      },
      ws, ex);
}
PHASE2(aclnnApplyAdamWV2)

// --- reductions and unary math (the local pieces of the vocab-parallel cross-entropy) ---------------------------
// Rules (hicann/ops-math docs, Atlas A2/A3 rows; each violation is 161002 in phase 1 unless noted):
//  * aclnnAmax (math/reduce_max/docs/aclnnAmax.md): self and out FLOAT, FLOAT16, DOUBLE, INT8, INT16,
//    INT32, INT64, UINT8, BOOL or BFLOAT16, out "要与self数据类型相同"; at most 8 dimensions; dim
//    entries in [-self.dim(), self.dim()-1], no repeats; a reduced dimension of size 0 is refused;
//    out has the reduced shape (keepDim: the reduced dimensions kept as 1). NULL self/dim/out: 161001.
//  * aclnnReduceSum (math/reduce_sum_op/docs/aclnnReduceSum.md): self FLOAT16, FLOAT32, INT8, INT16,
//    INT32, INT64, UINT8, BOOL, DOUBLE or BFLOAT16 (complex types are not emulated), 0-8 dimensions;
//    dims in range and without repeats; dtype in the same list and equal to out's dtype ("dtype取值与
//    out的数据类型不一致" is 161002); out shape must match. An empty dims list is not documented and
//    is refused. NULL self/dims/out: 161001.
//  * aclnnInplaceExp / aclnnInplaceLog (math/exp, math/log docs): selfRef FLOAT, FLOAT16, BFLOAT16 or
//    DOUBLE on A2/A3 (an in-place result must be floating), at most 8 dimensions. log of a negative
//    value is NaN, of 0 is -inf (IEEE), as on the AI core.
namespace {
bool is_reducible(aclDataType dt) {
  return is_nn_float(dt) || dt == ACL_DOUBLE || dt == ACL_INT8 || dt == ACL_INT16 || dt == ACL_INT32 ||
         dt == ACL_INT64 || dt == ACL_UINT8 || dt == ACL_BOOL;
}
/// The reduced shape of `in` over `dims` ("" = ok), with the flags of the reduced axes.
std::string reduce_shape(const aclTensor& in, const std::vector<int64_t>& dims, bool keep, dims_t* out,
                         std::vector<bool>* reduced) {
  const auto n = int64_t(in.dims.size());
  if (n > 8) return "self has " + std::to_string(n) + " dimensions; at most 8 are supported";
  if (dims.empty()) return "the dimension list is empty (not documented; pass the axes to reduce)";
  reduced->assign(std::size_t(n), false);
  for (int64_t d : dims) {
    if (d < -n || d >= n)
      return "dimension " + std::to_string(d) + " is outside [" + std::to_string(-n) + ", " + std::to_string(n - 1) + "]";
    const auto a = std::size_t(d < 0 ? d + n : d);
    if ((*reduced)[a]) return "dimension " + std::to_string(d) + " is repeated";
    (*reduced)[a] = true;
  }
  out->clear();
  for (std::size_t i = 0; i < in.dims.size(); ++i)
    if (!(*reduced)[i]) out->push_back(in.dims[i]);
    else if (keep) out->push_back(1);
  return "";
}
/// Reduces v (shape dims, row-major) over the flagged axes with op (max or sum), row-major result.
std::vector<double> reduce_values(const std::vector<double>& v, const dims_t& dims, const std::vector<bool>& reduced,
                                  bool take_max) {
  const std::size_t nd = dims.size();
  std::vector<int64_t> out_stride(nd, 0);
  int64_t s = 1, count = 1;
  for (std::size_t i = nd; i-- > 0;)
    if (!reduced[i]) {
      out_stride[i] = s;
      s *= dims[i];
    }
  count = s;
  std::vector<double> out(std::size_t(count), take_max ? -HUGE_VAL : 0.0);
  std::vector<bool> seen(std::size_t(count), false);
  std::vector<int64_t> idx(nd, 0);
  for (std::size_t k = 0; k < v.size(); ++k) {
    int64_t o = 0;
    for (std::size_t i = 0; i < nd; ++i) o += idx[i] * out_stride[i];
    double& r = out[std::size_t(o)];
    if (take_max) r = !seen[std::size_t(o)] || v[k] > r || std::isnan(v[k]) ? v[k] : r;
    else r += v[k];
    seen[std::size_t(o)] = true;
    for (std::size_t i = nd; i-- > 0;) {
      if (++idx[i] < dims[i]) break;
      idx[i] = 0;
    }
  }
  return out;
}
}  // namespace

extern "C" aclnnStatus aclnnAmaxGetWorkspaceSize(const aclTensor* self, const aclIntArray* dim, bool keepDim,
                                                 aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  constexpr const char* name = "aclnnAmax";
  INJECT_PHASE1("aclnnAmax");
  NEED(self, name, "self");
  NEED(dim, name, "dim");
  NEED(out, name, "out");
  if (!is_reducible(self->dtype)) return invalid(name, std::string("self dtype ") + dtype_name(self->dtype) + " not supported");
  if (out->dtype != self->dtype)
    return invalid(name, std::string("out dtype ") + dtype_name(out->dtype) + " differs from self's " +
                             dtype_name(self->dtype) + " (documented: the same dtype)");
  dims_t want;
  std::vector<bool> reduced;
  if (auto why = reduce_shape(*self, dim->v, keepDim, &want, &reduced); !why.empty()) return invalid(name, why);
  for (std::size_t i = 0; i < reduced.size(); ++i)
    if (reduced[i] && self->dims[i] == 0) return invalid(name, "a reduced dimension of self has size 0");
  if (out->dims != want) return invalid(name, "out is " + dims_string(out->dims) + ", expected " + dims_string(want));
  const aclTensor S = *self, O = *out;
  return make_executor(name, {self, out}, 0,
                       [=](void*) { scatter(O, reduce_values(gather(S), S.dims, reduced, true)); }, ws, ex);
}
PHASE2(aclnnAmax)

extern "C" aclnnStatus aclnnReduceSumGetWorkspaceSize(const aclTensor* self, const aclIntArray* dims, bool keepDims,
                                                      aclDataType dtype, aclTensor* out, uint64_t* ws,
                                                      aclOpExecutor** ex) {
  constexpr const char* name = "aclnnReduceSum";
  INJECT_PHASE1("aclnnReduceSum");
  NEED(self, name, "self");
  NEED(dims, name, "dims");
  NEED(out, name, "out");
  if (!is_reducible(self->dtype)) return invalid(name, std::string("self dtype ") + dtype_name(self->dtype) + " not supported");
  if (!is_reducible(dtype)) return invalid(name, std::string("dtype ") + dtype_name(dtype) + " not supported");
  if (out->dtype != dtype)
    return invalid(name, std::string("dtype ") + dtype_name(dtype) + " differs from out's dtype " + dtype_name(out->dtype));
  dims_t want;
  std::vector<bool> reduced;
  if (auto why = reduce_shape(*self, dims->v, keepDims, &want, &reduced); !why.empty()) return invalid(name, why);
  if (out->dims != want) return invalid(name, "out is " + dims_string(out->dims) + ", expected " + dims_string(want));
  const aclTensor S = *self, O = *out;
  return make_executor(name, {self, out}, 0,
                       [=](void*) { scatter(O, reduce_values(gather(S), S.dims, reduced, false)); }, ws, ex);
}
PHASE2(aclnnReduceSum)

static aclnnStatus unary_inplace(const char* name, aclTensor* selfRef, double (*f)(double), uint64_t* ws,
                                 aclOpExecutor** ex) {
  NEED(selfRef, name, "selfRef");
  if (!is_nn_float(selfRef->dtype) && selfRef->dtype != ACL_DOUBLE)
    return invalid(name, std::string("selfRef dtype ") + dtype_name(selfRef->dtype) +
                             " not in FLOAT, FLOAT16, BFLOAT16, DOUBLE (an in-place result must be floating)");
  if (selfRef->dims.size() > 8) return invalid(name, "selfRef has more than 8 dimensions");
  const aclTensor S = *selfRef;
  return make_executor(name, {selfRef}, 0,
                       [=](void*) {
                         auto v = gather(S);
                         for (auto& x : v) x = f(x);
                         scatter(S, v);
                       },
                       ws, ex);
}

extern "C" aclnnStatus aclnnInplaceExpGetWorkspaceSize(aclTensor* selfRef, uint64_t* ws, aclOpExecutor** ex) {
  INJECT_PHASE1("aclnnInplaceExp");
  return unary_inplace("aclnnInplaceExp", selfRef, [](double x) { return std::exp(x); }, ws, ex);
}
PHASE2(aclnnInplaceExp)

extern "C" aclnnStatus aclnnInplaceLogGetWorkspaceSize(aclTensor* selfRef, uint64_t* ws, aclOpExecutor** ex) {
  INJECT_PHASE1("aclnnInplaceLog");
  return unary_inplace("aclnnInplaceLog", selfRef, [](double x) { return std::log(x); }, ws, ex);
}
PHASE2(aclnnInplaceLog)

// aclnnClamp (hicann/ops-math conversion/clip_by_value_v2/docs/aclnnClamp.md, A2/A3 rows): self and
// out FLOAT16, FLOAT, FLOAT64, INT8, UINT8, INT16, INT32, INT64 or BFLOAT16, out of self's dtype and
// shape (161002 otherwise); NULL self or out, or both bounds NULL: 161001; each bound "数据类型需要
// 可转换成self的数据类型": as for aclnnAdd's alpha (CanCast), a floating bound does not cast to an
// integer self (161002). A NULL bound is no bound.
extern "C" aclnnStatus aclnnClampGetWorkspaceSize(const aclTensor* self, const aclScalar* clipValueMin,
                                                  const aclScalar* clipValueMax, aclTensor* out, uint64_t* ws,
                                                  aclOpExecutor** ex) {
  constexpr const char* name = "aclnnClamp";
  INJECT_PHASE1("aclnnClamp");
  NEED(self, name, "self");
  NEED(out, name, "out");
  if (!clipValueMin && !clipValueMax) return reject(name, param_nullptr, "clipValueMin and clipValueMax are both NULL");
  const aclDataType dt = self->dtype;
  if (!(is_nn_float(dt) || dt == ACL_DOUBLE || dt == ACL_INT8 || dt == ACL_UINT8 || dt == ACL_INT16 ||
        dt == ACL_INT32 || dt == ACL_INT64))
    return invalid(name, std::string("self dtype ") + dtype_name(dt) + " not supported");
  if (out->dtype != dt || out->dims != self->dims)
    return invalid(name, "out must have self's dtype and shape: " + shape_string(*self) + " vs " + shape_string(*out));
  for (const aclScalar* b : {clipValueMin, clipValueMax})
    if (b && is_integral(dt) && !is_integral(b->dtype))
      return invalid(name, std::string("bound dtype ") + dtype_name(b->dtype) + " can't be cast to self's " +
                               dtype_name(dt) + " (pass integer bounds)");
  const aclTensor S = *self, O = *out;
  const bool has_lo = clipValueMin, has_hi = clipValueMax;
  const double lo = has_lo ? clipValueMin->value : 0.0, hi = has_hi ? clipValueMax->value : 0.0;
  return make_executor(name, {self, out}, 0,
                       [=](void*) {
                         auto v = gather(S);
                         for (auto& x : v) {
                           if (has_hi) x = std::min(x, hi);
                           if (has_lo) x = std::max(x, lo);
                         }
                         scatter(O, v);
                       },
                       ws, ex);
}
PHASE2(aclnnClamp)
