// loom's HOST EMULATION of the CANN aclnn operators of a Llama block — NOT the vendor library:
// aclnnRmsNorm, aclnnRmsNormGrad, aclnnSwiGlu, aclnnSwiGluGrad, aclnnRotaryPositionEmbedding,
// aclnnRotaryPositionEmbeddingGrad. Phase 1 enforces the rules of the operators' documentation for
// the Atlas A2 training series (910B), hicann/ops-nn v9.0.0:
//   norm/rms_norm/docs/aclnnRmsNorm.md, norm/rms_norm_grad/docs/aclnnRmsNormGrad.md,
//   activation/swi_glu/docs/aclnnSwiGlu.md, activation/swi_glu_grad/docs/aclnnSwiGluGrad.md
// and hicann/ops-transformer v9.0.0 posembedding/rotary_position_embedding(_grad)/docs/
// aclnnRotaryPositionEmbedding(Grad).md (A2/A3: mode 0 half or 1 interleave; x, cos, sin of one
// dtype; D even and < 896; cos/sin of one shape, broadcast to x; out 4-D, contiguous; half mode's
// broadcast axes (B, N) < 1000, interleave's product < 1000)
// (dtypes per the A2/A3 tables, gamma = trailing dims of x, rstd FLOAT32, dgamma FLOAT32, the
// SwiGlu axis even and in range, its input and output contiguous, SwiGluGrad's x 64-byte
// aligned); the computation runs in double on the stream worker and rounds once per output.
// SwiGluGrad follows the corrected formula (ops-nn master 7187a4d: the v9.0.0 bracket is a typo;
// the kernel computes the derivative of A * sigmoid(A)).
#include <aclnnop/aclnn_rms_norm.h>
#include <aclnnop/aclnn_rotary_position_embedding.h>
#include <aclnnop/aclnn_rotary_position_embedding_grad.h>
#include <aclnnop/aclnn_rms_norm_grad.h>
#include <aclnnop/aclnn_swi_glu.h>
#include <aclnnop/aclnn_swi_glu_grad.h>

#include <cmath>
#include <string>
#include <vector>

#include "internal.hpp"
#include "op_common.hpp"

using namespace loomemu;

namespace {

using dims_t = std::vector<int64_t>;

bool contiguous(const aclTensor& t) {
  int64_t s = 1;
  for (std::size_t d = t.dims.size(); d-- > 0;) {
    if (t.dims[d] != 1 && t.strides[d] != s) return false;
    s *= t.dims[d];
  }
  return true;
}

/// Rows (product of x's leading dims) and row length (gamma's elements) when gamma's shape is
/// x's trailing dims ("gamma_shape = x_shape[n:], n < x_shape.dims()"); "" or the reason.
std::string norm_rows(const aclTensor& x, const aclTensor& gamma, int64_t* rows, int64_t* cols) {
  if (x.dims.empty() || x.dims.size() > 8) return "x must have 1 to 8 dimensions, got " + shape_string(x);
  if (gamma.dims.empty() || gamma.dims.size() > x.dims.size())
    return "gamma " + shape_string(gamma) + " must be x's trailing dimensions (x " + shape_string(x) + ")";
  const std::size_t lead = x.dims.size() - gamma.dims.size();
  *rows = 1;
  *cols = 1;
  for (std::size_t i = 0; i < x.dims.size(); ++i) {
    if (x.dims[i] == 0) return "x " + shape_string(x) + " has a zero dimension (the tiling refuses it)";
    if (i < lead) {
      *rows *= x.dims[i];
    } else {
      if (x.dims[i] != gamma.dims[i - lead])
        return "gamma " + shape_string(gamma) + " must be x's trailing dimensions (x " + shape_string(x) + ")";
      *cols *= x.dims[i];
    }
  }
  return "";
}

/// rstd: FLOAT32 with x's leading dims, either with x's rank and 1s in the normalised dims
/// (the forward's inferred shape) or as the leading dims alone.
std::string check_rstd(const aclTensor& rstd, const aclTensor& x, std::size_t lead) {
  if (rstd.dtype != ACL_FLOAT) return std::string("rstd must be FLOAT32, got ") + dtype_name(rstd.dtype);
  const bool keepdim = rstd.dims.size() == x.dims.size(), leading = rstd.dims.size() == lead;
  bool fits = keepdim || leading;
  for (std::size_t i = 0; fits && i < rstd.dims.size(); ++i)
    fits = i < lead ? rstd.dims[i] == x.dims[i] : rstd.dims[i] == 1;
  if (!fits)
    return "rstd " + shape_string(rstd) + " must hold x's leading dimensions (x " + shape_string(x) + ", " +
           std::to_string(lead) + " of them not normalised), with 1s for the normalised ones";
  return "";
}

/// The A2/A3 dtype rule of RmsNorm(Grad): gamma has x's dtype, or FLOAT32 for 16-bit x.
std::string check_gamma_dtype(const aclTensor& x, const aclTensor& gamma) {
  if (gamma.dtype == x.dtype || (gamma.dtype == ACL_FLOAT && x.dtype != ACL_FLOAT)) return "";
  return std::string("gamma dtype ") + dtype_name(gamma.dtype) + " with x " + dtype_name(x.dtype) +
         " is not in the documented table (gamma: x's dtype, or FLOAT32 for FLOAT16/BFLOAT16 x)";
}

/// The SwiGlu axis: dim in [-rank, rank-1], normalised to [0, rank).
std::string swiglu_axis(const aclTensor& x, int64_t dim, std::size_t* axis) {
  const int64_t r = int64_t(x.dims.size());
  if (r == 0) return "x must have at least one dimension";
  if (dim < -r || dim > r - 1) return "dim " + std::to_string(dim) + " is outside [" + std::to_string(-r) + ", " + std::to_string(r - 1) + "]";
  *axis = std::size_t(dim < 0 ? dim + r : dim);
  if (x.dims[*axis] % 2 != 0)
    return "x " + shape_string(x) + " must be even along dim " + std::to_string(dim) + " (it is split in two halves)";
  return "";
}

dims_t halved(const aclTensor& x, std::size_t axis) {
  dims_t d = x.dims;
  d[axis] /= 2;
  return d;
}

/// outer x (2 * half) x inner: the split axis' neighbourhood, for indexing the two halves.
void split_extents(const aclTensor& x, std::size_t axis, int64_t* outer, int64_t* half, int64_t* inner) {
  *outer = 1;
  *inner = 1;
  for (std::size_t i = 0; i < axis; ++i) *outer *= x.dims[i];
  for (std::size_t i = axis + 1; i < x.dims.size(); ++i) *inner *= x.dims[i];
  *half = x.dims[axis] / 2;
}

double sigmoid(double a) { return 1.0 / (1.0 + std::exp(-a)); }

}  // namespace

// --- RmsNorm ---------------------------------------------------------------------------------------------------
extern "C" aclnnStatus aclnnRmsNormGetWorkspaceSize(const aclTensor* x, const aclTensor* gamma, double epsilon,
                                                    const aclTensor* yOut, const aclTensor* rstdOut, uint64_t* ws,
                                                    aclOpExecutor** ex) {
  constexpr const char* name = "aclnnRmsNorm";
  INJECT_PHASE1("aclnnRmsNorm");
  NEED(x, name, "x");
  NEED(gamma, name, "gamma");
  NEED(yOut, name, "yOut");
  NEED(rstdOut, name, "rstdOut");
  if (!is_nn_float(x->dtype)) return invalid(name, std::string("x dtype ") + dtype_name(x->dtype) + " not in FLOAT, FLOAT16, BFLOAT16");
  int64_t A = 0, R = 0;
  if (auto why = norm_rows(*x, *gamma, &A, &R); !why.empty()) return invalid(name, why);
  if (auto why = check_gamma_dtype(*x, *gamma); !why.empty()) return invalid(name, why);
  if (yOut->dtype != x->dtype || yOut->dims != x->dims)
    return invalid(name, "yOut must have x's dtype and shape, got " + shape_string(*yOut));
  if (auto why = check_rstd(*rstdOut, *x, x->dims.size() - gamma->dims.size()); !why.empty()) return invalid(name, why);
  const double eps = double(float(epsilon));  // the kernel's attribute is a float
  const aclTensor X = *x, G = *gamma, Y = *yOut, Rs = *rstdOut;
  return make_executor(name, {x, gamma, yOut, rstdOut}, 0,
                       [=](void*) {
                         auto v = gather(X);
                         const auto g = gather(G);
                         std::vector<double> rstd(static_cast<std::size_t>(A));
                         for (int64_t a = 0; a < A; ++a) {
                           double* row = v.data() + a * R;
                           double ss = 0;
                           for (int64_t r = 0; r < R; ++r) ss += row[r] * row[r];
                           const double s = 1.0 / std::sqrt(ss / double(R) + eps);
                           for (int64_t r = 0; r < R; ++r) row[r] = g[std::size_t(r)] * (row[r] * s);
                           rstd[std::size_t(a)] = s;
                         }
                         scatter(Y, v);
                         scatter(Rs, rstd);
                       },
                       ws, ex);
}
PHASE2(aclnnRmsNorm)

extern "C" aclnnStatus aclnnRmsNormGradGetWorkspaceSize(const aclTensor* dy, const aclTensor* x, const aclTensor* rstd,
                                                        const aclTensor* gamma, const aclTensor* dxOut,
                                                        const aclTensor* dgammaOut, uint64_t* ws, aclOpExecutor** ex) {
  constexpr const char* name = "aclnnRmsNormGrad";
  INJECT_PHASE1("aclnnRmsNormGrad");
  NEED(dy, name, "dy");
  NEED(x, name, "x");
  NEED(rstd, name, "rstd");
  NEED(gamma, name, "gamma");
  NEED(dxOut, name, "dxOut");
  NEED(dgammaOut, name, "dgammaOut");
  if (!is_nn_float(x->dtype)) return invalid(name, std::string("x dtype ") + dtype_name(x->dtype) + " not in FLOAT, FLOAT16, BFLOAT16");
  if (dy->dtype != x->dtype || dy->dims != x->dims)
    return invalid(name, "dy must have x's dtype and shape, got dy " + shape_string(*dy) + ", x " + shape_string(*x));
  int64_t A = 0, R = 0;
  if (auto why = norm_rows(*x, *gamma, &A, &R); !why.empty()) return invalid(name, why);
  if (auto why = check_gamma_dtype(*x, *gamma); !why.empty()) return invalid(name, why);
  if (auto why = check_rstd(*rstd, *x, x->dims.size() - gamma->dims.size()); !why.empty()) return invalid(name, why);
  if (dxOut->dtype != x->dtype || dxOut->dims != x->dims)
    return invalid(name, "dxOut must have x's dtype and shape, got " + shape_string(*dxOut));
  if (dgammaOut->dtype != ACL_FLOAT || dgammaOut->dims != gamma->dims)
    return invalid(name, "dgammaOut must be FLOAT32 with gamma's shape, got " + shape_string(*dgammaOut));
  const aclTensor DY = *dy, X = *x, Rs = *rstd, G = *gamma, DX = *dxOut, DG = *dgammaOut;
  return make_executor(name, {dy, x, rstd, gamma, dxOut, dgammaOut}, 0,
                       [=](void*) {
                         const auto g = gather(DY), v = gather(X), s = gather(Rs), w = gather(G);
                         std::vector<double> dx(v.size()), dw(std::size_t(R), 0.0);
                         for (int64_t a = 0; a < A; ++a) {
                           const double rs = s[std::size_t(a)];
                           double m = 0;  // mean(dy * gamma * xhat)
                           for (int64_t r = 0; r < R; ++r) {
                             const std::size_t i = std::size_t(a * R + r);
                             m += g[i] * w[std::size_t(r)] * v[i] * rs;
                             dw[std::size_t(r)] += g[i] * v[i] * rs;
                           }
                           m /= double(R);
                           for (int64_t r = 0; r < R; ++r) {
                             const std::size_t i = std::size_t(a * R + r);
                             dx[i] = (g[i] * w[std::size_t(r)] - v[i] * rs * m) * rs;
                           }
                         }
                         scatter(DX, dx);
                         scatter(DG, dw);
                       },
                       ws, ex);
}
PHASE2(aclnnRmsNormGrad)

// --- SwiGlu ----------------------------------------------------------------------------------------------------
extern "C" aclnnStatus aclnnSwiGluGetWorkspaceSize(const aclTensor* x, int64_t dim, const aclTensor* out, uint64_t* ws,
                                                   aclOpExecutor** ex) {
  constexpr const char* name = "aclnnSwiGlu";
  INJECT_PHASE1("aclnnSwiGlu");
  NEED(x, name, "x");
  NEED(out, name, "out");
  if (!is_nn_float(x->dtype)) return invalid(name, std::string("x dtype ") + dtype_name(x->dtype) + " not in FLOAT, FLOAT16, BFLOAT16");
  std::size_t axis = 0;
  if (auto why = swiglu_axis(*x, dim, &axis); !why.empty()) return invalid(name, why);
  if (out->dtype != x->dtype || out->dims != halved(*x, axis))
    return invalid(name, "out must have x's dtype and x's shape with dim " + std::to_string(dim) + " halved, got " +
                             shape_string(*out));
  if (!contiguous(*x) || !contiguous(*out)) return invalid(name, "x and out must be contiguous (documented: no non-contiguous tensors)");
  int64_t outer = 0, half = 0, inner = 0;
  split_extents(*x, axis, &outer, &half, &inner);
  const aclTensor X = *x, O = *out;
  return make_executor(name, {x, out}, 0,
                       [=](void*) {
                         const auto v = gather(X);
                         std::vector<double> o(std::size_t(outer * half * inner));
                         for (int64_t p = 0; p < outer; ++p)
                           for (int64_t h = 0; h < half; ++h)
                             for (int64_t q = 0; q < inner; ++q) {
                               const double a = v[std::size_t((p * 2 * half + h) * inner + q)];
                               const double b = v[std::size_t((p * 2 * half + half + h) * inner + q)];
                               o[std::size_t((p * half + h) * inner + q)] = a * sigmoid(a) * b;
                             }
                         scatter(O, o);
                       },
                       ws, ex);
}
PHASE2(aclnnSwiGlu)

extern "C" aclnnStatus aclnnSwiGluGradGetWorkspaceSize(const aclTensor* yGrad, const aclTensor* x, int64_t dim,
                                                       const aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  constexpr const char* name = "aclnnSwiGluGrad";
  INJECT_PHASE1("aclnnSwiGluGrad");
  NEED(yGrad, name, "yGrad");
  NEED(x, name, "x");
  NEED(out, name, "out");
  if (!is_nn_float(x->dtype)) return invalid(name, std::string("x dtype ") + dtype_name(x->dtype) + " not in FLOAT, FLOAT16, BFLOAT16");
  if (x->dims.empty() || x->dims.size() > 8) return invalid(name, "x must have 1 to 8 dimensions, got " + shape_string(*x));
  std::size_t axis = 0;
  if (auto why = swiglu_axis(*x, dim, &axis); !why.empty()) return invalid(name, why);
  if (numel(*x) == 0) return invalid(name, "x is empty (documented: no empty tensor)");
  if (yGrad->dtype != x->dtype || yGrad->dims != halved(*x, axis))
    return invalid(name, "yGrad must have x's dtype and x's shape with dim " + std::to_string(dim) + " halved, got " +
                             shape_string(*yGrad));
  if (out->dtype != x->dtype || out->dims != x->dims) return invalid(name, "out must have x's dtype and shape, got " + shape_string(*out));
  if (!contiguous(*yGrad)) return invalid(name, "yGrad must be contiguous (documented: no non-contiguous yGrad)");
  if ((x->dims.back() * int64_t(dtype_size(x->dtype))) % 64 != 0)
    return invalid(name, "x " + shape_string(*x) + ": its last dimension is " +
                             std::to_string(x->dims.back() * int64_t(dtype_size(x->dtype))) +
                             " bytes, not a multiple of 64 (documented: shapes not 64-byte aligned are not supported)");
  int64_t outer = 0, half = 0, inner = 0;
  split_extents(*x, axis, &outer, &half, &inner);
  const aclTensor G = *yGrad, X = *x, O = *out;
  return make_executor(name, {yGrad, x, out}, 0,
                       [=](void*) {
                         const auto g = gather(G), v = gather(X);
                         std::vector<double> o(v.size());
                         for (int64_t p = 0; p < outer; ++p)
                           for (int64_t h = 0; h < half; ++h)
                             for (int64_t q = 0; q < inner; ++q) {
                               const std::size_t ia = std::size_t((p * 2 * half + h) * inner + q);
                               const std::size_t ib = std::size_t((p * 2 * half + half + h) * inner + q);
                               const double a = v[ia], b = v[ib], dy = g[std::size_t((p * half + h) * inner + q)];
                               const double s = sigmoid(a);
                               o[ia] = dy * (s + s * (1.0 - s) * a) * b;
                               o[ib] = dy * s * a;
                             }
                         scatter(O, o);
                       },
                       ws, ex);
}
PHASE2(aclnnSwiGluGrad)

// --- RotaryPositionEmbedding ---------------------------------------------------------------------------------------
namespace {

/// The rotation partner of element d (of D) and its sign: y = x cos + sign * x[partner] sin.
/// mode 0 (half, rotate_half): partner d +- D/2, sign -1 for the first half; mode 1 (interleave):
/// partner d ^ 1, sign -1 for even d.
void partner(int64_t mode, int64_t D, int64_t d, int64_t* other, double* sign) {
  if (mode == 0) {
    *other = d < D / 2 ? d + D / 2 : d - D / 2;
    *sign = d < D / 2 ? -1.0 : 1.0;
  } else {
    *other = d ^ 1;
    *sign = d % 2 == 0 ? -1.0 : 1.0;
  }
}

/// Element offsets into a row-major tensor of shape `from` broadcast to `to` (same rank).
std::vector<std::size_t> broadcast_index(const dims_t& from, const dims_t& to) {
  int64_t n = 1;
  for (auto d : to) n *= d;
  std::vector<std::size_t> out(std::size_t(std::max<int64_t>(n, 0)));
  std::vector<int64_t> stride(to.size(), 0), idx(to.size(), 0);
  int64_t s = 1;
  for (std::size_t i = to.size(); i-- > 0;) {
    stride[i] = from[i] == 1 ? 0 : s;
    s *= from[i];
  }
  for (int64_t k = 0; k < n; ++k) {
    int64_t o = 0;
    for (std::size_t i = 0; i < to.size(); ++i) o += idx[i] * stride[i];
    out[std::size_t(k)] = std::size_t(o);
    for (std::size_t i = to.size(); i-- > 0;) {
      if (++idx[i] < to[i]) break;
      idx[i] = 0;
    }
  }
  return out;
}

/// The A2/A3 rules shared by the forward and the backward; x is the forward's x (or dy).
std::string check_rope(const aclTensor& x, const aclTensor& cos, const aclTensor& sin, int64_t mode, bool grad) {
  if (!is_nn_float(x.dtype)) return std::string("dtype ") + dtype_name(x.dtype) + " not in FLOAT, FLOAT16, BFLOAT16";
  if (cos.dtype != x.dtype || sin.dtype != x.dtype)
    return std::string("cos and sin must have x's dtype ") + dtype_name(x.dtype) + " (documented: the same dtype), got " +
           dtype_name(cos.dtype) + "/" + dtype_name(sin.dtype);
  if (mode == 2 || mode == 3) return "mode " + std::to_string(mode) + " (quarter / interleave-half) is documented for Ascend 950 only; A2/A3 take 0 (half) and 1 (interleave)";
  if (mode != 0 && mode != 1) return "mode " + std::to_string(mode) + " is outside 0..3";
  const std::size_t r = x.dims.size();
  if (grad ? r != 4 : (r != 3 && r != 4)) return std::string(grad ? "dy" : "x") + " must be " + (grad ? "4-D" : "3-D or 4-D") + ", got " + shape_string(x);
  if (cos.dims != sin.dims) return "cos " + shape_string(cos) + " and sin " + shape_string(sin) + " must have one shape";
  if (cos.dims.size() != r) return "cos/sin " + shape_string(cos) + " must have x's rank (" + std::to_string(r) + ")";
  const int64_t D = x.dims.back();
  if (cos.dims.back() != D) return "cos/sin last dimension " + std::to_string(cos.dims.back()) + " differs from x's " + std::to_string(D);
  if (D % 2 != 0 || D >= 896) return "D = " + std::to_string(D) + " must be even and below 896 (documented for A2/A3)";
  int64_t product = 1;
  for (std::size_t i = 0; i + 1 < r; ++i) {
    if (cos.dims[i] != x.dims[i] && cos.dims[i] != 1)
      return "cos/sin " + shape_string(cos) + " does not broadcast to x " + shape_string(x);
    if (cos.dims[i] == 1 && x.dims[i] > 1) {
      if (mode == 0 && x.dims[i] >= 1000)
        return "half mode: a broadcast axis (B or N) of x " + shape_string(x) + " is not below 1000 (documented)";
      product *= x.dims[i];
    }
  }
  if (mode == 1 && product >= 1000) return "interleave mode: B * N = " + std::to_string(product) + " is not below 1000 (documented)";
  return "";
}

}  // namespace

extern "C" aclnnStatus aclnnRotaryPositionEmbeddingGetWorkspaceSize(const aclTensor* x, const aclTensor* cos,
                                                                    const aclTensor* sin, int64_t mode, aclTensor* out,
                                                                    uint64_t* ws, aclOpExecutor** ex) {
  constexpr const char* name = "aclnnRotaryPositionEmbedding";
  INJECT_PHASE1("aclnnRotaryPositionEmbedding");
  NEED(x, name, "x");
  NEED(cos, name, "cos");
  NEED(sin, name, "sin");
  NEED(out, name, "out");
  if (auto why = check_rope(*x, *cos, *sin, mode, false); !why.empty()) return invalid(name, why);
  if (out->dims.size() != 4) return invalid(name, "out must be 4-D (documented), got " + shape_string(*out));
  if (out->dims != x->dims || out->dtype != x->dtype) return invalid(name, "out must have x's shape and dtype, got " + shape_string(*out));
  if (!contiguous(*out)) return invalid(name, "out must be contiguous (documented: no non-contiguous out)");
  const aclTensor X = *x, Cs = *cos, Sn = *sin, O = *out;
  return make_executor(name, {x, cos, sin, out}, 0,
                       [=](void*) {
                         const auto v = gather(X), c = gather(Cs), sn = gather(Sn);
                         const auto bi = broadcast_index(Cs.dims, X.dims);
                         const int64_t D = X.dims.back();
                         std::vector<double> y(v.size());
                         for (std::size_t i = 0; i < v.size(); ++i) {
                           const int64_t d = int64_t(i) % D;
                           int64_t o = 0;
                           double sign = 0;
                           partner(mode, D, d, &o, &sign);
                           const std::size_t j = i - std::size_t(d) + std::size_t(o);
                           y[i] = v[i] * c[bi[i]] + sign * v[j] * sn[bi[i]];
                         }
                         scatter(O, y);
                       },
                       ws, ex);
}
PHASE2(aclnnRotaryPositionEmbedding)

extern "C" aclnnStatus aclnnRotaryPositionEmbeddingGradGetWorkspaceSize(
    const aclTensor* dy, const aclTensor* cos, const aclTensor* sin, const aclTensor* xOptional, int64_t mode,
    const aclTensor* dxOut, const aclTensor* dcosOut, const aclTensor* dsinOut, uint64_t* ws, aclOpExecutor** ex) {
  constexpr const char* name = "aclnnRotaryPositionEmbeddingGrad";
  INJECT_PHASE1("aclnnRotaryPositionEmbeddingGrad");
  NEED(dy, name, "dy");
  NEED(cos, name, "cos");
  NEED(sin, name, "sin");
  NEED(dxOut, name, "dxOut");
  NEED(dcosOut, name, "dcosOut (required even without xOptional: pass an empty tensor)");
  NEED(dsinOut, name, "dsinOut (required even without xOptional: pass an empty tensor)");
  if (auto why = check_rope(*dy, *cos, *sin, mode, true); !why.empty()) return invalid(name, why);
  if (dxOut->dims != dy->dims || dxOut->dtype != dy->dtype) return invalid(name, "dxOut must have dy's shape and dtype, got " + shape_string(*dxOut));
  const bool hx = xOptional;
  if (hx) {
    if (xOptional->dims != dy->dims || xOptional->dtype != dy->dtype) return invalid(name, "xOptional must have dy's shape and dtype");
    for (const aclTensor* t : {dcosOut, dsinOut})
      if (t->dims != cos->dims || t->dtype != cos->dtype) return invalid(name, "dcosOut/dsinOut must have cos's shape and dtype");
    int64_t bn = 1;
    for (std::size_t i = 0; i + 1 < dy->dims.size(); ++i)
      if (cos->dims[i] == 1) bn *= dy->dims[i];
    if (bn > 1024) return invalid(name, "with dcos/dsin, B * N = " + std::to_string(bn) + " must be at most 1024 (documented)");
  }
  const aclTensor DY = *dy, Cs = *cos, Sn = *sin, DX = *dxOut;
  const aclTensor X = hx ? *xOptional : aclTensor{}, DC = hx ? *dcosOut : aclTensor{}, DS = hx ? *dsinOut : aclTensor{};
  return make_executor(name, {dy, cos, sin, xOptional, dxOut, hx ? dcosOut : nullptr, hx ? dsinOut : nullptr}, 0,
                       [=](void*) {
                         const auto g = gather(DY), c = gather(Cs), sn = gather(Sn);
                         const auto bi = broadcast_index(Cs.dims, DY.dims);
                         const int64_t D = DY.dims.back();
                         std::vector<double> dx(g.size(), 0.0);
                         std::vector<double> x = hx ? gather(X) : std::vector<double>{};
                         std::vector<double> dc(c.size(), 0.0), ds(c.size(), 0.0);
                         for (std::size_t i = 0; i < g.size(); ++i) {
                           const int64_t d = int64_t(i) % D;
                           int64_t o = 0;
                           double sign = 0;
                           partner(mode, D, d, &o, &sign);
                           const std::size_t j = i - std::size_t(d) + std::size_t(o);
                           // y_i = x_i c_i + sign_i x_j s_i, so dx_i = c_i dy_i + sum over k with partner(k) = i
                           // of sign_k s_k dy_k; the partner relation is symmetric: k = j
                           int64_t oj = 0;
                           double sign_j = 0;
                           partner(mode, D, o, &oj, &sign_j);
                           dx[i] += c[bi[i]] * g[i] + sign_j * sn[bi[j]] * g[j];
                           if (hx) {
                             dc[bi[i]] += g[i] * x[i];
                             ds[bi[i]] += g[i] * sign * x[j];
                           }
                         }
                         scatter(DX, dx);
                         if (hx) {
                           scatter(DC, dc);
                           scatter(DS, ds);
                         }
                       },
                       ws, ex);
}
PHASE2(aclnnRotaryPositionEmbeddingGrad)

