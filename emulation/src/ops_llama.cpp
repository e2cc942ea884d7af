// loom's HOST EMULATION of the CANN aclnn operators of a Llama block — NOT the vendor library:
// aclnnRmsNorm, aclnnRmsNormGrad, aclnnSwiGlu, aclnnSwiGluGrad. Phase 1 enforces the rules of the
// operators' documentation for the Atlas A2 training series (910B), hicann/ops-nn v9.0.0:
//   norm/rms_norm/docs/aclnnRmsNorm.md, norm/rms_norm_grad/docs/aclnnRmsNormGrad.md,
//   activation/swi_glu/docs/aclnnSwiGlu.md, activation/swi_glu_grad/docs/aclnnSwiGluGrad.md
// (dtypes per the A2/A3 tables, gamma = trailing dims of x, rstd FLOAT32, dgamma FLOAT32, the
// SwiGlu axis even and in range, its input and output contiguous, SwiGluGrad's x 64-byte
// aligned); the computation runs in double on the stream worker and rounds once per output.
// SwiGluGrad follows the corrected formula (ops-nn master 7187a4d: the v9.0.0 bracket is a typo;
// the kernel computes the derivative of A * sigmoid(A)).
#include <aclnnop/aclnn_rms_norm.h>
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
